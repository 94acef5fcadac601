"""A100 SXM4 80GB kernel model. No A100 GEMM table by shape is published in text (README, "Measurements"): the
only A100 GEMM benchmark is the best shape of ``mamf_ml_engineering.csv`` (271.2 TFLOP/s at
1024 x 10240 x 5120, bf16, torch 2.6 / CUDA 12.6). So the A100 takes the *shape* of the H100 fit (tile
and split-K grid, ``k_half``, per-kernel overhead: the same tensor-core GEMM design one generation
earlier; an assumption) with its own 108 SMs (NVIDIA A100 Tensor Core GPU architecture whitepaper),
and its ceiling ``gemm_efficiency`` is fitted (least squares on log time) to the one A100 kernel-level
measurement of the FIT set: Korthikanti et al. 2022, Table 4 (one 22B layer, tensor 8, forward and
backward of five variants, ``papers/published-runs/data.toml``). The ceiling MAMF's shape would need
is reported beside it (``mamf_ceiling``): 2025 software on the best shape found by search, above what
2022's Megatron-LM kernels ran at. Memory-bound
kernels at gpu-benches' A100 80 GB STREAM ``scale`` bandwidth; fused attention through FlashAttention-2's
"up to 230 TFLOPs/s" (taken at its sweep's longest sequence, 16k; ``attention_text_points.csv``).

    PYTHONPATH=. python papers/kernel-efficiency/fit_a100.py     # needs kernels_h100.json; writes kernels_a100.json
"""

import importlib.util
import json
import sys

import numpy as np
from kernel_fit import HERE, attention, attention_point, gemm_seconds, kernel_model, mamf_point, stream_fraction, write
from scipy.optimize import brentq, minimize_scalar

import diffpipe as dp

#: FlashAttention-2's benchmark sweep runs sequences 512 ... 16k (Dao 2023, Figs. 4-6).
FA2_LONGEST = 16384

def _published_runs():
    spec = importlib.util.spec_from_file_location("published_runs_run", HERE.parent / "published-runs" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def table4_errors(km) -> list[float]:
    """Relative errors of the first block's forward and backward (ms, with its tensor collectives) of
    Korthikanti Table 4's five variants on an A100 with kernel model ``km``."""
    rp = _published_runs()
    r = next(r for r in rp.DATA["korthikanti"]["table5"] if r["name"] == "22B")
    base = dp.presets.DEVICES["A100"]
    device = dp.Device(base.peak_flops, base.memory, memory_bandwidth=base.memory_bandwidth, name="A100", kernels=km)
    errors = []
    for t in rp.DATA["korthikanti"]["table4"]:
        model = rp._korthikanti_model(r, t["recompute"])
        cfg = dp.Configuration(model, dp.Parallelism(tensor=8, sequence_parallel=t["sequence_parallel"]),
                               dp.Cluster(device=device, gpus=8, **{k: v for k, v in rp.SELENE.items()
                                                                     if k != "device"}), r["batch"])
        c = np.asarray(sum(cfg.compute_seconds().values()), np.float64)
        comm = np.asarray(cfg.collective_seconds(), np.float64)
        f = 1e3 * (c[0, 1] + comm[0, 1])
        b = 1e3 * (c[1, 1] + c[2, 1] + comm[1, 1] + comm[2, 1])
        errors += [round(f / t["forward_ms"] - 1, 4), round(b / t["backward_ms"] - 1, 4)]
    return errors


def table4_rms(km) -> float:
    return float(np.sqrt(np.mean(np.log1p(np.asarray(table4_errors(km))) ** 2)))


if __name__ == "__main__":
    h100 = json.loads((HERE / "kernels_h100.json").read_text())
    memory = stream_fraction("a100_80", "A100")
    r = mamf_point("NVIDIA A100 SXM")
    m, n, k = (float(r[c]) for c in ("best_m", "best_n", "best_k"))
    target = 2 * m * n * k / (float(r["mamf_tflops"]) * 1e12)
    shape = {key: h100["gemm"][key] for key in ("tile_m", "tile_n", "split_k_min", "k_half", "overhead")}

    def out(e: float) -> dict:
        fa2 = attention_point("fa2_arxiv_2307.08691", "A100", "FlashAttention-2")
        return dict(gemm=dict(shape, table_key=None, sms=108, gemm_efficiency=e, rows=[],
                              rms_log_error=None, rms_log_error_tokens_curve=None,
                              shape_from="kernels_h100.json", calibrated_to=dict(m=int(m), n=int(n), k=int(k),
                                                                                 tflops=float(r["mamf_tflops"]))),
                    memory_efficiency=round(memory, 4),
                    memory_source="gpu_benches_stream.csv a100_80, kernel scale, over A100's 2,039 GB/s",
                    attention=attention("A100", shape["k_half"], float(fa2["tflops"]), FA2_LONGEST,
                                        "attention_text_points.csv: FA2 'up to 230 TFLOPs/s', at 16k"))

    mamf = brentq(lambda e: float(gemm_seconds(kernel_model(out(e)), "A100", m, n, k)) - target, 0.05, 1.0)
    res = minimize_scalar(lambda e: table4_rms(kernel_model(out(e))), bounds=(0.5, 1.0), method="bounded",
                          options=dict(xatol=1e-4))
    result = out(round(float(res.x), 4))
    result["gemm"]["calibrated_to"] = "papers/published-runs/data.toml korthikanti.table4 (FIT set)"
    result["gemm"]["rms_log_error_table4"] = round(table4_rms(kernel_model(result)), 4)
    result["gemm"]["table4_errors"] = table4_errors(kernel_model(result))
    result["mamf_ceiling"] = dict(gemm_efficiency=round(mamf, 4), m=int(m), n=int(n), k=int(k),
                                  tflops=float(r["mamf_tflops"]))
    link = json.loads((HERE / "collectives.json").read_text())["nvlink3"]
    result["note"] = (f"Table 4's tensor collectives priced by the presets' collective fit (collectives.json nvlink3: "
                      f"bus efficiency {link['bus_efficiency']}, {1e6 * link['step_latency']:.2f} us per step); "
                      f"the shape (k_half, overhead) is kernels_h100.json's as it stands")
    write("A100", result)
