"""B200 kernel model: GEMMs fitted to OpenXLA's measured ``sm_100_B200`` table (``xla_matmul_bf16.csv``);
memory-bound kernels at the H200's fraction, BabelStream ``Mul`` on Azure's ND H200 v5 (HBM3e, the
H200 preset's source; no Blackwell measurement in text: an assumption); 148 SMs (NVIDIA Blackwell architecture
technical brief, B200).

    PYTHONPATH=. python papers/kernel-efficiency/fit_b200.py     # writes kernels_b200.json
"""

from kernel_fit import babelstream_fraction, fit_gemm, mamf_check, write

if __name__ == "__main__":
    memory = babelstream_fraction("ND H200 v5", "H200")
    gemm = fit_gemm("sm_100_B200", "B200", 148, memory)
    # no attention measurement for Blackwell in text: the GEMM efficiency over the key loop (s_half = k_half)
    out = dict(gemm=gemm, memory_efficiency=round(memory, 4),
               memory_source="azure_babelstream.csv ND H200 v5, kernel Mul, over H200's 4.8 TB/s (assumed for B200)",
               attention=dict(attention_efficiency=gemm["gemm_efficiency"], attention_half=gemm["k_half"],
                              attention_backward=1.0, point=None))
    out["mamf_check"] = mamf_check(out, "B200", "NVIDIA B200 SXM")
    write("B200", out)
