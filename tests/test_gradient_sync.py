"""``compile(..., gradient_sync=True)``: data-parallel gradient sync on per-device sync lanes,
against the pure-Python reference (``schedules._reference.evaluate_gradient_sync``) and by hand."""

import zlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import SIZES, covering
from test_simulator import MODES, build

import diffpipe as dp
from diffpipe._engine._evaluate import finish_times
from diffpipe._engine._graph import KIND_CODES
from diffpipe.schedules._reference import evaluate_gradient_sync, evaluate_network

FAMILIES = ("1f1b", "interleaved-1f1b", "zb-h1", "gpipe", "zb-v", "dualpipe-v", "chimera")


def schedule(family):
    devices, microbatches, options = SIZES[family]
    return dp.schedules.get(family, devices=devices, microbatches=microbatches, **options)


def with_data_parallel(hw, data_parallel, link):
    net = hw.network
    return eqx.tree_at(lambda h: h.network, hw, dp.Network(
        net.latency, net.bandwidth, net.inter_latency, net.inter_bandwidth,
        data_parallel=data_parallel, data_parallel_link=link))


def reference_sync(s, hw, mode, per_node, data_parallel, link):
    """The reference's sync and update durations, written from docs/architecture.md ("The
    data-parallel gradient sync"): a ring all-reduce of ``n = holders * data_parallel`` over the
    slowest of the holders' link (when several devices hold the stage) and the data-parallel
    link; free under ``none``."""
    lat, bw, ilat, ibw = (float(x) for x in (hw.network.latency, hw.network.bandwidth,
                                            hw.network.inter_latency, hw.network.inter_bandwidth))
    grad = np.broadcast_to(np.asarray(hw.gradient_bytes), (s.pipelines, s.stages))
    upd = np.broadcast_to(np.asarray(hw.update), (s.pipelines, s.stages))
    node = per_node or s.devices

    def sync(stage):
        if mode == "none":
            return 0.0
        holders = sorted({s.placement.device(p, stage) for p in range(s.pipelines)})
        links = [(lat, bw) if link == "intra" else (ilat, ibw)] if data_parallel > 1 else []
        if len(holders) > 1:
            same = holders[0] // node == holders[-1] // node
            links.append((lat, bw) if same else (ilat, ibw))
        n = len(holders) * data_parallel
        if n == 1:
            return 0.0
        a, beta = max(x for x, _ in links), min(y for _, y in links)
        return 2 * (n - 1) / n * grad[0, stage] / beta + 2 * (n - 1) * a

    def update(p, stage):
        return float(hw.overhead) + float(upd[p, stage])

    return sync, update


def node_finishes(graph, hw):
    """JAX finish times of the sync (by stage) and update (by (pipeline, stage)) nodes."""
    finish = np.asarray(finish_times(graph, hw.tables(graph).batch_last())[:, 0])
    kind, op_index = np.asarray(graph.kind), np.asarray(graph.op_index)
    stage, pipe = np.asarray(graph.stage), np.asarray(graph.pipeline)
    extra = np.flatnonzero(op_index < 0)
    syncs = {int(stage[i]): finish[i] for i in extra if kind[i] == KIND_CODES["R"]}
    updates = {(int(pipe[i]), int(stage[i])): finish[i] for i in extra if kind[i] == KIND_CODES["U"]}
    return syncs, updates


#: Every family under one of the two lane-structure extremes, every mode on a one-pipeline and a
#: replicated schedule (``_helpers.covering``; the full cross product takes minutes more of CI).
REFERENCE_CASES = covering([(f,) for f in FAMILIES], ("overlap", "contention")) + [
    (f, m) for f in ("1f1b", "chimera") for m in ("none", "blocking", "rendezvous")]


@pytest.mark.parametrize(("family", "mode"), REFERENCE_CASES)
def test_matches_reference(family, mode):
    s = schedule(family)
    rng = np.random.default_rng(zlib.crc32(f"sync/{family}/{mode}".encode()))
    per_node = 2 if s.devices >= 4 else None
    link = "intra" if zlib.crc32(family.encode()) % 2 else "inter"
    data_parallel = 3
    hw, duration, transfer, comm = build(s, rng, mode, per_node)
    hw = with_data_parallel(hw, data_parallel, link)
    try:
        graph = dp.compile(s, communication=mode, devices_per_node=per_node, gradient_sync=True)
    except dp.ScheduleError as error:  # blocking send/recv orders may deadlock (test_simulator's case)
        assert mode == "blocking" and "deadlocks under blocking" in str(error)
        return
    _, finish, xfer = evaluate_network(s, duration, transfer, comm, per_node)
    sync, update = reference_sync(s, hw, mode, per_node, data_parallel, link)
    ref_syncs, ref_updates = evaluate_gradient_sync(s, finish, xfer, sync, update, comm)
    syncs, updates = node_finishes(graph, hw)
    assert set(syncs) == set(ref_syncs) == set(range(s.stages))
    assert set(updates) == set(ref_updates)
    for key, (_, end) in ref_syncs.items():
        assert syncs[key] == pytest.approx(end, rel=2e-5, abs=1e-4), ("R", key)
    for key, (_, end) in ref_updates.items():
        assert updates[key] == pytest.approx(end, rel=2e-5, abs=1e-4), ("U", key)
    want = max([*finish.values(), *(e for _, e in xfer.values()), *(e for _, e in ref_syncs.values()),
                *(e for _, e in ref_updates.values())])
    assert float(dp.makespan(graph, hw)) == pytest.approx(want, rel=2e-5)
    result = dp.simulate(s, hw, gradient_sync=True, communication=mode, devices_per_node=per_node)
    assert float(result.makespan) == pytest.approx(want, rel=2e-5)
    np.testing.assert_allclose(np.asarray(result.finish), [finish[op] for op in s.ops], rtol=2e-5, atol=1e-4)
    # Peak memory is that of the plain graph: syncs and updates neither store nor free.
    plain = dp.simulate(s, hw, communication=mode)
    np.testing.assert_allclose(np.asarray(result.peak_memory), np.asarray(plain.peak_memory), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(result.peak_activations), np.asarray(plain.peak_activations))


def hand_hardware(data_parallel=4, gradient_bytes=1.0e9, bandwidth=2.0e9):
    hw = dp.Hardware.from_times(1.0, 2.0)
    net = dp.Network(jnp.asarray(0.0), jnp.asarray(bandwidth), jnp.asarray(0.0), jnp.asarray(bandwidth),
                     data_parallel=data_parallel)
    return eqx.tree_at(lambda h: (h.network, h.gradient_bytes, h.update), hw,
                       (net, jnp.asarray(gradient_bytes), jnp.asarray(0.25)))


def test_hand_computed_1f1b():
    """1F1B, 2 devices x 4 microbatches, F = 1 s, B = 2 s, free transfers; each stage's gradients
    are 1 GB, all-reduced over 4 data-parallel replicas at 2 GB/s: ``2 (4-1)/4 * 1/2 = 0.75 s``;
    an update takes 0.25 s.

    Device 1 runs F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7] F2 [7,8] B2 [8,10] F3 [10,11] B3 [11,13];
    device 0 runs F0 [0,1] F1 [1,2] B0 [4,6] F2 [6,7] B1 [7,9] F3 [9,10] B2 [10,12] B3 [13,15]
    (the plain step: 15 s). Stage 1's sync starts when device 1's B3 ends, at 13, ends at 13.75,
    and its update ends at 14: both overlap device 0's drain (B3 on device 0, 13-15). Stage 0's
    sync runs 15-15.75 and its update 15.75-16: the step takes 16 s.
    """
    s = dp.schedules.get("1f1b", devices=2, microbatches=4)
    hw = hand_hardware()
    graph = dp.compile(s, gradient_sync=True)
    syncs, updates = node_finishes(graph, hw)
    assert syncs == {1: pytest.approx(13.75), 0: pytest.approx(15.75)}
    assert updates == {(0, 1): pytest.approx(14.0), (0, 0): pytest.approx(16.0)}
    assert float(dp.makespan(graph, hw)) == pytest.approx(16.0)
    assert float(dp.makespan(dp.compile(s), hw)) == pytest.approx(15.0)
    result = dp.simulate(s, hw, gradient_sync=True)
    # The updates are compute (0.25 s per device); the syncs are not.
    np.testing.assert_allclose(np.asarray(result.busy), [12.25, 12.25])
    # The intra link (here 10x slower) only matters with data_parallel_link="intra".
    net = hw.network
    slow = eqx.tree_at(lambda h: h.network, hw, dp.Network(
        net.latency, jnp.asarray(2.0e8), net.inter_latency, net.inter_bandwidth, data_parallel=4))
    assert float(dp.makespan(graph, slow)) == pytest.approx(16.0)
    slow = eqx.tree_at(lambda h: h.network, hw, dp.Network(
        net.latency, jnp.asarray(2.0e8), net.inter_latency, net.inter_bandwidth, data_parallel=4,
        data_parallel_link="intra"))
    assert float(dp.makespan(graph, slow)) == pytest.approx(15 + 7.5 + 0.25)


def test_sync_lane_runs_one_sync_at_a_time():
    """Interleaved 1F1B, 2 devices, 2 chunks: device 0 holds stages 0 and 2, whose last backwards
    end close together; with a long sync, stage 0's sync queues behind stage 2's on the lane."""
    s = dp.schedules.get("interleaved-1f1b", devices=2, microbatches=4, chunks=2)
    hw = hand_hardware(gradient_bytes=1.0e10)  # 7.5 s per sync
    graph = dp.compile(s, gradient_sync=True)
    _, finish, xfer = evaluate_network(s, dp.schedules._reference.as_duration_fn(None),
                                       lambda op, dep: 0.0, dp.communication("overlap"))
    last = {st: max(finish[op] for op in s.ops if op.kind == "B" and op.stage == st) for st in range(4)}
    syncs, _ = node_finishes(graph, hw)
    assert last[2] < last[0]
    assert syncs[2] == pytest.approx(last[2] + 7.5)
    assert syncs[0] == pytest.approx(max(last[0], syncs[2]) + 7.5)
    assert syncs[0] > last[0] + 7.5 + 1e-6  # it did wait for the lane


@pytest.mark.parametrize(("family", "mode"), [(f, "overlap") for f in FAMILIES] + [
    ("1f1b", m) for m in MODES if m != "overlap"])
def test_single_replica_without_update_is_the_plain_step(family, mode):
    s = schedule(family)
    hw, *_ = build(s, np.random.default_rng(zlib.crc32(family.encode())), mode, None)
    hw = eqx.tree_at(lambda h: (h.update, h.overhead), hw, (jnp.zeros(()), jnp.zeros(())))
    if s.pipelines > 1 and mode != "none":
        pytest.skip("replicated stages all-reduce among their pipelines even without data parallelism")
    try:
        plain = dp.compile(s, communication=mode)
    except dp.ScheduleError:
        return
    synced = dp.compile(s, communication=mode, gradient_sync=True)
    assert float(dp.makespan(synced, hw)) == pytest.approx(float(dp.makespan(plain, hw)), rel=1e-6)


def test_plain_graph_unchanged_and_sync_adds_one_r_per_stage_and_one_u_per_copy():
    s = schedule("chimera")
    plain, synced = dp.compile(s), dp.compile(s, gradient_sync=True)
    def added(graph):
        kind = np.asarray(graph.kind)
        return kind[(kind >= 0) & (np.asarray(graph.op_index) < 0)]

    assert len(added(plain)) == 0 and np.sum(np.asarray(plain.kind) >= 0) == len(s.ops)
    assert np.sum(added(synced) == KIND_CODES["R"]) == s.stages
    assert np.sum(added(synced) == KIND_CODES["U"]) == s.pipelines * s.stages
    assert len(added(synced)) == s.stages + s.pipelines * s.stages
    # Updates close every device's compute lane; syncs sit on no compute lane.
    lanes = np.asarray(synced.lane_nodes)
    assert len(lanes) == len(plain.lane_nodes) + s.pipelines * s.stages
    assert not np.any(np.asarray(synced.kind)[lanes] == KIND_CODES["R"])


@pytest.mark.parametrize("family", ["chimera", "pipedream", "amdp"])
def test_schedules_with_their_own_sync_are_refused(family):
    options = {"sync": True} if family == "chimera" else {}
    devices, microbatches, _ = SIZES[family]
    try:
        s = dp.schedules.get(family, devices=devices, microbatches=microbatches, **options)
    except dp.ConfigError:
        pytest.skip(f"{family} has no sync option")
    if not {op.kind for op in s.ops} & {"R", "U"}:
        pytest.skip(f"{family} {options} has no R/U ops")
    with pytest.raises(dp.ConfigError, match="already has its own"):
        dp.compile(s, gradient_sync=True)


def test_bad_inputs():
    s = schedule("1f1b")
    with pytest.raises(dp.ConfigError, match="gradient_sync must be True or False"):
        dp.compile(s, gradient_sync="yes")
    with pytest.raises(dp.ConfigError, match="a Graph has its own"):
        dp.simulate(dp.compile(s), dp.Hardware.from_times(1.0, 2.0), gradient_sync=True)
    with pytest.raises(dp.ConfigError, match="data_parallel_link"):
        dp.Network(jnp.asarray(0.0), jnp.asarray(1.0), jnp.asarray(0.0), jnp.asarray(1.0), data_parallel_link="nvlink")


@pytest.mark.parametrize("mode", ["overlap", "contention"])
def test_gradients_match_finite_differences(mode):
    """d makespan / d (gradient_bytes, bandwidth) in float64, where stage 0's sync is critical."""
    with jax.enable_x64(True):
        s = dp.schedules.get("1f1b", devices=2, microbatches=4)
        graph = dp.compile(s, communication=mode, gradient_sync=True)

        def step(grad_bytes, bandwidth):
            hw = dp.Hardware.from_times(jnp.asarray(1.0, jnp.float64), jnp.asarray(2.0, jnp.float64))
            net = dp.Network(jnp.asarray(0.0, jnp.float64), bandwidth, jnp.asarray(1e-3, jnp.float64), bandwidth,
                             data_parallel=4)
            hw = eqx.tree_at(lambda h: (h.network, h.gradient_bytes), hw, (net, grad_bytes))
            return dp.makespan(graph, hw)

        x = (jnp.asarray([1.0e9, 2.0e9], jnp.float64), jnp.asarray(2.0e9, jnp.float64))
        got = jax.grad(step, argnums=(0, 1))(*x)
        # Stage 0's sync ends the step: 0.75 n/(n-1)... = 2(n-1)/n * bytes / bw with n = 4.
        np.testing.assert_allclose(got[0], [1.5 / 2.0e9, 0.0], rtol=1e-6)
        h = 1.0e5
        fd = (step(x[0], x[1] + h) - step(x[0], x[1] - h)) / (2 * h)
        np.testing.assert_allclose(got[1], fd, rtol=1e-5)
        np.testing.assert_allclose(got[1], -1.5 * 1.0e9 / 2.0e9**2, rtol=1e-6)
        e = jnp.asarray([1.0e5, 0.0], jnp.float64)
        fd0 = (step(x[0] + e, x[1]) - step(x[0] - e, x[1])) / (2 * 1.0e5)
        np.testing.assert_allclose(got[0][0], fd0, rtol=1e-5)


def test_trace_and_timeline_take_a_synced_result():
    """The trace shows the schedule's ops (the syncs and updates are not drawn yet); it must not
    break on a result whose makespan includes them."""
    s = dp.schedules.get("1f1b", devices=2, microbatches=4)
    hw = hand_hardware()
    result = dp.simulate(s, hw, gradient_sync=True)
    data = dp.viz.trace(result, hw, schedule=s)
    ops = [e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "transfer"]
    assert len(ops) >= len(s.ops)
    assert data["otherData"]["makespan_us"] == pytest.approx(16.0e6)  # the step; its last drawn op ends at 15 s
    assert float(result.makespan) == pytest.approx(16.0)
