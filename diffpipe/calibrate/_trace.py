"""Read ``torch.profiler`` Chrome traces of ``torch.distributed.pipelining`` steps.

torch 2.13 labels the actions of a step with ``record_function``:

- ``_PipelineScheduleRuntime`` (``ScheduleInterleaved1F1B``, ``ScheduleLoopedBFS``,
  ``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV`` and schedules
  loaded from CSV) labels every action ``PP:<action>`` (``PP:1F0``, ``PP:0I3``, ``PP:1RECV_F0``,
  ``PP:0SEND_B2``, ``PP:(0F1;3B0)OVERLAP_F_B``; ``_get_profiler_function_name``). A compute action
  starts by waiting for the data its ``RECV`` action posted, so its compute begins when that
  transfer's ``gloo:recv`` (or ``nccl:recv``) span ends.
- ``ScheduleGPipe`` labels ``Forward <i>`` and ``Backward <i>``; each label posts and waits for its
  receive, computes, then posts its send, so the compute is the part between the last receive span
  and the first ``c10d::send``.
- ``Schedule1F1B`` labels nothing: its trace cannot be read (run it through the runtime instead).

The reader times the host (CPU) timeline, which is where the work runs on a CPU (gloo) run; on a
GPU run the compute runs on CUDA streams (the trace's ``kernel`` events), which it does not read yet.
A receive inside a ``Forward``/``Backward`` label always counts as a wait (its gap is not an
overhead sample). A new step starts where a rank's action label repeats. Timestamps of all ranks share one clock
when the ranks ran on one host; the transfer delay compares two ranks' clocks, so it is measured
only when every trace names the same ``host_name``.
"""

from __future__ import annotations

import bisect
import math
import os
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._checks import is_int, is_number
from .._errors import ConfigError, ScheduleError
from .._io import load_json
from ..schedules import Op, Placement, Schedule
from ._calibration import Calibration, robust_mean, robust_spread

_RUNTIME = re.compile(r"^PP:(\d+)(F|I|W|B|SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD)(\d*)$")
#: torch's per-stage runtime actions (no microbatch): they may repeat within one step.
_STAGE_ACTIONS = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
_OVERLAP = re.compile(r"^PP:\((.*)\)OVERLAP_F_B$")
_SINGLE = re.compile(r"^(Forward|Backward) (\d+)$")
_SUB = re.compile(r"^(\d+)(F|I|W|B)(\d+)$")
#: Events of a P2P operation: the host call posting it, and the backend's span until it completes.
_RECV = re.compile(r"^(c10d::recv_\w*|\w+:recv)$")
_SEND = re.compile(r"^(c10d::send|\w+:send)$")
_POST = ("c10d::recv_", "c10d::send")
_US = 1e-6
#: Seconds within which a receive's completion after its consumer's label start means the data was
#: there before: the backend's span (``gloo:recv``) ends when ``wait()`` returns, not when the data
#: arrived, so a receive whose data came early ends a few tens of microseconds into its consumer's
#: label (the wait call). Only a later end is a wait, and only a wait times the transfer.
WAIT_CALL_S = 1e-4
#: A ``record_function`` label around a whole ``step()`` call (optional): where a trace has one, a
#: step's setup, wind-down and time run from its bounds (the part of ``step()`` before the first
#: action label, splitting the batch into microbatches, and after the last, waiting for the sends,
#: included); else from the first action label's start to the last one's end.
STEP_LABEL = "diffpipe.step"


@dataclass
class _Compute:
    kind: str
    stage: int
    mb: int
    start: float  # label start
    end: float  # compute end
    begin: float  # compute start (after the wait for data)
    waited: bool
    overlapped: bool = False
    subs: tuple[tuple[str, int, int], ...] = ()


@dataclass
class _Recv:
    post: float
    end: float


@dataclass
class _Step:
    computes: list[_Compute] = field(default_factory=list)
    recvs: dict[tuple[str, int, int], _Recv] = field(default_factory=dict)
    #: the host spans of transfers, ``("send" | "recv", start, end)``: torch's ``SEND_*``/``RECV_*``
    #: action labels, or (``ScheduleGPipe``) the ``c10d::send``/``c10d::recv_`` posts in its labels
    host: list[tuple[str, float, float]] = field(default_factory=list)
    start: float = float("inf")
    end: float = float("-inf")
    labels: set[str] = field(default_factory=set)


def _load(path: str | os.PathLike) -> dict[str, Any]:
    data = load_json(path, "trace", "a torch.profiler Chrome trace")
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ConfigError(f"{path}: not a torch.profiler Chrome trace (no traceEvents list)")
    return data


def _read(name: str) -> bool:
    """Whether the reader uses events of this name (action labels, P2P spans, the step label)."""
    return bool(_RUNTIME.match(name) or _OVERLAP.match(name) or _SINGLE.match(name) or _RECV.match(name)
                or _SEND.match(name) or name == STEP_LABEL)


def _spans(path: Any, events: list[Any]) -> list[tuple[float, float, str, Any]]:
    """Complete events as ``(start, end, name, thread)`` in seconds, sorted by start. An event the
    reader uses must have a finite ``ts`` and a finite ``dur >= 0`` (JSON numbers); others are
    skipped when unreadable."""
    out = []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name = str(e.get("name", ""))
        if _read(name):
            ts, dur = e.get("ts"), e.get("dur", 0.0)
            for key, value in (("ts", ts), ("dur", dur)):
                if not is_number(value) or not math.isfinite(value) or (key == "dur" and value < 0):
                    want = "a finite number >= 0" if key == "dur" else "a finite number"
                    raise ConfigError(f"{path}: traceEvents[{i}] ({name[:40]!r}): {key} must be {want} "
                                      f"(microseconds), got {value!r}")
            ts, dur = float(ts), float(dur)
        else:
            try:
                ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
            except (KeyError, TypeError, ValueError):
                continue
        out.append((ts * _US, (ts + dur) * _US, name, (e.get("pid"), e.get("tid"))))
    out.sort(key=lambda x: (x[0], -x[1]))
    return out


class _Threads:
    """Spans by thread, for the spans of one thread that start inside an interval."""

    def __init__(self, spans) -> None:
        self._by: dict[Any, list] = defaultdict(list)
        for span in spans:
            self._by[span[3]].append(span)
        self._starts = {thread: [s[0] for s in group] for thread, group in self._by.items()}

    def inside(self, start: float, end: float, thread) -> list[tuple[float, float, str, Any]]:
        starts = self._starts.get(thread, [])
        return self._by[thread][bisect.bisect_left(starts, start):bisect.bisect_right(starts, end)] if starts else []


def _rank_steps(path, spans, rank: int) -> list[_Step]:
    """One rank's steps: its compute ops (with the wait for data taken out) and its receives."""
    labels = [s for s in spans if _RUNTIME.match(s[2]) or _OVERLAP.match(s[2]) or _SINGLE.match(s[2])]
    comms = _Threads(s for s in spans if _RECV.match(s[2]) or _SEND.match(s[2]))
    steps: list[_Step] = []
    step = None
    # A step ends where a label repeats. torch's per-stage actions (no microbatch) may run more
    # than once in a step (LoopedBFS with 4 stages per rank unshards stage 0 before its forwards
    # and again before its backwards), so they do not end one: an UNSHARD belongs to the step of
    # the label after it, a RESHARD or REDUCE_GRAD to the step before it.
    unshards: list[tuple[float, float]] = []
    for start, end, name, thread in labels:
        action = _RUNTIME.match(name)
        if action and action[2] == "UNSHARD":
            unshards.append((start, end))
            continue
        if step is None or (name in step.labels and not (action and action[2] in _STAGE_ACTIONS)):
            step = _Step()
            steps.append(step)
        for begin, finish in unshards:
            step.start, step.end = min(step.start, begin), max(step.end, finish)
        unshards.clear()
        step.labels.add(name)
        step.start, step.end = min(step.start, start), max(step.end, end)
        inner = comms.inside(start, end, thread)
        runtime = _RUNTIME.match(name)
        if runtime:
            stage, kind, mb = int(runtime[1]), runtime[2], int(runtime[3] or -1)
            if kind in ("SEND_F", "SEND_B", "RECV_F", "RECV_B"):
                step.host.append(("send" if kind.startswith("SEND") else "recv", start, end))
            if kind in ("RECV_F", "RECV_B"):
                posts = [s[0] for s in inner if s[2] in _POST]
                ends = [s[1] for s in inner if _RECV.match(s[2])]
                step.recvs[(kind[-1], stage, mb)] = _Recv(min(posts, default=start), max(ends, default=end))
            elif kind in ("F", "B", "I", "W"):
                recv = step.recvs.get(("F" if kind == "F" else "B", stage, mb)) if kind != "W" else None
                begin = max(start, recv.end) if recv else start
                waited = recv is not None and recv.end > start + WAIT_CALL_S
                step.computes.append(_Compute(kind, stage, mb, start, end, min(begin, end), waited))
            continue
        overlap = _OVERLAP.match(name)
        if overlap:
            subs = []
            for text in overlap[1].split(";"):
                sub = _SUB.match(text.strip())
                if not sub:
                    raise ConfigError(f"{path}: rank {rank}: cannot read overlapped action {text!r} in {name!r}")
                subs.append((sub[2], int(sub[1]), int(sub[3])))
            kind, stage, mb = subs[0]
            step.computes.append(_Compute(kind, stage, mb, start, end, start, False, True, tuple(subs)))
            continue
        single = _SINGLE.match(name)
        if single is None:
            continue
        kind, mb = ("F" if single[1] == "Forward" else "B"), int(single[2])
        recv_ends = [s[1] for s in inner if _RECV.match(s[2])]
        send_posts = [s[0] for s in inner if s[2] == "c10d::send"]
        step.host += [("send" if s[2] == "c10d::send" else "recv", s[0], s[1]) for s in inner if s[2] in _POST]
        if recv_ends:
            posts = [s[0] for s in inner if s[2] in _POST and _RECV.match(s[2])]
            step.recvs[(kind, rank, mb)] = _Recv(min(posts, default=start), max(recv_ends))
        begin = max([start, *recv_ends])
        finish = min([end, *[p for p in send_posts if p >= begin]])
        step.computes.append(_Compute(kind, rank, mb, start, finish, min(begin, finish), begin > start))
    if step is not None:
        for begin, finish in unshards:  # unshards after the last step's last label
            step.start, step.end = min(step.start, begin), max(step.end, finish)
    bounds = [(start, end) for start, end, name, _ in spans if name == STEP_LABEL]
    for step in steps:  # a step label around the step: its bounds are the step's
        around = [b for b in bounds if b[0] <= step.start and step.end <= b[1]]
        if around:
            step.start, step.end = min(around, key=lambda b: b[1] - b[0])
    return steps


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _ops(step: _Step) -> tuple[str, ...]:
    out = []
    for c in step.computes:
        for kind, stage, mb in c.subs or ((c.kind, c.stage, c.mb),):
            out.append(f"{stage}{kind}{mb}")
    return tuple(out)


def parse(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> tuple[dict[int, list[_Step]], bool]:
    """Every rank's steps, keyed by rank (checks the trace covers every rank of its world), and
    whether all ranks ran on one host (one clock)."""
    if isinstance(paths, (str, os.PathLike)):
        files = [paths]
    elif isinstance(paths, (list, tuple)) and all(isinstance(p, (str, os.PathLike)) for p in paths):
        files = list(paths)
    else:
        raise ConfigError(f"trace: paths must be a file path or a list of them, got {paths!r}"[:200])
    if not files:
        raise ConfigError("trace: no trace files given")
    ranks: dict[int, list[_Step]] = {}
    hosts: set[Any] = set()
    world = None
    for index, path in enumerate(files):
        data = _load(path)
        info = data.get("distributedInfo")
        if not isinstance(info, dict):
            info = {}
        rank = info.get("rank", index)
        if not is_int(rank) or rank < 0:
            raise ConfigError(f"{path}: distributedInfo.rank is {rank!r}, expected an int >= 0")
        size = info.get("world_size")
        if size is not None:
            if not is_int(size) or size < 1:
                raise ConfigError(f"{path}: distributedInfo.world_size is {size!r}, expected an int >= 1")
            if world is not None and size != world:
                raise ConfigError(f"{path}: distributedInfo.world_size is {size}, another trace's is {world}")
            if rank >= size:
                raise ConfigError(f"{path}: distributedInfo.rank {rank} is outside world_size {size}")
            world = size
        if rank in ranks:
            raise ConfigError(f"{path}: a second trace of rank {rank} (give one trace file per rank)")
        steps = _rank_steps(path, _spans(path, data["traceEvents"]), rank)
        if not steps or not any(s.computes for s in steps):
            raise ConfigError(
                f"{path}: no torch.distributed.pipelining action labels ('PP:<action>' or 'Forward <i>'/"
                "'Backward <i>'); torch 2.13's Schedule1F1B labels none, run it through _PipelineScheduleRuntime"
            )
        ranks[rank] = steps
        hosts.add(data.get("host_name"))
    if world is not None and max(ranks) >= world:
        raise ConfigError(f"trace: rank {max(ranks)} is outside world_size {world}")
    size = world if world is not None else max(ranks) + 1
    if size != len(ranks):  # the ranks are distinct and below size: one is missing (found in len(ranks) steps)
        missing = next(r for r in range(len(ranks) + 1) if r not in ranks)
        shown = sorted(ranks)[:8]
        raise ConfigError(f"trace: covers rank(s) {shown}{' ...' if len(ranks) > 8 else ''} of {size}; no trace of "
                          f"rank {missing} (give one trace file per rank)")
    counts = {r: len(s) for r, s in ranks.items()}
    if len(set(counts.values())) != 1:
        raise ConfigError(f"trace: ranks ran different numbers of steps: {counts}")
    for r, steps in ranks.items():
        for k, step in enumerate(steps[1:], start=1):
            if _ops(step) != _ops(steps[0]):
                raise ConfigError(f"trace: rank {r} ran a different op order in step {k} than in step 0 "
                                  "(a step cut off by the profiler?)")
    return dict(sorted(ranks.items())), len(hosts) == 1 and None not in hosts


def _check_schedule(schedule: Any, orders: dict[int, tuple[str, ...]]) -> None:
    if schedule.devices != len(orders):
        raise ConfigError(f"trace: covers {len(orders)} rank(s), the schedule has {schedule.devices} devices")
    for rank, order in orders.items():
        expected = tuple(str(op) for op in schedule.orders[rank] if op.kind in ("F", "B", "I", "W"))
        if order != expected:
            at = next((i for i, (a, b) in enumerate(zip(order, expected, strict=False)) if a != b),
                      min(len(order), len(expected)))
            got = order[at] if at < len(order) else "the end"
            want = expected[at] if at < len(expected) else "the end"
            raise ConfigError(f"trace: rank {rank} ran {got} at position {at} where the schedule has {want}")


def traced_schedule(orders: dict[int, tuple[str, ...]], stage_ranks: Sequence[int]) -> Any:
    """The schedule the trace ran (its placement and orders), as a ``diffpipe`` ``Schedule``."""

    ops = tuple(tuple(Op.parse(text) for text in order) for order in orders.values())
    microbatches = 1 + max(op.microbatch for order in ops for op in order)
    return Schedule(Placement(len(orders), (tuple(stage_ranks),)), ops, microbatches, options=(("traced", True),))


def from_torch_trace(paths: str | os.PathLike | Sequence[str | os.PathLike], schedule: Any = None, *,
                     model: Any = None, layers_per_stage: Sequence[int] | None = None,
                     probe: Calibration | None = None) -> Calibration:
    """A ``Calibration`` from ``torch.profiler`` Chrome traces of pipelined steps (one file per rank).

    Per stage and kind, the mean compute time over microbatches and steps (``robust_mean``: gross
    outliers dropped); the overhead is the mean gap between consecutive compute ops of a rank where
    the second did not wait for data (per kind of the second op: ``overhead_by_kind``), less the
    host time of the transfers posted in the gap: that is ``send_cost`` / ``recv_cost``, the mean
    host time of one send / receive (torch's ``SEND_*``/``RECV_*`` action labels; in
    ``ScheduleGPipe``'s labels the ``c10d::send``/``c10d::recv_`` posts), which the cost model
    charges to the op that sends / receives each transfer; the transfer delay is the mean time
    (a plain mean: its slow tail is time the step pays) from a producing op's end to its data's
    arrival at a receiver that had posted its receive before and was waiting for it
    (``WAIT_CALL_S``), and ``p2p`` that delay less the overhead and
    the two host times;
    ``setup``/``wind_down`` the medians over steps (``setup``: from the step's start to its first
    compute, less that op's kind's overhead).
    ``schedule`` (a diffpipe ``Schedule``), when given, must be what every rank ran.
    ``model`` (a ``Transformer``, its blocks split as ``layers_per_stage`` or evenly) or ``probe``
    (a ``profile_stages`` calibration of the same stages) gives the ``I``/``W`` split of a trace
    that ran full backwards (``Calibration.with_split``), so split schedules can be predicted.
    """

    if schedule is not None and not isinstance(schedule, Schedule):
        raise ConfigError(f"from_torch_trace: schedule must be a diffpipe Schedule (schedules.get(...), "
                          f"from_torch(...)) or None, got {schedule!r}")
    ranks, one_clock = parse(paths)
    orders = {r: _ops(steps[0]) for r, steps in ranks.items()}
    stage_ranks: dict[int, int] = {}
    for r, order in orders.items():
        for text in order:
            stage = Op.parse(text).stage
            if stage_ranks.setdefault(stage, r) != r:
                raise ConfigError(f"trace: stage {stage} ran on ranks {stage_ranks[stage]} and {r}")
    n_stages = max(stage_ranks) + 1
    if n_stages != len(stage_ranks):  # found without counting to a stage number the trace may inflate
        missing = next(s for s in range(len(stage_ranks) + 1) if s not in stage_ranks)
        raise ConfigError(f"trace: no compute op of stage {missing} (of {n_stages}) in any rank's trace")
    # a microbatch number past the ops of a step names microbatches the trace never ran (sizes
    # built from it, such as the traced schedule's, stay bounded by the trace itself)
    ops = [Op.parse(text) for order in orders.values() for text in order]
    top = max(ops, key=lambda op: op.microbatch)
    if top.microbatch >= len(ops):
        raise ConfigError(f"trace: action {str(top)[:40]!r} names microbatch {top.microbatch}, but a step holds only "
                          f"{len(ops)} compute ops (microbatches are numbered from 0)")
    if schedule is not None:
        _check_schedule(schedule, orders)

    durations: dict[tuple[str, int], list[float]] = defaultdict(list)
    gaps: list[float] = []
    gaps_by_kind: dict[str, list[float]] = defaultdict(list)
    host: dict[str, list[float]] = {"send": [], "recv": []}
    for steps in ranks.values():
        for step in steps:
            for side, start, end in step.host:
                host[side].append(end - start)
            spans = sorted((start, end) for _, start, end in step.host)
            starts = [start for start, _ in spans]
            previous = None
            for c in step.computes:
                if not c.overlapped:
                    durations[(c.kind, c.stage)].append(c.end - c.begin)
                if previous is not None and not c.waited and not c.overlapped and not previous.overlapped:
                    # the gap less the host time of the transfers posted in it (their own terms)
                    inside = spans[bisect.bisect_left(starts, previous.end):bisect.bisect_left(starts, c.begin)]
                    gap = c.begin - previous.end - sum(min(end, c.begin) - start for start, end in inside)
                    gaps.append(gap)
                    gaps_by_kind[c.kind].append(gap)
                previous = c
    overhead = max(robust_mean(gaps) or 0.0, 0.0)
    # plain means, not robust ones: the gaps above lost every span's whole time, so the terms
    # must give it all back (a send the gloo thread held for milliseconds is time the rank spent)
    send_cost, recv_cost = (statistics.fmean(host[side]) if host[side] else 0.0 for side in ("send", "recv"))

    transfers: list[float] = []
    n_steps = len(next(iter(ranks.values())))
    for k in range(n_steps):
        produced = {(c.kind, c.stage, c.mb): c.end for steps in ranks.values() for c in [*steps[k].computes]
                    if not c.overlapped}
        for steps in ranks.values():
            waited = {(c.kind, c.stage, c.mb) for c in steps[k].computes if c.waited}
            for (direction, stage, mb), recv in steps[k].recvs.items():
                source = stage - 1 if direction == "F" else stage + 1
                kinds = ("F",) if direction == "F" else ("B", "I")
                end = next((produced[(kind, source, mb)] for kind in kinds if (kind, source, mb) in produced), None)
                # timed only where the receive was posted before the data was sent and the consumer
                # waited for it (else the span's end is the wait call, not the arrival)
                if end is not None and recv.post <= end and any((kind, stage, mb) in waited for kind in kinds):
                    transfers.append(recv.end - end)
    # a plain mean, not a fenced one: the slow transfers are real (1.5-6 ms when both ranks send at
    # once, papers/validation/README.md "When gloo's transfers complete"), and a step pays them
    transfer = (statistics.fmean(transfers) if transfers else None) if one_clock else None
    p2p = max((transfer or 0.0) - overhead - send_cost - recv_cost, 0.0)

    overhead_by_kind = {kind: max(robust_mean(v) or 0.0, 0.0) for kind, v in sorted(gaps_by_kind.items())}
    setups, winds, spans = [], [], []
    for k in range(n_steps):
        steps = [s[k] for s in ranks.values()]
        start, end = min(s.start for s in steps), max(s.end for s in steps)
        first = min((c for s in steps for c in s.computes), key=lambda c: c.begin)
        last = max(c.end for s in steps for c in s.computes)
        # the model's first op starts at setup and computes after its kind's overhead
        setups.append(max(first.begin - start - overhead_by_kind.get(first.kind, overhead), 0.0))
        winds.append(max(end - last, 0.0))
        spans.append(end - start)

    def per_stage(kind: str) -> tuple[float | None, ...] | None:
        values = tuple(robust_mean(durations.get((kind, s), [])) for s in range(n_stages))
        return None if all(v is None for v in values) else values

    forward = per_stage("F")
    if forward is None or any(v is None for v in forward):
        raise ConfigError("trace: a stage has no forward op outside overlapped actions; cannot time forward")
    ranks_of_stages = tuple(stage_ranks[s] for s in range(n_stages))
    step_time = statistics.median(spans)
    deviations = [abs(d - statistics.median(ds)) / statistics.median(ds)
                  for ds in durations.values() for d in ds if statistics.median(ds) > 0]
    calibration = Calibration(
        forward=tuple(float(v) for v in forward if v is not None), backward=per_stage("B"),
        input_grad=per_stage("I"), weight=per_stage("W"),
        overhead=overhead,
        overhead_by_kind=overhead_by_kind,
        p2p=p2p, transfer=transfer, setup=statistics.median(setups),
        wind_down=statistics.median(winds), step_time=step_time, stage_ranks=ranks_of_stages,
        orders=tuple(orders.values()),
        send_cost=send_cost, recv_cost=recv_cost,
        samples={**{f"{kind}{stage}": len(ds) for (kind, stage), ds in sorted(durations.items())},
                 **{f"{side}_cost": len(values) for side, values in host.items() if values}},
        spread={**{f"{kind}{stage}": robust_spread(ds) for (kind, stage), ds in sorted(durations.items())},
                **{f"{side}_cost": statistics.stdev(values) / statistics.fmean(values)
                   for side, values in host.items() if len(values) > 1 and statistics.fmean(values) > 0}},
        residual={"durations": _median(deviations)},
        source=", ".join(str(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)),
    )
    if model is not None or probe is not None:
        calibration = calibration.with_split(model=model, layers_per_stage=layers_per_stage, probe=probe)
    try:  # the fit's residual on the step it was taken from (when the trace holds a whole schedule)
        traced = schedule if schedule is not None else traced_schedule(orders, ranks_of_stages)
        predicted = calibration.predict(traced)
    except (ConfigError, ScheduleError):
        return replace(calibration, residual={**calibration.residual, "step": None})
    residual = {**calibration.residual, "step": (predicted - step_time) / step_time}
    return replace(calibration, residual=residual)
