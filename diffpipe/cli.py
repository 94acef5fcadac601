"""The ``diffpipe`` command line: a thin shell over the library API.

Every command takes the machine from flags or a TOML file (``--config``; schema in README.md and
``examples/machine.toml``); ``--json`` prints strict JSON (``null`` where a number is undefined).
The contract (README, "The command line"):

- a bad input (a flag, a TOML key, a CSV cell, an output path, a size past ``--max-ops``) is one
  line ``diffpipe: error: ...`` on stderr naming the culprit, exit code 2, and no file changes;
- an unexpected failure is one line asking for a report, exit code 1 (``--debug``: the traceback);
- every output path is checked before any work starts, and a command's outputs are written all
  or none (``diffpipe._io.Staged``);
- sizes are checked against ``--max-ops`` before anything is generated.

JAX is imported only by commands that simulate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import re
import signal
import sys
import threading
import tomllib
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _io, schedules
from ._checks import check_int, is_int, is_number
from ._errors import ConfigError, ScheduleError

#: The most operations one command may generate (the library's limit, ``schedules.MAX_OPS``),
#: estimated from its sizes before anything is built (``estimated_ops``); ``--max-ops`` raises or
#: lowers it. At the default, the largest single 1F1B schedule allowed (64 devices x 2048
#: microbatches) simulates in about 10 s on 2 CPU cores.
MAX_OPS = schedules.MAX_OPS
#: ``optimize`` counts its ops once per this many gradient steps: ops x steps / 3 <= ``--max-ops``
#: (measured on 2 CPU cores with examples/machine.toml at 300 steps: 1F1B 8 x 256 takes 40 s and
#: is allowed, 8 x 2048 took 160 s and is refused).
OPTIMIZE_STEPS_PER_OP = 3
#: Sizes of the one-schedule commands (show, simulate, optimize, export) when neither a flag nor
#: ``[schedule]`` gives them: those of ``diffpipe.sweep`` (``schedules.get`` has none; a test
#: checks they agree). ``compare`` and ``sweep`` leave unset sizes to their library defaults.
DEFAULT_DEVICES = 4
DEFAULT_MICROBATCHES = 8
#: The library's mode names (``_communication.MODES``), copied so that parsing never imports JAX (tested).
COMMUNICATION_MODES = ("none", "overlap", "contention", "blocking", "rendezvous")
#: ``Transformer.recompute`` modes (``_transformer.RECOMPUTE``), copied for the same reason (tested).
RECOMPUTE_MODES = ("none", "selective", "full")
#: The units of the sweep table's numeric columns (``SweepResult`` stores SI units).
SWEEP_UNITS = "units: makespan in s, throughput in microbatches/s, peak_memory in bytes, bubble_ratio a fraction"
REPORT = "please report this at the diffpipe issue tracker (rerun with --debug for the traceback)"


class _UsageError(Exception):
    """A command-line syntax error (argparse's), printed as one line."""


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that every ``finally`` (temporary files) runs."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse prints usage + message over two lines
        command = self.prog.removeprefix("diffpipe").strip()
        raise _UsageError(f"{command}: {message}" if command else message)


# -- command-line values -------------------------------------------------------------------------
def _integer_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


_count = _integer_at_least(1)
_natural = _integer_at_least(0)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (a number >= 0), got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected seconds (a finite number >= 0), got {text!r}")
    return value


def _value(raw: str) -> object:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            pass
    return raw


def _family_options(pairs: Sequence[str]) -> dict[str, object]:
    """``--option chunks=2`` -> ``{"chunks": 2}`` (ints, floats, booleans, else strings)."""
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key or not raw:
            raise ConfigError(f"--option {pair!r}: expected NAME=VALUE")
        options[key.replace("-", "_")] = _value(raw)
    return options


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected comma-separated integers") from None
    for v in values:
        check_int(f"{flag} {text!r}: each", v, 1)
    return values


def _names(text: str, flag: str) -> list[str]:
    names = [x.strip() for x in text.split(",")]
    if not text.strip() or not all(names):
        raise ConfigError(f"{flag} {text!r}: expected comma-separated names, none empty")
    return names


# -- the TOML file: schema ---------------------------------------------------------------------------
def _is_scalar_option(v: Any) -> bool:
    return isinstance(v, (bool, int, float, str))


#: kind -> (test, what the value must be).
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "count": (lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    "seconds": (lambda v: is_number(v) and math.isfinite(v) and v >= 0, "a finite number >= 0 (seconds)"),
    "times": (lambda v: _seconds_or_list(v), "a number or a list of numbers (seconds, finite, >= 0)"),
    "positive": (lambda v: is_number(v) and math.isfinite(v) and v > 0, "a finite number > 0"),
    "bandwidth": (lambda v: is_number(v) and v > 0, "a number > 0 (bytes/s; inf for free)"),
    "fraction": (lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "shares": (lambda v: all(is_number(x) and 0 <= x <= 1 for x in (v if isinstance(v, list) and v else [v])),
               "a number or a list of numbers in [0, 1]"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "mode": (lambda v: v in COMMUNICATION_MODES, f"one of {', '.join(COMMUNICATION_MODES)}"),
    "options": (lambda v: isinstance(v, dict) and all(_is_scalar_option(x) for x in v.values()),
                "a table of NAME = number, bool or string"),
    "zero": (lambda v: is_int(v) and 0 <= v <= 3, "a ZeRO stage 0, 1, 2 or 3"),
    "recompute": (lambda v: v in RECOMPUTE_MODES, f"one of {', '.join(RECOMPUTE_MODES)}"),
}


def _seconds_or_list(v: Any) -> bool:
    def ok(x: Any) -> bool:
        return is_number(x) and math.isfinite(x) and x >= 0

    return ok(v) or (isinstance(v, list) and len(v) > 0 and all(ok(x) for x in v))


#: section -> key -> kind. Every documented key (README, examples/machine.toml).
SCHEMA: dict[str, dict[str, str]] = {
    "schedule": {"family": "name", "devices": "count", "microbatches": "count", "options": "options"},
    "times": {"forward": "times", "backward": "times", "weight": "times", "update": "times",
              "p2p": "seconds", "overhead": "seconds", "full_backward": "times", "setup": "seconds",
              "wind_down": "seconds", "overhead_F": "seconds", "overhead_B": "seconds", "overhead_I": "seconds",
              "overhead_W": "seconds", "pair_overlap": "shares"},
    "model": {"layers": "count", "hidden": "count", "heads": "count", "sequence": "count",
              "vocabulary": "count", "microbatch_size": "count", "microbatch": "count", "dtype_bytes": "count",
              "ffn_multiplier": "positive", "recompute": "bool", "tied_embedding": "bool"},
    "device": {"preset": "name", "peak_flops": "positive", "memory": "positive", "efficiency": "fraction"},
    "network": {"intra": "name", "inter": "name", "devices_per_node": "count", "mode": "mode",
                "latency": "seconds", "bandwidth": "bandwidth", "inter_latency": "seconds",
                "inter_bandwidth": "bandwidth"},
    # A whole training configuration (simulate and compare; examples/llama3-70b.toml).
    "training": {"model": "name", "hf_config": "name", "sequence": "count", "microbatch_size": "count",
                 "global_batch": "count", "recompute": "recompute", "flash_attention": "bool"},
    "parallelism": {"tensor": "count", "pipeline": "count", "data": "count", "expert": "count", "virtual": "count",
                    "zero": "zero", "sequence_parallel": "bool"},
    "cluster": {"device": "name", "gpus": "count", "devices_per_node": "count", "intra": "name", "inter": "name"},
}
_MACHINE_SECTIONS = ("times", "model", "device", "network")
#: The sections of a training configuration, and the commands that read them.
_CONFIGURATION_SECTIONS = ("training", "parallelism", "cluster")
_CONFIGURATION_COMMANDS = ("simulate", "compare")


def _shown(value: Any) -> str:
    """A TOML value as the user wrote it (``"abc"``, ``true``, ``[1, "x"]``)."""
    try:
        return json.dumps(value, default=str)
    except ValueError:
        return repr(value)


@dataclass(frozen=True)
class _Config:
    """A checked TOML machine file (``path`` None: no file)."""

    path: str | None = None
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def get(self, section: str) -> dict[str, Any]:
        return dict(self.sections.get(section, {}))

    def where(self, section: str, key: str | None = None) -> str:
        return f"{self.path}: [{section}]" + ("" if key is None else f" {key}")


def _load_config(path: str | None, command: str, usable: Iterable[str] | None = None) -> _Config:
    """Read and check a TOML machine file: UTF-8, known sections and keys, typed values, and only
    sections the command can use (default: every section, the configuration ones only for
    ``simulate`` and ``compare``)."""
    if path is None:
        return _Config()
    if usable is None:
        usable = [s for s in SCHEMA if command in _CONFIGURATION_COMMANDS or s not in _CONFIGURATION_SECTIONS]
    text = _io.read_text(path, "--config")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: malformed TOML: {error}") from None
    usable = tuple(usable)
    for section, body in data.items():
        if section not in SCHEMA:
            raise ConfigError(f"{path}: unknown section [{section}]; known: {', '.join(SCHEMA)}")
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: [{section}] must be a table, got {_shown(body)}")
        for key, value in body.items():
            kind = SCHEMA[section].get(key)
            if kind is None:
                raise ConfigError(f"{path}: unknown key {key!r} in [{section}]; "
                                  f"known: {', '.join(sorted(SCHEMA[section]))}")
            test, want = _KINDS[kind]
            if not test(value):
                raise ConfigError(f"{path}: [{section}] {key} must be {want}, got {_shown(value)}")
        if section not in usable:
            raise ConfigError(f"{path}: [{section}] cannot be used by '{command}'"
                              f" (it uses {', '.join(f'[{s}]' for s in usable) or 'no sections'})")
    if "times" in data:
        other = [s for s in ("model", "device") if s in data]
        if other:
            raise ConfigError(f"{path}: [times] cannot be combined with [{other[0]}]: give per-stage times "
                              "or a model and device, not both")
    return _Config(path, data)


# -- size guards -------------------------------------------------------------------------------------
def estimated_ops(family: str, devices: int, microbatches: int, options: dict[str, Any] | None = None) -> int:
    """The family's own estimate of its op count (``Family.estimate_ops``), from the sizes alone,
    before anything is generated; 0 where the request is invalid (generating it names the problem).
    Options the family does not have are left out (a sweep's grid spans several families)."""
    fam = schedules.family(family)  # an unknown family: one line naming it
    given = {k: v for k, v in (options or {}).items() if k in fam.option_names}
    try:
        resolved = fam.check(devices, microbatches, given)
    except ScheduleError:
        return 0
    return fam.estimate_ops(devices, microbatches, resolved)


def units_per_sample(family: str, options: dict[str, Any] | None = None) -> int:
    """Microbatch ids per sample of ``family`` at ``options`` (those it declares; Seq1F1B's
    ``segments``), 1 where they are invalid: ``compare`` and ``sweep`` count samples."""
    fam = schedules.family(family)
    try:
        return fam.units({k: v for k, v in (options or {}).items() if k in fam.option_names})
    except ScheduleError:
        return 1


def _guard(detail: str, ops: int, max_ops: int) -> None:
    if ops > max_ops:
        raise ConfigError(f"{detail} is about {ops:,} ops, past the limit of {max_ops:,} (--max-ops); "
                          f"lower the sizes or pass --max-ops {ops}")


def _guard_schedule(family: str, devices: int, microbatches: int, options: dict[str, Any],
                    max_ops: int, factor: int = 1, why: str = "") -> None:
    ops = estimated_ops(family, devices, microbatches, options)
    extra = "".join(f", {k}={v}" for k, v in options.items() if k in ("chunks", "waves", "steps"))
    detail = f"{family} on {devices} devices x {microbatches} microbatches{extra}{why}"
    _guard(detail, max(ops * factor, devices * devices), max_ops)


# -- the machine -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Machine:
    """``schedule -> Hardware`` from the merged configuration, and a name for reports. ``given``:
    whether any machine input was given (else it is the library's ``default_machine()``)."""

    name: str
    hardware: Callable[[Any], Any]
    model: Any = None
    device: Any = None
    network: Any = None
    given: bool = True


_TIME_FLAGS = {"forward": "--forward", "backward": "--backward", "weight": "--weight", "p2p": "--p2p"}
_NET_FLAGS = {"intra": "--intra", "inter": "--inter", "devices_per_node": "--devices-per-node", "mode": "--mode"}


def _merged(args: argparse.Namespace, config: _Config, section: str,
            flags: dict[str, str]) -> dict[str, tuple[Any, str]]:
    """``key -> (value, origin)``: the file's section, overridden by flags."""
    out = {k: (v, config.where(section, k)) for k, v in config.get(section).items()}
    for key, flag in flags.items():
        if getattr(args, key, None) is not None:
            out[key] = (getattr(args, key), flag)
    return out


def _machine_flags(args: argparse.Namespace) -> list[str]:
    flags = {**_TIME_FLAGS, **_NET_FLAGS, "device": "--device"}
    return [flag for key, flag in flags.items() if getattr(args, key, None) is not None]


def _check_float32(values: dict[str, tuple[Any, str]]) -> None:
    """Finite inputs must stay finite in float32 (JAX's default): 1e39 seconds would become inf."""
    import jax
    import numpy as np

    if jax.config.jax_enable_x64:
        return
    biggest = float(np.finfo(np.float32).max)
    for value, origin in values.values():
        for x in value if isinstance(value, list) else [value]:
            if is_number(x) and math.isfinite(x) and abs(x) > biggest:
                raise ConfigError(f"{origin} = {x!r} does not fit float32 (at most {biggest:.4g}); enable 64-bit "
                                  "floats (JAX_ENABLE_X64=1) or use other units")


def _machine(args: argparse.Namespace, config: _Config) -> _Machine:
    import jax.numpy as jnp

    from . import _presets
    from ._compare import Machine, default_machine
    from ._hardware import Hardware, Network
    from ._transformer import Device

    times = _merged(args, config, "times", _TIME_FLAGS)
    net = _merged(args, config, "network", _NET_FLAGS)
    model_cfg = config.get("model")
    dev = _merged(args, config, "device", {})
    if getattr(args, "device", None) is not None:
        dev["preset"] = (args.device, "--device")
    mode = net.pop("mode", (None, ""))[0]
    _check_float32({**times, **{f"n.{k}": v for k, v in net.items()}, **{f"d.{k}": v for k, v in dev.items()}})
    modes = {} if mode is None else {"mode": mode}
    if times:
        if net:
            key, (_, origin) = next(iter(net.items()))
            raise ConfigError(f"{origin} cannot be combined with per-stage times: give p2p (seconds per "
                              "transfer) or use a [model] and [device]")
        if model_cfg or dev:
            origin = config.where("model") if model_cfg else next(iter(dev.values()))[1]
            raise ConfigError(f"{origin} cannot be combined with per-stage times (--forward/--backward or "
                              "[times]): give one or the other")
        missing = [k for k in ("forward", "backward") if k not in times]
        if missing:
            raise ConfigError(f"times: give both forward and backward (seconds per stage); {missing[0]} is missing")
        t = {k: v for k, (v, _) in times.items()}

        by_kind = {k: t[f"overhead_{k}"] for k in "FBIW" if f"overhead_{k}" in t}  # Hardware.kind_overhead

        def from_times(schedule: Any) -> Any:
            return Hardware.from_times(t["forward"], t["backward"], t.get("weight"), t.get("p2p", 0.0),
                                       update=t.get("update", 0.0), overhead=t.get("overhead", 0.0), **modes,
                                       kind_overhead=by_kind or None, full_backward=t.get("full_backward"),
                                       setup=t.get("setup", 0.0), wind_down=t.get("wind_down", 0.0),
                                       pair_overlap=t.get("pair_overlap"))

        label = (f"times F={t['forward']} I={t['backward']} W={t.get('weight', 0)} p2p={t.get('p2p', 0)} "
                 + (f"pair_overlap={t['pair_overlap']} " if "pair_overlap" in t else "") + f"({mode or 'overlap'})")
        return _Machine(label, from_times)
    if not model_cfg and not dev and not net:
        m = default_machine(**modes)
        return _Machine(m.name, m, m.model, m.device, m.network, given=mode is not None)
    base = default_machine(**modes)
    if model_cfg and "microbatch" in model_cfg:  # the key's old name, read as microbatch_size
        if "microbatch_size" in model_cfg:
            raise ConfigError(f"{config.where('model')}: [model] give microbatch_size, not also microbatch")
        model_cfg = {("microbatch_size" if k == "microbatch" else k): v for k, v in model_cfg.items()}
    model = dataclasses.replace(base.model, **model_cfg) if model_cfg else base.model
    d = {k: v for k, (v, _) in dev.items()}
    if "preset" in d:
        device = _presets.device(d["preset"], efficiency=d.get("efficiency"))
    elif ("peak_flops" in d) != ("memory" in d):
        have, need = ("peak_flops", "memory") if "peak_flops" in d else ("memory", "peak_flops")
        raise ConfigError(f"{dev[have][1]} needs [device] {need} too (or a preset to start from)")
    else:
        device = base.device
        if "efficiency" in d:
            device = device.flat(d["efficiency"])
    if "peak_flops" in d or "memory" in d:
        device = Device(d.get("peak_flops", device.peak_flops), d.get("memory", device.memory),
                        d.get("efficiency", device.efficiency), name=f"{device.name} (custom)"
                        if "preset" in d else "a custom device")
    presets = [k for k in ("intra", "inter") if k in net]
    explicit = [k for k in ("latency", "bandwidth", "inter_latency", "inter_bandwidth") if k in net]
    if presets and explicit:
        raise ConfigError(f"{net[explicit[0]][1]} cannot be combined with {net[presets[0]][1]}: give link "
                          "presets or latency/bandwidth, not both")
    if ("inter" in net or "devices_per_node" in net) and "intra" not in net and not explicit:
        raise ConfigError("--inter/--devices-per-node need --intra (the intra-node network preset)")
    n = {k: v for k, (v, _) in net.items()}
    if "intra" in net:
        network = _presets.network(n["intra"], n.get("inter"), devices_per_node=n.get("devices_per_node", 8),
                                   **modes)
        if "inter" not in n and "devices_per_node" in n:
            raise ConfigError(f"{net['devices_per_node'][1]} needs --inter (the link between nodes)")
    elif explicit:
        lat = jnp.asarray(float(n.get("latency", 0.0)))
        bw = jnp.asarray(float(n.get("bandwidth", math.inf)))
        network = Network(lat, bw, jnp.asarray(float(n.get("inter_latency", lat))),
                          jnp.asarray(float(n.get("inter_bandwidth", bw))), **modes,
                          devices_per_node=n.get("devices_per_node"))
    else:
        network = base.network
    label = f"{model.layers}-layer model (h={model.hidden}) on {getattr(device, 'name', 'a custom device')}"
    m = Machine(model, device, network, name=label)
    return _Machine(m.name, m, model, device, network)


# -- a training configuration (--model/--hf-config, --tp/--pp/--dp, ...) -----------------------------
@dataclass(frozen=True)
class _Flag:
    """One flag of a training configuration, for every command that takes it: ``simulate`` and
    ``compare`` (one value, also the TOML key ``key`` of ``[section]``) and ``plan`` (``search``:
    ``"one"`` value, a comma-separated ``"list"`` of values to search, ``"both"`` for a switch
    searched on and off; None: not a plan flag). ``parse`` and ``choices`` check one value in
    both; ``default`` is what plan searches when the flag is absent; ``alias`` plan's older name;
    ``machine``: simulate and compare take it from their machine group (``_add_machine``)."""

    flag: str
    key: str
    section: str | None
    help: str
    parse: Callable[[str], Any] | None = None
    choices: tuple[Any, ...] | None = None
    switch: bool = False
    metavar: str | None = None
    search: str | None = "one"
    default: str = ""
    alias: str | None = None
    machine: bool = False


def _zero(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a ZeRO stage 0, 1, 2 or 3, got {text!r}") from None


_CONFIG_FLAGS = (
    _Flag("--model", "model", "training", "model preset (llama-3-70b, mixtral-8x7b, ...; diffpipe.presets.models())"),
    _Flag("--hf-config", "hf_config", "training", "a Hugging Face config.json", metavar="PATH"),
    _Flag("--sequence", "sequence", "training", "tokens per sample (default: the model's)", _count),
    _Flag("--microbatch-size", "microbatch_size", "training", "samples per microbatch", _count, search="list",
          default="1,2,4,8", alias="--microbatch-sizes"),
    _Flag("--global-batch", "global_batch", "training", "samples per optimizer step", _count),
    _Flag("--recompute", "recompute", "training", "activation recomputation", choices=RECOMPUTE_MODES,
          search="list", default="all"),
    _Flag("--flash-attention", "flash_attention", "training", "fused attention (no s x s tensors stored)",
          switch=True),
    _Flag("--tp", "tensor", "parallelism", "tensor-parallel size", _count, search="list",
          default="every divisor of a node", alias="--tensor"),
    _Flag("--pp", "pipeline", "parallelism", "pipeline-parallel size", _count, search="list",
          default="every divisor up to the layers", alias="--pipeline"),
    _Flag("--dp", "data", "parallelism", "data-parallel size (default: --gpus / (tp x pp))", _count, search=None),
    _Flag("--ep", "expert", "parallelism", "expert-parallel size (divides the data-parallel size)", _count,
          search="list", default="every divisor of dp and the experts"),
    _Flag("--vpp", "virtual", "parallelism", "model chunks per pipeline device", _count, search="list",
          default="2,4 for families with chunks"),
    _Flag("--zero", "zero", "parallelism", "ZeRO stage (1: Megatron's distributed optimizer)", _zero,
          choices=(0, 1, 2, 3), search="list", default="all"),
    _Flag("--sequence-parallel", "sequence_parallel", "parallelism",
          "Megatron's sequence parallelism in the tensor group", switch=True, search="both"),
    _Flag("--gpus", "gpus", "cluster", "GPUs in the cluster (simulate, compare: default tp x pp x dp; plan: "
          "required, or --cluster)", _count),
    _Flag("--cluster", "cluster", None, "GPUs and device preset at once, e.g. 64xH100", metavar="GPUSxDEVICE"),
    _Flag("--device", "device", "cluster", "device preset (default H100)", machine=True),
    _Flag("--intra", "intra", "cluster", "intra-node link preset (default nvlink4)", machine=True),
    _Flag("--inter", "inter", "cluster", "inter-node link preset (default ib-ndr)", machine=True),
    _Flag("--devices-per-node", "devices_per_node", "cluster",
          "GPUs per node (default: the intra link's switch domain, 8 for NVLink)", _count, machine=True),
)


def _keys(section: str) -> dict[str, str]:
    """``[section]`` key -> its flag (the flag's dest is the key)."""
    return {f.key: f.flag for f in _CONFIG_FLAGS if f.section == section}


_TRAINING_FLAGS = _keys("training")
_PARALLEL_FLAGS = _keys("parallelism")
_CLUSTER_FLAGS = _keys("cluster")
_CLUSTER_SHAPE = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*([A-Za-z][\w.-]*)|([A-Za-z][\w.-]*?)\s*[xX]\s*(\d+))\s*$")


def _listed(parse: Callable[[str], Any] | None = None,
            choices: Sequence[Any] | None = None) -> Callable[[str], list[Any]]:
    """An argparse type for comma-separated values, each checked as one value is (``parse``,
    ``choices``): how plan takes a flag that simulate takes once."""
    def values(text: str) -> list[Any]:
        items = [x.strip() for x in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"expected comma-separated values, none empty, got {text!r}")
        out = [parse(x) if parse else x for x in items]
        for raw, value in zip(items, out):
            if choices is not None and value not in choices:
                raise argparse.ArgumentTypeError(f"{raw!r} is not one of {', '.join(map(str, choices))}")
        return out

    return values


def _add_training(p: argparse.ArgumentParser, plan: bool = False) -> None:
    """The training-configuration flags of ``simulate``/``compare`` (one value each), or of ``plan``
    (lists where it searches; ``_Flag``)."""
    if plan:
        g = p.add_argument_group("training configuration (lists: comma-separated values to search)")
    else:
        g = p.add_argument_group("training configuration (flags override [training], [parallelism], [cluster]; "
                                 "see examples/llama3-70b.toml)")
    for f in _CONFIG_FLAGS:
        if (f.machine and not plan) or (plan and f.search is None):
            continue
        names = [f.flag] + ([f.alias] if plan and f.alias else [])
        if plan and f.search == "both":
            g.add_argument(*names, dest=f.key, action=argparse.BooleanOptionalAction, default=None,
                           help=f"{f.help}: only with it, or only without (default: search both)")
        elif f.switch:
            g.add_argument(*names, dest=f.key, action="store_true", default=None, help=f.help)
        elif plan and f.search == "list":
            g.add_argument(*names, dest=f.key, type=_listed(f.parse, f.choices),
                           metavar=f.metavar or ("N[,N...]" if f.parse else "NAME[,NAME...]"),
                           help=f"{f.help}: comma-separated values to search (default: {f.default})")
        else:
            g.add_argument(*names, dest=f.key, type=f.parse, choices=f.choices, metavar=f.metavar, help=f.help)


def _wants_configuration(args: argparse.Namespace, config: _Config) -> bool:
    """Whether the command describes a training configuration (a flag or section of one)."""
    flags = [*_TRAINING_FLAGS, *_PARALLEL_FLAGS, "gpus", "cluster"]
    return any(getattr(args, k, None) is not None for k in flags) or any(
        config.get(s) for s in _CONFIGURATION_SECTIONS)


@dataclass(frozen=True)
class _Training:
    """A checked training configuration: ``build(family, options)`` -> ``Configuration``."""

    model: Any
    parallelism: Any
    cluster: Any
    global_batch: int
    communication: str
    family: str | None
    options: dict[str, Any]
    label: str

    def build(self, family: str | None = None, options: dict[str, Any] | None = None,
              adapt: bool = False, max_ops: int = MAX_OPS) -> Any:
        """The ``Configuration`` of ``family`` (default the given one), its schedule within
        ``max_ops``; ``adapt``: a family without chunks keeps the stages it places (``virtual`` =
        its stages per device: compare)."""
        from . import _configuration

        family = family or self.family
        options = self.options if options is None else options
        par = self.parallelism

        def make(par: Any) -> Any:
            return _configuration.Configuration(self.model, par, self.cluster, self.global_batch, schedule=family,
                                                options=options, communication=self.communication)

        cfg = make(par)
        _guard_configuration(cfg, max_ops)
        if adapt and "chunks" not in schedules.family(cfg.family).option_names:
            stages = schedules.get(cfg.family, devices=par.pipeline, microbatches=cfg.microbatches,
                                   **dict(cfg.options)).stages
            cfg = make(dataclasses.replace(par, virtual=max(1, stages // par.pipeline)))
        return cfg


def _training(args: argparse.Namespace, config: _Config) -> _Training:
    """The training configuration of ``--model``/``--hf-config``, ``--tp``... and the sections
    ``[training]``, ``[parallelism]``, ``[cluster]`` (flags override the file)."""
    for flag in ("--forward", "--backward", "--weight", "--p2p"):
        if getattr(args, flag.lstrip("-"), None) is not None:
            raise ConfigError(f"{flag} (per-stage times) cannot be combined with a training configuration "
                              "(--model/--hf-config, --tp, ...): the model gives the times")
    for section in ("times", "model", "device"):
        if config.get(section):
            raise ConfigError(f"{config.where(section)} cannot be combined with a training configuration: give "
                              "the model in [training] (model or hf_config) and the device in [cluster]")
    network = config.get("network")
    for key in network:
        if key != "mode":
            raise ConfigError(f"{config.where('network', key)} cannot be combined with a training configuration: "
                              "give the links in [cluster] (intra, inter, devices_per_node)")
    section = config.get("schedule")
    for flag, given in (("--devices", args.devices), ("--microbatches", args.microbatches),
                        (config.where("schedule", "devices"), section.get("devices")),
                        (config.where("schedule", "microbatches"), section.get("microbatches"))):
        if given is not None:
            what = "--pp" if "devices" in flag else "--global-batch (with --microbatch-size and --dp)"
            raise ConfigError(f"{flag} cannot be combined with a training configuration: {what} sets it")
    train, par, clu = _configuration_values(args, config)
    from ._parallel import Parallelism

    model, name = _model(train, ("sequence", "microbatch_size", "recompute", "flash_attention"))
    t, p = par.get("tensor", 1), par.get("pipeline", 1)
    if "data" not in par:
        if "gpus" in clu and clu["gpus"] % (t * p):
            raise ConfigError(f"--gpus {clu['gpus']} is not a multiple of --tp x --pp = {t * p}")
        par["data"] = clu["gpus"] // (t * p) if "gpus" in clu else 1
    parallelism = Parallelism(**par)
    cluster = _cluster(clu, parallelism.gpus)
    mode = args.mode or network.get("mode") or "overlap"
    extra = "".join(f" {k}{v}" for k, v in (("EP", parallelism.expert), ("VPP", parallelism.virtual)) if v > 1)
    label = (f"{name} (s={model.sequence}, b={model.microbatch_size}, {model.recompute} recompute"
             f"{', flash attention' if model.flash_attention else ''}) on {cluster.gpus}x {cluster.device.name}, "
             f"TP{parallelism.tensor} PP{parallelism.pipeline} DP{parallelism.data}{extra} ZeRO-{parallelism.zero}"
             f"{' SP' if parallelism.sequence_parallel else ''}, global batch {train['global_batch']}")
    family = getattr(args, "family", None) or section.get("family")
    options = {**section.get("options", {}), **_family_options(args.option)}
    return _Training(model, parallelism, cluster, train["global_batch"], mode, family, options, label)


def _configuration_values(args: argparse.Namespace, config: _Config) -> tuple[dict, dict, dict]:
    """``[training]``, ``[parallelism]`` and ``[cluster]`` values, flags over the file, with
    ``--cluster GPUSxDEVICE`` folded in; exactly one model and a global batch are required."""
    train = {k: v for k, (v, _) in _merged(args, config, "training", _TRAINING_FLAGS).items()}
    par = {k: v for k, (v, _) in _merged(args, config, "parallelism", _PARALLEL_FLAGS).items()}
    clu = {k: v for k, (v, _) in _merged(args, config, "cluster", _CLUSTER_FLAGS).items()}
    if getattr(args, "cluster", None) is not None:
        found = _CLUSTER_SHAPE.match(args.cluster)
        if not found:
            raise ConfigError(f"--cluster {args.cluster!r}: expected GPUSxDEVICE, e.g. 64xH100")
        gpus, device = (int(found[1]), found[2]) if found[1] else (int(found[4]), found[3])
        for key, value in (("gpus", gpus), ("device", device)):
            if key in clu and clu[key] != value:
                raise ConfigError(f"--cluster {args.cluster!r} contradicts {_CLUSTER_FLAGS[key]} {clu[key]}")
            clu[key] = value
        check_int(f"--cluster {args.cluster!r}: gpus", gpus, 1)
    if ("model" in train) == ("hf_config" in train):
        raise ConfigError("a training configuration needs exactly one model: --model NAME (see "
                          "diffpipe.presets.models()) or --hf-config PATH (a Hugging Face config.json)"
                          + ("" if "model" not in train else ", not both"))
    if "global_batch" not in train:
        raise ConfigError("a training configuration needs --global-batch (samples per optimizer step)")
    return train, par, clu


def _model(train: dict[str, Any], fields: Sequence[str]) -> tuple[Any, str]:
    """The ``Transformer`` of ``--model`` or ``--hf-config`` with the ``fields`` of ``train`` that
    are given, and a name for it."""
    from . import _presets
    from ._transformer import Transformer

    given = {k: train[k] for k in fields if k in train}
    if "model" in train:
        return _presets.model(train["model"], **given), train["model"]
    return (Transformer.from_hf_config(train["hf_config"], **given),
            Path(train["hf_config"]).parent.name or train["hf_config"])


def _cluster(clu: dict[str, Any], gpus: int) -> Any:
    """The ``Cluster`` of ``[cluster]`` values (``gpus`` when they give none)."""
    from ._parallel import Cluster

    return Cluster(clu.get("device", "H100"), gpus=clu.get("gpus", gpus), devices_per_node=clu.get("devices_per_node"),
                   intra=clu.get("intra", "nvlink4"), inter=clu.get("inter", "ib-ndr"))


def _guard_configuration(cfg: Any, max_ops: int) -> None:
    options = dict(cfg.options)
    if "chunks" in schedules.family(cfg.family).option_names:
        options["chunks"] = cfg.parallelism.virtual
    _guard_schedule(cfg.family, cfg.parallelism.pipeline, cfg.microbatches, options, max_ops)


def _configuration_summary(cfg: Any, schedule: Any, result: Any, label: str) -> dict[str, Any]:
    """What ``simulate --json`` prints for a training configuration (seconds, bytes)."""
    par = cfg.parallelism
    return {"family": schedule.family, "options": dict(schedule.options), "machine": label,
            "tensor": par.tensor, "pipeline": par.pipeline, "data": par.data, "expert": par.expert,
            "virtual": par.virtual, "zero": par.zero, "sequence_parallel": par.sequence_parallel,
            "global_batch": cfg.global_batch, **result.to_dict(),
            "busy_s": [float(x) for x in result.result.busy]}


def _simulate_configuration(args: argparse.Namespace, training: _Training,
                            outputs: list[tuple[str, Path]]) -> None:
    cfg = training.build(max_ops=args.max_ops)
    result = cfg.evaluate()
    schedule = cfg.schedule()
    if outputs:
        _write_all(_pictures(args, schedule, cfg.hardware(), result.result, result.gradient_sync))
    summary = _configuration_summary(cfg, schedule, result, training.label)
    if args.json:
        _print_json(summary)
        return
    gb = 1e9
    r = result
    print(f"{schedule.family} {dict(schedule.options) or ''}: {training.label}".replace("  ", " "))
    print(f"  step time       {r.step_time:.3f} s" + ("" if r.gradient_sync else
                                                        f"  ({schedule.family}'s own R/U ops: no gradient-sync lane)"))
    print(f"  tokens/s/GPU    {r.tokens_per_second_per_gpu:,.0f}")
    print(f"  MFU             {100 * r.mfu:.1f}%  (model FLOPs over {r.gpus} x the dense BF16 peak)")
    print(f"  memory/GPU      {r.memory_per_gpu / gb:.1f} GB of {r.capacity / gb:.0f} GB: "
          f"{'fits' if r.fits else 'does NOT fit'}")
    print(f"  bubble          {100 * r.bubble_ratio:.1f}%   blocking collectives {100 * r.communication_share:.1f}%"
          f" of the step")
    print(f"  microbatches    {r.microbatches} per pipeline ({cfg.global_batch} = {cfg.model.microbatch_size} x "
          f"{r.microbatches} x {cfg.parallelism.data} data-parallel)")
    print("  rank  busy(s)  peak memory(GB)  fits")
    for d, mem in enumerate(r.memory):
        print(f"  {d:>4}  {summary['busy_s'][d]:7.3f}  {mem / gb:15.1f}  {'yes' if mem <= r.capacity else 'NO'}")


def _compare_configuration(args: argparse.Namespace, training: _Training) -> None:
    from ._compare import DEFAULT_SCHEDULES, compare

    families = list(args.families) or ([training.family] if training.family else [])
    items = [(f, training.options) for f in families] if families else list(DEFAULT_SCHEDULES.values())
    configs = {}
    for item in items:
        name, opts = (item, {}) if isinstance(item, str) else item
        cfg = training.build(name, dict(opts), adapt=True, max_ops=args.max_ops)
        configs[cfg.schedule()] = cfg
    def hardware(schedule: Any) -> Any:
        return configs[schedule].hardware()

    hardware.__name__ = training.label  # compare names the machine by it
    comparison = compare(list(configs), hardware)
    results = {entry.name: configs[s].evaluate() for entry, s in zip(comparison.entries, configs)}
    if args.json:
        data = json.loads(comparison.to_json())
        data["configuration"] = {"machine": training.label,
                                 "results": {name: r.to_dict() for name, r in results.items()}}
        _print_json(data)
        return
    print(comparison.to_markdown() if args.markdown else comparison)
    print(f"\nwhole step of each schedule: {training.label}")
    width = max(len(n) for n in results)
    print(f"  {'schedule':<{width}}  step(s)  tokens/s/GPU    MFU  memory/GPU(GB)  fits")
    for name, r in results.items():
        print(f"  {name:<{width}}  {r.step_time:7.3f}  {r.tokens_per_second_per_gpu:12,.0f}  {100 * r.mfu:4.1f}%"
              f"  {r.memory_per_gpu / 1e9:14.1f}  {'yes' if r.fits else 'NO'}")


# -- the schedule ------------------------------------------------------------------------------------
def _schedule(args: argparse.Namespace, config: _Config) -> Any:
    section = config.get("schedule")
    if getattr(args, "torch_csv", None):
        given = [("a family", args.family), ("--devices", args.devices), ("--microbatches", args.microbatches),
                 ("--option", args.option or None)]
        given += [(config.where("schedule", k), True) for k in section]
        for culprit, value in given:
            if value is not None:
                raise ConfigError(f"--torch-csv gives the whole schedule; {culprit} cannot be combined with it")
        path = args.torch_csv
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0  # unreadable: from_torch_csv names the reason
        _guard(f"--torch-csv {path} ({size:,} bytes)", size // 3, args.max_ops)
        return schedules.from_torch_csv(path)
    family = args.family or section.get("family")
    if not family:
        raise ConfigError("no schedule family: give one (see 'diffpipe list') or [schedule] family in --config")
    options = {**section.get("options", {}), **_family_options(args.option)}
    devices = args.devices if args.devices is not None else section.get("devices", DEFAULT_DEVICES)
    microbatches = args.microbatches if args.microbatches is not None else \
        section.get("microbatches", DEFAULT_MICROBATCHES)
    factor, why = 1, ""
    if getattr(args, "command", None) == "optimize":
        steps = _optimize_steps(args)
        factor, why = max(1, math.ceil(steps / OPTIMIZE_STEPS_PER_OP)), f" over {steps} gradient steps"
    _guard_schedule(family, devices, microbatches, options, args.max_ops, factor, why)
    return schedules.get(family, devices=devices, microbatches=microbatches, **options)


def _optimize_steps(args: argparse.Namespace) -> int:
    """``--steps``, else ``dp.optimize``'s default."""
    if args.steps is not None:
        return args.steps
    import inspect

    from ._optimize import optimize

    return inspect.signature(optimize).parameters["steps"].default


# -- outputs -----------------------------------------------------------------------------------------
def _check_outputs(*outputs: tuple[str, str | None, tuple[str, ...] | None]) -> list[tuple[str, Path]]:
    """Check every ``(flag, path, suffixes)`` given before any work: directory exists and is
    writable, target is no directory, suffix allowed, no path named twice."""
    checked: list[tuple[str, Path]] = []
    seen: dict[str, str] = {}
    for flag, path, suffixes in outputs:
        if path is None:
            continue
        p = _io.check_output(path, flag)
        if suffixes and p.suffix.lower() not in suffixes:
            raise ConfigError(f"{flag}: cannot write {path!r}: the suffix must be one of {', '.join(suffixes)}")
        key = os.path.realpath(p)
        if key in seen:
            raise ConfigError(f"{flag}: {path!r} is also the target of {seen[key]}")
        seen[key] = flag
        checked.append((flag, p))
    return checked


def _pictures(args: argparse.Namespace, schedule: Any, hw: Any, result: Any,
              gradient_sync: bool = False) -> list[tuple[str, str, Any]]:
    """``(flag, path, data)`` of the requested Gantt chart and trace (nothing written yet);
    ``gradient_sync``: the result's step has the gradient-sync lane (a training configuration's)."""
    subject = schedule if result is None else result
    out: list[tuple[str, str, Any]] = []
    if getattr(args, "gantt", None):
        from .viz import gantt
        from .viz.gantt import DEFAULT_DPI

        fig = gantt(subject, hw, schedule=schedule, gradient_sync=gradient_sync)
        fmt = Path(args.gantt).suffix.lower().lstrip(".")
        out.append(("--gantt", args.gantt, lambda tmp: fig.savefig(tmp, format=fmt, dpi=DEFAULT_DPI)))
    if getattr(args, "trace", None):
        from .viz import trace

        data = trace(subject, hw, schedule=schedule, gradient_sync=gradient_sync)
        out.append(("--trace", args.trace, _io.dumps_json(data, indent=None)))
    return out


def _write_all(outputs: Sequence[tuple[str, str, Any]]) -> None:
    """All outputs or none."""
    with _io.Staged() as staged:
        for flag, path, data in outputs:
            staged.add(path, data, flag)


def _print_json(data: Any) -> None:
    sys.stdout.write(_io.dumps_json(data))


def _strict(text: str) -> str:
    """A library's JSON text as strict JSON (NaN/Infinity -> null)."""
    return _io.dumps_json(json.loads(text))


# -- commands --------------------------------------------------------------------------------------
def _cmd_list(args: argparse.Namespace) -> None:
    rows = []
    for name in schedules.names():
        fam = schedules.family(name)
        rows.append({"name": name, "summary": fam.summary, "options": {o.name: o.describe() for o in fam.options},
                     "asynchronous": fam.asynchronous, "source": fam.source})
    if args.json:
        _print_json(rows)
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['summary']}")
        if r["source"]:
            print(f"{'':<{width}}    source: {r['source']}")
        for opt, doc in r["options"].items():
            print(f"{'':<{width}}    --option {opt}=...  {doc}")


def _cmd_show(args: argparse.Namespace) -> None:
    schedule = _schedule(args, _load_config(args.config, "show", ("schedule",)))
    t = schedules.table(schedule)
    if args.json:
        _print_json({
            "family": schedule.family, "devices": schedule.devices, "stages": schedule.stages,
            "microbatches": schedule.microbatches, "makespan": t.makespan, "bubble_ratio": t.bubble_ratio,
            "peak_activations": list(schedules.peak_activations(schedule)),
            "orders": [[str(op) for op in order] for order in schedule.orders],
        })
    else:
        print(t)


def _finite_or_none(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _simulation_summary(schedule: Any, result: Any, machine: _Machine) -> dict[str, Any]:
    import numpy as np

    makespan = float(result.makespan)
    if not math.isfinite(makespan):
        raise ConfigError(f"simulate: the makespan of {schedule.family} came out {makespan} from finite "
                          "inputs: it overflowed float32; enable 64-bit floats (JAX_ENABLE_X64=1) or use "
                          "smaller units")
    out = {
        "family": schedule.family, "options": dict(schedule.options), "devices": schedule.devices,
        "stages": schedule.stages, "microbatches": schedule.microbatches, "steps": schedule.steps,
        "machine": machine.name, "makespan_s": makespan,
        "microbatches_per_s": schedule.microbatches / makespan if makespan > 0 else None,
        "bubble_ratio": _finite_or_none(result.bubble_ratio) if makespan > 0 else None,
        "busy_s": [float(x) for x in np.asarray(result.busy)],
        "peak_memory_bytes": [float(x) for x in np.asarray(result.peak_memory)],
        "peak_activations": [int(x) for x in np.asarray(result.peak_activations)],
        "fits": [bool(x) for x in np.asarray(result.fits)],
        "communication_bytes": float(result.communication_bytes),
    }
    if schedule.steps > 1:
        out["step_period_s"] = [float(x) for x in np.asarray(result.period)]
        out["max_staleness"] = max(result.staleness.values(), default=0)
    return out


def _cmd_simulate(args: argparse.Namespace) -> None:
    outputs = _check_outputs(("--gantt", args.gantt, (".png", ".svg")), ("--trace", args.trace, (".json",)))
    config = _load_config(args.config, "simulate")
    if _wants_configuration(args, config):
        if args.torch_csv:
            raise ConfigError("--torch-csv cannot be combined with a training configuration (--model, --tp, ...)")
        _simulate_configuration(args, _training(args, config), outputs)
        return
    schedule = _schedule(args, config)
    machine = _machine(args, config)
    from ._simulate import simulate

    hw = machine.hardware(schedule)
    result = simulate(schedule, hw)
    summary = _simulation_summary(schedule, result, machine)
    if outputs:
        _write_all(_pictures(args, schedule, hw, result))
    if args.json:
        _print_json(summary)
        return
    gib = 2**30
    print(f"{schedule.family} {dict(schedule.options) or ''} on {machine.name}".replace("  ", " "))
    rate, bubble = summary["microbatches_per_s"], summary["bubble_ratio"]
    rate_text = "undefined: no work" if rate is None else f"{rate:.1f} microbatches/s"
    print(f"  makespan       {summary['makespan_s'] * 1e3:.3f} ms  ({rate_text})")
    print(f"  bubble ratio   {'undefined (zero makespan)' if bubble is None else f'{bubble:.3f}'}")
    print(f"  communication  {summary['communication_bytes'] / gib:.3f} GiB")
    if "step_period_s" in summary:
        periods = ", ".join(f"{p * 1e3:.3f}" for p in summary["step_period_s"])
        print(f"  step period    {periods} ms   max staleness {summary['max_staleness']}")
    print("  device  busy(ms)  peak memory(GiB)  activations  fits")
    for d in range(schedule.devices):
        print(f"  {d:>6}  {summary['busy_s'][d] * 1e3:8.3f}  {summary['peak_memory_bytes'][d] / gib:16.2f}"
              f"  {summary['peak_activations'][d]:11d}  {'yes' if summary['fits'][d] else 'NO'}")


def _compare_items(families: Sequence[str], options: dict[str, Any]) -> list[Any]:
    """Each named family with the given options it declares (``--option segments=4`` reaches
    seq1f1b, not 1f1b); an option no named family declares is an error."""
    declared = {f: schedules.family(f).option_names for f in families}
    unused = sorted(set(options) - {o for names in declared.values() for o in names})
    if unused:
        raise ConfigError(f"compare: --option {unused[0]} is not an option of {', '.join(families)}")
    items: list[Any] = []
    for f in families:
        mine = {k: v for k, v in options.items() if k in declared[f]}
        items.append((f, mine) if mine else f)
    return items


def _cmd_compare(args: argparse.Namespace) -> None:
    from ._compare import DEFAULT_DEVICES as COMPARE_DEVICES
    from ._compare import DEFAULT_MICROBATCHES as COMPARE_MICROBATCHES
    from ._compare import DEFAULT_SCHEDULES, compare

    config = _load_config(args.config, "compare")
    if _wants_configuration(args, config):
        _compare_configuration(args, _training(args, config))
        return
    section = config.get("schedule")
    families = list(args.families) or ([section["family"]] if "family" in section else [])
    options = {**section.get("options", {}), **_family_options(args.option)}
    if options and not families:
        raise ConfigError("compare: --option (or [schedule] options) applies to the families named on the "
                          "command line; the default set has its own options")
    devices = args.devices if args.devices is not None else section.get("devices")
    microbatches = args.microbatches if args.microbatches is not None else section.get("microbatches")
    items: Any = _compare_items(families, options) if families else DEFAULT_SCHEDULES
    for item in (items if families else DEFAULT_SCHEDULES.values()):
        name, opts = (item, {}) if isinstance(item, str) else item
        units = units_per_sample(name, dict(opts))  # --microbatches counts samples
        _guard_schedule(name, COMPARE_DEVICES if devices is None else devices,
                        (COMPARE_MICROBATCHES if microbatches is None else microbatches) * units, dict(opts),
                        args.max_ops)
    machine = _machine(args, config)
    comparison = compare(items, machine.hardware if machine.given else None,
                         devices=devices, microbatches=microbatches)
    if args.json:
        sys.stdout.write(_strict(comparison.to_json()))
    elif args.markdown:
        print(comparison.to_markdown())
    else:
        print(comparison)


def _cmd_optimize(args: argparse.Namespace) -> None:
    if args.batch is not None and args.knob == "stages":
        raise ConfigError("--batch sets the global batch of --knob microbatches/both; --knob stages does not use it")
    config = _load_config(args.config, "optimize", ("schedule", "model", "device", "network"))
    schedule = _schedule(args, config)
    machine = _machine(args, config)
    if machine.model is None:
        raise ConfigError("optimize needs a model (per-layer costs): give [model] in --config or --device/--intra")
    import numpy as np

    from ._knobs import MicrobatchSplit, StageBalance, Workload
    from ._optimize import optimize

    workload = Workload.from_model(machine.model, machine.device, machine.network)
    knobs: list[Any] = []
    if args.knob in ("stages", "both"):
        knobs.append(StageBalance(schedule.stages))
    if args.knob in ("microbatches", "both"):
        batch = machine.model.microbatch_size * schedule.microbatches if args.batch is None else args.batch
        knobs.append(MicrobatchSplit(batch, schedule.microbatches))
    steps = {} if args.steps is None else {"steps": args.steps}
    result = optimize(schedule, workload, tuple(knobs) if len(knobs) > 1 else knobs[0], **steps)
    plan, base = result.plan, result.baseline_plan
    out = {
        "family": schedule.family, "devices": schedule.devices, "stages": schedule.stages,
        "microbatches": schedule.microbatches, "machine": machine.name, "message": result.message,
        "fits": bool(result.fits), "layers_per_stage": list(plan.layers_per_stage),
        "samples": None if plan.samples is None else list(plan.samples), "makespan_s": float(plan.makespan),
        "peak_memory_bytes": [float(x) for x in np.asarray(plan.peak_memory)],
        "baseline": result.baseline, "baseline_layers_per_stage": list(base.layers_per_stage),
        "baseline_makespan_s": float(base.makespan), "speedup": float(result.speedup),
        "continuous_makespan_s": float(result.continuous_makespan), "evaluations": int(result.evaluations),
    }
    if args.json:
        _print_json(out)
        return
    print(f"{schedule.family}: {result.message}")
    print(f"  layers per stage  {out['layers_per_stage']}   (layer rows: embedding, blocks, head)")
    if out["samples"] is not None:
        print(f"  samples           {out['samples']}")
    print(f"  makespan          {out['makespan_s'] * 1e3:.3f} ms (exact)")
    base_ms = out["baseline_makespan_s"] * 1e3
    print(f"  baseline {out['baseline']:<8} {out['baseline_layers_per_stage']}  {base_ms:.3f} ms"
          f"  -> speed-up {out['speedup']:.3f}x")


def _cmd_sweep(args: argparse.Namespace) -> None:
    if args.json and args.limit is not None:
        raise ConfigError("--limit sets the rows of the printed table; --json prints every row")
    _check_outputs(("--csv", args.csv, None), ("--json-out", args.json_out, None),
                   ("--markdown-out", args.markdown_out, None))
    config = _load_config(args.config, "sweep")
    section = config.get("schedule")
    families = _names(args.families, "--families") if args.families is not None else \
        ([section["family"]] if "family" in section else None)
    modes = _names(args.modes, "--modes") if args.modes is not None else None
    for m in modes or ():
        if m not in COMMUNICATION_MODES:
            raise ConfigError(f"--modes: unknown mode {m!r}; known: {', '.join(COMMUNICATION_MODES)}")
    options: dict[str, Any] = {k: [v] for k, v in section.get("options", {}).items()}
    for pair in args.option:
        key, sep, raw = pair.partition("=")
        if not sep or not key or not raw:
            raise ConfigError(f"--option {pair!r}: expected NAME=V1,V2,...")
        options[key.replace("-", "_")] = [_value(v) for v in raw.split(",")]
    sizes: dict[str, Any] = {}
    if args.devices is not None:
        sizes["devices"] = _ints(args.devices, "--devices")
    elif "devices" in section:
        sizes["devices"] = [section["devices"]]
    if args.microbatches is not None:
        sizes["microbatches"] = _ints(args.microbatches, "--microbatches")
    elif "microbatches" in section:
        sizes["microbatches"] = [section["microbatches"]]
    grid_devices = sizes.get("devices", [DEFAULT_DEVICES])
    grid_micro = sizes.get("microbatches", [DEFAULT_MICROBATCHES])
    largest = {k: max((v for v in vs if is_int(v)), default=1) for k, vs in options.items()}
    variants = math.prod(len(vs) for vs in options.values()) * len(modes or [None])
    total = sum(estimated_ops(f, d, n * units_per_sample(f, largest), largest) for f in (families or schedules.names())
                for d in grid_devices for n in grid_micro) * variants
    _guard(f"sweep: the grid ({len(families or schedules.names())} families x {len(grid_devices)} device "
           f"counts x {len(grid_micro)} microbatch counts x {variants} option/mode variants)",
           max(total, max(grid_devices) ** 2), args.max_ops)
    machine = _machine(args, config)
    from ._sweep import sweep

    result = sweep(machine.hardware, families=families, options=options or None, communication=modes,
                   progress=False if args.json else None, **sizes)
    outputs = [(flag, path, make()) for flag, path, make in (
        ("--csv", args.csv, result.to_csv), ("--json-out", args.json_out, lambda: _strict(result.to_json())),
        ("--markdown-out", args.markdown_out, lambda: f"{result.to_markdown()}\n{SWEEP_UNITS}\n")) if path]
    _write_all(outputs)
    if args.json:
        sys.stdout.write(_strict(result.to_json()))
        return
    print(result.to_markdown(limit=40 if args.limit is None else args.limit))
    print(SWEEP_UNITS)
    if getattr(result, "skipped", None):
        print(f"\n{len(result.skipped)} combination(s) skipped (see --json for reasons)")


def _cmd_export(args: argparse.Namespace) -> None:
    from .schedules import to_torch_csv

    if not (args.csv or args.gantt or args.trace):
        raise ConfigError("export: give --csv, --gantt and/or --trace")
    _check_outputs(("--csv", args.csv, None), ("--gantt", args.gantt, (".png", ".svg")),
                   ("--trace", args.trace, (".json",)))
    pictures = bool(args.gantt or args.trace)
    if not pictures and _machine_flags(args):
        raise ConfigError(f"export: {_machine_flags(args)[0]} is used only with --gantt/--trace")
    usable = ("schedule", *_MACHINE_SECTIONS) if pictures else ("schedule",)
    config = _load_config(args.config, "export" if pictures else "export --csv", usable)
    schedule = _schedule(args, config)
    outputs: list[tuple[str, str, Any]] = []
    if args.csv:
        outputs.append(("--csv", args.csv, to_torch_csv(schedule)))
    if pictures:
        machine = _machine(args, config)
        outputs += _pictures(args, schedule, machine.hardware(schedule), None)
    _write_all(outputs)
    for _, path, _ in outputs:
        print(f"wrote {path}")


def _cmd_plan(args: argparse.Namespace) -> None:
    import shlex

    from ._export import megatron_args, torchtitan_toml
    from ._plan import plan
    from .schedules import to_torch_csv

    if args.out and not args.export:
        raise ConfigError("plan: --out needs --export")
    _check_outputs(("--out", args.out, None))
    train, par, clu = _configuration_values(args, _Config())
    if "gpus" not in clu:
        raise ConfigError("plan: give the cluster's GPUs: --gpus N or --cluster GPUSxDEVICE")
    model, name = _model(train, ("flash_attention",))
    cluster = _cluster(clu, clu["gpus"])
    # dp.plan's axes, where a flag narrows them (else dp.plan's defaults)
    axes = {"families": args.families, "tensor": par.get("tensor"), "pipeline": par.get("pipeline"),
            "expert": par.get("expert"), "virtual": par.get("virtual"),
            "microbatch_sizes": train.get("microbatch_size"), "recompute": train.get("recompute"),
            "zero": par.get("zero"), "sequence_parallel": par.get("sequence_parallel")}
    table = plan(model, cluster, train["global_batch"], sequence=train.get("sequence"),
                 **{k: tuple(v) if isinstance(v, list) else v for k, v in axes.items() if v is not None},
                 headroom=args.headroom, top_k=args.balance_top, balance=args.balance_top > 0, progress=None)
    text, exported = None, None
    exporters = {"megatron": lambda i: shlex.join(megatron_args(table.launch(i))) + "\n",
                 "torchtitan": lambda i: torchtitan_toml(table.launch(i)),
                 "csv": lambda i: to_torch_csv(table.configuration(i).schedule())}
    if args.export:  # the fastest row the framework can run (e.g. Megatron-LM runs no zb-h1)
        first = None
        for i in range(len(table.rows)):
            try:
                text, exported = exporters[args.export](i), i
                break
            except (ConfigError, ScheduleError) as error:
                first = first or error
        if text is None:
            raise ConfigError(f"plan: no evaluated configuration exports to {args.export} ({first})")
    if args.out and text is not None:
        _write_all([("--out", args.out, text)])
    if args.json:
        data = table.to_dict()
        data["rows"] = data["rows"][: args.top]
        if text is not None:
            data["export"] = {"format": args.export, "row": exported, "text": text}
        _print_json(data)
        return
    print(f"{name} on {cluster.gpus} x {cluster.device.name}, global batch {table.global_batch} x "
          f"{table.model.sequence} tokens")
    print(table.to_markdown(args.top), end="")
    if text is not None:
        which = "the best row" if exported == 0 else f"row {exported + 1}, the fastest it runs"
        print(f"\n{args.export} ({which}): " + (f"wrote {args.out}" if args.out else f"\n{text}"),
              end="\n" if args.out else "")


def _cmd_calibrate(args: argparse.Namespace) -> None:
    from .calibrate import cli_calibrate

    calibration = cli_calibrate(args.trace, args.schedule, args.out)
    if args.json:
        print(calibration.to_json(), end="")
    else:
        def ms(values: Any) -> str:
            return " ".join("-" if v is None else f"{1e3 * v:.3g}" for v in values or ())

        c = calibration
        print(f"{len(args.trace)} trace file(s), {c.stages} stage(s); ms per stage: forward {ms(c.forward)}; "
              f"backward {ms(c.backward)}; input-grad {ms(c.input_grad)}; weight {ms(c.weight)}; "
              f"overhead per op {1e3 * c.overhead:.3g} ms")
    if args.out:
        print(f"wrote {args.out}")


# -- parser ---------------------------------------------------------------------------------------
def _add_common(p: argparse.ArgumentParser, sizes: bool = True) -> None:
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the traceback of an error")
    if sizes:
        p.add_argument("--max-ops", type=_count, default=MAX_OPS, dest="max_ops", metavar="N",
                       help=f"refuse work estimated past N ops before starting (default {MAX_OPS:,})")


def _add_schedule(p: argparse.ArgumentParser, positional: bool = True) -> None:
    if positional:
        p.add_argument("family", nargs="?", help="schedule family (see 'diffpipe list')")
    p.add_argument("--devices", type=_count,
                   help=f"pipeline devices (default {DEFAULT_DEVICES}; compare: the library's)")
    p.add_argument("--microbatches", type=_count,
                   help=f"microbatches per step (default {DEFAULT_MICROBATCHES}; compare: the library's)")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE", help="a family option")
    if positional:
        p.add_argument("--torch-csv", dest="torch_csv", metavar="PATH",
                       help="read the schedule from a torch.distributed.pipelining CSV instead")


def _add_machine(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="TOML", help="machine/schedule file (see examples/machine.toml)")
    g = p.add_argument_group("machine (flags override --config)")
    g.add_argument("--forward", type=_seconds, help="seconds per stage forward (simple times model)")
    g.add_argument("--backward", type=_seconds, help="seconds per stage input-gradient backward")
    g.add_argument("--weight", type=_seconds, help="seconds per stage weight-gradient backward")
    g.add_argument("--p2p", type=_seconds, help="seconds per cross-device transfer")
    g.add_argument("--device", help="device preset (A100, H100, H200)")
    g.add_argument("--intra", help="intra-node network preset (nvlink3, nvlink4, ib-ndr, 100gbe)")
    g.add_argument("--inter", help="inter-node network preset")
    g.add_argument("--devices-per-node", type=_count, dest="devices_per_node")
    g.add_argument("--mode", choices=COMMUNICATION_MODES, help="communication model")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="diffpipe",
                     description="Pipeline-parallel schedules: show, simulate, compare, optimize, sweep and "
                                 "export them.",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, example: str, sizes: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {example}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        _add_common(p, sizes)
        return p

    p = command("list", "schedule families and their options", "diffpipe list --json", sizes=False)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_list)

    p = command("show", "the unit-time table of a schedule (F=1, B=2, I=W=1, no communication)",
                "diffpipe show interleaved-1f1b --devices 4 --microbatches 8 --option chunks=2")
    _add_schedule(p)
    p.add_argument("--config", metavar="TOML", help="take [schedule] from this file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_show)

    p = command("simulate", "simulate one step on a modelled machine",
                "diffpipe simulate 1f1b --devices 4 --microbatches 8 --forward 1e-3 --backward 2e-3 --p2p 1e-4")
    _add_schedule(p)
    _add_machine(p)
    _add_training(p)
    p.add_argument("--gantt", metavar="PNG|SVG", help="also draw a Gantt chart")
    p.add_argument("--trace", metavar="JSON", help="also write a Chrome/Perfetto trace")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_simulate)

    p = command("compare", "rank schedules at the formula, table and simulation levels; --microbatches counts "
                "samples for every family (seq1f1b and seq1f1b-i run --option segments=k units per sample, each "
                "priced at its segment's share), and each --option reaches the named families that declare it",
                "diffpipe compare 1f1b seq1f1b seq1f1b-i --devices 8 --microbatches 8 --option segments=4")
    p.add_argument("families", nargs="*",
                   help="families (default: dp.compare's, gpipe 1f1b chimera(sync=True) hanayo)")
    _add_schedule(p, positional=False)
    _add_machine(p)
    _add_training(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output")
    out.add_argument("--markdown", action="store_true", help="Markdown tables")
    p.set_defaults(run=_cmd_compare)

    p = command("optimize", "balance stages (and/or split microbatches) by gradient descent, verified exactly",
                "diffpipe optimize 1f1b --devices 4 --microbatches 8 --config examples/machine.toml")
    _add_schedule(p)
    _add_machine(p)
    p.add_argument("--knob", choices=["stages", "microbatches", "both"], default="stages")
    p.add_argument("--batch", type=_count, help="global batch for --knob microbatches (default microbatch x count)")
    p.add_argument("--steps", type=_count, help="gradient steps (default: dp.optimize's)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_optimize)

    p = command("sweep", "evaluate every combination of families, sizes and modes exactly",
                "diffpipe sweep --families gpipe,1f1b,zb-h1 --devices 4,8 --microbatches 8,16 --csv out.csv")
    p.add_argument("--families", help="comma-separated families (default all)")
    p.add_argument("--devices", help=f"comma-separated device counts (default {DEFAULT_DEVICES}, dp.sweep's)")
    p.add_argument("--microbatches",
                   help=f"comma-separated microbatch counts (default {DEFAULT_MICROBATCHES}, dp.sweep's)")
    p.add_argument("--modes", help="comma-separated communication modes (default the machine's)")
    p.add_argument("--option", action="append", default=[], metavar="NAME=V1,V2", help="a family option grid")
    _add_machine(p)
    p.add_argument("--csv", metavar="PATH", help="write the table as CSV")
    p.add_argument("--json-out", metavar="PATH", dest="json_out", help="write the table as JSON")
    p.add_argument("--markdown-out", metavar="PATH", dest="markdown_out", help="write the table as Markdown")
    p.add_argument("--limit", type=_natural, help="rows printed (default 40)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=_cmd_sweep)

    p = command("export", "write a schedule as torch CSV, a Gantt chart or a Perfetto trace",
                "diffpipe export 1f1b --devices 4 --microbatches 8 --csv 1f1b.csv")
    _add_schedule(p)
    _add_machine(p)
    p.add_argument("--csv", metavar="PATH", help="torch.distributed.pipelining compute-only CSV")
    p.add_argument("--gantt", metavar="PNG|SVG", help="Gantt chart of the simulated step")
    p.add_argument("--trace", metavar="JSON", help="Chrome/Perfetto trace of the simulated step")
    p.set_defaults(run=_cmd_export)
    p = command("plan", "search tensor x pipeline x data splits, schedules, microbatch sizes, recompute and ZeRO",
                "diffpipe plan --model llama-3-70b --gpus 256 --global-batch 256 --export megatron", sizes=False)
    _add_training(p, plan=True)
    p.add_argument("--families", type=_listed(), metavar="NAME[,NAME...]",
                   help="schedule families to search, comma-separated (default: dp.plan's)")
    p.add_argument("--headroom", type=float, default=0.1, help="memory fraction kept free (default 0.1)")
    p.add_argument("--balance-top", type=_natural, default=3, dest="balance_top",
                   help="balance the stages of the best N by gradient (default 3; 0: off)")
    p.add_argument("--top", type=_count, default=10, help="rows shown (default 10)")
    p.add_argument("--export", choices=["megatron", "torchtitan", "csv"], help="export the best configuration")
    p.add_argument("--out", metavar="PATH", help="write the export to PATH")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_plan)
    p = command("calibrate", "fit per-stage times, per-op overhead and p2p time from a torch.profiler trace",
                "diffpipe calibrate rank0.json rank1.json --schedule 1f1b --out machine.toml", sizes=False)
    p.add_argument("trace", nargs="+", help="Chrome trace JSON of a pipelined step, one file per rank")
    p.add_argument("--schedule", help="the schedule that ran (torch or diffpipe name, or a torch CSV)")
    p.add_argument("--out", metavar="TOML", help="write a machine file the other commands read (--config)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_calibrate)
    return parser


# -- errors -----------------------------------------------------------------------------------------
_JIT_ERRORS = ("EquinoxRuntimeError", "_EquinoxRuntimeError", "JaxRuntimeError", "XlaRuntimeError")


def _error_line(error: BaseException) -> tuple[int, str]:
    """The exit code and the one line for an exception the commands did not turn into ConfigError."""
    text = str(error)
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    if isinstance(error, MemoryError) or "RESOURCE_EXHAUSTED" in text:
        return 2, "diffpipe: error: out of memory; lower the sizes (or --max-ops)"
    if type(error).__name__ in _JIT_ERRORS:
        found = re.search(r"EquinoxRuntimeError: (.+)", text)
        if found:  # a check inside jit: its message names the culprit
            return 2, f"diffpipe: error: {found.group(1).strip()}"
    if isinstance(error, OSError):
        where = f"{error.filename}: " if error.filename else ""
        return 2, f"diffpipe: error: {where}{error.strerror or first}"
    return 1, f"diffpipe: internal error: {type(error).__name__}: {first}; {REPORT}"


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if not debug:  # jax logs a failed check inside jit as a traceback of its own
        logging.getLogger("jax._src.callback").setLevel(logging.CRITICAL)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    code, line, caught = 0, "", None
    try:
        args = build_parser().parse_args(argv)
        args.run(args)
    except _UsageError as error:
        code, line, caught = 2, f"diffpipe: error: {error}", error
    except (ScheduleError, ConfigError) as error:
        code, line, caught = 2, f"diffpipe: error: {error}", error
    except BrokenPipeError:  # e.g. piped into head: stop quietly
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as error:
        code, line, caught = 130, "diffpipe: interrupted (no file was changed)", error
    except _Terminated as error:
        code, line, caught = 143, "diffpipe: terminated (no file was changed)", error
    except Exception as error:
        (code, line), caught = _error_line(error), error
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if code:
        if debug and caught is not None:
            traceback.print_exception(caught)
        print(" ".join(line.split()), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
