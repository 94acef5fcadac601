"""Argument types, the usage error, and the flags shared by several subcommands."""


from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._checks import check_int
from .._choices import FLASH_KERNELS, FLASH_VERSIONS, FRAMEWORK_NAMES, MACHINE_MODES, RECOMPUTE, ZERO_STAGES
from .._errors import ConfigError
from ._guards import MAX_OPS

#: Sizes of the one-schedule commands (show, simulate, optimize, export) when neither a flag nor
#: ``[schedule]`` gives them: those of ``diffpipe.sweep`` (``schedules.get`` has none; a test
#: checks they agree). ``compare`` and ``sweep`` leave unset sizes to their library defaults.
DEFAULT_DEVICES = 4
DEFAULT_MICROBATCHES = 8
#: The sequence length of a training configuration when neither a flag nor a file gives one: the
#: pre-training length of today's open recipes (Llama 3: 8,192 tokens before its long-context
#: stage, Dubey et al. 2024 §3.4; Megatron-LM's and torchtitan's Llama 3 examples train at 8,192),
#: not the model's longest context (131,072 in a Llama 3.1 config.json). ``--sequence max`` asks for that.
DEFAULT_SEQUENCE = 8192
#: Fused (flash) attention unless ``--no-flash-attention``: Megatron-LM's default attention backend
#: and torchtitan's SDPA both run a fused kernel, storing no ``s x s`` tensors.
DEFAULT_FLASH_ATTENTION = True
#: The units of the sweep table's numeric columns (``SweepResult`` stores SI units).
SWEEP_UNITS = ("units: makespan in s, throughput in microbatches/s, peak memory in GB (10^9 bytes), bubble in % of "
               "the makespan (--csv and --json-out keep SI units: s, bytes, a fraction)")
REPORT = "please report this at the diffpipe issue tracker (rerun with --debug for the traceback)"


class _UsageError(Exception):
    """A command-line syntax error (argparse's), printed as one line."""


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that every ``finally`` (temporary files) runs."""


class _Parser(argparse.ArgumentParser):
    """argparse, with one-line errors and no abbreviations: ``--mode`` never becomes ``--model``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # argparse prints usage + message over two lines
        command = self.prog.removeprefix("diffpipe").strip()
        raise _UsageError(f"{command}: {message}" if command else message)


# -- command-line values -------------------------------------------------------------------------
def _integer_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


_count = _integer_at_least(1)


def _sequence(text: str) -> int | str:
    """``--sequence``: tokens per sample, or ``max`` (the model's longest context)."""
    if text.strip().lower() == "max":
        return "max"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'max', got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (a number >= 0), got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected seconds (a finite number >= 0), got {text!r}")
    return value


def _number_in(low: float, high: float = math.inf) -> Callable[[str], float]:
    """A finite number in ``[low, high]`` (``--jitter``, ``--slow-fraction``, ``--slow-factor``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low <= value <= high):
            bound = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text!r}")
        return value

    return parse


def _value(raw: str) -> object:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            pass
    return raw


def _family_options(pairs: Sequence[str]) -> dict[str, object]:
    """``--option chunks=2`` -> ``{"chunks": 2}`` (ints, floats, booleans, else strings)."""
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key or not raw:
            raise ConfigError(f"--option {pair!r}: expected NAME=VALUE")
        options[key.replace("-", "_")] = _value(raw)
    return options


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected comma-separated integers") from None
    for v in values:
        check_int(f"{flag} {text!r}: each", v, 1)
    return values


def _names(text: str, flag: str) -> list[str]:
    names = [x.strip() for x in text.split(",")]
    if not text.strip() or not all(names):
        raise ConfigError(f"{flag} {text!r}: expected comma-separated names, none empty")
    return names


# -- a training configuration (--model/--hf-config, --tp/--pp/--dp, ...) -----------------------------
@dataclass(frozen=True)
class _Flag:
    """One flag of a training configuration, for every command that takes it: ``simulate`` and
    ``compare`` (one value, also the TOML key ``key`` of ``[section]``) and ``plan`` (``search``:
    ``"one"`` value, a comma-separated ``"list"`` of values to search, ``"both"`` for a switch
    searched on and off; None: not a plan flag). ``parse`` and ``choices`` check one value in
    both; ``default`` is what plan searches when the flag is absent; ``alias`` plan's older name;
    ``machine``: simulate and compare take it from their machine group (``_add_machine``)."""

    flag: str
    key: str
    section: str | None
    help: str
    parse: Callable[[str], Any] | None = None
    choices: tuple[Any, ...] | None = None
    switch: bool = False
    metavar: str | None = None
    search: str | None = "one"
    default: str = ""
    alias: str | None = None
    machine: bool = False


def _zero(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a ZeRO stage 0, 1, 2 or 3, got {text!r}") from None


_CONFIG_FLAGS = (
    _Flag("--model", "model", "training", "model preset (llama-3-70b, mixtral-8x7b, ...; all: diffpipe list models)"),
    _Flag("--hf-config", "hf_config", "training", "a Hugging Face config.json", metavar="PATH"),
    _Flag("--sequence", "sequence", "training", f"tokens per sample (default {DEFAULT_SEQUENCE:,}; 'max': the "
          "model's longest context)", _sequence, metavar="N|max"),
    _Flag("--microbatch-size", "microbatch_size", "training", "samples per microbatch", _count, search="list",
          default="1,2,4,8", alias="--microbatch-sizes"),
    _Flag("--global-batch", "global_batch", "training", "samples per optimizer step", _count),
    _Flag("--recompute", "recompute", "training", "activation recomputation", choices=RECOMPUTE,
          search="list", default="all"),
    _Flag("--framework", "framework", "training", "the training framework whose communication overlap and gradient "
          "reduction precision are priced (megatron: its README's overlap flags, fp32 reduction; torchtitan, fsdp: "
          "FSDP per block; ddp: 25 MiB buckets; default none: nothing overlapped)", choices=FRAMEWORK_NAMES,
          default="none"),
    _Flag("--flash-attention", "flash_attention", "training", "fused attention, no s x s tensors stored (default: "
          "on; --no-flash-attention: off)", switch=True),
    _Flag("--flash-version", "flash_version", "training", "the fused attention kernel priced: "
          + ", ".join(f"{k} {v}" for k, v in FLASH_KERNELS.items()) + " (default: the --framework's, else 3; "
          "on a GPU without a kernel of its own 3 prices FlashAttention-2)", int, choices=FLASH_VERSIONS),
    _Flag("--tp", "tensor", "parallelism", "tensor-parallel size", _count, search="list",
          default="every divisor of a node"),
    _Flag("--pp", "pipeline", "parallelism", "pipeline-parallel size", _count, search="list",
          default="every divisor up to the layers"),
    _Flag("--cp", "context", "parallelism", "context-parallel size: the sequence split over cp ranks next to the "
          "tensor group (ring attention; needs flash attention and a sequence divisible by 2 x cp)", _count,
          search="list", default="1; from sequence 16,384, powers of 2 down to 4,096 tokens per rank"),
    _Flag("--dp", "data", "parallelism", "data-parallel size (default: --gpus / (tp x cp x pp))", _count,
          search=None),
    _Flag("--ep", "expert", "parallelism", "expert-parallel size (etp x ep divides tp x cp x dp: Megatron's "
          "parallel folding)", _count, search="list",
          default="every divisor of dp and the experts; with --etp, of tp x cp x dp / etp"),
    _Flag("--etp", "expert_tensor", "parallelism", "expert tensor-parallel size (Megatron "
          "--expert-tensor-parallel-size; default: --tp)", _count, search="list", default="--tp"),
    _Flag("--vpp", "virtual", "parallelism", "model chunks per pipeline device", _count, search="list",
          default="2,4 for families with chunks"),
    _Flag("--zero", "zero", "parallelism", "ZeRO stage (1: Megatron's distributed optimizer)", _zero,
          choices=ZERO_STAGES, search="list", default="all"),
    _Flag("--sequence-parallel", "sequence_parallel", "parallelism",
          "Megatron's sequence parallelism in the tensor group", switch=True, search="both"),
    _Flag("--gpus", "gpus", "cluster", "GPUs in the cluster (simulate, compare: default tp x cp x pp x dp; plan: "
          "required, or --cluster)", _count),
    _Flag("--cluster", "cluster", None, "GPUs and device preset at once, e.g. 64xH100 (devices: diffpipe list "
          "devices)", metavar="GPUSxDEVICE"),
    _Flag("--device", "device", "cluster", "device preset (default H100; all: diffpipe list devices)", machine=True),
    _Flag("--intra", "intra", "cluster", "intra-node link preset (default nvlink4; all: diffpipe list networks)",
          machine=True),
    _Flag("--inter", "inter", "cluster", "inter-node link preset (default ib-ndr; all: diffpipe list networks)",
          machine=True),
    _Flag("--devices-per-node", "devices_per_node", "cluster",
          "GPUs per node (default: the intra link's switch domain, 8 for NVLink)", _count, machine=True),
)


def _keys(section: str) -> dict[str, str]:
    """``[section]`` key -> its flag (the flag's dest is the key)."""
    return {f.key: f.flag for f in _CONFIG_FLAGS if f.section == section}


_TRAINING_FLAGS = _keys("training")
_PARALLEL_FLAGS = _keys("parallelism")
_CLUSTER_FLAGS = _keys("cluster")
_CLUSTER_SHAPE = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*([A-Za-z][\w.-]*)|([A-Za-z][\w.-]*?)\s*[xX]\s*(\d+))\s*$")


def _listed(parse: Callable[[str], Any] | None = None,
            choices: Sequence[Any] | None = None) -> Callable[[str], list[Any]]:
    """An argparse type for comma-separated values, each checked as one value is (``parse``,
    ``choices``): how plan takes a flag that simulate takes once."""
    def values(text: str) -> list[Any]:
        items = [x.strip() for x in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"expected comma-separated values, none empty, got {text!r}")
        out = [parse(x) if parse else x for x in items]
        for raw, value in zip(items, out):
            if choices is not None and value not in choices:
                raise argparse.ArgumentTypeError(f"{raw!r} is not one of {', '.join(map(str, choices))}")
        return out

    return values


def _add_training(p: argparse.ArgumentParser, plan: bool = False) -> None:
    """The training-configuration flags of ``simulate``/``compare`` (one value each), or of ``plan``
    (lists where it searches; ``_Flag``)."""
    if plan:
        g = p.add_argument_group("training configuration (lists: comma-separated values to search)")
    else:
        g = p.add_argument_group("training configuration (flags override [training], [parallelism], [cluster]; "
                                 "see examples/llama3-70b.toml)")
    for f in _CONFIG_FLAGS:
        if (f.machine and not plan) or (plan and f.search is None):
            continue
        names = [f.flag] + ([f.alias] if plan and f.alias else [])
        if plan and f.search == "both":
            g.add_argument(*names, dest=f.key, action=argparse.BooleanOptionalAction, default=None,
                           help=f"{f.help}: only with it, or only without (default: search both)")
        elif f.switch:
            g.add_argument(*names, dest=f.key, action=argparse.BooleanOptionalAction, default=None, help=f.help)
        elif plan and f.search == "list":
            g.add_argument(*names, dest=f.key, type=_listed(f.parse, f.choices),
                           metavar=f.metavar or ("N[,N...]" if f.parse else "NAME[,NAME...]"),
                           help=f"{f.help}: comma-separated values to search (default: {f.default})")
        else:
            g.add_argument(*names, dest=f.key, type=f.parse, choices=f.choices, metavar=f.metavar, help=f.help)


# -- parser ---------------------------------------------------------------------------------------
def _add_common(p: argparse.ArgumentParser, sizes: bool = True) -> None:
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the traceback of an error")
    p.add_argument("--no-cache", action="store_true", default=argparse.SUPPRESS, dest="no_cache",
                   help="do not keep compiled programs or stage-balancing results on disk for the next run "
                        "(also DIFFPIPE_CACHE=0; "
                        "DIFFPIPE_CACHE_DIR moves the cache; see 'diffpipe cache info')")
    if sizes:
        p.add_argument("--max-ops", type=_count, default=MAX_OPS, dest="max_ops", metavar="N",
                       help=f"refuse work estimated past N ops before starting (default {MAX_OPS:,})")


def _add_schedule(p: argparse.ArgumentParser, positional: bool = True) -> None:
    if positional:
        p.add_argument("family", nargs="?", help="schedule family (see 'diffpipe list')")
    p.add_argument("--devices", type=_count,
                   help=f"pipeline devices (default {DEFAULT_DEVICES}; compare: the library's)")
    p.add_argument("--microbatches", type=_count,
                   help=f"microbatches per step (default {DEFAULT_MICROBATCHES}; compare: the library's)")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE", help="a family option")
    if positional:
        p.add_argument("--torch-csv", dest="torch_csv", metavar="PATH",
                       help="read the schedule from a torch.distributed.pipelining CSV instead")


def _add_machine(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="TOML", help="machine/schedule file (see examples/machine.toml)")
    g = p.add_argument_group("machine (flags override --config)")
    g.add_argument("--forward", type=_seconds, help="seconds per stage forward (simple times model)")
    g.add_argument("--backward", type=_seconds, help="seconds per stage input-gradient backward")
    g.add_argument("--weight", type=_seconds, help="seconds per stage weight-gradient backward")
    g.add_argument("--p2p", type=_seconds, help="seconds per cross-device transfer")
    g.add_argument("--device", help="device preset (A100, H100, H200, B200, MI300X, ...; all: diffpipe list devices)")
    g.add_argument("--intra", help="intra-node network preset (nvlink4, ...; all: diffpipe list networks)")
    g.add_argument("--inter", help="inter-node network preset (ib-ndr, ...; all: diffpipe list networks)")
    g.add_argument("--devices-per-node", type=_count, dest="devices_per_node")
    g.add_argument("--mode", choices=MACHINE_MODES, help="communication model")

