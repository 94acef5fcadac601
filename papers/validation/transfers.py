"""When do gloo's transfers complete? A test of "a transfer moves only when its sender idles".

The hypothesis (README, "Where the own-op-time replay falls behind"): each rank runs on one pinned
core, so gloo's transfer threads progress only when the rank's compute thread blocks, and a
transfer does not move while its sender computes back to back. This script checks it on the traces
a study left in ``--work`` (``run.py --work DIR``), read by the calibration's own parser
(``calibrate._trace.parse``).

A transfer's arrival is visible only where its consumer waited for it (the end of the receive's
``gloo:recv`` span is then the arrival; else it is the wait call). For every such cross-rank
transfer of every traced step it takes

- ``ready``: the later of the producer's end and the receive's post (when ``torch-runtime`` starts
  the transfer);
- ``idle``: the first time at or after ``ready`` when the sending rank's main thread is blocked:
  inside an op's wait for data (label start to compute start of an op that waited), or after its
  last op of the step. Under the hypothesis the data arrives at ``idle`` plus a transfer time.

and counts the arrivals that came more than 0.3 ms before ``idle`` (the hypothesis says they cannot),
where the sender was computing when the data arrived, and the delay ``arrival - ready`` (its
median and 90th percentile). A second table counts the send labels (``SEND_F``/``SEND_B``) that
lasted more than 1 ms and how many of them overlapped a send label on the other rank.

A third table (``collisions``) takes the arrivals the calibration times (``from_torch_trace``: the
receive posted before the producer ended, the consumer waited) and splits them by whether the
transfer *met a send the other way*: the receiving rank had a send label running at the producer's
end or starting within ``MEET_S`` after it. That is fixed by the timing at the transfer's start, not
by how long it took (a send label overlapping the whole wait, as in the second table, is likelier
the longer the wait). For each it reports the delay, the sender's own send label of the transfer
(the first one starting within ``OWN_SEND_S`` of the producer's end) and the arrival less that
label's end, for all of them and for the slow ones (delay > ``LONG_SEND_S``).

Usage::

    python papers/validation/transfers.py /tmp/diffpipe-validation [ROUNDS]   # ROUNDS: r0,r1 (default r0)
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# The per-step records of the trace parser (``_trace.parse``) have no public form: research plumbing.
from diffpipe.calibrate import _trace  # noqa: E402

EARLY_S = 3e-4  #: an arrival this much before the sender's next idle time contradicts the hypothesis
LONG_SEND_S = 1e-3  #: a send label longer than this blocked its rank
TAIL_S = 2e-3  #: a transfer whose arrival came this long after ``ready`` is in the tail
MEET_S = 2.5e-4  #: a send the other way starting this soon after the producer's end meets the transfer
OWN_SEND_S = 5e-4  #: the sender's send label of a transfer starts within this of the producer's end


def _idle(step) -> list[tuple[float, float]]:
    """The intervals of a rank's step where its main thread is blocked: waits for data, and after
    its last op."""
    spans = [(c.start, c.begin) for c in step.computes if c.waited and c.begin > c.start]
    spans.append((max(c.end for c in step.computes), float("inf")))
    return sorted(spans)


def _next_idle(spans: list[tuple[float, float]], t: float) -> float:
    return next(max(a, t) for a, b in spans if b >= t)


def _receives(paths: list[Path]):
    """Every cross-rank receive of every traced step whose producer ran outside an overlapped pair:
    ``(steps, rank, recv, end, sender, consumers)``, with ``end`` the producer's end and
    ``consumers`` the receiving rank's ops that may consume it (``F``; or ``B``/``I``)."""
    ranks, _ = _trace.parse(paths)
    rank_of = {c.stage: r for r, steps in ranks.items() for c in steps[0].computes}
    for k in range(len(next(iter(ranks.values())))):
        steps = {r: s[k] for r, s in ranks.items()}
        produced = {(c.kind, c.stage, c.mb): c.end for s in steps.values() for c in s.computes if not c.overlapped}
        for r, step in steps.items():
            ops = {(c.kind, c.stage, c.mb): c for c in step.computes}
            for (direction, stage, mb), recv in step.recvs.items():
                source = stage - 1 if direction == "F" else stage + 1
                kinds = ("F",) if direction == "F" else ("B", "I")
                end = next((produced[(kind, source, mb)] for kind in kinds if (kind, source, mb) in produced), None)
                sender = rank_of.get(source)
                if end is not None and sender not in (None, r):
                    consumers = [ops[(kind, stage, mb)] for kind in kinds if (kind, stage, mb) in ops]
                    yield steps, r, recv, end, sender, consumers


def arrivals(paths: list[Path]) -> list[dict]:
    """One record per visible cross-rank arrival (see the module docstring) of every traced step."""
    out = []
    for steps, _, recv, end, sender, consumers in _receives(paths):
        consumer = consumers[0] if consumers else None
        if consumer is None or not consumer.waited or consumer.overlapped:
            continue
        ready = max(end, recv.post)
        computing = any(c.begin <= recv.end <= c.end for c in steps[sender].computes)
        out.append({"ready": ready, "arrival": recv.end, "idle": _next_idle(_idle(steps[sender]), ready),
                    "sender_computing": computing, "late_post": recv.post > end})
    return out


def sends(paths: list[Path]) -> list[tuple[float, bool]]:
    """Every send label's duration and whether it overlapped a send label of another rank."""
    ranks, _ = _trace.parse(paths)
    out = []
    for k in range(len(next(iter(ranks.values())))):
        labels = {r: [(a, b) for side, a, b in s[k].host if side == "send"] for r, s in ranks.items()}
        for r, mine in labels.items():
            others = [x for q, v in labels.items() if q != r for x in v]
            out += [(b - a, any(c < b and a < d for c, d in others)) for a, b in mine]
    return out


def collisions(paths: list[Path]) -> list[dict]:
    """One record per arrival the calibration times (see the module docstring): its delay after the
    producer's end, whether it met a send the other way, and the sender's own send label
    (``own_send``: its duration, ``after_send``: the arrival less its end; None where none was found);
    ``other_left``: what the met send labels had left to run after the producer's end."""
    out = []
    for steps, r, recv, end, sender, consumers in _receives(paths):
        if recv.post > end or not any(c.waited for c in consumers):
            continue
        labels = {q: sorted((a, b) for side, a, b in s.host if side == "send") for q, s in steps.items()}
        own = next(((a, b) for a, b in labels[sender] if end - 1e-5 <= a <= end + OWN_SEND_S), None)
        met = [(a, b) for a, b in labels[r] if a <= end + MEET_S and b >= end]
        out.append({"delay": recv.end - end, "meets": bool(met),
                    "other_left": sum(b - max(a, end) for a, b in met) if met else None,
                    "own_send": None if own is None else own[1] - own[0],
                    "after_send": None if own is None else recv.end - own[1]})
    return out


def _ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    return (f"{1e3 * statistics.fmean(values):.2f} / {1e3 * statistics.median(values):.2f} / "
            f"{1e3 * ordered[9 * len(values) // 10]:.2f}")


def _cases(work: Path, rounds: list[str]):
    for r in rounds:
        for first in sorted(work.glob(f"*.{r}.rank0.json")):
            key = first.name[: -len(".rank0.json")]
            yield key.split(".")[0], [first, work / f"{key}.rank1.json"]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        raise SystemExit("usage: transfers.py WORK_DIR [ROUNDS, e.g. r0,r1]")
    work = Path(args[0])
    rounds = args[1].split(",") if len(args) == 2 else ["r0"]
    seen: dict[str, list[dict]] = defaultdict(list)
    sent: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    met: dict[str, list[dict]] = defaultdict(list)
    for group, paths in _cases(work, rounds):
        try:
            seen[group] += arrivals(paths)
            sent[group] += sends(paths)
            met[group] += collisions(paths)
        except Exception:  # noqa: BLE001  (Schedule1F1B: no labels)
            continue
    print("| group | visible arrivals | delay after ready, median / p90 (ms) | arrived > 0.3 ms before the sender's "
          "next idle | sender computing at arrival | tail (> 2 ms) | tail arrivals at the sender's next idle "
          "(within 1 ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for group, rows in sorted(seen.items()):
        delays = sorted(x["arrival"] - x["ready"] for x in rows)
        n = len(rows)
        early = sum(x["arrival"] < x["idle"] - EARLY_S for x in rows)
        computing = sum(x["sender_computing"] for x in rows)
        tail = [x for x in rows if x["arrival"] - x["ready"] > TAIL_S]
        at_idle = sum(abs(x["arrival"] - x["idle"]) < 1e-3 for x in tail)
        print(f"| {group} | {n} | {1e3 * statistics.median(delays):.2f} / {1e3 * delays[9 * n // 10]:.2f} | "
              f"{early} ({100 * early / n:.0f}%) | {computing} ({100 * computing / n:.0f}%) | {len(tail)} | "
              f"{at_idle} |")
    print()
    print("| group | send labels | longer than 1 ms | of which overlapping a send on the other rank | "
          "share of overlapping sends that blocked | share of lone sends that blocked |")
    print("|---|---:|---:|---:|---:|---:|")
    for group, rows in sorted(sent.items()):
        long = [o for d, o in rows if d > LONG_SEND_S]
        both = sum(o for _, o in rows)
        alone = len(rows) - both
        print(f"| {group} | {len(rows)} | {len(long)} | {sum(long)} | "
              f"{100 * sum(long) / both if both else 0:.0f}% | "
              f"{100 * (len(long) - sum(long)) / alone if alone else 0:.1f}% |")
    print()
    print("| group | transfers | meets a send the other way | the met send's time left (ms, mean / median / p90) | "
          "delay: alone | met | sender's own send label: alone | met | slow (> 1 ms) ones: alone | met | "
          "their own send label: alone | met | their arrival less that label's end: alone | met |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for group, rows in sorted(met.items()):
        cells = [_ms([x["other_left"] for x in rows if x["meets"]])]
        for name in ("delay", "own_send"):
            for meets in (False, True):
                cells.append(_ms([x[name] for x in rows if x["meets"] == meets and x[name] is not None]))
        cells += [str(sum(x["meets"] == meets and x["delay"] > LONG_SEND_S for x in rows)) for meets in (False, True)]
        for name in ("own_send", "after_send"):
            for meets in (False, True):
                cells.append(_ms([x[name] for x in rows if x["meets"] == meets and x[name] is not None
                                  and x["delay"] > LONG_SEND_S]))
        n_met = sum(x["meets"] for x in rows)
        print(f"| {group} | {len(rows)} | {n_met} ({100 * n_met / len(rows):.0f}%) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
