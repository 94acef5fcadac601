"""Shared fitting code of the per-device kernel fits (``fit_h100.py``, ``fit_b200.py``, ...).

``fit_gemm``: least squares on log time of ``KernelModel``'s GEMM time (per-kernel overhead +
roofline with the tile/wave-quantised efficiency, ``diffpipe._machine._kernels``) to every measured
``(m, n, k)`` row of a table, for each discrete (tile_m, tile_n, split_k_min) in a small grid; the
continuous ``gemm_efficiency``, ``k_half`` and ``overhead`` by ``scipy.optimize.least_squares``.
``stream_fraction``: the sustained fraction of the datasheet bandwidth of a STREAM-like kernel (gpu-benches);
``babelstream_fraction``: the same from Azure's BabelStream tables (``azure_babelstream.csv``);
``azure_gemm_rows``: Azure's cuBLASLt GEMM table (``azure_cublaslt_gemm.csv``).
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import jax
import numpy as np
from scipy.optimize import least_squares

import diffpipe as dp
from diffpipe import KernelModel

jax.config.update("jax_enable_x64", True)
HERE = Path(__file__).resolve().parent
TILES = (64, 128, 256)
SPLIT_K_MIN = (128, 256, 512, 1024, 1 << 30)  # the last: no split-K
#: The streaming kernel whose bandwidth stands for a norm or activation kernel: one array read, one written.
STREAM_KERNEL = "scale"
#: BabelStream's name for the same kernel (``b[i] = scalar * c[i]``: one array read, one written).
BABELSTREAM_KERNEL = "Mul"


def gemm_rows(key: str) -> tuple[np.ndarray, ...]:
    """``(m, n, k, seconds)`` of every bf16 row of ``xla_matmul_bf16.csv`` for table key ``key``."""
    with open(HERE / "xla_matmul_bf16.csv") as f:
        data = [r for r in csv.DictReader(f) if r["device"] == key]
    m, n, k, rate = (np.asarray([float(r[c]) for r in data]) for c in ("m", "n", "k", "bf16_flops_per_s"))
    return m, n, k, 2 * m * n * k / rate


def azure_gemm_rows(system: str) -> tuple[np.ndarray, ...]:
    """``(m, n, k, seconds)`` of every row of ``azure_cublaslt_gemm.csv`` for Azure VM ``system``."""
    with open(HERE / "azure_cublaslt_gemm.csv") as f:
        data = [r for r in csv.DictReader(f) if r["system"] == system]
    if not data:
        raise KeyError(system)
    m, n, k, tflops = (np.asarray([float(r[c]) for r in data]) for c in ("m", "n", "k", "tflops"))
    return m, n, k, 2 * m * n * k / (tflops * 1e12)


def stream_fraction(file: str, preset: str) -> float:
    """The highest ``STREAM_KERNEL`` bandwidth of ``gpu_benches_stream.csv``'s ``file`` over any occupancy,
    over the preset's datasheet bandwidth."""
    with open(HERE / "gpu_benches_stream.csv") as f:
        best = max(float(r["gb_per_s"]) for r in csv.DictReader(f)
                   if r["file"] == file and r["kernel"] == STREAM_KERNEL)
    return best * 1e9 / float(dp.presets.DEVICES[preset].memory_bandwidth)


def babelstream_fraction(system: str, preset: str) -> float:
    """``BABELSTREAM_KERNEL``'s bandwidth in ``azure_babelstream.csv``'s ``system`` over the preset's datasheet
    bandwidth."""
    with open(HERE / "azure_babelstream.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["system"] == system and r["kernel"] == BABELSTREAM_KERNEL]
    if len(rows) != 1:
        raise KeyError((system, BABELSTREAM_KERNEL))
    return float(rows[0]["tb_per_s"]) * 1e12 / float(dp.presets.DEVICES[preset].memory_bandwidth)


def model(preset: str, sms: int, memory_efficiency: float, tile_m: int, tile_n: int, split: int,
          p: np.ndarray) -> KernelModel:
    e, kh, o = (float(x) for x in np.exp(p))
    return KernelModel(min(e, 1.0), kh, memory_efficiency, o, 1.0, 0.0, 1.0, sms=sms, tile_m=tile_m, tile_n=tile_n,
                       split_k_min=split)


def gemm_seconds(km: KernelModel, preset: str, m, n, k) -> np.ndarray:
    spec = dp.presets.DEVICES[preset]
    return np.asarray(km.gemm_seconds(spec.peak_flops, spec.memory_bandwidth, m, n, k), np.float64)


def fit_gemm(key: str, preset: str, sms: int, memory_efficiency: float,
             rows: tuple[np.ndarray, ...] | None = None, split_k: tuple[int, ...] = SPLIT_K_MIN) -> dict:
    """The best GEMM fit over the discrete grid (module docstring), with its rms log error, to the rows of
    table key ``key`` of ``xla_matmul_bf16.csv``, or to ``rows`` (``(m, n, k, seconds)``) when given;
    ``split_k``: the ``split_k_min`` values tried."""
    m, n, k, seconds = gemm_rows(key) if rows is None else rows
    best = None
    for tm, tn, split in itertools.product(TILES, TILES, split_k):
        def residual(p, tm=tm, tn=tn, split=split):
            km = model(preset, sms, memory_efficiency, tm, tn, split, p)
            return np.log(gemm_seconds(km, preset, m, n, k) / seconds)

        res = least_squares(residual, np.log([0.8, 100.0, 3e-6]), bounds=(np.log([0.05, 1.0, 1e-8]),
                                                                          np.log([1.0, 1e5, 1e-4])))
        rms = float(np.sqrt(np.mean(res.fun ** 2)))
        if best is None or rms < best["rms_log_error"]:
            best = dict(tile_m=tm, tile_n=tn, split_k_min=split, p=res.x, rms_log_error=rms)
    km = model(preset, sms, memory_efficiency, best["tile_m"], best["tile_n"], best["split_k_min"], best["p"])
    predicted = gemm_seconds(km, preset, m, n, k)
    # the old per-op curve (efficiency in the rows only), on the same rows, for comparison
    old = dp.presets.device(preset).without_kernels()
    spec = dp.presets.DEVICES[preset]
    flops = 2 * m * n * k
    old_pred = np.asarray(old.seconds(flops, 2 * (m * k + k * n + m * n), m), np.float64)
    peak = float(spec.peak_flops)
    return dict(
        table_key=key, sms=sms, tile_m=best["tile_m"], tile_n=best["tile_n"], split_k_min=best["split_k_min"],
        gemm_efficiency=round(float(km.gemm_efficiency), 4), k_half=round(float(km.k_half), 1),
        overhead=float(f"{float(km.overhead):.3g}"), rms_log_error=round(best["rms_log_error"], 4),
        rms_log_error_tokens_curve=round(float(np.sqrt(np.mean(np.log(old_pred / seconds) ** 2))), 4),
        rows=[dict(m=int(a), n=int(b), k=int(c), measured=round(float(f / s / peak), 4),
                   fitted=round(float(f / p / peak), 4))
              for a, b, c, f, s, p in zip(m, n, k, flops, seconds, predicted)])


def write(preset: str, out: dict, name: str | None = None) -> None:
    """Write ``name`` (default ``kernels_<preset>.json``) and print its summary."""
    path = HERE / (name or f"kernels_{preset.lower()}.json")
    dp.write_atomic(path, json.dumps(out, indent=1) + "\n", path.name)
    g = out["gemm"]
    print(f"{preset}: GEMM efficiency {g['gemm_efficiency']}, k_half {g['k_half']}, overhead {g['overhead']:.3g} s, "
          f"tiles {g['tile_m']}x{g['tile_n']}, split_k_min {g['split_k_min']}: rms log error {g['rms_log_error']} over "
          f"{len(g['rows'])} shapes (the tokens-only curve: {g['rms_log_error_tokens_curve']}); memory efficiency "
          f"{out['memory_efficiency']:.3f}; attention {out['attention']['attention_efficiency']}; MAMF check "
          f"{out.get('mamf_check')} -> {path.name}")


def attention_point(source: str, device_prefix: str, kernel: str) -> dict:
    """The row of ``attention_text_points.csv`` of ``source`` whose device starts with ``device_prefix``
    and whose kernel is ``kernel``."""
    with open(HERE / "attention_text_points.csv") as f:
        for r in csv.DictReader(f):
            if r["source"] == source and r["device"].startswith(device_prefix) and r["kernel"] == kernel:
                return r
    raise KeyError((source, device_prefix, kernel))


def attention(preset: str, k_half: float, tflops: float, sequence: float, where: str) -> dict:
    """The fused-attention curve ``e s / (s + s_half)`` with ``s_half`` the GEMM fit's ``k_half`` (a
    flash-attention block's loop over the keys is a GEMM main loop over ``K``; no sweep by sequence is
    published in text) and ``e`` such that the curve passes through the measured point."""
    fraction = tflops * 1e12 / float(dp.presets.DEVICES[preset].peak_flops)
    return dict(attention_efficiency=round(min(1.0, fraction * (sequence + k_half) / sequence), 4),
                attention_half=k_half, attention_backward=1.0, point=dict(tflops=tflops, sequence=sequence,
                                                                           fraction_of_peak=round(fraction, 4),
                                                                           where=where))


def mamf_point(accelerator: str) -> dict:
    """The ``mamf_ml_engineering.csv`` bf16 row of ``accelerator``."""
    with open(HERE / "mamf_ml_engineering.csv") as f:
        return next(r for r in csv.DictReader(f) if r["dtype"] == "bf16" and r["accelerator"] == accelerator)


def kernel_model(out: dict) -> KernelModel:
    """The ``KernelModel`` of a ``kernels_<device>.json``."""
    g, a = out["gemm"], out["attention"]
    return KernelModel(g["gemm_efficiency"], g["k_half"], out["memory_efficiency"], g["overhead"],
                       a["attention_efficiency"], a["attention_half"], a["attention_backward"], sms=g["sms"],
                       attention_native=out.get("attention_native", 1.0),
                       attention_older=a.get("attention_older", 0.5), tile_m=g["tile_m"], tile_n=g["tile_n"],
                       split_k_min=g["split_k_min"])


def mamf_check(out: dict, preset: str, accelerator: str) -> dict:
    """The fitted model at the best shape of ``mamf_ml_engineering.csv`` (a shape outside the XLA table)."""
    r = mamf_point(accelerator)
    m, n, k = (float(r[c]) for c in ("best_m", "best_n", "best_k"))
    seconds = float(gemm_seconds(kernel_model(out), preset, m, n, k))
    return dict(m=int(m), n=int(n), k=int(k), measured_tflops=float(r["mamf_tflops"]),
                predicted_tflops=round(2 * m * n * k / seconds / 1e12, 1))


# -- fused attention by sequence, per pass, from the FlashAttention papers' figures (``attention_figures.csv``) --
#: The FLOPs the FlashAttention benchmarks count (``benchmarks/benchmark_flash_attention.py`` at Dao-AILab/flash-
#: attention 60499abc, ``flops``): forward ``4 b s^2 h d`` (halved with the causal mask), backward 2.5x that,
#: forward + backward 3.5x; a rate is those FLOPs over the pass's time.
BACKWARD_FLOPS, COMBINED_FLOPS = 2.5, 3.5
#: The head dims of the fit: those of the training rows (64 and 128); every training kernel is causal.
FIT_HEAD_DIMS = (64, 128)


def figure_points(figure: str, kernel: str, causal: bool = True,
                  head_dims: tuple[int, ...] = FIT_HEAD_DIMS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(seqlen, head_dim, TFLOP/s)`` of ``attention_figures.csv``'s bars of ``kernel`` in ``figure``."""
    with open(HERE / "attention_figures.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["figure"] == figure and r["kernel"] == kernel
                and r["causal"] == ("true" if causal else "false") and int(r["head_dim"]) in head_dims]
    if not rows:
        raise KeyError((figure, kernel, causal, head_dims))
    return tuple(np.asarray([float(r[c]) for r in rows]) for c in ("seqlen", "head_dim", "tflops"))


def combined_factor(ratio: float) -> float:
    """A forward + backward rate over the forward rate when the backward runs at ``ratio`` times the forward's
    rate (3.5 FLOPs in ``1 + 2.5 / ratio`` forward-times)."""
    return COMBINED_FLOPS * ratio / (ratio + BACKWARD_FLOPS)


def ratio_from_factor(k: float) -> float:
    """The backward's rate over the forward's that gives ``combined_factor`` ``k``."""
    return BACKWARD_FLOPS * k / (COMBINED_FLOPS - k)


def fit_curve(preset: str, s: np.ndarray, tflops: np.ndarray) -> tuple[float, float, float]:
    """``(e, s_half, rms log error)`` of ``peak e s / (s + s_half)`` fitted to ``tflops`` at sequences ``s`` (least
    squares on log rate)."""
    peak = float(dp.presets.DEVICES[preset].peak_flops) / 1e12

    def residual(p):
        e, half = np.exp(p)
        return np.log(peak * e * s / (s + half) / tflops)

    res = least_squares(residual, np.log([0.5, 300.0]))
    e, half = (float(x) for x in np.exp(res.x))
    return e, half, float(np.sqrt(np.mean(res.fun ** 2)))


def older_rate(figure: str) -> float:
    """FlashAttention-1's forward + backward rate over FlashAttention-2's at the same causal points of ``figure``
    (geometric mean): the older generation's rate relative to the curve, both passes alike (no figure gives
    FlashAttention-1's passes apart)."""
    s1, d1, v1 = figure_points(figure, "FlashAttention")
    s2, d2, v2 = figure_points(figure, "FlashAttention-2")
    assert np.array_equal(s1, s2) and np.array_equal(d1, d2)
    return float(np.exp(np.mean(np.log(v1 / v2))))


def _measured_vs_fitted(rate, figure: str, kernel: str, factor: float = 1.0) -> list[dict]:
    """Each bar of ``kernel`` in ``figure``: its measured TFLOP/s beside ``rate(seqlen) x factor``."""
    s, d, v = figure_points(figure, kernel)
    return [dict(seqlen=int(a), head_dim=int(b), measured=float(c), fitted=round(float(rate(a) * factor), 1))
            for a, b, c in zip(s, d, v)]


def attention_from_figures(device: str) -> dict:
    """The fused-attention fit of ``device`` (``"H100"`` or ``"A100"``) to the FlashAttention papers' figures, causal
    bars of head dims ``FIT_HEAD_DIMS``:

    - H100: the forward curve ``e s / (s + s_half)`` to FlashAttention-2's forward bars of FlashAttention-3's Fig. 5;
      the backward's ratio to FlashAttention-2's forward + backward bars of its own Fig. 7, given that forward
      (least squares on log rate of the one factor ``combined_factor``). The two figures are a year apart (2023's
      FlashAttention-2 in its own paper, 2024's in FlashAttention-3's).
    - A100: no figure gives a pass apart. The backward's ratio from the two A100 numbers of the FlashAttention-2
      paper that can be paired: its text's forward "up to 230 TFLOPs/s" (``attention_text_points.csv``) and Fig. 4's
      largest forward + backward bar, head dim 128 without the mask at 16k (203), taken at the same point (an
      assumption: the forward sweep's best is where the combined sweep's is); the forward curve then to Fig. 4's
      forward + backward bars given that ratio.
    - Both: the older generation's rate (``older_rate``), FlashAttention-1 over FlashAttention-2 in the device's
      forward + backward figure.
    """
    peak = float(dp.presets.DEVICES[device].peak_flops) / 1e12
    if device == "H100":
        s, _, fwd = figure_points("fa3_fig5_h100", "FlashAttention-2")
        e, half, rms = fit_curve(device, s, fwd)
        sc, _, comb = figure_points("fa2_fig7_h100", "FlashAttention-2")
        curve = peak * e * sc / (sc + half)
        k = float(np.exp(np.mean(np.log(comb / curve))))
        ratio = ratio_from_factor(k)
        rms_combined = float(np.sqrt(np.mean(np.log(k * curve / comb) ** 2)))
        source = ("forward: attention_figures.csv fa3_fig5_h100 (FlashAttention-2 bars); backward ratio: "
                  "fa2_fig7_h100 (FlashAttention-2 forward + backward) given that forward")
        older_figure, forward_figure = "fa2_fig7_h100", "fa3_fig5_h100"
    elif device == "A100":
        text = attention_point("fa2_arxiv_2307.08691", "A100", "FlashAttention-2")
        s16, d16, v16 = figure_points("fa2_fig4_a100", "FlashAttention-2", causal=False, head_dims=(128,))
        best = float(v16[s16 == 16384][0])
        ratio = ratio_from_factor(best / float(text["tflops"]))
        k = combined_factor(ratio)
        sc, _, comb = figure_points("fa2_fig4_a100", "FlashAttention-2")
        e, half, rms_combined = fit_curve(device, sc, comb / k)
        rms = None
        source = ("backward ratio: attention_text_points.csv FA2 'up to 230 TFLOPs/s' forward with "
                  "attention_figures.csv fa2_fig4_a100 head dim 128 non-causal 16k forward + backward (203), same "
                  "point assumed; forward curve: fa2_fig4_a100 causal forward + backward given that ratio")
        older_figure, forward_figure = "fa2_fig4_a100", None
    else:
        raise KeyError(device)

    def rate(x):
        return peak * e * x / (x + half)

    out = dict(attention_efficiency=round(e, 4), attention_half=round(half, 1), attention_backward=round(ratio, 4),
               attention_older=round(older_rate(older_figure), 4), rms_log_error_forward=None if rms is None
               else round(rms, 4), rms_log_error_combined=round(rms_combined, 4), source=source,
               combined=_measured_vs_fitted(rate, older_figure, "FlashAttention-2", combined_factor(ratio)))
    if forward_figure:
        out["forward"] = _measured_vs_fitted(rate, forward_figure, "FlashAttention-2")
    return out
