"""``diffpipe optimize``: stages balanced and/or microbatches split by gradient descent, verified
exactly."""

from __future__ import annotations

import argparse
from typing import Any

from .._errors import ConfigError
from .._progress import Progress
from ._inputs import _load_config, _machine, _schedule
from ._outputs import _print_json


def _cmd_optimize(args: argparse.Namespace) -> None:
    if args.batch is not None and args.knob == "stages":
        raise ConfigError("--batch sets the global batch of --knob microbatches/both; --knob stages does not use it")
    config = _load_config(args.config, "optimize", ("schedule", "model", "device", "network"))
    schedule = _schedule(args, config)
    machine = _machine(args, config)
    if machine.model is None:
        raise ConfigError("optimize needs a model (per-layer costs): give [model] in --config or --device/--intra")
    import numpy as np

    from .._optimize._knobs import MicrobatchSplit, StageBalance
    from .._optimize._optimize import optimize
    from .._workload._workload import Workload

    workload = Workload.from_model(machine.model, machine.device, machine.network)
    knobs: list[Any] = []
    if args.knob in ("stages", "both"):
        knobs.append(StageBalance(schedule.stages))
    if args.knob in ("microbatches", "both"):
        batch = machine.model.microbatch_size * schedule.microbatches if args.batch is None else args.batch
        knobs.append(MicrobatchSplit(batch, schedule.microbatches))
    steps = {} if args.steps is None else {"steps": args.steps}
    with Progress("optimize") as bar:
        bar.stage("optimizing (compiling, gradient descent, exact verification)")
        result = optimize(schedule, workload, tuple(knobs) if len(knobs) > 1 else knobs[0], **steps,
                          communication=machine.communication, devices_per_node=machine.devices_per_node)
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
