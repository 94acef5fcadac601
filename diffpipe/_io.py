"""Files in and out: one atomic writer for every output, strict JSON, and text decoding for inputs.

Every file diffpipe writes goes through ``write_atomic``: the data is written to a uniquely named
temporary file in the target's directory, flushed and fsynced, and renamed over the target only on
success; on any failure (including ``KeyboardInterrupt``) the temporary file is removed and the
target is left as it was. ``check_output`` validates a target before any work starts, and
``Staged`` writes several outputs all-or-nothing. Failures are ``ConfigError`` naming the user's
path and the reason, never the temporary file.

No JAX here: the discrete layer and the CLI use this module.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._errors import ConfigError

#: A writer fills the temporary file at the given path (e.g. ``lambda p: fig.savefig(p)``).
Writer = Callable[[Path], None]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def check_output(path: str | os.PathLike, what: str = "output") -> Path:
    """Validate an output target before any work: its directory exists and is writable, and the
    target is not a directory. Returns it as a ``Path``."""
    if not isinstance(path, (str, os.PathLike)) or str(path) == "":
        raise ConfigError(f"{what}: expected a file path, got {path!r}")
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ConfigError(f"{what}: {str(p)!r} is a directory")
    if not parent.is_dir():
        raise ConfigError(f"{what}: directory {str(parent)!r} of {str(p)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{what}: directory {str(parent)!r} of {str(p)!r} is not writable")
    if p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(f"{what}: {str(p)!r} is not writable")
    return p


#: Temporary files of the ``Staged`` blocks not yet left: what ``remove_temporaries`` removes when
#: the process must end at once (the CLI, a while after SIGTERM, ``diffpipe.cli._main``).
_LIVE: set[Path] = set()


def _temporary(target: Path) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    os.close(fd)
    _LIVE.add(Path(tmp))
    return Path(tmp)


def remove_temporaries() -> None:
    """Remove every staged temporary file still on disk (safe from any thread; targets untouched)."""
    for tmp in list(_LIVE):
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        _LIVE.discard(tmp)


def _fill(tmp: Path, data: str | bytes | Writer) -> None:
    if callable(data):
        data(tmp)
    else:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
    with open(tmp, "rb+") as f:  # whatever the writer did, the bytes reach the disk before the rename
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; give it a new file's mode


def write_atomic(path: str | os.PathLike, data: str | bytes | Writer, what: str = "output") -> Path:
    """Write ``data`` (text, bytes, or a ``Writer`` filling a temporary path) to ``path`` atomically."""
    with Staged() as staged:
        staged.add(path, data, what)
    return Path(path)


class Staged:
    """Several outputs, all or none: ``add`` writes each to its temporary file at once, and leaving
    the ``with`` block without an error renames them all over their targets; an error anywhere
    (in a writer or in the caller's block) removes every temporary file and changes nothing:
    ``with Staged() as staged: staged.add("a.json", text); staged.add("b.md", other)``."""

    def __init__(self) -> None:
        self._pending: list[tuple[Path, Path, str]] = []

    def __enter__(self) -> Staged:
        return self

    def add(self, path: str | os.PathLike, data: str | bytes | Writer, what: str = "output") -> None:
        target = check_output(path, what)
        try:
            tmp = _temporary(target)
        except OSError as e:
            raise ConfigError(f"{what}: cannot write {str(target)!r}: {_reason(e)}") from None
        self._pending.append((target, tmp, what))
        try:
            _fill(tmp, data)
        except OSError as e:
            raise ConfigError(f"{what}: cannot write {str(target)!r}: {_reason(e)}") from None

    def __exit__(self, kind, value, traceback) -> None:
        try:
            if kind is None:
                for target, tmp, what in self._pending:
                    try:
                        os.replace(tmp, target)
                    except OSError as e:
                        raise ConfigError(f"{what}: cannot write {str(target)!r}: {_reason(e)}") from None
        finally:
            for _, tmp, _ in self._pending:
                tmp.unlink(missing_ok=True)
                _LIVE.discard(tmp)
            self._pending = []


# -- strict JSON ---------------------------------------------------------------------------------
def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data: numpy/JAX scalars and arrays become numbers and lists, and
    undefined numbers (NaN, +-inf) become ``None`` (strict JSON has no NaN or Infinity)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist"):  # numpy and JAX arrays and scalars
        return json_safe(value.tolist())
    if hasattr(value, "item"):
        return json_safe(value.item())
    if isinstance(value, Sequence):
        return [json_safe(v) for v in value]
    return str(value)


def dumps_json(value: Any, indent: int | None = 2) -> str:
    """Strict JSON text of ``value`` (through ``json_safe``), ending in a newline."""
    return json.dumps(json_safe(value), indent=indent, allow_nan=False) + "\n"


# TOML 1.0, "Basic strings": the quotation mark, the backslash and the control characters other
# than tab (U+0000-U+001F, U+007F) must be escaped.
_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_TOML_ESCAPES.update({chr(c): f"\\u{c:04X}" for c in (*range(0x20), 0x7F) if chr(c) not in _TOML_ESCAPES and c != 0x09})


def toml_value(value: Any) -> str:
    """``value`` as a TOML value: a boolean, an integer, a float (``repr``, which reads back
    exactly), a string (quoted; ``\\``, ``"`` and control characters escaped, as TOML's basic
    strings require) or a list of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, str):
        return '"' + "".join(_TOML_ESCAPES.get(c, c) for c in value) + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML spelling for {value!r}")


# -- inputs -----------------------------------------------------------------------------------------


def read_text(path: str | os.PathLike, what: str = "input") -> str:
    """A UTF-8 text file's contents; anything else is a ``ConfigError`` naming the file (and the
    line of the first byte that is not UTF-8)."""
    if not isinstance(path, (str, os.PathLike)) or str(path) == "":
        raise ConfigError(f"{what}: expected a file path, got {path!r}")
    p = Path(path)
    try:
        data = p.read_bytes()
    except IsADirectoryError:
        raise ConfigError(f"{what}: {str(p)!r} is a directory") from None
    except OSError as e:
        raise ConfigError(f"{what}: cannot read {str(p)!r}: {_reason(e)}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"{p}:{line}: not UTF-8 text") from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise ConfigError(f"{p}:{line}: not a text file (NUL byte)")
    return text.removeprefix("\ufeff")


class _NotStrict(ValueError):
    pass


def _refuse_constant(token: str) -> Any:
    raise _NotStrict(token)


def load_json(path: str | os.PathLike, what: str = "input", kind: str = "a JSON file") -> Any:
    """A strict JSON file's value (``read_text``, then ``json``): malformed text, ``NaN``/``Infinity``
    and nesting deeper than the parser's recursion limit (a few hundred levels; no file diffpipe
    reads nests more than a few) are one ``ConfigError`` naming the file, never a traceback."""
    text = read_text(path, what)
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}: not JSON: {e.msg}, so not {kind}") from None
    except _NotStrict as e:
        raise ConfigError(f"{path}: not strict JSON: {e.args[0]} is not a number, so not {kind}") from None
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested too deeply, so not {kind}") from None
