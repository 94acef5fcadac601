"""Simulator speed: batched exact evaluation, reverse mode vs forward, compile time vs graph size.

Run by hand (nothing in CI depends on a timing):

    python benchmarks/bench_simulator.py [--quick] [--out benchmarks/results/simulator-cpu.json]

Every row compares against the pure-Python reference evaluator (``schedules._reference.evaluate``)
in the same run. Peak memory is XLA's own account of the compiled function's buffers
(``compiled.memory_analysis()``: arguments + outputs + temporaries).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import diffpipe as dp
from diffpipe.schedules._reference import evaluate


def timeit(fn, *, repeat: int = 5) -> float:
    """Median wall time of ``fn()`` (which must block until its result is ready)."""
    fn()  # warm-up / compile
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


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


def bench_batched(devices: int, microbatches: int, batch: int) -> dict:
    s = dp.schedules.get("1f1b", devices=devices, microbatches=microbatches)
    g = dp.compile(s)
    hws = hardware_batch(s.stages, batch)
    fast = timeit(lambda: dp.makespan(g, hws, batched=True).block_until_ready())
    vmapped = jax.jit(jax.vmap(lambda h: dp.makespan(g, h)))
    slow = timeit(lambda: vmapped(hws).block_until_ready())
    ref = python_reference_time(s)
    return {
        "case": f"exact 1f1b {devices}x{microbatches} ({len(s.ops)} ops), {batch} variants",
        "ops": len(s.ops), "batch": batch,
        "batched_s_per_eval": fast / batch, "vmap_s_per_eval": slow / batch, "python_s_per_eval": ref,
        "speedup_batched": ref / (fast / batch), "speedup_vmap": ref / (slow / batch),
    }


def bench_grad(devices: int, microbatches: int, batch: int, tau: float = 0.05) -> list[dict]:
    s = dp.schedules.get("1f1b", devices=devices, microbatches=microbatches)
    g = dp.compile(s)
    hws = hardware_batch(s.stages, batch)
    rows = []
    for adjoint in ("sweep", "autodiff"):
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
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/simulator-<platform>.json)")
    args = parser.parse_args()
    backend = jax.default_backend()
    batch = 256 if args.quick else 4096
    results = {
        "platform": {"backend": backend, "devices": [str(d) for d in jax.devices()],
                     "machine": platform.machine(), "processor": platform.processor(), "jax": jax.__version__},
        "batched": [bench_batched(8, 32, batch)],
        "grad": bench_grad(8, 64 if args.quick else 256, 32 if args.quick else 256),
        "compile": bench_compile([(8, 32), (8, 256 if args.quick else 2048)]),
    }
    print(f"backend: {backend}, {len(jax.devices())} device(s)")
    print("\n| batched exact evaluation | per eval, batched | per eval, jax.vmap | per eval, pure Python | speed-up |")
    print("|---|---|---|---|---|")
    for r in results["batched"]:
        print(f"| {r['case']} | {r['batched_s_per_eval'] * 1e6:.2f} µs | {r['vmap_s_per_eval'] * 1e6:.2f} µs | "
              f"{r['python_s_per_eval'] * 1e3:.2f} ms | {r['speedup_batched']:.0f}× (vmap {r['speedup_vmap']:.0f}×) |")
    print("\n| reverse mode | forward | value_and_grad | time ratio | memory fwd | memory v&g | ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in results["grad"]:
        print(f"| {r['case']} | {r['forward_s'] * 1e3:.1f} ms | {r['value_and_grad_s'] * 1e3:.1f} ms | "
              f"{r['time_ratio']:.2f}× | {r['forward_bytes'] / 2**20:.1f} MiB | "
              f"{r['value_and_grad_bytes'] / 2**20:.1f} MiB | {r['memory_ratio']:.2f}× |")
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
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
