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

The modes live here, not in ``diffpipe``: on these traces they did not make every group better
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402
import transfers  # noqa: E402

from diffpipe._engine._communication import transfer_order  # noqa: E402  (the lanes' issue order)
from diffpipe.calibrate import TorchRuntime  # noqa: E402


def _lanes(schedule, lane) -> list:
    """``(waiter, waited)`` pairs chaining each lane's transfers in issue order."""
    return [pair for queue in transfer_order(schedule, lane).values() for pair in zip(queue[1:], queue[:-1])]


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


if __name__ == "__main__":
    main()
