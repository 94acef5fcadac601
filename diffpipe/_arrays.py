"""The array helpers every pytree uses: one float converter, one "is its value known now" test, the
NumPy-or-JAX choice of set-up arithmetic (``on_host``, ``array_module``, ``scatter_add``, ``divide``), and
the power-of-two rounding of the size buckets that compiled programs are shared by."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array


def as_float(value: Any) -> Array:
    """``value`` as an array of JAX's default float dtype (float32 unless x64 is enabled); numbers and
    NumPy arrays by one transfer (``jnp.asarray`` of a Python float compiles a conversion)."""
    dtype = jnp.result_type(float)
    if any(isinstance(x, (jax.Array, jax.core.Tracer)) for x in jax.tree.leaves(value)):
        return jnp.asarray(value, dtype=dtype)
    return jax.device_put(np.asarray(value, dtype))


def concrete(x: Any) -> np.ndarray | None:
    """``x`` as a numpy array when its value is known now (not a tracer), else None: eager checks
    run on concrete values and are skipped under ``jit``/``vmap``/``grad``."""
    return None if isinstance(x, jax.core.Tracer) else np.asarray(x)


def on_host(tree: Any) -> Any:
    """``tree`` with its JAX array leaves as NumPy arrays when none is a tracer, else ``tree`` itself.
    Set-up arithmetic on what it returns runs in NumPy and compiles nothing (each eager JAX operation
    compiles a program of its own, in every process): float32 ``+ - *``, ``max``, ``min``, comparisons
    and ``where`` give NumPy the bits XLA gives them, one operation at a time, and so does ``divide``
    (not reductions and dots of many terms, whose order XLA chooses, nor transcendental functions)."""
    leaves = jax.tree.leaves(tree)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return tree
    return jax.tree.map(lambda x: np.asarray(x) if isinstance(x, jax.Array) else x, tree)


def array_module(*values: Any) -> Any:
    """``jax.numpy`` when a leaf of ``values`` is a JAX array or a tracer, else ``numpy`` (NumPy arrays
    and numbers, as ``on_host`` leaves them): one formula, written against the module it is given,
    serves the traced and the concrete path."""
    jax_leaf = any(isinstance(x, (jax.Array, jax.core.Tracer)) for x in jax.tree.leaves(values))
    return jnp if jax_leaf else np


def scatter_add(x: Any, index: Any, values: Any) -> Any:
    """``x.at[index].add(values)``; with NumPy operands ``np.add.at`` on a copy (duplicate indices
    added in order, as XLA's scatter adds them)."""
    if array_module(x, values) is np:
        out = np.array(x)
        np.add.at(out, index, values)
        return out
    return jnp.asarray(x).at[index].add(values)


def divide(x: Any, y: Any) -> Any:
    """``x / y`` as XLA computes it one operation at a time: an array over a scalar ``y`` is ``x`` times
    ``1 / y`` (XLA's algebraic simplifier rewrites a division by a broadcast scalar so; ``y`` taken in
    ``x``'s dtype), anything else IEEE division. NumPy operands then give XLA's bits."""
    xp = array_module(x, y)
    if xp.ndim(y) == 0 and xp.ndim(x) > 0:
        return x * (1 / xp.asarray(y, xp.result_type(x)))
    return x / y


def power_of_two(n: int, floor: int = 1) -> int:
    """The smallest power of two at least ``max(n, floor)`` (a size bucket)."""
    return 1 << (max(int(n), floor) - 1).bit_length()
