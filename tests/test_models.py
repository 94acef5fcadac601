"""Model variants of ``Transformer``: Hugging Face configs, parameter counts, FLOPs and activations.

References: the model cards' parameter counts; Kaplan et al. 2020 (``6N`` training FLOPs per
token plus the attention term); Korthikanti et al. 2022, Table 2 (activation bytes per block for
each recomputation mode, with and without tensor and sequence parallelism).
"""

import json
from pathlib import Path

import numpy as np
import pytest

import diffpipe as dp
from diffpipe._model._transformer import activation_bytes

HF = Path(__file__).parent / "data" / "hf"

#: fixture -> (total, active, unit): the model card's figures and the unit of their last digit
#: (vendors round or truncate to it; DeepSeek and Qwen-MoE cards truncate: DeepSeek-V2's 21.38B
#: activated is "21B"). Sources: each fixture's "_comment" and the model cards on Hugging Face:
#: Qwen3-8B "8.2B", Qwen3-30B-A3B "30.5B in total and 3.3B activated", Qwen2-57B-A14B "57B, 14B
#: activated", DeepSeek-V3 "671B total, 37B activated"; the others as in test_presets.py.
CARDS = {
    "llama-3-8b": (8.03e9, 8.03e9, 1e7),
    "mistral-7b": (7.24e9, 7.24e9, 1e7),
    "mixtral-8x7b": (46.7e9, 12.9e9, 1e8),
    "qwen2.5-72b": (72.7e9, 72.7e9, 1e8),
    "qwen3-8b": (8.2e9, 8.2e9, 1e8),
    "qwen3-30b-a3b": (30.5e9, 3.3e9, 1e8),
    "qwen2-57b-a14b": (57e9, 14e9, 1e9),
    "deepseek-v3": (671e9, 37e9, 1e9),
}


def _hf(name, **overrides):
    return dp.Transformer.from_hf_config(HF / f"{name}.json", **overrides)


@pytest.mark.parametrize("name", sorted(CARDS))
def test_hf_configs_match_the_model_cards(name):
    total, active, unit = CARDS[name]
    m = _hf(name, sequence=4096)
    assert abs(m.parameters() - total) < unit, m.parameters()
    assert abs(m.active_parameters() - active) < unit, m.active_parameters()
    assert m.active_parameters() <= m.parameters()
    assert json.loads((HF / f"{name}.json").read_text())["_comment"]  # every fixture names its source


def test_hf_config_fields():
    m = _hf("deepseek-v3")
    assert m.sequence == 163840 and m.moe_layers == tuple(range(3, 61)) and m.dh == 192 and m.dv == 128
    assert (m.experts, m.experts_per_token, m.shared_experts, m.kv_lora_rank) == (256, 8, 1, 512)
    q = _hf("qwen2.5-72b", sequence=8192, microbatch_size=2, recompute="selective")
    assert (q.kv, q.qkv_bias, q.bias, q.norm, q.activation, q.positions) == (8, True, False, "rmsnorm", "swiglu",
                                                                             "rotary")
    assert (q.sequence, q.microbatch_size, q.recompute, q.dropout, q.tied_embedding) == (8192, 2, "selective",
                                                                                         False, False)
    mapping = json.loads((HF / "mixtral-8x7b.json").read_text())
    assert dp.Transformer.from_hf_config(mapping) == _hf("mixtral-8x7b")


def _training_flops(m):
    c = dp.layer_costs(m)
    return c.forward.sum() + c.input_grad.sum() + c.weight.sum()


@pytest.mark.parametrize("name", sorted(CARDS))
def test_flops_per_token_are_6n_plus_attention(name):
    # Kaplan et al. 2020, §2.1: 6 N per token for the matmul weights a token passes through (the
    # embedding lookup is no matmul; norms are negligible) plus 3 passes of the attention core,
    # 2 s a (d_h + d_v) per layer and token.
    m = _hf(name, sequence=4096)
    n = m.active_parameters() - m.vocabulary * m.hidden
    attention = 6 * m.layers * m.sequence * m.heads * (m.dh + m.dv)
    np.testing.assert_allclose(_training_flops(m) / m.sequence, 6 * n + attention, rtol=2e-4)
    again = dp.Transformer(**{**m.__dict__, "recompute": "full", "flash_attention": True})
    assert _training_flops(again) > _training_flops(m) and again.model_flops() == m.model_flops() == _training_flops(m)


GPT = dp.Transformer(layers=4, hidden=1024, heads=16, sequence=2048, vocabulary=51200, microbatch_size=2)


@pytest.mark.parametrize("tensor", [1, 2, 8])
def test_activations_match_korthikanti_table_2(tensor):
    s, b, h, a, t = GPT.sequence, GPT.microbatch_size, GPT.hidden, GPT.heads, tensor
    sbh, core = s * b * h, 5 * a * s / h

    def block(mode, sp):
        m = dp.Transformer(**{**GPT.__dict__, "recompute": mode})
        return activation_bytes(m, tensor=t, sequence_parallel=sp)[1] / sbh

    np.testing.assert_allclose(block("none", False), 10 + 24 / t + core / t, rtol=1e-12)
    np.testing.assert_allclose(block("none", True), 34 / t + core / t, rtol=1e-12)
    np.testing.assert_allclose(block("selective", False), 10 + 24 / t, rtol=1e-12)
    np.testing.assert_allclose(block("selective", True), 34 / t, rtol=1e-12)
    np.testing.assert_allclose(block("full", False), 2, rtol=1e-12)
    if t == 1:  # Table 2's first row: 34 + 5 a s / h
        np.testing.assert_allclose(dp.layer_costs(GPT).activation_bytes[1] / sbh, 34 + core, rtol=1e-12)


def _with(**fields):
    return dp.Transformer(**{**GPT.__dict__, **fields})


def test_recompute_modes_and_flash_attention_flops():
    s, b, h = GPT.sequence, GPT.microbatch_size, GPT.hidden
    base = dp.layer_costs(GPT)
    core, qk = 4 * b * s * s * h, 2 * b * s * s * h  # Q K^T and P V; Q K^T alone
    for fields, extra in [({"recompute": "selective"}, core), ({"recompute": "full"}, base.forward[1]),
                          ({"flash_attention": True}, qk), ({"flash_attention": True, "recompute": "selective"},
                                                            core + qk)]:
        c = dp.layer_costs(_with(**fields))
        np.testing.assert_array_equal(c.forward, base.forward)
        np.testing.assert_array_equal(c.weight, base.weight)
        np.testing.assert_allclose(c.input_grad[1:-1] - base.input_grad[1:-1], extra, rtol=1e-12)
    flash = dp.layer_costs(_with(flash_attention=True)).activation_bytes[1]
    np.testing.assert_allclose(flash, s * b * h * 34 + 4 * GPT.heads * s * b, rtol=1e-12)  # fp32 log-sum-exp
    assert dp.Transformer(**{**GPT.__dict__, "recompute": True}).recompute == "full"
    assert GPT.recompute == "none"


def test_a_small_moe_gqa_model_by_hand():
    # h=8, a=2 heads of 4, 1 kv head; SwiGLU; 4 experts of width 4, 2 per token, 1 shared; block 1 MoE.
    m = dp.Transformer(layers=2, hidden=8, heads=2, sequence=4, vocabulary=16, kv_heads=1, ffn_hidden=12,
                       activation="swiglu", norm="rmsnorm", positions="rotary", bias=False, dropout=False,
                       tied_embedding=False, experts=4, experts_per_token=2, moe_ffn_hidden=4, shared_experts=1,
                       moe_layers=[1])
    attention = 8 * 8 + 2 * 8 * 4 + 8 * 8  # Q, K and V (one head each), output
    dense = attention + 3 * 8 * 12 + 2 * 8  # + SwiGLU + two RMSNorm scales
    expert = 3 * 8 * 4
    moe = attention + 4 * 8 + (4 + 1) * expert + 2 * 8  # + router, 4 routed + 1 shared expert, norms
    c = dp.layer_costs(m)
    np.testing.assert_array_equal(c.parameters, [16 * 8, dense, moe, 16 * 8 + 8])
    assert m.parameters() == c.parameters.sum() and c.shared_parameters == 0
    assert m.active_parameters() == m.parameters() - 2 * expert
    tokens, core = 4, 2 * 16 * 2 * (4 + 4)  # A = 2 b s^2 a (d_h + d_v)
    moe_weights = attention + 4 * 8 + (2 + 1) * expert  # router, k routed, shared
    np.testing.assert_array_equal(c.forward, [0, 2 * tokens * (dense - 16) + core, 2 * tokens * moe_weights + core,
                                              2 * tokens * 8 * 16])
    np.testing.assert_array_equal(c.weight[1:-1], c.forward[1:-1] - core)
    np.testing.assert_array_equal(c.input_grad[1:-1], c.forward[1:-1] + core)
    # stored: 4 d h (norm and projection inputs) + Q, K, V, output-projection input + MLP interior
    # + the softmax output (no dropout), per token
    dense_act = 4 * 2 * 8 + 2 * (8 + 4 + 4 + 8) + 3 * 2 * 12 + 2 * 4 * 2
    moe_act = 4 * 2 * 8 + 2 * (8 + 4 + 4 + 8) + 3 * 2 * 4 + 2 * (2 * 2 * 8 + 3 * 2 * 4) + 4 * 4 + 2 * 4 * 2
    np.testing.assert_array_equal(c.activation_bytes, tokens * np.asarray([0, dense_act, moe_act, 2 * 2 * 8 + 4 * 16]))
    padded = dp.Transformer(**{**m.__dict__, "capacity_factor": 1.5})
    np.testing.assert_allclose(dp.layer_costs(padded).weight[2] - c.weight[2], 2 * tokens * 0.5 * 2 * expert)


def test_the_defaults_are_gpt():
    tiny = dp.Transformer(layers=2, hidden=8, heads=2, sequence=4, vocabulary=16, microbatch_size=3)
    explicit = dp.Transformer(**{**tiny.__dict__, "kv_heads": 2, "ffn_hidden": 32, "head_dim": 4})
    for field in ("forward", "input_grad", "weight", "parameters", "activation_bytes", "output_bytes"):
        np.testing.assert_array_equal(getattr(dp.layer_costs(explicit), field), getattr(dp.layer_costs(tiny), field))


def _broken(key):
    config = json.loads((HF / "llama-3-8b.json").read_text())
    del config[key]
    return config


@pytest.mark.parametrize(("call", "culprit"), [
    (lambda: dp.Transformer.from_hf_config(_broken("hidden_size")), "needs hidden_size"),
    (lambda: dp.Transformer.from_hf_config({"model_type": "gpt_bigcode"}), "unsupported model_type 'gpt_bigcode'"),
    (lambda: dp.Transformer.from_hf_config({"model_type": "mixtral", "hidden_size": 8}),
     "needs num_hidden_layers, num_attention_heads, vocab_size, max_position_embeddings, intermediate_size, "
     "num_local_experts, num_experts_per_tok"),
    (lambda: dp.Transformer.from_hf_config(HF / "missing.json"), "missing.json"),
    (lambda: dp.Transformer.from_hf_config({**_broken("rope_theta"), "hidden_act": "gelu"}), "hidden_act"),
    (lambda: dp.Transformer.from_hf_config(3), "path or a mapping"),
    (lambda: _with(kv_heads=3), "kv_heads=3"),
    (lambda: _with(experts=4, experts_per_token=5), "experts_per_token=5"),
    (lambda: _with(experts=4, moe_layers=[1, 9]), "moe_layers"),
    (lambda: _with(activation="relu"), "activation"),
    (lambda: _with(recompute="some"), "recompute"),
    (lambda: _with(router="top2"), "unknown field(s) router"),
    (lambda: _with(rope_head_dim=8), "rope_head_dim"),
    (lambda: _with(capacity_factor=0), "capacity_factor"),
    (lambda: activation_bytes(GPT, tensor=0), "tensor"),
])
def test_errors_are_one_line(call, culprit):
    with pytest.raises(dp.ConfigError) as err:
        call()
    assert culprit in str(err.value) and "\n" not in str(err.value)


def test_bad_json_names_the_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama",\n  oops}')
    with pytest.raises(dp.ConfigError, match=r"config.json:2: not JSON"):
        dp.Transformer.from_hf_config(bad)
