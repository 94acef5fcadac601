"""The max-plus evaluation of a graph: exact, or smoothed with a log-sum-exp, with a custom VJP.

``finish[i] = dur[i] + smax(0, max_k finish[pred[i,k]] + delay[i,k])`` over the levels of the
graph (``lax.scan``; each level is one contiguous block of rows, vectorised over its nodes and
the batch, which is the last axis: ``[nodes, batch]``).

Smoothing: ``smax_tau(x) = tau * log(exp(0) + sum_k exp(x_k / tau))``. The release term ``0`` is
always finite, so no reduction is all ``-inf`` and tangents never become NaN. Since
``max(x) <= smax_tau(x) <= max(x) + tau * ln(k + 1)``, the smoothed finish of a node exceeds the
exact one by at most ``tau * ln(k + 1)`` per level it lies below the sources, and the makespan (a
smoothed max over ``s`` sinks) by at most ``tau * (levels * ln(k + 1) + ln(s))``.

Costs are read per level from the graph's small cost tables (``CostTables``), so no
``[nodes, k, batch]`` array is materialised in either direction.

Gradients: a reverse sweep over the levels recomputes each level's edge weights, the soft-argmax
``exp((x_k - start_i) / tau)`` (one-hot for exact), and sends each node's cotangent to its
predecessors; the tables' cotangents are then segment sums. Reverse mode costs about two
forwards and stores ``[nodes, batch]`` arrays plus ``[transfers, k, batch]`` for the delays'
cotangents (measured in benchmarks/bench_simulator.py).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float

from ._graph import PAD, Graph
from ._hardware import CostTables


def _start_exact(x: Array) -> Array:
    return jnp.maximum(jnp.max(x, axis=1), 0.0)


def _start_smooth(x: Array, tau: Array) -> Array:
    top = jnp.maximum(jnp.max(x, axis=1), 0.0)  # finite: includes the release term
    # Padded edges (x = -inf) are masked on both sides of the exp, so that plain autodiff never
    # forms inf * 0 (the derivative in tau of exp(-inf / tau)).
    finite = jnp.isfinite(x)
    z = jnp.where(finite, x - top[:, None, :], 0.0) / tau
    total = jnp.exp(-top / tau) + jnp.sum(jnp.where(finite, jnp.exp(z), 0.0), axis=1)
    return top + tau * jnp.log(total)


def _level(finish, pred, dur, delay, tau):
    """One level: ``dur + smax(0, max_k finish[pred] + delay)`` for its ``[width]`` rows."""
    x = finish[pred] + delay
    return dur + (_start_exact(x) if tau is None else _start_smooth(x, tau))


def _sweep(pred, offsets, width, dur, delay, tau):
    """Forward sweep over levels from precomputed ``dur [rows, B]`` and ``delay [rows, k, B]``."""

    def level(finish, offset):
        rows = _level(finish, lax.dynamic_slice_in_dim(pred, offset, width),
                      lax.dynamic_slice_in_dim(dur, offset, width),
                      lax.dynamic_slice_in_dim(delay, offset, width), tau)
        return lax.dynamic_update_slice_in_dim(finish, rows, offset, 0), None

    finish0 = jnp.full(dur.shape, -jnp.inf, dtype=dur.dtype)
    return lax.scan(level, finish0, offsets)[0]


def _sweep_tables(graph: Graph, tables: CostTables, tau):
    """The same sweep reading each level's costs straight from the small cost tables, so the
    ``[rows, k, B]`` delays are never materialised (they would dominate memory traffic)."""
    width = graph.width
    batch = tables.size.shape[-1]

    def level(finish, offset):
        def cut(x):
            return lax.dynamic_slice_in_dim(x, offset, width)

        node_row, edge_row = cut(graph.node_row), cut(graph.edge_row)
        size = tables.size[cut(graph.microbatch)]
        dur = tables.base[node_row] + size * tables.per_size[node_row]
        delay = tables.edge_base[edge_row] + size[:, None, :] * tables.edge_per_size[edge_row]
        return lax.dynamic_update_slice_in_dim(finish, _level(finish, cut(graph.pred), dur, delay, tau),
                                               offset, 0), None

    finish0 = jnp.full((graph.kind.shape[-1], batch), -jnp.inf, dtype=tables.base.dtype)
    return lax.scan(level, finish0, graph.offsets)[0]


def _edge_weights(x, start, tau):
    """Soft-argmax weights ``exp((x_k - start) / tau)`` of the incoming edges (argmax one-hot when
    exact); the release term takes the rest. ``x`` is ``[width, k, B]``, ``start`` ``[width, B]``."""
    if tau is None:
        candidates = jnp.concatenate([jnp.zeros_like(x[:, :1]), x], axis=1)
        winner = jnp.argmax(candidates, axis=1).astype(jnp.int32)  # first maximum; 0 = release
        slots = jnp.arange(1, x.shape[1] + 1, dtype=jnp.int32)[None, :, None]
        return (winner[:, None, :] == slots).astype(x.dtype)
    # x <= start on real rows, so the exponent is <= 0; clamping and masking keep rows outside the
    # level (junk values, zero cotangent) from producing inf * 0 = NaN.
    exponent = jnp.minimum((x - start[:, None, :]) / tau, 0.0)
    return jnp.where(jnp.isneginf(x), 0.0, jnp.exp(exponent))


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _finish(graph: Graph, tables: CostTables, exact: bool, tau):
    return _sweep_tables(graph, tables, None if exact else tau)


def _finish_fwd(graph, tables, exact, tau):
    finish = _sweep_tables(graph, tables, None if exact else tau)
    return finish, (graph, tables, tau, finish)


def _finish_bwd(exact, residuals, g_finish):
    """Reverse sweep over the levels, recomputing each level's costs and edge weights from the
    cost tables (as the forward does), so no ``[nodes, k, batch]`` array is ever stored; each
    level sends its rows' final cotangents to their predecessors. The tables' cotangents are then
    segment sums: a node's duration cotangent is its own, a transfer edge's is its weight times its
    node's cotangent (recomputed for the transfer edges only)."""
    graph, tables, tau, finish = residuals
    smooth = None if exact else tau
    width = graph.width
    lanes = jnp.arange(width, dtype=graph.sizes.dtype)[:, None]
    real = (graph.kind != PAD)[:, None]

    def level(carry, level_at):
        g, g_tau = carry
        offset, count = level_at

        def cut(x):
            return lax.dynamic_slice_in_dim(x, offset, width)

        pred, x, start = _level_inputs(graph, tables, finish, cut(graph.pred), cut(graph.node_row),
                                       cut(graph.edge_row), cut(graph.microbatch), cut(finish))
        w = _edge_weights(x, start, smooth)
        gl = jnp.where(lanes < count, cut(g), 0.0)
        g = g.at[pred].add(gl[:, None, :] * w)
        if smooth is not None:  # d start / d tau at fixed inputs: (start - sum_k w_k x_k) / tau
            local = (start - jnp.sum(jnp.where(w > 0, w * x, 0.0), axis=1)) / tau
            g_tau = g_tau + jnp.sum(jnp.where(jnp.isfinite(local), gl * local, 0.0))
        return (g, g_tau), None

    carry = (jnp.where(real, g_finish, 0.0), jnp.zeros((), tau.dtype))
    (g, g_tau), _ = lax.scan(level, carry, (graph.offsets, graph.sizes), reverse=True)
    g = jnp.where(real, g, 0.0)  # the cotangent of every node's duration
    g_tau = jnp.zeros_like(tau) if exact else g_tau.astype(tau.dtype)
    return None, _table_cotangent(graph, tables, finish, g, smooth), g_tau


def _level_inputs(graph: Graph, tables: CostTables, finish, pred, node_row, edge_row, microbatch, row_finish):
    """For some rows: predecessors, edge arguments ``x = finish[pred] + delay`` and start times."""
    size = tables.size[microbatch]
    dur = tables.base[node_row] + size * tables.per_size[node_row]
    x = finish[pred] + tables.edge_base[edge_row] + size[:, None, :] * tables.edge_per_size[edge_row]
    return pred, x, row_finish - dur


def _table_cotangent(graph: Graph, tables: CostTables, finish, g, smooth) -> CostTables:
    """Transpose of ``CostTables.expand`` given the nodes' cotangents ``g``: segment sums."""
    node, slot = graph.xfer_node, graph.xfer_slot
    pred, x, start = _level_inputs(graph, tables, finish, graph.pred[node], graph.node_row[node],
                                   graph.edge_row[node], graph.microbatch[node], finish[node])
    w = jnp.take_along_axis(_edge_weights(x, start, smooth), slot[:, None, None], axis=1)[:, 0]
    g_edge = g[node] * w  # [transfers, batch]: the cotangent of each transfer edge's delay
    row = graph.edge_row[node, slot]
    size, edge_size = tables.size[graph.microbatch], tables.size[graph.microbatch[node]]
    costs, edge_costs, microbatches = tables.base.shape[0], tables.edge_base.shape[0], tables.size.shape[0]
    return CostTables(
        base=jax.ops.segment_sum(g, graph.node_row, costs),
        per_size=jax.ops.segment_sum(g * size, graph.node_row, costs),
        edge_base=jax.ops.segment_sum(g_edge, row, edge_costs),
        edge_per_size=jax.ops.segment_sum(g_edge * edge_size, row, edge_costs),
        size=jax.ops.segment_sum(g * tables.per_size[graph.node_row], graph.microbatch, microbatches)
        + jax.ops.segment_sum(g_edge * tables.edge_per_size[row], graph.microbatch[node], microbatches),
    )


_finish.defvjp(_finish_fwd, _finish_bwd)

#: How gradients are computed: ``"sweep"`` the reverse sweep above (custom VJP; reverse mode only);
#: ``"autodiff"`` JAX's own differentiation of the level scan (forward mode too, but reverse mode
#: stores every level's carry and is several times slower: see benchmarks/bench_simulator.py).
ADJOINTS = ("sweep", "autodiff")


def finish_times(
    graph: Graph,
    tables: CostTables,
    temperature: Float[Array, ""] | None = None,
    adjoint: str = "sweep",
) -> Float[Array, "nodes batch"]:
    """Finish time of every node under cost ``tables`` (batch last); rows that are not real nodes
    (scratch, sentinel) hold ``-inf``. ``temperature=None`` is exact max-plus; a positive
    temperature smooths every max."""
    if adjoint == "autodiff":
        dur, delay = tables.expand(graph)
        finish = _sweep(graph.pred, graph.offsets, graph.width, dur, delay, temperature)
    else:
        tau = jnp.ones((), tables.base.dtype) if temperature is None else temperature
        finish = _finish(graph, tables, temperature is None, tau)
    return jnp.where((graph.kind != PAD)[:, None], finish, -jnp.inf)


def smooth_max(values: Float[Array, "n batch"], temperature: Float[Array, ""] | None) -> Float[Array, " batch"]:
    """Max over axis 0, or ``tau * logsumexp(values / tau)`` (>= max, <= max + tau ln n)."""
    if temperature is None:
        return jnp.max(values, axis=0)
    return temperature * jax.nn.logsumexp(values / temperature, axis=0)


def sink_max(graph: Graph, finish: Float[Array, "nodes batch"], temperature) -> Float[Array, " batch"]:
    """The makespan: (smoothed) max of the sinks' finish times."""
    return smooth_max(finish[graph.sinks], temperature)

