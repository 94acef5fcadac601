"""Knobs, baselines and ``optimize``: gradients, invariants, quality against brute force, errors.

Every optimizer instance here shares one graph (1F1B, 4 devices x 8 microbatches) and one layer
count (12), so the compiled optimizer loop and the exact evaluators are reused across tests.
"""

import math

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import diffpipe as dp
from diffpipe._engine import _batch
from diffpipe._engine._graph import common_sizes
from diffpipe._optimize import _optimize
from diffpipe._optimize._baselines import compositions, evaluate_plans

STAGES, MICROBATCHES, LAYERS = 4, 8, 12
CHUNK = 64  # the batch size optimize's local search compiles: brute force then compiles nothing new
SCHEDULE = dp.schedules.get("1f1b", devices=STAGES, microbatches=MICROBATCHES)


@pytest.fixture(scope="module")
def graph():
    return dp.compile(SCHEDULE)


def random_workload(rng, *, layers=LAYERS, communication=True, capacity=math.inf):
    """Heterogeneous layers: log-normal compute, an embedding-like first layer or a heavy head,
    uneven output, static and activation bytes."""
    f = rng.lognormal(0.0, 0.5, layers)
    if rng.random() < 0.5:
        f[0] = 0.05
    if rng.random() < 0.5:
        f[-1] *= 3.0
    network = dp.Network.uniform(rng.uniform(0.0, 0.3), rng.uniform(1.0, 8.0)) if communication else None
    return dp.Workload.from_table(
        f, f * rng.uniform(0.8, 1.5, layers), f * rng.uniform(0.3, 1.0, layers),
        static_bytes=rng.uniform(0.5, 3.0, layers), activation_bytes=rng.uniform(0.2, 1.0, layers),
        output_bytes=rng.uniform(0.2, 2.0, layers) * (rng.random(layers) < 0.7), network=network,
        capacity=capacity,
    )


@jax.jit
def _exact(graph, hw):
    return dp.makespan(graph, hw), dp.peak_memory(graph, hw)[0]


def exact(graph, workload, counts):
    """The exact simulator's makespan and peak memory of a split (its public entry points)."""
    time, memory = _exact(graph, workload.hardware(workload.boundaries(counts)))
    return float(time), np.asarray(memory)


# -- gradients ----------------------------------------------------------------------------------------
def test_gradients_match_central_differences_float64():
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        g = dp.compile(dp.schedules.get("1f1b", devices=3, microbatches=4))
        workload = random_workload(rng, layers=7)
        balance, split = dp.StageBalance(3), dp.MicrobatchSplit(16, 4)
        params = (jnp.asarray(rng.normal(0, 0.3, 3)), jnp.asarray(rng.normal(0, 0.3, 4)))

        def loss(p):
            hw = workload.hardware(balance.boundaries(p[0], workload), split.contribute(p[1], workload, {})["size"])
            memory = dp.peak_memory(g, hw)[0]
            return dp.makespan(g, hw, temperature=0.05) + 1e-2 * jnp.sum(memory)

        value_and_grad = jax.jit(jax.value_and_grad(loss))  # one compilation serves both
        _, grad = value_and_grad(params)
        h = 1e-6
        for which in range(2):
            for i in range(params[which].shape[0]):
                step = jnp.zeros_like(params[which]).at[i].set(h)
                up = tuple(p + step if k == which else p for k, p in enumerate(params))
                down = tuple(p - step if k == which else p for k, p in enumerate(params))
                fd = (value_and_grad(up)[0] - value_and_grad(down)[0]) / (2 * h)
                np.testing.assert_allclose(grad[which][i], fd, rtol=1e-5, atol=1e-7)


# -- knob invariants ----------------------------------------------------------------------------------
@given(st.integers(1, 6), st.integers(0, 40), st.lists(st.floats(-4, 4), min_size=6, max_size=6))
def test_microbatch_sizes_are_positive_and_sum_to_the_batch(microbatches, extra, logits):
    split = dp.MicrobatchSplit(microbatches + extra, microbatches)
    samples = np.asarray(split.samples(jnp.asarray(logits[:microbatches], jnp.float32)))
    assert np.all(samples > 0)
    np.testing.assert_allclose(samples.sum(), microbatches + extra, rtol=1e-5)


_WORKLOAD = random_workload(np.random.default_rng(1), layers=9)


@jax.jit
def _balance(params, workload):
    knob = dp.StageBalance(params.shape[0])
    return knob.boundaries(params, workload), knob(params, workload)


@jax.jit
def _balance_at(boundaries, workload):
    return boundaries, workload.hardware(boundaries)


@given(st.sampled_from([1, 4, 9]), st.integers(0, 2**31 - 1))
def test_stage_quantities_sum_to_the_model(stages, seed):
    params = jnp.asarray(np.random.default_rng(seed).normal(0, 1.5, stages), jnp.float32)
    x, hw = _balance(params, _WORKLOAD)
    x = np.asarray(x)
    assert x[0] == 0 and x[-1] == _WORKLOAD.layers and np.all(np.diff(x) >= -1e-6)
    for stage_name, layer_name in [("forward", "forward"), ("input_grad", "input_grad"), ("weight", "weight"),
                                   ("activation_bytes", "activation_bytes"), ("static_bytes", "static_bytes")]:
        np.testing.assert_allclose(np.sum(getattr(hw, stage_name)), np.sum(getattr(_WORKLOAD, layer_name)),
                                   rtol=1e-5)
    assert hw.message_bytes.shape == (stages,) and float(hw.message_bytes[0]) == 0.0


def test_zero_params_balance_compute_and_integer_boundaries_are_exact():
    knob = dp.StageBalance(4)
    _, hw = _balance(knob.init(_WORKLOAD), _WORKLOAD)
    compute = np.asarray(hw.forward + hw.input_grad + hw.weight)
    np.testing.assert_allclose(compute, compute.mean(), rtol=2e-2)  # up to the flat-layer sliver
    counts = (2, 4, 1, 2)
    x, hw = _balance(knob.init(_WORKLOAD, counts), _WORKLOAD)
    np.testing.assert_allclose(np.diff(np.asarray(x)), counts, atol=1e-4)
    _, hw = _balance_at(jnp.asarray(np.cumsum((0, *counts)), jnp.float32), _WORKLOAD)
    edges = np.cumsum((0, *counts))
    for name in ("forward", "static_bytes", "activation_bytes"):
        per_layer = np.asarray(getattr(_WORKLOAD, name))
        want = [per_layer[a:b].sum() for a, b in zip(edges[:-1], edges[1:])]
        np.testing.assert_allclose(np.asarray(getattr(hw, name)), want, rtol=1e-5)
    out = np.asarray(_WORKLOAD.output_bytes)
    np.testing.assert_allclose(np.asarray(hw.message_bytes), [0.0, out[1], out[5], out[6]], rtol=1e-6)


def test_transformer_workload_matches_hardware_from_model():
    model = dp.Transformer(layers=6, hidden=512, heads=8, sequence=1024, vocabulary=32000, microbatch_size=2)
    device, network = dp.presets.device("H100"), dp.presets.network("nvlink4")
    workload = dp.Workload.from_model(model, device, network)
    assert workload.layers == 8 and workload.samples == 2.0
    for rows, blocks in [((2, 3, 3), [1, 3, 2]), ((8,), [6])]:
        ours = workload.hardware(workload.boundaries(rows))
        ref = dp.hardware_from_model(model, device, network, layers_per_stage=blocks)
        for name in ("forward", "input_grad", "weight", "static_bytes", "gradient_bytes", "activation_bytes",
                     "message_bytes", "capacity"):
            np.testing.assert_allclose(np.asarray(getattr(ours, name)), np.asarray(getattr(ref, name)), rtol=1e-5)


# -- baselines ----------------------------------------------------------------------------------------
def test_minmax_partition_is_the_minmax_over_all_splits():
    rng = np.random.default_rng(2)
    for _ in range(5):
        costs = rng.lognormal(0, 1, 9)
        counts = dp.minmax_partition(costs, 4)
        edges = np.cumsum(np.concatenate([[0], costs]))

        def worst(c, edges=edges):
            cuts = np.cumsum((0, *c))
            return max(edges[b] - edges[a] for a, b in zip(cuts[:-1], cuts[1:]))

        assert sum(counts) == 9 and min(counts) >= 1
        assert math.isclose(worst(counts), min(worst(c) for c in compositions(9, 4)))
    assert dp.uniform_partition(10, 4) == (3, 3, 2, 2)


@given(st.integers(1, 7), st.integers(1, 4), st.integers(0, 2**32 - 1), st.booleans())
def test_partition_is_the_brute_force_optimum(layers, stages, seed, limited):
    """The one split DP (min-max stage cost, optional per-stage memory limit) against every split."""
    from diffpipe._partition import partition

    stages = min(stages, layers)
    rng = np.random.default_rng(seed)
    costs = np.round(rng.uniform(0, 4, layers), 1)  # coarse values: ties happen
    memory = rng.uniform(0, 2, (stages, layers))
    limit = rng.uniform(0.5, 4.0, stages)
    splits = compositions(layers, stages)
    cuts = np.concatenate([np.zeros((len(splits), 1), np.int64), np.cumsum(splits, axis=1)], axis=1)
    cum = np.concatenate([[0.0], np.cumsum(costs)])
    worst = np.max(cum[cuts[:, 1:]] - cum[cuts[:, :-1]], axis=1)
    ok = np.ones(len(splits), dtype=bool)
    if limited:
        held = np.concatenate([np.zeros((stages, 1)), np.cumsum(memory, axis=1)], axis=1)
        rows = np.arange(stages)
        ok = np.all(held[rows, cuts[:, 1:]] - held[rows, cuts[:, :-1]] <= limit, axis=1)
    found = partition(costs, stages, memory=memory, limit=limit) if limited else partition(costs, stages)
    if not ok.any():
        assert found is None
        return
    assert found is not None and sum(found) == layers and min(found) >= 1
    i = [tuple(c) for c in splits.tolist()].index(found)
    assert ok[i]
    assert math.isclose(worst[i], worst[ok].min(), abs_tol=1e-12)


def test_search_batches_share_two_programs_and_split_nothing(graph):
    """The search's batches of plans run as calls of two shapes (one plan, a chunk): one program
    each per graph, whatever the count (a local-search round is 450 to 2,186 plans); the results
    are those of each plan alone, bit for bit, and the public exact simulator's."""
    workload = random_workload(np.random.default_rng(5))
    plans = compositions(LAYERS, STAGES)
    chunk = _optimize.SEARCH_CHUNK
    many = np.concatenate([plans] * (chunk // len(plans) + 2))  # past one chunk, a ragged last one
    assert len(many) > chunk and len(many) % chunk
    _batch._exact._cached.clear_cache()
    times, memory, fits = evaluate_plans(graph, workload, many, chunk=chunk)
    for i in (0, 7, len(plans) - 1):
        alone = evaluate_plans(graph, workload, plans[i:i + 1], chunk=chunk)
        chex.assert_trees_all_equal(alone, (times[i:i + 1], memory[i:i + 1], fits[i:i + 1]))
        j = i + (chunk // len(plans) + 1) * len(plans)  # the same plan, in the last chunk
        chex.assert_trees_all_equal((times[j], memory[j]), (times[i], memory[i]))
        time, peak = exact(graph, workload, plans[i])
        assert times[i] == pytest.approx(time, rel=1e-6)
        np.testing.assert_allclose(memory[i], peak, rtol=1e-6)
    evaluate_plans(graph, workload, plans[:3], chunk=chunk)
    assert _batch._exact._cached._cache_size() == 2  # the chunk and the single-plan bucket



def test_the_optimizer_s_search_runs_one_batch_shape(graph):
    """``optimize``'s exact search (``buckets=()``) runs every call, a single plan included, as one
    chunk: one program per graph, and each plan's figures are those of the bucketed calls bit for bit."""
    from diffpipe._optimize._baselines import _hardware_at

    workload = random_workload(np.random.default_rng(6))
    plans = compositions(LAYERS, STAGES)
    chunk = _optimize.SEARCH_CHUNK
    many = np.concatenate([plans] * (chunk // len(plans) + 2))
    build = jax.tree_util.Partial(_hardware_at, workload)

    def run(counts, **kw):
        bounds = np.concatenate([np.zeros((len(counts), 1)), np.cumsum(counts, axis=1)], axis=1)
        sizes = np.broadcast_to(np.asarray(workload.size, np.float64), (len(counts), graph.microbatches))
        return _batch.evaluate_batched(graph, build, (bounds, sizes), workload.capacity, workload.forward.dtype,
                                       chunk=chunk, **kw)

    _batch._exact._cached.clear_cache()
    outs = [run(x, buckets=()) for x in (many, plans[:1], plans[:3])]
    assert _batch._exact._cached._cache_size() == 1  # one shape: the chunk
    chex.assert_trees_all_equal(outs[0], run(many))
    chex.assert_trees_all_equal(outs[1], run(plans[:1]))  # the single-plan bucket's figures
    chex.assert_trees_all_equal(outs[2], run(plans[:3]))
    assert _batch._exact._cached._cache_size() == 2

# -- optimize against brute force ---------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_optimizer_within_half_a_percent_of_brute_force(graph, seed):
    rng = np.random.default_rng(100 + seed)
    workload = random_workload(rng, communication=seed % 4 != 0)
    if seed % 2 == 0:  # a memory cap that rules out most splits, but not all
        _, memory, _ = evaluate_plans(graph, workload, compositions(LAYERS, STAGES), chunk=CHUNK)
        cap = float(np.quantile(memory.max(axis=1), rng.uniform(0.05, 0.5)))
        workload = random_workload(np.random.default_rng(100 + seed), communication=seed % 4 != 0, capacity=cap)
    result = dp.optimize(graph, workload, dp.StageBalance(STAGES))
    best = dp.brute_force_partition(graph, workload, chunk=CHUNK)
    assert best.fits and result.fits
    assert result.makespan <= best.makespan * 1.005, (result.layers_per_stage, best.layers_per_stage)
    # what is reported is what the exact simulator says of the plan
    time, memory = exact(graph, workload, result.layers_per_stage)
    assert time == pytest.approx(result.makespan, rel=1e-6)
    np.testing.assert_allclose(result.peak_memory, memory, rtol=1e-6)
    assert result.makespan <= result.baseline_makespan * (1 + 1e-6) or not result.baseline_plan.fits
    assert result.loss.shape == (300,) and np.all(np.isfinite(result.loss))


def test_communication_makes_the_minmax_split_wrong(graph):
    # Equal layers, so min-max cuts every 3 layers, exactly where the outputs are huge.
    out = np.full(LAYERS, 0.05)
    out[[2, 5, 8]] = 20.0
    workload = dp.Workload.from_table(np.ones(LAYERS), np.full(LAYERS, 2.0), output_bytes=out,
                                      network=dp.Network.uniform(0.0, 10.0))
    minmax = dp.minmax_partition(workload, STAGES)
    assert minmax == (3, 3, 3, 3)
    minmax_time, _ = exact(graph, workload, minmax)
    result = dp.optimize(graph, workload, dp.StageBalance(STAGES))
    best = dp.brute_force_partition(graph, workload, chunk=CHUNK)
    assert result.makespan < 0.9 * minmax_time
    assert result.makespan <= best.makespan * 1.005
    assert result.rounded.makespan < minmax_time  # the gradient phase alone already beats it


def test_memory_makes_the_minmax_split_wrong(graph):
    # 1F1B: stage 0 holds 4 microbatches' activations, the last stage 1; min-max ignores that.
    workload = dp.Workload.from_table(np.ones(LAYERS), np.full(LAYERS, 2.0), activation_bytes=1.0,
                                      static_bytes=1.0, capacity=12.5)
    minmax = dp.minmax_partition(workload, STAGES)
    minmax_time, minmax_memory = exact(graph, workload, minmax)
    assert minmax_memory.max() > 12.5
    result = dp.optimize(graph, workload, dp.StageBalance(STAGES))
    best = dp.brute_force_partition(graph, workload, chunk=CHUNK)
    assert result.fits and best.fits
    assert result.makespan <= best.makespan * 1.005
    assert result.layers_per_stage[0] < result.layers_per_stage[-1]


def test_microbatch_split_beats_equal_sizes_and_matches_brute_force(graph, monkeypatch):
    traces = []  # the knob is applied once per trace of the compiled loop
    real = _optimize.knob_hardware
    monkeypatch.setattr(_optimize, "knob_hardware", lambda *a: traces.append(1) or real(*a))

    def workload(overhead):
        return dp.Workload.from_table(np.ones(LAYERS), np.full(LAYERS, 2.0), overhead=overhead,
                                      layers_per_stage=(3, 3, 3, 3), output_bytes=1.0,
                                      network=dp.Network.uniform(0.1, 4.0))

    # New float values (workload, temperatures, penalty) reuse the compiled loop.
    dp.optimize(graph, workload(0.3), dp.MicrobatchSplit(12, MICROBATCHES), temperature=(2e-2, 1e-3),
                memory_penalty=10.0)
    assert traces
    before = len(traces)
    # Small first and last microbatches shorten the pipeline's fill and drain.
    workload = workload(0.2)
    result = dp.optimize(graph, workload, dp.MicrobatchSplit(12, MICROBATCHES))
    assert len(traces) == before
    samples = compositions(12, MICROBATCHES)
    times, _, _ = evaluate_plans(graph, workload, np.tile((3, 3, 3, 3), (len(samples), 1)),
                                 samples / (12 / MICROBATCHES), chunk=CHUNK)
    assert sum(result.samples) == 12 and min(result.samples) >= 1
    assert result.makespan <= times.min() * 1.005
    assert result.makespan < result.baseline_makespan  # the equal split is not optimal here
    assert result.layers_per_stage == (3, 3, 3, 3)


def test_no_fitting_plan_is_reported_not_hidden(graph):
    workload = dp.Workload.from_table(np.ones(LAYERS), np.full(LAYERS, 2.0), activation_bytes=10.0,
                                      static_bytes=1.0, capacity=20.0)
    result = dp.optimize(graph, workload, dp.StageBalance(STAGES), steps=300)
    assert not result.fits and result.message.startswith("no plan fits memory")
    with pytest.raises(dp.ConfigError, match="no plan fits memory"):
        dp.optimize(graph, workload, dp.StageBalance(STAGES), throw=True)


# -- bad input fails before any compilation -----------------------------------------------------------
@pytest.fixture
def no_compile(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("compiled before failing")

    monkeypatch.setattr(_optimize, "compile", refuse)


def test_more_stages_than_layers(no_compile):
    workload = dp.Workload.from_table(np.ones(3), np.ones(3))
    with pytest.raises(dp.ConfigError, match="4 stages exceed the workload's 3 layers"):
        dp.optimize(SCHEDULE, workload, dp.StageBalance(4))
    with pytest.raises(dp.ConfigError, match="4 stages exceed the 3 layers"):
        dp.uniform_partition(3, 4)


def test_batch_smaller_than_microbatches():
    with pytest.raises(dp.ConfigError, match="batch 6 is smaller than the 8 microbatches"):
        dp.MicrobatchSplit(6, 8)


def test_infeasible_memory_cap(no_compile):
    workload = dp.Workload.from_table(np.ones(LAYERS), np.ones(LAYERS), static_bytes=1.0, capacity=2.5)
    with pytest.raises(dp.ConfigError, match="no split of 12 layers into 4 stages fits the static bytes"):
        dp.optimize(SCHEDULE, workload, dp.StageBalance(STAGES))
    fixed = workload.with_split((9, 1, 1, 1))
    with pytest.raises(dp.ConfigError, match="device 0 needs 9 static bytes"):
        dp.optimize(SCHEDULE, dp.Workload.from_table(np.ones(LAYERS), np.ones(LAYERS), static_bytes=1.0,
                                                     capacity=8.0, layers_per_stage=(9, 1, 1, 1)),
                    dp.MicrobatchSplit(16, MICROBATCHES))
    assert fixed.layers_per_stage == (9, 1, 1, 1)


@pytest.mark.parametrize("knob, match", [
    (dp.StageBalance(3), "StageBalance has 3 stages, the schedule has 4"),
    (dp.MicrobatchSplit(16, 4), "MicrobatchSplit has 4 microbatches, the schedule has 8"),
    ("stages", "knob must be an AbstractKnob"),
    ((dp.StageBalance(4), dp.StageBalance(4)), "StageBalance and StageBalance both set forward"),
])
def test_knob_mismatch(no_compile, knob, match):
    workload = dp.Workload.from_table(np.ones(LAYERS), np.ones(LAYERS))
    with pytest.raises(dp.ConfigError, match=match):
        dp.optimize(SCHEDULE, workload, knob)


def test_other_bad_arguments(no_compile):
    workload = dp.Workload.from_table(np.ones(LAYERS), np.ones(LAYERS))
    knob = dp.StageBalance(STAGES)
    for kwargs, match in [({"steps": 0}, "steps must be a positive int"),
                          ({"memory_penalty": -1.0}, "memory_penalty"),
                          ({"temperature": (0.0, 1e-3)}, "temperatures must be positive"),
                          ({"restarts": 2}, "restarts need a PRNG key")]:
        with pytest.raises(dp.ConfigError, match=match):
            dp.optimize(SCHEDULE, workload, knob, **kwargs)
    with pytest.raises(dp.ConfigError, match="forward has"):
        dp.Workload.from_table(np.ones(4), np.ones(3))
    with pytest.raises(dp.ConfigError, match="must be non-negative"):
        dp.Workload.from_table(-np.ones(4), np.ones(4))


def test_brute_force_refuses_large_instances(graph):
    workload = dp.Workload.from_table(np.ones(40), np.ones(40))
    with pytest.raises(dp.ConfigError, match=r"C\(39, 3\) = 9139 splits exceed limit=1000"):
        dp.brute_force_partition(graph, workload, limit=1000)


# -- one compiled descent for several graphs; results kept across calls ---------------------------------
@pytest.mark.slow
def test_padded_descent_shares_one_program_and_balances_alike(graph):
    """Two graphs of one stage count padded to their common sizes run one compiled descent, and
    each gives the unpadded call's balanced plan (the descent up to float rounding; every exact
    figure bit for bit)."""
    other = dp.compile(dp.schedules.get("1f1b", devices=STAGES, microbatches=MICROBATCHES + 4))
    sizes = common_sizes([graph, other])
    assert other.offsets.shape[0] > graph.offsets.shape[0]  # different sizes: unpadded, two descents
    knob = dp.StageBalance(STAGES)
    _optimize._descend._cached.clear_cache()
    for g, seed in ((graph, 7), (other, 8)):
        workload = random_workload(np.random.default_rng(seed), capacity=math.inf)
        alone = dp.optimize(g, workload, knob)
        shared = dp.optimize(g, workload, knob, pad_to=sizes)
        assert shared is not alone
        chex.assert_trees_all_equal((shared.plan, shared.rounded, shared.baseline_plan, shared.evaluations),
                                    (alone.plan, alone.rounded, alone.baseline_plan, alone.evaluations))
        chex.assert_trees_all_close(shared.continuous, alone.continuous, rtol=1e-4, atol=1e-4)
        chex.assert_trees_all_close(shared.loss, alone.loss, rtol=1e-5)
    assert _optimize._descend._cached._cache_size() == 3  # one per unpadded graph, one for both padded
    with pytest.raises(dp.ConfigError, match="pad_to must map"):
        dp.optimize(graph, workload, knob, pad_to={"levels": 64, "colour": 1})
    with pytest.raises(dp.ConfigError, match=r"pad_to\['levels'\] must be a positive int"):
        dp.optimize(graph, workload, knob, pad_to={"levels": 0})


def test_a_padded_stage_split_is_inert(graph):
    """``PaddedStageBalance`` (a stage split run in more stages, for sharing programs across stage
    counts): the hardware of a plan is ``pad_hardware``'s of the real knob's, bit for bit, so every
    makespan and memory is the unpadded graph's; the relaxed boundaries are the real knob's up to
    float rounding (padded ones at ``layers``), and no gradient reaches a padded logit."""
    from diffpipe._engine._graph import pad_graph
    from diffpipe._engine._hardware import pad_hardware
    from diffpipe._optimize._knobs import PaddedStageBalance, value_hardware

    eight = dp.compile(dp.schedules.get("interleaved-1f1b", devices=STAGES, microbatches=MICROBATCHES, chunks=2))
    assert eight.stages == 2 * STAGES
    padded_graph = pad_graph(graph, **common_sizes([graph, eight]))
    knob = dp.StageBalance(STAGES)
    padded = PaddedStageBalance.of(knob, eight.stages)
    workload = random_workload(np.random.default_rng(5))
    for plan in (np.array([3, 3, 3, 3]), np.array([1, 5, 2, 4])):
        real = pad_hardware(value_hardware((knob,), (knob.encode(plan, workload),), workload, STAGES), padded_graph)
        wide = value_hardware((padded,), (padded.encode(plan, workload),), workload, eight.stages)
        chex.assert_trees_all_equal(wide, real)
        assert float(dp.makespan(padded_graph, wide)) == float(dp.makespan(graph, workload.hardware(
            workload.boundaries(plan))))
    params = jnp.asarray(np.random.default_rng(6).normal(size=STAGES), workload.forward.dtype)
    bounds = np.asarray(padded.relax(padded.pad_params(params), workload))
    chex.assert_trees_all_close(bounds[:STAGES + 1], np.asarray(knob.relax(params, workload)), rtol=1e-6, atol=1e-5)
    assert np.all(bounds[STAGES:] == LAYERS)
    assert np.array_equal(padded.round(params, workload), knob.round(params, workload))
    grad = jax.grad(lambda p: jnp.sum(padded.relax(p, workload) ** 2))(padded.pad_params(params))
    assert np.all(np.asarray(grad)[STAGES:] == 0) and np.all(np.isfinite(np.asarray(grad)))


@pytest.mark.slow
def test_one_descent_serves_two_stage_counts(graph):
    """Graphs of 4 and 8 stages padded to their common sizes run one compiled descent and one exact
    evaluator per batch shape, and each gives the unpadded call's plan (every exact figure bit for
    bit; the continuous optimum up to float rounding)."""
    eight = dp.compile(dp.schedules.get("interleaved-1f1b", devices=STAGES, microbatches=MICROBATCHES, chunks=2))
    sizes = common_sizes([graph, eight])
    _optimize._descend._cached.clear_cache()
    for g, seed in ((graph, 11), (eight, 12)):
        workload = random_workload(np.random.default_rng(seed), capacity=math.inf)
        knob = dp.StageBalance(g.stages)
        alone = dp.optimize(g, workload, knob)
        shared = dp.optimize(g, workload, knob, pad_to=sizes)
        chex.assert_trees_all_equal((shared.plan, shared.rounded, shared.baseline_plan, shared.evaluations),
                                    (alone.plan, alone.rounded, alone.baseline_plan, alone.evaluations))
        chex.assert_trees_all_close(shared.continuous, alone.continuous, rtol=1e-4, atol=1e-4)
        chex.assert_trees_all_close(shared.loss, alone.loss, rtol=1e-5)
        chex.assert_trees_all_close(shared.params, alone.params, rtol=1e-4, atol=1e-4)
    assert _optimize._descend._cached._cache_size() == 3  # one per unpadded graph, one for both padded


def test_a_stored_result_needs_every_input_equal(graph, monkeypatch):
    """A repeated call returns the stored result without running anything; a change of any input
    (one float's last bit, the graph, a keyword, the padding) runs afresh."""
    descents = []
    real = _optimize._descend
    monkeypatch.setattr(_optimize, "_descend", lambda *a: descents.append(1) or real(*a))
    _optimize._STORED.clear()
    workload = random_workload(np.random.default_rng(21))
    knob = dp.StageBalance(STAGES)
    first = dp.optimize(graph, workload, knob)
    assert dp.optimize(graph, workload, knob) is first and len(descents) == 1
    with pytest.raises(ValueError, match="read-only"):
        first.loss[0] = 0.0
    forward = np.asarray(workload.forward).copy()
    forward[3] = np.nextafter(forward[3], np.inf)
    nudged = eqx.tree_at(lambda w: w.forward, workload, jax.device_put(forward))
    other = dp.compile(dp.schedules.get("gpipe", devices=STAGES, microbatches=MICROBATCHES))
    changes = [(graph, nudged, {}), (other, workload, {}), (graph, workload, {"steps": 299}),
               (graph, workload, {"temperature": (1e-2, 2e-4)}), (graph, workload, {"local_search": False}),
               (graph, workload, {"pad_to": {"levels": graph.offsets.shape[0] + 1}})]
    for g, w, kwargs in changes:
        before = len(descents)
        again = dp.optimize(g, w, knob, **kwargs)
        assert again is not first and len(descents) == before + 1, kwargs
        assert dp.optimize(g, w, knob, **kwargs) is again and len(descents) == before + 1
    dp.clear_caches()
    assert dp.optimize(graph, workload, knob) is not first


def test_a_schedule_is_optimized_for_the_devices_per_node_it_is_given():
    """The topology is the graph's: ``optimize(schedule, ..., devices_per_node=2)`` compiles for two
    stages per node, so its plan's exact makespan is the simulator's on that graph, whose middle
    boundary pays the (10x slower) inter link, not the one-node graph's."""
    out = np.full(LAYERS, 1.0)
    network = dp.Network(jnp.asarray(0.0), jnp.asarray(10.0), jnp.asarray(0.0), jnp.asarray(1.0))
    workload = dp.Workload.from_table(np.ones(LAYERS), np.full(LAYERS, 2.0), output_bytes=out, network=network)
    result = dp.optimize(SCHEDULE, workload, dp.StageBalance(STAGES), steps=20, devices_per_node=2)
    counts = result.plan.layers_per_stage
    two, _ = exact(dp.compile(SCHEDULE, devices_per_node=2), workload, counts)
    one, _ = exact(dp.compile(SCHEDULE), workload, counts)
    assert float(result.makespan) == pytest.approx(two, rel=1e-6) and two > one
