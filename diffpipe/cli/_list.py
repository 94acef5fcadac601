"""``diffpipe list``: the schedule families and their options, or the device, network and model
presets."""

from __future__ import annotations

import argparse
from typing import Any

from .. import schedules
from ._outputs import _print_json


def _preset_rows(what: str) -> list[dict[str, Any]]:
    """The rows of ``diffpipe list devices|networks|models`` (units in the keys)."""
    from .. import presets

    if what == "devices":  # memory: the driver's total where a public nvidia-smi listing gives it
        return [{"name": name, "bf16_dense_tflops": spec.peak_flops / 1e12, "memory_gb": spec.memory / 1e9,
                 "memory_from": "datasheet" if spec.memory_source is None else "nvidia-smi",
                 "memory_bandwidth_tb_per_s": spec.memory_bandwidth / 1e12,
                 "source": spec.source + ("" if spec.memory_source is None else f"; memory: {spec.memory_source}")}
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
    columns = {"devices": (("bf16_dense_tflops", "BF16 TFLOP/s (dense)", ",.0f"), ("memory_gb", "memory GB", ".2f"),
                           ("memory_from", "memory from", ""), ("memory_bandwidth_tb_per_s", "memory TB/s", ".2f")),
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
