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


def _start_exact(x: Array) -> Array:
    return jnp.maximum(jnp.max(x, axis=1), 0.0)


def _start_smooth(x: Array, tau: Array) -> Array:
    top = jnp.maximum(jnp.max(x, axis=1), 0.0)  # finite: includes the release term
    total = jnp.exp(-top / tau) + jnp.sum(jnp.exp((x - top[:, None, :]) / tau), axis=1)
    return top + tau * jnp.log(total)


def _sweep(pred, offsets, width, dur, delay, tau):
    rows, batch = dur.shape

    def level(finish, offset):
        p = lax.dynamic_slice_in_dim(pred, offset, width)
        x = finish[p] + lax.dynamic_slice_in_dim(delay, offset, width)
        start = _start_exact(x) if tau is None else _start_smooth(x, tau)
        return lax.dynamic_update_slice_in_dim(finish, lax.dynamic_slice_in_dim(dur, offset, width) + start,
                                               offset, 0), None

    finish0 = jnp.full((rows, batch), -jnp.inf, dtype=dur.dtype)
    finish, _ = lax.scan(level, finish0, offsets)
    return finish


def _weights(pred, finish, dur, delay, tau):
    """Soft-argmax (or argmax) weight of every incoming edge, and its argument ``x``."""
    x = finish[pred] + delay  # [rows, k, batch]
    start = finish - dur
    if tau is None:
        candidates = jnp.concatenate([jnp.zeros_like(x[:, :1]), x], axis=1)
        winner = jnp.argmax(candidates, axis=1).astype(jnp.int32)  # first maximum; 0 = release
        slots = jnp.arange(1, x.shape[1] + 1, dtype=jnp.int32)[None, :, None]
        return x, (winner[:, None, :] == slots).astype(dur.dtype)
    # x <= start on real rows, so the exponent is <= 0; clamping and masking keep the scratch rows
    # (junk values, zero cotangent) from producing inf * 0 = NaN.
    exponent = jnp.minimum((x - start[:, None, :]) / tau, 0.0)
    return x, jnp.where(jnp.isneginf(x), 0.0, jnp.exp(exponent))


@partial(jax.custom_vjp, nondiff_argnums=(3, 6))
def _finish(pred, offsets, sizes, width, dur, delay, exact, tau):
    return _sweep(pred, offsets, width, dur, delay, None if exact else tau)


def _finish_fwd(pred, offsets, sizes, width, dur, delay, exact, tau):
    finish = _sweep(pred, offsets, width, dur, delay, None if exact else tau)
    return finish, (pred, offsets, sizes, dur, delay, tau, finish)


def _finish_bwd(width, exact, residuals, g_finish):
    pred, offsets, sizes, dur, delay, tau, finish = residuals
    x, w = _weights(pred, finish, dur, delay, None if exact else tau)
    lanes = jnp.arange(width, dtype=sizes.dtype)[:, None]

    def level(g, level_at):
        offset, size = level_at
        gl = jnp.where(lanes < size, lax.dynamic_slice_in_dim(g, offset, width), 0.0)
        push = gl[:, None, :] * lax.dynamic_slice_in_dim(w, offset, width)
        return g.at[lax.dynamic_slice_in_dim(pred, offset, width)].add(push), None

    g, _ = lax.scan(level, g_finish, (offsets, sizes), reverse=True)
    g_delay = g[:, None, :] * w
    if exact:
        g_tau = jnp.zeros_like(tau)
    else:  # d start / d tau at fixed inputs: (start - sum_k w_k x_k) / tau
        start = finish - dur
        local = (start - jnp.sum(jnp.where(w > 0, w * x, 0.0), axis=1)) / tau
        g_tau = jnp.sum(jnp.where(jnp.isfinite(local), g * local, 0.0)).astype(tau.dtype)
    return None, None, None, g, g_delay, g_tau


_finish.defvjp(_finish_fwd, _finish_bwd)


#: How gradients are computed: ``"sweep"`` the reverse sweep above (custom VJP; reverse mode only);
#: ``"autodiff"`` JAX's own differentiation of the level scan (forward mode too, but reverse mode
#: stores every level's carry and is several times slower: see benchmarks/bench_simulator.py).
ADJOINTS = ("sweep", "autodiff")


def finish_times(
    graph: Graph,
    dur: Float[Array, "nodes batch"],
    delay: Float[Array, "nodes k batch"],
    temperature: Float[Array, ""] | None = None,
    adjoint: str = "sweep",
) -> Float[Array, "nodes batch"]:
    """Finish time of every node; rows that are not real nodes (scratch, sentinel) hold ``-inf``.

    ``temperature=None`` is exact max-plus; a positive temperature smooths every max.
    """
    real = (graph.kind != PAD)[:, None]
    dur = jnp.where(real, dur, 0.0)
    if adjoint == "autodiff":
        finish = _sweep(graph.pred, graph.offsets, graph.width, dur, delay, temperature)
    else:
        tau = jnp.ones((), dur.dtype) if temperature is None else temperature
        finish = _finish(graph.pred, graph.offsets, graph.sizes, graph.width, dur, delay, temperature is None, tau)
    return jnp.where(real, finish, -jnp.inf)


def smooth_max(values: Float[Array, "n batch"], temperature: Float[Array, ""] | None) -> Float[Array, " batch"]:
    """Max over axis 0, or ``tau * logsumexp(values / tau)`` (>= max, <= max + tau ln n)."""
    if temperature is None:
        return jnp.max(values, axis=0)
    return temperature * jax.nn.logsumexp(values / temperature, axis=0)


def sink_max(graph: Graph, finish: Float[Array, "nodes batch"], temperature) -> Float[Array, " batch"]:
    """The makespan: (smoothed) max of the sinks' finish times."""
    return smooth_max(finish[graph.sinks], temperature)

