"""The sweep's evaluator: one chunk of ``[graphs, hardware]`` points at a time, sharded over every
device JAX sees (``jax.shard_map`` on a 1-D mesh; no communication between devices).

Per point it returns the exact makespan (the simulator's batched fast path), the total busy time,
the microbatch work, the largest per-device peak memory and whether it fits.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array

from .._evaluate import finish_times, sink_max
from .._graph import KIND_CODES, Graph, stack_graphs
from .._hardware import Hardware
from .._simulate import peak_memory
from .plan import Entry, Sizes, bytes_per_graph, bytes_per_point, chunking
from .variants import as_hardware, pad_variants


def _stack(graphs: Sequence[Graph]) -> Graph:
    """``stack_graphs``, kept on the host: chunks index it with numpy and feed each device its part."""
    return jax.tree.map(np.asarray, stack_graphs(graphs))


def _busy_weights(graph: Graph) -> np.ndarray:
    """Per node, how many device lanes its duration keeps busy: a compute op one, a collective one
    per participant (its lane entries), a blocking transfer two (sender and receiver). The total
    busy time ``sum(weights * dur)`` is then one product, not a per-device gather and scatter."""
    kind = np.asarray(graph.kind)
    weights = np.bincount(np.asarray(graph.lane_nodes), minlength=kind.shape[-1]).astype(np.float32)
    weights += graph.communication.busy_weight * (kind == KIND_CODES["T"])
    return weights


def _point_metrics(stack: tuple[Graph, Array], hw: Hardware):
    """Exact makespan, total busy time, microbatch work, largest peak memory and fit of one graph
    (and its ``_busy_weights``) on a hardware batch (leading axis; the batch is last inside, the
    fast path)."""
    graph, weights = stack
    tables = jax.vmap(lambda h: h.tables(graph))(hw).batch_last(batched=True)  # the batched fast path
    dur, _ = tables.expand(graph)
    # One sweep over the whole chunk: with several graphs vmapped here, splitting the batch into
    # cache-sized pieces (as makespan(batched=True) does) measured slower (62k vs 89k points/s).
    total = sink_max(graph, finish_times(graph, tables, None), None)
    busy = jnp.sum(weights.astype(dur.dtype)[:, None] * dur, axis=0)
    memory = jax.vmap(lambda h: peak_memory(graph, h)[0])(hw)
    capacity = jax.vmap(lambda h: h.per_device(graph))(hw)
    work = jnp.sum(jax.vmap(lambda h: h.per_microbatch(graph))(hw), axis=-1)
    return total, busy, work, jnp.max(memory, axis=-1), jnp.all(memory <= capacity, axis=-1)


_EVALUATORS: dict[tuple, Callable] = {}


def _evaluator(mesh: Mesh, axis: int, shared: bool) -> Callable:
    """The jitted, sharded evaluator of a chunk: graphs ``[G]``, hardware ``[B]`` (``shared``) or
    ``[G, B]``; ``axis`` 1 shards the hardware axis, 0 the graph axis. One object per layout, so
    ``eqx.filter_jit`` caches compilations across chunks and sweeps."""
    key = (mesh, axis, shared)
    if key not in _EVALUATORS:
        local = jax.vmap(_point_metrics, in_axes=(0, None if shared else 0))
        batch = P("points")
        if axis == 1:
            specs = (P(), batch if shared else P(None, "points"))
            out = P(None, "points")
        else:
            specs = (batch, P() if shared else batch)
            out = batch
        if mesh.devices.size == 1:  # nothing to split: skip shard_map's tracing and compile overhead
            mapped = local
        else:  # check_vma=False: equinox's runtime checks (error_if) are not annotated for shard_map
            mapped = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=out, check_vma=False)
        _EVALUATORS[key] = eqx.filter_jit(mapped)
    return _EVALUATORS[key]


def _put(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global array from the same host array on every process (each feeds its own devices)."""
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def _fetch(x: jax.Array) -> np.ndarray:
    if jax.process_count() > 1:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


class Progress:
    """tqdm when installed, else one rewritten stderr line; silent when disabled."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.bar, self.enabled = total, 0, None, enabled
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return
        self.bar = tqdm(total=total, unit="pt", unit_scale=True, desc="sweep", file=sys.stderr)

    def update(self, n: int) -> None:
        if not self.enabled:
            return
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        else:
            sys.stderr.write(f"\rsweep: {self.done}/{self.total} points ({100 * self.done / self.total:.0f}%)")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


def evaluate_stack(entries: Sequence[Entry], hardware: int, mesh: Mesh, max_bytes: int, progress: Progress,
                    out: Mapping[str, np.ndarray]) -> int:
    """Evaluate one stack chunk by chunk into the ``out`` columns; returns the chunk bytes used."""
    sizes = Sizes.of(entries[0].graph)
    for e in entries[1:]:
        sizes = sizes.join(Sizes.of(e.graph))
    pairs = "pair_latency" in entries[0].variants.leaves or "pair_bandwidth" in entries[0].variants.leaves
    per_point, per_graph = bytes_per_point(sizes, pairs), bytes_per_graph(sizes)
    devices = mesh.devices.size
    plan = chunking(len(entries), hardware, per_point, per_graph, devices, max_bytes)
    stacked = _stack([e.graph for e in entries])
    weights = np.stack([_busy_weights(jax.tree.map(lambda x, i=i: x[i], stacked)) for i in range(len(entries))])
    hw_sizes = (sizes.pipelines, sizes.stages, sizes.microbatches, sizes.devices)
    # Hardware shared by the whole stack (one normalisation) unless it depends on the schedule's shape.
    shared = all(e.variants is entries[0].variants for e in entries)
    mode = entries[0].mode
    evaluate = _evaluator(mesh, plan.axis, shared)
    split = NamedSharding(mesh, P("points"))
    whole = NamedSharding(mesh, P())
    split_second = NamedSharding(mesh, P(None, "points"))
    graph_def = jax.tree.structure((stacked, weights))
    stacked_leaves = jax.tree.leaves((stacked, weights))
    for g0 in range(0, len(entries), plan.graphs):
        members = list(range(g0, min(g0 + plan.graphs, len(entries))))
        members += [members[0]] * (plan.graphs - len(members))  # pad: one compiled shape per stack
        graph_leaves = [x[members] for x in stacked_leaves]
        graph_sharding = split if plan.axis == 0 else whole
        graphs = jax.tree.unflatten(graph_def, [_put(x, graph_sharding) for x in graph_leaves])
        for b0 in range(0, hardware, plan.hardware):
            index = np.arange(b0, b0 + plan.hardware)
            index = np.where(index < hardware, index, b0)  # pad with a real variant
            if shared:
                chunk = pad_variants(entries[0].variants, index, *hw_sizes)
                sharding = split if plan.axis == 1 else whole
            else:
                parts = [pad_variants(entries[i].variants, index, *hw_sizes) for i in members]
                chunk = {k: np.stack([part[k] for part in parts]) for k in parts[0]}
                sharding = split_second if plan.axis == 1 else split
            hw = as_hardware(chunk, entries[0].variants, mode, stacked.devices_per_node)
            hw = jax.tree.map(lambda x, s=sharding: _put(x, s), hw)
            results = [_fetch(x) for x in evaluate(graphs, hw)]
            real_g = min(g0 + plan.graphs, len(entries)) - g0
            real_b = min(b0 + plan.hardware, hardware) - b0
            for j in range(real_g):
                rows = slice(entries[g0 + j].row + b0, entries[g0 + j].row + b0 + real_b)
                for name, value in zip(("makespan", "_busy", "_work", "peak_memory", "fits"), results):
                    out[name][rows] = value[j, :real_b]
            progress.update(real_g * real_b)
    return plan.bytes
