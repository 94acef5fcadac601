"""The registry of schedule families: names, lazy loading, argument checking, closed forms.

Each family lives in its own module and exports a ``Family``; this registry names them without
importing them, so listing families (and starting the CLI) stays fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._errors import ScheduleError
from ._ops import Schedule


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


@dataclass(frozen=True)
class Family:
    """A schedule family: its generator, its closed form, its options and its source.

    ``generate(devices=, microbatches=, **options) -> Schedule``;
    ``formula(devices=, microbatches=, durations=, **options) -> Formula | None``.
    ``options`` maps each option name to a one-line description including its default.
    """

    name: str
    generate: Callable[..., Schedule]
    summary: str
    source: str
    formula: Callable[..., Formula | None] | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    asynchronous: bool = False


# name -> (module under diffpipe.schedules, attribute holding the Family)
_FAMILIES: dict[str, tuple[str, str]] = {
    "gpipe": ("gpipe", "GPIPE"),
    "1f1b": ("one_f_one_b", "ONE_F_ONE_B"),
    "interleaved-1f1b": ("interleaved", "INTERLEAVED_1F1B"),
    "looped-bfs": ("interleaved", "LOOPED_BFS"),
    "chimera": ("chimera", "CHIMERA"),
    "chimera-asymmetric": ("chimera", "CHIMERA_ASYMMETRIC"),
    "hanayo": ("hanayo", "HANAYO"),
    "zb-h1": ("zero_bubble", "ZB_H1"),
    "zb-h2": ("zero_bubble", "ZB_H2"),
    "zb-v": ("zero_bubble", "ZB_V"),
    "dualpipe-v": ("dualpipe", "DUALPIPE_V"),
    "pipedream": ("pipedream", "PIPEDREAM"),
    "pipedream-2bw": ("pipedream", "PIPEDREAM_2BW"),
    "amdp": ("amdp", "AMDP"),
}


def names() -> tuple[str, ...]:
    """Registered family names, in a stable order (synchronous first)."""
    return tuple(_FAMILIES)


def family(name: str) -> Family:
    """The ``Family`` registered under ``name``."""
    if name not in _FAMILIES:
        raise ScheduleError(f"unknown schedule family {name!r}; known: {', '.join(_FAMILIES)}")
    module, attribute = _FAMILIES[name]
    return getattr(importlib.import_module(f"diffpipe.schedules.{module}"), attribute)


def _check_options(fam: Family, options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - set(fam.options))
    if unknown:
        known = ", ".join(fam.options) or "none"
        raise ScheduleError(f"{fam.name}: unknown option {unknown[0]!r}; its options: {known}")


def check_size(family_name: str, name: str, value: object, minimum: int = 1) -> int:
    """Reject a non-int or too-small size argument with a message naming the family and argument."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ScheduleError(f"{family_name}: {name} must be an int >= {minimum}, got {value!r}")
    return value


def get(name: str, *, devices: int, microbatches: int, **options: Any) -> Schedule:
    """Generate a schedule of family ``name`` for ``devices`` devices and ``microbatches`` microbatches."""
    fam = family(name)
    _check_options(fam, options)
    check_size(name, "devices", devices)
    check_size(name, "microbatches", microbatches)
    return fam.generate(devices=devices, microbatches=microbatches, **options)


def formula(
    name: str, *, devices: int, microbatches: int, durations: Mapping[str, float] | None = None, **options: Any
) -> Formula | None:
    """The family's closed form (None where the literature gives none) at per-kind ``durations``
    (default F=1, B=2, I=W=1, as in ``table``)."""
    from ._reference import DEFAULT_DURATIONS

    fam = family(name)
    _check_options(fam, options)
    if fam.formula is None:
        return None
    merged = {**DEFAULT_DURATIONS, **(durations or {})}
    return fam.formula(devices=devices, microbatches=microbatches, durations=merged, **options)
