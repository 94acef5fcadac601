"""The registry of schedule families: ``Family`` and ``Option`` data, registered through ``register``.

Every built-in family registers itself when its module is imported (``diffpipe.schedules``
imports them all: plain Python, no JAX, so listing families keeps the CLI fast), and a family
defined outside the package registers the same way; ``get``, ``formula``, the sweep, the CLI's
``list`` and the test matrix all read this one registry. Options are declared with their type,
default and check, and checked here, before any generator runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._caches import bounded
from .._checks import check_int, is_int, is_number
from .._errors import ScheduleError
from ._reference import DEFAULT_DURATIONS
from ._schedule import Placement, Schedule

#: Largest number of ops ``get`` generates unless told otherwise (``get(..., max_ops=...)``). A
#: schedule is a tuple of Python ``Op`` objects; a million of them is a few hundred MB and seconds of
#: generation and validation, so anything larger is refused before it starts.
MAX_OPS = 1_000_000
#: Largest placement table ``estimate_ops`` builds to count stages (past it, an upper bound is used).
PLACEMENT_CELLS = 10_000_000
_TYPE_NAMES = {int: "an integer", bool: "True or False", float: "a finite number", str: "a string"}


@dataclass(frozen=True)
class Formula:
    """A family's closed form at uniform per-stage op times, with the assumption it rests on.

    ``makespan`` and ``bubble_ratio`` are comparable to ``table(schedule, durations)``;
    ``peak_activations`` is per device, in stage-microbatch units (None where no closed form).
    """

    makespan: float
    bubble_ratio: float
    assumption: str
    peak_activations: tuple[int, ...] | None = None


def at_least(minimum: int) -> Callable[[Any], str | None]:
    """An ``Option.check`` refusing values below ``minimum``."""

    def check(value: Any) -> str | None:
        return None if value >= minimum else f"must be >= {minimum}"

    return check


@dataclass(frozen=True)
class Option:
    """One typed option of a family.

    **Arguments:**

    - ``name``: the keyword the generator takes.
    - ``type``: ``int``, ``bool``, ``float`` or ``str`` (bools are not ints, strings not numbers).
    - ``default``: the value used when the option is not given (must pass its own checks).
    - ``check``: ``value -> None`` when accepted, else the requirement it breaks (``"must be >= 1"``).
    - ``help``: one line for ``diffpipe list``.
    """

    name: str
    type: type = int
    default: Any = None
    check: Callable[[Any], str | None] | None = None
    help: str = ""

    def validate(self, owner: str, value: Any) -> Any:
        """``value`` if it has this option's type and passes its check; else one-line ``ScheduleError``."""
        if self.type is bool:
            ok = isinstance(value, bool)
        elif self.type is int:
            ok = is_int(value)
        elif self.type is float:
            ok = is_number(value) and math.isfinite(value)
        else:
            ok = isinstance(value, self.type)
        if not ok:
            need = _TYPE_NAMES.get(self.type, f"a {self.type.__name__}")
            raise ScheduleError(f"{owner}: {self.name} must be {need}, got {value!r}")
        reason = self.check(value) if self.check is not None else None
        if reason:
            raise ScheduleError(f"{owner}: {self.name} {reason}, got {value!r}")
        return value

    def describe(self) -> str:
        """The help line with the default."""
        return f"{self.help} (default {self.default!r})" if self.help else f"default {self.default!r}"


@dataclass(frozen=True)
class Family:
    """A schedule family: its generator, options, accepted sizes, closed form and source.

    **Arguments:**

    - ``name``: the registered name (``get(name, ...)``).
    - ``generate``: ``(devices=, microbatches=, **options) -> Schedule``; called with every option
      (defaults filled in) after the registry has checked sizes, options and ``accepts``.
    - ``summary``, ``source``: one line each (what it is; paper and section, or code).
    - ``options``: the typed ``Option``s the generator takes.
    - ``accepts``: ``(devices=, microbatches=, **options) -> None`` when the sizes are valid, else
      the reason (one line, without the family name), e.g. ``"devices must be even, got 3"``.
    - ``formula``: ``(devices=, microbatches=, durations=, **options) -> Formula | None``.
    - ``placement``: ``(devices=, **options) -> Placement``, the family's placement (its stage count
      feeds the op estimate).
    - ``ops_per_cell``: ops per (stage, microbatch): 2 for F and B (default), 3 for F, I and W.
    - ``ops``: ``(devices=, microbatches=, **options) -> int``, an estimate of the op count; default
      ``stages * microbatches * ops_per_cell``, the stages from ``placement`` (else ``devices``).
    - ``setup_ops``: ``(devices=, microbatches=, **options) -> int``, one-time work before the
      schedule exists, in op units (v-schedule's ranking of its candidate blocks); counted by
      ``estimate_ops``, once (not per use of the schedule: ``setup_estimate``).
    - ``asynchronous``: whether its schedules update weights while microbatches are in flight.
    - ``units_per_sample``: ``(**options) -> int``, how many schedule microbatch ids make up one
      sample (one microbatch of the global batch); default 1. Sequence-level families (Seq1F1B,
      ``segments``) cut a sample into that many units, so equal work is ``units(options)`` times as
      many microbatch ids, each a share of a sample's cost (``compare``, ``sweep``).
    """

    name: str
    generate: Callable[..., Schedule]
    summary: str = ""
    source: str = ""
    options: tuple[Option, ...] = ()
    accepts: Callable[..., str | None] | None = None
    formula: Callable[..., Formula | None] | None = None
    placement: Callable[..., Placement] | None = None
    ops_per_cell: int = 2
    ops: Callable[..., int] | None = None
    setup_ops: Callable[..., int] | None = None
    asynchronous: bool = False
    units_per_sample: Callable[..., int] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name != self.name.strip():
            raise ScheduleError(f"Family: name must be a non-empty string without spaces around it, got {self.name!r}")
        if not callable(self.generate):
            raise ScheduleError(f"Family {self.name}: generate must be callable, got {self.generate!r}")
        object.__setattr__(self, "options", tuple(self.options))
        seen: set[str] = set()
        for option in self.options:
            if not isinstance(option, Option):
                raise ScheduleError(f"Family {self.name}: options must be Option objects, got {option!r}")
            if option.name in seen or option.name in ("devices", "microbatches", "max_ops"):
                raise ScheduleError(f"Family {self.name}: option name {option.name!r} is repeated or reserved")
            seen.add(option.name)
            option.validate(f"{self.name} default", option.default)

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    def units(self, options: Mapping[str, Any]) -> int:
        """Schedule microbatch ids per sample at ``options`` (resolved here): 1 unless the family
        declares ``units_per_sample``."""
        if self.units_per_sample is None:
            return 1
        return int(self.units_per_sample(**self.resolve(options)))

    def resolve(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Every option's value: the given ones checked, the others at their defaults."""
        unknown = sorted(set(options) - set(self.option_names))
        if unknown:
            known = ", ".join(self.option_names) or "none"
            raise ScheduleError(f"{self.name}: unknown option {unknown[0]!r}; its options: {known}")
        return {o.name: o.validate(self.name, options[o.name]) if o.name in options else o.default
                for o in self.options}

    def check(self, devices: Any, microbatches: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        """Check sizes, options and ``accepts``; returns the resolved options."""
        check_int(f"{self.name}: devices", devices, 1, error=ScheduleError)
        check_int(f"{self.name}: microbatches", microbatches, 1, error=ScheduleError)
        resolved = self.resolve(options)
        reason = self.accepts(devices=devices, microbatches=microbatches, **resolved) if self.accepts else None
        if reason:
            raise ScheduleError(f"{self.name}: {reason}")
        return resolved

    def estimate_ops(self, devices: int, microbatches: int, options: Mapping[str, Any]) -> int:
        """About how many ops ``generate`` makes at these (checked) sizes and options, plus its
        one-time work (``setup_estimate``)."""
        return self._schedule_ops(devices, microbatches, options) + self.setup_estimate(devices, microbatches, options)

    def setup_estimate(self, devices: int, microbatches: int, options: Mapping[str, Any]) -> int:
        """The one-time work of ``generate`` before its ops (``setup_ops``; 0 without one)."""
        if self.setup_ops is None:
            return 0
        return int(self.setup_ops(devices=devices, microbatches=microbatches, **options))

    def _schedule_ops(self, devices: int, microbatches: int, options: Mapping[str, Any]) -> int:
        if self.ops is not None:
            return int(self.ops(devices=devices, microbatches=microbatches, **options))
        if self.placement is None:
            return devices * microbatches * self.ops_per_cell
        # A placement holds at most 2 x devices x the integer options (chunks, waves) stages: build
        # it only when that bound is small, so that an absurd option is refused, not allocated.
        bound = 2 * devices * math.prod(v for v in options.values() if is_int(v) and v > 1)
        stages = self.placement(devices=devices, **options).stages if bound <= PLACEMENT_CELLS else bound
        return stages * microbatches * self.ops_per_cell

    def build(self, *, devices: int, microbatches: int, max_ops: int | None = None, **options: Any) -> Schedule:
        """Check everything (``check``), refuse more than ``max_ops`` ops (default ``MAX_OPS``) before
        generating, then generate. ``get(name, ...)`` is ``family(name).build(...)``."""
        resolved = self.check(devices, microbatches, options)
        limit = MAX_OPS if max_ops is None else check_int("max_ops", max_ops, 1, error=ScheduleError)
        needed = self.estimate_ops(devices, microbatches, resolved)
        if needed > limit:
            raise ScheduleError(
                f"{self.name}: {devices} devices x {microbatches} microbatches needs about {needed:,} ops, over "
                f"the limit of {limit:,}; pass max_ops={needed} (or more) to generate it anyway"
            )
        return self.generate(devices=devices, microbatches=microbatches, **resolved)


_FAMILIES: dict[str, Family] = {}


def register(family: Family, *, replace: bool = False) -> Family:
    """Add ``family`` to the registry (every command then sees it) and return it.

    Registering a taken name is an error unless ``replace``.
    """
    if not isinstance(family, Family):
        raise ScheduleError(f"register expects a Family, got {type(family).__name__}")
    if family.name in _FAMILIES and not replace and _FAMILIES[family.name] is not family:
        raise ScheduleError(f"schedule family {family.name!r} is already registered (pass replace=True)")
    _FAMILIES[family.name] = family
    return family


def unregister(name: str) -> Family:
    """Remove and return the family registered under ``name``."""
    fam = family(name)
    del _FAMILIES[name]
    return fam


def names() -> tuple[str, ...]:
    """Registered family names, in registration order (the built-ins: synchronous first)."""
    return tuple(_FAMILIES)


def family(name: str) -> Family:
    """The ``Family`` registered under ``name``."""
    if not isinstance(name, str) or name not in _FAMILIES:
        raise ScheduleError(f"unknown schedule family {name!r}; known: {', '.join(_FAMILIES)}")
    return _FAMILIES[name]


def get(name: str, *, devices: int, microbatches: int, max_ops: int | None = None, **options: Any) -> Schedule:
    """Generate a schedule of family ``name`` for ``devices`` devices and ``microbatches`` microbatches.

    Sizes, options and the family's ``accepts`` are checked first; then a request whose estimated
    op count exceeds ``max_ops`` (default ``MAX_OPS``) is refused before anything is generated.
    """
    return family(name).build(devices=devices, microbatches=microbatches, max_ops=max_ops, **options)


#: Generated schedules kept (``cached_build``): bounded.
SCHEDULES_KEPT = 512


@bounded(SCHEDULES_KEPT)
def build_cached(fam: Family, devices: int, microbatches: int, options: tuple[tuple[str, Any], ...]) -> Schedule:
    """``fam.build(...)`` of hashable sorted ``options``, kept (``cached_build``)."""
    return fam.build(devices=devices, microbatches=microbatches, **dict(options))


def cached_build(fam: Family, devices: int, microbatches: int, options: Mapping[str, Any]) -> Schedule:
    """``fam.build(...)``, cached on (family, sizes, options): a schedule is a pure function of them
    and immutable, so the sweep and ``plan`` share one object per request; options that cannot be
    hashed are built every time. A ``ScheduleError`` is not cached (it is raised again)."""
    key = tuple(sorted(options.items()))
    try:
        hash(key)
    except TypeError:
        return fam.build(devices=devices, microbatches=microbatches, **options)
    return build_cached(fam, devices, microbatches, key)


def units_per_sample(schedule: Schedule) -> int:
    """How many of ``schedule``'s microbatch ids make up one sample: its registered family's
    ``Family.units`` at its options (Seq1F1B: ``segments``), 1 for an unregistered family."""
    if schedule.family not in _FAMILIES:
        return 1
    return _FAMILIES[schedule.family].units(dict(schedule.options))


def formula(
    name: str, *, devices: int, microbatches: int, durations: Mapping[str, float] | None = None, **options: Any
) -> Formula | None:
    """The family's closed form (None where the literature gives none) at per-kind ``durations``
    (default F=1, B=2, I=W=1, as in ``table``)."""
    fam = family(name)
    resolved = fam.resolve(options)
    if fam.formula is None:
        return None
    merged = {**DEFAULT_DURATIONS, **(durations or {})}
    return fam.formula(devices=devices, microbatches=microbatches, durations=merged, **resolved)
