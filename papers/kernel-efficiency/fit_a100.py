"""A100 SXM4 80GB kernel model. No A100 GEMM table by shape is published in text (``SOURCES.md``): the
only A100 GEMM measurement is the best shape of ``mamf_ml_engineering.csv`` (271.2 TFLOP/s at
1024 x 10240 x 5120, bf16). So the A100 takes the *shape* of the H100 fit (tile and split-K grid,
``k_half``, per-kernel overhead: the same tensor-core GEMM design one generation earlier; an
assumption) with its own 108 SMs (NVIDIA A100 Tensor Core GPU architecture whitepaper), and
``gemm_efficiency`` solved so that the model gives the MAMF figure at MAMF's shape. Memory-bound
kernels at gpu-benches' A100 80 GB STREAM ``scale`` bandwidth; fused attention through FlashAttention-2's
"up to 230 TFLOPs/s" (taken at its sweep's longest sequence, 16k; ``attention_text_points.csv``).

    PYTHONPATH=. python papers/kernel-efficiency/fit_a100.py     # needs kernels_h100.json; writes kernels_a100.json
"""

import json

from scipy.optimize import brentq

from kernel_fit import HERE, attention, attention_point, gemm_seconds, kernel_model, mamf_point, stream_fraction, write

#: FlashAttention-2's benchmark sweep runs sequences 512 ... 16k (Dao 2023, Figs. 4-6).
FA2_LONGEST = 16384

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

    e = brentq(lambda e: float(gemm_seconds(kernel_model(out(e)), "A100", m, n, k)) - target, 0.05, 1.0)
    write("A100", out(round(e, 4)))
