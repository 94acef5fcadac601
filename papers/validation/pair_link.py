"""Colliding sends: does a pair link shared by both directions (half-duplex) predict them?

gloo's TCP transport keeps one socket per pair of ranks and one mutex per pair (``Pair::m_``,
facebookincubator/gloo ``gloo/transport/tcp/pair.cc`` at 01e2c26): ``Pair::send`` holds it while
it writes a payload in place from the calling thread (``sendUnboundBuffer`` -> ``sendAsyncMode``,
when the peer's receive is already posted), and the device thread holds it while it reads
(``handleEvents``, which skips until the next tick when it cannot take it); outgoing ops of a
pair queue in one FIFO (``tx_``). torch's ``ProcessGroupGloo`` sends and receives through gloo's
``UnboundBuffer`` (``SendWork`` / ``RecvWork``, ``torch/csrc/distributed/c10d/ProcessGroupGloo.hpp``).
So the two directions of a pair may be handled one at a time. This script tests that as a
communication mode on the 23:52 run's traces (a re-analysis: nothing runs torch):

- ``TorchRuntimeHalfDuplex``: ``torch-runtime`` (a transfer starts when its producer has ended and
  torch's runtime has posted its receive) and, as ``contention`` does for one direction, each
  unordered pair of devices carries one transfer at a time, both directions in one issue order
  (``transfer_order``); a transfer's time on it is the calibration's ``p2p``.
- ``TorchRuntimeDirected``: the control, one lane per direction (``contention``'s links).
- the half-duplex mode priced from the arrivals that met no send the other way (``transfers.py``'s
  ``collisions``): the pair link should then add what collisions cost, not the calibrated mean.

- held sends, a two-pass term on the reference evaluator (what the traces show instead: a slow
  transfer that met a send the other way held its *sender* in its ``isend``): pass 1 prices the
  target in ``torch-runtime`` with the send cost and transfer delay of the source's sends and
  arrivals that met nothing; every send that pass 1 puts within ``transfers.MEET_S`` of a send the
  other way then holds its producer for the source's mean extra send time of such sends
  (``held_terms``), and pass 2 prices the target again.

The modes and the term live here, not in ``diffpipe``: on these traces none made every group better
(``README.md``, "Colliding sends"). Usage::

    python papers/validation/pair_link.py /tmp/diffpipe-validation
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402
import transfers  # noqa: E402

from diffpipe import AbstractLaneCommunication  # noqa: E402
from diffpipe.calibrate import (  # noqa: E402
    TorchRuntime,
    _trace,  # the trace parser's per-step records (``_trace.parse``) have no public form: research plumbing
)
from diffpipe.schedules import evaluate_network  # noqa: E402

#: ``(waiter, waited)`` pairs chaining each lane's transfers in issue order.
_lanes = AbstractLaneCommunication.lane_waits


class TorchRuntimeHalfDuplex(TorchRuntime):
    """``torch-runtime`` with one lane per unordered pair of devices (both directions share it)."""

    name = "torch-runtime + half-duplex pair"

    def waits(self, schedule, devices_per_node):
        return [*super().waits(schedule, devices_per_node), *_lanes(schedule, lambda s, d: frozenset((s, d)))]


class TorchRuntimeDirected(TorchRuntime):
    """``torch-runtime`` with one lane per direction (the control)."""

    name = "torch-runtime + directed links"

    def waits(self, schedule, devices_per_node):
        return [*super().waits(schedule, devices_per_node), *_lanes(schedule, lambda s, d: (s, d))]


def lone_priced(cal, paths):
    """``cal`` with its transfer delay the plain mean of the arrivals that met no send the other
    way (``p2p`` less the overhead and host times, as ``from_torch_trace`` computes it)."""
    lone = [x["delay"] for x in transfers.collisions(paths) if not x["meets"]]
    if cal.transfer is None or not lone:
        return cal
    delay = statistics.fmean(lone)
    return dataclasses.replace(cal, transfer=delay,
                               p2p=max(delay - cal.overhead - cal.send_cost - cal.recv_cost, 0.0))


def held_terms(paths_by_round: list[list[Path]]) -> dict:
    """From a source's own traced rounds: ``send_alone``, the mean send label (``SEND_F``/``SEND_B``)
    that met no send the other way (none on the other rank running at its start or starting within
    ``transfers.MEET_S`` after it); ``held``, how much longer the ones that met one lasted on average
    (0 when none did); ``transfer``, the mean delay of the timed arrivals that met nothing."""
    alone, met, delays = [], [], []
    for paths in paths_by_round:
        ranks, _ = _trace.parse(paths)
        for k in range(len(next(iter(ranks.values())))):
            labels = {r: [(a, b) for side, a, b in s[k].host if side == "send"] for r, s in ranks.items()}
            for r, mine in labels.items():
                others = [x for q, v in labels.items() if q != r for x in v]
                for a, b in mine:
                    (met if any(c <= a + transfers.MEET_S and d >= a for c, d in others) else alone).append(b - a)
        delays += [x["delay"] for x in transfers.collisions(paths) if not x["meets"]]
    send_alone = statistics.fmean(alone) if alone else 0.0
    return {"send_alone": send_alone, "held": statistics.fmean(met) - send_alone if met else 0.0,
            "transfer": statistics.fmean(delays) if delays else None}


def op_prices(cal, schedule) -> tuple[dict, dict, list, dict, dict]:
    """What ``Calibration.predict`` charges each op of ``schedule``: the overhead by kind, the
    compute by ``(kind, stage)`` (a ``B`` of a split schedule the measured full backward, else
    ``I + W``), the cross-device transfer edges ``(producer, consumer)`` and each op's number of
    sends and receives (each charged ``send_cost`` / ``recv_cost``)."""
    times = cal.times(schedule)
    kinds = {**{k: cal.overhead for k in "FBIW"}, **cal.overhead_by_kind}
    full = times["full_backward"]
    per_op = {("F", s): times["forward"][s] for s in range(cal.stages)}
    for s in range(cal.stages):
        per_op[("I", s)], per_op[("W", s)] = times["input_grad"][s], times["weight"][s]
        per_op[("B", s)] = full[s] if full else times["input_grad"][s] + times["weight"][s]
    edges = [(dep.op, op) for op in schedule.ops for dep in schedule.dependencies[op] if dep.is_transfer]
    sends, receives = defaultdict(int), defaultdict(int)
    for producer, consumer in edges:
        sends[producer] += 1
        receives[consumer] += 1
    return kinds, per_op, edges, sends, receives


def reference_step(cal, schedule, *, send_cost: float, p2p: float, held: float = 0.0) -> tuple[float, int]:
    """``cal.predict(schedule, mode="torch-runtime")``'s model on the reference evaluator, with the
    given host time of a send and transfer delay; ``held`` > 0: the two-pass held-send term (module
    docstring). Returns the step and how many sends pass 1 put against a send the other way."""
    kinds, per_op, edges, sends, receives = op_prices(cal, schedule)

    def step(extra: dict) -> dict:
        def duration(op):
            return (kinds[op.kind] + per_op[(op.kind, op.stage)] + send_cost * sends[op]
                    + cal.recv_cost * receives[op] + extra.get(op, 0.0))

        _, finish, _ = evaluate_network(schedule, duration, lambda op, dep: p2p, TorchRuntime(), setup=cal.setup)
        return finish

    finish = step({})
    extra: dict = defaultdict(float)
    if held:
        device = {op: schedule.placement.device(op.pipeline, op.stage) for op in schedule.ops}
        # a send is the tail of its producer (the host time the model adds to it)
        label = {edge: (finish[edge[0]] - send_cost * sends[edge[0]], finish[edge[0]]) for edge in edges}
        for (producer, consumer), (a, _) in label.items():
            if any(device[p] == device[consumer] and device[c] == device[producer]
                   and x <= a + transfers.MEET_S and y >= a for (p, c), (x, y) in label.items()):
                extra[producer] += held
        if extra:
            finish = step(extra)
    return max(finish.values()) + cal.wind_down, len(extra)


def study_cases(work: Path, meta: dict, conditions: dict) -> dict:
    """Every case of ``meta`` with its measured times, its diffpipe schedule and its calibration
    (``run._calibrate``; None for a case that cannot be one: ``Schedule1F1B`` labels nothing)."""
    cases = {}
    for key, info in meta.items():
        schedule = run._diffpipe_schedule(info["kind"], info["microbatches"], info["spr"], info["csv"])
        try:
            cal = run._calibrate(work, key, conditions["rounds"], schedule)
        except Exception:  # noqa: BLE001  (Schedule1F1B has no labels: a target only)
            cal = None
        cases[key] = {**info, **run._measured(work, key, conditions["rounds"]), "schedule": schedule,
                      "calibration": cal}
    return cases


def targets(cases: dict, source_key: str):
    """The other cases of the source's group it can predict: ``(key, case, predict's torch-runtime
    step)``; a split target of a full-backward source is skipped (it cannot price it)."""
    source = cases[source_key]
    for target_key, target in cases.items():
        if target["group"] != source["group"] or target_key == source_key:
            continue
        try:
            expected = source["calibration"].predict(target["schedule"], mode="torch-runtime")
        except Exception:  # noqa: BLE001  (a split target from a full-backward source)
            continue
        yield target_key, target, expected


def ways_table(cases: dict, predictions: list[dict], ways) -> str:
    """Per group and way (a prediction's ``mode``): cross-schedule MAPE and separated pairs ordered."""
    summary = run.summarize_rows(cases, predictions, ways)
    lines = ["| group | " + " | ".join(f"{way}: MAPE (separated pairs ordered)" for way in ways) + " |",
             "|---|" + "---:|" * len(ways)]
    for group in dict.fromkeys(c["group"] for c in cases.values()):
        cells = []
        for way in ways:
            errors = [abs(p["error"]) for p in predictions if p["mode"] == way and cases[p["source"]]["group"] == group]
            rows = [r for r in summary if r["mode"] == way and r["group"] == group]
            cells.append(f"{100 * statistics.fmean(errors):.1f}% ({sum(r['ordered_correctly'] for r in rows)}/"
                         f"{sum(r['separated_pairs'] for r in rows)})" if errors else "n/a")
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def held_sends(work: Path, meta: dict, conditions: dict) -> str:
    """The held-send term's table (module docstring): every source predicts every other case of
    its group three ways on the reference evaluator; pairs the reference does not price as
    ``predict`` does (to 1e-6) are left out and counted."""
    cases, predictions, skipped = study_cases(work, meta, conditions), [], 0
    ways = ("torch-runtime", "from what met nothing", "+ held sends")
    for source_key, source in cases.items():
        cal = source["calibration"]
        if cal is None:
            continue
        terms = held_terms([[work / f"{source_key}.r{r}.rank{k}.json" for k in range(run.RANKS)]
                            for r in range(conditions["rounds"])])
        p2p = cal.p2p if terms["transfer"] is None else max(
            terms["transfer"] - cal.overhead - terms["send_alone"] - cal.recv_cost, 0.0)
        for target_key, target, expected in targets(cases, source_key):
            base, _ = reference_step(cal, target["schedule"], send_cost=cal.send_cost, p2p=cal.p2p)
            if abs(base - expected) > 1e-6 * expected:
                skipped += 1
                continue
            lone, _ = reference_step(cal, target["schedule"], send_cost=terms["send_alone"], p2p=p2p)
            held, _ = reference_step(cal, target["schedule"], send_cost=terms["send_alone"], p2p=p2p,
                                     held=terms["held"])
            for way, predicted in zip(ways, (base, lone, held), strict=True):
                row = {"source": source_key, "target": target_key, "mode": way}
                predictions.append(run._prediction(row, predicted, target))
    left_out = f"\n{skipped} pairs left out (not priced as predict does on the reference)\n"
    return ways_table(cases, predictions, ways) + left_out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: pair_link.py WORK_DIR", file=sys.stderr)
        raise SystemExit(2)
    work = Path(args[0])
    if not (work / "conditions.json").is_file() or not (work / "probes.json").is_file():
        print(f"pair_link.py: {work}: no conditions.json and probes.json (not a run.py --work directory)",
              file=sys.stderr)
        raise SystemExit(2)
    conditions = json.loads((work / "conditions.json").read_text())
    conditions["probes"] = json.loads((work / "probes.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:  # the CSVs rebuilt outside the run's directory
        meta = run._cases(run.GROUPS, Path(tmp), width=conditions["width"], rows=conditions["rows_per_microbatch"])
        for variant, modes, calibrate in (
                ("as calibrated", (TorchRuntime(), TorchRuntimeHalfDuplex(), TorchRuntimeDirected()), None),
                ("transfer delay from the arrivals that met no send the other way",
                 (TorchRuntime(), TorchRuntimeHalfDuplex()), functools.partial(run._calibrate, each=lone_priced))):
            results = run.analyze(meta, work, {**conditions, "modes": list(modes)}, modes, calibrate=calibrate)
            for row in (*results["predictions"], *results["summary"]):  # the tables print modes by name
                row["mode"] = str(row["mode"])
            results["conditions"]["modes"] = [str(m) for m in modes]
            print(f"## {variant}\n\n{run.summary_table(results)}")
        print(f"## held sends (two passes on the reference evaluator)\n\n{held_sends(work, meta, conditions)}")


if __name__ == "__main__":
    main()
