"""viz: Gantt charts (PNG/SVG written whole or not at all) and Chrome traces (tracks, flows, units)."""

import json
import os
from collections import Counter

import jax.numpy as jnp
import numpy as np
import pytest

import diffpipe as dp
from diffpipe._compare import Machine, default_machine
from diffpipe.viz import gantt, trace
from diffpipe.viz._timeline import timeline, write_atomic

D, N = 4, 4


@pytest.fixture(scope="module")
def one_f_one_b():
    return dp.schedules.get("1f1b", devices=D, microbatches=N)


@pytest.fixture(scope="module")
def ethernet():
    """A GPT on H100s, uniform stages, each GPU's sends one contended lane at 12.5 GB/s (the
    structure of papers/tabular-abstraction, so compiled simulators are shared)."""
    base = default_machine()
    lat, bw = jnp.asarray(1e-5), jnp.asarray(12.5e9)
    network = dp.Network(lat, bw, lat, bw)
    return Machine(base.model, base.device, network, uniform_stages=True, communication="contention",
                   devices_per_node=1)


@pytest.fixture(scope="module")
def contended(ethernet, one_f_one_b):
    return ethernet(one_f_one_b)


@pytest.fixture(scope="module")
def chimera_sync(ethernet):
    """Chimera with its stage all-reduces (collectives on two devices), simulated under contention."""
    s = dp.schedules.get("chimera", devices=D, microbatches=N, sync=True)
    hw = ethernet(s)
    return s, hw, dp.simulate(s, hw, communication="contention", devices_per_node=1)


def transfer_time(hw):
    return float(hw.network.latency + hw.message_bytes[1] / hw.network.bandwidth)


def files(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir())


# -- Gantt ----------------------------------------------------------------------------------------------
def test_gantt_writes_png_and_svg(tmp_path, one_f_one_b, contended):
    written = gantt(one_f_one_b, contended, communication="contention", devices_per_node=1,
                    path=[tmp_path / "g.png", tmp_path / "g.svg"])
    assert [p.name for p in written] == ["g.png", "g.svg"]
    png, svg = (tmp_path / "g.png").read_bytes(), (tmp_path / "g.svg").read_text()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "<svg" in svg and "d3" in svg and len(svg) > 10_000
    assert files(tmp_path) == ["g.png", "g.svg"]  # no temporary left behind
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "g.png").stat().st_mode & 0o777 == 0o666 & ~mask  # an ordinary file's mode


def test_gantt_of_a_result_with_link_lanes(tmp_path, chimera_sync):
    s, hw, result = chimera_sync
    fig = gantt(result, hw, schedule=s, title="chimera", communication="contention")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[:D] == [f"d{d}" for d in range(D)] and labels[D:] == [f"egress d{d}" for d in range(D)]
    assert ax.get_title(loc="left") == "chimera"
    assert len(fig.axes) >= 2 and fig.axes[1].get_ylabel() == "memory (GB)"
    gantt(result, schedule=s, path=tmp_path / "r.svg", memory=False, arrows=False)  # no hardware: no lanes
    assert (tmp_path / "r.svg").stat().st_size > 0


@pytest.mark.parametrize(
    "path, message",
    [("chart.pdf", "suffix must be one of .png, .svg"), ("missing/chart.png", "directory .* does not exist"),
     (3, "path must be a string")],
)
def test_gantt_bad_path_writes_nothing(tmp_path, one_f_one_b, path, message):
    target = tmp_path / path if isinstance(path, str) else path
    with pytest.raises(dp.ConfigError, match=message):
        gantt(one_f_one_b, path=target)
    assert files(tmp_path) == []


def test_bad_sources(one_f_one_b, contended):
    result = dp.simulate(one_f_one_b, contended, communication="contention", devices_per_node=1)
    with pytest.raises(dp.ConfigError, match="pass schedule="):
        gantt(result)
    with pytest.raises(dp.ConfigError, match="not simulated from this schedule"):
        trace(result, schedule=dp.schedules.get("gpipe", devices=D, microbatches=N + 1))
    with pytest.raises(dp.ConfigError, match="expected a Schedule or a Result, got str"):
        trace("1f1b")
    with pytest.raises(dp.ConfigError, match="expected a Hardware, got float"):
        gantt(one_f_one_b, 1.0)


def test_write_atomic_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "out.json"

    def fail(tmp):
        tmp.write_text("{half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomic(target, fail)
    assert files(tmp_path) == []
    target.write_text("old")
    with pytest.raises(RuntimeError):
        write_atomic(target, fail)
    assert target.read_text() == "old"  # the previous file survives intact


# -- the timeline behind both -------------------------------------------------------------------------
def test_timeline_transfers_and_memory(one_f_one_b, contended):
    tl = timeline(one_f_one_b, contended, communication="contention", devices_per_node=1)
    result = dp.simulate(one_f_one_b, contended, communication="contention", devices_per_node=1)
    np.testing.assert_allclose(tl.start, np.asarray(result.start), rtol=1e-6)
    index = {op: i for i, op in enumerate(tl.ops)}
    assert len(tl.transfers) == 2 * (D - 1) * N  # an activation and a gradient per boundary and microbatch
    for t in tl.transfers:
        assert t.start >= tl.finish[index[t.producer]] - 1e-6
        assert t.finish <= tl.start[index[t.consumer]] + 1e-6
        assert t.finish - t.start == pytest.approx(transfer_time(contended), rel=1e-5)
        assert t.lane == f"egress d{t.src}"
    by_lane = {}
    for t in tl.transfers:  # a lane's transfers never overlap (contention: one at a time)
        by_lane.setdefault(t.lane, []).append((t.start, t.finish))
    for spans in by_lane.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:]))
    # The memory curves peak where the simulator says: static + activations.
    assert tl.memory_unit == "bytes"
    peaks = [float(values.max()) for _, values in tl.memory]
    np.testing.assert_allclose(peaks, np.asarray(result.peak_memory), rtol=1e-6)
    static, act = float(contended.static_bytes[0]), float(contended.activation_bytes[0])
    np.testing.assert_allclose(peaks, [static + act * min(D - d, N) for d in range(D)], rtol=1e-6)


def test_timeline_of_a_result_without_hardware_counts_activations(one_f_one_b, contended):
    tl = timeline(dp.simulate(one_f_one_b, contended, communication="contention", devices_per_node=1),
                  schedule=one_f_one_b)
    assert tl.memory_unit == "activations" and tl.lanes == ()
    assert [int(v.max()) for _, v in tl.memory] == list(dp.schedules.peak_activations(one_f_one_b))
    assert all(t.start is None for t in tl.transfers) and len(tl.transfers) == 2 * (D - 1) * N


def test_a_result_brings_the_mode_it_was_simulated_under(one_f_one_b, contended, chimera_sync):
    result = dp.simulate(one_f_one_b, contended, communication="contention", devices_per_node=1)
    assert result.communication == "contention"
    tl = timeline(result, contended, schedule=one_f_one_b)  # no communication=: the Result's own
    assert tl.communication == "contention" and set(tl.lanes) == {f"egress d{d}" for d in range(D)}
    assert timeline(result, contended, schedule=one_f_one_b, communication="contention").lanes == tl.lanes
    for draw in (timeline, gantt, trace):
        with pytest.raises(dp.ConfigError, match="^communication='overlap': the Result was simulated under "
                                                 "'contention'"):
            draw(result, contended, schedule=one_f_one_b, communication="overlap")
    s, hw, synced = chimera_sync
    assert trace(synced, hw, schedule=s)["otherData"]["communication"] == "contention"


def test_a_result_brings_the_topology_it_was_simulated_under(one_f_one_b, contended):
    """The graph's ``devices_per_node`` rides on its Result: drawn alone, the Result lays out the
    lanes of the topology it was simulated under (one NIC per GPU here), not one node's links."""
    result = dp.simulate(one_f_one_b, contended, communication="contention", devices_per_node=1)
    assert result.devices_per_node == 1
    lanes = set(timeline(result, contended, schedule=one_f_one_b).lanes)
    assert lanes == {f"egress d{d}" for d in range(D)}
    one_node = timeline(one_f_one_b, contended, communication="contention")  # default: one node, a link per pair
    assert set(one_node.lanes) != lanes and float(one_node.makespan) <= float(result.makespan)
    for draw in (timeline, gantt, trace):
        with pytest.raises(dp.ConfigError, match=r"^devices_per_node=2: the Result was simulated with 1 devices "
                                                 r"per node \(give the Result alone: it brings its topology\)$"):
            draw(result, contended, schedule=one_f_one_b, devices_per_node=2)


def test_default_hardware_is_unit_times():
    s = dp.schedules.get("gpipe", devices=2, microbatches=2)
    tl = timeline(s)
    assert tl.makespan == pytest.approx(table_makespan(s)) and tl.communication == "overlap"
    assert [lane for lane in tl.lanes] == ["link 0→1", "link 1→0"]  # an arrow lane per direction
    fig = gantt(s, memory=False)
    assert len(fig.axes) == 1 and fig.axes[0].get_xlabel() == "time (s)"


def table_makespan(s):
    return dp.table(s).makespan


# -- trace ----------------------------------------------------------------------------------------------
def test_trace_json(tmp_path, one_f_one_b, contended):
    data = trace(one_f_one_b, contended, communication="contention", devices_per_node=1, path=tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text()) == data
    assert files(tmp_path) == ["t.json"]
    events = data["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert [names[(0, d)] for d in range(D)] == [f"device {d}" for d in range(D)]
    links = {name for (pid, _), name in names.items() if pid == 1}
    assert links == {f"egress d{d}" for d in range(D - 1)} | {f"egress d{d}" for d in range(1, D)}
    ops = [e for e in events if e["ph"] == "X" and e["pid"] == 0]
    assert len(ops) == len(one_f_one_b.ops)
    forward = next(e for e in ops if e["name"] == "F0" and e["tid"] == 0)
    f_us = float(contended.forward[0]) * 1e6  # seconds to microseconds
    assert forward["ts"] == 0 and forward["dur"] == pytest.approx(f_us, rel=1e-5)
    # B = 2F up to the embedding's gather and scatter-add (equal bytes at the memory roof): B/F = 1.9996
    assert all(e["dur"] == pytest.approx(2 * f_us, rel=1e-3) for e in ops if e["cat"] == "B")
    link_events = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    assert len(link_events) == 2 * (D - 1) * N
    assert all(e["dur"] == pytest.approx(transfer_time(contended) * 1e6, rel=1e-5) for e in link_events)
    # Flows: one start and one finish per transfer, inside the producing and the consuming op.
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert set(starts) == set(finishes) and len(starts) == 2 * (D - 1) * N
    for n, s in starts.items():
        f = finishes[n]
        assert f["bp"] == "e" and abs(s["tid"] - f["tid"]) == 1 and s["ts"] < f["ts"]
        for flow in (s, f):
            assert any(e["tid"] == flow["tid"] and e["ts"] < flow["ts"] < e["ts"] + e["dur"] for e in ops)
    # A track's slices are disjoint: Perfetto needs them nested.
    for track in Counter((e["pid"], e["tid"]) for e in events if e["ph"] == "X"):
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                       if e["ph"] == "X" and (e["pid"], e["tid"]) == track)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    step = float(dp.simulate(one_f_one_b, contended, communication="contention", devices_per_node=1).makespan)
    assert data["otherData"]["makespan_us"] == pytest.approx(step * 1e6)


def test_trace_of_a_collective_spans_its_devices(tmp_path, chimera_sync):
    s, hw, result = chimera_sync
    data = trace(result, hw, schedule=s, communication="contention")
    reduces = [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] == "R"]
    # One all-reduce per stage, on both devices holding a replica of it (d and D-1-d).
    assert sorted(e["tid"] for e in reduces) == sorted(2 * list(range(D)))
    for e in reduces:
        partner = next(r for r in reduces if r["args"] == e["args"] and r["tid"] != e["tid"])
        assert partner["tid"] == D - 1 - e["tid"] and partner["ts"] == e["ts"]
    with pytest.raises(dp.ConfigError, match="suffix must be one of .json"):
        trace(s, path=tmp_path / "t.txt")
    assert files(tmp_path) == []


# -- the data-parallel gradient sync (compile(..., gradient_sync=True), Configuration.evaluate) -----
@pytest.fixture(scope="module")
def synced():
    """A whole configuration (2 pipeline ranks x 2 chunks, 2 data-parallel replicas): its evaluated
    step has an all-reduce R per stage on a sync lane and an optimizer step U per stage."""
    model = dp.Transformer(layers=8, hidden=256, heads=4, sequence=256, vocabulary=2048)
    cfg = dp.Configuration(model, dp.Parallelism(pipeline=2, data=2, virtual=2), dp.Cluster(device="H100", gpus=4), 16)
    result = cfg.evaluate()
    assert result.gradient_sync
    return cfg.schedule(), cfg.hardware(), result, cfg.graph()


def sync_reference(graph, hw):
    """Start and finish of every R (by stage) and U (by (pipeline, stage)) from the evaluator's own
    finish times (``finish_times``, not the simulate path viz uses) and the cost tables."""
    from diffpipe._engine._evaluate import finish_times
    from diffpipe._engine._graph import KIND_CODES

    tables = hw.tables(graph).batch_last()  # no setup or wind-down here: durations are the ops' own
    finish = np.asarray(finish_times(graph, tables)[:, 0], np.float64)
    duration = np.asarray(tables.expand(graph)[0][:, 0], np.float64)
    kind, op_index = np.asarray(graph.kind), np.asarray(graph.op_index)
    stage, pipe = np.asarray(graph.stage), np.asarray(graph.pipeline)
    out = {}
    for i in np.flatnonzero(op_index < 0):
        if kind[i] in (KIND_CODES["R"], KIND_CODES["U"]):
            key = ("R", int(stage[i])) if kind[i] == KIND_CODES["R"] else ("U", int(pipe[i]), int(stage[i]))
            out[key] = (finish[i] - duration[i], finish[i])
    return out


def test_trace_draws_the_gradient_sync_lane(tmp_path, synced):
    s, hw, result, graph = synced
    trace(result.result, hw, schedule=s, path=tmp_path / "sync.json", gradient_sync=True)
    data = json.loads((tmp_path / "sync.json").read_text())  # the file, as Perfetto reads it
    events = data["traceEvents"]
    assert data["otherData"]["gradient_sync"] is True
    assert all({"name", "ph", "pid", "tid"} <= set(e) for e in events)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    order = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in events if e["name"] == "thread_sort_index"}
    devices = s.devices
    for d in range(devices):
        assert names[(0, d)] == f"device {d}" and names[(0, devices + d)] == f"device {d} sync"
        assert order[(0, devices + d)] == order[(0, d)] + 1  # right under its device
    reference = sync_reference(graph, hw)
    reduces = [e for e in events if e["ph"] == "X" and e["cat"] == "R"]
    updates = [e for e in events if e["ph"] == "X" and e["cat"] == "U"]
    assert sorted(e["args"]["stage"] for e in reduces) == list(range(s.stages))
    assert len(updates) == s.stages and len(reduces) + len(updates) == len(reference)
    for e in reduces + updates:
        stage = e["args"]["stage"]
        holder = s.placement.device(0, stage)
        key = ("R", stage) if e["cat"] == "R" else ("U", e["args"]["pipeline"], stage)
        start, finish = reference[key]
        assert e["ts"] == pytest.approx(start * 1e6, rel=1e-5)
        assert e["ts"] + e["dur"] == pytest.approx(finish * 1e6, rel=1e-5)
        assert e["tid"] == (devices + holder if e["cat"] == "R" else holder)
        assert e["dur"] > 0
    # An R starts once its stage's last backward op has ended and the sync lane is free.
    backward = [e for e in events if e["ph"] == "X" and e["cat"] in ("B", "I", "W")]
    for e in reduces:
        last_b = max(o["ts"] + o["dur"] for o in backward if o["args"]["stage"] == e["args"]["stage"])
        before = [r["ts"] + r["dur"] for r in reduces if r["tid"] == e["tid"] and r["ts"] < e["ts"]]
        assert e["ts"] == pytest.approx(max([last_b, *before]), rel=1e-5)
    end = max(e["ts"] + e["dur"] for e in events if e["ph"] == "X")
    assert end == pytest.approx(result.step_time * 1e6, rel=1e-6)  # the last U ends the step
    for track in Counter((e["pid"], e["tid"]) for e in events if e["ph"] == "X"):
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                       if e["ph"] == "X" and (e["pid"], e["tid"]) == track)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    without = trace(result.result, hw, schedule=s)  # off by default: the old trace
    assert not [e for e in without["traceEvents"] if e.get("cat") in ("R", "U")]


def test_gantt_draws_the_gradient_sync_lane(tmp_path, synced):
    from matplotlib.colors import to_hex

    from diffpipe.viz.gantt import COLORS

    s, hw, result, _ = synced
    written = gantt(result.result, hw, schedule=s, path=tmp_path / "sync.png", gradient_sync=True)
    png = written[0].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    fig = gantt(s, hw, gradient_sync=True)  # from the schedule: simulated with the sync here
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[: 2 * s.devices] == [f"d{d}" for d in range(s.devices)] + [f"d{d} sync" for d in range(s.devices)]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "gradient all-reduce R (sync row)" in legend and "optimizer step U" in legend
    boxes = [(to_hex(p.get_facecolor()), p.get_y() + 0.4, p.get_x(), p.get_x() + p.get_width()) for p in ax.patches]
    tl = timeline(s, hw, gradient_sync=True)
    units = {"time (µs)": 1e6, "time (ms)": 1e3, "time (s)": 1.0}  # the axis unit follows the step length
    scale = units[fig.axes[1].get_xlabel()]
    for op in tl.syncs:
        row = s.devices + op.devices[0] if op.kind == "R" else op.devices[0]
        assert any(c == COLORS[op.kind].lower() and y == pytest.approx(row) and x0 == pytest.approx(op.start * scale)
                   and x1 == pytest.approx(op.finish * scale) for c, y, x0, x1 in boxes), op
    assert tl.makespan == pytest.approx(result.step_time, rel=1e-6)


def test_gradient_sync_refusals(synced):
    s, hw, result, _ = synced
    with pytest.raises(dp.ConfigError, match="needs its hardware"):
        timeline(result.result, schedule=s, gradient_sync=True)
    plain = dp.simulate(s, hw)  # simulated without the sync: its step is not the synced one
    with pytest.raises(dp.ConfigError, match="simulate it with gradient_sync=True"):
        trace(plain, hw, schedule=s, gradient_sync=True)
    own = dp.schedules.get("chimera", devices=D, microbatches=N, sync=True)
    with pytest.raises(dp.ConfigError, match="already has its own"):
        gantt(own, gradient_sync=True)
    with pytest.raises(dp.ConfigError, match="gradient_sync must be True or False"):
        timeline(s, hw, gradient_sync="yes")


def test_cli_simulate_of_a_configuration_traces_its_sync(tmp_path):
    from diffpipe import cli

    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(model_type="llama", num_hidden_layers=4, hidden_size=256,
                                      num_attention_heads=4, intermediate_size=512, vocab_size=2048,
                                      max_position_embeddings=512, hidden_act="silu")))
    out = tmp_path / "step.json"
    code = cli.main(["simulate", "1f1b", "--hf-config", str(config), "--pp", "2", "--dp", "2", "--global-batch", "8",
                     "--cluster", "4xH100", "--sequence", "256", "--trace", str(out), "--json"])
    assert code == 0
    data = json.loads(out.read_text())
    kinds = Counter(e["cat"] for e in data["traceEvents"] if e["ph"] == "X")
    assert kinds["R"] == 2 and kinds["U"] == 2 and data["otherData"]["gradient_sync"] is True


def test_gantt_draws_the_configurations_breakdown_as_one_stacked_bar():
    model = dp.Transformer(layers=4, hidden=256, heads=4, sequence=256, vocabulary=2048, flash_attention=True)
    cfg = dp.Configuration(model, dp.Parallelism(tensor=2, pipeline=2, data=1), dp.Cluster("H100", gpus=4), 8)
    r = cfg.evaluate()
    fig = gantt(r.result, cfg.hardware(), schedule=cfg.schedule(), gradient_sync=r.gradient_sync,
                breakdown=r.breakdown)
    bar = fig.axes[-1]
    widths = {" ".join(c.get_label().split(" ")[:-2]): c.patches[0].get_width() for c in bar.containers}
    scale = 1e3 if r.step_time < 1 else 1.0  # the chart's unit: ms below a second
    # the segments tile the step: every positive part of the breakdown, and the rest as "other"
    assert sum(p.get_width() for p in bar.patches) == pytest.approx(r.step_time * scale, rel=1e-6)
    assert widths["compute gemm"] == pytest.approx(r.breakdown["compute_gemm"] * scale, rel=1e-6)
    assert len(fig.axes) == 3  # chart, memory, breakdown
    assert len(gantt(r.result, cfg.hardware(), schedule=cfg.schedule(), gradient_sync=True).axes) == 2


# -- long steps: zoomed windows; a configuration's collectives on rows of their own (issue 24) ----
def test_windows_of_a_long_1f1b_are_its_warm_up_steady_state_and_drain():
    """1F1B on 4 devices, 128 microbatches, F = 1 s, B = 2 s: the step is (N + D - 1)(F + B) = 393 s;
    device 0 runs the most warm-up forwards, so every device has begun backward when it starts B0 at
    D F + (D - 1) B = 10 s; it also ends its forwards first, F127 at 393 - 11 = 382 s. A window is
    20 mean op durations (1.5 s) = 30 s, the steady slice centred at (10 + 382) / 2 = 196 s."""
    from diffpipe.viz import windows
    from diffpipe.viz.gantt import LONG_OPS, WINDOW_OPS

    s = dp.schedules.get("1f1b", devices=D, microbatches=128)
    tl = timeline(s)
    assert tl.makespan == pytest.approx(393.0) and WINDOW_OPS == 20 and 2 * 128 > LONG_OPS
    got = [(w.name, w.start, w.finish) for w in windows(tl)]
    assert got == [("warm-up", 0.0, 30.0), ("steady state", 181.0, 211.0), ("drain", 363.0, 393.0)]
    assert windows(timeline(dp.schedules.get("1f1b", devices=D, microbatches=48))) == ()  # 96 ops a device: short
    assert len(windows(timeline(dp.schedules.get("1f1b", devices=D, microbatches=N)), force=True)) == 3


def test_a_long_gantt_is_drawn_as_zoomed_windows_over_the_whole_step():
    from diffpipe.viz import windows

    s = dp.schedules.get("1f1b", devices=D, microbatches=128)
    fig = gantt(s, arrows=False)
    panels, memory = fig.axes[:3], fig.axes[3]
    assert len(fig.axes) == 4  # three windows, the whole step's memory
    for ax, w in zip(panels, windows(timeline(s))):
        assert ax.get_xlim() == pytest.approx((w.start, w.finish))
        assert ax.get_title() == f"{w.name}: {w.start:.4g}–{w.finish:.4g} s"
        # every box of the window overlaps it, and every op that overlaps it has its box
        boxes = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches]
        assert all(x1 >= w.start and x0 <= w.finish for x0, x1 in boxes)
        ops = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches if p.get_y() + p.get_height() / 2 < D]
        tl = timeline(s)
        inside = sorted((tl.start[i], tl.finish[i]) for i in range(len(tl.ops))
                        if tl.finish[i] >= w.start and tl.start[i] <= w.finish)
        np.testing.assert_allclose(np.array(sorted(ops)), np.array(inside), rtol=1e-6)
        whole = [x for x in inside if x[0] >= w.start and x[1] <= w.finish]
        labels = [t for t in ax.texts if float(t.get_position()[1]) < D]  # legible: each whole op labelled
        assert len(labels) == len(whole) and len(whole) >= len(inside) - 2 * D
    assert [t.get_text() for t in panels[0].get_yticklabels()][:D] == [f"d{d}" for d in range(D)]
    assert memory.get_xlim()[1] == pytest.approx(393.0 * 1.01)
    assert [t.get_text() for t in memory.texts] == ["warm-up", "steady state", "drain"]
    assert len(gantt(s, memory=False, zoom=False).axes) == 1  # the single view, when asked for
    with pytest.raises(dp.ConfigError, match="zoom must be True, False or None"):
        gantt(s, zoom="yes")


@pytest.fixture(scope="module")
def tensor_parallel():
    model = dp.Transformer(layers=4, hidden=256, heads=4, sequence=256, vocabulary=2048, flash_attention=True)
    cfg = dp.Configuration(model, dp.Parallelism(tensor=2, pipeline=2, data=1), dp.Cluster("H100", gpus=4), 8)
    return cfg, cfg.evaluate(), cfg.schedule(), cfg.hardware()


def test_op_collectives_are_the_exposed_part_of_each_op(tensor_parallel):
    """Each op lasts overhead + size x (its stage's compute + exposed collectives), and the per-op
    collectives add up, per device, to the breakdown's ``exposed_tensor`` (``Configuration.figures``)."""
    from diffpipe.viz import op_collectives

    cfg, r, s, hw = tensor_parallel
    col = op_collectives(cfg, s, hw)
    assert set(col) == {"tensor", "expert", "gather"} and not col["expert"].any() and not col["gather"].any()
    per_device = np.zeros(s.devices)
    for d, order in enumerate(s.orders):
        index = {op: i for i, op in enumerate(s.ops)}
        per_device[d] = sum(col["tensor"][index[op]] for op in order)
    assert np.mean(per_device) == pytest.approx(r.breakdown["exposed_tensor"], rel=1e-6)
    compute = np.asarray(sum(cfg.compute_seconds().values()), np.float64)  # [F, I, W] x layers
    rows = cfg.stage_rows()
    duration = np.asarray(r.result.finish) - np.asarray(r.result.start)
    assert hw.kind_overhead is None  # one overhead for every kind
    overhead = {kind: float(hw.overhead) for kind in "FBIW"}
    for i, op in enumerate(s.ops):
        kinds = {"F": [0], "B": [1, 2], "I": [1], "W": [2]}[op.kind]
        work = sum(compute[k, rows == op.stage].sum() for k in kinds)
        assert duration[i] == pytest.approx(overhead[op.kind] + work + col["tensor"][i], rel=2e-5), op
        assert 0 < col["tensor"][i] < duration[i]


def test_gantt_draws_collectives_on_a_row_under_each_device(tensor_parallel):
    from matplotlib.colors import to_hex

    from diffpipe.viz import op_collectives
    from diffpipe.viz.gantt import _BREAKDOWN_COLORS

    cfg, r, s, hw = tensor_parallel
    col = op_collectives(cfg, s, hw)
    fig = gantt(r.result, hw, schedule=s, gradient_sync=r.gradient_sync, collectives=col, breakdown=r.breakdown)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[:4] == ["d0", "d0 comm", "d1", "d1 comm"]
    scale = {"time (ms)": 1e3, "time (s)": 1.0, "time (µs)": 1e6}[fig.axes[-1].get_xlabel()]
    red = _BREAKDOWN_COLORS["exposed_tensor"]
    comm = sorted((round(p.get_y() + 0.3), p.get_x(), p.get_x() + p.get_width()) for p in ax.patches
                  if to_hex(p.get_facecolor()) == red)
    tl = timeline(r.result, hw, schedule=s)
    want = sorted((2 * d + 1, (tl.finish[i] - col["tensor"][i]) * scale, tl.finish[i] * scale)
                  for i, op in enumerate(s.ops) for d in s.devices_of(op))
    assert len(comm) == len(want)
    for (row, x0, x1), (wrow, w0, w1) in zip(comm, want):
        assert row == wrow and x0 == pytest.approx(w0, rel=1e-6) and x1 == pytest.approx(w1, rel=1e-6)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "tensor-parallel collectives (exposed, comm row)" in legend


def test_bad_collectives_are_refused(tensor_parallel):
    cfg, r, s, hw = tensor_parallel
    with pytest.raises(dp.ConfigError, match="expected one value per op"):
        timeline(r.result, hw, schedule=s, collectives={"tensor": [0.0]})
    with pytest.raises(dp.ConfigError, match="which lasts only"):
        timeline(r.result, hw, schedule=s, collectives={"tensor": np.full(len(s.ops), 10.0)})
    with pytest.raises(dp.ConfigError, match="mapping of kind to seconds"):
        timeline(r.result, hw, schedule=s, collectives=[1.0])
    with pytest.raises(dp.ConfigError, match="finite and at least 0"):
        timeline(r.result, hw, schedule=s, collectives={"tensor": np.full(len(s.ops), -1.0)})
    assert timeline(r.result, hw, schedule=s, collectives={"tensor": np.zeros(len(s.ops))}).collectives == ()


def test_a_configuration_draws_as_its_parts(tensor_parallel):
    """``gantt(configuration)`` and ``trace(configuration)`` draw what the parts give by hand (its
    evaluation on its schedule and hardware, its gradient sync, breakdown and collectives per op),
    evaluated there or handed in as ``evaluation=``; a configuration with parts of its own given is
    refused, and so is ``evaluation=`` without one."""
    import io

    from diffpipe.viz import op_collectives

    cfg, r, s, hw = tensor_parallel

    def png(fig):  # PNG: its bytes are the drawing's (an SVG's element ids change from one figure to the next)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=50)
        return buffer.getvalue()

    by_hand = png(gantt(r.result, hw, schedule=s, gradient_sync=r.gradient_sync, breakdown=r.breakdown,
                        collectives=op_collectives(cfg, s, hw)))
    assert png(gantt(cfg, evaluation=r)) == by_hand
    assert png(gantt(cfg)) == by_hand
    want = json.dumps(trace(r.result, hw, schedule=s, gradient_sync=r.gradient_sync))
    assert json.dumps(trace(cfg, evaluation=r)) == want == json.dumps(trace(cfg))
    with pytest.raises(dp.ConfigError, match="gantt: a Configuration brings its own hw"):
        gantt(cfg, hw)
    with pytest.raises(dp.ConfigError, match="trace: a Configuration brings its own schedule"):
        trace(cfg, schedule=s)
    with pytest.raises(dp.ConfigError, match="evaluation= must be the configuration's ConfigResult"):
        gantt(cfg, evaluation=r.result)
    with pytest.raises(dp.ConfigError, match="gantt: evaluation= goes with a Configuration"):
        gantt(s, evaluation=r)
