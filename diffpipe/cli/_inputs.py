"""Flags and TOML files (``--config``) to library objects: the machine, the training configuration and the schedule.

The machine, the training configuration and the schedule are read from one checked file
(``_machine_format``: ``SCHEMA``, ``MachineFile``) through one merge of flags over its keys
(``_merged``), and each refuses the sections and flags of the others (``_training`` a machine's).
The values, each with the flag or file key it came from, become library objects in
``diffpipe._machine_file`` (``machine``) and ``_training_file`` (``configuration``), whose errors name
that origin.
"""


from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import schedules
from .._checks import check_int
from .._choices import FLASH_KERNELS, FLASH_VERSIONS
from .._errors import ConfigError
from .._machine_format import CONFIGURATION_SECTIONS, SCHEMA, MachineFile, read_machine_file
from ._args import (
    _CLUSTER_FLAGS,
    _CLUSTER_SHAPE,
    _PARALLEL_FLAGS,
    _TRAINING_FLAGS,
    DEFAULT_DEVICES,
    DEFAULT_FLASH_ATTENTION,
    DEFAULT_MICROBATCHES,
    DEFAULT_SEQUENCE,
    _family_options,
)
from ._guards import MAX_OPS, OPTIMIZE_STEPS_PER_OP, _guard, _guard_configuration, _guard_schedule

#: The commands that read a training configuration's sections.
_CONFIGURATION_COMMANDS = ("simulate", "compare")


def _load_config(path: str | None, command: str, usable: Iterable[str] | None = None) -> MachineFile:
    """Read and check ``--config`` (``read_machine_file``), with only the sections the command can
    use (default: every section, the configuration ones only for ``simulate`` and ``compare``)."""
    if path is None:
        return MachineFile()
    if usable is None:
        usable = [s for s in SCHEMA if command in _CONFIGURATION_COMMANDS or s not in CONFIGURATION_SECTIONS]
    return read_machine_file(path, usable, user=command, what="--config")


# -- the machine -------------------------------------------------------------------------------------
_TIME_FLAGS = {"forward": "--forward", "backward": "--backward", "weight": "--weight", "p2p": "--p2p"}
_NET_FLAGS = {"intra": "--intra", "inter": "--inter", "devices_per_node": "--devices-per-node", "mode": "--mode"}
#: How the library's machine-file errors name what no given value names, on the command line.
_NAMES = {"times": "--forward/--backward or [times]", "intra": "--intra", "inter": "--inter",
          "devices_per_node": "--devices-per-node"}


def _merged(args: argparse.Namespace, config: MachineFile, section: str,
            flags: dict[str, str]) -> dict[str, tuple[Any, str]]:
    """``key -> (value, origin)``: the file's section, overridden by flags."""
    out = config.given(section)
    for key, flag in flags.items():
        if getattr(args, key, None) is not None:
            out[key] = (getattr(args, key), flag)
    return out


def _machine_flags(args: argparse.Namespace) -> list[str]:
    flags = {**_TIME_FLAGS, **_NET_FLAGS, "device": "--device"}
    return [flag for key, flag in flags.items() if getattr(args, key, None) is not None]


def _machine(args: argparse.Namespace, config: MachineFile) -> Any:
    """The ``FileMachine`` of the machine flags over ``--config``'s sections."""
    from .._machine_file import machine

    dev = _merged(args, config, "device", {})
    if getattr(args, "device", None) is not None:
        dev["preset"] = (args.device, "--device")
    return machine(_merged(args, config, "times", _TIME_FLAGS), config.get("model"), dev,
                   _merged(args, config, "network", _NET_FLAGS), names={**_NAMES, "model": config.where("model")})


def _wants_configuration(args: argparse.Namespace, config: MachineFile) -> bool:
    """Whether the command describes a training configuration (a flag or section of one)."""
    flags = [*_TRAINING_FLAGS, *_PARALLEL_FLAGS, "gpus", "cluster"]
    return any(getattr(args, k, None) is not None for k in flags) or any(
        config.get(s) for s in CONFIGURATION_SECTIONS)


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
    virtual_given: bool = False
    settings: dict[str, Any] = field(default_factory=dict)
    framework: str = "none"

    def build(self, family: str | None = None, options: dict[str, Any] | None = None,
              adapt: bool = False, max_ops: int = MAX_OPS) -> Any:
        """The ``Configuration`` of ``family`` (default the given one), its schedule within
        ``max_ops``; ``adapt``: a family without chunks keeps the stages it places (``virtual`` =
        its stages per device: compare)."""
        from .._training_file import configuration

        return configuration(self.model, self.parallelism, self.cluster, self.global_batch,
                             family=family or self.family, options=self.options if options is None else options,
                             communication=self.communication, framework=self.framework, placed_stages=adapt,
                             check=lambda cfg: _guard_configuration(cfg, max_ops))


def _training(args: argparse.Namespace, config: MachineFile) -> _Training:
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
    train, par, clu, settings = _configuration_values(args, config)
    from .._workload._parallelism import Parallelism

    model, name = _model(train, ("sequence", "microbatch_size", "recompute", "flash_attention", "flash_version"))
    t, p, c = par.get("tensor", 1), par.get("pipeline", 1), par.get("context", 1)
    if "data" not in par:
        if "gpus" in clu and clu["gpus"] % (t * p * c):
            what = "--tp x --pp" if c == 1 else "--tp x --cp x --pp"
            raise ConfigError(f"--gpus {clu['gpus']} is not a multiple of {what} = {t * p * c}")
        par["data"] = clu["gpus"] // (t * p * c) if "gpus" in clu else 1
    parallelism = Parallelism(**par)
    cluster = _cluster(clu, parallelism.gpus)
    mode = args.mode or network.get("mode") or "overlap"
    framework = train.get("framework", "none")
    extra = "".join(f" {k}{v}" for k, v in (("EP", parallelism.expert), ("VPP", parallelism.virtual)) if v > 1)
    if parallelism.etp != parallelism.tensor:
        extra += f" ETP{parallelism.etp}"
    cp = f" CP{parallelism.context}" if parallelism.context > 1 else ""
    label = (f"{name} (s={model.sequence}, b={model.microbatch_size}, {model.recompute} recompute"
             f"{', flash attention' if model.flash_attention else ''}) on {cluster.gpus}x {cluster.device.name}, "
             f"TP{parallelism.tensor}{cp} PP{parallelism.pipeline} DP{parallelism.data}{extra} ZeRO-{parallelism.zero}"
             f"{' SP' if parallelism.sequence_parallel else ''}, global batch {train['global_batch']}"
             f"{'' if framework == 'none' else ', ' + framework}")
    family = getattr(args, "family", None) or section.get("family")
    options = {**section.get("options", {}), **_family_options(args.option)}
    return _Training(model, parallelism, cluster, train["global_batch"], mode, family, options, label,
                     "virtual" in par, settings, framework)


def _configuration_values(args: argparse.Namespace, config: MachineFile) -> tuple[dict, dict, dict, dict]:
    """``[training]``, ``[parallelism]`` and ``[cluster]`` values, flags over the file, with
    ``--cluster GPUSxDEVICE`` folded in; exactly one model and a global batch are required. The
    sequence and flash attention are resolved (``_settings``); the fourth value says where they came from."""
    merged = _merged(args, config, "training", _TRAINING_FLAGS)
    train = {k: v for k, (v, _) in merged.items()}
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
    settings = _settings(train, {k: origin for k, (_, origin) in merged.items()})
    train.update({k: settings[k]["value"] for k in ("sequence", "flash_attention")})
    return train, par, clu, settings


def _longest(train: dict[str, Any]) -> int:
    """The model's longest context: its ``max_position_embeddings`` (a preset's, else the config's)."""
    from .._model._hf import transformer_fields
    from .._model._specs import longest_context

    if "model" in train:
        return longest_context(train["model"])
    return int(transformer_fields(train["hf_config"])["sequence"])


def _settings(train: dict[str, Any], origins: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The sequence, flash attention and its kernel of a training configuration, each with where it came
    from (a flag, a file's key, the framework or ``default``): ``DEFAULT_SEQUENCE`` unless given (``max``: the
    model's longest context), ``DEFAULT_FLASH_ATTENTION`` unless given, the kernel by the library's one
    rule (``_model._transformer.attention_kernel``: the given one, else the framework's, else the default)."""
    out: dict[str, dict[str, Any]] = {}
    sequence = train.get("sequence", DEFAULT_SEQUENCE)
    longest = _longest(train)
    origin = origins.get("sequence", "default")
    if sequence == "max":
        sequence, origin = longest, f"{origin} max: the model's longest context"
    out["sequence"] = {"value": int(sequence), "from": origin, "longest": longest}
    flash = bool(train.get("flash_attention", DEFAULT_FLASH_ATTENTION))
    origin = origins.get("flash_attention", "default")
    if origin == "--flash-attention" and not flash:
        origin = "--no-flash-attention"  # the flag as it was typed
    out["flash_attention"] = {"value": flash, "from": origin}
    from .._model._transformer import attention_kernel
    from .._workload._frameworks import framework

    fw = train.get("framework", "none")
    version, source = attention_kernel(train.get("flash_version"), framework(fw).flash_version)
    origin = {"model": origins.get("flash_version", "default"), "framework": f"--framework {fw}",
              "default": "default"}[source]
    out["flash_kernel"] = {"value": version, "from": origin}
    return out


def _settings_line(settings: dict[str, dict[str, Any]]) -> str:
    """The header line that states the sequence, flash attention and its kernel and where each came from."""
    seq, flash, kernel = settings["sequence"], settings["flash_attention"], settings["flash_kernel"]
    hint = "" if seq["value"] == seq["longest"] else f"; --sequence max: {seq['longest']:,}"
    flash_hint = "; --no-flash-attention: off" if flash["value"] else ""
    line = (f"sequence {seq['value']:,} tokens ({seq['from']}{hint}), flash attention "
            f"{'on' if flash['value'] else 'off'} ({flash['from']}{flash_hint})")
    if flash["value"]:
        others = "|".join(str(v) for v in FLASH_VERSIONS if v != kernel["value"])
        line += (f", kernel {kernel['value']}: {FLASH_KERNELS[kernel['value']]} ({kernel['from']}; "
                 f"--flash-version {others} for the others)")
    return line


def _model(train: dict[str, Any], fields: Sequence[str]) -> tuple[Any, str]:
    """The ``Transformer`` of ``--model`` or ``--hf-config`` with the ``fields`` of ``train`` that
    are given, and a name for it."""
    from .._model import _presets
    from .._model._transformer import Transformer

    given = {k: train[k] for k in fields if k in train}
    if "model" in train:
        return _presets.model(train["model"], **given), train["model"]
    return (Transformer.from_hf_config(train["hf_config"], **given),
            Path(train["hf_config"]).parent.name or train["hf_config"])


def _cluster(clu: dict[str, Any], gpus: int) -> Any:
    """The ``Cluster`` of ``[cluster]`` values (``gpus`` when they give none)."""
    from .._machine._cluster import Cluster

    return Cluster(clu.get("device", "H100"), gpus=clu.get("gpus", gpus), devices_per_node=clu.get("devices_per_node"),
                   intra=clu.get("intra", "nvlink4"), inter=clu.get("inter", "ib-ndr"))


# -- the schedule ------------------------------------------------------------------------------------
def _schedule(args: argparse.Namespace, config: MachineFile) -> Any:
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

    from .._optimize._optimize import optimize

    return inspect.signature(optimize).parameters["steps"].default

