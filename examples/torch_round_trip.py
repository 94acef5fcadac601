"""Round trip with torch.distributed.pipelining: import torch's schedules, simulate, export CSV, read back.

1. ``from_torch`` builds torch's own schedules (against mocked stages) as diffpipe ``Schedule``s;
   they match diffpipe's generators op for op, and diffpipe simulates them on real-ish hardware.
2. ``to_torch_csv`` writes any exportable diffpipe schedule (here a greedy zero-bubble order for a
   loop placement, which torch has no built-in for) as torch's compute-only CSV; torch parses it,
   its validator accepts it, and its lowering pass adds the send/receive actions its runtime
   executes (``_PipelineScheduleRuntime._load_csv``; tests/test_torch_run.py runs such CSVs for
   real with gloo and checks the gradients).
3. ``from_torch_csv`` reads the CSV back to the same schedule.

    python examples/torch_round_trip.py          # 4 ranks, 8 microbatches, every torch schedule
    python examples/torch_round_trip.py --fast   # 2 ranks, 4 microbatches, two schedules
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from pathlib import Path

import diffpipe as dp
from diffpipe.schedules import Placement, from_torch, from_torch_csv, get, list_schedule, to_torch_csv

#: (torch name, diffpipe family, options, stages per rank)
TORCH_SCHEDULES = [
    ("GPipe", "gpipe", {}, 1),
    ("Interleaved1F1B", "interleaved-1f1b", {"chunks": 2}, 2),
    ("LoopedBFS", "looped-bfs", {"chunks": 2}, 2),
    ("InterleavedZeroBubble", "zb-h1", {"chunks": 2}, 2),
    ("ZBVZeroBubble", "zb-v", {}, 2),
    ("DualPipeV", "dualpipe-v", {}, 2),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="2 ranks, 4 microbatches, two schedules")
    parser.add_argument("--out", type=Path, default=None, help="folder for the CSV (default: a temporary one)")
    args = parser.parse_args(argv)
    dp.enable_compilation_cache()  # keep compiled programs for the next run (DIFFPIPE_CACHE=0: off)
    ranks, microbatches = (2, 4) if args.fast else (4, 8)
    chosen = TORCH_SCHEDULES[:2] if args.fast else TORCH_SCHEDULES

    # 1. torch's schedules, as diffpipe sees them.
    print(
        f"torch schedule        stages  agrees with diffpipe  makespan (ms)  bubble   [{ranks} ranks, N={microbatches}]"
    )
    for torch_name, family, options, per_rank in chosen:
        theirs = from_torch(torch_name, ranks, microbatches, per_rank)
        ours = get(family, devices=ranks, microbatches=microbatches, **options)
        chunks = theirs.stages // ranks
        hw = dp.Hardware.from_times(1e-3 / chunks, 2e-3 / chunks, p2p_time=5e-5)
        if any(op.kind == "W" for order in theirs.orders for op in order):  # split backward: I + W
            hw = dp.Hardware.from_times(1e-3 / chunks, 1e-3 / chunks, 1e-3 / chunks, p2p_time=5e-5)
        result = dp.simulate(theirs, hw)
        print(
            f"{torch_name:22s}{theirs.stages:6d}  {str(theirs.orders == ours.orders):>20s}  "
            f"{float(result.makespan) * 1e3:13.2f}  {float(result.bubble_ratio):6.3f}"
        )
    try:
        from_torch("1F1B", ranks, microbatches)
    except dp.ScheduleError as error:  # torch's exported 1F1B order names a microbatch that does not exist
        print(f"torch 1F1B refused: {error}")

    # 2. A diffpipe order torch has no built-in for, exported as torch's CSV.
    greedy = list_schedule(Placement.loop(ranks, 2), microbatches, priority="zero-bubble", split_backward=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "greedy_zero_bubble.csv"
        to_torch_csv(greedy, path)
        print(f"\nwrote {path.name}:")
        print(path.read_text().strip())

        from torch.distributed.pipelining.schedules import _Action, _add_send_recv, _validate_schedule

        with open(path, newline="") as handle:
            actions = {rank: [_Action.from_str(cell) for cell in row] for rank, row in enumerate(csv.reader(handle))}
        stage_to_rank = _validate_schedule(actions, ranks, greedy.stages, microbatches)
        lowered = _add_send_recv(actions, stage_to_rank=lambda s: stage_to_rank[s], num_stages=greedy.stages)
        comms = sum(
            str(a.computation_type).split(".")[-1].startswith(("SEND", "RECV")) for row in lowered.values() for a in row
        )
        print(f"torch validates it and adds {comms} send/receive actions for its runtime")
        print(f"rank 0 as torch will run it: {' '.join(str(a) for a in lowered[0])}")

        # 3. Back into diffpipe.
        back = from_torch_csv(path)
        assert back.orders == greedy.orders and back.placement == greedy.placement
        print("read back: the same schedule")
        makespan = float(dp.simulate(back, dp.Hardware.from_times(5e-4, 5e-4, 5e-4, p2p_time=5e-5)).makespan)
        print(f"simulated: {makespan * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
