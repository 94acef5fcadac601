"""Interleaved 1F1B (Megatron virtual stages) and looped breadth-first pipelines.

Both put ``devices * chunks`` stages on a loop placement: stage s on device ``s mod D``
(``Placement.loop``), so a microbatch visits every device ``chunks`` times.

``interleaved-1f1b``. Source: Narayanan et al., "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", SC 2021, §2.2.2 (Fig. 4); Megatron-LM's
``forward_backward_pipelining_with_interleaving``. Device d runs
``min((D-d-1)·2 + (v-1)·D, N·v)`` warm-up forwards, then alternates one forward and one
backward, then drains its backwards. Forward number k runs chunk ``(k // D) mod v``, backward
number k chunk ``v-1 - (k // D) mod v`` (depth first: D microbatches per chunk in turn). With N a
multiple of D this is exactly ``torch.distributed.pipelining.ScheduleInterleaved1F1B``'s compute
order (torch also accepts some other N; diffpipe keeps Megatron's requirement).

``looped-bfs``. Source: Lamy-Poirier, "Breadth-First Pipeline Parallelism", MLSys 2023;
``torch.distributed.pipelining.ScheduleLoopedBFS``, whose compute order this is: all forwards of
chunk 0 (microbatches 0..N-1), then of chunk 1, ...; then the backwards chunk by chunk in reverse,
microbatches N-1..0 within a chunk.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._ops import Op, Placement, Schedule
from ._registry import Family, Formula, Option, at_least, register


def _interleaved_order(device: int, devices: int, microbatches: int, chunks: int) -> list[Op]:
    """Megatron's per-device order (``get_model_chunk_id`` and its warm-up count)."""
    d, n, v = device, microbatches, chunks
    total = n * v
    warmup = min((devices - d - 1) * 2 + (v - 1) * devices, total)
    next_mb = {"F": [0] * v, "B": [0] * v}

    def op(kind: str, chunk: int) -> Op:
        m = next_mb[kind][chunk]
        next_mb[kind][chunk] += 1
        return Op(kind, chunk * devices + d, m)

    def forward(k: int) -> Op:
        return op("F", (k // devices) % v)

    def backward(k: int) -> Op:
        return op("B", v - 1 - (k // devices) % v)

    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    order += [backward(k) for k in range(total - warmup, total)]
    return order


def _accepts_interleaved(*, devices: int, microbatches: int, chunks: int) -> str | None:
    """Megatron's requirement: N a multiple of D."""
    if microbatches % devices:
        lower = microbatches // devices * devices
        options = [m for m in (lower, lower + devices) if m > 0]
        return (f"microbatches ({microbatches}) must be a multiple of devices ({devices}); "
                f"try microbatches={' or '.join(map(str, options))}")
    return None


def generate_interleaved(*, devices: int, microbatches: int, chunks: int = 2) -> Schedule:
    orders = [_interleaved_order(d, devices, microbatches, chunks) for d in range(devices)]
    return Schedule(
        Placement.loop(devices, chunks),
        orders,
        microbatches,
        family="interleaved-1f1b",
        options={"chunks": chunks},
    )


def formula_interleaved(
    *, devices: int, microbatches: int, durations: Mapping[str, float], chunks: int = 2
) -> Formula:
    """Per-chunk op times f, b: makespan ``N·v(f+b) + (D-1)(f+b)``, bubble ``(D-1)/(vN+D-1)``
    (Narayanan et al. 2021, §2.2.2: the bubble of 1F1B divided by v).

    Peak activations (chunk-microbatches) on device d: Megatron's warm-up
    ``w = (D-d-1)·2 + (v-1)·D`` forwards plus the steady state's one forward before its backward,
    ``min(w + 1, N·v)``.
    """
    d, n, v = devices, microbatches, chunks
    f, b = durations["F"], durations["B"]
    return Formula(
        makespan=n * v * (f + b) + (d - 1) * (f + b),
        bubble_ratio=(d - 1) / (v * n + d - 1),
        assumption="uniform per-chunk times, no communication, N a multiple of D",
        peak_activations=tuple(min((d - i - 1) * 2 + (v - 1) * d + 1, n * v) for i in range(d)),
    )


def _looped_bfs_order(device: int, devices: int, microbatches: int, chunks: int) -> list[Op]:
    stages = [c * devices + device for c in range(chunks)]
    order = [Op("F", s, m) for s in stages for m in range(microbatches)]
    order += [Op("B", s, m) for s in reversed(stages) for m in reversed(range(microbatches))]
    return order


def generate_looped_bfs(*, devices: int, microbatches: int, chunks: int = 2) -> Schedule:
    orders = [_looped_bfs_order(d, devices, microbatches, chunks) for d in range(devices)]
    return Schedule(
        Placement.loop(devices, chunks), orders, microbatches, family="looped-bfs", options={"chunks": chunks}
    )


def formula_looped_bfs(
    *, devices: int, microbatches: int, durations: Mapping[str, float], chunks: int = 2
) -> Formula:
    """Per-chunk op times f, b: makespan ``((v-1)·max(N, D) + N + D - 1)(f + b)``.

    Derived here (and checked against ``table``): device 0 starts chunk c's forwards when both its
    own chunk c-1 and the first microbatch's lap round the loop are done, ``c·max(N, D)·f``; the last
    forward ends ``(N + D - 1)·f`` after chunk v-1 starts, and the backwards mirror the forwards.
    For N >= D this is interleaved 1F1B's makespan. Every device holds all N·v activations.
    """
    d, n, v = devices, microbatches, chunks
    f, b = durations["F"], durations["B"]
    slots = (v - 1) * max(n, d) + n + d - 1
    return Formula(
        makespan=slots * (f + b),
        bubble_ratio=1 - n * v / slots,
        assumption="uniform per-chunk times, no communication",
        peak_activations=(n * v,) * d,
    )


CHUNKS = Option("chunks", int, 2, at_least(1), "model chunks (virtual stages) per device")


def _placement(*, devices: int, chunks: int) -> Placement:
    return Placement.loop(devices, chunks)


INTERLEAVED_1F1B = register(Family(
    name="interleaved-1f1b",
    generate=generate_interleaved,
    summary="Megatron interleaved 1F1B: v chunks per device on a loop, depth first",
    source="Narayanan et al., Megatron-LM, SC 2021, §2.2.2",
    formula=formula_interleaved,
    options=(CHUNKS,),
    accepts=_accepts_interleaved,
    placement=_placement,
))

LOOPED_BFS = register(Family(
    name="looped-bfs",
    generate=generate_looped_bfs,
    summary="breadth-first looping: all microbatches through chunk 0, then chunk 1, ...; GPipe-like flush",
    source="Lamy-Poirier, Breadth-First Pipeline Parallelism, MLSys 2023; torch ScheduleLoopedBFS",
    formula=formula_looped_bfs,
    options=(CHUNKS,),
    placement=_placement,
))
