"""Named devices and links, as published by their vendors, for ``Hardware.from_model``.

``device("H100")`` gives a ``Device`` and ``network("nvlink4", "ib-ndr")`` a ``Network``; the
tables ``DEVICES`` and ``NETWORKS`` and ``preset_names()`` need no JAX (the CLI lists them fast).

Units: FLOP/s, bytes, bytes/s per direction, seconds. Vendor "GB" is 10**9 bytes and is used as
published (the usable memory a framework reports is a little lower still). Peak FLOP/s are the
*dense* BF16 Tensor Core figures: the datasheets headline the 2:4-sparsity figure, twice that.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

from ._errors import ConfigError

if TYPE_CHECKING:
    from ._hardware import Network
    from ._transformer import Device


class DeviceSpec(NamedTuple):
    """A device as published: dense BF16 peak (FLOP/s), memory (bytes) and the source."""

    peak_flops: float
    memory: float
    source: str


class LinkSpec(NamedTuple):
    """A link: bandwidth per direction (bytes/s), latency (s) and the source.

    Latencies are not datasheet figures: they are the order of magnitude of a small message's
    end-to-end point-to-point time through the communication library (one significant figure).
    """

    bandwidth: float
    latency: float
    source: str


DEVICES: dict[str, DeviceSpec] = {
    "A100": DeviceSpec(312e12, 80e9, "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): BF16 312 TFLOPS "
                                     "dense (624 with sparsity), 80GB HBM2e"),
    "H100": DeviceSpec(989e12, 80e9, "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BF16 1,979 TFLOPS "
                                     "with sparsity, i.e. 989 dense; 80GB HBM3"),
    "H200": DeviceSpec(989e12, 141e9, "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): BF16 1,979 TFLOPS "
                                      "with sparsity, i.e. 989 dense; 141GB HBM3e"),
}

NETWORKS: dict[str, LinkSpec] = {
    "nvlink3": LinkSpec(300e9, 3e-6, "NVIDIA A100 datasheet: third-generation NVLink 600 GB/s "
                                     "(both directions), i.e. 300 GB/s per direction"),
    "nvlink4": LinkSpec(450e9, 3e-6, "NVIDIA H100/H200 datasheets: fourth-generation NVLink 900 GB/s "
                                     "(both directions), i.e. 450 GB/s per direction"),
    "ib-ndr": LinkSpec(50e9, 5e-6, "NVIDIA ConnectX-7 / Quantum-2 InfiniBand NDR: 400 Gb/s per port, "
                                   "i.e. 50 GB/s per direction"),
    "100gbe": LinkSpec(12.5e9, 1e-5, "IEEE 802.3 100 Gigabit Ethernet: 100 Gb/s, i.e. 12.5 GB/s per "
                                     "direction; TCP-level latency"),
}

# Other spellings users type; lookups also ignore case, "-", "_" and spaces.
_ALIASES = {
    "a100sxm": "A100", "a100sxm4": "A100", "a10080gb": "A100",
    "h100sxm": "H100", "h100sxm5": "H100", "h200sxm": "H200",
    "nvlinka100": "nvlink3", "nvlinkh100": "nvlink4", "nvlinkh200": "nvlink4",
    "ndr": "ib-ndr", "infinibandndr": "ib-ndr", "ethernet100g": "100gbe",
}


def _key(name: str) -> str:
    return re.sub(r"[-_\s]", "", name).lower()


def _lookup(table: dict, name: object, what: str) -> str:
    if isinstance(name, str):
        known = {_key(k): k for k in table}
        key = _key(name)
        key = _key(_ALIASES.get(key, key))
        if key in known:
            return known[key]
    raise ConfigError(f"unknown {what} preset {name!r}; known: {', '.join(table)}")


def preset_names() -> dict[str, tuple[str, ...]]:
    """The preset names: ``{"devices": (...), "networks": (...)}``."""
    return {"devices": tuple(DEVICES), "networks": tuple(NETWORKS)}


def device(name: str, *, efficiency: float | None = None) -> Device:
    """The ``Device`` preset ``name`` (case-insensitive; see ``DEVICES``).

    ``efficiency`` (fraction of peak sustained) defaults to ``diffpipe._transformer.DEFAULT_EFFICIENCY``.
    """
    from ._transformer import Device  # imported here so that listing presets needs no JAX

    key = _lookup(DEVICES, name, "device")
    spec = DEVICES[key]
    if efficiency is None:
        return Device(spec.peak_flops, spec.memory, name=key)
    return Device(spec.peak_flops, spec.memory, efficiency, name=key)


def network(intra: str, inter: str | None = None, *, devices_per_node: int = 8, mode: str = "overlap") -> Network:
    """A ``Network`` from link presets (see ``NETWORKS``).

    Args:
        intra: the link between devices of one node (e.g. ``"nvlink4"``).
        inter: the link between nodes (e.g. ``"ib-ndr"``); ``None`` puts every device on one node
            (``devices_per_node`` is then ignored).
        devices_per_node: devices sharing a node when ``inter`` is given.
        mode: communication mode (``none``, ``overlap``, ``contention``, ``blocking``).
    """
    from ._hardware import Network, _float  # imported here so that listing presets needs no JAX

    a = NETWORKS[_lookup(NETWORKS, intra, "network")]
    b = a if inter is None else NETWORKS[_lookup(NETWORKS, inter, "network")]
    return Network(_float(a.latency), _float(a.bandwidth), _float(b.latency), _float(b.bandwidth), mode=mode,
                   devices_per_node=None if inter is None else devices_per_node)
