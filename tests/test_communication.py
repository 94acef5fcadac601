"""Communication modes as objects: the built-ins, the string edge, and modes defined outside diffpipe."""

import zlib

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import diffpipe as dp
from diffpipe._engine._communication import Rendezvous, node_size, topology
from diffpipe._engine._graph import COST_T
from diffpipe.schedules._reference import evaluate_network

# -- two modes defined outside the package: one class each, no edit to diffpipe ---------------


class HalfDuplex(dp.AbstractLaneCommunication):
    """Each device pair shares one half-duplex link: its transfers, in either direction, run one
    at a time in issue order (contention has one lane per direction)."""

    name = "half-duplex"

    def lane(self, src, dst, devices_per_node):
        return frozenset((src, dst))


class Delayed(dp.AbstractCommunication):
    """``overlap`` plus a fixed software latency ``extra`` on every link (a parametrised mode)."""

    extra: float
    name = "delayed"

    def links(self, latency, bandwidth):
        return latency + self.extra, bandwidth

    def cost(self, seconds):
        return seconds + self.extra


CASES = [("1f1b", 4, 6, {}), ("zb-h1", 3, 4, {}), ("interleaved-1f1b", 2, 4, {"chunks": 2}), ("chimera", 4, 4, {})]
LAT, BW = 0.05, 2.0


def machine(s, seed):
    """Random per-stage hardware on uniform links, and the reference's duration/transfer functions
    (the mode is the graph's: each test compiles or simulates under its own)."""
    rng = np.random.default_rng(seed)
    P, S, M = s.pipelines, s.stages, s.microbatches
    f, b, w, msg = (rng.uniform(0.5, 2.0, (P, S)) for _ in range(4))
    size = rng.uniform(0.5, 1.5, M)
    hw = dp.Hardware(
        forward=jnp.asarray(f, jnp.float32), input_grad=jnp.asarray(b, jnp.float32),
        weight=jnp.asarray(w, jnp.float32), update=jnp.zeros(()), overhead=jnp.zeros(()),
        size=jnp.asarray(size, jnp.float32), message_bytes=jnp.asarray(msg, jnp.float32),
        gradient_bytes=jnp.zeros(()), static_bytes=jnp.zeros(()), activation_bytes=jnp.zeros(()),
        capacity=jnp.asarray(np.inf), network=dp.Network.uniform(LAT, BW),
    )
    times = {"F": f, "I": b, "W": w, "B": b + w}

    def duration(op):
        return float(size[op.microbatch] * times[op.kind][op.pipeline, op.stage]) if op.kind in times else 0.0

    def transfer(op, dep):
        return LAT + size[op.microbatch] * msg[op.pipeline, dep.boundary] / BW

    return hw, duration, transfer


def schedule(name, devices, microbatches, options):
    return dp.schedules.get(name, devices=devices, microbatches=microbatches, **options)


@pytest.mark.parametrize("mode", [HalfDuplex(), Delayed(0.3)], ids=["half-duplex", "delayed"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_outside_mode_simulates_like_its_reference(case, mode):
    s = schedule(*case)
    hw, duration, transfer = machine(s, zlib.crc32(f"{case[0]}/{mode}".encode()))
    result = dp.simulate(s, hw, communication=mode)
    start, finish, _ = evaluate_network(s, duration, transfer, mode)
    np.testing.assert_allclose(np.asarray(result.finish), [finish[op] for op in s.ops], rtol=2e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(result.start), [start[op] for op in s.ops], rtol=2e-5, atol=1e-4)
    assert dp.compile(s, communication=mode).communication == mode


def with_network(hw, network):
    return eqx.tree_at(lambda h: h.network, hw, network)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_half_duplex_only_adds_waits_to_contention(case):
    # Each half-duplex lane merges the two directed lanes of a pair: more waits, never earlier.
    s = schedule(*case)
    hw, *_ = machine(s, 7)
    contention = dp.simulate(s, hw, communication="contention")
    half = dp.simulate(s, hw, communication=HalfDuplex())
    assert np.all(np.asarray(half.finish) >= np.asarray(contention.finish) - 1e-5)


def test_half_duplex_is_slower_when_both_directions_share_a_link():
    s = schedule("1f1b", 2, 4, {})  # activations 0 -> 1 and gradients 1 -> 0 on one pair
    hw, *_ = machine(s, 3)
    contention = dp.simulate(s, with_network(hw, dp.Network.uniform(0.0, 0.05)), communication="contention")
    half = dp.simulate(s, with_network(hw, dp.Network.uniform(0.0, 0.05)), communication=HalfDuplex())
    assert float(half.makespan) > float(contention.makespan) + 1e-3


def test_strings_map_to_objects_in_one_place():
    for name, cls in [("none", dp.NoCommunication), ("overlap", dp.Overlap), ("contention", dp.Contention),
                      ("blocking", dp.Blocking), ("rendezvous", Rendezvous)]:
        mode = dp.communication(name)
        assert type(mode) is cls and mode == name and str(mode) == name and mode == cls()
        assert hash(mode) == hash(cls()) and dp.communication(mode) is mode
        graph = dp.Hardware.from_times(1.0, 2.0).compile_schedule(schedule("gpipe", 2, 2, {}), communication=name)
        assert graph.communication == cls()
        assert dp.compile(schedule("gpipe", 2, 2, {}), communication=name).communication == cls()
    assert dp.Overlap() != dp.Contention() and Delayed(0.1) != Delayed(0.2) and Delayed(0.1) == Delayed(0.1)
    with pytest.raises(dp.ConfigError, match="communication 'fast' is not one of"):
        dp.communication("fast")
    with pytest.raises(dp.ConfigError, match="communication 'fast'"):
        dp.compile(schedule("gpipe", 2, 2, {}), communication="fast")
    with pytest.raises(TypeError):
        dp.AbstractLaneCommunication()  # abstract: no lane
    with pytest.raises(AttributeError):
        dp.Overlap().name = "other"


def test_a_moved_argument_is_a_config_error_any_other_unknown_one_a_type_error():
    with pytest.raises(dp.ConfigError, match=r"^Network: mode= moved to compile\(communication=\.\.\.\)"):
        dp.Network(0.0, 1.0, 0.0, 1.0, mode="contention")
    with pytest.raises(TypeError, match="unexpected keyword argument 'latencies'"):
        dp.Network(0.0, 1.0, 0.0, 1.0, latencies=1.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'p2p'"):
        dp.Hardware.from_times(1.0, 2.0, p2p=1.0)
    # the written-out __init__ keeps every field, positional order and default of the dataclass one
    net = dp.Network(1.0, 2.0, 3.0, 4.0, None, None, 3, "intra")
    assert (net.data_parallel, net.data_parallel_link, net.replicas) == (3, "intra", None)
    assert dp.Network(1.0, 2.0, 3.0, 4.0).data_parallel == 1


def test_devices_per_node_moved_to_the_graph_is_one_config_error_line():
    """The topology left ``Network`` (and ``presets.network``): giving it there says where it went."""
    moved = r"devices_per_node= moved to compile\(devices_per_node=\.\.\.\)"
    for call, what in [(lambda: dp.Network(0.0, 1.0, 0.0, 1.0, devices_per_node=8), "Network"),
                       (lambda: dp.Network.uniform(0.0, 1.0, devices_per_node=8), "Network.uniform"),
                       (lambda: dp.presets.network("nvlink4", "ib-ndr", devices_per_node=4), "presets.network")]:
        with pytest.raises(dp.ConfigError, match=rf"^{what}: {moved}") as error:
            call()
        assert "\n" not in str(error.value)
    assert not hasattr(dp.Network(0.0, 1.0, 0.0, 1.0), "devices_per_node")


def test_one_hardware_prices_each_graph_under_the_graph_s_mode():
    """The graph owns the mode (``Network`` has none): one hardware, graphs compiled under different
    modes, each priced as its mode charges a transfer."""
    s = schedule("1f1b", 4, 4, {})
    hw = dp.Hardware.from_times(1.0, 2.0, p2p_time=0.5)
    assert not hasattr(hw.network, "mode") and not hasattr(hw.network, "devices_per_node")
    steps = {str(mode): float(dp.makespan(dp.compile(s, communication=mode), hw))
             for mode in ("none", "overlap", Delayed(0.5), "contention", HalfDuplex())}
    assert steps["none"] < steps["overlap"] < steps["delayed"]  # free transfers, 0.5 s, 0.5 + 0.5 s
    for mode in ("none", "overlap", "contention"):
        assert float(dp.simulate(s, hw, communication=mode).makespan) == pytest.approx(steps[mode])
    assert steps["half-duplex"] >= steps["contention"] - 1e-6


def test_blocking_busy_weight_counts_both_ends():
    s = schedule("1f1b", 2, 2, {})
    hw = dp.Hardware.from_times(1.0, 2.0, p2p_time=0.5)
    r = dp.simulate(s, hw, communication="blocking")
    transfers = sum(1 for op in s.ops for dep in s.dependencies[op] if dep.is_transfer)
    compute = float(np.sum(np.asarray(r.finish) - np.asarray(r.start)))
    busy = compute + dp.Blocking.busy_weight * 0.5 * transfers
    assert float(r.bubble_ratio) == pytest.approx(1 - busy / (s.devices * float(r.makespan)), rel=1e-5)


def test_topology_rule_one_node_by_default():
    assert node_size(None, 8) == 8 and node_size(2, 8) == 2
    assert topology(None, 8) is None and topology(8, 8) is None and topology(16, 8) is None and topology(4, 8) == 4
    s = schedule("1f1b", 4, 4, {})
    graph = dp.compile(s, communication="contention")  # default: one node
    assert graph.devices_per_node == 4 and dp.compile(s, devices_per_node=8).devices_per_node == 8
    hw = with_network(dp.Hardware.from_times(1.0, 2.0), dp.Network(*(jnp.asarray(x) for x in (0.1, 1.0, 0.1, 1.0))))
    want = dp.simulate(s, hw, communication="contention").makespan
    assert float(dp.makespan(graph, hw)) == pytest.approx(float(want))


@pytest.mark.parametrize("mode", ["overlap", "contention"])
def test_the_graph_s_devices_per_node_decides_which_links_are_inter_node(mode):
    """The topology is the graph's alone: one hardware (intra latency 0.1 s, inter 1.0 s) prices
    every transfer of a graph compiled for 2 devices per node over the inter link exactly when its
    ends sit on different nodes, and every transfer of a one-node graph over the intra link."""
    s = schedule("1f1b", 4, 4, {})
    hw = with_network(dp.Hardware.from_times(1.0, 2.0),
                      dp.Network(*(jnp.asarray(x) for x in (0.1, np.inf, 1.0, np.inf))))
    for per_node in (None, 2, 1):
        graph = dp.compile(s, communication=mode, devices_per_node=per_node)
        tables = hw.tables(graph)
        node = node_size(per_node, s.devices)
        if mode == "overlap":  # transfers are edges: their cost rows (src, dst, pipeline, boundary)
            src, dst = (np.asarray(graph.edge_cost[:, i]) for i in (0, 1))
            base = np.asarray(tables.edge_base)
        else:  # transfers are nodes: rows of kind T carry (src, dst)
            rows = np.asarray(graph.node_cost)
            keep = rows[:, 0] == COST_T
            src, dst, base = rows[keep, 3], rows[keep, 4], np.asarray(tables.base)[keep]
        cross = src != dst
        assert cross.any()
        want = np.where(src // node == dst // node, 0.1, 1.0)
        np.testing.assert_allclose(base[cross], want[cross], rtol=1e-6)
        if per_node == 2:
            assert np.any(want[cross] == 1.0) and np.any(want[cross] == 0.1)
    one, two = (dp.simulate(s, hw, communication=mode, devices_per_node=n) for n in (None, 2))
    assert two.devices_per_node == 2 and one.devices_per_node == 4
    assert float(two.makespan) > float(one.makespan)
    graph = dp.compile(s, communication=mode, devices_per_node=2)
    assert float(dp.simulate(graph, hw).makespan) == float(two.makespan)
    with pytest.raises(dp.ConfigError, match=r"^simulate: devices_per_node=1 applies to a Schedule; this graph "
                                             r"was compiled for 2$"):
        dp.simulate(graph, hw, devices_per_node=1)


# -- rendezvous: sender and receiver meet --------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rendezvous_simulates_like_its_reference(case):
    s = schedule(*case)
    mode = dp.communication("rendezvous")
    hw, duration, transfer = machine(s, zlib.crc32(f"{case[0]}/rendezvous".encode()))
    result = dp.simulate(s, hw, communication=mode)
    start, finish, xfer = evaluate_network(s, duration, transfer, mode)
    np.testing.assert_allclose(np.asarray(result.finish), [finish[op] for op in s.ops], rtol=2e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(result.start), [start[op] for op in s.ops], rtol=2e-5, atol=1e-4)
    assert float(result.makespan) == pytest.approx(max([*finish.values(), *(e for _, e in xfer.values())]),
                                                   rel=2e-5)
    # A transfer never starts before the receiver reached its receive, nor earlier than under overlap.
    overlap = dp.simulate(s, hw, communication="overlap")
    assert np.all(np.asarray(result.start) >= np.asarray(overlap.start) - 1e-5)


def test_rendezvous_hand_computed():
    """1F1B, 2 devices x 2 microbatches, F = 1, B = 2, every transfer 0.5 s.

    Device 0: F0 [0, 1], F1 [1, 2]; its activation for device 1's F1 waits until device 1 has
    finished B0 (at 4.5): it moves 4.5-5, and device 1's F1 runs 5-6 (under overlap the activation
    arrives at 2.5 and F1 runs 4.5-5.5). Device 1's B1 6-8; its gradient moves 8-8.5 and device
    0's B1 runs 8.5-10.5: the step takes 10.5 s (overlap: 10 s).
    """
    s = schedule("1f1b", 2, 2, {})
    hw = dp.Hardware.from_times(1.0, 2.0, p2p_time=0.5)
    r = dp.simulate(s, hw, communication="rendezvous")
    assert r.time_of(dp.schedules.Op("F", 1, 1)) == pytest.approx((5.0, 6.0))
    assert r.time_of(dp.schedules.Op("B", 0, 1)) == pytest.approx((8.5, 10.5))
    assert float(r.makespan) == pytest.approx(10.5)
    assert float(dp.simulate(s, dp.Hardware.from_times(1.0, 2.0, p2p_time=0.5)).makespan) == pytest.approx(10.0)


def test_rendezvous_never_deadlocks_where_blocking_does():
    deadlocked = []
    for name in ("1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v", "gpipe", "looped-bfs"):
        s = dp.schedules.get(name, devices=4, microbatches=8)
        try:
            dp.compile(s, communication="blocking")
        except dp.ScheduleError:
            deadlocked.append(name)
        graph = dp.compile(s, communication="rendezvous")
        hw = dp.Hardware.from_times(1.0, 2.0, p2p_time=0.1)
        assert float(dp.makespan(graph, hw)) > 0
    assert deadlocked  # the motivating case: blocking deadlocks on some 4-stage schedules
