"""``fit_kernel_efficiency``: a ``Device``'s kernel-efficiency curve from measured op times."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import ConfigError
from .._machine._device import Device

#: Grid points per axis and zoom rounds of the deterministic search (each round shrinks the box
#: around the best point to 4 grid cells): the fitted parameters are exact to about 1e-6 relative.
_GRID = 121
_ROUNDS = 8


def _positive(name: str, values: Any) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0 or not np.all(np.isfinite(x) & (x > 0)):
        raise ConfigError(f"fit_kernel_efficiency: {name} must be finite positive numbers")
    return x


def fit_kernel_efficiency(tokens: Any, flops: Any, seconds: Any, device: Device, *,
                          bytes: Any = None) -> Device:
    """``device`` with the kernel-efficiency curve that best explains measured op times.

    Fits ``efficiency`` (the maximum, at most 1) and ``saturation_tokens`` of
    ``Device.kernel_efficiency`` by least squares on ``log`` time: the prediction of op ``i`` is
    the roofline ``max(flops_i / (peak x efficiency(tokens_i)), bytes_i / memory_bandwidth)``
    (``Device.seconds``, ``device``'s peak and bandwidth), so memory-bound measurements
    (small matmuls) do not drag the curve down. The search is a deterministic zooming grid over
    ``log efficiency`` and ``log saturation_tokens``, no optimizer state, no randomness.

    Args:
        tokens: rows ``T`` of each measured op's matmuls (tokens per microbatch for a layer).
        flops: FLOPs of each op (``2 M N K`` for one matmul).
        seconds: measured time of each op.
        device: the device measured (peak FLOP/s and memory bandwidth are kept).
        bytes: bytes each op moves (``(M K + K N + M N) d`` for one matmul); None: no memory roof.

    Returns:
        ``device`` with the fitted ``efficiency`` and ``saturation_tokens``.

    Raises ``ConfigError`` when the inputs differ in length, are not positive, or hold fewer than
    two distinct token counts (the curve's shape is then not determined).
    """
    if not isinstance(device, Device):
        raise ConfigError(f"fit_kernel_efficiency expects a Device, got {type(device).__name__}")
    t, f, y = (_positive(n, v) for n, v in (("tokens", tokens), ("flops", flops), ("seconds", seconds)))
    if not t.shape == f.shape == y.shape:
        raise ConfigError(f"fit_kernel_efficiency: tokens, flops and seconds have {t.size}, {f.size} and "
                          f"{y.size} values; give one of each per measurement")
    if np.unique(t).size < 2:
        raise ConfigError("fit_kernel_efficiency: needs measurements at two or more token counts")
    peak = float(device.peak_flops)
    if bytes is None:
        memory = np.full_like(t, -np.inf)
    else:
        b = _positive("bytes", bytes)
        if b.shape != t.shape:
            raise ConfigError(f"fit_kernel_efficiency: bytes has {b.size} values, tokens {t.size}")
        memory = np.log(b / float(device.memory_bandwidth))
    log_y, log_f = np.log(y), np.log(f / peak)

    def loss(u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Sum of squared log errors at ``log efficiency = u``, ``log saturation_tokens = v``."""
        shape = -np.expm1(-t / np.exp(v)[..., None])  # the curve's shape, in (0, 1)
        compute = log_f - u[..., None] - np.log(shape)
        return np.sum((np.maximum(compute, memory) - log_y) ** 2, axis=-1)

    u_box = (np.log(1e-4), 0.0)
    v_box = (np.log(t.min()) - 6.0, np.log(t.max()) + 6.0)
    for _ in range(_ROUNDS):
        u = np.linspace(*u_box, _GRID)
        v = np.linspace(*v_box, _GRID)
        grid = loss(u[:, None] * np.ones_like(v), np.ones_like(u)[:, None] * v)
        i, j = np.unravel_index(np.argmin(grid), grid.shape)
        du, dv = 2 * (u[1] - u[0]), 2 * (v[1] - v[0])
        u_box = (max(u[i] - du, np.log(1e-4)), min(u[i] + du, 0.0))
        v_box = (v[j] - dv, v[j] + dv)
    return Device(device.peak_flops, device.memory, float(np.exp(u[i])), device.memory_bandwidth,
                  float(np.exp(v[j])), name=device.name)
