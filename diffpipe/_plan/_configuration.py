"""``Configuration``: a model, a parallelism, a cluster and a global batch, simulated as one step.

``Configuration(model, parallelism, cluster, global_batch, schedule="1f1b")`` builds the pipeline
schedule (``devices = pipeline``; ``chunks = virtual`` for families with chunks; ``microbatches =
global_batch / (microbatch_size x data)``), the per-device ``Workload`` of ``diffpipe._workload._parallel``
(tensor/context/expert-sharded FLOPs in seconds, the tensor, expert and ZeRO-3 collectives and the
context ring's exposed transfers each op waits for added to its duration, ZeRO static bytes,
data-parallel gradient bytes, optimizer-step traffic over memory bandwidth), its ``Hardware``, and
``evaluate()`` simulates one step of one pipeline (all ``data`` replicas, and the ``context`` ranks
of each stage, run the same one) and reports:

- ``step_time``: the makespan, seconds, the gradient sync of every stage over its data-parallel
  group and the optimizer steps included (``compile(..., gradient_sync=True)``: docs/architecture.md);
- ``tokens_per_second_per_gpu``: ``global_batch x sequence / step_time / gpus``;
- ``mfu``: model FLOPs utilisation, ``model.model_flops() x microbatches x data / (step_time x gpus x
  peak_flops)``: the FLOPs the model needs per step, without recomputation, over what the GPUs
  could do at peak (Chowdhery et al., "PaLM", 2022, Appendix B; Korthikanti et al. 2022, §6.3:
  "model FLOPs" leave recomputation out, "hardware FLOPs" would count it);
- ``memory_per_gpu``: the peak over pipeline ranks of static (ZeRO) plus stored activation bytes,
  ``fits`` against the device memory less ``HEADROOM`` (the allocator's fragmentation, the
  communication buffers and the CUDA context are not modelled: the same rule as ``plan``'s);
- ``bubble_ratio`` (``Result.bubble_ratio``) and ``communication_share``: the share of the step a
  pipeline rank spends in the tensor, expert and ZeRO-3 collectives inside its ops, averaged over
  the ranks (the overlapped gradient sync is not counted: what it does not hide is in the step).

Every float of the cluster (device peak and efficiency, link bandwidths and latencies, memory
bandwidth) reaches the ``Hardware`` through array operations, so ``makespan`` is differentiable in
them, and a configuration of the same structure with new values reuses the compiled evaluator.

Why one module past 500 lines: ``Configuration`` is one object whose methods each derive one term of
the same step from the same ``ParallelCosts`` table (compute, the collectives by group and what the
overlap leaves exposed, the context ring, the gradient sync, the optimizer step), and ``ConfigResult``
is what its ``evaluate`` returns; apart, every term would reach back into the whole object.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .. import schedules
from .._arrays import array_module, divide, on_host
from .._caches import BoundedDict
from .._checks import check_int, check_number
from .._engine._communication import AbstractCommunication
from .._engine._graph import Graph, compile
from .._engine._hardware import Hardware, Network
from .._engine._jitter import Jitter, sample_makespans, step_time_summary
from .._engine._simulate import Result, makespan, simulate
from .._errors import ConfigError
from .._machine._cluster import Cluster
from .._model._kernels import Kernels, kernel_times
from .._model._transformer import Transformer, parameter_tensors, stage_of_layers
from .._results import json_text
from .._workload._frameworks import Framework
from .._workload._frameworks import framework as get_framework
from .._workload._overlap import CommunicationOverlap, hidden_cost
from .._workload._parallel import (
    GROUPS,
    ParallelCosts,
    Placement,
    parallel_costs,
    placement,
    ring_exchange,
    sync_bytes_per_parameter,
)
from .._workload._parallelism import Parallelism
from .._workload._workload import Workload
from ..schedules import Schedule
from ..schedules._analysis import staleness as schedule_staleness
from ..schedules._registry import cached_build

#: The share of each GPU's memory a configuration leaves free: it "fits" when its modelled peak is at
#: most ``(1 - HEADROOM) x capacity``. One rule for ``Configuration.evaluate`` (``simulate``) and
#: ``plan`` (its default ``headroom``).
HEADROOM = 0.1


def usable_memory(capacity: float, headroom: float = HEADROOM) -> float:
    """Bytes a device lets a configuration use: its ``capacity`` less ``headroom`` of it (the one fit
    rule of ``simulate``, ``compare`` and ``plan``)."""
    return float(capacity) * (1.0 - headroom)


def fits_memory(peak: float, capacity: float, headroom: float = HEADROOM) -> bool:
    """Whether a modelled ``peak`` (bytes) fits a device of ``capacity`` bytes with ``headroom`` kept free."""
    return float(peak) <= usable_memory(capacity, headroom)


def check_headroom(what: str, headroom: Any) -> float:
    """``headroom`` as a float in ``[0, 1)``, else a ``ConfigError`` naming ``what``."""
    headroom = check_number(f"{what}: headroom", headroom)
    if headroom >= 1:
        raise ConfigError(f"{what}: headroom must be below 1, got {headroom!r}")
    return headroom


def fit_rule(capacity: float, headroom: float = HEADROOM) -> str:
    """The fit rule in words, as every table's notes print it (decimal GB)."""
    capacity = float(capacity)  # an array's division would compile a program
    return (f"fits: at most {usable_memory(capacity, headroom) / 1e9:.1f} GB of {capacity / 1e9:.1f} GB "
            f"({headroom:.0%} kept free)")

#: Kind index of ``ParallelCosts.collective_*`` rows.
_F, _I, _W = range(3)


def gradient_sync(schedule: Schedule) -> bool:
    """Whether a configuration compiles ``schedule`` with the gradient-sync lane: unless it has its
    own ``R`` or ``U`` ops (``compile`` refuses both at once)."""
    return not any(op.kind in ("R", "U") for op in schedule.ops)




#: ``onehot @ x`` as XLA computes it (its order of summation, which NumPy's differs from in the last
#: bits): one small program per shape for NumPy operands, inlined in a caller's trace.
_matmul = jax.jit(jnp.matmul)


def _stage_sums(onehot: Any, x: Any) -> Any:
    """``[stages]`` sums of ``x`` over each stage's layers (``onehot``: ``[stages, layers]``)."""
    out = _matmul(onehot, x)
    return np.asarray(out) if array_module(onehot, x) is np else out


#: Graphs kept (``_graph_of``), keyed by the schedule object (schedules are kept too:
#: ``schedules._registry.cached_build``), so a plan compiles each schedule once across calls.
GRAPHS_KEPT = 256
_GRAPHS: BoundedDict = BoundedDict(GRAPHS_KEPT)


def _graph_of(schedule: Schedule, communication: Any, devices_per_node: int) -> Graph:
    """``compile`` of ``schedule`` with the gradient-sync lane where it has none of its own (a pure
    function of its arguments; kept by schedule object, which the entry holds)."""
    try:
        key = (id(schedule), communication, devices_per_node)
        held = _GRAPHS.get(key)
    except TypeError:  # an unhashable communication mode
        key = held = None
    if held is not None and held[0] is schedule:
        return held[1]
    graph = compile(schedule, communication=communication, devices_per_node=devices_per_node,
                    gradient_sync=gradient_sync(schedule))
    if key is not None:
        _GRAPHS[key] = (schedule, graph)
    return graph


@dataclass(frozen=True, init=False)
class Configuration:
    """One training configuration (see the module docstring).

    Args:
        model: the ``Transformer`` (its ``microbatch_size``, ``recompute`` and ``flash_attention``
            are the run's).
        parallelism: the ``Parallelism`` (its sizes must multiply to ``cluster.gpus``).
        cluster: the ``Cluster``.
        global_batch: samples per optimizer step (a multiple of ``microbatch_size x data``).
        schedule: the pipeline family (``diffpipe.schedules.names()``); default ``"1f1b"``, or
            ``"interleaved-1f1b"`` when ``parallelism.virtual > 1``.
        options: further family options (``chunks`` comes from ``virtual``).
        communication: the pipeline's communication mode: a name (``overlap`` by default) or an
            ``AbstractCommunication`` (e.g. ``diffpipe.calibrate.TorchRuntime()``).
        layers_per_stage: transformer blocks per model stage (default: as even as possible).
        overlap: how much communication the framework hides (``CommunicationOverlap``; default none:
            tensor collectives on the critical path, the gradient sync after the backward, no prefetch).
        framework: the training framework whose overlap and gradient precision the step has (a
            ``Framework`` or a preset name: ``diffpipe._workload._frameworks.FRAMEWORKS``); it sets
            ``overlap`` (give one or the other) and the model's ``reduce_bytes`` where the model states
            none. Default: ``overlap`` as given.
    """

    model: Transformer
    parallelism: Parallelism
    cluster: Cluster
    global_batch: int
    family: str
    options: tuple[tuple[str, Any], ...]
    communication: str | AbstractCommunication
    layers_per_stage: tuple[int, ...] | None
    overlap: CommunicationOverlap
    framework: Framework | None

    def __init__(self, model: Transformer, parallelism: Parallelism, cluster: Cluster, global_batch: int, *,
                 schedule: str | None = None, options: dict[str, Any] | None = None,
                 communication: str = "overlap", layers_per_stage: Any = None,
                 overlap: CommunicationOverlap | None = None, framework: str | Framework | None = None) -> None:
        if not isinstance(model, Transformer):
            raise ConfigError(f"configuration: model must be a Transformer, got {type(model).__name__}")
        if not isinstance(parallelism, Parallelism):
            raise ConfigError(f"configuration: parallelism must be a Parallelism, got {type(parallelism).__name__}")
        if framework is not None:
            if overlap is not None:
                raise ConfigError("configuration: give overlap or framework, not both (the framework sets the overlap)")
            framework = get_framework(framework)
            model = framework.model(model)
            overlap = framework.overlap(model, parallelism)
        if not isinstance(cluster, Cluster):
            raise ConfigError(f"configuration: cluster must be a Cluster, got {type(cluster).__name__}")
        check_int("configuration: global_batch", global_batch, 1)
        if schedule is not None and not isinstance(schedule, str):
            raise ConfigError(f"configuration: schedule must be a family name, got {schedule!r}")
        if not isinstance(communication, (str, AbstractCommunication)):
            raise ConfigError(f"configuration: communication must be a mode name or an AbstractCommunication, "
                              f"got {communication!r}")
        overlap = CommunicationOverlap() if overlap is None else overlap
        if not isinstance(overlap, CommunicationOverlap):
            raise ConfigError(f"configuration: overlap must be a CommunicationOverlap, got {type(overlap).__name__}")
        family = schedule if schedule is not None else ("interleaved-1f1b" if parallelism.virtual > 1 else "1f1b")
        fam = schedules.family(family)  # an unknown family: one line naming it
        options = dict(options or {})
        if "chunks" in options:
            raise ConfigError("configuration: chunks comes from parallelism.virtual; do not pass it in options")
        parallelism.check(model, cluster.gpus)
        per_step = model.microbatch_size * parallelism.data
        if global_batch % per_step:
            raise ConfigError(f"configuration: global_batch={global_batch} is not a multiple of microbatch_size x "
                              f"data = {model.microbatch_size} x {parallelism.data} = {per_step}")
        if layers_per_stage is not None:
            if isinstance(layers_per_stage, (str, bytes)) or not hasattr(layers_per_stage, "__iter__"):
                raise ConfigError(f"configuration: layers_per_stage must be a sequence of ints, got "
                                  f"{layers_per_stage!r}")
            layers_per_stage = tuple(check_int("configuration: layers_per_stage entry", c, 0)
                                     for c in layers_per_stage)
            if len(layers_per_stage) != parallelism.stages:
                raise ConfigError(f"configuration: layers_per_stage has {len(layers_per_stage)} entries, the "
                                  f"parallelism has pipeline x virtual = {parallelism.stages} stages")
            stage_of_layers(model, layers_per_stage=layers_per_stage)  # sums to the model's blocks
        for name, value in (("model", model), ("parallelism", parallelism), ("cluster", cluster),
                            ("global_batch", int(global_batch)), ("family", fam.name),
                            ("options", tuple(sorted(options.items()))), ("communication", communication),
                            ("layers_per_stage", layers_per_stage), ("overlap", overlap), ("framework", framework)):
            object.__setattr__(self, name, value)
        placement(parallelism, cluster)  # tensor groups inside a node, groups tiling the nodes

    # -- the discrete side ---------------------------------------------------------------------------
    @property
    def microbatches(self) -> int:
        """Microbatches per pipeline per step: ``global_batch / (microbatch_size x data)``."""
        return self.global_batch // (self.model.microbatch_size * self.parallelism.data)

    @property
    def placement(self) -> Placement:
        return placement(self.parallelism, self.cluster)

    def schedule(self) -> Schedule:
        """The pipeline schedule: ``devices = pipeline``, ``chunks = virtual`` where the family has chunks."""
        par = self.parallelism
        options = dict(self.options)
        if "chunks" in schedules.family(self.family).option_names:
            options["chunks"] = par.virtual
        s = cached_build(schedules.family(self.family), par.pipeline, self.microbatches, options)
        if s.stages != par.stages:
            raise ConfigError(f"configuration: {self.family} places {s.stages} stages on {par.pipeline} devices; "
                              f"set virtual={s.stages // par.pipeline} (parallelism has {par.stages} stages)")
        if s.stages > self.model.layers and self.layers_per_stage is None:
            raise ConfigError(f"configuration: {self.family} needs {s.stages} stages, the model has "
                              f"{self.model.layers} layers (give layers_per_stage with the embedding or head "
                              "alone on the first or last stage: 0 blocks there)")
        return s

    def graph(self, schedule: Schedule | None = None) -> Graph:
        """``compile`` of the schedule with the gradient-sync lane (``gradient_sync=True``), except
        for schedules that bring their own ``R``/``U`` ops (chimera's sync, the asynchronous
        families), which are compiled as they are."""
        schedule = self.schedule() if schedule is None else schedule
        return _graph_of(schedule, self.communication, self.placement.stages_per_node)

    # -- the cost side -------------------------------------------------------------------------------
    def costs(self) -> ParallelCosts:
        """The per-device per-layer table (``diffpipe._workload._parallel.parallel_costs``)."""
        return parallel_costs(self.model, self.parallelism)

    def collective_seconds_by_group(self, costs: ParallelCosts | None = None) -> dict[str, Array]:
        """``{group: [3, layers]}`` seconds of the collectives the ``F``, ``I`` and ``W`` of each layer
        issue, before any overlap: ring bytes over the group's bus bandwidth (``Cluster.bus_bandwidth``:
        the link's measured NCCL efficiency, hierarchical over nodes) plus a fitted latency per ring step
        (``Cluster.step_latency``)."""
        costs = self.costs() if costs is None else costs
        cluster = on_host(self.cluster)
        xp = array_module(cluster)
        dtype = cluster.device.throughput.dtype
        where = self.placement
        out = {}
        for group in GROUPS:
            link = where.links[group]
            bandwidth = cluster.bus_bandwidth(link, where.ranks_per_node[group])
            latency = cluster.step_latency(link)
            out[group] = (divide(xp.asarray(costs.collective_bytes[group], dtype), bandwidth)
                          + xp.asarray(costs.collective_hops[group], dtype) * latency)
        return out

    def exposed_collectives(self, costs: ParallelCosts | None = None,
                            compute: dict[str, Array] | None = None) -> dict[str, Array]:
        """``{kind: [3, layers]}`` collective seconds left on each op's critical path after the
        configuration's ``overlap``: ``tensor`` (all-reduces, or all-gathers and reduce-scatters with
        sequence parallelism) times ``1 - overlap.tensor``; ``expert`` (all-to-alls); ``gather``
        (ZeRO-3 parameter all-gathers: with ``overlap.prefetch``, only what exceeds the layer's own
        compute, which the prefetch runs under); with context parallelism, ``context`` (the K,V
        ring's transfers beyond the attention kernels they overlap: ``context_seconds``). What each
        hides costs ``overlap.contention`` of its time in slower compute (``CommunicationOverlap``)."""
        costs = self.costs() if costs is None else costs
        raw = self.collective_seconds_by_group(costs)
        overlap = self.overlap
        out = {"tensor": raw["tensor"] * (1.0 - overlap.tensor + overlap.contention * overlap.tensor),
               "expert": raw["expert"]}
        gather = raw["data"]
        if overlap.prefetch:
            compute = self.compute_seconds(costs) if compute is None else compute
            gather = overlap.hidden_cost(gather, sum(compute.values()))
        out["gather"] = gather
        if costs.context_block is not None:
            out["context"] = self.context_seconds(costs)
        if overlap.every_microbatch and self.parallelism.shards > 1 and self.microbatches > 1:
            compute = self.compute_seconds(costs) if compute is None else compute
            out["reduce"] = self.microbatch_reduction(costs, compute)
        return out

    def microbatch_reduction(self, costs: ParallelCosts, compute: dict[str, Array]) -> Array:
        """``[3, layers]`` seconds the gradient reduction of every microbatch but the last adds to the
        layer's ``W`` (``overlap.every_microbatch``): a reduce-scatter of each layer's gradients (ZeRO-1-3;
        an all-reduce without ZeRO) over the data group's bus, run under the layer's own backward
        (``hidden_cost``: what exceeds it, plus the contention of what it hides), averaged over the
        microbatches (the last one's reduction is the step's sync lane)."""
        par, model = self.parallelism, self.model
        cluster = on_host(self.cluster)
        xp = array_module(cluster)
        where = self.placement
        link = where.links["data"]
        n = par.shards
        bus = cluster.bus_bandwidth(link, where.ranks_per_node["data"])
        r, d = float(model.reduction_bytes), float(model.dtype_bytes)
        per_param = sync_bytes_per_parameter(par.zero, r, d)  # costs.gradient_bytes is all-reduce-equivalent
        ring, steps = (2.0, 2 * (n - 1)) if par.zero == 0 else (1.0, n - 1)
        dtype = cluster.device.throughput.dtype
        reduce_bytes = xp.asarray(costs.gradient_bytes, dtype) * (r / per_param)  # parameters x r
        seconds = divide(ring * (n - 1) / n * reduce_bytes, bus) + steps * cluster.step_latency(link)
        total = sum(compute.values())
        paid = (self.microbatches - 1) / self.microbatches * hidden_cost(seconds, total[_I] + total[_W],
                                                                          self.overlap.contention)
        zero = xp.zeros((model.layers + 2,), dtype)
        return xp.stack([zero, zero, paid.astype(dtype)])  # W (_W = 2) alone

    def context_seconds(self, costs: ParallelCosts | None = None) -> Array:
        """``[3, layers]`` seconds of the context-parallel K,V ring left on each op's critical path
        (``diffpipe._workload._parallel.ring_exchange``): point-to-point transfers between neighbours of
        the context group at its link's bus bandwidth (one NIC per transfer across nodes) and ring-step
        latency, each overlapping one ring step's attention kernel (its seconds from the device's
        ``KernelModel``; on a device without one the ring is not overlapped)."""
        costs = self.costs() if costs is None else costs
        cluster = on_host(self.cluster)
        xp = array_module(cluster)
        dtype = cluster.device.throughput.dtype
        if costs.context_block is None:
            return xp.zeros((3, self.model.layers + 2), dtype)
        link = self.placement.links["context"]
        bandwidth = cluster.bus_bandwidth(link, 1)
        latency = cluster.step_latency(link)
        c = costs.context
        device, k = cluster.device, costs.kernels
        steps: dict[str, Any] = {"forward_step": 0.0, "backward_step": 0.0,
                                 "recompute_step": 0.0 if costs.recomputes_attention else None}
        if device.kernels is not None and k is not None and len(k.attention):
            def attention(backward: bool) -> Array:  # [3, layers] seconds of one ring step's kernel
                only = k.attention[(k.attention[:, 4] > 0) == backward]
                empty = Kernels(np.zeros((0, 7)), only, np.zeros((0, 4)), k.rows)
                return divide(kernel_times(empty, device, float(self.model.dtype_bytes))["attention"], c)

            forward, backward = attention(False), attention(True)
            steps = {"forward_step": forward[_F], "backward_step": backward[_I],
                     "recompute_step": forward[_I] if costs.recomputes_attention else None}
        return xp.asarray(ring_exchange(costs.context_block, c, bandwidth, latency, **steps,
                                        contention=self.overlap.contention), dtype)

    def collective_seconds(self, costs: ParallelCosts | None = None) -> Array:
        """``[3, layers]`` seconds of the collectives the ``F``, ``I`` and ``W`` of each layer wait for
        (``exposed_collectives``, summed over kinds)."""
        return sum(self.exposed_collectives(costs).values())

    def sync_scale(self, costs: ParallelCosts | None = None, compute: dict[str, Array] | None = None) -> Array:
        """``[layers]`` factor on each layer's gradient bytes for the engine's sync lane, which prices a
        ring over the raw data link: the link's bandwidth over the bus bandwidth (``Cluster.bus_bandwidth``),
        times the share of the stage's sync left on the critical path. With ``overlap.data_bucket``, the
        gradient reduction is left after the stage's last backward by its last bucket, or by what the
        last microbatch's backward of that stage cannot hide; with ``overlap.param_gather`` (ZeRO-1/2),
        the weights' all-gather runs under the next step's forward. What they hide costs
        ``overlap.contention`` of its time (the compute it runs under is that much slower)."""
        costs = self.costs() if costs is None else costs
        overlap, par, model = self.overlap, self.parallelism, self.model
        cluster = on_host(self.cluster)
        xp = array_module(cluster)
        where = self.placement
        link = where.links["data"]
        bus = cluster.bus_bandwidth(link, where.ranks_per_node["data"])
        scale = cluster.link(link)[0] / bus
        dtype = cluster.device.throughput.dtype
        rows = self.stage_rows()
        # the weights' all-gather's part of ZeRO-1/2's all-reduce-equivalent bytes, (r + d) / 2 a parameter
        d = float(model.dtype_bytes)
        gather = d / (float(model.reduction_bytes) + d) if overlap.param_gather and par.zero in (1, 2) else 0.0
        hidden_gather = gather * overlap.contention
        if overlap.data_bucket is None or par.shards == 1:
            return xp.broadcast_to(scale * (1.0 - gather + hidden_gather), rows.shape).astype(dtype)
        compute = self.compute_seconds(costs) if compute is None else compute
        total = sum(compute.values())
        backward = total[_I] + total[_W]
        onehot = xp.asarray(rows[None, :] == np.arange(par.stages)[:, None], dtype)  # [stages, layers]
        n = par.shards
        full = _stage_sums(onehot, xp.asarray(costs.gradient_bytes, dtype))  # all-reduce-equivalent bytes a stage
        stage_bytes = (1.0 - gather) * full  # the reduction's
        sync = divide(2.0 * (n - 1) / n * stage_bytes, bus)
        hidden = _stage_sums(onehot, backward)
        tail = xp.minimum(overlap.data_bucket, stage_bytes)
        safe = xp.where(stage_bytes > 0, stage_bytes, 1.0)
        exposed = xp.maximum(tail / safe, xp.maximum(sync - hidden, 0.0) / xp.where(sync > 0, sync, 1.0))
        reduction = exposed + overlap.contention * (1.0 - exposed)
        share = (1.0 - gather) * reduction + hidden_gather
        if overlap.bucket_latency:
            share = share + self._bucket_latency_share(full, sync, hidden, bus, gather > 0)
        share = xp.where(stage_bytes > 0, share, 1.0)
        return scale * share[rows]  # each layer its stage's share

    def _bucket_latency_share(self, full: Any, sync: Any, hidden: Any, bus: Any, param_gather: bool) -> Array:
        """``[stages]`` share of each stage's sync (``sync_scale``'s unit: the stage's whole all-reduce-
        equivalent bytes ``full`` over the bus) that its buckets' ring latencies add (``overlap.bucket_latency``).
        Each bucket is one collective: a reduce-scatter (ZeRO-1-3; ``n - 1`` ring steps) or an all-reduce
        (``2 (n - 1)``), plus ZeRO-1/2's weight all-gather (``n - 1``), each step at the data link's
        ``Cluster.step_latency``. The buckets before the last run under the backward: ``hidden_cost``
        against what the backward leaves after the sync's bandwidth part; the last bucket's is the sync
        lane's own ring latency (the engine's). With ``param_gather`` every bucket's weight all-gather
        runs under the next forward, at ``contention`` of its latency."""
        overlap, par, model = self.overlap, self.parallelism, self.model
        cluster = on_host(self.cluster)
        xp = array_module(cluster, sync)
        n = par.shards
        r, d = float(model.reduction_bytes), float(model.dtype_bytes)
        grads = full * (r / sync_bytes_per_parameter(par.zero, r, d))  # parameters x r
        buckets = xp.maximum(grads / overlap.data_bucket, 1.0)
        step = cluster.step_latency(self.placement.links["data"])
        reduce_steps = 2.0 * (n - 1) if par.zero == 0 else float(n - 1)
        gather_steps = float(n - 1) if par.zero in (1, 2) else 0.0
        backward_steps = reduce_steps + (0.0 if param_gather else gather_steps)
        in_backward = (buckets - 1.0) * backward_steps * step
        seconds = hidden_cost(in_backward, xp.maximum(hidden - sync, 0.0), overlap.contention)
        if param_gather:
            seconds = seconds + overlap.contention * buckets * gather_steps * step
        whole = divide(2.0 * (n - 1) / n * full, bus)
        return xp.where(whole > 0, seconds / xp.where(whole > 0, whole, 1.0), 0.0)

    def network(self) -> Network:
        """Links of the pipeline: neighbours inside a node use the intra link, others the inter link
        (which are inside a node is the graph's ``devices_per_node``: ``graph()`` compiles for
        ``placement.stages_per_node``); ``data_parallel = data x context`` (the gradient all-reduce's
        ranks: Megatron-LM reduces over the data and context groups together) over that group's link."""
        c = self.cluster
        return Network(c.intra_latency, c.intra_bandwidth, c.inter_latency, c.inter_bandwidth,
                       data_parallel=self.parallelism.shards, data_parallel_link=self.placement.links["data"])

    def compute_seconds(self, costs: ParallelCosts | None = None) -> dict[str, Array]:
        """``{class: [3, layers]}`` compute seconds of the ``F``, ``I`` and ``W`` of each layer on one
        device: per kernel class (``gemm``, ``attention``, ``memory``, ``launch``) when the device has a
        ``KernelModel`` (``diffpipe._model._kernels.kernel_times``), else one class ``roofline`` (each
        op one roofline, ``LayerCosts.times``). With a framework whose host dispatch has a cost
        (``Framework.host_op_seconds``) a class ``host`` more: what the host's dispatch of an op's kernels (kernels
        launched x that cost) exceeds their GPU time by, so that the classes sum to ``max(GPU, host)`` per op."""
        costs = self.costs() if costs is None else costs
        device = self.cluster.device
        if device.kernels is not None and costs.kernels is not None:
            out = kernel_times(costs.kernels, device, float(self.model.dtype_bytes))
            host = 0.0 if self.framework is None else self.framework.host_op_seconds
            if host > 0:  # the host's dispatch where it is slower than the kernels (Framework.host_op_seconds)
                xp = array_module(out["launch"])
                gpu = sum(out.values())
                out["host"] = xp.maximum(xp.asarray(host * costs.kernels.count(), gpu.dtype) - gpu, 0.0)
            return out
        times = on_host(costs.costs.times(device))  # one compiled program (Device.seconds)
        return {"roofline": array_module(times).stack(times)}

    def update_seconds(self, costs: ParallelCosts | None = None) -> Array:
        """Seconds of each layer's optimizer step: its memory traffic over the memory bandwidth (at the
        kernel model's sustained fraction of it, when the device has one); with a framework whose optimizer
        loops over the parameters with a host sync in each iteration (``Framework.optimizer_ops``), the sum over the
        layer's parameter tensors (``parameter_tensors``) of the larger of the host's dispatch, ``optimizer_ops x
        host_op_seconds``, and the tensor's kernels, ``optimizer_ops`` fixed kernel costs (``KernelModel.overhead``)
        plus its share of the layer's traffic: the sync leaves neither side running ahead of the other."""
        costs = self.costs() if costs is None else costs
        cluster = on_host(self.cluster)
        device = cluster.device
        dtype = device.throughput.dtype
        bandwidth = cluster.memory_bandwidth
        if device.kernels is not None:
            bandwidth = bandwidth * device.kernels.memory_efficiency
        xp = array_module(cluster)
        gpu = divide(xp.asarray(costs.update_bytes, dtype), bandwidth)
        f = self.framework
        if f is None or not f.optimizer_ops:
            return gpu
        # a host sync in every parameter's iteration: the host cannot run ahead, nor the GPU pipeline one
        # parameter's kernels behind another's (Framework.optimizer_ops): each tensor takes the larger of the host's
        # dispatch and its kernels (their fixed costs, and its share of the layer's update traffic)
        tensors = parameter_tensors(self.model)
        width = max(len(t) for t in tensors)
        share = np.zeros((len(tensors), width))
        for row, elements in enumerate(tensors):
            share[row, :len(elements)] = elements / elements.sum()
        present = xp.asarray(share > 0, dtype)
        fixed = 0.0 if device.kernels is None else device.kernels.overhead * f.optimizer_ops
        kernels = gpu[:, None] * xp.asarray(share, dtype) + fixed * present
        host = xp.asarray(f.optimizer_ops * f.host_op_seconds, dtype) * present
        return xp.maximum(kernels, host).sum(axis=1)

    def workload(self) -> Workload:
        """One pipeline rank's per-layer ``Workload`` (rows: embedding, blocks, head)."""
        costs = self.costs()
        device = self.cluster.device
        compute = self.compute_seconds(costs)
        forward, input_grad, weight = sum(compute.values())
        dtype = forward.dtype
        xp = array_module(forward)
        comm = sum(self.exposed_collectives(costs, compute).values())
        sync = self.sync_scale(costs, compute)
        rows = tuple(np.bincount(self.stage_rows()).tolist())
        # NumPy float32 tables (concrete inputs) enter JAX here, each by one transfer
        return Workload.from_table(
            forward + comm[_F], input_grad + comm[_I], weight + comm[_W],
            update=self.update_seconds(costs),
            static_bytes=xp.asarray(costs.static_bytes, dtype),
            gradient_bytes=xp.asarray(costs.gradient_bytes, dtype) * sync,
            activation_bytes=xp.asarray(costs.activation_bytes, dtype),
            output_bytes=xp.asarray(costs.output_bytes, dtype),
            capacity=device.memory, network=self.network(), samples=float(self.model.microbatch_size),
            layers_per_stage=rows, shared_static_bytes=costs.shared_static_bytes,
            shared_gradient_bytes=float(costs.shared_gradient_bytes) * sync[-1],
        )

    def stage_rows(self, layers_per_stage: Any = None) -> np.ndarray:
        """The model stage of every ``workload()`` row (embedding, blocks, head), for blocks per stage
        ``layers_per_stage`` (default the configuration's, else as even as possible)."""
        split = self.layers_per_stage if layers_per_stage is None else tuple(layers_per_stage)
        stages = None if split is not None else self.parallelism.stages
        return stage_of_layers(self.model, stages, split)

    def hardware(self, layers_per_stage: Any = None) -> Hardware:
        """``Hardware`` of ``schedule()`` (blocks per stage: ``layers_per_stage``, else the
        configuration's, else as even as possible)."""
        workload = self.workload()
        rows = tuple(np.bincount(self.stage_rows(layers_per_stage)).tolist())
        return workload.hardware(workload.boundaries(rows))

    def makespan(self, temperature: Any = None) -> Array:
        """``diffpipe.makespan`` of this configuration (differentiable in the cluster's floats)."""
        return makespan(self.graph(), self.hardware(), temperature=temperature)

    # -- the answer ----------------------------------------------------------------------------------
    def evaluate(self, headroom: float = HEADROOM, *, jitter: Jitter | None = None, samples: int = 512,
                 seed: int = 0) -> ConfigResult:
        """Simulate one step exactly (see the module docstring for every figure); ``fits`` keeps
        ``headroom`` of the memory free.

        With ``jitter`` (a ``dp.Jitter``: per-kind coefficients of variation, stragglers) the step is
        also sampled ``samples`` times by batched Monte Carlo (``dp.sample_makespans``, key
        ``jax.random.key(seed)``): each op's ranks of a tensor-parallel group run in lock-step (the
        ``Jitter``'s ``group`` is the tensor size times its own; with context parallelism, times the
        context size: the ring attention couples those ranks every layer), the ``data`` replicas of the
        pipeline end together at the gradient sync (``replicas = data``). The result then carries
        ``expected_step_time`` and ``p95_step_time``, and the breakdown's ``jitter`` entry is the
        expected step less the deterministic one; every other figure stays the deterministic step's.
        """
        schedule = self.schedule()
        graph, hardware = self.graph(schedule), self.hardware()
        result = simulate(graph, hardware)
        result = dataclasses.replace(result, ops=schedule.ops, staleness=schedule_staleness(schedule))
        step = float(result.makespan)
        figures = self.figures(schedule, step, float(result.bubble_ratio), result.peak_memory, headroom)
        if jitter is not None:
            if not isinstance(jitter, Jitter):
                raise ConfigError(f"evaluate: jitter must be a dp.Jitter, got {type(jitter).__name__}")
            check_int("evaluate: seed", seed, 0)
            lockstep = Jitter(forward=jitter.cv[0], backward=jitter.cv[1], input_grad=jitter.cv[2],
                              weight=jitter.cv[3], slow_fraction=jitter.slow_fraction,
                              slow_factor=jitter.slow_factor,
                              group=jitter.group * self.parallelism.tensor * self.parallelism.context)
            times = step_time_summary(sample_makespans(graph, hardware, lockstep, key=jax.random.key(seed),
                                                       samples=samples, replicas=self.parallelism.data))
            figures |= dict(expected_step_time=times["mean"], p95_step_time=times["p95"])
            figures["breakdown"]["jitter"] = times["mean"] - step
        return ConfigResult(**figures, result=result, headroom=headroom)

    def figures(self, schedule: Schedule, step: float, bubble_ratio: float, memory: Any,
                headroom: float = HEADROOM) -> dict[str, Any]:
        """Every ``ConfigResult`` figure but ``result``, from a simulated step of ``schedule`` (its
        ``step`` time, ``bubble_ratio`` and per-rank peak ``memory``): the one place of the
        formulas, which ``evaluate`` and ``plan`` (its batched simulations) both use."""
        par, model, device = self.parallelism, self.model, self.cluster.device
        gpus = par.gpus
        costs = self.costs()
        compute = self.compute_seconds(costs)
        exposed = self.exposed_collectives(costs, compute)
        rows = self.stage_rows()

        def per_device(table: Any) -> np.ndarray:
            """Seconds each pipeline rank spends per step in a ``[3, layers]`` per-op table."""
            table = np.asarray(table, np.float64)
            per_stage = np.zeros((3, par.stages))
            for row, stage in enumerate(rows):
                per_stage[:, stage] += table[:, row]
            per_kind = {"F": per_stage[_F], "B": per_stage[_I] + per_stage[_W], "I": per_stage[_I],
                        "W": per_stage[_W]}
            busy = np.zeros(schedule.devices)
            for device_index, order in enumerate(schedule.orders):
                for op in order:
                    if op.kind in per_kind:
                        busy[device_index] += per_kind[op.kind][op.stage]
            return busy

        busy = per_device(sum(exposed.values()))
        breakdown = {f"compute_{name}": float(np.mean(per_device(table))) for name, table in compute.items()}
        breakdown |= {f"exposed_{name}": float(np.mean(per_device(table))) for name, table in exposed.items()}
        breakdown["bubble"] = bubble_ratio * step
        memory = tuple(float(x) for x in np.asarray(memory))
        capacity = float(device.memory)
        peak = float(device.peak_flops)
        flops = model.model_flops() * self.microbatches * par.data
        return dict(
            step_time=step,
            tokens_per_second_per_gpu=self.global_batch * model.sequence / step / gpus if step > 0 else math.nan,
            mfu=flops / (step * gpus * peak) if step > 0 else math.nan,
            memory_per_gpu=max(memory), memory=memory, capacity=capacity,
            fits=fits_memory(max(memory), capacity, headroom),
            bubble_ratio=bubble_ratio,
            communication_share=float(np.mean(busy)) / step if step > 0 else math.nan,
            microbatches=self.microbatches, gpus=gpus, family=self.family, gradient_sync=gradient_sync(schedule),
            breakdown=breakdown,
        )


@dataclass(frozen=True)
class ConfigResult:
    """What ``Configuration.evaluate`` reports (units: seconds, bytes; see the module docstring).

    Attributes:
        step_time, tokens_per_second_per_gpu, mfu: the step and its throughput.
        memory_per_gpu: bytes, the peak over pipeline ranks; ``memory``: per pipeline rank.
        capacity, fits: the device memory and whether ``memory_per_gpu`` fits it, ``headroom`` of
            it kept free (``usable``).
        bubble_ratio, communication_share: idle share of the step, and the share spent in the
            collectives inside ops (mean over pipeline ranks).
        microbatches, gpus, family: the configuration's sizes.
        gradient_sync: whether the step includes the gradient-sync lane (False for schedules with
            their own ``R``/``U`` ops).
        breakdown: seconds per step, the mean over pipeline ranks: ``compute_<class>`` per kernel class
            (``gemm``, ``attention``, ``memory``, ``launch``; ``roofline`` for a device without a
            ``KernelModel``), ``exposed_<kind>`` per collective kind left on the ops' critical path
            (``tensor``, ``expert``, ``gather``: ZeRO-3 parameter all-gathers), and ``bubble``
            (``bubble_ratio x step_time``). What remains of the step (optimizer, gradient sync tail,
            pipeline transfers) is ``step_time`` less the rest. With ``evaluate(jitter=...)``,
            ``jitter``: the expected step less the deterministic one.
        result: the simulated step (``diffpipe.Result``, the schedule's ops).
        expected_step_time, p95_step_time: the mean and 95th percentile of the sampled steps
            (``evaluate(jitter=...)``; ``None`` without jitter).
    """

    step_time: float
    tokens_per_second_per_gpu: float
    mfu: float
    memory_per_gpu: float
    memory: tuple[float, ...]
    capacity: float
    fits: bool
    bubble_ratio: float
    communication_share: float
    microbatches: int
    gpus: int
    family: str
    gradient_sync: bool
    result: Result
    headroom: float = HEADROOM
    breakdown: dict[str, float] = dataclasses.field(default_factory=dict)
    expected_step_time: float | None = None
    p95_step_time: float | None = None

    @property
    def usable(self) -> float:
        """Bytes a configuration may use: the capacity less the headroom (``usable_memory``)."""
        return usable_memory(self.capacity, self.headroom)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: every figure (seconds, bytes), without the per-op ``result``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "result"} | {
            "memory": list(self.memory)}

    def to_json(self, path: Any = None, indent: int | None = 2) -> str:
        """Strict JSON text of ``to_dict()``; also written atomically to ``path`` when given."""
        return json_text(self.to_dict(), path, indent)


__all__ = ["HEADROOM", "ConfigResult", "Configuration", "check_headroom", "fit_rule", "fits_memory", "gradient_sync",
           "usable_memory"]
