"""Bus-bandwidth efficiency of the link presets, from the committed NCCL/XLA collective measurements.

A ring collective over ``n`` ranks moves ``2 (n-1)/n S`` (all-reduce) or ``(n-1)/n S`` (all-gather,
reduce-scatter, all-to-all) bytes through each rank's link, so its time is that over the *bus
bandwidth* (NVIDIA/nccl-tests ``doc/PERFORMANCE.md``) plus a latency per ring step. ``bus_efficiency``
is the measured bus bandwidth of large messages (the median over messages of 256 MiB and more) over
the link's datasheet bandwidth per direction:

- ``nvlink3``: the A100 8-GPU nccl-tests all-reduce sweep (``nccl_ml_engineering.csv``, ``a100_allreduce_sweep``);
- ``nvlink4``: OpenXLA's H100 (``sm_90``) 8-GPU all-reduce rows (``xla_collectives_f32.csv``; a ring: the
  NVLS in-switch reduction of the H200 rows is not what Megatron-LM's default NCCL setting of the
  FIT runs' era used);
- ``nvlink5``: OpenXLA's B200 (``sm_100_B200``) 8-GPU all-reduce rows;
- the network links (``ib-*``, ``roce-*``): the 4-node, 32-rank H200 all-reduce with Ring forced
  (``h200_allreduce_4_nodes_4GiB``): its bus bandwidth over the 8 x 50 GB/s of EFA per node (each of a
  node's 8 rings crosses the network once per node through its own NIC: the ring's network share
  is the node's 8 NICs), taken for InfiniBand and RoCE too (an assumption: no IB sweep is committed).

    PYTHONPATH=. python papers/kernel-efficiency/fit_collectives.py     # writes collectives.json
"""

import csv
import json
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

HERE = Path(__file__).resolve().parent
LINK = {"nvlink3": 300e9, "nvlink4": 450e9, "nvlink5": 900e9}
#: The EFA of the 4-node H200 row: 8 x 50 GB/s per node (the text's "8x 50GBps EFA").
EFA_NODE = 8 * 50e9
LARGE = 256 * 2 ** 20


def xla_busbw(key: str) -> list[tuple[float, float]]:
    """``(bytes, bus bytes/s)`` of the 8-GPU all-reduce rows of ``xla_collectives_f32.csv`` for ``key``."""
    with open(HERE / "xla_collectives_f32.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["device"] == key and r["collective"] == "all-reduce"
                and r["group_size"] == "8"]
    return [(float(r["tensor_size_bytes"]), float(r["throughput_bytes_per_s"]) * 2 * 7 / 8) for r in rows]


def nccl_busbw(table: str, setting: str | None = None) -> list[tuple[float, float]]:
    with open(HERE / "nccl_ml_engineering.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["table"] == table and (setting is None or r["setting"] == setting)]
    return [(float(r["size_bytes"]), float(r["busbw_GBps"]) * 1e9) for r in rows if r["busbw_GBps"]]


def efficiency(points: list[tuple[float, float]], bandwidth: float) -> float:
    return float(np.median([bw for size, bw in points if size >= LARGE]) / bandwidth)


def ring_fit(points: list[tuple[float, float]], bandwidth: float, n: int = 8) -> dict:
    """``bus_efficiency``, ``step_latency`` and the rms log error of the all-reduce ring model on messages of 1 MiB+."""
    size = np.asarray([p[0] for p in points if p[0] >= 2 ** 20])
    seconds = 2 * (n - 1) / n * size / np.asarray([p[1] for p in points if p[0] >= 2 ** 20])

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log((2 * (n - 1) / n * size / (bandwidth * x[0]) + 2 * (n - 1) * x[1]) / seconds)

    res = least_squares(residual, [0.8, 3e-6], bounds=([0.05, 0.0], [1.0, 1e-3]))
    return dict(bus_efficiency=round(float(res.x[0]), 3), step_latency=float(f"{res.x[1]:.3g}"),
                rms_log_error=round(float(np.sqrt(np.mean(res.fun ** 2))), 4), rows=len(size))


def main() -> dict:
    out = {
        "nvlink3": ring_fit(nccl_busbw("a100_allreduce_sweep"), LINK["nvlink3"]),
        "nvlink4": ring_fit(xla_busbw("sm_90"), LINK["nvlink4"]),
        "nvlink5": ring_fit(xla_busbw("sm_100_B200"), LINK["nvlink5"]),
        "network": dict(bus_efficiency=round(efficiency(
            nccl_busbw("h200_allreduce_4_nodes_4GiB", "NCCL_ALGO=allreduce:ring"), EFA_NODE), 3)),
    }
    (HERE / "collectives.json").write_text(json.dumps(out, indent=1) + "\n")
    print(out)
    return out


if __name__ == "__main__":
    main()
