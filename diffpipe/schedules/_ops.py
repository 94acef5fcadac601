"""The schedule IR: ``Op``, ``Placement`` and ``Schedule``, frozen and hashable.

A schedule is data: a placement of model stages on devices, and one order of ops per device.
Dependencies are never stored here; they are derived from ops + placement by ``_rules``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._checks import is_int
from .._errors import ScheduleError

#: Op kinds. F forward, B full backward, I input-gradient backward, W weight-gradient backward
#: (zero-bubble split: B = I + W), U optimizer step, R collective (gradient all-reduce).
KINDS = ("F", "B", "I", "W", "U", "R")
#: Kinds that move one microbatch through one stage.
COMPUTE_KINDS = ("F", "B", "I", "W")


@dataclass(frozen=True, order=True, slots=True)
class Op:
    """One unit of work.

    Attributes:
        kind: one of ``KINDS``.
        stage: model stage within its pipeline (0 = first layers). Virtual stages of interleaved
            schedules are stages too. For ``U`` and ``R`` it names the weights updated or reduced.
        microbatch: the microbatch for F/B/I/W; for ``U`` and ``R`` the optimizer *step* index.
        pipeline: which concurrent pipeline / model replica (Chimera: 0 down, 1 up).
    """

    kind: str
    stage: int
    microbatch: int
    pipeline: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ScheduleError(f"op kind {self.kind!r} is not one of {', '.join(KINDS)}")
        for name in ("stage", "microbatch", "pipeline"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ScheduleError(f"op {self.kind}: {name} must be a non-negative int, got {value!r}")

    @property
    def step(self) -> int:
        """The optimizer step of a ``U`` or ``R`` op (stored in ``microbatch``)."""
        return self.microbatch

    def __str__(self) -> str:
        # torch.distributed.pipelining's action format, with the pipeline appended when non-zero.
        text = f"{self.stage}{self.kind}{self.microbatch}"
        return text if self.pipeline == 0 else f"{text}@p{self.pipeline}"

    @classmethod
    def parse(cls, text: str) -> Op:
        """Inverse of ``str``: ``'2F3'`` or ``'2F3@p1'``."""
        body, _, pipe = text.strip().partition("@p")
        for i, ch in enumerate(body):
            if ch.isalpha():
                try:
                    return cls(ch, int(body[:i]), int(body[i + 1 :]), int(pipe) if pipe else 0)
                except ValueError:
                    break
        raise ScheduleError(f"cannot parse op {text!r}: expected e.g. '2F3' or '2F3@p1'")


def _rows(value: Any, what: str) -> tuple[tuple[Any, ...], ...]:
    """``value`` as a tuple of tuples (placement tables, op orders); anything else (a number, a
    string) is a ``ScheduleError`` naming ``what``."""
    def bad(x: Any) -> bool:
        return isinstance(x, (str, bytes)) or not isinstance(x, Iterable)

    if bad(value):
        raise ScheduleError(f"{what} must be a sequence of sequences, got {value!r}")
    rows = tuple(value)
    for row in rows:
        if bad(row):
            raise ScheduleError(f"{what} must be a sequence of sequences, got an entry {row!r}")
    return tuple(tuple(row) for row in rows)


@dataclass(frozen=True)
class Placement:
    """Where each stage of each pipeline lives: ``table[pipeline][stage] -> device``.

    Loop (interleaved), V (zb-v, dualpipe-v), waves (Hanayo), mirrored (Chimera) and AMDP's
    rings are all placements; build them with the class methods or pass a table.
    """

    devices: int
    table: tuple[tuple[int, ...], ...]
    name: str = "custom"

    def __post_init__(self) -> None:
        if not is_int(self.devices) or self.devices < 1:
            raise ScheduleError(f"placement: devices must be a positive int, got {self.devices!r}")
        table = _rows(self.table, "placement: table")
        object.__setattr__(self, "table", table)
        if not table or not table[0]:
            raise ScheduleError("placement: the table needs at least one pipeline with one stage")
        if any(len(row) != len(table[0]) for row in table):
            raise ScheduleError("placement: every pipeline must have the same number of stages")
        for p, row in enumerate(table):
            for s, d in enumerate(row):
                if not is_int(d) or not 0 <= d < self.devices:
                    raise ScheduleError(
                        f"placement: stage {s} of pipeline {p} is on device {d!r}, "
                        f"outside 0..{self.devices - 1}"
                    )

    @property
    def pipelines(self) -> int:
        return len(self.table)

    @property
    def stages(self) -> int:
        return len(self.table[0])

    def device(self, pipeline: int, stage: int) -> int:
        return self.table[pipeline][stage]

    def held(self, device: int) -> tuple[tuple[int, int], ...]:
        """The ``(pipeline, stage)`` pairs on ``device``, in (pipeline, stage) order."""
        return tuple(
            (p, s) for p, row in enumerate(self.table) for s, d in enumerate(row) if d == device
        )

    def chunk(self, pipeline: int, stage: int) -> int:
        """Index of ``stage`` among the stages of ``pipeline`` held by its device (0, 1, ...)."""
        d = self.table[pipeline][stage]
        return sum(1 for s in range(stage) if self.table[pipeline][s] == d)

    # -- the standard placements ------------------------------------------------------------
    @classmethod
    def linear(cls, devices: int) -> Placement:
        """Stage d on device d: GPipe, 1F1B, ZB-H1/H2."""
        return cls(devices, (tuple(range(devices)),), "linear")

    @classmethod
    def loop(cls, devices: int, chunks: int) -> Placement:
        """``devices * chunks`` stages, stage s on device ``s mod devices`` (Megatron interleaving)."""
        return cls(devices, (tuple(s % devices for s in range(devices * chunks)),), "loop")

    @classmethod
    def wave(cls, devices: int, waves: int) -> Placement:
        """``2 * waves * devices`` stages zig-zagging down and up the devices (Hanayo).

        Stage j runs on device r if r < D else 2D-1-r, with r = j mod 2D.
        """
        stages = []
        for j in range(2 * waves * devices):
            r = j % (2 * devices)
            stages.append(r if r < devices else 2 * devices - 1 - r)
        return cls(devices, (tuple(stages),), "wave" if waves > 1 else "v")

    @classmethod
    def v(cls, devices: int) -> Placement:
        """``2 * devices`` stages in a V: down the devices and back up (zb-v, dualpipe-v)."""
        return cls.wave(devices, 1)

    @classmethod
    def mirrored(cls, devices: int) -> Placement:
        """Two pipelines (replicas): stage s of the down pipeline on device s, of the up one on D-1-s (Chimera)."""
        return cls(devices, (tuple(range(devices)), tuple(reversed(range(devices)))), "mirrored")


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
    _derived: Any = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.placement, Placement):
            raise ScheduleError(f"schedule: placement must be a Placement, got {self.placement!r}")
        for name in ("microbatches", "steps"):
            if not is_int(getattr(self, name)):
                raise ScheduleError(f"schedule: {name} must be an int, got {getattr(self, name)!r}")
        object.__setattr__(self, "orders", _rows(self.orders, "schedule: orders"))
        object.__setattr__(self, "options", _freeze(self.options))
        from ._validate import validate  # local: _validate imports this module

        object.__setattr__(self, "_derived", validate(self))

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
        from ._table import table

        return str(table(self))


def orders_from_strings(rows: Sequence[Sequence[str]]) -> tuple[tuple[Op, ...], ...]:
    """``[["0F0", "0B0"], ...]`` -> orders of ``Op`` (handy in tests and examples)."""
    return tuple(tuple(Op.parse(cell) for cell in row) for row in rows)
