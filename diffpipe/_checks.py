"""The shared validators: one copy of each check, used eagerly at the API's edge.

Each returns the checked value (so ``n = check_int("devices", n)`` reads naturally) or raises
``ConfigError`` (or the ``error`` type given) with one line naming the culprit and its value.
Bools are not numbers and strings are not numbers: ``True`` and ``"1e-3"`` are refused.
No JAX here.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

from ._errors import ConfigError


def is_int(value: Any) -> bool:
    """An integer that is not a bool (numpy integers count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_positive_int(value: Any) -> bool:
    """An integer >= 1 that is not a bool (numpy integers count)."""
    return is_int(value) and value >= 1


def is_number(value: Any) -> bool:
    """A real number that is not a bool (ints, floats, numpy scalars)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(what: str, value: Any, minimum: int | None = 1, maximum: int | None = None,
              error: type[ValueError] = ConfigError) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (either bound may be None)."""
    if not is_int(value):
        raise error(f"{what} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise error(f"{what} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise error(f"{what} must be an integer <= {maximum}, got {value!r}")
    return int(value)


def check_number(what: str, value: Any, *, positive: bool = False, allow_inf: bool = False,
                 error: type[ValueError] = ConfigError) -> float:
    """``value`` as a float: finite (or +inf where allowed) and non-negative (or positive)."""
    if not is_number(value):
        raise error(f"{what} must be a number, got {value!r}")
    x = float(value)
    if math.isnan(x) or x < 0 or (positive and x == 0) or (math.isinf(x) and not allow_inf):
        need = "positive" if positive else "non-negative"
        need += "" if allow_inf else " and finite"
        raise error(f"{what} must be {need}, got {value!r}")
    return x


def _folded(name: str) -> str:
    return re.sub(r"[-_\s]", "", name).lower()


def preset_key(table: Mapping[str, object], name: object, what: str, aliases: Mapping[str, str]) -> str:
    """The key of ``table`` that ``name`` spells, ignoring case, ``-``, ``_`` and spaces, through
    ``aliases`` (folded spelling -> key); ``ConfigError`` naming the known keys otherwise."""
    if isinstance(name, str):
        known = {_folded(k): k for k in table}
        key = _folded(name)
        key = _folded(aliases.get(key, key))
        if key in known:
            return known[key]
    raise ConfigError(f"unknown {what} preset {name!r}; known: {', '.join(table)}")


#: Where the communication mode went when it left the network (the graph owns it).
MODE_MOVED = {"mode": "compile(communication=...) (or simulate/compare/optimize(communication=...))"}
#: Where ``devices_per_node`` went when it left ``Network`` (the graph owns the topology).
TOPOLOGY_MOVED = {"devices_per_node": "compile(devices_per_node=...) (or simulate/compare/optimize/sweep/viz"
                                      "(devices_per_node=...)): the topology is the graph's"}


def check_moved(what: str, given: Mapping[str, Any], moved: Mapping[str, str]) -> None:
    """Refuse the keyword arguments ``given`` that ``what`` no longer takes: one ``ConfigError``
    line saying where a moved one went (``moved``: name -> its new home); any other is the
    ``TypeError`` Python raises for an unexpected keyword."""
    for name in given:
        if name in moved:
            raise ConfigError(f"{what}: {name}= moved to {moved[name]}")
        raise TypeError(f"{what} got an unexpected keyword argument {name!r}")
