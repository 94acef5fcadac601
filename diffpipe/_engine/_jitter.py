"""Random op times: the expected makespan, and its spread, by batched Monte Carlo.

A training step ends when its slowest participant does: the last microbatch through the slowest
stage, the slowest rank of a tensor-parallel group at every layer, the slowest data-parallel replica
at the gradient sync. With random op times the expected maximum exceeds the maximum of the
expected times, and it grows with the number of participants (the expected maximum of ``n``
independent normals is ``mu + sigma e_n``, ``e_n`` ~ ``sqrt(2 ln n)``). This is one mechanism
behind the fall of measured throughput with scale that a deterministic simulator misses.

``Jitter`` describes the randomness; ``sample_makespans`` draws ``samples`` steps in one call of
the batched evaluator (each sample is one variant of the batch: every op of the graph gets its own
draw); ``expected_makespan`` is their mean, differentiable in the hardware by reparameterisation
(the draws are fixed by the key; the durations scale with them). The key is explicit.

Model, per sample:

- every compute op (``F``, ``B``, ``I``, ``W``) lasts ``d max(0, 1 + cv[kind] z)``, with ``z`` the
  largest of ``group`` independent standard normals (``group`` ranks of a tensor-parallel group
  run the op in lock-step: it ends when the slowest does), ``d`` its deterministic duration;
- each GPU is, independently with probability ``slow_fraction``, a straggler whose compute ops all
  last ``slow_factor`` times longer (throttling, a noisy neighbour); a device of the graph stands for
  its ``group`` lock-step ranks, so it straggles with probability ``1 - (1 - slow_fraction)^group``;
- transfers, collectives and optimizer steps keep their deterministic times;
- ``replicas`` independent copies of the step (data-parallel replicas that synchronise once per
  step) are drawn and the step lasts as long as the slowest.
"""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._checks import check_int, is_number
from .._errors import ConfigError
from ._cost_model import CostTables
from ._evaluate import batched_makespan
from ._graph import KIND_CODES, Graph
from ._hardware import Hardware

#: The op kinds that jitter, in the order of ``Jitter.cv``.
JITTER_KINDS = ("F", "B", "I", "W")


def _number(name: str, value: Any, minimum: float = 0.0, maximum: float | None = None) -> Array:
    """A scalar float leaf; concrete values are checked here (traced ones pass: vmap, grad)."""
    if not isinstance(value, jax.core.Tracer):
        x = np.asarray(value) if isinstance(value, (np.ndarray, jax.Array)) else value
        if isinstance(x, np.ndarray):
            x = x.item() if x.shape == () and np.issubdtype(x.dtype, np.number) else None
        if not is_number(x) or not math.isfinite(x) or x < minimum or (maximum is not None and x > maximum):
            bound = f"in [{minimum:g}, {maximum:g}]" if maximum is not None else f"finite and >= {minimum:g}"
            raise ConfigError(f"jitter: {name} must be a number {bound}, got {value!r}")
    return jnp.asarray(value, dtype=jnp.result_type(float))


class Jitter(eqx.Module):
    """Random op times (see the module docstring for the model).

    ``Jitter(0.05)`` gives every compute op a coefficient of variation of 5%;
    ``Jitter(forward=0.03, backward=0.05)`` sets kinds apart (``backward`` covers ``B`` and ``I``
    unless ``input_grad`` is given; ``weight`` defaults to ``backward``).

    Attributes:
        cv: coefficient of variation of ``F``, ``B``, ``I``, ``W`` (``JITTER_KINDS``).
        slow_fraction: probability that a device is a straggler in a step.
        slow_factor: how much longer a straggler's compute ops last (>= 1).
        group: ranks that run each op in lock-step (a tensor-parallel group).
    """

    cv: Float[Array, "4"]
    slow_fraction: Float[Array, ""]
    slow_factor: Float[Array, ""]
    group: int = eqx.field(static=True)

    def __init__(self, cv: Any = 0.0, *, forward: Any = None, backward: Any = None, input_grad: Any = None,
                 weight: Any = None, slow_fraction: Any = 0.0, slow_factor: Any = 1.0, group: int = 1) -> None:
        default = _number("cv", cv)
        f = default if forward is None else _number("forward", forward)
        b = default if backward is None else _number("backward", backward)
        i = b if input_grad is None else _number("input_grad", input_grad)
        w = b if weight is None else _number("weight", weight)
        self.cv = jnp.stack([f, b, i, w])
        self.slow_fraction = _number("slow_fraction", slow_fraction, 0.0, 1.0)
        self.slow_factor = _number("slow_factor", slow_factor, 1.0)
        self.group = check_int("jitter: group", group, 1)


def _per_node_tables(graph: Graph, tables: CostTables,
                     factor: Float[Array, "nodes samples"]) -> tuple[Graph, CostTables]:
    """A graph whose every node has a cost row of its own, and batch-last tables holding each
    sample's durations ``[nodes, samples]`` (edges keep the graph's deterministic delays)."""
    dur, _ = tables.batch_last().expand(graph)  # [nodes, 1]
    samples = factor.shape[-1]
    nodes = graph.kind.shape[-1]
    own = eqx.tree_at(lambda g: g.node_row, graph, jnp.arange(nodes, dtype=graph.node_row.dtype))
    base = dur * factor
    per_node = CostTables(
        base=base,
        per_size=jnp.zeros_like(base),
        edge_base=jnp.broadcast_to(tables.edge_base[:, None], (*tables.edge_base.shape, samples)),
        edge_per_size=jnp.broadcast_to(tables.edge_per_size[:, None], (*tables.edge_per_size.shape, samples)),
        size=jnp.broadcast_to(tables.size[:, None], (*tables.size.shape, samples)),
    )
    return own, per_node


def _factors(graph: Graph, jitter: Jitter, key: PRNGKeyArray, samples: int, dtype) -> Float[Array, "nodes samples"]:
    """Each node's duration multiplier in each sample (1 for nodes that do not jitter)."""
    nodes = graph.kind.shape[-1]
    k_op, k_slow = jax.random.split(key)
    z = jnp.max(jax.random.normal(k_op, (jitter.group, nodes, samples), dtype), axis=0)
    codes = jnp.asarray([KIND_CODES[k] for k in JITTER_KINDS], dtype=graph.kind.dtype)
    which = graph.kind[:, None] == codes[None, :]  # [nodes, 4]
    jitters = jnp.any(which, axis=1)
    cv = jnp.sum(jnp.where(which, jitter.cv.astype(dtype)[None, :], 0.0), axis=1)
    noise = jnp.maximum(0.0, 1.0 + cv[:, None] * z)
    # A device of the graph stands for its ``group`` lock-step ranks: it straggles when any of them does.
    p_slow = 1.0 - (1.0 - jitter.slow_fraction.astype(dtype)) ** jitter.group
    slow = jax.random.bernoulli(k_slow, p_slow, (graph.devices, samples))
    straggler = jnp.where(slow, jitter.slow_factor.astype(dtype), 1.0)[jnp.clip(graph.device, 0, graph.devices - 1)]
    return jnp.where(jitters[:, None], noise * straggler, 1.0)


def sample_makespans(graph: Graph, hw: Hardware, jitter: Jitter, *, key: PRNGKeyArray, samples: int = 1024,
                     replicas: int = 1, temperature: Any = None) -> Float[Array, " samples"]:
    """``samples`` makespans of ``graph`` on ``hw`` with random op times (``Jitter``).

    Args:
        graph, hw: as for ``makespan`` (one ``Hardware``, not a batch).
        jitter: the randomness.
        key: a JAX PRNG key (``jax.random.key(0)``); the same key gives the same samples.
        samples: Monte Carlo samples (steps).
        replicas: independent copies of the step that end together (data-parallel replicas): each
            sample is the slowest of ``replicas`` draws.
        temperature: ``None`` for the exact makespan of each draw, else the smoothed one.

    Returns:
        ``[samples]`` step times (seconds).
    """
    if not isinstance(graph, Graph) or not isinstance(hw, Hardware) or not isinstance(jitter, Jitter):
        raise ConfigError("sample_makespans expects a Graph, a Hardware and a Jitter")
    samples = check_int("sample_makespans: samples", samples, 1)
    replicas = check_int("sample_makespans: replicas", replicas, 1)
    tau = None if temperature is None else jnp.asarray(temperature, hw.forward.dtype)
    return _sample(graph, hw, jitter, key, tau, samples, replicas)


@eqx.filter_jit
def _sample(graph: Graph, hw: Hardware, jitter: Jitter, key: PRNGKeyArray, tau: Array | None, samples: int,
            replicas: int) -> Float[Array, " samples"]:
    tables = hw.tables(graph)

    def replica(slowest, r):  # one replica's draws at a time: memory [nodes, samples], whatever ``replicas``
        factor = _factors(graph, jitter, jax.random.fold_in(key, r), samples, hw.forward.dtype)
        own, per_node = _per_node_tables(graph, tables, factor)
        return jnp.maximum(slowest, batched_makespan(own, per_node, tau)), None

    start = jnp.full((samples,), -jnp.inf, hw.forward.dtype)
    slowest, _ = jax.lax.scan(replica, start, jnp.arange(replicas))
    return slowest


def expected_makespan(graph: Graph, hw: Hardware, jitter: Jitter, *, key: PRNGKeyArray, samples: int = 1024,
                      replicas: int = 1, temperature: Any = None) -> Float[Array, ""]:
    """The mean of ``sample_makespans`` (same arguments): the expected step time, differentiable in
    ``hw`` (and ``jitter``'s floats) by reparameterisation."""
    return jnp.mean(sample_makespans(graph, hw, jitter, key=key, samples=samples, replicas=replicas,
                                     temperature=temperature))


def step_time_summary(times: Any) -> dict[str, float]:
    """Mean, standard deviation, median and 95th percentile of sampled step times (seconds), and
    the standard error of the mean."""
    t = np.asarray(times, dtype=np.float64)
    return {"mean": float(t.mean()), "std": float(t.std(ddof=1)) if t.size > 1 else 0.0,
            "p50": float(np.percentile(t, 50)), "p95": float(np.percentile(t, 95)),
            "stderr": float(t.std(ddof=1) / np.sqrt(t.size)) if t.size > 1 else 0.0}
