"""The max-plus evaluation of a graph: exact, or smoothed with a log-sum-exp, with a custom VJP.

``finish[i] = dur[i] + smax(0, max_k finish[pred[i,k]] + delay[i,k])`` over the levels of the
graph (``lax.scan``; each level is one contiguous block of rows, vectorised over its nodes and
the batch, which is the last axis: ``[nodes, batch]``).

Smoothing: ``smax_tau(x) = tau * log(exp(0) + sum_k exp(x_k / tau))``. The release term ``0`` is
always finite, so no reduction is all ``-inf`` and tangents never become NaN. Since
``max(x) <= smax_tau(x) <= max(x) + tau * ln(k + 1)``, the smoothed finish of a node exceeds the
exact one by at most ``tau * ln(k + 1)`` per level it lies below the sources, and the makespan (a
smoothed max over ``s`` sinks) by at most ``tau * (levels * ln(k + 1) + ln(s))``.

Gradients: a reverse sweep over the levels sends each node's cotangent to its predecessors with
the soft-argmax weights ``exp((x_k - start_i) / tau)`` (one-hot for exact), so reverse mode costs
about one more forward and stores only ``[nodes, batch]`` and ``[nodes, k, batch]`` arrays.
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
    total = jnp.exp(-top / tau) + jnp.sum(jnp.exp((x - top[:, None, :]) / tau), axis=1)
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
    """Reverse sweep: each level sends its rows' (final) cotangents to their predecessors with the
    edge weights; then the cost tables' cotangents are segment sums over the rows using them."""
    graph, tables, tau, finish = residuals
    smooth = None if exact else tau
    width = graph.width
    lanes = jnp.arange(width, dtype=graph.sizes.dtype)[:, None]
    real = (graph.kind != PAD)[:, None]
    # Barriers keep XLA from fusing the gathers into the elementwise work that follows (on CPU
    # that fusion redoes each gather per element: about 10x slower, measured).
    dur, delay = lax.optimization_barrier(tables.expand(graph))
    start = finish - dur
    x = lax.optimization_barrier(finish[graph.pred] + delay)
    w = lax.optimization_barrier(_edge_weights(x, start, smooth))

    def level(g, level_at):
        offset, count = level_at
        gl = jnp.where(lanes < count, lax.dynamic_slice_in_dim(g, offset, width), 0.0)
        push = gl[:, None, :] * lax.dynamic_slice_in_dim(w, offset, width)
        return g.at[lax.dynamic_slice_in_dim(graph.pred, offset, width)].add(push), None

    g, _ = lax.scan(level, jnp.where(real, g_finish, 0.0), (graph.offsets, graph.sizes), reverse=True)
    g = jnp.where(real, g, 0.0)  # = cotangent of every duration
    g_delay = g[:, None, :] * w
    g_tables = _table_cotangent(graph, tables, g, g_delay)
    if exact:
        g_tau = jnp.zeros_like(tau)
    else:  # d start / d tau at fixed inputs: (start - sum_k w_k x_k) / tau
        local = (start - jnp.sum(jnp.where(w > 0, w * x, 0.0), axis=1)) / tau
        g_tau = jnp.sum(jnp.where(real & jnp.isfinite(local), g * local, 0.0)).astype(tau.dtype)
    return None, g_tables, g_tau


def _table_cotangent(graph: Graph, tables: CostTables, g_dur, g_delay) -> CostTables:
    """Transpose of ``CostTables.expand``: segment sums of the duration and delay cotangents."""
    rows, k, batch = g_delay.shape
    size, per, edge_per = lax.optimization_barrier(
        (tables.size[graph.microbatch], tables.per_size[graph.node_row], tables.edge_per_size[graph.edge_row]))
    flat_rows, flat_delay = graph.edge_row.reshape(-1), g_delay.reshape(rows * k, batch)
    costs, edge_costs, microbatches = tables.base.shape[0], tables.edge_base.shape[0], tables.size.shape[0]
    weighted = lax.optimization_barrier((
        g_dur * size,
        (g_delay * size[:, None, :]).reshape(rows * k, batch),
        g_dur * per + jnp.sum(g_delay * edge_per, axis=1),
    ))
    return CostTables(
        base=jax.ops.segment_sum(g_dur, graph.node_row, costs),
        per_size=jax.ops.segment_sum(weighted[0], graph.node_row, costs),
        edge_base=jax.ops.segment_sum(flat_delay, flat_rows, edge_costs),
        edge_per_size=jax.ops.segment_sum(weighted[1], flat_rows, edge_costs),
        size=jax.ops.segment_sum(weighted[2], graph.microbatch, microbatches),
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

