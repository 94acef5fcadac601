"""Simulator speed and accuracy: jax.vmap vs batched=True, call overhead, cost per op against a
compiled C loop, reverse mode vs forward, float32 gradients at small temperatures, compile time.

Run by hand (nothing in CI depends on a timing):

    python benchmarks/bench_simulator.py [--quick] [--only vmap,overhead,...] [--out PATH]

Every figure that matters is a ratio of two timings taken in the same run (the machine may be
shared and noisy); rows also compare against the pure-Python reference evaluator
(``schedules._reference.evaluate``) and, for the cost per op, the C yardstick (``yardstick.py``).
Peak memory is XLA's own account of the compiled function's buffers
(``compiled.memory_analysis()``: arguments + outputs + temporaries).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import diffpipe as dp
from diffpipe import write_atomic
from diffpipe.schedules import evaluate

try:
    import yardstick
except ImportError:  # run as a module from the repository root
    from benchmarks import yardstick

SECTIONS = ("accuracy", "vmap", "overhead", "per_op", "grad", "compile")


def timeit(fn, *, repeat: int = 5) -> float:
    """Median wall time of ``fn()`` (which must block until its result is ready)."""
    fn()  # warm-up / compile
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _once(fn) -> float:
    """Wall time of one ``fn()`` call (already warm)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def hardware_batch(stages: int, batch: int, seed: int = 0) -> dp.Hardware:
    rng = np.random.default_rng(seed)
    f = jnp.asarray(rng.uniform(0.5, 2.0, (batch, stages)), jnp.float32)
    b = jnp.asarray(rng.uniform(1.0, 4.0, (batch, stages)), jnp.float32)
    c = jnp.asarray(rng.uniform(0.0, 0.5, batch), jnp.float32)
    return jax.vmap(lambda f, b, c: dp.Hardware.from_times(f, b, p2p_time=c))(f, b, c)


def python_reference_time(schedule: dp.schedules.Schedule, samples: int = 3) -> float:
    """Seconds per evaluation of the pure-Python evaluator with per-stage times and p2p delays."""
    rng = np.random.default_rng(1)
    total = 0.0
    for _ in range(samples):
        f, b = rng.uniform(0.5, 2.0, schedule.stages), rng.uniform(1.0, 4.0, schedule.stages)
        c = float(rng.uniform(0, 0.5))

        def duration(op, f=f, b=b):
            return f[op.stage] if op.kind == "F" else b[op.stage]

        def delay(op, dep, c=c):
            return c if dep.is_transfer else 0.0

        t0 = time.perf_counter()
        evaluate(schedule, duration, delay)
        total += time.perf_counter() - t0
    return total / samples


def memory_bytes(fn, *args) -> int:
    stats = jax.jit(fn).lower(*args).compile().memory_analysis()
    if stats is None:
        return -1
    return int(stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes)


def bench_vmap(devices: int, microbatches: int, batch: int, tau: float = 0.05) -> dict:
    """jax.vmap(dp.makespan) against makespan(batched=True), values and value_and_grad."""
    s = dp.schedules.get("1f1b", devices=devices, microbatches=microbatches)
    g = dp.compile(s)
    hws = hardware_batch(s.stages, batch)
    fast = timeit(lambda: dp.makespan(g, hws, batched=True).block_until_ready())
    vmapped = jax.jit(jax.vmap(lambda h: dp.makespan(g, h)))
    slow = timeit(lambda: vmapped(hws).block_until_ready())
    vg_batched = jax.jit(jax.value_and_grad(lambda h: jnp.sum(dp.makespan(g, h, temperature=tau, batched=True))))
    vg_vmap = jax.jit(jax.vmap(jax.value_and_grad(lambda h: dp.makespan(g, h, temperature=tau))))
    t_vgb = timeit(lambda: jax.block_until_ready(vg_batched(hws)))
    t_vgv = timeit(lambda: jax.block_until_ready(vg_vmap(hws)))
    ref = python_reference_time(s)
    return {
        "case": f"1f1b {devices}x{microbatches} ({len(s.ops)} ops), {batch} variants",
        "ops": len(s.ops), "batch": batch,
        "batched_s_per_eval": fast / batch, "vmap_s_per_eval": slow / batch, "python_s_per_eval": ref,
        "vmap_over_batched": slow / fast, "speedup_batched": ref / (fast / batch), "speedup_vmap": ref / (slow / batch),
        "value_and_grad_batched_s_per_eval": t_vgb / batch, "value_and_grad_vmap_s_per_eval": t_vgv / batch,
        "value_and_grad_vmap_over_batched": t_vgv / t_vgb,
    }


def bench_overhead(devices: int, microbatches: int) -> dict:
    """One variant: dp.makespan(g, hw) against the same call inside the user's own jax.jit."""
    s = dp.schedules.get("1f1b", devices=devices, microbatches=microbatches)
    g = dp.compile(s)
    hw = dp.Hardware.from_times(jnp.linspace(0.8, 1.2, s.stages), 2.0, p2p_time=0.1)
    inside = jax.jit(lambda h: dp.makespan(g, h))
    t_call = timeit(lambda: dp.makespan(g, hw).block_until_ready(), repeat=200)
    t_jit = timeit(lambda: inside(hw).block_until_ready(), repeat=200)
    return {"case": f"1f1b {devices}x{microbatches} ({len(s.ops)} ops), one variant", "ops": len(s.ops),
            "call_s": t_call, "user_jit_s": t_jit, "call_over_user_jit": t_call / t_jit}


def bench_per_op(sizes: list[tuple[int, int]], batch: int, rounds: int = 7) -> list[dict]:
    """Exact batched evaluation per op per variant against the C yardstick, as the graph grows.
    diffpipe and C alternate for ``rounds`` rounds (the machine is shared: each round's ratio is
    taken from back-to-back calls); reported: the median of the per-round ratios, and per-op costs
    from the fastest round of each (the least disturbed, used for the flatness ratio)."""
    libs = yardstick.build() if yardstick.available() else None
    rows = []
    for devices, microbatches in sizes:
        s = dp.schedules.get("1f1b", devices=devices, microbatches=microbatches)
        g = dp.compile(s)
        hws = hardware_batch(s.stages, batch)
        ops = len(s.ops)

        def ours(g=g, hws=hws):
            return dp.makespan(g, hws, batched=True).block_until_ready()

        want = ours()
        c = None
        if libs is not None:
            tables = jax.vmap(lambda h, g=g: h.tables(g))(hws).batch_last(batched=True)
            c = yardstick.Yardstick(libs, g, tables)
            np.testing.assert_allclose(c(), np.asarray(want), rtol=1e-5)  # same numbers; C warm
        t_ours, t_c = [], []
        for _ in range(rounds):
            t_ours.append(_once(ours))
            if c is not None:
                t_c.append(_once(c))
        row = {"case": f"1f1b {devices}x{microbatches}", "ops": ops, "batch": batch, "rounds": rounds,
               "diffpipe_ns_per_op_variant": min(t_ours) / (ops * batch) * 1e9,
               "diffpipe_ns_per_op_variant_median": statistics.median(t_ours) / (ops * batch) * 1e9}
        if c is not None:
            row.update(yardstick_width=c.width, yardstick_ns_per_op_variant=min(t_c) / (ops * batch) * 1e9,
                       yardstick_ns_per_op_variant_median=statistics.median(t_c) / (ops * batch) * 1e9,
                       fraction_of_yardstick=statistics.median(b / a for a, b in zip(t_ours, t_c)),
                       fraction_of_yardstick_fastest=min(t_c) / min(t_ours))
        rows.append(row)
    return rows


def bench_accuracy(taus=(1e-2, 1e-4, 1e-6, 1e-8, 1e-9)) -> list[dict]:
    """float32 reverse-mode dM/dforward against float64, 1F1B 4x8, at small temperatures."""
    s = dp.schedules.get("1f1b", devices=4, microbatches=8)
    g = dp.compile(s)
    x = np.asarray([1.0, 1.1, 0.9, 1.05])

    def grad(dtype, rel):
        x_ = jnp.asarray(x, dtype)
        exact = float(dp.makespan(g, dp.Hardware.from_times(x_, jnp.asarray(2.0, dtype), p2p_time=0.1)))
        fn = jax.grad(lambda v: dp.makespan(g, dp.Hardware.from_times(v, jnp.asarray(2.0, dtype), p2p_time=0.1),
                                            temperature=jnp.asarray(rel * exact, dtype)))
        return np.asarray(fn(x_), np.float64)

    rows = []
    for rel in taus:
        f32 = grad(jnp.float32, rel)
        with jax.enable_x64(True):
            f64 = grad(jnp.float64, rel)
        rows.append({"case": f"1f1b 4x8, tau = {rel:g} x makespan", "tau_relative": rel, "float32": f32.tolist(),
                     "float64": f64.tolist(), "max_abs_error": float(np.max(np.abs(f32 - f64)))})
    return rows


def bench_grad(devices: int, microbatches: int, batch: int, tau: float = 0.05) -> list[dict]:
    s = dp.schedules.get("1f1b", devices=devices, microbatches=microbatches)
    g = dp.compile(s)
    hws = hardware_batch(s.stages, batch)
    rows = []
    for adjoint in ("sweep", "autodiff"):  # names map to dp.SweepAdjoint() / dp.AutodiffAdjoint()
        def forward(h, adjoint=adjoint):
            return jnp.sum(dp.makespan(g, h, temperature=tau, batched=True, adjoint=adjoint))

        value_and_grad = jax.jit(jax.value_and_grad(forward))
        fwd = jax.jit(forward)
        t_fwd = timeit(lambda fwd=fwd: fwd(hws).block_until_ready())
        t_vg = timeit(lambda v=value_and_grad: jax.block_until_ready(v(hws)))
        m_fwd = memory_bytes(forward, hws)
        m_vg = memory_bytes(jax.value_and_grad(forward), hws)
        rows.append({
            "case": f"smoothed 1f1b {devices}x{microbatches} ({len(s.ops)} ops), {batch} variants, adjoint={adjoint}",
            "ops": len(s.ops), "batch": batch, "adjoint": adjoint,
            "forward_s": t_fwd, "value_and_grad_s": t_vg, "time_ratio": t_vg / t_fwd,
            "forward_bytes": m_fwd, "value_and_grad_bytes": m_vg, "memory_ratio": m_vg / m_fwd,
            "python_forward_s_per_eval": python_reference_time(s, samples=1),
        })
    return rows


def bench_compile(sizes: list[tuple[int, int]], batch: int = 64) -> list[dict]:
    rows = []
    for devices, microbatches in sizes:
        s = dp.schedules.get("1f1b", devices=devices, microbatches=microbatches)
        t0 = time.perf_counter()
        g = dp.compile(s)
        t_graph = time.perf_counter() - t0
        hws = hardware_batch(s.stages, batch)
        fn = jax.jit(lambda g, h: dp.makespan(g, h, batched=True))
        t0 = time.perf_counter()
        fn.lower(g, hws).compile()
        t_xla = time.perf_counter() - t0
        rows.append({"case": f"compile 1f1b {devices}x{microbatches}", "ops": len(s.ops),
                     "levels": int(g.offsets.shape[0]), "graph_s": t_graph, "xla_compile_s": t_xla,
                     "python_s_per_eval": python_reference_time(s, samples=1)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/simulator-<backend>.json)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    backend = jax.default_backend()
    batch = 256 if args.quick else 4096
    results: dict = {"platform": {"backend": backend, "devices": [str(d) for d in jax.devices()],
                                  "machine": platform.machine(), "processor": platform.processor(),
                                  "jax": jax.__version__}}
    print(f"backend: {backend}, {len(jax.devices())} device(s)")
    if "accuracy" in only:
        results["accuracy"] = bench_accuracy()
        print("\n| float32 gradient accuracy | dM/dforward float32 | float64 | max abs error |")
        print("|---|---|---|---|")
        for r in results["accuracy"]:
            print(f"| {r['case']} | {np.round(r['float32'], 4).tolist()} | {np.round(r['float64'], 4).tolist()} | "
                  f"{r['max_abs_error']:.2e} |")
    if "vmap" in only:
        results["batched"] = [bench_vmap(8, 32, batch)]  # the key papers/diffpipe/reproduce.py reads
        print("\n| jax.vmap vs batched=True | batched | jax.vmap | ratio | v&g batched | vmap(v&g) | ratio | "
              "pure Python | speed-up |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in results["batched"]:
            print(f"| {r['case']} | {r['batched_s_per_eval'] * 1e6:.2f} µs | {r['vmap_s_per_eval'] * 1e6:.2f} µs | "
                  f"{r['vmap_over_batched']:.2f}× | {r['value_and_grad_batched_s_per_eval'] * 1e6:.2f} µs | "
                  f"{r['value_and_grad_vmap_s_per_eval'] * 1e6:.2f} µs | "
                  f"{r['value_and_grad_vmap_over_batched']:.2f}× | "
                  f"{r['python_s_per_eval'] * 1e3:.2f} ms | {r['speedup_batched']:.0f}× |")
    if "overhead" in only:
        results["overhead"] = [bench_overhead(8, 32)]
        print("\n| call overhead | dp.makespan(g, hw) | inside the user's jax.jit | ratio |")
        print("|---|---|---|---|")
        for r in results["overhead"]:
            print(f"| {r['case']} | {r['call_s'] * 1e6:.0f} µs | {r['user_jit_s'] * 1e6:.0f} µs | "
                  f"{r['call_over_user_jit']:.2f}× |")
    if "per_op" in only:
        sizes = [(8, 32), (8, 256)] if args.quick else [(8, 32), (8, 256), (8, 2048)]
        results["per_op"] = bench_per_op(sizes, batch)
        print("\n| cost per op (fastest of the rounds) | ops | diffpipe ns/op/variant | C yardstick ns/op/variant "
              "(its chunk width) | diffpipe speed / C (median of rounds; fastest rounds) |")
        print("|---|---|---|---|---|")
        for r in results["per_op"]:
            print(f"| {r['case']}, {r['batch']} variants | {r['ops']} | {r['diffpipe_ns_per_op_variant']:.3f} | "
                  f"{r.get('yardstick_ns_per_op_variant', math.nan):.3f} ({r.get('yardstick_width', '-')}) | "
                  f"{r.get('fraction_of_yardstick', math.nan):.2f}; "
                  f"{r.get('fraction_of_yardstick_fastest', math.nan):.2f} |")
        first, last = results["per_op"][0], results["per_op"][-1]
        print(f"per-op cost {last['ops']} ops / {first['ops']} ops: "
              f"{last['diffpipe_ns_per_op_variant'] / first['diffpipe_ns_per_op_variant']:.2f}×")
    if "grad" in only:
        results["grad"] = bench_grad(8, 64 if args.quick else 256, 32 if args.quick else 256)
        print("\n| reverse mode | forward | value_and_grad | time ratio | memory fwd | memory v&g | ratio |")
        print("|---|---|---|---|---|---|---|")
        for r in results["grad"]:
            print(f"| {r['case']} | {r['forward_s'] * 1e3:.1f} ms | {r['value_and_grad_s'] * 1e3:.1f} ms | "
                  f"{r['time_ratio']:.2f}× | {r['forward_bytes'] / 2**20:.1f} MiB | "
                  f"{r['value_and_grad_bytes'] / 2**20:.1f} MiB | {r['memory_ratio']:.2f}× |")
    if "compile" in only:
        results["compile"] = bench_compile([(8, 32), (8, 256 if args.quick else 2048)])
        print("\n| compile | ops | levels | graph (Python) | XLA compile | pure-Python eval |")
        print("|---|---|---|---|---|---|")
        for r in results["compile"]:
            print(f"| {r['case']} | {r['ops']} | {r['levels']} | {r['graph_s']:.2f} s | {r['xla_compile_s']:.2f} s | "
                  f"{r['python_s_per_eval'] * 1e3:.1f} ms |")
        small, large = results["compile"][0], results["compile"][-1]
        print(f"\nXLA compile time ratio {large['ops']} ops / {small['ops']} ops: "
              f"{large['xla_compile_s'] / small['xla_compile_s']:.2f}×")
    out = Path(args.out or Path(__file__).parent / "results" / f"simulator-{backend}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
