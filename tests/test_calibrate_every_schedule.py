"""``diffpipe calibrate`` on real gloo runs of every torch schedule class and every exported CSV.

One pair of gloo workers (``papers/validation/run.py``'s, as in ``tests/test_calibrate.py``) runs,
on tiny ``Linear + GELU`` blocks, each torch ``torch.distributed.pipelining`` schedule class with
1, 2 and 4 stages per rank where torch takes that many (``ScheduleGPipe`` and ``Schedule1F1B``
one, the V classes two), and each form diffpipe exports as a torch CSV that torch's runtime runs
(the forms of ``tests/test_torch_run.py``: one stage per rank, loops of 2 and 4 stages per rank,
V placements with DualPipe-V's overlapped pairs, a ``list_schedule`` order). For every run the
command calibrates from the two ranks' traces with ``--schedule`` naming what ran (the torch class,
the diffpipe family, the CSV file), writes the machine file and predicts the run's own schedule.
torch 2.13's ``Schedule1F1B`` labels none of its actions: the command refuses its trace in one line.
The cases ``tests/test_calibrate.py`` already runs through the command (ZBV, interleaved 1F1B with 2
and 4 stages per rank, looped BFS with 4) are not repeated here.
"""

from __future__ import annotations

import importlib.util
import json
import math
import tomllib
from pathlib import Path

import pytest

from diffpipe import cli
from diffpipe.schedules import Placement, get, list_schedule, to_torch_csv

pytestmark = pytest.mark.slow

_RUN = Path(__file__).resolve().parents[1] / "papers" / "validation" / "run.py"
MICROBATCHES = 4

#: job name -> (torch schedule class, stages per rank): every class at each count torch takes.
TORCH = {
    "GPipe": ("GPipe", 1), "1F1B": ("1F1B", 1),
    "ZB-H1": ("InterleavedZeroBubble", 1), "Interleaved1F1B-1": ("Interleaved1F1B", 1),
    "LoopedBFS-1": ("LoopedBFS", 1),
    "LoopedBFS-2": ("LoopedBFS", 2), "InterleavedZeroBubble-2": ("InterleavedZeroBubble", 2),
    "DualPipeV": ("DualPipeV", 2),
    "InterleavedZeroBubble-4": ("InterleavedZeroBubble", 4),
}
#: job name -> (the diffpipe schedule exported as a torch CSV, the name ``--schedule`` may give
#: instead of the file, None: only the file names it).
CSV = {
    "gpipe": (lambda: get("gpipe", devices=2, microbatches=MICROBATCHES), "gpipe"),
    "1f1b": (lambda: get("1f1b", devices=2, microbatches=MICROBATCHES), "1f1b"),
    "zb-h1": (lambda: get("zb-h1", devices=2, microbatches=MICROBATCHES), "zb-h1"),
    "interleaved-1f1b": (lambda: get("interleaved-1f1b", devices=2, microbatches=MICROBATCHES, chunks=2),
                         "interleaved-1f1b"),
    # torch's flexible rounds: 3 microbatches on 2 ranks
    "interleaved-1f1b-m3": (lambda: get("interleaved-1f1b", devices=2, microbatches=3, chunks=2), "interleaved-1f1b"),
    "looped-bfs": (lambda: get("looped-bfs", devices=2, microbatches=MICROBATCHES, chunks=2), "looped-bfs"),
    "zb-h1-2": (lambda: get("zb-h1", devices=2, microbatches=MICROBATCHES, chunks=2), "zb-h1"),
    "zb-v": (lambda: get("zb-v", devices=2, microbatches=MICROBATCHES), "zb-v"),
    "dualpipe-v": (lambda: get("dualpipe-v", devices=2, microbatches=MICROBATCHES), "dualpipe-v"),
    "v-half": (lambda: get("v-half", devices=2, microbatches=MICROBATCHES), "v-half"),
    "v-min": (lambda: get("v-min", devices=2, microbatches=MICROBATCHES), "v-min"),
    "hanayo": (lambda: get("hanayo", devices=2, microbatches=MICROBATCHES), "hanayo"),
    "interleaved-1f1b-4": (lambda: get("interleaved-1f1b", devices=2, microbatches=MICROBATCHES, chunks=4),
                           "interleaved-1f1b"),
    "looped-bfs-4": (lambda: get("looped-bfs", devices=2, microbatches=MICROBATCHES, chunks=4), "looped-bfs"),
    "zb-h1-4": (lambda: get("zb-h1", devices=2, microbatches=MICROBATCHES, chunks=4), "zb-h1"),
    "greedy-zero-bubble-loop": (lambda: list_schedule(Placement.loop(2, 2), MICROBATCHES, priority="zero-bubble",
                                                      split_backward=True), None),
}


def _runner():
    spec = importlib.util.spec_from_file_location("validation_run", _RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("torch.distributed.pipelining")
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    run = _runner()
    work = tmp_path_factory.mktemp("calibrate_every_schedule")
    jobs = [run.job(name, cls, microbatches=MICROBATCHES, stages_per_rank=spr, width=16, rows=4)
            for name, (cls, spr) in TORCH.items()]
    for name, (make, _) in CSV.items():
        schedule = make()
        to_torch_csv(schedule, work / f"{name}.csv")
        jobs.append(run.job(name, "csv", microbatches=schedule.microbatches, width=16, rows=4,
                            stages_per_rank=schedule.stages // 2, csv=str(work / f"{name}.csv")))
    return work, run.run_jobs(jobs, work, timeout_s=300)


def _files(runs, name: str) -> list[str]:
    work, failure = runs
    files = [work / f"{name}.rank{r}.json" for r in range(2)]
    if not all(f.exists() for f in files):
        pytest.fail(f"the torch run of {name} did not complete:\n{failure}")
    return [str(f) for f in files]


def _calibrates(files: list[str], schedule: str, out: Path, stages: int, capsys) -> dict:
    """``diffpipe calibrate FILES --schedule S --predict S --json --out OUT``: exit 0, a machine
    file of ``stages`` stages, a finite prediction of the schedule that ran."""
    code = cli.main(["calibrate", *files, "--schedule", schedule, "--predict", schedule, "--mode", "torch-runtime",
                     "--json", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(captured.out.split("\nwrote ")[0])
    assert len(data["forward"]) == stages and len(tomllib.loads(out.read_text())["times"]["forward"]) == stages
    [row] = data["predictions"]
    assert row["why"] is None and math.isfinite(row["step_s"]) and row["step_s"] > 0, row
    assert tomllib.loads(out.read_text())["network"]["mode"] == "torch-runtime"
    return data


@pytest.mark.parametrize("name", [n for n in TORCH if n != "1F1B"])
def test_every_torch_class_calibrates_by_its_name(runs, tmp_path, capsys, name):
    cls, spr = TORCH[name]
    data = _calibrates(_files(runs, name), cls, tmp_path / "m.toml", 2 * spr, capsys)
    # a split class measured I and W on every stage past the first (torch's stage 0 has no I)
    split = cls in ("InterleavedZeroBubble", "DualPipeV")
    assert bool(data["weight"]) == split and all(v > 0 for v in (data["weight"] or ()))


def test_torch_1f1b_trace_is_refused_in_one_line(runs, capsys):
    # torch 2.13's Schedule1F1B runs its own loop without action labels: nothing to read
    assert cli.main(["calibrate", *_files(runs, "1F1B"), "--schedule", "1F1B"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diffpipe: error:") and err.count("\n") == 1 and "Schedule1F1B" in err


@pytest.mark.parametrize("name", list(CSV))
def test_every_exported_csv_calibrates_by_its_file_and_its_family(runs, tmp_path, capsys, name):
    make, family = CSV[name]
    schedule = make()
    work, _ = runs
    files = _files(runs, name)
    by_file = _calibrates(files, str(work / f"{name}.csv"), tmp_path / "file.toml", schedule.stages, capsys)
    assert by_file["orders"] == [[str(op) for op in order] for order in schedule.orders]
    if family is not None:  # the family's own name, sized like the trace, is the same schedule
        by_name = _calibrates(files, family, tmp_path / "name.toml", schedule.stages, capsys)
        assert by_name["forward"] == by_file["forward"] and by_name["predictions"][0]["step_s"] == pytest.approx(
            by_file["predictions"][0]["step_s"])
