"""Real pipelined training steps under torch.profiler, for calibrating and checking diffpipe.

Runs ``torch.distributed.pipelining`` schedules with the gloo backend on CPU, in 2 worker processes
on loopback (each pinned to one core where the machine has them), on a stack of ``Linear + GELU``
blocks or of pre-norm transformer blocks (``MODELS``), and writes one ``torch.profiler`` Chrome
trace per rank and job. The study then calibrates diffpipe from ONE schedule's trace
(``dp.calibrate.from_torch_trace``) and predicts the step time of every other schedule, next to the
time torch measured; a source that ran full backwards predicts the split schedules with the I/W
split of a probe of the same stages (``calibrate.profile_stages``) or, for transformer blocks, of
the model's FLOPs, in rows of their own.

Usage::

    python papers/validation/run.py                    # the study (see README.md); writes results.json
    python papers/validation/run.py --out DIR --quick  # fewer steps and schedules

The workers are this file run as a script (``--worker RANK SPEC.json``); ``tests/test_calibrate.py``
imports ``run_jobs`` from here (by path) to run a small case end to end. Torch is imported once per
worker process; the workers meet through a ``FileStore`` in the work directory.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

RANKS = 2
#: ``diffpipe.calibrate._trace.STEP_LABEL`` (the workers run without diffpipe): the label around a step.
STEP_LABEL = "diffpipe.step"
#: Seconds one gloo operation may wait before the step fails.
GLOO_TIMEOUT_S = 30

#: A step is quiet when no rank's threads waited for a CPU for more than this fraction of it. The
#: count of quiet steps is reported per case (a diagnostic of the machine's load), but the measured
#: step time is the median of *all* steps: choosing the quiet ones chose the stalled ones, since a
#: step that stalls for a reason other than a CPU wait (page faults, a slow transfer) has the same
#: wait spread over a longer step, so a smaller fraction (the 2026-12-02 23:52 run: the 3 "quiet"
#: steps of 25 of ``2_stages.m16.diffpipe_1f1b__CSV`` were its 160-239 ms steps, the median of all
#: 25 is 115.7 ms; README, "Diagnosis of the 2-stage regression").
QUIET_WAIT_FRACTION = 0.05
#: Untimed rounds before the measured ones (every job once, no trace): each worker process reaches
#: its peak memory in them. Memory a process touches for the first time costs a page fault per
#: 4 KiB page, and where the machine's hypervisor has taken back free guest memory (a Firecracker
#: VM reporting free pages, ``page_reporting``), about 10 us a page instead of 1.4 (measured on
#: this study's machine): a 4 MiB weight gradient then stalls its op by about 13 ms. Without
#: these rounds the processes grow in round 0, the traced round (README, "Diagnosis of the 2-stage
#: error").
WARMUP_ROUNDS = 1
#: glibc's allocator for the workers: large blocks from the heap, never returned to the kernel, so
#: that memory freed by one step or job is reused by the next without new page faults (the
#: environment variables of ``mallopt``'s M_MMAP_THRESHOLD, at its 64-bit maximum, and M_TRIM_THRESHOLD).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}

#: torch schedule classes the study runs, with how their stages sit on ranks.
V_STYLE = ("ZBVZeroBubble", "DualPipeV")
SINGLE_STAGE = ("GPipe", "1F1B")


# -- the model ---------------------------------------------------------------------------------------


#: Width of one attention head of the transformer blocks (``model="transformer"``).
HEAD_DIM = 64
#: The models a job can run: ``Linear + GELU`` blocks on ``(rows, width)`` inputs, or pre-norm
#: transformer blocks on one sequence of ``rows`` tokens per microbatch, ``(1, rows, width)``.
MODELS = ("linear", "transformer")


def transformer_heads(width: int) -> int:
    """The attention heads of a ``width``-wide transformer block: ``width / HEAD_DIM``, at least 1."""
    return max(1, width // HEAD_DIM)


def _transformer_block(width: int):
    """A pre-norm GPT block (Radford et al. 2019, "Language Models are Unsupervised Multitask
    Learners", section 2.3): ``x + proj(causal attention(LayerNorm x))``, then ``x + down(GELU(up(
    LayerNorm x)))`` with a 4x wide MLP; ``width / HEAD_DIM`` heads, torch's fused
    ``scaled_dot_product_attention``."""
    from torch import nn

    heads = transformer_heads(width)
    if width % heads:
        raise ValueError(f"transformer width {width} is not a multiple of {heads} heads")

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            b, s, w = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, heads, w // heads).permute(2, 0, 3, 1, 4)
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, w))
            return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))

    return Block()


def _blocks(stages: int, width: int, blocks: list[int] | None = None, model: str = "linear"):
    """One module per stage, stage ``s`` a stack of ``blocks[s]`` (default 1) blocks of ``model``
    (``MODELS``: ``Linear + GELU``, or a transformer block), identical in every process (seeded)."""
    import torch
    from torch import nn

    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    torch.manual_seed(0)
    counts = blocks or [1] * stages
    if model == "transformer":
        return nn.ModuleList([nn.Sequential(*[_transformer_block(width) for _ in range(n)]) for n in counts])
    return nn.ModuleList([nn.Sequential(*[layer for _ in range(n) for layer in (nn.Linear(width, width), nn.GELU())])
                          for n in counts])


def example_input(model: str, rows: int, width: int, microbatches: int = 1, generator=None):
    """A batch of ``microbatches`` microbatches for ``model``: ``rows`` rows of ``width`` each
    (``linear``), or one sequence of ``rows`` tokens each (``transformer``)."""
    import torch

    shape = (microbatches, rows, width) if model == "transformer" else (rows * microbatches, width)
    return torch.randn(*shape, generator=generator)


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


def runqueue_wait() -> float:
    """Seconds this process's threads have spent runnable but waiting for a CPU (the second field
    of ``/proc/<pid>/task/<tid>/schedstat``; 0 where the kernel does not provide it)."""
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as handle:
                total += int(handle.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total * 1e-9


def minor_faults() -> int:
    """Page faults this process has taken without I/O so far (``getrusage``; 0 where unavailable)."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _run_job(job: dict, rank: int, out: Path) -> None:
    """``job["warmup"]`` untraced steps, then ``job["steps"]`` steps under the profiler; the meta
    file records the job's wall time (``job_s``: the stages' set-up, every step, the trace's export)."""
    began = time.perf_counter()
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torch.profiler import ProfilerActivity, profile, record_function

    n_stages, width, rows = job["stages"], job["width"], job["rows"]
    if job["schedule"] == "csv":
        import csv

        from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

        with open(job["csv"], newline="") as handle:
            row = list(csv.reader(handle))[rank]
        actions = [_Action.from_str(cell) for cell in row if cell]  # compounds: their sub-actions' stages
        mine = sorted({sub.stage_index for action in actions for sub in action.sub_actions or (action,)})
    else:
        mine = stages_of_rank(job["schedule"], rank, RANKS, job["stages_per_rank"])
    kind = job.get("model", "linear")
    model = _blocks(n_stages, width, job.get("blocks"), kind)
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
    x = example_input(kind, rows, width, job["microbatches"], generator)
    y = example_input(kind, rows, width, job["microbatches"], generator)

    def step() -> tuple[float, float, int]:
        for p in model.parameters():
            p.grad = None
        dist.barrier()
        waited, faulted = runqueue_wait(), minor_faults()
        start = time.perf_counter()
        with record_function(STEP_LABEL):  # the step's bounds in the trace (setup, wind-down)
            if 0 in mine:
                runtime.step(x, target=y, losses=[])
            else:
                runtime.step(target=y, losses=[])
        return time.perf_counter() - start, runqueue_wait() - waited, minor_faults() - faulted

    for _ in range(job["warmup"]):
        step()
    peak[0] = 0
    times, waits, faults = [], [], []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(job["steps"]):
            elapsed, waited, faulted = step()
            times.append(elapsed)
            waits.append(waited)
            faults.append(faulted)
            prof.step()
    if job.get("trace", True):
        prof.export_chrome_trace(str(out / f"{job['name']}.rank{rank}.json"))
    (out / f"{job['name']}.rank{rank}.meta.json").write_text(
        json.dumps({"stages": mine, "peak_stored": peak[0], "step_s": times, "runqueue_wait_s": waits,
                    "minor_faults": faults, "job_s": time.perf_counter() - began})
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
        rows: int = 8, warmup: int = 1, steps: int = 2, csv: str | None = None,
        blocks: list[int] | None = None, trace: bool = True, model: str = "linear") -> dict:
    """One run on 2 ranks: torch's ``schedule`` class (or ``"csv"``: the torch CSV file ``csv``,
    run by ``_PipelineScheduleRuntime``), ``width``-wide blocks of ``model`` (``MODELS``;
    ``blocks[s]`` of them on stage ``s``, default one each), ``rows`` rows (transformer: tokens)
    per microbatch; ``trace``: write the Chrome traces (every job's steps run under the profiler
    either way, so all step times are comparable)."""
    spr = 2 if schedule in V_STYLE else (1 if schedule in SINGLE_STAGE else stages_per_rank)
    if blocks is not None and len(blocks) != RANKS * spr:
        raise ValueError(f"job {name}: blocks has {len(blocks)} entries for {RANKS * spr} stages")
    if model not in MODELS:
        raise ValueError(f"job {name}: model must be one of {MODELS}, got {model!r}")
    return {"name": name, "schedule": schedule, "microbatches": microbatches, "stages_per_rank": spr,
            "stages": RANKS * spr, "width": width, "rows": rows, "warmup": warmup, "steps": steps,
            "csv": csv, "blocks": list(blocks) if blocks else None, "trace": trace,
            "model": model}


def run_jobs(jobs: list[dict], work: Path, *, timeout_s: float = 100.0, pin: bool = False,
             env: dict[str, str] | None = None) -> str | None:
    """Run ``jobs`` in one pair of gloo workers (``env``: more environment variables for them);
    traces land in ``work``. Returns None on success, else the tail of the workers' output."""
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "jobs.json"
    store = work / "store"
    store.unlink(missing_ok=True)
    spec.write_text(json.dumps({"jobs": jobs, "out": str(work), "store": str(store), "pin": pin}))
    from diffpipe.calibrate import run_ranks  # here: the workers run this file without diffpipe

    return run_ranks(__file__, [str(spec)], ranks=RANKS, timeout_s=timeout_s,
                     env={"OMP_NUM_THREADS": "1", **(env or {})})


# -- the study ---------------------------------------------------------------------------------------

TWO_STAGES = [("GPipe", "GPipe"), ("1F1B", "1F1B"), ("ZB-H1 (InterleavedZeroBubble)", "InterleavedZeroBubble"),
              ("diffpipe 1f1b (CSV)", "csv:1f1b"), ("diffpipe zb-h1 (CSV)", "csv:zb-h1")]
FOUR_STAGES = [("Interleaved1F1B", "Interleaved1F1B"), ("LoopedBFS", "LoopedBFS"),
               ("InterleavedZeroBubble", "InterleavedZeroBubble"), ("ZBVZeroBubble", "ZBVZeroBubble"),
               ("DualPipeV", "DualPipeV"), ("diffpipe interleaved-1f1b (CSV)", "csv:interleaved-1f1b")]

#: group -> its schedules (job name, torch schedule class or "csv:<diffpipe family>"), stages per
#: rank, microbatch counts, blocks per stage (absent: one each), the model (``MODELS``; absent:
#: ``linear``) and the width and rows per microbatch as multiples of the base (``--width``,
#: ``--rows``). Every case of a group runs the same model, so one case's calibration predicts all
#: of them.
GROUPS = {
    "2 stages": {"members": TWO_STAGES, "spr": 1, "microbatches": (4, 8, 16)},
    "4 stages": {"members": FOUR_STAGES, "spr": 2, "microbatches": (4, 8)},
    # stages 0 and 3 twice as deep: the loop placements (ranks hold 0+2 and 1+3) are balanced, the
    # V placements (0+3 and 1+2) put twice the work on rank 0
    "4 stages uneven": {"members": FOUR_STAGES, "spr": 2, "microbatches": (4, 8), "blocks": (2, 1, 1, 2)},
    # a quarter of the width, four times the rows: the same bytes per transfer, a quarter of the compute
    "4 stages costly p2p": {"members": FOUR_STAGES, "spr": 2, "microbatches": (8,), "width": 0.25, "rows": 4},
    # stage 0 twice as deep as stage 1 (each on its own rank): the schedules differ in how they
    # fill the light rank's bubbles (ZB-H1's W ops; GPipe's all-forward start)
    "2 stages uneven": {"members": TWO_STAGES, "spr": 1, "microbatches": (4, 8, 16), "blocks": (2, 1)},
    # a pre-norm transformer block per stage (causal attention + 4x MLP, 256 wide, 4 heads, one
    # sequence of 128 tokens per microbatch): about a 1024-wide Linear block's op time on one core
    # (measured here side by side, under load: forward 3.8-4.3 ms against 4.0 ms)
    "4 stages transformer": {"members": FOUR_STAGES, "spr": 2, "microbatches": (4, 8), "model": "transformer",
                             "width": 0.25},
}
#: Communication modes every calibration predicts in; the first is the study's headline.
MODES = ("torch-runtime", "overlap", "rendezvous")
#: The probe of each group's stages (``calibrate.profile_stages``, in the driver after the torch
#: runs, pinned to one core, one torch thread): timed rounds and untimed ones before them.
PROBE_REPEATS, PROBE_WARMUP = 25, 5


def _group_shape(spec: dict, *, width: int, rows: int) -> dict:
    """A group's model: stages, blocks per stage, model kind, width and rows per microbatch."""
    return {"stages": RANKS * spec["spr"], "blocks": list(spec["blocks"]) if spec.get("blocks") else None,
            "model": spec.get("model", "linear"), "width": max(1, round(width * spec.get("width", 1))),
            "rows": max(1, round(rows * spec.get("rows", 1)))}


def probe_groups(groups: dict, *, width: int, rows: int, repeats: int = PROBE_REPEATS,
                 warmup: int = PROBE_WARMUP) -> dict:
    """Per group, ``calibrate.profile_stages`` of its stages (the same seeded modules the workers
    run; torch's own ``stage_backward_input``/``stage_backward_weight``), on one core and one torch
    thread as a worker: the I/W split a full-backward source borrows to predict split schedules.
    Returns group -> ``{"forward", "backward", "input_grad", "weight"}`` (seconds per stage)."""
    import torch

    from diffpipe import calibrate

    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    threads = torch.get_num_threads()
    probes = {}
    try:
        torch.set_num_threads(1)
        if affinity and len(affinity) >= RANKS:
            os.sched_setaffinity(0, {sorted(affinity)[0]})
        for group, spec in groups.items():
            shape = _group_shape(spec, width=width, rows=rows)
            modules = list(_blocks(shape["stages"], shape["width"], shape["blocks"], shape["model"]))
            x = example_input(shape["model"], shape["rows"], shape["width"])
            target = torch.zeros_like(x)
            cal = calibrate.profile_stages(modules, x, repeats=repeats, warmup=warmup,
                                           loss_fn=lambda out, _t=target: torch.nn.functional.mse_loss(out, _t))
            probes[group] = {"forward": list(cal.forward), "backward": list(cal.backward),
                             "input_grad": list(cal.input_grad), "weight": list(cal.weight)}
    finally:
        torch.set_num_threads(threads)
        if affinity:
            os.sched_setaffinity(0, affinity)
    return probes


def split_sources(groups: dict, probes: dict | None, *, width: int, rows: int) -> dict:
    """Per group, how a full-backward calibration gets the I/W split it lacks: ``{"probe":
    Calibration}`` from ``probes`` (``probe_groups``) and, for a transformer group, ``{"model":
    Transformer}`` (the FLOPs of ``diffpipe.Transformer`` of the same shape: no embedding to speak
    of, a one-word vocabulary)."""
    from diffpipe import Transformer, calibrate

    out = {}
    for group, spec in groups.items():
        ways = {}
        if probes and group in probes:
            p = probes[group]
            ways["probe"] = calibrate.Calibration(tuple(p["forward"]), tuple(p["backward"]), tuple(p["input_grad"]),
                                                  tuple(p["weight"]), source="profile_stages")
        shape = _group_shape(spec, width=width, rows=rows)
        if shape["model"] == "transformer":
            blocks = shape["blocks"] or [1] * shape["stages"]
            width = shape["width"]
            ways["model"] = (Transformer(layers=sum(blocks), hidden=width, heads=transformer_heads(width),
                                         sequence=shape["rows"], vocabulary=1, dtype_bytes=4, dropout=False,
                                         tied_embedding=False, positions="rotary"), blocks)
        out[group] = ways
    return out


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def _diffpipe_schedule(kind: str, microbatches: int, spr: int, csv_path: Path | None):
    """The diffpipe ``Schedule`` a job ran (torch's Schedule1F1B runs its own loop: textbook 1F1B)."""
    from diffpipe.schedules import from_torch, from_torch_csv, get

    if kind.startswith("csv:"):
        return from_torch_csv(csv_path)
    if kind == "1F1B":
        return get("1f1b", devices=RANKS, microbatches=microbatches)
    return from_torch(kind, RANKS, microbatches, spr)


def _kendall(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-a of two rankings (ties count as neither concordant nor discordant)."""
    n = len(xs)
    if n < 2:
        return None
    score = 0
    for i in range(n):
        for j in range(i + 1, n):
            product = (xs[i] - xs[j]) * (ys[i] - ys[j])
            score += (product > 0) - (product < 0)
    return score / (n * (n - 1) / 2)


def _cases(groups: dict, work: Path, *, width: int, rows: int) -> dict:
    """Every case of the study (group x microbatches x schedule), with its CSV written."""
    from diffpipe.schedules import get, to_torch_csv

    meta = {}
    for group, spec in groups.items():
        spr = spec["spr"]
        for m in spec["microbatches"]:
            for name, kind in spec["members"]:
                key = f"{_slug(group)}.m{m}.{_slug(name)}"
                csv_path = None
                if kind.startswith("csv:"):
                    options = {"chunks": spr} if spr > 1 else {}
                    csv_path = work / f"{key}.csv"
                    to_torch_csv(get(kind[4:], devices=RANKS, microbatches=m, **options), csv_path)
                meta[key] = {"group": group, "name": name, "kind": kind, "spr": spr, "microbatches": m,
                             "width": max(1, round(width * spec.get("width", 1))),
                             "rows": max(1, round(rows * spec.get("rows", 1))),
                             "blocks": list(spec["blocks"]) if spec.get("blocks") else None, "csv": csv_path,
                             "model": spec.get("model", "linear")}
    return meta


def median_standard_error(iqr: float, rounds: int) -> float:
    """The standard error of a case's median step: ``1.2533 sigma / sqrt(n)`` (the median of ``n``
    normal samples), ``sigma = IQR / 1.349``, and ``n`` the rounds, not the steps: the steps of one
    round share its process and its neighbours' load, so only rounds count as independent."""
    return 1.2533 * (iqr / 1.349) / math.sqrt(rounds)


def _measured(work: Path, key: str, rounds: int) -> dict:
    """A case's step times over rounds and steps: the median and interquartile range of all of
    them (``QUIET_WAIT_FRACTION``: not of the quiet ones), and the CPU waits."""
    import statistics

    samples, fractions, faults, round_medians = [], [], [], []
    for r in range(rounds):
        metas = [json.loads((work / f"{key}.r{r}.rank{k}.meta.json").read_text()) for k in range(RANKS)]
        steps = []
        for ts, ws in zip(zip(*[m["step_s"] for m in metas], strict=True),
                          zip(*[m["runqueue_wait_s"] for m in metas], strict=True), strict=True):
            steps.append(max(ts))
            fractions.append(max(ws) / max(ts))
        samples += steps
        round_medians.append(statistics.median(steps))
        if all("minor_faults" in m for m in metas):  # traces before the count have none
            faults.append([max(fs) for fs in zip(*[m["minor_faults"] for m in metas], strict=True)])
    quiet = sum(f <= QUIET_WAIT_FRACTION for f in fractions)
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return {"measured_s": statistics.median(samples), "iqr_s": q[2] - q[0], "samples": len(samples),
            "rounds": rounds, "median_se_s": median_standard_error(q[2] - q[0], rounds), "quiet_steps": quiet,
            "round_medians_s": round_medians,
            "measured_from": "all steps",
            "runqueue_wait_fraction": statistics.median(fractions),
            "runqueue_wait_fractions": fractions,
            # per round, per step: the page faults of the rank that took more (round 0 is traced)
            "minor_faults": faults or None}


def study_jobs(meta: dict, *, rounds: int, steps: int, warmup_rounds: int = WARMUP_ROUNDS,
               trace_all: bool = False) -> list[dict]:
    """The study's jobs, in the order they run: every case once per round (interleaved), first
    ``warmup_rounds`` untimed rounds (``<case>.w<k>``: no trace, not analysed), then the measured
    rounds ``<case>.r<k>``, the traces of round 0 (``trace_all``: of every measured round); every job
    runs ``steps`` steps under the profiler (a warm-up job as many as a measured one: the profiler's
    buffers grow with them)."""
    jobs = []
    for r in range(-warmup_rounds, rounds):
        for key, info in meta.items():
            torch_kind = "csv" if info["kind"].startswith("csv:") else info["kind"]
            jobs.append(job(f"{key}.w{warmup_rounds + r}" if r < 0 else f"{key}.r{r}", torch_kind,
                            microbatches=info["microbatches"], stages_per_rank=info["spr"], width=info["width"],
                            rows=info["rows"], warmup=1, steps=steps,
                            csv=str(info["csv"]) if info["csv"] else None, blocks=info["blocks"],
                            trace=r == 0 or (trace_all and r > 0), model=info.get("model", "linear")))
    return jobs


def study(out: Path, *, groups: dict, rounds: int, steps: int, width: int, rows: int, work: Path,
          modes: tuple[str, ...] = MODES, run: bool = True, warmup_rounds: int = WARMUP_ROUNDS,
          trace_all: bool = False) -> dict:
    """Run every group's schedules (``warmup_rounds`` untimed, then ``rounds`` interleaved
    repetitions), calibrate from each
    schedule's trace in turn, predict the step time of every case of its group in each of
    ``modes``; returns the results. ``run=False`` analyses the traces already in ``work``."""
    meta = _cases(groups, work, width=width, rows=rows)
    if not run:  # analyse the traces a previous run left in ``work``
        previous = json.loads((work / "conditions.json").read_text())
        previous.update(modes=list(modes), groups={g: _spec_json(v) for g, v in groups.items()})
        if (work / "probes.json").exists():  # runs before the probe have none: no split-from-full rows
            previous["probes"] = json.loads((work / "probes.json").read_text())
        return analyze(meta, work, previous, modes)
    load_before = os.getloadavg()
    started = time.time()
    jobs = []
    for group in groups:  # each group in its own pair of workers, its warm-up round first (a pair
        # that ran all 432 jobs of the six groups fell out of step after 368: both ranks in one barrier)
        group_jobs = study_jobs({k: v for k, v in meta.items() if v["group"] == group}, rounds=rounds,
                                steps=steps, warmup_rounds=warmup_rounds, trace_all=trace_all)
        failure = run_jobs(group_jobs, work, timeout_s=60 + 5 * len(group_jobs), pin=True, env=MALLOC_ENV)
        if failure:
            raise SystemExit(f"the torch run failed ({group}):\n{failure}")
        jobs += group_jobs
    elapsed = time.time() - started
    load_after = os.getloadavg()
    probe_started = time.time()
    probes = probe_groups(groups, width=width, rows=rows)
    probe_s = time.time() - probe_started
    (work / "probes.json").write_text(json.dumps(probes))
    job_s: dict[str, float] = {}  # per group, its jobs' wall (warm-up rounds included), the slower rank's
    for job_spec in jobs:
        group = meta[job_spec["name"].rsplit(".", 1)[0]]["group"]
        metas = [json.loads((work / f"{job_spec['name']}.rank{k}.meta.json").read_text()) for k in range(RANKS)]
        job_s[group] = job_s.get(group, 0.0) + max(m["job_s"] for m in metas)
    conditions = {"ranks": RANKS, "width": width, "rows_per_microbatch": rows,
                  "groups": {g: _spec_json(spec) for g, spec in groups.items()},
                  "rounds": rounds, "steps_per_round": steps, "warmup_rounds": warmup_rounds,
                  "traced_rounds": rounds if trace_all else 1,
                  "worker_env": MALLOC_ENV, "pinned": True, "modes": list(modes),
                  "loadavg_before": load_before, "loadavg_after": load_after, "wall_s": elapsed,
                  "job_s_by_group": job_s, "probes": probes, "probe_s": probe_s,
                  "cpus": os.cpu_count(), "under_load": load_before[0] > LOADED}
    (work / "conditions.json").write_text(json.dumps(conditions))
    return analyze(meta, work, conditions, modes)


def _calibrate(work: Path, key: str, rounds: int, schedule, each=None, op_times: str = "median"):
    """A case's calibration from its traced rounds: round 0's, or where more rounds were traced
    (``--trace-all-rounds``), all of them combined (``calibrate.combine``: the same steps the case's
    measured time comes from; op times by the median of the rounds' means, ``op_times="median"``:
    rounds are the independent unit, as in ``median_standard_error`` and ``noise_floor``, so a
    stalled round moves an op time no more than it moves the case's measured median), with the
    median of the rounds' step times and round 0's orders.
    ``each(calibration, paths)``, when given, replaces each round's calibration before they combine
    (``pair_link.py``: the transfer delay from a subset of the arrivals); ``op_times="pooled"``: the
    rule before (``rounds.py`` compares the two)."""
    import dataclasses
    import statistics

    from diffpipe import calibrate

    traced = [r for r in range(rounds) if r == 0 or all((work / f"{key}.r{r}.rank{k}.json").exists()
                                                        for k in range(RANKS))]
    runs = []
    for r in traced:
        paths = [work / f"{key}.r{r}.rank{k}.json" for k in range(RANKS)]
        cal = calibrate.from_torch_trace(paths, schedule)
        runs.append(cal if each is None else each(cal, paths))
    if len(runs) == 1:
        return runs[0]
    return dataclasses.replace(calibrate.combine(runs, op_times=op_times), orders=runs[0].orders,
                               step_time=statistics.median(c.step_time for c in runs))


def analyze(meta: dict, work: Path, conditions: dict, modes: tuple, calibrate=None) -> dict:
    """Calibrate from each case's traces in ``work``, predict every case of its group in each mode
    (a name or a communication mode object). ``calibrate(work, key, rounds, schedule)``: a case's
    calibration (default ``_calibrate``; ``pair_link.py`` passes one that reprices the transfers)."""
    from diffpipe.schedules import peak_activations

    calibrate = _calibrate if calibrate is None else calibrate
    rounds = conditions["rounds"]
    cases = {}
    for key, info in meta.items():
        schedule = _diffpipe_schedule(info["kind"], info["microbatches"], info["spr"], info["csv"])
        try:
            cal = calibrate(work, key, rounds, schedule)
        except Exception as error:  # noqa: BLE001  (Schedule1F1B has no labels: recorded, not fatal)
            cal, note = None, str(error).split(".json: ", 1)[-1]
        else:
            note = None
        peaks = [json.loads((work / f"{key}.r0.rank{k}.meta.json").read_text())["peak_stored"] for k in range(RANKS)]
        cases[key] = {**{k: v for k, v in info.items() if k != "csv"}, **_measured(work, key, rounds),
                      "schedule": schedule, "calibration": cal, "calibration_note": note,
                      "torch_peak_stored": peaks, "diffpipe_peak_activations": list(peak_activations(schedule))}

    ways = split_sources(conditions["groups"], conditions.get("probes"), width=conditions["width"],
                         rows=conditions["rows_per_microbatch"])
    predictions = []
    for source_key, source in cases.items():
        cal = source["calibration"]
        if cal is None:
            continue
        # a full-backward source: the same calibration with the I/W split of each of its group's
        # ways (probe, model), for the split targets it cannot predict alone
        split_cals, source["split_notes"] = {}, {}
        if not cal.split_known():
            for way, given in ways.get(source["group"], {}).items():
                try:
                    split_cals[way] = (cal.with_split(probe=given) if way == "probe" else
                                       cal.with_split(model=given[0], layers_per_stage=given[1]))
                except Exception as error:  # noqa: BLE001  (recorded: the way does not fit this source)
                    source["split_notes"][way] = str(error)
        source["backward_split"] = {way: c.backward_split for way, c in split_cals.items()}
        for target_key, target in cases.items():
            if target["group"] != source["group"]:
                continue
            for mode in modes:
                row = {"source": source_key, "target": target_key, "mode": mode}
                try:
                    predicted = cal.predict(target["schedule"], mode=mode)
                except Exception as error:  # noqa: BLE001  (no I/W split measured: recorded as n/a)
                    predictions.append({**row, "predicted_s": None, "note": str(error)})
                else:
                    predictions.append(_prediction(row, predicted, target))
                    continue
                for way, split_cal in split_cals.items():  # split from full: rows of their own
                    predicted = split_cal.predict(target["schedule"], mode=mode)
                    predictions.append(_prediction({**row, "split": way}, predicted, target))
    splits = sorted({p["split"] for p in predictions if p.get("split")})
    return {
        "conditions": conditions,
        "cases": {k: {**{f: v for f, v in c.items() if f not in ("schedule", "calibration")},
                      "calibration": c["calibration"].to_dict() if c["calibration"] else None}
                  for k, c in cases.items()},
        "predictions": predictions,
        "summary": [row for split in (None, *splits) for row in summarize_rows(cases, predictions, modes, split)],
    }


def _prediction(row: dict, predicted: float, target: dict) -> dict:
    return {**row, "predicted_s": predicted, "measured_s": target["measured_s"],
            "error": (predicted - target["measured_s"]) / target["measured_s"]}


def _usable(prediction: dict, split: str | None) -> bool:
    """A prediction counted under ``split``: a plain one (a source predicting with what it
    measured), or, where ``split`` names a way (``probe``, ``model``), one of that way's
    split-from-full predictions (of the targets its source could not predict alone)."""
    return prediction["predicted_s"] is not None and prediction.get("split") in (None, split)


def _spec_json(spec: dict) -> dict:
    """A ``GROUPS`` entry as JSON (schedules by name)."""
    return {k: [m[0] for m in v] if k == "members" else list(v) if isinstance(v, tuple) else v
            for k, v in spec.items()}


#: A run is "under load" when the 1-minute load average before it exceeds this. The average after
#: it is recorded but not judged: the study's own two busy ranks raise it by 1 or more.
LOADED = 0.5


def noise_floor(case: dict) -> float | None:
    """The mean absolute relative error a perfect predictor would still show against ``case``'s
    measured step: ``sqrt(2 / pi)`` (the mean of ``|N(0, 1)|``) times the standard error of a median
    over its rounds (``1.2533 sigma / sqrt(rounds)``; rounds, not steps, are independent, as in
    ``median_standard_error``) over its measured step, with ``sigma`` the rounds' spread taken
    robustly (``1.4826`` times the median absolute deviation of the round medians), as the measured
    median of all steps is: one stalled round sets neither. None without per-round medians (fewer
    than two rounds, or results written before they were recorded)."""
    import statistics

    medians = case.get("round_medians_s") or []
    if len(medians) < 2:
        return None
    centre = statistics.median(medians)
    sigma = 1.4826 * statistics.median(abs(m - centre) for m in medians)
    return math.sqrt(2 / math.pi) * 1.2533 * sigma / math.sqrt(len(medians)) / case["measured_s"]


def separated_beyond_noise(a: dict, b: dict) -> bool:
    """Whether two cases' measured medians differ by more than twice the standard error of their
    difference (``median_standard_error``): about 95% confidence that the faster one is faster."""
    return abs(a["measured_s"] - b["measured_s"]) > 2 * math.hypot(a["median_se_s"], b["median_se_s"])


def summarize_rows(cases: dict, predictions: list[dict], modes, split: str | None = None) -> list[dict]:
    """Per calibration source, mode and microbatch count of the targets: MAPE over the other
    cases, Kendall's tau, and the clearly separated pairs (``separated_beyond_noise``) and how many
    of them the prediction orders correctly. ``split``: with that way's split-from-full predictions
    too (``_usable``); each row says which (``split``)."""
    import statistics

    rows = []
    for mode in modes:
        for source_key in cases:
            mine = [p for p in predictions if p["source"] == source_key and p["mode"] == mode
                    and _usable(p, split) and p["target"] != source_key]
            for m in sorted({cases[p["target"]]["microbatches"] for p in mine}):
                sub = [p for p in mine if cases[p["target"]]["microbatches"] == m]
                if len(sub) < 2:
                    continue
                pred = [p["predicted_s"] for p in sub]
                meas = [p["measured_s"] for p in sub]
                separated, wrong = 0, []
                for i in range(len(sub)):
                    for j in range(i + 1, len(sub)):
                        a, b = cases[sub[i]["target"]], cases[sub[j]["target"]]
                        if separated_beyond_noise(a, b):
                            separated += 1
                            if (pred[i] - pred[j]) * (meas[i] - meas[j]) <= 0:
                                wrong.append([sub[i]["target"], sub[j]["target"]])
                rows.append({"source": source_key, "group": cases[source_key]["group"], "mode": mode, "split": split,
                             "microbatches": m, "targets": len(sub),
                             "mape": statistics.mean(abs(p["error"]) for p in sub),
                             "max_error": max((p["error"] for p in sub), key=abs),
                             "kendall_tau": _kendall(pred, meas), "separated_pairs": separated,
                             "ordered_correctly": separated - len(wrong), "misordered": wrong})
    return rows


#: The issue's targets (issue 13): cross-schedule MAPE, mean Kendall tau, every separated pair.
TARGET_MAPE, TARGET_TAU = 0.03, 0.8


def _group_line(results: dict, mode: str, group: str, split: str | None) -> str | None:
    """One row of the summary tables (``split``: with that way's split-from-full predictions)."""
    import statistics

    cases = results["cases"]
    preds = [p for p in results["predictions"] if p["mode"] == mode and _usable(p, split)
             and p["source"] != p["target"] and cases[p["source"]]["group"] == group]
    sub = [r for r in results["summary"] if r["mode"] == mode and r["group"] == group and r.get("split") == split]
    if not preds:
        return None
    mape = statistics.mean(abs(p["error"]) for p in preds)
    per_source = [statistics.mean(abs(p["error"]) for p in preds if p["source"] == s)
                  for s in dict.fromkeys(p["source"] for p in preds)]
    taus = [r["kendall_tau"] for r in sub if r["kendall_tau"] is not None and r["targets"] >= 3]
    tau = statistics.mean(taus) if taus else None
    separated = sum(r["separated_pairs"] for r in sub)
    ordered = sum(r["ordered_correctly"] for r in sub)
    met = mape <= TARGET_MAPE and tau is not None and tau >= TARGET_TAU and ordered == separated
    cells = [mode, group] + ([split] if split else []) + [str(len(preds))]
    if split:  # the split-from-full predictions alone, and the same targets from sources that ran split
        own = [p for p in preds if p.get("split") == split]
        targets = {p["target"] for p in own}
        from_split = [p for p in preds if p.get("split") is None and p["target"] in targets
                      and cases[p["source"]]["calibration"] and not _ran_full(cases[p["source"]])]
        cells += [f"{len(own)}: {100 * statistics.mean(abs(p['error']) for p in own):.1f}%" if own else "0",
                  f"{100 * statistics.mean(abs(p['error']) for p in from_split):.1f}%" if from_split else "n/a"]
    floors = [noise_floor(cases[t]) for t in dict.fromkeys(p["target"] for p in preds)]
    floor = "n/a" if None in floors else f"{100 * statistics.mean(floors):.1f}%"
    cells += [f"{100 * mape:.1f}%", floor,
              f"{100 * statistics.median(per_source):.1f}% / {100 * max(per_source):.1f}%",
              "n/a" if tau is None else f"{tau:.2f}", f"{ordered}/{separated}", "yes" if met else "no"]
    return "| " + " | ".join(cells) + " |"


def _ran_full(case: dict) -> bool:
    """Whether a case's source ran full backwards only (it measured no ``I``/``W``)."""
    cal = case["calibration"]
    return not any(v for v in (cal.get("input_grad") or ()) if v) and not any(v for v in (cal.get("weight") or ()) if v)


def summary_table(results: dict) -> str:
    """The study's headline as markdown: per mode and group, the cross-schedule MAPE (over every
    prediction of another case), the noise floor (the mean ``noise_floor`` of its targets: what a
    perfect predictor would still miss by), the median and worst per-source MAPE, the mean Kendall tau (rows
    with at least 3 targets), the separated pairs ordered correctly, and memory; each checked
    against the targets. Then, where the run has them, the same with the split-from-full
    predictions: full-backward sources predicting split schedules with the I/W split of a probe
    (``profile_stages``) or of the model's FLOPs, next to the same targets predicted from sources
    that ran split. ``python papers/validation/run.py --summary results.json`` prints it."""
    cases = results["cases"]
    c = results["conditions"]
    head = (f"MAPE (target <= {100 * TARGET_MAPE:.0f}%) | noise floor | per-source MAPE median / max "
            f"| mean Kendall tau (target >= {TARGET_TAU}) | separated pairs ordered (target: all) | met? |")
    lines = [f"Conditions: {c['rounds']} rounds x {c['steps_per_round']} steps, base width {c['width']}, "
             f"{c['rows_per_microbatch']} rows; load average before/after {c['loadavg_before'][0]:.2f} / "
             f"{c['loadavg_after'][0]:.2f} on {c['cpus']} CPUs"
             + (" -- TAKEN UNDER LOAD: not an accuracy claim" if c["under_load"] else "")
             + f"; wall {c['wall_s']:.0f} s.", "",
             f"| mode | group | predictions | {head}", "|---|---|---|---|---|---|---|---|---|"]
    for mode in c["modes"]:
        for group in c["groups"]:
            line = _group_line(results, mode, group, None)
            if line:
                lines.append(line)
    splits = sorted({p["split"] for p in results["predictions"] if p.get("split")})
    if splits:
        lines += ["", "Split schedules from full-backward sources (each source predicts every case of its group; "
                  "a full-backward one prices a split target with the I/W split of the probe or the model):", "",
                  f"| mode | group | split from | predictions | split from full: count, MAPE | same targets from "
                  f"split runs, MAPE | {head}", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for mode in c["modes"]:
            for split in splits:
                for group in c["groups"]:
                    line = _group_line(results, mode, group, split)
                    if line and any(p.get("split") == split and cases[p["source"]]["group"] == group
                                    for p in results["predictions"]):
                        lines.append(line)
    exact = sum(cc["torch_peak_stored"] == cc["diffpipe_peak_activations"] for cc in cases.values())
    lines += ["", f"Memory: diffpipe's peak stored activations equal torch's on every rank in {exact} of "
              f"{len(cases)} cases."]
    return "\n".join(lines) + "\n"


def _traced_ratio(case: dict) -> str:
    """The traced round's median step (the calibration's ``step_time``) over the case's measured
    time: far from 1, the round a calibration comes from is not the steps it is judged against."""
    cal = case["calibration"]
    return f"{cal['step_time'] / case['measured_s']:.2f}" if cal and cal.get("step_time") else "n/a"


def _faults(case: dict) -> str:
    """Median page faults per step in the traced round and in the other rounds."""
    import statistics

    rounds = case.get("minor_faults")
    if not rounds:
        return "n/a"
    others = [f for r in rounds[1:] for f in r]
    return f"{statistics.median(rounds[0]):.0f} / {statistics.median(others):.0f}" if others else \
        f"{statistics.median(rounds[0]):.0f} / n/a"


def _markdown(results: dict) -> str:
    c = results["conditions"]
    lines = [f"# Validation run (ranks {c['ranks']}, base width {c['width']}, {c['rows_per_microbatch']} rows per "
             f"microbatch, {c['rounds']} rounds x {c['steps_per_round']} steps)", "", summary_table(results),
             "| case | width x rows | measured ms | IQR ms | quiet steps | runqueue wait | traced round / measured "
             "| page faults per step, traced round / others | torch peak stored | diffpipe peak | calibrated? |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, case in results["cases"].items():
        lines.append(f"| {key} | {case['width']} x {case['rows']} | {1e3 * case['measured_s']:.2f} | "
                     f"{1e3 * case['iqr_s']:.2f} | {case['quiet_steps']}/{case['samples']} | "
                     f"{100 * case['runqueue_wait_fraction']:.0f}% | {_traced_ratio(case)} | {_faults(case)} | "
                     f"{case['torch_peak_stored']} | "
                     f"{case['diffpipe_peak_activations']} | "
                     f"{'yes' if case['calibration'] else 'no: ' + (case['calibration_note'] or '')[:60]} |")
    lines += ["", "| mode | calibrated from | microbatches | targets | MAPE | worst error | Kendall tau "
              "| separated pairs ordered |", "|---|---|---|---|---|---|---|---|"]
    for s in results["summary"]:
        tau = "n/a" if s["kendall_tau"] is None else f"{s['kendall_tau']:.2f}"
        mode = s["mode"] + (f" + {s['split']} split" if s.get("split") else "")
        lines.append(f"| {mode} | {s['source']} | {s['microbatches']} | {s['targets']} | {100 * s['mape']:.1f}% | "
                     f"{100 * s['max_error']:+.1f}% | {tau} | {s['ordered_correctly']}/{s['separated_pairs']} |")
    return "\n".join(lines + _split_markdown(results)) + "\n"


def _split_markdown(results: dict) -> list[str]:
    """The split-from-full predictions one by one (the headline mode), and each probe's split."""
    c, cases = results["conditions"], results["cases"]
    mode = c["modes"][0]
    own = [p for p in results["predictions"] if p.get("split") and p["mode"] == mode]
    if not own:
        return []
    ways = sorted({p["split"] for p in own})
    lines = ["", f"Split schedules from full-backward sources ({mode}): each prediction's error, by where the "
             "I/W split came from", "", f"| calibrated from | target | measured ms | {' | '.join(ways)} |",
             "|---|---|---|" + "---|" * len(ways)]
    for source, target in dict.fromkeys((p["source"], p["target"]) for p in own):
        errors = {p["split"]: p["error"] for p in own if p["source"] == source and p["target"] == target}
        cells = " | ".join(f"{100 * errors[w]:+.1f}%" if w in errors else "-" for w in ways)
        lines.append(f"| {source} | {target} | {1e3 * cases[target]['measured_s']:.2f} | {cells} |")
    for group, probe in (c.get("probes") or {}).items():
        ratios = ", ".join(f"stage {k}: I/B {i / b:.2f}, W/B {w / b:.2f}" for k, (b, i, w) in
                           enumerate(zip(probe["backward"], probe["input_grad"], probe["weight"], strict=True)))
        lines.append(f"\nProbe of {group} (`profile_stages`, {PROBE_REPEATS} repeats): {ratios}.")
    return lines


def main(argv: list[str] | None = None) -> None:
    import argparse
    import tempfile

    from diffpipe import Staged, dumps_json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--quick", action="store_true",
                        help="the first microbatch count of each group, 2 rounds x 3 steps")
    parser.add_argument("--width", type=int, default=1024, help="base width of the blocks")
    parser.add_argument("--rows", type=int, default=128, help="base rows per microbatch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--groups", nargs="+", choices=list(GROUPS), help="run only these groups")
    parser.add_argument("--trace-all-rounds", action="store_true",
                        help="write the traces of every measured round (not only round 0's) and calibrate from all")
    parser.add_argument("--work", type=Path, help="keep the traces in this directory (default: a temporary one)")
    parser.add_argument("--analyze-only", action="store_true",
                        help="run nothing: analyse the traces a previous run with the same options left in --work")
    parser.add_argument("--summary", type=Path, metavar="RESULTS_JSON",
                        help="print the summary table of a results.json and exit (runs nothing)")
    args = parser.parse_args(argv)
    if args.summary is not None:
        print(summary_table(json.loads(args.summary.read_text())), end="")
        return
    groups = {g: spec for g, spec in GROUPS.items() if not args.groups or g in args.groups}
    if args.quick:
        groups = {g: {**spec, "microbatches": spec["microbatches"][:1]} for g, spec in groups.items()}
    rounds, steps = (2, 3) if args.quick else (args.rounds, args.steps)
    args.out.mkdir(parents=True, exist_ok=True)  # before the runs, not after them
    with tempfile.TemporaryDirectory(prefix="diffpipe-validation-") as tmp:
        work = Path(tmp) if args.work is None else args.work
        work.mkdir(parents=True, exist_ok=True)
        results = study(args.out, groups=groups, rounds=rounds, steps=steps, width=args.width,
                        rows=args.rows, work=work, run=not args.analyze_only, trace_all=args.trace_all_rounds)
    with Staged() as staged:
        staged.add(args.out / "results.json", dumps_json(results), "results")
        staged.add(args.out / "results.md", _markdown(results), "results table")
    print(summary_table(results), end="")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        _worker(int(sys.argv[2]), sys.argv[3])
    else:
        main()
