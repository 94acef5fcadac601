"""Results kept on disk between processes: ``optimize``'s (the stage balancing of ``plan``), so that a
fresh process repeating a command does not run the descent again.

An entry lives in ``result_cache_dir()`` (``_caches``: the compilation cache's folder's
``results/``, on only while ``enable_compilation_cache`` turned that cache on, so
``DIFFPIPE_CACHE=0``, ``--no-cache`` and ``diffpipe cache clear`` govern both). Its name is the
SHA-256 of its key (``Key``): the format, ``code_fingerprint()`` (every file of the installed
package, byte for byte, and the versions of Python, JAX, jaxlib, NumPy, equinox and optax: any edit
of diffpipe's source, not only a new version string, makes every older entry unreachable), and
every input, arrays by dtype, shape and all their bytes, other values by an unambiguous encoding
(``Key.add``; a value it cannot encode exactly makes the call ``Unkeyable``, and nothing is kept).
The entry stores that digest again and is read only when it matches. Entries are NumPy ``.npz``
archives read without pickle (``encode``/``decode``: plain data, arrays and the named dataclasses,
exactly: floats by their shortest round-trip text, arrays by their bytes), written atomically
(``_io.write_atomic``). A missing, corrupt or unreadable entry is a miss (a corrupt one is removed,
and the caller's result replaces it), never an error; a failed write is ignored. At most
``MAX_ENTRIES`` entries and ``MAX_BYTES`` bytes: storing one more removes the least recently used.

No JAX here (the caller turns its arrays into NumPy ones).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ._caches import _version, bounded, result_cache_dir
from ._errors import ConfigError
from ._io import write_atomic

#: The entries' format; a new one makes every older entry unreachable.
FORMAT = 1
#: Entries kept at most (least recently used removed first).
MAX_ENTRIES = 256
#: Bytes kept at most.
MAX_BYTES = 64 * 2**20
#: The installed package, whose files ``code_fingerprint`` reads.
PACKAGE = Path(__file__).resolve().parent
#: The distributions whose versions enter the fingerprint (their code computes the results).
DEPENDENCIES = ("jax", "jaxlib", "numpy", "equinox", "optax")
_SUFFIX = ".npz"


class Unkeyable(Exception):
    """An input ``Key`` cannot encode exactly (a function, a tracer, an unknown object)."""


@bounded(1)
def code_fingerprint() -> str:
    """SHA-256 of every file of the package (relative path and bytes, bytecode caches aside) and of
    Python's, the machine's and ``DEPENDENCIES``' versions. Computed once per process (about 1 MiB
    of source)."""
    h = hashlib.sha256()
    for path in sorted(p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and p.suffix != ".pyc"):
        for part in (path.relative_to(PACKAGE).as_posix().encode(), path.read_bytes()):
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
    h.update(f"python={sys.version}\nmachine={platform.machine()}\n".encode())
    for name in DEPENDENCIES:
        h.update(f"{name}={_version(name)}\n".encode())
    return h.hexdigest()


class Key:
    """An unambiguous encoding of the inputs of a call, hashed (SHA-256) as it is fed: each value
    carries its type and its length, so that two different sequences of values never give the same
    bytes. Starts with ``FORMAT``, ``code_fingerprint()`` and ``what`` (the call's name)."""

    def __init__(self, what: str) -> None:
        self._hash = hashlib.sha256()
        self.add(FORMAT, code_fingerprint(), what)

    def _put(self, tag: bytes, data: bytes = b"") -> None:
        self._hash.update(tag + len(data).to_bytes(8, "little") + data)

    def add(self, *values: Any) -> Key:
        """Feed ``values``: None, bools, ints, floats, complex numbers, strings, bytes, tuples,
        lists, dicts, classes, arrays (NumPy, or anything ``np.asarray`` reads: dtype, shape and
        bytes), dataclasses (equinox modules: their class and every field), and stateless sentinels
        (``_sentinel``: their class). Anything else (a function, a tracer, an unknown object)
        raises ``Unkeyable``."""
        for value in values:
            self._feed(value)
        return self

    def _feed(self, x: Any) -> None:
        if x is None:
            self._put(b"N")
        elif isinstance(x, bool):
            self._put(b"B", b"1" if x else b"0")
        elif isinstance(x, int):
            self._put(b"I", str(x).encode())
        elif isinstance(x, float):
            self._put(b"F", x.hex().encode())
        elif isinstance(x, complex):
            self._put(b"C", f"{x.real.hex()},{x.imag.hex()}".encode())
        elif isinstance(x, str):
            self._put(b"S", x.encode("utf-8", "surrogatepass"))
        elif isinstance(x, bytes):
            self._put(b"Y", x)
        elif isinstance(x, (tuple, list)):
            self._put(b"T" if isinstance(x, tuple) else b"L", str(len(x)).encode())
            for item in x:
                self._feed(item)
        elif isinstance(x, dict):
            self._put(b"D", str(len(x)).encode())
            for k, v in x.items():
                self._feed(k)
                self._feed(v)
        elif isinstance(x, type):
            self._put(b"K", f"{x.__module__}.{x.__qualname__}".encode())
        elif isinstance(x, (np.ndarray, np.generic)) or hasattr(x, "__array__"):
            try:
                a = np.asarray(x)
            except Exception as e:  # a tracer, a PRNG key array
                raise Unkeyable(f"an array of {type(x).__name__}") from e
            if a.dtype.hasobject:
                raise Unkeyable("an object array")
            self._put(b"A", f"{a.dtype.str}{a.shape}".encode())
            self._put(b"a", np.ascontiguousarray(a).tobytes())
        elif dataclasses.is_dataclass(x):
            self._feed(type(x))
            fields = dataclasses.fields(x)
            self._put(b"O", str(len(fields)).encode())
            for f in fields:
                self._feed(f.name)
                self._feed(getattr(x, f.name))
        elif _sentinel(x):
            self._put(b"Z")  # a stateless sentinel (equinox's ``Missing``): its class says it all
            self._feed(type(x))
        else:
            raise Unkeyable(f"a {type(x).__name__}")

    def digest(self) -> str:
        return self._hash.hexdigest()


def _sentinel(x: Any) -> bool:
    """An object of no state of its own, of a class of diffpipe's, equinox's or JAX's (whose code the
    fingerprint names): not callable (a function's ``__dict__`` is empty too, yet its code is not its
    class), no instance attributes, no slots."""
    return (not callable(x) and getattr(x, "__dict__", None) == {} and not getattr(type(x), "__slots__", ())
            and type(x).__module__.split(".")[0] in ("diffpipe", "equinox", "jax", "jaxlib"))


# -- the entries' codec ---------------------------------------------------------------------------------
def encode(value: Any, classes: Mapping[str, type]) -> bytes:
    """``value`` (None, bools, ints, floats, strings, tuples, lists, dicts of string keys, NumPy
    arrays and scalars, dataclasses of ``classes``) as the bytes of an ``.npz`` archive: the
    structure as JSON, the arrays beside it. Raises ``Unkeyable`` on anything else."""
    arrays: list[np.ndarray] = []
    names = {cls: name for name, cls in classes.items()}

    def plain(x: Any) -> Any:
        if x is None or isinstance(x, (bool, int, str)):
            return x
        if isinstance(x, float):
            return {"f": x.hex()}  # exact, NaN and infinities included
        if isinstance(x, (np.ndarray, np.generic)):
            a = np.asarray(x)
            if a.dtype.hasobject:
                raise Unkeyable("an object array")
            arrays.append(a)
            return {"a": len(arrays) - 1, "scalar": isinstance(x, np.generic)}
        if isinstance(x, tuple):
            return {"t": [plain(v) for v in x]}
        if isinstance(x, list):
            return {"l": [plain(v) for v in x]}
        if isinstance(x, dict) and all(isinstance(k, str) for k in x):
            return {"d": [[k, plain(v)] for k, v in x.items()]}
        if dataclasses.is_dataclass(x) and type(x) in names:
            return {"c": names[type(x)], "v": {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)}}
        raise Unkeyable(f"a {type(x).__name__}")

    meta = json.dumps(plain(value), separators=(",", ":")).encode()
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.frombuffer(meta, np.uint8), **{f"a{i}": a for i, a in enumerate(arrays)})
    return buffer.getvalue()


def decode(data: bytes, classes: Mapping[str, type]) -> Any:
    """The value ``encode`` wrote (arrays read-only). Raises on anything malformed."""
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}

    def value(x: Any) -> Any:
        if x is None or isinstance(x, (bool, int, str)):
            return x
        if "f" in x:
            return float.fromhex(x["f"])
        if "a" in x:
            a = arrays[f"a{int(x['a'])}"]
            if x["scalar"]:
                return a[()]
            a.flags.writeable = False
            return a
        if "t" in x:
            return tuple(value(v) for v in x["t"])
        if "l" in x:
            return [value(v) for v in x["l"]]
        if "d" in x:
            return {k: value(v) for k, v in x["d"]}
        if "c" in x:
            return classes[x["c"]](**{k: value(v) for k, v in x["v"].items()})
        raise ValueError(f"unknown entry part {sorted(x)}")

    return value(json.loads(bytes(arrays.pop("meta")).decode()))


# -- the store -------------------------------------------------------------------------------------------
def _entry(digest: str) -> Path | None:
    folder = result_cache_dir()
    return None if folder is None else folder / f"{digest}{_SUFFIX}"


def load(key: Key, classes: Mapping[str, type]) -> Any | None:
    """The value kept under ``key``, or None: no cache on, no entry, or an entry that does not
    read back (removed then)."""
    digest = key.digest()
    path = _entry(digest)
    if path is None or not path.is_file():
        return None
    try:
        stored = decode(path.read_bytes(), classes)
        if not (isinstance(stored, dict) and stored.get("key") == digest and "value" in stored):
            raise ValueError("not this key's entry")
    except Exception:  # corrupt, truncated, another format: a miss, and the caller's result replaces it
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass
        return None
    try:
        os.utime(path)  # recently used: evicted last
    except OSError:
        pass
    return stored["value"]


def save(key: Key, value: Any, classes: Mapping[str, type]) -> Path | None:
    """Keep ``value`` under ``key`` (atomically), then drop the least recently used entries past
    the bounds. Returns the entry's path, or None when no cache is on, the value cannot be encoded
    or the write failed (nothing is raised: the cache only saves time)."""
    digest = key.digest()
    path = _entry(digest)
    if path is None:
        return None
    try:
        data = encode({"key": digest, "value": value}, classes)
    except Unkeyable:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data, "result cache")
    except (OSError, ConfigError):
        return None
    _evict(path.parent)
    return path


def _evict(folder: Path) -> None:
    entries = []
    for p in folder.glob(f"*{_SUFFIX}"):
        try:
            s = p.stat()
        except OSError:
            continue
        entries.append((s.st_mtime_ns, s.st_size, p))
    entries.sort(key=lambda e: (e[0], e[2].name))
    total = sum(size for _, size, _ in entries)
    while entries and (len(entries) > MAX_ENTRIES or total > MAX_BYTES):
        _, size, p = entries.pop(0)
        try:
            p.unlink(missing_ok=True)
        except OSError:
            pass
        total -= size


__all__ = ["Key", "Unkeyable", "code_fingerprint", "decode", "encode", "load", "save"]
