"""Output of the commands: strict JSON, summaries, pictures and staged (all-or-nothing) writes."""


from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _io
from .._errors import ConfigError

if TYPE_CHECKING:
    from .._machine_file import FileMachine

#: Figures of a configuration or plan row -> (the key the command line prints, with its unit; the
#: factor from the library's SI value): GB are 10^9 bytes, percentages of the step or of the peak.
UNIT_KEYS = {"step_time": ("step_time_s", 1.0), "mfu": ("mfu_percent", 100.0),
             "memory_per_gpu": ("memory_per_gpu_gb", 1e-9), "memory": ("memory_gb", 1e-9),
             "capacity": ("capacity_gb", 1e-9), "bubble_ratio": ("bubble_percent", 100.0),
             "communication_share": ("communication_percent", 100.0), "bound": ("bound_s", 1.0),
             "expected_step_time": ("expected_step_time_s", 1.0), "p95_step_time": ("p95_step_time_s", 1.0)}


def _with_units(figures: dict[str, Any]) -> dict[str, Any]:
    """``figures`` (a ``ConfigResult.to_dict()`` or a plan row) with every figure under a key that
    says its unit (``UNIT_KEYS``); other keys as they are; ``usable_gb`` next to ``capacity_gb``."""
    out: dict[str, Any] = {}
    for key, value in figures.items():
        if key not in UNIT_KEYS:
            out[key] = value
            continue
        name, factor = UNIT_KEYS[key]
        if isinstance(value, (list, tuple)):
            out[name] = [None if v is None else float(v) * factor for v in value]
        else:
            out[name] = None if value is None else float(value) * factor
        if key == "capacity" and "headroom" in figures:
            out["usable_gb"] = float(value) * (1.0 - figures["headroom"]) * factor
    return out


def _configuration_summary(cfg: Any, schedule: Any, result: Any, label: str) -> dict[str, Any]:
    """What ``simulate --json`` prints for a training configuration (units in the keys)."""
    par = cfg.parallelism
    return {"family": schedule.family, "options": dict(schedule.options), "machine": label,
            "tensor": par.tensor, "context": par.context, "pipeline": par.pipeline, "data": par.data,
            "expert": par.expert, "expert_tensor": par.etp,
            "virtual": par.virtual, "zero": par.zero, "sequence_parallel": par.sequence_parallel,
            "global_batch": cfg.global_batch, "framework": "none" if cfg.framework is None else cfg.framework.name,
            **_with_units(result.to_dict()),
            "busy_s": [float(x) for x in result.result.busy.tolist()]}  # tolist: no eager indexing


# -- outputs -----------------------------------------------------------------------------------------
def _input_paths(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The files a command reads, by flag (``--config``, ``--torch-csv``, ``--hf-config``)."""
    named = (("--config", "config"), ("--torch-csv", "torch_csv"), ("--hf-config", "hf_config"))
    return [(flag, getattr(args, dest)) for flag, dest in named if isinstance(getattr(args, dest, None), str)]


def _check_outputs(*outputs: tuple[str, str | None, tuple[str, ...] | None],
                   inputs: Sequence[tuple[str, str]] = ()) -> list[tuple[str, Path]]:
    """Check every ``(flag, path, suffixes)`` given before any work: directory exists and is
    writable, target is no directory, suffix allowed, no path named twice, and none is one of the
    command's ``inputs`` (``(flag, path)``: writing it would destroy what was read)."""
    checked: list[tuple[str, Path]] = []
    seen: dict[str, str] = {}
    read = {os.path.realpath(path): flag for flag, path in inputs if path}
    for flag, path, suffixes in outputs:
        if path is None:
            continue
        p = _io.check_output(path, flag)
        if suffixes and p.suffix.lower() not in suffixes:
            raise ConfigError(f"{flag}: cannot write {path!r}: the suffix must be one of {', '.join(suffixes)}")
        key = os.path.realpath(p)
        if key in read:
            raise ConfigError(f"{flag}: {path!r} is also the input of {read[key]}; write to another file")
        if key in seen:
            raise ConfigError(f"{flag}: {path!r} is also the target of {seen[key]}")
        seen[key] = flag
        checked.append((flag, p))
    return checked


def _pictures(args: argparse.Namespace, subject: Any, hw: Any = None, **given: Any) -> list[tuple[str, str, Any]]:
    """``(flag, path, data)`` of the requested Gantt chart and trace (nothing written yet): ``viz.gantt``
    and ``viz.trace`` of ``subject`` (a ``Schedule``, a ``Result`` with ``schedule=``, or a
    ``Configuration`` with its ``evaluation=``) on ``hw``, with the keywords ``given``."""
    out: list[tuple[str, str, Any]] = []
    if getattr(args, "gantt", None):
        from ..viz import gantt
        from ..viz.gantt import DEFAULT_DPI

        fig = gantt(subject, hw, **given)
        fmt = Path(args.gantt).suffix.lower().lstrip(".")
        out.append(("--gantt", args.gantt, lambda tmp: fig.savefig(tmp, format=fmt, dpi=DEFAULT_DPI)))
    if getattr(args, "trace", None):
        from ..viz import trace

        data = trace(subject, hw, **given)
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


def _finite_or_none(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _simulation_summary(schedule: Any, result: Any, machine: FileMachine, hw: Any,
                        headroom: float) -> dict[str, Any]:
    """What ``simulate --json`` prints for a schedule on a machine: ``fits`` is plan's rule (each
    device's peak at most its capacity less ``headroom``: ``fits_memory``), ``capacity_gb`` and
    ``usable_gb`` per device (None where the machine gives no memory)."""
    import numpy as np

    from .._plan._configuration import fits_memory, usable_memory

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
        "communication_bytes": float(result.communication_bytes),
    }
    peaks = np.asarray(result.peak_memory, np.float64)
    capacities = np.broadcast_to(np.asarray(hw.capacity, np.float64), peaks.shape)  # numpy: no compiled op
    out["fits"] = [fits_memory(m, c, headroom) for m, c in zip(peaks, capacities)]
    out["capacity_gb"] = [_finite_or_none(c / 1e9) for c in capacities]
    out["usable_gb"] = [_finite_or_none(usable_memory(c, headroom) / 1e9) for c in capacities]
    out["headroom"] = headroom
    if schedule.steps > 1:
        out["step_period_s"] = [float(x) for x in np.asarray(result.period)]
        out["max_staleness"] = max(result.staleness.values(), default=0)
    return out

