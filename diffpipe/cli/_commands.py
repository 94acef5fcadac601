"""One function per subcommand: each reads its parsed arguments, calls the library and prints."""



from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import schedules
from .._caches import (
    CACHE_SWITCH,
    clear_compilation_cache,
    compilation_cache_info,
    compilation_cache_root,
)
from .._checks import is_int
from .._choices import COMMUNICATION_MODES
from .._errors import ConfigError
from .._progress import Progress
from ._args import (
    DEFAULT_DEVICES,
    DEFAULT_MICROBATCHES,
    SWEEP_UNITS,
    _family_options,
    _integer_at_least,
    _ints,
    _names,
    _value,
)
from ._guards import _guard, _guard_schedule, estimated_ops, family_units
from ._inputs import (
    _MACHINE_SECTIONS,
    _cluster,
    _Config,
    _configuration_values,
    _load_config,
    _machine,
    _machine_flags,
    _mode,
    _model,
    _schedule,
    _settings_line,
    _Training,
    _training,
    _wants_configuration,
)
from ._outputs import (
    _check_outputs,
    _configuration_summary,
    _input_paths,
    _pictures,
    _print_json,
    _simulation_summary,
    _strict,
    _with_units,
    _write_all,
)

_natural = _integer_at_least(0)


#: A straggler's slowdown when ``--slow-fraction`` is given alone (``stragglers.py``'s ``slow_factor``).
SLOW_FACTOR = 1.1


def _jitter(args: argparse.Namespace) -> dict[str, float] | None:
    """The ``dp.Jitter`` arguments of ``--jitter``/``--slow-fraction``/``--slow-factor``, or None."""
    cv, fraction, factor = args.jitter, args.slow_fraction, args.slow_factor
    if cv is None and fraction is None:
        if factor is not None:
            raise ConfigError("simulate: --slow-factor needs --slow-fraction (the share of straggling GPUs)")
        return None
    return dict(cv=cv or 0.0, slow_fraction=fraction or 0.0,
                slow_factor=(SLOW_FACTOR if fraction else 1.0) if factor is None else factor)


def _simulate_configuration(args: argparse.Namespace, training: _Training,
                            outputs: list[tuple[str, Path]]) -> None:
    jitter = _jitter(args)
    with Progress("simulate") as bar:
        bar.stage("compiling and simulating one step")
        cfg = training.build(max_ops=args.max_ops)  # the size guards run before JAX is imported
        if jitter is not None:
            from .._engine._jitter import Jitter

            jitter = Jitter(**jitter)
            bar.stage(f"sampling {args.samples} steps")
        result = cfg.evaluate(jitter=jitter, samples=args.samples, seed=args.seed)
        schedule = cfg.schedule()
        if outputs:
            from ..viz import op_collectives

            bar.stage("drawing")
            hw = cfg.hardware()
            _write_all(_pictures(args, schedule, hw, result.result, result.gradient_sync, result.breakdown,
                                 op_collectives(cfg, schedule, hw) if args.gantt else None))
    summary = _configuration_summary(cfg, schedule, result, training.label)
    summary["settings"] = training.settings
    if args.json:
        _print_json(summary)
        return
    gb = 1e9
    r = result
    print(f"{schedule.family} {dict(schedule.options) or ''}: {training.label}".replace("  ", " "))
    print(f"  {_settings_line(training.settings)}")
    print(f"  step time       {r.step_time:.3f} s" + ("" if r.gradient_sync else
                                                        f"  ({schedule.family}'s own R/U ops: no gradient-sync lane)"))
    if r.expected_step_time is not None:
        print(f"  with jitter     {r.expected_step_time:.3f} s expected, {r.p95_step_time:.3f} s at the 95th "
              f"percentile ({args.samples} samples, seed {args.seed})")
    print(f"  tokens/s/GPU    {r.tokens_per_second_per_gpu:,.0f}")
    print(f"  MFU             {100 * r.mfu:.1f}%  (model FLOPs over {r.gpus} x the dense BF16 peak)")
    print(f"  memory/GPU      {r.memory_per_gpu / gb:.1f} GB of {r.capacity / gb:.0f} GB: "
          f"{'fits' if r.fits else 'does NOT fit'} (at most {r.usable / gb:.1f} GB: {r.headroom:.0%} kept free, "
          "as plan does)")
    print(f"  bubble          {100 * r.bubble_ratio:.1f}%   blocking collectives {100 * r.communication_share:.1f}%"
          f" of the step")
    print(f"  microbatches    {r.microbatches} per pipeline ({cfg.global_batch} = {cfg.model.microbatch_size} x "
          f"{r.microbatches} x {cfg.parallelism.data} data-parallel)")
    if r.breakdown:
        parts = "  ".join(f"{name.split('_', 1)[-1]} {seconds:.3f}" for name, seconds in r.breakdown.items()
                          if name.startswith("compute_"))
        print(f"  compute (s)     {parts}   (per rank and step, by kernel class)")
        parts = "  ".join(f"{name.split('_', 1)[-1]} {seconds:.3f}" for name, seconds in r.breakdown.items()
                          if name.startswith("exposed_"))
        print(f"  exposed comm(s) {parts}   bubble {r.breakdown.get('bubble', 0.0):.3f}")
    print("  rank  busy(s)  peak memory(GB)  fits")
    for d, mem in enumerate(r.memory):
        print(f"  {d:>4}  {summary['busy_s'][d]:7.3f}  {mem / gb:15.1f}  {'yes' if mem <= r.usable else 'NO'}")


def _compare_configuration(args: argparse.Namespace, training: _Training) -> None:
    from .._compare import compare
    from .._levels import DEFAULT_SCHEDULES

    families = list(args.families) or ([training.family] if training.family else [])
    if training.options and not families:
        raise ConfigError("compare: --option (or [schedule] options) applies to the families named on the "
                          "command line; the default set has its own options")
    items = _compare_items(families, training.options) if families else list(DEFAULT_SCHEDULES.values())
    names = [item if isinstance(item, str) else item[0] for item in items]
    if training.virtual_given and not any("chunks" in schedules.family(n).option_names for n in names):
        raise ConfigError(f"compare: --vpp (parallelism.virtual) cannot take effect: none of {', '.join(names)} "
                          "takes chunks (each places its own stages); name one that does (e.g. interleaved-1f1b)")
    configs = {}
    for item in items:
        name, opts = (item, {}) if isinstance(item, str) else item
        cfg = training.build(name, dict(opts), adapt=True, max_ops=args.max_ops)
        configs[cfg.schedule()] = cfg
    def hardware(schedule: Any) -> Any:
        return configs[schedule].hardware()

    hardware.__name__ = training.label  # compare names the machine by it
    with Progress("compare") as bar:
        bar.stage("comparing at three levels (compiling and simulating)")
        comparison = compare(list(configs), hardware)
        bar.stage("simulating each whole step", len(configs))
        results = {}
        for entry, s in zip(comparison.entries, configs):
            results[entry.name] = configs[s].evaluate()
            bar.update(1)
    if args.json:
        data = json.loads(comparison.to_json())
        data["configuration"] = {"machine": training.label, "settings": training.settings,
                                 "results": {name: _with_units(r.to_dict()) for name, r in results.items()}}
        _print_json(data)
        return
    print(comparison.to_markdown() if args.markdown else comparison)
    print(f"\nwhole step of each schedule: {training.label}")
    print(f"  {_settings_line(training.settings)}")
    width = max(len(n) for n in results)
    print(f"  {'schedule':<{width}}  step(s)  tokens/s/GPU    MFU  memory/GPU(GB)  fits")
    for name, r in results.items():
        print(f"  {name:<{width}}  {r.step_time:7.3f}  {r.tokens_per_second_per_gpu:12,.0f}  {100 * r.mfu:4.1f}%"
              f"  {r.memory_per_gpu / 1e9:14.1f}  {'yes' if r.fits else 'NO'}")
    first = next(iter(results.values()))
    print(f"  (fits: at most {first.usable / 1e9:.1f} GB of {first.capacity / 1e9:.0f} GB, {first.headroom:.0%} "
          "kept free, as plan does)")


# -- commands --------------------------------------------------------------------------------------
def _cmd_cache(args: argparse.Namespace) -> None:
    if args.action == "clear":
        removed = clear_compilation_cache()
        if args.json:
            _print_json({"removed": [str(p) for p in removed]})
            return
        for folder in removed:
            print(f"removed {folder}")
        if not removed:
            print(f"nothing to remove under {compilation_cache_root()}")
        return
    info = compilation_cache_info()
    if args.json:
        _print_json(info)
        return
    state = "on" if info["enabled"] else f"off ({CACHE_SWITCH}=0)"
    print(f"compilation cache  {state}")
    print(f"  path             {info['path']}")
    print(f"  entries          {info['entries']}")
    print(f"  size             {info['bytes'] / 2**20:.1f} MiB")
    for other in info["other_versions"]:
        print(f"  other version    {other['path']}: {other['entries']} entries, {other['bytes'] / 2**20:.1f} MiB "
              "(unused; 'diffpipe cache clear' removes it)")


def _preset_rows(what: str) -> list[dict[str, Any]]:
    """The rows of ``diffpipe list devices|networks|models`` (units in the keys)."""
    from .. import presets

    if what == "devices":
        from .._machine._specs import REPORTED_SOURCE

        return [{"name": name, "bf16_dense_tflops": spec.peak_flops / 1e12, "memory_gb": spec.memory / 1e9,
                 "reported_memory_gb": None if spec.reported_memory is None else spec.reported_memory / 1e9,
                 "memory_bandwidth_tb_per_s": spec.memory_bandwidth / 1e12,
                 "source": spec.source + ("" if spec.reported_memory is None else f"; reported: {REPORTED_SOURCE}")}
                for name, spec in presets.DEVICES.items()]
    if what == "networks":
        return [{"name": name, "gb_per_s_per_direction": spec.bandwidth / 1e9, "latency_us": spec.latency * 1e6,
                 "devices_per_node": spec.domain, "source": spec.source} for name, spec in presets.NETWORKS.items()]
    from .._model._specs import longest_context

    rows = []
    for name, spec in presets.MODELS.items():
        m = presets.model(name)
        rows.append({"name": name, "parameters_billions": m.parameters() / 1e9, "layers": m.layers,
                     "hidden": m.hidden, "heads": m.heads, "experts": m.experts,
                     "pretraining_sequence": spec.sequence, "longest_context": longest_context(name),
                     "source": spec.source})
    return rows


def _cmd_list_presets(args: argparse.Namespace) -> None:
    rows = _preset_rows(args.what)
    if args.json:
        _print_json(rows)
        return
    columns = {"devices": (("bf16_dense_tflops", "BF16 TFLOP/s (dense)", ",.0f"), ("memory_gb", "memory GB", ".0f"),
                           ("reported_memory_gb", "reported GB", ".2f"), ("memory_bandwidth_tb_per_s", "memory TB/s",
                                                                         ".2f")),
               "networks": (("gb_per_s_per_direction", "GB/s per direction", ",.1f"),
                            ("latency_us", "latency us", ".0f"), ("devices_per_node", "GPUs per node", "")),
               "models": (("parameters_billions", "parameters (B)", ",.1f"), ("layers", "layers", "d"),
                          ("hidden", "hidden", "d"), ("heads", "heads", "d"), ("experts", "experts", "d"),
                          ("pretraining_sequence", "sequence", ",d"), ("longest_context", "longest", ",d"))}
    cols = columns[args.what]
    width = max(len(r["name"]) for r in rows)
    print(f"{'name':<{width}}  " + "  ".join(title for _, title, _ in cols))
    for r in rows:
        cells = ["-" if r[key] is None else format(r[key], fmt) for key, _, fmt in cols]
        print(f"{r['name']:<{width}}  " + "  ".join(f"{c:>{len(title)}}" for c, (_, title, _) in zip(cells, cols)))
    flag = {"devices": "--device / --cluster GPUSxNAME", "networks": "--intra / --inter",
            "models": "--model"}[args.what]
    print(f"(sources: diffpipe list {args.what} --json; use a name with {flag}; any case, '-' or '_')")


def _cmd_list(args: argparse.Namespace) -> None:
    if getattr(args, "what", "families") != "families":
        _cmd_list_presets(args)
        return
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
        if r["source"]:
            print(f"{'':<{width}}    source: {r['source']}")
        for opt, doc in r["options"].items():
            print(f"{'':<{width}}    --option {opt}=...  {doc}")


def _cmd_show(args: argparse.Namespace) -> None:
    schedule = _schedule(args, _load_config(args.config, "show", ("schedule",)))
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


def _cmd_simulate(args: argparse.Namespace) -> None:
    outputs = _check_outputs(("--gantt", args.gantt, (".png", ".svg")), ("--trace", args.trace, (".json",)),
                             inputs=_input_paths(args))
    config = _load_config(args.config, "simulate")
    if _wants_configuration(args, config):
        if args.torch_csv:
            raise ConfigError("--torch-csv cannot be combined with a training configuration (--model, --tp, ...)")
        _simulate_configuration(args, _training(args, config), outputs)
        return
    given = [flag for flag, dest in (("--jitter", "jitter"), ("--slow-fraction", "slow_fraction"),
                                     ("--slow-factor", "slow_factor")) if getattr(args, dest) is not None]
    if given:
        raise ConfigError(f"simulate: {given[0]} applies to a training configuration (--model or --config "
                          "with [training]); a schedule on a machine has no random op times")
    schedule = _schedule(args, config)
    machine = _machine(args, config)
    from .._engine._simulate import simulate

    with Progress("simulate") as bar:
        bar.stage("compiling and simulating")
        hw = machine.hardware(schedule)
        result = simulate(schedule, hw)
        summary = _simulation_summary(schedule, result, machine)
        if outputs:
            bar.stage("drawing")
            _write_all(_pictures(args, schedule, hw, result))
    if args.json:
        _print_json(summary)
        return
    gb = 1e9
    print(f"{schedule.family} {dict(schedule.options) or ''} on {machine.name}".replace("  ", " "))
    rate, bubble = summary["microbatches_per_s"], summary["bubble_ratio"]
    rate_text = "undefined: no work" if rate is None else f"{rate:.1f} microbatches/s"
    print(f"  makespan       {summary['makespan_s'] * 1e3:.3f} ms  ({rate_text})")
    print(f"  bubble         {'undefined (zero makespan)' if bubble is None else f'{100 * bubble:.1f}%'}")
    print(f"  communication  {summary['communication_bytes'] / gb:.3f} GB")
    if "step_period_s" in summary:
        periods = ", ".join(f"{p * 1e3:.3f}" for p in summary["step_period_s"])
        print(f"  step period    {periods} ms   max staleness {summary['max_staleness']}")
    print("  device  busy(ms)  peak memory(GB)  activations  fits")
    for d in range(schedule.devices):
        print(f"  {d:>6}  {summary['busy_s'][d] * 1e3:8.3f}  {summary['peak_memory_bytes'][d] / gb:15.2f}"
              f"  {summary['peak_activations'][d]:11d}  {'yes' if summary['fits'][d] else 'NO'}")


def _compare_items(families: Sequence[str], options: dict[str, Any]) -> list[Any]:
    """Each named family with the given options it declares (``--option segments=4`` reaches
    seq1f1b, not 1f1b); an option no named family declares is an error."""
    declared = {f: schedules.family(f).option_names for f in families}
    unused = sorted(set(options) - {o for names in declared.values() for o in names})
    if unused:
        raise ConfigError(f"compare: --option {unused[0]} is not an option of {', '.join(families)}")
    items: list[Any] = []
    for f in families:
        mine = {k: v for k, v in options.items() if k in declared[f]}
        items.append((f, mine) if mine else f)
    return items


def _cmd_compare(args: argparse.Namespace) -> None:
    from .._levels import DEFAULT_DEVICES as COMPARE_DEVICES
    from .._levels import DEFAULT_MICROBATCHES as COMPARE_MICROBATCHES
    from .._levels import DEFAULT_SCHEDULES

    config = _load_config(args.config, "compare")
    if _wants_configuration(args, config):
        _compare_configuration(args, _training(args, config))
        return
    section = config.get("schedule")
    families = list(args.families) or ([section["family"]] if "family" in section else [])
    options = {**section.get("options", {}), **_family_options(args.option)}
    if options and not families:
        raise ConfigError("compare: --option (or [schedule] options) applies to the families named on the "
                          "command line; the default set has its own options")
    devices = args.devices if args.devices is not None else section.get("devices")
    microbatches = args.microbatches if args.microbatches is not None else section.get("microbatches")
    items: Any = _compare_items(families, options) if families else DEFAULT_SCHEDULES
    for item in (items if families else DEFAULT_SCHEDULES.values()):
        name, opts = (item, {}) if isinstance(item, str) else item
        units = family_units(name, dict(opts))  # --microbatches counts samples
        _guard_schedule(name, COMPARE_DEVICES if devices is None else devices,
                        (COMPARE_MICROBATCHES if microbatches is None else microbatches) * units, dict(opts),
                        args.max_ops)
    from .._compare import compare  # JAX: only once the size is known to be acceptable

    machine = _machine(args, config)
    with Progress("compare") as bar:
        bar.stage("comparing at three levels (compiling and simulating)")
        comparison = compare(items, machine.hardware if machine.given else None,
                             devices=devices, microbatches=microbatches)
    if args.json:
        sys.stdout.write(_strict(comparison.to_json()))
    elif args.markdown:
        print(comparison.to_markdown())
    else:
        print(comparison)


def _cmd_optimize(args: argparse.Namespace) -> None:
    if args.batch is not None and args.knob == "stages":
        raise ConfigError("--batch sets the global batch of --knob microbatches/both; --knob stages does not use it")
    config = _load_config(args.config, "optimize", ("schedule", "model", "device", "network"))
    schedule = _schedule(args, config)
    machine = _machine(args, config)
    if machine.model is None:
        raise ConfigError("optimize needs a model (per-layer costs): give [model] in --config or --device/--intra")
    import numpy as np

    from .._optimize._knobs import MicrobatchSplit, StageBalance
    from .._optimize._optimize import optimize
    from .._workload._workload import Workload

    workload = Workload.from_model(machine.model, machine.device, machine.network)
    knobs: list[Any] = []
    if args.knob in ("stages", "both"):
        knobs.append(StageBalance(schedule.stages))
    if args.knob in ("microbatches", "both"):
        batch = machine.model.microbatch_size * schedule.microbatches if args.batch is None else args.batch
        knobs.append(MicrobatchSplit(batch, schedule.microbatches))
    steps = {} if args.steps is None else {"steps": args.steps}
    with Progress("optimize") as bar:
        bar.stage("optimizing (compiling, gradient descent, exact verification)")
        result = optimize(schedule, workload, tuple(knobs) if len(knobs) > 1 else knobs[0], **steps)
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
    if args.json and args.limit is not None:
        raise ConfigError("--limit sets the rows of the printed table; --json prints every row")
    _check_outputs(("--csv", args.csv, None), ("--json-out", args.json_out, None),
                   ("--markdown-out", args.markdown_out, None), inputs=_input_paths(args))
    config = _load_config(args.config, "sweep")
    section = config.get("schedule")
    families = _names(args.families, "--families") if args.families is not None else \
        ([section["family"]] if "family" in section else None)
    modes = _names(args.modes, "--modes") if args.modes is not None else None
    for m in modes or ():
        if m not in COMMUNICATION_MODES:
            raise ConfigError(f"--modes: unknown mode {m!r}; known: {', '.join(COMMUNICATION_MODES)}")
    options: dict[str, Any] = {k: [v] for k, v in section.get("options", {}).items()}
    for pair in args.option:
        key, sep, raw = pair.partition("=")
        if not sep or not key or not raw:
            raise ConfigError(f"--option {pair!r}: expected NAME=V1,V2,...")
        options[key.replace("-", "_")] = [_value(v) for v in raw.split(",")]
    sizes: dict[str, Any] = {}
    if args.devices is not None:
        sizes["devices"] = _ints(args.devices, "--devices")
    elif "devices" in section:
        sizes["devices"] = [section["devices"]]
    if args.microbatches is not None:
        sizes["microbatches"] = _ints(args.microbatches, "--microbatches")
    elif "microbatches" in section:
        sizes["microbatches"] = [section["microbatches"]]
    grid_devices = sizes.get("devices", [DEFAULT_DEVICES])
    grid_micro = sizes.get("microbatches", [DEFAULT_MICROBATCHES])
    largest = {k: max((v for v in vs if is_int(v)), default=1) for k, vs in options.items()}
    variants = math.prod(len(vs) for vs in options.values()) * len(modes or [None])
    total = sum(estimated_ops(f, d, n * family_units(f, largest), largest) for f in (families or schedules.names())
                for d in grid_devices for n in grid_micro) * variants
    _guard(f"sweep: the grid ({len(families or schedules.names())} families x {len(grid_devices)} device "
           f"counts x {len(grid_micro)} microbatch counts x {variants} option/mode variants)",
           max(total, max(grid_devices) ** 2), args.max_ops)
    machine = _machine(args, config)
    from .._sweep import sweep

    result = sweep(machine.hardware, families=families, options=options or None, communication=modes,
                   progress=None, **sizes)
    outputs = [(flag, path, make()) for flag, path, make in (
        ("--csv", args.csv, result.to_csv), ("--json-out", args.json_out, lambda: _strict(result.to_json())),
        ("--markdown-out", args.markdown_out, lambda: f"{result.to_markdown()}\n{SWEEP_UNITS}\n")) if path]
    _write_all(outputs)
    if args.json:
        sys.stdout.write(_strict(result.to_json()))
        return
    print(result.to_markdown(limit=40 if args.limit is None else args.limit))
    print(SWEEP_UNITS)
    if getattr(result, "skipped", None):
        print(f"\n{len(result.skipped)} combination(s) skipped (see --json for reasons)")


def _cmd_export(args: argparse.Namespace) -> None:
    from ..schedules import to_torch_csv

    if not (args.csv or args.gantt or args.trace):
        raise ConfigError("export: give --csv, --gantt and/or --trace")
    _check_outputs(("--csv", args.csv, None), ("--gantt", args.gantt, (".png", ".svg")),
                   ("--trace", args.trace, (".json",)), inputs=_input_paths(args))
    pictures = bool(args.gantt or args.trace)
    if not pictures and _machine_flags(args):
        raise ConfigError(f"export: {_machine_flags(args)[0]} is used only with --gantt/--trace")
    usable = ("schedule", *_MACHINE_SECTIONS) if pictures else ("schedule",)
    config = _load_config(args.config, "export" if pictures else "export --csv", usable)
    schedule = _schedule(args, config)
    outputs: list[tuple[str, str, Any]] = []
    if args.csv:
        outputs.append(("--csv", args.csv, to_torch_csv(schedule)))
    if pictures:
        machine = _machine(args, config)
        outputs += _pictures(args, schedule, machine.hardware(schedule), None)
    _write_all(outputs)
    for _, path, _ in outputs:
        print(f"wrote {path}")


def _cmd_plan(args: argparse.Namespace) -> None:
    from .._plan._search import plan

    if args.out and not args.export:
        raise ConfigError("plan: --out needs --export")
    _check_outputs(("--out", args.out, None), ("--report", args.report, (".html", ".htm")),
                   inputs=_input_paths(args))
    train, par, clu, settings = _configuration_values(args, _Config())
    if "gpus" not in clu:
        raise ConfigError("plan: give the cluster's GPUs: --gpus N or --cluster GPUSxDEVICE")
    model, name = _model(train, ("flash_attention",))
    cluster = _cluster(clu, clu["gpus"])
    # dp.plan's axes, where a flag narrows them (else dp.plan's defaults)
    axes = {"families": args.families, "tensor": par.get("tensor"), "pipeline": par.get("pipeline"),
            "expert": par.get("expert"), "expert_tensor": par.get("expert_tensor"), "virtual": par.get("virtual"),
            "context": par.get("context"),
            "microbatch_sizes": train.get("microbatch_size"), "recompute": train.get("recompute"),
            "zero": par.get("zero"), "sequence_parallel": par.get("sequence_parallel")}
    table = plan(model, cluster, train["global_batch"], sequence=train.get("sequence"),
                 **{k: tuple(v) if isinstance(v, list) else v for k, v in axes.items() if v is not None},
                 headroom=args.headroom, top_k=args.balance_top, balance=args.balance_top > 0, progress=None,
                 export=args.export if args.export in ("megatron", "torchtitan") else None)
    text, exported = None, None
    if args.export:
        exported, text = table.export(args.export)
    heading = (f"{name} on {cluster.gpus} x {cluster.device.name}, global batch {table.global_batch} x "
               f"{table.model.sequence} tokens")
    outputs = [("--out", args.out, text)] if args.out else []
    if args.report:
        from ..viz.report import report

        with Progress("plan") as bar:
            bar.stage("drawing the report")
            outputs.append(("--report", args.report, report(table, title=heading, settings=_settings_line(settings),
                                                            top=args.top)))
    _write_all(outputs)
    if args.json:
        data = table.to_dict()
        data["settings"] = settings
        data["rows"] = [_with_units({**r, "headroom": table.headroom}) for r in data["rows"][: args.top]]
        if text is not None:
            data["export"] = {"format": args.export, "row": exported, "text": text}
        _print_json(data)
        return
    print(heading)
    print(_settings_line(settings))
    print(table.to_markdown(args.top), end="")
    if text is not None:
        which = "the best row" if exported == 0 else f"row {exported + 1}, the fastest it runs"
        print(f"\n{args.export} ({which}): " + (f"wrote {args.out}" if args.out else f"\n{text}"),
              end="\n" if args.out else "")
    if args.report:
        print(f"wrote {args.report}")


def _cmd_calibrate(args: argparse.Namespace) -> None:
    from ..calibrate import cli_calibrate
    from ..calibrate._cli import predictions, report

    model = None
    if args.model is not None or args.hf_config is not None:
        if args.model is not None and args.hf_config is not None:
            raise ConfigError("--model and --hf-config: give one")
        model, _ = _model({"model": args.model} if args.model is not None else {"hf_config": args.hf_config}, ())
    mode = args.mode or "overlap"
    calibration = cli_calibrate(args.trace, args.schedule, args.out, mode=mode, model=model)
    rows = predictions(calibration, args.predict or (), mode=_mode(mode))
    if args.json:
        data = json.loads(calibration.to_json())
        if args.predict:
            data["predictions"] = rows
        _print_json(data)
    else:
        print(report(calibration, rows, mode=mode))
    if args.out:
        print(f"wrote {args.out}")