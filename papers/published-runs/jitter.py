"""How much of the published fall of throughput with scale does random op time explain?

With the global batch fixed, SC'21 Table 2 (GPT-3 175B and 530B on 1x, 2x, 4x A100s) and Llama 3
Table 4 rows 1-2 (405B on 8K and 16K H100s) lose throughput per GPU as GPUs are added. A
deterministic simulator sees only the larger bubble of fewer microbatches per pipeline. With random
op times a step ends when its slowest participant does, and the expected maximum grows with the
number of participants: the ``tensor`` ranks of each op (``Jitter(group=tensor)``) and the ``data``
replicas that synchronise once per step (``replicas=data``). This script simulates each published
configuration as ``run.py`` does, then its expected step time by Monte Carlo
(``dp.sample_makespans``) for a few coefficients of variation, and compares the predicted fall
(first row of a series to the last) with the published one.

Both series are of the FIT set (see README.md): a coefficient of variation chosen here is fitted
on them, and can only be judged on the test sources.

    python papers/published-runs/jitter.py            # writes jitter.json and jitter.md next to this file
    python papers/published-runs/jitter.py --quick    # fewer samples, the 175B series only (prints only)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import jax

import diffpipe as dp
from diffpipe import step_time_summary as summary

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("published_runs_run", HERE / "run.py")
run = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = run
_spec.loader.exec_module(run)

#: The randomness tried: (label, ``dp.Jitter`` arguments besides ``group``). Coefficients of variation
#: of every compute op's time, and stragglers: one GPU in a thousand 10% slower in a step.
SETTINGS = (("cv 1%", {"cv": 0.01}), ("cv 2%", {"cv": 0.02}), ("cv 5%", {"cv": 0.05}),
            ("stragglers 0.1% x1.1", {"slow_fraction": 1e-3, "slow_factor": 1.1}))
SEED = 0


def series() -> dict[str, list]:
    table2 = run.sc21_table2()
    return {
        "sc21_175b": [r for r in table2 if r.name.startswith("174.6B")],
        "sc21_530b": [r for r in table2 if r.name.startswith("529.6B")],
        "llama3_405b": run.llama3_table4(),
    }


def evaluate(row, settings, samples: int) -> dict:
    cfg = row.build()
    res = cfg.evaluate()
    graph, hw = cfg.graph(), cfg.hardware()
    base = float(dp.makespan(graph, hw))
    par = cfg.parallelism
    out = {"name": row.name, "gpus": cfg.cluster.gpus, "tensor": par.tensor, "data": par.data,
           "published": row.published, "predicted": row.predict(cfg, res), "makespan_s": base, "jitter": {}}
    for label, kwargs in settings:
        times = dp.sample_makespans(graph, hw, dp.Jitter(**kwargs, group=par.tensor), key=jax.random.key(SEED),
                                    samples=samples, replicas=par.data)
        s = summary(times)
        # Throughput metrics scale with 1 / step time: the expected step is base x (mean / base).
        out["jitter"][label] = {"mean_s": s["mean"], "p95_s": s["p95"], "stderr_s": s["stderr"],
                                  "predicted": out["predicted"] * base / s["mean"]}
    return out


def falls(rows: list[dict], labels) -> dict:
    """Relative throughput change from the first row of a series to the last (negative: a fall)."""
    first, last = rows[0], rows[-1]
    out = {"published": last["published"] / first["published"] - 1,
           "deterministic": last["predicted"] / first["predicted"] - 1}
    for label in labels:
        a, b = first["jitter"][label]["predicted"], last["jitter"][label]["predicted"]
        out[label] = b / a - 1
    return out


def _mean(row: dict, label: str) -> str:
    mean = row["jitter"][label]["mean_s"]
    return f"{mean:.3f} (+{mean / row['makespan_s'] - 1:.2%})"


def markdown(results: dict) -> str:
    cvs = results["settings"]
    lines = ["# Random op time and the fall of throughput with scale", "",
             f"`python papers/published-runs/jitter.py` ({results['samples']} samples a row, seed {SEED}, "
             f"{results['seconds']:.0f} s). Throughput change from the smallest to the largest run of each "
             "series at a fixed global batch (negative: a fall); 'explained' is the share of the gap between "
             "the deterministic prediction and the published change that the jitter closes.", "",
             "| series | GPUs | published | deterministic | " + " | ".join(cvs)
             + " | " + " | ".join(f"explained, {cv}" for cv in cvs) + " |",
             "|---|---|---:|---:|" + "---:|" * (2 * len(cvs))]
    for name, s in results["series"].items():
        f = s["falls"]
        gap = f["published"] - f["deterministic"]
        explained = [(f[cv] - f["deterministic"]) / gap if gap else float("nan") for cv in cvs]
        gpus = f"{s['rows'][0]['gpus']} -> {s['rows'][-1]['gpus']}"
        lines.append(f"| {name} | {gpus} | {f['published']:+.1%} | {f['deterministic']:+.1%} | "
                     + " | ".join(f"{f[cv]:+.1%}" for cv in cvs) + " | "
                     + " | ".join(f"{e:.0%}" for e in explained) + " |")
    lines += ["", "Per row: the expected step time (mean of the samples) over the deterministic makespan.", "",
              "| row | tensor | data replicas | makespan (s) | " + " | ".join(f"mean, {cv}" for cv in cvs)
              + " |", "|---|---:|---:|---:|" + "---:|" * len(cvs)]
    for s in results["series"].values():
        for r in s["rows"]:
            lines.append(f"| {r['name']} | {r['tensor']} | {r['data']} | {r['makespan_s']:.3f} | "
                         + " | ".join(_mean(r, cv) for cv in cvs) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--quick", action="store_true", help="fewer samples, one series, nothing written")
    p.add_argument("--samples", type=int, default=None)
    args = p.parse_args(argv)
    samples = args.samples or (8 if args.quick else 32)
    chosen = series()
    if args.quick:
        chosen = {"sc21_175b": chosen["sc21_175b"]}
    start = time.perf_counter()
    labels = [label for label, _ in SETTINGS]
    results = {"settings": labels, "samples": samples, "series": {}}
    for name, rows in chosen.items():
        evaluated = []
        for row in rows:
            evaluated.append(evaluate(row, SETTINGS, samples))
            print(f"{name}: {row.name} done ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
        results["series"][name] = {"rows": evaluated, "falls": falls(evaluated, labels)}
    results["seconds"] = time.perf_counter() - start
    text = markdown(results)
    print(text)
    if not args.quick:
        dp.write_atomic(HERE / "jitter.json", json.dumps(results, indent=1) + "\n")
        dp.write_atomic(HERE / "jitter.md", text)


if __name__ == "__main__":
    main()
