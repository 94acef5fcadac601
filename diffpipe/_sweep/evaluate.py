"""The sweep's evaluator: one chunk of ``[graphs, hardware]`` points at a time, sharded over every
device JAX sees (``jax.shard_map`` on a 1-D mesh; no communication between devices).

Per point it returns the exact makespan, the total busy time, the microbatch work, the largest
per-device peak memory and whether it fits. A chunk's graphs are evaluated one after the other
(``lax.map`` over indices into the stack), each on all of the chunk's hardware by the engine's
batched evaluator (``_engine._batch.batch_metrics``, batch last: the simulator's makespan and peak
memory formulas, busy time two small products on the cost tables), so no metric expands
``[nodes, batch]`` arrays or runs batched scatters. A stack (its padded graphs and busy-time
coefficients) is built and sent to the devices once, and cached across sweeps (``stack``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array

from .. import _progress
from .._caches import BoundedDict
from .._engine._batch import batch_metrics, busy_coefficients
from .._engine._graph import Graph, stack_graphs
from .._engine._hardware import Hardware
from .._engine._jit_checks import nan_checked
from .plan import Entry, Sizes, bytes_per_graph, bytes_per_point, chunking
from .variants import as_hardware, pad_variants


@dataclass
class Stack:
    """A stack's graphs padded and stacked on the host, each graph's busy-time coefficients, and
    the same arrays once on the devices (replicated): cached across sweeps (``stack``)."""

    graphs: tuple[Graph, ...]  # held, so that the cache key (their ids) stays unique
    host: tuple[Graph, np.ndarray, np.ndarray]
    device: tuple[Graph, jax.Array, jax.Array] | None = None


#: Stacks kept across sweeps (keyed by their graphs, which the sweep caches): bounded.
STACK_CACHE = 16
_STACKS: BoundedDict = BoundedDict(STACK_CACHE)


def stack(graphs: Sequence[Graph], mesh: Mesh) -> Stack:
    """The cached ``Stack`` of ``graphs`` (built and sent to the devices once)."""
    key = (tuple(id(g) for g in graphs), mesh)
    entry = _STACKS.get(key)
    if entry is not None and all(a is b for a, b in zip(entry.graphs, graphs)):
        _STACKS.move_to_end(key)
        return entry
    stacked = jax.tree.map(np.asarray, stack_graphs(graphs))
    costs, microbatches = stacked.node_cost.shape[-2], stacked.microbatches
    parts = [busy_coefficients(jax.tree.map(lambda x, i=i: x[i], stacked), costs, microbatches)
             for i in range(len(graphs))]
    host = (stacked, np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts]))
    whole = NamedSharding(mesh, P())
    entry = Stack(tuple(graphs), host, _put_tree(host, whole))
    _STACKS[key] = entry
    return entry


def point_metrics(graph: Graph, rows: Array, sizes: Array, hw: Hardware, memory: Array | bool = True):
    """Exact makespan, total busy time, microbatch work, largest peak memory and fit of one graph
    on a hardware batch (leading axis): the engine's batched evaluator (``batch_metrics``, busy time
    from the stack's coefficients). Peak memory and fit are computed only where ``memory`` (else 0
    and False: another entry of the same schedule supplies them)."""
    out = batch_metrics(graph, hw, busy=(rows, sizes), memory=memory)
    capacity = jnp.moveaxis(hw.capacity, 0, -1)
    work = jnp.sum(hw.size, axis=-1)
    peak = out.peak_memory
    return out.makespan, out.busy, work, jnp.max(peak, axis=0), jnp.all(peak <= capacity, axis=0) & memory


def chunk_metrics(stacked: tuple[Graph, Array, Array], index: Array, which: Array, memory: Array, hw: Hardware):
    """``point_metrics`` of the stack's graphs ``index`` ``[G]``, one after the other (``lax.map``),
    graph ``index[g]`` on the hardware normalisation ``which[g]`` of ``hw`` ``[V, B]`` (one per
    distinct schedule shape in the stack, usually far fewer than graphs), its peak memory where
    ``memory[g]``: outputs ``[G, B]``."""
    graphs, rows, sizes = stacked

    def one(args):
        i, v, m = args
        h = jax.tree.map(lambda x: x[v], hw)
        return point_metrics(jax.tree.map(lambda x: x[i], graphs), rows[i], sizes[i], h, m)

    return lax.map(one, (index, which, memory))


#: (mesh, axis) -> its evaluator: one per device layout, a handful in a process.
_EVALUATORS: BoundedDict = BoundedDict(64)


def _evaluator(mesh: Mesh, axis: int) -> Callable:
    """The jitted, sharded evaluator of a chunk: the stack (replicated), graph and hardware indices
    and memory flags ``[G]``, hardware ``[V, B]``; ``axis`` 1 shards the hardware axis, 0 the graph axis. One object
    per layout, so ``eqx.filter_jit`` caches compilations across chunks and sweeps."""
    key = (mesh, axis)
    if key not in _EVALUATORS:
        batch = P("points")
        if axis == 1:
            specs = (P(), P(), P(), P(), P(None, "points"))
            out = P(None, "points")
        else:
            specs = (P(), batch, batch, batch, P())
            out = batch
        if mesh.devices.size == 1:  # nothing to split: skip shard_map's tracing and compile overhead
            mapped = chunk_metrics
        else:  # check_vma=False: equinox's runtime checks (error_if) are not annotated for shard_map
            mapped = jax.shard_map(chunk_metrics, mesh=mesh, in_specs=specs, out_specs=out, check_vma=False)
        _EVALUATORS[key] = eqx.filter_jit(nan_checked(mapped))  # checked hardware: no host callback
    return _EVALUATORS[key]


def _put(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global array from the same host array on every process (each feeds its own devices)."""
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def _put_tree(tree, sharding: NamedSharding):
    """``_put`` of every leaf; in one process, one batched ``jax.device_put`` (a transfer per leaf
    cost ~0.4 ms of Python each: 15-20 leaves per hardware chunk)."""
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)
    return jax.tree.map(lambda x: _put(x, sharding), tree)


def _refill(template: Hardware, leaves: Mapping[str, np.ndarray]) -> Hardware:
    """``template`` (a checked ``as_hardware`` of an earlier chunk of the same stack) with the same
    named leaves of another chunk: no constructor checks (the values come from checked hardware,
    padded with valid fills), no per-leaf Python."""
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    return jax.tree.unflatten(treedef, [leaves[path[-1].name] for path, _ in paths])


def _fetch(x: jax.Array) -> np.ndarray:
    if jax.process_count() > 1:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


class Progress(_progress.Progress):
    """The sweep's progress (``diffpipe._progress.Progress``): ``total`` points evaluated;
    ``enabled`` None: shown once the sweep has run ``DELAY`` seconds, True: at once, False: never."""

    def __init__(self, total: int, enabled: bool | None, label: str = "sweep"):
        super().__init__(label, enabled is not False, show_now=enabled is True)
        self.stage("evaluating points", total)


def evaluate_stack(entries: Sequence[Entry], hardware: int, mesh: Mesh, max_bytes: int, progress: Progress,
                    out: Mapping[str, np.ndarray]) -> int:
    """Evaluate one stack chunk by chunk into the ``out`` columns; returns the chunk bytes used."""
    sizes = Sizes.of(entries[0].graph)
    for e in entries[1:]:
        sizes = sizes.join(Sizes.of(e.graph))
    pairs = "pair_latency" in entries[0].variants.leaves or "pair_bandwidth" in entries[0].variants.leaves
    # One hardware normalisation per distinct schedule shape (HardwareSource caches them by shape):
    # each is padded and sent once per hardware chunk; graphs pick theirs by index.
    distinct: dict[int, int] = {}
    for e in entries:
        distinct.setdefault(id(e.variants), len(distinct))
    normalised = list({id(e.variants): e.variants for e in entries}.values())
    which = np.asarray([distinct[id(e.variants)] for e in entries], np.int32)
    memory = np.asarray([e.memory_from < 0 for e in entries])
    per_point, per_graph = bytes_per_point(sizes, pairs, len(normalised)), bytes_per_graph(sizes)
    devices = mesh.devices.size
    plan = chunking(len(entries), hardware, per_point, per_graph, devices, max_bytes)
    cached = stack([e.graph for e in entries], mesh)
    hw_sizes = (sizes.pipelines, sizes.stages, sizes.microbatches, sizes.devices)
    evaluate = _evaluator(mesh, plan.axis)
    split = NamedSharding(mesh, P("points"))
    whole = NamedSharding(mesh, P())
    names = ("makespan", "_busy", "_work", "peak_memory", "fits")
    hw_sharding = NamedSharding(mesh, P(None, "points")) if plan.axis == 1 else whole
    sharding = split if plan.axis == 0 else whole
    template = None
    per_graph_args = {}  # graph chunk -> its index arrays on the devices (the same for every hardware chunk)
    for b0 in range(0, hardware, plan.hardware):
        index = np.arange(b0, b0 + plan.hardware)
        index = np.where(index < hardware, index, b0)  # pad with a real variant
        real_b = min(b0 + plan.hardware, hardware) - b0
        parts = [pad_variants(v, index, *hw_sizes) for v in normalised]
        chunk = {k: np.stack([part[k] for part in parts]) for k in parts[0]}
        if template is None:
            template = as_hardware(chunk, entries[0].variants)
            hw = template
        else:
            hw = _refill(template, chunk)
        hw = _put_tree(hw, hw_sharding)  # once per hardware chunk
        for g0 in range(0, len(entries), plan.graphs):
            if g0 not in per_graph_args:
                members = list(range(g0, min(g0 + plan.graphs, len(entries))))
                members += [members[0]] * (plan.graphs - len(members))  # pad: one compiled shape per stack
                per_graph_args[g0] = _put_tree((np.asarray(members, np.int32), which[members], memory[members]),
                                               sharding)
            results = [_fetch(x) for x in evaluate(cached.device, *per_graph_args[g0], hw)]
            real_g = min(g0 + plan.graphs, len(entries)) - g0
            for j in range(real_g):
                rows = slice(entries[g0 + j].row + b0, entries[g0 + j].row + b0 + real_b)
                for name, value in zip(names, results):
                    out[name][rows] = value[j, :real_b]
            progress.update(real_g * real_b)
    return plan.bytes
