"""Stragglers as the model of the fall of throughput with scale: fitted on FIT series, judged on TEST ones.

A step of a synchronous data-parallel job ends when its slowest GPU does. With each GPU a straggler
(every compute op ``slow_factor`` times longer) independently with probability ``slow_fraction`` in a
step, the expected step grows with the number of GPUs (``dp.Jitter(slow_fraction=, slow_factor=)``,
``Configuration.evaluate(jitter=...)``: batched Monte Carlo, tensor ranks in lock-step, the ``data``
replicas ending together). ``jitter.py`` showed one GPU in a thousand 10% slower closes 34-41% of the
gap on the FIT series; here ``slow_fraction`` (``slow_factor`` fixed at 1.1) is **fitted** to the FIT
series' falls (SC'21 Table 2's 175B and 530B at a fixed batch on 1x-4x GPUs, Llama 3's 405B on 8K and
16K GPUs: least squares over a grid), then the TEST set's weak-scaling series (``test_runs.py``: same
model, sequence and microbatch on more GPUs) are predicted with it, never fitted to: the slope of MFU
against log2(GPUs), published, deterministic and with stragglers.

    PYTHONPATH=. python papers/published-runs/stragglers.py     # writes stragglers.json (~30-60 min on 2 CPUs)
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

import diffpipe as dp

HERE = Path(__file__).resolve().parent


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


jitter = _load("published_runs_jitter", "jitter.py")
test_runs = _load("published_runs_test", "test_runs.py")

SLOW_FACTOR = 1.1
#: The ``slow_fraction`` grid of the FIT (per GPU and step).
GRID = (0.0, 5e-4, 1e-3, 2e-3, 4e-3)
SAMPLES = 32


def fit() -> dict:
    """The FIT series' throughput falls (first row to last) at every ``slow_fraction`` of ``GRID``."""
    out: dict = {"series": {}}
    for name, rows in jitter.series().items():
        ends = []
        for row in (rows[0], rows[-1]):
            cfg = row.build()
            plain = cfg.evaluate()
            predicted = float(row.predict(cfg, plain))
            per_f = {}
            for f in GRID:
                if f == 0.0:
                    per_f[f] = predicted
                    continue
                r = cfg.evaluate(jitter=dp.Jitter(0.0, slow_fraction=f, slow_factor=SLOW_FACTOR), samples=SAMPLES)
                per_f[f] = predicted * plain.step_time / r.expected_step_time  # throughput ~ 1 / step
            ends.append(dict(name=row.name, published=row.published, predicted=per_f))
            print(f"fit: {name} {row.name} done", file=sys.stderr, flush=True)
        first, last = ends
        out["series"][name] = dict(
            published=last["published"] / first["published"] - 1,
            predicted={str(f): last["predicted"][f] / first["predicted"][f] - 1 for f in GRID})
    loss = {str(f): float(sum((s["predicted"][str(f)] - s["published"]) ** 2 for s in out["series"].values()))
            for f in GRID}
    out["loss"] = loss
    out["slow_fraction"] = float(min(GRID, key=lambda f: loss[str(f)]))
    return out


def test(slow_fraction: float) -> dict:
    """The TEST weak-scaling series: MFU slope against log2(GPUs), published, deterministic, stragglers."""
    by: dict[str, list] = {}
    for row in test_runs.rows():
        if row.mfu is not None:
            by.setdefault(row.series, []).append(row)
    slopes = {"published": [], "deterministic": [], "stragglers": []}
    series = {}
    for name, rows in by.items():
        if len({r.gpus for r in rows}) < 3:
            continue
        points = []
        for row in rows:
            cfg = row.build()
            plain = cfg.evaluate()
            ratio = row.predict(cfg, plain) / row.published
            r = cfg.evaluate(jitter=dp.Jitter(0.0, slow_fraction=slow_fraction, slow_factor=SLOW_FACTOR),
                             samples=SAMPLES)
            points.append(dict(gpus=row.gpus, published=row.mfu, deterministic=row.mfu * ratio,
                               stragglers=row.mfu * ratio * plain.step_time / r.expected_step_time))
        x = np.log2([p["gpus"] for p in points])
        fitted = {k: float(np.polyfit(x, [p[k] for p in points], 1)[0]) for k in slopes}
        for k, v in fitted.items():
            slopes[k].append(v)
        series[name] = dict(points=points, slope=fitted)
        print(f"test: {name} done", file=sys.stderr, flush=True)
    mean = {k: float(np.mean(v)) for k, v in slopes.items()}
    return dict(series=series, mean_slope=mean,
                ratio={k: mean[k] / mean["published"] for k in ("deterministic", "stragglers")})


def main() -> dict:
    start = time.perf_counter()
    fitted = fit()
    tested = test(fitted["slow_fraction"])
    out = dict(slow_factor=SLOW_FACTOR, samples=SAMPLES, grid=GRID, fit=fitted, test=tested,
               seconds=time.perf_counter() - start)
    dp.write_atomic(HERE / "stragglers.json", json.dumps(out, indent=1) + "\n")
    print(f"slow_fraction fitted on FIT: {fitted['slow_fraction']:g} (loss by grid point {fitted['loss']})")
    print(f"TEST MFU slope per doubling: {tested['mean_slope']} (ratio to published {tested['ratio']})")
    return out


if __name__ == "__main__":
    main()
