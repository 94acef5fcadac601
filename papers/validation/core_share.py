"""A transfer's payload takes its ranks' cores: does a term for it predict the costly-p2p group?

A re-analysis of the traces a ``run.py --trace-all-rounds`` run left in its work directory (nothing
runs torch). Each rank runs on one pinned core, shared by its compute thread and gloo's threads.
When a transfer's payload moves (both its ``isend`` and its ``irecv`` are posted: gloo's
point-to-point is a rendezvous), gloo's threads copy it through the loopback socket on the
sending and the receiving rank's cores; an op computing there meanwhile is slowed by the copy.
The traces show both halves (``README.md``, "The core a transfer takes"):

- ``arrivals_before_op_end``: a timed arrival (the consumer waited) whose sender was computing at
  ``ready`` (the later of the send's and the receive's posts) mostly arrives before that op ends:
  the transfer does not wait for the sender's op.
- ``fit_slowdown``: an op's compute time against the number of payload moves (``ready +
  MOVE_S``) inside its compute span on its rank, as sender and as receiver, least squares with
  (stage, kind, round) fixed effects inside robust fences: the slope is what one move costs the
  op (``send``/``recv``, seconds).

The term (``CoreShare``), priced from the calibration source's own traces only: the source's op
means carry the moves that landed in its own ops, so its base op time is its mean less ``send x``
(the mean number of send moves in that stage and kind's ops) ``+ recv x`` (receive moves); a
target is priced on the reference evaluator in ``torch-runtime`` from the base times, each
transfer's start (the model's payload move) adds ``send`` to the op its sender runs then and
``recv`` to the op its receiver runs then, and the target is priced again, until the assignment
is stable (``PASSES`` at most). It lives here, not in ``diffpipe`` (a two-pass rule, not a static
graph; see the README for why it was not adopted or what adopting it needs).

Usage::

    python papers/validation/core_share.py /tmp/diffpipe-validation ["4 stages costly p2p"]

(the optional argument: only the groups whose name starts with it). It prints the mechanism table,
the kernel times of the 2-stage group's torch 1F1B against the same order run from a CSV
(``kernel_table``), the MAPE table of the ways (``WAYS``) and each source's fitted costs.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pair_link  # noqa: E402
import run  # noqa: E402

from diffpipe import communication  # noqa: E402
from diffpipe.calibrate import (  # noqa: E402
    TorchRuntime,
    _trace,  # the trace parser's per-step records (``_trace.parse``) have no public form: research plumbing
)
from diffpipe.schedules import evaluate_network  # noqa: E402

MOVE_S = 1e-4  #: a payload moves this long after ``ready`` (the timed arrivals' delay is 0.2-0.3 ms)
FENCE = 3.0  #: op times further than this many robust sigmas from their group's median are left out
PASSES = 4  #: at most this many pricings of a target (the first without the term)
#: The study's ways: the committed model, the term with the source's moves counted in its trace, and
#: with them counted where the model puts them (``in_model_frame``); torch's single-stage classes in
#: the mode of their own p2p code (``single_stage_mode``), alone and with the term (model's moves).
WAYS = ("torch-runtime", "+ core share (trace's moves)", "+ core share (model's moves)",
        "GPipe, 1F1B in their own modes", "+ both")
#: torch 2.13's ``PipelineScheduleSingle`` classes do not run ``_PipelineScheduleRuntime``'s lowered
#: actions (``torch/distributed/pipelining/schedules.py``): ``ScheduleGPipe._step_microbatches``
#: posts each receive inside the op's label just before its compute and waits for it, its sends
#: are waited only after the phase (``rendezvous``); ``Schedule1F1B._step_microbatches`` fires each
#: op's sends together with the next op's receives and waits for both before that op
#: (``_wait_batch_p2p(_batch_p2p(fwd_sends + bwd_recvs))``; ``blocking``: the sender's next op waits
#: for the transfer, the receive is posted just before its op).
SINGLE_STAGE_MODES = {"GPipe": "rendezvous", "1F1B": "blocking"}


def single_stage_mode(kind: str):
    """The communication mode of a case of torch schedule ``kind`` (``run.GROUPS``' kinds):
    ``SINGLE_STAGE_MODES``' for torch's single-stage classes, else ``torch-runtime``."""
    return communication(SINGLE_STAGE_MODES[kind]) if kind in SINGLE_STAGE_MODES else TorchRuntime()
KINDS = {"F": "forward", "B": "backward", "I": "input_grad", "W": "weight"}


def _rank_of(steps) -> dict[int, int]:
    return {stage: r for r, s in steps.items() for c in s.computes
            for _, stage, _ in (c.subs or ((c.kind, c.stage, c.mb),))}


def transfers_of(steps) -> list[dict]:
    """Every cross-rank transfer of one traced step (``{rank: _Step}``): sender, receiver, the
    producer's compute end, ``ready`` (the later of the sender's send post, the first send label
    at or after that end, and the receive's post), the arrival and whether it is timed (its
    consumer waited), and the sender's op computing at ``ready`` (None: none)."""
    rank_of = _rank_of(steps)
    produced = {(c.kind, c.stage, c.mb): c.end for s in steps.values() for c in s.computes if not c.overlapped}
    posts = {r: sorted(a for side, a, _ in s.host if side == "send") for r, s in steps.items()}
    out = []
    for r, step in steps.items():
        ops = {(c.kind, c.stage, c.mb): c for c in step.computes}
        for (direction, stage, mb), recv in step.recvs.items():
            source = stage - 1 if direction == "F" else stage + 1
            kinds = ("F",) if direction == "F" else ("B", "I")
            end = next((produced[(k, source, mb)] for k in kinds if (k, source, mb) in produced), None)
            sender = rank_of.get(source)
            if end is None or sender in (None, r):
                continue
            post = next((a for a in posts[sender] if a >= end - 1e-5), end)
            ready = max(post, recv.post)
            consumer = next((ops[(k, stage, mb)] for k in kinds if (k, stage, mb) in ops), None)
            running = next((c for c in steps[sender].computes if c.begin <= ready < c.end), None)
            out.append({"sender": sender, "receiver": r, "end": end, "ready": ready, "arrival": recv.end,
                        "timed": consumer is not None and consumer.waited and not consumer.overlapped,
                        "sender_op": running})
    return out


def _rounds(paths_by_round):
    for paths in paths_by_round:
        ranks, _ = _trace.parse(paths)
        for k in range(len(next(iter(ranks.values())))):
            yield {r: s[k] for r, s in ranks.items()}


def arrivals_before_op_end(paths_by_round) -> tuple[int, int, list[float], list[float]]:
    """Of the timed arrivals whose sender was computing at ``ready``: how many, how many arrived
    more than ``MOVE_S`` before that op ended, their delays after ``ready`` and the times that
    op had left at ``ready``."""
    delays, left = [], []
    for steps in _rounds(paths_by_round):
        for t in transfers_of(steps):
            if t["timed"] and t["sender_op"] is not None:
                delays.append(t["arrival"] - t["ready"])
                left.append(t["sender_op"].end - t["ready"])
    early = sum(d < x - MOVE_S for d, x in zip(delays, left, strict=True))
    return len(delays), early, delays, left


def op_samples(paths_by_round) -> list[tuple[tuple[int, str], float, int, int, int]]:
    """Per compute op outside an overlapped pair of every traced step: ``((stage, kind), compute
    time, send moves, receive moves, round)``, a move counted in the op whose compute span holds
    its ``ready + MOVE_S``."""
    rows = []
    for index, paths in enumerate(paths_by_round):
        for steps in _rounds([paths]):
            moments = defaultdict(list)
            for t in transfers_of(steps):
                moments[t["sender"]].append((t["ready"] + MOVE_S, 0))
                moments[t["receiver"]].append((t["ready"] + MOVE_S, 1))
            for r, step in steps.items():
                for c in step.computes:
                    if c.overlapped:
                        continue
                    counts = [0, 0]
                    for at, role in moments[r]:
                        if c.begin <= at < c.end:
                            counts[role] += 1
                    rows.append(((c.stage, c.kind), c.end - c.begin, counts[0], counts[1], index))
    return rows


def fit_slowdown(rows) -> dict | None:
    """``{"send", "recv", "send_se", "recv_se", "samples"}`` (seconds per move) from ``op_samples``
    rows: least squares of compute time on (send, receive) moves within (stage, kind, round)
    groups, each group's times inside ``FENCE`` robust sigmas of its median. A role no op's compute
    ever overlapped (``ScheduleGPipe``'s receives, posted just before their op and waited) is not
    fitted: 0, its error None. None when nothing is (no op overlapped a move)."""
    groups = defaultdict(list)
    for term, duration, sends, receives, index in rows:
        groups[(term, index)].append((duration, sends, receives))
    ys, xs = [], []
    for values in groups.values():
        a = np.array(values, dtype=float)
        if len(a) < 3:
            continue
        centre = np.median(a[:, 0])
        sigma = max(1.4826 * np.median(np.abs(a[:, 0] - centre)), 1e-6)
        a = a[np.abs(a[:, 0] - centre) <= FENCE * sigma]
        a = a - a.mean(axis=0)
        ys += list(a[:, 0])
        xs += list(a[:, 1:])
    x, y = np.array(xs), np.array(ys)
    used = [j for j in range(2) if len(y) and np.any(x[:, j] != 0)]  # a role no op ever overlapped: not fitted
    if len(y) < 3 or not used or np.linalg.matrix_rank(x[:, used]) < len(used):
        return None
    beta, *_ = np.linalg.lstsq(x[:, used], y, rcond=None)
    residual = y - x[:, used] @ beta
    errors = np.sqrt(np.diag(np.linalg.inv(x[:, used].T @ x[:, used])) * (residual @ residual) / (len(y) - len(used)))
    out = {"send": 0.0, "recv": 0.0, "send_se": None, "recv_se": None, "samples": len(y)}
    for j, b, e in zip(used, beta, errors, strict=True):
        role = ("send", "recv")[j]
        out[role], out[f"{role}_se"] = float(b), float(e)
    return out


def share_terms(paths_by_round) -> dict:
    """A source's term from its own traces: ``send``/``recv`` (``fit_slowdown``, each at least 0;
    0 where not fitted) and ``moves[(stage, kind)]``, the mean (send, receive) moves per op; with
    ``fit`` and ``arrivals`` (``arrivals_before_op_end``'s counts) for the mechanism table."""
    rows = op_samples(paths_by_round)
    fit = fit_slowdown(rows) or {"send": 0.0, "recv": 0.0}
    timed, early, _, _ = arrivals_before_op_end(paths_by_round)
    counts = defaultdict(list)
    for term, _, sends, receives, _ in rows:
        counts[term].append((sends, receives))
    return {"send": max(fit["send"], 0.0), "recv": max(fit["recv"], 0.0), "fit": fit,
            "arrivals": {"timed_while_sender_computed": timed, "before_its_op_ended": early},
            "moves": {term: tuple(statistics.fmean(v[i] for v in values) for i in (0, 1))
                      for term, values in counts.items()}}


def base_calibration(cal, terms: dict):
    """``cal`` with each (stage, kind)'s op time less what its measured moves cost it."""
    def less(kind: str):
        values = getattr(cal, KINDS[kind])
        if values is None:
            return None
        out = []
        for stage, value in enumerate(values):
            sends, receives = terms["moves"].get((stage, kind), (0.0, 0.0))
            out.append(None if value is None else max(value - terms["send"] * sends - terms["recv"] * receives, 0.0))
        return tuple(out)

    return dataclasses.replace(cal, **{KINDS[k]: less(k) for k in KINDS})


def in_model_frame(cal, schedule, terms: dict) -> dict:
    """``terms`` with ``moves`` counted where the model puts them: the moves per op of each
    (stage, kind) that land in an op when the source's own ``schedule`` is priced with its
    calibrated times and the term (the trace's own counts, ``share_terms``, depend on each
    transfer's actual timing, which one number per stage and kind does not carry: the source then
    predicts itself as before, and a target differs from it by where its structure puts the moves)."""
    landed: dict = {}
    reference_step(cal, schedule, {**terms, "moves": {}}, landed)
    counts = defaultdict(int)
    for op in schedule.ops:
        counts[(op.stage, op.kind)] += 1
    moves = {term: [0.0, 0.0] for term in counts}
    for op, (sends, receives) in landed.items():
        moves[(op.stage, op.kind)][0] += sends / counts[(op.stage, op.kind)]
        moves[(op.stage, op.kind)][1] += receives / counts[(op.stage, op.kind)]
    return {**terms, "moves": {term: tuple(v) for term, v in moves.items()}}


def reference_step(cal, schedule, terms: dict | None = None, landed_by: dict | None = None,
                   mode=None) -> tuple[float, int]:
    """``cal.predict(schedule, mode=mode)``'s model on the reference evaluator (default
    ``torch-runtime``; ``single_stage_mode`` gives torch's single-stage classes theirs); with
    ``terms`` (``share_terms``), the core-share term (module docstring) on the base op times.
    Returns the step and the number of moves that landed in an op in the last pass;
    ``landed_by``, when given, receives them per op: ``{op: [sends, receives]}``."""
    if terms is not None:
        cal = base_calibration(cal, terms)
    kinds, per_op, _, sends, receives = pair_link.op_prices(cal, schedule)
    device = {op: schedule.placement.device(op.pipeline, op.stage) for op in schedule.ops}
    by_device = defaultdict(list)
    for op in schedule.ops:
        by_device[device[op]].append(op)

    def price(extra: dict):
        def duration(op):
            return (kinds[op.kind] + per_op[(op.kind, op.stage)] + cal.send_cost * sends[op]
                    + cal.recv_cost * receives[op] + extra.get(op, 0.0))

        return evaluate_network(schedule, duration, lambda op, dep: cal.p2p, TorchRuntime() if mode is None else mode,
                                setup=cal.setup)

    def compute(op, start, finish):
        """An op's compute span in the model: after its overhead and receive posts, before its
        send posts (the trace's order: the gap, the ``RECV`` labels, the compute, the ``SEND`` labels)."""
        return (start[op] + kinds[op.kind] + cal.recv_cost * receives[op], finish[op] - cal.send_cost * sends[op])

    extra: dict = {}
    start, finish, moved = price(extra)
    landed = 0
    if terms is not None and (terms["send"] or terms["recv"]):
        for _ in range(PASSES - 1):
            new: dict = defaultdict(float)
            hits: dict = {}
            for (producer, consumer), (begin, _) in moved.items():
                # the trace's ready: the producer's send post (its compute's end), or the receive's post
                at = (begin - cal.send_cost * sends[producer] if begin - finish[producer] < 1e-12 else begin) + MOVE_S
                for role, side, cost in ((0, device[producer], terms["send"]), (1, device[consumer], terms["recv"])):
                    hit = next((op for op in by_device[side]
                                if compute(op, start, finish)[0] <= at < compute(op, start, finish)[1]), None)
                    if hit is not None:
                        new[hit] += cost
                        hits.setdefault(hit, [0, 0])[role] += 1
            landed = sum(sum(v) for v in hits.values())
            if landed_by is not None:
                landed_by.clear()
                landed_by.update(hits)
            if dict(new) == extra:
                break
            extra = dict(new)
            start, finish, moved = price(extra)
    return max(finish.values()) + cal.wind_down, landed


def _paths(work: Path, key: str, rounds: int) -> list[list[Path]]:
    return [[work / f"{key}.r{r}.rank{k}.json" for k in range(run.RANKS)] for r in range(rounds)
            if all((work / f"{key}.r{r}.rank{k}.json").exists() for k in range(run.RANKS))]


def study(work: Path, meta: dict, conditions: dict) -> tuple[dict, list[dict], dict, int]:
    """Every source predicts every other case of its group with and without the term on the
    reference evaluator; pairs the reference does not price as ``predict`` does (to 1e-6) are
    left out and counted. Returns the cases, the predictions (``mode`` ``torch-runtime`` / ``+
    core share``), each source's terms, and the count left out."""
    cases, predictions, terms_of, skipped = pair_link.study_cases(work, meta, conditions), [], {}, 0
    for source_key, source in cases.items():
        cal = source["calibration"]
        if cal is None:
            continue
        terms = terms_of[source_key] = share_terms(_paths(work, source_key, conditions["rounds"]))
        framed = in_model_frame(cal, source["schedule"], terms)
        for target_key, target, expected in pair_link.targets(cases, source_key):
            own = single_stage_mode(target["kind"])
            base, _ = reference_step(cal, target["schedule"])
            single, _ = reference_step(cal, target["schedule"], mode=own)
            if (abs(base - expected) > 1e-6 * expected
                    or abs(single - cal.predict(target["schedule"], mode=own)) > 1e-6 * single):
                skipped += 1
                continue
            shared, _ = reference_step(cal, target["schedule"], terms)
            modelled, _ = reference_step(cal, target["schedule"], framed)
            both, _ = reference_step(cal, target["schedule"], framed, mode=own)
            for way, predicted in zip(WAYS, (base, shared, modelled, single, both), strict=True):
                predictions.append(run._prediction({"source": source_key, "target": target_key, "mode": way},
                                                   predicted, target))
    return cases, predictions, terms_of, skipped


def table(cases: dict, predictions: list[dict], ways=WAYS) -> str:
    """The MAPE table of ``ways`` (``pair_link.ways_table``)."""
    return pair_link.ways_table(cases, predictions, ways)


def mechanism_table(cases: dict, terms_of: dict) -> str:
    """Per group: the timed arrivals whose sender was computing at ``ready`` and how many came
    before that op ended (``arrivals_before_op_end``), and the sources' fitted costs of a move
    (``fit_slowdown``: median and range over the sources that fitted each role)."""
    lines = ["| group | timed arrivals, sender computing at ready | arrived before its op ended | "
             "send move (ms per op, median (range) over sources) | receive move |", "|---|---:|---:|---:|---:|"]
    for group in dict.fromkeys(c["group"] for c in cases.values()):
        mine = [t for k, t in terms_of.items() if cases[k]["group"] == group]
        timed = sum(t["arrivals"]["timed_while_sender_computed"] for t in mine)
        early = sum(t["arrivals"]["before_its_op_ended"] for t in mine)
        cells = []
        for role in ("send", "recv"):
            values = sorted(1e3 * t["fit"][role] for t in mine if t["fit"].get(f"{role}_se"))
            cells.append(f"{statistics.median(values):+.3f} ({values[0]:+.3f}..{values[-1]:+.3f}), "
                         f"{len(values)} sources" if values else "n/a")
        lines.append(f"| {group} | {timed} | {early} ({100 * early / timed:.0f}%) | " + " | ".join(cells) + " |"
                     if timed else f"| {group} | 0 | n/a | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


#: The kernels of a ``Linear + GELU`` block that ``kernel_table`` times: the forward matmul and the
#: backward's (torch's autograd node of the addmm: input and weight gradients).
KERNELS = ("aten::addmm", "autograd::engine::evaluate_function: AddmmBackward0")
#: The 2-stage cases ``kernel_table`` compares: torch's own 1F1B loop against the same order run by
#: ``_PipelineScheduleRuntime`` from diffpipe's CSV, and the group's other schedules.
KERNEL_CASES = ("1F1B", "diffpipe_1f1b__CSV", "GPipe", "ZB_H1__InterleavedZeroBubble")


def kernel_table(work: Path, rounds: int, group: str = "2_stages", microbatches=(4, 8, 16)) -> str:
    """Per case and rank, the mean duration of each of ``KERNELS`` over every traced round (the
    profiler's own ``cpu_op`` events: torch's ``Schedule1F1B`` labels no action, but its kernels are
    in its trace like any other's)."""
    heads = [f"rank {r}: {k.rsplit(' ', 1)[-1]} (ms)" for r in range(run.RANKS) for k in KERNELS]
    lines = ["| case | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for m in microbatches:
        for case in KERNEL_CASES:
            cells = []
            for rank in range(run.RANKS):
                durations = defaultdict(list)
                for r in range(rounds):
                    path = work / f"{group}.m{m}.{case}.r{r}.rank{rank}.json"
                    if path.exists():
                        for event in json.loads(path.read_text())["traceEvents"]:
                            if event.get("ph") == "X" and event.get("name") in KERNELS:
                                durations[event["name"]].append(event["dur"] * 1e-3)
                cells += [f"{statistics.fmean(durations[k]):.3f}" if durations[k] else "n/a" for k in KERNELS]
            lines.append(f"| {group}.m{m}.{case} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print("usage: core_share.py WORK_DIR [GROUP_PREFIX]", file=sys.stderr)
        raise SystemExit(2)
    work = Path(args[0])
    if not (work / "conditions.json").is_file():
        print(f"core_share.py: {work}: no conditions.json (not a run.py --work directory)", file=sys.stderr)
        raise SystemExit(2)
    conditions = json.loads((work / "conditions.json").read_text())
    groups = {g: s for g, s in run.GROUPS.items() if len(args) == 1 or g.startswith(args[1])}
    with tempfile.TemporaryDirectory() as tmp:  # the CSVs rebuilt outside the run's directory
        meta = run._cases(groups, Path(tmp), width=conditions["width"], rows=conditions["rows_per_microbatch"])
        cases, predictions, terms_of, skipped = study(work, meta, conditions)
    print(mechanism_table(cases, terms_of))
    if len(args) == 1 or "2 stages".startswith(args[1]) or args[1].startswith("2 stages"):
        print(kernel_table(work, conditions["rounds"]))
    print(table(cases, predictions))
    print(f"{skipped} pairs left out (not priced as predict does on the reference)\n")
    for key, terms in terms_of.items():
        fit = terms["fit"]
        cells = [f"{role} {1e3 * fit[role]:+.3f}" + (f" +- {1e3 * fit[role + '_se']:.3f}" if fit.get(role + "_se")
                                                     else " (not fitted)") for role in ("send", "recv")]
        print(f"- {key}: ms per move, " + ", ".join(cells) + (f" ({fit['samples']} ops)" if "samples" in fit else ""))


if __name__ == "__main__":
    main()
