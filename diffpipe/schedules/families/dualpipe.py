"""DualPipe and DualPipe-V: DeepSeek's bidirectional pipeline, and its fold onto a V placement.

Source: DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, §3.2.1 (DualPipe) and the
``deepseek-ai/DualPipe`` repository (``DualPipeV``); the order is exactly
``torch.distributed.pipelining.ScheduleDualPipeV``'s. Stage s runs on device s for s < D and on
2D-1-s otherwise (``Placement.v``). Device d runs ``2(D-d-1)`` chunk-0 forwards, ``d+1`` pairs of
chunk-0 and chunk-1 forwards, ``D-d-1`` zero-bubble steps ``I W F`` on chunk 1, then the main
phase of overlapped forward-backward pairs (chunk 0 forward with chunk 1 backward, chunk 1 forward
with chunk 0 backward), and a cool-down whose second half splits backwards into I and W.

torch's compound action ``(aFb;cBd)OVERLAP_F_B`` keeps its two ops in the order, the forward then
the full backward, and is marked as an overlapped pair (``Schedule.overlapped``): evaluators run
it as one interval that starts when both members' inputs are ready and lasts the pair's time,
``Hardware.pair_overlap`` (the fraction of the shorter pass hidden under the longer one: DeepSeek's
F&B chunk overlaps one pass's all-to-all communication with the other's compute). Without it a
pair lasts F + B, as two consecutive ops would.

``dualpipe``: the original two-way DualPipe (``deepseek-ai/DualPipe``, ``dualpipe.py``) on D = PP
devices (D even): two copies of the model run in opposite directions on ``Placement.mirrored``
(pipeline 0 down, stage s on device s; pipeline 1 up, stage s on device D-1-s, as Chimera's), so
every device holds two stages, twice 1F1B's parameters. Pipeline 0 takes microbatches 0..N/2-1,
pipeline 1 the other half. Device r runs DualPipe-V's program for device ``h = min(r, D-1-r)`` of
``D/2`` devices and N/2 microbatches (the authors' two ``step`` functions are the same eight steps),
with chunk c meaning direction ``c XOR (r >= D/2)`` (their ``phase ^= is_in_second_half``).

The closed forms take the pair's time as ``durations["F&B"]`` (``table`` reads the same key).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .._reference import PAIR
from .._registry import Family, Formula, register
from .._schedule import Op, Placement, Schedule


def _dualpipe_v_order(
    device: int, devices: int, microbatches: int, where: Callable[[str, int, int], Op] | None = None
) -> tuple[list[Op], list[int]]:
    """torch's ``ScheduleDualPipeV._calculate_single_rank_operations``: the order, and the indices
    of the forwards that open an overlapped pair (torch's ``add_overlap_f_b``). ``where(kind,
    chunk, k)`` is the op of the k-th pass of that kind on ``chunk`` (default: the V's stages)."""
    r, n = device, microbatches
    stage = (r, 2 * devices - 1 - r)
    if where is None:
        def where(kind: str, chunk: int, k: int) -> Op:
            return Op(kind, stage[chunk], k)
    count = {(kind, c): 0 for kind in "FIW" for c in (0, 1)}  # a full B counts as its I and W
    pending_w: list[tuple[int, int]] = []  # (chunk, microbatch) of I passes awaiting their W
    order: list[Op] = []
    pairs: list[int] = []

    def add(kind: str, chunk: int) -> None:
        key = (kind, chunk) if kind != "B" else ("I", chunk)
        m = count[key]
        order.append(where(kind, chunk, m))
        if kind == "B":
            count[("I", chunk)] += 1
            count[("W", chunk)] += 1
        else:
            count[key] += 1
            if kind == "I":
                pending_w.append((chunk, m))

    def add_pending_w() -> None:
        if pending_w:
            chunk, m = pending_w.pop(0)
            order.append(where("W", chunk, m))
            count[("W", chunk)] += 1

    def overlapped(forward_chunk: int, backward_chunk: int) -> None:
        pairs.append(len(order))
        add("F", forward_chunk)
        add("B", backward_chunk)

    for _ in range((devices - r - 1) * 2):  # step 1: chunk-0 forwards
        add("F", 0)
    for _ in range(r + 1):  # step 2: forward pairs
        add("F", 0)
        add("F", 1)
    for _ in range(devices - r - 1):  # step 3: I W F on chunk 1
        add("I", 1)
        add_pending_w()
        add("F", 1)
    for i in range(n - 2 * devices + r + 1):  # step 4: the overlapped main phase
        if i == 0 and r == devices - 1:
            add("F", 0)  # not overlapped in torch, to shorten the bubble
            add("B", 1)
        else:
            overlapped(0, 1)
        overlapped(1, 0)
    for _ in range(devices - r - 1):  # step 5
        add("B", 1)
        overlapped(1, 0)
    split = False
    for i in range(r + 1):  # step 6: the second half of these backwards is split
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        add("I" if split else "B", 1)
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        add("I" if split else "B", 0)
    for _ in range(devices - r - 1):  # step 7
        add_pending_w()
        add("I" if split else "B", 0)
    for _ in range(r + 1):  # step 8
        add_pending_w()
    return order, pairs


def _build(placement: Placement, programs: list[tuple[list[Op], list[int]]], microbatches: int,
           family: str) -> Schedule:
    marks = frozenset((d, i) for d, (_, pairs) in enumerate(programs) for i in pairs)
    return Schedule(placement, [order for order, _ in programs], microbatches, family=family, overlapped=marks)


def _accepts(*, devices: int, microbatches: int) -> str | None:
    if microbatches < 2 * devices:
        return (f"microbatches ({microbatches}) must be at least 2 * devices = {2 * devices} "
                f"(one per stage of the V, as in torch)")
    return None


def generate(*, devices: int, microbatches: int) -> Schedule:
    programs = [_dualpipe_v_order(d, devices, microbatches) for d in range(devices)]
    return _build(Placement.v(devices), programs, microbatches, "dualpipe-v")


def formula(*, devices: int, microbatches: int, durations: Mapping[str, float]) -> Formula | None:
    """At per-chunk ``t_F = t_I = t_W = t`` (so ``t_B = 2t``) and overlapped pairs of time
    ``t_FB = durations["F&B"]`` (default F + B = 3t, no overlap) between ``2t`` and ``3t``, with
    ``h = 3t - t_FB`` the time a pair hides: makespan ``(6N + 2D - 2)·t - (2N - D - 2)·h``, and
    peak activations ``2D + 1`` chunk-microbatches on every device (DeepSeek's table: PP+1
    full-stage activations against 1F1B's PP). The busy time is ``6NDt - pairs·h`` with
    ``pairs = D(2N - 3D + 1) + D(D-1)/2 - 1`` (torch's ``OVERLAP_F_B`` count). A pair starts when
    both members' inputs are ready, so at h = 0 the makespan exceeds zb-v's ``(6N + D - 1)·t`` by
    ``(D - 1)·t``; device 0's idle time is then DeepSeek's published bubble ``(PP/2-1)(F&B+B-3W)``
    with PP = 2D. Derived here and checked against ``table``. Other times get None.
    """
    d, n = devices, microbatches
    f, i, w, b = durations["F"], durations["I"], durations["W"], durations["B"]
    pair = durations.get(PAIR, f + b)
    if not (f == i == w and b == i + w and b <= pair <= f + b) or n < 2 * d:
        return None
    hidden = f + b - pair
    makespan = (6 * n + 2 * d - 2) * f - (2 * n - d - 2) * hidden
    pairs = d * (2 * n - 3 * d + 1) + d * (d - 1) // 2 - 1
    busy = 6 * n * d * f - pairs * hidden
    return Formula(
        makespan=makespan,
        bubble_ratio=1 - busy / (d * makespan) if makespan else 0.0,
        assumption="per-chunk t_F = t_I = t_W, t_B = t_I + t_W, max(F, B) <= F&B <= F + B, no communication",
        peak_activations=(2 * d + 1,) * d,
    )


DUALPIPE_V = register(Family(
    name="dualpipe-v",
    generate=generate,
    summary="DeepSeek DualPipe-V: V placement, overlapped forward/backward pairs, zero-bubble tail",
    source="DeepSeek-V3 Technical Report, 2024, §3.2.1; deepseek-ai/DualPipe; torch ScheduleDualPipeV",
    formula=formula,
    accepts=_accepts,
    ops_per_cell=3,
    placement=lambda *, devices: Placement.v(devices),
))


# -- dualpipe (two-way, two model copies) -------------------------------------------------------------


def _dualpipe_order(device: int, devices: int, microbatches: int) -> tuple[list[Op], list[int]]:
    """The authors' ``DualPipe.step`` on rank ``device``: DualPipe-V's program for its half rank."""
    half, per_direction = devices // 2, microbatches // 2
    second_half = device >= half

    def where(kind: str, chunk: int, k: int) -> Op:
        direction = chunk ^ second_half  # 0: pipeline 0, down; 1: pipeline 1, up
        stage = device if direction == 0 else devices - 1 - device
        return Op(kind, stage, k + direction * per_direction, direction)

    return _dualpipe_v_order(min(device, devices - 1 - device), half, per_direction, where)


def _accepts_dualpipe(*, devices: int, microbatches: int) -> str | None:
    if devices % 2:
        return f"devices must be even (two pipelines in opposite directions), got {devices}"
    if microbatches % 2 or microbatches < 2 * devices:
        return (f"microbatches must be even and at least 2 * devices = {2 * devices} (half per direction, "
                f"as in deepseek-ai/DualPipe), got {microbatches}")
    return None


def generate_dualpipe(*, devices: int, microbatches: int) -> Schedule:
    programs = [_dualpipe_order(d, devices, microbatches) for d in range(devices)]
    return _build(Placement.mirrored(devices), programs, microbatches, "dualpipe")


def formula_dualpipe(*, devices: int, microbatches: int, durations: Mapping[str, float]) -> Formula | None:
    """DualPipe-V's form for ``D/2`` devices and N/2 microbatches (each device runs that program):
    at ``t_F = t_I = t_W = t`` and pairs hiding ``h = 3t - t_FB``, makespan ``(3N + D - 2)·t -
    (N - D/2 - 2)·h``; peak activations ``D + 1`` stage-microbatches on every device (DeepSeek's
    table: PP + 1). None for other times."""
    half = formula(devices=devices // 2, microbatches=microbatches // 2, durations=durations)
    if half is None:
        return None
    return Formula(
        makespan=half.makespan,
        bubble_ratio=half.bubble_ratio,
        assumption=half.assumption,
        peak_activations=(devices + 1,) * devices,
    )


DUALPIPE = register(Family(
    name="dualpipe",
    generate=generate_dualpipe,
    summary="DeepSeek DualPipe: two model copies in opposite directions (mirrored), overlapped F&B pairs",
    source="DeepSeek-V3 Technical Report, 2024, §3.2.1; deepseek-ai/DualPipe (dualpipe.py)",
    formula=formula_dualpipe,
    accepts=_accepts_dualpipe,
    ops_per_cell=3,
    placement=lambda *, devices: Placement.mirrored(devices),
))
