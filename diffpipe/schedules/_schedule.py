"""The schedule IR: ``Op``, ``Placement`` (from ``_ir``) and ``Schedule``, frozen and hashable.

A schedule is data: a placement of model stages on devices, and one order of ops per device.
Dependencies are never stored here; they are derived from ops + placement by ``_rules``, and
``_validate`` checks a schedule when it is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._checks import is_int
from .._errors import ScheduleError
from ._ir import COMPUTE_KINDS as COMPUTE_KINDS
from ._ir import KINDS as KINDS
from ._ir import Op as Op
from ._ir import Placement as Placement
from ._ir import rows
from ._reference import pair_order
from ._table import table
from ._validate import validate


def _freeze(options: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
    items = options.items() if isinstance(options, Mapping) else options
    return tuple(sorted((str(k), v) for k, v in items))


@dataclass(frozen=True)
class Schedule:
    """A placement plus one order of ops per device, validated on construction.

    Attributes:
        placement: the stage-to-device map.
        orders: ``orders[d]`` is the sequence of ops device d runs, in order (one compute stream).
            An ``R`` (collective) op appears in the order of every participating device.
        microbatches: number of microbatch ids used, ``0 .. microbatches-1`` (over all steps).
        steps: optimizer steps the schedule spans; microbatch m belongs to step
            ``m // (microbatches // steps)``. Synchronous schedules have one step; asynchronous
            ones (PipeDream, AMDP) are unrolled over several so that a simulator sees steady state.
        family: the generator's registry name, or ``"custom"``.
        options: the generator's options (sorted ``(name, value)`` pairs).
        asynchronous: whether weights are updated while other microbatches are in flight.
        stashing: whether each in-flight microbatch keeps the weight version its forward used
            (PipeDream weight stashing, PipeDream-2BW's second version): memory then holds
            ``1 + max staleness`` versions of a stage (``_analysis.weight_versions``).
        overlapped: ``(device, index)`` positions where ``orders[device][index]`` (an ``F``) and
            the next op (a ``B`` or ``I`` of another stage or microbatch, which must not depend on
            that ``F`` except by lane order) form one *overlapped pair*: DualPipe's F&B chunk,
            torch's ``OVERLAP_F_B``. The orders keep both ops (memory, validation and the table
            read them as usual); evaluators run the pair as one interval that starts when both
            members' inputs are ready and lasts the pair's time (``Hardware.pair_overlap``; by default
            F + B). Default empty: no pairs.

    Construction validates (see ``_validate.validate``) and raises ``ScheduleError`` naming the
    first problem; a ``Schedule`` object is therefore always valid and deadlock-free.
    """

    placement: Placement
    orders: tuple[tuple[Op, ...], ...]
    microbatches: int
    steps: int = 1
    family: str = "custom"
    options: tuple[tuple[str, Any], ...] = ()
    asynchronous: bool = False
    stashing: bool = False
    overlapped: frozenset[tuple[int, int]] = field(default=frozenset(), repr=False)
    _derived: Any = field(default=None, init=False, repr=False, compare=False, hash=False)
    _pairs: Any = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.placement, Placement):
            raise ScheduleError(f"schedule: placement must be a Placement, got {self.placement!r}")
        for name in ("microbatches", "steps"):
            if not is_int(getattr(self, name)):
                raise ScheduleError(f"schedule: {name} must be an int, got {getattr(self, name)!r}")
        object.__setattr__(self, "orders", rows(self.orders, "schedule: orders"))
        object.__setattr__(self, "options", _freeze(self.options))
        object.__setattr__(self, "_derived", validate(self))
        object.__setattr__(self, "overlapped", self._check_overlapped())
        if self.overlapped:
            object.__setattr__(self, "_pairs", pair_order(self))

    def _check_overlapped(self) -> frozenset[tuple[int, int]]:
        """``overlapped`` as a frozenset of ``(device, index)``, each naming a valid pair."""
        try:
            marks = frozenset(tuple(mark) for mark in self.overlapped)
        except TypeError:
            raise ScheduleError(f"schedule: overlapped must be (device, index) pairs, "
                                f"got {self.overlapped!r}") from None
        for mark in sorted(marks, key=repr):
            if len(mark) != 2 or not all(is_int(x) for x in mark):
                raise ScheduleError(f"schedule: overlapped must hold (device, index) pairs of ints, got {mark!r}")
            d, i = mark
            if not (0 <= d < self.devices and 0 <= i < len(self.orders[d]) - 1):
                raise ScheduleError(f"schedule: overlapped pair {mark} is outside the orders (device {d}, "
                                    f"index {i}: needs an op and the next one)")
            f, b = self.orders[d][i], self.orders[d][i + 1]
            if f.kind != "F" or b.kind not in ("B", "I"):
                raise ScheduleError(f"schedule: overlapped pair {mark} is {f} then {b}; a pair is an F "
                                    "followed by a B or I")
            if (d, i + 1) in marks or (d, i - 1) in marks:
                raise ScheduleError(f"schedule: overlapped pairs {mark} and its neighbour share an op")
            if any(dep.op == f and dep.edge != "lane" for dep in self.dependencies[b]):
                raise ScheduleError(f"schedule: overlapped pair {mark}: {b} needs the output of {f}, so "
                                    "they cannot overlap")
        return marks

    @property
    def pairs(self) -> Mapping[Op, Op]:
        """The overlapped pairs, forward -> backward (empty when ``overlapped`` is)."""
        return {} if self._pairs is None else self._pairs[0]

    # -- sizes --------------------------------------------------------------------------------
    @property
    def devices(self) -> int:
        return self.placement.devices

    @property
    def stages(self) -> int:
        return self.placement.stages

    @property
    def pipelines(self) -> int:
        return self.placement.pipelines

    @property
    def microbatches_per_step(self) -> int:
        return self.microbatches // self.steps

    def step_of(self, op: Op) -> int:
        """The optimizer step an op belongs to."""
        return op.microbatch if op.kind in ("U", "R") else op.microbatch // self.microbatches_per_step

    # -- derived structure (computed once by validation) -------------------------------------
    @property
    def ops(self) -> tuple[Op, ...]:
        """Every distinct op once, in a topological order of the dependencies."""
        return self._derived.ops

    @property
    def dependencies(self) -> Mapping[Op, tuple[Any, ...]]:
        """``op -> tuple of _rules.Dep`` (its predecessors with edge types)."""
        return self._derived.deps

    def devices_of(self, op: Op) -> tuple[int, ...]:
        """Devices whose order contains ``op`` (one for compute ops, the participants for ``R``)."""
        return self._derived.lanes[op]

    def option(self, name: str, default: Any = None) -> Any:
        return dict(self.options).get(name, default)

    def replace(self, **changes: Any) -> Schedule:
        """A new, re-validated schedule with some fields changed (e.g. ``orders=``)."""
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        return str(table(self))


def orders_from_strings(rows: Sequence[Sequence[str]]) -> tuple[tuple[Op, ...], ...]:
    """``[["0F0", "0B0"], ...]`` -> orders of ``Op`` (handy in tests and examples)."""
    return tuple(tuple(Op.parse(cell) for cell in row) for row in rows)
