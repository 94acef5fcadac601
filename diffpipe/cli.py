"""The ``diffpipe`` command line: a thin shell over the library API.

Errors are one line on stderr and a non-zero exit, never a traceback. JAX is imported only by
commands that simulate.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ._errors import ConfigError, ScheduleError


def _family_options(pairs: Sequence[str]) -> dict[str, object]:
    """``--option chunks=2`` -> ``{"chunks": 2}`` (ints, floats, booleans, else strings)."""
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option {pair!r}: expected NAME=VALUE")
        value: object = raw
        for convert in (int, float):
            try:
                value = convert(raw)
                break
            except ValueError:
                pass
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        options[key.replace("-", "_")] = value
    return options


def _cmd_list(args: argparse.Namespace) -> None:
    from . import schedules

    rows = []
    for name in schedules.names():
        fam = schedules.family(name)
        rows.append({"name": name, "summary": fam.summary, "options": dict(fam.options),
                     "asynchronous": fam.asynchronous, "source": fam.source})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['summary']}")
        for opt, doc in r["options"].items():
            print(f"{'':<{width}}    --option {opt}=...  {doc}")


def _cmd_show(args: argparse.Namespace) -> None:
    from . import schedules

    schedule = schedules.get(
        args.family, devices=args.devices, microbatches=args.microbatches, **_family_options(args.option)
    )
    t = schedules.table(schedule)
    if args.json:
        print(json.dumps({
            "family": schedule.family, "devices": schedule.devices, "stages": schedule.stages,
            "microbatches": schedule.microbatches, "makespan": t.makespan, "bubble_ratio": t.bubble_ratio,
            "orders": [[str(op) for op in order] for order in schedule.orders],
        }, indent=2))
    else:
        print(t)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diffpipe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="schedule families and their options",
                       epilog="example: diffpipe list --json")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_list)

    p = sub.add_parser("show", help="the unit-time table of a schedule",
                       epilog="example: diffpipe show interleaved-1f1b --devices 4 --microbatches 8 --option chunks=2")
    p.add_argument("family")
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE", help="a family option")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (ScheduleError, ConfigError) as error:
        print(f"diffpipe: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
