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

from .._registry import Family, Formula, Option, at_least, register
from .._schedule import Op, Placement, Schedule


def rounds(devices: int, microbatches: int) -> tuple[int, int]:
    """torch's flexible interleaving: ``max(1, N // D)`` rounds of ``N // rounds`` microbatches each."""
    count = max(1, microbatches // devices)
    return count, microbatches // count


def accepts_rounds(devices: int, microbatches: int) -> str | None:
    """None when N splits into ``rounds(D, N)`` equal rounds (torch's requirement), else the reason
    with the nearest N that would."""
    count = rounds(devices, microbatches)[0]
    if microbatches % count == 0:
        return None
    lower = microbatches // count * count
    return (f"microbatches ({microbatches}) must split into max(1, N // devices) = {count} equal rounds "
            f"(as in torch); try microbatches={lower} or {lower + count}, or a multiple of devices ({devices})")


def _interleaved_order(device: int, devices: int, microbatches: int, chunks: int) -> list[Op]:
    """Megatron's per-device order (``get_model_chunk_id`` and its warm-up count), with torch's
    rounds of ``r`` microbatches in place of D (the same when D divides N)."""
    d, n, v = device, microbatches, chunks
    per_round = rounds(devices, n)[1]
    total = n * v
    warmup = min((devices - d - 1) * 2 + (v - 1) * per_round, total)
    next_mb = {"F": [0] * v, "B": [0] * v}

    def op(kind: str, chunk: int) -> Op:
        m = next_mb[kind][chunk]
        next_mb[kind][chunk] += 1
        return Op(kind, chunk * devices + d, m)

    def forward(k: int) -> Op:
        return op("F", (k // per_round) % v)

    def backward(k: int) -> Op:
        return op("B", v - 1 - (k // per_round) % v)

    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    order += [backward(k) for k in range(total - warmup, total)]
    return order


def _accepts_interleaved(*, devices: int, microbatches: int, chunks: int) -> str | None:
    """torch's requirement: N in ``max(1, N // D)`` equal rounds (Megatron's N a multiple of D passes)."""
    return accepts_rounds(devices, microbatches)


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
    """Per-chunk op times f, b: makespan ``max(N·v + D - 1, v·D + N - 1)·(f+b)``.

    For N >= D this is Narayanan et al. 2021, §2.2.2: ``N·v(f+b) + (D-1)(f+b)``, the bubble of
    1F1B divided by v, ``(D-1)/(vN+D-1)``; it holds for torch's flexible rounds too. For N < D
    (one round of N) microbatch 0's lap through all ``v·D`` stages and back is the critical path,
    ``(v·D + N - 1)(f+b)`` (derived here, checked against ``table``).

    Peak activations (chunk-microbatches) on device d: the warm-up
    ``w = (D-d-1)·2 + (v-1)·r`` forwards (r microbatches per round, D when D divides N) plus the
    steady state's one forward before its backward, ``min(w + 1, N·v)``.
    """
    d, n, v = devices, microbatches, chunks
    f, b = durations["F"], durations["B"]
    per_round = rounds(d, n)[1]
    slots = max(n * v + d - 1, v * d + n - 1)
    return Formula(
        makespan=slots * (f + b),
        bubble_ratio=1 - n * v / slots,
        assumption="uniform per-chunk times, no communication, N in max(1, N // D) equal rounds",
        peak_activations=tuple(min((d - i - 1) * 2 + (v - 1) * per_round + 1, n * v) for i in range(d)),
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
