"""``diffpipe sweep``: every combination of families, sizes, options and modes, evaluated exactly."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from .. import schedules
from .._checks import is_int
from .._choices import COMMUNICATION_MODES
from .._errors import ConfigError
from ._args import DEFAULT_DEVICES, DEFAULT_MICROBATCHES, SWEEP_UNITS, _ints, _names, _value
from ._guards import _guard, estimated_ops, family_units
from ._inputs import _load_config, _machine
from ._outputs import _check_outputs, _input_paths, _strict, _write_all


def _cmd_sweep(args: argparse.Namespace) -> None:
    if args.json and args.limit is not None:
        raise ConfigError("--limit sets the rows of the printed table; --json prints every row")
    _check_outputs(("--csv", args.csv, None), ("--json-out", args.json_out, None),
                   ("--markdown-out", args.markdown_out, None), inputs=_input_paths(args))
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
    total = sum(estimated_ops(f, d, n * family_units(f, largest), largest) for f in (families or schedules.names())
                for d in grid_devices for n in grid_micro) * variants
    _guard(f"sweep: the grid ({len(families or schedules.names())} families x {len(grid_devices)} device "
           f"counts x {len(grid_micro)} microbatch counts x {variants} option/mode variants)",
           max(total, max(grid_devices) ** 2), args.max_ops)
    machine = _machine(args, config)
    from .._sweep import sweep

    result = sweep(machine.hardware, families=families, options=options or None,
                   communication=modes or [machine.communication], devices_per_node=machine.devices_per_node,
                   progress=None, **sizes)
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
