"""Plan a Llama-3-70B run on 256 H100s end to end: search, Megatron-LM flags, Pareto plot.

``dp.plan`` searches tensor x pipeline x data splits, schedule families, virtual stages, microbatch
sizes, recomputation and ZeRO for a global batch of 256 x 8,192 tokens, simulates the survivors
exactly and balances the best stages; the fastest configuration Megatron-LM runs is exported as
its command-line flags, and every evaluated configuration is plotted as step time against memory
per GPU, coloured by schedule family (written atomically).

python examples/plan_llama70b.py [--out DIR]          # the default search (a few minutes cold)
python examples/plan_llama70b.py --fast [--out DIR]   # a narrow search (Megatron's families, TP8, mbs 1)
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import diffpipe as dp  # noqa: E402


def pareto_plot(table: dp.PlanTable, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    families = sorted({r["family"] for r in table.rows})
    for k, family in enumerate(families):
        rows = [r for r in table.rows if r["family"] == family]
        ax.scatter([r["memory_per_gpu"] / 1e9 for r in rows], [r["step_time"] for r in rows], s=18, c=f"C{k}",
                   label=family, marker="o")
    front, lightest = [], float("inf")
    for r in table.rows:  # sorted by step time: a row is on the front when it is lighter than every faster one
        if r["memory_per_gpu"] < lightest:
            front.append(r)
            lightest = r["memory_per_gpu"]
    ax.plot([r["memory_per_gpu"] / 1e9 for r in front], [r["step_time"] for r in front], "k--", lw=0.8,
            label="Pareto front")
    ax.axvline(table.best["capacity"] / 1e9, c="0.5", lw=0.8, ls=":", label="GPU memory")
    ax.set_xlabel("memory per GPU (GB)")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"Llama-3-70B on {table.cluster.gpus} H100s: {table.simulated} simulated of {table.explored:,}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    dp.write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120), "pareto plot")
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a narrow search")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory of the plot (default .)")
    args = parser.parse_args(argv)
    dp.enable_compilation_cache()  # keep compiled programs for the next run (DIFFPIPE_CACHE=0: off)

    model = dp.presets.model("llama-3-70b", flash_attention=True)  # 8,192 tokens, flash attention: the CLI's defaults
    cluster = dp.Cluster(device="H100", gpus=256)
    # --fast: TP8 with PP2 or 4 only (fewer graphs to compile than every tensor and pipeline
    # size); it still finds a balanced, uneven split to export
    axes = dict(families=("1f1b", "interleaved-1f1b"), tensor=(8,), pipeline=(2, 4), microbatch_sizes=(1,),
                recompute=("selective", "full"), zero=(1,), top_k=1) if args.fast else {}
    table = dp.plan(model, cluster, 256, export="megatron", **axes)  # only what Megatron-LM runs
    print(table.to_markdown(8))
    print("Megatron-LM flags of the best row (the model's shape included):")
    print(shlex.join(table.megatron_args(0)))
    path = args.out / "plan_llama70b_pareto.png"
    pareto_plot(table, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
