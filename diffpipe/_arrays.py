"""The array helpers every pytree uses: one float converter and one "is its value known now" test."""

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
