"""What each change of the cost model moved on the TEST set: the full model, and the full model with
one change undone at a time (issue 22's closing-note ablation).

Changes (each undone by patching the one place it lives, nothing else):

- ``ce``: the cross-entropy as Megatron-LM runs it (six fp32 passes forward, two backward; ``diffpipe._model.
  _kernels._cross_entropy_passes``); undone: the earlier two passes, ``d + 8`` and ``4 + d`` bytes per logit.
- ``flash1``: llm-foundry's Triton attention at FlashAttention-1's rate (``FLASH_RATE[1] = 0.5``); undone: at
  FlashAttention-2's rate.
- ``ceiling``: the H100 ceiling refitted on the FIT set after Megatron-LM's stated --tp-comm-overlap was
  modelled (``H100_CEILING``); undone: the earlier fit, 0.9247, from FIT rows whose TP collectives were all
  exposed.

The TEST rows are the same as ``test_runs.py``'s; nothing is fitted here.

    PYTHONPATH=. python papers/published-runs/ablation.py            # ~4 x 10 min; writes ablation.json
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import equinox as eqx

import diffpipe as dp
from diffpipe._machine import _presets
from diffpipe._model import _kernels

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("published_runs_test", HERE / "test_runs.py")
tr = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = tr
_spec.loader.exec_module(tr)

#: The H100 ceiling before this change (fitted with every TP collective of the FIT rows exposed).
OLD_CEILING = 0.9247


@contextlib.contextmanager
def undone(change: str | None) -> Iterator[None]:
    if change is None:
        yield
        return
    if change == "ce":
        saved = _kernels._cross_entropy_passes
        _kernels._cross_entropy_passes = lambda d: ((d + 8.0,), (4.0 + d,))
        try:
            yield
        finally:
            _kernels._cross_entropy_passes = saved
    elif change == "flash1":
        saved = dict(_kernels.FLASH_RATE)
        _kernels.FLASH_RATE[1] = _kernels.FLASH_RATE[2]
        try:
            yield
        finally:
            _kernels.FLASH_RATE.update(saved)
    elif change == "ceiling":
        saved = _presets.KERNELS["H100"]
        scale = OLD_CEILING / _presets.H100_CEILING
        _presets.KERNELS["H100"] = eqx.tree_at(lambda k: (k.gemm_efficiency, k.attention_efficiency), saved,
                                               (saved.gemm_efficiency * scale, saved.attention_efficiency * scale))
        try:
            yield
        finally:
            _presets.KERNELS["H100"] = saved
    else:
        raise ValueError(change)


def main() -> dict:
    out = {}
    for change in (None, "ce", "flash1", "ceiling"):
        label = "all" if change is None else f"all but {change}"
        dp.clear_caches()  # nothing computed under another variant is reused
        with undone(change):
            results = [tr.evaluate(row) for row in tr.rows()]
        out[label] = summary = tr.summarise(results)
        a, sl = summary["all"], summary["slope"]
        print(f"{label:18s} MAPE {100 * a['mape']:5.1f}%  mean {100 * a['mean_error']:+5.1f}%  "
              + "  ".join(f"{k} {100 * v['mape']:.1f}% ({100 * v['mean_error']:+.1f}%)" for k, v in summary.items()
                          if k.startswith("device:"))
              + f"  slope ratio {sl.get('ratio', float('nan')):.2f}  pairs {summary['pairs']['ordered']}/"
              f"{summary['pairs']['pairs']}", flush=True)
    dp.write_atomic(HERE / "ablation.json", json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
