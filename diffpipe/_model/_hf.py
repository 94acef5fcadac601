"""Hugging Face ``config.json`` -> ``Transformer`` fields (``Transformer.from_hf_config``).

No JAX and no network: a local file (read with ``diffpipe._io.read_text``) or an already parsed
mapping. Each supported ``model_type`` names the keys it needs; an unknown type or missing keys
are one ``ConfigError`` naming them. Key meanings follow the ``transformers`` configuration
classes of the same name (``LlamaConfig``, ``MistralConfig``, ``MixtralConfig``, ``Qwen2Config``,
``Qwen2MoeConfig``, ``Qwen3Config``, ``Qwen3MoeConfig``, ``DeepseekV3Config``) and their modelling
code. All of them are rotary, RMSNorm, SwiGLU (``hidden_act = "silu"``) decoders trained without
dropout.

Approximations, stated:
- Llama-style ``attention_bias`` is read as biases on the query/key/value projections (and on every
  linear layer when ``mlp_bias`` is set too); a bias on the output projection alone is not represented.
- ``sequence`` is ``max_position_embeddings`` (the longest context, not necessarily the training
  one): pass ``sequence=`` to ``from_hf_config`` for the length you train at.
- Qwen2-MoE's shared expert is ``shared_expert_intermediate_size / moe_intermediate_size`` experts
  of the routed width (an integer for the published models); its sigmoid gate (``h`` weights a
  block) is left out.
- DeepSeek-V3: multi-head latent attention's parameters and FLOPs are modelled without the
  absorbed-matrix inference trick (exact for training); the multi-token-prediction module
  (``num_nextn_predict_layers``, 14B parameters outside the 671B main model) and the router's
  per-expert score-correction bias (``E`` numbers a block) are left out; node-limited routing
  (``n_group``, ``topk_group``) does not change FLOPs and is ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from .._errors import ConfigError
from .._io import load_json

#: Keys every supported config needs.
_COMMON = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "max_position_embeddings")
#: model_type -> the further keys it needs.
_REQUIRED: dict[str, tuple[str, ...]] = {
    "llama": ("intermediate_size",),
    "mistral": ("intermediate_size",),
    "qwen2": ("intermediate_size",),
    "qwen3": ("intermediate_size",),
    "mixtral": ("intermediate_size", "num_local_experts", "num_experts_per_tok"),
    "qwen2_moe": ("intermediate_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "shared_expert_intermediate_size"),
    "qwen3_moe": ("intermediate_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "deepseek_v3": ("intermediate_size", "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok",
                    "n_shared_experts", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                    "v_head_dim", "first_k_dense_replace"),
}


def _load(config: Any) -> tuple[dict[str, Any], str]:
    if isinstance(config, Mapping):
        return dict(config), "hf config"
    if isinstance(config, (str, os.PathLike)):
        data = load_json(config, "hf config", "a Hugging Face config.json")
        if not isinstance(data, dict):
            raise ConfigError(f"{config}: expected a JSON object, got {type(data).__name__}")
        return data, str(config)
    raise ConfigError(f"from_hf_config: expected a path or a mapping, got {type(config).__name__}")


#: Every key diffpipe reads -> its kind (``_KINDS``); each is checked before any is used.
_FIELDS: dict[str, str] = {
    "model_type": "name", "hidden_act": "name",
    **{k: "count" for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                            "max_position_embeddings", "intermediate_size", "num_key_value_heads", "head_dim",
                            "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                            "n_routed_experts", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
                            "qk_rope_head_dim", "v_head_dim", "decoder_sparse_step", "moe_layer_freq")},
    **{k: "natural" for k in ("shared_expert_intermediate_size", "n_shared_experts", "first_k_dense_replace")},
    **{k: "bool" for k in ("tie_word_embeddings", "attention_bias", "mlp_bias")},
    "mlp_only_layers": "blocks",
}


def _is_int(v: Any, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


_KINDS: dict[str, tuple[Any, str]] = {
    "name": (lambda v: isinstance(v, str), "a string"),
    "count": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "natural": (lambda v: _is_int(v, 0), "an integer >= 0"),
    "bool": (lambda v: isinstance(v, bool), "a JSON boolean (true or false)"),
    "blocks": (lambda v: isinstance(v, list) and all(_is_int(x, 0) for x in v), "a list of block indices >= 0"),
}


def _check(c: Mapping[str, Any], where: str) -> None:
    """Types and ranges of every key read (``null`` reads as absent), one line naming the first bad one."""
    for key, kind in _FIELDS.items():
        value = c.get(key)
        test, want = _KINDS[kind]
        if value is not None and not test(value):
            raise ConfigError(f"{where}: {key} must be {want}, got {json.dumps(value, default=str)[:80]}")


def _at_most(c: Mapping[str, Any], where: str, key: str, bound: int, what: str) -> None:
    if c[key] > bound:
        raise ConfigError(f"{where}: {key} = {c[key]} exceeds {what} ({bound})")


def _sparse(layers: int, step: int, dense: list[int]) -> tuple[int, ...]:
    """Qwen2/3-MoE's rule (``Qwen2MoeDecoderLayer``): block ``i`` is MoE unless listed in
    ``mlp_only_layers``, when ``(i + 1) % decoder_sparse_step == 0``."""
    return tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)


def transformer_fields(config: Any) -> dict[str, Any]:
    """The ``Transformer`` keyword arguments a Hugging Face config describes (see the module docstring)."""
    c, where = _load(config)
    _check(c, where)
    kind = c.get("model_type")
    if kind not in _REQUIRED:
        raise ConfigError(f"{where}: unsupported model_type {kind!r}; supported: {', '.join(_REQUIRED)}")
    missing = [k for k in (*_COMMON, *_REQUIRED[kind]) if c.get(k) is None]
    if missing:
        raise ConfigError(f"{where}: model_type {kind!r} needs {', '.join(missing)}")
    act = c.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"{where}: hidden_act {act!r} is not supported (SwiGLU models use 'silu')")
    layers = c["num_hidden_layers"]
    if kind in ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"):
        experts = {"mixtral": "num_local_experts", "deepseek_v3": "n_routed_experts"}.get(kind, "num_experts")
        _at_most(c, where, "num_experts_per_tok", c[experts], experts)
    for key in ("first_k_dense_replace", "decoder_sparse_step", "moe_layer_freq"):
        if c.get(key) is not None:
            _at_most(c, where, key, layers, "num_hidden_layers")
    outside = [i for i in c.get("mlp_only_layers") or [] if i >= layers]
    if outside:
        raise ConfigError(f"{where}: mlp_only_layers names block {outside[0]}, past num_hidden_layers ({layers})")
    fields: dict[str, Any] = dict(
        layers=layers, hidden=c["hidden_size"], heads=c["num_attention_heads"], sequence=c["max_position_embeddings"],
        vocabulary=c["vocab_size"], ffn_hidden=c["intermediate_size"], kv_heads=c.get("num_key_value_heads"),
        head_dim=c.get("head_dim"), tied_embedding=bool(c.get("tie_word_embeddings", False)),
        activation="swiglu", norm="rmsnorm", positions="rotary", dropout=False,
        bias=bool(c.get("attention_bias", False)) and bool(c.get("mlp_bias", False)),
        qkv_bias=bool(c.get("attention_bias", False)),
    )
    if kind in ("qwen2", "qwen2_moe"):
        fields["qkv_bias"] = True  # Qwen2Attention: q/k/v projections with bias, o_proj without
    if kind in ("qwen3", "qwen3_moe"):
        fields["qk_norm"] = True  # Qwen3Attention: q_norm and k_norm over head_dim
    if kind == "mixtral":
        fields.update(experts=c["num_local_experts"], experts_per_token=c["num_experts_per_tok"])
    elif kind in ("qwen2_moe", "qwen3_moe"):
        dense = list(c.get("mlp_only_layers") or [])
        fields.update(experts=c["num_experts"], experts_per_token=c["num_experts_per_tok"],
                      moe_ffn_hidden=c["moe_intermediate_size"],
                      moe_layers=_sparse(layers, c.get("decoder_sparse_step") or 1, dense))
        if kind == "qwen2_moe":
            shared, width = c["shared_expert_intermediate_size"], c["moe_intermediate_size"]
            if shared % width:
                raise ConfigError(f"{where}: shared_expert_intermediate_size {shared} is not a multiple of "
                                  f"moe_intermediate_size {width}")
            fields["shared_experts"] = shared // width
    elif kind == "deepseek_v3":
        first, step = c["first_k_dense_replace"], c.get("moe_layer_freq") or 1
        fields.update(
            experts=c["n_routed_experts"], experts_per_token=c["num_experts_per_tok"],
            moe_ffn_hidden=c["moe_intermediate_size"], shared_experts=c["n_shared_experts"],
            moe_layers=tuple(i for i in range(first, layers) if i % step == 0),  # DeepseekV3DecoderLayer
            kv_heads=None, head_dim=c["qk_nope_head_dim"] + c["qk_rope_head_dim"], v_head_dim=c["v_head_dim"],
            q_lora_rank=c["q_lora_rank"], kv_lora_rank=c["kv_lora_rank"], rope_head_dim=c["qk_rope_head_dim"],
        )
    return fields


__all__ = ["transformer_fields"]
