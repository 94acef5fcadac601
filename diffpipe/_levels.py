"""The formula and table levels of ``compare``, its default schedule set and sizes, and the rank
statistics. No JAX: the CLI checks a comparison's size against these defaults before anything heavy
loads; the simulation level and ``compare`` itself are in ``_compare``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import combinations
from types import MappingProxyType
from typing import Any

from ._errors import ConfigError
from .schedules import Schedule, units_per_sample
from .schedules import formula as family_formula
from .schedules import names as family_names
from .schedules import table as schedule_table
from .schedules._analysis import peak_activations as schedule_peak_activations

#: The levels, in order of increasing fidelity.
LEVELS = ("formula", "table", "simulation")
#: What each level ranks by (lower is better).
RANKED_BY = {"formula": "bubble_ratio", "table": "makespan", "simulation": "makespan"}
#: The schedules compared when none are given: the four of the study, Chimera with the gradient
#: all-reduce its two replicas need once per step (``sync``).
DEFAULT_SCHEDULES: Mapping[str, Any] = MappingProxyType({
    "gpipe": "gpipe", "1f1b": "1f1b", "chimera": ("chimera", {"sync": True}), "hanayo": "hanayo",
})
#: Devices and microbatches when neither is given nor implied by a Schedule: one 8-GPU node at
#: Hanayo's operating point N = D.
DEFAULT_DEVICES = 8
DEFAULT_MICROBATCHES = 8
#: Relative tolerance under which two values tie (float32 simulation noise is ~1e-6).
DEFAULT_RTOL = 1e-4
#: Durations under which a closed form assuming ``t_F = t_B`` (Chimera, Table 2) is evaluated.
_EQUAL_FB = {"F": 1.0, "B": 1.0, "I": 0.5, "W": 0.5, "U": 0.0, "R": 0.0}
_COMPUTE = ("F", "B", "I", "W")


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise ConfigError(f"unknown level {level!r}; levels are {', '.join(LEVELS)}")


# -- ranking ------------------------------------------------------------------------------------------
def _order(a: float, b: float, rtol: float) -> int:
    """-1 if a is better (smaller) than b, +1 if worse, 0 if they tie within ``rtol``."""
    if abs(a - b) <= rtol * max(abs(a), abs(b)) or a == b:
        return 0
    return -1 if a < b else 1


def ranks(values: Sequence[float | None], rtol: float = DEFAULT_RTOL) -> tuple[int | None, ...]:
    """Competition ranks (1 = smallest; ties share a rank, "1224"); None stays None."""
    out = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        out.append(1 + sum(1 for w in values if w is not None and _order(w, v, rtol) < 0))
    return tuple(out)


def kendall_tau(x: Sequence[float], y: Sequence[float], rtol: float = DEFAULT_RTOL) -> float | None:
    """Kendall's tau-b of two paired samples (ties within ``rtol``); None when undefined (fewer
    than two items, or every pair tied in one sample). Kendall, Biometrika 1945."""
    n = len(x)
    if len(y) != n:
        raise ConfigError(f"kendall_tau: samples of different lengths {n} and {len(y)}")
    concordant = discordant = tied_x = tied_y = 0
    for i, j in combinations(range(n), 2):
        sx, sy = _order(x[i], x[j], rtol), _order(y[i], y[j], rtol)
        tied_x += sx == 0
        tied_y += sy == 0
        if sx * sy > 0:
            concordant += 1
        elif sx * sy < 0:
            discordant += 1
    pairs = n * (n - 1) // 2
    denominator = math.sqrt((pairs - tied_x) * (pairs - tied_y))
    return None if denominator == 0 else (concordant - discordant) / denominator


# -- the formula and table levels ----------------------------------------------------------------
def _share(schedule: Schedule) -> float:
    """Fraction of a device's share of the model in one stage: ``D / S``."""
    return schedule.devices / schedule.stages


def _per_unit(durations: Mapping[str, float], units: int) -> dict[str, float]:
    """Compute durations of one unit, ``1/units`` of a sample's (equal per-segment times)."""
    return {kind: value / units if kind in _COMPUTE else value for kind, value in durations.items()}


def formula_level(schedule: Schedule, durations: Mapping[str, float]) -> tuple[dict | None, str | None]:
    """The formula level of ``schedule`` under per-sample ``durations`` (``{"F": ..., "B": ...}``,
    split evenly over its units): the registry's closed form as ``{"bubble_ratio", "makespan",
    "peak_activations", "assumption"}`` (``makespan`` None where the form holds only under ``t_F =
    t_B``), or ``(None, why)`` where there is none."""
    if schedule.family not in family_names():
        return None, f"custom schedule, family {schedule.family!r} is not registered"
    units = units_per_sample(schedule)
    durations = _per_unit(durations, units)
    options = dict(schedule.options)
    sizes = dict(devices=schedule.devices, microbatches=schedule.microbatches)
    result = family_formula(schedule.family, **sizes, durations=durations, **options)
    assumption_only = False
    if result is None:
        result = family_formula(schedule.family, **sizes, durations=_per_unit(_EQUAL_FB, units), **options)
        assumption_only = result is not None
    if result is None:
        return None, "no closed form in the registry"
    peak = None
    if result.peak_activations is not None:
        peak = max(result.peak_activations) * _share(schedule) / units
    return {
        "bubble_ratio": float(result.bubble_ratio),
        "makespan": None if assumption_only else float(result.makespan),
        "peak_activations": peak,
        "assumption": result.assumption,
    }, None


def table_level(schedule: Schedule, durations: Mapping[str, float]) -> dict:
    """The table level of ``schedule`` under per-sample ``durations``: its tabular view's
    ``{"makespan", "bubble_ratio", "peak_activations"}`` (compute ops at a device's share of the
    model, no communication)."""
    units = units_per_sample(schedule)
    durations = _per_unit(durations, units)
    share = _share(schedule)

    def duration(op: Any) -> float:
        return durations[op.kind] * (share if op.kind in _COMPUTE else 1.0)

    t = schedule_table(schedule, duration)
    return {
        "makespan": float(t.makespan),
        "bubble_ratio": float(t.bubble_ratio),
        "peak_activations": max(schedule_peak_activations(schedule)) * share / units,
    }
