"""Every cache diffpipe keeps, bounded, and ``clear_caches()`` to empty them all.

A function is cached with ``@bounded(maxsize)`` (``functools.lru_cache`` that registers itself); a
module-level table is a ``BoundedDict(maxsize)`` (an ``OrderedDict`` that drops its oldest entry
past ``maxsize`` and registers itself); anything else registers its ``clear`` with ``register``. Caches hold only
derived data (generated schedules, compiled graphs, per-layer costs), so clearing them changes no
result, only the time of the next call.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])
_CLEARS: list[Callable[[], None]] = []


def register(clear: Callable[[], None]) -> Callable[[], None]:
    """Register ``clear`` (a callable that empties one cache) with ``clear_caches``."""
    _CLEARS.append(clear)
    return clear


def bounded(maxsize: int) -> Callable[[_F], _F]:
    """``functools.lru_cache(maxsize)``, registered with ``clear_caches``."""

    def wrap(function: _F) -> _F:
        cached = functools.lru_cache(maxsize=maxsize)(function)
        register(cached.cache_clear)
        return cached  # type: ignore[return-value]

    return wrap


class BoundedDict(OrderedDict):
    """An ``OrderedDict`` holding at most ``maxsize`` entries: storing one more drops the oldest
    (insertion order; ``move_to_end`` on a hit makes it least-recently used). Registered with
    ``clear_caches``."""

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        self.maxsize = maxsize
        register(self.clear)

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        if len(self) > self.maxsize:
            self.popitem(last=False)


def clear_caches() -> None:
    """Empty every cache diffpipe keeps (and JAX's compiled functions, when JAX is loaded)."""
    import sys

    for clear in _CLEARS:
        clear()
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()
