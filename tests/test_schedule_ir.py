"""The schedule IR: ops, placements, validation errors, the table and the reference evaluators."""

import subprocess
import sys

import pytest
from _helpers import schedules

import diffpipe as dp
from diffpipe.schedules import Op, Placement, Schedule, orders_from_strings
from diffpipe.schedules._reference import as_duration_fn, evaluate, evaluate_network

SCHEDULES = schedules()


def make(rows, devices=None, microbatches=2, placement=None):
    placement = placement or Placement.linear(devices or len(rows))
    return Schedule(placement, orders_from_strings(rows), microbatches)


GOOD = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]


def test_op_text_round_trip():
    for op in [Op("F", 2, 3), Op("I", 0, 11), Op("B", 7, 0, pipeline=1)]:
        assert Op.parse(str(op)) == op
    assert str(Op("B", 1, 0, 1)) == "1B0@p1"


@pytest.mark.parametrize("bad", ["F", "2X3", "", "aF1", "1F"])
def test_op_parse_rejects(bad):
    with pytest.raises(dp.ScheduleError):
        Op.parse(bad)


def test_op_rejects_bad_fields():
    with pytest.raises(dp.ScheduleError, match="kind"):
        Op("Q", 0, 0)
    with pytest.raises(dp.ScheduleError, match="stage"):
        Op("F", -1, 0)


def test_placements():
    assert Placement.loop(2, 2).table == ((0, 1, 0, 1),)
    assert Placement.v(3).table == ((0, 1, 2, 2, 1, 0),)
    assert Placement.wave(2, 2).table == ((0, 1, 1, 0, 0, 1, 1, 0),)
    assert Placement.mirrored(4).table == ((0, 1, 2, 3), (3, 2, 1, 0))
    assert Placement.loop(2, 2).chunk(0, 3) == 1
    with pytest.raises(dp.ScheduleError, match="device 5"):
        Placement(2, ((0, 5),))


def test_valid_schedule_and_derived_structure():
    s = make(GOOD)
    assert len(s.ops) == 8
    deps = s.dependencies[Op("B", 0, 0)]
    assert {(d.op, d.edge) for d in deps} == {(Op("F", 0, 1), "lane"), (Op("B", 1, 0), "gradient")}
    assert s == make(GOOD) and hash(s) == hash(make(GOOD))


@pytest.mark.parametrize(
    "rows, message",
    [
        ([["0F0", "0F1", "0B0"], ["1F0", "1B0", "1F1", "1B1"]], r"missing op 0B1 .*device 0"),
        ([["0F0", "0F1", "0B0", "0B1", "0B1"], ["1F0", "1B0", "1F1", "1B1"]], "duplicated"),
        ([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1", "1F2"]], "microbatch 2 outside"),
        ([["0F0", "0F1", "0B0", "0B1", "1F0"], ["1B0", "1F1", "1B1"]], "placement puts stage 1"),
        ([["0F0", "0F1", "0I0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]], "0I0 has no matching 0W0"),
        ([["0F0", "0F1", "0B0", "0B1"], ["1B0", "1F0", "1F1", "1B1"]], "deadlock: device 1 waits at 1B0 for 1F0"),
        ([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]], "deadlock"),
    ],
)
def test_validation_errors_name_the_culprit(rows, message):
    with pytest.raises(dp.ScheduleError, match=message) as info:
        make(rows)
    assert "\n" not in str(info.value)


def test_deadlock_message_is_a_chain_across_devices():
    # device 0 waits for 1B1 before running 0F0 of the microbatch device 1 needs.
    rows = [["0B0", "0F0", "0F1", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]
    with pytest.raises(dp.ScheduleError) as info:
        make(rows)
    text = str(info.value)
    assert text.startswith("deadlock: ")
    assert "device 0 waits at 0B0 for 1B0 (device 1)" in text
    assert "device 1 waits at 1F0 for 0F0 (device 0)" in text


def test_orders_must_match_devices():
    with pytest.raises(dp.ScheduleError, match="2 devices"):
        Schedule(Placement.linear(2), orders_from_strings([["0F0", "0B0"]]), 1)


@pytest.mark.parametrize("family", ["gpipe", "1f1b"])
@pytest.mark.parametrize("devices, microbatches", [(1, 1), (2, 3), (4, 8), (8, 4), (5, 16)])
def test_table_matches_closed_form(family, devices, microbatches):
    s = dp.schedules.get(family, devices=devices, microbatches=microbatches)
    durations = {"F": 1.5, "B": 2.25}
    t = dp.table(s, durations)
    f = dp.schedules.formula(family, devices=devices, microbatches=microbatches, durations=durations)
    assert t.makespan == pytest.approx(f.makespan)
    assert t.bubble_ratio == pytest.approx(f.bubble_ratio)
    assert dp.schedules.peak_activations(s) == f.peak_activations


def test_table_render_shows_cells_and_idle():
    text = dp.table(dp.schedules.get("1f1b", devices=2, microbatches=2)).render()
    assert text.splitlines() == [
        "d0 | F0 F1 .  .  B0 B0 .  B1 B1",
        "d1 | .  F0 B0 B0 F1 B1 B1 .  .",
    ]


def test_table_rejects_bad_durations():
    s = dp.schedules.get("gpipe", devices=2, microbatches=2)
    with pytest.raises(dp.ScheduleError, match="unknown op kind"):
        dp.table(s, {"X": 1.0})
    with pytest.raises(dp.ScheduleError, match="F must be"):
        dp.table(s, {"F": -1.0})


def test_registry_errors():
    with pytest.raises(dp.ScheduleError, match="unknown schedule family 'nope'"):
        dp.schedules.get("nope", devices=2, microbatches=2)
    with pytest.raises(dp.ScheduleError, match="devices must be an integer >= 1"):
        dp.schedules.get("1f1b", devices=0, microbatches=2)
    with pytest.raises(dp.ScheduleError, match="unknown option 'chunks'"):
        dp.schedules.get("1f1b", devices=2, microbatches=2, chunks=2)


def test_the_discrete_world_imports_no_jax():
    code = ("import sys, diffpipe.schedules as s; s.table(s.get('1f1b', devices=2, microbatches=2)); "
            "assert not [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'numpy')], 'jax loaded'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("case, s", SCHEDULES, ids=[c for c, _ in SCHEDULES])
def test_reference_evaluators_agree(case, s):
    # evaluate_network under an edge mode is evaluate with the mode's cost on transfer edges.
    def duration(op):
        return 1.0 + 0.25 * op.stage + 0.5 * (op.kind in "BI")

    def transfer(op, dep):
        return 0.3 + 0.1 * dep.boundary

    plain = evaluate(s, duration)
    delayed = evaluate(s, duration, lambda op, dep: transfer(op, dep) if dep.is_transfer else 0.0)
    assert evaluate_network(s, duration, transfer, dp.communication("none"))[:2] == plain
    assert evaluate_network(s, duration, transfer, dp.communication("overlap"))[:2] == delayed
    assert dp.table(s).finish == evaluate(s, as_duration_fn(None))[1]
    # transfer nodes on lanes only ever delay: contention and blocking finish no earlier than overlap
    for mode in ("contention", "blocking"):
        try:
            _, finish, xfer = evaluate_network(s, duration, transfer, dp.communication(mode), 2)
        except dp.ScheduleError:  # the reference finds the deadlock compile finds
            with pytest.raises(dp.ScheduleError, match=f"deadlocks under {mode}"):
                dp.compile(s, communication=mode, devices_per_node=2)
            continue
        assert all(finish[op] >= delayed[1][op] - 1e-9 for op in s.ops)
        assert len(xfer) == sum(dep.is_transfer for op in s.ops for dep in s.dependencies[op])
