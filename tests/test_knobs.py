"""Extending ``optimize`` with a knob defined outside the package (``AbstractKnob``).

``Compression`` chooses an integer compression factor ``c`` for every transfer: the links' effective
bandwidth is ``c`` times higher, and every compute op pays ``cost x (c - 1)`` seconds more (the
encoding). On slow links compressing pays; on fast ones it does not: a trade-off with an optimum
that brute force over the few factors finds, and that ``optimize`` must match.
"""

import json
from typing import ClassVar

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffpipe as dp
from diffpipe._optimize._knobs import value_hardware

STAGES, MICROBATCHES, LAYERS = 4, 8, 12


class Compression(dp.AbstractKnob):
    """Compression factor ``1 .. top`` of every transfer (params: one logit)."""

    top: int = eqx.field(static=True)
    cost: float = eqx.field(static=True)
    name: ClassVar[str] = "compression"
    label: ClassVar[str] = "compression"
    sets: ClassVar[tuple[str, ...]] = ("network", "overhead")

    def check(self, problem):
        if self.top < 1:
            raise dp.ConfigError(f"Compression: top must be >= 1, got {self.top}")

    def init(self, workload, plan=None):
        if plan is None:
            return jnp.zeros((1,), workload.forward.dtype)
        share = (float(plan[0]) - 1.0) / max(self.top - 1, 1)
        share = min(max(share, 1e-3), 1 - 1e-3)
        return jnp.asarray([np.log(share / (1 - share))], workload.forward.dtype)

    def relax(self, params, workload):
        return 1.0 + (self.top - 1) * jax.nn.sigmoid(params)

    def encode(self, plan, workload):
        return np.asarray(plan, np.float64).reshape(1)

    def apply(self, value, workload, fields):
        c = jnp.asarray(value, workload.forward.dtype)[0]
        network = fields["network"]
        network = eqx.tree_at(lambda n: (n.bandwidth, n.inter_bandwidth), network,
                              (network.bandwidth * c, network.inter_bandwidth * c))
        return {**fields, "network": network, "overhead": fields["overhead"] + self.cost * (c - 1.0)}

    def round(self, params, workload):
        c = float(np.asarray(self.relax(params, workload))[0])
        return np.unique(np.clip([[np.floor(c)], [np.ceil(c)]], 1, self.top).astype(np.int64), axis=0)

    def neighbours(self, plan):
        return np.asarray([[c] for c in (plan[0] - 1, plan[0] + 1) if 1 <= c <= self.top], np.int64).reshape(-1, 1)

    def baselines(self, problem):
        return {"uncompressed": np.asarray([1])}

    def starts(self, problem):
        return []

    def fractional(self, params, workload):
        return np.asarray(self.relax(params, workload))


def workload(bandwidth):
    rng = np.random.default_rng(7)
    f = rng.uniform(0.5, 1.5, LAYERS)
    return dp.Workload.from_table(f, 2 * f, output_bytes=4.0, network=dp.Network.uniform(0.01, bandwidth))


@pytest.fixture(scope="module")
def graph():
    return dp.compile(dp.schedules.get("1f1b", devices=STAGES, microbatches=MICROBATCHES))


def brute_force(graph, w, knob):
    w = w.with_split((3, 3, 3, 3))
    times = [float(dp.makespan(graph, value_hardware((knob,), (jnp.asarray([float(c)]),), w, STAGES)))
             for c in range(1, knob.top + 1)]
    return int(np.argmin(times)) + 1, min(times)


@pytest.mark.parametrize("bandwidth, cost", [(0.5, 0.05), (8.0, 0.3)])
def test_an_outside_knob_is_optimized_like_a_builtin(graph, bandwidth, cost):
    knob = Compression(top=6, cost=cost)
    w = workload(bandwidth)
    best_c, best_time = brute_force(graph, w, knob)
    result = dp.optimize(graph, w, knob, steps=100)
    assert result.baseline == "given"  # the workload as given: uncompressed, uniform split
    assert dict(result.plan.values) == {"compression": (best_c,)}
    assert result.makespan == pytest.approx(best_time, rel=1e-6)
    assert result.makespan <= result.baseline_makespan
    assert "compression [" in result.message
    assert result.continuous["compression"].shape == (1,)
    if bandwidth < 1:
        assert best_c > 1  # slow links: compressing pays
    doc = json.loads(result.to_json())  # the result protocol
    assert doc["plan"]["values"] == {"compression": [best_c]} and doc["baseline"] == "given"
    assert doc["plan"]["makespan_s"] == result.makespan and len(doc["loss"]) == 100
    assert len(result.to_csv().splitlines()) == 4 and "| optimized |" in result.to_markdown()


def test_an_outside_knob_composes_with_stage_balance(graph):
    knobs = (dp.StageBalance(STAGES), Compression(top=6, cost=0.05))
    result = dp.optimize(graph, workload(0.5), knobs, steps=100)
    assert result.baseline in ("uniform", "minmax")
    assert set(dict(result.plan.values)) == {"layers_per_stage", "compression"}
    assert result.makespan < result.baseline_makespan
    # The reported plan is the exact simulator's.
    w = workload(0.5)
    counts = result.layers_per_stage
    c = dict(result.plan.values)["compression"][0]
    hw = value_hardware(knobs, (jnp.asarray(np.cumsum((0, *counts)), jnp.float32), jnp.asarray([float(c)])), w,
                        STAGES)
    assert float(dp.makespan(graph, hw)) == pytest.approx(result.makespan, rel=1e-6)


def test_two_knobs_setting_one_field_are_refused(graph):
    with pytest.raises(dp.ConfigError, match="both set network"):
        dp.optimize(graph, workload(1.0), (Compression(3, 0.1), Compression(4, 0.1)))


def test_workload_and_hardware_are_cost_models(graph):
    """The cost-model protocol: a ``Workload`` prices a graph at its default split exactly as the
    ``Hardware`` of that split does; ``Hardware.from_times`` and ``hardware_from_model`` are both
    ``Hardware``, hence cost models."""
    w = workload(2.0).with_split((2, 4, 3, 3))
    hw = w.hardware(w.boundaries((2, 4, 3, 3)))
    assert isinstance(w, dp.AbstractCostModel) and isinstance(hw, dp.AbstractCostModel)
    assert isinstance(dp.Hardware.from_times(1.0, 2.0), dp.AbstractCostModel)
    ours, theirs = w.tables(graph), hw.tables(graph)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(dp.makespan(graph, w)) == float(dp.makespan(graph, hw))  # makespan takes any cost model
    ours, theirs = dp.simulate(graph, w), dp.simulate(graph, hw)  # memory too: the default split's
    chex.assert_trees_all_equal((ours.finish, ours.peak_memory, ours.communication_bytes),
                                (theirs.finish, theirs.peak_memory, theirs.communication_bytes))
    model = dp.Transformer(layers=4, hidden=256, heads=4, sequence=128, vocabulary=1000, microbatch_size=2)
    device, network = dp.presets.device("H100"), dp.presets.network("nvlink4")
    via_workload = dp.Workload.from_model(model, device, network).with_split((2, 1, 1, 2))
    direct = dp.hardware_from_model(model, device, network, layers_per_stage=[1, 1, 1, 1])
    for a, b in zip(jax.tree.leaves(via_workload.tables(graph)), jax.tree.leaves(direct.tables(graph))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # one path: equal, not close
