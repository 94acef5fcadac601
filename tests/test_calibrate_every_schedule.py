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

_VALIDATION = Path(__file__).resolve().parents[1] / "papers" / "validation"
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


def _script(name: str):
    """``papers/validation/<name>.py`` as a module (``run``: the study and its gloo workers)."""
    spec = importlib.util.spec_from_file_location(f"validation_{name}", _VALIDATION / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gloo():
    """Skip unless torch's pipelining and its gloo backend are here; the study's module."""
    pytest.importorskip("torch.distributed.pipelining")
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    return _script("run")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    run = _gloo()
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


@pytest.fixture(scope="module")
def small_study(tmp_path_factory):
    """``papers/validation``'s study, CI-size: a transformer-block group of a full-backward and a
    split schedule (one round, no warm-up round, the headline mode only)."""
    run = _gloo()
    work = tmp_path_factory.mktemp("small_study")
    groups = {"t": {"members": [("GPipe", "GPipe"), ("ZB-H1", "InterleavedZeroBubble")], "spr": 1,
                    "microbatches": (2,), "model": "transformer", "blocks": (2, 1)}}
    results = run.study(work, groups=groups, rounds=1, steps=2, width=64, rows=8, work=work,
                        modes=("torch-runtime",), warmup_rounds=0)
    return run, work, results


def test_the_study_runs_transformer_blocks_and_predicts_split_schedules_from_full_ones(small_study):
    from diffpipe import Transformer, calibrate
    from diffpipe.schedules import from_torch

    run, work, results = small_study
    cases, conditions = results["cases"], results["conditions"]
    gpipe, zb = "t.m2.GPipe", "t.m2.ZB_H1"
    assert cases[gpipe]["calibration"] and cases[zb]["calibration"]
    assert all(c["torch_peak_stored"] == c["diffpipe_peak_activations"] for c in cases.values())
    assert conditions["job_s_by_group"]["t"] > 0 and conditions["probe_s"] > 0
    # the workers ran the transformer blocks: (1, rows, width) microbatches through 2 + 1 blocks
    model = run._blocks(2, 64, [2, 1], "transformer")
    assert len(model[0]) == 2 and model[0][0].qkv.in_features == 64
    assert run.example_input("transformer", 8, 64, 2).shape == (2, 8, 64)
    # the probe: torch's split backward of the same stages, stage 0's I empty as in torch
    probe = conditions["probes"]["t"]
    assert probe["input_grad"][0] == 0 and all(v > 0 for v in probe["weight"] + probe["backward"])
    # GPipe alone cannot price ZB-H1 (n/a), the probe's and the model's split can: rows of their own
    rows = [p for p in results["predictions"] if p["source"] == gpipe and p["target"] == zb]
    assert [p.get("split") for p in rows] == [None, "probe", "model"] and rows[0]["predicted_s"] is None
    schedule = from_torch("InterleavedZeroBubble", 2, 2)
    cal = calibrate.from_torch_trace([work / f"{gpipe}.r0.rank{k}.json" for k in range(2)], from_torch("GPipe", 2, 2))
    probed = cal.with_split(probe=calibrate.Calibration(*(tuple(probe[k]) for k in ("forward", "backward",
                                                                                      "input_grad", "weight"))))
    assert rows[1]["predicted_s"] == pytest.approx(probed.predict(schedule, mode="torch-runtime"))
    transformer = Transformer(layers=3, hidden=64, heads=1, sequence=8, vocabulary=1, dtype_bytes=4, dropout=False,
                              tied_embedding=False, positions="rotary")
    modelled = cal.with_split(model=transformer, layers_per_stage=[2, 1])
    assert rows[2]["predicted_s"] == pytest.approx(modelled.predict(schedule, mode="torch-runtime"))
    assert rows[1]["error"] == pytest.approx(rows[1]["predicted_s"] / cases[zb]["measured_s"] - 1)
    # a split source needs no borrowed split; its own rows only
    assert not cases[zb]["backward_split"] and all(p.get("split") is None for p in results["predictions"]
                                                   if p["source"] == zb)
    # the tables: the split-from-full predictions have rows of their own
    table = run.summary_table(results)
    assert "Split schedules from full-backward sources" in table
    assert "| torch-runtime | t | probe | 2 | 1: " in table and "| torch-runtime | t | model | 2 | 1: " in table
    assert "| torch-runtime | t | 1 |" in table  # the plain row: GPipe's n/a left out
    markdown = run._markdown(results)
    assert f"| {gpipe} | {zb} |" in markdown and "Probe of t (`profile_stages`" in markdown


@pytest.mark.parametrize("name", ["LoopedBFS-2", "ZB-H1"])
def test_the_replay_with_calibrated_times_is_the_prediction_of_the_traced_schedule(runs, name):
    # papers/validation/replay.py prices a step as the cost model does, host time of the transfers
    # (send_cost / recv_cost) included; without it (--no-host) every replay is shorter
    from diffpipe import calibrate
    from diffpipe.calibrate import _trace

    replay = _script("replay")
    files = _files(runs, name)
    cal = calibrate.from_torch_trace(files)
    assert cal.send_cost > 0 and cal.recv_cost > 0
    ranks, _ = _trace.parse(files)
    traced = _trace.traced_schedule({r: _trace._ops(s[0]) for r, s in ranks.items()}, cal.stage_ranks)
    with_host = replay.replayed_steps(files, ("overlap", "torch-runtime"))
    without = replay.replayed_steps(files, ("overlap", "torch-runtime"), host=False)
    for mode in ("overlap", "torch-runtime"):
        predicted = cal.predict(traced, mode=mode)
        assert [p for _, p in with_host[mode]["means"]] == pytest.approx([predicted] * 2, rel=1e-5)
        for label in ("own", "means"):
            assert len(with_host[mode][label]) == 2
            assert all(a[1] > b[1] for a, b in zip(with_host[mode][label], without[mode][label], strict=True))
