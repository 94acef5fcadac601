"""Tensor x pipeline x data (x expert) parallelism: sizes, their placement on a cluster, and the
per-device costs, collectives and memory they imply, as plain numbers.

``Parallelism`` holds the sizes (validated against a model by ``check``); ``Cluster`` the devices
and links (presets by name, ``diffpipe.presets``); ``placement`` puts the groups on the cluster the
way Megatron-LM (``RankGenerator`` order ``"tp-cp-ep-dp-pp"``) and torchtitan do by default: a
tensor group is ``tensor`` consecutive ranks (inside one node), a data group strides by ``tensor``,
pipeline neighbours stride by ``tensor x data``; the expert group is carved out of the data group
(``expert`` consecutive data ranks, stride ``tensor``). ``parallel_costs`` gives the per-device
per-layer table that ``diffpipe._configuration`` turns into a ``Workload``: FLOPs, the collectives
each op waits for (bytes over a bandwidth and latency hops, per group), static, gradient,
activation, message and optimizer-traffic bytes.

Sources and rules (notation of ``diffpipe._transformer``; ``t`` tensor, ``N_d`` data, ``e`` expert
sizes; ``X = d b s h`` the bytes of one block's activation):

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
  full recomputation). Expert weights are split by ``t`` as well (Megatron-Core's default expert
  tensor parallel size is ``t``).
- ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
  Models", SC'20, §5 and Figure 1): with ``Psi`` parameters on a device, ``d``-byte weights and
  gradients and ``K``-byte optimizer state (mixed-precision Adam: ``d = 2``, ``K = 12``, so
  ``bytes_per_parameter = 2d + K = 16``), the static bytes are ``(2d + K) Psi`` (stage 0), ``2d Psi
  + K Psi / N_d`` (stage 1: optimizer state sharded; Megatron-LM's distributed optimizer), ``d Psi
  + (d + K) Psi / N_d`` (stage 2: gradients too) and ``(2d + K) Psi / N_d`` (stage 3: weights too);
  i.e. ``16, 4 + 12/N_d, 2 + 14/N_d, 16/N_d`` bytes per parameter. Expert parameters are sharded
  over their own data group, ``N_d / e`` ranks.
- Data-parallel gradient sync (API.md section 1): the bytes one device's sync of a stage moves,
  in *all-reduce-equivalent* bytes for a ring over ``N_d`` ranks: the stage's gradient bytes ``d
  Psi`` for stages 0-2 (ZeRO-1/2's reduce-scatter + all-gather moves what an all-reduce moves),
  half of that for stage 3 (a reduce-scatter; parameters are all-gathered in the passes instead).
  Expert gradients sync over ``N_d / e`` ranks: their bytes are scaled by ``((n_e - 1)/n_e) /
  ((N_d - 1)/N_d)`` so that the ring formula over ``N_d`` gives their bandwidth term.
- ZeRO-3 parameter all-gathers (SC'20 §7.2.2): every layer's weights are all-gathered over the
  data group before its forward and again before its backward (1.5x the all-reduce volume in all,
  with the gradient reduce-scatter), counted here on the op that needs them, not overlapped (an
  upper bound: FSDP prefetches the next layer's).
- Optimizer step: Adam reads each owned parameter's gradient (``d``) and optimizer state (``K``) and
  writes the state and the new weights (``K + d``): ``2(K + d)`` bytes of memory traffic per owned
  parameter (``Psi / N_d`` with ZeRO >= 1), over the device's memory bandwidth (a memory-bound
  kernel; the roofline's bandwidth term).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import _presets
from ._checks import check_int, is_int
from ._errors import ConfigError
from ._transformer import Device, LayerCosts, Transformer, _block, activation_bytes, layer_costs

#: The ZeRO stages (Rajbhandari et al. SC'20): 0 none, 1 optimizer state, 2 + gradients, 3 + weights.
ZERO_STAGES = (0, 1, 2, 3)
#: The groups a collective runs over.
GROUPS = ("tensor", "expert", "data")


@dataclass(frozen=True)
class Parallelism:
    """Parallel sizes of a training run, Megatron-LM style.

    Attributes:
        tensor: tensor-parallel size ``t`` (Megatron ``--tensor-model-parallel-size``).
        pipeline: pipeline-parallel size (devices of one pipeline).
        data: data-parallel size ``N_d`` (replicas of a pipeline).
        virtual: model chunks per pipeline device (interleaved schedules; Megatron
            ``--num-layers-per-virtual-pipeline-stage`` gives it implicitly).
        expert: expert-parallel size ``e``, carved out of the data group (``e`` divides ``data``).
        zero: ZeRO stage 0-3 (1 is Megatron-LM's distributed optimizer).
        sequence_parallel: Megatron's sequence parallelism (Korthikanti et al. 2022).
    """

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    virtual: int = 1
    expert: int = 1
    zero: int = 0
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        for name in ("tensor", "pipeline", "data", "virtual", "expert"):
            check_int(f"parallelism: {name}", getattr(self, name), 1)
        if not is_int(self.zero) or self.zero not in ZERO_STAGES:
            raise ConfigError(f"parallelism: zero must be a ZeRO stage 0, 1, 2 or 3, got {self.zero!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise ConfigError(f"parallelism: sequence_parallel must be a bool, got {self.sequence_parallel!r}")
        if self.data % self.expert:
            raise ConfigError(f"parallelism: expert={self.expert} must divide data={self.data} (the expert group "
                              "is carved out of the data-parallel group)")

    @property
    def gpus(self) -> int:
        """``tensor x pipeline x data`` (expert parallelism reuses the data ranks)."""
        return self.tensor * self.pipeline * self.data

    @property
    def stages(self) -> int:
        """Model stages of one pipeline: ``pipeline x virtual``."""
        return self.pipeline * self.virtual

    def check_gpus(self, gpus: int) -> None:
        """``ConfigError`` unless ``tensor x pipeline x data == gpus``."""
        if self.gpus != gpus:
            raise ConfigError(f"parallelism: tensor x pipeline x data = {self.tensor} x {self.pipeline} x "
                              f"{self.data} = {self.gpus}, but the cluster has {gpus} GPUs")

    def check(self, model: Transformer, gpus: int | None = None) -> None:
        """Raise ``ConfigError`` (one line) when these sizes cannot run ``model`` (on ``gpus`` devices)."""
        if not isinstance(model, Transformer):
            raise ConfigError(f"parallelism: check expects a Transformer, got {type(model).__name__}")
        if gpus is not None:
            self.check_gpus(gpus)
        t = self.tensor
        for name, value in (("heads", model.heads), ("kv_heads", model.kv), ("ffn_hidden", model.ffn)):
            if float(value) % t:
                raise ConfigError(f"parallelism: tensor={t} must divide the model's {name}={value:g}")
        if model.experts > 1:
            if float(model.expert_ffn) % t:
                raise ConfigError(f"parallelism: tensor={t} must divide the model's moe_ffn_hidden="
                                  f"{model.expert_ffn:g}")
            if model.experts % self.expert:
                raise ConfigError(f"parallelism: expert={self.expert} must divide the model's "
                                  f"experts={model.experts}")
        elif self.expert > 1:
            raise ConfigError(f"parallelism: expert={self.expert} needs a mixture-of-experts model (this one "
                              "is dense)")
        if self.stages > model.layers + 2:  # the first and last stage may hold the embedding or head alone
            raise ConfigError(f"parallelism: pipeline x virtual = {self.pipeline} x {self.virtual} = "
                              f"{self.stages} stages exceed the model's {model.layers} layers plus its "
                              "embedding and head")
        if self.sequence_parallel and model.sequence % t:
            raise ConfigError(f"parallelism: tensor={t} must divide the sequence={model.sequence} with "
                              "sequence_parallel")


# -- the cluster ------------------------------------------------------------------------------------
def _float(value: Any) -> Array:
    return jnp.asarray(value, dtype=jnp.result_type(float))


def _link(value: Any, what: str) -> tuple[str, float, float]:
    """``(name, bandwidth, latency)`` of a link preset name, a ``LinkSpec`` or ``(bandwidth, latency)``."""
    if isinstance(value, str):
        key = _presets._lookup(_presets.NETWORKS, value, "network")
        spec = _presets.NETWORKS[key]
        return key, spec.bandwidth, spec.latency
    if isinstance(value, _presets.LinkSpec):
        return "custom", value.bandwidth, value.latency
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return "custom", value[0], value[1]
    raise ConfigError(f"cluster: {what} must be a link preset name (see diffpipe.presets.networks()), a LinkSpec "
                      f"or (bandwidth, latency), got {value!r}")


def _concrete(x: Any) -> np.ndarray | None:
    return None if isinstance(x, jax.core.Tracer) else np.asarray(x)


class Cluster(eqx.Module):
    """Devices and the links between them; float leaves are arrays (differentiable, vmap-able).

    ``Cluster(device="H100", gpus=64, devices_per_node=8, intra="nvlink4", inter="ib-ndr")``:
    ``device`` is a ``Device`` or a device preset name; ``intra``/``inter`` link preset names
    (``diffpipe.presets.networks()``), ``LinkSpec``s or ``(bandwidth bytes/s, latency s)`` pairs;
    ``devices_per_node`` defaults to the intra link's switch domain (8 for NVLink, 72 for NVL72).
    ``memory_bandwidth`` (bytes/s; it also times the optimizer step) lives on the ``Device``
    (presets carry the datasheet figure); ``memory_bandwidth=`` replaces the device's. A device
    without one (``inf``, a bare ``Device(peak, memory)``) is refused: the optimizer step would be free.
    """

    device: Device
    intra_bandwidth: Float[Array, ""]
    intra_latency: Float[Array, ""]
    inter_bandwidth: Float[Array, ""]
    inter_latency: Float[Array, ""]
    gpus: int = eqx.field(static=True)
    devices_per_node: int = eqx.field(static=True)
    intra: str = eqx.field(static=True)
    inter: str = eqx.field(static=True)

    def __init__(self, device: Any = "H100", gpus: int = 8, devices_per_node: int | None = None,
                 intra: Any = "nvlink4", inter: Any = "ib-ndr", *, memory_bandwidth: Any = None) -> None:
        if isinstance(device, str):
            device = _presets.device(_presets._lookup(_presets.DEVICES, device, "device"))
        elif not isinstance(device, Device):
            raise ConfigError(f"cluster: device must be a Device or a device preset name, got {device!r}")
        if memory_bandwidth is not None:
            device = eqx.tree_at(lambda d: d.memory_bandwidth, device, _float(memory_bandwidth))
        bandwidth = _concrete(device.memory_bandwidth)
        if bandwidth is not None and not np.all(np.isfinite(bandwidth)):
            raise ConfigError(f"cluster: device {device.name!r} has no memory bandwidth: give memory_bandwidth= "
                              "(bytes/s)")
        self.device = device
        self.gpus = check_int("cluster: gpus", gpus, 1)
        self.intra, intra_bw, intra_lat = _link(intra, "intra")
        self.inter, inter_bw, inter_lat = _link(inter, "inter")
        if devices_per_node is None:
            domain = _presets.NETWORKS[self.intra].domain if self.intra in _presets.NETWORKS else None
            devices_per_node = domain or 8
        self.devices_per_node = check_int("cluster: devices_per_node", devices_per_node, 1)
        if self.gpus > self.devices_per_node and self.gpus % self.devices_per_node:
            raise ConfigError(f"cluster: gpus={self.gpus} is not a whole number of {self.devices_per_node}-GPU "
                              "nodes")
        self.intra_bandwidth, self.intra_latency = _float(intra_bw), _float(intra_lat)
        self.inter_bandwidth, self.inter_latency = _float(inter_bw), _float(inter_lat)

    def __check_init__(self) -> None:
        for name, positive in (("intra_bandwidth", True), ("inter_bandwidth", True), ("intra_latency", False),
                               ("inter_latency", False)):
            x = _concrete(getattr(self, name))
            if x is None:
                continue
            bad = np.isnan(x) | (x < 0) | ((x <= 0) if positive else False) | (np.isinf(x) & (not positive))
            if np.any(bad):
                want = "positive (inf allowed)" if positive else "non-negative and finite"
                raise ConfigError(f"cluster: {name} must be {want}, got {x.ravel()[0]!r}")

    @property
    def memory_bandwidth(self) -> Array:
        """The device's memory bandwidth (bytes/s)."""
        return self.device.memory_bandwidth

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.devices_per_node)

    def link(self, name: str) -> tuple[Array, Array]:
        """``(bandwidth, latency)`` of ``"intra"`` or ``"inter"``."""
        if name == "intra":
            return self.intra_bandwidth, self.intra_latency
        if name == "inter":
            return self.inter_bandwidth, self.inter_latency
        raise ConfigError(f"cluster: link must be 'intra' or 'inter', got {name!r}")


class Placement(NamedTuple):
    """Where each group of a ``Parallelism`` sits on a ``Cluster`` (Megatron-LM's rank order
    ``tp-cp-ep-dp-pp``, tensor innermost).

    Attributes:
        links: group (``tensor``, ``expert``, ``data``) -> ``"intra"`` or ``"inter"``: the slowest
            link its ring crosses.
        stages_per_node: pipeline ranks of one pipeline that share a node (``devices_per_node //
            (tensor x data)``, at least 1): the pipeline ``Network``'s ``devices_per_node``.
    """

    links: dict[str, str]
    stages_per_node: int


def placement(parallelism: Parallelism, cluster: Cluster) -> Placement:
    """Place ``parallelism``'s groups on ``cluster`` (see ``Placement``); ``ConfigError`` when a
    tensor group does not fit in a node or the groups do not tile the nodes."""
    p, n = parallelism, cluster.devices_per_node
    p.check_gpus(cluster.gpus)
    if p.tensor > n or n % p.tensor:
        raise ConfigError(f"parallelism: tensor={p.tensor} must divide the {n} GPUs of a node (a tensor group "
                          "stays inside one node)")
    inner = p.tensor * p.data
    if inner < n and n % inner:
        raise ConfigError(f"parallelism: tensor x data = {inner} must divide the {n} GPUs of a node when smaller "
                          "(pipeline neighbours stride by it)")

    def where(ranks: int) -> str:
        return "intra" if ranks <= n or cluster.gpus <= n else "inter"

    links = {"tensor": "intra", "expert": where(p.tensor * p.expert), "data": where(inner)}
    stages_per_node = max(1, min(p.pipeline, n // inner)) if cluster.gpus > n else p.pipeline
    return Placement(links, stages_per_node)


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
            ``N_d`` ranks (API.md section 1).
        activation_bytes: stored activations per device (``activation_bytes(model, tensor, SP)``).
        output_bytes: the boundary message one device sends (``1/t`` of the activation).
        update_bytes: memory traffic of the optimizer step on one device.
        parameters: parameters held by one device.
        shared_static_bytes, shared_gradient_bytes: the head's copy of a tied embedding.
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


def parallel_costs(model: Transformer, parallelism: Parallelism) -> ParallelCosts:
    """The per-device per-layer table of ``model`` under ``parallelism`` (rules and sources: the
    module docstring)."""
    par = parallelism
    par.check(model)
    t, e, n = par.tensor, par.expert, par.data
    sp = par.sequence_parallel
    full = model.recompute == "full"
    base = layer_costs(model)
    rows = model.layers + 2
    d = float(model.dtype_bytes)
    x = d * model.microbatch_size * model.sequence * model.hidden  # one block's activation
    moe = {1 + i for i in model.moe_blocks()}

    coll_bytes = {g: np.zeros((3, rows)) for g in GROUPS}
    coll_hops = {g: np.zeros((3, rows)) for g in GROUPS}

    def add(group: str, kind: int, row: int, term: tuple[float, float], times: float = 1.0) -> None:
        coll_bytes[group][kind, row] += times * term[0]
        coll_hops[group][kind, row] += times * term[1]

    F, I = 0, 1
    block_ar = all_reduce(t, x)  # with SP: all-gather + reduce-scatter, the same terms
    for row in range(1, rows - 1):
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

    expert = _expert_parameters(model)
    dense = base.parameters - expert
    shards_e = n // e
    per_device_dense = dense / t
    per_device_expert = expert / (t * e)
    parameters = per_device_dense + per_device_expert
    bpp = model.bytes_per_parameter
    static = (zero_static_bytes(per_device_dense, par.zero, n, d, bpp)
              + zero_static_bytes(per_device_expert, par.zero, shards_e, d, bpp))
    ring = (n - 1) / n if n > 1 else 0.0
    expert_scale = ((shards_e - 1) / shards_e / ring) if ring and shards_e > 1 else 0.0
    sync = 0.5 if par.zero == 3 else 1.0
    gradient = sync * d * (per_device_dense + expert_scale * per_device_expert)
    if par.zero == 3:  # parameter all-gathers before each layer's forward and backward
        gather = np.array([all_gather(n, d * p)[0] for p in per_device_dense]) + np.array(
            [all_gather(shards_e, d * p)[0] for p in per_device_expert])
        hops = float(n - 1) if n > 1 else 0.0
        for kind in (F, I):
            coll_bytes["data"][kind] += gather
            coll_hops["data"][kind] += np.where(gather > 0, hops, 0.0)
    k = float(bpp) - 2 * d
    owned = per_device_dense / (n if par.zero >= 1 else 1) + per_device_expert / (shards_e if par.zero >= 1 else 1)
    shared = base.shared_parameters / t
    shared_static = float(zero_static_bytes(shared, par.zero, n, d, bpp))
    return ParallelCosts(
        costs=shard_flops(base, t),
        collective_bytes=coll_bytes,
        collective_hops=coll_hops,
        static_bytes=np.asarray(static, np.float64),
        gradient_bytes=np.asarray(gradient, np.float64),
        activation_bytes=activation_bytes(model, tensor=t, sequence_parallel=sp),
        output_bytes=np.asarray(base.output_bytes, np.float64) / t,
        update_bytes=2 * (k + d) * owned,
        parameters=parameters,
        shared_static_bytes=shared_static,
        shared_gradient_bytes=sync * d * shared,
    )


__all__ = ["GROUPS", "ZERO_STAGES", "Cluster", "ParallelCosts", "Parallelism", "Placement", "all_gather",
           "all_reduce", "parallel_costs", "placement", "SHARDED_FIELDS", "shard_flops", "zero_static_bytes"]
