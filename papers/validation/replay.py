"""Replay traced steps: how much of a prediction's error is the model's structure, how much its statistics.

For each case whose traces a study left in ``--work`` (``run.py --work DIR``), each traced step is
replayed on diffpipe's reference evaluator (``schedules._reference.evaluate_network``) twice per
communication mode: once with *that step's own* op times (each op's compute as traced, plus the gap
before it where it did not wait for data, else its kind's calibrated overhead; the step's own setup),
and once with the calibration's per-stage times (what ``Calibration.predict`` uses). Transfers cost the
calibrated ``p2p`` in both. The replay with the step's own times isolates the model's structure
(dependencies, the communication mode): with the right structure it reproduces the traced step up
to the transfer costs. Its difference from the calibrated replay is what the statistic (one time
per stage and kind: ``robust_mean``) costs.

The host time of a transfer (the calibrated ``send_cost`` / ``recv_cost``) is charged as the cost
model charges it. With the calibrated times, each op lasts its kind's overhead, its stage's time and
the host time of the transfers it sends and receives (``Hardware.send_cost``/``recv_cost``), so the
replay is ``Calibration.predict``'s model of the traced schedule. With a step's own times, a gap
before an op that did not wait already holds the posts made in it; an op that waited gets its
kind's overhead (which the calibration measures net of the posts) plus the host time of the
receives it consumes, and a transfer costs ``p2p`` plus the sender's ``send_cost`` (the send is
posted after the producer, inside the next op's gap, not before the data leaves). ``--no-host``
replays without that term (as this script did before it).

Usage::

    python papers/validation/run.py --quick --work /tmp/v       # leaves traces in /tmp/v
    python papers/validation/replay.py /tmp/v                    # one line per case and mode
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# The replay reads the trace parser's per-step records (``_trace.parse``), which have no public form.
from diffpipe.calibrate import (
    _trace,  # noqa: E402
    communication_mode,  # noqa: E402
)
from diffpipe.schedules import Op, evaluate_network  # noqa: E402

MODES = ("torch-runtime", "overlap", "rendezvous")


def replay(paths: list[Path], modes=MODES, *, host: bool = True) -> dict:
    """Per mode, the mean over traced steps of (replayed - traced) / traced with the steps' own op
    times (``own``) and with the calibration's per-stage times (``means``); ``host``: charge the
    calibrated host time of each transfer (module docstring)."""
    out = replayed_steps(paths, modes, host=host)
    return {mode: {label: statistics.mean((p - span) / span for span, p in v) if v else None
                   for label, v in d.items()} for mode, d in out.items()}


def replayed_steps(paths: list[Path], modes=MODES, *, host: bool = True) -> dict:
    """Per mode and label (``own``, ``means``), ``(traced span, replayed step)`` of every traced step
    (seconds; steps with overlapped actions left out)."""
    ranks, _ = _trace.parse(paths)
    cal = _trace.from_torch_trace(paths)
    schedule = _trace.traced_schedule({r: _trace._ops(s[0]) for r, s in ranks.items()}, cal.stage_ranks)
    times = cal.times(schedule)
    kinds = {**{k: cal.overhead for k in "FBIW"}, **cal.overhead_by_kind}
    per_stage = {}
    for s in range(cal.stages):
        per_stage[("F", s)] = times["forward"][s]
        per_stage[("I", s)] = times["input_grad"][s]
        per_stage[("W", s)] = times["weight"][s]
        full = times["full_backward"]
        per_stage[("B", s)] = full[s] if full else times["input_grad"][s] + times["weight"][s]
    sends: dict[Op, int] = {}
    receives: dict[Op, int] = {}
    for producer, consumer in ((dep.op, op) for op in schedule.ops for dep in schedule.dependencies[op]
                               if dep.is_transfer):
        sends[producer] = sends.get(producer, 0) + 1
        receives[consumer] = receives.get(consumer, 0) + 1
    send_cost, recv_cost = (cal.send_cost, cal.recv_cost) if host else (0.0, 0.0)

    def host_time(op: Op) -> float:  # what Hardware charges an op for the transfers it sends and receives
        return send_cost * sends.get(op, 0) + recv_cost * receives.get(op, 0)

    out: dict = {mode: {"own": [], "means": []} for mode in modes}
    n_steps = len(next(iter(ranks.values())))
    for k in range(n_steps):
        steps = [s[k] for s in ranks.values()]
        start = min(s.start for s in steps)
        span = max(s.end for s in steps) - start
        own = {}
        for step in steps:
            previous = None
            for c in step.computes:
                if c.overlapped:
                    break
                op = Op(c.kind, c.stage, c.mb)
                gap = (c.begin - previous.end if previous is not None and not c.waited
                       else kinds[c.kind] + recv_cost * receives.get(op, 0))
                own[op] = gap + (c.end - c.begin)
                previous = c
        if len(own) != len(schedule.ops):
            continue  # overlapped actions: no per-op times
        first = min((c for s in steps for c in s.computes), key=lambda c: c.begin)
        setup = max(first.begin - start - kinds[first.kind], 0.0)
        for mode in modes:
            comm = communication_mode(mode)
            comm = comm if not isinstance(comm, str) else _named(comm)
            for label, duration, first_setup, edge in (
                    ("own", own.__getitem__, setup, cal.p2p + send_cost),
                    ("means", lambda op: kinds[op.kind] + per_stage[(op.kind, op.stage)] + host_time(op), cal.setup,
                     cal.p2p)):
                _, finish, _ = evaluate_network(schedule, duration, lambda op, dep, _e=edge: _e, comm,
                                                setup=first_setup)
                predicted = max(finish.values()) + cal.wind_down
                out[mode][label].append((span, predicted))
    return out


def _named(mode: str):
    from diffpipe import communication

    return communication(mode)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    host = "--no-host" not in args
    args = [a for a in args if a != "--no-host"]
    if len(args) not in (1, 2):
        raise SystemExit("usage: replay.py WORK_DIR [CASE_PREFIX] [--no-host]")
    work = Path(args[0])
    prefix = args[1] if len(args) == 2 else ""
    print("| case | mode | replay error, own op times | replay error, calibrated means |")
    print("|---|---|---|---|")
    for first in sorted(work.glob(f"{prefix}*.r0.rank0.json")):
        key = first.name[: -len(".rank0.json")]
        try:
            result = replay([first, work / f"{key}.rank1.json"], host=host)
        except Exception as error:  # noqa: BLE001  (e.g. Schedule1F1B: no labels)
            reason = str(error).split(": ", 1)[-1]  # without the work directory's path
            print(f"| {key} | - | not replayed: {reason} | |")
            continue
        for mode, r in result.items():
            cells = ["n/a" if v is None else f"{100 * v:+.1f}%" for v in (r["own"], r["means"])]
            print(f"| {key} | {mode} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
