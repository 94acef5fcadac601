"""Real pipelined training steps under torch.profiler, for calibrating and checking diffpipe.

Runs ``torch.distributed.pipelining`` schedules with the gloo backend on CPU, in 2 worker processes
on loopback (each pinned to one core where the machine has them), on a stack of ``Linear + GELU``
blocks (one block per pipeline stage), and writes one ``torch.profiler`` Chrome trace per rank and
job. The study then calibrates diffpipe from ONE schedule's trace (``dp.calibrate.from_torch_trace``)
and predicts the step time of every other schedule, next to the time torch measured.

Usage::

    python papers/validation/run.py                    # the study (see README.md); writes results.json
    python papers/validation/run.py --out DIR --quick  # fewer steps and schedules

The workers are this file run as a script (``--worker RANK SPEC.json``); ``tests/test_calibrate.py``
imports ``run_jobs`` from here (by path) to run a small case end to end. Torch is imported once per
worker process; the workers meet through a ``FileStore`` in the work directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

RANKS = 2
#: Seconds one gloo operation may wait before the step fails.
GLOO_TIMEOUT_S = 30

#: torch schedule classes the study runs, with how their stages sit on ranks.
V_STYLE = ("ZBVZeroBubble", "DualPipeV")
SINGLE_STAGE = ("GPipe", "1F1B")


# -- the model ---------------------------------------------------------------------------------------


def _blocks(stages: int, width: int):
    """``stages`` blocks (Linear + GELU), identical in every process (seeded)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.ModuleList([nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(stages)])


def stages_of_rank(schedule: str, rank: int, ranks: int, stages_per_rank: int) -> list[int]:
    """The stages ``rank`` holds: a V (rank r holds r and 2R-1-r) or a loop (r, r+R, ...)."""
    if schedule in V_STYLE:
        return [rank, 2 * ranks - 1 - rank]
    return [rank + k * ranks for k in range(stages_per_rank)]


# -- worker side (this file run as a script) ----------------------------------------------------------


def _stored(stage) -> int:
    """Microbatches whose activations ``stage`` holds now: forward outputs waiting for their backward,
    and (split backward) the state waiting for the weight gradient."""
    return len(stage.fwd_cache) + len(stage.backward_state)


def _watch(stage, stages, peak: list[int]) -> None:
    """Record the rank's stored-activation count after every compute call of ``stage``."""
    for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
        original = getattr(stage, name)

        def wrapped(*args, _original=original, **kwargs):
            out = _original(*args, **kwargs)
            peak[0] = max(peak[0], sum(_stored(s) for s in stages))
            return out

        setattr(stage, name, wrapped)


def _run_job(job: dict, rank: int, out: Path) -> None:
    """``job["warmup"]`` untraced steps, then ``job["steps"]`` steps under the profiler."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torch.profiler import ProfilerActivity, profile

    n_stages, width, rows = job["stages"], job["width"], job["rows"]
    if job["schedule"] == "csv":
        import csv

        from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

        with open(job["csv"], newline="") as handle:
            row = list(csv.reader(handle))[rank]
        mine = sorted({_Action.from_str(cell).stage_index for cell in row if cell})
    else:
        mine = stages_of_rank(job["schedule"], rank, RANKS, job["stages_per_rank"])
    model = _blocks(n_stages, width)
    stages = [PipelineStage(model[i], i, n_stages, torch.device("cpu")) for i in mine]
    peak = [0]
    for stage in stages:
        _watch(stage, stages, peak)
    if job["schedule"] == "csv":
        runtime = _PipelineScheduleRuntime(stages, job["microbatches"], loss_fn=nn.functional.mse_loss)
        runtime._load_csv(job["csv"], format="compute_only")
    elif job["schedule"] in SINGLE_STAGE:
        cls = get_schedule_class(job["schedule"])
        runtime = cls(stages[0], job["microbatches"], loss_fn=nn.functional.mse_loss)
    else:
        cls = get_schedule_class(job["schedule"])
        runtime = cls(stages, job["microbatches"], loss_fn=nn.functional.mse_loss)
    generator = torch.Generator().manual_seed(1)
    batch = rows * job["microbatches"]
    x = torch.randn(batch, width, generator=generator)
    y = torch.randn(batch, width, generator=generator)

    def step() -> float:
        for p in model.parameters():
            p.grad = None
        dist.barrier()
        start = time.perf_counter()
        if 0 in mine:
            runtime.step(x, target=y, losses=[])
        else:
            runtime.step(target=y, losses=[])
        return time.perf_counter() - start

    for _ in range(job["warmup"]):
        step()
    peak[0] = 0
    times = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(job["steps"]):
            times.append(step())
            prof.step()
    prof.export_chrome_trace(str(out / f"{job['name']}.rank{rank}.json"))
    (out / f"{job['name']}.rank{rank}.meta.json").write_text(
        json.dumps({"stages": mine, "peak_stored": peak[0], "step_s": times})
    )


def _worker(rank: int, spec_path: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    if spec.get("pin") and hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= RANKS:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    out = Path(spec["out"])
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(spec["store"], RANKS),
        rank=rank,
        world_size=RANKS,
        timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S),
    )
    try:
        for job in spec["jobs"]:
            _run_job(job, rank, out)
    finally:
        dist.destroy_process_group()


# -- driver side ---------------------------------------------------------------------------------------


def job(name: str, schedule: str, *, microbatches: int, stages_per_rank: int = 1, width: int = 64,
        rows: int = 8, warmup: int = 1, steps: int = 2, csv: str | None = None) -> dict:
    """One run on 2 ranks: torch's ``schedule`` class (or ``"csv"``: the torch CSV file ``csv``,
    run by ``_PipelineScheduleRuntime``), ``width``-wide blocks, ``rows`` rows per microbatch."""
    spr = 2 if schedule in V_STYLE else (1 if schedule in SINGLE_STAGE else stages_per_rank)
    return {"name": name, "schedule": schedule, "microbatches": microbatches, "stages_per_rank": spr,
            "stages": RANKS * spr, "width": width, "rows": rows, "warmup": warmup, "steps": steps,
            "csv": csv}


def run_jobs(jobs: list[dict], work: Path, *, timeout_s: float = 100.0, pin: bool = False) -> str | None:
    """Run ``jobs`` in one pair of gloo workers; traces land in ``work``. Returns None on success,
    else the tail of the workers' output."""
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "jobs.json"
    store = work / "store"
    store.unlink(missing_ok=True)
    spec.write_text(json.dumps({"jobs": jobs, "out": str(work), "store": str(store), "pin": pin}))
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"
    procs = [
        subprocess.Popen([sys.executable, __file__, "--worker", str(rank), str(spec)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(RANKS)
    ]
    logs = []
    try:
        for proc in procs:
            try:
                logs.append(proc.communicate(timeout=timeout_s)[0])
            except subprocess.TimeoutExpired:
                for other in procs:
                    other.kill()
                logs.append(proc.communicate()[0])
                logs.append(f"worker {proc.args[3]} timed out after {timeout_s} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if any(p.returncode != 0 for p in procs):
        return "\n".join(logs)[-4000:]
    return None


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--worker":
    _worker(int(sys.argv[2]), sys.argv[3])
