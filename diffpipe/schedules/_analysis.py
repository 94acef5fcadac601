"""Timing-free properties of a schedule read off its device orders: in-flight activations, staleness.

Because a device runs its order sequentially, these are exact for any durations.
"""

from __future__ import annotations

from ._ops import Op, Schedule


def releases_activation(op: Op) -> bool:
    """Whether ``op`` frees the activation stored by ``F`` of its stage and microbatch.

    The activation is needed until the op that last reads it ends: ``B``, or ``W`` in split schedules.
    """
    return op.kind == "B" or op.kind == "W"


def in_flight(schedule: Schedule) -> tuple[tuple[int, ...], ...]:
    """Per device, the number of stage-microbatch activations held after each op of its order."""
    result = []
    for order in schedule.orders:
        held, trace = 0, []
        for op in order:
            if op.kind == "F":
                held += 1
            elif releases_activation(op):
                held -= 1
            trace.append(held)
        result.append(tuple(trace))
    return tuple(result)


def peak_activations(schedule: Schedule) -> tuple[int, ...]:
    """Per device, the peak number of stored stage-microbatch activations (max prefix sum)."""
    return tuple(max(trace, default=0) for trace in in_flight(schedule))


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
