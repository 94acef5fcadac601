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

import _thread
import argparse
import gc
import logging
import os
import re
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Sequence
from typing import Any

from .. import _io
from .._caches import enable_compilation_cache
from .._choices import MACHINE_MODES
from .._errors import ConfigError, ScheduleError
from ._args import (
    DEFAULT_DEVICES,
    DEFAULT_MICROBATCHES,
    REPORT,
    _add_common,
    _add_machine,
    _add_schedule,
    _add_training,
    _count,
    _integer_at_least,
    _listed,
    _number_in,
    _Parser,
    _Terminated,
    _UsageError,
)
from ._cache import _cmd_cache
from ._calibrate import _cmd_calibrate
from ._compare import _cmd_compare
from ._export import _cmd_export
from ._list import _cmd_list
from ._optimize import _cmd_optimize
from ._plan import _cmd_plan
from ._show import _cmd_show
from ._simulate import _cmd_simulate
from ._sweep import _cmd_sweep

_natural = _integer_at_least(0)
#: ``diffpipe._plan._configuration.HEADROOM``, copied so that parsing never imports JAX (tested).
HEADROOM = 0.1
#: What ``diffpipe list`` lists.
LISTS = ("families", "devices", "networks", "models")


def _version() -> str:
    """The installed distribution's version (``pyproject.toml``), without importing the package's JAX parts."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("diffpipe")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="diffpipe",
                     description="Pipeline-parallel schedules: show, simulate, compare, optimize, sweep and "
                                 "export them.",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument("--no-cache", action="store_true", dest="no_cache",
                        help="do not keep compiled programs or stage-balancing results on disk (also DIFFPIPE_CACHE=0)")
    parser.add_argument("--version", action="version", version=f"diffpipe {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, example: str, sizes: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {example}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        _add_common(p, sizes)
        return p

    p = command("list", "schedule families and their options, or the device, network and model presets",
                "diffpipe list devices --json", sizes=False)
    p.add_argument("what", nargs="?", choices=LISTS, default="families",
                   help="what to list (default families)")
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
    g = p.add_argument_group("random op times (a training configuration; dp.Jitter, docs/cost-model.md)")
    g.add_argument("--jitter", type=_number_in(0.0), metavar="CV",
                   help="coefficient of variation of every compute op: also report the expected and 95th-"
                        "percentile step by batched Monte Carlo")
    g.add_argument("--slow-fraction", type=_number_in(0.0, 1.0), dest="slow_fraction", metavar="P",
                   help="probability that a GPU is a straggler in a step (default 0)")
    g.add_argument("--slow-factor", type=_number_in(1.0), dest="slow_factor", metavar="X",
                   help="how much longer a straggler's compute ops last (default 1.1 with --slow-fraction)")
    g.add_argument("--samples", type=_count, default=512, help="Monte Carlo samples (default 512)")
    g.add_argument("--seed", type=_integer_at_least(0), default=0, help="random seed (default 0)")
    p.add_argument("--headroom", type=float, default=HEADROOM,
                   help=f"memory fraction kept free for 'fits' (default {HEADROOM}, plan's rule)")
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
    p.add_argument("--headroom", type=float, default=HEADROOM,
                   help=f"memory fraction kept free (default {HEADROOM}, the rule simulate's 'fits' uses)")
    p.add_argument("--balance-top", type=_natural, default=3, dest="balance_top",
                   help="balance the stages of the best N by gradient (default 3; 0: off)")
    p.add_argument("--top", type=_count, default=10, help="rows shown (default 10)")
    p.add_argument("--export", choices=["megatron", "torchtitan", "torchtitan-v0.2", "csv"],
                   help="export the best configuration: Megatron-LM arguments, a torchtitan Python configuration "
                        "(torchtitan main, Python configs since 9810191bb), torchtitan v0.2.0-v0.2.2's TOML, or "
                        "the torch CSV")
    p.add_argument("--torchtitan-base", metavar="MODULE:FUNCTION", dest="torchtitan_base",
                   help="the model's own torchtitan configuration the torchtitan export sets the plan on "
                        "(default for llama-3-8b/70b, llama-3.1-405b, deepseek-v3: torchtitan's)")
    p.add_argument("--out", metavar="PATH", help="write the export to PATH")
    p.add_argument("--report", metavar="HTML",
                   help="write one self-contained HTML page: step time against memory by family, the best "
                        "configuration's Gantt chart and breakdown, its Megatron-LM and torchtitan exports")
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
    p = command("cache", "the compiled programs and stage-balancing results kept on disk between runs: where, "
                "how many, how large; or "
                "remove them (DIFFPIPE_CACHE=0 or --no-cache: keep none; DIFFPIPE_CACHE_DIR=PATH: keep them there)",
                "diffpipe cache info", sizes=False)
    p.add_argument("action", choices=["info", "clear"], help="info: path, entries and size; clear: remove them")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_cache)
    return parser


#: The commands that compile with JAX (export only with --gantt or --trace).
_COMPILING = ("simulate", "compare", "optimize", "sweep", "plan", "calibrate")


def _compiles(args: argparse.Namespace) -> bool:
    if args.command == "export":
        return bool(args.gantt or args.trace)
    return args.command in _COMPILING


def _keep_compiled(args: argparse.Namespace) -> None:
    """JAX's persistent compilation cache for a command that compiles, unless turned off."""
    if getattr(args, "no_cache", False) or not _compiles(args):
        return
    enable_compilation_cache()


# -- errors -----------------------------------------------------------------------------------------
_JIT_ERRORS = ("EquinoxRuntimeError", "_EquinoxRuntimeError", "JaxRuntimeError", "XlaRuntimeError")


def _signal_in_chain(error: BaseException) -> BaseException | None:
    """The signal's exception (``_Terminated``, ``KeyboardInterrupt``) that ``error`` was raised while
    handling, if any: a signal landing inside an import or an extension's initialisation comes back
    wrapped (e.g. numpy's ``ImportError``)."""
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        if isinstance(link, (_Terminated, KeyboardInterrupt)):
            return link
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return None


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


#: Seconds a command has to unwind after SIGTERM or Ctrl-C (its ``finally`` blocks remove its
#: temporary files) before the process ends itself: the exception a signal raises can land inside
#: a callback that swallows it (JAX's garbage-collection callback), or never be raised while the
#: main thread waits inside a long compiled call.
GRACE_S = 1.5
_ENDED = {signal.SIGTERM: (143, "terminated"), signal.SIGINT: (130, "interrupted")}


def _in_callback(frame: Any) -> bool:
    """Whether ``frame`` runs inside a callback whose exceptions Python swallows (a
    garbage-collection callback such as JAX's, or a ``__del__``)."""
    codes = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in codes or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _again(signum: int) -> None:
    """Deliver ``signum`` to the main thread again shortly (after the callback it hit returned)."""
    timer = threading.Timer(0.01, _thread.interrupt_main, args=(signum,))
    timer.daemon = True
    timer.start()


def _on_signal(signum: int, frame: Any) -> None:
    if _in_callback(frame):
        _again(signum)
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise _Terminated()


class _Signals:
    """SIGTERM and SIGINT for one ``main`` call: the handler raises (``_Terminated``,
    ``KeyboardInterrupt``) so that the command unwinds; a watcher thread, woken by the signal
    itself (``signal.set_wakeup_fd``: it wakes even while the main thread is inside C code),
    gives it ``GRACE_S`` seconds, then removes the staged temporary files and ends the process
    with the signal's exit code (143, 130). Only in the main thread; a no-op elsewhere."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.previous: dict[int, Any] = {}
        self.pipe: tuple[int, int] | None = None
        self.wakeup = -1
        self.hook = sys.unraisablehook

    def __enter__(self) -> _Signals:
        if threading.current_thread() is not threading.main_thread():
            return self
        self.pipe = os.pipe()
        os.set_blocking(self.pipe[1], False)
        self.wakeup = signal.set_wakeup_fd(self.pipe[1], warn_on_full_buffer=False)
        for signum in _ENDED:
            self.previous[signum] = signal.signal(signum, _on_signal)
        self.hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        threading.Thread(target=self._watch, args=(self.pipe[0],), name="diffpipe-signals", daemon=True).start()
        return self

    def _unraisable(self, unraisable: Any) -> None:
        """A signal's exception raised inside a callback that cannot raise (a garbage-collection
        callback, ``__del__``): send the signal again, so that it lands where it unwinds."""
        error = unraisable.exc_value
        if isinstance(error, (_Terminated, KeyboardInterrupt)):
            if not self.done.is_set():
                _again(signal.SIGTERM if isinstance(error, _Terminated) else signal.SIGINT)
        else:
            self.hook(unraisable)

    def _watch(self, read: int) -> None:
        try:
            while True:
                data = os.read(read, 64)
                if not data or self.done.is_set():
                    return
                ended = [_ENDED[s] for s in data if s in _ENDED]
                if ended:
                    break
            if self.done.wait(GRACE_S):
                return
            code, word = ended[0]
            _io.remove_temporaries()
            os.write(2, f"diffpipe: {word} (no file was changed)\n".encode())
            os._exit(code)
        except OSError:
            return
        finally:
            try:
                os.close(read)
            except OSError:
                pass

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        if self.pipe is None:
            return
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = self.hook
        signal.set_wakeup_fd(self.wakeup)
        os.close(self.pipe[1])  # the watcher reads the end of the pipe and returns
        self.pipe = None


def main(argv: Sequence[str] | None = None) -> int:
    program = argv is None  # the process itself (the console script, ``python -m diffpipe``)
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if not debug:  # jax logs a failed check inside jit as a traceback of its own
        logging.getLogger("jax._src.callback").setLevel(logging.CRITICAL)
    code, line, caught = 0, "", None
    signals = _Signals().__enter__()
    quiet = warnings.catch_warnings()
    quiet.__enter__()
    if not debug:  # a number past float32's range is named by the check that meets it, in one line
        warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
    try:
        args = build_parser().parse_args(argv)
        _keep_compiled(args)
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
        signalled = _signal_in_chain(error)
        if isinstance(signalled, _Terminated):
            code, line, caught = 143, "diffpipe: terminated (no file was changed)", error
        elif isinstance(signalled, KeyboardInterrupt):
            code, line, caught = 130, "diffpipe: interrupted (no file was changed)", error
        else:
            (code, line), caught = _error_line(error), error
    finally:
        quiet.__exit__(None, None, None)
        signals.__exit__()
    if code:
        if debug and caught is not None:
            traceback.print_exception(caught)
        print(" ".join(line.split()), file=sys.stderr)
    if program and code in (130, 143):
        # Ended by a signal mid-work: leave without the interpreter's shutdown, where XLA's threads,
        # stopped inside a compilation, can crash the process (seen: SIGSEGV after the line above).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code

