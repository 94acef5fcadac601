"""The tabular abstraction and the pure-Python reference evaluator.

``table(schedule)`` lays a schedule out as devices x time slots with unit-ish durations
(default F=1, B=2, I=W=1, U=R=0, no communication), as in the figures of the pipeline papers and
the idealized-table level of the "Tabular Schedule Abstraction" paper. The evaluator is
deliberately plain: visit ops in topological order, start each at the latest finish of its
predecessors (plus the edge's delay). It is the reference the JAX simulator is tested against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .._errors import ScheduleError
from ._ops import KINDS, Op, Schedule
from ._rules import Dep

#: Default unit durations of the table (B = I + W).
DEFAULT_DURATIONS: Mapping[str, float] = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0, "U": 0.0, "R": 0.0}

Durations = Mapping[str, float] | Callable[[Op], float]


def as_duration_fn(durations: Durations | None) -> Callable[[Op], float]:
    """A per-op duration function from a ``{kind: time}`` mapping (missing kinds take the default)."""
    if durations is None:
        durations = {}
    if callable(durations):
        return durations
    unknown = set(durations) - set(KINDS)
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
) -> tuple[dict[Op, float], dict[Op, float]]:
    """Start and finish time of every op: ``start = max(0, max over edges (finish[pred] + delay))``.

    ``delay(op, dep)`` is the extra time on the edge ``dep -> op`` (a transfer, say); default 0.
    """
    start: dict[Op, float] = {}
    finish: dict[Op, float] = {}
    for op in schedule.ops:  # topological order
        ready = 0.0
        for dep in schedule.dependencies[op]:
            extra = delay(op, dep) if delay is not None else 0.0
            ready = max(ready, finish[dep.op] + extra)
        start[op] = ready
        finish[op] = ready + duration(op)
    return start, finish


@dataclass(frozen=True)
class Table:
    """A schedule laid out in time. ``bubble_ratio`` is the idle fraction of devices x makespan."""

    schedule: Schedule
    start: dict[Op, float]
    finish: dict[Op, float]

    @property
    def makespan(self) -> float:
        return max(self.finish.values(), default=0.0)

    @property
    def busy(self) -> tuple[float, ...]:
        """Busy time per device (a collective counts on every participant)."""
        totals = [0.0] * self.schedule.devices
        for op in self.schedule.ops:
            for device in self.schedule.devices_of(op):
                totals[device] += self.finish[op] - self.start[op]
        return tuple(totals)

    @property
    def bubble_ratio(self) -> float:
        total = self.schedule.devices * self.makespan
        return 1.0 - sum(self.busy) / total if total > 0 else 0.0

    def label(self, op: Op) -> str:
        """Cell text: kind and microbatch, ``.c`` for chunk c > 0 on its device, ``'`` per pipeline."""
        text = f"{op.kind}{op.microbatch}"
        placement = self.schedule.placement
        if op.kind in ("F", "B", "I", "W"):
            chunk = placement.chunk(op.pipeline, op.stage)
            if chunk:
                text += f".{chunk}"
        return text + "'" * op.pipeline

    def render(self, unit: float | None = None) -> str:
        """Devices x time slots of width ``unit`` (default: the shortest positive duration)."""
        durations = [self.finish[op] - self.start[op] for op in self.schedule.ops]
        positive = [d for d in durations if d > 0]
        if unit is None:
            unit = min(positive, default=1.0)
        slots = math.ceil(self.makespan / unit - 1e-9) if self.makespan else 0
        rows = []
        for order in self.schedule.orders:
            cells = ["."] * slots
            for op in order:
                first = round(self.start[op] / unit)
                last = round(self.finish[op] / unit)
                for slot in range(first, min(last, slots)):
                    cells[slot] = self.label(op)
            rows.append(cells)
        width = max((len(c) for row in rows for c in row), default=1)
        name = max(len(f"d{len(rows) - 1}"), 2)
        lines = [f"{'d' + str(d):<{name}} | " + " ".join(c.ljust(width) for c in row).rstrip()
                 for d, row in enumerate(rows)]
        return "\n".join(lines)

    def __str__(self) -> str:
        s = self.schedule
        header = (
            f"{s.family}: {s.devices} devices, {s.stages} stages, {s.microbatches} microbatches — "
            f"makespan {self.makespan:g}, bubble {self.bubble_ratio:.3f}"
        )
        return header + "\n" + self.render()


def table(schedule: Schedule, durations: Durations | None = None) -> Table:
    """Lay ``schedule`` out with per-kind durations (default F=1, B=2, I=W=1, U=R=0), no communication."""
    if not isinstance(schedule, Schedule):
        raise ScheduleError(f"table: expected a Schedule, got {schedule!r}")
    start, finish = evaluate(schedule, as_duration_fn(durations))
    return Table(schedule, start, finish)


def transfer_order(
    schedule: Schedule, link_of: Callable[[int, int], object]
) -> dict[object, list[tuple[Op, Op]]]:
    """The issue order of transfers on each link (``link_of(src, dst)`` names the link):
    ``(producer, consumer)`` pairs sorted by the producer's finish in the unit-time table, ties by
    topological position. Every dependency then increases that key, so chaining a link's transfers
    in this order never creates a cycle."""
    _, finish = evaluate(schedule, as_duration_fn(None))
    position = {op: i for i, op in enumerate(schedule.ops)}
    lanes: dict[object, list[tuple[Op, Op]]] = {}
    for op in schedule.ops:
        for dep in schedule.dependencies[op]:
            if dep.is_transfer:
                lanes.setdefault(link_of(dep.src, dep.dst), []).append((dep.op, op))
    for queue in lanes.values():
        queue.sort(key=lambda pair: (finish[pair[0]], position[pair[0]]))
    return lanes


def evaluate_network(
    schedule: Schedule,
    duration: Callable[[Op], float],
    transfer: Callable[[Op, Dep], float],
    mode: str,
    link_of: Callable[[int, int], object] | None = None,
) -> tuple[dict[Op, float], dict[Op, float], dict[tuple[Op, Op], tuple[float, float]]]:
    """Reference semantics of every communication mode, as equations solved by plain iteration.

    - ``none``: transfers take no time; ``overlap``: a consumer starts ``transfer`` after its producer;
    - ``contention``: a transfer starts after its producer and after the previous transfer on its
      link (``transfer_order``) has finished;
    - ``blocking``: a transfer starts after its producer and after the op before the consumer on the
      receiving device; the op after the producer on the sending device waits for it to end.

    Every op starts when all it waits for has finished (``max``, at least 0). The equations are
    re-evaluated until nothing changes (a longest-path fixed point, reached within as many rounds as
    the dependency graph is deep). Returns op starts, op finishes, and ``(start, finish)`` of each
    transfer keyed by ``(producer, consumer)``.
    """
    as_node = mode in ("contention", "blocking")
    deps = schedule.dependencies
    links_before: dict[tuple[Op, Op], tuple[Op, Op]] = {}
    if mode == "contention":
        for queue in transfer_order(schedule, link_of or (lambda s, d: (s, d))).values():
            links_before.update(zip(queue[1:], queue[:-1]))
    orders = schedule.orders
    position = {(d, op): i for d, order in enumerate(orders) for i, op in enumerate(order)}

    start = {op: 0.0 for op in schedule.ops}
    finish = {op: duration(op) for op in schedule.ops}
    xfer: dict[tuple[Op, Op], tuple[float, float]] = {}
    for op in schedule.ops:
        for dep in deps[op]:
            if dep.is_transfer and as_node:
                xfer[(dep.op, op)] = (0.0, transfer(op, dep))
    waits_on_send: dict[Op, list[tuple[Op, Op]]] = {}
    if mode == "blocking":
        for (producer, consumer), _ in xfer.items():
            sender = schedule.devices_of(producer)[0]
            i = position[(sender, producer)]
            if i + 1 < len(orders[sender]):
                waits_on_send.setdefault(orders[sender][i + 1], []).append((producer, consumer))

    changed = True
    while changed:
        changed = False
        for key, (t0, t1) in xfer.items():
            producer, consumer = key
            ready = finish[producer]
            if key in links_before:
                ready = max(ready, xfer[links_before[key]][1])
            if mode == "blocking":
                receiver = schedule.devices_of(consumer)[0]
                i = position[(receiver, consumer)]
                if i > 0:
                    ready = max(ready, finish[orders[receiver][i - 1]])
            new = (ready, ready + transfer(consumer, next(d for d in deps[consumer] if d.op == producer)))
            if new != (t0, t1):
                xfer[key], changed = new, True
        for op in schedule.ops:
            ready = 0.0
            for dep in deps[op]:
                if dep.is_transfer and as_node:
                    ready = max(ready, xfer[(dep.op, op)][1])
                elif dep.is_transfer and mode == "overlap":
                    ready = max(ready, finish[dep.op] + transfer(op, dep))
                else:
                    ready = max(ready, finish[dep.op])
            for key in waits_on_send.get(op, ()):
                ready = max(ready, xfer[key][1])
            if ready != start[op]:
                start[op], finish[op], changed = ready, ready + duration(op), True
    return start, finish, xfer
