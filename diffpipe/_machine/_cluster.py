"""``Cluster``: devices and the links between them (presets by name, ``diffpipe.presets``)."""


from __future__ import annotations

from typing import Any

import equinox as eqx
import numpy as np
from jaxtyping import Array, Float

from .._arrays import array_module, as_float, concrete
from .._checks import check_int
from .._errors import ConfigError
from . import _presets, _specs
from ._device import Device

# -- the cluster ------------------------------------------------------------------------------------
#: The most GPUs a cluster may have (2**20): past any machine built, and it bounds the planner's
#: search (every divisor of the GPU count) before it starts.
MAX_GPUS = 1 << 20


def _link(value: Any, what: str) -> tuple[str, float, float, float, float]:
    """``(name, bandwidth, latency, bus efficiency, ring step latency)`` of a link preset name, a
    ``LinkSpec`` or ``(bandwidth, latency)`` (bus efficiency 1, step latency the latency)."""
    if isinstance(value, str):
        key = _specs.network_key(value)
        spec = _specs.NETWORKS[key]
    elif isinstance(value, _specs.LinkSpec):
        key, spec = "custom", value
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        return "custom", value[0], value[1], 1.0, value[1]
    else:
        spec = None
    if spec is not None:
        step = spec.latency if spec.step_latency is None else spec.step_latency
        return key, spec.bandwidth, spec.latency, spec.bus_efficiency, step
    raise ConfigError(f"cluster: {what} must be a link preset name (see diffpipe.presets.networks()), a LinkSpec "
                      f"or (bandwidth, latency), got {value!r}")


class Cluster(eqx.Module):
    """Devices and the links between them; float leaves are arrays (differentiable, vmap-able).

    ``Cluster(device="H100", gpus=64, devices_per_node=8, intra="nvlink4", inter="ib-ndr")``:
    ``device`` is a ``Device`` or a device preset name; ``intra``/``inter`` link preset names
    (``diffpipe.presets.networks()``), ``LinkSpec``s or ``(bandwidth bytes/s, latency s)`` pairs;
    ``devices_per_node`` defaults to the intra link's switch domain (8 for NVLink, 72 for NVL72).
    Collectives run at ``bus_efficiency`` of each link's bandwidth (the presets' measured NCCL bus
    bandwidth; 1 for a ``(bandwidth, latency)`` pair): ``bus_bandwidth``.
    ``memory_bandwidth`` (bytes/s; it also times the optimizer step) lives on the ``Device``
    (presets carry the datasheet figure); ``memory_bandwidth=`` replaces the device's. A device
    without one (``inf``, a bare ``Device(peak, memory)``) is refused: the optimizer step would be free.
    """

    device: Device
    intra_bandwidth: Float[Array, ""]
    intra_latency: Float[Array, ""]
    inter_bandwidth: Float[Array, ""]
    inter_latency: Float[Array, ""]
    intra_bus_efficiency: Float[Array, ""]
    inter_bus_efficiency: Float[Array, ""]
    intra_step_latency: Float[Array, ""]
    inter_step_latency: Float[Array, ""]
    gpus: int = eqx.field(static=True)
    devices_per_node: int = eqx.field(static=True)
    intra: str = eqx.field(static=True)
    inter: str = eqx.field(static=True)

    def __init__(self, device: Any = "H100", gpus: int = 8, devices_per_node: int | None = None,
                 intra: Any = "nvlink4", inter: Any = "ib-ndr", *, memory_bandwidth: Any = None) -> None:
        if isinstance(device, str):
            device = _presets.device(device)
        elif not isinstance(device, Device):
            raise ConfigError(f"cluster: device must be a Device or a device preset name, got {device!r}")
        if memory_bandwidth is not None:
            device = eqx.tree_at(lambda d: d.memory_bandwidth, device, as_float(memory_bandwidth))
        bandwidth = concrete(device.memory_bandwidth)
        if bandwidth is not None and not np.all(np.isfinite(bandwidth)):
            raise ConfigError(f"cluster: device {device.name!r} has no memory bandwidth: give memory_bandwidth= "
                              "(bytes/s)")
        if bandwidth is not None and not np.all(bandwidth > 0):
            got = float(bandwidth.ravel()[0])
            raise ConfigError(f"cluster: memory_bandwidth must be positive (bytes/s), got {got!r}")
        self.device = device
        self.gpus = check_int("cluster: gpus", gpus, 1, MAX_GPUS)
        self.intra, intra_bw, intra_lat, intra_bus, intra_step = _link(intra, "intra")
        self.inter, inter_bw, inter_lat, inter_bus, inter_step = _link(inter, "inter")
        self.intra_bus_efficiency, self.inter_bus_efficiency = as_float(intra_bus), as_float(inter_bus)
        self.intra_step_latency, self.inter_step_latency = as_float(intra_step), as_float(inter_step)
        if devices_per_node is None:
            domain = _specs.NETWORKS[self.intra].domain if self.intra in _specs.NETWORKS else None
            devices_per_node = domain or 8
        self.devices_per_node = check_int("cluster: devices_per_node", devices_per_node, 1)
        if self.gpus > self.devices_per_node and self.gpus % self.devices_per_node:
            raise ConfigError(f"cluster: gpus={self.gpus} is not a whole number of {self.devices_per_node}-GPU "
                              "nodes")
        self.intra_bandwidth, self.intra_latency = as_float(intra_bw), as_float(intra_lat)
        self.inter_bandwidth, self.inter_latency = as_float(inter_bw), as_float(inter_lat)

    def __check_init__(self) -> None:
        for name, positive in (("intra_bandwidth", True), ("inter_bandwidth", True), ("intra_latency", False),
                               ("inter_latency", False)):
            x = concrete(getattr(self, name))
            if x is None:
                continue
            bad = np.isnan(x) | (x < 0) | ((x <= 0) if positive else False) | (np.isinf(x) & (not positive))
            if np.any(bad):
                want = "positive (inf allowed)" if positive else "non-negative and finite"
                raise ConfigError(f"cluster: {name} must be {want}, got {x.ravel()[0]!r}")

    @property
    def memory_bandwidth(self) -> Array:
        """The device's memory bandwidth (bytes/s)."""
        return self.device.memory_bandwidth

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.devices_per_node)

    def bus_bandwidth(self, name: str, ranks_per_node: int = 1) -> Array:
        """Bus bandwidth (bytes/s) of a ring collective over ``"intra"`` or ``"inter"`` links. A ring
        that spans nodes with ``ranks_per_node`` of its ranks in each node runs as NCCL's
        hierarchical rings: each of those ranks' rings crosses the network once per node through its
        own NIC, so the network share is ``ranks_per_node`` links, capped by the node's link (NumPy for
        a cluster ``on_host``, as every method here)."""
        intra = self.intra_bandwidth * self.intra_bus_efficiency
        if name == "intra":
            return intra
        if name == "inter":
            xp = array_module(self)
            return xp.minimum(intra, ranks_per_node * self.inter_bandwidth * self.inter_bus_efficiency)
        raise ConfigError(f"cluster: link must be 'intra' or 'inter', got {name!r}")

    def step_latency(self, name: str) -> Array:
        """A ring collective's latency per step over ``"intra"`` or ``"inter"`` links (the slower of the
        two for a ring that spans nodes)."""
        if name == "intra":
            return self.intra_step_latency
        if name == "inter":
            return array_module(self).maximum(self.intra_step_latency, self.inter_step_latency)
        raise ConfigError(f"cluster: link must be 'intra' or 'inter', got {name!r}")

    def link(self, name: str) -> tuple[Array, Array]:
        """``(bandwidth, latency)`` of ``"intra"`` or ``"inter"``."""
        if name == "intra":
            return self.intra_bandwidth, self.intra_latency
        if name == "inter":
            return self.inter_bandwidth, self.inter_latency
        raise ConfigError(f"cluster: link must be 'intra' or 'inter', got {name!r}")

