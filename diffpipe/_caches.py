"""Every cache diffpipe keeps, bounded, and ``clear_caches()`` to empty them all; and JAX's
persistent compilation cache on disk (``enable_compilation_cache``), which the CLI and the examples
turn on.

A function is cached with ``@bounded(maxsize)`` (``functools.lru_cache`` that registers itself;
``@memoized(maxsize)`` also makes the NumPy arrays of each kept result read-only); a
module-level table is a ``BoundedDict(maxsize)`` (an ``OrderedDict`` that drops its oldest entry
past ``maxsize`` and registers itself); anything else registers its ``clear`` with ``register``. Caches hold only
derived data (generated schedules, compiled graphs, per-layer costs), so clearing them changes no
result, only the time of the next call.

The compilation cache keeps XLA's compiled programs across processes, in
``compilation_cache_dir()``: a folder per diffpipe x JAX x jaxlib version under
``$DIFFPIPE_CACHE_DIR``, ``$XDG_CACHE_HOME/diffpipe/jax`` or ``~/.cache/diffpipe/jax``;
``DIFFPIPE_CACHE=0`` turns it off. Only derived data again: removing it changes no result.
Turning it on also keeps ``optimize``'s results on disk, in that folder's ``results/``
(``result_cache_dir``; the store is ``diffpipe._store``), so a fresh process repeating a ``plan``
does not balance its stages again.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import shutil
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
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


def _read_only(value: Any) -> Any:
    """``value`` with every NumPy array in it (itself, the items of a tuple, the fields of a
    dataclass such as an ``eqx.Module``) made read-only: a cached value cannot be changed by a caller."""
    if hasattr(value, "setflags") and hasattr(value, "flags"):
        value.setflags(write=False)
    elif isinstance(value, tuple):
        for item in value:
            _read_only(item)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            _read_only(getattr(value, name, None))
    return value


def memoized(maxsize: int) -> Callable[[_F], _F]:
    """``bounded(maxsize)`` for a pure function of hashable arguments whose result holds NumPy
    arrays: each result is made read-only (``_read_only``) before it is kept, so every caller sees
    the same numbers; a call with an unhashable argument is computed without the cache."""

    def wrap(function: _F) -> _F:
        cached = bounded(maxsize)(lambda *args, **kwargs: _read_only(function(*args, **kwargs)))

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return cached(*args, **kwargs)
            except TypeError:
                try:
                    hash((args, tuple(kwargs.items())))
                except TypeError:
                    return function(*args, **kwargs)
                raise

        call.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

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


# -- the persistent compilation cache ---------------------------------------------------------------
#: ``DIFFPIPE_CACHE=0`` (or ``false``, ``no``, ``off``) turns the persistent compilation cache off.
CACHE_SWITCH = "DIFFPIPE_CACHE"
#: ``DIFFPIPE_CACHE_DIR=PATH`` moves it (default ``$XDG_CACHE_HOME/diffpipe/jax``, else
#: ``~/.cache/diffpipe/jax``).
CACHE_DIR = "DIFFPIPE_CACHE_DIR"
_OFF = ("0", "false", "no", "off")
_VERSIONED = "diffpipe-"  # every versioned directory's name starts so (``cache clear`` removes only those)
#: The folder of ``optimize``'s kept results inside the compilation cache's (``diffpipe._store``).
RESULTS = "results"
#: The result cache's folder while one is on in this process (``enable_compilation_cache``).
_RESULT_DIR: list[Path | None] = [None]


def compilation_cache_enabled() -> bool:
    """False when ``DIFFPIPE_CACHE`` says off."""
    return os.environ.get(CACHE_SWITCH, "1").strip().lower() not in _OFF


def compilation_cache_root() -> Path:
    """The folder holding one compilation cache per diffpipe x JAX x jaxlib version."""
    moved = os.environ.get(CACHE_DIR, "").strip()
    if moved:
        return Path(moved).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"  # XDG: relative is invalid
    return base / "diffpipe" / "jax"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def compilation_cache_dir() -> Path:
    """This installation's cache: the root's folder named by the diffpipe, JAX and jaxlib versions,
    so a program compiled by one version is never loaded by another (JAX's own key holds the
    program, the backend and the compile options too)."""
    name = f"{_VERSIONED}{_version('diffpipe')}-jax-{_version('jax')}-jaxlib-{_version('jaxlib')}"
    return compilation_cache_root() / re.sub(r"[^A-Za-z0-9._+-]", "_", name)


def enable_compilation_cache(path: str | os.PathLike[str] | None = None) -> Path | None:
    """Keep every program JAX compiles on disk, so the next process loads it instead of compiling.

    ``path`` defaults to ``compilation_cache_dir()``; with no ``path``, ``DIFFPIPE_CACHE=0`` turns
    the cache off (returns None). Every program is kept, however small or quick to compile (a
    fresh process pays for each). Call it before the first computation: JAX opens its cache once
    per process. Imports JAX. Returns the folder.

    It also keeps ``optimize``'s results (the stage balancing of ``plan``) in the folder's
    ``results/`` (``result_cache_dir``), keyed by a fingerprint of diffpipe's code and its
    dependencies' versions and by every input (``diffpipe._store``).
    """
    if path is None:
        if not compilation_cache_enabled():
            return None
        path = compilation_cache_dir()
    import jax  # only here: the base layer imports no JAX

    folder = Path(path).expanduser()
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    _RESULT_DIR[0] = folder / RESULTS
    return folder


def result_cache_dir() -> Path | None:
    """The folder where ``optimize`` keeps its results on disk, or None while no cache is on in
    this process (``enable_compilation_cache`` turns it on; the library alone writes nothing)."""
    return _RESULT_DIR[0]


def _folder_size(folder: Path, skip: Path | None = None) -> tuple[int, int]:
    if not folder.is_dir():
        return 0, 0
    files = [f for f in folder.rglob("*") if f.is_file() and (skip is None or skip not in f.parents)]
    return len(files), sum(f.stat().st_size for f in files)


def compilation_cache_info() -> dict[str, Any]:
    """The cache's folder, whether it is on, and its compiled programs' entries and bytes; the
    kept ``optimize`` results' folder, entries and bytes (``results``); with those of other
    versions' caches under the same root, which this installation never reads."""
    root, current = compilation_cache_root(), compilation_cache_dir()
    results = current / RESULTS
    entries, size = _folder_size(current, skip=results)
    kept, kept_size = _folder_size(results)
    others = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(_VERSIONED)
                    and p != current) if root.is_dir() else []
    return {"enabled": compilation_cache_enabled(), "path": str(current), "entries": entries, "bytes": size,
            "results": {"path": str(results), "entries": kept, "bytes": kept_size},
            "other_versions": [{"path": str(p), "entries": n, "bytes": b}
                               for p in others for n, b in [_folder_size(p)]]}


def clear_compilation_cache() -> list[Path]:
    """Remove every version's cache under the root (the root too, once empty); other files there
    are left alone. Returns the folders removed."""
    root = compilation_cache_root()
    if not root.is_dir():
        return []
    removed = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(_VERSIONED))
    for p in removed:
        shutil.rmtree(p)
    if not any(root.iterdir()):
        root.rmdir()
    return removed
