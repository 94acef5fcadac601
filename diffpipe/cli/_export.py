"""``diffpipe export``: a schedule as torch CSV, a Gantt chart or a Perfetto trace."""

from __future__ import annotations

import argparse
from typing import Any

from .._errors import ConfigError
from .._machine_format import MACHINE_SECTIONS
from ._inputs import _load_config, _machine, _machine_flags, _schedule
from ._outputs import _check_outputs, _input_paths, _pictures, _write_all


def _cmd_export(args: argparse.Namespace) -> None:
    from ..schedules import to_torch_csv

    if not (args.csv or args.gantt or args.trace):
        raise ConfigError("export: give --csv, --gantt and/or --trace")
    _check_outputs(("--csv", args.csv, None), ("--gantt", args.gantt, (".png", ".svg")),
                   ("--trace", args.trace, (".json",)), inputs=_input_paths(args))
    pictures = bool(args.gantt or args.trace)
    if not pictures and _machine_flags(args):
        raise ConfigError(f"export: {_machine_flags(args)[0]} is used only with --gantt/--trace")
    usable = ("schedule", *MACHINE_SECTIONS) if pictures else ("schedule",)
    config = _load_config(args.config, "export" if pictures else "export --csv", usable)
    schedule = _schedule(args, config)
    outputs: list[tuple[str, str, Any]] = []
    if args.csv:
        outputs.append(("--csv", args.csv, to_torch_csv(schedule)))
    if pictures:
        machine = _machine(args, config)
        outputs += _pictures(args, schedule, machine.hardware(schedule), communication=machine.communication,
                             devices_per_node=machine.devices_per_node)
    _write_all(outputs)
    for _, path, _ in outputs:
        print(f"wrote {path}")
