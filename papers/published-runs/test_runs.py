"""The TEST set of published runs (``test_data.toml``): simulated as published, never fitted to.

Every number of these rows is in ``test_data.toml`` with its source; what no source states is an
assumption listed in ``TEST_ASSUMPTIONS`` (and printed in ``test_results.md``). No parameter of diffpipe
is fitted to any of these rows: the kernel curves come from ``papers/kernel-efficiency`` (kernel
benchmarks), the collective model from its NCCL/XLA measurements.

Rows used: llm-foundry's BF16 MPT tables (A100 80 GB, A100 40 GB, H100: PyTorch FSDP, tensor = pipeline =
1), flash-attention's 8x A100 GPT-3 table, BLOOM-176B. Left out: FP8 rows (diffpipe prices bf16 kernels
only), NeMo-launcher's scaling rows (``config_stated = false``), Megatron Bridge's and NeMo 24.07's
tables (FP8, or MoE shapes not transcribed).

Metric: tokens/s per GPU (BLOOM: seconds per iteration). Summary (``summarise``): MAPE and mean signed
error per device generation; the slope of MFU against log2(GPUs) over each weak-scaling series
(same model, sequence and microbatch, more GPUs), published vs predicted; and the pairs of rows whose
published MFU differ by more than 2% that the prediction orders as published.

    python papers/published-runs/test_runs.py            # every row (writes test_results.json / .md)
    python papers/published-runs/test_runs.py --quick    # a CI-sized subset, nothing written
"""

from __future__ import annotations

import argparse
import json
import math
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import diffpipe as dp

HERE = Path(__file__).resolve().parent
TEST = tomllib.loads((HERE / "test_data.toml").read_text())

#: llm-foundry's A100 sections: "with 1600 Gbps node-node interconnect (RoCE)", i.e. 8 x 200 Gb/s per node.
MOSAIC_A100 = dict(devices_per_node=8, intra="nvlink3", inter="roce-200")
#: llm-foundry's H100 sections name no interconnect: 400 Gb/s InfiniBand per GPU assumed.
MOSAIC_H100 = dict(device="H100", devices_per_node=8, intra="nvlink4", inter="ib-ndr")
#: BLOOM (Jean Zay): "4 OmniPath links" of 100 Gb/s per 8-GPU node, i.e. 6.25 GB/s per GPU.
JEAN_ZAY = dict(device="A100", devices_per_node=8, intra="nvlink3", inter=(6.25e9, 5e-6))

TEST_ASSUMPTIONS = {
    "llm_foundry": [
        "MPT as in its yamls (test_data.toml config_source): LayerNorm, GeLU MLP (4h), no biases, tied embeddings, "
        "learned positions (the table's NumParams grows with the sequence), vocabulary 50368, no dropout, "
        "bf16 weights and activations (amp_bf16 and bf16 priced alike). Attention: MPT's Triton flash-attention "
        "kernel (attn_impl 'triton', the default of submit_benchmarks.py, which sweep.sh does not override, at "
        "b2a43a147 and 5e85bd62d), priced as FlashAttention-1 (flash_version=1); except the h100_bf16_large rows "
        "of 1b, 3b, 7b and 70b, which the section's generator sweep.py (5e85bd62d) runs with '--attn_impl flash' "
        "and the '.[gpu-flash2]' install (flash-attn 2.4.2), priced as FlashAttention-2 (flash_version=2) with "
        "the unpadding llm-foundry's flash_attn_fn runs around it (unpadded_attention: flash-attn's "
        "bert_padding.unpad_input on q, k and v, pad_input on the output, and their backward).",
        "PyTorch FSDP FULL_SHARD as ZeRO-3, SHARD_GRAD_OP as ZeRO-2, each block one FSDP unit (gradients "
        "reduce-scattered per block during the backward, parameters prefetched: the FIT set's torchtitan rule), "
        "after every microbatch (Composer enters no no_sync for FSDP: the 'fsdp' framework preset), "
        "in fp32 for MP Mode DEFAULT and bf16 for PURE (Composer's get_mixed_precision at v0.16.4 / v0.17.2); "
        "the H100s are SXM parts on 400 Gb/s InfiniBand per GPU (the README says neither).",
    ],
    "flash_attention": [
        "GPT-3 as Megatron's GPT (biases, dropout, GeLU, tied embeddings, learned positions), vocabulary 50264 "
        "(50257 padded to a multiple of 8), flash attention, bf16; 'zero1' rows as ZeRO-1, others ZeRO-0; one "
        "8-GPU node; PyTorch DDP's 25 MiB gradient buckets overlapped with the backward, in fp32 (Lightning's "
        "'precision: bf16' autocasts with fp32 parameters, so their gradients are fp32).",
    ],
    "bloom": [
        "BLOOM-176B as Megatron's GPT with ALiBi priced as rotary positions (no position parameters), an "
        "embedding LayerNorm not counted, no flash attention (Megatron-DeepSpeed 2022); bf16 with its own ZeRO-1 "
        "equivalent as ZeRO-1; 1F1B; Omni-Path at 6.25 GB/s per GPU.",
    ],
}


@dataclass
class Row:
    study: str
    series: str
    name: str
    device: str
    published: float
    metric: str
    build: Callable[[], Any]
    predict: Callable[[Any, Any], float]
    mfu: float | None
    gpus: int


def _tokens(cfg: Any, res: Any) -> float:
    return res.tokens_per_second_per_gpu


def _step(cfg: Any, res: Any) -> float:
    return res.step_time


def configuration(model: dp.Transformer, cluster: dict[str, Any], gpus: int, batch: int, *, tensor: int = 1,
                  pipeline: int = 1, zero: int = 0, schedule: str | None = None,
                  framework: Any = None) -> dp.Configuration:
    data = gpus // (tensor * pipeline)
    par = dp.Parallelism(tensor=tensor, pipeline=pipeline, data=data, zero=zero)
    return dp.Configuration(model, par, dp.Cluster(gpus=gpus, **cluster), batch, schedule=schedule, framework=framework)


#: Bytes of a gradient element in FSDP's reduce-scatter by Composer's ``mixed_precision`` mode (``get_mixed_precision``
#: in ``composer/trainer/mosaic_fsdp_utils.py`` at v0.16.4 and v0.17.2, the versions llm-foundry pinned at b2a43a147
#: and 5e85bd62d): ``DEFAULT`` reduces in fp32, ``PURE`` in the training precision.
COMPOSER_REDUCE_BYTES = {"DEFAULT": 4, "PURE": 2}

#: The attention kernel of each model of the ``h100_bf16_large`` section: its generator,
#: ``scripts/train/benchmarking/sweep.py`` at 5e85bd62d (the commit that added the section; its GPU counts,
#: microbatch sizes, sharding and checkpointing are the table's), passes ``--attn_impl flash`` for 1b, 3b, 7b
#: and 70b and ``--attn_impl triton`` for 13b and 30b; ``submit_benchmarks.py`` there installs
#: ``.[gpu-flash2]`` (``flash-attn==2.4.2`` in ``setup.py``), so 'flash' is FlashAttention-2. Every other
#: section ran ``submit_benchmarks.py``'s default, 'triton' (``flash_version=1``).
LARGE_FLASH_VERSION = {"mpt-1b": 2, "mpt-3b": 2, "mpt-7b": 2, "mpt-70b": 2, "mpt-13b": 1, "mpt-30b": 1}
#: Whether those 'flash' rows price llm-foundry's unpadding around the kernel (``Transformer.unpadded_attention``):
#: ``flash_attn_fn`` (``llmfoundry/models/layers/attention.py`` at 5e85bd62d) runs flash-attn's
#: ``bert_padding.unpad_input`` on q, k and v and ``pad_input`` on the output whatever the mask (none: all ones);
#: the triton path does neither.
UNPADDED = True

#: llm-foundry: PyTorch FSDP wrapping each block (``diffpipe.presets.FRAMEWORKS["fsdp"]``; its fp32 reduction is
#: Composer's DEFAULT mode, the model states the PURE rows' bf16). flash-attention's training runs: Lightning's
#: ``precision: bf16`` autocasts with fp32 parameters, so DDP (25 MiB buckets) reduces fp32 gradients (``"ddp"``).
FSDP = dp.presets.framework("fsdp")
DDP = dp.presets.framework("ddp")


def llm_foundry() -> list[Row]:
    out = []
    sections = {"h100_bf16_large": ("H100", "H100"), "h100_bf16": ("H100", "H100"), "a100_80gb": ("A100", "A100"),
                "a100_40gb": ("A100-40GB", "A100")}
    for section, (device, generation) in sections.items():
        for r in TEST["llm_foundry"][section]:
            if "fp8" in r["precision"].lower():
                continue
            model = dp.Transformer(layers=r["layers"], hidden=r["hidden"], heads=r["heads"], sequence=r["sequence"],
                                   vocabulary=50368, microbatch_size=r["mbs"], recompute=r["recompute"], bias=False,
                                   dropout=False, flash_attention=True,
                                   flash_version=LARGE_FLASH_VERSION[r["model"]] if section == "h100_bf16_large" else 1,
                                   unpadded_attention=UNPADDED and section == "h100_bf16_large"
                                   and LARGE_FLASH_VERSION[r["model"]] == 2,
                                   reduce_bytes=COMPOSER_REDUCE_BYTES[r["mp_mode"]])
            cluster = MOSAIC_H100 if device == "H100" else dict(MOSAIC_A100, device=device)
            zero = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}[r["sharding"]]

            def build(model=model, cluster=cluster, r=r, zero=zero):
                return configuration(model, cluster, r["gpus"], r["batch"], zero=zero, framework=FSDP)

            series = f"{section}:{r['model']}:{r['sequence']}:{r['mbs']}:{r['recompute']}"
            out.append(Row("llm_foundry", series, f"{section}: {r['name']}", generation, r["tps_per_gpu"],
                           "tokens/s per GPU", build, _tokens, r["mfu"], r["gpus"]))
    return out


def flash_attention() -> list[Row]:
    out = []
    for r in TEST["flash_attention"]["rows"]:
        model = dp.Transformer(layers=r["layers"], hidden=r["hidden"], heads=r["heads"], sequence=r["sequence"],
                               vocabulary=50264, microbatch_size=r["mbs"], recompute=r["recompute"],
                               flash_attention=True)
        zero = 1 if r["optimizer_sharding"] == "zero1" else 0

        def build(model=model, r=r, zero=zero):
            return configuration(model, dict(device="A100", devices_per_node=8, intra="nvlink3", inter="ib-hdr"),
                                 r["gpus"], r["batch"], zero=zero, framework=DDP)

        out.append(Row("flash_attention", "flash_attention", r["name"], "A100", r["tps"] / r["gpus"],
                       "tokens/s per GPU", build, _tokens, None, r["gpus"]))
    return out


def bloom() -> list[Row]:
    out = []
    for r in TEST["bloom"]["rows"]:
        model = dp.Transformer(layers=r["layers"], hidden=r["hidden"], heads=r["heads"], sequence=r["sequence"],
                               vocabulary=r["vocab"], microbatch_size=r["mbs"], recompute=r["recompute"],
                               positions="rotary")

        def build(model=model, r=r):
            return configuration(model, JEAN_ZAY, r["gpus"], r["batch"], tensor=r["tp"], pipeline=r["pp"], zero=1)

        out.append(Row("bloom", "bloom", r["name"], "A100", r["step_s"], "seconds per iteration", build, _step, None,
                       r["gpus"]))
    return out


STUDIES = {"llm_foundry": llm_foundry, "flash_attention": flash_attention, "bloom": bloom}
#: ``--quick``: one small row of each device generation and study.
QUICK = {"a100_80gb: MPT-1b seq 2048 8x a100_80gb", "h100_bf16: MPT-1b seq 2048 8x h100_80gb",
         "GPT3-125M 8x A100"}


def rows(quick: bool = False) -> list[Row]:
    out = [r for study in STUDIES.values() for r in study()]
    return [r for r in out if r.name in QUICK] if quick else out


#: ``--stragglers``: Monte Carlo samples of each row's step (``stragglers.py``'s count).
STRAGGLER_SAMPLES = 32


def stragglers() -> Any:
    """The stragglers ``stragglers.py`` fitted on the FIT set (``stragglers.json``) as a ``dp.Jitter``."""
    fitted = json.loads((HERE / "stragglers.json").read_text())
    return dp.Jitter(0.0, slow_fraction=fitted["fit"]["slow_fraction"], slow_factor=fitted["slow_factor"])


def evaluate(row: Row, jitter: Any = None) -> dict[str, Any]:
    """One row's prediction; with ``jitter`` (``stragglers()``) the expected step of the Monte Carlo
    (``Configuration.evaluate(jitter=...)``) in place of the deterministic one."""
    t0 = time.perf_counter()
    cfg = row.build()
    res = cfg.evaluate() if jitter is None else cfg.evaluate(jitter=jitter, samples=STRAGGLER_SAMPLES)
    predicted = float(row.predict(cfg, res))
    if jitter is not None:  # the metric of the expected step: a throughput falls, a step time grows with it
        slower = float(res.expected_step_time) / float(res.step_time)
        predicted = predicted * slower if row.metric == "seconds per iteration" else predicted / slower
    # throughput-like metrics: error of the throughput; a step time: of its inverse (so that + is "too fast")
    ratio = predicted / row.published if row.metric != "seconds per iteration" else row.published / predicted
    return dict(study=row.study, series=row.series, name=row.name, device=row.device, gpus=row.gpus,
                metric=row.metric, published=row.published, predicted=predicted, error=ratio - 1,
                mfu_published=row.mfu, mfu_predicted=None if row.mfu is None else row.mfu * ratio,
                step_time=res.step_time, fits=bool(res.fits), memory_per_gpu_gb=res.memory_per_gpu / 1e9,
                seconds=time.perf_counter() - t0)


def _slopes(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Least-squares slope of MFU against log2(GPUs) in every series of 3+ GPU counts, published and predicted."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r["mfu_published"] is not None:
            by.setdefault(r["series"], []).append(r)
    pub, pred = [], []
    for series in by.values():
        if len({r["gpus"] for r in series}) < 3:
            continue
        x = np.log2([r["gpus"] for r in series])
        pub.append(np.polyfit(x, [r["mfu_published"] for r in series], 1)[0])
        pred.append(np.polyfit(x, [r["mfu_predicted"] for r in series], 1)[0])
    if not pub:
        return dict(series=0)
    return dict(series=len(pub), published=float(np.mean(pub)), predicted=float(np.mean(pred)),
                ratio=float(np.mean(pred) / np.mean(pub)) if np.mean(pub) else math.nan)


def _pairs(results: list[dict[str, Any]], threshold: float = 0.02) -> dict[str, Any]:
    """Pairs (same device generation) whose published MFU differ by more than ``threshold`` (relative)."""
    rs = [r for r in results if r["mfu_published"] is not None]
    pairs = ordered = 0
    for i in range(len(rs)):
        for j in range(i + 1, len(rs)):
            a, b = rs[i], rs[j]
            if a["device"] != b["device"] or abs(a["mfu_published"] / b["mfu_published"] - 1) <= threshold:
                continue
            pairs += 1
            ordered += (a["mfu_predicted"] - b["mfu_predicted"]) * (a["mfu_published"] - b["mfu_published"]) > 0
    return dict(pairs=pairs, ordered=ordered)


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(rs: list[dict[str, Any]]) -> dict[str, Any]:
        e = np.asarray([r["error"] for r in rs])
        return dict(rows=len(rs), mape=float(np.mean(np.abs(e))), mean_error=float(np.mean(e)),
                    max_abs_error=float(np.max(np.abs(e))))

    out = dict(all=stats(results), slope=_slopes(results), pairs=_pairs(results))
    for key in ("device", "study"):
        for value in sorted({r[key] for r in results}):
            out[f"{key}:{value}"] = stats([r for r in results if r[key] == value])
    return out


def markdown(results: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    lines = ["# TEST set: predicted vs published (never fitted)", "",
             "Generated by `python papers/published-runs/test_runs.py`; sources in `test_data.toml`.", "",
             "| slice | rows | MAPE | mean signed error | max abs error |", "|---|---:|---:|---:|---:|"]
    for key, s in summary.items():
        if isinstance(s, dict) and "mape" in s:
            lines.append(f"| {key} | {s['rows']} | {100 * s['mape']:.1f}% | {100 * s['mean_error']:+.1f}% | "
                         f"{100 * s['max_abs_error']:.1f}% |")
    sl, pr = summary["slope"], summary["pairs"]
    lines += ["", f"MFU slope against log2(GPUs) over {sl.get('series', 0)} weak-scaling series: published "
              f"{sl.get('published', math.nan):+.4f}, predicted {sl.get('predicted', math.nan):+.4f} per doubling "
              f"(ratio {sl.get('ratio', math.nan):.2f}). Pairs whose published MFU differ by more than 2% (same "
              f"generation): {pr['ordered']}/{pr['pairs']} ordered as published.", "", "Assumptions:", ""]
    for study, items in TEST_ASSUMPTIONS.items():
        lines += [f"- {study}: {x}" for x in items]
    lines += ["", "| row | device | GPUs | published | predicted | error | fits |",
              "|---|---|---:|---:|---:|---:|:---:|"]
    for r in results:
        lines.append(f"| {r['name']} | {r['device']} | {r['gpus']} | {r['published']:.4g} | {r['predicted']:.4g} | "
                     f"{100 * r['error']:+.1f}% | {'yes' if r['fits'] else 'no'} |")
    return "\n".join(lines) + "\n"


def run(quick: bool = False, log: Callable[[str], None] = print, jitter: Any = None) -> dict[str, Any]:
    results = []
    for row in rows(quick):
        r = evaluate(row, jitter)
        log(f"{row.study:16s} {row.name:55s} published {r['published']:9.4g} predicted {r['predicted']:9.4g} "
            f"error {100 * r['error']:+6.1f}% ({r['seconds']:.1f} s)")
        results.append(r)
    return dict(quick=quick, assumptions=TEST_ASSUMPTIONS, rows=results, summary=summarise(results))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a CI-sized subset of rows (nothing written)")
    ap.add_argument("--out", type=Path, default=None, help="folder for test_results.json/.md (default: here)")
    ap.add_argument("--stragglers", action="store_true",
                    help="predict the expected step with stragglers.py's FIT-fitted stragglers "
                         "(test_results_stragglers.json/.md)")
    args = ap.parse_args(argv)
    jitter = stragglers() if args.stragglers else None
    out = run(args.quick, log=lambda s: print(s, flush=True), jitter=jitter)
    if jitter is not None:
        out["stragglers"] = dict(slow_fraction=float(jitter.slow_fraction),
                                 slow_factor=float(jitter.slow_factor), samples=STRAGGLER_SAMPLES)
    folder = args.out if args.out is not None else (None if args.quick else HERE)
    if folder is not None:
        name = "test_results_stragglers" if jitter is not None else "test_results"
        folder.mkdir(parents=True, exist_ok=True)
        dp.write_atomic(folder / f"{name}.json", json.dumps(out, indent=1) + "\n")
        dp.write_atomic(folder / f"{name}.md", markdown(out["rows"], out["summary"]))
    s = out["summary"]
    for key, v in s.items():
        if isinstance(v, dict) and "mape" in v:
            print(f"{key:24s} rows {v['rows']:4d}  MAPE {100 * v['mape']:5.1f}%  mean {100 * v['mean_error']:+5.1f}%")
    print("slope", s["slope"], "pairs", s["pairs"])


if __name__ == "__main__":
    main()
