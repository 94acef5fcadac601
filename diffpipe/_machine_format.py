"""The machine file's format: its sections and keys, each key's kind (``SCHEMA``), and reading one
checked (``read_machine_file``). The format ``Calibration.to_toml`` writes and ``diffpipe --config``
reads (README, ``examples/machine.toml``, ``examples/llama3-70b.toml``); ``_machine_file`` turns
its values into library objects.

No JAX here: the command line reads and checks a file before anything heavy loads.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from . import _io
from ._checks import is_int, is_number
from ._choices import FRAMEWORK_NAMES, MACHINE_MODES, RECOMPUTE, ZERO_STAGES
from ._errors import ConfigError


def _is_scalar_option(v: Any) -> bool:
    return isinstance(v, (bool, int, float, str))


def _seconds_or_list(v: Any) -> bool:
    def ok(x: Any) -> bool:
        return is_number(x) and math.isfinite(x) and x >= 0

    return ok(v) or (isinstance(v, list) and len(v) > 0 and all(ok(x) for x in v))


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
    "mode": (lambda v: v in MACHINE_MODES, f"one of {', '.join(MACHINE_MODES)}"),
    "options": (lambda v: isinstance(v, dict) and all(_is_scalar_option(x) for x in v.values()),
                "a table of NAME = number, bool or string"),
    "zero": (lambda v: is_int(v) and v in ZERO_STAGES, "a ZeRO stage 0, 1, 2 or 3"),
    "recompute": (lambda v: v in RECOMPUTE, f"one of {', '.join(RECOMPUTE)}"),
    "framework": (lambda v: v in FRAMEWORK_NAMES, f"one of {', '.join(FRAMEWORK_NAMES)}"),
    "sequence": (lambda v: (is_int(v) and v >= 1) or v == "max", "an integer >= 1 or \"max\""),
}


#: section -> key -> kind. Every documented key (README, examples/machine.toml).
SCHEMA: dict[str, dict[str, str]] = {
    "schedule": {"family": "name", "devices": "count", "microbatches": "count", "options": "options"},
    "times": {"forward": "times", "backward": "times", "weight": "times", "update": "times",
              "p2p": "seconds", "overhead": "seconds", "full_backward": "times", "setup": "seconds",
              "wind_down": "seconds", "overhead_F": "seconds", "overhead_B": "seconds", "overhead_I": "seconds",
              "overhead_W": "seconds", "pair_overlap": "shares", "split_known": "bool", "send_cost": "seconds",
              "recv_cost": "seconds"},
    "model": {"layers": "count", "hidden": "count", "heads": "count", "sequence": "count",
              "vocabulary": "count", "microbatch_size": "count", "dtype_bytes": "count",
              "ffn_multiplier": "positive", "recompute": "bool", "tied_embedding": "bool"},
    "device": {"preset": "name", "peak_flops": "positive", "memory": "positive", "efficiency": "fraction"},
    "network": {"intra": "name", "inter": "name", "devices_per_node": "count", "mode": "mode",
                "latency": "seconds", "bandwidth": "bandwidth", "inter_latency": "seconds",
                "inter_bandwidth": "bandwidth"},
    # A whole training configuration (simulate and compare; examples/llama3-70b.toml).
    "training": {"model": "name", "hf_config": "name", "sequence": "sequence", "microbatch_size": "count",
                 "global_batch": "count", "recompute": "recompute", "flash_attention": "bool",
                 "framework": "framework"},
    "parallelism": {"tensor": "count", "pipeline": "count", "data": "count", "expert": "count", "virtual": "count",
                    "zero": "zero", "sequence_parallel": "bool", "context": "count",
                    "expert_tensor": "count"},
    "cluster": {"device": "name", "gpus": "count", "devices_per_node": "count", "intra": "name", "inter": "name"},
}
#: The sections of a machine (per-stage times, or a model on a device over a network).
MACHINE_SECTIONS = ("times", "model", "device", "network")
#: The sections of a training configuration.
CONFIGURATION_SECTIONS = ("training", "parallelism", "cluster")


def _shown(value: Any) -> str:
    """A TOML value as the user wrote it (``"abc"``, ``true``, ``[1, "x"]``)."""
    try:
        return json.dumps(value, default=str)
    except ValueError:
        return repr(value)


@dataclass(frozen=True)
class MachineFile:
    """A checked TOML machine file (``path`` None: no file): its sections, and where each value is."""

    path: str | None = None
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def get(self, section: str) -> dict[str, Any]:
        return dict(self.sections.get(section, {}))

    def where(self, section: str, key: str | None = None) -> str:
        return f"{self.path}: [{section}]" + ("" if key is None else f" {key}")

    def given(self, section: str) -> dict[str, tuple[Any, str]]:
        """``key -> (value, where)`` of ``section``: what ``_machine_file.machine`` reads."""
        return {k: (v, self.where(section, k)) for k, v in self.get(section).items()}


def read_machine_file(path: str | os.PathLike, usable: Iterable[str] | None = None, *, user: str = "a machine",
                      what: str = "machine file") -> MachineFile:
    """Read and check a TOML machine file: UTF-8, known sections and keys, typed values, and only
    the ``usable`` sections (default: every one; ``user`` names who uses them, ``what`` the file,
    in errors); per-stage ``[times]`` exclude ``[model]`` and ``[device]``."""
    text = _io.read_text(path, what)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: malformed TOML: {error}") from None
    usable = tuple(SCHEMA if usable is None else usable)
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
            raise ConfigError(f"{path}: [{section}] cannot be used by '{user}'"
                              f" (it uses {', '.join(f'[{s}]' for s in usable) or 'no sections'})")
    if "times" in data:
        other = [s for s in ("model", "device") if s in data]
        if other:
            raise ConfigError(f"{path}: [times] cannot be combined with [{other[0]}]: give per-stage times "
                              "or a model and device, not both")
    return MachineFile(path, data)


__all__ = ["CONFIGURATION_SECTIONS", "MACHINE_SECTIONS", "SCHEMA", "MachineFile", "read_machine_file"]
