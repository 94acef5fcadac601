"""Gradient stage balancing of a GPT-style model whose embedding and LM head make stages uneven.

The model's layers are the embedding, the transformer blocks and the LM head
(``Workload.from_model``): the head's vocabulary projection costs several blocks, the embedding
almost nothing, so "equal layers per stage" is not balanced and "equal compute per stage" (the
min-max dynamic program) ignores transfers, memory and the schedule's shape. ``dp.optimize``
descends the smoothed makespan over continuous stage boundaries, rounds, searches ±1 moves with
the exact simulator and reports only exactly verified plans; brute force checks it where the
number of splits allows.

python examples/stage_balancing.py          # 30 blocks on 8 H100 stages and 8 A100 stages
python examples/stage_balancing.py --fast   # 14 blocks on 4 A100 stages (what the tests run)
"""

from __future__ import annotations

import argparse
import math

import diffpipe as dp

GIB = 2.0**30
#: Brute force is run when there are at most this many splits (C(layers - 1, stages - 1)).
BRUTE_FORCE_SPLITS = 20_000


def case(blocks: int, stages: int, device: str, link: str, microbatches: int, steps: int) -> dict:
    """Uniform, min-max, optimized (and brute force where feasible) splits of one configuration."""
    model = dp.Transformer(layers=blocks, hidden=2048, heads=16, sequence=2048, vocabulary=50257, microbatch_size=2)
    workload = dp.Workload.from_model(model, dp.presets.device(device), dp.presets.network(link))
    schedule = dp.schedules.get("1f1b", devices=stages, microbatches=microbatches)
    graph = dp.compile(schedule)
    result = dp.optimize(graph, workload, dp.StageBalance(stages), steps=steps)

    rows = {}
    splits = {"uniform": dp.uniform_partition(workload.layers, stages),
              "min-max DP": dp.minmax_partition(workload, stages)}
    for name, counts in splits.items():
        time, memory, fits = dp.evaluate_plans(graph, workload, [counts])
        rows[name] = (counts, float(time[0]), float(memory[0].max()), bool(fits[0]))
    plan = result.plan
    rows["optimize"] = (plan.layers_per_stage, plan.makespan, max(plan.peak_memory), plan.fits)
    if math.comb(workload.layers - 1, stages - 1) <= BRUTE_FORCE_SPLITS:
        best = dp.brute_force_partition(graph, workload)
        rows["brute force"] = (best.layers_per_stage, best.makespan, max(best.peak_memory), best.fits)

    print(f"GPT {blocks} blocks + embedding + LM head = {workload.layers} layers, 1F1B on {stages} x {device} "
          f"({link}), {microbatches} microbatches")
    compute = [float(x) * 1e3 for x in workload.compute]
    print(f"  per-layer F+I+W: embedding {compute[0]:.2f} ms, block {compute[1]:.2f} ms, LM head {compute[-1]:.2f} ms")
    print(f"  {'split':<12} {'layers per stage':<28} {'makespan':>10} {'peak mem':>9}  fits")
    for name, (counts, time, memory, fits) in rows.items():
        print(f"  {name:<12} {str(list(counts)):<28} {time * 1e3:8.2f}ms {memory / GIB:7.1f}G  {fits}")
    uniform = rows["uniform"][1]
    print(f"  {result.message}; vs uniform {uniform / plan.makespan:.3f}x, "
          f"{result.evaluations} exact evaluations\n")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one small configuration (14 blocks, 4 stages)")
    args = parser.parse_args(argv)
    dp.enable_compilation_cache()  # keep compiled programs for the next run (DIFFPIPE_CACHE=0: off)
    if args.fast:
        case(blocks=14, stages=4, device="A100", link="nvlink3", microbatches=8, steps=100)
        return
    case(blocks=30, stages=8, device="H100", link="nvlink4", microbatches=16, steps=300)
    case(blocks=30, stages=8, device="A100", link="nvlink3", microbatches=16, steps=300)


if __name__ == "__main__":
    main()
