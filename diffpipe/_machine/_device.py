"""``Device``: one accelerator's peak, memory, memory bandwidth and kernel-efficiency curve (the roofline)."""


from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._arrays import as_float, concrete
from .._errors import ConfigError
from ._kernels import KernelModel

#: Default fraction of peak FLOP/s a training step sustains (model FLOPs utilisation). Narayanan
#: et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
#: (SC'21), report 52% of the A100's peak per GPU at scale (abstract, Table 1); large-scale
#: reports since sit around 40-55%. One round figure, to be overridden with a measured one: the
#: flat kernel-efficiency curve of ``Device`` and of the presets without matmul measurements.
DEFAULT_EFFICIENCY = 0.5


class Device(eqx.Module):
    """One accelerator: peak FLOP/s, memory (bytes), memory bandwidth and a kernel-efficiency curve.

    An op of ``flops`` FLOPs that moves ``bytes`` through device memory, over matmuls of ``T`` rows
    (tokens), takes the roofline time (Williams, Waterman and Patterson, "Roofline: An Insightful
    Visual Performance Model for Multicore Architectures", CACM 52(4), 2009)
    ``max(flops / (peak_flops x efficiency(T)), bytes / memory_bandwidth)`` with the saturating curve

        ``efficiency(T) = efficiency x (1 - exp(-T / saturation_tokens))``

    (``saturation_tokens`` 0: the flat curve ``efficiency``). The exponential fits the measured
    matmul throughput of H100 and B200 better than ``e T / (T + T_half)`` (rms log error 0.033
    against 0.071 on H100, 0.024 against 0.031 on B200; ``papers/kernel-efficiency``). Presets
    (``diffpipe.presets.device("H100")``) carry the datasheet bandwidth and, where there are
    measurements, the fitted curve; ``diffpipe.calibrate.fit_kernel_efficiency`` fits it to your own.

    Attributes:
        peak_flops: dense peak FLOP/s.
        memory: device memory (bytes).
        efficiency: the curve's maximum, the fraction of peak a large matmul sustains (a constant
            ``efficiency`` with the other defaults is the old fixed-fraction model).
        memory_bandwidth: bytes/s (default ``inf``: no memory roof).
        saturation_tokens: the ``T`` at which the curve reaches ``1 - 1/e`` (63%) of its maximum
            (default 0: flat).
        name: a label.
        kernels: the shape-dependent kernel model (``KernelModel``: GEMM, attention and memory-bound
            efficiencies, per-kernel overhead) that ``Configuration`` times each op's kernels with;
            None: each op is one roofline at the curve above.

    Float fields are arrays (differentiable, vmap-able): ``jax.vmap(lambda e: Device(p, m, e))``.
    """

    peak_flops: Float[Array, ""] = eqx.field(converter=as_float)
    memory: Float[Array, ""] = eqx.field(converter=as_float)
    efficiency: Float[Array, ""] = eqx.field(converter=as_float, default=DEFAULT_EFFICIENCY)
    memory_bandwidth: Float[Array, ""] = eqx.field(converter=as_float, default=float("inf"))
    saturation_tokens: Float[Array, ""] = eqx.field(converter=as_float, default=0.0)
    name: str = eqx.field(static=True, default="custom")
    kernels: KernelModel | None = None

    def __check_init__(self) -> None:
        for field, value, ok, want in (
            ("peak_flops", self.peak_flops, lambda x: np.isfinite(x) & (x > 0), "positive"),
            ("memory", self.memory, lambda x: x > 0, "positive"),
            ("efficiency", self.efficiency, lambda x: (x > 0) & (x <= 1), "in (0, 1]"),
            ("memory_bandwidth", self.memory_bandwidth, lambda x: x > 0, "positive (or inf)"),
            ("saturation_tokens", self.saturation_tokens, lambda x: np.isfinite(x) & (x >= 0), ">= 0"),
        ):
            x = concrete(value)
            if x is not None and not np.all(ok(x)):
                raise ConfigError(f"device {self.name!r}: {field} must be {want}, got {x.ravel()[0]!r}")

    @property
    def throughput(self) -> Array:
        """Sustained FLOP/s of a large matmul: ``peak_flops x efficiency`` (the curve's maximum)."""
        return self.peak_flops * self.efficiency

    def kernel_efficiency(self, tokens: Any) -> Array:
        """The fraction of peak sustained by matmuls of ``tokens`` rows:
        ``efficiency x (1 - exp(-tokens / saturation_tokens))`` (flat when ``saturation_tokens`` is 0)."""
        t0 = self.saturation_tokens
        tokens = jnp.asarray(tokens, dtype=t0.dtype)
        flat = t0 <= 0
        safe = jnp.where(flat, jnp.ones_like(t0), t0)  # keeps the gradient finite on the flat branch
        return self.efficiency * jnp.where(flat, 1.0, -jnp.expm1(-tokens / safe))

    def seconds(self, flops: Any, bytes: Any = None, tokens: Any = None) -> Array:
        """Roofline seconds of ops of ``flops`` FLOPs moving ``bytes`` over matmuls of ``tokens``
        rows: ``max(flops / (peak_flops x kernel_efficiency(tokens)), bytes / memory_bandwidth)``;
        ``bytes`` None has no memory roof, ``tokens`` None runs at the curve's maximum.
        Concrete arguments run as one compiled program (each operation run eagerly would compile
        alone, in every process); tracers stay in the caller's trace."""
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((self, flops, bytes, tokens))):
            return self._seconds(flops, bytes, tokens)
        unnamed = self if self.name == "custom" else dataclasses.replace(self, name="custom")  # static: one program
        return _seconds(unnamed, flops, bytes, tokens)

    def _seconds(self, flops: Any, bytes: Any = None, tokens: Any = None) -> Array:
        dtype = self.peak_flops.dtype
        flops = jnp.asarray(flops, dtype=dtype)
        rate = self.throughput if tokens is None else self.peak_flops * self.kernel_efficiency(tokens)
        compute = flops / rate
        if bytes is None:
            return compute
        return jnp.maximum(compute, jnp.asarray(bytes, dtype=dtype) / self.memory_bandwidth)

    def flat(self, efficiency: Any) -> Device:
        """This device with the flat curve ``efficiency`` (its memory bandwidth kept)."""
        return Device(self.peak_flops, self.memory, efficiency, self.memory_bandwidth, 0.0, name=self.name)

    def without_kernels(self) -> Device:
        """This device with each op timed as one roofline (no ``KernelModel``)."""
        return Device(self.peak_flops, self.memory, self.efficiency, self.memory_bandwidth, self.saturation_tokens,
                      name=self.name)


#: ``Device.seconds`` of concrete arguments, compiled once per shape (and kept on disk with the
#: compilation cache). The arguments are traced, never baked in, so XLA folds no constant.
_seconds = eqx.filter_jit(Device._seconds)

