"""diffpipe in five minutes: schedule -> table -> compile -> hardware -> simulate -> grad -> vmap.

python examples/quickstart.py          # 8 devices, 32 microbatches
python examples/quickstart.py --fast   # 4 devices, 8 microbatches (what the tests run)
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import diffpipe as dp


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a small pipeline (4 devices, 8 microbatches)")
    args = parser.parse_args(argv)
    dp.enable_compilation_cache()  # keep compiled programs for the next run (DIFFPIPE_CACHE=0: off)
    devices, microbatches = (4, 8) if args.fast else (8, 32)

    # 1. A schedule is data: a placement and one order of ops per device.
    s = dp.schedules.get("1f1b", devices=devices, microbatches=microbatches)
    print(f"families: {', '.join(dp.schedules.names())}\n")

    # 2. The tabular view at unit times (F = 1, B = 2, no communication), and the closed form.
    print(dp.table(s) if args.fast else dp.table(s).render().splitlines()[0])
    formula = dp.schedules.formula("1f1b", devices=devices, microbatches=microbatches)
    print(f"closed form: makespan {formula.makespan:g}, bubble {formula.bubble_ratio:.3f}\n")

    # 3. Compile once into dependency tensors; every evaluation below reuses this graph.
    g = dp.compile(s)

    # 4. Hardware: per-stage times (seconds) and a delay per cross-device transfer.
    hw = dp.Hardware.from_times(forward=1e-3, input_grad=2e-3, p2p_time=1e-4)

    # 5. Simulate: times, bubble, memory (here 1 byte per stored activation: a count).
    result = dp.simulate(s, dp.Hardware.from_times(1e-3, 2e-3, p2p_time=1e-4, activation_bytes=1.0))
    print(f"makespan {float(result.makespan) * 1e3:.2f} ms, bubble {float(result.bubble_ratio):.3f}")
    print(f"peak stored activations per device: {[int(x) for x in result.peak_activations]}\n")

    # 6. Gradients: how much the step time moves per second of each stage's forward time.
    #    A smoothed makespan (temperature) gives useful gradients through every max.
    times = jnp.full((devices,), 1e-3)

    def step_time(forward):
        return dp.makespan(g, dp.Hardware.from_times(forward, 2e-3, p2p_time=1e-4), temperature=1e-5)

    grad = jax.grad(step_time)(times)
    print(f"d makespan / d forward[stage] = {[round(float(x), 2) for x in grad]}")
    print(
        f"exact makespan {float(dp.makespan(g, hw)) * 1e3:.3f} ms, "
        f"smoothed {float(step_time(times)) * 1e3:.3f} ms (an upper bound)\n"
    )

    # 7. vmap: many hardware what-ifs in one call (here: transfer delays from 0 to 1 ms).
    delays = jnp.linspace(0.0, 1e-3, 5)
    hws = jax.vmap(lambda c: dp.Hardware.from_times(1e-3, 2e-3, p2p_time=c))(delays)
    spans = dp.makespan(g, hws, batched=True)
    for c, t in zip(delays, spans, strict=True):
        print(f"p2p {float(c) * 1e3:.2f} ms -> makespan {float(t) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
