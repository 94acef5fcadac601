"""The body of ``diffpipe calibrate TRACE.json... [--schedule NAME|CSV] [--predict NAMES] --out machine.toml``:
the calibration, the report of what it fitted and the prediction table."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._errors import ConfigError, ScheduleError
from .._io import check_output
from ..schedules import Op, from_torch, from_torch_csv, get
from ._calibration import Calibration, combine
from ._trace import _load, from_torch_trace


def schedule_like(name: str, calibration: Calibration) -> Any:
    """``name`` sized like the trace (its ranks, microbatches and stages per rank): a
    torch.distributed.pipelining CSV file, a torch schedule name (``from_torch``), or a diffpipe
    family (``get``; also where torch's own order is wrong, as torch 2.13's ``1F1B`` is)."""

    if name.endswith(".csv") or Path(name).is_file():
        return from_torch_csv(name)
    ranks = max(len(calibration.orders or ()), 1)  # one order per rank; a rank may hold several stages
    microbatches = 1 + max(Op.parse(text).microbatch for order in calibration.orders or () for text in order)
    per_rank = max(calibration.stages // ranks, 1)
    try:
        return from_torch(name, ranks, microbatches, per_rank)
    except ScheduleError as error:
        attempts = [{}] if per_rank == 1 else [{"chunks": per_rank}, {}]
        for options in attempts:
            try:
                schedule = get(name, devices=ranks, microbatches=microbatches, **options)
            except (ConfigError, ScheduleError):
                continue
            if schedule.stages == calibration.stages:
                return schedule
        raise error from None


def predictions(calibration: Calibration, names: Sequence[str], *, mode: Any = "overlap",
                weight_fraction: float | None = None) -> list[dict[str, Any]]:
    """One row per name: ``schedule`` (the name), ``step_s`` (the prediction, None where it cannot
    be made) and ``why`` (the reason, else None)."""
    rows = []
    for name in names:
        try:
            schedule = schedule_like(name, calibration)
            step = calibration.predict(schedule, weight_fraction=weight_fraction, mode=mode)
        except (ConfigError, ScheduleError) as error:
            rows.append({"schedule": name, "step_s": None, "why": str(error)})
            continue
        rows.append({"schedule": name, "step_s": step, "why": None})
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1e3 * value:.4g}"


def _with_spread(value: float, spread: float | None, count: int | None, unit: str = "") -> str:
    """``value`` in ms, with its relative spread and sample count where known."""
    extra = [x for x in (f"{100 * spread:.1f}%" if spread is not None else None, f"n={count}" if count else None) if x]
    return _ms(value) + unit + (f" ({', '.join(extra)})" if extra else "")


def report(calibration: Calibration, rows: Sequence[dict[str, Any]] = (), *, mode: Any = "overlap") -> str:
    """What ``diffpipe calibrate`` prints: per stage and kind, the fitted mean (ms), its spread and
    its sample count; the per-op terms; the residual; and the prediction table of ``rows``."""
    c = calibration
    kinds = [k for k in ("F", "B", "I", "W") if getattr(c, {"F": "forward", "B": "backward", "I": "input_grad",
                                                              "W": "weight"}[k])]
    ranks = f", {len(c.orders)} rank(s)" if c.orders else ""
    lines = [f"calibrated {c.stages} stage(s){ranks} from {c.source}"]
    if c.step_time is not None:
        lines[0] += f"; measured step {_ms(c.step_time)} ms"
    lines.append("per stage and kind: mean ms (relative spread, samples)")
    head = ["stage", *(["rank"] if c.stage_ranks else []), *kinds]
    table = [head]
    names = {"F": "forward", "B": "backward", "I": "input_grad", "W": "weight"}
    for s in range(c.stages):
        row = [str(s), *([str(c.stage_ranks[s])] if c.stage_ranks else [])]
        for kind in kinds:
            value = getattr(c, names[kind])[s]
            if value is None:
                row.append("-")
                continue
            row.append(_with_spread(value, c.spread.get(f"{kind}{s}"), c.samples.get(f"{kind}{s}")))
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in table]
    by_kind = ", ".join(f"{k} {_ms(v)}" for k, v in c.overhead_by_kind.items())
    lines.append(f"overhead per op {_ms(c.overhead)} ms" + (f" (by kind: {by_kind})" if by_kind else "")
                 + f"; p2p {_ms(c.p2p)} ms" + (f" (transfer {_ms(c.transfer)} ms)" if c.transfer is not None else "")
                 + f"; setup {_ms(c.setup)} ms; wind-down {_ms(c.wind_down)} ms")
    host = []
    for name, side in (("send_cost", "send"), ("recv_cost", "receive")):
        if getattr(c, name):
            host.append(f"{side} {_with_spread(getattr(c, name), c.spread.get(name), c.samples.get(name), ' ms')}")
    if host:
        lines.append("host time per transfer: " + ", ".join(host))
    between = [f"{k} {100 * c.spread[k]:.1f}%" for k in ("overhead", "p2p", "setup", "wind_down")
               if c.spread.get(k) is not None]
    if between:
        lines.append("spread between runs: " + ", ".join(between))
    if c.backward_split:
        split = ", ".join("-" if r is None else f"{s}: I {100 * r[0]:.0f}% W {100 * r[1]:.0f}%"
                          for s, r in enumerate(c.backward_split))
        lines.append(f"I/W split of the full backward (of B) from {c.split_source}: {split}")
    elif not c.split_known():
        lines.append("no I/W split: schedules with I/W ops cannot be predicted (give --model, or trace a "
                     "zero-bubble schedule)")
    residual = [f"{k} {100 * v:{'+' if k == 'step' else ''}.1f}%" for k, v in c.residual.items()
                if v is not None and math.isfinite(v)]
    if residual:
        lines.append("residual: " + ", ".join(residual))
    if rows:
        lines += ["", f"predicted step ({mode}):"]
        width = max(len(r["schedule"]) for r in rows)
        for r in rows:
            if r["step_s"] is None:
                lines.append(f"  {r['schedule'].ljust(width)}  n/a: {r['why']}")
                continue
            vs = ""
            if c.step_time:
                vs = f"  ({100 * (r['step_s'] - c.step_time) / c.step_time:+.1f}% vs the measured step)"
            lines.append(f"  {r['schedule'].ljust(width)}  {_ms(r['step_s'])} ms{vs}")
    return "\n".join(lines)


def runs_of(files: Sequence[str | os.PathLike]) -> list[list[str | os.PathLike]]:
    """``files`` (one per rank and run, run by run) split into runs: a run ends where a rank repeats."""
    runs: list[list[str | os.PathLike]] = [[]]
    seen: set[Any] = set()
    for path in files:
        info = _load(path).get("distributedInfo")
        rank = info.get("rank", len(runs[-1])) if isinstance(info, dict) else len(runs[-1])
        if rank in seen:
            runs.append([])
            seen = set()
        runs[-1].append(path)
        seen.add(rank)
    return runs


def cli_calibrate(trace: str | os.PathLike | Sequence[str | os.PathLike], schedule: str | None = None,
                  out: str | os.PathLike | None = None, *, mode: Any = "overlap", model: Any = None,
                  probe: Calibration | None = None) -> Calibration:
    """Calibrate from ``trace`` (one file per rank; several runs one after the other, each a file
    per rank, are calibrated each and ``combine``d); with ``schedule`` (one name, or one per run
    comma-separated), check each run ran it; ``model`` or ``probe`` give the I/W split of a
    full-backward trace (``from_torch_trace``); write the machine file (in ``mode``) to ``out``
    (atomically) when given."""
    if out is not None:
        written = os.path.realpath(check_output(out, "--out"))
        inputs = [trace] if isinstance(trace, (str, os.PathLike)) else list(trace)
        if schedule is not None:
            inputs.append(schedule)
        for path in inputs:
            if isinstance(path, (str, os.PathLike)) and os.path.realpath(path) == written:
                raise ConfigError(f"--out: {os.fspath(out)!r} is also an input ({os.fspath(path)!r}); write to "
                                  "another file")
    files = [trace] if isinstance(trace, (str, os.PathLike)) else list(trace)
    runs = runs_of(files) if len(files) > 1 else [files]
    names = [None] * len(runs) if schedule is None else [x.strip() for x in schedule.split(",")]
    if len(names) == 1 and len(runs) > 1:
        names *= len(runs)
    if len(names) != len(runs):
        raise ConfigError(f"--schedule names {len(names)} schedule(s) for {len(runs)} run(s) of traces; give one, "
                          "or one per run")
    calibrations, target = [], None
    for files_of_run, name in zip(runs, names, strict=True):
        calibration = from_torch_trace(files_of_run, model=model, probe=probe)
        if name is not None:
            target = schedule_like(name, calibration)
            calibration = from_torch_trace(files_of_run, target, model=model, probe=probe)
        calibrations.append(calibration)
    calibration = calibrations[0] if len(calibrations) == 1 else combine(calibrations)
    if out is not None:
        calibration.to_toml(out, target if len(calibrations) == 1 else None, mode=mode)
    return calibration
