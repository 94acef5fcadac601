"""The one parameter per device fitted to whole training runs, on the FIT set only: the sustained GEMM and
attention ceiling in training of the H100 and of the A100.

The kernel curves of ``papers/kernel-efficiency`` are short measurements (OpenXLA's H100 table and
FlashAttention-3's Table 2 at a fixed clock; for the A100, one 22B layer's kernels, Korthikanti et al.'s
Table 4); a training step runs for seconds at the power limit, beside its framework's host work. So each
preset's ``gemm_efficiency`` and ``attention_efficiency`` are scaled by one factor ``alpha`` fitted here: the
mean log error (of throughput) of the device's FIT rows is zero, interpolated log-linearly between two
evaluations of every row.

- H100: Megatron-LM's README table (its stated overlaps) and Llama 3 Table 4 rows 1-2. Left out: torchtitan's
  rows (its cluster runs 500 W HBM2e parts, below the SXM preset, as its own footnote says) and Llama 3's
  context-parallel row 3 (``LEFT_OUT``).
- A100: SC'21 Tables 1 and 2 and Korthikanti et al.'s Table 5 (iteration times, taken as throughputs).

The TEST set (``test_runs.py``) is never used.

    PYTHONPATH=. python papers/published-runs/fit_ceilings.py        # ~10 min on 2 CPUs; writes fit_ceilings.json
    PYTHONPATH=. python papers/published-runs/fit_ceilings.py A100   # one device; the others keep their fit
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import equinox as eqx
import numpy as np

import diffpipe as dp

# Inside by design: the fit swaps the presets' own kernel models (``_presets.KERNELS``) for scaled ones
# while it searches, which no public API may change.
from diffpipe._machine import _presets

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("published_runs_run", HERE / "run.py")
rp = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = rp
_spec.loader.exec_module(rp)

#: The FIT studies of each device's ceiling, and the presets that share its kernel fit.
STUDIES = {"H100": ("megatron_h100", "llama3_table4"), "A100": ("sc21_table1", "sc21_table2", "korthikanti_table5")}
PRESETS = {"H100": ("H100",), "A100": ("A100", "A100-40GB")}
TRIALS = (1.0, 0.7)
#: FIT rows the ceiling is not fitted to: Llama 3's CP row runs its own context parallelism (an all-gather of
#: K and V before attention, exposed), which diffpipe's ring does not model (its communication is a lower bound).
LEFT_OUT = {"16K GPUs, CP 16"}


def scaled(km: _presets.KernelModel, alpha: float) -> _presets.KernelModel:
    """``km`` with its GEMM and attention ceilings times ``alpha``."""
    return eqx.tree_at(lambda k: (k.gemm_efficiency, k.attention_efficiency), km,
                       (km.gemm_efficiency * alpha, km.attention_efficiency * alpha))


def throughput_error(r: dict) -> float:
    """Signed error of a row's throughput (+: too fast), whether it states a rate or a time."""
    ratio = r["predicted"] / r["published"]
    return 1 / ratio - 1 if "time" in r["metric"] else ratio - 1


def errors(device: str, alpha: float) -> list[float]:
    """Throughput errors of every FIT row of ``device`` with its kernel fit's ceilings scaled by ``alpha``."""
    base = {p: _presets.KERNELS[p] for p in PRESETS[device]}
    for p, km in base.items():
        _presets.KERNELS[p] = scaled(km, alpha / _presets.CEILINGS[device])
    try:
        out = []
        for study in STUDIES[device]:
            for row in rp.STUDIES[study]():
                if row.name in LEFT_OUT:
                    continue
                e = throughput_error(rp.evaluate_row(row))
                print(f"{device} alpha {alpha}: {study} {row.name}: {100 * e:+.1f}%", flush=True)
                out.append(e)
        return out
    finally:
        _presets.KERNELS.update(base)


def fit(device: str) -> dict:
    trials = {alpha: errors(device, alpha) for alpha in TRIALS}
    (a0, e0), (a1, e1) = ((a, float(np.mean(np.log1p(e)))) for a, e in trials.items())
    slope = (e1 - e0) / (np.log(a1) - np.log(a0))
    alpha = float(np.exp(np.log(a0) - e0 / slope))
    print(f"{device}: alpha = {alpha:.4f}")
    return dict(alpha=round(alpha, 4), studies=STUDIES[device], trials={str(a): e for a, e in trials.items()},
                mean_log_error={str(a0): e0, str(a1): e1})


def main(devices: tuple[str, ...] = tuple(STUDIES)) -> dict:
    """Fit ``devices`` (default: every device); the others keep their committed fit."""
    path = HERE / "fit_ceilings.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    out.update({device: fit(device) for device in devices})
    out = {device: out[device] for device in STUDIES}
    dp.write_atomic(path, json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    unknown = sorted(set(sys.argv[1:]) - set(STUDIES))
    if unknown:
        print(f"fit_ceilings.py: unknown device {unknown[0]!r} (known: {', '.join(STUDIES)})", file=sys.stderr)
        sys.exit(2)
    main(tuple(sys.argv[1:]) or tuple(STUDIES))
