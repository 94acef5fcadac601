"""sweep(): exact per-point results, grouping/stacking/chunking invariance, skipped combinations,
table formats, Pareto front and ranking, grid errors, and sharding over 4 (forced) CPU devices."""

import csv
import io
import json
import os
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffpipe as dp
from diffpipe._sweep import COLUMNS, SweepResult
from diffpipe._sweep.plan import OUT_BYTES, Sizes, bytes_per_graph, bytes_per_point, chunking

FAMILIES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "pipedream"]
MODES = ["overlap", "contention"]
#: (forward, backward, weight, p2p, activation bytes, static bytes, capacity) per variant.
VARIANTS = [(1.0, 2.0, 0.0, 0.1, 1e6, 1e7, 1.3e7), (1.5, 2.5, 0.5, 0.4, 2e6, 1e7, 1e9),
            (0.7, 1.1, 0.3, 1.3, 3e6, 2e7, 2.5e7)]


def hardware():
    return [dp.Hardware.from_times(f, b, w, p2p_time=c, activation_bytes=a, static_bytes=s, capacity=cap)
            for f, b, w, c, a, s, cap in VARIANTS]


def grid(**changes):
    kwargs = dict(families=FAMILIES, devices=2, microbatches=2, placements=["v"],
                  options={"interleaved-1f1b": {"chunks": [2, 0]}}, communication=MODES)
    kwargs.update(changes)
    return kwargs


@pytest.fixture(scope="module")
def result():
    return dp.sweep(hardware(), **grid())


def schedule_of(row):
    if row["family"] == "list":
        opts = row["options"]
        return dp.schedules.list_schedule(dp.schedules.Placement.v(row["devices"]), row["microbatches"],
                                          priority=opts["priority"])
    return dp.schedules.get(row["family"], devices=row["devices"], microbatches=row["microbatches"], **row["options"])


def test_every_point_equals_makespan_and_peak_memory(result):
    rows = result.rows()
    assert len(rows) == len(result) > 0
    for mode in MODES:
        mine = [r for r in rows if r["communication"] == mode]
        keys = [(r["family"], tuple(sorted(r["options"].items())), r["microbatches"]) for r in mine]
        entries = list(dict.fromkeys(keys))
        graphs = []
        for family, options, n in entries:
            row = next(r for r in mine if (r["family"], tuple(sorted(r["options"].items())), r["microbatches"])
                       == (family, options, n))
            graphs.append(dp.compile(schedule_of(row), communication=mode))

        @jax.jit
        def reference(graph, hw):
            return dp.makespan(graph, hw), jnp.max(dp.peak_memory(graph, hw)[0])

        stacked = dp.stack_graphs(graphs)  # padding never changes a result (test_simulator)
        for h, hw in enumerate(hardware()):
            want_time, want_memory = jax.vmap(reference, in_axes=(0, None))(stacked, hw)
            for e, (family, options, n) in enumerate(entries):
                (row,) = [r for r in mine if r["hardware"] == h and r["family"] == family and r["microbatches"] == n
                          and tuple(sorted(r["options"].items())) == options]
                assert row["makespan"] == float(want_time[e]), (family, n, mode, h)
                assert row["peak_memory"] == float(want_memory[e]), (family, n, mode, h)


@pytest.mark.parametrize(("family", "mode"), [("1f1b", "overlap"), ("zb-v", "contention")])
def test_points_equal_simulate(result, family, mode):
    rows = result.filter(family=family, communication=mode).rows()
    assert len(rows) == len(VARIANTS)
    for row in rows:
        sim = dp.simulate(schedule_of(row), hardware()[row["hardware"]], communication=mode)
        assert row["makespan"] == float(sim.makespan)
        assert row["peak_memory"] == float(jnp.max(sim.peak_memory))
        assert row["fits"] == bool(jnp.all(sim.fits))
        assert row["bubble_ratio"] == pytest.approx(float(sim.bubble_ratio), rel=1e-6, abs=1e-7)
        assert row["throughput"] == pytest.approx(row["microbatches"] / row["makespan"], rel=1e-6)
        assert row["stages"] == schedule_of(row).stages


def test_fits_and_memory_vary_across_hardware(result):
    assert result["fits"].any() and not result["fits"].all()
    assert set(result["hardware"].tolist()) == {0, 1, 2}
    assert set(result["communication"].tolist()) == set(MODES)


def small_chunks():
    """Sweep arguments for 1f1b and zb-v: one compiled function per structure, and chunks of two
    hardware variants for zb-v (its last chunk padded). Shared by tests to share compilations."""
    sizes = Sizes.of(dp.compile(dp.schedules.get("zb-v", devices=2, microbatches=2)))
    max_bytes = bytes_per_graph(sizes) + 2 * bytes_per_point(sizes)
    kwargs = grid(families=["1f1b", "zb-v"], placements=(), options=None, communication="overlap")
    return dict(kwargs, stacking="never", max_bytes=max_bytes)


def test_grouping_stacking_and_chunking_do_not_change_results(result):
    small = dp.sweep(hardware(), **small_chunks())
    assert small.compiled == 2
    assert 0 < small.chunk_bytes <= small.max_bytes
    want = result.filter(communication="overlap")
    for family in ("1f1b", "zb-v"):
        a, b = small.filter(family=family), want.filter(family=family)
        for column in ("makespan", "peak_memory", "fits", "throughput", "hardware"):
            np.testing.assert_array_equal(a[column], b[column])
        # the busy-time sum runs over the padded rows: the same terms, possibly another order
        np.testing.assert_allclose(a["bubble_ratio"], b["bubble_ratio"], rtol=1e-6, atol=1e-7)


def test_hardware_forms_agree():
    by_list = dp.sweep(hardware(), **small_chunks())
    batched = jax.tree.map(lambda *xs: jnp.stack(xs), *hardware())
    by_batch = dp.sweep(batched, **small_chunks())

    def per_schedule(schedule):  # per-stage arrays sized to the schedule
        return [dp.Hardware.from_times(jnp.full(schedule.stages, f), jnp.full(schedule.stages, b), w, p2p_time=c,
                                       activation_bytes=a, static_bytes=s, capacity=cap)
                for f, b, w, c, a, s, cap in VARIANTS]

    by_function = dp.sweep(per_schedule, **small_chunks())
    for other in (by_batch, by_function):
        for column in ("makespan", "peak_memory", "fits"):
            np.testing.assert_array_equal(other[column], by_list[column])


def test_skipped_combinations_are_reported_not_fatal(result):
    skipped = [s for s in result.skipped if s["family"] == "interleaved-1f1b"]
    assert len(skipped) == 1
    assert skipped[0]["options"] == "chunks=0" and "chunks must be" in skipped[0]["reason"]
    assert len(result.filter(family="interleaved-1f1b")) == len(MODES) * len(VARIANTS)
    assert "interleaved-1f1b" in result.to_markdown().split("Skipped:")[1]


def test_hardware_that_does_not_fit_a_schedule_is_skipped():
    hw = [dp.Hardware.from_times(jnp.full(2, f), b, w, p2p_time=c, activation_bytes=a, static_bytes=s, capacity=cap)
          for f, b, w, c, a, s, cap in VARIANTS]  # two stages: fits 1f1b on 2 devices, not on 3
    out = dp.sweep(hw, **dict(small_chunks(), families="1f1b", devices=[2, 3]))
    assert out["devices"].tolist() == [2, 2, 2]
    assert len(out.skipped) == 1 and "forward has shape" in out.skipped[0]["reason"]


def test_csv_json_markdown_are_well_formed(result, tmp_path):
    text = result.to_csv(tmp_path / "sweep.csv")
    assert (tmp_path / "sweep.csv").read_text() == text
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == list(COLUMNS)
    assert len(rows) == len(result) + 1 and all(len(r) == len(COLUMNS) for r in rows)
    assert [float(r[COLUMNS.index("makespan")]) for r in rows[1:]] == result["makespan"].tolist()

    doc = json.loads(result.to_json(tmp_path / "sweep.json"))
    assert json.loads((tmp_path / "sweep.json").read_text()) == doc
    assert len(doc["points"]) == len(result) and doc["columns"] == list(COLUMNS)
    assert doc["points"][0]["options"] == {} and isinstance(doc["points"][0]["fits"], bool)
    assert doc["skipped"] and doc["chunk_bytes"] <= doc["max_bytes"]

    md = result.to_markdown(limit=5).splitlines()
    assert md[0].startswith("| family | options |") and set(md[1]) <= set("|-")
    assert all(line.count("|") == len(COLUMNS) + 1 for line in md[:7])
    assert any("more rows" in line for line in md)


def hand_table(points):
    """A SweepResult over (hardware, makespan, peak memory, fits) tuples, 4 microbatches each."""
    n = len(points)
    hw, time, memory, fits = (np.asarray(x) for x in zip(*points))
    columns = {
        "family": np.asarray([f"s{i}" for i in range(n)], dtype=object), "options": np.asarray([""] * n, dtype=object),
        "devices": np.full(n, 4), "microbatches": np.full(n, 4), "stages": np.full(n, 4),
        "communication": np.asarray(["overlap"] * n, dtype=object), "hardware": hw.astype(np.int32),
        "makespan": time.astype(np.float32), "throughput": (4 / time).astype(np.float32),
        "bubble_ratio": np.zeros(n, np.float32), "peak_memory": memory.astype(np.float32), "fits": fits.astype(bool),
    }
    return SweepResult(columns)


def test_pareto_front_and_best_on_a_hand_example():
    table = hand_table([
        (0, 10.0, 5.0, True),  # s0 front
        (0, 8.0, 7.0, True),   # s1 front
        (0, 9.0, 7.0, True),   # s2 dominated by s1
        (0, 12.0, 4.0, False),  # s3 front (least memory)
        (0, 10.0, 6.0, True),  # s4 dominated by s0
        (0, 8.0, 7.0, True),   # s5 equal to s1: not dominated
        (1, 20.0, 9.0, True),  # s6 front on hardware 1
        (1, 30.0, 1.0, True),  # s7 front on hardware 1
    ])
    front = table.pareto()
    assert front["family"].tolist() == ["s1", "s5", "s0", "s3", "s6", "s7"]
    assert table.pareto(metric="makespan")["family"].tolist() == front["family"].tolist()
    overall = table.pareto(per_hardware=False)["family"].tolist()
    assert overall == ["s1", "s5", "s0", "s3", "s7"]

    best = table.best()
    assert best["family"].tolist() == ["s1", "s6"] and best["rank"].tolist() == [1, 1]
    top = table.best(3)
    assert top["family"].tolist() == ["s1", "s5", "s2", "s6", "s7"] and top["rank"].tolist() == [1, 2, 3, 1, 2]
    assert table.best(fits_only=False, metric="makespan")["family"].tolist() == ["s1", "s6"]
    assert "| rank |" in top.to_markdown()
    assert list(csv.reader(io.StringIO(top.to_csv())))[0][-1] == "rank"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(families=[]), "empty"),
        (dict(families="1f1b", devices=[]), "empty"),
        (dict(families="1f1b", microbatches=()), "empty"),
        (dict(families="1f1b", options={"chunks": []}), "neither|empty"),
        (dict(families="1f1b", options={"waves": [1, 2]}), "waves"),
        (dict(families="hanayo", options={"hanayo": {"chunks": 2}}), "chunks"),
        (dict(families="nope"), "nope"),
        (dict(families="interleaved-1f1b", devices=4, microbatches=9), "no combination"),
        (dict(families="1f1b", communication="fast"), "fast"),
        (dict(families="1f1b", placements=["spiral"]), "spiral"),
        (dict(families="1f1b", stacking="sometimes"), "stacking"),
        (dict(families="1f1b", max_bytes=100), "max_bytes"),
    ],
)
def test_empty_or_contradictory_grids_raise(kwargs, match):
    with pytest.raises(dp.ConfigError, match=match) as info:
        dp.sweep(dp.Hardware.from_times(1.0, 2.0), **kwargs)
    assert "\n" not in str(info.value)


def test_bad_hardware_raises():
    with pytest.raises(dp.ConfigError, match="hardware"):
        dp.sweep(None, families="1f1b")
    with pytest.raises(dp.ConfigError, match="empty"):
        dp.sweep([], families="1f1b")


@pytest.mark.parametrize("devices", [1, 4, 8])
@pytest.mark.parametrize(("graphs", "hardware_count"), [(1, 1), (3, 2), (50, 1000), (1, 10**6)])
def test_chunk_plan_respects_the_bound(devices, graphs, hardware_count):
    per_point, per_graph, bound = 3_000, 20_000, 4 * 2**20
    plan = chunking(graphs, hardware_count, per_point, per_graph, devices, bound)
    assert plan.bytes <= bound
    sharded = plan.hardware if plan.axis == 1 else plan.graphs
    assert sharded % devices == 0 and plan.graphs >= 1 and plan.hardware >= 1
    # a device evaluates its graphs one after the other, each on all of its hardware variants
    local_hardware = plan.hardware // devices if plan.axis == 1 else plan.hardware
    local_graphs = plan.graphs // devices if plan.axis == 0 else plan.graphs
    assert local_graphs * (per_graph + local_hardware * OUT_BYTES) + local_hardware * per_point <= bound


SHARDED = textwrap.dedent(
    """
    import json, sys
    import jax
    import numpy as np
    import diffpipe as dp
    from diffpipe._sweep import evaluate
    sys.path.insert(0, sys.argv[1])
    from test_sweep import hardware, grid

    seen = []
    fetch = evaluate._fetch

    def spy(x):
        seen.append((str(x.sharding.spec), sorted(s.device.id for s in x.addressable_shards),
                     [tuple(s.data.shape) for s in x.addressable_shards], tuple(x.shape)))
        return fetch(x)

    evaluate._fetch = spy
    kwargs = grid(families=["1f1b", "zb-v"], placements=(), options=None, communication="overlap")
    by_graph = dp.sweep(hardware(), **kwargs)  # 3 variants < 4 devices: the graph axis is split
    print(json.dumps({
        "devices": len(jax.devices()), "used": by_graph.devices_used, "makespan": by_graph["makespan"].tolist(),
        "memory": by_graph["peak_memory"].tolist(), "spy": seen,
    }))
    """
)


@pytest.mark.slow
def test_sharded_over_four_cpu_devices_in_a_subprocess(result):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", SHARDED, os.path.dirname(__file__)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4 and out["used"] == 4

    want = result.filter(communication="overlap")
    want = want.where(np.isin(want["family"], ["1f1b", "zb-v"]))
    assert out["makespan"] == want["makespan"].tolist()  # identical to one device
    assert out["memory"] == want["peak_memory"].tolist()
    # The work was split: every output has one shard on each of the 4 devices, a quarter each
    # (3 hardware variants < 4 devices: the graph axis, padded to 4, is the one split).
    assert out["spy"]
    for spec, device_ids, shard_shapes, shape in out["spy"]:
        assert device_ids == [0, 1, 2, 3] and "points" in spec
        assert all(s[0] * 4 == shape[0] for s in shard_shapes)


MULTIHOST = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(sys.argv[2], 2, int(sys.argv[3]))
    import diffpipe as dp
    sys.path.insert(0, sys.argv[1])
    from test_sweep import hardware, grid

    kwargs = grid(families=["1f1b", "zb-v"], placements=(), options=None, communication="overlap")
    hw = hardware()
    out = dp.sweep(hw + hw + hw[:2], **kwargs)
    print(json.dumps({"devices": len(jax.devices()), "local": len(jax.local_devices()), "used": out.devices_used,
                      "makespan": out["makespan"].tolist(), "memory": out["peak_memory"].tolist()}))
    """
)


@pytest.mark.slow
def test_multihost_two_processes_of_two_cpu_devices(result):
    """jax.distributed with 2 processes (2 forced CPU devices each, gloo): 8 hardware variants split
    over the 4 devices; every process gets the whole table, identical to one process."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, "-c", MULTIHOST, os.path.dirname(__file__), f"localhost:{port}",
                               str(pid)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for pid in (0, 1)]
    outputs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=240)
            assert p.returncode == 0, stderr[-3000:]
            outputs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    want = result.filter(communication="overlap")
    want = want.where(np.isin(want["family"], ["1f1b", "zb-v"]))
    for out in outputs:
        assert (out["devices"], out["local"], out["used"]) == (4, 2, 4)
        got = np.asarray(out["makespan"]).reshape(2, 8)
        memory = np.asarray(out["memory"]).reshape(2, 8)
        for h in range(8):
            np.testing.assert_array_equal(got[:, h], want["makespan"].reshape(2, 3)[:, h % 3])
            np.testing.assert_array_equal(memory[:, h], want["peak_memory"].reshape(2, 3)[:, h % 3])


def test_a_second_identical_sweep_hits_the_caches_and_returns_identical_results():
    from diffpipe._sweep import evaluate, graph_of, grid

    kwargs = small_chunks()
    first = dp.sweep(hardware(), **kwargs)
    graphs, schedules = graph_of.cache_info(), grid._cached_build.cache_info()
    stacks = [id(s) for s in evaluate._STACKS.values()]
    compiled = {key: fn._cached._cache_size() for key, fn in evaluate._EVALUATORS.items()}
    second = dp.sweep(hardware(), **kwargs)
    assert graph_of.cache_info().hits >= graphs.hits + 2 and graph_of.cache_info().misses == graphs.misses
    assert grid._cached_build.cache_info().hits >= schedules.hits + 2
    assert grid._cached_build.cache_info().misses == schedules.misses
    assert sorted(id(s) for s in evaluate._STACKS.values()) == sorted(stacks)  # reused (on the device), not rebuilt
    assert {key: fn._cached._cache_size() for key, fn in evaluate._EVALUATORS.items()} == compiled  # no recompiles
    for column in (*COLUMNS, "_entry"):
        np.testing.assert_array_equal(second[column], first[column])
    assert second.skipped == first.skipped


def test_optional_hardware_terms_are_carried_not_dropped():
    """Every Hardware term reaches the sweep's evaluator: the data-parallel link, per-kind overheads,
    a full-backward time, setup and wind-down (a sweep used to rebuild Hardware field by field)."""
    base = dp.Hardware.from_times([1.0, 1.2, 0.9, 1.1], [2.0, 2.1, 1.9, 2.2], weight=0.5, p2p_time=0.05,
                                  kind_overhead={"F": 0.01, "B": 0.03, "I": 0.02, "W": 0.04},
                                  full_backward=[2.3, 2.5, 2.2, 2.6], setup=0.2, wind_down=0.1)
    hw = eqx.tree_at(lambda h: h.network, base, dp.Network(
        base.network.latency, jnp.asarray(1e9), base.network.inter_latency, jnp.asarray(1e8),
        data_parallel=4, data_parallel_link="intra"))
    hw = eqx.tree_at(lambda h: h.gradient_bytes, hw, jnp.asarray(3e8))
    chimera = dp.schedules.get("chimera", devices=4, microbatches=8, sync=True)  # R ops: the data-parallel link
    out = dp.sweep(hw, families=["1f1b", "zb-h1"], devices=4, microbatches=8, schedules=[chimera])
    rows = out.rows()
    assert {r["family"] for r in rows} == {"1f1b", "zb-h1", "chimera"}
    for row in rows:
        schedule = chimera if row["family"] == "chimera" else dp.schedules.get(row["family"], devices=4,
                                                                                 microbatches=8)
        want = dp.simulate(schedule, hw)
        assert row["makespan"] == pytest.approx(float(want.makespan), rel=1e-6)
        assert row["bubble_ratio"] == pytest.approx(float(want.bubble_ratio), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("mode", ["overlap", "contention"])
def test_the_sweep_compiles_for_the_devices_per_node_it_is_given(mode):
    """The topology is the graph's: ``sweep(devices_per_node=2)`` prices the stage pair that crosses
    nodes over the (slower) inter link, as ``simulate`` of the same topology does, and one node
    (the default) over the intra link."""
    base = dp.Hardware.from_times([1.0, 1.2, 0.9, 1.1], [2.0, 2.1, 1.9, 2.2], p2p_time=0.05)
    hw = eqx.tree_at(lambda h: (h.network, h.message_bytes), base, (dp.Network(
        base.network.latency, jnp.asarray(1e9), jnp.asarray(0.2), jnp.asarray(1e8)), jnp.asarray(5e7)))
    schedule = dp.schedules.get("1f1b", devices=4, microbatches=8)
    steps = {}
    for per_node in (None, 2):
        (row,) = dp.sweep(hw, families=["1f1b"], devices=4, microbatches=8, communication=mode,
                          devices_per_node=per_node).rows()
        want = dp.simulate(schedule, hw, communication=mode, devices_per_node=per_node)
        assert row["makespan"] == pytest.approx(float(want.makespan), rel=1e-6)
        steps[per_node] = row["makespan"]
    assert steps[2] > steps[None]
