"""Stalled rounds: are a case's rounds exchangeable, term by term, and which terms carry the error?

A re-analysis of the traces a ``run.py --trace-all-rounds`` run left in its work directory
(nothing runs torch). Two tables:

1. **Exchangeability of the rounds**, per group: for every case and op term (``F``/``B``/``I``/``W``
   per stage, at least 3 samples a round), Cochran's Q of the rounds' means against their own
   standard errors (``robust_spread x mean / sqrt(samples)``, as ``from_torch_trace`` keeps them),
   and the same for the transfer delays the calibration times (``transfers.collisions``: the
   receive posted before the producer ended, the consumer waited; plain means and standard
   deviations, as ``from_torch_trace`` takes its transfer delay). A term whose Q has ``p < 0.001``
   on ``rounds - 1`` degrees of freedom moved between rounds by more than its samples' spread
   allows: its samples are not independent across rounds, the rounds are the unit, and a stalled
   round lifts a pooled mean (``calibrate.combine``'s sample-weighted default) by its share of the
   samples. This is what ``run._calibrate``'s ``op_times="median"`` answers.
2. **Which terms carry a group's cross-schedule error** (``torch-runtime``): for every source and
   target, the source's prediction error, the target's own calibration predicting the target
   (``self``: what no choice of terms can remove), and per family of terms (op times, overheads,
   communication: ``p2p``/``transfer``/``send_cost``/``recv_cost``, set-up and wind-down) the points
   of error that go away when the source's family is replaced by the target's own (the family's
   share; the shares need not add up: the families interact), as means by source and by target,
   for both ways of combining the rounds' op times.

Usage::

    python papers/validation/rounds.py /tmp/diffpipe-validation ["4 stages transformer" ...]

(the groups of table 2: default the costly-p2p and transformer groups; table 1 covers every group).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402
import transfers  # noqa: E402

#: The term families of table 2 (``Calibration`` fields).
FAMILIES = {"ops": ("forward", "backward", "input_grad", "weight"), "overhead": ("overhead", "overhead_by_kind"),
            "communication": ("p2p", "transfer", "send_cost", "recv_cost"), "ends": ("setup", "wind_down")}
KINDS = {"F": "forward", "B": "backward", "I": "input_grad", "W": "weight"}
ALPHA = 1e-3  #: a term's rounds are not exchangeable below this p-value
MODE = "torch-runtime"


def chi2_sf(q: float, df: int) -> float:
    """``P(X >= q)`` for ``X`` chi-squared with ``df`` degrees of freedom (closed forms for whole
    ``df``: the Poisson sum for even ``df``, with the normal tail for odd)."""
    if df < 1:
        raise ValueError(f"chi2_sf: df must be >= 1, got {df}")
    if q <= 0:
        return 1.0
    x = q / 2
    if df % 2 == 0:
        return math.exp(-x) * sum(x ** i / math.factorial(i) for i in range(df // 2))
    return math.erfc(math.sqrt(x)) + math.exp(-x) * sum(x ** (i - 0.5) / math.gamma(i + 0.5)
                                                        for i in range(1, (df - 1) // 2 + 1))


def rounds_p_value(means: list[float], errors: list[float]) -> float:
    """Cochran's Q of ``means`` with standard errors ``errors``: the p-value that they share one
    mean (``len(means) - 1`` degrees of freedom)."""
    weights = [1 / e ** 2 for e in errors]
    centre = sum(w * m for w, m in zip(weights, means, strict=True)) / sum(weights)
    q = sum(w * (m - centre) ** 2 for w, m in zip(weights, means, strict=True))
    return chi2_sf(q, len(means) - 1)


def op_term_p_values(runs: list) -> list[float]:
    """Per op term the rounds of ``runs`` (one case's ``Calibration`` per round) all measured with at
    least 3 samples and a spread, its rounds' p-value (``rounds_p_value``)."""
    out = []
    for key in runs[0].samples:
        if key[:1] not in KINDS or not key[1:].isdigit():
            continue
        name, s = KINDS[key[0]], int(key[1:])
        got = [(c._measured(name, s), c.spread.get(key), c.samples.get(key, 0)) for c in runs]
        if any(v is None or v <= 0 or not spread or n < 3 for v, spread, n in got):
            continue
        out.append(rounds_p_value([v for v, _, _ in got], [spread * v / math.sqrt(n) for v, spread, n in got]))
    return out


def transfer_p_value(paths_by_round: list[list[Path]]) -> float | None:
    """The rounds' p-value of the timed transfer delays (None where a round timed fewer than 3)."""
    delays = [[c["delay"] for c in transfers.collisions(paths)] for paths in paths_by_round]
    if len(delays) < 2 or any(len(d) < 3 for d in delays):
        return None
    return rounds_p_value([statistics.fmean(d) for d in delays],
                          [statistics.stdev(d) / math.sqrt(len(d)) for d in delays])


def attribute(cals: dict, schedules: dict, measured: dict, group_keys: list[str]) -> list[dict]:
    """Table 2's rows: per source and target of ``group_keys`` (both calibrated, the source able to
    price the target), ``error``, ``self`` and each family's share (module docstring)."""

    def error(cal, target):
        try:
            return cal.predict(schedules[target], mode=MODE) / measured[target] - 1
        except Exception:  # noqa: BLE001  (a full-backward source cannot price a split target)
            return None

    rows = []
    for target in group_keys:
        if target not in cals:
            continue
        own = error(cals[target], target)
        for source in group_keys:
            if source == target or source not in cals or (e := error(cals[source], target)) is None:
                continue
            row = {"source": source, "target": target, "error": e, "self": own}
            for family, names in FAMILIES.items():
                theirs = {n: getattr(cals[target], n) for n in names}
                swapped = error(dataclasses.replace(cals[source], **theirs), target)
                row[family] = None if swapped is None else e - swapped
            rows.append(row)
    return rows


def _means(rows: list[dict], by: str) -> list[str]:
    lines = [f"| {'source' if by == 'source' else 'target'} | n | error | self | "
             + " | ".join(FAMILIES) + " |", "|---|---:|---:|---:|" + "---:|" * len(FAMILIES)]
    for key in dict.fromkeys(r[by] for r in rows):
        mine = [r for r in rows if r[by] == key]
        cells = []
        for field in ("error", "self", *FAMILIES):
            values = [r[field] for r in mine if r[field] is not None]
            cells.append(f"{100 * statistics.fmean(values):+.1f}" if values else "n/a")
        lines.append(f"| {key.split('.', 1)[1]} | {len(mine)} | " + " | ".join(cells) + " |")
    fields = ("error", "self", *FAMILIES)
    lines.append("| mean abs | | " + " | ".join(
        f"{100 * statistics.fmean(abs(r[f]) for r in rows if r[f] is not None):.1f}" for f in fields) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: rounds.py WORK_DIR [GROUP ...]", file=sys.stderr)
        raise SystemExit(2)
    work, named = Path(args[0]), args[1:] or ["4 stages costly p2p", "4 stages transformer"]
    if not (work / "conditions.json").is_file():
        print(f"rounds.py: {work}: no conditions.json (not a run.py --work directory)", file=sys.stderr)
        raise SystemExit(2)
    unknown = [g for g in named if g not in run.GROUPS]
    if unknown:
        print(f"rounds.py: no group {unknown[0]!r} (groups: {', '.join(run.GROUPS)})", file=sys.stderr)
        raise SystemExit(2)
    conditions = json.loads((work / "conditions.json").read_text())
    rounds = conditions["rounds"]
    with tempfile.TemporaryDirectory() as tmp:  # the CSVs rebuilt outside the run's directory
        meta = run._cases(run.GROUPS, Path(tmp), width=conditions["width"], rows=conditions["rows_per_microbatch"])
        schedules = {k: run._diffpipe_schedule(i["kind"], i["microbatches"], i["spr"], i["csv"])
                     for k, i in meta.items()}
        cals: dict[str, dict] = {"pooled": {}, "median": {}}
        tests: dict[str, tuple[list[float], list[float]]] = {}
        for key, info in meta.items():
            captured: list = []

            def keep(cal, paths, into=captured):
                into.append((cal, paths))
                return cal
            try:
                cals["median"][key] = run._calibrate(work, key, rounds, schedules[key], each=keep)
            except Exception:  # noqa: BLE001  (Schedule1F1B labels nothing: not a source)
                continue
            cals["pooled"][key] = run._calibrate(work, key, rounds, schedules[key], op_times="pooled")
            ops, trans = tests.setdefault(info["group"], ([], []))
            if len(captured) > 1:
                ops += op_term_p_values([c for c, _ in captured])
                p = transfer_p_value([paths for _, paths in captured])
                trans += [] if p is None else [p]
    print(f"Rounds not exchangeable (Cochran's Q, p < {ALPHA}), terms of every calibrated case\n")
    print("| group | op terms | transfer delays |\n|---|---:|---:|")
    for group, (ops, trans) in tests.items():
        print(f"| {group} | {sum(p < ALPHA for p in ops)} / {len(ops)} | "
              f"{sum(p < ALPHA for p in trans)} / {len(trans)} |")
    measured = {k: run._measured(work, k, rounds)["measured_s"] for k in meta}
    for group in named:
        keys = [k for k in meta if meta[k]["group"] == group]
        for how in ("pooled", "median"):
            rows = attribute(cals[how], schedules, measured, keys)
            print(f"\n## {group}, op times {how} over rounds ({MODE}; points of error, means)\n")
            print("\n".join(_means(rows, "source")) + "\n")
            print("\n".join(_means(rows, "target")))


if __name__ == "__main__":
    main()
