"""Each layer op (``F``, ``I``, ``W``) as the list of kernels a GPU runs, with shapes after tensor and
expert sharding, and their times on a device with a ``KernelModel`` (``diffpipe._machine._kernels``).

Rows are those of ``layer_costs`` (embedding, blocks, head); kinds ``F``, ``I``, ``W`` (0, 1, 2).
Three kernel classes (notation of ``diffpipe._model._transformer``; ``T = b s`` tokens, ``t`` the
tensor size, ``rep = 1/t`` with sequence parallelism else 1):

- **GEMMs** ``(M, N, K, batch)``: each weight matmul ``X[T, K] W[K, N]`` of ``_block_matmuls``; a
  column-parallel matrix (its input is the hidden state: ``QKV``, MLP up/gate, MLA's projections
  from ``h``) shards ``N`` by ``t``, a row-parallel one (attention output, MLP down, MLA's
  up-projections) shards ``K`` (Shoeybi et al. 2019). ``F`` runs ``(T, N, K)``; ``I`` the input
  gradient ``dX = dY W^T``, ``(T, K, N)``; ``W`` the weight gradient ``dW = X^T dY``, ``(K, N, T)``.
  Routed experts: ``E / e`` experts per device of ``k c T e / E`` rows each (balanced routing); with
  an expert tensor size ``e_t`` other than ``t`` (Megatron-LM ``--expert-tensor-parallel-size``),
  ``k c T e e_t / (t E)`` rows of matrices split by ``e_t`` (the same FLOPs per device). The
  head's logit matmul is vocabulary-parallel (``N = V / t``). Unfused attention runs ``Q K^T`` and
  ``P V`` as batched GEMMs of ``b a / t`` heads (and four in its backward).
- **Attention** (``flash_attention``): one fused kernel per pass, causal: ``2 b (a/t) s^2 (d_h + d_v)
  / 2`` FLOPs executed in the forward, ``2.5x`` that in the backward (Dao, "FlashAttention-2",
  2023: the backward's five matmuls against the forward's two; the causal mask skips half the
  blocks). ``layer_costs`` counts the attention FLOPs without the causal halving, as Megatron-LM
  does; the kernels run the halved work.
- **Memory-bound** kernels by their bytes (read + written once, in ``d``-byte elements unless
  stated): the two norms ``2 d h T rep`` each (backward ``3 d h T rep``: reads ``x``, ``dy``, writes
  ``dx``); the two bias-dropout-add kernels ``(3d + 1) h T rep`` (``3 d`` without dropout; backward
  ``(2d + 1)``); the activation ``2 d F T / t`` (GeLU) or ``3 d F T / t`` (SwiGLU; backward ``3 d`` and
  ``5 d``); rotary embedding of ``Q, K`` ``2 d (a + a_kv) d_h T / t`` each way; unfused attention's
  softmax ``2 d`` and dropout ``2 d + 1`` per score (``b a s^2 / t`` scores; backward ``3 d`` and
  ``2d + 1``); the MoE token permutation and its inverse ``2 d k' T h / (t if SP)`` each; the
  embedding's gather (and scatter-add); the vocabulary-parallel cross-entropy over fp32 logits as
  Megatron-LM runs it, six passes forward (``(d + 36) V T / t`` bytes: upcast, max, subtract, exp,
  sum, normalise) and two backward (``(d + 12) V T / t``: scale, downcast; ``_cross_entropy_passes``);
  the fp32 gradient accumulation of every weight (Megatron-LM's ``main_grad``: read and write 4 bytes
  per weight per microbatch) in ``W``. With ``Transformer.eager_blocks`` (eager PyTorch modules,
  llm-foundry's MPT) the backward (``I``) also runs PyTorch's LayerNorm weight-gradient kernel, which
  reads ``x`` and ``dy`` again, ``2 d h T rep`` per LayerNorm (the block's two and the final one), and the
  concatenation of ``dq, dk, dv`` that the backward of the fused ``Wqkv`` output's split is,
  ``2 d (a d_h + a_kv (d_h + d_v)) T / t`` (``_eager_backward``). With ``Transformer.flat_gradients``
  (PyTorch FSDP's flat parameters) the weight gradients' memory-bound work in ``W`` is FSDP's in place of
  the fp32 accumulation: the concatenation into the flat gradient (``2 d``), its cast to the reduce dtype
  (``d + r`` where ``r != d``) and the in-place pre-divide (``2 r``) per weight per microbatch
  (``_gradient_bytes``).
- With ``Transformer.unpadded_attention`` (llm-foundry's ``attn_impl: flash``) the fused attention's forward
  (recomputed with it) also runs flash-attn's ``unpad_input`` on each of ``q``, ``k``, ``v`` (five small kernels
  over the mask and a gather of ``2 d x T`` bytes, ``x`` its elements per token) and ``pad_input`` on the output
  (``3 d x_o T``), and its backward the gather of the output's gradient (``2 d x_o T``) and a zero-fill and scatter
  per input gradient (``3 d x T``), each index read once (``8 T``; ``_unpad_forward``, ``_unpad_backward``).
- Fused attention runs at the device's FlashAttention-2 curve; ``flash_version=3`` (the architecture's own
  kernels: cuDNN's fused flash attention, FlashAttention-3) times the device's ``KernelModel.attention_native``,
  ``flash_version=1`` (FlashAttention-1, the Triton kernels of its time) times its ``attention_older``.
- Recomputation re-runs kernels in ``I``: full, the block's whole forward list; selective, the
  attention core's (Korthikanti et al. 2022, §4.2). With ``Transformer.recompute_early_stop`` (PyTorch's
  non-reentrant checkpoint) a dense block without dropout leaves out its MLP output projection's GEMM
  and the residual add after it (``early_stop_skips``).

A kernel's time (``KernelModel``): a fixed overhead each plus the roofline with a shape-dependent
efficiency. ``kernel_times`` returns it per class, so ``Configuration.evaluate`` can report where a
step's compute goes. A hook for op-time jitter (per-kind coefficients of variation, a later issue)
belongs on top of these per-op seconds, not inside them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from jaxtyping import Array

from .._arrays import array_module, divide, on_host, scatter_add
from .._caches import memoized
from .._errors import ConfigError
from .._machine._device import Device
from .._machine._kernels import KERNEL_CLASSES
from ._transformer import _LOGIT_BYTES, CACHED, Transformer, _block_matmuls, early_stop_skips

_F, _I, _W = range(3)
#: fp32 gradient accumulation: read and write 4 bytes per weight per microbatch.
_GRAD_ACCUMULATION_BYTES = 8


def _gradient_bytes(model: Transformer) -> float:
    """Bytes of memory-bound work per weight per microbatch on its gradient after the weight-gradient GEMM:
    Megatron-LM's fp32 accumulation (``_GRAD_ACCUMULATION_BYTES``), or with ``model.flat_gradients`` PyTorch
    FSDP's: the concatenation into the flat gradient (read and write ``d``), the cast to the reduce dtype
    (read ``d``, write ``r``, where they differ) and the in-place pre-divide (read and write ``r``)."""
    if not model.flat_gradients:
        return float(_GRAD_ACCUMULATION_BYTES)
    d, r = float(model.dtype_bytes), float(model.reduction_bytes)
    return 2 * d + (d + r if r != d else 0.0) + 2 * r
#: Executed FLOPs of a causal fused attention over the non-causal count (half the score blocks).
_CAUSAL = 0.5
#: FlashAttention-2's backward runs 5 matmuls of the forward's size against the forward's 2.
_FLASH_BACKWARD = 2.5
#: Bytes per logit of each pass of the vocabulary-parallel cross-entropy over ``d``-byte logits, as
#: Megatron-LM runs it (``megatron/core/tensor_parallel/cross_entropy.py`` at d98e8a6), in fp32
#: (``L = 4``): forward ``.float()`` (read ``d``, write ``L``), the row max (read), subtract it in place
#: (read, write), ``exp`` in place, the row sum (read), divide by it in place (the softmax kept for the
#: backward); backward: scale by the incoming gradient in place, and the cast back to ``d`` bytes for
#: the logit matmul's backward (``.float()``'s gradient).
def _cross_entropy_passes(d: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    L = _LOGIT_BYTES
    return (d + L, L, 2 * L, 2 * L, L, 2 * L), (2 * L, L + d)


#: The generations (``Transformer.flash_version``) that run the device's architecture-specific kernel, at its
#: curve times ``KernelModel.attention_native``.
NATIVE = {3}
#: The generations that run the older kernel, at the device's curve times ``KernelModel.attention_older``.
OLDER = {1}


class Kernels(NamedTuple):
    """Kernels of one microbatch on one device (numpy float64 columns).

    Attributes:
        gemm: ``[n, 7]``: row, kind, M, N, K, batch, count (kernels of that shape).
        attention: ``[n, 7]``: row, kind, executed FLOPs, sequence, backward (0/1), older (0/1: at the
            device's ``attention_older``), native (0/1: at the device's ``attention_native``), per kernel; one
            kernel.
        memory: ``[n, 4]``: row, kind, bytes, count.
        rows: rows of the table (``layers + 2``).
    """

    gemm: np.ndarray
    attention: np.ndarray
    memory: np.ndarray
    rows: int

    def count(self) -> np.ndarray:
        """``[3, rows]`` kernels launched per op."""
        out = np.zeros((3, self.rows))
        for table, col in ((self.gemm, 6), (self.memory, 3)):
            np.add.at(out, (table[:, 1].astype(int), table[:, 0].astype(int)), table[:, col])
        np.add.at(out, (self.attention[:, 1].astype(int), self.attention[:, 0].astype(int)), 1.0)
        return out

    def gemm_flops(self) -> np.ndarray:
        """``[3, rows]`` FLOPs of the GEMMs (``2 M N K x batch x count``)."""
        g = self.gemm
        out = np.zeros((3, self.rows))
        np.add.at(out, (g[:, 1].astype(int), g[:, 0].astype(int)), 2 * g[:, 2] * g[:, 3] * g[:, 4] * g[:, 5] * g[:, 6])
        return out


class _Builder:
    def __init__(self) -> None:
        self.gemm: list[tuple[float, ...]] = []
        self.attention: list[tuple[float, ...]] = []
        self.memory: list[tuple[float, ...]] = []

    def mm(self, row: int, kind: int, m: float, n: float, k: float, batch: float = 1.0, count: float = 1.0) -> None:
        if m > 0 and n > 0 and k > 0 and count > 0:
            self.gemm.append((row, kind, m, n, k, batch, count))

    def weight(self, row: int, m: float, n: float, k: float, count: float, kinds: tuple[int, ...]) -> None:
        """The three GEMMs of one weight matmul ``X[m, k] W[k, n]`` (``F``, ``I``, ``W``) for ``kinds``."""
        shapes = {_F: (m, n, k), _I: (m, k, n), _W: (k, n, m)}
        for kind in kinds:
            self.mm(row, kind if kind != -1 else _I, *shapes[_F if kind == -1 else kind], count=count)

    def mem(self, row: int, kind: int, bytes: float, count: float = 1.0) -> None:
        if bytes > 0 and count > 0:
            self.memory.append((row, kind, bytes, count))

    def attn(self, row: int, kind: int, flops: float, sequence: float, backward: bool, older: bool,
             native: bool) -> None:
        self.attention.append((row, kind, flops, sequence, float(backward), float(older), float(native)))

    def build(self, rows: int) -> Kernels:
        def table(x: list, width: int) -> np.ndarray:
            return np.asarray(x, np.float64).reshape(-1, width)

        return Kernels(table(self.gemm, 7), table(self.attention, 7), table(self.memory, 4), rows)


@memoized(CACHED)
def layer_kernels(model: Transformer, *, tensor: int = 1, sequence_parallel: bool = False,
                  expert: int = 1, expert_tensor: int | None = None) -> Kernels:
    """The kernels of every op of every row of ``layer_costs(model)`` on one device of a tensor group
    of ``tensor`` (and an expert group of ``expert``, the routed experts' matrices split over
    ``expert_tensor`` ranks, default ``tensor``): the rules of the module docstring."""
    if not isinstance(model, Transformer):
        raise ConfigError(f"layer_kernels expects a Transformer, got {type(model).__name__}")
    t, e = float(tensor), float(expert)
    et = t if expert_tensor is None else float(expert_tensor)
    rep = 1 / t if sequence_parallel else 1.0
    b, s, h, V = (float(x) for x in (model.microbatch_size, model.sequence, model.hidden, model.vocabulary))
    d, T = float(model.dtype_bytes), b * s
    a, kv, dh, dv = float(model.heads), float(model.kv), float(model.dh), float(model.dv)
    if model.kv_lora_rank:
        kv = a  # MLA decompresses K and V per head
    heads = b * a / t  # attention (batch x heads) per device
    mask = 1.0 if model.dropout else 0.0
    older, native = model.flash_generation in OLDER, model.flash_generation in NATIVE
    moe = set(model.moe_blocks())
    rows = model.layers + 2
    out = _Builder()

    unpadded = _unpadded_elements(model, tensor=t) if model.unpadded_attention else None

    def attention_core(row: int, kinds_fwd: tuple[int, ...], backward: bool) -> None:
        """The attention core's forward (into each of ``kinds_fwd``) and, if ``backward``, its backward (``I``)."""
        for kind in kinds_fwd:
            if model.flash_attention:
                if unpadded is not None:
                    _unpad_forward(out, row, kind, unpadded, tokens=T, batch=b, dtype_bytes=d)
                out.attn(row, kind, _CAUSAL * 2 * heads * s * s * (dh + dv), s, False, older, native)
            else:
                out.mm(row, kind, s, s, dh, batch=heads)  # Q K^T
                out.mem(row, kind, 2 * d * heads * s * s)  # scale-mask-softmax
                out.mem(row, kind, (2 * d + 1) * heads * s * s * mask)  # attention dropout
                out.mm(row, kind, s, dv, s, batch=heads)  # P V
        if not backward:
            return
        if model.flash_attention:
            out.attn(row, _I, _FLASH_BACKWARD * _CAUSAL * 2 * heads * s * s * (dh + dv), s, True, older, native)
            if unpadded is not None:
                _unpad_backward(out, row, unpadded, tokens=T, dtype_bytes=d)
            return
        out.mm(row, _I, s, s, dv, batch=heads)  # dP = dO V^T
        out.mm(row, _I, s, dv, s, batch=heads)  # dV = P^T dO
        out.mem(row, _I, (2 * d + 1) * heads * s * s * mask)  # dropout backward
        out.mem(row, _I, 3 * d * heads * s * s)  # softmax backward
        out.mm(row, _I, s, dh, s, batch=heads)  # dQ = dS K
        out.mm(row, _I, s, dh, s, batch=heads)  # dK = dS^T Q

    def elementwise(row: int, kind: int, is_moe: bool, backward: bool, adds: int = 2) -> None:
        norm = (3 if backward else 2) * d * h * T * rep
        out.mem(row, kind, norm, 2)
        add = ((2 * d + mask) if backward else (3 * d + mask)) * h * T * rep
        out.mem(row, kind, add, adds)
        if model.positions == "rotary":
            out.mem(row, kind, 2 * d * (a + kv) * dh * T / t)
        if is_moe:
            routed = model.experts_per_token * (1.0 if model.capacity_factor is None else model.capacity_factor)
            widths = [(model.expert_ffn, routed * T), (model.expert_ffn, model.shared_experts * T)]
            out.mem(row, kind, 2 * d * routed * T * h / (t if sequence_parallel else 1.0), 2)  # permute, unpermute
        else:
            widths = [(model.ffn, T)]
        per = {("gelu", False): 2, ("gelu", True): 3, ("swiglu", False): 3, ("swiglu", True): 5}[
            (model.activation, backward)]
        for width, tokens in widths:
            out.mem(row, kind, per * d * width * tokens / t)

    for i in range(model.layers):
        row = 1 + i
        is_moe = i in moe
        weights = 0.0
        fwd_kinds = (_F,) + ((-1,) if model.recompute == "full" else ())
        stop = early_stop_skips(model, is_moe)  # the recompute ends before the MLP's output projection
        matmuls = _block_matmuls(model, is_moe)
        for j, (rows_per_sample, k, n, count) in enumerate(matmuls):
            m = rows_per_sample * b
            column = k == h
            shard = t
            if is_moe and count == float(model.experts) and model.experts > 1:
                # E / e experts per device, e e_t / t times the rows each (e: the all-to-all, e_t: the
                # expert tensor group's gather of the t-sharded tokens), the matrices split by e_t
                m, count, shard = (m * e if et == t else m * e * et / t), count / e, et
            n_, k_ = (n / shard, k) if column else (n, k / shard)
            kinds = (_F,) if stop and j == len(matmuls) - 1 else fwd_kinds
            out.weight(row, m, n_, k_, count, (*kinds, _I, _W))
            weights += n_ * k_ * count
        elementwise(row, _F, is_moe, False)
        if model.recompute == "full":
            elementwise(row, _I, is_moe, False, adds=1 if stop else 2)
        elementwise(row, _I, is_moe, True)
        if model.eager_blocks:
            _eager_backward(out, row, model, tensor=t, rep=rep, norms=2)
        core_fwd = (_F,) + ((_I,) if model.recompute in ("full", "selective") else ())
        attention_core(row, core_fwd, True)
        out.mem(row, _W, _gradient_bytes(model) * weights)

    # the embedding: gather (+ learned positions), dropout; its gradient's scatter-add and fp32 accumulation
    gather = (3.0 if model.positions == "learned" else 2.0) * d * T * h
    out.mem(0, _F, gather)
    out.mem(0, _F, (2 * d + 1) * T * h * rep * mask)
    out.mem(0, _W, gather)
    out.mem(0, _W, _gradient_bytes(model) * V * h / t)
    # the head: final norm, vocabulary-parallel logits, fp32 cross-entropy
    last = rows - 1
    out.mem(last, _F, 2 * d * h * T * rep)
    out.weight(last, T, V / t, h, 1.0, (_F, _I, _W))
    logits = V * T / t
    forward, backward = _cross_entropy_passes(d)
    for per_logit in forward:
        out.mem(last, _F, per_logit * logits)
    for per_logit in backward:
        out.mem(last, _I, per_logit * logits)
    out.mem(last, _I, 3 * d * h * T * rep)
    if model.eager_blocks:
        _eager_backward(out, last, model, tensor=t, rep=rep, norms=1, qkv=False)
    out.mem(last, _W, _gradient_bytes(model) * V * h / t)
    return out.build(rows)


def _eager_backward(out: _Builder, row: int, model: Transformer, *, tensor: float, rep: float, norms: int,
                    qkv: bool = True) -> None:
    """The backward kernels of eager PyTorch blocks (``Transformer.eager_blocks``) that fused frameworks do
    not run, into ``I`` of ``row``: PyTorch's LayerNorm weight gradient, a second kernel over ``x`` and ``dy``
    (``GammaBetaBackwardCUDAKernel`` in ``aten/src/ATen/native/cuda/layer_norm_kernel.cu``), for each of
    ``norms`` LayerNorms; and with ``qkv`` the ``at::cat`` of ``dq, dk, dv`` (``split_with_sizes_backward``)
    that the backward of splitting the fused ``Wqkv`` output is (``qkv.split`` in llm-foundry's
    ``llmfoundry/models/layers/attention.py`` at 5e85bd62d), each read and written once."""
    d, T, h = float(model.dtype_bytes), float(model.microbatch_size * model.sequence), float(model.hidden)
    if model.norm == "layernorm":
        out.mem(row, _I, 2 * d * h * T * rep, norms)
    if qkv and not model.kv_lora_rank:
        a, kv, dh, dv = float(model.heads), float(model.kv), float(model.dh), float(model.dv)
        out.mem(row, _I, 2 * d * (a * dh + kv * (dh + dv)) * T / tensor)


#: Bytes of an element of the tensors ``bert_padding.unpad_input`` makes from the mask: the ``int64`` token indices
#: (``torch.nonzero``) and the ``int32`` sequence lengths and their cumulative sum.
_INDEX_BYTES, _LENGTH_BYTES = 8, 4


def _unpadded_elements(model: Transformer, *, tensor: float) -> tuple[float, float, float, float]:
    """Elements per token of ``q``, ``k``, ``v`` and the attention output on one device of a tensor group of
    ``tensor`` (``model.unpadded_attention``): ``a d_h / t``, ``a_kv d_h / t``, ``a_kv d_v / t``, ``a d_v / t``."""
    a, kv, dh, dv = float(model.heads), float(model.kv), float(model.dh), float(model.dv)
    return a * dh / tensor, kv * dh / tensor, kv * dv / tensor, a * dv / tensor


def _unpad_forward(out: _Builder, row: int, kind: int, widths: tuple[float, ...], *, tokens: float, batch: float,
                   dtype_bytes: float) -> None:
    """The forward kernels around an unpadded fused attention (``Transformer.unpadded_attention``), each read and
    written once: for each of ``q``, ``k``, ``v``, flash-attn's ``unpad_input`` (``flash_attn/bert_padding.py`` at
    v2.4.2, called three times by llm-foundry's ``flash_attn_fn`` at 5e85bd62d) runs, over the ``[b, s]`` boolean
    mask, its sum per sequence (``int32``), ``torch.nonzero`` (the ``int64`` index of every kept token: all ``T`` of
    them), the lengths' max (``.item()``), their cumulative sum and its pad by one, then ``index_first_axis``'s
    ``torch.gather`` of the tensor's ``T`` rows (``d`` bytes an element, plus the index read once); after the
    kernel ``pad_input`` zero-fills the padded output and index-puts the rows back (``IndexPutFirstAxis``). Each
    op is counted as one kernel (PyTorch's ``nonzero`` and scans may launch more)."""
    d, T, b = dtype_bytes, tokens, batch
    q, k, v, o = widths
    for width in (q, k, v):
        out.mem(row, kind, T + _LENGTH_BYTES * b)  # attention_mask.sum(dim=-1, dtype=int32)
        out.mem(row, kind, T + _INDEX_BYTES * T)  # torch.nonzero(attention_mask.flatten())
        out.mem(row, kind, _LENGTH_BYTES * (b + 1))  # seqlens_in_batch.max()
        out.mem(row, kind, 2 * _LENGTH_BYTES * b)  # torch.cumsum(seqlens_in_batch)
        out.mem(row, kind, _LENGTH_BYTES * (2 * b + 1))  # F.pad(..., (1, 0))
        out.mem(row, kind, 2 * d * width * T + _INDEX_BYTES * T)  # torch.gather of the T rows
    out.mem(row, kind, d * o * T)  # torch.zeros of the padded output
    out.mem(row, kind, 2 * d * o * T + _INDEX_BYTES * T)  # output[indices] = values


def _unpad_backward(out: _Builder, row: int, widths: tuple[float, ...], *, tokens: float,
                    dtype_bytes: float) -> None:
    """The backward kernels around an unpadded fused attention (``Transformer.unpadded_attention``; ``bert_padding.py``
    at flash-attn v2.4.2), into ``I``: ``IndexPutFirstAxis.backward`` gathers the output's gradient
    (``grad_output[indices]``), and ``IndexFirstAxis.backward`` of each of ``q``, ``k``, ``v`` zero-fills a padded
    gradient (``torch.zeros``) and scatters the unpadded one into it (``scatter_``)."""
    d, T = dtype_bytes, tokens
    q, k, v, o = widths
    out.mem(row, _I, 2 * d * o * T + _INDEX_BYTES * T)  # grad_output[indices]
    for width in (q, k, v):
        out.mem(row, _I, d * width * T)  # torch.zeros
        out.mem(row, _I, 2 * d * width * T + _INDEX_BYTES * T)  # scatter_


def kernel_times(kernels: Kernels, device: Device, dtype_bytes: float = 2.0) -> dict[str, Array]:
    """``{class: [3, rows]}`` seconds of ``kernels`` on ``device`` (which needs a ``KernelModel``),
    classes ``KERNEL_CLASSES``: GEMM, attention and memory-bound time without the per-kernel
    overhead, and ``launch``, the overheads. Differentiable in the device's floats (jax.numpy when
    they are tracers); for a concrete device, NumPy float arrays of the same bits, computed without
    compiling a program (``on_host``)."""
    if device.kernels is None:
        raise ConfigError(f"kernel_times: device {device.name!r} has no kernel model (KernelModel)")
    device = on_host(device)
    km = device.kernels
    xp = array_module(device)
    peak, bandwidth = device.peak_flops, device.memory_bandwidth * km.memory_efficiency
    dtype = km.k_half.dtype
    out = {c: xp.zeros((3, kernels.rows), dtype) for c in KERNEL_CLASSES}

    def scatter(cls: str, table: np.ndarray, seconds: Array) -> None:
        if len(table):
            out[cls] = scatter_add(out[cls], (table[:, 1].astype(int), table[:, 0].astype(int)), seconds)

    g = kernels.gemm
    if len(g):
        m, n, k, batch, count = (g[:, c] for c in range(2, 7))
        flops = xp.asarray(2 * m * n * k * batch, dtype)
        traffic = xp.asarray(dtype_bytes * batch * (m * k + k * n + m * n), dtype)
        seconds = xp.maximum(flops / km.gemm_rate(peak, m, n, k), divide(traffic, bandwidth))
        scatter("gemm", g, seconds * xp.asarray(count, dtype))
    at = kernels.attention
    if len(at):
        seconds = xp.asarray(at[:, 2], dtype) / km.attention_rate(peak, at[:, 3], at[:, 4] > 0)
        if np.any(at[:, 5] > 0):  # the older generation's kernel (flash_version 1)
            seconds = seconds / xp.where(xp.asarray(at[:, 5] > 0), km.attention_older, 1.0)
        if np.any(at[:, 6] > 0):  # the architecture's own kernel (flash_version 3)
            seconds = seconds / xp.where(xp.asarray(at[:, 6] > 0), km.attention_native, 1.0)
        scatter("attention", at, seconds)
    mem = kernels.memory
    if len(mem):
        scatter("memory", mem, divide(xp.asarray(mem[:, 2] * mem[:, 3], dtype), bandwidth))
    out["launch"] = km.overhead * xp.asarray(kernels.count(), dtype)
    return out


__all__ = ["Kernels", "kernel_times", "layer_kernels"]
