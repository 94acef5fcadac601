"""Timing-free properties of a schedule read off its device orders: in-flight activations, staleness.

Because a device runs its order sequentially, these are exact for any durations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._errors import ConfigError
from ._schedule import Op, Schedule


def releases_activation(op: Op) -> bool:
    """Whether ``op`` frees the activation stored by ``F`` of its stage and microbatch.

    The activation is needed until the op that last reads it ends: ``B``, or ``W`` in split
    schedules (a split schedule has no ``B``, so both rules are one).
    """
    return op.kind == "B" or op.kind == "W"


def activation_delta(op: Op) -> int:
    """The release rule: ``+1`` at ``F``, ``-1`` at the op that frees it (``B``, or ``W`` when the
    backward is split), ``0`` otherwise. The one copy every discrete-world peak is built on;
    ``diffpipe.peak_memory`` evaluates the same rule on a ``Graph`` (``Graph.release``)."""
    if op.kind == "F":
        return 1
    return -1 if releases_activation(op) else 0


def in_flight(schedule: Schedule) -> tuple[tuple[int, ...], ...]:
    """Per device, the number of stage-microbatch activations held after each op of its order."""
    result = []
    for order in schedule.orders:
        held, trace = 0, []
        for op in order:
            held += activation_delta(op)
            trace.append(held)
        result.append(tuple(trace))
    return tuple(result)


def peak_activations(schedule: Schedule) -> tuple[int, ...]:
    """Per device, the peak number of stored stage-microbatch activations (max prefix sum)."""
    return tuple(max(trace, default=0) for trace in in_flight(schedule))


def activation_peaks(schedule: Schedule, amount: Callable[[int, int, int], float]) -> tuple[float, ...]:
    """Per device, the peak of stored activation amounts (e.g. bytes).

    ``amount(pipeline, stage, microbatch)`` is added at each ``F`` and taken back at the op that
    frees it (``activation_delta``); the peak is the max prefix sum along the device's order,
    exact for any timing (at least 0).
    """
    peaks = []
    for order in schedule.orders:
        held = peak = 0.0
        for op in order:
            delta = activation_delta(op)
            if delta:
                held += delta * amount(op.pipeline, op.stage, op.microbatch)
                peak = max(peak, held)
        peaks.append(float(peak))
    return tuple(peaks)


def _values(x: Any) -> Any:
    """An array-like (numpy, JAX, nested sequences, scalar) as nested Python floats."""
    x = x.tolist() if hasattr(x, "tolist") else x
    return [_values(v) for v in x] if isinstance(x, (list, tuple)) else float(x)


def activation_table(schedule: Schedule, activation_bytes: Any, size: Any
                     ) -> tuple[tuple[tuple[float, ...], ...], tuple[float, ...]]:
    """``activation_bytes`` as ``[pipelines][stages]`` and ``size`` as ``[microbatches]`` floats (the
    broadcasting of ``Hardware.per_stage`` / ``per_microbatch``: a scalar, ``[stages]`` or
    ``[pipelines, stages]``; a scalar or ``[microbatches]``)."""
    act, sizes = _values(activation_bytes), _values(size)
    p, s, m = schedule.pipelines, schedule.stages, schedule.microbatches
    if not isinstance(act, list):
        act = [[act] * s] * p
    elif act and not isinstance(act[0], list) and len(act) == s:
        act = [act] * p
    if not isinstance(sizes, list):
        sizes = [sizes] * m
    if (len(act) != p or any(not isinstance(row, list) or len(row) != s for row in act)
            or len(sizes) != m or any(isinstance(v, list) for v in sizes)):
        raise ConfigError(f"hardware: activation_bytes or size do not fit {schedule.family}'s {p} x {s} stages "
                          f"and {m} microbatches")
    return tuple(tuple(row) for row in act), tuple(sizes)


def activation_bytes_peaks(schedule: Schedule, activation_bytes: Any, size: Any) -> tuple[float, ...]:
    """Per device, the peak stored activation bytes ``activation_bytes[p, s] x size[m]``
    (``activation_peaks`` with ``activation_table``'s broadcasting)."""
    act, sizes = activation_table(schedule, activation_bytes, size)
    return activation_peaks(schedule, lambda p, s, m: act[p][s] * sizes[m])


def staleness(schedule: Schedule) -> dict[Op, int]:
    """For every forward ``F(p,s,m)``: the number of optimizer steps ``U`` on its device between it
    and the op that consumes its weights' gradient (``B``, or ``I`` in split schedules).

    0 for synchronous schedules. A positive value means the backward ran on weights that changed
    since the forward (unless the family stashes weights; see its docstring).
    """
    result: dict[Op, int] = {}
    for order in schedule.orders:
        updates = 0
        seen_at: dict[tuple[int, int, int], int] = {}
        for op in order:
            key = (op.pipeline, op.stage, op.microbatch)
            if op.kind == "U":
                updates += 1
            elif op.kind == "F":
                seen_at[key] = updates
            elif op.kind in ("B", "I"):
                result[Op("F", *key[1:], key[0])] = updates - seen_at[key]
    return result


def weight_versions(schedule: Schedule) -> tuple[tuple[int, ...], ...]:
    """Weight versions of each ``(pipeline, stage)`` held at once: 1, or with weight stashing one
    more than the largest staleness of the stage's microbatches (PipeDream: D-d on device d;
    PipeDream-2BW: 2)."""
    versions = [[1] * schedule.stages for _ in range(schedule.pipelines)]
    if schedule.stashing:
        for op, stale in staleness(schedule).items():
            row = versions[op.pipeline]
            row[op.stage] = max(row[op.stage], 1 + stale)
    return tuple(tuple(row) for row in versions)
