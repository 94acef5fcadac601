"""The grid of discrete choices a sweep crosses: registered families x sizes x their options, greedy
list schedules over named placements, and ready-made schedules. No JAX here.

Option names, types and checks come from the family registry (``diffpipe.schedules.Family``); the
placement variants are small unregistered ``Family`` objects, checked the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._caches import bounded
from .._checks import check_int
from .._errors import ConfigError, ScheduleError
from ..schedules import Family, Option, Placement, Schedule, at_least, family, names
from ..schedules._list_scheduler import PRIORITIES, list_schedule
from ..schedules._registry import SCHEDULES_KEPT
from ..schedules._registry import build_cached as _cached_build  # noqa: F401 (its cache: tests/test_caches.py)
from ..schedules._registry import cached_build as build

_CHUNKS = Option("chunks", int, 2, at_least(1), "model chunks per device")
_WAVES = Option("waves", int, 2, at_least(1), "down-and-up passes")
#: Placement variants scheduled by the greedy list scheduler (``list_schedule``): their options and
#: the placement at given devices and options.
_PLACEMENTS: dict[str, tuple[tuple[Option, ...], Callable[..., Placement]]] = {
    "linear": ((), lambda devices: Placement.linear(devices)),
    "loop": ((_CHUNKS,), lambda devices, chunks: Placement.loop(devices, chunks)),
    "v": ((), lambda devices: Placement.v(devices)),
    "wave": ((_WAVES,), lambda devices, waves: Placement.wave(devices, waves)),
    "mirrored": ((), lambda devices: Placement.mirrored(devices)),
}
PLACEMENTS = tuple(_PLACEMENTS)


@dataclass(frozen=True)
class Choice:
    """One point of the discrete grid: a family (or ``list``) at sizes and options, built lazily."""

    family: str
    options: tuple[tuple[str, Any], ...]
    devices: int
    microbatches: int
    make: Callable[[], Schedule] = field(compare=False)

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.options)


def values(name: str, value: Any) -> list:
    """A grid axis: a scalar becomes one value; a sequence (or range) its values; never empty."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        return [value]
    out = list(value)
    if not out:
        raise ConfigError(f"sweep: the grid is empty: {name} has no values")
    return out


def _sizes(name: str, value: Any) -> list[int]:
    return [check_int(f"sweep: {name}", v) for v in values(name, value)]


def _option_grid(declared: Mapping[str, Sequence[str]], options: Mapping[str, Any]) -> dict[str, list[dict]]:
    """Per family (or placement variant), a list of option dicts: the cross product of its axes."""
    shared, per_family = {}, {}
    known = {o for opts in declared.values() for o in opts}
    for key, value in options.items():
        if key in declared:
            if not isinstance(value, Mapping):
                raise ConfigError(f"sweep: options[{key!r}] must map option names to values, got {value!r}")
            for option in value:
                if option not in declared[key]:
                    raise ConfigError(f"sweep: {option!r} is not an option of {key} "
                                      f"(its options: {', '.join(declared[key]) or 'none'})")
            per_family[key] = {o: values(f"options[{key!r}][{o!r}]", v) for o, v in value.items()}
        elif key in known:
            shared[key] = values(f"options[{key!r}]", value)
        else:
            raise ConfigError(
                f"sweep: option {key!r} is neither a selected family nor an option of one "
                f"(options: {', '.join(sorted(known)) or 'none'})"
            )
    grids = {}
    for name, declared_options in declared.items():
        axes = {o: v for o, v in shared.items() if o in declared_options}
        axes.update(per_family.get(name, {}))
        keys = sorted(axes)
        grids[name] = [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]
    return grids


#: Schedules and graphs kept across sweeps (both are pure functions of their arguments): bounded.
CACHE_SIZE = SCHEDULES_KEPT


@bounded(256)  # a few placements x priorities: one Family object each, so it can key caches
def _list_family(placement: str, priority: str) -> Family:
    """The placement variant ``list:<placement>`` as an (unregistered) family at one priority."""
    options, make_placement = _PLACEMENTS[placement]

    def generate(*, devices: int, microbatches: int, **opts: Any) -> Schedule:
        return list_schedule(make_placement(devices, **opts), microbatches, priority=priority,
                             split_backward=priority == "zero-bubble")

    return Family(f"list:{placement}", generate, options=options,
                  placement=lambda *, devices, **opts: make_placement(devices, **opts),
                  ops_per_cell=3 if priority == "zero-bubble" else 2)


def choices(families, devices, microbatches, options, placements, priorities, schedules) -> list[Choice]:
    """The grid's points in table order: families, then placement variants, then given schedules."""
    families = names() if families is None else [families] if isinstance(families, str) else list(families)
    declared: dict[str, tuple[str, ...]] = {}
    for name in families:
        try:
            declared[name] = family(name).option_names
        except ScheduleError as error:
            raise ConfigError(f"sweep: {error}") from None
    placements = [placements] if isinstance(placements, str) else list(placements)
    for p in placements:
        if p not in _PLACEMENTS:
            raise ConfigError(f"sweep: placement {p!r} is not one of {', '.join(PLACEMENTS)}")
    priorities = values("priorities", priorities)
    for p in priorities:
        if p not in PRIORITIES:
            raise ConfigError(f"sweep: priority {p!r} is not one of {', '.join(PRIORITIES)}")
    for p in placements:
        declared[f"list:{p}"] = tuple(o.name for o in _PLACEMENTS[p][0])
    schedules = list(schedules)
    for s in schedules:
        if not isinstance(s, Schedule):
            raise ConfigError(f"sweep: schedules must be Schedule objects, got {type(s).__name__}")
    if not families and not placements and not schedules:
        raise ConfigError("sweep: the grid is empty: no families, placements or schedules given")
    device_values = _sizes("devices", devices) if families or placements else []
    microbatch_values = _sizes("microbatches", microbatches) if families or placements else []
    grids = _option_grid(declared, dict(options or {}))

    out: list[Choice] = []
    for name in families:
        fam = family(name)
        for opts, d, n in itertools.product(grids[name], device_values, microbatch_values):
            # n counts samples: a sequence-level family runs n x units_per_sample microbatch ids
            out.append(Choice(name, tuple(sorted(opts.items())), d, n,
                              lambda fam=fam, d=d, n=n, opts=opts: build(fam, d, n * fam.units(opts), opts)))
    for p in placements:
        for opts, prio, d, n in itertools.product(grids[f"list:{p}"], priorities, device_values, microbatch_values):
            fam = _list_family(p, prio)
            full = {**{o.name: o.default for o in fam.options}, **opts}
            out.append(Choice("list", tuple(sorted({"placement": p, "priority": prio, **full}.items())), d, n,
                              lambda fam=fam, d=d, n=n, opts=opts: build(fam, d, n, opts)))
    for s in schedules:
        out.append(Choice(s.family, s.options, s.devices, s.microbatches, lambda s=s: s))
    return out
