"""Non-uniform microbatch sizes: ``MicrobatchSplit`` against the equal split of the global batch.

A pipeline's fill and drain run the first and last microbatches through stages one after the
other; with a fixed cost per op (kernel launches, per-transfer latency) that cost is paid per
microbatch, while compute scales with its samples. ``dp.optimize`` with a ``MicrobatchSplit``
descends the smoothed makespan over the sizes (``batch x softmax(logits)``), rounds to whole
samples, moves single samples between microbatches with the exact simulator, and reports only
exactly verified plans; with few enough splits, every one is evaluated (brute force).

python examples/microbatch_split.py          # GPT 22 blocks on 8 H100 stages, 64 samples in 16 microbatches
python examples/microbatch_split.py --fast   # GPT 6 blocks on 4 A100 stages, 16 samples in 8 microbatches
"""

from __future__ import annotations

import argparse
import math

import numpy as np

import diffpipe as dp

#: Every split of the batch is evaluated when there are at most this many (C(batch - 1, microbatches - 1)).
BRUTE_FORCE_SPLITS = 20_000
#: Fixed seconds per compute op (launch and framework overhead), what makes small microbatches cheap
#: only up to a point.
OVERHEAD = 2e-3


def case(blocks: int, stages: int, device: str, batch: int, microbatches: int, steps: int) -> dict:
    model = dp.Transformer(layers=blocks, hidden=2048, heads=16, sequence=2048, vocabulary=50257,
                           microbatch_size=batch // microbatches)
    network = dp.presets.network("nvlink4", "ib-ndr")
    workload = dp.Workload.from_model(model, dp.presets.device(device), network, overhead=OVERHEAD)
    workload = workload.with_split(dp.minmax_partition(workload, stages))
    # two stages per node: neighbours alternate between NVLink and NDR (the topology is the graph's)
    graph = dp.compile(dp.schedules.get("1f1b", devices=stages, microbatches=microbatches), devices_per_node=2)
    split = dp.MicrobatchSplit(batch, microbatches)
    result = dp.optimize(graph, workload, split, steps=steps)

    counts = np.asarray(workload.layers_per_stage)[None, :]
    equal = np.full(microbatches, batch // microbatches)
    rows = {"equal": equal, "optimize": np.asarray(result.samples)}
    if math.comb(batch - 1, microbatches - 1) <= BRUTE_FORCE_SPLITS:
        every = dp.compositions(batch, microbatches)
        times, _, _ = dp.evaluate_plans(graph, workload, np.repeat(counts, len(every), axis=0),
                                     every / (batch / microbatches))
        rows["brute force"] = every[int(np.argmin(times))]

    print(f"GPT {blocks} blocks, 1F1B on {stages} x {device} (2 per node, NVLink + NDR), {batch} samples in "
          f"{microbatches} microbatches, {OVERHEAD * 1e3:g} ms per op; layers per stage "
          f"{list(workload.layers_per_stage)}")
    print(f"  {'split':<12} {'samples per microbatch':<52} {'makespan':>10} {'peak mem':>9}")
    out = {}
    for name, samples in rows.items():
        time, memory, _ = dp.evaluate_plans(graph, workload, counts, (samples / (batch / microbatches))[None, :])
        out[name] = (samples.tolist(), float(time[0]), float(memory[0].max()))
        print(f"  {name:<12} {str(samples.tolist()):<52} {time[0] * 1e3:8.2f}ms {memory[0].max() / 2**30:7.1f}G")
    print(f"  {result.message}; {out['equal'][1] / out['optimize'][1]:.3f}x vs equal sizes\n")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a small pipeline (4 stages, 8 microbatches)")
    args = parser.parse_args(argv)
    dp.enable_compilation_cache()  # keep compiled programs for the next run (DIFFPIPE_CACHE=0: off)
    if args.fast:
        case(blocks=6, stages=4, device="A100", batch=16, microbatches=8, steps=100)
    else:
        case(blocks=22, stages=8, device="H100", batch=64, microbatches=16, steps=300)


if __name__ == "__main__":
    main()
