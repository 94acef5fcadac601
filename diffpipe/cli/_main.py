"""The ``diffpipe`` command line: a thin shell over the library API.

Every command takes the machine from flags or a TOML file (``--config``; schema in README.md and
``examples/machine.toml``); ``--json`` prints strict JSON (``null`` where a number is undefined).
The contract (README, "The command line"):

- a bad input (a flag, a TOML key, a CSV cell, an output path, a size past ``--max-ops``) is one
  line ``diffpipe: error: ...`` on stderr naming the culprit, exit code 2, and no file changes;
- an unexpected failure is one line asking for a report, exit code 1 (``--debug``: the traceback);
- every output path is checked before any work starts, and a command's outputs are written all
  or none (``diffpipe._io.Staged``);
- sizes are checked against ``--max-ops`` before anything is generated.

JAX is imported only by commands that simulate.
"""



from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from .._errors import ConfigError, ScheduleError
from ._args import (
    DEFAULT_DEVICES,
    DEFAULT_MICROBATCHES,
    MACHINE_MODES,
    REPORT,
    _add_common,
    _add_machine,
    _add_schedule,
    _add_training,
    _count,
    _integer_at_least,
    _listed,
    _Parser,
    _Terminated,
    _UsageError,
)
from ._commands import (
    _cmd_calibrate,
    _cmd_compare,
    _cmd_export,
    _cmd_list,
    _cmd_optimize,
    _cmd_plan,
    _cmd_show,
    _cmd_simulate,
    _cmd_sweep,
)

_natural = _integer_at_least(0)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="diffpipe",
                     description="Pipeline-parallel schedules: show, simulate, compare, optimize, sweep and "
                                 "export them.",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, example: str, sizes: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {example}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        _add_common(p, sizes)
        return p

    p = command("list", "schedule families and their options", "diffpipe list --json", sizes=False)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_list)

    p = command("show", "the unit-time table of a schedule (F=1, B=2, I=W=1, no communication)",
                "diffpipe show interleaved-1f1b --devices 4 --microbatches 8 --option chunks=2")
    _add_schedule(p)
    p.add_argument("--config", metavar="TOML", help="take [schedule] from this file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_show)

    p = command("simulate", "simulate one step on a modelled machine",
                "diffpipe simulate 1f1b --devices 4 --microbatches 8 --forward 1e-3 --backward 2e-3 --p2p 1e-4")
    _add_schedule(p)
    _add_machine(p)
    _add_training(p)
    p.add_argument("--gantt", metavar="PNG|SVG", help="also draw a Gantt chart")
    p.add_argument("--trace", metavar="JSON", help="also write a Chrome/Perfetto trace")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_simulate)

    p = command("compare", "rank schedules at the formula, table and simulation levels; --microbatches counts "
                "samples for every family (seq1f1b and seq1f1b-i run --option segments=k units per sample, each "
                "priced at its segment's share), and each --option reaches the named families that declare it",
                "diffpipe compare 1f1b seq1f1b seq1f1b-i --devices 8 --microbatches 8 --option segments=4")
    p.add_argument("families", nargs="*",
                   help="families (default: dp.compare's, gpipe 1f1b chimera(sync=True) hanayo)")
    _add_schedule(p, positional=False)
    _add_machine(p)
    _add_training(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output")
    out.add_argument("--markdown", action="store_true", help="Markdown tables")
    p.set_defaults(run=_cmd_compare)

    p = command("optimize", "balance stages (and/or split microbatches) by gradient descent, verified exactly",
                "diffpipe optimize 1f1b --devices 4 --microbatches 8 --config examples/machine.toml")
    _add_schedule(p)
    _add_machine(p)
    p.add_argument("--knob", choices=["stages", "microbatches", "both"], default="stages")
    p.add_argument("--batch", type=_count, help="global batch for --knob microbatches (default microbatch x count)")
    p.add_argument("--steps", type=_count, help="gradient steps (default: dp.optimize's)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_optimize)

    p = command("sweep", "evaluate every combination of families, sizes and modes exactly",
                "diffpipe sweep --families gpipe,1f1b,zb-h1 --devices 4,8 --microbatches 8,16 --csv out.csv")
    p.add_argument("--families", help="comma-separated families (default all)")
    p.add_argument("--devices", help=f"comma-separated device counts (default {DEFAULT_DEVICES}, dp.sweep's)")
    p.add_argument("--microbatches",
                   help=f"comma-separated microbatch counts (default {DEFAULT_MICROBATCHES}, dp.sweep's)")
    p.add_argument("--modes", help="comma-separated communication modes (default the machine's)")
    p.add_argument("--option", action="append", default=[], metavar="NAME=V1,V2", help="a family option grid")
    _add_machine(p)
    p.add_argument("--csv", metavar="PATH", help="write the table as CSV")
    p.add_argument("--json-out", metavar="PATH", dest="json_out", help="write the table as JSON")
    p.add_argument("--markdown-out", metavar="PATH", dest="markdown_out", help="write the table as Markdown")
    p.add_argument("--limit", type=_natural, help="rows printed (default 40)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=_cmd_sweep)

    p = command("export", "write a schedule as torch CSV, a Gantt chart or a Perfetto trace",
                "diffpipe export 1f1b --devices 4 --microbatches 8 --csv 1f1b.csv")
    _add_schedule(p)
    _add_machine(p)
    p.add_argument("--csv", metavar="PATH", help="torch.distributed.pipelining compute-only CSV")
    p.add_argument("--gantt", metavar="PNG|SVG", help="Gantt chart of the simulated step")
    p.add_argument("--trace", metavar="JSON", help="Chrome/Perfetto trace of the simulated step")
    p.set_defaults(run=_cmd_export)
    p = command("plan", "search tensor x pipeline x data splits, schedules, microbatch sizes, recompute and ZeRO",
                "diffpipe plan --model llama-3-70b --gpus 256 --global-batch 256 --export megatron", sizes=False)
    _add_training(p, plan=True)
    p.add_argument("--families", type=_listed(), metavar="NAME[,NAME...]",
                   help="schedule families to search, comma-separated (default: dp.plan's)")
    p.add_argument("--headroom", type=float, default=0.1, help="memory fraction kept free (default 0.1)")
    p.add_argument("--balance-top", type=_natural, default=3, dest="balance_top",
                   help="balance the stages of the best N by gradient (default 3; 0: off)")
    p.add_argument("--top", type=_count, default=10, help="rows shown (default 10)")
    p.add_argument("--export", choices=["megatron", "torchtitan", "csv"], help="export the best configuration")
    p.add_argument("--out", metavar="PATH", help="write the export to PATH")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_plan)
    p = command("calibrate", "fit per-stage times, per-op overhead and p2p time from a torch.profiler trace",
                "diffpipe calibrate rank0.json rank1.json --schedule 1f1b --out machine.toml", sizes=False)
    p.add_argument("trace", nargs="+", help="Chrome trace JSON of a pipelined step, one file per rank")
    p.add_argument("--schedule", help="the schedule that ran (torch or diffpipe name, or a torch CSV)")
    p.add_argument("--predict", type=_listed(), metavar="NAME[,NAME...]",
                   help="schedules to predict, sized like the trace (torch or diffpipe names, torch CSVs)")
    p.add_argument("--mode", choices=MACHINE_MODES,
                   help="communication mode of the predictions and the machine file (default overlap; "
                        "torch-runtime: torch's pipelining runtime over gloo)")
    p.add_argument("--model", help="model preset whose FLOPs split a full backward into I and W")
    p.add_argument("--hf-config", dest="hf_config", metavar="PATH",
                   help="a Hugging Face config.json, instead of --model")
    p.add_argument("--out", metavar="TOML", help="write a machine file the other commands read (--config)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_calibrate)
    return parser


# -- errors -----------------------------------------------------------------------------------------
_JIT_ERRORS = ("EquinoxRuntimeError", "_EquinoxRuntimeError", "JaxRuntimeError", "XlaRuntimeError")


def _error_line(error: BaseException) -> tuple[int, str]:
    """The exit code and the one line for an exception the commands did not turn into ConfigError."""
    text = str(error)
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    if isinstance(error, MemoryError) or "RESOURCE_EXHAUSTED" in text:
        return 2, "diffpipe: error: out of memory; lower the sizes (or --max-ops)"
    if type(error).__name__ in _JIT_ERRORS:
        found = re.search(r"EquinoxRuntimeError: (.+)", text)
        if found:  # a check inside jit: its message names the culprit
            return 2, f"diffpipe: error: {found.group(1).strip()}"
    if isinstance(error, OSError):
        where = f"{error.filename}: " if error.filename else ""
        return 2, f"diffpipe: error: {where}{error.strerror or first}"
    return 1, f"diffpipe: internal error: {type(error).__name__}: {first}; {REPORT}"


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if not debug:  # jax logs a failed check inside jit as a traceback of its own
        logging.getLogger("jax._src.callback").setLevel(logging.CRITICAL)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    code, line, caught = 0, "", None
    try:
        args = build_parser().parse_args(argv)
        args.run(args)
    except _UsageError as error:
        code, line, caught = 2, f"diffpipe: error: {error}", error
    except (ScheduleError, ConfigError) as error:
        code, line, caught = 2, f"diffpipe: error: {error}", error
    except BrokenPipeError:  # e.g. piped into head: stop quietly
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as error:
        code, line, caught = 130, "diffpipe: interrupted (no file was changed)", error
    except _Terminated as error:
        code, line, caught = 143, "diffpipe: terminated (no file was changed)", error
    except Exception as error:
        (code, line), caught = _error_line(error), error
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if code:
        if debug and caught is not None:
            traceback.print_exception(caught)
        print(" ".join(line.split()), file=sys.stderr)
    return code

