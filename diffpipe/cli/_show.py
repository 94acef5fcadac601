"""``diffpipe show``: the unit-time table of a schedule."""

from __future__ import annotations

import argparse

from .. import schedules
from ._inputs import _load_config, _schedule
from ._outputs import _print_json


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
