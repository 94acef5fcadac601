"""Batched what-if: how the step time of several schedules moves with the link bandwidth.

Each schedule is compiled once; ``jax.vmap(Hardware.from_times)`` builds one ``Hardware`` per
bandwidth and ``makespan(graph, hws, batched=True)`` evaluates all of them in one call. The
transfer of a stage boundary costs ``latency + bytes / bandwidth`` (alpha-beta), given to
``from_times`` as its ``p2p_time``.

Workload: a GPT-like stage (48 layers of hidden 1600 on 8 devices, microbatch 4 x 1024 tokens, on an
A100 at half its peak): forward 10.7 ms and backward 21.4 ms per device per microbatch, 13.1 MB per
boundary activation; interleaved and V schedules split a device's share into chunks, each with its
own transfers.

    python examples/what_if_bandwidth.py          # 8 devices, 32 microbatches, 41 bandwidths
    python examples/what_if_bandwidth.py --fast   # 4 devices, 8 microbatches, 9 bandwidths
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import diffpipe as dp

#: Seconds per device per microbatch, boundary bytes and link latency (see the module docstring).
FORWARD, BACKWARD = 10.7e-3, 21.4e-3
MESSAGE_BYTES = 13.1e6
LATENCY = 5e-6
SCHEDULES = (("1f1b", {}), ("interleaved-1f1b", {"chunks": 2}), ("zb-h1", {}), ("zb-v", {}))


def step_times(name: str, options: dict, devices: int, microbatches: int, bandwidths: np.ndarray) -> np.ndarray:
    """Exact step time (s) of one schedule at every bandwidth (bytes/s), in one batched call."""
    s = dp.schedules.get(name, devices=devices, microbatches=microbatches, **options)
    chunks = s.stages // devices  # a device's work is split over its chunks
    split = name.startswith("zb")  # zero-bubble schedules split B into I and W
    backward = BACKWARD / chunks / (2 if split else 1)
    weight = BACKWARD / chunks / 2 if split else None
    p2p = LATENCY + MESSAGE_BYTES / jnp.asarray(bandwidths, dtype=jnp.float32)

    def build(p2p_time):
        return dp.Hardware.from_times(FORWARD / chunks, backward, weight, p2p_time)

    hws = jax.vmap(build)(p2p)
    return np.asarray(dp.makespan(dp.compile(s), hws, batched=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="4 devices, 8 microbatches, 9 bandwidths")
    args = parser.parse_args(argv)
    dp.enable_compilation_cache()  # keep compiled programs for the next run (DIFFPIPE_CACHE=0: off)
    devices, microbatches, points = (4, 8, 9) if args.fast else (8, 32, 41)
    bandwidths = np.logspace(8, 12, points)  # 0.1 GB/s .. 1 TB/s

    times = {name: step_times(name, opts, devices, microbatches, bandwidths) for name, opts in SCHEDULES}
    names = list(times)
    print(f"step time (ms), {devices} devices, {microbatches} microbatches")
    print(f"{'GB/s':>9} " + " ".join(f"{n:>17}" for n in names) + "  fastest")
    for i, bw in enumerate(bandwidths):
        row = [times[n][i] for n in names]
        print(f"{bw / 1e9:9.2f} " + " ".join(f"{t * 1e3:17.1f}" for t in row) + f"  {names[int(np.argmin(row))]}")

    # Where does the fastest schedule change? (Slow links penalise the schedules with more transfers.)
    best = [names[int(np.argmin([times[n][i] for n in names]))] for i in range(len(bandwidths))]
    for i in range(1, len(best)):
        if best[i] != best[i - 1]:
            print(
                f"between {bandwidths[i - 1] / 1e9:.2f} and {bandwidths[i] / 1e9:.2f} GB/s the fastest "
                f"changes from {best[i - 1]} to {best[i]}"
            )


if __name__ == "__main__":
    main()
