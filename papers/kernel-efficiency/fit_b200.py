"""B200 kernel model: GEMMs fitted to OpenXLA's measured ``sm_100_B200`` table (``xla_matmul_bf16.csv``);
memory-bound kernels at the STREAM ``scale`` fraction of gpu-benches' H200 (HBM3e; no Blackwell file
exists: an assumption); 148 SMs (NVIDIA Blackwell architecture technical brief, B200).

    PYTHONPATH=. python papers/kernel-efficiency/fit_b200.py     # writes kernels_b200.json
"""

from kernel_fit import fit_gemm, mamf_check, stream_fraction, write

if __name__ == "__main__":
    memory = stream_fraction("h200", "H200")
    gemm = fit_gemm("sm_100_B200", "B200", 148, memory)
    # no attention measurement for Blackwell in text: the GEMM efficiency over the key loop (s_half = k_half)
    out = dict(gemm=gemm, memory_efficiency=round(memory, 4),
               memory_source="gpu_benches_stream.csv h200, kernel scale, over H200's 4.8 TB/s (assumed for B200)",
               attention=dict(attention_efficiency=gemm["gemm_efficiency"], attention_half=gemm["k_half"],
                              attention_backward=1.0, point=None))
    out["mamf_check"] = mamf_check(out, "B200", "NVIDIA B200 SXM")
    write("B200", out)
