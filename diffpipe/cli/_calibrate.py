"""``diffpipe calibrate``: a cost model fitted to torch.profiler traces, its predictions and its
machine file."""

from __future__ import annotations

import argparse
import json

from .._errors import ConfigError
from ._inputs import _model
from ._outputs import _print_json


def _cmd_calibrate(args: argparse.Namespace) -> None:
    from ..calibrate import cli_calibrate
    from ..calibrate._calibration import communication_mode
    from ..calibrate._cli import predictions, report

    model = None
    if args.model is not None or args.hf_config is not None:
        if args.model is not None and args.hf_config is not None:
            raise ConfigError("--model and --hf-config: give one")
        model, _ = _model({"model": args.model} if args.model is not None else {"hf_config": args.hf_config}, ())
    mode = args.mode or "overlap"
    calibration = cli_calibrate(args.trace, args.schedule, args.out, mode=mode, model=model)
    rows = predictions(calibration, args.predict or (), mode=communication_mode(mode))
    if args.json:
        data = json.loads(calibration.to_json())
        if args.predict:
            data["predictions"] = rows
        _print_json(data)
    else:
        print(report(calibration, rows, mode=mode))
    if args.out:
        print(f"wrote {args.out}")
