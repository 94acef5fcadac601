"""Machine files to library objects: the sections of a TOML machine file (the format
``Calibration.to_toml`` writes and ``diffpipe --config`` reads; ``_machine_format`` reads and
checks it) as the machine that prices a schedule (``machine``; ``load_machine`` of a file's path); a training
configuration's become its ``Configuration`` in ``_training_file``, so that a machine's commands do
not load the planner.

Every value comes with where it was given (``Given``: key -> ``(value, origin)``, the origin a
file's ``path: [section] key`` or a command-line flag), so an error names the culprit as the user
gave it; ``names`` spells, the same way, what no given value names (a whole section, a key that
is missing: ``NAMES`` by default, the command line names its flags).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import is_number
from ._compare import Machine, default_machine
from ._engine._hardware import Hardware, Network
from ._errors import ConfigError
from ._machine import _presets
from ._machine._device import Device
from ._machine_format import MACHINE_SECTIONS, read_machine_file
from .calibrate._calibration import communication_mode

#: A section's given values: key -> (value, where it was given).
Given = Mapping[str, tuple[Any, str]]
#: How an error names what no given value names: a section, or a key that is missing.
NAMES = {"model": "[model]", "times": "[times]", "intra": "[network] intra", "inter": "[network] inter",
         "devices_per_node": "[network] devices_per_node"}


@dataclass(frozen=True)
class FileMachine:
    """The machine of a machine file: ``hardware(schedule) -> Hardware`` and a name for reports;
    the model, device and network where it has them (not for per-stage ``[times]``). ``given``:
    whether any machine input was given (else it is ``default_machine()``). ``communication``: the
    mode its schedules are compiled under (``[network] mode``; else ``overlap``, or ``contention``
    where the links are the default machine's): the graph's, as ``compile(communication=...)``
    takes it, never a field of the hardware. ``devices_per_node``: likewise the topology its
    schedules are compiled for (``[network] devices_per_node``, 8 where ``inter`` is given without
    it; None: all on one node; 1 where the links are the default machine's)."""

    name: str
    hardware: Callable[[Any], Any]
    model: Any = None
    device: Any = None
    network: Any = None
    given: bool = True
    communication: Any = "overlap"
    devices_per_node: int | None = None


def check_float32(values: Given) -> None:
    """Finite inputs must stay finite in float32 (JAX's default): 1e39 seconds would become inf."""
    if jax.config.jax_enable_x64:
        return
    biggest = float(np.finfo(np.float32).max)
    for value, origin in values.values():
        for x in value if isinstance(value, list) else [value]:
            if is_number(x) and math.isfinite(x) and abs(x) > biggest:
                raise ConfigError(f"{origin} = {x!r} does not fit float32 (at most {biggest:.4g}); enable 64-bit "
                                  "floats (JAX_ENABLE_X64=1) or use other units")


def machine(times: Given, model: Mapping[str, Any], device: Given, network: Given,
            names: Mapping[str, str] | None = None) -> FileMachine:
    """The machine of a machine file's ``[times]``, ``[model]``, ``[device]`` and ``[network]``.

    Per-stage ``times`` (``Hardware.from_times``; ``backward`` is ``input_grad``) exclude the
    other sections but ``[network] mode``; else ``default_machine()`` with the ``model`` fields,
    the ``device`` (a preset, its ``efficiency``, or ``peak_flops`` and ``memory``) and the
    ``network`` (link presets ``intra``/``inter`` or ``latency``/``bandwidth``) that are given
    replaced. ``[network] mode`` is any mode name, ``"torch-runtime"`` included.
    """
    names = {**NAMES, **(names or {})}
    times, net, dev = dict(times), dict(network), dict(device)
    mode = communication_mode(net.pop("mode", (None, ""))[0])
    check_float32({**times, **{f"n.{k}": v for k, v in net.items()}, **{f"d.{k}": v for k, v in dev.items()}})
    modes = {} if mode is None else {"mode": mode}
    chosen = "overlap" if mode is None else mode  # links of a preset or of given values: overlap by default
    if times:
        if net:
            key, (_, origin) = next(iter(net.items()))
            raise ConfigError(f"{origin} cannot be combined with per-stage times: give p2p (seconds per "
                              "transfer) or use a [model] and [device]")
        if model or dev:
            origin = names["model"] if model else next(iter(dev.values()))[1]
            raise ConfigError(f"{origin} cannot be combined with per-stage times ({names['times']}): give one or "
                              "the other")
        missing = [k for k in ("forward", "backward") if k not in times]
        if missing:
            raise ConfigError(f"times: give both forward and backward (seconds per stage); {missing[0]} is missing")
        t = {k: v for k, (v, _) in times.items()}

        by_kind = {k: t[f"overhead_{k}"] for k in "FBIW" if f"overhead_{k}" in t}  # Hardware.kind_overhead

        def from_times(schedule: Any) -> Any:
            return Hardware.from_times(t["forward"], t["backward"], t.get("weight"), t.get("p2p", 0.0),
                                       update=t.get("update", 0.0), overhead=t.get("overhead", 0.0),
                                       kind_overhead=by_kind or None, full_backward=t.get("full_backward"),
                                       setup=t.get("setup", 0.0), wind_down=t.get("wind_down", 0.0),
                                       pair_overlap=t.get("pair_overlap"), split_known=t.get("split_known", True),
                                       send_cost=t.get("send_cost"), recv_cost=t.get("recv_cost"))

        label = (f"times F={t['forward']} I={t['backward']} W={t.get('weight', 0)} p2p={t.get('p2p', 0)} "
                 + (f"pair_overlap={t['pair_overlap']} " if "pair_overlap" in t else "") + f"({mode or 'overlap'})")
        return FileMachine(label, from_times, communication=chosen)
    if not model and not dev and not net:
        m = default_machine(**modes)
        return FileMachine(m.name, m, m.model, m.device, m.network, given=mode is not None,
                           communication=m.communication, devices_per_node=m.devices_per_node)
    base = default_machine(**modes)
    transformer = dataclasses.replace(base.model, **model) if model else base.model
    d = {k: v for k, (v, _) in dev.items()}
    if "preset" in d:
        chip = _presets.device(d["preset"], efficiency=d.get("efficiency"))
    elif ("peak_flops" in d) != ("memory" in d):
        have, need = ("peak_flops", "memory") if "peak_flops" in d else ("memory", "peak_flops")
        raise ConfigError(f"{dev[have][1]} needs [device] {need} too (or a preset to start from)")
    else:
        chip = base.device
        if "efficiency" in d:
            chip = chip.flat(d["efficiency"])
    if "peak_flops" in d or "memory" in d:
        chip = Device(d.get("peak_flops", chip.peak_flops), d.get("memory", chip.memory),
                      d.get("efficiency", chip.efficiency), name=f"{chip.name} (custom)"
                      if "preset" in d else "a custom device")
    presets = [k for k in ("intra", "inter") if k in net]
    explicit = [k for k in ("latency", "bandwidth", "inter_latency", "inter_bandwidth") if k in net]
    if presets and explicit:
        raise ConfigError(f"{net[explicit[0]][1]} cannot be combined with {net[presets[0]][1]}: give link "
                          "presets or latency/bandwidth, not both")
    if ("inter" in net or "devices_per_node" in net) and "intra" not in net and not explicit:
        raise ConfigError(f"{names['inter']}/{names['devices_per_node']} need {names['intra']} (the intra-node "
                          "network preset)")
    n = {k: v for k, (v, _) in net.items()}
    if "intra" in net:
        links = _presets.network(n["intra"], n.get("inter"))
        if "inter" not in n and "devices_per_node" in n:
            raise ConfigError(f"{net['devices_per_node'][1]} needs {names['inter']} (the link between nodes)")
        per_node = n.get("devices_per_node", 8) if "inter" in n else None
    elif explicit:
        lat = jnp.asarray(float(n.get("latency", 0.0)))
        bw = jnp.asarray(float(n.get("bandwidth", math.inf)))
        links = Network(lat, bw, jnp.asarray(float(n.get("inter_latency", lat))),
                        jnp.asarray(float(n.get("inter_bandwidth", bw))))
        per_node = n.get("devices_per_node")
    else:
        links, chosen, per_node = base.network, base.communication, base.devices_per_node
    label = f"{transformer.layers}-layer model (h={transformer.hidden}) on {getattr(chip, 'name', 'a custom device')}"
    m = Machine(transformer, chip, links, name=label, communication=chosen, devices_per_node=per_node)
    return FileMachine(m.name, m, transformer, chip, links, communication=chosen, devices_per_node=per_node)


def load_machine(path: str | os.PathLike) -> FileMachine:
    """The machine of a machine file (``Calibration.to_toml``'s, or one written by hand as
    ``examples/machine.toml``): its ``[times]``, or its ``[model]``, ``[device]`` and ``[network]``
    over ``default_machine()`` (``machine``); a ``[schedule]`` section is allowed and not read.
    ``m = load_machine(path)``: ``simulate(schedule, m.hardware(schedule), communication=m.communication,
    devices_per_node=m.devices_per_node)`` is what ``diffpipe simulate --config path`` simulates. Errors
    name the file, the section and the key.
    """
    file = read_machine_file(path, ("schedule", *MACHINE_SECTIONS), user="load_machine")
    return machine(file.given("times"), file.get("model"), file.given("device"), file.given("network"),
                   names={"model": file.where("model")})


__all__ = ["NAMES", "FileMachine", "Given", "check_float32", "load_machine", "machine"]
