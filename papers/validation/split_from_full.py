"""Split schedules predicted from full-backward runs: the W share from a probe, the model, or a guess.

Runs, on 2 gloo ranks (``run.py``'s workers and model: ``Linear + GELU`` blocks, one per stage),
two full-backward schedules (torch's ``ScheduleGPipe``, diffpipe's ``1f1b`` as a torch CSV) and
two split ones (torch's ``ScheduleInterleavedZeroBubble`` with one stage per rank, i.e. ZB-H1, and
diffpipe's ``zb-h1`` as CSV), ``--rounds`` interleaved rounds of ``--steps`` profiled steps each.
Then calibrates from each full-backward trace and predicts the split schedules' step times
(``torch-runtime`` mode) three ways: the I/W split from ``profile_stages`` of the same modules
(``probe=``), and ``weight_fraction=0.5`` (the guess it replaces); the split schedules' own
calibrations give the reference of predicting them from a split run. Prints one Markdown table:
per source and target, the measured step (median over steps, the slower rank's) and each
prediction's error.

Usage (from the repository root)::

    PYTHONPATH=$PWD python papers/validation/split_from_full.py --work /tmp/split-from-full

A development check, not the study: the errors depend on the machine's load (quote the ``uptime``
load with any number from it). The study (``run.py``) makes the same predictions, probe (and, for
its transformer group, model FLOPs) for every full-backward source of every group, in rows of their
own; this script adds the ``weight_fraction=0.5`` guess they replace.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _run_module():
    spec = importlib.util.spec_from_file_location("validation_run", _HERE / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    import torch

    from diffpipe import calibrate
    from diffpipe.schedules import from_torch, from_torch_csv, get, to_torch_csv

    run = _run_module()
    work, m = args.work, args.microbatches
    work.mkdir(parents=True, exist_ok=True)
    to_torch_csv(get("1f1b", devices=2, microbatches=m), work / "1f1b.csv")
    to_torch_csv(get("zb-h1", devices=2, microbatches=m), work / "zb-h1.csv")
    cases = {"GPipe": ("GPipe", None), "1f1b (CSV)": ("csv", "1f1b.csv"),
             "ZB-H1 (InterleavedZeroBubble)": ("InterleavedZeroBubble", None), "zb-h1 (CSV)": ("csv", "zb-h1.csv")}
    ran = {"GPipe": from_torch("GPipe", 2, m), "1f1b (CSV)": from_torch_csv(work / "1f1b.csv"),
           "ZB-H1 (InterleavedZeroBubble)": from_torch("InterleavedZeroBubble", 2, m),
           "zb-h1 (CSV)": from_torch_csv(work / "zb-h1.csv")}
    jobs = []
    for r in range(args.rounds):
        for name, (kind, csv) in cases.items():
            jobs.append(run.job(f"{run._slug(name)}.r{r}", kind, microbatches=m, width=args.width, rows=args.rows,
                                steps=args.steps, csv=str(work / csv) if csv else None, trace=r == 0))
    failure = run.run_jobs(jobs, work, timeout_s=600, pin=True)
    if failure:
        raise SystemExit(f"the torch run failed:\n{failure}")

    def measured(name: str) -> float:
        steps = []
        for r in range(args.rounds):
            metas = [json.loads((work / f"{run._slug(name)}.r{r}.rank{k}.meta.json").read_text()) for k in range(2)]
            steps += [max(ts) for ts in zip(*[meta["step_s"] for meta in metas], strict=True)]
        return statistics.median(steps)

    torch.set_num_threads(1)  # as the workers
    probe = calibrate.profile_stages(list(run._blocks(2, args.width)), torch.randn(args.rows, args.width))
    files = {name: [work / f"{run._slug(name)}.r0.rank{k}.json" for k in range(2)] for name in cases}
    split_targets = ["ZB-H1 (InterleavedZeroBubble)", "zb-h1 (CSV)"]
    lines = [f"{args.width} x {args.rows}, {m} microbatches, {args.rounds} x {args.steps} steps; probe ratios "
             + ", ".join(f"stage {s}: I/B {p.input_grad[s] / p.backward[s]:.2f}, W/B {p.weight[s] / p.backward[s]:.2f}"
                         for p in (probe,) for s in range(2)),
             "", "| source | target | measured ms | probe | weight_fraction=0.5 | from a split run |",
             "|---|---|---|---|---|---|"]
    for source in ("GPipe", "1f1b (CSV)"):
        with_probe = calibrate.from_torch_trace(files[source], ran[source], probe=probe)
        plain = calibrate.from_torch_trace(files[source], ran[source])
        for target in split_targets:
            truth = measured(target)
            other = next(t for t in split_targets if t != target)
            from_split = calibrate.from_torch_trace(files[other], ran[other])
            errors = [p / truth - 1 for p in (
                with_probe.predict(ran[target], mode="torch-runtime"),
                plain.predict(ran[target], mode="torch-runtime", weight_fraction=0.5),
                from_split.predict(ran[target], mode="torch-runtime"))]
            cells = " | ".join(f"{100 * e:+.1f}%" for e in errors)
            lines.append(f"| {source} | {target} | {1e3 * truth:.2f} | {cells} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
