"""What each change of the cost model moved on the TEST set: the full model, and the full model with
one change undone at a time (issue 22's closing-note ablation), the training ceilings refitted on the
FIT set under every variant (``fit_ceilings.py``), as the protocol fits them, so that an undone change is
not judged against ceilings fitted with it.

Changes (each undone by patching the one place it lives, nothing else):

- ``ce``: the cross-entropy as Megatron-LM runs it (six fp32 passes forward, two backward; ``diffpipe._model.
  _kernels._cross_entropy_passes``); undone: the earlier two passes, ``d + 8`` and ``4 + d`` bytes per logit.
- ``flash1``: llm-foundry's Triton attention at FlashAttention-1's rate (the device's ``attention_older``);
  undone: at FlashAttention-2's rate.
- ``contention``: compute slowed by ``CommunicationOverlap.contention`` of the communication it hides; undone:
  hidden communication free.
- ``bucket_latency``: every gradient bucket pays its ring's step latencies (``CommunicationOverlap.
  bucket_latency``); undone: one ring's latency a stage.
- ``reduce``: gradients reduced in fp32 where the framework does (``Transformer.reduce_bytes``: Megatron-LM,
  torchtitan, Composer's DEFAULT, Lightning's autocast); undone: in bf16.
- ``param_gather``: Megatron-LM's stated ``--overlap-param-gather``; undone: the weights' all-gather in the sync.
- ``every_microbatch``: Composer's FSDP reducing gradients after every microbatch (the ``fsdp`` preset's
  ``every_microbatch``, the llm-foundry rows); undone: once a step, as under ``no_sync``.
- ``native``: the Megatron-LM rows' attention by Hopper's own fused kernel (the ``megatron`` preset's
  ``flash_version=3``); undone: FlashAttention-2.
- ``eager``: llm-foundry's eager PyTorch blocks (the ``fsdp`` preset's ``eager_blocks``: PyTorch's LayerNorm
  weight-gradient pass and the concatenation of the split ``Wqkv``'s gradients); undone: the fused kernel list.
- ``flat``: PyTorch FSDP's flat-gradient passes (the ``fsdp`` preset's ``flat_gradients``); undone: the fp32
  accumulation of the kernel list.
- ``unpad``: llm-foundry's flash rows pay flash-attn's unpadding (``Transformer.unpadded_attention``,
  ``test_runs.UNPADDED``); undone: the fused kernel alone.
- ``host``: the host's dispatch (the ``fsdp`` preset's ``host_op_seconds`` and Composer's optimizer loop,
  ``optimizer_ops``); undone: no host cost, the update its traffic alone.
- ``a100_ceiling``: the A100's training ceiling (``CEILINGS["A100"]``); undone: the kernel fit alone (1.0), the
  H100's still refitted.

The TEST rows are the same as ``test_runs.py``'s; nothing is fitted to them.

    PYTHONPATH=. python papers/published-runs/ablation.py   # each change undone: refit + TEST; ablation.json
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import diffpipe as dp

# Inside by design: each ablation undoes one change by patching the module that holds it (a preset
# table, a kernel rule, a framework term), which no public API may change.
from diffpipe._machine import _presets
from diffpipe._model import _kernels
from diffpipe._workload import _frameworks

HERE = Path(__file__).resolve().parent


def _load(name: str, file: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


tr = _load("published_runs_test", "test_runs.py")
fc = _load("published_runs_ceilings", "fit_ceilings.py")
rp = fc.rp  # run.py, as the ceiling fit reads it

CHANGES = ("ce", "flash1", "contention", "bucket_latency", "reduce", "param_gather", "every_microbatch", "native",
           "eager", "flat", "unpad", "host", "a100_ceiling")


@contextlib.contextmanager
def patched(target: Any, **values: Any) -> Iterator[None]:
    saved = {k: getattr(target, k) for k in values}
    for k, v in values.items():
        setattr(target, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(target, k, v)


def overlap(**fields: Any) -> contextlib.ExitStack:
    """Every ``CommunicationOverlap`` built with ``fields`` (the scripts' own and the presets')."""
    built = functools.partial(dp.CommunicationOverlap, **fields)
    stack = contextlib.ExitStack()
    stack.enter_context(patched(dp, CommunicationOverlap=built))
    stack.enter_context(patched(_frameworks, CommunicationOverlap=built))  # the presets' overlaps
    return stack


def undone(change: str | None) -> contextlib.AbstractContextManager:
    if change is None:
        return contextlib.nullcontext()
    if change == "ce":
        return patched(_kernels, _cross_entropy_passes=lambda d: ((d + 8.0,), (4.0 + d,)))
    if change == "flash1":
        return patched(_kernels, OLDER=set())
    if change == "contention":
        return overlap(contention=0.0)
    if change == "bucket_latency":
        return overlap(bucket_latency=False)
    if change == "reduce":
        stack = contextlib.ExitStack()
        stack.enter_context(patched(rp, MEGATRON=dataclasses.replace(rp.MEGATRON, reduce_bytes=None),
                                    TORCHTITAN=dataclasses.replace(rp.TORCHTITAN, reduce_bytes=None)))
        stack.enter_context(patched(tr, COMPOSER_REDUCE_BYTES={"DEFAULT": 2, "PURE": 2},
                                    DDP=dataclasses.replace(tr.DDP, reduce_bytes=None)))
        return stack
    if change == "param_gather":
        return patched(rp, MEGATRON=dataclasses.replace(rp.MEGATRON, param_gather=False))
    if change == "every_microbatch":
        return patched(tr, FSDP=dataclasses.replace(tr.FSDP, every_microbatch=False))
    if change == "eager":
        return patched(tr, FSDP=dataclasses.replace(tr.FSDP, eager_blocks=False))
    if change == "flat":
        return patched(tr, FSDP=dataclasses.replace(tr.FSDP, flat_gradients=False))
    if change == "unpad":
        return patched(tr, UNPADDED=False)
    if change == "host":
        return patched(tr, FSDP=dataclasses.replace(tr.FSDP, host_op_seconds=0.0, optimizer_ops=0))
    if change == "native":
        return patched(rp, MEGATRON=dataclasses.replace(rp.MEGATRON, flash_version=2))
    if change == "a100_ceiling":
        return contextlib.nullcontext()  # handled by the refit: the A100 is not refitted
    raise ValueError(change)


@contextlib.contextmanager
def ceilings(alphas: dict[str, float]) -> Iterator[None]:
    """The presets' kernel models with each device's ceiling at ``alphas[device]``."""
    base = dict(_presets.KERNELS)
    for device, alpha in alphas.items():
        for p in fc.PRESETS[device]:
            _presets.KERNELS[p] = fc.scaled(base[p], alpha / _presets.CEILINGS[device])
    try:
        yield
    finally:
        _presets.KERNELS.update(base)


def main() -> dict:
    out = {}
    for change in (None, *CHANGES):
        label = "all" if change is None else f"all but {change}"
        dp.clear_caches()  # nothing computed under another variant is reused
        with undone(change):
            devices = ("H100",) if change == "a100_ceiling" else tuple(fc.STUDIES)
            alphas = {device: fc.fit(device)["alpha"] for device in devices}
            if change == "a100_ceiling":
                alphas["A100"] = 1.0
            with ceilings(alphas):
                results = [tr.evaluate(row) for row in tr.rows()]
        out[label] = summary = tr.summarise(results)
        summary["ceilings"] = alphas
        a, sl = summary["all"], summary["slope"]
        print(f"{label:22s} MAPE {100 * a['mape']:5.1f}%  mean {100 * a['mean_error']:+5.1f}%  "
              + "  ".join(f"{k} {100 * v['mape']:.1f}% ({100 * v['mean_error']:+.1f}%)" for k, v in summary.items()
                          if k.startswith("device:"))
              + f"  slope ratio {sl.get('ratio', float('nan')):.2f}  pairs {summary['pairs']['ordered']}/"
              f"{summary['pairs']['pairs']}  ceilings {alphas}", flush=True)
    dp.write_atomic(HERE / "ablation.json", json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
