"""A GPT-style transformer cost model: per-layer FLOPs and bytes, and ``Hardware`` from a model.

The model is a table over *layers*: the embedding, each transformer block, and the LM head (final
layer norm, projection to the vocabulary, cross-entropy). The first and last layers are uneven:
the embedding holds ``(V + s) h`` parameters but computes nothing worth counting, the head
computes ``2 b s h V`` FLOPs per pass and stores fp32 logits. ``layer_costs`` gives the table;
``Workload.from_model`` turns it into seconds and bytes on a ``Device``, and ``Workload.hardware``
(``StageBalance``, and ``Hardware.from_model`` through ``stage_of_layers``) groups consecutive
layers into pipeline stages: one path from a model to a ``Hardware``. No ``Hardware`` here.

Notation: ``b`` samples per microbatch, ``s`` sequence, ``h`` hidden, ``a`` heads, ``V``
vocabulary, ``l`` transformer layers, ``f`` FFN multiplier, ``d`` bytes per activation/weight
element (2 for fp16/bf16).

Sources:
- FLOPs: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM" (SC'21), §5.1: a block's forward is ``24 b s h^2 (1 + s/(6h))`` FLOPs (matmuls
  only), the logit layer ``2 b s h V``, backward twice the forward, so one iteration without
  recomputation costs ``72 B s l h^2 (1 + s/(6h) + V/(12 h l))`` and with full recomputation
  ``96 B s l h^2 (1 + s/(6h) + V/(16 h l))``; parameters ``12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h))``.
- Backward split (assumption, exact for matmuls): each weight matmul ``Y = X W`` costs as much for
  the input gradient ``dX = dY W^T`` as for the weight gradient ``dW = X^T dY`` (one forward each);
  the attention products ``Q K^T`` and ``P V`` have no weights, so both their gradients are input
  gradients. Hence per block ``I = (8+4f) b s h^2 + 8 b s^2 h`` and ``W = (8+4f) b s h^2``: the
  totals keep ``B = 2 F``, and this is the split of Qi et al., "Zero Bubble Pipeline Parallelism"
  (ICLR 2024), Table 1. Full recomputation re-runs the forward before ``I``: ``I += F``.
- Activation memory: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models" (2022), §4: a block stores ``s b h (34 + 5 a s / h)`` bytes in fp16 without
  recomputation, ``2 s b h`` (its input) with full recomputation; the embedding its dropout mask
  (``s b h``, one byte per element); the output layer ``4 s b h (1 + V/h)`` (inputs of the final
  layer norm and of the projection in fp16, logits in fp32 for the loss).
- Static memory: ``16`` bytes per parameter for mixed-precision Adam (2 fp16 weights + 2 fp16
  gradients + 12 fp32 master weights, momentum, variance): Rajbhandari et al., "ZeRO: Memory
  Optimizations Toward Training Trillion Parameter Models" (SC'20), §3.1.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._errors import ConfigError
from ._partition import uniform_partition

#: Default fraction of peak FLOP/s a training step sustains (model FLOPs utilisation). Narayanan
#: et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
#: (SC'21), report 52% of the A100's peak per GPU at scale (abstract, Table 1); large-scale
#: reports since sit around 40-55%. One round figure, to be overridden with a measured one.
DEFAULT_EFFICIENCY = 0.5

#: Bytes of one dropout-mask element (Korthikanti et al. 2022, §4.1).
_MASK_BYTES = 1
#: Bytes of one logit: the cross-entropy runs in fp32 (Korthikanti et al. 2022, §4.3).
_LOGIT_BYTES = 4


def _float(value: Any) -> Array:
    return jnp.asarray(value, dtype=jnp.result_type(float))


def _concrete(x: Any) -> np.ndarray | None:
    """``x`` as a numpy array when its value is known now (not a tracer), else None."""
    return None if isinstance(x, jax.core.Tracer) else np.asarray(x)


def _positive_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True, init=False)
class Transformer:
    """A GPT-style decoder (Megatron-LM layout: learned positions, biases, two layer norms a block).

    Attributes:
        layers: transformer blocks ``l``.
        hidden: hidden size ``h``.
        heads: attention heads ``a``.
        sequence: sequence length ``s``.
        vocabulary: vocabulary size ``V``.
        microbatch_size: samples per microbatch ``b`` (a ``Hardware.size`` of 1). The old keyword
            ``microbatch=`` (and attribute) still works for one release, with a ``DeprecationWarning``.
        dtype_bytes: bytes per weight/activation element ``d`` (2 for fp16/bf16).
        ffn_multiplier: FFN width over ``h`` (``f``; 4 for GPT).
        recompute: full activation recomputation of every block.
        tied_embedding: the LM head reuses the word embedding (GPT, Megatron); the stage holding
            the head then keeps a copy of it, as Megatron does, unless the two share a stage.
        bytes_per_parameter: static bytes per parameter: weights, gradients and optimizer state
            (16 for mixed-precision Adam, ZeRO §3.1).
    """

    layers: int
    hidden: int
    heads: int
    sequence: int
    vocabulary: int
    microbatch_size: int = 1
    dtype_bytes: int = 2
    ffn_multiplier: float = 4
    recompute: bool = False
    tied_embedding: bool = True
    bytes_per_parameter: int = 16

    def __init__(self, layers: int, hidden: int, heads: int, sequence: int, vocabulary: int, microbatch_size: int = 1,
                 dtype_bytes: int = 2, ffn_multiplier: float = 4, recompute: bool = False,
                 tied_embedding: bool = True, bytes_per_parameter: int = 16, *, microbatch: int | None = None) -> None:
        if microbatch is not None:  # the deprecated spelling, kept for one release
            warnings.warn("Transformer(microbatch=...) is deprecated: use microbatch_size= (microbatch wins when "
                          "both are given)", DeprecationWarning, stacklevel=2)
            microbatch_size = microbatch
        values = dict(layers=layers, hidden=hidden, heads=heads, sequence=sequence, vocabulary=vocabulary,
                      microbatch_size=microbatch_size, dtype_bytes=dtype_bytes, ffn_multiplier=ffn_multiplier,
                      recompute=recompute, tied_embedding=tied_embedding, bytes_per_parameter=bytes_per_parameter)
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self.__post_init__()

    @property
    def microbatch(self) -> int:
        """Deprecated: ``microbatch_size``."""
        warnings.warn("Transformer.microbatch is deprecated: use microbatch_size", DeprecationWarning, stacklevel=2)
        return self.microbatch_size

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "sequence", "vocabulary", "microbatch_size", "dtype_bytes",
                     "bytes_per_parameter"):
            value = getattr(self, name)
            if not _positive_int(value):
                raise ConfigError(f"transformer: {name} must be a positive int, got {value!r}")
        f = self.ffn_multiplier
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not np.isfinite(f) or f <= 0:
            raise ConfigError(f"transformer: ffn_multiplier must be a positive number, got {f!r}")
        for name in ("recompute", "tied_embedding"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"transformer: {name} must be a bool, got {getattr(self, name)!r}")


class LayerCosts(eqx.Module):
    """Per-layer costs of one microbatch, over ``[embedding, block 0, ..., block l-1, head]``.

    Attributes (numpy float64 arrays ``[l + 2]``):
        forward: forward FLOPs ``F``.
        backward: input-gradient FLOPs ``I`` (including the recomputed forward, if any).
        weight: weight-gradient FLOPs ``W`` (a full backward is ``I + W``).
        parameters: parameters held by the stage that holds the layer (the head counts its copy
            of a tied embedding: see ``shared_parameters``).
        static_bytes: ``parameters x bytes_per_parameter`` (weights, gradients, optimizer state).
        gradient_bytes: ``parameters x dtype_bytes``: what a data-parallel all-reduce moves.
        activation_bytes: bytes stored from the layer's forward until its backward.
        output_bytes: the activation sent to the next layer (the gradient sent back is the same
            size); 0 after the head.
        shared_parameters: parameters of the head that duplicate the embedding (``V h`` when
            tied, else 0): subtract them when the embedding and head share a stage.
    """

    forward: Float[np.ndarray, " layers"]
    backward: Float[np.ndarray, " layers"]
    weight: Float[np.ndarray, " layers"]
    parameters: Float[np.ndarray, " layers"]
    static_bytes: Float[np.ndarray, " layers"]
    gradient_bytes: Float[np.ndarray, " layers"]
    activation_bytes: Float[np.ndarray, " layers"]
    output_bytes: Float[np.ndarray, " layers"]
    shared_parameters: float = eqx.field(static=True, default=0.0)

    def times(self, device: Device) -> tuple[Array, Array, Array]:
        """Per-layer seconds ``(F, I, W)`` on ``device``: FLOPs / (peak x efficiency)."""
        return tuple(_seconds(x, device) for x in (self.forward, self.backward, self.weight))


def layer_costs(model: Transformer) -> LayerCosts:
    """The per-layer table of ``model`` for one microbatch (formulas and sources: module docstring).

    Per transformer block (``f = 4``, ``d = 2`` give the papers' constants):
        ``F = (8 + 4f) b s h^2 + 4 b s^2 h`` (= ``24 b s h^2 (1 + s/(6h))``),
        ``I = (8 + 4f) b s h^2 + 8 b s^2 h`` (``+ F`` with recomputation), ``W = (8 + 4f) b s h^2``;
        parameters ``(4 + 2f) h^2 + (9 + f) h`` (= ``12 h^2 + 13 h``);
        activations ``s b h (d (8 + 2f) + 2) + a s^2 b (2d + 1)`` (= ``s b h (34 + 5 a s / h)``),
        or ``d s b h`` with recomputation; output ``d s b h``.
    Embedding: no FLOPs (a gather), ``(V + s) h`` parameters, its dropout mask ``s b h`` bytes.
    Head: ``F = I = W = 2 b s h V``; ``V h + 2 h`` parameters (a copy of the word embedding when
    tied, and the final layer norm); activations ``2 d s b h + 4 s b V`` bytes.
    """
    if not isinstance(model, Transformer):
        raise ConfigError(f"layer_costs expects a Transformer, got {type(model).__name__}")
    b, s, h, a, V = (float(x) for x in (model.microbatch_size, model.sequence, model.hidden, model.heads,
                                        model.vocabulary))
    f, d, l = float(model.ffn_multiplier), float(model.dtype_bytes), model.layers

    matmul = (8 + 4 * f) * b * s * h * h  # QKV (3), projection (1), FFN (2f): 2 FLOPs per MAC
    attention = 4 * b * s * s * h  # Q K^T and P V
    block_f = matmul + attention
    block_i = matmul + 2 * attention + (block_f if model.recompute else 0.0)
    block_w = matmul
    block_params = (4 + 2 * f) * h * h + (9 + f) * h
    if model.recompute:
        block_act = d * s * b * h
    else:
        block_act = s * b * h * (d * (8 + 2 * f) + 2 * _MASK_BYTES) + a * s * s * b * (2 * d + _MASK_BYTES)
    boundary = d * s * b * h
    logits = 2 * b * s * h * V

    def row(embedding: float, block: float, head: float) -> np.ndarray:
        return np.concatenate([[embedding], np.full(l, block), [head]]).astype(np.float64)

    parameters = row((V + s) * h, block_params, V * h + 2 * h)
    return LayerCosts(
        forward=row(0.0, block_f, logits),
        backward=row(0.0, block_i, logits),
        weight=row(0.0, block_w, logits),
        parameters=parameters,
        static_bytes=parameters * model.bytes_per_parameter,
        gradient_bytes=parameters * d,
        activation_bytes=row(_MASK_BYTES * s * b * h, block_act, 2 * d * s * b * h + _LOGIT_BYTES * s * b * V),
        output_bytes=row(boundary, boundary, 0.0),
        shared_parameters=V * h if model.tied_embedding else 0.0,
    )


class Device(eqx.Module):
    """One accelerator: peak FLOP/s, the fraction of it sustained, and memory (bytes).

    Float fields are arrays (differentiable, vmap-able): ``jax.vmap(lambda e: Device(p, m, e))``.
    Presets: ``diffpipe.presets.device("H100")``.
    """

    peak_flops: Float[Array, ""] = eqx.field(converter=_float)
    memory: Float[Array, ""] = eqx.field(converter=_float)
    efficiency: Float[Array, ""] = eqx.field(converter=_float, default=DEFAULT_EFFICIENCY)
    name: str = eqx.field(static=True, default="custom")

    def __check_init__(self) -> None:
        for field, value, ok in (
            ("peak_flops", self.peak_flops, lambda x: np.isfinite(x) & (x > 0)),
            ("memory", self.memory, lambda x: x > 0),
            ("efficiency", self.efficiency, lambda x: (x > 0) & (x <= 1)),
        ):
            x = _concrete(value)
            if x is not None and not np.all(ok(x)):
                want = "in (0, 1]" if field == "efficiency" else "positive"
                raise ConfigError(f"device {self.name!r}: {field} must be {want}, got {x.ravel()[0]!r}")

    @property
    def throughput(self) -> Array:
        """Sustained FLOP/s: ``peak_flops x efficiency``."""
        return self.peak_flops * self.efficiency


def _seconds(flops: np.ndarray, device: Device) -> Array:
    rate = device.throughput
    return jnp.asarray(flops, dtype=rate.dtype) / rate


def stage_of_layers(
    model: Transformer, stages: int | None = None, layers_per_stage: Sequence[int] | None = None
) -> np.ndarray:
    """The stage of every row of ``layer_costs(model)``: consecutive layers form a stage.

    Give exactly one of ``stages`` (blocks split as evenly as possible, the first
    ``layers % stages`` stages taking one more: the last stage already carries the LM head) or
    ``layers_per_stage`` (blocks per stage, summing to ``model.layers``; the first or last entry
    may be 0, leaving the embedding or the head alone on its stage). The embedding always joins
    stage 0 and the head the last stage.
    """
    if (stages is None) == (layers_per_stage is None):
        raise ConfigError("from_model: give exactly one of stages= or layers_per_stage=")
    if stages is not None:
        if not _positive_int(stages):
            raise ConfigError(f"from_model: stages must be a positive int, got {stages!r}")
        if stages > model.layers:
            raise ConfigError(f"from_model: stages={stages} exceeds the model's {model.layers} layers")
        counts = list(uniform_partition(model.layers, int(stages)))
    else:
        try:
            counts = [operator.index(c) for c in layers_per_stage]
        except TypeError:
            raise ConfigError(f"from_model: layers_per_stage must be a sequence of ints, got "
                              f"{layers_per_stage!r}") from None
        n = len(counts)
        if n == 0 or any(c < 0 for c in counts) or any(c == 0 for c in counts[1:-1]):
            raise ConfigError(f"from_model: layers_per_stage {counts} needs at least one layer per middle "
                              "stage and none negative")
        if sum(counts) != model.layers:
            raise ConfigError(f"from_model: layers_per_stage {counts} sums to {sum(counts)}, the model has "
                              f"{model.layers} layers")
    n = len(counts)
    return np.concatenate([[0], np.repeat(np.arange(n), counts), [n - 1]]).astype(np.int64)


__all__ = ["DEFAULT_EFFICIENCY", "Device", "LayerCosts", "Transformer", "layer_costs", "stage_of_layers"]
