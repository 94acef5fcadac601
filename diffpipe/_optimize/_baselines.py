"""Baseline stage splits, and exact batched evaluation of integer plans.

- ``uniform_partition``: equal layers per stage (the default of most frameworks; ``_partition``);
- ``minmax_partition``: ``_partition.partition`` (the min-max dynamic programme of the PipeDream and
  Alpa planners) on the per-layer compute time, without their communication and memory terms: it
  ignores transfers, memory and the schedule's shape;
- ``brute_force_partition``: every split into contiguous non-empty stages (``C(L-1, S-1)`` of
  them), evaluated with the batched exact simulator; refused above ``BRUTE_FORCE_LIMIT``.

``evaluate_plans`` is the exact check every reported plan goes through.
"""


from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from .._engine._batch import EVALUATION_CHUNK, evaluate_batched
from .._engine._graph import Graph
from .._errors import ConfigError
from .._partition import check_split, partition
from .._workload._workload import Workload

#: Largest number of splits ``brute_force_partition`` evaluates by default (24 layers over 8
#: stages is C(23, 7) = 245,157: a few seconds on two CPU cores).
BRUTE_FORCE_LIMIT = 300_000


@dataclass(frozen=True)
class StagePlan:
    """An integer plan checked by the exact simulator.

    Attributes:
        layers_per_stage: layers of each stage (the schedule's stages, in order).
        samples: samples per microbatch, or ``None`` when the workload's sizes were used.
        makespan: exact step time (seconds).
        peak_memory: per device, exact peak bytes (static + stored activations).
        capacity: per device, bytes.
        fits: whether every device's peak is within its capacity.
        values: ``(name, plan)`` of every knob that chose part of it (``optimize``), else empty.
    """

    layers_per_stage: tuple[int, ...]
    samples: tuple[int, ...] | None
    makespan: float
    peak_memory: tuple[float, ...]
    capacity: tuple[float, ...]
    fits: bool
    values: tuple[tuple[str, tuple[int, ...]], ...] = ()


def evaluate_plans(
    graph: Graph, workload: Workload, layers_per_stage: Any, size: Any = None, *, chunk: int = EVALUATION_CHUNK
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact makespan ``[B]``, peak memory ``[B, devices]`` and fit ``[B]`` of ``B`` integer plans.

    ``layers_per_stage`` is ``[B, stages]``; ``size`` (relative microbatch sizes) ``[B, microbatches]``,
    or ``None`` for the workload's. Batches are padded to one of a few sizes (at most ``chunk`` per
    call), so new plan counts rarely compile anything new.
    """
    counts = np.asarray(layers_per_stage, dtype=np.int64)
    if counts.ndim != 2 or counts.shape[1] != graph.stages:
        raise ConfigError(f"plans: layers_per_stage has shape {counts.shape}, expected [plans, {graph.stages}]")
    bounds = np.concatenate([np.zeros((counts.shape[0], 1), np.int64), np.cumsum(counts, axis=1)], axis=1)
    return evaluate_boundaries(graph, workload, bounds, size, chunk=chunk)


def _hardware_at(workload: Workload, inputs: tuple) -> Any:
    return workload.hardware(*inputs)


def evaluate_boundaries(
    graph: Graph, workload: Workload, boundaries: Any, size: Any = None, *, chunk: int = EVALUATION_CHUNK
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``evaluate_plans`` for stage boundaries ``[B, stages + 1]`` (fractional ones split layers)."""
    bounds = np.asarray(boundaries, dtype=np.float64)
    n = bounds.shape[0]
    shape = (graph.microbatches,)
    if size is None:
        sizes = np.broadcast_to(np.asarray(workload.size, np.float64), shape)
        sizes = np.broadcast_to(sizes, (n, *shape))
    else:
        sizes = np.asarray(size, np.float64)
        if sizes.shape != (n, *shape):
            raise ConfigError(f"plans: size has shape {sizes.shape}, expected {[n, *shape]}")
    return evaluate_batched(graph, jax.tree_util.Partial(_hardware_at, workload), (bounds, sizes),
                            workload.capacity, workload.forward.dtype, chunk=chunk)


def best_plan(times: np.ndarray, memory: np.ndarray, fits: np.ndarray, capacity: np.ndarray) -> int:
    """Index of the fastest fitting plan; when none fits, of the one with the least overflow."""
    if np.any(fits):
        return int(np.argmin(np.where(fits, times, np.inf)))
    finite = np.isfinite(capacity)[None, :]
    overflow = np.max(np.where(finite, (memory - capacity[None, :]) / np.where(finite, capacity, 1.0), -np.inf),
                      axis=1)
    return int(np.lexsort((times, overflow))[0])


def make_plan(graph: Graph, workload: Workload, counts: Sequence[int], samples: Sequence[int] | None,
              time: float, memory: np.ndarray, values: Mapping[str, Any] | None = None) -> StagePlan:
    capacity = np.broadcast_to(np.asarray(workload.capacity, np.float64), (graph.devices,))
    return StagePlan(
        layers_per_stage=tuple(int(c) for c in counts),
        samples=None if samples is None else tuple(int(s) for s in samples),
        makespan=float(time), peak_memory=tuple(float(m) for m in memory),
        capacity=tuple(float(c) for c in capacity), fits=bool(np.all(memory <= capacity)),
        values=tuple((name, tuple(int(x) for x in np.ravel(v))) for name, v in (values or {}).items()),
    )


# -- the baselines -----------------------------------------------------------------------------------
def minmax_partition(costs: Workload | Sequence[float], stages: int) -> tuple[int, ...]:
    """Contiguous non-empty stages minimising the largest stage cost (per-layer ``F + I + W`` of a
    ``Workload``, or any per-layer costs): ``partition`` without a memory limit."""
    values = costs.compute if isinstance(costs, Workload) else costs
    split = partition(np.asarray(values, np.float64), stages)
    assert split is not None  # without a memory limit every split is feasible
    return split


def compositions(layers: int, stages: int) -> np.ndarray:
    """Every split of ``layers`` into ``stages`` contiguous non-empty stages, ``[C(L-1, S-1), S]``."""
    cuts = np.array(list(itertools.combinations(range(1, layers), stages - 1)), dtype=np.int64)
    cuts = cuts.reshape(math.comb(layers - 1, stages - 1), stages - 1)  # (1, 0) for one stage
    edges = np.concatenate([np.zeros((cuts.shape[0], 1), np.int64), cuts,
                            np.full((cuts.shape[0], 1), layers, np.int64)], axis=1)
    return np.diff(edges, axis=1)


def brute_force_partition(
    graph: Graph, workload: Workload, *, size: Any = None, limit: int = BRUTE_FORCE_LIMIT,
    chunk: int = EVALUATION_CHUNK,
) -> StagePlan:
    """The best split over all ``C(layers-1, stages-1)`` splits, by the exact simulator.

    The best is the fastest that fits memory; when none fits, the plan with the least overflow
    (``fits=False``). ``size``: relative microbatch sizes (scalar or ``[microbatches]``), default
    the workload's. Raises ``ConfigError`` when there are more than ``limit`` splits.
    """
    if not isinstance(graph, Graph):
        raise ConfigError(f"brute_force_partition expects a Graph, got {type(graph).__name__}")
    if not isinstance(workload, Workload):
        raise ConfigError(f"brute_force_partition expects a Workload, got {type(workload).__name__}")
    layers, stages = workload.layers, graph.stages
    check_split(layers, stages)
    count = math.comb(layers - 1, stages - 1)
    if count > limit:
        raise ConfigError(f"brute force: C({layers - 1}, {stages - 1}) = {count} splits exceed limit={limit}; "
                          "use diffpipe.optimize")
    plans = compositions(layers, stages)
    sizes = None
    if size is not None:
        sizes = np.broadcast_to(np.asarray(size, np.float64), (count, graph.microbatches))
    times, memory, fits = evaluate_plans(graph, workload, plans, sizes, chunk=chunk)
    capacity = np.broadcast_to(np.asarray(workload.capacity, np.float64), (graph.devices,))
    i = best_plan(times, memory, fits, capacity)
    return make_plan(graph, workload, plans[i], None, times[i], memory[i])

