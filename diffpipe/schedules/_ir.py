"""The atoms of the schedule IR: op kinds, ``Op`` and ``Placement``, frozen and hashable.

The lowest module of the discrete world: the dependency rules and validation build on it, and
``_ops.Schedule`` on them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
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


def rows(value: Any, what: str) -> tuple[tuple[Any, ...], ...]:
    """``value`` as a tuple of tuples (placement tables, op orders); anything else (a number, a
    string) is a ``ScheduleError`` naming ``what``."""
    def bad(x: Any) -> bool:
        return isinstance(x, (str, bytes)) or not isinstance(x, Iterable)

    if bad(value):
        raise ScheduleError(f"{what} must be a sequence of sequences, got {value!r}")
    out = tuple(value)
    for row in out:
        if bad(row):
            raise ScheduleError(f"{what} must be a sequence of sequences, got an entry {row!r}")
    return tuple(tuple(row) for row in out)


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
        object.__setattr__(self, "devices", int(self.devices))
        table = rows(self.table, "placement: table")
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
        object.__setattr__(self, "table", tuple(tuple(int(d) for d in row) for row in table))

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
