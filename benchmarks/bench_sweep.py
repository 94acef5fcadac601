"""Sweep throughput: >= 10^6 (schedule, hardware) points, peak memory, the pure-Python reference.

Run by hand (nothing in CI depends on a timing):

    python benchmarks/bench_sweep.py [--host-devices 2] [--points 1000000] [--sample 200] [--skip-memory]
                                     [--grid homogeneous|mixed] [--out PATH]

``--grid mixed`` is issue 21's mixed-size grid: gpipe, 1f1b, interleaved-1f1b, zb-h1 x 4 and 8 devices x
16 and 32 microbatches x both modes (32 graphs of 64-1,024 ops), whose graphs differ in size; the default
(``homogeneous``) is the repository's grid of 4-device graphs. ``--points 40960`` is the issue's sweep.

``--host-devices N`` splits the CPU into N JAX devices (``XLA_FLAGS=--xla_force_host_platform_
device_count``, set before JAX starts), so the sweep's sharding uses N cores; on GPUs/TPUs leave it
out and the sweep shards over every accelerator. The sweep runs cold (schedule and graph building
and XLA compilation included), then warm: the same call again, best of ``WARM_RUNS`` (schedules,
graphs, device stacks and compiled evaluators come from the caches). The yardstick, in the same
run on the same points: ``dp.makespan(graph, hws, batched=True)`` called once per (schedule, mode),
cold (one compilation per graph structure) and warm (best of ``WARM_RUNS``); its makespans must
equal the sweep's. The sweep computes more per point (busy time, work, peak memory, fit) and pads
each stack's graphs to common sizes.
Peak memory is the process's maximum resident set (``resource.getrusage``), next to the sweep's
stated per-device chunk bound; the evaluator's own buffers are checked against the estimate
(``bytes_per_point``) with XLA's ``memory_analysis``. The same run times the pure-Python reference
evaluator (``schedules._reference.evaluate``) on a sample of the points and checks its makespans.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

#: The grids: (families, devices, microbatches, modes).
GRIDS = {
    "homogeneous": (["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "hanayo"], [4], [8, 16],
                    ["overlap", "contention"]),
    "mixed": (["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"], [4, 8], [16, 32], ["overlap", "contention"]),
}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000, help="at least this many points (default 10^6)")
    parser.add_argument("--host-devices", type=int, default=0, help="split the CPU into N JAX devices")
    parser.add_argument("--max-bytes", type=int, default=None, help="per-device chunk bound (default: sweep's)")
    parser.add_argument("--sample", type=int, default=200, help="points timed with the pure-Python evaluator")
    parser.add_argument("--skip-memory", action="store_true", help="skip the XLA memory-analysis check")
    parser.add_argument("--grid", choices=sorted(GRIDS), default="homogeneous",
                        help="homogeneous: 7 families x 4 devices (default); mixed: graphs of different sizes")
    parser.add_argument("--out", default=None,
                        help="JSON path (default benchmarks/results/sweep[-mixed]-<backend>.json)")
    return parser.parse_args()


ARGS = parse()
if ARGS.host_devices:  # must precede the first JAX import
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={ARGS.host_devices}").strip()

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

import diffpipe as dp  # noqa: E402
from diffpipe import write_atomic  # noqa: E402

# The memory check measures the sweep's own evaluator against its own chunk estimate (``bytes_per_point``):
# internals by design, no public form.
from diffpipe._sweep import evaluate as sweep_evaluate  # noqa: E402
from diffpipe._sweep import plan as sweep_plan  # noqa: E402
from diffpipe._sweep import variants as sweep_variants  # noqa: E402
from diffpipe.schedules import evaluate  # noqa: E402

FAMILIES, DEVICES, MICROBATCHES, MODES = GRIDS[ARGS.grid]
#: Warm repetitions (sweep and yardstick alike); the fastest counts: the machine is shared.
WARM_RUNS = 3


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def hardware_grid(count: int) -> tuple[dp.Hardware, dict[str, np.ndarray]]:
    """A product grid of hardware variants (per-stage times alike): forward time x backward
    ratio x weight-gradient share x p2p delay x activation size, capacities cycling, >= count."""
    side = int(np.ceil(count ** (1 / 5)))
    axes = np.meshgrid(np.linspace(0.5, 2.0, side), np.linspace(1.5, 2.5, side), np.linspace(0.0, 0.5, side),
                       np.linspace(0.0, 1.0, side), np.linspace(1e6, 4e6, side), indexing="ij")
    f, ratio, share, p2p, act = (a.ravel()[:count].astype(np.float32) for a in axes)
    backward = f * ratio * (1 - share)
    weight = f * ratio * share
    capacity = np.resize(np.asarray([4e7, 6e7, 1e9], np.float32), count)
    values = dict(forward=f, input_grad=backward, weight=weight, p2p=p2p, activation=act, capacity=capacity)
    hw = jax.vmap(lambda f, b, w, c, a, cap: dp.Hardware.from_times(
        f, b, w, p2p_time=c, activation_bytes=a, static_bytes=1e7, capacity=cap))(
        f, backward, weight, p2p, act, capacity)
    return hw, values


def run_sweep(hw: dp.Hardware, max_bytes: int | None) -> tuple[dp.SweepResult, float]:
    kwargs = {} if max_bytes is None else {"max_bytes": max_bytes}
    t0 = time.perf_counter()
    result = dp.sweep(hw, families=FAMILIES, devices=DEVICES, microbatches=MICROBATCHES, communication=MODES,
                      progress=True, **kwargs)
    return result, time.perf_counter() - t0


def per_graph(hw: dp.Hardware, result: dp.SweepResult) -> dict:
    """The yardstick: ``dp.makespan(graph, hws, batched=True)`` called once per (schedule, mode) on
    the same hardware batch, graphs built beforehand (evaluation only). The first pass compiles
    one evaluator per graph structure (cold), the second reuses them (warm); its makespans must equal
    the sweep's."""
    graphs = {}
    for family in FAMILIES:
        for d in DEVICES:
            for n in MICROBATCHES:
                schedule = dp.schedules.get(family, devices=d, microbatches=n)
                for mode in MODES:
                    graphs[family, d, n, mode] = dp.compile(schedule, communication=mode)
    times, out = [], {}
    for _ in range(1 + WARM_RUNS):
        t0 = time.perf_counter()
        for key, graph in graphs.items():
            out[key] = dp.makespan(graph, hw, batched=True)  # the mode is the graph's
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t0)
    count = result.hardware_variants
    for (family, d, n, mode), value in out.items():
        rows = (result["family"] == family) & (result["devices"] == d) & (result["microbatches"] == n) & (
            result["communication"] == mode)
        assert np.array_equal(result["makespan"][rows], np.asarray(value)), (family, d, n, mode)
    points = len(graphs) * count
    warm = min(times[1:])
    return {"graphs": len(graphs), "points": points, "cold_s": times[0], "warm_s": warm, "warm_runs_s": times[1:],
            "cold_points_per_s": points / times[0], "warm_points_per_s": points / warm}


def reference(result: dp.SweepResult, values: dict[str, np.ndarray], sample: int) -> dict:
    """Time the pure-Python evaluator on ``sample`` overlap points and compare its makespans."""
    rng = np.random.default_rng(0)
    overlap = np.flatnonzero(result["communication"] == "overlap")
    picked = rng.choice(overlap, size=min(sample, overlap.size), replace=False)
    rows = result.where(np.sort(picked)).rows()
    cache: dict = {}
    seconds, worst = 0.0, 0.0
    for row in rows:
        key = (row["family"], tuple(sorted(row["options"].items())), row["devices"], row["microbatches"])
        if key not in cache:
            cache[key] = dp.schedules.get(row["family"], devices=row["devices"], microbatches=row["microbatches"],
                                          **row["options"])
        schedule = cache[key]
        h = row["hardware"]
        f, b, w, c = (float(values[k][h]) for k in ("forward", "input_grad", "weight", "p2p"))
        durations = {"F": f, "B": b + w, "I": b, "W": w, "U": 0.0, "R": 0.0}

        def duration(op, durations=durations):
            return durations[op.kind]

        def delay(op, dep, c=c):
            return c if dep.is_transfer else 0.0

        t0 = time.perf_counter()
        _, finish = evaluate(schedule, duration, delay)
        seconds += time.perf_counter() - t0
        want = max(finish.values())
        worst = max(worst, abs(want - row["makespan"]) / want)
    return {"points": len(rows), "s_per_point": seconds / len(rows), "max_rel_diff": worst}


def memory_check(points: int = 2048) -> list[dict]:
    """XLA's buffers for one chunk of the evaluator (one graph on ``points`` hardware variants) vs
    the sweep's estimate, per representative graph."""
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("points",))
    rows = []
    for family, n, mode in (("1f1b", 8, "overlap"), ("zb-v", 16, "contention"), ("hanayo", 16, "overlap")):
        s = dp.schedules.get(family, devices=4, microbatches=n)
        g = dp.compile(s, communication=mode)
        sizes = sweep_plan.Sizes.of(g)
        x = np.linspace(1.0, 2.0, points).astype(np.float32)
        hws = jax.vmap(lambda x: dp.Hardware.from_times(x, 2 * x, p2p_time=0.1 * x))(x)
        variants = sweep_variants.HardwareSource(hws).variants(s)
        leaves = sweep_variants.pad_variants(variants, np.arange(points), g.pipelines, g.stages, g.microbatches,
                                             g.devices)
        leaves = {k: x[None] for k, x in leaves.items()}  # one normalisation
        hw = sweep_variants.as_hardware(leaves, variants)
        stacked = sweep_evaluate.stack([g], mesh).host
        index = np.zeros(1, np.int32)
        dynamic, static = eqx.partition((stacked, index, index, np.ones(1, bool), hw), eqx.is_array)
        t0 = time.perf_counter()
        fn = jax.jit(lambda d, static=static: sweep_evaluate.chunk_metrics(*eqx.combine(d, static)))
        compiled = fn.lower(dynamic).compile()
        compile_s = time.perf_counter() - t0
        eval_s = min(_timed(lambda c=compiled, d=dynamic: jax.block_until_ready(c(d))) for _ in range(1 + WARM_RUNS))
        cells_per_s = points * sizes.cells / eval_s
        stats = compiled.memory_analysis()
        xla = stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
        per_point, per_graph = sweep_plan.bytes_per_point(sizes), sweep_plan.bytes_per_graph(sizes)
        estimate = per_graph + points * (per_point + sweep_plan.OUT_BYTES)
        rows.append({"graph": f"{family} 4x{n} {mode}", "nodes": sizes.nodes, "k": sizes.k, "points": points,
                     "cells": sizes.cells, "xla_bytes": int(xla), "estimate_bytes": int(estimate),
                     "xla_per_point": xla / points, "estimate_per_point": estimate / points,
                     "compile_s": compile_s, "eval_s": eval_s, "cells_per_s": cells_per_s,
                     "compile_cells": compile_s * cells_per_s})
    return rows


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    backend = jax.default_backend()
    print(f"backend: {backend}, {len(jax.devices())} device(s), jax {jax.__version__}")
    entries = len(FAMILIES) * len(DEVICES) * len(MICROBATCHES) * len(MODES)
    hw, values = hardware_grid(-(-ARGS.points // entries))
    rss_before = maxrss_mib()
    cold, cold_s = run_sweep(hw, ARGS.max_bytes)
    rss_cold = maxrss_mib()
    warm_runs = [run_sweep(hw, ARGS.max_bytes) for _ in range(WARM_RUNS)]
    warm, warm_s = min(warm_runs, key=lambda run: run[1])
    rss_warm = maxrss_mib()
    assert np.array_equal(cold["makespan"], warm["makespan"])
    points = len(warm)
    yardstick = per_graph(hw, warm)
    ref = reference(warm, values, ARGS.sample)
    memory = [] if ARGS.skip_memory else memory_check()
    results = {
        "platform": {"backend": backend, "devices": [str(d) for d in jax.devices()], "machine": platform.machine(),
                     "cpus": os.cpu_count(), "jax": jax.__version__, "python": sys.version.split()[0]},
        "grid": {"name": ARGS.grid, "families": FAMILIES, "devices": DEVICES, "microbatches": MICROBATCHES,
                 "modes": MODES,
                 "hardware_variants": warm.hardware_variants, "points": points, "skipped": list(warm.skipped)},
        "sweep": {"cold_s": cold_s, "warm_s": warm_s, "warm_runs_s": [t for _, t in warm_runs],
                  "cold_points_per_s": points / cold_s,
                  "warm_points_per_s": points / warm_s, "stacks_compiled": warm.compiled,
                  "devices_used": warm.devices_used, "max_bytes": warm.max_bytes, "chunk_bytes": warm.chunk_bytes,
                  "maxrss_before_mib": rss_before, "maxrss_after_cold_mib": rss_cold,
                  "maxrss_after_warm_mib": rss_warm},
        "per_graph_batched": yardstick,
        "sweep_vs_per_graph": {"warm_throughput_ratio": (points / warm_s) / yardstick["warm_points_per_s"],
                               "cold_time_ratio": cold_s / yardstick["cold_s"]},
        "reference": ref | {"speedup_warm": ref["s_per_point"] / (warm_s / points)},
        "memory_estimate": memory,
        "fits": float(np.mean(warm["fits"])),
    }
    print(f"\n{points} points = {entries} (schedule, mode) x {warm.hardware_variants} hardware variants; "
          f"{warm.compiled} stacks compiled, sharded over {warm.devices_used} device(s)")
    print("\n| run | wall | points/s | s/point | max RSS | chunk bound (per device) |")
    print("|---|---|---|---|---|---|")
    for name, secs, rss in (("sweep, cold (compiles included)", cold_s, rss_cold),
                            ("sweep, warm", warm_s, rss_warm)):
        print(f"| {name} | {secs:.1f} s | {points / secs:,.0f} | {secs / points * 1e6:.2f} µs | {rss:.0f} MiB | "
              f"{warm.chunk_bytes / 2**20:.1f} of {warm.max_bytes / 2**20:.0f} MiB |")
    for name, secs in (("per-graph makespan(batched=True), cold (compiles included)", yardstick["cold_s"]),
                       ("per-graph makespan(batched=True), warm", yardstick["warm_s"])):
        print(f"| {name} | {secs:.1f} s | {points / secs:,.0f} | {secs / points * 1e6:.2f} µs | - | - |")
    print(f"| pure-Python reference ({ref['points']} sampled points) | - | {1 / ref['s_per_point']:,.0f} | "
          f"{ref['s_per_point'] * 1e6:.0f} µs | - | - |")
    ratio = results["sweep_vs_per_graph"]
    print(f"\nwarm sweep throughput / warm per-graph batched evaluator: {ratio['warm_throughput_ratio']:.2f}; "
          f"cold sweep time / cold per-graph: {ratio['cold_time_ratio']:.2f}")
    print(f"\nspeed-up of the warm sweep over the reference: {results['reference']['speedup_warm']:,.0f}x; "
          f"max relative makespan difference on the sample: {ref['max_rel_diff']:.1e}; "
          f"RSS before the sweeps: {rss_before:.0f} MiB")
    if not memory:
        print("(memory check skipped)")
    print("\n| evaluator memory (2048 points, one graph) | nodes | k | XLA bytes/point | estimate bytes/point | "
          "XLA total | estimate total | compile | cells/s | compile in cells |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in memory:
        print(f"| {r['graph']} | {r['nodes']} | {r['k']} | {r['xla_per_point']:.0f} | {r['estimate_per_point']:.0f} | "
              f"{r['xla_bytes'] / 2**20:.2f} MiB | {r['estimate_bytes'] / 2**20:.2f} MiB | {r['compile_s']:.1f} s | "
              f"{r['cells_per_s']:.2e} | {r['compile_cells']:.2e} |")
    if memory:
        cells = sorted(r["compile_cells"] for r in memory)
        print(f"one compilation in evaluated cells (median; sweep.COMPILE_CELLS = {sweep_plan.COMPILE_CELLS:.1e}): "
              f"{cells[len(cells) // 2]:.2e}")
    stem = "sweep" if ARGS.grid == "homogeneous" else f"sweep-{ARGS.grid}"
    out = Path(ARGS.out or Path(__file__).parent / "results" / f"{stem}-{backend}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(results, indent=2, default=str))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
