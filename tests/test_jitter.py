"""Random op times (``dp.Jitter``): the Monte Carlo expected makespan against closed forms, and its
gradient against central finite differences in float64."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffpipe as dp
from diffpipe import step_time_summary as summary

#: E[max of n independent standard normals] (closed forms for n <= 3; n = 5 by quadrature, e.g.
#: Harter 1961, "Expected values of normal order statistics", Biometrika 48, Table: 1.16296).
EXPECTED_MAX = {1: 0.0, 2: 1 / math.sqrt(math.pi), 3: 3 / (2 * math.sqrt(math.pi)), 5: 1.1629644736}


def _one_device(forward=1.0, backward=2.0):
    graph = dp.compile(dp.schedules.get("gpipe", devices=1, microbatches=1))
    return graph, dp.Hardware.from_times(forward=forward, input_grad=backward)


@pytest.mark.parametrize("replicas", [1, 2, 3, 5])
def test_expected_maximum_of_replicas_is_the_normal_order_statistic(replicas):
    # F + B on one device: normal with mean 3 and variance cv^2 (1 + 4); the slowest of n replicas.
    graph, hw = _one_device()
    cv, samples = 0.1, 10_000
    times = dp.sample_makespans(graph, hw, dp.Jitter(cv), key=jax.random.key(1), samples=samples,
                                replicas=replicas)
    s = summary(times)
    sigma = cv * math.sqrt(1.0 + 4.0)
    expected = 3.0 + sigma * EXPECTED_MAX[replicas]
    assert abs(s["mean"] - expected) < 4 * s["stderr"] + 1e-4, (s, expected)


@pytest.mark.parametrize("group", [2, 3])
def test_a_lock_step_group_ends_with_its_slowest_rank(group):
    graph, hw = _one_device(1.0, 1e-9)
    times = dp.sample_makespans(graph, hw, dp.Jitter(forward=0.2, backward=0.0, group=group),
                                key=jax.random.key(2), samples=10_000)
    s = summary(times)
    assert abs(s["mean"] - (1.0 + 0.2 * EXPECTED_MAX[group])) < 4 * s["stderr"] + 1e-4


def test_no_jitter_is_the_deterministic_makespan():
    s = dp.schedules.get("1f1b", devices=4, microbatches=8)
    graph = dp.compile(s)
    hw = dp.Hardware.from_times(forward=1.0, input_grad=2.0, p2p_time=0.1)
    times = dp.sample_makespans(graph, hw, dp.Jitter(0.0), key=jax.random.key(0), samples=4)
    chex.assert_trees_all_close(times, jnp.full((4,), dp.makespan(graph, hw)), rtol=1e-6)


@pytest.mark.parametrize("family", ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b"])
def test_expected_makespan_exceeds_the_deterministic_one(family):
    # Jensen: the makespan is a convex (max-plus) function of the durations, and the noise has mean ~1.
    s = dp.schedules.get(family, devices=4, microbatches=8)
    graph = dp.compile(s)
    hw = dp.Hardware.from_times(forward=1.0, input_grad=1.5, weight=0.5, p2p_time=0.05)
    base = float(dp.makespan(graph, hw))
    times = dp.sample_makespans(graph, hw, dp.Jitter(0.1), key=jax.random.key(3), samples=500)
    assert summary(times)["mean"] > base
    more = dp.sample_makespans(graph, hw, dp.Jitter(0.1), key=jax.random.key(3), samples=500, replicas=8)
    assert summary(more)["mean"] > summary(times)["mean"]


def test_stragglers_slow_the_step():
    graph = dp.compile(dp.schedules.get("1f1b", devices=4, microbatches=8))
    hw = dp.Hardware.from_times(forward=1.0, input_grad=2.0)
    base = float(dp.makespan(graph, hw))
    every = dp.sample_makespans(graph, hw, dp.Jitter(slow_fraction=1.0, slow_factor=1.5),
                                key=jax.random.key(0), samples=8)
    chex.assert_trees_all_close(every, jnp.full((8,), 1.5 * base), rtol=1e-5)


def test_a_device_straggles_when_any_rank_of_its_group_does():
    # One device standing for 2 lock-step ranks, each slow with probability 1/2: slow w.p. 3/4.
    graph, hw = _one_device()
    times = dp.sample_makespans(graph, hw, dp.Jitter(slow_fraction=0.5, slow_factor=2.0, group=2),
                                key=jax.random.key(5), samples=4000)
    slow = float(np.mean(np.asarray(times) > 4.5))  # 3 s when fast, 6 s when slow
    assert abs(slow - 0.75) < 4 * math.sqrt(0.75 * 0.25 / 4000)


def test_same_key_same_samples():
    graph, hw = _one_device()
    a = dp.sample_makespans(graph, hw, dp.Jitter(0.1), key=jax.random.key(7), samples=64)
    b = dp.sample_makespans(graph, hw, dp.Jitter(0.1), key=jax.random.key(7), samples=64)
    chex.assert_trees_all_equal(a, b)


def test_gradient_matches_finite_differences_in_float64():
    with jax.enable_x64(True):
        graph = dp.compile(dp.schedules.get("1f1b", devices=3, microbatches=6))
        jitter = dp.Jitter(0.1, slow_fraction=0.2, slow_factor=1.3)
        key = jax.random.key(11)

        def loss(forward):
            hw = dp.Hardware.from_times(forward=forward, input_grad=jnp.asarray([2.0, 2.2, 1.8]), p2p_time=0.05)
            return dp.expected_makespan(graph, hw, jitter, key=key, samples=256, replicas=2)

        x = jnp.asarray([1.0, 1.3, 0.9])
        grad = jax.grad(loss)(x)
        h = 1e-6
        fd = jnp.stack([(loss(x.at[i].add(h)) - loss(x.at[i].add(-h))) / (2 * h) for i in range(3)])
        chex.assert_trees_all_close(grad, fd, rtol=1e-5, atol=1e-7)
        assert float(jnp.sum(grad)) > 0


@pytest.mark.parametrize("bad, match", [
    (dict(cv=-0.1), "cv"), (dict(cv=float("nan")), "cv"), (dict(slow_fraction=1.5), "slow_fraction"),
    (dict(slow_factor=0.5), "slow_factor"), (dict(group=0), "group"), (dict(forward="x"), "forward"),
])
def test_bad_jitter_is_one_clear_error(bad, match):
    with pytest.raises(dp.ConfigError, match=match):
        dp.Jitter(**bad)


def test_bad_sample_arguments():
    graph, hw = _one_device()
    with pytest.raises(dp.ConfigError, match="samples"):
        dp.sample_makespans(graph, hw, dp.Jitter(0.1), key=jax.random.key(0), samples=0)
    with pytest.raises(dp.ConfigError, match="replicas"):
        dp.sample_makespans(graph, hw, dp.Jitter(0.1), key=jax.random.key(0), replicas=np.int64(-1))
