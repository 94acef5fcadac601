"""H100 SXM kernel model: GEMMs fitted to OpenXLA's measured ``sm_90`` table (every bf16 shape,
``xla_matmul_bf16.csv``); memory-bound kernels at the STREAM ``scale`` bandwidth of gpu-benches'
H100 (PCIe: no SXM file exists; the fraction of the datasheet bandwidth is taken to carry over);
132 SMs (NVIDIA H100 Tensor Core GPU architecture whitepaper, H100 SXM5); fused attention through
FlashAttention-3's Table 2 point (``attention_text_points.csv``); checked against the best-shape
``mamf_ml_engineering.csv`` row, a shape outside the table.

    PYTHONPATH=. python papers/kernel-efficiency/fit_h100.py     # writes kernels_h100.json
"""

from kernel_fit import attention, attention_point, fit_gemm, mamf_check, stream_fraction, write

if __name__ == "__main__":
    memory = stream_fraction("h100_pcie", "H100-PCIe")
    gemm = fit_gemm("sm_90", "H100", 132, memory)
    fa3 = attention_point("fa3_arxiv_2407.08608", "H100", "FlashAttention-3")
    out = dict(gemm=gemm, memory_efficiency=round(memory, 4),
               memory_source="gpu_benches_stream.csv h100_pcie, kernel scale, over H100-PCIe's 2.0 TB/s",
               attention=attention("H100", gemm["k_half"], float(fa3["tflops"]), float(fa3["seqlen"]),
                                   "attention_text_points.csv: FA3 Table 2, FlashAttention-3, forward"))
    out["mamf_check"] = mamf_check(out, "H100", "NVIDIA H100 SXM")
    write("H100", out)
