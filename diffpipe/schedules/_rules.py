"""The dependency rules: the one place where ops + placement become a dependency graph.

1. lane order: each op waits for the previous op in its device's order (one compute stream);
   a collective ``R`` waits for the previous op on every participating device.
2. data: ``F(p,s,m) <- F(p,s-1,m)``; ``B|I(p,s,m) <- B|I(p,s+1,m)``; ``B|I(p,S-1,m) <- F(p,S-1,m)``;
   ``W(p,s,m) <- I(p,s,m)``.
3. a data edge between different devices is a transfer: an activation (forward) or a gradient
   (backward) crossing the stage boundary ``b`` (between stages ``b-1`` and ``b`` of pipeline p).
4. ``U`` and ``R`` have lane edges only: lane order already puts every contributing op before them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ._ir import Op, Placement

LANE = "lane"  #: previous op on the same device
DATA = "data"  #: data dependency inside one device (no transfer)
ACTIVATION = "activation"  #: forward transfer of an activation to another device
GRADIENT = "gradient"  #: backward transfer of a gradient to another device
EDGES = (LANE, DATA, ACTIVATION, GRADIENT)


@dataclass(frozen=True, slots=True)
class Dep:
    """One incoming edge: ``op`` must finish (plus any transfer) before the dependent op starts.

    ``boundary`` is the stage boundary crossed by a data edge (-1 when none); ``src`` and ``dst``
    are the devices of the two ends (equal for lane and same-device data edges).
    """

    op: Op
    edge: str
    boundary: int
    src: int
    dst: int

    @property
    def is_transfer(self) -> bool:
        return self.edge in (ACTIVATION, GRADIENT)


def data_predecessor(
    op: Op, backward_kind: Mapping[tuple[int, int, int], str], stages: int
) -> tuple[Op, int] | None:
    """Rule 2: the op whose output ``op`` consumes, with the stage boundary crossed (-1 if none).

    ``backward_kind[(pipeline, stage, microbatch)]`` is ``"B"`` or ``"I"``: whichever op carries
    the input gradient of that stage (split schedules use ``I``).
    """
    p, s, m = op.pipeline, op.stage, op.microbatch
    if op.kind == "F":
        return (Op("F", s - 1, m, p), s) if s > 0 else None
    if op.kind in ("B", "I"):
        if s == stages - 1:
            return Op("F", s, m, p), -1
        return Op(backward_kind[(p, s + 1, m)], s + 1, m, p), s + 1
    if op.kind == "W":
        return Op("I", s, m, p), -1
    return None


def dependencies(
    orders: Sequence[Sequence[Op]],
    placement: Placement,
    backward_kind: Mapping[tuple[int, int, int], str],
) -> dict[Op, tuple[Dep, ...]]:
    """Every op's incoming edges (lane and data), derived from the orders and the placement.

    Assumes the ops are complete and placed correctly (``_validate`` checks that first).
    """
    deps: dict[Op, list[Dep]] = {}
    for device, order in enumerate(orders):
        previous = None
        for op in order:
            incoming = deps.setdefault(op, [])
            if previous is not None:
                incoming.append(Dep(previous, LANE, -1, device, device))
            previous = op
    for op, incoming in deps.items():
        found = data_predecessor(op, backward_kind, placement.stages)
        if found is None:
            continue
        pred, boundary = found
        src = placement.device(pred.pipeline, pred.stage)
        dst = placement.device(op.pipeline, op.stage)
        if src == dst:
            edge = DATA
        else:
            edge = ACTIVATION if op.kind == "F" else GRADIENT
        incoming.append(Dep(pred, edge, boundary, src, dst))
    return {op: tuple(incoming) for op, incoming in deps.items()}
