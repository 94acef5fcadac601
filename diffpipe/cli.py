"""The ``diffpipe`` command line: a thin shell over the library API.

Every command takes the machine from flags or a TOML file (``--config``; schema in README.md and
``examples/machine.toml``); ``--json`` prints stable machine-readable output. Errors are one line
on stderr with exit code 2, never a traceback. JAX is imported only by commands that simulate.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import ConfigError, ScheduleError

DEFAULT_COMPARE = ("gpipe", "1f1b", "chimera", "hanayo")


# -- option parsing ------------------------------------------------------------------------------
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
        if not sep or not key:
            raise ConfigError(f"--option {pair!r}: expected NAME=VALUE")
        options[key.replace("-", "_")] = _value(raw)
    return options


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not values:
        raise ConfigError(f"{flag} is empty")
    return values


# -- the machine: TOML file and flags --------------------------------------------------------------
_SECTIONS = {
    "schedule": {"family", "devices", "microbatches", "options"},
    "times": {"forward", "backward", "weight", "p2p", "update", "overhead"},
    "model": {"layers", "hidden", "heads", "sequence", "vocabulary", "microbatch", "dtype_bytes",
              "ffn_multiplier", "recompute", "tied_embedding"},
    "device": {"preset", "peak_flops", "memory", "efficiency"},
    "network": {"intra", "inter", "devices_per_node", "mode", "latency", "bandwidth",
                "inter_latency", "inter_bandwidth"},
}


def _load_config(path: str | None) -> dict[str, dict[str, Any]]:
    """Read and check a TOML machine file: known sections and keys only."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--config {path}: malformed TOML: {error}") from None
    for section, body in data.items():
        if section not in _SECTIONS:
            raise ConfigError(f"{path}: unknown section [{section}]; known: {', '.join(_SECTIONS)}")
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: [{section}] must be a table")
        unknown = set(body) - _SECTIONS[section]
        if unknown:
            raise ConfigError(f"{path}: unknown key {sorted(unknown)[0]!r} in [{section}]; "
                              f"known: {', '.join(sorted(_SECTIONS[section]))}")
    if "times" in data and ("model" in data or "device" in data):
        raise ConfigError(f"{path}: give either [times] or [model]/[device], not both")
    return data


@dataclass(frozen=True)
class _Machine:
    """``schedule -> Hardware`` from the merged configuration, and a name for reports."""

    name: str
    hardware: Callable[[Any], Any]
    model: Any = None
    device: Any = None
    network: Any = None


def _machine(args: argparse.Namespace, config: dict[str, dict[str, Any]]) -> _Machine:
    import jax.numpy as jnp

    from . import _presets
    from ._compare import Machine, default_machine
    from ._hardware import Hardware, Network
    from ._transformer import Transformer

    times = dict(config.get("times", {}))
    for key in ("forward", "backward", "weight", "p2p"):
        if getattr(args, key, None) is not None:
            times[key] = getattr(args, key)
    net = dict(config.get("network", {}))
    for key in ("intra", "inter", "devices_per_node", "mode"):
        if getattr(args, key, None) is not None:
            net[key] = getattr(args, key)
    mode = net.get("mode", "overlap")
    model_cfg = dict(config.get("model", {}))
    dev_cfg = dict(config.get("device", {}))
    if getattr(args, "device", None):
        dev_cfg["preset"] = args.device
    if times:
        presets = sorted(set(net) & {"intra", "inter", "devices_per_node"})
        if presets:
            raise ConfigError(f"per-stage times take --p2p for transfers; {presets[0]} needs a model and device")
        if "forward" not in times or "backward" not in times:
            raise ConfigError("times: give both forward and backward (seconds per stage)")
        if model_cfg or dev_cfg:
            raise ConfigError("give either per-stage times (--forward/--backward) or a model and device, not both")

        def from_times(schedule: Any) -> Any:
            return Hardware.from_times(times["forward"], times["backward"], times.get("weight"),
                                       times.get("p2p", 0.0), update=times.get("update", 0.0),
                                       overhead=times.get("overhead", 0.0), mode=mode)

        label = f"times F={times['forward']} B={times['backward']} W={times.get('weight', 0)} " \
                f"p2p={times.get('p2p', 0)} ({mode})"
        return _Machine(label, from_times)
    if not model_cfg and not dev_cfg and not net:
        m = default_machine()
        return _Machine(m.name, m, m.model, m.device, m.network)
    base = default_machine(mode)
    try:
        model = Transformer(**{**base.model.__dict__, **model_cfg}) if model_cfg else base.model
    except TypeError as error:
        raise ConfigError(f"model: {error}") from None
    if "preset" in dev_cfg:
        device = _presets.device(dev_cfg.pop("preset"), efficiency=dev_cfg.pop("efficiency", None))
    else:
        device = base.device
    if dev_cfg:
        raise ConfigError(f"device: give a preset (and efficiency); custom keys {sorted(dev_cfg)} need a preset")
    if ("inter" in net or "devices_per_node" in net) and "intra" not in net and "latency" not in net:
        raise ConfigError("--inter/--devices-per-node need --intra (the intra-node network preset)")
    if "intra" in net:
        network = _presets.network(net["intra"], net.get("inter"), devices_per_node=net.get("devices_per_node", 8),
                                   mode=mode)
    elif "latency" in net or "bandwidth" in net:
        lat = jnp.asarray(float(net.get("latency", 0.0)))
        bw = jnp.asarray(float(net.get("bandwidth", math.inf)))
        network = Network(lat, bw, jnp.asarray(float(net.get("inter_latency", lat))),
                          jnp.asarray(float(net.get("inter_bandwidth", bw))), mode=mode,
                          devices_per_node=net.get("devices_per_node"))
    else:
        network = base.network if mode == base.network.mode else default_machine(mode).network
    label = f"{model.layers}-layer model (h={model.hidden}) on {getattr(device, 'name', 'a custom device')}"
    m = Machine(model, device, network, name=label)
    return _Machine(m.name, m, model, device, network)


def _schedule(args: argparse.Namespace, config: dict[str, dict[str, Any]]) -> Any:
    from . import schedules

    section = config.get("schedule", {})
    if getattr(args, "torch_csv", None):
        return schedules.from_torch_csv(args.torch_csv)
    family = args.family or section.get("family")
    if not family:
        raise ConfigError("no schedule family: give one (see 'diffpipe list') or [schedule] family in --config")
    options = {**section.get("options", {}), **_family_options(args.option)}
    devices = args.devices if args.devices is not None else section.get("devices", 4)
    microbatches = args.microbatches if args.microbatches is not None else section.get("microbatches", 8)
    return schedules.get(family, devices=devices, microbatches=microbatches, **options)


# -- commands --------------------------------------------------------------------------------------
def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=float))


def _cmd_list(args: argparse.Namespace) -> None:
    from . import schedules

    rows = []
    for name in schedules.names():
        fam = schedules.family(name)
        rows.append({"name": name, "summary": fam.summary, "options": {o.name: o.describe() for o in fam.options},
                     "asynchronous": fam.asynchronous, "source": fam.source})
    if args.json:
        _print_json(rows)
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['summary']}")
        for opt, doc in r["options"].items():
            print(f"{'':<{width}}    --option {opt}=...  {doc}")


def _cmd_show(args: argparse.Namespace) -> None:
    from . import schedules

    schedule = _schedule(args, _load_config(args.config))
    t = schedules.table(schedule)
    if args.json:
        _print_json({
            "family": schedule.family, "devices": schedule.devices, "stages": schedule.stages,
            "microbatches": schedule.microbatches, "makespan": t.makespan, "bubble_ratio": t.bubble_ratio,
            "peak_activations": list(schedules.peak_activations(schedule)),
            "orders": [[str(op) for op in order] for order in schedule.orders],
        })
    else:
        print(t)


def _simulation_summary(schedule: Any, result: Any, machine: _Machine) -> dict[str, Any]:
    import numpy as np

    makespan = float(result.makespan)
    out = {
        "family": schedule.family, "options": dict(schedule.options), "devices": schedule.devices,
        "stages": schedule.stages, "microbatches": schedule.microbatches, "steps": schedule.steps,
        "machine": machine.name, "makespan_s": makespan,
        "microbatches_per_s": schedule.microbatches / makespan if makespan > 0 else None,
        "bubble_ratio": float(result.bubble_ratio),
        "busy_s": [float(x) for x in np.asarray(result.busy)],
        "peak_memory_bytes": [float(x) for x in np.asarray(result.peak_memory)],
        "peak_activations": [int(x) for x in np.asarray(result.peak_activations)],
        "fits": [bool(x) for x in np.asarray(result.fits)],
        "communication_bytes": float(result.communication_bytes),
    }
    if schedule.steps > 1:
        out["step_period_s"] = [float(x) for x in np.asarray(result.period)]
        out["max_staleness"] = max(result.staleness.values(), default=0)
    return out


def _cmd_simulate(args: argparse.Namespace) -> None:
    from ._simulate import simulate

    config = _load_config(args.config)
    schedule = _schedule(args, config)
    machine = _machine(args, config)
    hw = machine.hardware(schedule)
    result = simulate(schedule, hw)
    summary = _simulation_summary(schedule, result, machine)
    _write_pictures(args, schedule, hw, result)
    if args.json:
        _print_json(summary)
        return
    gib = 2**30
    print(f"{schedule.family} {dict(schedule.options) or ''} on {machine.name}".replace("  ", " "))
    rate = summary["microbatches_per_s"]
    print(f"  makespan       {summary['makespan_s'] * 1e3:.3f} ms  ({rate:.1f} microbatches/s)")
    print(f"  bubble ratio   {summary['bubble_ratio']:.3f}")
    print(f"  communication  {summary['communication_bytes'] / gib:.3f} GiB")
    if "step_period_s" in summary:
        periods = ", ".join(f"{p * 1e3:.3f}" for p in summary["step_period_s"])
        print(f"  step period    {periods} ms   max staleness {summary['max_staleness']}")
    print("  device  busy(ms)  peak memory(GiB)  activations  fits")
    for d in range(schedule.devices):
        print(f"  {d:>6}  {summary['busy_s'][d] * 1e3:8.3f}  {summary['peak_memory_bytes'][d] / gib:16.2f}"
              f"  {summary['peak_activations'][d]:11d}  {'yes' if summary['fits'][d] else 'NO'}")


def _write_pictures(args: argparse.Namespace, schedule: Any, hw: Any, result: Any) -> None:
    subject = schedule if result is None else result
    if getattr(args, "gantt", None):
        from .viz import gantt

        gantt(subject, hw, path=args.gantt, schedule=schedule)
    if getattr(args, "trace", None):
        from .viz import trace

        trace(subject, hw, path=args.trace, schedule=schedule)


def _cmd_compare(args: argparse.Namespace) -> None:
    from ._compare import compare

    config = _load_config(args.config)
    machine = _machine(args, config)
    families = args.families or list(DEFAULT_COMPARE)
    comparison = compare(families, machine.hardware,
                         devices=8 if args.devices is None else args.devices,
                         microbatches=8 if args.microbatches is None else args.microbatches)
    if args.json:
        print(comparison.to_json())
    elif args.markdown:
        print(comparison.to_markdown())
    else:
        print(comparison)


def _cmd_optimize(args: argparse.Namespace) -> None:
    import numpy as np

    from ._knobs import MicrobatchSplit, StageBalance, Workload
    from ._optimize import optimize

    config = _load_config(args.config)
    schedule = _schedule(args, config)
    machine = _machine(args, config)
    if machine.model is None:
        raise ConfigError("optimize needs a model (per-layer costs): give [model] in --config or --device/--intra")
    workload = Workload.from_model(machine.model, machine.device, machine.network)
    knobs: list[Any] = []
    if args.knob in ("stages", "both"):
        knobs.append(StageBalance(schedule.stages))
    if args.knob in ("microbatches", "both"):
        batch = args.batch or machine.model.microbatch * schedule.microbatches
        knobs.append(MicrobatchSplit(batch, schedule.microbatches))
    result = optimize(schedule, workload, tuple(knobs) if len(knobs) > 1 else knobs[0], steps=args.steps)
    plan, base = result.plan, result.baseline_plan
    out = {
        "family": schedule.family, "devices": schedule.devices, "stages": schedule.stages,
        "microbatches": schedule.microbatches, "machine": machine.name, "message": result.message,
        "fits": bool(result.fits), "layers_per_stage": list(plan.layers_per_stage),
        "samples": None if plan.samples is None else list(plan.samples), "makespan_s": float(plan.makespan),
        "peak_memory_bytes": [float(x) for x in np.asarray(plan.peak_memory)],
        "baseline": result.baseline, "baseline_layers_per_stage": list(base.layers_per_stage),
        "baseline_makespan_s": float(base.makespan), "speedup": float(result.speedup),
        "continuous_makespan_s": float(result.continuous_makespan), "evaluations": int(result.evaluations),
    }
    if args.json:
        _print_json(out)
        return
    print(f"{schedule.family}: {result.message}")
    print(f"  layers per stage  {out['layers_per_stage']}   (layer rows: embedding, blocks, head)")
    if out["samples"] is not None:
        print(f"  samples           {out['samples']}")
    print(f"  makespan          {out['makespan_s'] * 1e3:.3f} ms (exact)")
    base_ms = out["baseline_makespan_s"] * 1e3
    print(f"  baseline {out['baseline']:<8} {out['baseline_layers_per_stage']}  {base_ms:.3f} ms"
          f"  -> speed-up {out['speedup']:.3f}x")


def _cmd_sweep(args: argparse.Namespace) -> None:
    from ._sweep import sweep

    config = _load_config(args.config)
    machine = _machine(args, config)
    families = [f for f in args.families.split(",") if f] if args.families else None
    modes = [m for m in args.modes.split(",") if m] if args.modes else None
    options: dict[str, Any] = {}
    for pair in args.option:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ConfigError(f"--option {pair!r}: expected NAME=V1,V2,...")
        options[key.replace("-", "_")] = [_value(v) for v in raw.split(",")]
    result = sweep(machine.hardware, families=families, devices=_ints(args.devices, "--devices"),
                   microbatches=_ints(args.microbatches, "--microbatches"), options=options or None,
                   communication=modes, progress=not args.json)
    outputs = {"csv": result.to_csv, "json": result.to_json}
    for kind, path in (("csv", args.csv), ("json", args.json_out)):
        if path:
            outputs[kind](path)
    if args.markdown_out:
        _atomic_write(args.markdown_out, result.to_markdown())
    if args.json:
        print(result.to_json())
        return
    print(result.to_markdown(limit=args.limit))
    if getattr(result, "skipped", None):
        print(f"\n{len(result.skipped)} combination(s) skipped (see --json for reasons)")


def _cmd_export(args: argparse.Namespace) -> None:
    from .schedules import to_torch_csv

    config = _load_config(args.config)
    schedule = _schedule(args, config)
    if not (args.csv or args.gantt or args.trace):
        raise ConfigError("export: give --csv, --gantt and/or --trace")
    if args.csv:
        to_torch_csv(schedule, args.csv)
    if args.gantt or args.trace:
        machine = _machine(args, config)
        _write_pictures(args, schedule, machine.hardware(schedule), None)
    for path in (args.csv, args.gantt, args.trace):
        if path:
            print(f"wrote {path}")


def _atomic_write(path: str, text: str) -> None:
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(target)


# -- parser ---------------------------------------------------------------------------------------
def _add_schedule(p: argparse.ArgumentParser, positional: bool = True) -> None:
    if positional:
        p.add_argument("family", nargs="?", help="schedule family (see 'diffpipe list')")
    p.add_argument("--devices", type=int, help="pipeline devices (default 4; compare: 8)")
    p.add_argument("--microbatches", type=int, help="microbatches per step (default 8)")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE", help="a family option")
    if positional:
        p.add_argument("--torch-csv", dest="torch_csv", metavar="PATH",
                       help="read the schedule from a torch.distributed.pipelining CSV instead")


def _add_machine(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="TOML", help="machine/schedule file (see examples/machine.toml)")
    g = p.add_argument_group("machine (flags override --config)")
    g.add_argument("--forward", type=float, help="seconds per stage forward (simple times model)")
    g.add_argument("--backward", type=float, help="seconds per stage input-gradient backward")
    g.add_argument("--weight", type=float, help="seconds per stage weight-gradient backward")
    g.add_argument("--p2p", type=float, help="seconds per cross-device transfer")
    g.add_argument("--device", help="device preset (A100, H100, H200)")
    g.add_argument("--intra", help="intra-node network preset (nvlink3, nvlink4, ib-ndr, 100gbe)")
    g.add_argument("--inter", help="inter-node network preset")
    g.add_argument("--devices-per-node", type=int, dest="devices_per_node")
    g.add_argument("--mode", choices=["none", "overlap", "contention", "blocking"], help="communication model")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diffpipe",
                                     description="Pipeline-parallel schedules: show, simulate, compare, "
                                                 "optimize, sweep and export them.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, example: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {example}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    p = command("list", "schedule families and their options", "diffpipe list --json")
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
    p.add_argument("--gantt", metavar="PNG|SVG", help="also draw a Gantt chart")
    p.add_argument("--trace", metavar="JSON", help="also write a Chrome/Perfetto trace")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_simulate)

    p = command("compare", "rank schedules at the formula, table and simulation levels",
                "diffpipe compare gpipe 1f1b chimera hanayo --devices 8 --microbatches 8")
    p.add_argument("families", nargs="*", help=f"families (default {' '.join(DEFAULT_COMPARE)})")
    _add_schedule(p, positional=False)
    _add_machine(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--markdown", action="store_true", help="Markdown tables")
    p.set_defaults(run=_cmd_compare)

    p = command("optimize", "balance stages (and/or split microbatches) by gradient descent, verified exactly",
                "diffpipe optimize 1f1b --devices 4 --microbatches 8 --config examples/machine.toml")
    _add_schedule(p)
    _add_machine(p)
    p.add_argument("--knob", choices=["stages", "microbatches", "both"], default="stages")
    p.add_argument("--batch", type=int, help="global batch for --knob microbatches (default microbatch x count)")
    p.add_argument("--steps", type=int, default=200, help="gradient steps")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_cmd_optimize)

    p = command("sweep", "evaluate every combination of families, sizes and modes exactly",
                "diffpipe sweep --families gpipe,1f1b,zb-h1 --devices 4,8 --microbatches 8,16 --csv out.csv")
    p.add_argument("--families", help="comma-separated families (default all)")
    p.add_argument("--devices", default="4", help="comma-separated device counts")
    p.add_argument("--microbatches", default="8", help="comma-separated microbatch counts")
    p.add_argument("--modes", help="comma-separated communication modes (default the machine's)")
    p.add_argument("--option", action="append", default=[], metavar="NAME=V1,V2", help="a family option grid")
    _add_machine(p)
    p.add_argument("--csv", metavar="PATH", help="write the table as CSV")
    p.add_argument("--json-out", metavar="PATH", dest="json_out", help="write the table as JSON")
    p.add_argument("--markdown-out", metavar="PATH", dest="markdown_out", help="write the table as Markdown")
    p.add_argument("--limit", type=int, default=40, help="rows printed")
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (ScheduleError, ConfigError) as error:
        print(f"diffpipe: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. piped into head: stop quietly
        sys.stderr.close()
        return 0
    except OSError as error:
        print(f"diffpipe: error: {error.filename or ''}: {error.strerror or error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
