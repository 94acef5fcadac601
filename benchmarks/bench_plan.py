"""``plan`` speed: Llama-3-70B on 1,024 H100s, global batch 1,024 x 8,192 tokens.

Run by hand (nothing in CI depends on a timing):

    python benchmarks/bench_plan.py [--gpus 1024] [--batch 1024] [--wide] [--balance 3] [--out PATH]

Each search runs cold (first call in the process: cost tables, schedules, graphs and XLA
compilations) and then warm (the same call again: the plan's per-variant cost tables and the
compiled evaluators come from their caches; schedules and graphs are rebuilt). Reported per run:
configurations explored (every combination of the axes), simulated (evaluated by the exact
simulator), configurations per second (explored / total wall time), and the split of the wall
time into Python (everything but the simulation and the balancing: enumeration and closed forms,
schedules and their compilation, building each ``Hardware``) and evaluation (the batched exact
simulation, XLA compilation included), plus the stage balancing of the best ``--balance`` rows.
``--wide`` widens the axes (six synchronous single-pipeline families, eleven virtual-stage counts,
six microbatch sizes) to explore >= 100,000 configurations. The machine is whatever runs it: the
committed figures came from a 2-core CPU shared with other jobs, so read ratios, not absolute
seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

WIDE = dict(families=("1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "gpipe"),
            virtual=(2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 20), microbatch_sizes=(1, 2, 4, 8, 16, 32))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1024, help="global batch in samples (default 1024)")
    parser.add_argument("--model", default="llama-3-70b")
    parser.add_argument("--wide", action="store_true", help="the wide search space (>= 100,000 configurations)")
    parser.add_argument("--balance", type=int, default=3, help="stage-balance the best N (default 3; 0 off)")
    parser.add_argument("--out", type=Path, default=None, help="JSON results (default benchmarks/results/...)")
    return parser.parse_args()


def run(dp, model, cluster, batch, axes, balance):
    t = time.perf_counter()
    table = dp.plan(model, cluster, batch, top_k=balance, balance=balance > 0, progress=False, **axes)
    wall = time.perf_counter() - t
    s = table.seconds
    python = s["total"] - s["simulate"] - s["balance"]  # enumeration, closed forms, schedules, Hardware
    return table, {
        "explored": table.explored, "simulated": table.simulated, "wall_s": wall,
        "configurations_per_s": table.explored / wall, "python_s": python, "evaluation_s": s["simulate"],
        "balance_s": s["balance"], "python_share": python / wall, "evaluation_share": s["simulate"] / wall,
        "seconds": s, "rejected": table.rejected, "best": {k: v for k, v in table.best.items()},
    }


def main() -> None:
    args = parse()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import jax

    import diffpipe as dp

    model = dp.presets.model(args.model)
    cluster = dp.Cluster(device="H100", gpus=args.gpus)
    axes = WIDE if args.wide else {}
    results = {"model": args.model, "gpus": args.gpus, "global_batch": args.batch, "sequence": model.sequence,
               "axes": {k: list(v) for k, v in axes.items()} or "dp.plan defaults", "balance_top": args.balance,
               "backend": jax.default_backend(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
               "load_average": os.getloadavg()}
    for label in ("cold", "warm"):
        table, r = run(dp, model, cluster, args.batch, axes, args.balance)
        results[label] = r
        print(f"{label}: {r['explored']:,} explored, {r['simulated']:,} simulated in {r['wall_s']:.1f} s "
              f"({r['configurations_per_s']:,.0f} configurations/s); Python {r['python_s']:.1f} s "
              f"({100 * r['python_share']:.0f}%), evaluation {r['evaluation_s']:.1f} s "
              f"({100 * r['evaluation_share']:.0f}%), balancing {r['balance_s']:.1f} s", flush=True)
    print(f"rejected (warm): {results['warm']['rejected']}")
    print(table.to_markdown(5))
    try:
        print("Megatron-LM:", " ".join(dp.megatron_args(table.launch(0))))
    except dp.ConfigError as error:
        print("Megatron-LM:", error)
    out = args.out or Path(__file__).parent / "results" / (
        f"plan{'-wide' if args.wide else ''}-{jax.default_backend()}.json")
    from diffpipe import write_atomic  # the package's one atomic writer
    write_atomic(out, json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
