"""The batched exact evaluator: makespan, peak memory and fit of many ``Hardware`` built from inputs.

Batches are padded to a few bucket sizes so that new batch counts rarely compile anything new.
"""


from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import numpy as np

from ._graph import Graph
from ._hardware import nan_checked
from ._simulate import makespan, peak_memory

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

