"""Named devices and links, as published by their vendors (with sources), without JAX.

The tables ``DEVICES`` and ``NETWORKS`` hold the published figures; ``_presets`` builds a
``Device`` and a ``Network`` from them. Listing and looking up presets needs no JAX.

Units: FLOP/s, bytes, bytes/s per direction, seconds. ``DeviceSpec.memory``, the capacity every fit
test uses, is the device's real capacity: the total the driver reports (NVML, ``nvidia-smi``, in MiB =
2**20 bytes) where a public ``nvidia-smi`` listing gives it (``DeviceSpec.memory_source``), else the
vendor's figure (GB = 10**9 bytes, as published). An HBM part's "80 GB" is about 80 GiB: an H100 SXM
reports 81,559 MiB = 85,520,809,984 bytes (79.65 GiB, 85.52 GB in the decimal GB of every output), about
6.9% more than its datasheet's 80 GB. The CUDA context and communication buffers take part of it: the
planner's headroom (10% by default) stands for them. Peak FLOP/s are the *dense* BF16 Tensor Core
figures: the datasheets headline the 2:4-sparsity figure, twice that.
"""


from __future__ import annotations

from typing import NamedTuple

from .._checks import preset_key


class DeviceSpec(NamedTuple):
    """A device: dense BF16 peak (FLOP/s), memory (bytes: the driver's total where ``memory_source``
    names a public ``nvidia-smi`` listing of it, else the datasheet's), the datasheet source, memory
    bandwidth (bytes/s), the dense FP8 peak (FLOP/s; None where the part has no FP8 units), the
    BF16 kernel-efficiency curve ``(efficiency, saturation_tokens)`` fitted to published matmul
    measurements (``Device.kernel_efficiency``; None: no measurements, the flat
    ``DEFAULT_EFFICIENCY``), and where ``memory`` comes from (None: the datasheet, no driver total
    found for the part)."""

    peak_flops: float
    memory: float
    source: str
    memory_bandwidth: float
    fp8_flops: float | None = None
    curve: tuple[float, float] | None = None
    memory_source: str | None = None


MIB = 2**20
#: The total memory NVML reports (``nvidia-smi``'s "Memory-Usage" total, MiB), each from a public listing.
#: Modal's table, "Why does an NVIDIA H100 80GB card offer 85.52 GB?" (thundergolfer.com/blog/nvidia-gpu-
#: memory-capacity) and modal-labs/modal-client pull request #2797: H200 143,771 MiB, H100 80 GB 81,559,
#: A100 80 GB 81,920, A100 40 GB 40,960; the H100's also in NVIDIA/nccl issue #1264 (8 x "NVIDIA H100
#: 80GB HBM3", "0MiB / 81559MiB", driver 550.54.15). NVIDIA/nvtrust issue #128: "NVIDIA H20", "0MiB /
#: 97871MiB" (driver 580.95.05). NVIDIA/TensorRT-LLM issue #10278: "NVIDIA B200", "166593MiB / 183359MiB"
#: (driver 580.95.05). No listing was found for H100 PCIe, H800, GB200, the AMD parts (rocm-smi) or the
#: TPUs: they keep the datasheet figure.
NVML_MODAL = ("NVML total via nvidia-smi: Modal, thundergolfer.com/blog/nvidia-gpu-memory-capacity and "
              "modal-labs/modal-client#2797")
NVML_H100 = NVML_MODAL + "; NVIDIA/nccl#1264 (0MiB / 81559MiB, driver 550.54.15)"
NVML_H20 = "NVML total via nvidia-smi: NVIDIA/nvtrust#128 (NVIDIA H20, 0MiB / 97871MiB, driver 580.95.05)"
NVML_B200 = ("NVML total via nvidia-smi: NVIDIA/TensorRT-LLM#10278 (NVIDIA B200, 166593MiB / 183359MiB, "
             "driver 580.95.05)")


#: ``Device.kernel_efficiency`` fitted (``papers/kernel-efficiency/fit.py``, ``fit.json``) to the bf16
#: ``n = k = 4096`` rows of OpenXLA's measured GEMM table (openxla/xla commit ad6eaee1,
#: ``xla/service/gpu/model/default_matmul_perf_table.txtpb``): ``sm_90`` (an H100 SXM), used for
#: the H100 and for the H800 and H200 (the same GH100 compute at the same clocks: an assumption,
#: their matmuls were not measured), and ``sm_100_B200``. Other devices have no published table
#: here and keep the flat ``DEFAULT_EFFICIENCY``.
CURVE_H100 = (0.7858, 313.7)
CURVE_B200 = (0.6073, 400.3)


class LinkSpec(NamedTuple):
    """A link: bandwidth per direction (bytes/s), latency (s), the source, and ``domain``: the
    devices one switch domain joins (the default ``devices_per_node`` of a ``Cluster``; None: 8).
    ``bus_efficiency``: the measured NCCL bus bandwidth of large ring collectives over ``bandwidth``
    (``papers/kernel-efficiency/fit_collectives.py``, ``collectives.json``; 1 where none was measured);
    ``step_latency``: a ring collective's fitted latency per step (None: ``latency``).

    Latencies are not datasheet figures: they are the order of magnitude of a small message's
    end-to-end point-to-point time through the communication library (one significant figure).
    """

    bandwidth: float
    latency: float
    source: str
    domain: int | None = None
    bus_efficiency: float = 1.0
    step_latency: float | None = None


#: "dense" is without 2:4 structured sparsity: NVIDIA's and AMD's datasheets headline the sparse
#: figure, twice the dense one. Memory bandwidth as published (TB/s = 1e12 bytes/s).
DEVICES: dict[str, DeviceSpec] = {
    "A100": DeviceSpec(312e12, 81_920 * MIB, "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): BF16 312 TFLOPS "
                                             "dense (624 with sparsity), 80GB HBM2e, 2,039 GB/s", 2039e9,
                       memory_source=NVML_MODAL),
    "H100": DeviceSpec(989e12, 81_559 * MIB, "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BF16 1,979 TFLOPS "
                                             "with sparsity, i.e. 989 dense; FP8 3,958 sparse, 1,979 dense; 80GB HBM3, "
                                             "3.35 TB/s", 3.35e12, 1979e12, CURVE_H100, NVML_H100),
    "H200": DeviceSpec(989e12, 143_771 * MIB, "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): BF16 1,979 TFLOPS "
                                              "with sparsity, i.e. 989 dense; FP8 1,979 dense; 141GB HBM3e, 4.8 TB/s",
                       4.8e12, 1979e12, CURVE_H100, NVML_MODAL),
    "A100-40GB": DeviceSpec(312e12, 40_960 * MIB, "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB): BF16 312 TFLOPS "
                                                  "dense, 40GB HBM2, 1,555 GB/s", 1555e9,
                            memory_source=NVML_MODAL),
    "H100-PCIe": DeviceSpec(756e12, 80e9, "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe): BF16 1,513 "
                                          "TFLOPS with sparsity, i.e. 756 dense; FP8 1,513 dense; 80GB HBM2e, "
                                          "2 TB/s", 2.0e12, 1513e12),
    "H800": DeviceSpec(989e12, 80e9, "NVIDIA H800 SXM5 product brief: compute as H100 SXM (BF16 989 TFLOPS "
                                     "dense, FP8 1,979 dense), 80GB HBM3, 3.35 TB/s; NVLink cut to 400 GB/s",
                       3.35e12, 1979e12, CURVE_H100),
    "H20": DeviceSpec(148e12, 97_871 * MIB, "NVIDIA H20 product brief (as published by OEMs): BF16 148 TFLOPS "
                                            "dense, FP8 296 dense, 96GB HBM3, 4.0 TB/s", 4.0e12, 296e12,
                      memory_source=NVML_H20),
    "B200": DeviceSpec(2.25e15, 183_359 * MIB, "NVIDIA HGX B200 / DGX B200 datasheet (1,000 W): BF16 4.5 PFLOPS with "
                                               "sparsity, i.e. 2.25 dense; FP8 4.5 dense; 1,440GB HBM3e and 64 TB/s "
                                               "for 8 GPUs, i.e. 180GB and 8 TB/s each", 8.0e12, 4.5e15, CURVE_B200,
                       NVML_B200),
    "GB200": DeviceSpec(2.5e15, 186e9, "NVIDIA GB200 NVL72 datasheet, per Blackwell GPU (1,200 W): BF16 360 "
                                       "PFLOPS with sparsity for 72 GPUs, i.e. 2.5 dense each; FP8 5 dense; "
                                       "13.4TB HBM3e and 576 TB/s for 72, i.e. 186GB and 8 TB/s", 8.0e12, 5.0e15),
    "MI300X": DeviceSpec(1307.4e12, 192e9, "AMD Instinct MI300X datasheet: BF16 1,307.4 TFLOPS dense (2,614.9 "
                                           "with sparsity), FP8 2,614.9 dense; 192GB HBM3, 5.3 TB/s",
                         5.3e12, 2614.9e12),
    "MI325X": DeviceSpec(1307.4e12, 256e9, "AMD Instinct MI325X datasheet: BF16 1,307.4 TFLOPS dense, FP8 2,614.9 "
                                           "dense; 256GB HBM3E, 6 TB/s", 6.0e12, 2614.9e12),
    "TPU-v5e": DeviceSpec(197e12, 16e9, "Google Cloud TPU v5e documentation: 197 TFLOPS BF16 per chip, 16 GB "
                                        "HBM2 at 819 GBps (no FP8: INT8 393 TOPS)", 819e9),
    "TPU-v5p": DeviceSpec(459e12, 95e9, "Google Cloud TPU v5p documentation: 459 TFLOPS BF16 per chip, 95 GB "
                                        "HBM2e at 2,765 GBps (no FP8)", 2765e9),
    "TPU-v6e": DeviceSpec(918e12, 32e9, "Google Cloud TPU v6e (Trillium) documentation: 918 TFLOPS BF16 per "
                                        "chip, 32 GB HBM at 1,638 GBps (no FP8: INT8 1,836 TOPS)", 1638e9),
}

#: Bus-bandwidth efficiencies of ``papers/kernel-efficiency/collectives.json`` (``fit_collectives.py``):
#: nccl-tests on an A100 node (NVLink 3), OpenXLA's H100 and B200 rings (NVLink 4, 5), a 4-node H200 ring
#: over EFA (the network links: InfiniBand and RoCE assumed alike); the NVLink ones with their fitted latency
#: per ring step.
BUS_NVLINK3, BUS_NVLINK4, BUS_NVLINK5, BUS_NETWORK = 0.723, 0.838, 0.628, 0.912
STEP_NVLINK3, STEP_NVLINK4, STEP_NVLINK5 = 6.16e-06, 3.68e-06, 4.34e-06

NETWORKS: dict[str, LinkSpec] = {
    "nvlink3": LinkSpec(300e9, 3e-6, "NVIDIA A100 datasheet: third-generation NVLink 600 GB/s "
                                     "(both directions), i.e. 300 GB/s per direction; HGX A100: 8 GPUs", 8,
                      bus_efficiency=BUS_NVLINK3, step_latency=STEP_NVLINK3),
    "nvlink4": LinkSpec(450e9, 3e-6, "NVIDIA H100/H200 datasheets: fourth-generation NVLink 900 GB/s "
                                     "(both directions), i.e. 450 GB/s per direction; HGX H100: 8 GPUs", 8,
                      bus_efficiency=BUS_NVLINK4, step_latency=STEP_NVLINK4),
    "ib-ndr": LinkSpec(50e9, 5e-6, "NVIDIA ConnectX-7 / Quantum-2 InfiniBand NDR: 400 Gb/s per port, "
                                   "i.e. 50 GB/s per direction", bus_efficiency=BUS_NETWORK),
    "100gbe": LinkSpec(12.5e9, 1e-5, "IEEE 802.3 100 Gigabit Ethernet: 100 Gb/s, i.e. 12.5 GB/s per "
                                     "direction; TCP-level latency"),
    "nvlink-h800": LinkSpec(200e9, 3e-6, "NVIDIA H800 SXM5 product brief: NVLink 400 GB/s (both directions), "
                                         "i.e. 200 GB/s per direction; 8 GPUs a node", 8,
                      bus_efficiency=BUS_NVLINK4, step_latency=STEP_NVLINK4),
    "nvlink5": LinkSpec(900e9, 3e-6, "NVIDIA Blackwell datasheets: fifth-generation NVLink 1.8 TB/s per GPU "
                                     "(both directions), i.e. 900 GB/s per direction; HGX B200: 8 GPUs", 8,
                      bus_efficiency=BUS_NVLINK5, step_latency=STEP_NVLINK5),
    "nvl72": LinkSpec(900e9, 3e-6, "NVIDIA GB200 NVL72 datasheet: one NVLink 5 switch domain of 72 GPUs, "
                                   "1.8 TB/s per GPU (both directions), i.e. 900 GB/s per direction", 72,
                      bus_efficiency=BUS_NVLINK5, step_latency=STEP_NVLINK5),
    "ib-hdr": LinkSpec(25e9, 5e-6, "NVIDIA ConnectX-6 / Quantum InfiniBand HDR: 200 Gb/s per port, i.e. "
                                   "25 GB/s per direction", bus_efficiency=BUS_NETWORK),
    "ib-xdr": LinkSpec(100e9, 5e-6, "NVIDIA ConnectX-8 / Quantum-X800 InfiniBand XDR: 800 Gb/s per port, "
                                    "i.e. 100 GB/s per direction", bus_efficiency=BUS_NETWORK),
    "roce-200": LinkSpec(25e9, 1e-5, "RoCE v2 over 200 Gigabit Ethernet (e.g. ConnectX-6): 200 Gb/s, i.e. "
                                     "25 GB/s per direction", bus_efficiency=BUS_NETWORK),
    "roce-400": LinkSpec(50e9, 1e-5, "RoCE v2 over 400 Gigabit Ethernet (ConnectX-7 / Spectrum-X): 400 Gb/s, "
                                     "i.e. 50 GB/s per direction", bus_efficiency=BUS_NETWORK),
    "infinity-fabric": LinkSpec(64e9, 3e-6, "AMD Instinct MI300X platform: each of 8 GPUs joined to the 7 others "
                                            "by one Infinity Fabric link of 128 GB/s (both directions), i.e. "
                                            "64 GB/s per direction between two GPUs", 8),
    "ici-v5e": LinkSpec(50e9, 3e-6, "Google Cloud TPU v5e documentation: 400 GBps bidirectional ICI per chip "
                                    "over 4 ports (2D torus), i.e. 50 GB/s per port and direction; 256-chip pod",
                        256),
    "ici-v5p": LinkSpec(50e9, 3e-6, "Google Cloud TPU v5p documentation: 4,800 Gbps ICI per chip over 6 ports "
                                    "(3D torus), taken as bidirectional: 50 GB/s per port and direction", 8960),
    "ici-v6e": LinkSpec(100e9, 3e-6, "Google Cloud TPU v6e documentation: 800 GBps bidirectional ICI per chip "
                                     "over 4 ports (2D torus), i.e. 100 GB/s per port and direction; 256-chip "
                                     "pod", 256),
}


# Other spellings users type; lookups also ignore case, "-", "_" and spaces (``_checks.preset_key``).
ALIASES = {
    "a100sxm": "A100", "a100sxm4": "A100", "a10080gb": "A100",
    "h100sxm": "H100", "h100sxm5": "H100", "h200sxm": "H200",
    "nvlinka100": "nvlink3", "nvlinkh100": "nvlink4", "nvlinkh200": "nvlink4",
    "ndr": "ib-ndr", "infinibandndr": "ib-ndr", "ethernet100g": "100gbe",
    "a10040g": "A100-40GB", "a100sxm440gb": "A100-40GB", "h100sxm580gb": "H100", "h800sxm": "H800",
    "h800sxm5": "H800", "h141gb": "H200", "mi300": "MI300X", "v5e": "TPU-v5e", "v5p": "TPU-v5p",
    "v6e": "TPU-v6e", "trillium": "TPU-v6e", "tpuv6etrillium": "TPU-v6e",
    "hdr": "ib-hdr", "infinibandhdr": "ib-hdr", "xdr": "ib-xdr", "infinibandxdr": "ib-xdr",
    "nvlinkb200": "nvlink5", "gb200nvl72": "nvl72", "nvlinkh800": "nvlink-h800", "xgmi": "infinity-fabric",
    "roce200g": "roce-200", "roce400g": "roce-400", "roce200gbe": "roce-200", "roce400gbe": "roce-400",
}


def device_key(name: object) -> str:
    """The ``DEVICES`` key of ``name`` (any case, spelling or alias); ``ConfigError`` names the known ones."""
    return preset_key(DEVICES, name, "device", ALIASES)


def network_key(name: object) -> str:
    """The ``NETWORKS`` key of ``name`` (any case, spelling or alias); ``ConfigError`` names the known ones."""
    return preset_key(NETWORKS, name, "network", ALIASES)


def devices() -> tuple[str, ...]:
    """The device preset names (see ``DEVICES``)."""
    return tuple(DEVICES)


def networks() -> tuple[str, ...]:
    """The link preset names (see ``NETWORKS``)."""
    return tuple(NETWORKS)
