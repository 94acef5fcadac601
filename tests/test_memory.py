"""The one release rule: the discrete world's activation peaks equal the simulator's."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import schedules

import diffpipe as dp
from diffpipe._engine._graph import bucketed
from diffpipe._engine._simulate import peak_in_flight
from diffpipe.schedules._analysis import activation_bytes_peaks, activation_delta, peak_activations

CASES = schedules()


@pytest.mark.parametrize(("case", "schedule"), CASES, ids=[c for c, _ in CASES])
def test_peak_count_and_bytes_equal_the_simulator(case, schedule):
    rng = np.random.default_rng(sum(map(ord, case)))  # deterministic per case
    act = rng.uniform(1.0, 4.0, size=(schedule.pipelines, schedule.stages))
    size = rng.uniform(0.5, 2.0, size=schedule.microbatches)
    hw = dp.Hardware.from_times(1.0, 2.0, activation_bytes=jnp.asarray(act), size=jnp.asarray(size))
    result = dp.simulate(schedule, hw)  # one compilation checks both representations of the rule
    assert peak_activations(schedule) == tuple(int(x) for x in np.asarray(result.peak_activations))
    assert activation_bytes_peaks(schedule, act, size) == pytest.approx(tuple(np.asarray(result.peak_memory)), rel=1e-5)
    # the NumPy count optimize reads (no program per graph) is the simulator's, padded or not
    graph = dp.compile(schedule)
    counts = np.asarray(result.peak_activations, np.float64)
    chex.assert_trees_all_equal(peak_in_flight(graph), counts)
    chex.assert_trees_all_equal(peak_in_flight(bucketed(graph))[: schedule.devices], counts)


def test_release_rule():
    assert [activation_delta(dp.schedules.Op(k, 0, 0)) for k in "FBIWU"] == [1, -1, 0, -1, 0]
