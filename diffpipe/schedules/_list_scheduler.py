"""Greedy list scheduling: device orders for any placement from an event-driven simulation.

``list_schedule(placement, microbatches, ...)`` creates every compute op of every microbatch (F and
B, or F, I and W when the backward is split), then simulates time: whenever a device is idle it
starts the highest-priority op of its own whose data dependency (``_rules.data_predecessor``) has
finished. The order in which each device started its ops is its order in the returned, validated
``Schedule``. This is the classic list-scheduling heuristic (Graham, 1966) applied to pipeline
schedules, as Hanayo (Liu et al., SC'23) and the zero-bubble paper's greedy (Qi et al., ICLR 2024,
§3) do; families use it for placements without a published closed-form order (``hanayo``,
``chimera-asymmetric``) and users call it for custom placements.

No communication is modelled while scheduling (durations only), so ``table(schedule, durations)``
with the same durations reproduces the simulated start times exactly.

Priority rules (the smaller key runs first; ties always fall back to the oldest microbatch, then
the lowest stage, then the lowest pipeline, so the result is deterministic):

* ``"backward-first"``: B/I, then W, then F (1F1B-like: drain activations as soon as possible);
* ``"forward-first"``: F, then B/I, then W (GPipe-like: fill the pipeline first);
* ``"zero-bubble"``: B/I, then F, then W; W only fills otherwise idle time or frees memory when the
  activation cap stops F (the greedy of Qi et al., ICLR 2024, §3). Its default cap is
  ``placement.stages`` stage-microbatch activations per device: 1F1B's peak on its first device;
* a callable ``priority(op) -> key``: any sortable key, smaller first.

``memory_limit`` caps the in-flight activations of a device under any rule: an F may only start
while the device holds fewer than the cap (an activation is held from its F until its B, or W).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import ScheduleError
from ._analysis import activation_delta
from ._reference import Durations, as_duration_fn
from ._rules import data_predecessor
from ._schedule import Op, Placement, Schedule

#: The named priority rules.
PRIORITIES = ("backward-first", "forward-first", "zero-bubble")

Priority = str | Callable[[Op], Any]

_RANKS: dict[str, dict[str, int]] = {
    "backward-first": {"B": 0, "I": 0, "W": 1, "F": 2},
    "forward-first": {"F": 0, "B": 1, "I": 1, "W": 2},
    "zero-bubble": {"B": 0, "I": 0, "F": 1, "W": 2},
}


def _tiebreak(op: Op) -> tuple[int, int, int, str]:
    return (op.microbatch, op.stage, op.pipeline, op.kind)


def _key_function(priority: Priority) -> Callable[[Op], tuple[Any, ...]]:
    if callable(priority):
        return lambda op: (priority(op), _tiebreak(op))
    if priority not in _RANKS:
        raise ScheduleError(
            f"list_schedule: priority {priority!r} is not one of {', '.join(PRIORITIES)} or a callable"
        )
    ranks = _RANKS[priority]
    return lambda op: (ranks[op.kind], _tiebreak(op))


def _check_assignment(assignment: Sequence[int] | None, microbatches: int, pipelines: int) -> tuple[int, ...]:
    if assignment is None:
        return tuple(m % pipelines for m in range(microbatches))
    assignment = tuple(assignment)
    if len(assignment) != microbatches:
        raise ScheduleError(
            f"list_schedule: assignment has {len(assignment)} entries; give one pipeline per microbatch "
            f"({microbatches})"
        )
    for m, p in enumerate(assignment):
        if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < pipelines:
            raise ScheduleError(
                f"list_schedule: assignment[{m}] = {p!r} is not a pipeline of the placement "
                f"(0..{pipelines - 1})"
            )
    return assignment


def _check_limits(memory_limit: int | Sequence[int] | None, devices: int) -> tuple[float, ...]:
    if memory_limit is None:
        return (float("inf"),) * devices
    limits = (memory_limit,) * devices if isinstance(memory_limit, int) else tuple(memory_limit)
    if len(limits) != devices:
        raise ScheduleError(
            f"list_schedule: memory_limit has {len(limits)} entries; "
            f"give an int or one per device ({devices})"
        )
    for d, limit in enumerate(limits):
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ScheduleError(
                f"list_schedule: memory_limit of device {d} must be an int >= 1 (activations), got {limit!r}"
            )
    return tuple(float(limit) for limit in limits)


def greedy_run(
    placement: Placement,
    microbatches: int,
    *,
    assignment: Sequence[int] | None = None,
    split_backward: bool = False,
    durations: Durations | None = None,
    priority: Priority = "backward-first",
    memory_limit: int | Sequence[int] | None = None,
) -> tuple[tuple[tuple[Op, ...], ...], dict[Op, float]]:
    """The greedy simulation behind ``list_schedule``: per-device orders and each op's start time.

    Raises ``ScheduleError`` on bad arguments, or when a memory cap stalls every device.
    """
    if not isinstance(placement, Placement):
        raise ScheduleError(f"list_schedule: placement must be a Placement, got {type(placement).__name__}")
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
        raise ScheduleError(f"list_schedule: microbatches must be an int >= 1, got {microbatches!r}")
    if not isinstance(split_backward, bool):
        raise ScheduleError(f"list_schedule: split_backward must be a bool, got {split_backward!r}")
    pipeline_of = _check_assignment(assignment, microbatches, placement.pipelines)
    if memory_limit is None and priority == "zero-bubble":
        memory_limit = placement.stages
    limits = _check_limits(memory_limit, placement.devices)
    key = _key_function(priority)
    duration = as_duration_fn(durations)

    stages = placement.stages
    backward = "I" if split_backward else "B"
    backward_kind = {(pipeline_of[m], s, m): backward for m in range(microbatches) for s in range(stages)}
    successors: dict[Op, list[Op]] = {}
    roots: list[Op] = []
    total = 0
    for m, p in enumerate(pipeline_of):
        kinds = ("F", "I", "W") if split_backward else ("F", "B")
        for s in range(stages):
            for kind in kinds:
                op = Op(kind, s, m, p)
                total += 1
                found = data_predecessor(op, backward_kind, stages)
                if found is None:
                    roots.append(op)
                else:
                    successors.setdefault(found[0], []).append(op)

    # Per device, a heap of data-ready ops; ``keys`` memoizes the (possibly user-supplied) key.
    keys: dict[Op, tuple[Any, ...]] = {}
    ready: list[list[tuple[tuple[Any, ...], Op]]] = [[] for _ in range(placement.devices)]

    def make_ready(op: Op) -> None:
        if op not in keys:
            try:
                keys[op] = key(op)
            except Exception as error:  # a user callable failing is an argument error
                raise ScheduleError(f"list_schedule: priority({op}) raised {error!r}") from error
        heapq.heappush(ready[placement.device(op.pipeline, op.stage)], (keys[op], op))

    try:
        for op in roots:
            make_ready(op)
    except TypeError as error:
        raise ScheduleError(f"list_schedule: priority keys must be mutually comparable ({error})") from error

    orders: list[list[Op]] = [[] for _ in range(placement.devices)]
    start: dict[Op, float] = {}
    held = [0] * placement.devices
    busy = [False] * placement.devices
    running: list[tuple[float, int, Op]] = []
    time, done = 0.0, 0
    while done < total:
        for device in range(placement.devices):
            if busy[device]:
                continue
            op = _pick(ready[device], held[device] < limits[device])
            if op is None:
                continue
            orders[device].append(op)
            start[op] = time
            held[device] += max(activation_delta(op), 0)
            busy[device] = True
            length = duration(op)
            if not (isinstance(length, (int, float)) and math.isfinite(length) and length >= 0):
                raise ScheduleError(
                    f"list_schedule: durations({op}) = {length!r}; give a finite non-negative number"
                )
            heapq.heappush(running, (time + length, device, op))
        if not running:
            stuck = next(d for d in range(placement.devices) if ready[d])
            raise ScheduleError(
                f"list_schedule: memory_limit {int(limits[stuck])} stalls device {stuck}: its activations "
                f"fill the cap and no backward can run until it runs another forward; raise memory_limit "
                f"(or pass None)"
            )
        time = running[0][0]
        while running and running[0][0] == time:
            _, device, op = heapq.heappop(running)
            done += 1
            busy[device] = False
            held[device] += min(activation_delta(op), 0)
            for succ in successors.get(op, ()):
                try:
                    make_ready(succ)
                except TypeError as error:
                    raise ScheduleError(
                        f"list_schedule: priority keys must be mutually comparable ({error})"
                    ) from error
    return tuple(tuple(order) for order in orders), start


def _pick(heap: list[tuple[tuple[Any, ...], Op]], forward_allowed: bool) -> Op | None:
    """Pop the best op of a device's ready heap, skipping forwards when the memory cap is reached."""
    if forward_allowed:
        return heapq.heappop(heap)[1] if heap else None
    skipped = []
    chosen = None
    while heap:
        item = heapq.heappop(heap)
        if item[1].kind != "F":
            chosen = item[1]
            break
        skipped.append(item)
    for item in skipped:
        heapq.heappush(heap, item)
    return chosen


def list_schedule(
    placement: Placement,
    microbatches: int,
    *,
    assignment: Sequence[int] | None = None,
    split_backward: bool = False,
    durations: Durations | None = None,
    priority: Priority = "backward-first",
    memory_limit: int | Sequence[int] | None = None,
) -> Schedule:
    """A validated ``Schedule`` whose device orders come from a greedy event-driven simulation.

    Args:
        placement: where each (pipeline, stage) runs; any ``Placement``, including custom tables.
        microbatches: number of microbatches (one synchronous step).
        assignment: the pipeline of each microbatch (length ``microbatches``); default round-robin
            ``m mod placement.pipelines``.
        split_backward: run the backward as I (input gradient) then W (weight gradient).
        durations: per-kind times ``{"F": 1, "B": 2, "I": 1, "W": 1}`` (the ``table`` defaults) or a
            callable ``op -> time``; the greedy's decisions depend on them.
        priority: ``"backward-first"``, ``"forward-first"``, ``"zero-bubble"`` or a callable
            ``op -> sortable key`` (smaller runs first); see the module docstring.
        memory_limit: cap on in-flight activations per device (an int, or one per device); default
            none, except ``placement.stages`` for ``"zero-bubble"``.

    Returns:
        A ``Schedule`` with family ``"custom"``; ``table(result, durations)`` reproduces the
        greedy's timing.

    Raises:
        ScheduleError: on a bad argument, or when the memory cap stalls the greedy.
    """
    orders, _ = greedy_run(
        placement,
        microbatches,
        assignment=assignment,
        split_backward=split_backward,
        durations=durations,
        priority=priority,
        memory_limit=memory_limit,
    )
    name = priority if isinstance(priority, str) else getattr(priority, "__name__", "callable")
    options = {"priority": name, "split_backward": split_backward}
    if memory_limit is not None:
        options["memory_limit"] = memory_limit if isinstance(memory_limit, int) else tuple(memory_limit)
    return Schedule(placement, orders, microbatches, options=options)
