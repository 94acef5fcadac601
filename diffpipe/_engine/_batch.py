"""The batched exact evaluator, one for every caller: ``batch_metrics`` gives makespan, total busy
time and per-device peak memory of a batch of hardware on one graph, batch last inside (the
makespan is ``batched_makespan``, the peak memory ``peak_bytes``: the simulator's own formulas, so
every member equals ``simulate``'s numbers bit for bit). Its callers: ``evaluate_batched``
(hardware built from inputs: the optimizer's and the baselines' candidates), ``simulate_members``
(given hardware on a graph padded to its size bucket or to given sizes: ``plan``'s candidates,
``compare``'s schedules) and the sweep (``_sweep.evaluate``: chunks of stacked graphs, busy time
from ``busy_coefficients``).

Batches are padded to a few bucket sizes so that new batch counts rarely compile anything new.
"""


from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array

from .._arrays import power_of_two
from ._evaluate import batched_makespan
from ._graph import KIND_CODES, Graph, bucketed, pad_graph
from ._hardware import pad_hardware
from ._jit_checks import nan_checked
from ._simulate import device_busy, op_durations, peak_bytes


class Metrics(NamedTuple):
    """What ``batch_metrics`` computes for a batch of ``B`` hardware."""

    makespan: Array  # [B]
    busy: Array | None  # [B] seconds of work summed over the devices (None where not asked)
    peak_memory: Array  # [devices, B] bytes (0 where not asked)


def batch_metrics(graph: Graph, hws: Any, *, busy: str | tuple[Array, Array] | None = None,
                  memory: bool | Array = True) -> Metrics:
    """The exact makespan, total busy time and per-device peak memory of ``hws`` (a cost model whose
    leaves carry a leading batch axis ``[B]``) on ``graph``, traced (the caller jits it).

    ``busy``: None (not computed); ``"devices"``, ``simulate``'s per-device sums (``device_busy``)
    then their total, so a bubble from it is ``simulate``'s bit for bit; or the ``(rows, sizes)``
    of ``busy_coefficients``: the same total as two small products on the cost tables, no
    ``[nodes, batch]`` expansion (the sweep, where that expansion would dominate; rounded
    differently). ``memory``: compute the peak memory (a traced flag runs it under ``lax.cond``).
    """
    type(hws).check(hws, graph)  # static: the batch changes nothing
    tables = jax.vmap(lambda h: h.tables(graph))(hws).batch_last(batched=True)
    total = batched_makespan(graph, tables)
    work = None
    if isinstance(busy, str):
        if busy != "devices":
            raise ValueError(f"batch_metrics: busy must be None, 'devices' or (rows, sizes), got {busy!r}")
        work = jax.vmap(lambda h: jnp.sum(device_busy(graph, op_durations(graph, h)[0])))(hws)
    elif busy is not None:
        rows, sizes = busy
        exact = lax.Precision.HIGHEST  # float32 products also on accelerators (no TF32/bf16 passes)
        work = (jnp.matmul(rows, tables.base, precision=exact)
                + jnp.sum(tables.per_size * jnp.matmul(sizes, tables.size, precision=exact), axis=0))
        if getattr(hws, "setup", None) is not None or getattr(hws, "wind_down", None) is not None:
            lead, tail = jax.vmap(lambda h: h._step_terms(graph.node_cost[:, 6]))(hws)  # the step's, no op's
            work = work - jnp.matmul(lead + tail, rows, precision=exact)

    def peak():
        static, act, size = jax.vmap(lambda h: (h.per_stage("static_bytes", graph), h.per_stage(
            "activation_bytes", graph), h.per_microbatch(graph)))(hws)
        return peak_bytes(graph, *(jnp.moveaxis(x, 0, -1) for x in (static, act, size)))

    if memory is True:
        bytes_ = peak()
    else:
        bytes_ = lax.cond(memory, peak, lambda: jnp.zeros((graph.devices, total.shape[0]), total.dtype))
    return Metrics(total, work, bytes_)


def busy_coefficients(graph: Graph, costs: int, microbatches: int) -> tuple[np.ndarray, np.ndarray]:
    """Per cost row, the busy weight of its nodes ``[costs]`` and per (cost row, microbatch)
    ``[costs, microbatches]`` of a concrete ``graph``, so that the total busy time ``sum_i weight_i *
    dur_i`` (``dur_i = base[row_i] + size[mb_i] * per_size[row_i]``) is ``rows @ base + sum(per_size *
    (sizes @ size))`` (``batch_metrics(..., busy=(rows, sizes))``)."""
    kind = np.asarray(graph.kind)
    weights = np.bincount(np.asarray(graph.lane_nodes), minlength=kind.shape[-1]).astype(np.float32)
    weights += graph.communication.busy_weight * (kind == KIND_CODES["T"])
    row, mb = np.asarray(graph.node_row), np.asarray(graph.microbatch)
    rows = np.zeros(costs, np.float32)
    np.add.at(rows, row, weights)
    sizes = np.zeros((costs, microbatches), np.float32)
    np.add.at(sizes, (row, mb), weights)
    return rows, sizes


#: Plans per call of the batched exact simulator; memory is about ``nodes x k x chunk`` floats.
EVALUATION_CHUNK = 4096
#: Batches are padded to one of these sizes (the last one is ``chunk``), so that only a few shapes
#: are ever compiled whatever the number of plans.
_BUCKETS = (64, 512)


@eqx.filter_jit
@nan_checked
def _exact(graph: Graph, build: Any, inputs: Any):
    out = batch_metrics(graph, jax.vmap(build)(inputs))
    return out.makespan, out.peak_memory.T


def evaluate_batched(graph: Graph, build: Any, inputs: Any, capacity: Any, dtype: Any, *,
                     chunk: int = EVALUATION_CHUNK,
                     buckets: Sequence[int] = _BUCKETS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact makespan ``[B]``, peak memory ``[B, devices]`` and fit ``[B]`` of ``jax.vmap(build)(inputs)``.

    ``build`` (a hashable callable, e.g. an ``eqx.Partial`` or a Module method) maps one entry of
    ``inputs`` (a pytree of numpy arrays with a leading ``[B]`` axis) to a ``Hardware``. Batches
    are padded to one of a few sizes (``buckets`` below ``chunk``, else ``chunk``; at most ``chunk``
    per call), so new plan counts rarely compile anything new; ``buckets=()``: every call runs
    ``chunk`` plans, one compiled program (each member's figures do not depend on the batch size).
    """
    leaves = jax.tree.leaves(inputs)
    n = leaves[0].shape[0]
    capacity = np.broadcast_to(np.asarray(capacity, np.float64), (graph.devices,))
    times = np.empty(n)
    memory = np.empty((n, graph.devices))
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        bucket = next((b for b in buckets if b >= hi - lo and b < chunk), chunk)
        index = np.minimum(np.arange(lo, lo + bucket), hi - 1)  # pad with copies of the last plan
        batch = jax.tree.map(lambda x, index=index: jax.device_put(np.asarray(np.asarray(x)[index], dtype)), inputs)
        t, m = _exact(graph, build, batch)
        times[lo:hi] = np.asarray(t)[: hi - lo]
        memory[lo:hi] = np.asarray(m)[: hi - lo]
    fits = np.all(memory <= capacity[None, :], axis=1)
    return times, memory, fits


@eqx.filter_jit
@nan_checked
def batched_simulation(graph, hws, devices):
    """Exact makespan, bubble ratio and per-device peak memory of a batch of hardware on one padded
    graph (``batch_metrics`` with ``simulate``'s busy sums: every member's numbers are
    ``simulate``'s). ``devices``: the real graph's device count (a traced value, so that every graph
    of a bucket shares the program); the padded devices are idle and hold nothing."""
    out = batch_metrics(graph, hws, busy="devices")
    return out.makespan, 1.0 - out.busy / (devices * out.makespan), out.peak_memory.T


#: Batches of ``batched_simulation`` are padded to powers of two (copies of the first member), at least this.
BATCH_BUCKET = 4


def simulate_members(graph: Graph, hws: Sequence[Any], pad_to: Mapping[str, int] | None = None,
                     batch_bucket: int = BATCH_BUCKET) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``batched_simulation`` of the members' hardware on ``graph``, padded to the graph's size bucket
    (``bucketed``) or to ``pad_to`` (``pad_graph``'s sizes) and the batch to a power of two (at least
    ``batch_bucket``), so that one compiled program serves every graph padded alike (docs/
    architecture.md, "Compilation"): makespans ``[B]``, bubble ratios ``[B]``, memory ``[B, devices]``.
    A check that fails inside the program gives a NaN makespan (the caller reruns it eagerly)."""
    padded = bucketed(graph) if pad_to is None else pad_graph(graph, **pad_to)
    n = len(hws)
    count = power_of_two(n, batch_bucket)
    members = [pad_hardware(eqx.tree_at(lambda h: h.network, hw, hw.network.with_traced_data_parallel()), padded)
               for hw in hws]
    members += [members[0]] * (count - n)
    stacked = jax.tree.map(lambda *x: jax.device_put(np.stack([np.asarray(v) for v in x])), *members)
    steps, bubbles, memory = (np.asarray(x) for x in batched_simulation(padded, stacked, jax.device_put(
        np.asarray(graph.devices, np.float32))))
    return steps[:n], bubbles[:n], memory[:n, :graph.devices]
