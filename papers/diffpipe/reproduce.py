"""diffpipe's own results: gradient stage balancing and micro-batch split against the baselines,
and the recorded benchmark numbers (sweep throughput, simulator speed) next to the pure-Python
reference evaluator.

    python papers/diffpipe/reproduce.py            # every configuration, writes into this folder
    python papers/diffpipe/reproduce.py --fast     # one stage-balancing and one split case (into a temp dir)

Writes ``stage_balance.md``, ``microbatch_split.md``, ``benchmarks.md``, ``stage_balance.png`` and
every number in ``results.json`` (into ``--out`` when given). Every plan is evaluated by the exact
simulator (``diffpipe.evaluate_plans``); benchmark numbers are only read from
``benchmarks/results/*.json``, never measured here. ``tests/test_paper_diffpipe.py`` checks each
claim of the README.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import diffpipe as dp
from diffpipe import brute_force_partition, compositions, evaluate_plans, minmax_partition, uniform_partition

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parents[1] / "benchmarks" / "results"
#: Brute force is run when there are at most this many stage splits (C(layers - 1, stages - 1)) or
#: microbatch splits (C(batch - 1, microbatches - 1)).
BRUTE_FORCE_SPLITS = 300_000
#: Fixed seconds per compute op in the micro-batch split cases (launch and framework overhead).
OVERHEAD = 2e-3
VOCABULARY = 50257


@dataclass(frozen=True)
class Balance:
    name: str
    blocks: int
    hidden: int
    heads: int
    microbatch: int
    device: str
    link: str
    stages: int
    microbatches: int
    capacity: float | None = None  # bytes; None: the device's memory


@dataclass(frozen=True)
class Split:
    name: str
    blocks: int
    device: str
    stages: int
    batch: int
    microbatches: int


BALANCE = (
    Balance("gpt14-A100x4", 14, 2048, 16, 2, "A100", "nvlink3", 4, 8),
    Balance("gpt22-h4096-A100x8", 22, 4096, 32, 1, "A100", "nvlink3", 8, 16),
    Balance("gpt22-A100x8-20GB", 22, 2048, 32, 1, "A100", "nvlink3", 8, 16, capacity=20e9),
    Balance("gpt30-H100x8", 30, 2048, 16, 2, "H100", "nvlink4", 8, 16),
)
SPLIT = (
    Split("gpt6-A100x4-b16", 6, "A100", 4, 16, 8),
    Split("gpt22-H100x8-b64", 22, "H100", 8, 64, 16),
)
FAST = ("gpt14-A100x4", "gpt6-A100x4-b16")


def balance_workload(c: Balance) -> dp.Workload:
    model = dp.Transformer(layers=c.blocks, hidden=c.hidden, heads=c.heads, sequence=2048, vocabulary=VOCABULARY,
                           microbatch_size=c.microbatch)
    return dp.Workload.from_model(model, dp.presets.device(c.device), dp.presets.network(c.link),
                                  capacity=c.capacity)


def split_workload(c: Split) -> dp.Workload:
    model = dp.Transformer(layers=c.blocks, hidden=2048, heads=16, sequence=2048, vocabulary=VOCABULARY,
                           microbatch_size=c.batch // c.microbatches)
    network = dp.presets.network("nvlink4", "ib-ndr")  # two stages per node: SPLIT_DEVICES_PER_NODE
    workload = dp.Workload.from_model(model, dp.presets.device(c.device), network, overhead=OVERHEAD)
    return workload.with_split(minmax_partition(workload, c.stages))


#: The microbatch-split configurations' topology: two pipeline stages per node, so that stage
#: neighbours alternate between NVLink and InfiniBand (the graph's ``devices_per_node``).
SPLIT_DEVICES_PER_NODE = 2


def graph_of(stages: int, microbatches: int, devices_per_node: int | None = None) -> dp.Graph:
    return dp.compile(dp.schedules.get("1f1b", devices=stages, microbatches=microbatches),
                      devices_per_node=devices_per_node)


def plan_row(counts, time: float, memory: np.ndarray, fits: bool) -> dict:
    return {"plan": [int(x) for x in counts], "makespan": float(time), "peak_memory": float(np.max(memory)),
            "fits": bool(fits)}


def run_balance(c: Balance) -> dict:
    workload, graph = balance_workload(c), graph_of(c.stages, c.microbatches)
    result = dp.optimize(graph, workload, dp.StageBalance(c.stages), steps=300)
    rows = {}
    for name, counts in (("uniform", uniform_partition(workload.layers, c.stages)),
                         ("minmax", minmax_partition(workload, c.stages))):
        t, m, f = evaluate_plans(graph, workload, [counts])
        rows[name] = plan_row(counts, t[0], m[0], f[0])
    p = result.plan
    rows["optimize"] = plan_row(p.layers_per_stage, p.makespan, np.asarray(p.peak_memory), p.fits)
    splits = math.comb(workload.layers - 1, c.stages - 1)
    if splits <= BRUTE_FORCE_SPLITS:
        b = brute_force_partition(graph, workload)
        rows["brute_force"] = plan_row(b.layers_per_stage, b.makespan, np.asarray(b.peak_memory), b.fits)
    compute = np.asarray(workload.compute, np.float64)
    return {"config": c.__dict__, "layers": workload.layers, "splits": splits,
            "capacity": float(np.max(np.asarray(workload.capacity))),
            "layer_ms": {"embedding": compute[0] * 1e3, "block": compute[1] * 1e3, "head": compute[-1] * 1e3},
            "evaluations": result.evaluations, "baseline": result.baseline, **rows}


def run_split(c: Split) -> dict:
    workload, graph = split_workload(c), graph_of(c.stages, c.microbatches, SPLIT_DEVICES_PER_NODE)
    result = dp.optimize(graph, workload, dp.MicrobatchSplit(c.batch, c.microbatches), steps=300)
    counts = np.asarray(workload.layers_per_stage)[None, :]
    mean = c.batch / c.microbatches

    def exact(samples: np.ndarray) -> dict:
        t, m, f = evaluate_plans(graph, workload, counts, (np.asarray(samples) / mean)[None, :])
        return plan_row(samples, t[0], m[0], f[0])

    rows = {"equal": exact(np.full(c.microbatches, c.batch // c.microbatches)),
            "optimize": exact(np.asarray(result.samples))}
    splits = math.comb(c.batch - 1, c.microbatches - 1)
    if splits <= BRUTE_FORCE_SPLITS:
        every = compositions(c.batch, c.microbatches)
        t, _, f = evaluate_plans(graph, workload, np.repeat(counts, len(every), axis=0), every / mean)
        rows["brute_force"] = exact(every[int(np.argmin(np.where(f, t, np.inf)))])
    return {"config": c.__dict__, "layers_per_stage": list(workload.layers_per_stage), "splits": splits,
            "overhead_s": OVERHEAD, "evaluations": result.evaluations, **rows}


# -- recorded benchmarks ------------------------------------------------------------------------------
def benchmarks() -> dict:
    """The numbers of benchmarks/results/*.json, with the command that produced each (None: missing)."""
    out: dict = {}
    path = BENCHMARKS / "optimize-cpu.json"
    if path.exists():
        d = json.loads(path.read_text())
        small = d["layers_24"]
        out["optimize"] = {
            "file": "benchmarks/results/optimize-cpu.json", "command": "python benchmarks/bench_optimize.py",
            "instances_24": len(small),
            "max_gap_vs_brute_force": max(r["gap"] for r in small),
            "optimizer_seconds_max": max(r["optimizer_seconds"] for r in small),
            "brute_force_seconds_max": max(r["brute_force_seconds"] for r in small),
            "brute_force_evaluations": small[0]["brute_force_evaluations"],
            "python_reference_seconds_per_evaluation": d["python_reference_seconds_per_evaluation"],
            "vs_uniform_64": [r["vs_uniform"] for r in d["layers_64"]],
            "vs_minmax_64": [r["vs_minmax"] for r in d["layers_64"]],
        }
    else:
        out["optimize"] = None
    path = BENCHMARKS / "sweep-cpu.json"
    if path.exists():
        d = json.loads(path.read_text())
        out["sweep"] = {
            "file": "benchmarks/results/sweep-cpu.json",
            "command": "python benchmarks/bench_sweep.py" + (
                f" --host-devices {len(d['platform']['devices'])}" if len(d["platform"]["devices"]) > 1 else ""),
            "points": d["grid"]["points"], "cpus": d["platform"]["cpus"],
            "cold_points_per_s": d["sweep"]["cold_points_per_s"], "warm_points_per_s": d["sweep"]["warm_points_per_s"],
            "reference_s_per_point": d["reference"]["s_per_point"], "speedup_warm": d["reference"]["speedup_warm"],
            "max_rel_diff": d["reference"]["max_rel_diff"],
            "maxrss_after_warm_mib": d["sweep"]["maxrss_after_warm_mib"],
        }
    else:
        out["sweep"] = None
    path = BENCHMARKS / "simulator-cpu.json"
    if path.exists():
        d = json.loads(path.read_text())
        batched = d["batched"][0]
        grad = {g["adjoint"]: g for g in d["grad"]}
        out["simulator"] = {
            "file": "benchmarks/results/simulator-cpu.json", "command": "python benchmarks/bench_simulator.py",
            "batched_case": batched["case"], "batched_s_per_eval": batched["batched_s_per_eval"],
            "python_s_per_eval": batched["python_s_per_eval"], "speedup_batched": batched["speedup_batched"],
            "speedup_vmap": batched["speedup_vmap"],
            "grad_case": grad["sweep"]["case"].split(",")[0],
            "grad_time_ratio": {k: g["time_ratio"] for k, g in grad.items()},
        }
    else:
        out["simulator"] = None
    return out


# -- outputs ----------------------------------------------------------------------------------------------
def ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def balance_markdown(runs: list[dict]) -> str:
    lines = ["| configuration | layers (emb / block / head F+I+W ms) | split | layers per stage | makespan (ms) "
             "| vs uniform | peak GiB | fits |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        c, lm = r["config"], r["layer_ms"]
        what = (f"{c['name']}: 1F1B, {c['stages']} x {c['device']}, m={c['microbatches']}"
                + (f", capacity {c['capacity'] / 1e9:g} GB" if c["capacity"] else ""))
        layers = f"{r['layers']} ({lm['embedding']:.2f} / {lm['block']:.2f} / {lm['head']:.2f})"
        for name in ("uniform", "minmax", "optimize", "brute_force"):
            if name not in r:
                continue
            p = r[name]
            lines.append(f"| {what} | {layers} | {name} | {p['plan']} | {ms(p['makespan'])} | "
                         f"{r['uniform']['makespan'] / p['makespan']:.3f}x | {p['peak_memory'] / 2**30:.1f} | "
                         f"{p['fits']} |")
            what = layers = ""
        if "brute_force" not in r:
            lines.append(f"| | | brute force | not run: {r['splits']:,} splits | | | | |")
    return "\n".join(lines) + "\n"


def split_markdown(runs: list[dict]) -> str:
    lines = ["| configuration | split | samples per microbatch | makespan (ms) | vs equal | peak GiB |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        c = r["config"]
        what = (f"{c['name']}: 1F1B, {c['stages']} x {c['device']}, {c['batch']} samples / {c['microbatches']} "
                f"microbatches, layers {r['layers_per_stage']}")
        for name in ("equal", "optimize", "brute_force"):
            if name not in r:
                continue
            p = r[name]
            lines.append(f"| {what} | {name} | {p['plan']} | {ms(p['makespan'])} | "
                         f"{r['equal']['makespan'] / p['makespan']:.3f}x | {p['peak_memory'] / 2**30:.1f} |")
            what = ""
        if "brute_force" not in r:
            lines.append(f"| | brute force | not run: {r['splits']:,} splits | | | |")
    return "\n".join(lines) + "\n"


def benchmarks_markdown(b: dict) -> str:
    lines = []
    o = b["optimize"]
    if o is None:
        lines.append("- optimize: `benchmarks/results/optimize-cpu.json` is missing.")
    else:
        lines += [f"- **optimize** (`{o['file']}`, produced by `{o['command']}`, CPU): on {o['instances_24']} "
                  f"instances of 24 layers / 8 stages the optimizer is within {o['max_gap_vs_brute_force']:.2%} "
                  f"of brute force ({o['brute_force_evaluations']:,} exact evaluations); warm optimizer at most "
                  f"{o['optimizer_seconds_max']:.2f} s against brute force up to {o['brute_force_seconds_max']:.2f} s. "
                  f"The pure-Python reference evaluator takes "
                  f"{o['python_reference_seconds_per_evaluation'] * 1e3:.2f} ms per evaluation there, i.e. "
                  f"{o['python_reference_seconds_per_evaluation'] * o['brute_force_evaluations']:.0f} s for the "
                  "same brute force."]
    s = b["sweep"]
    if s is None:
        lines.append("- sweep: `benchmarks/results/sweep-cpu.json` is missing.")
    else:
        lines += [f"- **sweep** (`{s['file']}`, produced by `{s['command']}` on {s['cpus']} CPU cores): "
                  f"{s['points']:,} "
                  f"points at {s['warm_points_per_s']:,.0f} points/s warm ({s['cold_points_per_s']:,.0f} cold, "
                  f"compilation included), {s['speedup_warm']:.1f}x the pure-Python reference evaluator "
                  f"({s['reference_s_per_point'] * 1e3:.3f} ms per point) with max relative difference "
                  f"{s['max_rel_diff']:g}; peak RSS {s['maxrss_after_warm_mib']:.0f} MiB."]
    if b["simulator"] is None:
        lines.append("- simulator: `benchmarks/results/simulator-cpu.json` is missing (run "
                     "`python benchmarks/bench_simulator.py`); no simulator-speed numbers are claimed.")
    else:
        m = b["simulator"]
        ratios = ", ".join(f"{k} {v:.1f}x" for k, v in m["grad_time_ratio"].items())
        lines.append(f"- **simulator** (`{m['file']}`, produced by `{m['command']}`, CPU): {m['batched_case']}: "
                     f"{m['batched_s_per_eval'] * 1e6:.1f} µs per evaluation batched, {m['speedup_batched']:.0f}x "
                     f"the pure-Python reference evaluator ({m['python_s_per_eval'] * 1e3:.2f} ms), "
                     f"{m['speedup_vmap']:.0f}x through `jax.vmap`; value-and-gradient over forward time on "
                     f"{m['grad_case']}: {ratios}.")
    return "\n".join(lines) + "\n"


def figure(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["uniform", "minmax", "optimize", "brute_force"]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    width = 0.2
    for j, name in enumerate(names):
        xs, ys = [], []
        for i, r in enumerate(runs):
            if name in r:
                xs.append(i + (j - 1.5) * width)
                ys.append(r["uniform"]["makespan"] / r[name]["makespan"])
        bars = ax.bar(xs, ys, width, label=name.replace("_", " "))
        for x, r in zip(xs, [r for r in runs if name in r], strict=True):
            if not r[name]["fits"]:
                ax.annotate("OOM", (x, 1.0), ha="center", va="bottom", fontsize=7, rotation=90, color="w")
        del bars
    ax.set_xticks(range(len(runs)), [r["config"]["name"] for r in runs], fontsize=8)
    ax.set_ylabel("speed-up over uniform (exact)")
    ax.set_ylim(0.95, max(r["uniform"]["makespan"] / r["optimize"]["makespan"] for r in runs) + 0.05)
    ax.axhline(1.0, c="k", lw=0.6)
    ax.legend(fontsize=8, ncol=4, loc="upper right")
    ax.set_title("Stage balancing, 1F1B: exact makespan speed-up over equal layers per stage")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help=f"only {', '.join(FAST)} (into a temp dir)")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: this folder; "
                        "a temp dir with --fast)")
    parser.add_argument("--benchmarks-only", action="store_true",
                        help="only re-read benchmarks/results/*.json into results.json and benchmarks.md")
    args = parser.parse_args(argv)
    if args.benchmarks_only:
        out = args.out or HERE
        doc = json.loads((out / "results.json").read_text())
        doc["benchmarks"] = benchmarks()
        (out / "benchmarks.md").write_text(benchmarks_markdown(doc["benchmarks"]))
        (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(benchmarks_markdown(doc["benchmarks"]))
        return
    out = args.out or (Path(tempfile.mkdtemp(prefix="diffpipe-paper-")) if args.fast else HERE)
    out.mkdir(parents=True, exist_ok=True)

    balance = [run_balance(c) for c in BALANCE if not args.fast or c.name in FAST]
    split = [run_split(c) for c in SPLIT if not args.fast or c.name in FAST]
    bench = benchmarks()
    (out / "stage_balance.md").write_text(balance_markdown(balance))
    (out / "microbatch_split.md").write_text(split_markdown(split))
    (out / "benchmarks.md").write_text(benchmarks_markdown(bench))
    figure(balance, out / "stage_balance.png")
    (out / "results.json").write_text(json.dumps({"stage_balance": balance, "microbatch_split": split,
                                                  "benchmarks": bench}, indent=1) + "\n")
    print(balance_markdown(balance))
    print(split_markdown(split))
    print(benchmarks_markdown(bench))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
