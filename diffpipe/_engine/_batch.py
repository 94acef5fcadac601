"""The batched exact evaluators: makespan, peak memory and fit of many ``Hardware`` built from
inputs (``evaluate_batched``), and makespan, bubble and peak memory of given ``Hardware`` on a graph
padded to its size bucket or to given sizes (``simulate_members``: ``plan``'s candidates, ``compare``'s
schedules).

Batches are padded to a few bucket sizes so that new batch counts rarely compile anything new.
"""


from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._arrays import power_of_two
from ._graph import Graph, bucketed, pad_graph
from ._hardware import pad_hardware
from ._jit_checks import nan_checked
from ._simulate import makespan, peak_memory, simulate_graph

#: Plans per call of the batched exact simulator; memory is about ``nodes x k x chunk`` floats.
EVALUATION_CHUNK = 4096
#: Batches are padded to one of these sizes (the last one is ``chunk``), so that only a few shapes
#: are ever compiled whatever the number of plans.
_BUCKETS = (64, 512)


@eqx.filter_jit
@nan_checked
def _exact(graph: Graph, build: Any, inputs: Any):
    hws = jax.vmap(build)(inputs)
    times = makespan(graph, hws, batched=True)
    memory = jax.vmap(lambda hw: peak_memory(graph, hw)[0])(hws)
    return times, memory


def evaluate_batched(graph: Graph, build: Any, inputs: Any, capacity: Any, dtype: Any, *,
                     chunk: int = EVALUATION_CHUNK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact makespan ``[B]``, peak memory ``[B, devices]`` and fit ``[B]`` of ``jax.vmap(build)(inputs)``.

    ``build`` (a hashable callable, e.g. an ``eqx.Partial`` or a Module method) maps one entry of
    ``inputs`` (a pytree of numpy arrays with a leading ``[B]`` axis) to a ``Hardware``. Batches
    are padded to one of a few sizes (at most ``chunk`` per call), so new plan counts rarely
    compile anything new.
    """
    leaves = jax.tree.leaves(inputs)
    n = leaves[0].shape[0]
    capacity = np.broadcast_to(np.asarray(capacity, np.float64), (graph.devices,))
    times = np.empty(n)
    memory = np.empty((n, graph.devices))
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        bucket = next((b for b in _BUCKETS if b >= hi - lo and b < chunk), chunk)
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
    graph (``simulate``'s own terms, vmapped: the evaluator folds the batch into its batch-last
    layout). ``devices``: the real graph's device count (a traced value, so that every graph of a
    bucket shares the program); the padded devices are idle and hold nothing."""
    def one(hw):
        out = simulate_graph(graph, hw)
        return out.makespan, 1.0 - jnp.sum(out.busy) / (devices * out.makespan), out.peak_memory

    return jax.vmap(one)(hws)


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
