"""``diffpipe compare``: schedules ranked at the formula, table and simulation levels, on a machine or
in a training configuration (then also each one's whole step)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from .. import schedules
from .._errors import ConfigError
from .._progress import Progress
from ._args import _family_options
from ._guards import _guard_schedule, family_units
from ._inputs import _load_config, _machine, _settings_line, _Training, _training, _wants_configuration
from ._outputs import _print_json, _strict, _with_units


def _stages_per_node(configs: Any) -> int:
    """The pipeline graphs' devices per node of the configurations compared (``Configuration.graph``
    compiles for ``placement.stages_per_node``): one parallelism on one cluster, so one value."""
    (per_node,) = {cfg.placement.stages_per_node for cfg in configs}
    return per_node


def _compare_configuration(args: argparse.Namespace, training: _Training) -> None:
    from .._compare import compare
    from .._levels import DEFAULT_SCHEDULES
    from .._plan._configuration import fit_rule

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
        comparison = compare(list(configs), hardware, communication=training.communication,
                             devices_per_node=_stages_per_node(configs.values()))
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
    print(f"  ({fit_rule(first.capacity, first.headroom)}, as plan does)")


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
                             devices=devices, microbatches=microbatches,
                             communication=machine.communication if machine.given else None,
                             devices_per_node=machine.devices_per_node if machine.given else None)
    if args.json:
        sys.stdout.write(_strict(comparison.to_json()))
    elif args.markdown:
        print(comparison.to_markdown())
    else:
        print(comparison)
