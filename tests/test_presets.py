"""Named presets: models against their model cards, devices and links against their datasheets."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import diffpipe as dp
from diffpipe._machine._specs import DEVICES, NETWORKS
from diffpipe._model._specs import MODELS

HF = Path(__file__).parent / "data" / "hf"

#: name -> (total, active) parameters as published. Hugging Face model pages (safetensors
#: parameter count): Meta-Llama-3-8B 8.03B, Meta-Llama-3-70B 70.6B, Llama-3.1-405B 405.9B (the
#: model card rounds to 405B), Mistral-7B-v0.1 7.24B, Qwen2.5-72B 72.7B (model card: "Number of
#: Parameters: 72.7B"); Mixtral of Experts (Jiang et al. 2024) §2: 46.7B total, 12.9B active
#: ("47B" / "13B" in the abstract); GPT-3 (Brown et al. 2020) Table 2.1: 175.0B.
PUBLISHED = {
    "llama-3-8b": (8.03e9, 8.03e9),
    "llama-3-70b": (70.6e9, 70.6e9),
    "llama-3.1-405b": (405.9e9, 405.9e9),
    "mistral-7b": (7.24e9, 7.24e9),
    "mixtral-8x7b": (46.7e9, 12.9e9),
    "qwen2.5-72b": (72.7e9, 72.7e9),
    "gpt-3-175b": (175.0e9, 175.0e9),
    "deepseek-v3": (671e9, None),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_model_presets_match_the_published_parameter_counts(name):
    total, active = PUBLISHED[name]
    m = dp.presets.model(name)
    np.testing.assert_allclose(m.parameters(), total, rtol=5e-3)
    if active is not None:
        np.testing.assert_allclose(m.active_parameters(), active, rtol=5e-3)
    assert m.sequence == MODELS[name].sequence and MODELS[name].source


def test_deepseek_v3_activated_parameters():
    # DeepSeek-V3 technical report: "671B total parameters with 37B activated for each token";
    # DeepSeek truncates the activated count (DeepSeek-V2's config gives 21.38B, published as "21B"),
    # so the card's 37B says 37e9 <= active < 38e9. The total (exact MLA projections) is 0.004% off.
    m = dp.presets.model("deepseek-v3")
    assert 37e9 <= m.active_parameters() < 38e9
    np.testing.assert_allclose(m.parameters(), 671e9, rtol=1e-4)


@pytest.mark.parametrize("name", ["llama-3-8b", "mistral-7b", "mixtral-8x7b", "qwen2.5-72b", "deepseek-v3"])
def test_model_presets_equal_their_hf_configs(name):
    # the stored facts against the hand-copied config.json fixtures (tests/data/hf)
    preset = dp.presets.model(name)
    assert preset == dp.Transformer.from_hf_config(HF / f"{name}.json", sequence=preset.sequence)


def test_gpt3_against_megatron_closed_forms():
    # Narayanan et al. (SC'21) §5.1: parameters 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) and
    # F = 72 B s l h^2 (1 + s/(6h) + V/(12 h l)) FLOPs per iteration without recomputation.
    m = dp.presets.model("gpt-3-175b", microbatch_size=2)
    B, s, l, h, V = m.microbatch_size, m.sequence, m.layers, m.hidden, m.vocabulary
    unique = m.parameters() - 2 * h  # the final LayerNorm is outside the closed form
    np.testing.assert_allclose(unique, 12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h)), rtol=1e-12)
    c = dp.layer_costs(m)
    total = c.forward.sum() + c.input_grad.sum() + c.weight.sum()
    np.testing.assert_allclose(total, 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * h * l)), rtol=1e-12)


def test_model_overrides_and_names():
    m = dp.presets.model("Llama-3-70B", microbatch_size=2, recompute="selective", flash_attention=True)
    assert (m.layers, m.hidden, m.kv, m.microbatch_size, m.recompute, m.flash_attention) == (
        80, 8192, 8, 2, "selective", True)
    assert dp.presets.model("GPT3") == dp.presets.model("gpt-3-175b")
    assert dp.presets.models() == tuple(MODELS) and len(MODELS) == 8


def test_device_presets_are_dense_figures():
    for name, spec in DEVICES.items():
        d = dp.presets.device(name)
        assert d.name == name and float(d.peak_flops) == pytest.approx(spec.peak_flops) and spec.source
        assert spec.memory_bandwidth > 0 and (spec.fp8_flops is None or spec.fp8_flops == pytest.approx(
            2 * spec.peak_flops, rel=2e-3))  # dense FP8 is twice dense BF16 (to the datasheets' rounding)
    # datasheet peaks (the headline sparse figure halved, where the datasheet gives only that); memory: the
    # driver's total (nvidia-smi's MiB, _specs' listings) where one is public, else the datasheet's GB
    mib = 2**20
    for name, bf16, memory in [("A100", 312e12, 81_920 * mib), ("A100-40GB", 312e12, 40_960 * mib),
                               ("H100", 989e12, 81_559 * mib), ("H100-PCIe", 756e12, 80e9), ("H800", 989e12, 80e9),
                               ("H200", 989e12, 143_771 * mib), ("H20", 148e12, 97_871 * mib),
                               ("B200", 2.25e15, 183_359 * mib), ("GB200", 2.5e15, 186e9),
                               ("MI300X", 1307.4e12, 192e9), ("MI325X", 1307.4e12, 256e9),
                               ("TPU-v5e", 197e12, 16e9), ("TPU-v5p", 459e12, 95e9), ("TPU-v6e", 918e12, 32e9)]:
        assert (DEVICES[name].peak_flops, DEVICES[name].memory) == (bf16, memory)
        assert (DEVICES[name].memory_source is None) == (memory % mib != 0), name  # sourced iff a driver total
    assert DEVICES["H100"].memory == 85_520_809_984 and "nvidia-smi" in DEVICES["H100"].memory_source
    assert dp.presets.device("trillium").name == "TPU-v6e" and dp.presets.device("h100 pcie").name == "H100-PCIe"


def test_link_presets():
    for name, spec in NETWORKS.items():
        net = dp.presets.network(name)
        assert float(net.bandwidth) == pytest.approx(spec.bandwidth) and spec.source
    per_direction = {"nvlink3": 300e9, "nvlink4": 450e9, "nvlink5": 900e9, "nvl72": 900e9, "nvlink-h800": 200e9,
                     "ib-hdr": 25e9, "ib-ndr": 50e9, "ib-xdr": 100e9, "roce-200": 25e9, "roce-400": 50e9,
                     "100gbe": 12.5e9}
    assert {k: NETWORKS[k].bandwidth for k in per_direction} == per_direction
    # which pairs are inter-node is the graph's devices_per_node; a cluster's default is the switch domain
    assert NETWORKS["nvl72"].domain == 72 and dp.Cluster("GB200", gpus=144, intra="nvl72").devices_per_node == 72
    assert not hasattr(dp.presets.network("nvlink4", "ib-ndr"), "devices_per_node")


def test_listing_needs_no_jax():
    code = ("import sys, diffpipe; p = diffpipe.presets; p.devices(); p.networks(); p.models(); "
            "p.MODELS['deepseek-v3'].config; assert 'jax' not in sys.modules, 'jax imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("call", "culprit"), [
    (lambda: dp.presets.model("llama-4"), "unknown model preset 'llama-4'"),
    (lambda: dp.presets.model("llama-3-8b", hidden=4097), "heads=32 must divide hidden=4097"),
    (lambda: dp.presets.device("TPU-v4"), "unknown device preset"),
])
def test_errors_are_one_line(call, culprit):
    with pytest.raises(dp.ConfigError) as err:
        call()
    assert culprit in str(err.value) and "\n" not in str(err.value)
