"""``diffpipe plan``: the best whole configuration for a model on a cluster (``dp.plan``), its export
and its HTML report."""

from __future__ import annotations

import argparse
from typing import Any

from .._errors import ConfigError
from .._machine_format import MachineFile
from .._progress import Progress
from ._inputs import _cluster, _configuration_values, _model, _settings_line
from ._outputs import _check_outputs, _input_paths, _print_json, _with_units, _write_all


def _plan_framework(train: dict[str, Any], export: str | None) -> str:
    """The framework ``plan`` prices: ``--framework``, else the export target's (megatron, torchtitan),
    else none."""
    if "framework" in train:
        return train["framework"]
    return {"megatron": "megatron", "torchtitan": "torchtitan", "torchtitan-v0.2": "torchtitan"}.get(export or "",
                                                                                                   "none")


def _cmd_plan(args: argparse.Namespace) -> None:
    from .._plan._search import plan

    if args.out and not args.export:
        raise ConfigError("plan: --out needs --export")
    base = args.torchtitan_base
    if base is not None:
        if args.export != "torchtitan" and not args.report:
            raise ConfigError("plan: --torchtitan-base applies to --export torchtitan (or --report)")
        from .._plan._export import check_torchtitan_base

        check_torchtitan_base(base, "plan: --torchtitan-base")
    _check_outputs(("--out", args.out, None), ("--report", args.report, (".html", ".htm")),
                   inputs=_input_paths(args))
    train, par, clu, settings = _configuration_values(args, MachineFile())
    if "gpus" not in clu:
        raise ConfigError("plan: give the cluster's GPUs: --gpus N or --cluster GPUSxDEVICE")
    model, name = _model(train, ("flash_attention", "flash_version"))
    if base is None:
        from .._model._specs import model_key
        from .._plan._export import TORCHTITAN_BASES

        base = TORCHTITAN_BASES.get(model_key(train["model"])) if "model" in train else None
    if args.export == "torchtitan" and base is None:  # before the search: one line, no work lost
        raise ConfigError(f"plan: --export torchtitan sets the plan on the model's own torchtitan configuration; "
                          f"none is known for {name}: give --torchtitan-base MODULE:FUNCTION (e.g. "
                          "torchtitan.models.llama3.config_registry:llama3_8b), or --export torchtitan-v0.2 (TOML)")
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
                 export=args.export if args.export in ("megatron", "torchtitan", "torchtitan-v0.2") else None,
                 framework=_plan_framework(train, args.export))
    text, exported = None, None
    if args.export:
        exported, text = table.export(args.export, torchtitan_base=base)
    framework = table.framework.name if table.framework else "none"
    heading = (f"{name} on {cluster.gpus} x {cluster.device.name}, global batch {table.global_batch} x "
               f"{table.model.sequence} tokens, framework {framework}"
               + (" (nothing overlapped: --framework megatron|torchtitan|fsdp|ddp)" if framework == "none" else ""))
    outputs = [("--out", args.out, text)] if args.out else []
    if args.report:
        from ..viz.report import report

        with Progress("plan") as bar:
            bar.stage("drawing the report")
            outputs.append(("--report", args.report, report(table, title=heading, settings=_settings_line(settings),
                                                            top=args.top, torchtitan_base=base)))
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
