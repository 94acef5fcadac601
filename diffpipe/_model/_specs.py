"""Named models, as published (Hugging Face ``config.json`` keys or ``Transformer`` fields, with
sources), without JAX: ``_presets.model("llama-3-70b")`` builds the ``Transformer``."""


from __future__ import annotations

from typing import Any, NamedTuple

from .._checks import preset_key


class ModelSpec(NamedTuple):
    """A model as published: its configuration (a Hugging Face ``config.json``'s keys, read by
    ``Transformer.from_hf_config``, or ``Transformer`` fields when ``hf`` is False), the sequence
    length it was pre-trained at, and the sources of both."""

    config: dict[str, Any]
    sequence: int
    source: str
    hf: bool = True


def _llama(layers: int, hidden: int, heads: int, ffn: int, vocabulary: int, positions: int, **more: Any) -> dict:
    return dict(model_type="llama", num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                num_key_value_heads=8, intermediate_size=ffn, vocab_size=vocabulary,
                max_position_embeddings=positions, hidden_act="silu", tie_word_embeddings=False, **more)


MODELS: dict[str, ModelSpec] = {
    "llama-3-8b": ModelSpec(_llama(32, 4096, 32, 14336, 128256, 8192), 8192,
                            "meta-llama/Meta-Llama-3-8B config.json; model card: 8B, context length 8k"),
    "llama-3-70b": ModelSpec(_llama(80, 8192, 64, 28672, 128256, 8192), 8192,
                             "meta-llama/Meta-Llama-3-70B config.json; model card: 70B, context length 8k"),
    "llama-3.1-405b": ModelSpec(_llama(126, 16384, 128, 53248, 128256, 131072), 8192,
                                "meta-llama/Llama-3.1-405B config.json; Llama 3 paper (Dubey et al. 2024) §3.4: "
                                "pre-training at 8K tokens before the long-context stage"),
    "mistral-7b": ModelSpec({**_llama(32, 4096, 32, 14336, 32000, 32768), "model_type": "mistral"}, 8192,
                            "mistralai/Mistral-7B-v0.1 config.json; Jiang et al. 2023, Table 1: context_len 8192 "
                            "(its 4096-token sliding window is not modelled: attention counted over s)"),
    "mixtral-8x7b": ModelSpec({**_llama(32, 4096, 32, 14336, 32000, 32768), "model_type": "mixtral",
                               "num_local_experts": 8, "num_experts_per_tok": 2}, 32768,
                              "mistralai/Mixtral-8x7B-v0.1 config.json; Jiang et al. 2024 (Mixtral of Experts) "
                              "§2: trained with a context of 32k tokens"),
    "qwen2.5-72b": ModelSpec({**_llama(80, 8192, 64, 29568, 152064, 131072), "model_type": "qwen2"}, 4096,
                             "Qwen/Qwen2.5-72B config.json; Qwen2.5 technical report §3.2: pre-training at "
                             "4,096 tokens before the 32,768-token stage"),
    "gpt-3-175b": ModelSpec(dict(layers=96, hidden=12288, heads=96, vocabulary=50257), 2048,
                            "Brown et al. 2020 (GPT-3), Table 2.1: 96 layers, d_model 12288, 96 heads, context "
                            "2048; GPT-2's 50257-token BPE vocabulary; Megatron-LM layout (learned positions, "
                            "biases, LayerNorm, GeLU, tied embeddings)", hf=False),
    "deepseek-v3": ModelSpec(dict(model_type="deepseek_v3", num_hidden_layers=61, hidden_size=7168,
                                  num_attention_heads=128, num_key_value_heads=128, intermediate_size=18432,
                                  moe_intermediate_size=2048, n_routed_experts=256, num_experts_per_tok=8,
                                  n_shared_experts=1, first_k_dense_replace=3, moe_layer_freq=1, q_lora_rank=1536,
                                  kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                  vocab_size=129280, max_position_embeddings=163840, hidden_act="silu",
                                  tie_word_embeddings=False), 4096,
                             "deepseek-ai/DeepSeek-V3 config.json; DeepSeek-V3 technical report §4.2: maximum "
                             "sequence length 4K in pre-training (multi-token prediction module left out)"),
}


#: Other spellings users type; lookups also ignore case, "-", "_" and spaces (``_checks.preset_key``).
ALIASES = {"llama405b": "llama-3.1-405b", "gpt3": "gpt-3-175b", "gpt3175b": "gpt-3-175b",
           "deepseekv3671b": "deepseek-v3"}


def model_key(name: object) -> str:
    """The ``MODELS`` key of ``name`` (any case, spelling or alias); ``ConfigError`` names the known ones."""
    return preset_key(MODELS, name, "model", ALIASES)


def models() -> tuple[str, ...]:
    """The model preset names (see ``MODELS``)."""
    return tuple(MODELS)


def longest_context(name: str) -> int:
    """The longest context of model preset ``name``: its ``max_position_embeddings`` (the
    pre-training sequence for a preset given as ``Transformer`` fields)."""
    spec = MODELS[model_key(name)]
    return int(spec.config["max_position_embeddings"]) if spec.hf else spec.sequence
