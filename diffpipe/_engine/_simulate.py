"""``makespan`` and ``simulate``: the public evaluation entry points, and per-device memory.

``makespan(graph, hw)`` is a jit/vmap/grad-able scalar; under ``jax.vmap`` the evaluator folds the
vmapped axis into its batch-last layout (``_evaluate``), so ``jax.vmap(makespan)`` is as fast as
``makespan(graph, hws, batched=True)``, a convenience for a batch of hardware (leaves with a
leading batch axis, e.g. from ``jax.vmap(Hardware.from_times)``). ``simulate`` returns a ``Result`` with
times, bubbles, memory, communication volume and, for asynchronous schedules, steady state and
staleness.
"""

from __future__ import annotations

import hashlib
import math
import re
from functools import partial
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float

from .._caches import BoundedDict
from .._errors import ConfigError, ScheduleError
from .._results import json_text
from ..schedules import Op, Schedule
from ..schedules._analysis import staleness as schedule_staleness
from ._communication import AbstractCommunication, topology
from ._communication import communication as get_communication
from ._cost_model import AbstractCostModel, CostTables
from ._evaluate import BATCH_CHUNK as BATCH_CHUNK
from ._evaluate import AbstractAdjoint, as_adjoint, batched_makespan, finish_times, sink_max
from ._graph import EDGE_ACTIVATION, EDGE_GRADIENT, KIND_CODES, PAD, Graph
from ._jit_checks import checks, enclosing_on_error, error_if, on_error_for


def _temperature(temperature: Any, dtype) -> Array | None:
    if temperature is None:
        return None
    if isinstance(temperature, (bool, str, bytes)) or (
            isinstance(temperature, (np.ndarray, np.generic, jax.Array))
            and not jnp.issubdtype(temperature.dtype, jnp.number)):
        raise ConfigError(f"temperature must be a positive finite number or None, got {temperature!r}")
    if isinstance(temperature, (int, float)):
        if not (math.isfinite(temperature) and temperature > 0):
            raise ConfigError(f"temperature must be a positive finite number or None, got {temperature!r}")
    elif not isinstance(temperature, jax.core.Tracer):
        value = np.asarray(temperature)
        if value.shape != () or not (np.isfinite(value) and value > 0):
            raise ConfigError(f"temperature must be a positive finite scalar or None, got {value.tolist()!r}")
    t = jnp.asarray(temperature, dtype=dtype)
    return error_if(t, ~(t > 0) | ~jnp.isfinite(t), "temperature must be positive and finite")


_RUNTIME_MESSAGE = re.compile(r"EquinoxRuntimeError: (.+)")


def _checked(fn, hw: AbstractCostModel, on_error: str, total=lambda out: out):
    """``fn()``; a check that failed inside jit (``eqx.error_if``) becomes a one-line
    ``ConfigError``, naming the value too when ``hw`` is concrete (its eager checks rerun). A
    program traced with ``on_error="nan"`` (``_jit_checks.checks``: concrete inputs) reports a failed
    check as a NaN makespan (``total(out)``): the eager checks then name the culprit."""
    try:
        out = fn(on_error=on_error)
    except (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError) as error:
        if not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(hw)):
            hw.recheck()  # raises ConfigError with the culprit and its value
        found = _RUNTIME_MESSAGE.findall(str(error))
        raise ConfigError(found[-1].strip() if found else str(error).splitlines()[0]) from None
    if on_error == "nan" and not isinstance(total(out), jax.core.Tracer) and np.isnan(np.asarray(total(out))).any():
        hw.recheck()
    return out


def _check_types(graph: Any, hw: Any) -> None:
    if isinstance(graph, Schedule):
        raise ConfigError("makespan expects a Graph: call diffpipe.compile(schedule) first")
    if not isinstance(graph, Graph):
        raise ConfigError(f"expected a Graph, got {type(graph).__name__}")
    if not isinstance(hw, AbstractCostModel):
        raise ConfigError(f"expected a Hardware (or another AbstractCostModel), got {type(hw).__name__}")
    type(hw).check(hw, graph)  # not ``hw.check``: equinox builds a bound-method module per access (hot path)


def _tables(graph: Graph, hw: AbstractCostModel, batched: bool) -> CostTables:
    """The hardware's cost tables for ``graph``, batch last (a batch of one when not ``batched``)."""
    if not batched:
        return hw.tables(graph).batch_last()
    return jax.vmap(lambda h: h.tables(graph))(hw).batch_last(batched=True)


def _evaluate_makespan(graph: Graph, hw: AbstractCostModel, temperature: Array | None, batched: bool,
                       adjoint: AbstractAdjoint, on_error: str = "raise") -> Array:
    with checks(on_error):
        out = batched_makespan(graph, _tables(graph, hw, batched), temperature, adjoint)
    return out if batched else out[0]


#: ``makespan`` for any graph (the graph's arrays are arguments: graphs of one structure share it).
_makespan = jax.jit(_evaluate_makespan, static_argnames=("batched", "on_error"))
#: Per graph structure, single-variant ``makespan`` with the graph's arrays baked in as constants:
#: XLA specialises the gathers and a call passes only the hardware (measured in
#: benchmarks/bench_simulator.py: the same speed as the call inside a user's own ``jax.jit``).
#: Keyed by the graph's contents, so a graph compiled anew from the same schedule reuses the
#: function; a graph object seen before is found by ``id`` without hashing it again. Both bounded.
_BAKED_GRAPHS = 32
_BAKED: BoundedDict = BoundedDict(_BAKED_GRAPHS)
_SEEN: BoundedDict = BoundedDict(_BAKED_GRAPHS)  # id(graph) -> (graph, function)
#: Larger graphs are not baked: their evaluation dwarfs the call overhead, and XLA would spend
#: compile time constant-folding their index arrays.
_BAKED_ROWS = 8192


def _content_key(graph: Graph) -> tuple:
    """The graph's structure (tree definition, static fields included) and a digest of its arrays."""
    leaves, treedef = jax.tree.flatten(graph)
    digest = hashlib.blake2b(digest_size=16)
    for leaf in leaves:
        a = np.asarray(leaf)
        digest.update(f"{a.shape}{a.dtype.str}".encode())
        digest.update(a.tobytes())
    return treedef, digest.digest()


def _baked(graph: Graph):
    seen = _SEEN.get(id(graph))
    if seen is not None and seen[0] is graph:  # holding the graph keeps its id unique while cached
        return seen[1]
    key = _content_key(graph)
    function = _BAKED.get(key)
    if function is None:
        function = jax.jit(partial(_evaluate_makespan, graph), static_argnames=("batched", "on_error"))
        _BAKED[key] = function
    _SEEN[id(graph)] = (graph, function)
    return function


def makespan(
    graph: Graph,
    hw: AbstractCostModel,
    *,
    temperature: float | Array | None = None,
    batched: bool = False,
    adjoint: AbstractAdjoint | str = "sweep",
) -> Float[Array, "*batch"]:
    """Time of one step (the whole unrolled window for asynchronous schedules).

    Args:
        graph: from ``diffpipe.compile``.
        hw: a ``Hardware``, or any other cost model (``AbstractCostModel``); with
            ``batched=True`` every leaf carries a leading batch axis.
        temperature: ``None`` for the exact max-plus makespan; a positive value smooths every
            max (log-sum-exp), giving a differentiable upper bound that tends to the exact value.
        batched: evaluate a batch of hardware in one call (fastest way to run many what-ifs).
        adjoint: ``SweepAdjoint()`` (default, or ``"sweep"``): hand-written tangent and reverse
            sweeps (forward and reverse mode; reverse costs about one extra forward in time and
            memory); ``AutodiffAdjoint()`` (``"autodiff"``): JAX differentiates the level scan.

    Returns:
        A scalar, or ``[batch]`` when ``batched``. Works under ``jax.jit``, ``jax.vmap``, ``jax.grad``;
        new float values never recompile.
    """
    _check_types(graph, hw)
    if batched:
        sizes = {x.shape[0] if x.ndim else None for x in jax.tree.leaves(eqx.filter(hw, eqx.is_array))}
        if None in sizes or len(sizes) != 1:
            raise ConfigError("batched=True needs every Hardware leaf to carry the same leading batch axis "
                              "(build it with jax.vmap(Hardware.from_times))")
    tau, adjoint = _temperature(temperature, hw.dtype), as_adjoint(adjoint)
    if (batched or graph.kind.shape[-1] > _BAKED_ROWS  # overhead amortised by the evaluation
            or any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(graph))):  # e.g. vmapped stacked graphs
        return _checked(partial(_makespan, graph, hw, tau, batched, adjoint), hw, enclosing_on_error())
    # The public call keeps raising checks (no NaN test of the result: a sync on the hot path);
    # diffpipe's own programs calling it trace theirs as theirs (``nan_checked``).
    return _checked(partial(_baked(graph), hw, tau, adjoint=adjoint, batched=batched), hw, enclosing_on_error())


def peak_memory(graph: Graph, hw: AbstractCostModel) -> tuple[Float[Array, " devices"], Float[Array, " devices"]]:
    """Per device: peak bytes (static + stored activations) and peak stored-activation count.

    Exact and independent of timing: a device runs its order sequentially, so the peak is the
    maximum prefix sum of activation allocations (+ at F) and frees (- at B, or W when split).
    Concrete arguments run as one compiled program (eagerly, each operation would compile alone).
    """
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((graph, hw))):
        return _peak_memory(graph, hw)
    return _peak_memory_compiled(graph, hw)


def _peak_memory(graph: Graph, hw: AbstractCostModel) -> tuple[Float[Array, " devices"], Float[Array, " devices"]]:
    static, act, size = (hw.per_stage("static_bytes", graph), hw.per_stage("activation_bytes", graph),
                         hw.per_microbatch(graph))
    return peak_bytes(graph, static, act, size), _segment_peak(graph, _release(graph, act.dtype))


def peak_bytes(graph: Graph, static: Array, act: Array, size: Array) -> Array:
    """The peak-memory formula, the one home of it: per device, the static bytes of the stages it
    holds (times their weight versions) plus the largest running sum of activation bytes stored
    (``+`` at ``F``) and freed (``-`` at ``B``, or ``W`` when split) along its order (at least 0).
    ``static``, ``act`` ``[pipelines, stages, *batch]``, ``size`` ``[microbatches, *batch]``; returns
    ``[devices, *batch]``: a batch rides along as trailing axes (the batched evaluator's layout,
    ``_batch``), and each member's bytes are those of the same call without a batch, bit for bit."""
    batch = act.shape[2:]
    dtype = act.dtype
    nodes = graph.lane_nodes  # collectives have release 0: they neither store nor free
    compute = graph.kind[nodes] <= KIND_CODES["W"]
    m = jnp.where(compute, graph.microbatch[nodes], 0)
    delta = _trailing(_release(graph, dtype), batch) * act[graph.pipeline[nodes], graph.stage[nodes]] * size[m]
    return _held(graph, static) + _segment_peak(graph, delta)


def _held(graph: Graph, static: Array) -> Array:
    """Per device ``[devices, *batch]``, the static bytes of the stages it holds times their weight
    versions (``static`` ``[pipelines, stages, *batch]``)."""
    batch = static.shape[2:]
    flat = (static * _trailing(graph.versions.astype(static.dtype), batch)).reshape((-1, *batch))
    return jax.ops.segment_sum(flat, graph.holder.ravel(), graph.devices)


def _trailing(x: Array, batch: tuple[int, ...]) -> Array:
    return x.reshape(x.shape + (1,) * len(batch))


def _release(graph: Graph, dtype) -> Array:
    """Per lane entry, +1 where its op stores an activation, -1 where it frees one, else 0."""
    return graph.release[graph.lane_nodes].astype(dtype)


def _segment_peak(graph: Graph, values: Array) -> Array:
    """Per device (its lane entries are contiguous), the largest running sum of ``values`` along its
    order, at least 0: ``[devices, *batch]``. The running sum restarts at each device's first entry
    (a scan over the entries, each a vector over the batch: no cancellation against earlier
    devices' sums, and on CPU ~7x faster than XLA's ``cumsum`` of ``[lanes, batch]``, which reduces a
    window per output; benchmarks in the commit that made it the one formula). A NumPy ``values``
    (with a concrete graph) is summed in NumPy, the same additions in the same order (a cumulative
    sum per device's entries): no program compiled per graph (``peak_in_flight``)."""
    if isinstance(values, np.ndarray):
        segment = np.asarray(graph.lane_device)
        first = np.flatnonzero(np.concatenate([[True], segment[1:] != segment[:-1]]))
        peak = np.full((graph.devices, *values.shape[1:]), -np.inf, values.dtype)
        for lo, hi in zip(first, [*first[1:], len(values)]):
            peak[segment[lo]] = np.max(np.cumsum(values[lo:hi], axis=0), axis=0)
        return np.maximum(peak, 0.0)
    segment = graph.lane_device
    start = jnp.concatenate([jnp.ones((1,), bool), segment[1:] != segment[:-1]])

    def step(total, row):
        value, first = row
        total = jnp.where(first, value, total + value)
        return total, total

    running = lax.scan(step, jnp.zeros_like(values[0]), (values, start))[1]
    return jnp.maximum(jax.ops.segment_max(running, segment, graph.devices), 0.0)


def peak_in_flight(graph: Graph) -> np.ndarray:
    """Per device, the peak number of stored activations of a concrete ``graph`` (``peak_memory``'s
    second output, timing-free): ``peak_bytes``' running sum (``_segment_peak``) of the lane entries'
    signs, in NumPy: small integer sums are exact in floats, so it equals ``peak_memory(graph, hw)[1]``
    for every ``hw`` without compiling a program per graph."""
    sign = np.asarray(graph.release)[np.asarray(graph.lane_nodes)].astype(np.float64)
    return _segment_peak(graph, sign)


def static_memory(graph: Graph, hw: AbstractCostModel) -> Float[Array, " devices"]:
    """Per device, the bytes held for the whole step: each stage's ``static_bytes`` times the
    weight versions it keeps (PipeDream's stashed weights), summed over the stages it holds
    (``peak_bytes`` without activations)."""
    return _held(graph, hw.per_stage("static_bytes", graph))


_peak_memory_compiled = eqx.filter_jit(_peak_memory)


class Result(eqx.Module):
    """What one simulated step looks like. Arrays over ops follow ``ops`` (the schedule's order).

    Attributes:
        ops: the schedule's ops (None when simulating a bare ``Graph``).
        start, finish: per op, seconds.
        makespan: the step time (the whole unrolled window for asynchronous schedules).
        busy: per device, seconds of compute (collectives count on every participant).
        bubble_ratio: idle fraction of ``devices x makespan``.
        peak_memory: per device, bytes; ``peak_activations``: stored stage-microbatch activations.
        fits: per device, whether ``peak_memory <= capacity``: the hardware's whole capacity, no headroom
            (the planning layers, ``Configuration.evaluate``, ``plan``, ``compare`` and the CLI, keep
            ``HEADROOM`` of it free: ``diffpipe.fits_memory``).
        communication_bytes: bytes sent between devices (transfers; collectives not included).
        step_finish: per optimizer step, when its last op finishes; ``period``: the differences
            (constant in steady state for asynchronous schedules).
        staleness: per forward op, optimizer steps between it and its backward (from the orders).
        communication: the mode the step was simulated under (the graph's ``communication``), so
            that drawing it (``viz.timeline``, ``gantt``, ``trace``) lays out the same link lanes.
        devices_per_node: the topology it was simulated under (the graph's ``devices_per_node``,
            which decides which links are inter-node), for the same reason.
    """

    start: Float[Array, " ops"]
    finish: Float[Array, " ops"]
    makespan: Float[Array, ""]
    busy: Float[Array, " devices"]
    bubble_ratio: Float[Array, ""]
    peak_memory: Float[Array, " devices"]
    peak_activations: Float[Array, " devices"]
    fits: Array
    communication_bytes: Float[Array, ""]
    step_finish: Float[Array, " steps"]
    period: Float[Array, " gaps"]
    ops: tuple[Op, ...] | None = eqx.field(static=True, default=None)
    staleness: dict | None = eqx.field(static=True, default=None)
    communication: AbstractCommunication | None = eqx.field(static=True, default=None)
    devices_per_node: int | None = eqx.field(static=True, default=None)

    def time_of(self, op: Op) -> tuple[float, float]:
        """``(start, finish)`` of ``op``."""
        if self.ops is None:
            raise ScheduleError("this result came from a bare Graph: simulate the Schedule to look up ops")
        i = self.ops.index(op)
        return float(self.start[i]), float(self.finish[i])

    # -- output (the result protocol, ``diffpipe._results``) ----------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain data: every array field as numbers or lists (seconds, bytes), ``ops`` as their
        names (``"0F3"``; None for a bare ``Graph``) and ``staleness`` as ``{op name: steps}``."""
        out: dict[str, Any] = {name: np.asarray(getattr(self, name)) for name in (
            "makespan", "bubble_ratio", "busy", "peak_memory", "peak_activations", "fits", "communication_bytes",
            "step_finish", "period", "start", "finish")}
        out["ops"] = None if self.ops is None else [str(op) for op in self.ops]
        out["staleness"] = None if self.staleness is None else {str(op): s for op, s in self.staleness.items()}
        return out

    def to_json(self, path: Any = None, indent: int | None = 2) -> str:
        """Strict JSON text of ``to_dict()``; also written atomically to ``path`` when given."""
        return json_text(self.to_dict(), path, indent)


class GraphTimes(NamedTuple):
    """What ``simulate_graph`` computes: per graph node (``Graph`` row order; padding and scratch
    rows included, ``op_index`` maps rows to ops), per device and per step."""

    start: Float[Array, " nodes"]
    finish: Float[Array, " nodes"]
    makespan: Float[Array, ""]
    busy: Float[Array, " devices"]
    bubble_ratio: Float[Array, ""]
    peak_memory: Float[Array, " devices"]
    peak_activations: Float[Array, " devices"]
    communication_bytes: Float[Array, ""]
    step_finish: Float[Array, " steps"]


def simulate_graph(graph: Graph, hw: AbstractCostModel, temperature: Array | None = None) -> GraphTimes:
    """One step of ``graph`` on ``hw``, every node of it: the jitted core of ``simulate``, for
    callers that need the nodes a schedule does not list (``compile(..., gradient_sync=True)``'s
    ``R`` and ``U``: ``viz``) or a vmapped batch of hardware (``plan``). No eager checks of the
    arguments (``simulate`` does them). A check failing inside jit is a one-line ``ConfigError``."""
    hw.check(graph)
    return _checked(partial(_simulate_graph, graph, hw, temperature), hw, on_error_for(hw, temperature),
                    lambda out: out.makespan)


@eqx.filter_jit
def _simulate_graph(graph: Graph, hw: AbstractCostModel, temperature: Array | None,
                    on_error: str = "raise") -> GraphTimes:
    with checks(on_error):
        return _simulate_graph_checked(graph, hw, temperature)


def _simulate_graph_checked(graph: Graph, hw: AbstractCostModel, temperature: Array | None) -> GraphTimes:
    tables = _tables(graph, hw, False)
    finish = finish_times(graph, tables, temperature)[:, 0]
    total = sink_max(graph, finish[:, None], temperature)[0]
    dur, tail = op_durations(graph, hw, tables)
    step_finish = finish[graph.step_last]  # a step ends after its wind-down
    finish = finish - tail
    real = graph.kind != PAD
    busy = device_busy(graph, dur)
    bubble = 1.0 - jnp.sum(busy) / (graph.devices * total)
    memory, count = peak_memory(graph, hw)
    msg = hw.per_stage("message_bytes", graph)
    size = hw.per_microbatch(graph)
    is_xfer_edge = (graph.edge == EDGE_ACTIVATION) | (graph.edge == EDGE_GRADIENT)
    edge_bytes = size[jnp.where(graph.kind <= KIND_CODES["W"], graph.microbatch, 0)][:, None] * msg[
        graph.pipeline[:, None], jnp.maximum(graph.edge_boundary, 0)]
    node_bytes = size[jnp.where(graph.kind == KIND_CODES["T"], graph.microbatch, 0)] * msg[
        graph.pipeline, jnp.maximum(graph.boundary, 0)]
    volume = jnp.sum(jnp.where(is_xfer_edge & real[:, None], edge_bytes, 0.0)) + jnp.sum(
        jnp.where(graph.kind == KIND_CODES["T"], node_bytes, 0.0))
    return GraphTimes(finish - dur, finish, total, busy, bubble, memory, count, volume, step_finish)


def op_durations(graph: Graph, hw: AbstractCostModel, tables: CostTables | None = None) -> tuple[Array, Array]:
    """Per node, its own work's seconds (its duration less the step's setup and wind-down, which
    are no op's work) and the wind-down it carries (``tables``: ``hw``'s, batch of one)."""
    dur, _ = (_tables(graph, hw, False) if tables is None else tables).expand(graph)
    lead, tail = hw.step_terms(graph)
    return dur[:, 0] - lead - tail, tail


def device_busy(graph: Graph, dur: Array) -> Float[Array, " devices"]:
    """Per device, seconds of work: its lane's ops (collectives on every participant) and, where the
    mode makes a transfer occupy both ends (``busy_weight``), its transfers."""
    busy = jax.ops.segment_sum(dur[graph.lane_nodes], graph.lane_device, graph.devices)
    if graph.communication.busy_weight:  # e.g. a blocking transfer occupies both ends
        xfer = jnp.where(graph.kind == KIND_CODES["T"], dur, 0.0)
        busy = busy + jax.ops.segment_sum(xfer, graph.device, graph.devices)
        busy = busy + jax.ops.segment_sum(xfer, graph.dst, graph.devices)
    return busy


def simulate(schedule: Schedule | Graph, hw: AbstractCostModel, *, temperature: float | None = None,
             gradient_sync: bool = False, communication: Any = None, devices_per_node: int | None = None) -> Result:
    """Simulate one step of ``schedule`` on ``hw``. A ``Schedule`` is compiled under
    ``communication`` (a mode name or an ``AbstractCommunication``; default ``overlap``), for
    ``devices_per_node`` devices per node (default: all on one node) and with ``gradient_sync`` as
    in ``compile`` (the makespan then includes the syncs and updates; the per-op arrays stay those
    of the schedule's ops); a ``Graph`` carries its own mode and topology."""
    if not isinstance(hw, AbstractCostModel):
        raise ConfigError(f"simulate expects a Hardware (or another AbstractCostModel), got {type(hw).__name__}")
    ops = stale = None
    if isinstance(schedule, Schedule):
        graph = hw.compile_schedule(schedule, communication="overlap" if communication is None else communication,
                                    devices_per_node=devices_per_node, gradient_sync=gradient_sync)
        ops, stale = schedule.ops, schedule_staleness(schedule)
    elif isinstance(schedule, Graph):
        if gradient_sync:
            raise ConfigError("simulate: gradient_sync=True applies to a Schedule; a Graph has its own "
                              "(compile(schedule, gradient_sync=True))")
        if communication is not None and get_communication(communication) != schedule.communication:
            raise ConfigError(f"simulate: communication={str(communication)!r} applies to a Schedule; this graph "
                              f"was compiled for {str(schedule.communication)!r}")
        if devices_per_node is not None and (topology(devices_per_node, schedule.devices)
                                             != topology(schedule.devices_per_node, schedule.devices)):
            raise ConfigError(f"simulate: devices_per_node={devices_per_node!r} applies to a Schedule; this graph "
                              f"was compiled for {schedule.devices_per_node}")
        graph = schedule
    else:
        raise ConfigError(f"simulate expects a Schedule or Graph, got {type(schedule).__name__}")
    start, finish, total, busy, bubble, memory, count, volume, step_finish = simulate_graph(
        graph, hw, _temperature(temperature, hw.dtype))
    index = np.asarray(graph.op_index)
    rows = np.flatnonzero(index >= 0)
    order = rows[np.argsort(index[rows])]
    capacity = hw.per_device(graph)
    if any(isinstance(x, jax.core.Tracer) for x in (start, memory, capacity)):
        start, finish, fits, period = start[order], finish[order], memory <= capacity, jnp.diff(step_finish)
    else:  # gathers, a comparison and differences: exact in NumPy, and no eager op compiles
        start, finish = (jax.device_put(np.asarray(x)[order]) for x in (start, finish))  # jnp.asarray compiles
        fits = jax.device_put(np.asarray(memory) <= np.asarray(capacity))
        period = jax.device_put(np.diff(np.asarray(step_finish)))
    return Result(
        start=start, finish=finish, makespan=total, busy=busy, bubble_ratio=bubble,
        peak_memory=memory, peak_activations=count, fits=fits,
        communication_bytes=volume, step_finish=step_finish, period=period,
        ops=ops, staleness=stale, communication=graph.communication,
        devices_per_node=graph.devices_per_node,
    )
