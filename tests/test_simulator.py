"""The JAX simulator against the pure-Python reference evaluator, closed forms and invariants."""

import math
import zlib

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import covering, schedules
from hypothesis import given, settings
from hypothesis import strategies as st

import diffpipe as dp
from diffpipe._engine import _simulate
from diffpipe.schedules._reference import evaluate_network

SCHEDULES = schedules()
MODES = ("none", "overlap", "contention", "blocking")


def build(s, rng, mode, devices_per_node=None, scale=1.0):
    """Random hardware for ``s`` and the matching reference duration/transfer functions."""
    P, S, M, D = s.pipelines, s.stages, s.microbatches, s.devices
    f, b, w = (rng.uniform(0.5, 2.0, (P, S)) * scale for _ in range(3))
    upd = rng.uniform(0.0, 0.5, (P, S))
    size = rng.uniform(0.5, 1.5, M)
    msg = rng.uniform(0.0, 2.0, (P, S))
    grad = rng.uniform(0.0, 2.0, (P, S))
    overhead = float(rng.uniform(0, 0.1))
    lat, bw, ilat, ibw = 0.05, 4.0, 0.2, 1.0
    per_node = devices_per_node or D
    hw = dp.Hardware(
        forward=jnp.asarray(f, jnp.float32), input_grad=jnp.asarray(b, jnp.float32),
        weight=jnp.asarray(w, jnp.float32), update=jnp.asarray(upd, jnp.float32),
        overhead=jnp.asarray(overhead, jnp.float32), size=jnp.asarray(size, jnp.float32),
        message_bytes=jnp.asarray(msg, jnp.float32), gradient_bytes=jnp.asarray(grad, jnp.float32),
        static_bytes=jnp.zeros(()), activation_bytes=jnp.ones(()), capacity=jnp.asarray(math.inf),
        network=dp.Network(jnp.asarray(lat), jnp.asarray(bw), jnp.asarray(ilat), jnp.asarray(ibw)),
    )

    def link(src, dst):
        same = src // per_node == dst // per_node
        return (lat, bw) if same else (ilat, ibw)

    def duration(op):
        p, st_, m = op.pipeline, op.stage, op.microbatch
        if op.kind == "F":
            return overhead + size[m] * f[p, st_]
        if op.kind == "B":
            return overhead + size[m] * (b[p, st_] + w[p, st_])
        if op.kind == "I":
            return overhead + size[m] * b[p, st_]
        if op.kind == "W":
            return overhead + size[m] * w[p, st_]
        if op.kind == "U":
            return overhead + upd[p, st_]
        devices = s.devices_of(op)  # R: ring all-reduce over the link of its first and last participant
        n = len(devices)
        if n == 1:
            return 0.0
        a, beta = link(devices[0], devices[-1])
        return 2 * (n - 1) / n * grad[p, st_] / beta + 2 * (n - 1) * a

    def transfer(op, dep):
        if mode == "none":
            return 0.0
        a, beta = link(dep.src, dep.dst)
        return a + size[op.microbatch] * msg[op.pipeline, dep.boundary] / beta

    return hw, duration, transfer, dp.communication(mode)


#: Every family in two modes, every mode on half the families (``_helpers.covering``).
REFERENCE_MATRIX = covering(SCHEDULES, MODES, per_case=2)


@pytest.mark.parametrize("case, s, mode", REFERENCE_MATRIX, ids=[f"{c}-{m}" for c, _, m in REFERENCE_MATRIX])
def test_matches_reference_every_family_and_mode(case, s, mode):
    rng = np.random.default_rng(zlib.crc32(f"{case}/{mode}".encode()))
    per_node = 2 if s.devices >= 4 else None
    hw, duration, transfer, comm = build(s, rng, mode, per_node)
    try:
        result = dp.simulate(s, hw, communication=mode, devices_per_node=per_node)
    except dp.ScheduleError as error:  # blocking send/recv orders may deadlock: the reference agrees
        assert mode == "blocking" and "deadlocks under blocking" in str(error)
        return
    start, finish, _ = evaluate_network(s, duration, transfer, comm, per_node)
    want = np.array([finish[op] for op in s.ops])
    np.testing.assert_allclose(np.asarray(result.finish), want, rtol=2e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(result.start), [start[op] for op in s.ops], rtol=2e-5, atol=1e-4)
    assert float(result.makespan) == pytest.approx(max(want), rel=2e-5)


@settings(max_examples=12)
@given(data=st.data())
def test_random_hardware_matches_reference(data):
    case, s = data.draw(st.sampled_from(SCHEDULES))
    mode = data.draw(st.sampled_from(("overlap", "contention")))
    seed = data.draw(st.integers(0, 2**31))
    hw, duration, transfer, comm = build(s, np.random.default_rng(seed), mode, None)
    got = dp.makespan(dp.compile(s, communication=mode), hw)
    _, finish, _ = evaluate_network(s, duration, transfer, comm)
    assert float(got) == pytest.approx(max(finish.values()), rel=2e-5)


@pytest.mark.parametrize("family", ["gpipe", "1f1b"])
@pytest.mark.parametrize("devices, microbatches", [(2, 2), (4, 8), (8, 32)])
def test_closed_form(family, devices, microbatches):
    s = dp.schedules.get(family, devices=devices, microbatches=microbatches)
    hw = dp.Hardware.from_times(1.25, 2.5)
    f = dp.schedules.formula(family, devices=devices, microbatches=microbatches, durations={"F": 1.25, "B": 2.5})
    assert float(dp.makespan(dp.compile(s), hw)) == pytest.approx(f.makespan, rel=1e-6)
    r = dp.simulate(s, hw)
    assert float(r.bubble_ratio) == pytest.approx(f.bubble_ratio, rel=1e-5)
    assert tuple(int(x) for x in r.peak_activations) == f.peak_activations


def test_smoothed_is_an_upper_bound_within_the_stated_gap():
    s = dp.schedules.get("1f1b", devices=4, microbatches=8)
    g = dp.compile(s)
    hw, *_ = build(s, np.random.default_rng(0), "overlap")
    exact = float(dp.makespan(g, hw))
    k, levels, sinks = g.pred.shape[-1], g.offsets.shape[-1], g.sinks.shape[-1]
    previous = math.inf
    for tau in (1.0, 0.1, 0.01, 1e-3):
        smooth = float(dp.makespan(g, hw, temperature=tau))
        bound = tau * (levels * math.log(k + 1) + math.log(sinks))
        assert exact - 1e-4 <= smooth <= exact + bound + 1e-4
        assert smooth <= previous + 1e-4
        previous = smooth
    assert previous == pytest.approx(exact, abs=0.05)


@pytest.mark.parametrize("tau", [1e-6, 0.5])
def test_no_nan_gradients_even_at_tiny_temperature_and_with_padding(tau):
    s1 = dp.schedules.get("1f1b", devices=4, microbatches=4)
    s2 = dp.schedules.get("gpipe", devices=2, microbatches=3)
    stacked = dp.stack_graphs([dp.compile(s1), dp.compile(s2)])
    hw = dp.Hardware.from_times(jnp.ones(4), 2.0 * jnp.ones(4), p2p_time=0.1)

    def loss(h):
        return jnp.sum(jax.vmap(lambda g: dp.makespan(g, h, temperature=tau))(stacked))

    grads = jax.grad(loss)(hw)
    for leaf in jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array)):
        assert np.all(np.isfinite(np.asarray(leaf)))


def test_padding_never_changes_a_result():
    graphs = [dp.compile(s) for _, s in SCHEDULES[:4]]
    stacked = dp.stack_graphs(graphs)
    hw = dp.Hardware.from_times(1.0, 2.0, 0.5, p2p_time=0.3)
    for tau in (None, 0.2):
        got = jax.vmap(lambda g, tau=tau: dp.makespan(g, hw, temperature=tau))(stacked)
        want = [dp.makespan(g, hw, temperature=tau) for g in graphs]
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_batched_path_equals_vmap_and_loop():
    s = dp.schedules.get("1f1b", devices=4, microbatches=8)
    g = dp.compile(s)
    f = jnp.linspace(0.5, 2.0, 7)
    hws = jax.vmap(lambda x: dp.Hardware.from_times(x, 2 * x, p2p_time=0.1 * x))(f)
    batched = dp.makespan(g, hws, batched=True)
    mapped = jax.vmap(lambda h: dp.makespan(g, h))(hws)
    looped = [dp.makespan(g, dp.Hardware.from_times(x, 2 * x, p2p_time=0.1 * x)) for x in f]
    np.testing.assert_allclose(np.asarray(batched), np.asarray(mapped), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(batched), np.asarray(looped), rtol=1e-6)


def _fd_check(fun, x, eps, rtol, atol=1e-7):
    grad = np.asarray(jax.grad(fun)(x))
    x = np.asarray(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = eps
        fd = (fun(jnp.asarray(x + e)) - fun(jnp.asarray(x - e))) / (2 * eps)
        assert grad.flat[i] == pytest.approx(float(fd), rel=rtol, abs=atol), i


@pytest.mark.parametrize("mode", ["overlap", "contention", "blocking"])
@pytest.mark.parametrize("tau", [None, 0.3])
def test_gradients_match_finite_differences_float64(mode, tau):
    with jax.enable_x64(True):
        s = dp.schedules.get("1f1b", devices=3, microbatches=4)
        g = dp.compile(s, communication=mode)
        rng = np.random.default_rng(1)
        base, *_ = build(s, rng, mode)
        base = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64) if eqx.is_inexact_array(x) else x, base)

        def fun(x):  # per-stage forward times, per-microbatch sizes and the latency at once
            h = eqx.tree_at(lambda h: (h.forward, h.size, h.network.latency), base,
                            (x[:3][None, :], x[3:7], x[7]))
            return dp.makespan(g, h, temperature=tau)

        x0 = jnp.concatenate([base.forward[0], base.size, base.network.latency[None]])
        _fd_check(fun, x0, 1e-6, 1e-5)


def test_gradient_of_temperature_matches_finite_difference():
    with jax.enable_x64(True):
        s = dp.schedules.get("1f1b", devices=3, microbatches=4)
        g = dp.compile(s)
        hw = dp.Hardware.from_times(1.0, 2.0, p2p_time=0.1)
        hw = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64) if eqx.is_inexact_array(x) else x, hw)
        _fd_check(lambda t: dp.makespan(g, hw, temperature=t), jnp.asarray(0.4), 1e-6, 1e-5)


@pytest.mark.parametrize("tau", [None, 0.2])
@pytest.mark.parametrize("mode", ["overlap", "contention"])
def test_reverse_sweep_agrees_with_plain_autodiff(tau, mode):
    s = dp.schedules.get("zb-h1", devices=3, microbatches=5)
    g = dp.compile(s, communication=mode)
    hw, *_ = build(s, np.random.default_rng(3), mode)
    ours = jax.grad(lambda h: dp.makespan(g, h, temperature=tau))(hw)
    plain = jax.grad(lambda h: dp.makespan(g, h, temperature=tau, adjoint="autodiff"))(hw)
    for x, y in zip(jax.tree.leaves(eqx.filter(ours, eqx.is_inexact_array)),
                    jax.tree.leaves(eqx.filter(plain, eqx.is_inexact_array))):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case, s", SCHEDULES[:6], ids=[c for c, _ in SCHEDULES[:6]])
def test_invariants(case, s):
    rng = np.random.default_rng(7)
    hw, duration, transfer, _ = build(s, rng, "overlap")
    r = dp.simulate(s, hw)
    total = float(r.makespan)
    assert np.all(np.asarray(r.busy) <= total + 1e-4)
    # the longest dependency chain (durations only) is a lower bound
    longest = {}
    for op in s.ops:
        longest[op] = duration(op) + max((longest[d.op] for d in s.dependencies[op]), default=0.0)
    assert total >= max(longest.values()) - 1e-4
    # monotone: making any one stage slower never speeds the step up
    g = dp.compile(s)
    slower = eqx.tree_at(lambda h: h.forward, hw, hw.forward.at[0, 0].add(0.5))
    assert float(dp.makespan(g, slower)) >= total - 1e-5


def test_relabelling_devices_changes_nothing():
    s = dp.schedules.get("1f1b", devices=4, microbatches=6)
    perm = [2, 0, 3, 1]  # new device of old device d
    table = tuple(tuple(perm[d] for d in row) for row in s.placement.table)
    orders = [None] * 4
    for d, order in enumerate(s.orders):
        orders[perm[d]] = order
    relabelled = dp.schedules.Schedule(dp.schedules.Placement(4, table), orders, s.microbatches)
    hw = dp.Hardware.from_times(jnp.array([1.0, 1.5, 0.7, 1.2]), 2.0, p2p_time=0.25)
    assert float(dp.simulate(relabelled, hw).makespan) == pytest.approx(float(dp.simulate(s, hw).makespan))


def test_new_hardware_values_do_not_recompile():
    s = dp.schedules.get("1f1b", devices=4, microbatches=8)
    g = dp.compile(s)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def run(f, tau):
        return dp.makespan(g, dp.Hardware.from_times(f, 2.0 * f, p2p_time=0.1), temperature=tau)

    for f, tau in [(1.0, 0.1), (2.0, 0.2), (3.5, 0.05)]:
        run(jnp.asarray(f), jnp.asarray(tau))
    hw1 = dp.Hardware.from_times(1.0, 2.0)
    dp.makespan(g, hw1)
    traces = _simulate._baked(g)._cache_size()
    dp.makespan(g, dp.Hardware.from_times(3.0, 1.0))
    assert _simulate._baked(g)._cache_size() == traces


def test_memory_matches_schedule_counts_and_bytes():
    s = dp.schedules.get("1f1b", devices=4, microbatches=8)
    hw = dp.Hardware.from_times(1.0, 2.0, activation_bytes=3.0, static_bytes=100.0, capacity=110.0)
    r = dp.simulate(s, hw)
    np.testing.assert_array_equal(np.asarray(r.peak_activations), dp.schedules.peak_activations(s))
    np.testing.assert_allclose(np.asarray(r.peak_memory), [112.0, 109.0, 106.0, 103.0])
    assert list(np.asarray(r.fits)) == [False, True, True, True]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: dp.Hardware.from_times(-1.0, 2.0), "forward must be non-negative"),
        (lambda: dp.Hardware.from_times(1.0, float("nan")), "input_grad"),
        (lambda: dp.Hardware.from_times(1.0, 2.0, p2p_time=float("inf")), "latency"),
        (lambda: dp.Network.uniform(0.0, 0.0), "bandwidth must be positive"),
        (lambda: dp.simulate(dp.schedules.get("1f1b", devices=2, microbatches=2), dp.Hardware.from_times(1.0, 2.0),
                             communication="fast"), "communication 'fast'"),
    ],
)
def test_bad_hardware_is_rejected_eagerly(make, message):
    with pytest.raises(dp.ConfigError, match=message):
        make()


def test_bad_inputs_at_evaluation():
    s = dp.schedules.get("1f1b", devices=4, microbatches=8)
    g = dp.compile(s)
    with pytest.raises(dp.ConfigError, match=r"forward has shape \(3,\)"):
        dp.makespan(g, dp.Hardware.from_times(jnp.ones(3), 2.0))
    with pytest.raises(dp.ConfigError, match="temperature"):
        dp.makespan(g, dp.Hardware.from_times(1.0, 2.0), temperature=0.0)
    with pytest.raises(dp.ConfigError, match="compile"):
        dp.makespan(s, dp.Hardware.from_times(1.0, 2.0))
    with pytest.raises(dp.ConfigError, match="communication='contention' applies to a Schedule"):
        dp.simulate(g, dp.Hardware.from_times(1.0, 2.0), communication="contention")
    with pytest.raises(Exception, match="non-negative and finite"):  # inside jit: eqx.error_if
        jax.jit(lambda f: dp.makespan(g, dp.Hardware.from_times(f, 2.0)))(jnp.asarray(-1.0))


def test_failed_checks_inside_jit_become_one_line_config_errors():
    g = dp.compile(dp.schedules.get("1f1b", devices=2, microbatches=2))
    hw = dp.Hardware.from_times(1.0, 2.0, p2p_time=0.1)
    negative = eqx.tree_at(lambda h: h.forward, hw, jnp.asarray(-1.5))  # tree_at skips the constructor's checks
    with pytest.raises(dp.ConfigError, match=r"forward must be non-negative and finite, got .*-1\.5"):
        dp.makespan(g, negative)
    with pytest.raises(dp.ConfigError, match="forward must be non-negative"):
        dp.simulate(g, negative)
    batch = jax.vmap(lambda x: dp.Hardware.from_times(x, 2.0))(jnp.asarray([1.0, -2.0]))  # vmap: no eager check
    with pytest.raises(dp.ConfigError, match=r"forward must be non-negative and finite, got .*-2\.0"):
        dp.makespan(g, batch, batched=True)
    zero_bandwidth = eqx.tree_at(lambda h: h.network.bandwidth, hw, jnp.asarray(0.0))
    with pytest.raises(dp.ConfigError, match="bandwidth must be positive"):
        dp.makespan(g, zero_bandwidth)
    with pytest.raises(dp.ConfigError, match=r"temperature must be .* got .*0\.0"):
        dp.makespan(g, hw, temperature=jnp.asarray(0.0))


def test_blocking_deadlock_is_reported():
    # device 1 receives microbatch 1 before 0 while device 0 sends 0 first: blocking send/recv hangs.
    rows = [["0F0", "0F1", "0B0", "0B1"], ["1F1", "1F0", "1B0", "1B1"]]
    s = dp.schedules.Schedule(dp.schedules.Placement.linear(2), dp.schedules.orders_from_strings(rows), 2)
    dp.compile(s, communication="overlap")
    with pytest.raises(dp.ScheduleError, match="deadlocks under blocking"):
        dp.compile(s, communication="blocking")


@pytest.mark.parametrize("tau", [1e-6, 0.3])
def test_forward_mode_with_autodiff_adjoint_has_no_nan(tau):
    s1 = dp.schedules.get("1f1b", devices=4, microbatches=4)
    s2 = dp.schedules.get("gpipe", devices=2, microbatches=3)
    stacked = dp.stack_graphs([dp.compile(s1), dp.compile(s2)])

    def f(x):
        hw = dp.Hardware.from_times(x, 2.0 * x, p2p_time=0.1)
        return jnp.sum(jax.vmap(lambda g: dp.makespan(g, hw, temperature=tau, adjoint="autodiff"))(stacked))

    _, tangent = jax.jvp(f, (jnp.ones(4),), (jnp.ones(4),))
    assert np.isfinite(float(tangent))
    np.testing.assert_allclose(np.asarray(jax.jacfwd(f)(jnp.ones(4))), np.asarray(jax.grad(f)(jnp.ones(4))), rtol=1e-5)
    with pytest.raises(dp.ConfigError, match="adjoint"):
        dp.makespan(dp.compile(s1), dp.Hardware.from_times(1.0, 2.0), adjoint="magic")


def test_the_graph_s_topology_decides_inter_node_links_in_every_mode():
    s = dp.schedules.get("1f1b", devices=4, microbatches=4)
    for mode in ("overlap", "blocking"):
        net = dp.Network(jnp.asarray(1e-5), jnp.asarray(4e11), jnp.asarray(1e-5), jnp.asarray(1e10))
        hw = eqx.tree_at(lambda h: (h.network, h.message_bytes),
                         dp.Hardware.from_times(1e-3, 2e-3), (net, jnp.asarray(1e8)))
        direct = dp.makespan(dp.compile(s, communication=mode, devices_per_node=2), hw)
        simulated = dp.simulate(s, hw, communication=mode, devices_per_node=2)
        assert float(direct) == pytest.approx(float(simulated.makespan), rel=1e-6)
        assert float(direct) > float(dp.makespan(dp.compile(s, communication=mode), hw))  # inter links are slower


def test_autodiff_adjoint_temperature_gradient_is_finite_and_agrees():
    with jax.enable_x64(True):
        s = dp.schedules.get("1f1b", devices=4, microbatches=8)
        g = dp.compile(s)
        hw = dp.Hardware.from_times(1e-3, 2e-3, p2p_time=1e-4)
        sweep = jax.grad(lambda t: dp.makespan(g, hw, temperature=t))(jnp.asarray(1e-4))
        plain = jax.grad(lambda t: dp.makespan(g, hw, temperature=t, adjoint="autodiff"))(jnp.asarray(1e-4))
        _, tangent = jax.jvp(lambda t: dp.makespan(g, hw, temperature=t, adjoint="autodiff"),
                             (jnp.asarray(1e-4),), (jnp.asarray(1.0),))
        assert float(plain) == pytest.approx(float(sweep), rel=1e-6)
        assert float(tangent) == pytest.approx(float(sweep), rel=1e-6)


def test_batched_needs_a_batch_axis():
    g = dp.compile(dp.schedules.get("1f1b", devices=2, microbatches=2))
    with pytest.raises(dp.ConfigError, match="leading batch axis"):
        dp.makespan(g, dp.Hardware.from_times(1.0, 2.0), batched=True)


def test_backward_is_no_longer_a_name_of_input_grad():
    """``Hardware.input_grad`` (the input-gradient part I) was once ``backward``: the old keyword
    and attribute are refused, never read silently."""
    hw = dp.Hardware.from_times(1.0, input_grad=2.0)
    assert float(hw.input_grad) == 2.0
    with pytest.raises(TypeError, match="unexpected keyword argument 'backward'"):
        dp.Hardware.from_times(1.0, backward=2.0)
    with pytest.raises(AttributeError, match="backward"):
        hw.backward  # noqa: B018
    with pytest.raises(dp.ConfigError, match="input_grad is required"):
        dp.Hardware.from_times(1.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'backward'"):
        dp.Workload.from_table([1.0, 1.0], backward=[2.0, 2.0])
    with pytest.raises(dp.ConfigError, match="input_grad is required"):
        dp.Workload.from_table([1.0, 1.0])


@pytest.mark.parametrize("bad", [True, "0.1", b"x", np.array(True)], ids=["bool", "str", "bytes", "bool-array"])
def test_temperature_that_is_not_a_number_is_one_line(bad):
    g = dp.compile(dp.schedules.get("1f1b", devices=2, microbatches=2))
    with pytest.raises(dp.ConfigError, match="temperature must be a positive finite number"):
        dp.makespan(g, dp.Hardware.from_times(1.0, 2.0), temperature=bad)
