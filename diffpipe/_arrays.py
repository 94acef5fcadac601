"""The array helpers every pytree uses: one float converter, one "is its value known now" test, and the
power-of-two rounding of the size buckets that compiled programs are shared by."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array


def as_float(value: Any) -> Array:
    """``value`` as an array of JAX's default float dtype (float32 unless x64 is enabled)."""
    return jnp.asarray(value, dtype=jnp.result_type(float))


def concrete(x: Any) -> np.ndarray | None:
    """``x`` as a numpy array when its value is known now (not a tracer), else None: eager checks
    run on concrete values and are skipped under ``jit``/``vmap``/``grad``."""
    return None if isinstance(x, jax.core.Tracer) else np.asarray(x)


def power_of_two(n: int, floor: int = 1) -> int:
    """The smallest power of two at least ``max(n, floor)`` (a size bucket)."""
    return 1 << (max(int(n), floor) - 1).bit_length()
