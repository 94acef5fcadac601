"""Zero-bubble schedules: the backward split into I (input gradient) and W (weight gradient).

Source: Qi, Wan, Huang and Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024 (§2: ZB-H1 and
ZB-H2; §6: ZB-V), and Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024
(V-shape building blocks). I must follow the I of the next stage (it carries the gradient);
W only its own I, so W passes can be moved into bubbles.

``zb-h1``: 1F1B's warm-up of ``D-d-1`` forwards; device d then runs its first ``d`` steady steps as
``F I`` with the W held back, later steps as ``F I W``, and the held-back W passes fill the
cool-down. Peak activations stay at 1F1B's maximum, ``min(D, N)`` (counted until W frees them).
With ``chunks`` > 1 it is the interleaved form on a loop placement. For every ``chunks`` the order
is exactly ``torch.distributed.pipelining.ScheduleInterleavedZeroBubble``'s ("ZB1P").

``zb-h2``: more warm-up forwards (``2(D-d)-1`` on device d) so the first I meets no bubble,
and the W passes reordered at the tail (device d ends with ``2d+1`` of them) so that, at
``t_F = t_I = t_W``, every device is busy without a gap from its first op to its last: the
paper's parallelogram. Deterministic construction (derived here; the paper draws it): after the
warm-up, device d runs ``I, ((W, F), I) × a, (F or W, I) × (2D-2)`` with ``a = N-2D+1`` and the single
slots taking d's remaining ``2d`` forwards first, then its W passes. For ``N < 2D-1`` the order
for ``2D-1`` microbatches is built and the extra microbatches dropped (as torch does for ZB-V).

``zb-v``: two chunks per device on a V placement (stage s on device s for s < D, else 2D-1-s),
exactly ``torch.distributed.pipelining.ScheduleZBVZeroBubble``'s order (the handcrafted ZB-V of
§6: warm-up of chunk-0 forwards, then ``F I W`` per chunk, I passes first at the tail).
"""

from __future__ import annotations

from collections.abc import Mapping

from .._registry import Family, Formula, Option, at_least, register
from .._schedule import Op, Placement, Schedule
from .interleaved import accepts_rounds
from .interleaved import rounds as _rounds

# -- zb-h1 (torch's ZB1P, any number of chunks) ----------------------------------------------------


def _zb_h1_order(device: int, devices: int, microbatches: int, chunks: int) -> list[Op]:
    d, v = device, chunks
    _, per_round = _rounds(devices, microbatches)
    total = microbatches * v
    warmup = min((v - 1) * per_round + (devices - 1 - d), total)
    next_mb = {kind: [0] * v for kind in "FIW"}

    def op(kind: str, chunk: int) -> Op:
        m = next_mb[kind][chunk]
        next_mb[kind][chunk] += 1
        return Op(kind, chunk * devices + d, m)

    def forward_chunk(k: int) -> int:
        return (k // per_round) % v

    def backward_chunk(k: int) -> int:
        return v - 1 - ((k - warmup) // per_round) % v

    order = [op("F", forward_chunk(k)) for k in range(warmup)]
    pending_w: list[int] = []  # chunks of the I passes whose W is still to run, oldest first
    for k in range(warmup, total + warmup):
        if k < total:
            order.append(op("F", forward_chunk(k)))
        order.append(op("I", backward_chunk(k)))
        pending_w.append(backward_chunk(k))
        if k - warmup >= d:  # the first d steady steps hold their W back
            order.append(op("W", pending_w.pop(0)))
    order += [op("W", chunk) for chunk in pending_w]
    return order


def _accepts_zb_h1(*, devices: int, microbatches: int, chunks: int) -> str | None:
    return accepts_rounds(devices, microbatches) if chunks > 1 else None


def _placement_zb_h1(*, devices: int, chunks: int) -> Placement:
    return Placement.linear(devices) if chunks == 1 else Placement.loop(devices, chunks)


def generate_zb_h1(*, devices: int, microbatches: int, chunks: int = 1) -> Schedule:
    placement = _placement_zb_h1(devices=devices, chunks=chunks)
    orders = [_zb_h1_order(d, devices, microbatches, chunks) for d in range(devices)]
    return Schedule(placement, orders, microbatches, family="zb-h1", options={"chunks": chunks})


def formula_zb_h1(
    *, devices: int, microbatches: int, durations: Mapping[str, float], chunks: int = 1
) -> Formula | None:
    """Makespan ``N(t_F+t_I+t_W) + (D-1)(t_F+t_I-t_W)`` (Qi et al. 2024, §2.1: a bubble of
    ``(D-1)(t_F+t_I-t_W)``, a third of 1F1B's at equal times) for one chunk, ``N >= D`` and
    ``t_W <= min(t_F, t_I)``, where every held-back W fits a cool-down bubble; outside that regime
    the W passes lengthen the step (checked against ``table``). Peak activations ``min(D, N)`` on
    every device: 1F1B's maximum, as the paper states, counting an activation until its W.

    None for ``chunks > 1`` or outside the regime: no published closed form.
    """
    d, n = devices, microbatches
    f, i, w = durations["F"], durations["I"], durations["W"]
    if chunks != 1 or n < d or w > min(f, i):
        return None
    makespan = n * (f + i + w) + (d - 1) * (f + i - w)
    return Formula(
        makespan=makespan,
        bubble_ratio=1 - n * (f + i + w) / makespan if makespan else 0.0,
        assumption="uniform stage times, no communication, N >= D, t_W <= min(t_F, t_I)",
        peak_activations=(min(d, n),) * d,
    )


# -- zb-h2 ---------------------------------------------------------------------------------------------


def _zb_h2_order(device: int, devices: int, microbatches: int) -> list[Op]:
    d, n = device, microbatches  # here n >= 2D - 1
    counters = {"F": 0, "I": 0, "W": 0}

    def op(kind: str) -> Op:
        counters[kind] += 1
        return Op(kind, d, counters[kind] - 1)

    order = [op("F") for _ in range(2 * (devices - d) - 1)]
    order.append(op("I"))
    paired = n - 2 * devices + 1  # gaps between consecutive I passes that hold an F and a W
    for gap in range(n - 1):
        if gap < paired:
            order += [op("W"), op("F")]
        else:
            order.append(op("F") if gap - paired < 2 * d else op("W"))
        order.append(op("I"))
    order += [op("W") for _ in range(n - counters["W"])]
    return order


def generate_zb_h2(*, devices: int, microbatches: int) -> Schedule:
    padded = max(microbatches, 2 * devices - 1)
    orders = [
        [op for op in _zb_h2_order(d, devices, padded) if op.microbatch < microbatches]
        for d in range(devices)
    ]
    return Schedule(Placement.linear(devices), orders, microbatches, family="zb-h2")


def formula_zb_h2(*, devices: int, microbatches: int, durations: Mapping[str, float]) -> Formula | None:
    """Makespan of one step ``N(t_F+t_I+t_W) + (D-1)·max(t_F, t_F+t_I-2t_W)`` for ``N >= 2D-1``
    and ``t_F >= t_I``; peak activations ``2D-1`` on every device (device 0 in its warm-up, device
    d > 0 before its tail, while its W passes wait). Derived here and checked against ``table``.

    The paper's term ``(D-1)(t_F+t_I+2c-2t_W)`` (c the p2p time, 0 here) is the bubble *per
    device*: at ``t_F = t_I = t_W`` every device is busy for ``N(t_F+t_I+t_W)`` without a gap, the
    parallelogram. A single step still pays ``(D-1)·t_F`` before the last device starts; the paper
    hides that fill by overlapping consecutive steps (optimizer post-validation), which the one-step
    ``table`` does not model. None outside these conditions.
    """
    d, n = devices, microbatches
    f, i, w = durations["F"], durations["I"], durations["W"]
    if n < 2 * d - 1 or f < i:
        return None
    makespan = n * (f + i + w) + (d - 1) * max(f, f + i - 2 * w)
    return Formula(
        makespan=makespan,
        bubble_ratio=1 - n * (f + i + w) / makespan if makespan else 0.0,
        assumption="uniform stage times, no communication, N >= 2D-1, t_F >= t_I, one step",
        peak_activations=(2 * d - 1,) * d,
    )


# -- zb-v (torch's ScheduleZBVZeroBubble) -------------------------------------------------------------


def _zb_v_order(device: int, devices: int, microbatches: int) -> list[Op]:
    """torch's ``ScheduleZBVZeroBubble._calculate_single_rank_operations`` for ``n >= 2D-1``."""
    r, n = device, microbatches
    chunk0, chunk1 = r, 2 * devices - 1 - r
    count = {(kind, c): 0 for kind in "FIW" for c in (0, 1)}
    order: list[Op] = []

    def add(kind: str, chunk: int) -> None:
        order.append(Op(kind, (chunk0, chunk1)[chunk], count[(kind, chunk)]))
        count[(kind, chunk)] += 1

    for _ in range(2 * (devices - r) - 1):
        add("F", 0)
    for _ in range(r):
        add("F", 1)
        add("F", 0)
    for _ in range(devices - r):
        add("F", 1)
        add("I", 1)
        add("W", 1)
    while count[("F", 1)] < count[("F", 0)] or count[("F", 0)] < n:
        if count[("F", 0)] < n:
            add("F", 0)
        add("I", 0)
        add("W", 0)
        add("F", 1)
        add("I", 1)
        add("W", 1)
    for _ in range(r):
        add("I", 0)
        add("I", 1)
    for _ in range(devices - r):
        add("I", 0)
        add("W", 0)
    while count[("W", 1)] < count[("I", 1)]:
        add("W", 1)
    while count[("W", 0)] < count[("I", 0)]:
        add("W", 0)
    return order


def generate_zb_v(*, devices: int, microbatches: int) -> Schedule:
    padded = max(microbatches, 2 * devices - 1)
    orders = [
        [op for op in _zb_v_order(d, devices, padded) if op.microbatch < microbatches] for d in range(devices)
    ]
    return Schedule(Placement.v(devices), orders, microbatches, family="zb-v")


def formula_zb_v(*, devices: int, microbatches: int, durations: Mapping[str, float]) -> Formula | None:
    """At per-chunk ``t_F = t_I = t_W = t`` and ``N >= 2D-1``: makespan ``(6N + D - 1)·t``.

    Derived here and checked against ``table``. Qi et al. 2024, §6, claim zero bubble: every
    device runs its 6N chunk-passes without a gap; one step adds the fill ``(D-1)·t`` before the
    last device's first forward, as for zb-h2. Peak activations ``2D`` chunk-microbatches on
    every device: 1F1B's peak of D full-stage activations, as the paper states.
    None for other times or sizes.
    """
    d, n = devices, microbatches
    f, i, w = durations["F"], durations["I"], durations["W"]
    if not f == i == w or n < 2 * d - 1:
        return None
    makespan = (6 * n + d - 1) * f
    return Formula(
        makespan=makespan,
        bubble_ratio=1 - 6 * n * f / makespan if makespan else 0.0,
        assumption="per-chunk t_F = t_I = t_W, no communication, N >= 2D-1",
        peak_activations=(2 * d,) * d,
    )


ZB_H1 = register(Family(
    name="zb-h1",
    generate=generate_zb_h1,
    summary="zero bubble, 1F1B memory: W passes held back into the cool-down (torch ZB1P)",
    source="Qi et al., Zero Bubble PP, ICLR 2024, §2.1; torch ScheduleInterleavedZeroBubble",
    formula=formula_zb_h1,
    options=(Option("chunks", int, 1, at_least(1), "model chunks per device (loop placement when > 1)"),),
    accepts=_accepts_zb_h1,
    placement=_placement_zb_h1,
    ops_per_cell=3,
))

ZB_H2 = register(Family(
    name="zb-h2",
    generate=generate_zb_h2,
    summary="zero bubble per device at equal F/I/W: 2(D-d)-1 warm-up forwards, W passes at the tail",
    source="Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, §2.2",
    formula=formula_zb_h2,
    ops_per_cell=3,
    placement=lambda *, devices: Placement.linear(devices),
))

ZB_V = register(Family(
    name="zb-v",
    generate=generate_zb_v,
    summary="zero bubble on a V placement (2 chunks per device), 1F1B memory",
    source="Qi et al., Zero Bubble PP, ICLR 2024, §6; torch ScheduleZBVZeroBubble",
    formula=formula_zb_v,
    ops_per_cell=3,
    placement=lambda *, devices: Placement.v(devices),
))
