"""Sweep schedule families x devices x microbatches on a modelled machine; CSV and a Pareto plot.

Every schedule of the grid is simulated exactly on a GPT-style model (``hardware_from_model``,
per-stage costs for each schedule's own stage count) on two device presets; the table goes to
CSV, and the time per microbatch against peak memory, with each machine's Pareto front (no other
schedule is both faster and lighter), to a PNG.

python examples/sweep_pareto.py [--out DIR]          # 8 families, 4 and 8 devices, 8/16/32 microbatches
python examples/sweep_pareto.py --fast [--out DIR]   # 5 families, 4 devices, 8/16 microbatches
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import diffpipe as dp  # noqa: E402

MACHINES = ("A100", "H100")


def machine(model: dp.Transformer):
    """``schedule -> [Hardware per machine]``: stage costs follow each schedule's stage count."""
    network = dp.presets.network("nvlink4", "ib-ndr")  # 4 GPUs per node: the sweep's devices_per_node

    def hardware(schedule):
        return [dp.hardware_from_model(model, dp.presets.device(name), network, stages=schedule.stages)
                for name in MACHINES]

    return hardware


def machine_memory(name: str) -> float:
    return float(dp.presets.device(name).memory)


def plot(result: dp.SweepResult, path: Path) -> None:
    fig, axes = plt.subplots(1, len(MACHINES), figsize=(6 * len(MACHINES), 4.5), squeeze=False)
    front = result.pareto()
    for h, (ax, name) in enumerate(zip(axes[0], MACHINES, strict=True)):
        rows = result.filter(hardware=h)
        fits = rows["fits"].astype(bool)
        memory, time = rows["peak_memory"] / 2**30, 1e3 / rows["throughput"]
        ax.scatter(memory[fits], time[fits], s=14, c="0.6", label="fits memory")
        ax.scatter(memory[~fits], time[~fits], s=18, c="0.6", marker="x", label="over capacity")
        ax.axvline(machine_memory(name) / 2**30, c="k", ls="--", lw=0.8, label="device memory")
        best = front.filter(hardware=h)
        x, y = best["peak_memory"] / 2**30, 1e3 / best["throughput"]
        ax.plot(x, y, "o-", c="C3", label="Pareto front")
        for i in range(len(best)):
            ax.annotate(f"{best['family'][i]} d{best['devices'][i]} m{best['microbatches'][i]}", (x[i], y[i]),
                        textcoords="offset points", xytext=(6, 6 - 12 * (i % 2)), fontsize=7)
        ax.set_title(f"{name}: {len(rows)} schedules")
        ax.set_xlabel("peak memory per device (GiB)")
        ax.set_ylabel("time per microbatch (ms)")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a small grid (5 families, 4 devices)")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: a new temp dir)")
    args = parser.parse_args(argv)
    dp.enable_compilation_cache()  # keep compiled programs for the next run (DIFFPIPE_CACHE=0: off)
    out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix="diffpipe-sweep-"))
    out.mkdir(parents=True, exist_ok=True)

    if args.fast:
        families, devices, microbatches = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"], [4], [8, 16]
    else:
        families = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "hanayo", "chimera"]
        devices, microbatches = [4, 8], [8, 16, 32]
    model = dp.Transformer(layers=32, hidden=4096, heads=32, sequence=2048, vocabulary=50257, microbatch_size=1)
    result = dp.sweep(machine(model), families=families, devices=devices, microbatches=microbatches,
                      devices_per_node=4)

    csv_path, png_path = out / "sweep.csv", out / "pareto.png"
    result.to_csv(csv_path)
    plot(result, png_path)
    print(f"{len(result)} points ({len(result.skipped)} skipped), {result.compiled} compiled stacks")
    print("Pareto front per machine (time per microbatch vs peak memory):")
    front = result.pareto()
    for i in range(len(front)):
        print(f"  {MACHINES[front['hardware'][i]]}: {front['family'][i]:<17} {front['options'][i]:<9} "
              f"d={front['devices'][i]} m={front['microbatches'][i]:<3} "
              f"{1e3 / front['throughput'][i]:7.2f} ms/microbatch  {front['peak_memory'][i] / 2**30:6.1f} GiB"
              f"  fits={bool(front['fits'][i])}")
    print(f"fastest that fits:\n{result.best().to_markdown()}")
    print(f"wrote {csv_path} and {png_path}")


if __name__ == "__main__":
    main()
