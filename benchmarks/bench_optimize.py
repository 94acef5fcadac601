"""Stage balancing: ``diffpipe.optimize`` against brute force, the min-max dynamic program and uniform.

Run by hand (nothing in CI depends on a timing):

    python benchmarks/bench_optimize.py [--quick] [--out benchmarks/results/optimize-cpu.json]

Two settings, 1F1B on 8 devices with 16 microbatches:
- 24 layers / 8 stages: every one of the C(23, 7) = 245,157 splits is evaluated with the batched exact
  simulator (brute force), so the optimizer's quality is measured against the true optimum;
- 64 layers / 8 stages (C(63, 7) ~ 5.5e8 splits: out of reach): the optimizer against the min-max
  dynamic program (the PipeDream/Alpa proxy) and the uniform split.
Instances are random heterogeneous layer tables (log-normal compute, an embedding-like or heavy last
layer, uneven boundary activations, a network, and on some a memory cap), plus a GPT-style
transformer on H100s (``Workload.from_model``). Times are wall-clock on this machine; compilation is
reported apart (first call) from a warm call. The pure-Python reference evaluator
(``schedules._reference.evaluate``) is timed on the same schedule for comparison.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import jax
import numpy as np

import diffpipe as dp
from diffpipe import compositions, evaluate_plans, write_atomic
from diffpipe.schedules import evaluate

DEVICES, MICROBATCHES = 8, 16


def random_workload(rng: np.random.Generator, layers: int, *, capacity: float = math.inf) -> dp.Workload:
    f = rng.lognormal(0.0, 0.5, layers)
    if rng.random() < 0.5:
        f[0] = 0.05  # an embedding: almost no compute
    if rng.random() < 0.5:
        f[-1] *= 3.0  # a heavy head
    return dp.Workload.from_table(
        f, f * rng.uniform(0.8, 1.5, layers), f * rng.uniform(0.3, 1.0, layers),
        static_bytes=rng.uniform(0.5, 3.0, layers), activation_bytes=rng.uniform(0.2, 1.0, layers),
        output_bytes=rng.uniform(0.2, 2.0, layers) * (rng.random(layers) < 0.7),
        network=dp.Network.uniform(rng.uniform(0.0, 0.3), rng.uniform(1.0, 8.0)), capacity=capacity,
    )


def transformer_workload(blocks: int, capacity: float) -> dp.Workload:
    model = dp.Transformer(layers=blocks, hidden=4096, heads=32, sequence=2048, vocabulary=128_000, microbatch_size=1)
    network = dp.presets.network("nvlink4", "ib-ndr")  # 4 GPUs per node: the graph's (main)
    return dp.Workload.from_model(model, dp.presets.device("H100"), network, capacity=capacity)


def with_capacity(workload: dp.Workload, capacity: float) -> dp.Workload:
    import equinox as eqx
    import jax.numpy as jnp

    return eqx.tree_at(lambda w: w.capacity, workload, jnp.asarray(capacity, workload.capacity.dtype))


def reference_seconds(schedule, workload: dp.Workload, counts) -> float:
    """Seconds per evaluation of the pure-Python evaluator (per-stage times, a delay per transfer)."""
    hw = workload.hardware(workload.boundaries(counts))
    f, b, w = (np.asarray(x, np.float64) for x in (hw.forward, hw.input_grad, hw.weight))
    msg = np.asarray(hw.message_bytes, np.float64)
    latency, bandwidth = float(workload.network.latency), float(workload.network.bandwidth)

    def duration(op):
        return {"F": f, "B": b + w, "I": b, "W": w}[op.kind][op.stage] if op.kind in "FBIW" else 0.0

    def delay(op, dep):
        return latency + msg[dep.boundary] / bandwidth if dep.is_transfer else 0.0

    evaluate(schedule, duration, delay)  # warm
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.5:
        evaluate(schedule, duration, delay)
        runs += 1
    return (time.perf_counter() - start) / runs


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def exact(graph, workload, counts) -> tuple[float, bool]:
    t, _, fits = evaluate_plans(graph, workload, np.asarray(counts)[None, :])
    return float(t[0]), bool(fits[0])


def optimize_warm(graph, workload):
    """``optimize`` twice: the first call compiles whatever this instance's shapes need."""
    _, first = timed(lambda: dp.optimize(graph, workload, dp.StageBalance(DEVICES)))
    result, warm = timed(lambda: dp.optimize(graph, workload, dp.StageBalance(DEVICES)))
    return result, warm, first


def against_brute_force(graph, instances) -> list[dict]:
    rows = []
    for name, workload in instances:
        result, t_opt, t_first = optimize_warm(graph, workload)
        best, t_bf = timed(lambda w=workload: dp.brute_force_partition(graph, w))
        rows.append(dict(
            instance=name, layers=workload.layers, optimizer=result.makespan, optimizer_fits=result.fits,
            optimizer_plan=list(result.layers_per_stage), rounded=result.rounded.makespan,
            brute_force=best.makespan, brute_force_fits=best.fits, brute_force_plan=list(best.layers_per_stage),
            gap=result.makespan / best.makespan - 1.0, rounded_gap=result.rounded.makespan / best.makespan - 1.0,
            baseline=result.baseline, baseline_makespan=result.baseline_makespan,
            optimizer_seconds=t_opt, optimizer_first_call_seconds=t_first, brute_force_seconds=t_bf,
            evaluations=result.evaluations,
            brute_force_evaluations=math.comb(workload.layers - 1, DEVICES - 1),
        ))
    return rows


def against_proxies(graph, instances) -> list[dict]:
    rows = []
    for name, workload in instances:
        result, t_opt, t_first = optimize_warm(graph, workload)
        minmax = dp.minmax_partition(workload, DEVICES)
        uniform = dp.uniform_partition(workload.layers, DEVICES)
        (t_mm, fit_mm), (t_un, fit_un) = exact(graph, workload, minmax), exact(graph, workload, uniform)
        rows.append(dict(
            instance=name, layers=workload.layers, optimizer=result.makespan, optimizer_fits=result.fits,
            optimizer_plan=list(result.layers_per_stage), rounded=result.rounded.makespan,
            minmax=t_mm, minmax_fits=fit_mm, minmax_plan=list(minmax), uniform=t_un, uniform_fits=fit_un,
            vs_minmax=t_mm / result.makespan - 1.0, vs_uniform=t_un / result.makespan - 1.0,
            optimizer_seconds=t_opt, optimizer_first_call_seconds=t_first, evaluations=result.evaluations,
        ))
    return rows


def memory_capped(graph, workload, rng, plans=None) -> dp.Workload:
    """The workload with a capacity that only some splits meet (a quantile of their peaks)."""
    if plans is None:
        plans = compositions(workload.layers, DEVICES)
    _, memory, _ = evaluate_plans(graph, workload, plans)
    return with_capacity(workload, float(np.quantile(memory.max(axis=1), rng.uniform(0.05, 0.5))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two instances per setting")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/optimize-<platform>.json)")
    args = parser.parse_args()
    count = 2 if args.quick else 6
    schedule = dp.schedules.get("1f1b", devices=DEVICES, microbatches=MICROBATCHES)
    graph = dp.compile(schedule, devices_per_node=4)  # the transformer workloads' nodes; uniform links alike
    rng = np.random.default_rng(0)

    small = []
    for i in range(count - 1):
        w = random_workload(rng, 24)
        small.append((f"random-{i}" + ("-memcap" if i % 2 else ""), memory_capped(graph, w, rng) if i % 2 else w))
    small.append(("gpt-22-blocks-H100", transformer_workload(22, 40e9)))
    large = []
    for i in range(count - 1):
        w = random_workload(rng, 64)
        if i % 2:  # a cap between the tightest and loosest of a sample of splits
            sample = np.array([np.diff(np.concatenate([[0], np.sort(rng.choice(np.arange(1, 64), 7, replace=False)),
                                                      [64]])) for _ in range(2000)])
            w = memory_capped(graph, w, rng, sample)
        large.append((f"random-{i}" + ("-memcap" if i % 2 else ""), w))
    large.append(("gpt-62-blocks-H100", transformer_workload(62, 80e9)))

    # Compilation, measured on the first instance (instances of equal shapes share compiled code;
    # "opt s" below is a warm call).
    _, compile_optimize = timed(lambda: dp.optimize(graph, small[0][1], dp.StageBalance(DEVICES)))
    _, compile_brute = timed(lambda: dp.brute_force_partition(graph, small[0][1]))
    python_eval = reference_seconds(schedule, small[0][1], dp.uniform_partition(24, DEVICES))

    rows24 = against_brute_force(graph, small)
    _, compile_large = timed(lambda: dp.optimize(graph, large[0][1], dp.StageBalance(DEVICES)))
    rows64 = against_proxies(graph, large)

    print(f"1f1b, {DEVICES} devices x {MICROBATCHES} microbatches ({len(schedule.ops)} ops); "
          f"{jax.default_backend()} ({platform.processor() or platform.machine()})")
    print(f"first call (compile + run): optimize {compile_optimize:.1f} s at 24 layers, {compile_large:.1f} s at "
          f"64 layers; brute force {compile_brute:.1f} s")
    print(f"pure-Python reference evaluator: {python_eval * 1e3:.2f} ms per evaluation "
          f"(brute force at 24 layers would take {python_eval * math.comb(23, 7):.0f} s)")
    print()
    print("24 layers / 8 stages: optimizer vs brute force (245,157 splits)")
    print(f"{'instance':<24} {'optimizer':>11} {'brute force':>11} {'gap':>8} {'rounded gap':>11} "
          f"{'best baseline':>20} {'opt s':>6} {'bf s':>6} {'evals':>6}")
    for r in rows24:
        base = f"{r['baseline']} {r['baseline_makespan']:.4g}"
        print(f"{r['instance']:<24} {r['optimizer']:>11.5g} {r['brute_force']:>11.5g} {r['gap']:>8.3%} "
              f"{r['rounded_gap']:>11.3%} {base:>20} {r['optimizer_seconds']:>6.2f} "
              f"{r['brute_force_seconds']:>6.2f} {r['evaluations']:>6}")
    print()
    print("64 layers / 8 stages: optimizer vs min-max DP and uniform (exact makespans; * = does not fit memory)")
    print(f"{'instance':<24} {'optimizer':>11} {'min-max DP':>11} {'uniform':>11} {'vs DP':>8} {'vs uniform':>10} "
          f"{'opt s':>6} {'evals':>6}")

    def mark(value, fits):
        return f"{value:.5g}{'' if fits else '*'}"

    for r in rows64:
        print(f"{r['instance']:<24} {mark(r['optimizer'], r['optimizer_fits']):>11} "
              f"{mark(r['minmax'], r['minmax_fits']):>11} {mark(r['uniform'], r['uniform_fits']):>11} "
              f"{r['vs_minmax']:>8.2%} {r['vs_uniform']:>10.2%} {r['optimizer_seconds']:>6.2f} {r['evaluations']:>6}")

    results = dict(
        backend=jax.default_backend(), machine=platform.machine(), schedule="1f1b", devices=DEVICES,
        microbatches=MICROBATCHES, first_call_seconds=dict(optimize_24=compile_optimize, optimize_64=compile_large,
                                                          brute_force_24=compile_brute),
        python_reference_seconds_per_evaluation=python_eval, layers_24=rows24, layers_64=rows64,
    )
    out = Path(args.out or Path(__file__).parent / "results" / f"optimize-{jax.default_backend()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(results, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
