"""Per-segment costs of a sequence cut into consecutive segments (Seq1F1B), as ``Hardware.size``.

A transformer's cost for one sample is a part linear in the sequence length (every weight matmul,
the embedding and head) plus an attention part quadratic in it (``Q K^T`` and ``P V``). Under
causal attention a segment of ``L_j`` tokens after a prefix of ``P_j`` tokens attends to
``L_j (P_j + L_j / 2)`` query-key pairs (continuous count; the discrete one adds ``L_j / 2``), and
the segments' pairs add up to the whole sequence's ``S^2 / 2``. So, in fractions of the sequence
(``x_j = L_j / S``, ends ``e_j = x_0 + ... + x_j``), segment j costs

    ``c_j = (1 - a) x_j + a (e_j^2 - e_{j-1}^2)``

of a whole sample, ``a`` being the attention share of the sample's cost (``attention_share``). The
``c_j`` sum to 1; with ``a = 0`` they are the lengths. This is the cost model of the Seq1F1B
authors' split solver (thunlp/Seq1F1B, ``sp_utils.SeqTFlops.get_prefix_tflops``: linear terms per
token plus ``L_j (P_j + L_j/2)`` attention terms), with the transformer model's FLOPs
(``diffpipe.layer_costs``, which counts the attention core densely, as Megatron-LM does: its total
is spread over the segments in proportion to their causal pairs).

Approximation (one factor per segment, ``Hardware.size[u]``, multiplies every stage's time, bytes and
stored activations): ``a`` is the share of the whole model's ``F + I + W``. Exact for the time of
stages made of identical blocks when ``F`` and ``B`` have the same attention share (no flash
attention, no selective recomputation: ``B = 2F`` per block); the embedding's and head's linear
costs and the ``W`` pass (no attention) are scaled by the same factor, and stored activations and
boundary messages, really proportional to ``L_j``, are scaled by ``c_j`` too. Exact per-kind,
per-stage costs would need a per-(stage, microbatch) size in ``Hardware``.

Equal work (``unit_sizes``, ``per_unit_hardware``): a schedule whose family cuts a sample into ``k``
units (``schedules.units_per_sample``) does a sample's work in ``k`` microbatch ids, so to price it
against a schedule of whole samples each unit's ``size`` is its segment's ``c_j`` times the sample's
size. Under the compute-balanced split (the authors' default) every ``c_j`` is ``1/k`` whatever the
model; under equal lengths (their ``average``) later segments cost more, by the model's attention
share. ``compare`` prices sequence-level families this way.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import is_positive_int
from .._engine._hardware import Hardware
from .._errors import ConfigError
from .._model._transformer import Transformer, layer_costs
from ..schedules import Schedule, units_per_sample

#: Segment splits ``unit_sizes`` knows: the compute-balanced one and equal lengths.
SPLITS = ("balanced", "equal")


def _sample_flops(model: Transformer, sequence: int) -> float:
    costs = layer_costs(dataclasses.replace(model, sequence=sequence))
    return float(np.sum(costs.forward + costs.input_grad + costs.weight))


def attention_share(model: Transformer) -> float:
    """Fraction of one sample's ``F + I + W`` FLOPs that is quadratic in the sequence length.

    Read off the model itself: its per-sample FLOPs are ``u s + q s^2``, so at ``S`` and ``2S``
    ``q S^2 = (c(2S) - 2 c(S)) / 2`` whatever the variant (GQA, MLA, flash attention's recomputed
    ``Q K^T``, recomputation).
    """
    if not isinstance(model, Transformer):
        raise ConfigError(f"attention_share expects a Transformer, got {type(model).__name__}")
    s = int(model.sequence)
    whole, double = _sample_flops(model, s), _sample_flops(model, 2 * s)
    share = (double - 2 * whole) / 2 / whole
    return min(max(share, 0.0), 1.0)


def _check_share(share: Any) -> float:
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
        raise ConfigError(f"segments: attention share must be a number in [0, 1], got {share!r}")
    return float(share)


def segment_costs(fractions: Float[Array, "... segments"], share: float) -> Float[Array, "... segments"]:
    """Each segment's share of a sample's cost, ``c_j = (1-a) x_j + a (e_j^2 - e_{j-1}^2)``, from
    the segments' fractions ``x_j`` of the sequence (summing to 1). Differentiable, vmap-safe."""
    a = _check_share(share)
    x = jnp.asarray(fractions)
    ends = jnp.cumsum(x, axis=-1)
    return (1 - a) * x + a * (ends**2 - (ends - x) ** 2)


def balanced_fractions(segments: int, share: float) -> np.ndarray:
    """The compute-balanced split: fractions ``x_j`` with every ``c_j = 1/k``.

    Closed form: each end solves ``a e^2 + (1 - a) e = j/k``, so
    ``e_j = (sqrt((1-a)^2 + 4 a j/k) - (1-a)) / (2a)`` (``j/k`` when ``a = 0``). Later segments are
    shorter, as in the paper's compute-wise partition (the authors solve the same equations
    one segment at a time from the end, ``split_solver.solve_partition``).
    """
    if not is_positive_int(segments):
        raise ConfigError(f"segments: segments must be a positive int, got {segments!r}")
    a = _check_share(share)
    targets = np.arange(segments + 1, dtype=np.float64) / segments
    if a == 0:
        ends = targets
    else:
        ends = (np.sqrt((1 - a) ** 2 + 4 * a * targets) - (1 - a)) / (2 * a)
    ends[-1] = 1.0
    return np.diff(ends)


def check_lengths(lengths: Any, sequence: int) -> np.ndarray:
    """``lengths`` as positive token counts summing to ``sequence``; else one-line ``ConfigError``."""
    x = np.asarray(lengths, dtype=np.float64)
    if x.ndim != 1 or x.size < 1 or np.any(~np.isfinite(x)) or np.any(x <= 0) \
            or not math.isclose(float(x.sum()), sequence, rel_tol=1e-9):
        raise ConfigError(f"segments: lengths {x.tolist()} must be positive and sum to the sequence {sequence}")
    return x


def unit_sizes(segments: int, samples: int, split: str = "balanced", share: float | None = None) -> np.ndarray:
    """``Hardware.size`` of ``samples`` samples of ``segments`` units each (unit ``u`` is segment
    ``u % segments``): each unit's share ``c_j`` of its sample's cost under ``split``.

    ``"balanced"``: the compute-balanced lengths, every ``c_j = 1/k`` (any share); ``"equal"``: equal
    lengths, ``c_j = (1-a)/k + a (2j+1)/k^2`` by the attention share ``a`` (``share``, required).
    """
    if split not in SPLITS:
        raise ConfigError(f"segments: split must be one of {', '.join(SPLITS)}, got {split!r}")
    if split == "equal" and share is None:
        raise ConfigError("segments: the equal split's costs depend on the attention share: give share= "
                          "(attention_share(model))")
    a = 0.0 if share is None else _check_share(share)
    fractions = balanced_fractions(segments, a) if split == "balanced" else np.full(segments, 1.0 / segments)
    costs = np.asarray(segment_costs(fractions, a), dtype=np.float64)
    return np.tile(costs, samples)


def per_unit_hardware(hw: Hardware, schedule: Schedule, split: str = "balanced",
                      share: float | None = None) -> Hardware:
    """``hw`` with ``size`` per unit of ``schedule``: each sample's size (``hw.size``, a scalar or one
    per sample) times its segments' ``unit_sizes``. Unchanged when the family has one unit per sample,
    or when ``hw.size`` already has one entry per unit (taken as priced)."""
    k = units_per_sample(schedule)
    units = schedule.microbatches
    size = jnp.asarray(hw.size)
    if k == 1 or size.shape == (units,):
        return hw
    samples = units // k
    if size.ndim == 0:
        size = jnp.broadcast_to(size, (samples,))
    elif size.shape != (samples,):
        raise ConfigError(f"segments: hardware size has shape {size.shape}; {schedule.family} has {samples} samples "
                          f"of {k} units (give a scalar, [{samples}] or [{units}])")
    per_unit = jnp.repeat(size, k) * jnp.asarray(unit_sizes(k, samples, split, share), size.dtype)
    return eqx.tree_at(lambda h: h.size, hw, per_unit)


__all__ = ["attention_share", "balanced_fractions", "check_lengths", "per_unit_hardware", "segment_costs",
           "unit_sizes"]
