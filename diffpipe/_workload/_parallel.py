"""Tensor x context x pipeline x data (x expert) parallelism: sizes, their placement on a cluster, and
the per-device costs, collectives and memory they imply, as plain numbers.

``Parallelism`` (in ``_parallelism``) holds the sizes, checked against a model by ``check``; ``Cluster``
the devices and links (presets by name, ``diffpipe.presets``); ``placement`` puts the groups on the cluster the
way Megatron-LM (``RankGenerator`` order ``"tp-cp-ep-dp-pp"``, ``megatron/core/parallel_state.py``)
and torchtitan (mesh ``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``) do by default: a tensor group
is ``tensor`` consecutive ranks (inside one node), a context group strides by ``tensor``, a data group
by ``tensor x context``, pipeline neighbours by ``tensor x context x data``; the expert layers fold onto
the same ranks in their own order (below): an expert tensor group is ``expert_tensor`` consecutive ranks,
an expert group ``expert`` ranks at stride ``expert_tensor`` (with ``expert_tensor = tensor``, the default,
it is carved out of the data and context ranks). ``parallel_costs`` gives the per-device
per-layer table that ``diffpipe._plan._configuration`` turns into a ``Workload``: FLOPs, the collectives
each op waits for (bytes over a bandwidth and latency hops, per group), static, gradient,
activation, message and optimizer-traffic bytes.

Sources and rules (notation of ``diffpipe._model._transformer``; ``t`` tensor, ``c`` context, ``N_d``
data, ``e`` expert sizes; ``X = d b (s / c) h`` the bytes of one block's activation on one rank):

- Ring collectives over ``n`` ranks (Patarasuk and Yuan, JPDC 2009; Thakur et al., IJHPCA 2005):
  all-reduce ``2(n-1)/n x bytes / bw + 2(n-1) x lat``; all-gather and reduce-scatter of a tensor of
  ``bytes`` (the whole, gathered size) half of that, ``(n-1)/n x bytes / bw + (n-1) x lat``; an
  all-to-all in which every rank holds ``bytes`` sends ``(n-1)/n`` of them, in ``n-1`` pairwise
  steps (the same terms as an all-gather).
- Tensor parallelism (Shoeybi et al. 2019; Narayanan et al., SC'21, §2.3): every weight matrix is
  split over the ``t`` ranks, so each device computes ``1/t`` of a block's FLOPs (attention heads and
  the FFN split) and holds ``1/t`` of its parameters; the embedding and the LM head are
  vocabulary-parallel (``1/t`` too). A block does two all-reduces of ``X`` in the forward (after
  attention, after the MLP) and two in the backward (the input gradients of the two
  column-parallel inputs). The vocabulary-parallel embedding all-reduces its output in the
  forward; the head all-reduces its input gradient in the backward. With sequence parallelism
  (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", MLSys 2023,
  §4.2.2) each all-reduce becomes an all-gather plus a reduce-scatter of the same total volume
  (the embedding's forward one reduce-scatter; the head's an all-gather forward and a
  reduce-scatter backward), and norm/dropout activations shard by ``t`` (``activation_bytes``).
  Full recomputation re-runs the forward, its all-reduces included, inside the backward
  (Korthikanti et al. §3); selective recomputation re-runs the attention core only, no collective.
  These collectives sit on the critical path of the layer (Megatron-LM does not overlap them by
  default), so their time is added to the op that issues them.
- Pipeline messages: the boundary activation ``X`` is sent as ``1/t`` slices by each of the ``t``
  ranks (Megatron-LM's scatter/gather optimisation, SC'21 §4.1; with sequence parallelism the
  activation is sharded anyway).
- Expert parallelism (Lepikhin et al., "GShard", 2020; Fedus et al., "Switch Transformers", JMLR
  2022): the ``E`` routed experts of a MoE block are split over the ``e`` ranks of the expert group;
  with balanced routing each device computes as many expert-token passes as without expert
  parallelism (compute unchanged), holds ``E/e`` experts, and every MoE block does two
  all-to-alls (dispatch, combine) of its ``k`` (times the capacity factor) token copies,
  ``k' X / (t if SP else 1)`` bytes, in the forward and two in the backward (plus two more under
  full recomputation). Expert weights are split over the expert tensor group, ``e_t`` ranks.
- Parallel folding (Megatron-LM d98e8a6, ``megatron/core/parallel_state.py``,
  ``initialize_model_parallel``; Liu et al., "MoE Parallel Folding", arXiv:2504.14960, 2025): the
  expert layers have their own decomposition of the same ranks, ``world = t c N_d p = e_t e N_e p``,
  built by a second ``RankGenerator(tp=e_t, ep=e, dp=N_e, pp=p, cp=1)`` in the same order
  (``tp-ep-dp-pp``): ``e_t`` (``--expert-tensor-parallel-size``; unset, ``t``, as ``validate_args``
  sets it) consecutive ranks, the expert group ``e`` ranks at stride ``e_t``, the expert data group
  ``N_e = t c N_d / (e_t e)`` the rest; Megatron requires ``world % (e_t e p) == 0`` (a
  ``RuntimeError`` there; here ``e_t e`` divides ``t c N_d``) and ``experts % e == 0``
  (``validate_args``). So the expert group may span tensor and context ranks as well as data ranks
  (``e_t = 1``: the tensor ranks join it). A MoE block's attention collectives stay over the tensor
  group; its MLP collective (the all-gather and reduce-scatter of ``X`` with sequence parallelism, as
  the dense MLP's) runs over the expert tensor group, ``e_t`` ranks, inside a node, so it is counted
  with the tensor collectives; with ``e_t = t`` this is the tensor-parallel MLP's. (Megatron's
  all-to-all dispatcher, ``megatron/core/transformer/moe/token_dispatcher.py``, gathers the ``k'``
  routed copies over the expert tensor group after the all-to-all, ``k'`` times this volume; the
  lighter term is kept so that ``e_t = t`` gives the results of the earlier model.) Expert weights
  are ``1/(e_t e)`` of the routed experts on a device, ZeRO-sharded and gradient-synced over the
  ``N_e`` ranks; the expert GEMMs run ``e e_t / t`` times the rows of ``E / e`` experts split by
  ``e_t`` (the same FLOPs). torchtitan v0.2.2 (73a0e69, ``torchtitan/distributed/parallel_dims.py``)
  builds the same order (sparse mesh ``["pp", "dp_replicate", "efsdp", "ep", "etp"]``, ``etp`` only
  ``1`` or ``tp``); its main (b5bcd76) dropped ``etp`` (experts never tensor-split, "[MoE][4/n]
  deprecate expert tensor parallel", #3167) and requires ``ep`` to divide ``dp_shard x cp x tp``.
- ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
  Models", SC'20, §5 and Figure 1): with ``Psi`` parameters on a device, ``d``-byte weights and
  gradients and ``K``-byte optimizer state (mixed-precision Adam: ``d = 2``, ``K = 12``, so
  ``bytes_per_parameter = 2d + K = 16``), the static bytes are ``(2d + K) Psi`` (stage 0), ``2d Psi
  + K Psi / N_d`` (stage 1: optimizer state sharded; Megatron-LM's distributed optimizer), ``d Psi
  + (d + K) Psi / N_d`` (stage 2: gradients too) and ``(2d + K) Psi / N_d`` (stage 3: weights too);
  i.e. ``16, 4 + 12/N_d, 2 + 14/N_d, 16/N_d`` bytes per parameter. Expert parameters are sharded
  over their own data group, ``N_e`` ranks (``N_d c / e`` with ``e_t = t``).
- Data-parallel gradient sync (docs/architecture.md, "The data-parallel gradient sync"): the
  bytes one device's sync of a stage moves, in *all-reduce-equivalent* bytes for a ring over
  ``N_d`` ranks, with gradients reduced in ``r`` bytes an element (``Transformer.reduce_bytes``,
  ``d`` by default): ``r Psi`` for stage 0 (an all-reduce), ``(r + d) Psi / 2`` for stages 1-2 (a
  reduce-scatter of the gradients and an all-gather of the ``d``-byte weights, each half an
  all-reduce), ``r Psi / 2`` for stage 3 (a reduce-scatter; parameters are all-gathered in the
  passes instead).
  Expert gradients sync over ``N_e`` ranks: their bytes are scaled by ``((N_e - 1)/N_e) /
  ((N_d - 1)/N_d)`` so that the ring formula over ``N_d`` gives their bandwidth term.
- ZeRO-3 parameter all-gathers (SC'20 §7.2.2): every layer's weights are all-gathered over the
  data group before its forward and again before its backward (1.5x the all-reduce volume in all,
  with the gradient reduce-scatter), counted here on the op that needs them, not overlapped (an
  upper bound: FSDP prefetches the next layer's).
- Context parallelism (Megatron-LM ``docs/user-guide/features/context_parallel.md``; TransformerEngine
  ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``,
  ``AttnFuncWithCPAndKVP2P``; Liu, Zaharia and Abbeel, "Ring Attention with Blockwise Transformers for
  Near-Infinite Context", 2023): the sequence is split over the ``c`` ranks of a context group, each
  holding ``s / c`` tokens of every sample (``2c`` chunks, rank ``r`` holding chunks ``r`` and ``2c - 1 -
  r``: the causal work balanced, so ``s`` must be a multiple of ``2c``, Megatron-LM
  ``megatron/training/arguments.py``). Every op but attention runs on the rank's tokens alone: its
  FLOPs, memory traffic, activations, collectives' bytes and pipeline messages are those of the model at
  sequence ``s / c`` (``context_model``). Attention: each rank computes ``1/c`` of the causal attention
  in ``c`` ring steps of one fused kernel on ``s / c`` queries against one ``s / c`` K,V block
  (``context_kernels``; TransformerEngine requires fused attention, Megatron-LM's own attention refuses
  ``context_parallel_size > 1``) and passes its K,V block ``K_c = d b (s/c) (a_kv/t) (d_h + d_v)`` bytes
  around the ring: ``c - 1`` point-to-point steps in the forward, and in the backward ``c`` steps moving
  ``K_c``, then ``c - 2`` times ``2 K_c`` (K,V and the partial dK,dV), then ``K_c``: ``2 (c - 1) K_c``
  (``ring_exchange``). Each step's transfer overlaps that step's attention kernel (two CUDA streams
  in TransformerEngine's loop), so only what exceeds it is exposed. Recomputation that re-runs the
  attention core re-runs its forward ring in ``I``. Parameters are not split by ``c``: the gradients
  are all-reduced, and ZeRO shards, over the ``N_d c`` ranks of the data and context groups together
  (Megatron-LM's ``dp_cp_group``, ``get_data_parallel_group(with_context_parallel=True)`` in
  ``megatron/core/distributed/``; torchtitan's FSDP mesh includes ``cp``).
- Optimizer step: Adam reads each owned parameter's gradient (``d``) and optimizer state (``K``) and
  writes the state and the new weights (``K + d``): ``2(K + d)`` bytes of memory traffic per owned
  parameter (``Psi / N_d`` with ZeRO >= 1), over the device's memory bandwidth (a memory-bound
  kernel; the roofline's bandwidth term).

With context parallelism every ``N_d`` above that shards or reduces parameters is ``N_d c``.
"""


from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._arrays import array_module, divide
from .._caches import memoized
from .._checks import check_int
from .._errors import ConfigError
from .._machine._cluster import Cluster
from .._model._kernels import Kernels, layer_kernels
from .._model._transformer import CACHED, LayerCosts, Transformer, _block, activation_bytes, layer_costs
from ._overlap import hidden_cost
from ._parallelism import Parallelism

#: The groups a collective runs over.
GROUPS = ("tensor", "expert", "data")


class Placement(NamedTuple):
    """Where each group of a ``Parallelism`` sits on a ``Cluster`` (Megatron-LM's rank order
    ``tp-cp-ep-dp-pp``, tensor innermost, then context; the expert layers' ``tp-ep-dp-pp`` with the
    expert tensor size: an expert group spans ``expert_tensor x expert`` consecutive ranks).

    Attributes:
        links: group (``tensor``, ``context``, ``expert``, ``data``) -> ``"intra"`` or ``"inter"``: the
            slowest link its ring crosses (``data``: the data and context ranks together, the
            gradient all-reduce's group).
        stages_per_node: pipeline ranks of one pipeline that share a node (``devices_per_node //
            (tensor x context x data)``, at least 1): the pipeline graph's ``devices_per_node``.
        ranks_per_node: group -> ranks of one of its rings inside one node (a ring that spans
            nodes runs as that many hierarchical rings over the network: ``Cluster.bus_bandwidth``).
    """

    links: dict[str, str]
    stages_per_node: int
    ranks_per_node: dict[str, int] | None = None


def placement(parallelism: Parallelism, cluster: Cluster) -> Placement:
    """Place ``parallelism``'s groups on ``cluster`` (see ``Placement``); ``ConfigError`` when a
    tensor group does not fit in a node or the groups do not tile the nodes."""
    p, n = parallelism, cluster.devices_per_node
    p.check_gpus(cluster.gpus)
    if p.tensor > n or n % p.tensor:
        raise ConfigError(f"parallelism: tensor={p.tensor} must divide the {n} GPUs of a node (a tensor group "
                          "stays inside one node)")
    et = p.etp
    if et > n or n % et:
        raise ConfigError(f"parallelism: expert_tensor={et} must divide the {n} GPUs of a node (an expert "
                          "tensor group stays inside one node, as the tensor group does)")
    inner = p.tensor * p.context * p.data
    if inner < n and n % inner:
        what = "tensor x data" if p.context == 1 else "tensor x context x data"
        raise ConfigError(f"parallelism: {what} = {inner} must divide the {n} GPUs of a node when smaller "
                          "(pipeline neighbours stride by it)")

    def where(ranks: int) -> str:
        return "intra" if ranks <= n or cluster.gpus <= n else "inter"

    links = {"tensor": "intra", "context": where(p.tensor * p.context), "expert": where(et * p.expert),
             "data": where(inner)}
    stages_per_node = max(1, min(p.pipeline, n // inner)) if cluster.gpus > n else p.pipeline
    per_node = max(1, n // p.tensor)  # context and data rings stride by the tensor size
    ranks = {"tensor": p.tensor, "context": min(p.context, per_node), "expert": min(p.expert, max(1, n // et)),
             "data": min(p.shards, per_node)}
    return Placement(links, stages_per_node, ranks)


# -- collectives ------------------------------------------------------------------------------------
def all_reduce(n: int, size: float) -> tuple[float, float]:
    """Ring all-reduce of ``size`` bytes over ``n`` ranks: ``(bytes over the bandwidth, latency hops)``."""
    return (2.0 * (n - 1) / n * size, 2.0 * (n - 1)) if n > 1 else (0.0, 0.0)


def all_gather(n: int, size: float) -> tuple[float, float]:
    """Ring all-gather (or reduce-scatter) of a ``size``-byte tensor over ``n`` ranks; also an
    all-to-all in which every rank holds ``size`` bytes."""
    return ((n - 1) / n * size, float(n - 1)) if n > 1 else (0.0, 0.0)


def zero_static_bytes(parameters: Any, zero: int, shards: int, dtype_bytes: float,
                      bytes_per_parameter: float) -> Any:
    """Static bytes of ``parameters`` on one device under ZeRO stage ``zero`` with ``shards``
    data-parallel ranks (SC'20 §5): ``(2d + K) Psi``, ``2d Psi + K Psi/N``, ``d Psi + (d + K) Psi/N``,
    ``(2d + K) Psi/N`` with ``K = bytes_per_parameter - 2d`` (12 for mixed-precision Adam)."""
    d = float(dtype_bytes)
    k = float(bytes_per_parameter) - 2 * d
    if k < 0:
        raise ConfigError(f"zero: bytes_per_parameter={bytes_per_parameter} is below the 2 x {d:g} bytes of "
                          "weights and gradients")
    n = float(shards)
    per = {0: 2 * d + k, 1: 2 * d + k / n, 2: d + (d + k) / n, 3: (2 * d + k) / n}[zero]
    return parameters * per


class ParallelCosts(NamedTuple):
    """One device's per-layer table under a parallelism (rows of ``layer_costs``: embedding,
    blocks, head), for one microbatch (numpy float64).

    Attributes:
        costs: the model's ``LayerCosts`` with FLOPs (and memory traffic) divided by ``t``
            (``shard_flops``): one device of a tensor group (``costs.times(device)``: its seconds).
        collective_bytes: group -> ``[3, layers]`` bytes over that group's bandwidth that the
            ``F``, ``I`` and ``W`` of each layer wait for (ring factors applied).
        collective_hops: group -> ``[3, layers]`` latencies (hops) of the same collectives.
        static_bytes: weights, gradients, optimizer state on one device (ZeRO applied).
        gradient_bytes: all-reduce-equivalent bytes of the data-parallel gradient sync over
            ``N_d`` ranks (docs/architecture.md, gradient sync).
        activation_bytes: stored activations per device (``activation_bytes(model, tensor, SP)``).
        output_bytes: the boundary message one device sends (``1/t`` of the activation).
        update_bytes: memory traffic of the optimizer step on one device.
        parameters: parameters held by one device.
        shared_static_bytes, shared_gradient_bytes: the head's copy of a tied embedding.
        gather_bytes: ``[layers]`` bus bytes of each layer's ZeRO-3 parameter all-gather (in
            ``collective_bytes["data"]`` of its ``F`` and ``I``; None without ZeRO-3).
        kernels: every op's kernels on one device, shapes after tensor and expert sharding
            (``diffpipe._model._kernels.layer_kernels``), for devices with a ``KernelModel``.
        context_block: ``[layers]`` bytes of the K,V block one rank of a context group passes on in
            each ring step (``K_c``, 0 outside the blocks; None without context parallelism).
        context: the context-parallel size ``c``.
        recomputes_attention: whether the ``I`` of a block re-runs the attention core's forward
            (full or selective recomputation), and with it the forward ring.
    """

    costs: LayerCosts
    collective_bytes: dict[str, np.ndarray]
    collective_hops: dict[str, np.ndarray]
    static_bytes: np.ndarray
    gradient_bytes: np.ndarray
    activation_bytes: np.ndarray
    output_bytes: np.ndarray
    update_bytes: np.ndarray
    parameters: np.ndarray
    shared_static_bytes: float
    shared_gradient_bytes: float
    kernels: Kernels | None = None
    gather_bytes: np.ndarray | None = None
    context_block: np.ndarray | None = None
    context: int = 1
    recomputes_attention: bool = False


def _expert_parameters(model: Transformer) -> np.ndarray:
    """Routed-expert parameters of every ``layer_costs`` row (0 outside MoE blocks)."""
    out = np.zeros(model.layers + 2)
    if model.experts > 1:
        routed = model.experts * _block(model, True)["expert"]
        for i in model.moe_blocks():
            out[1 + i] = routed
    return out


#: ``LayerCosts`` fields a tensor-parallel shard divides by ``t``: the FLOPs of ``F``, ``I``, ``W`` and,
#: where the cost model counts it (the roofline), their memory traffic; the matmuls' rows
#: (``tokens``) stay: a column- or row-parallel matmul has as many rows as the whole one.
SHARDED_FIELDS = ("forward", "input_grad", "weight", "forward_bytes", "input_grad_bytes", "weight_bytes")


def shard_flops(costs: LayerCosts, tensor: int) -> LayerCosts:
    """``costs`` of one device of a tensor group of ``tensor``: ``SHARDED_FIELDS`` divided by it."""
    t = float(tensor)
    names = {f.name for f in dataclasses.fields(costs)}
    return dataclasses.replace(costs, **{name: getattr(costs, name) / t for name in SHARDED_FIELDS
                                         if name in names and getattr(costs, name) is not None})


def context_model(model: Transformer, context: int) -> Transformer:
    """``model`` as one rank of a context group of ``context`` sees it: ``sequence / context`` tokens per
    sample (``model`` itself for 1). Its per-token costs are the rank's; its attention is one ring
    step's (``context_kernels``), and its parameters are not the rank's (positions cover the whole
    sequence): ``parallel_costs`` takes those from ``model``."""
    check_int("context_model: context", context, 1)
    if context == 1:
        return model
    if model.sequence % context:
        raise ConfigError(f"context_model: context={context} must divide the sequence={model.sequence}")
    return dataclasses.replace(model, sequence=model.sequence // context)


def context_kernels(kernels: Kernels, context: int) -> Kernels:
    """The kernels of one rank of a context group from those of ``context_model``: every fused
    attention kernel (one ring step: ``s / c`` queries against one block of ``s / c`` keys, half of
    the pairs computed, which the diagonal step's causal mask and the off-diagonal steps' half chunks
    both give) runs ``context`` times, once per ring step; the rest is the local tokens' already."""
    check_int("context_kernels: context", context, 1)
    if context == 1:
        return kernels
    return kernels._replace(attention=np.repeat(kernels.attention, context, axis=0))


def shard_context(base: LayerCosts, local: LayerCosts, tensor: int, context: int) -> LayerCosts:
    """``LayerCosts`` of one device of a tensor group of ``tensor`` and a context group of ``context``:
    FLOPs ``1 / (t c)`` of ``base`` (the whole sequence's; the causal attention balanced over the
    context ranks), memory traffic and matmul rows those of ``local`` (``context_model``'s) over
    ``t``; ``shard_flops(base, tensor)`` for ``context == 1``."""
    if context == 1:
        return shard_flops(base, tensor)
    traffic = shard_flops(local, tensor)
    return dataclasses.replace(shard_flops(base, tensor * context), forward_bytes=traffic.forward_bytes,
                               input_grad_bytes=traffic.input_grad_bytes, weight_bytes=traffic.weight_bytes,
                               tokens=traffic.tokens)


def ring_exchange(block: Any, context: int, bandwidth: Any, latency: Any, forward_step: Any = 0.0,
                  backward_step: Any = 0.0, recompute_step: Any = None, contention: float = 0.0) -> Array:
    """``[3, layers]`` seconds of the context-parallel K,V ring (TransformerEngine's
    ``AttnFuncWithCPAndKVP2P``) left on the critical path of each layer's ``F``, ``I`` and ``W``.

    One transfer of ``x`` bytes lasts ``latency + x / bandwidth`` and overlaps the attention kernel of
    the ring step it is issued in (``*_step``: ``[layers]`` seconds of one step's kernel; 0: no
    overlap); a step is exposed by what its transfer exceeds its kernel, plus ``contention`` times the
    part its kernel hides (``hidden_cost``). ``F``: ``c - 1`` transfers of
    the block ``K_c``. ``I``: ``c`` transfers, ``K_c``, then ``c - 2`` of ``2 K_c`` (K,V with the
    partial dK,dV), then ``K_c`` (``2 (c - 1) K_c`` in all), against the backward kernel; with
    ``recompute_step`` (recomputation re-running the attention core) also the forward's ``c - 1``
    against that recomputed kernel. ``W``: none. Differentiable in the floats (``jnp``; NumPy when
    every operand is NumPy or a number)."""
    xp = array_module(bandwidth, latency, forward_step, backward_step, recompute_step)
    c = float(context)
    block = xp.asarray(block, jnp.result_type(block))  # JAX's float dtype (float32 unless x64 is enabled)
    one = latency + divide(block, bandwidth)
    two = latency + divide(2.0 * block, bandwidth)

    def exposed(transfer: Array, step: Any) -> Array:
        return hidden_cost(transfer, step, contention)

    forward = (c - 1.0) * exposed(one, forward_step)
    backward = (2.0 if context > 1 else 0.0) * exposed(one, backward_step) + max(c - 2.0, 0.0) * exposed(
        two, backward_step)
    if recompute_step is not None:
        backward = backward + (c - 1.0) * exposed(one, recompute_step)
    zero = xp.zeros_like(forward)
    on = block > 0
    return xp.stack([xp.where(on, forward, zero), xp.where(on, backward, zero), zero])


def sync_bytes_per_parameter(zero: int, reduce_bytes: float, dtype_bytes: float) -> float:
    """All-reduce-equivalent bytes of one parameter's gradient sync at ZeRO stage ``zero`` (module
    docstring): ``r`` (stage 0, an all-reduce), ``(r + d) / 2`` (1-2: a gradient reduce-scatter and a
    weight all-gather), ``r / 2`` (3: a reduce-scatter)."""
    r, d = reduce_bytes, dtype_bytes
    return r if zero == 0 else (r + d) / 2 if zero in (1, 2) else r / 2


def parallel_costs(model: Transformer, parallelism: Parallelism) -> ParallelCosts:
    """The per-device per-layer table of ``model`` under ``parallelism`` (rules and sources: the
    module docstring). What the tensor, context and expert sizes alone decide is kept per sizes
    (``_sharded``): a plan prices each of them under many data sizes and ZeRO stages."""
    par = parallelism
    par.check(model)
    t, e, c, et = par.tensor, par.expert, par.context, par.etp
    n = par.shards  # the data and context ranks reduce (and ZeRO-shard) the same parameters
    shard = _sharded(model, t, c, par.sequence_parallel, e, et)
    d, base, rows = float(model.dtype_bytes), shard.base, model.layers + 2
    coll_bytes = {"tensor": shard.tensor_bytes, "expert": shard.expert_bytes, "data": np.zeros((3, rows))}
    coll_hops = {"tensor": shard.tensor_hops, "expert": shard.expert_hops, "data": np.zeros((3, rows))}
    F, I = 0, 1

    expert = _expert_parameters(model)
    dense = base.parameters - expert
    shards_e = par.expert_data  # ranks holding the same experts: t c N_d / (e_t e)
    per_device_dense = dense / t
    per_device_expert = expert / (et * e)
    parameters = per_device_dense + per_device_expert
    bpp = model.bytes_per_parameter
    static = (zero_static_bytes(per_device_dense, par.zero, n, d, bpp)
              + zero_static_bytes(per_device_expert, par.zero, shards_e, d, bpp))
    ring = (n - 1) / n if n > 1 else 0.0
    expert_scale = ((shards_e - 1) / shards_e / ring) if ring and shards_e > 1 else 0.0
    r = float(model.reduction_bytes)
    # all-reduce-equivalent bytes per parameter: all-reduce; reduce-scatter + weight all-gather; reduce-scatter
    reduce = sync_bytes_per_parameter(par.zero, r, d)
    gradient = reduce * (per_device_dense + expert_scale * per_device_expert)
    gather_bytes = None
    if par.zero == 3:  # parameter all-gathers before each layer's forward and backward
        gather = np.array([all_gather(n, d * p)[0] for p in per_device_dense]) + np.array(
            [all_gather(shards_e, d * p)[0] for p in per_device_expert])
        hops = float(n - 1) if n > 1 else 0.0
        gather_bytes = gather
        for kind in (F, I):
            coll_bytes["data"][kind] += gather
            coll_hops["data"][kind] += np.where(gather > 0, hops, 0.0)
    k = float(bpp) - 2 * d
    owned = per_device_dense / (n if par.zero >= 1 else 1) + per_device_expert / (shards_e if par.zero >= 1 else 1)
    shared = base.shared_parameters / t
    shared_static = float(zero_static_bytes(shared, par.zero, n, d, bpp))
    return ParallelCosts(
        costs=shard.costs,
        collective_bytes=coll_bytes,
        collective_hops=coll_hops,
        static_bytes=np.asarray(static, np.float64),
        gradient_bytes=np.asarray(gradient, np.float64),
        activation_bytes=shard.activation_bytes,
        output_bytes=shard.output_bytes,
        update_bytes=2 * (k + d) * owned,
        parameters=parameters,
        shared_static_bytes=shared_static,
        shared_gradient_bytes=reduce * shared,
        kernels=shard.kernels,
        gather_bytes=gather_bytes,
        context_block=shard.context_block,
        context=c,
        recomputes_attention=model.recompute in ("full", "selective"),
    )


class _Sharded(NamedTuple):
    """What ``parallel_costs`` reads of the tensor, context and expert sizes alone (read-only, kept)."""

    base: LayerCosts
    costs: LayerCosts
    tensor_bytes: np.ndarray
    tensor_hops: np.ndarray
    expert_bytes: np.ndarray
    expert_hops: np.ndarray
    activation_bytes: np.ndarray
    output_bytes: np.ndarray
    kernels: Kernels
    context_block: np.ndarray | None


@memoized(CACHED)
def _sharded(model: Transformer, t: int, c: int, sp: bool, e: int, et: int) -> _Sharded:
    """``parallel_costs``' terms of the tensor, context, sequence-parallel, expert and expert tensor sizes:
    the sharded layer table, the tensor and expert collectives, activations, messages, kernels, K,V block."""
    full = model.recompute == "full"
    base = layer_costs(model)
    local = context_model(model, c)  # one context rank's tokens (model itself without context parallelism)
    local_costs = base if c == 1 else layer_costs(local)
    rows, d = model.layers + 2, float(model.dtype_bytes)
    x = d * local.microbatch_size * local.sequence * local.hidden  # one block's activation
    moe = {1 + i for i in model.moe_blocks()}

    coll_bytes = {g: np.zeros((3, rows)) for g in ("tensor", "expert")}
    coll_hops = {g: np.zeros((3, rows)) for g in ("tensor", "expert")}

    def add(group: str, kind: int, row: int, term: tuple[float, float], times: float = 1.0) -> None:
        coll_bytes[group][kind, row] += times * term[0]
        coll_hops[group][kind, row] += times * term[1]

    F, I = 0, 1
    block_ar = all_reduce(t, x)  # with SP: all-gather + reduce-scatter, the same terms
    expert_ar = all_reduce(et, x)  # a MoE block's MLP collective, over the expert tensor group
    for row in range(1, rows - 1):
        if row in moe and et != t:  # attention over the tensor group, the experts over theirs
            for term in (block_ar, expert_ar):
                add("tensor", F, row, term)
                add("tensor", I, row, term, 2 if full else 1)
        else:
            add("tensor", F, row, block_ar, 2)
            add("tensor", I, row, block_ar, 4 if full else 2)
        if row in moe and e > 1:
            routed = model.experts_per_token * (1.0 if model.capacity_factor is None else model.capacity_factor)
            a2a = all_gather(e, routed * x / (t if sp else 1))
            add("expert", F, row, a2a, 2)
            add("expert", I, row, a2a, 4 if full else 2)
    if sp:
        add("tensor", F, 0, all_gather(t, x))  # the embedding's reduce-scatter
        add("tensor", F, rows - 1, all_gather(t, x))  # the head's all-gather
        add("tensor", I, rows - 1, all_gather(t, x))  # and its reduce-scatter
    else:
        add("tensor", F, 0, block_ar)
        add("tensor", I, rows - 1, block_ar)

    kernels = context_kernels(layer_kernels(local, tensor=t, sequence_parallel=sp, expert=e, expert_tensor=et), c)
    context_block = None
    if c > 1:  # the K,V block a rank passes on: b (s/c) tokens x a_kv/t heads x (d_h + d_v)
        kv = model.heads if model.kv_lora_rank else model.kv  # MLA decompresses K and V per head
        block = d * local.microbatch_size * local.sequence * (kv / t) * (model.dh + model.dv)
        context_block = np.concatenate([[0.0], np.full(model.layers, block), [0.0]])
    return _Sharded(base, shard_context(base, local_costs, t, c), coll_bytes["tensor"], coll_hops["tensor"],
                    coll_bytes["expert"], coll_hops["expert"], activation_bytes(local, tensor=t, sequence_parallel=sp),
                    np.asarray(local_costs.output_bytes, np.float64) / t, kernels, context_block)
