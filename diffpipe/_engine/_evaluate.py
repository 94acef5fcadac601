"""The max-plus evaluation of a graph: exact, or smoothed with a log-sum-exp; its adjoints; its
batching rule.

``finish[i] = dur[i] + smax(0, max_k finish[pred[i,k]] + delay[i,k])`` over the levels of the
graph (``lax.scan``; each level is one contiguous block of rows, vectorised over its nodes and
the batch, which is the last axis: ``[nodes, batch]``). Costs are read per level from the graph's
small cost tables (``CostTables``), so no ``[nodes, k, batch]`` array is materialised.

Smoothing: ``smax_tau(x) = tau * log(exp(0) + sum_k exp(x_k / tau))``. The release term ``0`` is
always finite, so no reduction is all ``-inf`` and tangents never become NaN. Since
``max(x) <= smax_tau(x) <= max(x) + tau * ln(k + 1)``, the smoothed finish of a node exceeds the
exact one by at most ``tau * ln(k + 1)`` per level it lies below the sources, and the makespan (a
smoothed max over ``s`` sinks) by at most ``tau * (levels * ln(k + 1) + ln(s))``.

Design (``SweepAdjoint``, the default): three JAX primitives, each a level scan over batch-last
arrays, evaluated in cache-sized chunks of ``BATCH_CHUNK`` variants (``lax.map``):

- ``forward``: ``(tables, tau) -> finish``;
- ``tangent``: ``(tables, tau, finish; d tables, d tau) -> d finish``, linear in the ``d``'s:
  ``d finish_i = d dur_i + sum_k w_ik (d finish[pred_ik] + d delay_ik) + s_i d tau``;
- ``cotangent``: its transpose, a reverse sweep that sends each node's cotangent to its
  predecessors with the same weights; the tables' cotangents are then segment sums.

``w_ik`` are the soft-argmax weights, a softmax over ``[0, x_i1, ..., x_ik] / tau`` computed from the
edge arguments ``x`` themselves (one-hot of the first maximum when exact): with the release term
they sum to one, so float32 rounding is never amplified by ``1 / tau``; ``s_i = d smax / d tau``.
The forward's JVP rule is ``tangent``, whose transpose rule is ``cotangent`` (and back), so forward
mode (``jax.jvp``, ``jax.jacfwd``) and reverse mode (``jax.grad``: one forward plus one reverse
sweep; it stores ``finish``, ``[nodes, batch]``) run the hand-written sweeps. The batching rule of
all three folds a ``jax.vmap`` axis into the trailing batch axis (``[..., B] x V -> [..., B*V]``),
so ``jax.vmap`` over hardware, nested ``vmap``s and ``vmap`` of gradients run the same chunked,
batch-last scan as one batched call; a vmapped (stacked) graph is evaluated one graph after the
other (``lax.map``), each with its batch last. ``AutodiffAdjoint`` lets JAX differentiate and batch
a plain level scan instead (a reference; slower in reverse mode and under ``vmap``).

Near the hardware (CPU): a level's reads of other rows (its predecessors' finish times, the sizes
of its microbatches) go through small loop-carried buffers (``_take``), so that every per-level
fusion either reads little or updates a buffer in place; XLA:CPU then runs the whole scan on one
thread. A plain gather from the ``[nodes, chunk]`` carry made XLA split each level's gather over
two threads (its cost model counts the whole operand), a thread hand-off per level that grew with
the graph: at 512 / 4k / 32k ops, 0.70 / 0.39 / 0.18 of a single-threaded C loop's speed before,
0.63 / 1.37 / 1.08 after (``benchmarks/bench_simulator.py``, ``per_op``). Chunks carry their
buffers to the next chunk (``_forward_buffers``): no per-chunk fill.
The reverse sweep's scatter to the predecessors is still split (XLA gives a scatter no in-place
exemption): the reverse mode keeps a hand-off per level.

Why one module past 500 lines: the three primitives, their JVP, transpose and batching rules and the
two adjoints are one mechanism, each rule written against the others.
"""

from __future__ import annotations

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jaxtyping import Array, Float

from .._errors import ConfigError
from ._cost_model import CostTables
from ._graph import PAD, Graph

#: Hardware variants a sweep evaluates together: larger batches run as a sequence of chunks this
#: wide, so that the ``[nodes, chunk]`` carry stays in cache (benchmarks/bench_simulator.py).
BATCH_CHUNK = 128


# -- one level ---------------------------------------------------------------------------------
def _take(scratch: Array, x: Array, index: Array, zero: Array) -> tuple[Array, Array]:
    """``x[index]`` (whole rows of ``x``) inside a level scan, written into the loop-carried
    ``scratch`` (``[index.size + 1, B]``) first; returns the new scratch and the rows.

    Why: XLA:CPU splits a fusion over threads when its *operands* are large (it counts a gather's
    whole operand: the ``[nodes, chunk]`` finish times, or a ``[microbatches, chunk]`` table), so
    a plain ``x[index]`` of a few rows ran as two tasks on two cores at every level once the graph
    passed about 500 nodes: per-op cost grew with the graph (bench_simulator.py ``per_op``). A
    fusion whose root updates a buffer in place is never split, and the gather fuses into it.
    ``zero`` is a start index that is 0 at run time (clamped) but not a constant XLA could fold."""
    flat = index.reshape(-1)
    scratch = lax.dynamic_update_slice_in_dim(scratch, x[flat], zero, 0)
    return scratch, lax.dynamic_slice_in_dim(scratch, zero, flat.shape[0]).reshape(*index.shape, *x.shape[1:])


def _scratch(graph: Graph, like: Array, *rows: int) -> tuple[Array, ...]:
    """Zeroed ``_take`` buffers ``[n + 1, B]`` for takes of ``n`` rows each."""
    return tuple(jnp.zeros((n + 1, like.shape[-1]), like.dtype) for n in rows)


def _level_scratch(graph: Graph, like: Array) -> tuple[Array, ...]:
    """Buffers for ``_level``'s takes: the sizes of a level's rows and its predecessors' finishes."""
    return _scratch(graph, like, graph.width, graph.width * graph.pred.shape[-1])


def _level(graph: Graph, tables: CostTables, finish: Array, offset: Array, scratch: tuple[Array, ...]):
    """The rows of the level at ``offset``: predecessors, edge arguments ``x = finish[pred] +
    delay`` ``[width, k, B]``, durations ``[width, B]``, the cost-table rows they read, and the
    updated ``_take`` buffers (``_level_scratch``)."""

    def cut(x):
        return lax.dynamic_slice_in_dim(x, offset, graph.width)

    pred, node_row, edge_row, microbatch = cut(graph.pred), cut(graph.node_row), cut(graph.edge_row), cut(
        graph.microbatch)
    zero = jnp.minimum(offset, 0)  # offsets are >= 0
    s_size, s_pred = scratch
    s_size, size = _take(s_size, tables.size, microbatch, zero)
    s_pred, before = _take(s_pred, finish, pred, zero)
    dur = tables.base[node_row] + size * tables.per_size[node_row]
    x = before + tables.edge_base[edge_row] + size[:, None, :] * tables.edge_per_size[edge_row]
    return pred, x, dur, (node_row, edge_row, microbatch, size, zero), (s_size, s_pred)


def _soft(x: Array, tau: Array, exact: bool):
    """``smax(0, x_1..x_k)`` ``[width, B]``, its weights ``[width, k, B]`` (softmax over the release
    term and the edges, computed from ``x``; one-hot of the first maximum when exact) and its
    derivative in ``tau``."""
    top = jnp.maximum(jnp.max(x, axis=1), 0.0)  # finite: includes the release term
    if exact:
        candidates = jnp.concatenate([jnp.zeros_like(x[:, :1]), x], axis=1)
        winner = jnp.argmax(candidates, axis=1).astype(jnp.int32)  # first maximum; 0 = release
        slots = jnp.arange(1, x.shape[1] + 1, dtype=jnp.int32)[None, :, None]
        return top, (winner[:, None, :] == slots).astype(x.dtype), jnp.zeros_like(top)
    t = tau[None, :]
    finite = jnp.isfinite(x)  # padded edges: -inf; masked before dividing, so no inf * 0 anywhere
    z = jnp.where(finite, x - top[:, None, :], 0.0) / t[:, None, :]
    e = jnp.where(finite, jnp.exp(z), 0.0)
    z0 = -top / t
    total = jnp.exp(z0) + jnp.sum(e, axis=1)  # >= 1 term equal to exp(0)
    w = e / total[:, None, :]
    d_tau = jnp.log(total) - jnp.sum(w * z, axis=1) - jnp.exp(z0) / total * z0
    return top + t * jnp.log(total), w, d_tau


# -- the three sweeps (batch-last, one chunk) ----------------------------------------------------
def _forward_buffers(graph: Graph, width: int, dtype) -> tuple:
    """The forward's working buffers for ``width`` variants: finish times (``-inf``: the sentinel
    row is never written), ``_level``'s takes and the sinks' take. Carried from one batch chunk to
    the next (``_in_chunks``): every node's row is rewritten before it is read, so nothing is
    refilled per chunk (a ``[nodes, chunk]`` fill was a multi-threaded op per chunk)."""
    finish = jnp.full((graph.kind.shape[-1], width), -jnp.inf, dtype=dtype)
    return finish, _level_scratch(graph, finish), _scratch(graph, finish, graph.sinks.shape[-1])[0]


def _forward_chunk(graph: Graph, tables: CostTables, tau: Array, exact: bool, buffers: tuple,
                   sinks: bool = False) -> tuple[Array, tuple]:
    """Finish times of every row (or of the sinks) of one chunk, and the buffers for the next."""
    def level(carry, offset):
        finish, scratch = carry
        _, x, dur, _, scratch = _level(graph, tables, finish, offset, scratch)
        rows = dur + _soft(x, tau, exact)[0]
        return (lax.dynamic_update_slice_in_dim(finish, rows, offset, 0), scratch), None

    finish, scratch, at_sinks = buffers
    (finish, scratch), _ = lax.scan(level, (finish, scratch), graph.offsets)
    # Rows that are not nodes hold -inf; masked here, inside the primitive, where the batch is last
    # (outside, under jax.vmap, a select would first move the vmapped axis to the front: a copy).
    if sinks:  # only the sinks leave the chunk
        at_sinks, out = _take(at_sinks, finish, graph.sinks, jnp.minimum(graph.offsets[0], 0))
        out = jnp.where((graph.kind[graph.sinks] != PAD)[:, None], out, -jnp.inf)
    else:
        out = jnp.where((graph.kind != PAD)[:, None], finish, -jnp.inf)
    return out, (finish, scratch, at_sinks)


def _forward(graph: Graph, tables: CostTables, tau: Array, exact: bool) -> Array:
    """Finish times of every row of one chunk (rows that are not nodes: ``-inf``)."""
    return _forward_chunk(graph, tables, tau, exact, _forward_buffers(graph, tau.shape[-1], tables.base.dtype))[0]


def _tangent(graph: Graph, tables: CostTables, tau: Array, finish: Array, d_tables: CostTables, d_tau: Array,
             exact: bool) -> Array:
    def level(carry, offset):
        d_finish, scratch, (s_size, s_pred) = carry
        pred, x, _, (node_row, edge_row, microbatch, size, zero), scratch = _level(
            graph, tables, finish, offset, scratch)
        _, w, s = _soft(x, tau, exact)
        s_size, d_size = _take(s_size, d_tables.size, microbatch, zero)
        s_pred, d_before = _take(s_pred, d_finish, pred, zero)
        d_dur = d_tables.base[node_row] + d_size * tables.per_size[node_row] + size * d_tables.per_size[node_row]
        d_delay = (d_tables.edge_base[edge_row] + d_size[:, None, :] * tables.edge_per_size[edge_row]
                   + size[:, None, :] * d_tables.edge_per_size[edge_row])
        rows = d_dur + jnp.sum(w * (d_before + d_delay), axis=1)
        if not exact:
            rows = rows + s * d_tau[None, :]
        return (lax.dynamic_update_slice_in_dim(d_finish, rows, offset, 0), scratch, (s_size, s_pred)), None

    d_finish = jnp.zeros_like(finish)
    carry = (d_finish, _level_scratch(graph, finish), _level_scratch(graph, finish))
    d_finish = lax.scan(level, carry, graph.offsets)[0][0]
    return jnp.where((graph.kind != PAD)[:, None], d_finish, 0.0)


def _cotangent(graph: Graph, tables: CostTables, tau: Array, finish: Array, g_finish: Array,
               exact: bool) -> tuple[CostTables, Array]:
    """Reverse sweep over the levels, recomputing each level's costs and weights from the tables
    (as the forward does); each level sends its rows' final cotangents to their predecessors."""
    lanes = jnp.arange(graph.width, dtype=graph.sizes.dtype)[:, None]
    real = (graph.kind != PAD)[:, None]

    def level(carry, level_at):
        g, g_tau, scratch = carry
        offset, count = level_at
        pred, x, _, _, scratch = _level(graph, tables, finish, offset, scratch)
        _, w, s = _soft(x, tau, exact)
        gl = jnp.where(lanes < count, lax.dynamic_slice_in_dim(g, offset, graph.width), 0.0)
        g = g.at[pred].add(gl[:, None, :] * w)
        return (g, g_tau + jnp.sum(gl * s, axis=0), scratch), None

    carry = (jnp.where(real, g_finish, 0.0), jnp.zeros_like(tau), _level_scratch(graph, finish))
    (g, g_tau, _), _ = lax.scan(level, carry, (graph.offsets, graph.sizes), reverse=True)
    g = jnp.where(real, g, 0.0)  # the cotangent of every node's duration
    return _table_cotangent(graph, tables, tau, finish, g, exact), g_tau


def _table_cotangent(graph: Graph, tables: CostTables, tau: Array, finish: Array, g: Array,
                     exact: bool) -> CostTables:
    """Transpose of ``CostTables.expand`` given the nodes' cotangents ``g``: segment sums. A
    transfer edge's cotangent is its weight times its node's (recomputed for those edges only)."""
    node, slot = graph.xfer_node, graph.xfer_slot
    size = tables.size[graph.microbatch[node]]
    edge_row = graph.edge_row[node]
    x = finish[graph.pred[node]] + tables.edge_base[edge_row] + size[:, None, :] * tables.edge_per_size[edge_row]
    w = jnp.take_along_axis(_soft(x, tau, exact)[1], slot[:, None, None], axis=1)[:, 0]
    g_edge = g[node] * w  # [transfers, batch]: the cotangent of each transfer edge's delay
    row = graph.edge_row[node, slot]
    node_size = tables.size[graph.microbatch]
    costs, edge_costs, microbatches = tables.base.shape[0], tables.edge_base.shape[0], tables.size.shape[0]
    return CostTables(
        base=jax.ops.segment_sum(g, graph.node_row, costs),
        per_size=jax.ops.segment_sum(g * node_size, graph.node_row, costs),
        edge_base=jax.ops.segment_sum(g_edge, row, edge_costs),
        edge_per_size=jax.ops.segment_sum(g_edge * size, row, edge_costs),
        size=jax.ops.segment_sum(g * tables.per_size[graph.node_row], graph.microbatch, microbatches)
        + jax.ops.segment_sum(g_edge * tables.edge_per_size[row], graph.microbatch[node], microbatches),
    )


def _in_chunks(fn, graph: Graph, operands: tuple, chunk: int = BATCH_CHUNK, buffers=None):
    """``fn(graph, *operands)`` (every operand and output leaf batch-last) over chunks of ``chunk``
    variants in sequence (``lax.scan``); the last chunk is padded with copies of the last variant.
    With ``buffers(graph, width, dtype)``, ``fn(graph, buffers, *operands) -> (out, buffers)``
    instead: working buffers carried from one chunk to the next."""
    leaves = jax.tree.leaves(operands)
    batch, dtype = leaves[0].shape[-1], leaves[0].dtype
    if buffers is None:
        def step(g, carry, *ops):
            return fn(g, *ops), carry

        def initial(width):
            return ()
    else:
        step = fn

        def initial(width):
            return buffers(graph, width, dtype)
    if batch <= chunk:
        return step(graph, initial(batch), *operands)[0]
    chunks = -(-batch // chunk)
    pad = chunks * chunk - batch

    def split(x):
        x = jnp.concatenate([x, jnp.repeat(x[..., -1:], pad, axis=-1)], axis=-1) if pad else x
        return jnp.moveaxis(x.reshape(*x.shape[:-1], chunks, chunk), -2, 0)

    def merge(x):
        x = jnp.moveaxis(x, 0, -2)
        return x.reshape(*x.shape[:-2], chunks * chunk)[..., :batch]

    def body(carry, ops):
        out, carry = step(graph, carry, *ops)
        return carry, out

    return jax.tree.map(merge, lax.scan(body, initial(chunk), jax.tree.map(split, operands))[1])


# -- the primitives --------------------------------------------------------------------------------
def _unpack(flat, tree):
    graph, operands = jax.tree.unflatten(tree, flat)
    return graph, operands


def _graph_leaves(tree) -> int:
    return tree.children()[0].num_leaves


def _bind(prim: Primitive, graph: Graph, operands: tuple, exact: bool, sinks: bool = False) -> list[Array]:
    flat, tree = jax.tree.flatten((graph, operands))
    return prim.bind(*flat, tree=tree, exact=exact, sinks=sinks)


def _define(name: str, fn, out_avals, buffers=None) -> Primitive:
    """A primitive running ``fn(graph, *operands, exact)`` in chunks (or, with ``buffers``,
    ``fn(graph, *operands, exact, buffers, sinks) -> (out, buffers)``: see ``_in_chunks``); operands
    and outputs are batch-last. Its batching rule folds a vmapped axis into the batch (see the
    module docstring)."""
    prim = Primitive(f"diffpipe_{name}")
    prim.multiple_results = True

    def impl(*flat, tree, exact, sinks):
        graph, operands = _unpack(flat, tree)
        if buffers is not None:
            def step(g, carry, *ops):
                return fn(g, *ops, exact, carry, sinks)

            return jax.tree.leaves(_in_chunks(step, graph, operands, buffers=buffers))

        def chunk(g, *ops):
            out = fn(g, *ops, exact)
            return out[g.sinks] if sinks else out  # only the sinks leave the chunk: no [nodes, B] copies

        return jax.tree.leaves(_in_chunks(chunk, graph, operands))

    def abstract(*avals, tree, exact, sinks):
        graph, operands = _unpack(avals, tree)
        out = out_avals(graph, *operands)
        return [jax.core.ShapedArray((graph.sinks.shape[-1], *x.shape[1:]), x.dtype) for x in out] if sinks else out

    def batch(args, dims, *, tree, exact, sinks):
        n = _graph_leaves(tree)
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        if all(d is None for d in dims[:n]):  # fold the vmapped axis into the batch
            rest = [_fold(x, d, size) for x, d in zip(args[n:], dims[n:])]
            out = prim.bind(*args[:n], *rest, tree=tree, exact=exact, sinks=sinks)
            out = [x.reshape(*x.shape[:-1], x.shape[-1] // size, size) for x in out]
            return out, [x.ndim - 1 for x in out]
        # stacked graphs: one graph after the other, each batch-last
        mapped = [i for i, d in enumerate(dims) if d is not None]

        def one(xs):
            full = list(args)
            for i, x in zip(mapped, xs):
                full[i] = x
            return prim.bind(*full, tree=tree, exact=exact, sinks=sinks)

        out = lax.map(one, [jnp.moveaxis(args[i], dims[i], 0) for i in mapped])
        return out, [0] * len(out)

    prim.def_impl(impl)
    prim.def_abstract_eval(abstract)
    mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=True))
    batching.primitive_batchers[prim] = batch
    return prim


def _fold(x: Array, dim, size: int) -> Array:
    """``x`` ``[..., B]`` with a vmapped axis at ``dim`` (or none) as ``[..., B * size]``."""
    if dim is None:
        x = jnp.broadcast_to(x[..., None], (*x.shape, size))
    else:
        x = jnp.moveaxis(x, dim, -1)
    return x.reshape(*x.shape[:-2], x.shape[-2] * size)


def _like(x) -> jax.core.ShapedArray:
    return jax.core.ShapedArray(x.shape, x.dtype)


_forward_p = _define("forward", _forward_chunk, lambda graph, tables, tau: [
    jax.core.ShapedArray((graph.kind.shape[-1], tau.shape[-1]), tables.base.dtype)], buffers=_forward_buffers)
_tangent_p = _define("tangent", _tangent, lambda graph, tables, tau, finish, d_tables, d_tau: [_like(finish)])
_cotangent_p = _define("cotangent", _cotangent, lambda graph, tables, tau, finish, g: [
    _like(x) for x in jax.tree.leaves((tables, tau))])


def _forward_jvp(primals, tangents, *, tree, exact, sinks):
    graph, (tables, tau) = _unpack(primals, tree)
    (finish,) = _forward_p.bind(*primals, tree=tree, exact=exact, sinks=False)  # the residual
    n = _graph_leaves(tree)
    out = finish[graph.sinks] if sinks else finish
    if all(type(t) is ad.Zero for t in tangents[n:]):
        return [out], [ad.Zero.from_primal_value(out)]
    d = [ad.instantiate_zeros(t) for t in tangents[n:]]
    d_tables, d_tau = jax.tree.unflatten(jax.tree.structure((tables, tau)), d)
    (d_finish,) = _bind(_tangent_p, graph, (tables, tau, finish, d_tables, d_tau), exact)
    return [out], [d_finish[graph.sinks] if sinks else d_finish]


def _linear_jvp(prim: Primitive, linear: int):
    """JVP of a primitive linear in its last ``linear`` operand leaves (and not differentiable in
    the others: second derivatives through the residuals would need another sweep)."""

    def jvp(primals, tangents, *, tree, exact, sinks):
        out = prim.bind(*primals, tree=tree, exact=exact, sinks=sinks)
        if not all(type(t) is ad.Zero for t in tangents[:-linear]):
            raise NotImplementedError("second derivatives of the makespan: use adjoint=AutodiffAdjoint()")
        lin = [ad.instantiate_zeros(t) for t in tangents[-linear:]]
        return out, prim.bind(*primals[:-linear], *lin, tree=tree, exact=exact, sinks=sinks)

    return jvp


_TANGENTS = len(CostTables.__dataclass_fields__) + 1  # d_tables' leaves and d_tau: the linear operands


def _tangent_transpose(cts, *args, tree, exact, sinks):
    graph, (tables, tau, finish, d_tables, d_tau) = _unpack(args, tree)
    linear = _TANGENTS
    (ct,) = cts
    if type(ct) is ad.Zero:
        return [None] * len(args)
    out = _bind(_cotangent_p, graph, (tables, tau, finish, ct), exact)
    return [None] * (len(args) - linear) + [c if ad.is_undefined_primal(a) else None
                                            for c, a in zip(out, args[-linear:])]


def _cotangent_transpose(cts, *args, tree, exact, sinks):
    graph, (tables, tau, finish, _) = _unpack(args, tree)
    if all(type(c) is ad.Zero for c in cts):
        return [None] * len(args)
    cts = [ad.instantiate_zeros(c) for c in cts]
    ct_tables, ct_tau = jax.tree.unflatten(jax.tree.structure((tables, tau)), cts)
    (g,) = _bind(_tangent_p, graph, (tables, tau, finish, ct_tables, ct_tau), exact)
    return [None] * (len(args) - 1) + [g]


ad.primitive_jvps[_forward_p] = _forward_jvp
ad.primitive_jvps[_tangent_p] = _linear_jvp(_tangent_p, _TANGENTS)
ad.primitive_jvps[_cotangent_p] = _linear_jvp(_cotangent_p, 1)
ad.primitive_transposes[_tangent_p] = _tangent_transpose
ad.primitive_transposes[_cotangent_p] = _cotangent_transpose


# -- adjoints ------------------------------------------------------------------------------------
class AbstractAdjoint(eqx.Module):
    """How the finish times are differentiated (and batched), as diffrax's adjoints."""

    @abc.abstractmethod
    def finish(self, graph: Graph, tables: CostTables, tau: Float[Array, " batch"], exact: bool,
               sinks: bool = False) -> Array:
        """Finish time of every row ``[rows, batch]`` (rows that are not nodes hold ``-inf``), or of
        the sinks only ``[sinks, batch]``."""


class SweepAdjoint(AbstractAdjoint):
    """The hand-written sweeps (module docstring): forward and reverse mode, ``jax.vmap`` folded
    into the batch-last evaluator; reverse mode costs about two forwards and stores ``[nodes, batch]``."""

    def finish(self, graph, tables, tau, exact, sinks=False):
        return _bind(_forward_p, graph, (tables, tau), exact, sinks)[0]


class AutodiffAdjoint(AbstractAdjoint):
    """JAX's own differentiation and batching of a plain level scan: a reference; reverse mode
    stores every level's carry and is several times slower (benchmarks/bench_simulator.py)."""

    def finish(self, graph, tables, tau, exact, sinks=False):
        def chunk(g, t, s):
            out = _forward(g, t, s, exact)
            return out[g.sinks] if sinks else out

        return _in_chunks(chunk, graph, (tables, tau))


#: The adjoints' names at the API's edge (``adjoint="sweep"``).
ADJOINTS = {"sweep": SweepAdjoint, "autodiff": AutodiffAdjoint}


_NAMED = {name: cls() for name, cls in ADJOINTS.items()}  # immutable, so shared (no per-call construction)


def as_adjoint(adjoint: Any) -> AbstractAdjoint:
    """An adjoint object from an object or its name (the one place names map to objects)."""
    if isinstance(adjoint, AbstractAdjoint):
        return adjoint
    if isinstance(adjoint, str) and adjoint in ADJOINTS:
        return _NAMED[adjoint]
    raise ConfigError(f"adjoint {adjoint!r} is not an AbstractAdjoint or one of {', '.join(ADJOINTS)}")


# -- entry points ----------------------------------------------------------------------------------
def finish_times(
    graph: Graph,
    tables: CostTables,
    temperature: Float[Array, ""] | None = None,
    adjoint: AbstractAdjoint | str = "sweep",
) -> Float[Array, "nodes batch"]:
    """Finish time of every node under cost ``tables`` (batch last); rows that are not real nodes
    (scratch, sentinel) hold ``-inf``. ``temperature=None`` is exact max-plus; a positive
    temperature smooths every max."""
    return _finish(graph, tables, temperature, adjoint, sinks=False)


def _finish(graph: Graph, tables: CostTables, temperature, adjoint, sinks: bool) -> Array:
    batch = tables.size.shape[-1]
    dtype = tables.base.dtype
    tau = jnp.ones((batch,), dtype) if temperature is None else jnp.broadcast_to(
        jnp.asarray(temperature, dtype), (batch,))
    return as_adjoint(adjoint).finish(graph, tables, tau, temperature is None, sinks)


def smooth_max(values: Float[Array, "n batch"], temperature: Float[Array, ""] | None) -> Float[Array, " batch"]:
    """Max over axis 0, or ``tau * logsumexp(values / tau)`` (>= max, <= max + tau ln n)."""
    if temperature is None:
        return jnp.max(values, axis=0)
    return temperature * jax.nn.logsumexp(values / temperature, axis=0)


def sink_max(graph: Graph, finish: Float[Array, "nodes batch"], temperature) -> Float[Array, " batch"]:
    """The makespan: (smoothed) max of the sinks' finish times."""
    return smooth_max(finish[graph.sinks], temperature)


def batched_makespan(graph: Graph, tables: CostTables, temperature: Array | None = None,
                     adjoint: AbstractAdjoint | str = "sweep") -> Float[Array, " batch"]:
    """Makespan ``[batch]`` of batch-last cost tables (evaluated in chunks of ``BATCH_CHUNK``; only
    the sinks' finish times leave a chunk)."""
    return smooth_max(_finish(graph, tables, temperature, adjoint, sinks=True), temperature)
