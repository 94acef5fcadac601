"""Interchange with torch.distributed.pipelining (torch 2.13): built-in schedules and the CSV.

For every torch family diffpipe has, the generator and torch's order agree op for op, on every
size both accept. Where they differ, the test says why:
- ``1F1B``: torch's ``Schedule1F1B._get_pipeline_order`` numbers the last rank's forwards from 1
  (``3F1 3B0 ... 3F6`` for D=4, N=6): ``3F0`` never runs and ``3F6`` does not exist, so diffpipe
  rejects the order, naming the op; the other ranks agree with diffpipe's 1f1b. (torch runs 1F1B
  from ``_step_microbatches``, not from this order, so only the exported order is wrong.)
- ``Interleaved1F1B``, ``InterleavedZeroBubble``: both sides use torch's flexible rounds
  (``max(1, N // D)`` rounds, N divisible by them), so N need not be a multiple of D; they agree
  on every N, and refuse the same ones.
- ``InterleavedZeroBubble`` with one stage per rank is ZB-H1; torch's round check still applies
  there, diffpipe's zb-h1 with one chunk needs none.
"""

import csv

import pytest

pytest.importorskip("torch.distributed.pipelining")

import diffpipe as dp  # noqa: E402
from diffpipe.schedules import (
    Op,
    Placement,
    Schedule,
    from_torch,
    from_torch_csv,
    get,
    orders_from_strings,
    table,
    to_torch_csv,
)
from diffpipe.schedules._torch import _torch_actions  # noqa: E402

AGREE = [
    # (diffpipe family, options, torch name, stages per rank, [(devices, microbatches), ...])
    ("gpipe", {}, "GPipe", 1, [(1, 3), (2, 4), (4, 4), (4, 7)]),
    ("interleaved-1f1b", {"chunks": 2}, "Interleaved1F1B", 2, [(1, 3), (2, 4), (4, 4), (4, 8), (3, 9)]),
    # torch's flexible rounds: N not a multiple of D (one round below D, several above).
    ("interleaved-1f1b", {"chunks": 2}, "Interleaved1F1B", 2, [(4, 3), (4, 6), (4, 10), (3, 8), (8, 12)]),
    ("interleaved-1f1b", {"chunks": 3}, "Interleaved1F1B", 3, [(2, 2), (4, 8), (4, 5), (3, 8)]),
    ("interleaved-1f1b", {"chunks": 1}, "Interleaved1F1B", 1, [(4, 8)]),
    ("looped-bfs", {"chunks": 2}, "LoopedBFS", 2, [(2, 4), (4, 2), (4, 5), (3, 6), (4, 10), (8, 12)]),
    ("looped-bfs", {"chunks": 3}, "LoopedBFS", 3, [(3, 4)]),
    ("zb-h1", {}, "InterleavedZeroBubble", 1, [(1, 2), (2, 4), (4, 4), (4, 8), (4, 3), (5, 12)]),
    ("zb-h1", {"chunks": 2}, "InterleavedZeroBubble", 2, [(2, 4), (4, 8), (4, 6), (4, 3), (3, 9)]),
    ("zb-h1", {"chunks": 3}, "InterleavedZeroBubble", 3, [(4, 8)]),
    ("zb-v", {}, "ZBVZeroBubble", 2, [(1, 2), (2, 4), (4, 3), (4, 7), (4, 8), (3, 10)]),
    ("dualpipe-v", {}, "DualPipeV", 2, [(1, 2), (2, 4), (4, 8), (4, 11), (3, 12)]),
]
AGREE_CASES = [
    (name, opts, torch_name, v, d, n) for name, opts, torch_name, v, sizes in AGREE for d, n in sizes
]


@pytest.mark.parametrize(
    "name, opts, torch_name, v, d, n",
    AGREE_CASES,
    ids=[f"{c[0]}{c[1].get('chunks', '')}-D{c[4]}-N{c[5]}" for c in AGREE_CASES],
)
def test_generator_agrees_with_torch_op_for_op(name, opts, torch_name, v, d, n):
    ours = get(name, devices=d, microbatches=n, **opts)
    theirs = from_torch(torch_name, d, n, v)
    assert theirs.orders == ours.orders
    assert theirs.placement.table == ours.placement.table
    assert table(theirs).makespan == table(ours).makespan


@pytest.mark.parametrize("d, n", [(2, 3), (4, 6), (4, 9)])
def test_torch_1f1b_order_is_rejected_naming_the_op(d, n):
    last = d - 1
    with pytest.raises(
        dp.ScheduleError, match=rf"torch 1F1B .*op {last}F{n} on device {last} .*outside"
    ) as info:
        from_torch("1f1b", d, n)
    assert "\n" not in str(info.value)
    # The other ranks' compute orders are diffpipe's 1f1b.
    ours = get("1f1b", devices=d, microbatches=n)
    raw = _torch_actions("1F1B", d, n, 1)
    for rank in range(d - 1):
        got = [str(a) for a in raw[rank] if a and a.computation_type.value in "FB"]
        assert got == [str(op) for op in ours.orders[rank]]


@pytest.mark.parametrize(
    "name, torch_name", [("interleaved-1f1b", "Interleaved1F1B"), ("zb-h1", "InterleavedZeroBubble")]
)
@pytest.mark.parametrize("d, n", [(4, 9), (4, 11), (3, 7), (8, 17)])
def test_flexible_rounds_refuse_the_sizes_torch_refuses(name, torch_name, d, n):
    with pytest.raises(dp.ScheduleError, match="torch refuses: .*multiple of the number of rounds"):
        from_torch(torch_name, d, n, 2)
    with pytest.raises(dp.ScheduleError, match=rf"{name}: microbatches \({n}\) must split into .* equal rounds"):
        get(name, devices=d, microbatches=n, chunks=2)


def test_torch_names_and_aliases():
    assert from_torch("ZBVZeroBubble", 2, 4) == from_torch("zb-v", 2, 4)
    assert from_torch("interleaved1f1b", 2, 4, 2).orders == from_torch("interleaved-1f1b", 2, 4, 2).orders
    assert from_torch("zb", 2, 4).orders == from_torch("zb-h1", 2, 4).orders
    with pytest.raises(dp.ScheduleError, match="unknown schedule 'pipedream'; known: gpipe"):
        from_torch("pipedream", 2, 4)
    with pytest.raises(dp.ScheduleError, match="stages_per_rank must be an int >= 1"):
        from_torch("gpipe", 2, 4, 0)


def test_torch_refusals_are_one_line():
    with pytest.raises(dp.ScheduleError, match="DualPipeV.*torch refuses: DualPipeV requires") as info:
        from_torch("dualpipe-v", 4, 6)
    assert "\n" not in str(info.value)
    with pytest.raises(dp.ScheduleError, match="torch refuses: .*2 stages per rank"):
        from_torch("zb-v", 2, 4, 3)


# -- CSV ----------------------------------------------------------------------------------------------


def write_rows(path, rows):
    """Write cells the way torch's ``_dump_csv`` does (``csv.writer``; None becomes an empty cell)."""
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    return path


ROUND_TRIP = [
    ("gpipe", {}),
    ("1f1b", {}),
    ("interleaved-1f1b", {"chunks": 3}),
    ("looped-bfs", {}),
    ("zb-h1", {"chunks": 2}),
    ("zb-h2", {}),
    ("zb-v", {}),
    ("dualpipe-v", {}),
    ("v-half", {}),
    ("v-min", {}),
    ("v-schedule", {"memory": 0.75}),
]


@pytest.mark.parametrize("name, opts", ROUND_TRIP, ids=[r[0] for r in ROUND_TRIP])
def test_csv_round_trip_and_torch_accepts_it(tmp_path, name, opts):
    from torch.distributed.pipelining.schedules import _Action, _validate_schedule

    s = get(name, devices=4, microbatches=8, **opts)
    path = tmp_path / f"{name}.csv"
    to_torch_csv(s, path)
    back = from_torch_csv(path)
    assert back.orders == s.orders and back.placement == s.placement and back.microbatches == 8
    # torch parses every cell and its own validator accepts the schedule.
    with open(path, newline="") as handle:
        actions = {
            rank: [_Action.from_str(cell) for cell in row] for rank, row in enumerate(csv.reader(handle))
        }
    _validate_schedule(actions, 4, s.stages, 8)


@pytest.mark.parametrize(
    "torch_name, v, d, n",
    [("Interleaved1F1B", 2, 4, 8), ("ZBVZeroBubble", 2, 4, 5), ("DualPipeV", 2, 3, 7), ("GPipe", 1, 3, 4)],
)
def test_reads_torch_dumps_with_bubbles_compounds_and_comms(tmp_path, torch_name, v, d, n):
    """torch's compute-only dump has empty cells (bubbles) and OVERLAP_F_B compounds; the
    compute+comms dump adds SEND/RECV/UNSHARD/RESHARD/REDUCE_GRAD, which the reader skips."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    expected = from_torch(torch_name, d, n, v)
    compute = write_rows(tmp_path / "compute.csv", get_schedule_ops(torch_name, d, n, v))
    assert from_torch_csv(compute).orders == expected.orders
    if v > 1:  # torch's visualizer adds communication to multi-stage schedules only
        comms = write_rows(tmp_path / "comms.csv", get_schedule_ops(torch_name, d, n, v, with_comms=True))
        text = comms.read_text()
        assert "SEND_F" in text and "RECV_B" in text and "UNSHARD" in text and "REDUCE_GRAD" in text
        assert from_torch_csv(comms).orders == expected.orders


def test_compound_cells_expand_in_order(tmp_path):
    rows = [
        ["0F0", "0F1", "3F0", "(3F1;3B0)OVERLAP_F_B", "3B1", "", "0B0", "0B1"],
        ["1F0", "1F1", "2F0", "2F1", "2B0", "2B1", "1B0", "1B1"],
    ]
    s = from_torch_csv(write_rows(tmp_path / "v.csv", rows))
    assert s.orders[0][3:5] == (Op("F", 3, 1), Op("B", 3, 0))
    assert s.placement == Placement.v(2)


@pytest.mark.parametrize(
    "cell, reason",
    [
        ("0X1", "not a torch action"),
        ("F0", "not a torch action"),
        ("0F", "not a torch action"),
        ("0F1x", "not a torch action"),
        ("(0F1;1Q2)OVERLAP_F_B", "not a torch action"),
        ("(0F1;1B0)OVERLAP_X", "not a torch action"),
    ],
)
def test_bad_cell_names_file_row_column(tmp_path, cell, reason):
    rows = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", cell, "1F1", "1B1"]]
    path = write_rows(tmp_path / "bad.csv", rows)
    with pytest.raises(dp.ScheduleError) as info:
        from_torch_csv(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: row 2 (rank 1), column 3: cell {cell!r}") and reason in message


def test_reader_errors_name_the_culprit(tmp_path):
    good = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]
    assert from_torch_csv(write_rows(tmp_path / "good.csv", good + [[], [""]])).devices == 2

    def error(rows, **kwargs):
        with pytest.raises(dp.ScheduleError) as info:
            from_torch_csv(write_rows(tmp_path / "x.csv", rows), **kwargs)
        assert "\n" not in str(info.value)
        return str(info.value)

    duplicate = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1", "1B0"]]
    assert "row 2 (rank 1), column 5: cell '1B0': op 1B0 is duplicated (first at row 2, column 2)" in error(
        duplicate
    )
    misplaced = [["0F0", "0F1", "1F0", "0B0", "0B1"], ["1B0", "1F1", "1B1"]]
    assert "row 1 (rank 0), column 3: cell '1F0': stage 1 is on rank 0" in error(misplaced)
    missing = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1"]]
    assert "x.csv: missing op 1B1" in error(missing)
    deadlock = [["0F0", "0B0", "0F1", "0B1"], ["1F0", "1F1", "1B0", "1B1"]]
    assert "deadlock" in error(deadlock)
    assert "a V placement needs 2 x 2 = 4 stages" in error(good, placement="v")
    assert "placement must be None, 'loop', 'v' or a Placement" in error(good, placement="ring")
    assert "the placement has 3 devices" in error(good, placement=Placement.linear(3))
    assert "stages 0..2" in error([["0F0", "2F0", "2B0", "0B0"], ["1F0", "1B0"]], placement="loop")
    with pytest.raises(dp.ScheduleError, match="cannot read"):
        from_torch_csv(tmp_path / "absent.csv")
    with pytest.raises(dp.ScheduleError, match="no compute actions"):
        from_torch_csv(write_rows(tmp_path / "comms.csv", [["0SEND_F0"], ["1RECV_F0"]]))


def test_reader_uses_a_given_placement(tmp_path):
    s = get("zb-v", devices=1, microbatches=2)  # on one device, loop and V coincide: say which
    path = tmp_path / "v1.csv"
    to_torch_csv(s, path)
    assert from_torch_csv(path).placement.name == "loop"
    assert from_torch_csv(path, placement="v") == Schedule(Placement.v(1), s.orders, 2)
    assert from_torch_csv(path, placement=Placement.v(1)).placement == Placement.v(1)


# -- export refusals ----------------------------------------------------------------------------------


def test_export_refuses_what_torch_cannot_express(tmp_path):
    path = tmp_path / "out.csv"
    replicas = Schedule(
        Placement.mirrored(2),
        orders_from_strings(
            [["0F0", "1F1@p1", "1B1@p1", "0B0"], ["0F1@p1", "1F0", "1B0", "0B1@p1"]],
        ),
        2,
    )
    with pytest.raises(dp.ScheduleError, match=r"runs 2 pipelines \(model replicas\)"):
        to_torch_csv(replicas, path)

    waves = Placement.wave(2, 2)
    wave_schedule = Schedule(waves, _stage_order(waves), 1)
    with pytest.raises(dp.ScheduleError, match="wave placement is neither a loop"):
        to_torch_csv(wave_schedule, path)

    step = Schedule(Placement.linear(1), orders_from_strings([["0F0", "0B0", "0R0"]]), 1)
    with pytest.raises(dp.ScheduleError, match=r"op 0R0 on device 0 is a collective \(R\)") as info:
        to_torch_csv(step, path)
    assert "\n" not in str(info.value)
    update = Schedule(Placement.linear(1), orders_from_strings([["0F0", "0B0", "0U0"]]), 1)
    with pytest.raises(dp.ScheduleError, match=r"op 0U0 on device 0 is an optimizer step \(U\)"):
        to_torch_csv(update, path)
    assert not path.exists()


def _stage_order(placement):
    """Per device: forwards in stage order, then backwards in reverse (valid for one microbatch)."""
    stages = range(placement.stages)
    return [
        [Op("F", s, 0) for s in stages if placement.device(0, s) == d]
        + [Op("B", s, 0) for s in reversed(stages) if placement.device(0, s) == d]
        for d in range(placement.devices)
    ]
