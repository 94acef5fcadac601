"""The device and link presets as objects: ``device("H100")`` a ``Device``, ``network("nvlink4",
"ib-ndr")`` a ``Network``, from the published figures of ``_specs``."""

from __future__ import annotations

from typing import Any

from .._arrays import as_float
from .._checks import MODE_MOVED, TOPOLOGY_MOVED, check_moved
from .._engine._hardware import Network
from ._device import DEFAULT_EFFICIENCY, Device
from ._kernels import KernelModel
from ._specs import DEVICES, NETWORKS, device_key, network_key

#: ``KernelModel`` of each measured device, copied from ``papers/kernel-efficiency/kernels_<device>.json``
#: (``fit_h100.py``, ``fit_a100.py``, ``fit_b200.py``; ``tests/test_kernels.py`` checks the copy): GEMMs fitted
#: to OpenXLA's measured table by shape (H100, B200; the A100 takes the H100's shape parameters, its
#: ceiling fitted to Korthikanti et al.'s Table 4 layer times, a FIT source; the A100's own fit to Azure's
#: ND A100 v4 cuBLASLt sweep, ``fit_a100_azure.py``, made FIT and TEST worse and is not used), memory-bound kernels
#: at gpu-benches' STREAM ``scale`` bandwidth (the H100 SXM and the H200: BabelStream ``Mul`` on Azure's ND H100 v5
#: and ND H200 v5, the same one-read-one-write kernel; gpu-benches has only an H100 PCIe file, and its H200 file is
#: not at its plateau; B200: the H200's, assumed), fused attention by sequence and per pass fitted to the
#: FlashAttention papers' figures (``papers/kernel-efficiency/attention_fit.json``: FlashAttention-2's forward curve,
#: its backward's rate over the forward's, FlashAttention-1's share of it; B200: none measured), the H100's own
#: fused attention (cuDNN's; ``Transformer(flash_version=3)``) at PyTorch 2.5.0's "up to 75% speed-up over
#: FlashAttentionV2".
#: The GEMM and attention ceilings in training of each measured kernel fit: the fitted ceilings scaled by
#: ``CEILINGS[fit]``, the one parameter per device fitted to whole runs, on the FIT set only
#: (``papers/published-runs/fit_ceilings.py``, ``fit_ceilings.json``): the mean log error of the device's FIT rows
#: is zero. A training step runs for seconds at the power limit, beside its framework's host work, where the H100
#: benchmarks ran for milliseconds and the A100 fit saw one layer's kernels (Korthikanti et al.'s Table 4).
CEILINGS = {"H100": 0.8356, "A100": 0.9290}
KERNELS_H100 = KernelModel(0.8549 * CEILINGS["H100"], 138.9, 0.8657, 5.47e-06, 0.3321 * CEILINGS["H100"], 381.2, 0.8533,
                           sms=132, attention_native=1.75, attention_older=0.5234, tile_m=64, tile_n=64,
                           split_k_min=1 << 30,
                           source="papers/kernel-efficiency/kernels_h100.json")
#: The H200: the H100's compute (same GEMM and attention curves), its own bandwidth fraction: BabelStream ``Mul`` on
#: Azure's ND H200 v5 (4.00 of 4.8 TB/s). gpu-benches' ``h200`` file (0.659) is not used: its ``scale`` kernel still
#: rises 11% from 75% to 100% occupancy (at most 3% on its A100 and H100 files), so it measures how many loads its
#: two blocks per SM keep in flight, not the bandwidth a full-occupancy elementwise kernel gets.
KERNELS_H200 = KernelModel(0.8549 * CEILINGS["H100"], 138.9, 0.8333, 5.47e-06, 0.3321 * CEILINGS["H100"], 381.2, 0.8533,
                           sms=132, attention_native=1.75, attention_older=0.5234, tile_m=64, tile_n=64,
                           split_k_min=1 << 30,
                           source="papers/kernel-efficiency/kernels_h100.json; memory: azure_babelstream ND H200 v5")
KERNELS_A100 = KernelModel(0.8113 * CEILINGS["A100"], 138.9, 0.849, 5.47e-06, 0.6694 * CEILINGS["A100"], 494.6, 0.843,
                           sms=108, attention_older=0.5174, tile_m=64, tile_n=64, split_k_min=1 << 30,
                           source="papers/kernel-efficiency/kernels_a100.json")
#: The A100 40 GB: the A100's compute, gpu-benches' ``a100_40`` STREAM ``scale`` fraction (1,381 of 1,555 GB/s).
KERNELS_A100_40GB = KernelModel(0.8113 * CEILINGS["A100"], 138.9, 0.8881, 5.47e-06, 0.6694 * CEILINGS["A100"], 494.6,
                                0.843, sms=108, attention_older=0.5174, tile_m=64, tile_n=64, split_k_min=1 << 30,
                                source="papers/kernel-efficiency/kernels_a100.json; memory: a100_40")
KERNELS_B200 = KernelModel(0.7652, 294.6, 0.8333, 5.08e-06, 0.7652, 294.6, 1.0, sms=148, tile_m=64, tile_n=128,
                           split_k_min=1 << 30, source="papers/kernel-efficiency/kernels_b200.json")
#: The ``KernelModel`` of each device preset that has measurements (``device()`` attaches it).
KERNELS: dict[str, KernelModel] = {"A100": KERNELS_A100, "H100": KERNELS_H100, "H200": KERNELS_H200,
                                   "A100-40GB": KERNELS_A100_40GB, "H800": KERNELS_H100, "B200": KERNELS_B200}


def device(name: str, *, efficiency: float | None = None) -> Device:
    """The ``Device`` preset ``name`` (case-insensitive; see ``DEVICES``): datasheet peak, memory
    and memory bandwidth, and the fitted kernel-efficiency curve (``DeviceSpec.curve``; the flat
    ``diffpipe._model._transformer.DEFAULT_EFFICIENCY`` where none was measured).

    ``efficiency`` (a fraction of peak) replaces the curve by that flat one, the bandwidth kept, and
    drops the kernel model (each op one roofline at ``efficiency``).
    """
    key = device_key(name)
    spec = DEVICES[key]
    maximum, tokens = (DEFAULT_EFFICIENCY, 0.0) if spec.curve is None else spec.curve
    if efficiency is not None:
        maximum, tokens = efficiency, 0.0
    kernels = KERNELS.get(key) if efficiency is None else None
    return Device(spec.peak_flops, spec.memory, maximum, spec.memory_bandwidth, tokens, name=key, kernels=kernels)


def network(intra: str, inter: str | None = None, **moved: Any) -> Network:
    """A ``Network`` from link presets (see ``NETWORKS``).

    Args:
        intra: the link between devices of one node (e.g. ``"nvlink4"``).
        inter: the link between nodes (e.g. ``"ib-ndr"``); ``None``: ``intra`` between nodes too.

    The communication mode and the topology are the graph's (``compile(communication=...,
    devices_per_node=...)``), not the network's: which pairs are inter-node is the graph's
    ``devices_per_node`` (the ``intra`` link's switch domain, ``NETWORKS[intra].domain``, e.g. 72
    for ``nvl72``, is the natural one; ``Cluster`` defaults to it).
    """
    check_moved("presets.network", moved, MODE_MOVED | TOPOLOGY_MOVED)
    a = NETWORKS[network_key(intra)]
    b = a if inter is None else NETWORKS[network_key(inter)]
    return Network(as_float(a.latency), as_float(a.bandwidth), as_float(b.latency), as_float(b.bandwidth))
