"""Splitting ``layers`` into contiguous non-empty stages: the uniform split and the min-max DP.

No JAX here (plain numpy): ``Workload`` checks, the baselines and ``optimize`` all use these two.

- ``uniform_partition``: equal layers per stage, the first ``layers % stages`` one more;
- ``partition``: the dynamic programme minimising the largest stage cost, the proxy objective of
  the PipeDream and Alpa planners (Narayanan et al., "PipeDream: Generalized Pipeline Parallelism
  for DNN Training", SOSP'19, §3.1; Zheng et al., "Alpa", OSDI'22, §5.2), optionally subject to a
  per-stage memory limit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._checks import check_int
from ._errors import ConfigError


def check_split(layers: Any, stages: Any) -> tuple[int, int]:
    """``layers`` and ``stages`` as positive ints with at least one layer per stage."""
    layers, stages = check_int("partition: layers", layers), check_int("partition: stages", stages)
    if stages > layers:
        raise ConfigError(f"partition: {stages} stages exceed the {layers} layers")
    return layers, stages


def uniform_partition(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage as equal as possible, the first ``layers % stages`` stages one more."""
    layers, stages = check_split(layers, stages)
    q, r = divmod(layers, stages)
    return tuple(q + (i < r) for i in range(stages))


def partition(costs: Any, stages: int, *, memory: Any = None, limit: Any = None) -> tuple[int, ...] | None:
    """Contiguous non-empty stages minimising the largest stage cost, ``O(stages x layers^2)``.

    Arguments:
        costs: per-layer costs ``[layers]`` (finite, non-negative); a stage costs the sum of its layers'.
        stages: number of stages.
        memory: optional per-layer bytes as held by each stage, ``[layers]`` or ``[stages, layers]``
            (e.g. static bytes x weight versions + activation bytes x in-flight count); a stage
            holds the sum over its layers.
        limit: per-stage memory limit, scalar or ``[stages]`` (``inf``: none); needs ``memory``.

    Returns:
        Layers per stage; ties go to the split whose last stage starts earliest, recursively.
        ``None`` when no split fits the memory limit (never without one).
    """
    values = np.asarray(costs, np.float64)
    if values.ndim != 1 or not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ConfigError("partition: costs must be a finite non-negative [layers] sequence")
    layers, stages = check_split(values.shape[0], stages)
    if (memory is None) != (limit is None):
        raise ConfigError("partition: give both memory= and limit=, or neither")
    cost = np.concatenate([[0.0], np.cumsum(values)])
    span = cost[:, None] - cost[None, :]  # span[end, start]: cost of layers start..end-1
    later = np.arange(layers + 1)[:, None] > np.arange(layers + 1)[None, :]
    fits = np.ones((stages, layers + 1, layers + 1), dtype=bool)
    if memory is not None:
        held = np.broadcast_to(np.asarray(memory, np.float64), (stages, layers))
        cap = np.broadcast_to(np.asarray(limit, np.float64), (stages,))
        cumulative = np.concatenate([np.zeros((stages, 1)), np.cumsum(held, axis=1)], axis=1)
        fits = cumulative[:, :, None] - cumulative[:, None, :] <= cap[:, None, None]
    # best[s, l]: least largest cost of layers 0..l-1 over stages 0..s-1; cut[s, l]: where stage s-1 starts.
    best = np.full((stages + 1, layers + 1), np.inf)
    cut = np.zeros((stages + 1, layers + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for s in range(1, stages + 1):
        candidate = np.where(later & fits[s - 1], np.maximum(best[s - 1][None, :], span), np.inf)
        cut[s] = np.argmin(candidate, axis=1)  # the first minimum: the earliest start
        best[s] = candidate[np.arange(layers + 1), cut[s]]
    if not np.isfinite(best[stages, layers]):
        return None
    counts, end = [], layers
    for s in range(stages, 0, -1):
        counts.append(end - int(cut[s, end]))
        end = int(cut[s, end])
    return tuple(reversed(counts))


__all__ = ["check_split", "partition", "uniform_partition"]
