"""Where a TEST row's predicted step goes, by kernel class, and how much faster its attention would have to run for
the prediction to meet the published throughput.

A diagnosis, not a fit: nothing computed here enters diffpipe (the TEST set is never fitted to). For each chosen row
of ``test_runs.rows()`` it prints ``Configuration.evaluate()``'s breakdown as shares of the predicted step (GEMM,
attention, memory-bound, launch, exposed communication of every kind, bubble) and the factor
``attention / (published step - everything else)``: the speed-up of the row's attention kernels that alone would
give the published throughput with every other term as priced ("-" where even free attention would not: the
prediction is too slow by more than its attention). A factor that is the same across a model's sequences points at
the attention kernel's price; one that moves with something else (recomputation, microbatch) at another term. For
the fused causal attention of these rows it also prints the rate that speed-up means (the executed attention FLOPs
of a step, forward 1, recomputed forward 1 with recomputation, backward 2.5, over the attention time that would meet
the published step; beside it the rate the model prices) and that rate over FlashAttention-2's forward + backward
bar of the device's figure at the row's head dim, causal, at the row's sequence (16k, the figure's longest, beyond
it): ``attention_figures.csv``.

    python papers/published-runs/decompose.py                     # the llm-foundry rows of >= 4096 tokens
    python papers/published-runs/decompose.py "h100_bf16: MPT-7b"  # the rows whose name starts so (any sequence)
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import test_runs

#: FlashAttention-2's causal forward + backward bars (TFLOP/s) by device, head dim and sequence.
FIGURES = {"H100": "fa2_fig7_h100", "A100": "fa2_fig4_a100"}
with open(Path(__file__).resolve().parent.parent / "kernel-efficiency" / "attention_figures.csv") as _f:
    FA2_BARS = {(d, int(r["head_dim"]), int(r["seqlen"])): float(r["tflops"]) for r in csv.DictReader(_f)
                for d, fig in FIGURES.items() if r["figure"] == fig and r["kernel"] == "FlashAttention-2"
                and r["causal"] == "true"}


def attention_flops(cfg) -> float:
    """Executed FLOPs of a step's fused causal attention on one GPU (tensor = 1): ``2 b a s^2 (d_h + d_v) / 2`` a
    forward, the recomputed forward with recomputation, 2.5x the forward in the backward, per layer and microbatch."""
    m = cfg.model
    forward = 0.5 * 2 * m.microbatch_size * m.heads * m.sequence ** 2 * (m.dh + m.dv)
    passes = 1 + 2.5 + (1 if m.recompute in ("full", "selective") else 0)
    return forward * passes * m.layers * cfg.microbatches


def decompose(row: test_runs.Row) -> dict:
    """Row ``row``'s predicted step (s), its published step (s, from the published throughput), the breakdown's
    shares of the predicted step, and the attention speed-up that would meet the published step (None if none)."""
    cfg = row.build()
    res = cfg.evaluate()
    step = float(res.step_time)
    published = step * float(row.predict(None, res)) / row.published
    if row.metric == "seconds per iteration":
        published = row.published
    b = {k: float(v) for k, v in res.breakdown.items()}
    attention = b["compute_attention"]
    rest = published - (step - attention)
    shares = dict(gemm=b["compute_gemm"] / step, attention=attention / step, memory=b["compute_memory"] / step,
                  launch=b["compute_launch"] / step,
                  communication=sum(v for k, v in b.items() if k.startswith("exposed")) / step,
                  bubble=b["bubble"] / step)
    rate = bar = priced = None
    if cfg.model.flash_attention and cfg.parallelism.tensor == 1:
        priced = attention_flops(cfg) / attention / 1e12
    if priced is not None and rest > 0:
        rate = attention_flops(cfg) / rest / 1e12
        bar = FA2_BARS.get((row.device, int(cfg.model.dh), min(int(cfg.model.sequence), 16384)))
    return dict(name=row.name, series=row.series, step=step, published_step=published, error=published / step - 1,
                shares=shares, attention_speedup=attention / rest if rest > 0 else None, priced_tflops=priced,
                attention_tflops=rate,
                of_fa2_bar=None if rate is None or bar is None else rate / bar)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", nargs="*", help="row names starting so (default: llm-foundry rows of >= 4096 tokens)")
    args = ap.parse_args(argv)
    rows = [r for r in test_runs.rows() if (r.name.startswith(tuple(args.prefix)) if args.prefix else
                                            r.study == "llm_foundry" and int(r.series.split(":")[2]) >= 4096)]
    print("| row | mbs:recompute | error | GEMM | attention | memory | launch | exposed comm. | bubble | "
          "attention TFLOP/s priced | speed-up to meet it | its TFLOP/s | of FA2's bar |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        d = decompose(row)
        s = d["shares"]
        need = "-" if d["attention_speedup"] is None else f"{d['attention_speedup']:.2f}x"
        priced = "-" if d["priced_tflops"] is None else f"{d['priced_tflops']:.0f}"
        rate = "-" if d["attention_tflops"] is None else f"{d['attention_tflops']:.0f}"
        share = "-" if d["of_fa2_bar"] is None else f"{d['of_fa2_bar']:.2f}"
        print(f"| {d['name']} | {':'.join(d['series'].split(':')[3:])} | {d['error']:+.1%} | {s['gemm']:.1%} | "
              f"{s['attention']:.1%} | {s['memory']:.1%} | {s['launch']:.1%} | {s['communication']:.1%} | "
              f"{s['bubble']:.1%} | {priced} | {need} | {rate} | {share} |")


if __name__ == "__main__":
    main()
