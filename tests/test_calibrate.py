"""``diffpipe.calibrate``: traces of torch.distributed.pipelining steps -> Calibration -> Hardware.

Unit tests read small synthetic traces built here (every number known, so every fitted term is
checked exactly); the end-to-end test runs a real 2-rank gloo pipelined step under torch.profiler
(``papers/validation/run.py``'s workers), calibrates from its traces and predicts other schedules,
checking only what does not depend on timing noise: every rank ran the predicted op order, the
fitted terms are positive and finite, every schedule gets a prediction, and diffpipe's peak stored
activations equal torch's. No assertion on a measured time.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
import tomllib
from pathlib import Path

import chex
import numpy as np
import pytest

import diffpipe as dp
from diffpipe import calibrate, cli
from diffpipe._engine._communication import transfers
from diffpipe._engine._simulate import simulate_graph
from diffpipe.schedules import from_torch, get, to_torch_csv
from diffpipe.schedules._reference import evaluate_network

US = 1e-6


# -- synthetic traces --------------------------------------------------------------------------------


def _x(name: str, start: float, end: float, cat: str = "user_annotation") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": start, "dur": end - start, "pid": 1, "tid": 1}


def _trace(path: Path, rank: int, events: list[dict], world: int = 2, host: str = "node0") -> Path:
    info = {"backend": "gloo", "rank": rank, "world_size": world}
    data = {"schemaVersion": 1, "host_name": host, "distributedInfo": info,
            "traceEvents": [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1}, *events]}
    path.write_text(json.dumps(data))
    return path


def _recv(label: str, start: float, arrive: float) -> list[dict]:
    """A RECV action posting at ``start``; its data arrives at ``arrive``."""
    return [_x(label, start, start + 10), _x("c10d::recv_", start + 2, start + 8, "cpu_op"),
            _x("gloo:recv", start + 5, arrive)]


def _send(label: str, start: float) -> list[dict]:
    return [_x(label, start, start + 10), _x("c10d::send", start + 2, start + 8, "cpu_op"),
            _x("gloo:send", start + 5, start + 400)]


def _runtime_step(t: float) -> tuple[list[dict], list[dict]]:
    """One GPipe-ordered step of ``_PipelineScheduleRuntime`` labels on 2 ranks, starting at ``t`` (us).

    Compute: F 100/150, B 200/300 on stages 0/1; 30 us between ops that do not wait; every
    transfer that the receiver had posted in time arrives 40 us after its producer ends; every
    SEND and RECV action lasts 10 us.
    """
    r0 = [_x("PP:0UNSHARD", t, t + 10), _x("PP:0F0", t + 100, t + 200), *_send("PP:0SEND_F0", t + 210),
          _x("PP:0F1", t + 230, t + 330), *_send("PP:0SEND_F1", t + 340),
          *_recv("PP:0RECV_B0", t + 360, t + 940), _x("PP:0B0", t + 380, t + 1140),
          *_recv("PP:0RECV_B1", t + 1150, t + 1270), _x("PP:0B1", t + 1160, t + 1470),
          _x("PP:0REDUCE_GRAD", t + 1480, t + 1500)]
    r1 = [*_recv("PP:1RECV_F0", t + 100, t + 240), _x("PP:1F0", t + 120, t + 390),
          *_recv("PP:1RECV_F1", t + 400, t + 420), _x("PP:1F1", t + 430, t + 580),  # posted late: no transfer
          _x("PP:1B0", t + 600, t + 900), *_send("PP:1SEND_B0", t + 910),
          _x("PP:1B1", t + 930, t + 1230), *_send("PP:1SEND_B1", t + 1240)]
    return r0, r1


def _runtime_files(tmp_path: Path, steps: int = 2) -> list[Path]:
    ranks: list[list[dict]] = [[], []]
    for k in range(steps):
        for rank, events in enumerate(_runtime_step(10_000.0 * k)):
            ranks[rank] += events
    return [_trace(tmp_path / f"rank{r}.json", r, events) for r, events in enumerate(ranks)]


def test_runtime_labels_give_every_term(tmp_path):
    cal = calibrate.from_torch_trace(_runtime_files(tmp_path))
    assert cal.orders == (("0F0", "0F1", "0B0", "0B1"), ("1F0", "1F1", "1B0", "1B1"))
    assert cal.stage_ranks == (0, 1)
    assert cal.forward == pytest.approx((100 * US, 150 * US))
    assert cal.backward == pytest.approx((200 * US, 300 * US))
    assert cal.input_grad is None and cal.weight is None
    # the gaps before ops that did not wait (0F1, 1F1, 1B0, 1B1: 30, 40, 20, 30 us) less the
    # SEND/RECV actions in them (10, 10, 0, 10 us): 20, 30, 20, 20
    assert cal.overhead == pytest.approx(22.5 * US)
    assert cal.overhead_by_kind == pytest.approx({"F": 25 * US, "B": 20 * US})
    assert cal.send_cost == pytest.approx(10 * US) and cal.recv_cost == pytest.approx(10 * US)
    assert cal.transfer == pytest.approx(40 * US)
    assert cal.p2p == 0.0  # the transfer (40) less the overhead and both host times: below 0
    assert cal.setup == pytest.approx(75 * US)  # first compute at 100, less one F overhead
    assert cal.wind_down == pytest.approx(30 * US)
    assert cal.step_time == pytest.approx(1500 * US)
    # 4 sends and 4 receives a step, on both steps
    assert cal.samples == {"B0": 4, "B1": 4, "F0": 4, "F1": 4, "send_cost": 8, "recv_cost": 8}
    assert cal.spread["send_cost"] == pytest.approx(0.0) and cal.spread["recv_cost"] == pytest.approx(0.0)
    assert cal.residual["durations"] == pytest.approx(0.0, abs=1e-9)
    assert math.isfinite(cal.residual["step"])
    # The traced schedule replayed on the calibrated hardware: ops back to back on each rank.
    schedule = calibrate.traced_schedule(dict(enumerate(cal.orders)), cal.stage_ranks)
    assert [[str(op) for op in order] for order in schedule.orders] == [list(o) for o in cal.orders]


def test_a_step_label_bounds_setup_wind_down_and_the_step(tmp_path):
    from diffpipe.calibrate._trace import STEP_LABEL

    ranks: list[list[dict]] = [[], []]
    for k in range(2):
        t = 10_000.0 * k
        for rank, events in enumerate(_runtime_step(t)):
            # step() begins 50 us before the first label (splitting the batch) and ends 70 us after the last
            ranks[rank] += [_x(STEP_LABEL, t - 50, t + 1570), *events]
    files = [_trace(tmp_path / f"rank{r}.json", r, events) for r, events in enumerate(ranks)]
    cal = calibrate.from_torch_trace(files)
    assert cal.setup == pytest.approx((75 + 50) * US) and cal.wind_down == pytest.approx((30 + 70) * US)
    assert cal.step_time == pytest.approx(1620 * US)


def test_ranks_on_different_hosts_have_no_transfer_delay(tmp_path):
    files = _runtime_files(tmp_path)
    data = json.loads(files[1].read_text())
    files[1].write_text(json.dumps({**data, "host_name": "node1"}))  # two clocks: not comparable
    cal = calibrate.from_torch_trace(files)
    assert cal.transfer is None and cal.p2p == 0.0 and cal.overhead == pytest.approx(22.5 * US)


def test_a_single_file_per_rank_list_or_one_path(tmp_path):
    files = _runtime_files(tmp_path)
    one = _trace(tmp_path / "solo.json", 0, [_x("PP:0F0", 0, 100), _x("PP:0B0", 130, 330)], world=1)
    cal = calibrate.from_torch_trace(one)
    assert cal.orders == (("0F0", "0B0"),) and cal.forward == pytest.approx((100 * US,))
    assert calibrate.from_torch_trace([str(f) for f in files]).stages == 2


def test_gpipe_labels_take_out_the_wait_and_the_send(tmp_path):
    r0 = [_x("Forward 0", 0, 150), _x("c10d::send", 100, 140, "cpu_op"),
          _x("Backward 0", 200, 1000), _x("c10d::recv_", 205, 210, "cpu_op"), _x("gloo:recv", 208, 750)]
    r1 = [_x("Forward 0", 0, 400), _x("c10d::recv_", 5, 10, "cpu_op"), _x("gloo:recv", 8, 150),
          _x("Backward 0", 410, 800), _x("c10d::send", 700, 720, "cpu_op")]
    files = [_trace(tmp_path / "r0.json", 0, r0), _trace(tmp_path / "r1.json", 1, r1)]
    cal = calibrate.from_torch_trace(files)
    assert cal.orders == (("0F0", "0B0"), ("1F0", "1B0"))
    assert cal.forward == pytest.approx((100 * US, 250 * US))
    assert cal.backward == pytest.approx((250 * US, 290 * US))
    assert cal.overhead == pytest.approx(10 * US)
    # the host time of a transfer: the c10d::send / c10d::recv_ posts inside the labels
    assert cal.send_cost == pytest.approx(30 * US) and cal.recv_cost == pytest.approx(5 * US)
    assert cal.transfer == pytest.approx(50 * US)
    assert cal.p2p == pytest.approx(5 * US)  # 50 less the overhead (10) and the host times (30 + 5)


def test_zero_bubble_split_and_overlapped_actions(tmp_path):
    # Stage 0 runs its whole backward in W (torch's convention: its I has no input to differentiate).
    r0 = [_x("PP:0F0", 0, 100), _x("PP:0I0", 500, 505), _x("PP:0W0", 520, 720)]
    r1 = [*_recv("PP:1RECV_F0", 0, 140), _x("PP:1F0", 20, 290), _x("PP:1I0", 300, 420), _x("PP:1W0", 440, 490),
          _x("PP:(1F1;1I1)OVERLAP_F_B", 600, 900)]
    files = [_trace(tmp_path / "r0.json", 0, r0), _trace(tmp_path / "r1.json", 1, r1)]
    cal = calibrate.from_torch_trace(files)
    assert cal.orders == (("0F0", "0I0", "0W0"), ("1F0", "1I0", "1W0", "1F1", "1I1"))
    assert cal.input_grad == pytest.approx((5 * US, 120 * US))
    assert cal.weight == pytest.approx((200 * US, 50 * US))
    assert cal.backward is None
    assert "F1" in cal.samples and cal.samples["F1"] == 1  # the overlapped F is not timed
    assert cal.residual["step"] is None  # not a whole schedule: nothing to replay


def test_a_receive_done_before_its_wait_is_no_wait_and_times_no_transfer(tmp_path):
    # gloo's recv span ends when wait() returns: 1F1's data came before its label (the span ends 20 us
    # into it, the wait call), so 1F1 did not wait: its gap (40 us) is an overhead sample and the
    # receive, though posted before its producer ended, gives no transfer sample (its arrival is unknown).
    # 0F1's gap (30 us) holds 0SEND_F0 (10 us): 20 us.
    r0 = [_x("PP:0F0", 0, 100), *_send("PP:0SEND_F0", 110), _x("PP:0F1", 130, 230), *_send("PP:0SEND_F1", 240)]
    r1 = [*_recv("PP:1RECV_F0", 0, 150), *_recv("PP:1RECV_F1", 20, 430), _x("PP:1F0", 40, 390),
          _x("PP:1F1", 410, 600), _x("PP:1B0", 620, 700), _x("PP:1B1", 720, 800)]
    files = [_trace(tmp_path / "r0.json", 0, r0), _trace(tmp_path / "r1.json", 1, r1)]
    cal = calibrate.from_torch_trace(files)
    assert cal.transfer == pytest.approx(50 * US)  # only 1F0's: it waited (label at 40, data at 150)
    assert cal.forward == pytest.approx((100 * US, 205 * US))  # 1F0 from 150 to 390, 1F1 from 430 to 600
    assert cal.overhead_by_kind["F"] == pytest.approx(30 * US)  # 0F1 after 20 us, 1F1 after 40 us


def test_the_transfer_delay_is_a_plain_mean_that_keeps_its_slow_tail(tmp_path):
    # Eight steps of 0F0 -> 1F0 (then 1B0); rank 1 posts its receive first and waits. The data arrives
    # 40 us after 0F0 ends in seven steps and 2,040 us after in one (gloo's slow transfers, when both
    # ranks send at once, are real time the step pays): the delay is their plain mean, 290 us; the
    # fenced mean (robust_mean, as for op times) would drop the slow one and give 40 us.
    r0, r1 = [], []
    for k, delay in enumerate((40, 40, 40, 2040, 40, 40, 40, 40)):
        t = 10_000.0 * k
        r0 += [_x("PP:0F0", t, t + 100), *_send("PP:0SEND_F0", t + 110)]
        r1 += [*_recv("PP:1RECV_F0", t, t + 100 + delay), _x("PP:1F0", t + 20, t + 300 + delay),
               _x("PP:1B0", t + 330 + delay, t + 630 + delay)]
    files = [_trace(tmp_path / "r0.json", 0, r0), _trace(tmp_path / "r1.json", 1, r1)]
    cal = calibrate.from_torch_trace(files)
    assert cal.forward == pytest.approx((100 * US, 200 * US))
    assert cal.transfer == pytest.approx(290 * US)


def test_robust_mean_keeps_the_skew_and_drops_gross_outliers():
    from diffpipe.calibrate._calibration import robust_mean

    skewed = [1.0, 1.0, 1.0, 1.0, 1.2, 1.4]
    assert robust_mean(skewed) == pytest.approx(sum(skewed) / 6)  # above the median (1.0): the skew counts
    assert robust_mean([*skewed, 1.1, 50.0]) == pytest.approx((sum(skewed) + 1.1) / 7)  # a preempted op does not
    assert robust_mean([2.0, 4.0]) == pytest.approx(3.0) and robust_mean([]) is None


def test_torch_runtime_lowers_a_family_its_csv_and_torchs_class_alike(tmp_path):
    # DualPipe-V's overlapped F;B pairs are one torch action wherever the schedule came from: the
    # diffpipe family, its exported CSV (compound cells) or torch's own DualPipeV class
    pytest.importorskip("torch.distributed.pipelining")
    from diffpipe.schedules import from_torch_csv, get, to_torch_csv

    family = get("dualpipe-v", devices=2, microbatches=4)
    to_torch_csv(family, tmp_path / "dpv.csv")
    posts = [calibrate.receive_posts(s) for s in (family, from_torch_csv(tmp_path / "dpv.csv"),
                                                  from_torch("DualPipeV", 2, 4, 2))]
    assert posts[0] == posts[1] == posts[2]


def test_torch_runtime_mode_sits_between_overlap_and_rendezvous():
    pytest.importorskip("torch.distributed.pipelining")
    cal = calibrate.from_measurements([1.0, 1.2, 0.9, 1.1], input_grad=[1.0, 1.3, 1.0, 1.2],
                                      weight=[0.8, 0.8, 0.9, 0.7], overhead=0.05, p2p=0.4)
    for name in ("LoopedBFS", "DualPipeV"):  # receives posted early; overlapped F;B pairs
        schedule = from_torch(name, 2, 4, 2)
        posts = calibrate.receive_posts(schedule)
        # every receive is posted before its consumer, after an op of the receiving rank
        for order in schedule.orders:
            for i, op in enumerate(order):
                if op in posts and posts[op] is not None:
                    assert posts[op] in order[:i], (name, op)
        # torch-runtime's meeting points are at or before rendezvous's (the op before the consumer),
        # on the reference evaluator (fast: no simulator compile per mode)
        hw = cal.times(schedule)
        op_time = {"F": hw["forward"], "I": hw["input_grad"], "W": hw["weight"],
                   "B": [i + w for i, w in zip(hw["input_grad"], hw["weight"], strict=True)]}
        spans = []
        for mode in (dp.communication("overlap"), calibrate.TorchRuntime(), dp.communication("rendezvous")):
            _, finish, _ = evaluate_network(schedule, lambda op, t=op_time: t[op.kind][op.stage],
                                            lambda op, dep: 0.4, mode)
            spans.append(max(finish.values()))
        assert spans[0] <= spans[1] <= spans[2] and spans[0] < spans[2], (name, spans)
    assert cal.predict(schedule, mode="torch-runtime") > cal.predict(schedule, mode="overlap")  # by name
    assert isinstance(calibrate.TorchRuntime(), dp.AbstractCommunication)


@pytest.mark.parametrize("name", ["1f1b", "zb-v", "dualpipe-v", "interleaved-1f1b"])
def test_the_host_time_of_a_transfer_is_paid_on_both_ranks(name):
    # send_cost on the op that produces each cross-device transfer, recv_cost on the op that
    # consumes it (an overlapped pair: both members'), against the reference evaluator given
    # those durations, counted here from the schedule's own dependencies
    schedule = get(name, devices=2, microbatches=4, **({"chunks": 2} if name == "interleaved-1f1b" else {}))
    n = schedule.stages
    cal = calibrate.from_measurements([1.0] * n, input_grad=[1.5] * n, weight=[0.7] * n, overhead=0.05, p2p=0.3,
                                      send_cost=0.11, recv_cost=0.07)
    sends: dict = {}
    receives: dict = {}
    for op in schedule.ops:
        for dep in schedule.dependencies[op]:
            if dep.src != dep.dst:
                sends[dep.op] = sends.get(dep.op, 0) + 1
                receives[op] = receives.get(op, 0) + 1
    assert sends and sum(sends.values()) == sum(receives.values())
    base = {"F": 1.0, "B": 2.2, "I": 1.5, "W": 0.7}
    for mode in ("overlap", "rendezvous"):
        _, finish, _ = evaluate_network(
            schedule, lambda op: 0.05 + base[op.kind] + 0.11 * sends.get(op, 0) + 0.07 * receives.get(op, 0),
            lambda op, dep: 0.3, dp.communication(mode))
        assert cal.predict(schedule, mode=mode) == pytest.approx(max(finish.values()), rel=1e-6), mode
        without = calibrate.from_measurements([1.0] * n, input_grad=[1.5] * n, weight=[0.7] * n, overhead=0.05,
                                              p2p=0.3)
        assert cal.predict(schedule, mode=mode) > without.predict(schedule, mode=mode)
    # the terms go to the machine file where measured (the CLI reading them back: the calibrate command test)
    text = cal.to_toml_text()
    assert "send_cost = 0.11" in text and "recv_cost = 0.07" in text
    assert "send_cost" not in without.to_toml_text()


def test_the_host_times_combine_across_runs():
    one = calibrate.Calibration(forward=(1.0, 2.0), backward=(3.0, 4.0), send_cost=0.1, recv_cost=0.2,
                                samples={"send_cost": 8, "recv_cost": 8}, spread={"send_cost": 0.5})
    two = calibrate.Calibration(forward=(1.0, 2.0), backward=(3.0, 4.0), send_cost=0.3, recv_cost=0.0)
    cal = calibrate.combine([one, two])
    assert cal.send_cost == pytest.approx(0.2) and cal.recv_cost == pytest.approx(0.2)  # 0: not timed
    assert cal.spread["send_cost"] == pytest.approx(np.std([0.1, 0.3], ddof=1) / 0.2)
    assert cal.spread.get("recv_cost") is None and cal.samples["send_cost"] == 8


@pytest.mark.parametrize(
    "write, message",
    [
        (lambda p: p.write_text("not json"), "not a torch.profiler Chrome trace"),
        (lambda p: p.write_text('{"foo": 1}'), "no traceEvents"),
        (lambda p: _trace(p, 0, [_x("aten::mm", 0, 10, "cpu_op")], world=1), "no torch.distributed.pipelining"),
        (lambda p: p.write_bytes(b"\xff\xfe\x00"), "not UTF-8"),
    ],
)
def test_bad_traces_name_what_is_missing(tmp_path, write, message):
    path = tmp_path / "t.json"
    write(path)
    with pytest.raises(dp.ConfigError, match=message) as info:
        calibrate.from_torch_trace(path)
    assert "\n" not in str(info.value)


def test_fewer_ranks_than_the_run_or_the_schedule(tmp_path):
    files = _runtime_files(tmp_path)
    with pytest.raises(dp.ConfigError, match="no trace of rank 1"):
        calibrate.from_torch_trace(files[:1])
    with pytest.raises(dp.ConfigError, match="second trace of rank 0"):
        calibrate.from_torch_trace([files[0], files[0]])
    with pytest.raises(dp.ConfigError, match="covers 2 rank.*4 devices"):
        calibrate.from_torch_trace(files, get("gpipe", devices=4, microbatches=2))
    with pytest.raises(dp.ConfigError, match="rank 0 ran 0B0 at position 2 where the schedule has 0F2"):
        calibrate.from_torch_trace(files, get("gpipe", devices=2, microbatches=4))
    calibrate.from_torch_trace(files, get("gpipe", devices=2, microbatches=2))


def test_steps_cut_off_are_refused(tmp_path):
    r0, r1 = _runtime_step(0.0)
    s0, _ = _runtime_step(10_000.0)
    files = [_trace(tmp_path / "r0.json", 0, r0 + s0[:3]), _trace(tmp_path / "r1.json", 1, r1)]
    with pytest.raises(dp.ConfigError, match="different numbers of steps"):
        calibrate.from_torch_trace(files)


# -- Calibration -> Hardware / machine file ------------------------------------------------------------


def test_hardware_takes_the_backward_each_schedule_runs():
    cal = calibrate.from_measurements([1.0, 1.0], [3.0, 3.5], input_grad=[1.0, 2.0], weight=[1.5, 1.5],
                                      overhead=0.1, p2p=0.2)
    full = cal.times(get("1f1b", devices=2, microbatches=4))
    split = cal.times(get("zb-h1", devices=2, microbatches=4))
    assert full["input_grad"] == [3.0, 3.5] and full["weight"] == [0.0, 0.0]
    assert split["input_grad"] == [1.0, 2.0] and split["weight"] == [1.5, 1.5]
    hw = cal.hardware(get("1f1b", devices=2, microbatches=4))
    assert float(hw.overhead) == pytest.approx(0.1) and float(hw.network.latency) == pytest.approx(0.2)
    only_full = calibrate.from_measurements([1.0, 1.0], [3.0, 3.0])
    with pytest.raises(dp.ConfigError, match="no measured I/W split"):
        only_full.times(get("zb-h1", devices=2, microbatches=4))
    assert only_full.times(get("zb-h1", devices=2, microbatches=4), weight_fraction=0.5)["weight"] == [1.5, 1.5]
    with pytest.raises(dp.ConfigError, match="measured 2 stages, the schedule has 4"):
        only_full.hardware(get("1f1b", devices=4, microbatches=4))
    # A split schedule's full B ops cost the measured full backward (Hardware.full_backward).
    assert split["full_backward"] == [3.0, 3.5] and full["full_backward"] is None
    assert np.asarray(cal.hardware(get("zb-h1", devices=2, microbatches=4)).full_backward).tolist() == [3.0, 3.5]
    # Without a full backward, B ops cost I + W.
    split_only = calibrate.from_measurements([1.0, 1.0], input_grad=[1.0, 1.0], weight=[0.5, 0.5])
    assert split_only.times(get("1f1b", devices=2, microbatches=4))["input_grad"] == [1.5, 1.5]


def test_a_full_backward_hardware_refuses_split_schedules(caplog):
    # From full-backward runs only, I/W are unknown: a split schedule must not be priced as I = B, W = 0.
    cal = calibrate.from_measurements([1.0, 1.0], [3.0, 3.0], overhead=0.1)
    gpipe, zb = get("gpipe", devices=2, microbatches=4), get("zb-h1", devices=2, microbatches=4)
    for hw in (cal.hardware(), cal.hardware(gpipe)):
        assert not hw.split_known
        assert float(dp.simulate(gpipe, hw).makespan) == pytest.approx(cal.predict(gpipe))
        caplog.clear()
        for run, graph in ((dp.simulate, zb), (dp.makespan, dp.compile(zb)), (simulate_graph, dp.compile(zb))):
            with pytest.raises(dp.ConfigError, match="knows only full backwards") as info:
                run(graph, hw)
            assert "\n" not in str(info.value)
        # refused before tracing: no runtime callback failed (JAX logs that failure with its traceback)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    with pytest.raises(dp.ConfigError, match="no measured I/W split"):
        cal.hardware(zb)
    # With a split (here a fraction), one hardware prices every schedule: B at the measured B.
    hw = cal.hardware(weight_fraction=0.25)
    assert hw.split_known and np.asarray(hw.full_backward).tolist() == [3.0, 3.0]
    assert float(dp.simulate(gpipe, hw).makespan) == pytest.approx(cal.predict(gpipe), rel=1e-6)
    assert float(dp.simulate(zb, hw).makespan) == pytest.approx(cal.predict(zb, weight_fraction=0.25), rel=1e-6)
    chex.assert_trees_all_close(np.asarray(hw.input_grad), np.asarray([2.25, 2.25]))


def test_an_unsplit_workload_or_sweep_refuses_split_schedules():
    # The other ways a full-backward calibration reaches the cost model: its Workload (optimize, or
    # Workload.hardware) and a sweep over its Hardware (whose stacked leaves lose the flag). Each
    # must refuse I/W ops in one line, not price I as the whole backward and W as free.
    cal = calibrate.from_measurements([1.0, 1.0], [3.0, 3.0], overhead=0.1)
    gpipe, zb = get("gpipe", devices=2, microbatches=4), get("zb-h1", devices=2, microbatches=4)
    for workload in (cal.workload(), cal.workload(gpipe)):
        assert not workload.split_known
        hw = workload.hardware(workload.default_boundaries(2))
        for run, args in ((dp.optimize, (zb, workload, dp.StageBalance(2))), (dp.simulate, (zb, hw))):
            with pytest.raises(dp.ConfigError, match="knows only full backwards") as info:
                run(*args)
            assert "\n" not in str(info.value)
        assert float(dp.simulate(gpipe, hw).makespan) == pytest.approx(cal.predict(gpipe), rel=1e-6)
    # a calibration that measured the split still gives an unsplit table for a full-backward schedule
    measured = calibrate.from_measurements([1.0, 1.0], [3.0, 3.0], input_grad=[1.0, 1.0], weight=[1.5, 1.5])
    assert not measured.workload(gpipe).split_known and measured.workload(zb).split_known
    split = cal.workload(weight_fraction=0.25)
    assert split.split_known and [float(x) for x in split.weight] == pytest.approx([0.75, 0.75])
    assert dp.optimize(zb, split, dp.StageBalance(2), steps=2).plan.layers_per_stage == (1, 1)
    # a sweep skips the split schedule with the reason and prices the others
    result = dp.sweep(cal.hardware(), families=[], schedules=[gpipe, zb])
    assert list(result.columns["family"]) == ["gpipe"]
    assert float(result.columns["makespan"][0]) == pytest.approx(cal.predict(gpipe), rel=1e-6)
    assert [s["family"] for s in result.skipped] == ["zb-h1"] and "knows only full backwards" in \
        result.skipped[0]["reason"]
    with pytest.raises(dp.ConfigError, match="no combination .* knows only full backwards"):
        dp.sweep(cal.hardware(), families=[], schedules=[zb])
    both = dp.sweep(cal.hardware(weight_fraction=0.25), families=[], schedules=[gpipe, zb])
    assert list(both.columns["family"]) == ["gpipe", "zb-h1"]


def test_the_split_of_a_full_backward_from_a_probe_or_the_model():
    full = calibrate.from_measurements([1.0, 1.0], [3.0, 8.0])
    # a probe of the same stages (profile_stages' convention: stage 0 has no I), split costs more than B
    probe = calibrate.from_measurements([1.0, 1.0], [2.0, 4.0], input_grad=[0.0, 2.5], weight=[2.0, 2.0])
    cal = full.with_split(probe=probe)
    chex.assert_trees_all_close(np.asarray(cal.backward_split), np.asarray([(0.0, 1.0), (0.625, 0.5)]))
    assert "probe" in cal.split_source
    zb = cal.times(get("zb-h1", devices=2, microbatches=4))
    assert zb["input_grad"] == pytest.approx([0.0, 5.0]) and zb["weight"] == pytest.approx([3.0, 4.0])
    assert zb["full_backward"] == pytest.approx([3.0, 8.0])  # measured B stays the B
    # the other way: a split source prices a full B as (I + W) x B / (I + W) of the probe
    split = calibrate.from_measurements([1.0, 1.0], input_grad=[0.0, 5.0], weight=[3.0, 4.0]).with_split(probe=probe)
    assert split.times(get("1f1b", devices=2, microbatches=4))["input_grad"] == pytest.approx([3.0, 8.0])
    # a Transformer's FLOPs (GPT block: I = M + 2A, W = M with M = 24 b s h^2, A = 4 b s^2 h; head F = I = W)
    b, s, h, v = 1, 32, 64, 100
    model = dp.Transformer(4, h, 4, s, v)
    by_model = calibrate.from_measurements([1.0] * 4, [2.0] * 4).with_split(model=model)
    m, a, head = 24 * b * s * h * h, 4 * b * s * s * h, 2 * b * s * h * v
    expected = [(0.0, 1.0), *[((m + 2 * a) / (2 * m + 2 * a), m / (2 * m + 2 * a))] * 2,
                ((m + 2 * a + head) / (2 * m + 2 * a + 2 * head), (m + head) / (2 * m + 2 * a + 2 * head))]
    chex.assert_trees_all_close(np.asarray(by_model.backward_split), np.asarray(expected), rtol=1e-9)
    uneven = calibrate.from_measurements([1.0] * 2, [2.0] * 2).with_split(model=model, layers_per_stage=[1, 3])
    assert uneven.backward_split[1] != pytest.approx(expected[1])
    assert by_model.hardware().split_known
    for kwargs, message in [({}, "exactly one of model= or probe="),
                            ({"model": model, "probe": probe}, "exactly one"),
                            ({"probe": calibrate.from_measurements([1.0], [1.0])}, "probe timed 1 stages"),
                            ({"probe": full}, "no full backward and I/W split for stage 0"),
                            ({"model": "gpt"}, "must be a diffpipe.Transformer")]:
        with pytest.raises(dp.ConfigError, match=message):
            full.with_split(**kwargs)


def test_the_trace_takes_the_model_for_the_split(tmp_path):
    files = _runtime_files(tmp_path)
    model = dp.Transformer(2, 64, 4, 32, 100)
    cal = calibrate.from_torch_trace(files, model=model)
    assert cal.backward_split[0] == (0.0, 1.0) and 0 < cal.backward_split[1][1] < 1
    zb = get("zb-h1", devices=2, microbatches=2)
    assert cal.predict(zb) > 0 and math.isfinite(cal.residual["step"])
    assert cal.spread["F0"] == pytest.approx(0.0, abs=1e-9)  # every synthetic op lasts the same
    assert calibrate.from_torch_trace(files).predict(get("gpipe", devices=2, microbatches=2)) == pytest.approx(
        cal.predict(get("gpipe", devices=2, microbatches=2)), rel=1e-6)  # the split does not move a full B


def test_the_machine_file_keeps_the_mode_and_the_split(tmp_path, capsys):
    pytest.importorskip("torch.distributed.pipelining")
    cal = calibrate.from_measurements([1.0, 1.2], [2.0, 2.4], overhead=0.05, p2p=0.3)
    gpipe, zb = get("gpipe", devices=2, microbatches=4), get("zb-h1", devices=2, microbatches=4)
    full = tmp_path / "full.toml"
    cal.to_toml(full, mode="torch-runtime")
    assert tomllib.loads(full.read_text())["network"] == {"mode": "torch-runtime"}
    args = ["--devices", "2", "--microbatches", "4", "--json"]
    assert cli.main(["simulate", "gpipe", *args, "--config", str(full)]) == 0
    got = json.loads(capsys.readouterr().out)["makespan_s"]
    assert got == pytest.approx(cal.predict(gpipe, mode="torch-runtime"), rel=1e-6)
    assert got != pytest.approx(cal.predict(gpipe), rel=1e-6)  # the mode was read, not defaulted
    assert cli.main(["simulate", "zb-h1", *args, "--config", str(full)]) == 2  # split_known = false
    assert "knows only full backwards" in capsys.readouterr().err
    split = tmp_path / "split.toml"
    cal.to_toml(split, mode=calibrate.TorchRuntime(), weight_fraction=0.4)
    data = tomllib.loads(split.read_text())
    assert "split_known" not in data["times"] and data["times"]["full_backward"] == [2.0, 2.4]
    for name, schedule in (("gpipe", gpipe), ("zb-h1", zb)):
        assert cli.main(["simulate", name, *args, "--config", str(split)]) == 0
        assert json.loads(capsys.readouterr().out)["makespan_s"] == pytest.approx(
            cal.predict(schedule, mode="torch-runtime", weight_fraction=0.4), rel=1e-6)


def test_a_machine_file_s_mode_goes_to_compile(tmp_path, capsys):
    """``[network] mode`` is the mode schedules compile under (``FileMachine.communication``; a
    ``Hardware`` holds none): the given one, else ``contention`` on the default machine's links and
    ``overlap`` on links the file names; the CLI simulates under it."""
    files = {"blocking": '[network]\nmode = "blocking"\n', "contention": '[device]\npreset = "A100"\n',
             "overlap": '[network]\nintra = "nvlink4"\n'}
    for mode, text in files.items():
        path = tmp_path / f"{mode}.toml"
        path.write_text(text)
        machine = dp.load_machine(path)
        assert machine.communication == mode and not hasattr(machine.network, "mode")
        schedule = get("1f1b", devices=4, microbatches=4)
        want = dp.simulate(schedule, machine.hardware(schedule), communication=mode)
        assert cli.main(["simulate", "1f1b", "--devices", "4", "--microbatches", "4", "--json",
                         "--config", str(path)]) == 0
        assert json.loads(capsys.readouterr().out)["makespan_s"] == float(want.makespan), mode
        assert float(want.makespan) != float(dp.simulate(schedule, machine.hardware(schedule),
                                                         communication="none").makespan)


def test_load_machine_reads_what_to_toml_writes(tmp_path):
    """``dp.load_machine``, the library's reader of the format ``to_toml`` writes: its machine
    prices every schedule as the calibration does, the mode included; errors name the file's key."""
    cal = calibrate.from_measurements([1.0, 1.2], input_grad=[1.0, 1.1], weight=[0.5, 0.6], overhead=0.05,
                                      p2p=0.3, send_cost=0.01)
    path = tmp_path / "m.toml"
    cal.to_toml(path, mode="rendezvous")
    machine = dp.load_machine(path)
    for name in ("gpipe", "zb-h1"):
        schedule = get(name, devices=2, microbatches=4)
        assert machine.communication == "rendezvous"
        got = float(dp.simulate(schedule, machine.hardware(schedule), communication=machine.communication).makespan)
        assert got == pytest.approx(cal.predict(schedule, mode="rendezvous"), rel=1e-6)
    assert got != pytest.approx(cal.predict(schedule), rel=1e-6)  # the mode was read, not defaulted
    bad = tmp_path / "bad.toml"
    bad.write_text("[times]\nforward = 1\nbackward = -1\n")
    with pytest.raises(dp.ConfigError, match=r"bad.toml: \[times\] backward must be"):
        dp.load_machine(bad)
    bad.write_text('[training]\nmodel = "llama-3-8b"\n')
    with pytest.raises(dp.ConfigError, match=r"\[training\] cannot be used by 'load_machine'"):
        dp.load_machine(bad)


def test_several_runs_combine_with_each_terms_spread():
    # a full-backward run (B) and a zero-bubble run (I, W) of the same 2 stages
    full = calibrate.Calibration(forward=(1.0, 2.0), backward=(3.0, 4.0), overhead=0.1, p2p=0.2, setup=0.5,
                                 overhead_by_kind={"F": 0.1}, samples={"F0": 4, "F1": 4, "B0": 4, "B1": 4},
                                 stage_ranks=(0, 1), residual={"step": -0.02})
    split = calibrate.Calibration(forward=(1.6, 2.0), input_grad=(1.0, 2.5), weight=(2.5, 2.0), overhead=0.3,
                                  p2p=0.2, setup=0.7, overhead_by_kind={"F": 0.2, "W": 0.4},
                                  samples={"F0": 12, "F1": 12, "I0": 12, "I1": 12, "W0": 12, "W1": 12},
                                  spread={"I0": 0.05}, stage_ranks=(0, 1), residual={"step": 0.03})
    cal = calibrate.combine([full, split])
    assert cal.forward == pytest.approx((1.45, 2.0))  # weighted by samples: (4 x 1.0 + 12 x 1.6) / 16
    assert cal.backward == (3.0, 4.0) and cal.input_grad == (1.0, 2.5) and cal.weight == (2.5, 2.0)
    assert cal.samples["F0"] == 16 and cal.samples["B1"] == 4
    assert cal.overhead == pytest.approx(0.2) and cal.overhead_by_kind == pytest.approx({"F": 0.15, "W": 0.4})
    assert cal.setup == pytest.approx(0.6) and cal.p2p == pytest.approx(0.2)
    # the spread between runs (relative standard deviation), where two runs measured a term; else the run's own
    assert cal.spread["F0"] == pytest.approx(np.std([1.0, 1.6], ddof=1) / 1.3)
    assert cal.spread["F1"] == pytest.approx(0.0) and cal.spread["p2p"] == pytest.approx(0.0)
    assert cal.spread["overhead"] == pytest.approx(np.std([0.1, 0.3], ddof=1) / 0.2)
    assert cal.spread["I0"] == 0.05 and "overhead_W" not in cal.spread
    assert cal.residual["step"] == pytest.approx(0.03) and cal.stage_ranks == (0, 1)
    # both backwards measured: every schedule is priced, a B at the measured B
    times = cal.times(get("zb-h1", devices=2, microbatches=4))
    assert times["input_grad"] == [1.0, 2.5] and times["full_backward"] == [3.0, 4.0]
    with pytest.raises(dp.ConfigError, match="run 1 has 1 stages, run 0 has 2"):
        calibrate.combine([full, calibrate.from_measurements([1.0], [2.0])])
    with pytest.raises(dp.ConfigError, match="non-empty list"):
        calibrate.combine([])


def _round(forward, backward, *, overhead=0.1, p2p=0.2, samples=20):
    return calibrate.Calibration(forward=forward, backward=backward, overhead=overhead, p2p=p2p,
                                 samples={f"{k}{s}": samples for k in "FB" for s in range(len(forward))},
                                 stage_ranks=(0, 1))


def test_combine_by_the_median_of_runs_leaves_a_stalled_run_out_of_the_op_times():
    # five repetitions of one job; the fourth stalled in its backward throughout (as the validation
    # study's round 3: every sample slow, so its own fences kept them)
    runs = [_round((1.0, 2.0), (3.0, 4.0)), _round((1.1, 2.1), (3.1, 4.1)), _round((0.9, 1.9), (2.9, 3.9)),
            _round((1.0, 2.0), (9.0, 12.0), overhead=0.3, p2p=0.5), _round((1.05, 2.05), (3.05, 4.05))]
    pooled, median = calibrate.combine(runs), calibrate.combine(runs, op_times="median")
    assert pooled.backward == pytest.approx((4.21, 5.61))  # the stall lifts every prediction
    assert median.backward == pytest.approx((3.05, 4.05)) and median.forward == pytest.approx((1.0, 2.0))
    # the per-op terms stay the plain mean over runs, the spread and samples as pooled
    assert median.overhead == pytest.approx(pooled.overhead) == pytest.approx(0.14)
    assert median.p2p == pytest.approx(0.26) and median.spread == pooled.spread and median.samples == pooled.samples
    schedule = get("1f1b", devices=2, microbatches=4)
    assert median.predict(schedule) < pooled.predict(schedule)
    # only the runs that measured a term: a split run's I/W, a full run's B; two runs, their mean
    split = calibrate.Calibration(forward=(1.2, 2.2), input_grad=(1.0, 2.0), weight=(2.0, 2.0),
                                  samples={"F0": 12, "F1": 12}, stage_ranks=(0, 1))
    both = calibrate.combine([runs[0], split], op_times="median")
    assert both.forward == pytest.approx((1.1, 2.1)) and both.backward == (3.0, 4.0) and both.input_grad == (1.0, 2.0)
    with pytest.raises(dp.ConfigError, match="op_times='mean': give one of pooled, median"):
        calibrate.combine(runs, op_times="mean")


def test_the_calibrate_command_takes_several_runs(tmp_path, capsys):
    first = _runtime_files(tmp_path)
    (tmp_path / "b").mkdir()
    second = _runtime_files(tmp_path / "b", steps=3)
    files = [str(f) for f in (*first, *second)]
    assert cli.main(["calibrate", *files, "--schedule", "gpipe", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["source"].startswith("2 runs:") and data["samples"]["F0"] == 4 + 6
    assert data["forward"] == pytest.approx([100 * US, 150 * US]) and data["spread"]["overhead"] == pytest.approx(0.0)
    assert cli.main(["calibrate", *files, "--schedule", "gpipe,gpipe,gpipe"]) == 2
    assert "3 schedule(s) for 2 run(s)" in capsys.readouterr().err


def test_workload_spreads_each_stage_over_its_layers():
    cal = calibrate.from_measurements([2.0, 3.0], [4.0, 6.0], overhead=0.1, p2p=0.2)
    workload = cal.workload(layers=[2, 3])
    assert [float(x) for x in workload.forward] == pytest.approx([1.0, 1.0, 1.0, 1.0, 1.0])
    assert [float(x) for x in workload.input_grad] == pytest.approx([2.0, 2.0, 2.0, 2.0, 2.0])
    assert float(workload.overhead) == pytest.approx(0.1)
    # the calibrated step and per-kind terms go with it
    assert [float(x) for x in workload.full_backward] == pytest.approx([2.0, 2.0, 2.0, 2.0, 2.0])
    assert workload.setup is not None and float(workload.setup) == 0.0
    timed = calibrate.from_measurements([2.0, 3.0], [4.0, 6.0], overhead=0.1, setup=0.3, wind_down=0.2)
    timed = dataclasses.replace(timed, overhead_by_kind={"F": 0.15})
    workload = timed.workload(layers=[2, 3])
    hw = workload.hardware(workload.default_boundaries(2))
    chex.assert_trees_all_close(
        (hw.kind_overhead, hw.full_backward, hw.setup, hw.wind_down),
        (np.array([0.15, 0.1, 0.1, 0.1]), np.array([4.0, 6.0]), np.array(0.3), np.array(0.2)), rtol=1e-6)
    gpipe = get("gpipe", devices=2, microbatches=3)
    assert float(dp.simulate(gpipe, hw).makespan) == pytest.approx(timed.predict(gpipe), rel=1e-6)
    with pytest.raises(dp.ConfigError, match="layers has 1 entries, the calibration 2 stages"):
        cal.workload(layers=[1])
    with pytest.raises(dp.ConfigError, match="layers must be an integer >= 1"):
        cal.workload(layers=[1, 0])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"forward": [1.0, -1.0], "backward": [1.0, 1.0]}, r"forward\[1\] must be non-negative and finite"),
        ({"forward": [1.0, 1.0], "backward": [1.0]}, "backward has 1 values, forward has 2"),
        ({"forward": [1.0, 1.0]}, "give backward"),
        ({"forward": [1.0], "backward": [1.0], "overhead": math.nan}, "overhead must be non-negative and finite"),
        ({"forward": 1.0, "backward": 1.0}, "one value per stage"),
    ],
)
def test_from_measurements_checks(kwargs, message):
    with pytest.raises(dp.ConfigError, match=message):
        calibrate.from_measurements(**kwargs)


def test_machine_file_runs_in_the_cli(tmp_path, capsys):

    cal = calibrate.from_measurements([1.0, 2.0], [2.0, 4.0], overhead=0.1, p2p=0.05, setup=0.3)
    path = tmp_path / "machine.toml"
    cal.to_toml(path)
    data = tomllib.loads(path.read_text())
    assert data["times"] == {"forward": [1.0, 2.0], "backward": [2.0, 4.0], "weight": [0.0, 0.0],
                             "p2p": 0.05, "overhead": 0.1, "setup": 0.3, "wind_down": 0.0, "split_known": False}
    assert cli.main(["simulate", "gpipe", "--devices", "2", "--microbatches", "2", "--config", str(path),
                     "--json"]) == 0
    simulated = json.loads(capsys.readouterr().out)["makespan_s"]
    hw_time = float(dp.simulate(get("gpipe", devices=2, microbatches=2), cal.hardware()).makespan)
    assert simulated == pytest.approx(hw_time)
    assert cal.predict(get("gpipe", devices=2, microbatches=2)) == pytest.approx(hw_time)
    # the setup is a term of the hardware (and of the machine file), not added on top
    no_setup = calibrate.from_measurements([1.0, 2.0], [2.0, 4.0], overhead=0.1, p2p=0.05)
    assert hw_time == pytest.approx(float(dp.simulate(get("gpipe", devices=2, microbatches=2),
                                                      no_setup.hardware()).makespan) + 0.3)
    text = cal.to_json(tmp_path / "cal.json")
    assert json.loads((tmp_path / "cal.json").read_text()) == json.loads(text)


def test_cli_calibrate_writes_a_machine_file_for_the_schedule(tmp_path, capsys):
    files = _runtime_files(tmp_path)
    out = tmp_path / "m.toml"
    cal = calibrate.cli_calibrate(files, "gpipe", out)
    assert cal.orders is not None
    times = tomllib.loads(out.read_text())["times"]
    assert times["forward"] == pytest.approx([100 * US, 150 * US])
    # every fitted term is in the file, and the CLI reads it back into the same hardware
    assert times["overhead_F"] == pytest.approx(25 * US) and times["overhead_B"] == pytest.approx(20 * US)
    assert times["setup"] == pytest.approx(75 * US) and times["wind_down"] == pytest.approx(30 * US)
    assert times["send_cost"] == pytest.approx(10 * US) and times["recv_cost"] == pytest.approx(10 * US)
    gpipe = get("gpipe", devices=2, microbatches=2)
    hw = cal.hardware(gpipe)
    assert np.asarray(hw.kind_overhead) == pytest.approx([25 * US, 20 * US, 22.5 * US, 22.5 * US])
    assert float(hw.send_cost) == pytest.approx(10 * US) and float(hw.recv_cost) == pytest.approx(10 * US)
    assert cli.main(["simulate", "gpipe", "--devices", "2", "--microbatches", "2", "--config", str(out),
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan_s"] == pytest.approx(cal.predict(gpipe), rel=1e-6)
    with pytest.raises(dp.ConfigError, match="rank 0 ran 0B0 at position 2 where the schedule has 0I0|torch"):
        calibrate.cli_calibrate(files, "zb-h1", tmp_path / "n.toml")
    assert not (tmp_path / "n.toml").exists()


def test_profile_stages_times_torch_modules():
    torch = pytest.importorskip("torch")
    from torch import nn

    torch.manual_seed(0)
    stages = [nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(3)]
    cal = calibrate.profile_stages(stages, torch.randn(4, 8), repeats=3, warmup=1, overhead=1e-4,
                                   loss_fn=lambda out: out.square().mean())
    for values in (cal.forward, cal.backward, cal.input_grad[1:], cal.weight):
        assert all(v > 0 and math.isfinite(v) for v in values)
    assert cal.input_grad[0] == 0.0  # torch's stage 0: no input gradient, the whole backward in W
    assert cal.overhead == 1e-4
    assert all(p.grad is not None for s in stages for p in s.parameters())
    assert float(dp.simulate(get("zb-h1", devices=3, microbatches=3), cal.hardware(
        get("zb-h1", devices=3, microbatches=3))).makespan) > 0


# -- a real run, end to end ----------------------------------------------------------------------------

_RUN = Path(__file__).resolve().parents[1] / "papers" / "validation" / "run.py"


def _runner():
    spec = importlib.util.spec_from_file_location("validation_run", _RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    pytest.importorskip("torch.distributed.pipelining")
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    run = _runner()
    work = tmp_path_factory.mktemp("calibrate_run")
    to_torch_csv(get("1f1b", devices=2, microbatches=4), work / "1f1b.csv")
    jobs = [
        run.job("gpipe", "GPipe", microbatches=4),
        run.job("1f1b", "csv", microbatches=4, csv=str(work / "1f1b.csv")),
        run.job("zbv", "ZBVZeroBubble", microbatches=4, blocks=[2, 1, 1, 2]),  # uneven stages
        run.job("interleaved", "Interleaved1F1B", microbatches=4, stages_per_rank=2),  # a loop, 2 per rank
        run.job("looped", "LoopedBFS", microbatches=4, stages_per_rank=4, width=16),  # 8 stages, 4 per rank
        run.job("interleaved4", "Interleaved1F1B", microbatches=4, stages_per_rank=4, width=16),  # a loop, 4 per rank
    ]
    failure = run.run_jobs(jobs, work, timeout_s=90)
    return work, failure


#: job name -> the diffpipe schedule it ran.
RAN = {
    "gpipe": lambda: from_torch("GPipe", 2, 4),
    "1f1b": lambda: get("1f1b", devices=2, microbatches=4),
    "zbv": lambda: from_torch("ZBVZeroBubble", 2, 4),
}
#: job name -> schedules to predict from its calibration (same stage count).
PREDICT = {
    "gpipe": lambda: [get("gpipe", devices=2, microbatches=4), get("1f1b", devices=2, microbatches=8),
                      get("zb-h1", devices=2, microbatches=4)],
    "1f1b": lambda: [get("gpipe", devices=2, microbatches=8), get("1f1b", devices=2, microbatches=4)],
    "zbv": lambda: [from_torch(name, 2, 4, 2) for name in
                    ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble")],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RAN))
def test_real_run_calibrates_and_predicts(real_run, name):
    work, failure = real_run
    files = [work / f"{name}.rank{r}.json" for r in range(2)]
    if not all(f.exists() for f in files):
        pytest.fail(f"the torch run of {name} did not complete:\n{failure}")
    schedule = RAN[name]()
    probe = None
    if name == "gpipe":  # full backwards only: the I/W split from a probe of the same torch modules
        import torch

        probe = calibrate.profile_stages(list(_runner()._blocks(2, 64)), torch.randn(8, 64), repeats=3, warmup=1)
    cal = calibrate.from_torch_trace(files, schedule, probe=probe)  # raises unless every rank ran the order
    assert cal.hardware().split_known == (name != "1f1b")
    assert cal.orders == tuple(tuple(str(op) for op in order) for order in schedule.orders)
    # Every fitted term positive (or, for p2p beyond the overhead, non-negative) and finite.
    measured = [v for kind in (cal.forward, cal.backward, cal.input_grad, cal.weight) if kind for v in kind]
    assert measured and all(v is not None and v > 0 and math.isfinite(v) for v in measured)
    assert cal.overhead > 0 and cal.step_time > 0 and math.isfinite(cal.residual["step"])
    assert cal.transfer is not None and cal.transfer > 0 and 0 <= cal.p2p < math.inf
    # the host time of a transfer: one SEND (GPipe: c10d::send) and one RECV per cross-rank
    # transfer of each of the 2 traced steps
    moves = sum(dep.src != dep.dst for op in schedule.ops for dep in schedule.dependencies[op])
    assert cal.samples["send_cost"] == cal.samples["recv_cost"] == 2 * moves
    assert 0 < cal.send_cost < math.inf and 0 < cal.recv_cost < math.inf
    assert cal.spread["send_cost"] is not None and cal.spread["recv_cost"] is not None
    hw = cal.hardware()
    assert float(hw.send_cost) == pytest.approx(cal.send_cost) and float(hw.recv_cost) == pytest.approx(cal.recv_cost)
    # A prediction for every schedule with the same stage count (in the study's headline mode;
    # the residual above replayed the traced schedule in the default overlap mode).
    for other in PREDICT[name]():
        predicted = cal.predict(other, mode="torch-runtime")
        assert math.isfinite(predicted) and predicted > 0, other
    # torch posted every receive where TorchRuntime says it does (ScheduleGPipe labels no receives).
    if name != "gpipe":
        posts = calibrate.receive_posts(schedule)
        traced = {}
        for f in files:
            traced.update(_traced_receive_posts(f))
        assert traced == {op: posts[op] for op in traced} and len(traced) == len(posts)
    # The page faults of every traced step, as the study reads them (README: a first touch stalls an op).
    metas = [json.loads((work / f"{name}.rank{r}.meta.json").read_text()) for r in range(2)]
    assert all(len(m["minor_faults"]) == len(m["step_s"]) == 2 and min(m["minor_faults"]) >= 0 for m in metas)
    # Memory: diffpipe's peak stored activations equal what torch held, on every rank.
    peaks = [m["peak_stored"] for m in metas]
    result = dp.simulate(schedule, cal.hardware(schedule))
    assert [int(x) for x in result.peak_activations] == peaks


def test_the_study_warms_every_job_up_before_the_traced_round():
    run = _runner()
    meta = {key: {"kind": kind, "microbatches": 4, "spr": 1, "width": 64, "rows": 8, "blocks": None, "csv": None}
            for key, kind in (("a", "GPipe"), ("b", "1F1B"))}
    jobs = run.study_jobs(meta, rounds=2, steps=3, warmup_rounds=1)
    assert [j["name"] for j in jobs] == ["a.w0", "b.w0", "a.r0", "b.r0", "a.r1", "b.r1"]
    # the warm-up round: as many steps as a measured one (the profiler's memory grows with them), no
    # trace; only round 0 is traced; every job keeps its own warm-up step
    assert [(j["steps"], j["trace"], j["warmup"]) for j in jobs] == [(3, False, 1)] * 2 + [(3, True, 1)] * 2 + [
        (3, False, 1)] * 2
    assert [j["name"] for j in run.study_jobs(meta, rounds=1, steps=3, warmup_rounds=0)] == ["a.r0", "b.r0"]
    traced = run.study_jobs(meta, rounds=2, steps=3, warmup_rounds=1, trace_all=True)
    assert [j["trace"] for j in traced] == [False] * 2 + [True] * 4  # every measured round, never a warm-up


def test_the_study_calibrates_from_every_traced_round(real_run, tmp_path):
    work, failure = real_run
    run = _runner()
    schedule = RAN["gpipe"]()
    for r in range(2):  # the same run's traces as two rounds of one case
        for k in range(2):
            (tmp_path / f"c.r{r}.rank{k}.json").write_bytes((work / f"gpipe.rank{k}.json").read_bytes())
    once = calibrate.from_torch_trace([work / f"gpipe.rank{k}.json" for k in range(2)], schedule)
    (tmp_path / "c.r1.rank1.json").unlink()  # round 1 not traced on every rank: round 0 alone
    assert run._calibrate(tmp_path, "c", 2, schedule).samples == once.samples
    (tmp_path / "c.r1.rank1.json").write_bytes((work / "gpipe.rank1.json").read_bytes())
    both = run._calibrate(tmp_path, "c", 2, schedule)
    assert both.samples["F0"] == 2 * once.samples["F0"] and both.forward == pytest.approx(once.forward)
    assert both.step_time == pytest.approx(once.step_time) and both.orders == once.orders
    assert both.predict(schedule, mode="torch-runtime") == pytest.approx(once.predict(schedule, mode="torch-runtime"))


def test_the_study_combines_its_rounds_op_times_by_their_median(tmp_path, monkeypatch):
    # each round's calibration stands in for its traces; round 2 stalled in stage 1's backward
    run = _runner()
    stalled = {2}
    def fake(paths, schedule):
        r = int(Path(paths[0]).name.split(".r")[1].split(".")[0])
        cal = _round((1.0, 2.0), (3.0, 12.0) if r in stalled else (3.0, 4.0 + 0.1 * r))
        return dataclasses.replace(cal, step_time=30.0 if r in stalled else 20.0 + r, orders=(("0F0",), ("1F0",)))
    monkeypatch.setattr(calibrate, "from_torch_trace", fake)
    for r in range(5):
        for k in range(2):
            (tmp_path / f"c.r{r}.rank{k}.json").write_text("{}")
    cal = run._calibrate(tmp_path, "c", 5, get("1f1b", devices=2, microbatches=4))
    assert cal.backward == pytest.approx((3.0, 4.3))  # the median of 4.0, 4.1, 12.0, 4.3, 4.4
    assert cal.step_time == pytest.approx(23.0) and cal.orders == (("0F0",), ("1F0",))


def _rounds_module():
    spec = importlib.util.spec_from_file_location("validation_rounds", _RUN.parent / "rounds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rounds_analysis_tells_a_stalled_round_from_exchangeable_ones():
    rounds = _rounds_module()
    # chi-squared tails at table values (0.001 at 18.467 on 4 degrees of freedom, 0.05 at 3.841 on 1)
    assert rounds.chi2_sf(18.467, 4) == pytest.approx(1e-3, rel=1e-3)
    assert rounds.chi2_sf(3.841, 1) == pytest.approx(0.05, rel=1e-3)
    assert rounds.chi2_sf(11.070, 5) == pytest.approx(0.05, rel=1e-3) and rounds.chi2_sf(0.0, 3) == 1.0
    assert rounds.rounds_p_value([2.0] * 5, [0.1] * 5) == pytest.approx(1.0)
    steady = [_round((1.0, 2.0), (3.0, 4.0 + 0.01 * r)) for r in range(5)]
    spread = {f"{k}{s}": 0.1 for k in "FB" for s in range(2)}
    steady = [dataclasses.replace(c, spread=spread) for c in steady]
    assert all(p > 0.5 for p in rounds.op_term_p_values(steady)) and len(rounds.op_term_p_values(steady)) == 4
    stalled = [*steady[:3], dataclasses.replace(steady[3], backward=(3.0, 6.0)), steady[4]]
    p = rounds.op_term_p_values(stalled)
    assert sum(x < rounds.ALPHA for x in p) == 1  # stage 1's B alone: 20 samples of 10% spread cannot reach 6.0


def test_the_rounds_analysis_puts_a_sources_error_on_the_family_that_differs():
    rounds = _rounds_module()
    schedules = {"g.a": get("gpipe", devices=2, microbatches=4), "g.b": get("1f1b", devices=2, microbatches=4)}
    cals = {"g.a": _round((1.0, 1.0), (2.0, 2.0)), "g.b": _round((1.2, 1.2), (2.4, 2.4))}
    measured = {k: cals[k].predict(schedules[k], mode="torch-runtime") for k in cals}  # each predicts itself
    rows = rounds.attribute(cals, schedules, measured, ["g.a", "g.b"])
    assert len(rows) == 2
    for row in rows:
        assert row["self"] == pytest.approx(0.0, abs=1e-9)
        assert row["ops"] == pytest.approx(row["error"]) and abs(row["error"]) > 0.1  # all of it the op times'
        assert row["overhead"] == row["communication"] == row["ends"] == pytest.approx(0.0, abs=1e-9)


def test_the_study_reads_page_faults_per_round_where_they_were_counted(tmp_path):
    run = _runner()
    for r, faults in enumerate(([900, 20], [30, 10])):
        for k in range(2):
            (tmp_path / f"c.r{r}.rank{k}.meta.json").write_text(json.dumps(
                {"step_s": [0.01, 0.02], "runqueue_wait_s": [0.0, 0.0], "minor_faults": [f + k for f in faults]}))
    got = run._measured(tmp_path, "c", 2)
    assert got["minor_faults"] == [[901, 21], [31, 11]]  # per round and step, the rank with more
    case = {**got, "calibration": {"step_time": 0.03}}
    assert run._faults(case) == "461 / 21" and run._traced_ratio(case) == f"{0.03 / got['measured_s']:.2f}"
    for k in range(2):  # traces from before the count: no faults, and the table says so
        (tmp_path / f"c.r0.rank{k}.meta.json").write_text(json.dumps({"step_s": [0.01], "runqueue_wait_s": [0.0]}))
    assert run._measured(tmp_path, "c", 1)["minor_faults"] is None
    assert run._faults({"minor_faults": None}) == "n/a" and run._traced_ratio({"calibration": None}) == "n/a"


def test_the_study_measures_a_case_from_all_its_steps_not_the_stalled_quiet_ones(tmp_path):
    # the 23:52 run's 2_stages.m16.diffpipe_1f1b__CSV in miniature: most steps ~115 ms with the
    # rank's own gloo threads waiting 6-13% of them; three steps stalled to 160-240 ms with the
    # same few ms of wait, so under 5%: the old rule took their median (217.6 ms) as the case's
    run = _runner()
    steps = [0.115, 0.113, 0.116, 0.114, 0.115, 0.2176, 0.2391, 0.1603, 0.112, 0.117]
    waits = [0.012, 0.010, 0.009, 0.014, 0.008, 0.0073, 0.0058, 0.0067, 0.011, 0.015]
    for k in range(2):
        (tmp_path / f"c.r0.rank{k}.meta.json").write_text(json.dumps(
            {"step_s": steps, "runqueue_wait_s": waits if k else [0.0] * len(steps)}))
    got = run._measured(tmp_path, "c", 1)
    assert got["quiet_steps"] == 3 and got["samples"] == 10  # still counted: a diagnostic of the load
    assert got["measured_s"] == pytest.approx(0.1155) and got["measured_from"] == "all steps"


def test_the_study_states_the_noise_floor_of_a_case_from_its_round_medians(tmp_path):
    # round medians 100, 104, 96, 101 and a stalled 150 ms: their median is 101, absolute deviations
    # 1, 3, 5, 0, 49, so the MAD is 3 ms (the stalled round does not set it), sigma 1.4826 x 3 ms
    run = _runner()
    for r, ms in enumerate((100, 104, 96, 101, 150)):
        for k in range(2):
            (tmp_path / f"c.r{r}.rank{k}.meta.json").write_text(json.dumps(
                {"step_s": [(ms - 1) / 1e3, ms / 1e3, (ms + 1) / 1e3], "runqueue_wait_s": [0.0] * 3}))
    got = run._measured(tmp_path, "c", 5)
    assert got["round_medians_s"] == pytest.approx([0.100, 0.104, 0.096, 0.101, 0.150])
    sigma = 1.4826 * 0.003
    expected = (2 / math.pi) ** 0.5 * 1.2533 * sigma / 5 ** 0.5 / got["measured_s"]
    assert run.noise_floor(got) == pytest.approx(expected)
    assert run.noise_floor({**got, "round_medians_s": [0.1]}) is None  # one round: no estimate
    assert run.noise_floor({"measured_s": 0.1}) is None  # results from before the medians were kept


def test_the_study_separates_two_cases_by_the_standard_error_of_their_medians():
    # 1.2533 sigma / sqrt(rounds), sigma = IQR / 1.349: an IQR of 10 ms over 6 rounds is 3.79 ms
    run = _runner()
    assert run.median_standard_error(0.010, 6) == pytest.approx(1.2533 * 0.010 / 1.349 / 6 ** 0.5)

    def case(ms, iqr_ms):
        return {"measured_s": ms / 1e3, "median_se_s": run.median_standard_error(iqr_ms / 1e3, 6)}

    # twice the difference's standard error is 2 x 3.79 x sqrt(2) = 10.7 ms
    assert run.separated_beyond_noise(case(100, 10), case(111, 10))
    assert not run.separated_beyond_noise(case(100, 10), case(110, 10))
    assert run.separated_beyond_noise(case(111, 10), case(100, 10))  # symmetric


@pytest.mark.parametrize("name, schedules", [("zbv", ("ZBVZeroBubble", "zb-v")),
                                             ("interleaved", ("Interleaved1F1B", "interleaved-1f1b")),
                                             ("looped", ("LoopedBFS", "looped-bfs")),
                                             ("interleaved4", ("Interleaved1F1B", "interleaved-1f1b"))])
def test_calibrate_command_names_a_schedule_with_several_stages_per_rank(real_run, tmp_path, capsys, name,
                                                                         schedules):
    # 2 ranks holding 2 stages each (a V and a loop), or 4 each (a loop of 8 stages): the schedule is
    # sized by ranks, not stages
    work, failure = real_run
    stages = 8 if name in ("looped", "interleaved4") else 4
    files = [str(work / f"{name}.rank{r}.json") for r in range(2)]
    if not all(Path(f).exists() for f in files):
        pytest.fail(f"the torch run of {name} did not complete:\n{failure}")
    for schedule in schedules:
        out = tmp_path / f"{schedule}.toml"
        assert cli.main(["calibrate", *files, "--schedule", schedule, "--out", str(out)]) == 0, \
            capsys.readouterr().err
        assert len(tomllib.loads(out.read_text())["times"]["forward"]) == stages
    capsys.readouterr()
    # a schedule of the wrong shape is still refused, in one line
    assert cli.main(["calibrate", *files, "--schedule", "GPipe"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diffpipe: error:") and err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.parametrize("name, layers", [("gpipe", [3, 1]), ("zbv", [2, 1, 1, 2]), ("interleaved4", None)])
def test_the_workload_of_a_real_run_predicts_as_the_calibration(real_run, name, layers):
    # Calibration.workload carries every calibrated term (the full backward, the per-kind
    # overheads, setup and wind-down): its hardware at the measured split, and the stage-balance
    # knob's hardware at that split, price every schedule as cal.predict does, in every mode
    work, failure = real_run
    files = [work / f"{name}.rank{r}.json" for r in range(2)]
    if not all(f.exists() for f in files):
        pytest.fail(f"the torch run of {name} did not complete:\n{failure}")
    cal = calibrate.from_torch_trace(files)
    assert cal.setup + cal.wind_down > 0 and len(set(cal.overhead_by_kind.values())) > 1
    stages = cal.stages
    others = {"gpipe": [get("gpipe", devices=2, microbatches=4), get("1f1b", devices=2, microbatches=8)],
              "zbv": [from_torch("ZBVZeroBubble", 2, 4), from_torch("Interleaved1F1B", 2, 4, 2),
                      get("zb-v", devices=2, microbatches=8)],
              "interleaved4": [from_torch("Interleaved1F1B", 2, 4, 4), from_torch("LoopedBFS", 2, 4, 4)]}[name]
    for schedule in others:
        assert schedule.stages == stages
        for mode in ("overlap", "torch-runtime"):
            workload = cal.workload(schedule, layers=layers)
            assert workload.setup is not None and workload.wind_down is not None
            boundaries = workload.default_boundaries(stages)
            expected = cal.predict(schedule, mode=mode)
            graph = workload.compile_schedule(schedule, communication=calibrate.communication_mode(mode))
            got = float(dp.simulate(graph, workload.hardware(boundaries)).makespan)
            assert got == pytest.approx(expected, rel=1e-6), (str(schedule), mode)
            knob = dp.StageBalance(stages)
            params = knob.init(workload, workload.layers_per_stage)
            balanced = knob(params, workload.with_split(None))
            assert float(dp.simulate(graph, balanced).makespan) == pytest.approx(expected, rel=1e-5)


def _traced_receive_posts(path: Path) -> dict:
    """From one rank's trace (its first step): per consumer op, the compute op after which that
    rank's ``PP:<stage>RECV_<F|B><mb>`` label ran (None: before its first compute)."""
    import re

    from diffpipe.schedules import Op

    labels = sorted((e for e in json.loads(path.read_text())["traceEvents"]
                     if e.get("ph") == "X" and str(e.get("name", "")).startswith("PP:")), key=lambda e: e["ts"])
    names = [e["name"][3:] for e in labels]
    names = names[:names.index(names[0], 1)] if names.count(names[0]) > 1 else names
    ops = [re.fullmatch(r"(\d+)([FBIW])(\d+)", n) for n in names]
    split = {int(m[1]) for m in ops if m and m[2] == "I"}
    posts, last = {}, None
    for text, m in zip(names, ops, strict=True):
        sub = re.fullmatch(r"\((.*)\)OVERLAP_F_B", text)
        if sub:
            m = re.fullmatch(r"(\d+)([FBIW])(\d+)", sub[1].split(";")[-1])
        if m:
            last = Op(m[2], int(m[1]), int(m[3]))
            continue
        recv = re.fullmatch(r"(\d+)RECV_([FB])(\d+)", text)
        if recv:
            stage = int(recv[1])
            kind = "F" if recv[2] == "F" else ("I" if stage in split else "B")
            posts[Op(kind, stage, int(recv[3]))] = last
    return posts


def test_calibrate_command_writes_the_machine_file_and_reports(tmp_path, capsys):
    files = [str(f) for f in _runtime_files(tmp_path)]
    out = tmp_path / "machine.toml"
    assert cli.main(["calibrate", *files, "--schedule", "gpipe", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "calibrated 2 stage(s), 2 rank(s)" in printed and f"wrote {out}" in printed
    # per stage and kind: the mean (ms), its spread and its sample count; no column for unmeasured kinds
    assert "stage  rank  F                 B\n" in printed and "0.15 (0.0%, n=4)" in printed and " I " not in printed
    assert "no I/W split" in printed
    assert tomllib.loads(out.read_text())["times"]["forward"] == pytest.approx([100 * US, 150 * US])
    assert cli.main(["calibrate", *files, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["forward"] == pytest.approx([100 * US, 150 * US])
    # the prediction table: every named schedule, sized like the trace, n/a with the reason
    assert cli.main(["calibrate", *files, "--predict", "gpipe,1f1b,zb-h1,zb-v"]) == 0
    printed = capsys.readouterr().out
    gpipe = calibrate.from_torch_trace(files).predict(get("gpipe", devices=2, microbatches=2))
    assert f"  gpipe  {1e3 * gpipe:.4g} ms" in printed
    assert "zb-h1  n/a: calibration: stage 0 has no measured I/W split" in printed
    assert "zb-v   n/a: calibration: measured 2 stages, the schedule has 4" in printed
    # with the model's FLOPs for the split: the split schedule is predicted, in the mode asked for
    assert cli.main(["calibrate", *files, "--predict", "zb-h1", "--model", "llama-3-8b", "--mode", "torch-runtime",
                     "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out.split("wrote")[0])
    expected = calibrate.from_torch_trace(files, model=dp.presets.model("llama-3-8b")).predict(
        from_torch("zb-h1", 2, 2), mode="torch-runtime")
    assert data["predictions"] == [{"schedule": "zb-h1", "step_s": pytest.approx(expected), "why": None}]
    assert tomllib.loads(out.read_text())["network"]["mode"] == "torch-runtime"
    # the file it wrote reads back in torch-runtime mode: the CLI's simulate prices as the calibration does
    split = calibrate.from_torch_trace(files, model=dp.presets.model("llama-3-8b"))
    zb = get("zb-h1", devices=2, microbatches=2)
    assert cli.main(["simulate", "zb-h1", "--devices", "2", "--microbatches", "2", "--json", "--config",
                     str(out)]) == 0
    got = json.loads(capsys.readouterr().out)["makespan_s"]
    assert got == pytest.approx(split.predict(zb, mode="torch-runtime"), rel=1e-6)
    assert cli.main(["calibrate", str(tmp_path / "missing.json"), "--out", str(tmp_path / "n.toml")]) == 2
    assert "missing.json" in capsys.readouterr().err and not (tmp_path / "n.toml").exists()


def test_run_ranks_names_each_failing_rank_with_its_own_output(tmp_path):
    """A failed multi-process run reports every failing rank's exit code and the tail of its own
    output: one rank's long log (the other rank's traceback of a dropped connection) must not
    push the first failure out of the message, as one joined tail did."""
    from diffpipe.calibrate._ranks import run_ranks

    script = tmp_path / "worker.py"
    script.write_text("import sys\nrank = int(sys.argv[2])\n"
                      "if rank == 0:\n    print('rank 0 failed first'); sys.exit(3)\n"
                      "print('x' * 10000); sys.exit(1)\n")
    message = run_ranks(script, [], ranks=2, timeout_s=60)
    assert "worker 0 exited with 3" in message and "rank 0 failed first" in message
    assert "worker 1 exited with 1" in message
    assert run_ranks(tmp_path / "missing.py", [], ranks=1, timeout_s=60) is not None
    ok = tmp_path / "ok.py"
    ok.write_text("print('fine')\n")
    assert run_ranks(ok, [], ranks=2, timeout_s=60) is None


def _validation_script(name: str):
    spec = importlib.util.spec_from_file_location(f"validation_{name}", _RUN.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_study_splits_arrivals_by_whether_they_met_a_send_the_other_way(tmp_path):
    # 0F0 -> 1F0 arrives 40 us after 0F0 ends, nothing sent the other way; 0F1 ends while rank 1's
    # 50 us SEND_B0 label runs (it met a send the other way) and arrives 500 us later, 480 us after
    # its own sender's SEND_F1 label ended. Two steps alike.
    script = _validation_script("transfers")
    r0, r1 = [], []
    for k in range(2):
        t = 10_000.0 * k
        r0 += [_x("PP:0F0", t, t + 100), *_send("PP:0SEND_F0", t + 110),
               _x("PP:0F1", t + 560, t + 660), *_send("PP:0SEND_F1", t + 670)]
        r1 += [*_recv("PP:1RECV_F0", t, t + 140), _x("PP:1F0", t + 20, t + 340),
               *_recv("PP:1RECV_F1", t + 341, t + 1160), _x("PP:1B0", t + 355, t + 655),
               _x("PP:1SEND_B0", t + 655, t + 705), _x("c10d::send", t + 657, t + 703, "cpu_op"),
               _x("gloo:send", t + 660, t + 1055), _x("PP:1F1", t + 710, t + 1310)]
    files = [_trace(tmp_path / "r0.json", 0, r0), _trace(tmp_path / "r1.json", 1, r1)]
    got = script.collisions(files)
    assert [x["meets"] for x in got] == [False, True] * 2
    assert [x["delay"] for x in got] == pytest.approx([40 * US, 500 * US] * 2)
    assert [x["own_send"] for x in got] == pytest.approx([10 * US] * 4)
    assert [x["after_send"] for x in got] == pytest.approx([20 * US, 480 * US] * 2)
    assert [x["other_left"] for x in got] == [None, pytest.approx(45 * US)] * 2  # SEND_B0 runs to 705 us
    pair_link = _validation_script("pair_link")
    cal = dataclasses.replace(calibrate.from_measurements([1e-4, 1e-4], [2e-4, 2e-4]), transfer=1e-3)
    lone = pair_link.lone_priced(cal, files)  # the delay of the arrivals that met nothing: 40 us
    assert lone.transfer == pytest.approx(40 * US) and lone.p2p == pytest.approx(40 * US)
    # SEND_B0 (50 us) starts 15 us before SEND_F1 (10 us), which starts while SEND_B0 runs: both met,
    # 30 us on average against the 10 us of SEND_F0, which met nothing
    terms = pair_link.held_terms([files])
    assert terms == pytest.approx({"send_alone": 10 * US, "held": 20 * US, "transfer": 40 * US})


def test_the_half_duplex_pair_link_serialises_both_directions_on_the_reference_and_the_simulator():
    pytest.importorskip("torch.distributed.pipelining")
    pair_link = _validation_script("pair_link")
    cal = calibrate.from_measurements([1.0, 1.2, 0.9, 1.1], [2.0, 2.1, 1.9, 2.2], p2p=0.4)
    half, runtime = pair_link.TorchRuntimeHalfDuplex(), calibrate.TorchRuntime()
    for name in ("Interleaved1F1B", "ZBVZeroBubble"):
        schedule = from_torch(name, 2, 4, 2)
        if name == "ZBVZeroBubble":
            cal = calibrate.from_measurements([1.0, 1.2, 0.9, 1.1], input_grad=[1.0, 1.1, 0.9, 1.2],
                                              weight=[1.0, 1.0, 1.0, 1.0], p2p=0.4)
        waits = half.waits(schedule, None)
        assert set(runtime.waits(schedule, None)) <= set(waits)  # torch-runtime's meetings, and
        lanes = [(a, b) for a, b in waits if isinstance(b, tuple) and isinstance(a, tuple)]
        # one lane for the one pair of devices: every transfer but the first waits for one other,
        # in both directions
        crossing = [pair for pair in lanes
                    if schedule.placement.device(0, pair[0][0].stage) != schedule.placement.device(0, pair[1][0].stage)]
        assert len(lanes) == len(transfers(schedule)) - 1 and crossing
        hw = cal.times(schedule)
        op_time = {"F": hw["forward"], "I": hw["input_grad"], "W": hw["weight"],
                   "B": [i + w for i, w in zip(hw["input_grad"], hw["weight"], strict=True)]}
        spans = {}
        for mode in (runtime, half):
            _, finish, _ = evaluate_network(schedule, lambda op, t=op_time: t[op.kind][op.stage],
                                            lambda op, dep: 0.4, mode)
            spans[mode.name] = max(finish.values())
            assert cal.predict(schedule, mode=mode) == pytest.approx(spans[mode.name], rel=1e-6), (name, mode)
        assert spans[half.name] >= spans[runtime.name], name


def test_the_held_send_term_prices_what_predict_does_and_holds_the_senders_that_meet():
    pytest.importorskip("torch.distributed.pipelining")
    pair_link = _validation_script("pair_link")
    cal = calibrate.from_measurements([1e-3, 1.2e-3, 0.9e-3, 1.1e-3], [2e-3, 2.1e-3, 1.9e-3, 2.2e-3], p2p=2e-4,
                                      overhead=5e-5, send_cost=2e-4, recv_cost=1e-4)
    met_somewhere = False
    for name in ("Interleaved1F1B", "LoopedBFS"):
        schedule = from_torch(name, 2, 4, 2)
        base, _ = pair_link.reference_step(cal, schedule, send_cost=cal.send_cost, p2p=cal.p2p)
        assert base == pytest.approx(cal.predict(schedule, mode="torch-runtime"), rel=1e-6), name  # jax (float32)
        held, met = pair_link.reference_step(cal, schedule, send_cost=cal.send_cost, p2p=cal.p2p, held=3e-3)
        assert held >= base and (held > base) == (met > 0), name
        met_somewhere |= met > 0
    assert met_somewhere  # interleaved 1F1B sends both ways at once


def test_the_core_share_fit_recovers_what_a_move_costs_the_op_it_lands_in():
    """``core_share.fit_slowdown``: op times of two (stage, kind) terms over three rounds, each
    round slower or faster as a whole, 0.2 ms more per send move and 0.1 ms per receive move in
    the op: the slopes come back within their errors, the round and term offsets do not leak in,
    and an outlier far outside the fences is left out. A role no op ever overlapped is not
    fitted (0, no error)."""
    script = _validation_script("core_share")
    rng = np.random.default_rng(3)
    rows = []
    for index, shift in enumerate((0.0, 0.4e-3, -0.1e-3)):
        for term, base in (((0, "F"), 1e-3), ((1, "B"), 2e-3)):
            for _ in range(60):
                sends, receives = int(rng.integers(0, 3)), int(rng.integers(0, 2))
                rows.append((term, base + shift + 2e-4 * sends + 1e-4 * receives + rng.normal(0, 2e-5),
                             sends, receives, index))
    rows.append(((0, "F"), 0.5, 0, 0, 0))  # a stall: outside the fences
    fit = script.fit_slowdown(rows)
    assert fit["send"] == pytest.approx(2e-4, abs=4 * fit["send_se"])
    assert fit["recv"] == pytest.approx(1e-4, abs=4 * fit["recv_se"])
    assert fit["send_se"] < 1e-5 and fit["samples"] == 360
    sends_only = script.fit_slowdown([(t, d - 1e-4 * r, s, 0, i) for t, d, s, r, i in rows])
    assert sends_only["recv"] == 0.0 and sends_only["recv_se"] is None
    assert sends_only["send"] == pytest.approx(2e-4, abs=4 * sends_only["send_se"])
    assert script.fit_slowdown([(t, d, 0, 0, i) for t, d, _, _, i in rows]) is None


def test_the_core_share_counts_a_move_in_the_op_its_rank_computes_when_both_posts_are_in(tmp_path):
    # rank 0: 0F0 0-100 us, its send posted at 110; 0F1 130-530, sent at 540. Rank 1 posts its
    # receives at 152 and 167 us; 1F0 (label at 170) waits for 0F0's data until 300 and computes to
    # 800; 1F1 850-1100 (its data came at 700). 0F0's payload moves once both posts are in (152,
    # +MOVE_S = 252): inside rank 0's 0F1, before rank 1's 1F0 computes; 0F1's at 540 (+100 = 640):
    # inside 1F0, rank 0 idle. 0F0's arrival is timed (1F0 waited) and came while its sender's 0F1
    # still had 378 us to run.
    script = _validation_script("core_share")
    r0, r1 = [], []
    for k in range(2):
        t = 10_000.0 * k
        r0 += [_x("PP:0F0", t, t + 100), *_send("PP:0SEND_F0", t + 110),
               _x("PP:0F1", t + 130, t + 530), *_send("PP:0SEND_F1", t + 540)]
        r1 += [*_recv("PP:1RECV_F0", t + 150, t + 300), *_recv("PP:1RECV_F1", t + 165, t + 700),
               _x("PP:1F0", t + 170, t + 800), _x("PP:1F1", t + 850, t + 1100)]
    files = [_trace(tmp_path / "r0.json", 0, r0), _trace(tmp_path / "r1.json", 1, r1)]
    rows = script.op_samples([files])
    counts = {(term, round(duration / US)): (sends, receives) for term, duration, sends, receives, _ in rows}
    assert counts == {((0, "F"), 100): (0, 0), ((0, "F"), 400): (1, 0), ((1, "F"), 500): (0, 1),
                      ((1, "F"), 250): (0, 0)}
    assert len(rows) == 8  # two steps alike
    n, early, delays, left = script.arrivals_before_op_end([files])
    assert (n, early) == (2, 2)
    assert delays == pytest.approx([148 * US] * 2) and left == pytest.approx([378 * US] * 2)
    terms = script.share_terms([files])
    assert set(terms["moves"]) == {(0, "F"), (1, "F")}
    assert terms["moves"][(1, "F")] == pytest.approx((0.0, 0.5))  # one receive move in 1F0, none in 1F1


def test_the_core_share_term_prices_what_predict_does_and_charges_the_ops_a_move_lands_in():
    pytest.importorskip("torch.distributed.pipelining")
    script = _validation_script("core_share")
    cal = calibrate.from_measurements([1e-3, 1.2e-3, 0.9e-3, 1.1e-3], [2e-3, 2.1e-3, 1.9e-3, 2.2e-3], p2p=2e-4,
                                      overhead=5e-5, send_cost=1e-4, recv_cost=5e-5)
    terms = {"send": 2e-4, "recv": 1e-4, "moves": {}}
    longer = []
    for name in ("Interleaved1F1B", "LoopedBFS"):
        schedule = from_torch(name, 2, 4, 2)
        base, landed = script.reference_step(cal, schedule)
        assert landed == 0
        assert base == pytest.approx(cal.predict(schedule, mode="torch-runtime"), rel=1e-6), name  # jax (float32)
        hits: dict = {}
        shared, landed = script.reference_step(cal, schedule, terms, hits)
        assert landed == sum(map(sum, hits.values())) and landed > 0, name
        assert shared >= base, name  # nothing is taken off the op times: the moves only add
        longer.append(shared > base)
        framed = script.in_model_frame(cal, schedule, terms)
        # the source's own schedule counted where the model puts its moves: its op times less what
        # those moves cost, plus what they cost again, price it about as before (not exactly: a
        # stage and kind's mean move count comes off every op of it, on the critical path or not)
        again, _ = script.reference_step(cal, schedule, framed)
        assert again == pytest.approx(base, rel=0.01), name
        if shared > base:
            assert abs(again - base) <= 0.25 * (shared - base), name
    assert any(longer)  # interleaved 1F1B's moves land on its critical path
    # torch's single-stage classes in their own modes, on the reference as in predict
    gpipe, one = from_torch("GPipe", 2, 4), get("1f1b", devices=2, microbatches=4)
    two = calibrate.from_measurements([1e-3, 1.2e-3], [2e-3, 2.1e-3], p2p=2e-4, overhead=5e-5)
    assert script.single_stage_mode("GPipe").name == "rendezvous"
    assert script.single_stage_mode("1F1B").name == "blocking"
    assert script.single_stage_mode("InterleavedZeroBubble").name == "torch-runtime"
    for schedule, kind in ((gpipe, "GPipe"), (one, "1F1B")):
        mode = script.single_stage_mode(kind)
        got, _ = script.reference_step(two, schedule, mode=mode)
        assert got == pytest.approx(two.predict(schedule, mode=mode), rel=1e-6), kind
    blocked, _ = script.reference_step(two, one, mode=script.single_stage_mode("1F1B"))
    assert blocked > script.reference_step(two, one)[0]  # the sender waits for its sends
