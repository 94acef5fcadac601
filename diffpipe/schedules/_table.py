"""The tabular view: a schedule laid out as devices x time slots.

``table(schedule)`` uses unit-ish durations (default F=1, B=2, I=W=1, U=R=0, no communication), as
in the figures of the pipeline papers and the idealized-table level of the "Tabular Schedule
Abstraction" paper. The times come from the reference evaluator (``_reference.evaluate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._errors import ScheduleError
from ._ir import Op
from ._reference import Durations, as_duration_fn, as_pair_fn, evaluate

if TYPE_CHECKING:  # annotations only: _ops builds on this module (Schedule.__str__ is a table)
    from ._schedule import Schedule

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
    """Lay ``schedule`` out with per-kind durations (default F=1, B=2, I=W=1, U=R=0), no communication;
    ``durations["F&B"]`` is the time of an overlapped pair (default F + B)."""
    if not all(hasattr(schedule, a) for a in ("orders", "placement", "ops")):  # Schedule builds on this module
        raise ScheduleError(f"table: expected a Schedule, got {schedule!r}")
    duration = as_duration_fn(durations)
    start, finish = evaluate(schedule, duration, pair=as_pair_fn(durations))
    return Table(schedule, start, finish)
