"""``diffpipe simulate``: one step of a schedule on a modelled machine, or one training step of a
configuration (``--model``, ``[training]``), with random op times on request (``--jitter``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .._errors import ConfigError
from .._progress import Progress
from ._inputs import _load_config, _machine, _schedule, _settings_line, _Training, _training, _wants_configuration
from ._outputs import (
    _check_outputs,
    _configuration_summary,
    _input_paths,
    _pictures,
    _print_json,
    _simulation_summary,
    _write_all,
)

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
    from .._plan._configuration import check_headroom

    headroom = check_headroom("simulate", args.headroom)
    with Progress("simulate") as bar:
        bar.stage("compiling and simulating one step")
        cfg = training.build(max_ops=args.max_ops)  # the size guards run before JAX is imported
        if jitter is not None:
            from .._engine._jitter import Jitter

            jitter = Jitter(**jitter)
            bar.stage(f"sampling {args.samples} steps")
        result = cfg.evaluate(headroom, jitter=jitter, samples=args.samples, seed=args.seed)
        schedule = cfg.schedule()
        if outputs:
            bar.stage("drawing")
            _write_all(_pictures(args, cfg, evaluation=result))
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
    print(f"  memory/GPU      {r.memory_per_gpu / gb:.1f} GB of {r.capacity / gb:.1f} GB: "
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
    from .._plan._configuration import check_headroom, fit_rule

    headroom = check_headroom("simulate", args.headroom)

    with Progress("simulate") as bar:
        bar.stage("compiling and simulating")
        hw = machine.hardware(schedule)
        result = simulate(schedule, hw, communication=machine.communication, devices_per_node=machine.devices_per_node)
        summary = _simulation_summary(schedule, result, machine, hw, headroom)
        if outputs:
            bar.stage("drawing")
            _write_all(_pictures(args, result, hw, schedule=schedule))  # the Result brings its mode and topology
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
    capacities = sorted({c for c in summary["capacity_gb"] if c is not None})
    if not capacities:
        print("  (no device memory given: every device fits)")
    for capacity in capacities:
        print(f"  ({fit_rule(capacity * gb, headroom)}, as plan does)")
