"""A decoder-only transformer cost model: per-layer FLOPs and bytes, and ``Hardware`` from a model.

The model is a table over *layers*: the embedding, each transformer block, and the LM head (final
norm, projection to the vocabulary, cross-entropy). The first and last layers are uneven: the
embedding holds ``V h`` (+ ``s h`` learned positions) parameters but computes nothing worth
counting, the head computes ``2 b s h V`` FLOPs per pass and stores fp32 logits. ``layer_costs``
gives the table; ``Workload.from_model`` turns it into seconds and bytes on a ``Device``, and
``Workload.hardware`` (``StageBalance``, and ``hardware_from_model`` through ``stage_of_layers``)
groups consecutive layers into pipeline stages: one path from a model to a ``Hardware``.

The default ``Transformer`` is Megatron-LM's GPT (learned positions, LayerNorm, biases, GeLU MLP,
full multi-head attention, tied embeddings, dropout); the fields generalise it to the models people
train now: grouped-query / multi-query attention, SwiGLU, RMSNorm, rotary positions, untied
embeddings, no biases, mixture of experts, DeepSeek's multi-head latent attention, flash attention
and selective recomputation. ``Transformer.from_hf_config`` reads a Hugging Face ``config.json``.

Notation: ``b`` samples per microbatch, ``s`` sequence, ``h`` hidden, ``a`` heads, ``a_kv`` key/value
heads, ``d_h`` head dimension (``h / a``), ``d_v`` value head dimension, ``V`` vocabulary, ``l``
transformer layers, ``F`` FFN width (``f h``), ``E`` experts, ``k`` experts per token, ``F_e`` an
expert's FFN width, ``d`` bytes per activation/weight element (2 for fp16/bf16), ``t`` tensor-parallel
size.

Sources and rules:
- FLOPs (matmuls only, 2 per multiply-accumulate; norms, activations and softmax are not counted):
  Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
  (SC'21), §5.1. Every weight matrix is applied once per token, so a block's weight matmuls cost
  ``M = 2 b s P_w`` in the forward, ``P_w`` the weight-matrix parameters a token passes through
  (for GPT ``12 h^2``: ``M = 24 b s h^2``); the attention core (``Q K^T`` and ``P V``, no causal
  halving, as Megatron counts) ``A = 2 b s^2 a (d_h + d_v)`` (``4 b s^2 h``). The logit layer is
  ``2 b s h V``. One iteration without recomputation is then ``72 B s l h^2 (1 + s/(6h) + V/(12 h l))``
  for GPT, with full recomputation ``96 B s l h^2 (1 + s/(6h) + V/(16 h l))``.
- Backward split (exact for matmuls): a weight matmul ``Y = X W`` costs as much for the input
  gradient ``dX = dY W^T`` as for the weight gradient ``dW = X^T dY``; ``Q K^T`` and ``P V`` have no
  weights, so both of their gradients are input gradients: ``I = M + 2A``, ``W = M`` (Qi et al.,
  "Zero Bubble Pipeline Parallelism", ICLR 2024, Table 1). Recomputation adds to ``I``: full
  recomputation re-runs the block's forward (``+ M + A``); selective recomputation re-runs the
  attention core only (``+ A``; Korthikanti et al. 2022, §4.2); flash attention's backward
  recomputes ``S = Q K^T`` from the stored log-sum-exp (``+ 2 b s^2 a d_h``; Dao, "FlashAttention-2",
  2023, Algorithm 2).
- Mixture of experts (Shazeer et al. 2017; Fedus et al., "Switch Transformers", JMLR 2022): a MoE
  block's FFN is a router (``E h`` weights, every token) and ``E`` expert FFNs of width ``F_e`` of
  which each token passes through ``k``, plus ``shared_experts`` always-on experts (DeepSeekMoE, Dai
  et al. 2024). Dropless routing (``capacity_factor=None``) computes and stores ``k`` expert passes
  per token; a capacity factor ``c`` pads every expert to ``c k T / E`` tokens (Switch Transformers
  §2.2), so compute and activations of the routed experts scale by ``c``.
- Multi-head latent attention (DeepSeek-AI, "DeepSeek-V2", 2024, §2.1; DeepSeek-V3 2024): queries
  through a rank-``q_lora_rank`` down/up projection, keys and values through a shared
  ``kv_lora_rank`` latent plus a decoupled ``rope_head_dim`` rotary key shared by all heads, with
  RMSNorms on both latents; keys have ``d_h`` (= nope + rope) and values ``d_v`` dimensions per
  head. Its parameters are exact; its stored activations are the latents and the decompressed
  ``Q, K, V`` (what an implementation without the absorbed-matrix trick keeps).
- Activation memory: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models" (MLSys 2023), §4 and Table 2: a GPT block stores ``s b h (34 + 5 a s / h)`` bytes in fp16
  without recomputation (``s b h (10 + 24/t + 5 a s/(h t))`` with tensor parallelism, ``34/t`` for the
  ``s b h`` term with sequence parallelism), ``34`` (resp. ``10 + 24/t``, ``34/t``) with selective
  recomputation, and ``2 s b h`` (its input) with full recomputation. The same rule (every tensor a
  backward op reads is stored once) gives the variants: see ``activation_bytes``.
- Op times (``LayerCosts.times``, ``Device``): the roofline of each layer and op, ``max(FLOPs /
  (peak x efficiency(T)), bytes / memory_bandwidth)`` (Williams et al., "Roofline", CACM 2009),
  with bytes by the per-matmul rule ``(M K + K N + M N) d`` (``memory_traffic``) and a kernel
  efficiency that saturates in the matmuls' rows ``T`` (tokens per microbatch), fitted to
  measured matmul throughput (``papers/kernel-efficiency``).
- Static memory: ``16`` bytes per parameter for mixed-precision Adam (2 fp16 weights + 2 fp16
  gradients + 12 fp32 master weights, momentum, variance): Rajbhandari et al., "ZeRO: Memory
  Optimizations Toward Training Trillion Parameter Models" (SC'20), §3.1.

Why one module past 500 lines: the model's fields and checks and the per-layer formulas with their
sources are one table; most of the length is the cited formulas.
"""


from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import equinox as eqx
import numpy as np
from jaxtyping import Array, Float

from .._caches import memoized
from .._checks import is_int, is_positive_int
from .._choices import FLASH_VERSIONS, RECOMPUTE
from .._errors import ConfigError
from .._machine._device import Device
from .._partition import uniform_partition
from ._hf import transformer_fields

#: Bytes of one dropout-mask element (Korthikanti et al. 2022, §4.1).
_MASK_BYTES = 1
#: Bytes of one logit: the cross-entropy runs in fp32 (Korthikanti et al. 2022, §4.3).
_LOGIT_BYTES = 4
#: Bytes of one softmax statistic kept by flash attention (fp32 log-sum-exp per row and head;
#: Dao, "FlashAttention-2", 2023, Algorithm 1) and of one router probability (fp32 in Megatron-LM).
_STAT_BYTES = 4
#: Model variants (and sharded sizes) whose per-layer tables are kept: a plan prices each
#: variant under many data sizes and ZeRO stages (``diffpipe._plan._bounds``).
CACHED = 256

ACTIVATIONS = ("gelu", "swiglu")
#: The most transformer blocks a model may have: every per-layer table holds ``layers + 2`` rows
#: (the largest published models have a few hundred blocks).
MAX_LAYERS = 100_000
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rotary")


def recompute_mode(value: Any) -> str:
    """``"none" | "selective" | "full"`` from a mode or the old bool (``True`` is ``"full"``)."""
    if isinstance(value, bool):
        return "full" if value else "none"
    if isinstance(value, str) and value in RECOMPUTE:
        return value
    raise ConfigError(f"transformer: recompute must be one of {', '.join(RECOMPUTE)} (or a bool), got {value!r}")


#: The generation priced when neither the model nor its framework names one: the device's own kernel.
DEFAULT_FLASH_VERSION = 3


def attention_kernel(model_version: int | None, framework_version: int | None = None) -> tuple[int, str]:
    """The one rule of which fused-attention generation is priced, and which setting gave it: the
    model's own ``flash_version`` (``"model"``), else its framework's (``"framework"``:
    ``Framework.model``), else ``DEFAULT_FLASH_VERSION`` (``"default"``: ``Transformer.flash_generation``,
    the CLI's settings line)."""
    if model_version is not None:
        return model_version, "model"
    if framework_version is not None:
        return framework_version, "framework"
    return DEFAULT_FLASH_VERSION, "default"


@dataclass(frozen=True, init=False)
class Transformer:
    """A decoder-only transformer; the defaults are Megatron-LM's GPT (learned positions, biases,
    LayerNorm, GeLU MLP, multi-head attention, tied embeddings, dropout).

    Attributes:
        layers: transformer blocks ``l``.
        hidden: hidden size ``h``.
        heads: attention (query) heads ``a``.
        sequence: sequence length ``s``.
        vocabulary: vocabulary size ``V``.
        microbatch_size: samples per microbatch ``b`` (a ``Hardware.size`` of 1).
        dtype_bytes: bytes per weight/activation element ``d`` (2 for fp16/bf16).
        ffn_multiplier: FFN width over ``h`` (``f``; 4 for GPT), used when ``ffn_hidden`` is None.
        recompute: ``"none"``, ``"selective"`` (the attention core, Korthikanti et al. 2022) or
            ``"full"`` (every block from its input); ``True``/``False`` mean ``"full"``/``"none"``.
        tied_embedding: the LM head reuses the word embedding (GPT, Megatron); the stage holding
            the head then keeps a copy of it, as Megatron does, unless the two share a stage.
        bytes_per_parameter: static bytes per parameter: weights, gradients and optimizer state
            (16 for mixed-precision Adam, ZeRO §3.1).

    Keyword-only (the GPT value when None):
        kv_heads: key/value heads ``a_kv`` (grouped-query attention; 1 is multi-query; ``heads``).
        head_dim: query/key dimension per head ``d_h`` (``hidden / heads``).
        v_head_dim: value dimension per head ``d_v`` (``head_dim``).
        ffn_hidden: FFN width ``F`` of dense blocks (``ffn_multiplier x hidden``).
        activation: ``"gelu"`` (two matrices ``h x F``, ``F x h``) or ``"swiglu"`` (three: gate, up,
            down; Shazeer, "GLU Variants Improve Transformer", 2020).
        norm: ``"layernorm"`` (scale and bias, ``2h``) or ``"rmsnorm"`` (scale, ``h``; Zhang & Sennrich 2019).
        positions: ``"learned"`` (an ``s x h`` table) or ``"rotary"`` (no parameters; Su et al. 2021).
        bias: biases on every linear layer (GPT) or on none (Llama).
        qkv_bias: biases on the query/key/value projections only (Qwen2); None follows ``bias``.
        qk_norm: RMSNorm of queries and keys per head (Qwen3; ``2 d_h`` parameters a block).
        dropout: dropout after attention, the MLP and the embedding, storing 1-byte masks
            (GPT-3 / Megatron); modern recipes train without (Llama: ``False``).
        experts: routed experts ``E`` per MoE block (1: a dense model).
        experts_per_token: routed experts ``k`` a token passes through.
        moe_ffn_hidden: an expert's FFN width ``F_e`` (``ffn_hidden``).
        shared_experts: always-on experts of width ``F_e`` in each MoE block (DeepSeekMoE).
        moe_layers: indices of the MoE blocks (None: all when ``experts > 1``).
        capacity_factor: expert capacity ``c`` (tokens padded to ``c k T / E`` per expert); None is dropless.
        q_lora_rank, kv_lora_rank, rope_head_dim: multi-head latent attention (DeepSeek-V2/V3) when
            ``kv_lora_rank > 0``: the query latent rank (0: a plain query projection), the key/value
            latent rank and the decoupled rotary key dimension (part of ``head_dim``).
        flash_attention: fused attention (Dao et al. 2022): no ``s x s`` tensors stored, ``Q K^T``
            recomputed in the backward.
        flash_version: the fused kernel's generation, 2 (FlashAttention-2, Dao 2023: the device's
            attention curve), 1 (FlashAttention-1, and the Triton kernel of its time, whose forward
            plus backward the FlashAttention repository's ``flash_attn_triton.py`` calls "slightly
            slower than" FlashAttention-1's CUDA one): half the rate ("around 2x speedup compared to
            FlashAttention", the FlashAttention-2 paper's abstract), or 3 (the device architecture's own
            kernels, on Hopper FlashAttention-3 and cuDNN's fused flash attention, which Transformer
            Engine prefers there and PyTorch 2.5.0's SDPA used by default): the curve times the
            device's ``KernelModel.attention_native``, 1 where it has none. None (the default): the
            kernel of the ``Configuration``'s framework (``Framework.flash_version``), else 3, the
            device's own: PyTorch's SDPA prefers cuDNN's attention on Hopper and Blackwell once its
            bundled cuDNN is newer than 9.15 (``check_prefer_cudnn_attention`` in
            ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` at pytorch 70d99e998b, lines 78-99;
            the wheels' cuDNN passes it from PyTorch 2.11), as Transformer Engine does; on a device
            without such a kernel (``attention_native`` 1) this is FlashAttention-2's rate. Timing only
            (kernel models).
        reduce_bytes: bytes of one gradient element in the data-parallel reduction (None:
            ``dtype_bytes``). 4 where the framework reduces bf16 training's gradients in fp32: Megatron-LM
            (``accumulate_allreduce_grads_in_fp32`` forced for bf16 unless ``--grad-reduce-in-bf16``,
            ``megatron/training/arguments.py`` at d98e8a6), torchtitan (``mixed_precision_reduce``, only
            ``"float32"``), Composer's FSDP ``mixed_precision: DEFAULT`` (``reduce_dtype=torch.float32``,
            ``composer/trainer/mosaic_fsdp_utils.py`` at v0.16.4 and v0.17.2). Communication only: the
            static bytes stay ``bytes_per_parameter``.
        eager_blocks: the blocks run as eager PyTorch modules (llm-foundry's MPT): each LayerNorm's
            backward is PyTorch's own, whose weight gradient is a second kernel that reads ``x`` and ``dy``
            again (``GammaBetaBackwardCUDAKernel`` beside ``layer_norm_grad_input_kernel`` in
            ``aten/src/ATen/native/cuda/layer_norm_kernel.cu``), and the fused ``Wqkv`` output is split into
            ``q``, ``k``, ``v`` before attention (``qkv.split`` in ``llmfoundry/models/layers/attention.py`` at
            5e85bd62d), whose backward concatenates ``dq``, ``dk``, ``dv`` into one tensor (PyTorch's
            ``split_with_sizes_backward``, ``at::cat``). Timing only (kernel models); False (the default):
            the backward's memory-bound kernels are those of ``diffpipe._model._kernels`` alone.
        flat_gradients: each block's weight gradients take PyTorch FSDP's (FSDP1's) path in every
            microbatch that reduces them, in place of Megatron-LM's fp32 ``main_grad`` accumulation: autograd
            concatenates them into the flat gradient (the backward of the ``torch.split`` that makes the
            parameters views of the flat parameter, ``FlatParamHandle._get_unflat_views``), FSDP casts it to
            the reduce dtype (``flat_param.grad.to(handle._reduce_dtype)``) and divides it in place by the
            gradient pre-divide factor before the reduce-scatter (``_post_backward_hook`` and ``_reduce_grad`` in
            ``torch/distributed/fsdp/_runtime_utils.py``; the factor is above 1 on 2 or more ranks); the sharded
            result accumulates on the shard. Timing only (kernel models).
        recompute_early_stop: with ``recompute="full"``, the recomputation stops at the last tensor the
            block's backward saved, as PyTorch's non-reentrant checkpoint does by default
            (``torch.utils.checkpoint``'s early stop, the default since pytorch/pytorch#96866, 2023, first
            in PyTorch 2.1; a saved input is packed before its op runs): a dense block without dropout saves
            nothing after the MLP's output projection takes its input, so that projection's GEMM and the
            residual add after it are not recomputed. MoE blocks, and blocks with dropout (its mask is saved
            after the projection), recompute their whole forward. Timing (kernels and FLOPs of ``I``).
        unpadded_attention: the fused attention runs on unpadded tokens, as llm-foundry's ``attn_impl: flash``
            does (``flash_attn_fn`` in ``llmfoundry/models/layers/attention.py`` at 5e85bd62d): ``q``, ``k`` and ``v``
            are each gathered out of the padded batch by flash-attn's ``bert_padding.unpad_input`` (a mask sum, a
            ``torch.nonzero``, a max, a cumsum and a pad of the mask, then ``torch.gather``), even with no padding (an
            absent mask becomes all ones), and the output is scattered back by ``pad_input`` (``torch.zeros`` and an
            index put); the backward gathers the output's gradient and scatters each of ``dq``, ``dk``, ``dv`` into
            zeros (``bert_padding.py`` at flash-attn v2.4.2, ``IndexFirstAxis`` and ``IndexPutFirstAxis``). Without
            ``flash_attention`` it changes nothing (as ``flash_version``). Timing only (kernel models:
            ``diffpipe._model._kernels``).
    """

    layers: int
    hidden: int
    heads: int
    sequence: int
    vocabulary: int
    microbatch_size: int = 1
    dtype_bytes: int = 2
    ffn_multiplier: float = 4
    recompute: str = "none"
    tied_embedding: bool = True
    bytes_per_parameter: int = 16
    kv_heads: int | None = None
    head_dim: int | None = None
    v_head_dim: int | None = None
    ffn_hidden: int | None = None
    activation: str = "gelu"
    norm: str = "layernorm"
    positions: str = "learned"
    bias: bool = True
    qkv_bias: bool | None = None
    qk_norm: bool = False
    dropout: bool = True
    experts: int = 1
    experts_per_token: int = 1
    moe_ffn_hidden: int | None = None
    shared_experts: int = 0
    moe_layers: tuple[int, ...] | None = None
    capacity_factor: float | None = None
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    rope_head_dim: int = 0
    flash_attention: bool = False
    flash_version: int | None = None
    reduce_bytes: int | None = None
    eager_blocks: bool = False
    flat_gradients: bool = False
    recompute_early_stop: bool = False
    unpadded_attention: bool = False

    @property
    def reduction_bytes(self) -> int:
        """Bytes of one gradient element as the data group reduces it: ``reduce_bytes``, else
        ``dtype_bytes``."""
        return self.reduce_bytes or self.dtype_bytes

    @property
    def flash_generation(self) -> int:
        """The fused-attention generation priced: ``flash_version``, else 3 (the device's own kernel)."""
        return attention_kernel(self.flash_version)[0]

    #: The keyword-only fields, with their defaults (GPT).
    OPTIONS: ClassVar[dict[str, Any]] = dict(
        kv_heads=None, head_dim=None, v_head_dim=None, ffn_hidden=None, activation="gelu", norm="layernorm",
        positions="learned", bias=True, qkv_bias=None, qk_norm=False, dropout=True, experts=1,
        experts_per_token=1, moe_ffn_hidden=None, shared_experts=0, moe_layers=None, capacity_factor=None,
        q_lora_rank=0, kv_lora_rank=0, rope_head_dim=0, flash_attention=False, flash_version=None,
        reduce_bytes=None, eager_blocks=False, flat_gradients=False,
        recompute_early_stop=False, unpadded_attention=False)

    def __init__(self, layers: int, hidden: int, heads: int, sequence: int, vocabulary: int, microbatch_size: int = 1,
                 dtype_bytes: int = 2, ffn_multiplier: float = 4, recompute: str | bool = "none",
                 tied_embedding: bool = True, bytes_per_parameter: int = 16, **options: Any) -> None:
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            raise ConfigError(f"transformer: unknown field(s) {', '.join(unknown)}")
        values: dict[str, Any] = dict(
            layers=layers, hidden=hidden, heads=heads, sequence=sequence, vocabulary=vocabulary,
            microbatch_size=microbatch_size, dtype_bytes=dtype_bytes, ffn_multiplier=ffn_multiplier,
            recompute=recompute_mode(recompute), tied_embedding=tied_embedding,
            bytes_per_parameter=bytes_per_parameter, **{**self.OPTIONS, **options})
        if values["moe_layers"] is not None:
            try:
                values["moe_layers"] = tuple(operator.index(i) for i in values["moe_layers"])
            except TypeError:
                raise ConfigError(f"transformer: moe_layers must be a sequence of ints, got "
                                  f"{values['moe_layers']!r}") from None
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self.__post_init__()

    def __post_init__(self) -> None:
        def fail(name: str, want: str) -> None:
            raise ConfigError(f"transformer: {name} must be {want}, got {getattr(self, name)!r}")

        for name in ("layers", "hidden", "heads", "sequence", "vocabulary", "microbatch_size", "dtype_bytes",
                     "bytes_per_parameter", "experts", "experts_per_token"):
            if not is_positive_int(getattr(self, name)):
                fail(name, "a positive int")
        for name in ("kv_heads", "head_dim", "v_head_dim", "ffn_hidden", "moe_ffn_hidden", "reduce_bytes"):
            if getattr(self, name) is not None and not is_positive_int(getattr(self, name)):
                fail(name, "a positive int or None")
        for name in ("shared_experts", "q_lora_rank", "kv_lora_rank", "rope_head_dim"):
            if not (is_int(getattr(self, name)) and getattr(self, name) >= 0):
                fail(name, "an int >= 0")
        if self.layers > MAX_LAYERS:
            raise ConfigError(f"transformer: layers must be at most {MAX_LAYERS:,}, got {self.layers!r}")
        f = self.ffn_multiplier
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not np.isfinite(f) or f <= 0:
            fail("ffn_multiplier", "a positive number")
        for name in ("tied_embedding", "bias", "qk_norm", "dropout", "flash_attention", "eager_blocks",
                     "flat_gradients", "recompute_early_stop", "unpadded_attention"):
            if not isinstance(getattr(self, name), bool):
                fail(name, "a bool")
        if self.flash_version is not None and (self.flash_version not in FLASH_VERSIONS
                                               or isinstance(self.flash_version, bool)):
            fail("flash_version", "1, 2, 3 or None")
        if self.qkv_bias is not None and not isinstance(self.qkv_bias, bool):
            fail("qkv_bias", "a bool or None")
        for name, choices in (("activation", ACTIVATIONS), ("norm", NORMS), ("positions", POSITIONS)):
            if getattr(self, name) not in choices:
                fail(name, "one of " + ", ".join(choices))
        if self.heads % self.kv:
            raise ConfigError(f"transformer: kv_heads={self.kv} must divide heads={self.heads}")
        if self.head_dim is None and self.hidden % self.heads:
            raise ConfigError(f"transformer: heads={self.heads} must divide hidden={self.hidden} (or give head_dim)")
        if self.experts_per_token > self.experts:
            raise ConfigError(f"transformer: experts_per_token={self.experts_per_token} exceeds "
                              f"experts={self.experts}")
        if self.moe_layers is not None:
            m = self.moe_layers
            if list(m) != sorted(set(m)) or (m and not 0 <= m[0] <= m[-1] < self.layers):
                raise ConfigError(f"transformer: moe_layers must be increasing block indices in "
                                  f"[0, {self.layers}), got {list(m)}")
        c = self.capacity_factor
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not np.isfinite(c) or c <= 0):
            fail("capacity_factor", "a positive number or None")
        if self.kv_lora_rank == 0 and (self.q_lora_rank or self.rope_head_dim):
            raise ConfigError("transformer: q_lora_rank and rope_head_dim need multi-head latent attention "
                              "(kv_lora_rank > 0)")
        if self.kv_lora_rank and self.rope_head_dim >= self.dh:
            raise ConfigError(f"transformer: rope_head_dim={self.rope_head_dim} must be below "
                              f"head_dim={self.dh}")

    # -- resolved dimensions (the field, or its GPT default) ----------------------------------------
    @property
    def kv(self) -> int:
        """Key/value heads ``a_kv``."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def dh(self) -> int:
        """Query/key dimension per head ``d_h``."""
        return self.hidden // self.heads if self.head_dim is None else self.head_dim

    @property
    def dv(self) -> int:
        """Value dimension per head ``d_v``."""
        return self.dh if self.v_head_dim is None else self.v_head_dim

    @property
    def ffn(self) -> float:
        """FFN width ``F`` of a dense block."""
        return self.ffn_multiplier * self.hidden if self.ffn_hidden is None else self.ffn_hidden

    @property
    def expert_ffn(self) -> float:
        """FFN width ``F_e`` of one expert."""
        return self.ffn if self.moe_ffn_hidden is None else self.moe_ffn_hidden

    def moe_blocks(self) -> tuple[int, ...]:
        """Indices of the MoE blocks (none for a dense model)."""
        if self.experts == 1:
            return ()
        return tuple(range(self.layers)) if self.moe_layers is None else self.moe_layers

    # -- totals -------------------------------------------------------------------------------------
    def parameters(self) -> float:
        """Unique parameters (a tied head counted once): the model card's "total parameters"."""
        c = layer_costs(self)
        return float(c.parameters.sum() - c.shared_parameters)

    def active_parameters(self) -> float:
        """Parameters one token passes through: ``parameters()`` less the ``E - k`` routed experts
        it skips in every MoE block (the model card's "active" or "activated" parameters)."""
        idle = (self.experts - self.experts_per_token) * _block(self, True)["expert"]
        return self.parameters() - len(self.moe_blocks()) * idle

    def model_flops(self) -> float:
        """FLOPs of one microbatch's forward and backward as the model defines them, without
        recomputation (full, selective or flash attention's): the numerator of model FLOPs
        utilisation (Chowdhery et al., "PaLM", 2022, Appendix B; Korthikanti et al. 2022, §6.3)."""
        c = layer_costs(dataclasses.replace(self, recompute="none", flash_attention=False))
        return float(c.forward.sum() + c.input_grad.sum() + c.weight.sum())

    @classmethod
    def from_hf_config(cls, config: Any, **overrides: Any) -> Transformer:
        """A ``Transformer`` from a Hugging Face ``config.json`` (a path or the parsed mapping).

        Reads Llama 2/3, Mistral, Mixtral, Qwen2/2.5, Qwen2-MoE, Qwen3, Qwen3-MoE and DeepSeek-V3
        configs (details and approximations: ``diffpipe._model._hf``); ``sequence`` defaults to the
        config's ``max_position_embeddings``; ``overrides`` set any other field (``sequence=8192``,
        ``microbatch_size=2``, ``recompute="selective"``, ...). No network access.
        """
        return cls(**{**transformer_fields(config), **overrides})


class LayerCosts(eqx.Module):
    """Per-layer costs of one microbatch, over ``[embedding, block 0, ..., block l-1, head]``.

    Attributes (numpy float64 arrays ``[l + 2]``):
        forward: forward FLOPs ``F``.
        input_grad: input-gradient FLOPs ``I`` (including the recomputed forward, if any).
        weight: weight-gradient FLOPs ``W`` (a full backward is ``I + W``).
        parameters: parameters held by the stage that holds the layer (the head counts its copy
            of a tied embedding: see ``shared_parameters``).
        static_bytes: ``parameters x bytes_per_parameter`` (weights, gradients, optimizer state).
        gradient_bytes: ``parameters x reduce_bytes``: what a data-parallel all-reduce moves.
        activation_bytes: bytes stored from the layer's forward until its backward.
        output_bytes: the activation sent to the next layer (the gradient sent back is the same
            size); 0 after the head.
        shared_parameters: parameters of the head that duplicate the embedding (``V h`` when
            tied, else 0): subtract them when the embedding and head share a stage.
        forward_bytes, input_grad_bytes, weight_bytes: bytes the kernels of ``F``, ``I``, ``W``
            read and write in device memory (``memory_traffic``); None: not counted (no memory roof).
        tokens: rows of the layer's matmuls, the ``T`` of the kernel-efficiency curve
            (``memory_traffic``); None: the curve's maximum.

    A tensor-parallel shard divides the FLOPs and the traffic by ``t`` and keeps ``tokens`` (a
    column- or row-parallel matmul has as many rows as the whole one).
    """

    forward: Float[np.ndarray, " layers"]
    input_grad: Float[np.ndarray, " layers"]
    weight: Float[np.ndarray, " layers"]
    parameters: Float[np.ndarray, " layers"]
    static_bytes: Float[np.ndarray, " layers"]
    gradient_bytes: Float[np.ndarray, " layers"]
    activation_bytes: Float[np.ndarray, " layers"]
    output_bytes: Float[np.ndarray, " layers"]
    shared_parameters: float = eqx.field(static=True, default=0.0)
    forward_bytes: Float[np.ndarray, " layers"] | None = None
    input_grad_bytes: Float[np.ndarray, " layers"] | None = None
    weight_bytes: Float[np.ndarray, " layers"] | None = None
    tokens: Float[np.ndarray, " layers"] | None = None

    def times(self, device: Device) -> tuple[Array, Array, Array]:
        """Per-layer seconds ``(F, I, W)`` on ``device``: the roofline of each op,
        ``max(FLOPs / (peak x efficiency(tokens)), bytes / memory_bandwidth)`` (``Device.seconds``)."""
        return (device.seconds(self.forward, self.forward_bytes, self.tokens),
                device.seconds(self.input_grad, self.input_grad_bytes, self.tokens),
                device.seconds(self.weight, self.weight_bytes, self.tokens))


def _mlp(model: Transformer, width: float) -> tuple[float, float]:
    """(weight-matrix parameters, bias parameters) of one FFN of ``width``: GeLU ``2 h F`` (+ ``F + h``),
    SwiGLU ``3 h F`` (+ ``2F + h``)."""
    h = float(model.hidden)
    matrices = 2 if model.activation == "gelu" else 3
    return matrices * h * width, ((matrices - 1) * width + h if model.bias else 0.0)


def _norm(model: Transformer, width: float) -> float:
    return (2.0 if model.norm == "layernorm" else 1.0) * width


def _attention_parameters(model: Transformer) -> tuple[float, float]:
    """(weight-matrix parameters, other parameters: biases and norms) of one attention layer.

    Multi-head/grouped-query: ``Q`` ``h a d_h``, ``K`` ``h a_kv d_h``, ``V`` ``h a_kv d_v``, output
    ``a d_v h``. Latent (DeepSeek-V2 §2.1): ``Q`` = ``h r_q + r_q a d_h`` (or ``h a d_h`` when
    ``r_q = 0``), ``KV`` = ``h (r_kv + d_r) + r_kv a (d_h - d_r + d_v)``, output ``a d_v h``, and
    RMSNorms of the two latents.
    """
    h, a, kv, dh, dv = (float(x) for x in (model.hidden, model.heads, model.kv, model.dh, model.dv))
    output = a * dv * h
    if model.kv_lora_rank:
        rq, rkv, dr = (float(x) for x in (model.q_lora_rank, model.kv_lora_rank, model.rope_head_dim))
        query = h * rq + rq * a * dh if rq else h * a * dh
        matrices = query + h * (rkv + dr) + rkv * a * (dh - dr + dv) + output
        return matrices, rq + rkv  # the latents' RMSNorm scales; DeepSeek's projections have no biases
    matrices = h * a * dh + h * kv * (dh + dv) + output
    qkv_bias = model.bias if model.qkv_bias is None else model.qkv_bias
    other = (a * dh + kv * (dh + dv) if qkv_bias else 0.0) + (h if model.bias else 0.0)
    return matrices, other + (2 * dh if model.qk_norm else 0.0)


def _block(model: Transformer, moe: bool) -> dict[str, float]:
    """Per-token weights and parameters of one block (dense or MoE).

    ``weights``: weight-matrix parameters a token passes through (its matmul FLOPs are ``2 weights``
    per token per pass; routed experts scale by the capacity factor); ``parameters``: all of the
    block's parameters (every expert); ``expert``: one routed expert's parameters.
    """
    h = float(model.hidden)
    attention, attention_other = _attention_parameters(model)
    norms = 2 * _norm(model, h)
    if not moe:
        mlp, mlp_bias = _mlp(model, model.ffn)
        return dict(weights=attention + mlp, parameters=attention + attention_other + norms + mlp + mlp_bias,
                    expert=0.0)
    e, k, shared = float(model.experts), float(model.experts_per_token), float(model.shared_experts)
    expert_w, expert_b = _mlp(model, model.expert_ffn)
    router = e * h
    routed = k * expert_w * (1.0 if model.capacity_factor is None else float(model.capacity_factor))
    return dict(weights=attention + router + routed + shared * expert_w,
                parameters=attention + attention_other + norms + router + (e + shared) * (expert_w + expert_b),
                expert=expert_w + expert_b)


def _attention_core(model: Transformer) -> tuple[float, float]:
    """Forward FLOPs per sample of ``Q K^T`` and of ``P V``: ``2 s^2 a d_h`` and ``2 s^2 a d_v``."""
    s, a = float(model.sequence), float(model.heads)
    return 2 * s * s * a * model.dh, 2 * s * s * a * model.dv


@memoized(CACHED)
def activation_bytes(model: Transformer, *, tensor: int = 1, sequence_parallel: bool = False) -> np.ndarray:
    """Bytes each row of ``layer_costs(model)`` stores from its forward until its backward, per device
    of a tensor-parallel group of ``tensor`` (Korthikanti et al. 2022, §4 and Table 2).

    Every tensor a backward op reads is stored once, in ``d`` bytes (dropout masks 1 byte, fp32
    logits, flash-attention statistics and router probabilities 4). Per token of a block:

    - *replicated* across the tensor group (divided by ``t`` only with sequence parallelism, §4.2.2):
      the inputs of both norms and of the attention and MLP input projections, ``4 d h``, the two
      dropout masks ``2 h`` (GPT: ``10 h``), and MLA's latents ``d (2 r_q + 2 r_kv + d_r)``;
    - *sharded* by ``t`` (between a column- and a row-parallel linear): ``Q`` and ``K`` ``d (a d_h + a_kv
      d_h)``, ``V`` ``d a_kv d_v``, the output projection's input ``d a d_v`` (MLA: ``K``, ``V`` per head),
      the MLP interior ``2 d F`` (GeLU input and output) or ``3 d F`` (SwiGLU gate, up and product,
      as Megatron's fused SwiGLU keeps them); a MoE block's shared experts, the ``k`` (times the
      capacity factor) routed copies of the token with their interiors and outputs ``d (2h + 3F_e)``
      each (SwiGLU), and ``4 E`` bytes of router probabilities (GPT: ``24 h``);
    - the attention core, per token and head, sharded: ``s (2d + 1)`` (softmax output, dropout mask
      and output; ``d s`` without dropout), or ``4`` (the log-sum-exp) with flash attention; nothing
      with selective recomputation (recomputed from ``Q, K, V``).

    With full recomputation a block stores its input only, ``d h`` per token (``/ t`` with sequence
    parallelism). The embedding stores its dropout mask (``h`` per token, if dropout); the head the
    inputs of the final norm and of the projection ``2 d h`` and the logits ``4 V`` (sharded by the
    vocabulary-parallel head). GPT: ``s b h (34 + 5 a s / h)`` per block. ``tensor`` is taken to
    divide ``heads`` and ``kv_heads`` (Megatron-LM replicates key/value heads when ``t > a_kv``; not
    modelled here) and expert interiors to shard like the dense MLP.
    """
    if not is_positive_int(tensor):
        raise ConfigError(f"activation_bytes: tensor must be a positive int, got {tensor!r}")
    t = float(tensor)
    rep = 1 / t if sequence_parallel else 1.0
    tokens = float(model.microbatch_size * model.sequence)
    h, d, a, s = float(model.hidden), float(model.dtype_bytes), float(model.heads), float(model.sequence)
    kv, dh, dv = float(model.kv), float(model.dh), float(model.dv)
    mask = _MASK_BYTES if model.dropout else 0.0

    def block(moe: bool) -> float:
        if model.recompute == "full":
            return d * h * rep
        replicated = 4 * d * h + 2 * mask * h
        if model.kv_lora_rank:
            replicated += d * (2 * model.q_lora_rank + 2 * model.kv_lora_rank + model.rope_head_dim)
            sharded = d * a * (dh + dh + dv + dv)
        else:
            sharded = d * (a * dh + kv * dh + kv * dv + a * dv)
        interior = (2 if model.activation == "gelu" else 3) * d
        if moe:
            routed = model.experts_per_token * (1.0 if model.capacity_factor is None else model.capacity_factor)
            sharded += model.shared_experts * interior * model.expert_ffn
            sharded += routed * (2 * d * h + interior * model.expert_ffn) + _STAT_BYTES * model.experts
        else:
            sharded += interior * model.ffn
        if model.recompute == "selective":
            core = 0.0
        elif model.flash_attention:
            core = _STAT_BYTES * a
        else:
            core = a * s * (2 * d + mask if model.dropout else d)
        return replicated * rep + (sharded + core) / t

    moe = set(model.moe_blocks())
    blocks = [block(i in moe) for i in range(model.layers)]
    head = 2 * d * h * rep + _LOGIT_BYTES * model.vocabulary / t
    return tokens * np.asarray([mask * h * rep, *blocks, head], dtype=np.float64)


def _block_matmuls(model: Transformer, moe: bool) -> list[tuple[float, float, float, float]]:
    """The weight matmuls of one block per sample: ``(rows, K, N, count)``, rows per sample
    (``s``, or ``k c s / E`` for a routed expert), ``X[rows, K] @ W[K, N]``. Megatron-LM fuses
    the ``Q, K, V`` projections into one matmul and SwiGLU's gate and up projections into another.
    Their FLOPs, ``2 rows K N count``, sum to ``2 s P_w`` (``_block``)."""
    s, h = float(model.sequence), float(model.hidden)
    a, kv, dh, dv = (float(x) for x in (model.heads, model.kv, model.dh, model.dv))
    out = [(s, a * dv, h, 1.0)]
    if model.kv_lora_rank:
        rq, rkv, dr = (float(x) for x in (model.q_lora_rank, model.kv_lora_rank, model.rope_head_dim))
        out += [(s, h, rq, 1.0), (s, rq, a * dh, 1.0)] if rq else [(s, h, a * dh, 1.0)]
        out += [(s, h, rkv + dr, 1.0), (s, rkv, a * (dh - dr + dv), 1.0)]
    else:
        out.append((s, h, a * dh + kv * (dh + dv), 1.0))

    def mlp(rows: float, width: float, count: float) -> list[tuple[float, float, float, float]]:
        up = width if model.activation == "gelu" else 2 * width
        return [(rows, h, up, count), (rows, width, h, count)]

    if not moe:
        return out + mlp(s, model.ffn, 1.0)
    e, k = float(model.experts), float(model.experts_per_token)
    c = 1.0 if model.capacity_factor is None else float(model.capacity_factor)
    out.append((s, h, e, 1.0))  # the router
    if model.shared_experts:
        out += mlp(s, model.expert_ffn, float(model.shared_experts))
    return out + mlp(k * c * s / e, model.expert_ffn, e)


def parameter_tensors(model: Transformer) -> list[np.ndarray]:
    """The elements of each parameter tensor of each row of ``layer_costs(model)`` (embedding, blocks, head),
    unsharded: what an optimizer that loops over parameters (``Framework.optimizer_ops``) visits on every rank
    (FSDP with ``use_orig_params`` keeps the original parameters, each rank a shard of each). A block: one weight
    ``K x N`` per matrix of ``_block_matmuls`` (each expert its own) and with ``model.bias`` its bias ``N``, a
    scale ``h`` per norm (and a bias for a LayerNorm with ``model.bias``), with ``qk_norm`` two of ``d_h``; the
    embedding: the word table ``V x h`` and, if learned, the position table ``s x h``; the head: the final norm
    and, if not tied, its own ``V x h``."""
    h, V = float(model.hidden), float(model.vocabulary)
    norm = [h, h] if model.norm == "layernorm" and model.bias else [h]
    moe = set(model.moe_blocks())
    out = [np.asarray([V * h] + ([float(model.sequence) * h] if model.positions == "learned" else []))]
    for i in range(model.layers):
        block: list[float] = []
        for _, k, n, count in _block_matmuls(model, i in moe):
            block += [k * n] * int(count) + ([n] * int(count) if model.bias else [])
        block += 2 * norm + ([float(model.dh)] * 2 if model.qk_norm else [])
        out.append(np.asarray(block))
    out.append(np.asarray(norm + ([] if model.tied_embedding else [V * h])))
    return out


def early_stop_skips(model: Transformer, moe: bool) -> bool:
    """Whether the recomputation of a block (MoE or not) stops before its MLP's output projection
    (``Transformer.recompute_early_stop``): full recomputation, early stop, a dense block, no dropout."""
    return model.recompute == "full" and model.recompute_early_stop and not moe and not model.dropout


def memory_traffic(model: Transformer) -> dict[str, np.ndarray]:
    """Bytes each op's kernels move through device memory, and the rows of its matmuls, for each
    row of ``layer_costs(model)``: ``{"forward", "input_grad", "weight", "tokens"}`` (``[l + 2]``).

    Counting rule (the roofline model's DRAM traffic, Williams et al. CACM 2009, with the usual
    per-matmul count): a matmul ``X[M, K] @ W[K, N]`` reads both operands and writes its result
    once, ``(M K + K N + M N) d`` bytes; so do its two gradients (``dX = dY W^T`` and
    ``dW = X^T dY`` move the same three sizes), so a block's weight matmuls move the same bytes in
    ``F``, ``I`` and ``W``: its weights once and ``T (K + N)`` activations per matmul (``T = b s``
    rows; a routed expert ``k c T / E``). The attention core (``Q K^T`` writing the ``s x s``
    scores, ``P V`` reading the probabilities) moves ``d (2 b a s^2 + T (a d_h + a_kv d_h + a_kv d_v
    + a d_v))`` in the forward; flash attention (one fused kernel, Dao et al. 2022) only its inputs
    and output, ``d T (a d_h + a_kv d_h + a_kv d_v + a d_v)``; the backward's four gradient matmuls (or
    flash attention's backward kernel reading ``Q, K, V, O, dO`` and writing ``dQ, dK, dV``) twice
    that, in ``I``. Recomputation adds its forward's bytes to ``I`` (full: the block's; selective:
    the core's). The embedding's gather reads and writes ``T`` rows of ``h`` (``+ T h`` read for
    learned positions) in ``F``, and its scatter-add the same in ``W``; the head is the ``h x V``
    logit matmul. Elementwise kernels (norms, activations, softmax, dropout, residual adds) are
    counted neither in FLOPs nor in bytes; weight gradients are written once in ``d`` bytes (an
    fp32 gradient accumulation moves more).

    ``tokens``: the ``T`` at which ``Device.kernel_efficiency`` is evaluated: ``b s``, or for a MoE
    block the FLOP-weighted harmonic mean of its matmuls' rows, ``sum f / sum (f / rows)`` (exact
    for a curve linear in ``1 / T``; for the routed experts' few rows an approximation).
    """
    b, s, h, V = (float(x) for x in (model.microbatch_size, model.sequence, model.hidden, model.vocabulary))
    d, tokens = float(model.dtype_bytes), b * s
    a, dh, dv = float(model.heads), float(model.dh), float(model.dv)
    kv = a if model.kv_lora_rank else float(model.kv)  # MLA decompresses K and V per head
    qkvo = a * dh + kv * dh + kv * dv + a * dv
    core = d * tokens * qkvo + (0.0 if model.flash_attention else 2 * d * b * a * s * s)
    core_flops = b * sum(_attention_core(model))
    moe = set(model.moe_blocks())
    forward, input_grad, weight, rows = [], [], [], []
    for i in range(model.layers):
        matmuls = _block_matmuls(model, i in moe)
        gemm = sum(c * d * (b * r * k + k * n + b * r * n) for r, k, n, c in matmuls)
        flops = [2 * b * r * k * n * c for r, k, n, c in matmuls]
        f = gemm + core
        forward.append(f)
        weight.append(gemm)
        r, k, n, c = matmuls[-1]  # the MLP's output projection, not recomputed after an early stop
        redo = f - (c * d * (b * r * k + k * n + b * r * n) if early_stop_skips(model, i in moe) else 0.0)
        input_grad.append(gemm + 2 * core + {"none": 0.0, "selective": core, "full": redo}[model.recompute])
        inverse = sum(x / (b * r) for x, (r, _, _, _) in zip(flops, matmuls)) + core_flops / tokens
        rows.append((sum(flops) + core_flops) / inverse)
    gather = (3.0 if model.positions == "learned" else 2.0) * d * tokens * h
    head = d * (tokens * h + h * V + tokens * V)

    def row(first: float, blocks: list[float], last: float) -> np.ndarray:
        return np.asarray([first, *blocks, last], dtype=np.float64)

    return dict(forward=row(gather, forward, head), input_grad=row(0.0, input_grad, head),
                weight=row(gather, weight, head), tokens=row(tokens, rows, tokens))


@memoized(CACHED)
def layer_costs(model: Transformer) -> LayerCosts:
    """The per-layer table of ``model`` for one microbatch (formulas and sources: module docstring).

    Per transformer block, ``M = 2 b s P_w`` (``P_w``: weight matrices a token passes through) and
    ``A = A_qk + A_pv = 2 b s^2 a (d_h + d_v)``:
        ``F = M + A``; ``I = M + 2A`` (``+ M + A`` with full, ``+ A`` with selective recomputation,
        ``+ A_qk`` with flash attention); ``W = M``.
    GPT (``f = 4``, ``d = 2``): ``F = 24 b s h^2 + 4 b s^2 h``, parameters ``12 h^2 + 13 h``, activations
    ``s b h (34 + 5 a s / h)`` (``activation_bytes``), output ``d s b h``.
    Embedding: no FLOPs (a gather), ``V h`` parameters (``+ s h`` learned positions), its dropout
    mask. Head: ``F = I = W = 2 b s h V``; ``V h`` parameters (a copy of the word embedding when
    tied) and the final norm. Bytes moved and matmul rows per op: ``memory_traffic``.
    """
    if not isinstance(model, Transformer):
        raise ConfigError(f"layer_costs expects a Transformer, got {type(model).__name__}")
    b, s, h, V = (float(x) for x in (model.microbatch_size, model.sequence, model.hidden, model.vocabulary))
    d = float(model.dtype_bytes)
    qk, pv = _attention_core(model)
    core = b * (qk + pv)
    extra = {"none": 0.0, "selective": core, "full": None}[model.recompute]
    flash = b * qk if model.flash_attention else 0.0
    moe = set(model.moe_blocks())
    rows = [_block(model, i in moe) for i in range(model.layers)]
    matmul = np.asarray([2 * b * s * r["weights"] for r in rows])
    forward = matmul + core
    skipped = np.asarray([2 * b * r * k * n * c if early_stop_skips(model, i in moe) else 0.0
                          for i in range(model.layers) for r, k, n, c in _block_matmuls(model, i in moe)[-1:]])
    input_grad = matmul + 2 * core + flash + (forward - skipped if extra is None else extra)
    logits = 2 * b * s * h * V
    embedding = (V + (s if model.positions == "learned" else 0.0)) * h

    def row(first: float, blocks: Any, last: float) -> np.ndarray:
        return np.concatenate([[first], np.broadcast_to(blocks, (model.layers,)), [last]]).astype(np.float64)

    parameters = row(embedding, [r["parameters"] for r in rows], V * h + _norm(model, h))
    traffic = memory_traffic(model)
    return LayerCosts(
        forward=row(0.0, forward, logits),
        input_grad=row(0.0, input_grad, logits),
        weight=row(0.0, matmul, logits),
        parameters=parameters,
        static_bytes=parameters * model.bytes_per_parameter,
        gradient_bytes=parameters * float(model.reduction_bytes),
        activation_bytes=activation_bytes(model),
        output_bytes=row(d * s * b * h, d * s * b * h, 0.0),
        shared_parameters=V * h if model.tied_embedding else 0.0,
        forward_bytes=traffic["forward"],
        input_grad_bytes=traffic["input_grad"],
        weight_bytes=traffic["weight"],
        tokens=traffic["tokens"],
    )


def stage_of_layers(
    model: Transformer, stages: int | None = None, layers_per_stage: Sequence[int] | None = None
) -> np.ndarray:
    """The stage of every row of ``layer_costs(model)``: consecutive layers form a stage.

    Give exactly one of ``stages`` (blocks split as evenly as possible, the first
    ``layers % stages`` stages taking one more: the last stage already carries the LM head) or
    ``layers_per_stage`` (blocks per stage, summing to ``model.layers``; the first or last entry
    may be 0, leaving the embedding or the head alone on its stage). The embedding always joins
    stage 0 and the head the last stage.
    """
    if (stages is None) == (layers_per_stage is None):
        raise ConfigError("from_model: give exactly one of stages= or layers_per_stage=")
    if stages is not None:
        if not is_positive_int(stages):
            raise ConfigError(f"from_model: stages must be a positive int, got {stages!r}")
        if stages > model.layers:
            raise ConfigError(f"from_model: stages={stages} exceeds the model's {model.layers} layers")
        counts = list(uniform_partition(model.layers, int(stages)))
    else:
        try:
            counts = [operator.index(c) for c in layers_per_stage]
        except TypeError:
            raise ConfigError(f"from_model: layers_per_stage must be a sequence of ints, got "
                              f"{layers_per_stage!r}") from None
        n = len(counts)
        if n == 0 or any(c < 0 for c in counts) or any(c == 0 for c in counts[1:-1]):
            raise ConfigError(f"from_model: layers_per_stage {counts} needs at least one layer per middle "
                              "stage and none negative")
        if sum(counts) != model.layers:
            raise ConfigError(f"from_model: layers_per_stage {counts} sums to {sum(counts)}, the model has "
                              f"{model.layers} layers")
    n = len(counts)
    return np.concatenate([[0], np.repeat(np.arange(n), counts), [n - 1]]).astype(np.int64)

