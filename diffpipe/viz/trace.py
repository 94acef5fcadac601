"""Chrome trace JSON of a simulated step, for Perfetto (ui.perfetto.dev) or chrome://tracing.

Format: the Trace Event Format (Google, "Trace Event Format", the JSON object form with
``traceEvents``). Process 0 ("devices") has one thread (track) per device, process 1 ("links")
one per link lane; every op and every timed transfer is a complete event (``ph: "X"``) with its
real start ``ts`` and duration ``dur`` in microseconds; each cross-device transfer is also a flow
(``ph: "s"`` inside the producing op on the sender's track, ``ph: "f"`` with ``bp: "e"`` inside
the consuming op on the receiver's track), which Perfetto draws as an arrow from send to receive.
With ``gradient_sync=True`` process 0 also has a sync track per device (``device d sync``, tid
``devices + d``, sorted right under its device's track) holding the all-reduce ``R`` of each stage
the device holds (category ``R``), and the optimizer steps ``U`` (category ``U``) sit on the device
tracks; both carry the simulated start and duration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._io import dumps_json, write_atomic
from .._plan._configuration import ConfigResult, Configuration
from ._timeline import Timeline, check_paths, configuration_step, timeline

#: Seconds to trace microseconds.
US = 1e6
DEVICES_PID, LINKS_PID = 0, 1


def _name(op: Any) -> str:
    return f"{op.kind}{op.microbatch}" + "'" * op.pipeline


def events(tl: Timeline) -> list[dict[str, Any]]:
    """The trace events of ``tl`` (metadata, complete events, flows), sorted by time."""
    s = tl.schedule
    meta: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": DEVICES_PID, "tid": 0, "args": {"name": "devices"}},
        {"name": "process_sort_index", "ph": "M", "pid": DEVICES_PID, "tid": 0, "args": {"sort_index": 0}},
    ]
    sync_tid = {d: s.devices + d for d in tl.sync_devices}
    for d in range(s.devices):
        meta.append({"name": "thread_name", "ph": "M", "pid": DEVICES_PID, "tid": d, "args": {"name": f"device {d}"}})
        order = 2 * d if sync_tid else d  # a device's sync track right under its compute track
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": DEVICES_PID, "tid": d,
                     "args": {"sort_index": order}})
    for d, tid in sync_tid.items():
        meta.append({"name": "thread_name", "ph": "M", "pid": DEVICES_PID, "tid": tid,
                     "args": {"name": f"device {d} sync"}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": DEVICES_PID, "tid": tid,
                     "args": {"sort_index": 2 * d + 1}})
    lane_tid = {lane: i for i, lane in enumerate(tl.lanes)}
    if tl.lanes:
        meta.append({"name": "process_name", "ph": "M", "pid": LINKS_PID, "tid": 0, "args": {"name": "links"}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": LINKS_PID, "tid": 0, "args": {"sort_index": 1}})
        for lane, tid in lane_tid.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": LINKS_PID, "tid": tid, "args": {"name": lane}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": LINKS_PID, "tid": tid,
                         "args": {"sort_index": tid}})

    timed: list[dict[str, Any]] = []
    mid: dict[Any, float] = {}
    for i, op in enumerate(tl.ops):
        ts, dur = tl.start[i] * US, (tl.finish[i] - tl.start[i]) * US
        mid[op] = ts + dur / 2
        args = {"stage": op.stage, "microbatch": op.microbatch, "pipeline": op.pipeline}
        for d in s.devices_of(op):
            timed.append({"name": _name(op), "cat": op.kind, "ph": "X", "ts": ts, "dur": dur,
                          "pid": DEVICES_PID, "tid": d, "args": args})
    for op in tl.syncs:
        ts, dur = op.start * US, (op.finish - op.start) * US
        args = {"stage": op.stage, "pipeline": op.pipeline, "devices": list(op.devices)}
        for d in op.devices:
            timed.append({"name": f"{op.kind} stage {op.stage}" + "'" * op.pipeline, "cat": op.kind, "ph": "X",
                          "ts": ts, "dur": dur, "pid": DEVICES_PID,
                          "tid": sync_tid[d] if op.kind == "R" else d, "args": args})
    for n, t in enumerate(tl.transfers):
        label = f"{t.kind} {_name(t.producer)}→{_name(t.consumer)}"
        if t.start is not None and t.lane in lane_tid:
            timed.append({"name": label, "cat": "transfer", "ph": "X", "ts": t.start * US,
                          "dur": (t.finish - t.start) * US, "pid": LINKS_PID, "tid": lane_tid[t.lane],
                          "args": {"src": t.src, "dst": t.dst, "kind": t.kind}})
        # Flow ends sit strictly inside their ops (the midpoints) so each binds to that op's slice.
        timed.append({"name": label, "cat": "transfer", "ph": "s", "id": n, "ts": mid[t.producer],
                      "pid": DEVICES_PID, "tid": t.src})
        timed.append({"name": label, "cat": "transfer", "ph": "f", "bp": "e", "id": n, "ts": mid[t.consumer],
                      "pid": DEVICES_PID, "tid": t.dst})
    _disjoint([e for e in timed if e["ph"] == "X"])
    timed.sort(key=lambda e: (e["ts"], e["pid"], e["tid"]))
    return meta + timed


def _disjoint(slices: list[dict[str, Any]]) -> None:
    """Make each track's slices disjoint: float32 times can let an op start a few nanoseconds
    before its predecessor on the device ends, which a trace viewer would draw as bad nesting."""
    last_end: dict[tuple[int, int], float] = {}
    for e in sorted(slices, key=lambda e: (e["pid"], e["tid"], e["ts"], e["dur"])):
        track = (e["pid"], e["tid"])
        end = e["ts"] + e["dur"]
        if e["ts"] < last_end.get(track, -float("inf")):
            e["ts"] = last_end[track]
            e["dur"] = max(0.0, end - e["ts"])
        last_end[track] = max(last_end.get(track, -float("inf")), e["ts"] + e["dur"])


def trace(
    result_or_schedule: Any,
    hw: Any = None,
    *,
    path: str | Path | None = None,
    schedule: Any = None,
    gradient_sync: bool = False,
    evaluation: ConfigResult | None = None,
    communication: Any = None,
    devices_per_node: int | None = None,
) -> dict[str, Any]:
    """A Chrome/Perfetto trace of one simulated step.

    Args:
        result_or_schedule: a ``Schedule`` (simulated on ``hw``), a ``Result`` (pass ``schedule=``) or
            a ``Configuration``: its step (``Configuration.evaluate()``) on its own schedule and
            hardware, with its gradient sync; then give none of ``hw``, ``schedule``, ``gradient_sync``,
            ``communication``, ``devices_per_node``.
        hw: the ``Hardware`` (default for a schedule: unit times, F = 1 s, B = 2 s). Link tracks
            appear when it times transfers.
        path: where to write the JSON (``.json``); written to a temporary file and renamed, so an
            error leaves nothing behind. None: only return it.
        gradient_sync: simulate (or, for a ``Result``, expect: pass ``hw``) the step with the
            data-parallel gradient sync (``simulate``'s flag) and trace its ``R`` on a sync track
            per device and its ``U`` on the device tracks.
        evaluation: with a ``Configuration``, its ``ConfigResult`` already evaluated; default:
            ``configuration.evaluate()``.
        communication: the mode the schedule is compiled under (as ``gantt``'s).
        devices_per_node: the topology it is compiled for (as ``gantt``'s).

    Returns:
        The trace as a dict: ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.
    """
    paths = None if path is None else check_paths(path, (".json",), "trace")
    if isinstance(result_or_schedule, Configuration):
        cfg = result_or_schedule
        evaluation, schedule, hw = configuration_step(cfg, evaluation, "trace", hw=hw, schedule=schedule,
                                                      gradient_sync=gradient_sync, communication=communication,
                                                      devices_per_node=devices_per_node)
        result_or_schedule, gradient_sync = evaluation.result, evaluation.gradient_sync
        communication, devices_per_node = cfg.communication, cfg.placement.stages_per_node
    elif evaluation is not None:
        raise ConfigError("trace: evaluation= goes with a Configuration (its ConfigResult)")
    tl = timeline(result_or_schedule, hw, schedule=schedule, gradient_sync=gradient_sync,
                  communication=communication, devices_per_node=devices_per_node)
    s = tl.schedule
    data = {
        "traceEvents": events(tl),
        "displayTimeUnit": "ms",
        "otherData": {"family": s.family, "devices": s.devices, "stages": s.stages,
                      "microbatches": s.microbatches, "communication": tl.communication,
                      "gradient_sync": gradient_sync, "makespan_us": tl.makespan * US},
    }
    text = dumps_json(data, indent=None)  # strict JSON: an undefined number is null
    for p in paths or ():
        write_atomic(p, text, "trace")
    return data
