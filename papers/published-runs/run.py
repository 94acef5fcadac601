"""Published training runs as tests: simulate each published configuration with diffpipe's parallel
cost model and compare the prediction with what the paper or framework measured.

Sources (every published number and configuration value, quoted with its table and file):
``data.toml`` next to this script. What no source states is an assumption of this script, listed in
``ASSUMPTIONS`` and printed next to its rows in ``results.md``.

Studies (one table each in ``results.md``):

- ``sc21_table1``: Narayanan et al., SC'21, Table 1 (GPT 1.7B-1T on up to 3072 A100s), with the
  microbatch size, virtual stages and recomputation of the authors' ``run_table_1.sh``; metric: teraFLOP/s
  per GPU by the paper's Eq. (3) from the (predicted) iteration time.
- ``sc21_table2``: the PTD-P rows of SC'21 Table 2 (GPT-3 175B and 530B at fixed batch on 1x, 2x, 4x GPUs).
- ``korthikanti_table5``: Korthikanti et al. 2022, Table 5 (iteration time, full recomputation vs
  sequence parallelism + selective recomputation, 22B-1T, no data parallelism), and §6.3's 530B at 8-way
  data parallelism; ``korthikanti_table4``: Table 4 (one 22B layer's forward and backward, ms).
- ``llama3_table4``: Llama 3 405B, Table 4 rows 1-3 (8K and 16K H100s, the third with CP 16 at 131,072 tokens;
  TFLOP/s per GPU and BF16 MFU).
- ``torchtitan``: torchtitan's docs/performance.md, Llama 3.1 8B FSDP (tokens/s/GPU) and the 405B
  1F1B vs interleaved 1F1B pair (an ordering: that run used Float8).
- ``megatron_h100``: the Megatron-LM README's H100 weak-scaling table (teraFLOP/s per GPU).
- ``sc21_orderings``: the orderings that SC'21 §5 states in words about its Figures 12-14 and 16 (the
  numbers are only in plots, so only the stated ordering is checked).

Usage::

    python papers/published-runs/run.py            # every row (minutes on 2 CPUs)
    python papers/published-runs/run.py --quick    # a CI-sized subset (no results files unless --out)

Writes ``results.json`` and ``results.md`` next to this file (or into ``--out``).
``tests/test_published_runs.py`` checks every claim of the README against the committed
``results.json`` and recomputes a few rows exactly.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

import diffpipe as dp

HERE = Path(__file__).resolve().parent
DATA = tomllib.loads((HERE / "data.toml").read_text())

#: Selene (SC'21 §5, Korthikanti §6): DGX A100 80GB nodes of 8 GPUs (NVLink3/NVSwitch), eight 200 Gb/s
#: HDR InfiniBand HCAs per node, i.e. one 25 GB/s port per GPU: the presets "A100", "nvlink3", "ib-hdr".
SELENE = dict(device="A100", devices_per_node=8, intra="nvlink3", inter="ib-hdr")
#: Llama 3 (§3.3.1): H100 SXM 80GB, 8 per server over NVLink, 400 Gb/s RoCE per GPU.
META_H100 = dict(device="H100", devices_per_node=8, intra="nvlink4", inter="roce-400")
#: torchtitan (performance.md): H100 (96GB HBM2e, 500 W), NVLink in a host, 400 Gb/s RDMA per GPU.
TITAN_H100 = dict(device="H100", devices_per_node=8, intra="nvlink4", inter="roce-400")
#: Megatron-LM README (2024): H100 clusters; the interconnect is not named (InfiniBand NDR assumed).
NVIDIA_H100 = dict(device="H100", devices_per_node=8, intra="nvlink4", inter="ib-ndr")

#: What this script assumes where no source says; results.md prints these next to the tables.
ASSUMPTIONS: dict[str, list[str]] = {
    "all": [
        "Device presets as they are: every op timed as its kernels (diffpipe._model._kernels) with the presets' "
        "KernelModel (papers/kernel-efficiency: GEMMs by shape from OpenXLA's H100 table; the A100 with the "
        "H100's shape parameters and its GEMM ceiling fitted to Korthikanti Table 4, a row of this FIT set; "
        "memory-bound kernels at STREAM bandwidth; attention through the FlashAttention-2/3 papers' points); "
        "collectives at the links' measured NCCL bus bandwidth (fit_collectives.py), hierarchical over nodes.",
        "Communication mode 'overlap' (transfers and the gradient sync overlap compute); tensor-parallel "
        "collectives sit on the critical path of their op (CommunicationOverlap.tensor = 0) except where the "
        "source states --tp-comm-overlap (Megatron-LM's README: dp.transformer_engine_tensor_overlap, Transformer "
        "Engine's default chunking). The gradient sync overlaps the backward bucket by bucket where the framework does "
        "(Megatron-LM 2024 README and Llama 3: --overlap-grad-reduce buckets; torchtitan: FSDP per block with "
        "prefetch) and not in the 2021-22 Megatron runs (Korthikanti §6.3).",
        "The data-parallel gradient sync and optimizer step are part of the step only where diffpipe's compile "
        "has gradient_sync (docs/architecture.md, gradient sync): each row of results.json says so (gradient_sync).",
    ],
    "sc21_table1": [
        "GPT as in Megatron-LM 2021: learned positions, LayerNorm, GeLU, biases, tied embeddings, dropout, no "
        "flash attention; fp16 (2-byte) weights and activations; full recomputation of every layer "
        "('--activations-checkpoint-method uniform'); mixed-precision Adam without ZeRO (zero=0).",
        "The interleaved rows use chunks = layers / (pipeline x --num-layers-per-virtual-pipeline-stage); the "
        "rows whose script gives no virtual stage use 1F1B.",
    ],
    "sc21_table2": [
        "Tensor size 8 (Table 2 gives only the model-parallel size 96 and 280; every Table 1 row of 18B and up "
        "uses tensor 8, and the 530B row of Table 1 is 8 x 35), so pipeline 12 and 35.",
        "Schedule: interleaved with the chunks of the authors' scripts for the same model (175B: "
        "run_figure_12.sh, 2 layers per virtual stage on pipeline 12, i.e. 4 chunks; 530B: run_table_1.sh, 1 "
        "layer per virtual stage, i.e. 3 chunks); full recomputation; zero=0.",
    ],
    "korthikanti": [
        "GPT as in sc21; 'Present work' = sequence parallelism + selective recomputation, 'Full Recompute' = "
        "full recomputation without sequence parallelism (Table 5, §6.3).",
        "The 22B and 1T runs are non-interleaved (§6 names interleaving only for 175B and 530B).",
    ],
    "llama3_table4": [
        "Llama 3.1 405B from its config.json (diffpipe preset) at sequence 8192, bf16, flash attention, no "
        "recomputation ('without activation checkpointing', §3.3.2), microbatch size 1 and sequence parallelism "
        "(the paper cites Korthikanti et al. for its TP; neither is stated).",
        "Attention: FlashAttention-2 (flash_version=2; the paper names no kernel): stated here because diffpipe's "
        "default is now the device's own fused kernel (Hopper's cuDNN attention, PyTorch's SDPA default on sm90 "
        "since its bundled cuDNN passed 9.15).",
        "Interleaved 1F1B with 4 chunks per pipeline rank and layers per stage [1, 2, ..., 2, 1] (V is not "
        "given; the text removes one layer from the first and the last stage; its 'the first model chunk on the "
        "first stage has only the embedding' reads as V = 8 with [0, 1, ..., 1, 0], which diffpipe's "
        "Parallelism.check refuses: 128 stages for 126 layers); FSDP as ZeRO-2 (optimizer state and gradients "
        "sharded; weights not resharded after the forward).",
        "Row 3 (CP 16, 131,072 tokens; 8,192 per context rank) as rows 1-2 with Parallelism(context=16): diffpipe's "
        "context parallelism is Megatron-LM's p2p ring (each K,V transfer overlapping one ring step's attention "
        "kernel; docs/architecture.md, context parallelism). Llama 3's own CP all-gathers K,V before attention "
        "(§3.3.2), which does not overlap: the same volume, (c - 1) K,V blocks forward and twice that backward, "
        "but exposed; not modelled, so the row's context communication is a lower bound. Global batch dp x 16 = "
        "128 sequences (16.8M tokens); the gradient sync over dp x cp = 128 ranks.",
    ],
    "torchtitan": [
        "Llama 3.1 8B from its config.json at sequence 8192 (train_configs/llama3_8b.toml at torchtitan 9dec370, "
        "the version of the measurement), bf16, flash attention, FSDP as ZeRO-3 reducing gradients in fp32 "
        "(--training.mixed_precision_reduce, whose one choice is float32 at 9dec370), one microbatch of the local "
        "batch (2) per step. Attention: FlashAttention-2 (flash_version=2): torchtitan's SDPA on the PyTorch of "
        "9dec370's time, before PyTorch preferred cuDNN's attention on Hopper (cuDNN was opt-in from 2.5.1, "
        "pytorch/pytorch#138522, to 2.11).",
        "torchtitan's 'selective' activation checkpointing at its default option '2' checkpoints every other "
        "layer in full: diffpipe has no such mode, so the row is simulated with no and with full "
        "recomputation, a bracket that must contain the measurement.",
        "The H100s of that cluster are 500 W HBM2e parts whose peak is below the SXM preset's (performance.md, "
        "footnote 2): the H100 SXM preset over-predicts them.",
        "405B pair: the measurement used Float8 linears, torch.compile and async TP, which diffpipe does not "
        "model (bf16 here): only the ordering is compared. Microbatches = pipeline stages (the default of "
        "--experimental.pipeline_parallel_microbatches at 9dec370): 8 microbatches of 4 for 1F1B, 16 of 2 "
        "for interleaved 1F1B with 2 stages per rank (the split points are not given); FSDP 8 as ZeRO-3.",
    ],
    "megatron_h100": [
        "GPT as in sc21 (GeLU, learned positions, tied embeddings) with flash attention, bf16, vocabulary "
        "131,072, sequence 4,096; microbatch size 1, selective recomputation, sequence parallelism where "
        "tensor > 1, 1F1B without virtual stages, the distributed optimizer (zero=1): the README gives none of "
        "these.",
        "Attention: Hopper's own fused kernel (flash_version=3, the 'megatron' preset's): Megatron-LM's "
        "default --transformer-impl transformer_engine (megatron/training/arguments.py at f2e5db402c, line "
        "668) runs Transformer Engine's DotProductAttention, which on compute capability 9.0 disables "
        "FlashAttention 'to give FusedAttention preference on Hopper+ for performance reasons' (cuDNN's "
        "F16_arbitrary_seqlen; transformer_engine/pytorch/attention.py at TE v1.5, lines 2894-2899: 'Select "
        "FusedAttention on sm90 and FlashAttention on others for performance'; v1.9, lines 655-666).",
        "The README's communication overlaps: DP as --overlap-grad-reduce buckets and --overlap-param-gather "
        "(the distributed optimizer's weight all-gather under the next forward), TP (--tp-comm-overlap) as "
        "Transformer Engine's default userbuffer chunking (dp.transformer_engine_tensor_overlap: 69% of the TP "
        "collectives hidden at tensor 2, 81% at 4, 88% at 8); PP transfers overlap in the 'overlap' mode. "
        "Gradients reduced in fp32 (Megatron-LM's rule for bf16 without --grad-reduce-in-bf16).",
    ],
    "sc21_orderings": [
        "Each figure's configuration is the authors' run_figure_*.sh (GPT as in sc21, full recomputation, "
        "microbatch 1 unless varied).",
    ],
}


# -- configurations ---------------------------------------------------------------------------------
def gpt(layers: int, hidden: int, heads: int, *, sequence: int = 2048, vocabulary: int = 51200,
        **fields: Any) -> dp.Transformer:
    """Megatron-LM's GPT (diffpipe's ``Transformer`` defaults) of the given shape."""
    return dp.Transformer(layers=layers, hidden=hidden, heads=heads, sequence=sequence, vocabulary=vocabulary,
                          **fields)


def eq3_flops(batch: int, model: dp.Transformer) -> float:
    """SC'21 Eq. (3): FLOPs of one iteration with full recomputation, 96 B s l h^2 (1 + s/(6h) + V/(16 l h))."""
    s, l, h, v = model.sequence, model.layers, model.hidden, model.vocabulary
    return 96.0 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


@dataclass
class Row:
    """One published row: its configuration, what was published and how a prediction maps to it."""

    study: str
    name: str
    metric: str  # what the source reports (and its unit)
    published: float
    build: Callable[[], Any]  # -> Configuration
    predict: Callable[[Any, Any], float]  # (Configuration, ConfigResult) -> the metric
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def configuration(model: dp.Transformer, cluster: dict[str, Any], batch: int, *, tensor: int = 1,
                  pipeline: int = 1, data: int = 1, virtual: int = 1, zero: int = 0,
                  sequence_parallel: bool = False, layers_per_stage: Any = None, framework: Any = None,
                  context: int = 1) -> Any:
    par = dp.Parallelism(tensor=tensor, pipeline=pipeline, data=data, virtual=virtual, zero=zero,
                         sequence_parallel=sequence_parallel, context=context)
    clu = dp.Cluster(gpus=par.gpus, **cluster)
    return dp.Configuration(model, par, clu, batch, layers_per_stage=layers_per_stage, framework=framework)


#: The frameworks of the sources, as ``diffpipe.presets.FRAMEWORKS`` states them (what each overlaps and its gradient
#: reduction precision, with sources: ``diffpipe/_workload/_frameworks.py``): Megatron-LM's README table runs with
#: ``--overlap-grad-reduce``, ``--overlap-param-gather`` and ``--tp-comm-overlap`` and reduces bf16 gradients in fp32;
#: torchtitan's FSDP2 wraps every block and reduces in fp32. SC'21 trained in fp16 (gradients reduced in fp16) with
#: nothing overlapped; Korthikanti et al. state no overlap of the gradient all-reduce (§6.3).
MEGATRON = dp.presets.framework("megatron")
TORCHTITAN = dp.presets.framework("torchtitan")
#: Llama 3 states neither its reduction dtype (the training precision here) nor its bucketing: Megatron-LM's
#: ``--overlap-grad-reduce`` buckets are assumed.
LLAMA3 = dp.Framework("llama-3 (assumed)", buckets="megatron", source="Megatron-LM's buckets assumed")


def _tflops_eq3(batch: int) -> Callable[[Any, Any], float]:
    return lambda cfg, res: eq3_flops(batch, cfg.model) / (res.step_time * res.gpus) / 1e12


def _step(cfg: Any, res: Any) -> float:
    return res.step_time


def _tflops_model(cfg: Any, res: Any) -> float:
    return res.mfu * float(cfg.cluster.device.peak_flops) / 1e12


def _tokens(cfg: Any, res: Any) -> float:
    return res.tokens_per_second_per_gpu


def sc21_table1() -> list[Row]:
    rows = []
    for r in DATA["sc21"]["table1"]:
        tp, pp, gpus = r["tp"], r["pp"], r["gpus"]
        virtual = r["layers"] // (pp * r["layers_per_virtual"]) if r["layers_per_virtual"] else 1
        model = gpt(r["layers"], r["hidden"], r["heads"], microbatch_size=r["mbs"], recompute="full")

        def build(model=model, r=r, tp=tp, pp=pp, data=gpus // (tp * pp), virtual=virtual):
            return configuration(model, SELENE, r["batch"], tensor=tp, pipeline=pp, data=data, virtual=virtual)

        rows.append(Row("sc21_table1", r["name"], "teraFLOP/s per GPU (Eq. 3)", r["tflops"], build,
                        _tflops_eq3(r["batch"]), extra={"gpus": gpus, "tp": tp, "pp": pp, "virtual": virtual,
                                                        "mbs": r["mbs"], "batch": r["batch"]}))
    return rows


def sc21_table2() -> list[Row]:
    rows = []
    shapes = {174.6: (96, 12288, 96, 12, 4), 529.6: (105, 20480, 128, 35, 3)}  # layers, hidden, heads, pp, chunks
    for r in DATA["sc21"]["table2_ptd"]:
        layers, hidden, heads, pp, chunks = shapes[r["parameters"]]
        assert 8 * pp == r["model_parallel"], r
        model = gpt(layers, hidden, heads, microbatch_size=r["mbs"], recompute="full")

        def build(model=model, r=r, pp=pp, chunks=chunks):
            return configuration(model, SELENE, r["batch"], tensor=8, pipeline=pp, data=r["gpus"] // (8 * pp),
                                 virtual=chunks)

        rows.append(Row("sc21_table2", r["name"], "teraFLOP/s per GPU (Eq. 3)", r["tflops"], build,
                        _tflops_eq3(r["batch"]), extra={"gpus": r["gpus"], "tp": 8, "pp": pp, "virtual": chunks,
                                                        "batch": r["batch"]}))
    return rows


KORTHIKANTI_CHUNKS = {"22B": 1, "175B": 3, "530B": 3, "1T": 1}


def _korthikanti_model(r: dict, recompute: str) -> dp.Transformer:
    return gpt(r["layers"], r["hidden"], r["heads"], microbatch_size=r["mbs"], recompute=recompute)


def korthikanti_table5() -> list[Row]:
    rows = []
    for r in DATA["korthikanti"]["table5"]:
        for label, recompute, sp, published in (("full recompute", "full", False, r["full_s"]),
                                                ("present work", "selective", True, r["present_s"])):
            model = _korthikanti_model(r, recompute)

            def build(model=model, r=r, sp=sp):
                return configuration(model, SELENE, r["batch"], tensor=r["tp"], pipeline=r["pp"],
                                     virtual=KORTHIKANTI_CHUNKS[r["name"]], sequence_parallel=sp)

            rows.append(Row("korthikanti_table5", f"{r['name']} {label}", "iteration time (s)", published, build,
                            _step, extra={"model": r["name"], "mode": label, "gpus": r["gpus"]}))
    r530 = next(r for r in DATA["korthikanti"]["table5"] if r["name"] == "530B")

    def build_dp8():
        return configuration(_korthikanti_model(r530, "selective"), SELENE, 8 * r530["batch"], tensor=8, pipeline=35,
                             data=8, virtual=3, sequence_parallel=True)

    rows.append(Row("korthikanti_table5", "530B present work, 8-way data parallel (§6.3)", "iteration time (s)",
                    DATA["korthikanti"]["dp8_530b_s"], build_dp8, _step,
                    note="§6.3: no overlap of the gradient all-reduce in the measurement",
                    extra={"model": "530B", "mode": "present work dp8", "gpus": 2240}))
    return rows


def korthikanti_table4() -> list[dict[str, Any]]:
    """One 22B layer's forward and backward (ms): the per-layer table of the 22B configuration."""
    r = next(r for r in DATA["korthikanti"]["table5"] if r["name"] == "22B")
    out = []
    for t in DATA["korthikanti"]["table4"]:
        model = _korthikanti_model(r, t["recompute"])
        cfg = configuration(model, SELENE, r["batch"], tensor=8, sequence_parallel=t["sequence_parallel"])
        costs = cfg.costs()
        forward, input_grad, weight = np.asarray(sum(cfg.compute_seconds(costs).values()))  # every kernel class
        comm = np.asarray(cfg.collective_seconds(costs))
        row = 1  # the first transformer block (rows: embedding, blocks, head)
        f = 1e3 * float(forward[row] + comm[0, row])
        b = 1e3 * float(input_grad[row] + weight[row] + comm[1, row] + comm[2, row])
        out.append({"experiment": t["experiment"], "forward_ms": {"published": t["forward_ms"], "predicted": f},
                    "backward_ms": {"published": t["backward_ms"], "predicted": b},
                    "combined_ms": {"published": t["combined_ms"], "predicted": f + b}})
    return out


def llama3_table4() -> list[Row]:
    rows = []
    for r in DATA["llama3"]["table4"]:
        model = dp.presets.model("llama-3.1-405b", sequence=r["sequence"], microbatch_size=1, recompute="none",
                                 flash_attention=True, flash_version=2)
        # V = 4 chunks of 2 layers, one layer fewer on the first and last stage: [1, 2, ..., 2, 1]. (The text's
        # "first chunk has only the embedding" reads as V = 8, [0, 1, ..., 1, 0]; Parallelism.check refuses
        # 128 stages for 126 layers even with empty end stages: see README.)
        split = [1] + [2] * ((model.layers - 2) // 2) + [1]

        def build(model=model, r=r, split=split):
            return configuration(model, META_H100, r["dp"] * r["batch_per_dp"], tensor=r["tp"], pipeline=r["pp"],
                                 data=r["dp"], virtual=len(split) // r["pp"], zero=2, sequence_parallel=True,
                                 layers_per_stage=split, context=r["cp"],
                                 framework=LLAMA3)

        rows.append(Row("llama3_table4", r["name"], "TFLOPs/GPU (BF16 MFU x 989)", r["tflops"], build, _tflops_model,
                        extra={"gpus": r["gpus"], "mfu_published": r["mfu"]}))
    return rows


def torchtitan_rows() -> list[Row]:
    rows = []
    for r in DATA["torchtitan"]["fsdp"]:
        for recompute in ("none", "full"):
            model = dp.presets.model("llama-3-8b", sequence=8192, microbatch_size=r["local_batch"],
                                     recompute=recompute, flash_attention=True, flash_version=2)

            def build(model=model, r=r):
                return configuration(model, TITAN_H100, r["batch"], data=r["gpus"], zero=3,
                                     framework=TORCHTITAN)

            rows.append(Row("torchtitan", f"{r['name']} (recompute {recompute})", "tokens/s per GPU",
                            r["tps_per_gpu"], build, _tokens, extra={"bracket": recompute, "case": r["name"]}))
    for r in DATA["torchtitan"]["pipeline"]:
        interleaved = r["schedule"] == "interleaved-1f1b"
        virtual = 2 if interleaved else 1
        mbs = r["local_batch"] // (r["pp"] * virtual)
        model = dp.presets.model("llama-3.1-405b", sequence=8192, microbatch_size=mbs, recompute="full",
                                 flash_attention=True, flash_version=2)

        def build(model=model, r=r, virtual=virtual):
            return configuration(model, TITAN_H100, r["batch"], tensor=r["tp"], pipeline=r["pp"], data=r["fsdp"],
                                 virtual=virtual, zero=3, framework=TORCHTITAN)

        rows.append(Row("torchtitan", r["name"], "tokens/s per GPU (Float8 run; ordering only)", r["tps_per_gpu"],
                        build, _tokens, extra={"pair": "405b", "schedule": r["schedule"]}))
    return rows


def megatron_h100() -> list[Row]:
    rows = []
    for r in DATA["megatron_h100"]["table"]:
        model = gpt(r["layers"], r["hidden"], r["heads"], sequence=4096, vocabulary=131072, microbatch_size=1,
                    recompute="selective", flash_attention=True)

        def build(model=model, r=r):
            return configuration(model, NVIDIA_H100, r["batch"], tensor=r["tp"], pipeline=r["pp"], data=r["dp"],
                                 zero=1, sequence_parallel=r["tp"] > 1,
                                 framework=MEGATRON)

        rows.append(Row("megatron_h100", r["name"], "teraFLOP/s per GPU (model FLOPs)", r["tflops"], build,
                        _tflops_model, extra={"gpus": r["gpus"], "mfu_published": r["mfu"]}))
    return rows


# -- the orderings that SC'21 §5 states in words -----------------------------------------------------
def sc21_orderings(quick: bool = False) -> list[dict[str, Any]]:
    """Each stated ordering, checked on the authors' script configuration: predicted teraFLOP/s per GPU
    (Eq. 3) of every point, and whether the stated ordering holds for every batch size."""
    out = []
    # Figure 13: (pipeline, tensor) over 64 GPUs, 162.2B GPT; 'peak performance when the tensor-parallel size is 8'.
    batches = (32,) if quick else (32, 128)
    points = []
    for batch in batches:
        for pp in (2, 4, 8, 16, 32):
            tp = 64 // pp
            if tp > 8:
                points.append({"batch": batch, "pipeline": pp, "tensor": tp, "tflops": None,
                               "why": "tensor > 8 GPUs of a node: diffpipe places a tensor group inside one node"})
                continue
            model = gpt(32, 20480, 128, microbatch_size=1, recompute="full")
            cfg = configuration(model, SELENE, batch, tensor=tp, pipeline=pp)
            res = cfg.evaluate()
            points.append({"batch": batch, "pipeline": pp, "tensor": tp,
                           "tflops": eq3_flops(batch, model) / (res.step_time * 64) / 1e12})
    held = []
    for batch in batches:
        pts = [p for p in points if p["batch"] == batch and p["tflops"] is not None]
        best = max(pts, key=lambda p: p["tflops"])
        held.append(best["tensor"] == 8)
    out.append({"id": "fig13_tensor_vs_pipeline", "stated": "peak at tensor = 8 (one node)", "points": points,
                "reproduced": all(held),
                "note": "tensor 16 and 32 span nodes, which diffpipe's placement refuses: only tensor <= 8 compared"})
    # Figure 14: (pipeline, data) over 64 GPUs, 5.9B GPT, tensor 1: 'throughput decreases as pipeline size increases'.
    batches = (32,) if quick else (32, 512)
    pps = (2, 4, 8) if quick else (2, 4, 8, 16, 32)
    points = []
    for batch in batches:
        for pp in pps:
            model = gpt(32, 3840, 32, microbatch_size=1, recompute="full")
            cfg = configuration(model, SELENE, batch, pipeline=pp, data=64 // pp)
            res = cfg.evaluate()
            points.append({"batch": batch, "pipeline": pp, "data": 64 // pp,
                           "tflops": eq3_flops(batch, model) / (res.step_time * 64) / 1e12})
    held = []
    for batch in batches:
        t = [p["tflops"] for p in points if p["batch"] == batch]
        held.append(all(a > b for a, b in zip(t, t[1:])))
    out.append({"id": "fig14_pipeline_vs_data", "stated": "throughput decreases as the pipeline size increases",
                "points": points, "reproduced": all(held)})
    # Figure 12: 175B, tensor 8, pipeline 12 (96 GPUs); interleaved (4 chunks) above 1F1B, the gap closing with batch.
    batches = (12, 60) if quick else (12, 24, 36, 48, 60)
    points = []
    for batch in batches:
        model = gpt(96, 12288, 96, microbatch_size=1, recompute="full")
        row = {"batch": batch}
        for name, chunks in (("1f1b", 1), ("interleaved", 4)):
            cfg = configuration(model, SELENE, batch, tensor=8, pipeline=12, virtual=chunks)
            res = cfg.evaluate()
            row[name] = eq3_flops(batch, model) / (res.step_time * 96) / 1e12
        points.append(row)
    above = all(p["interleaved"] > p["1f1b"] for p in points)
    gaps = [p["interleaved"] / p["1f1b"] - 1 for p in points]
    closes = all(a > b for a, b in zip(gaps, gaps[1:]))
    out.append({"id": "fig12_interleaved", "stated": "interleaved above 1F1B; the gap closes as the batch grows",
                "points": points, "interleaved_above": above, "gap_closes": closes, "reproduced": above and closes})
    # Figure 16: 91B GPT, (t, p) = (8, 8), microbatch 1, 2, 4, 8: 'the best microbatch size is 2'.
    batches = (128,) if quick else (128, 512)
    points = []
    for batch in batches:
        for mbs in (1, 2, 4, 8):
            model = gpt(32, 15360, 128, microbatch_size=mbs, recompute="full")
            cfg = configuration(model, SELENE, batch, tensor=8, pipeline=8)
            res = cfg.evaluate()
            points.append({"batch": batch, "mbs": mbs,
                           "tflops": eq3_flops(batch, model) / (res.step_time * 64) / 1e12})
    best = {b: max((p for p in points if p["batch"] == b), key=lambda p: p["tflops"])["mbs"] for b in batches}
    out.append({"id": "fig16_microbatch", "stated": "the best microbatch size is 2", "points": points,
                "best_mbs": best, "reproduced": all(v == 2 for v in best.values())})
    return out


# -- would plan have picked the published configuration? --------------------------------------------
#: (label, model fields, cluster, gpus, global batch, the published configuration, plan's search axes).
PLAN_CASES = (
    ("Korthikanti Table 3/5: 175B on 64 A100s, 'present work'",
     dict(layers=96, hidden=12288, heads=96, microbatch_size=1, recompute="selective"), SELENE, 64, 64,
     dict(family="interleaved-1f1b", tensor=8, pipeline=8, data=1, virtual=3, microbatch_size=1,
          recompute="selective", zero=0, sequence_parallel=True),
     dict(families=("1f1b", "interleaved-1f1b"), microbatch_sizes=(1, 2), virtual=(2, 3, 4), zero=(0, 1))),
    ("SC'21 Table 1: 39.1B on 512 A100s (2021 options: no SP, no selective, no ZeRO)",
     dict(layers=48, hidden=8192, heads=64, microbatch_size=4, recompute="full"), SELENE, 512, 1536,
     dict(family="1f1b", tensor=8, pipeline=2, data=32, virtual=1, microbatch_size=4, recompute="full", zero=0,
          sequence_parallel=False),
     dict(families=("1f1b", "interleaved-1f1b"), microbatch_sizes=(1, 2, 4, 8), recompute=("none", "full"),
          zero=(0,), sequence_parallel=(False,), virtual=(2, 3, 4))),
)
_PLAN_KEYS = ("family", "tensor", "pipeline", "data", "virtual", "microbatch_size", "recompute", "zero",
              "sequence_parallel")


def plan_comparison() -> list[dict[str, Any]]:
    """``dp.plan`` on the published request (model, cluster, global batch): its best configuration against
    the published one, both by the simulator (the same cost model, so this says what the model would
    change, not what a real run would gain)."""
    out = []
    for label, fields, cluster, gpus, batch, published, axes in PLAN_CASES:
        t0 = time.perf_counter()
        model = gpt(**fields)
        clu = dp.Cluster(gpus=gpus, **cluster)
        pub = configuration(model, cluster, batch, tensor=published["tensor"], pipeline=published["pipeline"],
                            data=published["data"], virtual=published["virtual"], zero=published["zero"],
                            sequence_parallel=published["sequence_parallel"]).evaluate()
        table = dp.plan(model, clu, batch, top_k=1, progress=False, **axes)
        best = table.best
        ranked = [i for i, r in enumerate(table.rows) if all(r[k] == published[k] for k in _PLAN_KEYS)
                  and not r["balanced"]]
        out.append({
            "case": label, "published": published, "published_step": pub.step_time,
            "published_memory_gb": pub.memory_per_gpu / 1e9,
            "best": {k: best[k] for k in (*_PLAN_KEYS, "balanced", "step_time", "memory_per_gpu", "mfu")},
            "speedup": pub.step_time / best["step_time"],
            "picked_published": bool(ranked) and ranked[0] == 0,
            "published_rank": ranked[0] if ranked else None,
            "explored": table.explored, "simulated": table.simulated, "rejected": dict(table.rejected),
            "seconds": time.perf_counter() - t0,
        })
    return out


# -- running and summarising ----------------------------------------------------------------------------
STUDIES: dict[str, Callable[[], list[Row]]] = {
    "sc21_table1": sc21_table1, "sc21_table2": sc21_table2, "korthikanti_table5": korthikanti_table5,
    "llama3_table4": llama3_table4, "torchtitan": torchtitan_rows, "megatron_h100": megatron_h100,
}
#: The CI-sized subset of ``--quick``: (study, row name) of small, fast rows.
QUICK = {("sc21_table1", "1.7B"), ("sc21_table1", "18.4B"), ("korthikanti_table5", "22B full recompute"),
         ("korthikanti_table5", "22B present work")}


def evaluate_row(row: Row) -> dict[str, Any]:
    t0 = time.perf_counter()
    cfg = row.build()
    res = cfg.evaluate()
    predicted = float(row.predict(cfg, res))
    return {
        "study": row.study, "name": row.name, "metric": row.metric, "published": row.published,
        "predicted": predicted, "error": predicted / row.published - 1, "step_time": res.step_time,
        "mfu": res.mfu, "tokens_per_second_per_gpu": res.tokens_per_second_per_gpu,
        "bubble_ratio": res.bubble_ratio, "communication_share": res.communication_share,
        "memory_per_gpu_gb": res.memory_per_gpu / 1e9, "fits": bool(res.fits), "microbatches": res.microbatches,
        "family": res.family, "gradient_sync": res.gradient_sync, "note": row.note, **row.extra,
        "device": cfg.cluster.device.name, "efficiency": float(cfg.cluster.device.efficiency),
        "saturation_tokens": float(cfg.cluster.device.saturation_tokens),
        "seconds": time.perf_counter() - t0,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """MAPE, signed mean error, Kendall's tau-b between predicted and published, and the share of row pairs
    ordered as published (pairs whose published values tie are left out)."""
    pub = np.array([r["published"] for r in rows], float)
    pred = np.array([r["predicted"] for r in rows], float)
    err = pred / pub - 1
    pairs = agree = 0
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            if pub[i] == pub[j]:
                continue
            pairs += 1
            agree += (pred[i] - pred[j]) * (pub[i] - pub[j]) > 0
    tau = float(kendalltau(pred, pub).statistic) if len(rows) > 1 else math.nan
    return {"rows": len(rows), "mape": float(np.mean(np.abs(err))), "mean_error": float(np.mean(err)),
            "max_abs_error": float(np.max(np.abs(err))), "kendall_tau": tau, "pairs": pairs,
            "pairs_ordered": int(agree), "order_reproduced": bool(pairs > 0 and agree == pairs)}


def torchtitan_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    cases = {}
    for r in rows:
        if "bracket" in r:
            c = cases.setdefault(r["case"], {"published": r["published"]})
            c[r["bracket"]] = r["predicted"]
    for c in cases.values():
        c["inside_bracket"] = c["full"] <= c["published"] <= c["none"]
    pair = {r["schedule"]: r for r in rows if r.get("pair") == "405b"}
    out = {"fsdp_bracket": cases}
    if len(pair) == 2:
        out["pipeline_pair"] = {
            "published_ratio": pair["interleaved-1f1b"]["published"] / pair["1f1b"]["published"],
            "predicted_ratio": pair["interleaved-1f1b"]["predicted"] / pair["1f1b"]["predicted"],
            "order_reproduced": pair["interleaved-1f1b"]["predicted"] > pair["1f1b"]["predicted"],
        }
    return out


def run(quick: bool = False, studies: tuple[str, ...] | None = None, log: Callable[[str], None] = print
        ) -> dict[str, Any]:
    studies = studies or tuple(STUDIES)
    out: dict[str, Any] = {"quick": quick, "sources": {k: DATA[k]["citation"] for k in DATA},
                           "assumptions": ASSUMPTIONS, "studies": {}}
    for study in studies:
        rows = []
        for row in STUDIES[study]():
            if quick and (row.study, row.name) not in QUICK:
                continue
            r = evaluate_row(row)
            log(f"{study:20s} {row.name:40s} published {r['published']:10.4g}  predicted {r['predicted']:10.4g}  "
                f"error {100 * r['error']:+6.1f}%  ({r['seconds']:.1f} s)")
            rows.append(r)
        if not rows:
            continue
        entry: dict[str, Any] = {"rows": rows}
        if study == "torchtitan":
            entry["summary"] = torchtitan_summary(rows)
            entry["summary"].update(summary([r for r in rows if r.get("bracket") != "full" and "pair" not in r]))
        elif study == "korthikanti_table5":
            entry["summary"] = summary(rows)
            by = {}
            for r in rows:
                by.setdefault(r["model"], {})[r["mode"]] = r
            entry["speedup"] = {m: {"published": v["full recompute"]["published"] / v["present work"]["published"],
                                    "predicted": v["full recompute"]["predicted"] / v["present work"]["predicted"]}
                                for m, v in by.items() if {"full recompute", "present work"} <= set(v)}
        else:
            entry["summary"] = summary(rows)
        out["studies"][study] = entry
    if studies == tuple(STUDIES):
        log("korthikanti_table4 ...")
        out["studies"]["korthikanti_table4"] = {"rows": korthikanti_table4()}
        log("sc21_orderings ...")
        out["studies"]["sc21_orderings"] = {"orderings": sc21_orderings(quick)}
        if not quick:
            log("plan ...")
            out["studies"]["plan"] = {"cases": plan_comparison()}
    return out


# -- the report ------------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Published runs: predicted vs published", "",
             "Generated by `python papers/published-runs/run.py`" + (" --quick" if results["quick"] else "") +
             "; sources of every published number in `data.toml`; assumptions listed under each table.", ""]
    lines += ["Assumptions for every study:", ""] + [f"- {a}" for a in ASSUMPTIONS["all"]] + [""]
    titles = {"sc21_table1": "Narayanan et al. SC'21, Table 1 (A100, weak scaling)",
              "sc21_table2": "Narayanan et al. SC'21, Table 2, PTD-P rows (A100, fixed batch)",
              "korthikanti_table5": "Korthikanti et al. 2022, Tables 3 and 5 (A100, iteration time)",
              "llama3_table4": "Llama 3 405B, Table 4 (H100)",
              "torchtitan": "torchtitan docs/performance.md (H100)",
              "megatron_h100": "Megatron-LM README, H100 weak scaling"}
    assumption_key = {"korthikanti_table5": "korthikanti"}
    for study, entry in results["studies"].items():
        if study in titles:
            s = entry["summary"]
            lines += [f"## {titles[study]}", "",
                      "| row | published | predicted | error | step (s) | MFU | bubble | comm. share "
                      "| memory/GPU (GB) | fits |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
            for r in entry["rows"]:
                lines.append(f"| {r['name']} | {r['published']:.4g} | {r['predicted']:.4g} | {_pct(r['error'])} | "
                             f"{r['step_time']:.3g} | {100 * r['mfu']:.1f}% | {100 * r['bubble_ratio']:.1f}% | "
                             f"{100 * r['communication_share']:.1f}% | {r['memory_per_gpu_gb']:.1f} | "
                             f"{'yes' if r['fits'] else 'no'} |")
            metric = entry["rows"][0]["metric"]
            lines += ["", f"Metric: {metric}. MAPE {100 * s['mape']:.1f}%, mean error {_pct(s['mean_error'])}, "
                          f"max |error| {100 * s['max_abs_error']:.1f}%; Kendall tau-b {s['kendall_tau']:.2f}; "
                          f"{s['pairs_ordered']}/{s['pairs']} pairs ordered as published "
                          f"(ordering {'reproduced' if s['order_reproduced'] else 'not reproduced'})."]
            if "speedup" in entry:
                lines += ["", "Speedup of 'present work' over full recomputation (published vs predicted): " +
                          ", ".join(f"{m} {v['published']:.3f} vs {v['predicted']:.3f}"
                                    for m, v in entry["speedup"].items()) + "."]
            if study == "torchtitan":
                ts = entry["summary"]
                for case, c in ts["fsdp_bracket"].items():
                    lines += ["", f"{case}: published {c['published']:.0f} tokens/s/GPU; predicted {c['full']:.0f} "
                                  f"(full recomputation) to {c['none']:.0f} (none): "
                                  f"{'inside' if c['inside_bracket'] else 'outside'} the bracket."]
                if "pipeline_pair" in ts:
                    pp = ts["pipeline_pair"]
                    lines += ["", f"405B interleaved / 1F1B: published {pp['published_ratio']:.3f}, predicted "
                                  f"{pp['predicted_ratio']:.3f} (order "
                                  f"{'reproduced' if pp['order_reproduced'] else 'not reproduced'})."]
            lines += ["", "Assumptions:", ""] + [f"- {a}" for a in ASSUMPTIONS[assumption_key.get(study, study)]] + [""]
        elif study == "korthikanti_table4":
            lines += ["## Korthikanti et al. 2022, Table 4 (one 22B layer, tensor 8, microbatch 4, ms)", "",
                      "| experiment | forward pub. | forward pred. | backward pub. | backward pred. | combined pub. "
                      "| combined pred. |",
                      "|---|---:|---:|---:|---:|---:|---:|"]
            for r in entry["rows"]:
                lines.append(f"| {r['experiment']} | {r['forward_ms']['published']:.1f} | "
                             f"{r['forward_ms']['predicted']:.2f} | "
                             f"{r['backward_ms']['published']:.1f} | {r['backward_ms']['predicted']:.2f} | "
                             f"{r['combined_ms']['published']:.1f} | {r['combined_ms']['predicted']:.2f} |")
            lines += ["", "Predicted: the first block's row of the configuration's per-device table (compute at "
                          "the device efficiency plus its tensor-parallel collectives).", ""]
        elif study == "plan":
            lines += ["## Would `dp.plan` have picked the published configuration?", "",
                      "| request | published config | predicted step | plan's best | predicted step | speedup "
                      "(model) | published rank |", "|---|---|---:|---|---:|---:|---:|"]

            def desc(c: dict) -> str:
                return (f"{c['family']} t{c['tensor']} p{c['pipeline']} d{c['data']} v{c['virtual']} "
                        f"mbs{c['microbatch_size']} {c['recompute']} zero{c['zero']}"
                        f"{' SP' if c['sequence_parallel'] else ''}")

            for c in entry["cases"]:
                rank = "not simulated (pruned)" if c["published_rank"] is None else str(c["published_rank"] + 1)
                lines.append(f"| {c['case']} | {desc(c['published'])} | {c['published_step']:.3g} s | "
                             f"{desc(c['best'])}{' (balanced)' if c['best']['balanced'] else ''} | "
                             f"{c['best']['step_time']:.3g} s | {c['speedup']:.3f} | {rank} |")
            lines += ["", "Both steps are the simulator's (the same cost model): the speedup says what the model "
                          "would change, not what a real run gains.", ""]
        elif study == "sc21_orderings":
            lines += ["## SC'21 §5: orderings stated in the text (numbers only in plots)", "",
                      "| figure | stated | reproduced | predicted points (teraFLOP/s per GPU, Eq. 3) |",
                      "|---|---|:---:|---|"]
            for o in entry["orderings"]:
                pts = "; ".join(", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in p.items() if k != "why") for p in o["points"])
                lines.append(f"| {o['id']} | {o['stated']} | {'yes' if o['reproduced'] else 'no'} | {pts} |")
            lines += ["", "Assumptions:", ""] + [f"- {a}" for a in ASSUMPTIONS["sc21_orderings"]] + [""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a CI-sized subset of rows")
    ap.add_argument("--out", type=Path, default=None, help="folder for results.json/results.md (default: here, "
                    "unless --quick or --study)")
    ap.add_argument("--study", action="append", choices=tuple(STUDIES), help="only these studies")
    args = ap.parse_args(argv)
    results = run(args.quick, tuple(args.study) if args.study else None)
    out = args.out if args.out is not None else (None if args.quick or args.study else HERE)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        dp.write_atomic(out / "results.json", json.dumps(results, indent=1, default=float) + "\n")
        dp.write_atomic(out / "results.md", markdown(results))
        print(f"wrote {out / 'results.json'} and {out / 'results.md'}")


if __name__ == "__main__":
    main()
