"""H100 SXM kernel model: GEMMs fitted to OpenXLA's measured ``sm_90`` table (every bf16 shape,
``xla_matmul_bf16.csv``); memory-bound kernels at the BabelStream ``Mul`` bandwidth (one array read, one
written: gpu-benches' ``scale``) of Azure's ND H100 v5 (H100 80GB HBM3, the SXM5 part; ``azure_babelstream.csv``);
132 SMs (NVIDIA H100 Tensor Core GPU architecture whitepaper, H100 SXM5); fused attention through
FlashAttention-2's H100 point (the kernel generation of the runs compared; FA3's Table 2 point kept beside
it, ``attention_text_points.csv``), Hopper's own fused attention (cuDNN's, which Transformer Engine prefers on
Hopper; ``flash_version=3``) at PyTorch 2.5.0's "up to 75% speed-up over FlashAttentionV2" on H100
(``attention_native``; FlashAttention-3's abstract, "1.5-2.0x faster than FlashAttention-2", brackets it);
checked against the best-shape
``mamf_ml_engineering.csv`` row, a shape outside the table.

    PYTHONPATH=. python papers/kernel-efficiency/fit_h100.py     # writes kernels_h100.json
"""

from kernel_fit import attention, attention_point, babelstream_fraction, fit_gemm, mamf_check, write

if __name__ == "__main__":
    memory = babelstream_fraction("ND H100 v5", "H100")
    gemm = fit_gemm("sm_90", "H100", 132, memory)
    # The runs of both sets (2023-24: Megatron-LM, Llama 3, llm-foundry) predate FlashAttention-3 (July 2024):
    # the preset's attention is FlashAttention-2 on H100, "up to 335 TFLOPs/s" forward + backward, taken at its
    # sweep's longest sequence (16k). FA3's Table 2 point (661 TFLOP/s forward at s = 8448) is kept as
    # ``attention_fa3``: what a run with FlashAttention-3 would get.
    fa2 = attention_point("fa2_arxiv_2307.08691", "H100", "FlashAttention-2 (no Hopper-specific instructions)")
    fa3 = attention_point("fa3_arxiv_2407.08608", "H100", "FlashAttention-3")
    out = dict(gemm=gemm, memory_efficiency=round(memory, 4),
               memory_source="azure_babelstream.csv ND H100 v5, kernel Mul, over H100 SXM's 3.35 TB/s",
               attention=attention("H100", gemm["k_half"], float(fa2["tflops"]), 16384,
                                   "attention_text_points.csv: FA2 on H100 'up to 335 TFLOPs/s' fwd+bwd, at 16k"),
               attention_fa3=attention("H100", gemm["k_half"], float(fa3["tflops"]), float(fa3["seqlen"]),
                                       "attention_text_points.csv: FA3 Table 2, FlashAttention-3, forward"))
    native = attention_point("pytorch_v2.5.0_release_notes", "H100",
                             "cuDNN fused flash attention (SDPA's cuDNN backend)")
    out["attention_native"] = float(native["speedup_over_fa2"])
    out["attention_native_source"] = "attention_text_points.csv: " + native["where"]
    out["mamf_check"] = mamf_check(out, "H100", "NVIDIA H100 SXM")
    write("H100", out)
