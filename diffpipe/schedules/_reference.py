"""The pure-Python reference evaluators: the semantics the JAX simulator is tested against.

Deliberately plain: visit ops in topological order (``evaluate``), or solve the equations of a
communication mode by plain iteration (``evaluate_network``). No JAX, no arrays.

Overlapped pairs (``Schedule.overlapped``: an ``F`` and the next op, a ``B`` or ``I``, run as one
interval, DualPipe's F&B chunk): the pair starts when the inputs of both members are ready and
lasts ``pair(F, B)`` (default: ``duration(F) + duration(B)``, no overlap; ``overlapped_time`` is
the form ``Hardware.pair_overlap`` uses). The forward is reported over the whole interval and the
backward as a zero-length op at its end (the time both outputs, the forward's activation and the
backward's gradient, are sent), so busy times and tables count the pair once.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._errors import ScheduleError
from ._ir import KINDS, Op
from ._rules import Dep

if TYPE_CHECKING:  # annotations only: _ops builds on this module
    from ._schedule import Schedule

#: Default unit durations of the tabular view and of the contention issue order (B = I + W).
DEFAULT_DURATIONS: Mapping[str, float] = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0, "U": 0.0, "R": 0.0}
#: The ``durations`` key of an overlapped pair's time (DeepSeek's notation); absent: F + B.
PAIR = "F&B"

Durations = Mapping[str, float] | Callable[[Op], float]
PairDuration = Callable[[Op, Op], float]


def overlapped_time(forward: Any, backward: Any, overlap: Any) -> Any:
    """Time of an overlapped pair whose members alone last ``forward`` and ``backward``: the
    fraction ``overlap`` (in [0, 1]) of the shorter one is hidden under the longer one,
    ``forward + backward - overlap * min(forward, backward)``; 0 is F + B, 1 is max(F, B).
    Plain arithmetic (``min`` as ``(a + b - |a - b|) / 2``), so floats and JAX arrays alike."""
    shorter = (forward + backward - abs(forward - backward)) / 2
    return forward + backward - overlap * shorter


def as_pair_fn(durations: Durations | None) -> PairDuration | None:
    """The pair time of a ``{kind: time}`` mapping: its ``"F&B"`` entry (a finite non-negative
    number, every pair alike), else None (each pair lasts F + B)."""
    if durations is None or callable(durations) or PAIR not in durations:
        return None
    value = durations[PAIR]
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ScheduleError(f"durations: {PAIR} must be a finite non-negative number, got {value!r}")
    return lambda f, b: float(value)


def _pair_fn(duration: Callable[[Op], float], pair: PairDuration | None) -> PairDuration:
    return pair if pair is not None else (lambda f, b: duration(f) + duration(b))


def _placed(op: Op, ready: Callable[[Op], float], duration: Callable[[Op], float],
            together: PairDuration, pairs: dict[Op, Op]) -> dict[Op, tuple[float, float]]:
    """(start, finish) of ``op`` once its inputs are ``ready``; a pair's forward places the pair:
    it starts when both members' inputs are ready, lasts ``together``, and its backward is
    reported as a zero-length interval at the pair's end."""
    begin = ready(op)
    if op not in pairs:
        return {op: (begin, begin + duration(op))}
    b = pairs[op]
    begin = max(begin, ready(b))
    end = begin + together(op, b)
    return {op: (begin, end), b: (end, end)}


def pair_order(schedule: Schedule) -> tuple[dict[Op, Op], tuple[Op, ...]]:
    """The pairs of ``schedule`` (forward -> backward) and a topological order of its ops in which
    each pair's two members are adjacent and come after every input of either (Kahn over units:
    a pair or a single op). Raises ``ScheduleError`` when merging a pair closes a cycle."""
    pairs = {schedule.orders[d][i]: schedule.orders[d][i + 1] for d, i in schedule.overlapped}
    unit = {op: op for op in schedule.ops}
    for f, b in pairs.items():
        unit[b] = f
    waiting: dict[Op, int] = dict.fromkeys(set(unit.values()), 0)
    after: dict[Op, list[Op]] = {}
    for op in schedule.ops:
        for dep in schedule.dependencies[op]:
            a, b = unit[dep.op], unit[op]
            if a != b:
                waiting[b] += 1
                after.setdefault(a, []).append(b)
    ready = deque(u for u in schedule.ops if unit[u] == u and waiting[u] == 0)
    order: list[Op] = []
    while ready:
        u = ready.popleft()
        order.extend((u, pairs[u]) if u in pairs else (u,))
        for v in after.get(u, ()):
            waiting[v] -= 1
            if waiting[v] == 0:
                ready.append(v)
    if len(order) != len(schedule.ops):
        stuck = next(f for f in pairs if f not in set(order))
        raise ScheduleError(f"schedule: overlapped pair {stuck} + {pairs[stuck]} deadlocks: an input of one "
                            "member waits for the other")
    return pairs, tuple(order)


def as_duration_fn(durations: Durations | None) -> Callable[[Op], float]:
    """A per-op duration function from a ``{kind: time}`` mapping (missing kinds take the default)."""
    if durations is None:
        durations = {}
    if callable(durations):
        return durations
    unknown = set(durations) - set(KINDS) - {PAIR}  # the pair's time: ``as_pair_fn``
    if unknown:
        raise ScheduleError(f"durations: unknown op kind(s) {sorted(unknown)}; kinds are {', '.join(KINDS)}")
    table = {**DEFAULT_DURATIONS, **durations}
    for kind, value in table.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ScheduleError(f"durations: {kind} must be a finite non-negative number, got {value!r}")
    return lambda op: float(table[op.kind])


def evaluate(
    schedule: Schedule,
    duration: Callable[[Op], float],
    delay: Callable[[Op, Dep], float] | None = None,
    pair: PairDuration | None = None,
) -> tuple[dict[Op, float], dict[Op, float]]:
    """Start and finish time of every op: ``start = max(0, max over edges (finish[pred] + delay))``.

    **Arguments:** ``duration(op)``; ``delay(op, dep)`` the extra time on the edge ``dep -> op``
    (a transfer, say; default 0); ``pair(f, b)`` the time of an overlapped pair (module
    docstring; default ``duration(f) + duration(b)``). **Returns:** ``(start, finish)`` keyed by op.
    """
    start: dict[Op, float] = {}
    finish: dict[Op, float] = {}
    pairs, ops = (schedule._pairs if schedule.overlapped else ({}, schedule.ops))
    partner = {b: f for f, b in pairs.items()}
    together = _pair_fn(duration, pair)

    def ready(op: Op) -> float:
        at = 0.0
        for dep in schedule.dependencies[op]:
            if op in partner and dep.op == partner[op]:
                continue  # the pair's own lane edge
            extra = delay(op, dep) if delay is not None else 0.0
            at = max(at, finish[dep.op] + extra)
        return at

    for op in ops:  # topological order (pairs adjacent, after both members' inputs)
        if op in partner:
            continue
        for x, (begin, end) in _placed(op, ready, duration, together, pairs).items():
            start[x], finish[x] = begin, end
    return start, finish


def evaluate_network(
    schedule: Schedule,
    duration: Callable[[Op], float],
    transfer: Callable[[Op, Dep], float],
    communication: Any,
    devices_per_node: int | None = None,
    setup: float = 0.0,
    pair: PairDuration | None = None,
) -> tuple[dict[Op, float], dict[Op, float], dict[tuple[Op, Op], tuple[float, float]]]:
    """Reference semantics of a communication mode, as equations solved by plain iteration.

    The mode is an ``AbstractCommunication`` (``diffpipe.communication("contention")``, say); this
    function only reads what the mode declares:

    - ``transfer_nodes`` false: a consumer starts ``cost(transfer)`` after its producer finishes;
    - ``transfer_nodes`` true: a transfer of duration ``cost(transfer)`` starts when its producer
      has finished, and its consumer waits for it to end;
    - ``waits(schedule, devices_per_node)``: further ``(waiter, waited)`` pairs of ops or transfers
      (a transfer is its ``(producer, consumer)`` pair): the waiter starts after the waited ends.

    Every op starts when all it waits for has finished (``max``, at least ``setup``: the step's
    fixed time before its first op, ``Hardware.setup``); an overlapped pair starts when everything
    either member waits for has finished and lasts ``pair(f, b)`` (``evaluate``). The equations are
    re-evaluated until nothing changes (a longest-path fixed point, reached within as many rounds
    as the graph has nodes; raises ``ScheduleError`` if the waits form a cycle and it never is).

    **Arguments:** ``duration(op)``; ``transfer(consumer, dep)`` the time of the transfer on edge
    ``dep`` on its link; ``communication`` the mode; ``devices_per_node`` its topology (None: one
    node). **Returns:** op starts, op finishes, and ``(start, finish)`` of each transfer node keyed
    by ``(producer, consumer)``.
    """
    deps = schedule.dependencies
    as_node = communication.transfer_nodes
    pairs = schedule.pairs
    partner = {b: f for f, b in pairs.items()}
    together = _pair_fn(duration, pair)
    start = {op: setup for op in schedule.ops}
    finish = {op: setup + duration(op) for op in schedule.ops}
    xfer: dict[tuple[Op, Op], tuple[float, float]] = {}
    cost: dict[tuple[Op, Op], float] = {}
    for op in schedule.ops:
        for dep in deps[op]:
            if dep.is_transfer:
                cost[(dep.op, op)] = communication.cost(transfer(op, dep))
                if as_node:
                    xfer[(dep.op, op)] = (0.0, cost[(dep.op, op)])
    waits: dict[Any, list[Any]] = {}
    for waiter, waited in communication.waits(schedule, devices_per_node):
        waits.setdefault(waiter, []).append(waited)

    def end(node: Any) -> float:
        return xfer[node][1] if isinstance(node, tuple) else finish[node]

    changed = True
    rounds = 0
    while changed:
        if rounds > len(start) + len(xfer):
            raise ScheduleError(f"the schedule deadlocks under {communication} communication (its waits form a cycle)")
        rounds += 1
        changed = False
        for key, old in xfer.items():
            ready = max([end(key[0]), *map(end, waits.get(key, ()))])
            new = (ready, ready + cost[key])
            if new != old:
                xfer[key], changed = new, True
        def ready_of(op: Op) -> float:
            ready = setup
            for dep in deps[op]:
                if dep.is_transfer and as_node:
                    ready = max(ready, xfer[(dep.op, op)][1])
                elif dep.is_transfer:
                    ready = max(ready, finish[dep.op] + cost[(dep.op, op)])
                elif partner.get(op) != dep.op:  # not a pair's own lane edge
                    ready = max(ready, finish[dep.op])
            for node in waits.get(op, ()):
                ready = max(ready, end(node))
            return ready

        for op in schedule.ops:
            if op in partner:
                continue
            for x, (begin, stop) in _placed(op, ready_of, duration, together, pairs).items():
                if (begin, stop) != (start[x], finish[x]):
                    start[x], finish[x], changed = begin, stop, True
    return start, finish, xfer


def evaluate_gradient_sync(
    schedule: Schedule,
    finish: Mapping[Op, float],
    xfer: Mapping[tuple[Op, Op], tuple[float, float]],
    sync: Callable[[int], float],
    update: Callable[[int, int], float],
    communication: Any,
) -> tuple[dict[int, tuple[float, float]], dict[tuple[int, int], tuple[float, float]]]:
    """Reference semantics of ``compile(..., gradient_sync=True)`` (docs/architecture.md, "The
    data-parallel gradient sync").

    Compute ops and transfers never wait for a sync or an update, so their times are those of
    ``evaluate_network`` (``finish``, ``xfer``); this adds, in plain steps:

    - the sync of stage ``s`` (``R``, lasting ``sync(s)``) starts when the last backward (the last
      ``B`` or ``W`` in its device's order) of every pipeline's copy of ``s`` has ended and the
      previous sync on the sync lane of every device holding ``s`` has ended. A device's syncs run
      one at a time, stages ordered by when their last backward ends at the default unit durations
      (``DEFAULT_DURATIONS``; on one device, its order), ties by stage;
    - the update of (pipeline ``p``, stage ``s``) (``U``, lasting ``update(p, s)``) runs on the
      compute lane of the device holding it, after the device's last op, anything that holds the
      device past it (``communication.tail_waits``), the device's previous update, and the sync of
      ``s``; a device updates its stages in sync order (then by pipeline).

    **Returns:** ``(start, finish)`` of every sync keyed by stage, and of every update keyed by
    ``(pipeline, stage)``. The step ends at the latest of these and of every op and transfer.
    """
    pipelines, stages = schedule.pipelines, schedule.stages
    holder = schedule.placement.device
    last_backward: dict[tuple[int, int], Op] = {}
    for order in schedule.orders:
        for op in order:
            if op.kind in ("B", "W"):
                last_backward[(op.pipeline, op.stage)] = op  # later ops overwrite earlier ones
    _, unit_finish = evaluate(schedule, as_duration_fn(None))

    def issue_key(s: int) -> tuple[float, int]:
        return max(unit_finish[last_backward[(p, s)]] for p in range(pipelines)), s

    sync_order = sorted(range(stages), key=issue_key)
    sync_lane_free = [0.0] * schedule.devices
    syncs: dict[int, tuple[float, float]] = {}
    for s in sync_order:
        devices = {holder(p, s) for p in range(pipelines)}
        begin = max([finish[last_backward[(p, s)]] for p in range(pipelines)]
                    + [sync_lane_free[d] for d in devices])
        syncs[s] = (begin, begin + sync(s))
        for d in devices:
            sync_lane_free[d] = syncs[s][1]

    def end(node: Any) -> float:
        return xfer[node][1] if isinstance(node, tuple) else finish[node]

    updates: dict[tuple[int, int], tuple[float, float]] = {}
    for d, order in enumerate(schedule.orders):
        free = max([finish[order[-1]], *map(end, communication.tail_waits(schedule, d))])
        held = {(op.pipeline, op.stage) for op in order}
        for p, s in sorted(held, key=lambda ps: (sync_order.index(ps[1]), ps[0])):
            begin = max(free, syncs[s][1])
            updates[(p, s)] = (begin, begin + update(p, s))
            free = updates[(p, s)][1]
    return syncs, updates
