"""``jax.vmap`` reaches the batch-last evaluator: values and gradients equal across vmap, nested
vmaps, stacked graphs, ``batched=True`` and single calls; the folded layout is checked in the jaxpr."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffpipe as dp
from diffpipe._engine._evaluate import BATCH_CHUNK


def _hardware(x):
    return dp.Hardware.from_times(x, 2.0 * x, 0.5 * x, p2p_time=0.2 * x)


@pytest.fixture(scope="module")
def graph():
    return dp.compile(dp.schedules.get("zb-h1", devices=3, microbatches=4))


@pytest.mark.parametrize("tau", [None, 0.1])
def test_vmap_batched_and_single_calls_agree(graph, tau):
    # two full chunks and a padded one: a chunk handing its buffers to a full chunk and to a padded one
    x = jnp.linspace(0.5, 2.0, 2 * BATCH_CHUNK + 5)
    hws = jax.vmap(_hardware)(x)
    mapped = jax.vmap(lambda h: dp.makespan(graph, h, temperature=tau))(hws)
    batched = dp.makespan(graph, hws, temperature=tau, batched=True)
    single = [dp.makespan(graph, _hardware(v), temperature=tau) for v in x[:: BATCH_CHUNK // 4]]
    np.testing.assert_allclose(np.asarray(mapped), np.asarray(batched), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(mapped[:: BATCH_CHUNK // 4]), np.asarray(single), rtol=1e-6)
    if tau is None:
        return
    d_map = jax.vmap(jax.grad(lambda h: dp.makespan(graph, h, temperature=tau)))(hws)
    d_batch = jax.grad(lambda h: jnp.sum(dp.makespan(graph, h, temperature=tau, batched=True)))(hws)
    d_inside = jax.grad(lambda h: jnp.sum(jax.vmap(lambda g: dp.makespan(graph, g, temperature=tau))(h)))(hws)
    d_single = jax.grad(lambda h: dp.makespan(graph, h, temperature=tau))(_hardware(x[3]))
    d_fwd = jax.vmap(jax.jacfwd(lambda v: dp.makespan(graph, _hardware(v), temperature=tau)))(x)
    d_rev = jax.vmap(jax.grad(lambda v: dp.makespan(graph, _hardware(v), temperature=tau)))(x)
    for a, b, c in zip(jax.tree.leaves(eqx.filter(d_map, eqx.is_inexact_array)),
                       jax.tree.leaves(eqx.filter(d_batch, eqx.is_inexact_array)),
                       jax.tree.leaves(eqx.filter(d_inside, eqx.is_inexact_array))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(d_map.forward[3]), np.asarray(d_single.forward), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(d_fwd), np.asarray(d_rev), rtol=1e-5, atol=1e-6)


def test_nested_vmaps_and_a_vmapped_temperature(graph):
    x = jnp.linspace(0.5, 2.0, 6).reshape(2, 3)
    taus = jnp.asarray([0.05, 0.3])
    nested = jax.vmap(lambda row, t: jax.vmap(lambda v: dp.makespan(graph, _hardware(v), temperature=t))(row))(x, taus)
    loop = [[dp.makespan(graph, _hardware(x[i, j]), temperature=taus[i]) for j in range(3)] for i in range(2)]
    np.testing.assert_allclose(np.asarray(nested), np.asarray(loop), rtol=1e-6)
    grads = jax.vmap(jax.vmap(jax.grad(lambda v, t: dp.makespan(graph, _hardware(v), temperature=t)),
                              in_axes=(0, None)))(x, taus)
    d_tau = jax.vmap(jax.grad(lambda t, v: dp.makespan(graph, _hardware(v), temperature=t)),
                     in_axes=(0, 0))(taus, x[:, 0])
    for i in range(2):
        for j in range(3):
            want = jax.grad(lambda v, i=i: dp.makespan(graph, _hardware(v), temperature=taus[i]))(x[i, j])
            assert float(grads[i, j]) == pytest.approx(float(want), rel=1e-5)
        want = jax.grad(lambda t, i=i: dp.makespan(graph, _hardware(x[i, 0]), temperature=t))(taus[i])
        assert float(d_tau[i]) == pytest.approx(float(want), rel=1e-5, abs=1e-6)


def test_vmap_over_stacked_graphs_and_hardware():
    schedules = [dp.schedules.get("1f1b", devices=3, microbatches=4),
                 dp.schedules.get("gpipe", devices=3, microbatches=3),
                 dp.schedules.get("interleaved-1f1b", devices=3, microbatches=3, chunks=2)]
    graphs = [dp.compile(s) for s in schedules]
    stacked = dp.stack_graphs(graphs)
    x = jnp.linspace(0.5, 2.0, 5)
    hws = jax.vmap(lambda v: dp.Hardware.from_times(v, 2.0 * v, p2p_time=0.2 * v))(x)
    for tau in (None, 0.1):
        both = jax.vmap(lambda g, tau=tau: jax.vmap(lambda h: dp.makespan(g, h, temperature=tau))(hws))(stacked)
        want = [[dp.makespan(g, dp.Hardware.from_times(v, 2.0 * v, p2p_time=0.2 * v), temperature=tau) for v in x]
                for g in graphs]
        np.testing.assert_allclose(np.asarray(both), np.asarray(want), rtol=1e-6)
        paired = jax.vmap(lambda g, h, tau=tau: dp.makespan(g, h, temperature=tau))(stacked, jax.tree.map(
            lambda a: a[:3], hws))
        np.testing.assert_allclose(np.asarray(paired), np.asarray(want)[np.arange(3), np.arange(3)], rtol=1e-6)
    grad = jax.grad(lambda v: jnp.sum(jax.vmap(lambda g: dp.makespan(
        g, dp.Hardware.from_times(v, 2.0 * v, p2p_time=0.1), temperature=0.1))(stacked)))(jnp.asarray(1.3))
    want = sum(jax.grad(lambda v, g=g: dp.makespan(g, dp.Hardware.from_times(v, 2.0 * v, p2p_time=0.1),
                                                   temperature=0.1))(jnp.asarray(1.3)) for g in graphs)
    assert float(grad) == pytest.approx(float(want), rel=1e-5)


def _evaluator_calls(jaxpr):
    """Every diffpipe evaluator primitive in ``jaxpr`` (recursively), with its operands' shapes."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name.startswith("diffpipe_"):
            found.append((eqn.primitive.name, [v.aval.shape for v in eqn.invars]))
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", None)
            if inner is not None and hasattr(inner, "eqns"):
                found += _evaluator_calls(inner)
            elif hasattr(param, "eqns"):
                found += _evaluator_calls(param)
    return found


def test_vmap_folds_into_the_trailing_batch_axis(graph):
    """Under vmap (of values and of gradients) the evaluator sees one unbatched call whose batch
    axis (the last of the temperature operand) holds every variant: the batch-last layout."""
    n = 37
    hws = jax.vmap(_hardware)(jnp.linspace(0.5, 2.0, n))
    for fn, want in ((jax.vmap(lambda h: dp.makespan(graph, h)), {"diffpipe_forward"}),
                     (jax.vmap(jax.grad(lambda h: dp.makespan(graph, h, temperature=0.1))),
                      {"diffpipe_forward", "diffpipe_cotangent"})):
        calls = _evaluator_calls(jax.make_jaxpr(fn)(hws).jaxpr)
        assert {name for name, _ in calls} == want
        for _, shapes in calls:
            assert shapes[-1][-1] == n  # the last operand (tau, or the cotangent) is batch-last
