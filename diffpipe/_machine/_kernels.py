"""``KernelModel``: one device's time for a GEMM of shape ``(M, N, K)``, an attention kernel and a
memory-bound kernel of ``bytes`` (the kernel-level roofline with shape-dependent efficiency).

Every kernel costs a fixed ``overhead`` (its launch and the fixed cost of a tiny kernel: prologue,
epilogue, tail) plus the larger of its compute and memory terms (the roofline, Williams, Waterman and
Patterson, CACM 2009):

- GEMM ``C[M, N] = A[M, K] B[K, N]`` (``2 M N K`` FLOPs, ``(M K + K N + M N) d`` bytes): the compute
  term is ``2 M N K / (peak x gemm_efficiency x u(M, N, K))``. ``u`` is the tile and wave
  quantisation of a tiled GEMM (NVIDIA, "Matrix Multiplication Background User's Guide", the
  sections "Tile Quantization" and "Wave Quantization"): the output is cut into
  ``ceil(M / tile_m) x ceil(N / tile_n)`` tiles, each one thread block; padded tiles compute
  wasted rows, ``M N / (tiles x tile_m x tile_n)`` of the work is useful; the tiles run in waves
  of ``sms`` blocks, so a last partial wave idles SMs, ``work / (ceil(work / sms) x sms)``. When
  there are fewer tiles than SMs, cuBLAS-like libraries split ``K`` over up to
  ``floor(sms / tiles)`` blocks (split-K), never below ``split_k_min`` of ``K`` each; and every
  block pays a fixed main-loop cost, modelled as an efficiency ``k / (k + k_half)`` in its share
  ``k`` of ``K``. A narrow tensor-parallel GEMM (``N`` or ``K`` divided by ``t``) is therefore
  slower per FLOP.
- Attention (fused, FlashAttention: Dao et al. 2022; Dao 2023): ``batch x heads`` independent
  ``(s_q x s_k x d)`` products, at ``attention_efficiency x s / (s + attention_half)`` of peak: each
  thread block loops over the ``s`` keys as a GEMM block loops over ``K``, paying the same kind of
  fixed main-loop cost (the forward; the backward at ``attention_backward`` times the forward's
  efficiency). The curve is FlashAttention-2's; a kernel written for the device's architecture
  (Hopper: FlashAttention-3, cuDNN's fused flash attention) runs ``attention_native`` times faster, one of
  the generation before (FlashAttention-1 and the Triton kernels of its time) ``attention_older`` times as fast.
  Unfused attention is its GEMMs (batched, timed as GEMMs) plus a memory-bound softmax.
- Memory-bound kernels (norms, activations, dropout, residual adds, rotary, softmax, the loss,
  gradient accumulation, the optimizer): ``bytes / (memory_bandwidth x memory_efficiency)``, the
  sustained fraction of the datasheet bandwidth a streaming kernel reaches (STREAM-like).

Shapes are static numpy (the quantisation uses ``ceil``); the float fields are arrays, so a step
time is differentiable in them and in the device's peak and bandwidth. The curves of the presets
are fitted to public measurements in ``papers/kernel-efficiency`` (``fit_kernels.py``).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import numpy as np
from jaxtyping import Array, Float

from .._arrays import array_module, as_float, concrete, divide
from .._checks import is_positive_int
from .._errors import ConfigError

#: Kernel classes a step's compute time is reported in (``Configuration.evaluate``'s breakdown).
KERNEL_CLASSES = ("gemm", "attention", "memory", "launch")


class KernelModel(eqx.Module):
    """Shape-dependent kernel efficiencies of one device (formulas: the module docstring).

    Attributes:
        gemm_efficiency: fraction of peak a large, well-shaped GEMM sustains (``u = 1``).
        k_half: the ``K`` share at which a block's main loop runs at half its efficiency.
        memory_efficiency: sustained fraction of the datasheet memory bandwidth (streaming kernels).
        overhead: fixed seconds of every kernel (launch, prologue, epilogue).
        attention_efficiency, attention_half, attention_backward: the fused-attention curve
            ``attention_efficiency x s / (s + attention_half)`` (forward) and the backward's
            efficiency relative to the forward's: FlashAttention-2 on this device.
        sms: streaming multiprocessors (thread blocks per wave).
        attention_native: the speed of the device's architecture-specific fused attention
            (``Transformer(flash_version=3)``) relative to that curve; 1 where it has none.
        attention_older: the speed of the older fused attention (``Transformer(flash_version=1)``:
            FlashAttention-1) relative to that curve, both passes; 0.5 where it was not measured (the
            FlashAttention-2 paper's "around 2x").
        tile_m, tile_n: the output tile of one thread block.
        split_k_min: the smallest ``K`` share a split-K block takes.
        source: where the figures come from.
    """

    gemm_efficiency: Float[Array, ""] = eqx.field(converter=as_float)
    k_half: Float[Array, ""] = eqx.field(converter=as_float)
    memory_efficiency: Float[Array, ""] = eqx.field(converter=as_float)
    overhead: Float[Array, ""] = eqx.field(converter=as_float)
    attention_efficiency: Float[Array, ""] = eqx.field(converter=as_float)
    attention_half: Float[Array, ""] = eqx.field(converter=as_float)
    attention_backward: Float[Array, ""] = eqx.field(converter=as_float)
    sms: int = eqx.field(static=True)
    attention_native: Float[Array, ""] = eqx.field(converter=as_float, default=1.0)
    attention_older: Float[Array, ""] = eqx.field(converter=as_float, default=0.5)
    tile_m: int = eqx.field(static=True, default=128)
    tile_n: int = eqx.field(static=True, default=128)
    split_k_min: int = eqx.field(static=True, default=512)
    source: str = eqx.field(static=True, default="")

    def __check_init__(self) -> None:
        for field, ok, want in (
            ("gemm_efficiency", lambda x: (x > 0) & (x <= 1), "in (0, 1]"),
            ("memory_efficiency", lambda x: (x > 0) & (x <= 1), "in (0, 1]"),
            ("attention_efficiency", lambda x: (x > 0) & (x <= 1), "in (0, 1]"),
            ("attention_backward", lambda x: (x > 0) & (x <= 2), "in (0, 2]"),
            ("attention_native", lambda x: (x >= 1) & (x <= 4), "in [1, 4]"),
            ("attention_older", lambda x: (x > 0) & (x <= 1), "in (0, 1]"),
            ("k_half", lambda x: np.isfinite(x) & (x >= 0), ">= 0"),
            ("overhead", lambda x: np.isfinite(x) & (x >= 0), ">= 0"),
            ("attention_half", lambda x: np.isfinite(x) & (x >= 0), ">= 0"),
        ):
            x = concrete(getattr(self, field))
            if x is not None and not np.all(ok(x)):
                raise ConfigError(f"kernel model: {field} must be {want}, got {x.ravel()[0]!r}")
        for field in ("sms", "tile_m", "tile_n", "split_k_min"):
            value = getattr(self, field)
            if not is_positive_int(value):
                raise ConfigError(f"kernel model: {field} must be a positive int, got {value!r}")

    # -- the shape part (numpy: shapes are static) ----------------------------------------------------
    def quantisation(self, m: Any, n: Any, k: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(u_tiles x u_waves, k per block)`` of GEMMs ``(m, n, k)``: the useful fraction of the
        launched tile-waves and the ``K`` share of one block (after split-K)."""
        m, n, k = (np.maximum(np.asarray(x, np.float64), 1.0) for x in (m, n, k))
        tm, tn = np.ceil(m / self.tile_m), np.ceil(n / self.tile_n)
        tiles = tm * tn
        useful = m * n / (tiles * self.tile_m * self.tile_n)
        split = np.maximum(1.0, np.minimum(np.floor(self.sms / tiles), np.floor(k / self.split_k_min)))
        work = tiles * split
        waves = work / (np.ceil(work / self.sms) * self.sms)
        return useful * waves, k / split

    # -- times (jnp: differentiable in the floats; NumPy for a model ``on_host``) ------------------------
    def gemm_rate(self, peak: Any, m: Any, n: Any, k: Any) -> Array:
        """Sustained FLOP/s of GEMMs ``(m, n, k)`` on a device of ``peak`` FLOP/s (no memory roof)."""
        xp = array_module(self, peak)
        u, share = self.quantisation(m, n, k)
        share = xp.asarray(share, self.k_half.dtype)
        return peak * self.gemm_efficiency * xp.asarray(u, self.k_half.dtype) * share / (share + self.k_half)

    def gemm_seconds(self, peak: Any, bandwidth: Any, m: Any, n: Any, k: Any, dtype_bytes: float = 2.0,
                     batch: Any = 1.0) -> Array:
        """Seconds of ``batch`` GEMMs ``(m, n, k)`` (one kernel): overhead + roofline."""
        xp = array_module(self, peak, bandwidth)
        m, n, k, batch = (np.asarray(x, np.float64) for x in (m, n, k, batch))
        flops = xp.asarray(2 * m * n * k * batch, self.k_half.dtype)
        traffic = xp.asarray(dtype_bytes * batch * (m * k + k * n + m * n), self.k_half.dtype)
        compute = flops / self.gemm_rate(peak, m, n, k)
        return self.overhead + xp.maximum(compute, divide(traffic, bandwidth * self.memory_efficiency))

    def attention_rate(self, peak: Any, sequence: Any, backward: Any = False) -> Array:
        """Sustained FLOP/s of fused attention over sequences of ``sequence`` (forward, or backward)."""
        xp = array_module(self, peak, backward)
        s = xp.asarray(np.asarray(sequence, np.float64), self.k_half.dtype)
        curve = s / (s + self.attention_half)
        scale = xp.where(xp.asarray(backward), self.attention_backward, 1.0)
        return peak * self.attention_efficiency * curve * scale

    def memory_seconds(self, bandwidth: Any, bytes: Any) -> Array:
        """Seconds of memory-bound kernels moving ``bytes`` (overhead + streaming time)."""
        xp = array_module(self, bandwidth, bytes)
        return self.overhead + divide(xp.asarray(bytes, self.k_half.dtype), bandwidth * self.memory_efficiency)


__all__ = ["KERNEL_CLASSES", "KernelModel"]
