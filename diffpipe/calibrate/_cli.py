"""The body of ``diffpipe calibrate TRACE.json... [--schedule NAME|CSV] --out machine.toml``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._io import check_output
from ..schedules import Op, from_torch, from_torch_csv
from ._calibration import Calibration
from ._trace import from_torch_trace


def _schedule(name: str, calibration: Calibration) -> Any:
    """``name``: a torch.distributed.pipelining CSV file, or a torch / diffpipe schedule name sized
    like the trace (its ranks, microbatches and stages per rank)."""

    if name.endswith(".csv") or Path(name).is_file():
        return from_torch_csv(name)
    ranks = len(calibration.orders or ())  # one order per rank; a rank may hold several stages
    microbatches = 1 + max(Op.parse(text).microbatch for order in calibration.orders or () for text in order)
    return from_torch(name, ranks, microbatches, max(calibration.stages // max(ranks, 1), 1))


def cli_calibrate(trace: str | os.PathLike | Sequence[str | os.PathLike], schedule: str | None = None,
                  out: str | os.PathLike | None = None) -> Calibration:
    """Calibrate from ``trace`` (one file per rank); with ``schedule``, check the trace ran it and
    time the machine file for it; write the machine file to ``out`` (atomically) when given."""
    if out is not None:
        check_output(out, "--out")
    calibration = from_torch_trace(trace)
    target = None
    if schedule is not None:
        target = _schedule(schedule, calibration)
        calibration = from_torch_trace(trace, target)
    if out is not None:
        calibration.to_toml(out, target)
    return calibration
