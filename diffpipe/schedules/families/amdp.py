"""AMDP: Asynchronous Multi-Directional Pipeline (D/2 pipelines on a ring, no flush).

Source: Chen, Wu and Yu, "AMDP: Asynchronous Multi-Directional Pipeline Parallelism for
Large-Scale Models Training", ICML 2026 (arXiv:2605.29664), and the authors' public Megatron-based
code (github.com/Vinsmoke86/AMDP: per-device orders, placement, round templates; see
papers/amdp/README.md). Reproduced exactly for the two published sizes, D = 4 and D = 8.

Placement: D/2 pipelines (model replicas), each holding one stage on every device, on a ring.
D = 8: stage s of pipeline 0 on device s, of pipeline 1 on (11-s) mod 8, of pipeline 2 on
(s+4) mod 8, of pipeline 3 on 7-s (pipelines 1 and 2 use the 7 <-> 0 link). D = 4: pipeline 0 on
s, pipeline 1 on 3-s (Chimera's mirrored placement).

Rounds: a round is D microbatches, local ids 0..D-1; local id i goes to pipeline i mod (D/2), so
each pipeline takes two per round. Round r of the window holds global microbatches ``rD + i``.
Each device advances through its published per-round forward order and backward order (tables
below). Round template per device (continuing across rounds and steps, no flush):

* D = 8, devices 0, 3, 4, 7 (each holds one pipeline's first stage and another's last):
  ``(F F | F F B) F×5 B F [U] B×6``;
  devices 1, 2, 5, 6: ``(F F | B F F) F×5 F [U] B B×6``.
* D = 4, devices 0, 3: ``(F F | F F B) F B [U] F B B``; devices 1, 2: ``(F F | B F F) F F [U] B B B``.

The first alternative in parentheses is the first round ever. Otherwise the template's first B is
the previous round's last backward, carried over (no flush), so every round after the first runs
D forwards and D backwards on each device, and the first round D-1 backwards. ``[U]`` is the
optimizer step of the previous step, run in the first round of every step but the first; the
gradients of the ``rounds`` rounds of a step accumulate and ``U`` applies them once. ``U`` on
device d is ``Op("U", stage=d, step, pipeline=0)``: the optimizer state is sharded so device d owns
stage d (pipeline 0 places stage d on device d); the reduction to the owner and the broadcast to
the replicas are not modelled as ops.

Window: ``microbatches`` is the number per optimizer step and must be a multiple of D (R =
microbatches / D rounds per step, the global batch over microbatch size over D); option ``steps``
(K, default 3) unrolls K steps, so the ``Schedule`` holds K·R·D microbatches, ``steps = K``,
``asynchronous=True``. The window closes with the last round's carried-over backward and then the
last step's ``U`` on every device, so every step has exactly one ``U`` per device.

Weights: one version, no stashing. In the first round of a step (after the first step) some
microbatches run forward on the old weights and backward on the new ones: ``staleness`` is at most
1, and non-zero only for microbatches of the first round of steps 1..K-1.

Other D: rejected with a ``ScheduleError``. The published per-round orders are exactly the order
in which one round, run alone, delivers work to each device (a greedy ``list_schedule`` of one
round over this placement reproduces both tables; the tests check it), but neither the placement
nor the round templates extend soundly: the ring pairs mirrored pipelines on segments of 4
devices, which does not tile D = 6 (three pipelines), and the two published templates place ``U``
differently relative to the last forward of end devices (after it for D = 8, before it for D = 4),
so D = 12 or 16 would need a choice the authors did not make. Build a custom ring schedule with
``list_schedule(Placement(D, table), microbatches, assignment=...)`` instead.
"""

from __future__ import annotations

from ..._errors import ScheduleError
from .._registry import Family, register
from .._schedule import Op, Placement, Schedule
from .pipedream import STEPS

#: Stage s of pipeline p is on device ``PLACEMENT[D][p][s]``.
PLACEMENT: dict[int, tuple[tuple[int, ...], ...]] = {
    4: (tuple(range(4)), tuple(3 - s for s in range(4))),
    8: (
        tuple(range(8)),
        tuple((11 - s) % 8 for s in range(8)),
        tuple((s + 4) % 8 for s in range(8)),
        tuple(7 - s for s in range(8)),
    ),
}

#: Per device, the forward and the backward order of a round's local microbatch ids.
FORWARD: dict[int, tuple[tuple[int, ...], ...]] = {
    4: ((0, 2, 1, 3), (0, 1, 2, 3), (1, 0, 3, 2), (1, 3, 0, 2)),
    8: (
        (0, 4, 1, 2, 5, 6, 3, 7),
        (0, 1, 4, 5, 2, 3, 6, 7),
        (1, 0, 5, 4, 3, 2, 7, 6),
        (1, 5, 0, 3, 4, 7, 2, 6),
        (2, 6, 3, 0, 7, 4, 1, 5),
        (2, 3, 6, 7, 0, 1, 4, 5),
        (3, 2, 7, 6, 1, 0, 5, 4),
        (3, 7, 2, 1, 6, 5, 0, 4),
    ),
}
BACKWARD: dict[int, tuple[tuple[int, ...], ...]] = {
    4: ((1, 3, 0, 2), (1, 0, 3, 2), (0, 1, 2, 3), (0, 2, 1, 3)),
    8: (
        (3, 7, 2, 1, 6, 5, 0, 4),
        (3, 2, 7, 6, 1, 0, 5, 4),
        (2, 3, 6, 7, 0, 1, 4, 5),
        (2, 6, 3, 0, 7, 4, 1, 5),
        (1, 5, 0, 3, 4, 7, 2, 6),
        (1, 0, 5, 4, 3, 2, 7, 6),
        (0, 1, 4, 5, 2, 3, 6, 7),
        (0, 4, 1, 2, 5, 6, 3, 7),
    ),
}

#: Round templates after the opening (``FF`` in the first round ever, else ``FFB`` on end devices
#: and ``BFF`` on middle ones); ``U`` marks where the previous step's update goes.
BODY: dict[int, dict[bool, str]] = {
    4: {True: "FBUFBB", False: "FFUBBB"},
    8: {True: "FFFFFBFUBBBBBB", False: "FFFFFFUBBBBBBB"},
}


def end_device(device: int) -> bool:
    """Whether ``device`` holds one pipeline's first stage and another's last (0, 3, 4, 7 for D=8)."""
    return device % 4 in (0, 3)


def _devices_reason(devices: int) -> str | None:
    if devices not in PLACEMENT:
        return (f"devices must be 4 or 8 (the authors' published orders), got {devices}; for another "
                f"ring use list_schedule with a custom Placement")
    return None


def placement(devices: int, **_: object) -> Placement:
    """AMDP's ring placement for D = 4 or 8."""
    reason = _devices_reason(devices)
    if reason:
        raise ScheduleError(f"amdp: {reason}")
    return Placement(devices, PLACEMENT[devices], "amdp-ring")


def _accepts(*, devices: int, microbatches: int, steps: int) -> str | None:
    if reason := _devices_reason(devices):
        return reason
    if microbatches % devices:
        return f"microbatches per step must be a multiple of devices ({devices}: rounds of D), got {microbatches}"
    return None


def template(device: int, devices: int, first_round: bool, update: bool) -> str:
    """The kinds device ``device`` runs in one round: ``F``, ``B`` (``B`` first = carried over), ``U``."""
    opening = "FF" if first_round else ("FFB" if end_device(device) else "BFF")
    body = BODY[devices][end_device(device)]
    return opening + (body if update else body.replace("U", ""))


def generate(*, devices: int, microbatches: int, steps: int = 3) -> Schedule:
    rounds = microbatches // devices
    table = PLACEMENT[devices]
    pipelines = len(table)
    stage_on = [{p: table[p].index(d) for p in range(pipelines)} for d in range(devices)]

    def op(kind: str, device: int, local: int, round_: int) -> Op:
        p = local % pipelines
        return Op(kind, stage_on[device][p], round_ * devices + local, p)

    orders = []
    total_rounds = steps * rounds
    for d in range(devices):
        forwards = [op("F", d, i, r) for r in range(total_rounds) for i in FORWARD[devices][d]]
        backwards = [op("B", d, i, r) for r in range(total_rounds) for i in BACKWARD[devices][d]]
        order: list[Op] = []
        f = b = 0
        for r in range(total_rounds):
            step, round_in_step = divmod(r, rounds)
            kinds = template(d, devices, r == 0, round_in_step == 0 and step > 0)
            for kind in kinds:
                if kind == "F":
                    order.append(forwards[f])
                    f += 1
                elif kind == "B":
                    order.append(backwards[b])
                    b += 1
                else:
                    order.append(Op("U", d, step - 1))
        order += backwards[b:]  # the last round's carried-over backward
        order.append(Op("U", d, steps - 1))
        orders.append(order)
    return Schedule(
        Placement(devices, table, "amdp-ring"),
        orders,
        steps * microbatches,
        steps=steps,
        family="amdp",
        options={"steps": steps},
        asynchronous=True,
    )


AMDP = register(Family(
    name="amdp",
    generate=generate,
    summary="asynchronous multi-directional pipelines on a ring (D/2 replicas), rounds of D, no flush",
    source="AMDP authors' public Megatron-based code (orders, placement, round templates)",
    options=(STEPS,),
    accepts=_accepts,
    placement=placement,
    ops=lambda *, devices, microbatches, steps: devices * steps * (2 * microbatches + 1),
    asynchronous=True,
))
