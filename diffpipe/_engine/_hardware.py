"""``Hardware``: a differentiable model of the machine a schedule runs on.

Every float leaf is a JAX array (differentiable, vmap-able); configuration (the data-parallel
size and link) is static. The communication mode and the topology are the graph's
(``compile(communication=..., devices_per_node=...)``, ``Graph.communication`` and
``Graph.devices_per_node``): the cost rows read them there, so one hardware prices a schedule under
whichever mode and devices per node it was compiled for. Per-stage leaves may be scalars (every
stage alike), ``[stages]`` (pipeline replicas alike) or ``[pipelines, stages]``; per-microbatch leaves scalars or
``[microbatches]``; they are broadcast against a ``Graph`` at evaluation and must match it.

Cost model (summarised in docs/architecture.md, "The cost model"):
- op duration = ``overhead[kind] + size[m] * time[kind, pipeline, stage]``; the per-op overhead
  is ``overhead`` for every kind, or, where ``kind_overhead`` is given, ``kind_overhead[k]`` for
  ``k`` in ``F, B, I, W`` *instead* (calibration measures a different framework gap before each
  kind); ``B`` costs ``I + W``, or ``full_backward[p, s]`` where given (torch's split backward
  costs more than its full one: issue 13); ``U`` costs ``overhead + update[p, s]``;
- an overlapped pair (``Schedule.overlapped``: DualPipe's F&B) of a forward lasting ``f`` and a
  backward lasting ``b`` (each as above, overheads included) lasts
  ``f + b - pair_overlap[p, s] * min(f, b)`` (``schedules._reference.overlapped_time``; ``p, s`` the
  forward's): ``pair_overlap`` is the fraction of the shorter pass hidden under the longer one, 0 (or
  None, the default) no overlap (F + B), 1 the pair as long as its longer member;
- the step: every op starts at least ``setup`` after the step begins, and the step ends
  ``wind_down`` after its last op. In max-plus terms a source node (no predecessor) also lasts
  ``setup`` (which shifts the whole timeline by ``setup``) and a sink (no successor) also lasts
  ``wind_down``; ``simulate`` reports the ops' own start, finish and busy time without them;
- transfer = ``latency(link) + size[m] * message_bytes[p, boundary] / bandwidth(link)`` (alpha-beta);
  where given, every cross-device transfer also costs host (CPU/DMA) time on both devices:
  ``send_cost`` added to the duration of the op that produces it, ``recv_cost`` to the op that
  consumes it (posting and completing the send and the receive; a calibration measures them);
- ring all-reduce of ``n`` participants: ``2(n-1)/n * bytes / bandwidth + 2(n-1) * latency`` over
  the slowest link of the group (Patarasuk and Yuan, JPDC 2009; Thakur et al., IJHPCA 2005);
- memory per device: static bytes of every stage held (times weight versions) plus stored
  activations ``activation_bytes[p, s] * size[m]`` from ``F`` until ``B`` (or ``W``) frees them.

Why one module past 500 lines: ``Network`` and ``Hardware`` are the built-in cost model's one pytree,
and its cost rows (``tables``), its checks against a graph and ``pad_hardware`` each read every
field of it.
"""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._arrays import concrete
from .._checks import MODE_MOVED, TOPOLOGY_MOVED, check_moved
from .._errors import ConfigError
from ..schedules._reference import overlapped_time
from ._communication import AbstractCommunication
from ._cost_model import AbstractCostModel, CostTables
from ._graph import (
    COST_F,
    COST_I,
    COST_PAIR,
    COST_R,
    COST_RECEIVES,
    COST_SENDS,
    COST_T,
    COST_U,
    COST_W,
    ROLE_SINK,
    ROLE_SOURCE,
    Graph,
)
from ._jit_checks import check_values, checked_float, error_if, traced_check

#: Why a hardware that knows only full backwards (``Hardware.split_known`` False) refuses I/W ops.
SPLIT_UNKNOWN = ("hardware: the schedule splits its backward (I/W ops) but this hardware knows only full "
                 "backwards (calibrated from full-backward runs); give the calibration the W share "
                 "(from_torch_trace(..., model=) or (..., probe=profile_stages(...))) or weight_fraction=")


def check_split_known(split_known: bool, work: Any) -> None:
    """Raise ``SPLIT_UNKNOWN`` (a ``ConfigError``) when only full backwards are known
    (``split_known`` False) and ``work`` (a ``Schedule`` or a concrete ``Graph``) has ``I`` or
    ``W`` ops: the eager form of ``Hardware.tables``' check, for callers that would otherwise
    price the ops (a sweep's stacked leaves, an optimizer's workload) without it, and before
    anything is traced (inside jit it surfaces through a runtime callback, which prints a
    traceback). A traced graph passes (``tables`` checks it in the program)."""
    if split_known:
        return
    if isinstance(work, Graph):
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(work)):
            return  # a traced graph: ``tables`` checks it inside the program
        rows = np.asarray(work.node_cost[..., 0])
        split = bool(np.any((rows == COST_I) | (rows == COST_W)))
    else:
        split = any(op.kind in ("I", "W") for order in work.orders for op in order)
    if split:
        raise ConfigError(SPLIT_UNKNOWN)


#: ``Network.data_parallel_link`` values: which link a data-parallel ring runs over.
DATA_PARALLEL_LINKS = ("inter", "intra")


class Network(eqx.Module):
    """Alpha-beta network: latency (s) and bandwidth (bytes/s) inside a node and between nodes.

    ``pair_latency`` / ``pair_bandwidth`` (``[devices, devices]``), when given, override the
    node-based values for each directed pair. The communication mode and the topology are not the
    network's but the graph's (``compile(communication=..., devices_per_node=...)``): the mode
    decides how a transfer is charged on these links, the graph's devices per node which pairs
    are inter-node.
    ``data_parallel`` > 1 adds an external data-parallel group to every collective ``R``, whose
    ring then also runs over ``data_parallel_link``: ``"inter"`` (default: the replicas sit on
    other nodes; ``inter_latency``/``inter_bandwidth``) or ``"intra"`` (``latency``/``bandwidth``).
    """

    latency: Float[Array, ""]
    bandwidth: Float[Array, ""]
    inter_latency: Float[Array, ""]
    inter_bandwidth: Float[Array, ""]
    pair_latency: Float[Array, "devices devices"] | None = None
    pair_bandwidth: Float[Array, "devices devices"] | None = None
    data_parallel: int = eqx.field(static=True, default=1)
    data_parallel_link: str = eqx.field(static=True, default="inter")
    #: ``data_parallel`` as a traced int32 scalar (``with_traced_data_parallel``), so that one
    #: compiled program serves every data-parallel size; None: the static ``data_parallel``.
    replicas: Int[Array, ""] | None = None

    def __init__(self, latency: Any, bandwidth: Any, inter_latency: Any, inter_bandwidth: Any,
                 pair_latency: Any = None, pair_bandwidth: Any = None, data_parallel: int = 1,
                 data_parallel_link: str = "inter", replicas: Any = None, **moved: Any):
        # the mode and the topology are the graph's now: say where they went
        check_moved("Network", moved, MODE_MOVED | TOPOLOGY_MOVED)
        self.latency, self.bandwidth = latency, bandwidth
        self.inter_latency, self.inter_bandwidth = inter_latency, inter_bandwidth
        self.pair_latency, self.pair_bandwidth = pair_latency, pair_bandwidth
        self.data_parallel, self.data_parallel_link = data_parallel, data_parallel_link
        self.replicas = replicas

    def __check_init__(self) -> None:
        if not isinstance(self.data_parallel, int) or self.data_parallel < 1:
            raise ConfigError(f"network: data_parallel must be a positive int, got {self.data_parallel!r}")
        if self.data_parallel_link not in DATA_PARALLEL_LINKS:
            raise ConfigError(f"network: data_parallel_link must be one of {', '.join(DATA_PARALLEL_LINKS)}, "
                              f"got {self.data_parallel_link!r}")
        check_values("network latency", self.latency)
        check_values("network inter_latency", self.inter_latency)
        check_values("network bandwidth", self.bandwidth, positive=True, allow_inf=True)
        check_values("network inter_bandwidth", self.inter_bandwidth, positive=True, allow_inf=True)
        if self.pair_latency is not None:
            check_values("network pair_latency", self.pair_latency)
        if self.pair_bandwidth is not None:
            check_values("network pair_bandwidth", self.pair_bandwidth, positive=True, allow_inf=True)

    @classmethod
    def uniform(cls, latency: Any = 0.0, bandwidth: Any = math.inf, **moved: Any) -> Network:
        """Every link alike (inside a node and between nodes)."""
        check_moved("Network.uniform", moved, MODE_MOVED | TOPOLOGY_MOVED)
        return cls(checked_float(latency, "latency"), checked_float(bandwidth, "bandwidth"),
                   checked_float(latency, "latency"), checked_float(bandwidth, "bandwidth"))

    def links(self, devices: int, devices_per_node: int) -> tuple[Array, Array]:
        """``[devices, devices]`` latency and bandwidth of every directed pair, ``devices_per_node``
        (the graph's) sharing a node."""
        node = np.arange(devices) // devices_per_node
        same = jnp.asarray(node[:, None] == node[None, :])
        latency = jnp.where(same, self.latency, self.inter_latency)
        bandwidth = jnp.where(same, self.bandwidth, self.inter_bandwidth)
        if self.pair_latency is not None:
            latency = self._pairs(self.pair_latency, devices, "pair_latency")
        if self.pair_bandwidth is not None:
            bandwidth = self._pairs(self.pair_bandwidth, devices, "pair_bandwidth")
        latency = traced_check("network latency", latency)
        bandwidth = traced_check("network bandwidth", bandwidth, positive=True, allow_inf=True)
        return latency, bandwidth

    def with_traced_data_parallel(self) -> Network:
        """This network with ``data_parallel`` carried as an array leaf (``replicas``) and the
        static field 1: programs compiled for it serve every data-parallel size with the same
        results (the ring's participants are an integer product either way)."""
        if self.replicas is not None:
            return self
        return Network(self.latency, self.bandwidth, self.inter_latency, self.inter_bandwidth, self.pair_latency,
                       self.pair_bandwidth, data_parallel=1, data_parallel_link=self.data_parallel_link,
                       replicas=np.asarray(self.data_parallel, np.int32))

    def data_parallel_links(self, mode: AbstractCommunication) -> tuple[Array, Array]:
        """Latency and bandwidth of the data-parallel link (``data_parallel_link``), as the
        communication mode ``mode`` (the graph's) charges them."""
        if self.data_parallel_link == "intra":
            return mode.links(self.latency, self.bandwidth)
        return mode.links(self.inter_latency, self.inter_bandwidth)

    @staticmethod
    def _pairs(matrix: Array, devices: int, name: str) -> Array:
        if matrix.shape != (devices, devices):
            raise ConfigError(f"network: {name} has shape {matrix.shape}, the schedule has {devices} devices")
        return matrix


def _optional(value: Any, what: str) -> Array | None:
    """An optional float leaf: None stays None (no leaf), anything else becomes a float array."""
    return None if value is None else checked_float(value, what)


def _kind_overhead(value: Any, overhead: Any) -> Array | None:
    """``from_times``' ``kind_overhead``: None, four values (``OVERHEAD_KINDS``), or a mapping of
    some kinds to seconds (the others take ``overhead``)."""
    if value is None:
        return None
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(OVERHEAD_KINDS))
        if unknown:
            raise ConfigError(f"hardware: kind_overhead has unknown kind(s) {unknown}; kinds are "
                              f"{', '.join(OVERHEAD_KINDS)}")
        default = checked_float(overhead, "overhead")
        return jnp.stack([checked_float(value[k], f"kind_overhead[{k}]") if k in value else default
                          for k in OVERHEAD_KINDS])
    return checked_float(value, "kind_overhead")


def _required(what: str, name: str, value: Any) -> Any:
    """``value``, which must be given: a ``ConfigError`` naming ``name`` otherwise."""
    if value is None:
        raise ConfigError(f"{what}: {name} is required (seconds of the input-gradient backward I)")
    return value


#: The kinds ``Hardware.kind_overhead`` lists, in order (the compute kinds).
OVERHEAD_KINDS = ("F", "B", "I", "W")
#: The ``Hardware`` leaves given per stage (``[pipelines, stages]`` once normalised): those that
#: depend on where the stage boundaries sit (``Workload.stage_fields``, the stage-balance knob, the
#: sweep's stacking).
STAGE_FIELDS = ("forward", "input_grad", "weight", "update", "message_bytes", "gradient_bytes", "static_bytes",
                "activation_bytes")


class Hardware(AbstractCostModel):
    """The built-in cost model: per-stage compute times, per-microbatch sizes, the network and the memory terms.

    Times are seconds for a microbatch of relative size 1; bytes are bytes. ``input_grad`` is the
    input-gradient part ``I`` of the backward, ``weight`` the weight-gradient part ``W``; a full
    ``B`` costs both, unless ``full_backward`` (per stage, optional) gives its own time.
    ``kind_overhead`` (optional, ``[4]``: ``F, B, I, W``) replaces ``overhead`` per compute kind;
    ``setup`` and ``wind_down`` are fixed times before the first op and after the last one of a
    step (module docstring); ``pair_overlap`` (optional, in [0, 1], a scalar or per stage of the
    pair's forward) the hidden fraction of an overlapped pair's shorter member (module docstring);
    ``send_cost`` / ``recv_cost`` (optional scalars) the host time a cross-device transfer costs
    the op that sends it / receives it (module docstring). All are float leaves, differentiable;
    their default, None (no leaf: the pytree of a plain hardware is unchanged), is the plain
    model: overhead, I + W, 0, 0, pairs lasting F + B, transfers costing no op any time.
    ``split_known`` (static, default True): False when only full backwards were measured (a
    calibration from full-backward runs: ``input_grad`` holds the whole ``B``, ``weight`` 0), so
    a graph with ``I`` or ``W`` ops is refused (``SPLIT_UNKNOWN``) instead of priced as I = B, W = 0.
    """

    forward: Float[Array, "..."]
    input_grad: Float[Array, "..."]
    weight: Float[Array, "..."]
    update: Float[Array, "..."]
    overhead: Float[Array, ""]
    size: Float[Array, "..."]
    message_bytes: Float[Array, "..."]
    gradient_bytes: Float[Array, "..."]
    static_bytes: Float[Array, "..."]
    activation_bytes: Float[Array, "..."]
    capacity: Float[Array, "..."]
    network: Network
    kind_overhead: Float[Array, "4"] | None = None
    full_backward: Float[Array, "..."] | None = None
    setup: Float[Array, ""] | None = eqx.field(default=None, converter=lambda v: _optional(v, "setup"))
    wind_down: Float[Array, ""] | None = eqx.field(default=None, converter=lambda v: _optional(v, "wind_down"))
    pair_overlap: Float[Array, "..."] | None = eqx.field(default=None,
                                                         converter=lambda v: _optional(v, "pair_overlap"))
    send_cost: Float[Array, ""] | None = eqx.field(default=None, converter=lambda v: _optional(v, "send_cost"))
    recv_cost: Float[Array, ""] | None = eqx.field(default=None, converter=lambda v: _optional(v, "recv_cost"))
    split_known: bool = eqx.field(default=True, static=True)

    def __check_init__(self) -> None:
        for name in ("forward", "input_grad", "weight", "update", "overhead", "size", "message_bytes",
                     "gradient_bytes", "static_bytes", "activation_bytes"):
            check_values(name, getattr(self, name))
        for name in ("kind_overhead", "full_backward", "setup", "wind_down", "pair_overlap", "send_cost",
                     "recv_cost"):
            if getattr(self, name) is not None:
                check_values(name, getattr(self, name))
        fraction = None if self.pair_overlap is None else concrete(self.pair_overlap)
        if fraction is not None and np.any(fraction > 1):
            raise ConfigError(f"hardware: pair_overlap must lie in [0, 1] (the hidden fraction of a pair's shorter "
                              f"pass), got {fraction.ravel()[np.argmax(fraction.ravel() > 1)]!r}")
        if self.kind_overhead is not None and self.kind_overhead.shape[-1:] != (len(OVERHEAD_KINDS),):
            raise ConfigError(f"hardware: kind_overhead has shape {self.kind_overhead.shape}; give one value "
                              f"per kind {', '.join(OVERHEAD_KINDS)}")
        check_values("capacity", self.capacity, positive=True, allow_inf=True)

    @classmethod
    def from_times(
        cls,
        forward: Any,
        input_grad: Any = None,
        weight: Any = None,
        p2p_time: Any = 0.0,
        *,
        update: Any = 0.0,
        overhead: Any = 0.0,
        size: Any = 1.0,
        activation_bytes: Any = 0.0,
        static_bytes: Any = 0.0,
        capacity: Any = math.inf,
        kind_overhead: Any = None,
        full_backward: Any = None,
        setup: Any = None,
        wind_down: Any = None,
        pair_overlap: Any = None,
        split_known: bool = True,
        send_cost: Any = None,
        recv_cost: Any = None,
        **moved: Any,
    ) -> Hardware:
        """The simple path: per-stage times (scalars or sequences), a fixed delay per transfer.

        ``input_grad`` is the input-gradient time ``I`` and ``weight`` the ``W`` time (default 0),
        so a full ``B`` takes ``input_grad + weight``. ``p2p_time`` delays every cross-device
        transfer (as the graph's communication mode charges it: under ``overlap``, no contention,
        overlapping compute). Only array operations,
        so ``jax.vmap(Hardware.from_times)(f, b)`` builds a batch. ``full_backward`` is the time of a
        full ``B`` when it is not ``input_grad + weight``. ``kind_overhead``: per-op overheads by kind
        replacing ``overhead``, a mapping ``{"F": s, "B": s, "I": s, "W": s}`` (missing kinds take ``overhead``) or four
        values in that order. ``setup``/``wind_down``: seconds before the first op and after the
        last op of the step. ``pair_overlap``: the hidden fraction of an overlapped pair (in [0, 1]).
        ``split_known=False``: only full backwards are known (the class docstring).
        ``send_cost``/``recv_cost``: host seconds per cross-device transfer on the sending and the
        receiving device (the class docstring).
        """
        check_moved("Hardware.from_times", moved, MODE_MOVED)
        input_grad = _required("hardware", "input_grad", input_grad)
        zero = checked_float(0.0)
        return cls(
            forward=checked_float(forward, "forward"), input_grad=checked_float(input_grad, "input_grad"),
            weight=zero if weight is None else checked_float(weight, "weight"), update=checked_float(update, "update"),
            overhead=checked_float(overhead, "overhead"), size=checked_float(size, "size"), message_bytes=zero,
            gradient_bytes=zero, static_bytes=checked_float(static_bytes, "static_bytes"),
            activation_bytes=checked_float(activation_bytes, "activation_bytes"),
            capacity=checked_float(capacity, "capacity"),
            network=Network(checked_float(p2p_time, "p2p_time"), checked_float(math.inf),
                            checked_float(p2p_time, "p2p_time"), checked_float(math.inf)),
            kind_overhead=_kind_overhead(kind_overhead, overhead),
            full_backward=_optional(full_backward, "full_backward"),
            setup=setup, wind_down=wind_down, pair_overlap=pair_overlap, split_known=bool(split_known),
            send_cost=send_cost, recv_cost=recv_cost,
        )

    # -- broadcasting against a graph ----------------------------------------------------------
    def per_stage(self, name: str, graph: Graph) -> Array:
        """Leaf ``name`` as ``[pipelines, stages]``."""
        x = getattr(self, name)
        shape = (graph.pipelines, graph.stages)
        if x.ndim == 0:
            return jnp.broadcast_to(x, shape)
        if x.ndim == 1 and x.shape[0] == graph.stages:
            return jnp.broadcast_to(x[None, :], shape)
        if x.shape == shape:
            return x
        raise ConfigError(
            f"hardware: {name} has shape {x.shape}, but the schedule has {graph.pipelines} pipeline(s) "
            f"x {graph.stages} stages (give a scalar, [{graph.stages}] or {list(shape)})"
        )

    def per_microbatch(self, graph: Graph) -> Array:
        x = self.size
        if x.ndim == 0:
            return jnp.broadcast_to(x, (graph.microbatches,))
        if x.shape == (graph.microbatches,):
            return x
        raise ConfigError(
            f"hardware: size has shape {x.shape}, but the schedule has {graph.microbatches} microbatches"
        )

    def per_device(self, graph: Graph) -> Array:
        x = self.capacity
        if x.ndim == 0:
            if not isinstance(x, jax.core.Tracer):  # no eager op to compile
                return jax.device_put(np.broadcast_to(np.asarray(x), (graph.devices,)))
            return jnp.broadcast_to(x, (graph.devices,))
        if x.shape == (graph.devices,):
            return x
        raise ConfigError(f"hardware: capacity has shape {x.shape}, but the schedule has {graph.devices} devices")

    # -- the cost-model methods beyond ``tables`` (``AbstractCostModel``) ---------------------------
    @property
    def dtype(self) -> Any:
        """The float type of ``forward`` (read on every ``makespan`` call: no tree walk)."""
        return self.forward.dtype

    def check(self, graph: Graph) -> None:
        """The eager form of ``tables``' split check (``check_split_known``)."""
        check_split_known(self.split_known, graph)

    # -- costs ------------------------------------------------------------------------------------
    def tables(self, graph: Graph) -> CostTables:
        """This hardware's cost rows for ``graph`` (``Graph.node_cost`` / ``edge_cost``)."""
        t = {name: traced_check(name, self.per_stage(name, graph))
             for name in ("forward", "input_grad", "weight", "update")}
        if not self.split_known:  # only full backwards known: an I or W op has no price
            rows = graph.node_cost[..., 0]
            t["input_grad"] = eqx.error_if(t["input_grad"], jnp.any((rows == COST_I) | (rows == COST_W)),
                                           SPLIT_UNKNOWN)
        if self.full_backward is None:
            full = t["input_grad"] + t["weight"]
        else:
            full = traced_check("full_backward", self.per_stage("full_backward", graph))
        msg = traced_check("message_bytes", self.per_stage("message_bytes", graph))
        grad_bytes = traced_check("gradient_bytes", self.per_stage("gradient_bytes", graph))
        size = traced_check("size", self.per_microbatch(graph))
        overhead = traced_check("overhead", self.overhead)
        # The graph's topology decides which links are inter-node (its contention lanes were built
        # for it too), its mode how they are charged.
        mode = graph.communication
        latency, bandwidth = mode.links(*self.network.links(graph.devices, graph.devices_per_node))

        def transfer(src, dst, pipe, boundary):
            base = jnp.where(src != dst, latency[src, dst], 0.0)
            per = jnp.where(src != dst, msg[pipe, boundary] / bandwidth[src, dst], 0.0)
            return base, per

        cost = graph.node_cost
        kind, p, s = cost[:, 0], cost[:, 1], cost[:, 2]
        a1, a2, a3 = cost[:, 3], cost[:, 4], cost[:, 5]
        # all-reduce rows: (participants, first device, last device); a ring over the slowest link:
        # the first-to-last participant link when the schedule has several, and the data-parallel link
        replicas = self.network.replicas
        n = a1 * (self.network.data_parallel if replicas is None else replicas)
        several = a1 > 1
        ring_lat = jnp.where(several, latency[a2, a3], 0.0)
        ring_bw = jnp.where(several, bandwidth[a2, a3], jnp.inf)
        if replicas is not None:  # the same values as the static branch below, selected at run time
            dp_lat, dp_bw = self.network.data_parallel_links(mode)
            ring_lat = jnp.where(replicas > 1, jnp.maximum(ring_lat, dp_lat), ring_lat)
            ring_bw = jnp.where(replicas > 1, jnp.minimum(ring_bw, dp_bw), ring_bw)
        elif self.network.data_parallel > 1:
            dp_lat, dp_bw = self.network.data_parallel_links(mode)
            ring_lat = jnp.maximum(ring_lat, dp_lat)
            ring_bw = jnp.minimum(ring_bw, dp_bw)
        nf = n.astype(ring_bw.dtype)
        allreduce = jnp.where(n > 1, 2 * (nf - 1) / jnp.maximum(nf, 1.0) * grad_bytes[p, s] / ring_bw
                              + 2 * (nf - 1) * ring_lat, 0.0)
        t_base, t_per = transfer(a1, a2, p, a3)
        compute = (kind >= COST_F) & (kind <= COST_W)
        per_kind = jnp.stack([t["forward"], full, t["input_grad"], t["weight"]])
        op_overhead = jnp.broadcast_to(overhead, (len(OVERHEAD_KINDS),))
        if self.kind_overhead is not None:
            op_overhead = traced_check("kind_overhead", self._checked_kind_overhead())
        every = op_overhead[jnp.clip(kind - COST_F, 0, 3)]
        base = jnp.select([compute, kind == COST_U, kind == COST_R, kind == COST_T],
                          [every, overhead + t["update"][p, s], allreduce, t_base], 0.0)
        lead, tail = self._step_terms(cost[:, 6])
        per = jnp.select([compute, kind == COST_T],
                         [per_kind[jnp.clip(kind - COST_F, 0, 3), p, s], t_per], 0.0)
        # An overlapped pair: its forward's time (kind F) and its backward's (the row a1 alone, at
        # microbatch a3) combined; one row per pair, so both microbatch sizes are exact.
        pair = kind == COST_PAIR
        forward = op_overhead[0] + size[a2] * t["forward"][p, s]
        backward = base[a1] + size[a3] * per[a1]
        hidden = 0.0 if self.pair_overlap is None else self._checked_overlap(graph)[p, s]
        base = jnp.where(pair, overlapped_time(forward, backward, hidden), base) + lead + tail
        base = base + self._host_time(cost)
        per = jnp.where(pair, 0.0, per)
        e = graph.edge_cost
        e_base, e_per = transfer(e[:, 0], e[:, 1], e[:, 2], e[:, 3])
        return CostTables(base, per, e_base, e_per, size)

    def _checked_overlap(self, graph: Graph) -> Array:
        x = traced_check("pair_overlap", self.per_stage("pair_overlap", graph))
        return error_if(x, jnp.any(x > 1), "hardware: pair_overlap must lie in [0, 1]")

    def _checked_kind_overhead(self) -> Array:
        if self.kind_overhead.shape != (len(OVERHEAD_KINDS),):
            raise ConfigError(f"hardware: kind_overhead has shape {self.kind_overhead.shape}; give one value "
                              f"per kind {', '.join(OVERHEAD_KINDS)}")
        return self.kind_overhead

    def _host_time(self, cost: Array) -> Array | float:
        """Per cost row, the host time of the cross-device transfers its op sends and receives
        (``send_cost`` / ``recv_cost`` times the row's ``COST_SENDS`` / ``COST_RECEIVES``; 0 for
        rows that are no compute op, and where neither cost is given)."""
        total: Array | float = 0.0
        for name, column in (("send_cost", COST_SENDS), ("recv_cost", COST_RECEIVES)):
            value = getattr(self, name)
            if value is not None:
                total = total + cost[:, column].astype(self.overhead.dtype) * traced_check(name, value)
        return total

    def _step_terms(self, role: Array) -> tuple[Array, Array]:
        def term(name: str, bit: int) -> Array:
            value = getattr(self, name)
            if value is None:
                return jnp.zeros(role.shape, self.overhead.dtype)
            return jnp.where((role & bit) != 0, traced_check(name, value), 0.0)

        return term("setup", ROLE_SOURCE), term("wind_down", ROLE_SINK)

    def step_terms(self, graph: Graph) -> tuple[Float[Array, " nodes"], Float[Array, " nodes"]]:
        """Per node, the part of its duration that is the step's ``setup`` (sources) and
        ``wind_down`` (sinks), not its own work: ``simulate`` reports ops without them."""
        return self._step_terms(graph.node_cost[graph.node_row, 6])

    def costs(self, graph: Graph) -> tuple[Float[Array, " nodes"], Float[Array, "nodes k"]]:
        """Duration of every node and delay of every edge of ``graph`` under this hardware."""
        dur, delay = self.tables(graph).batch_last().expand(graph)
        return dur[:, 0], delay[:, :, 0]


#: Optional per-stage ``Hardware`` leaves (None unless given), ``[pipelines, stages]`` once normalised.
OPTIONAL_PER_STAGE = ("full_backward", "pair_overlap")


def pad_hardware(hw: Hardware, padded: Graph) -> Hardware:
    """``hw`` padded to ``padded``'s sizes (a graph padded by ``pad_graph``/``bucketed``): per-stage
    leaves given per stage (``[stages]`` or ``[pipelines, stages]``) with 0 to the padded stages and
    pipelines, a per-microbatch ``size`` with 0, a per-device ``capacity`` with ``inf`` and the pair
    matrices with latency 0 and bandwidth ``inf``; scalars stay scalars (they broadcast). No padded
    node reads a padded value, so every real node's cost, every makespan and every real device's
    memory is ``hw``'s on the unpadded graph. Concrete leaves are padded in NumPy (exact copies: no
    eager JAX operation compiles), traced ones with ``jnp.pad`` (inside the caller's program)."""
    def pad(x: Any, shape: tuple[int, ...], fill: float) -> Any:
        if x is None or x.ndim == 0:
            return x
        shape = shape[len(shape) - x.ndim:]
        if x.ndim > len(shape) or any(n > m for n, m in zip(x.shape, shape)):
            raise ConfigError(f"hardware: a leaf of shape {x.shape} does not fit the padded graph's {list(shape)}")
        widths = [(0, m - n) for n, m in zip(x.shape, shape)]
        if isinstance(x, jax.core.Tracer):
            return jnp.pad(x, widths, constant_values=fill)
        return np.pad(np.asarray(x), widths, constant_values=fill)

    stages = (padded.pipelines, padded.stages)
    names = [n for n in (*STAGE_FIELDS, *OPTIONAL_PER_STAGE) if getattr(hw, n) is not None]
    out = eqx.tree_at(lambda h: [getattr(h, n) for n in names] + [h.size, h.capacity], hw,
                      [pad(getattr(hw, n), stages, 0.0) for n in names]
                      + [pad(hw.size, (padded.microbatches,), 0.0), pad(hw.capacity, (padded.devices,), np.inf)])
    pairs = [(n, f) for n, f in (("pair_latency", 0.0), ("pair_bandwidth", np.inf))
             if getattr(hw.network, n) is not None]
    if pairs:
        out = eqx.tree_at(lambda h: [getattr(h.network, n) for n, _ in pairs], out,
                          [pad(getattr(hw.network, n), (padded.devices,) * 2, f) for n, f in pairs])
    return out
