"""The device and link presets as objects: ``device("H100")`` a ``Device``, ``network("nvlink4",
"ib-ndr")`` a ``Network``, from the published figures of ``_specs``."""

from __future__ import annotations

from .._arrays import as_float
from .._engine._hardware import Network
from ._device import DEFAULT_EFFICIENCY, Device
from ._specs import DEVICES, NETWORKS, device_key, network_key


def device(name: str, *, efficiency: float | None = None) -> Device:
    """The ``Device`` preset ``name`` (case-insensitive; see ``DEVICES``): datasheet peak, memory
    and memory bandwidth, and the fitted kernel-efficiency curve (``DeviceSpec.curve``; the flat
    ``diffpipe._model._transformer.DEFAULT_EFFICIENCY`` where none was measured).

    ``efficiency`` (a fraction of peak) replaces the curve by that flat one, the bandwidth kept.
    """
    key = device_key(name)
    spec = DEVICES[key]
    maximum, tokens = (DEFAULT_EFFICIENCY, 0.0) if spec.curve is None else spec.curve
    if efficiency is not None:
        maximum, tokens = efficiency, 0.0
    return Device(spec.peak_flops, spec.memory, maximum, spec.memory_bandwidth, tokens, name=key)


def network(intra: str, inter: str | None = None, *, devices_per_node: int | None = None,
            mode: str = "overlap") -> Network:
    """A ``Network`` from link presets (see ``NETWORKS``).

    Args:
        intra: the link between devices of one node (e.g. ``"nvlink4"``).
        inter: the link between nodes (e.g. ``"ib-ndr"``); ``None`` puts every device on one node
            (``devices_per_node`` is then ignored).
        devices_per_node: devices sharing a node when ``inter`` is given (default: the ``intra``
            link's switch domain, e.g. 72 for ``nvl72``, else 8).
        mode: communication mode (``none``, ``overlap``, ``contention``, ``blocking``).
    """
    a = NETWORKS[network_key(intra)]
    b = a if inter is None else NETWORKS[network_key(inter)]
    if devices_per_node is None:
        devices_per_node = a.domain or 8
    return Network(as_float(a.latency), as_float(a.bandwidth), as_float(b.latency), as_float(b.bandwidth), mode=mode,
                   devices_per_node=None if inter is None else devices_per_node)
