"""Checks of values, eager and inside a program, and how a check traced inside jit fails.

Eager checks (``check_values``, ``checked_float``) name the culprit in one ``ConfigError`` line; a check
traced inside a program (``error_if``, ``traced_check``) raises through equinox's host callback,
or, in diffpipe's own programs of concrete inputs (``checks("nan")``, ``nan_checked``), turns the
checked value into NaN so that the program has no host callback and JAX's persistent compilation
cache can keep it (docs/architecture.md, "Compilation"); their callers then rerun the eager checks.
``compiled_unless_traced`` runs set-up work as one compiled program of concrete inputs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._arrays import as_float, concrete
from .._caches import bounded
from .._checks import is_number
from .._errors import ConfigError

try:  # equinox's traced check; its public ``error_if`` adds a trace-time walk of the Python stack
    from equinox._errors import _error as _eqx_error
    from equinox._filters import combine, is_array, partition
    from equinox._unvmap import unvmap_any
except ImportError:  # another equinox: ``eqx.error_if`` itself
    _eqx_error = None


def _numbers(value: Any) -> bool:
    """A number, or a (nested) list or tuple of numbers: never a bool, a string or None."""
    if isinstance(value, (list, tuple)):
        return len(value) > 0 and all(_numbers(v) for v in value)
    return is_number(value)


def checked_float(value: Any, what: str = "value") -> Array:
    """``value`` as a float array: arrays (and tracers) of a numeric dtype, numbers, or lists of
    numbers; anything else (None, a string, a bool) is a ``ConfigError`` naming ``what``."""
    if isinstance(value, (jax.Array, np.ndarray, np.generic, jax.core.Tracer)):
        if not (jnp.issubdtype(value.dtype, jnp.number)):
            raise ConfigError(f"hardware: {what} must be numeric, got an array of {value.dtype}")
    elif not _numbers(value):
        raise ConfigError(f"hardware: {what} must be a number or a list of numbers, got {value!r}")
    return as_float(value)


def check_values(name: str, value: Any, *, positive: bool = False, allow_inf: bool = False) -> None:
    """Eager check (constructors): finite (or +inf where allowed), non-negative (or positive)."""
    x = concrete(value)
    if x is None:
        return
    bad = np.isnan(x) | (x < 0) | (x <= 0 if positive else False)
    if not allow_inf:
        bad = bad | np.isinf(x)
    if np.any(bad):
        what = "positive" if positive else "non-negative"
        what += " (inf allowed)" if allow_inf else " and finite"
        got = x.ravel()[np.argmax(bad.ravel())]
        hint = ""
        if np.isinf(got) and x.dtype == np.float32:  # a finite input past float32's range becomes inf
            hint = (f"; a value past float32's range ({float(np.finfo(np.float32).max):.4g})? enable 64-bit "
                    "floats (JAX_ENABLE_X64=1) or use smaller sizes")
        raise ConfigError(f"hardware: {name} must be {what}, got {float(got)!r}{hint}")


#: How a check inside jit fails, while a diffpipe program is traced (``checks``): ``"raise"``, a host
#: callback raising ``EquinoxRuntimeError`` (the default: inside a user's own ``jit`` the inputs are
#: tracers and only the program can check them), or ``"nan"``, the checked value becomes NaN. A
#: program with a host callback cannot be kept by JAX's persistent compilation cache, so diffpipe's
#: programs for concrete inputs use ``"nan"`` and their callers check a NaN result's inputs eagerly
#: (``Hardware.__check_init__`` names the culprit).
_ON_ERROR: list[str] = []


@contextlib.contextmanager
def checks(on_error: str) -> Iterator[None]:
    """Trace-time: the checks traced inside fail as ``on_error`` (``"raise"`` or ``"nan"``)."""
    _ON_ERROR.append(on_error)
    try:
        yield
    finally:
        _ON_ERROR.pop()


def on_error_for(*trees: Any) -> str:
    """How the checks of a program about to be traced for ``trees`` fail: as the enclosing diffpipe
    program's; else ``"nan"`` when every leaf is concrete (the caller can check them), else ``"raise"``."""
    if _ON_ERROR:
        return _ON_ERROR[-1]
    traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(trees))
    return "raise" if traced else "nan"


def nan_checked(fn: Any) -> Any:
    """``fn`` with the checks it traces failing as NaN (``checks("nan")``): diffpipe's own programs
    of inputs checked before (no host callback, so the compiled program can be kept on disk)."""
    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        with checks("nan"):
            return fn(*args, **kwargs)

    return traced


def compiled_unless_traced(function: Any, *args: Any) -> Any:
    """``function(*args)``: one compiled program for concrete arguments (run eagerly, each of its
    operations would compile a program of its own, in every process), the plain function inside a
    caller's trace. The arguments are traced, never baked in: XLA folds no constant, and the result
    is the eager one's bit for bit (XLA's kernels either way)."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
        return function(*args)
    return _compiled(function)(*args)


@bounded(64)
def _compiled(function: Any) -> Any:
    return eqx.filter_jit(function)


def enclosing_on_error() -> str:
    """How the checks of the diffpipe program being traced fail; ``"raise"`` outside one."""
    return _ON_ERROR[-1] if _ON_ERROR else "raise"


def error_if(x: Array, pred: Array, message: str) -> Array:
    """``eqx.error_if`` failing as the program being traced says (``checks``; ``"raise"`` outside one).
    A NaN check is traced as ``_nan_if``: equinox's own operations without its stack walk."""
    on_error = _ON_ERROR[-1] if _ON_ERROR else "raise"
    if on_error == "nan" and _eqx_error is not None:
        return _nan_if(x, pred, 0, (message,))
    return eqx.error_if(x, pred, message, on_error=on_error)


def branched_error_if_impl(x: Any, pred: Any, index: int, msgs: tuple[str, ...]) -> Any:
    """``eqx.error_if(x, pred, msgs[index], on_error="nan")`` of equinox 0.13
    (``equinox/_errors.py``, ``branched_error_if_impl``) without the stack it formats for a raised
    error's message: walking it costs ~0.1 s a check at trace time (``jax._src.traceback_util``
    stats every frame's file against JAX's paths), every process, and a NaN check prints no
    message. Named as equinox's, so the program is equinox's op for op (``tests/test_compilation_cache.py``)."""
    with jax.ensure_compile_time_eval():
        if not isinstance(pred, bool):
            pred = unvmap_any(pred)
        if not isinstance(pred, jax.core.Tracer):
            if isinstance(pred, jax.Array):
                pred = pred.item()
            if pred:
                return eqx.error_if(x, pred, msgs[index], on_error="nan")  # equinox's trace-time NaN, warning
            return x
    dynamic, static = partition(x, is_array)
    return combine(_eqx_error(dynamic, pred, index, msgs=list(msgs), on_error="nan", stack=[]), static)


_nan_if = eqx.filter_jit(branched_error_if_impl)


def traced_check(name: str, x: Array, *, positive: bool = False, allow_inf: bool = False) -> Array:
    """The same check inside jit (``error_if``)."""
    bad = jnp.isnan(x) | (x < 0)
    if positive:
        bad = bad | (x <= 0)
    if not allow_inf:
        bad = bad | jnp.isinf(x)
    return error_if(x, jnp.any(bad), f"hardware: {name} must be {'positive' if positive else 'non-negative'}"
                    f"{'' if allow_inf else ' and finite'}")


__all__ = ["check_values", "checked_float", "checks", "compiled_unless_traced", "enclosing_on_error", "error_if",
           "nan_checked", "on_error_for", "traced_check"]
