"""A simulated step laid out for drawing: op intervals per device, transfers per link, memory.

Shared by ``gantt`` and ``trace``. Op times come from ``diffpipe.simulate`` (or the ``Result``
given); with ``gradient_sync=True`` also the data-parallel gradient sync that
``compile(..., gradient_sync=True)`` adds (and ``Configuration.evaluate`` simulates): each stage's
``R`` on the *sync lane* of the devices holding it, each (pipeline, stage)'s optimizer step ``U``
at the end of its device's compute lane, timed by ``simulate_graph`` on the same hardware; transfer
times from the same hardware: under ``none``/``overlap`` a transfer starts when
its producer ends and lasts the edge's delay; under ``contention``/``blocking`` each transfer is a
node of the compiled graph and starts when everything it waits for (its producer, the previous
transfer on its link, the receiver's previous op) has finished.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import equinox as eqx
import numpy as np

from .. import _io
from .._caches import bounded
from .._engine._communication import AbstractCommunication, topology
from .._engine._communication import communication as get_communication
from .._engine._graph import EDGE_ACTIVATION, EDGE_FEED, EDGE_GRADIENT, KIND_CODES
from .._engine._graph import compile as compile_graph
from .._engine._hardware import Hardware
from .._engine._jit_checks import nan_checked
from .._engine._simulate import Result, simulate, simulate_graph, static_memory
from .._errors import ConfigError
from .._plan._configuration import ConfigResult, Configuration
from ..schedules import Op, Schedule
from ..schedules._analysis import activation_delta, activation_table


@dataclass(frozen=True)
class Transfer:
    """One cross-device data edge: ``producer`` on ``src`` feeds ``consumer`` on ``dst``.

    ``kind`` is ``activation`` or ``gradient``; ``lane`` names the link it occupies (a directed
    link ``"link 0→1"``, a node's NIC ``"NIC node 0"``, or with one device per node its egress
    ``"egress d0"``); ``start``/``finish`` are seconds, or
    None when no hardware was given (then only the arrow from producer to consumer is known).
    """

    producer: Op
    consumer: Op
    src: int
    dst: int
    kind: str
    lane: str
    start: float | None
    finish: float | None


@dataclass(frozen=True)
class SyncOp:
    """A node of the data-parallel gradient sync (``compile(..., gradient_sync=True)``).

    ``kind`` is ``"R"`` (the all-reduce of ``stage``'s gradients, on the sync lane of every device
    in ``devices``: those holding a replica of the stage) or ``"U"`` (the optimizer step of
    (``pipeline``, ``stage``), on the compute lane of ``devices[0]``); ``start``/``finish`` are seconds.
    """

    kind: str
    stage: int
    pipeline: int
    devices: tuple[int, ...]
    start: float
    finish: float


@dataclass(frozen=True)
class Timeline:
    """Everything a picture of one step needs, in seconds and bytes (numpy, float64).

    ``ops``/``start``/``finish``/``devices_of`` follow ``schedule.ops``; ``lanes`` lists the link
    lanes in display order (transfers that overlap on one link are spread over numbered sub-lanes
    ``"link 0→1 #2"``); ``memory[d]`` is ``(times, values)`` of device d's step curve, in bytes
    when the hardware has activation sizes (``memory_unit == "bytes"``), else a count of stored
    stage-microbatch activations (``"activations"``). ``step`` is the simulated step time, which
    can end after the last drawn op (setup and wind-down, a data-parallel gradient sync and
    optimizer step: ``compile(..., gradient_sync=True)``). ``syncs`` holds that sync's ``R`` and
    ``U`` nodes when asked for (``timeline(..., gradient_sync=True)``), else nothing.
    ``collectives`` maps a collective kind (``tensor``, ``expert``, ``gather``, ``context``: the
    ``exposed_<kind>`` parts of ``ConfigResult.breakdown``) to the seconds of it inside each op
    (``op_collectives``; an array following ``schedule.ops``); kinds that are zero everywhere are left out.
    """

    schedule: Schedule
    start: np.ndarray
    finish: np.ndarray
    transfers: tuple[Transfer, ...]
    lanes: tuple[str, ...]
    memory: tuple[tuple[np.ndarray, np.ndarray], ...]
    memory_unit: str
    communication: str
    step: float = 0.0
    syncs: tuple[SyncOp, ...] = ()
    collectives: tuple[tuple[str, np.ndarray], ...] = ()

    @property
    def ops(self) -> tuple[Op, ...]:
        return self.schedule.ops

    @property
    def makespan(self) -> float:
        ends = [float(np.max(self.finish, initial=0.0)), self.step]
        ends += [t.finish for t in self.transfers if t.finish is not None]
        ends += [op.finish for op in self.syncs]
        return max(ends)

    @property
    def sync_devices(self) -> tuple[int, ...]:
        """Devices with a sync lane (those running an ``R``), in order."""
        return tuple(sorted({d for op in self.syncs if op.kind == "R" for d in op.devices}))


def _lane_name(src: int, dst: int, per_node: int, mode: str) -> str:
    if mode == "contention" and src // per_node != dst // per_node:
        # One device per node: the lane is that device's egress (its NIC, or its NVSwitch port).
        return f"egress d{src}" if per_node == 1 else f"NIC node {src // per_node}"
    return f"link {src}→{dst}"


def _spread(transfers: list[Transfer]) -> tuple[list[Transfer], list[str]]:
    """Give transfers that overlap in time on one lane their own numbered sub-lanes (greedy
    interval partitioning), so every lane's slices are disjoint (Chrome traces need nesting)."""
    out: list[Transfer] = []
    lanes: list[str] = []
    by_lane: dict[str, list[Transfer]] = {}
    for t in transfers:
        by_lane.setdefault(t.lane, []).append(t)
    for lane in sorted(by_lane, key=_lane_key):
        ends: list[float] = []
        for t in sorted(by_lane[lane], key=lambda t: (t.start, t.finish)):
            slot = next((i for i, end in enumerate(ends) if t.start >= end - 1e-12), None)
            if slot is None:
                slot = len(ends)
                ends.append(0.0)
                lanes.append(lane if slot == 0 else f"{lane} #{slot + 1}")
            ends[slot] = t.finish
            name = lane if slot == 0 else f"{lane} #{slot + 1}"
            out.append(Transfer(t.producer, t.consumer, t.src, t.dst, t.kind, name, t.start, t.finish))
    return out, lanes


def _lane_key(lane: str) -> tuple:
    parts = lane.replace("→", " ").replace(" d", " ").split()
    return (parts[0], *[int(p) for p in parts if p.isdigit()])


def timeline(source: Any, hw: Any = None, *, schedule: Schedule | None = None,
             gradient_sync: bool = False, collectives: Mapping[str, Any] | None = None,
             communication: Any = None, devices_per_node: int | None = None) -> Timeline:
    """Lay out ``source`` (a ``Schedule``, simulated on ``hw``, or a ``Result`` of ``schedule``).

    ``hw`` defaults, for a schedule, to unit times (``Hardware.from_times(1.0, 2.0)``: F = 1 s,
    B = 2 s, free communication). With a ``Result`` and no ``hw``, transfers are known only as
    arrows and memory is counted in activations. ``gradient_sync``: simulate (or, for a
    ``Result``, expect) the step with the data-parallel gradient sync, as ``simulate``'s flag, and
    lay out its ``R`` and ``U`` nodes (``Timeline.syncs``); a ``Result`` then needs its ``hw``.
    ``collectives``: ``{kind: seconds per op}`` of the collectives inside the ops
    (``op_collectives(configuration)``), each at most its op's duration. ``communication``: the
    mode the schedule is compiled under (a name or an ``AbstractCommunication``, default
    ``overlap``), which decides its link lanes, and ``devices_per_node`` its topology (default: all
    on one node), which decides which links are inter-node; a ``Result`` brings the mode and the
    topology it was simulated under (``Result.communication``, ``Result.devices_per_node``), and a
    different one given here is refused.
    """
    mode = get_communication("overlap" if communication is None else communication)
    per_node = devices_per_node
    if isinstance(source, Result) and source.communication is not None:
        if communication is not None and mode != source.communication:
            raise ConfigError(f"communication={str(mode)!r}: the Result was simulated under "
                              f"{str(source.communication)!r} (give the Result alone: it brings its mode)")
        mode = source.communication
    if isinstance(source, Result) and source.devices_per_node is not None:
        devices = int(np.shape(source.busy)[0])
        if devices_per_node is not None and (topology(devices_per_node, devices)
                                             != topology(source.devices_per_node, devices)):
            raise ConfigError(f"devices_per_node={devices_per_node!r}: the Result was simulated with "
                              f"{source.devices_per_node} devices per node (give the Result alone: it brings "
                              "its topology)")
        per_node = source.devices_per_node
    if hw is not None and not isinstance(hw, Hardware):
        raise ConfigError(f"expected a Hardware, got {type(hw).__name__}")
    if not isinstance(gradient_sync, bool):
        raise ConfigError(f"gradient_sync must be True or False, got {gradient_sync!r}")
    if isinstance(source, Schedule):
        if schedule is not None and schedule != source:
            raise ConfigError("give the schedule once: as the source or as schedule=, not two different ones")
        schedule = source
        if hw is None:
            hw = Hardware.from_times(1.0, 2.0)
        result = simulate(schedule, hw, gradient_sync=gradient_sync, communication=mode, devices_per_node=per_node)
    elif isinstance(source, Result):
        if schedule is None:
            raise ConfigError("a Result does not know its devices: pass schedule= (the simulated Schedule)")
        if not isinstance(schedule, Schedule):
            raise ConfigError(f"schedule= must be a Schedule, got {type(schedule).__name__}")
        if source.ops is not None and tuple(source.ops) != tuple(schedule.ops):
            raise ConfigError(f"the Result was not simulated from this schedule ({schedule.family})")
        if source.ops is None and np.shape(source.start) != (len(schedule.ops),):
            raise ConfigError(f"the Result has {np.shape(source.start)[0]} ops, the schedule {len(schedule.ops)}")
        result = source
        if gradient_sync and hw is None:
            raise ConfigError("gradient_sync=True with a Result needs its hardware: pass hw (the sync is "
                              "simulated again to time its R and U nodes)")
    else:
        raise ConfigError(f"expected a Schedule or a Result, got {type(source).__name__}")

    start = np.asarray(result.start, dtype=np.float64)
    finish = np.asarray(result.finish, dtype=np.float64)
    if hw is None:
        transfers = [
            Transfer(dep.op, op, dep.src, dep.dst, dep.edge, f"link {dep.src}→{dep.dst}", None, None)
            for op in schedule.ops for dep in schedule.dependencies[op] if dep.is_transfer
        ]
        lanes: list[str] = []
        label = "unknown"
    else:
        transfers, label = _timed_transfers(schedule, hw, mode, per_node, start, finish)
        transfers, lanes = _spread(transfers)
    memory, unit = _memory(schedule, hw, start, finish)
    syncs = _syncs(schedule, hw, mode, per_node, float(result.makespan)) if gradient_sync else ()
    return Timeline(schedule, start, finish, tuple(transfers), tuple(lanes), memory, unit, label,
                    float(result.makespan), syncs, _checked_collectives(collectives, schedule, finish - start))


def _checked_collectives(collectives: Any, schedule: Schedule, duration: np.ndarray) -> tuple:
    if collectives is None:
        return ()
    if not isinstance(collectives, Mapping):
        raise ConfigError(f"collectives must be a mapping of kind to seconds per op, got {type(collectives).__name__}")
    out = []
    for kind, seconds in collectives.items():
        if not isinstance(kind, str):
            raise ConfigError(f"collectives: kinds must be strings, got {kind!r}")
        values = np.asarray(seconds, dtype=np.float64)
        if values.shape != (len(schedule.ops),):
            raise ConfigError(f"collectives[{kind!r}]: expected one value per op ({len(schedule.ops)}), "
                              f"got shape {values.shape}")
        if not np.all(np.isfinite(values)) or np.any(values < 0):
            raise ConfigError(f"collectives[{kind!r}]: seconds must be finite and at least 0")
        if np.any(values > duration * (1 + 1e-5) + 1e-12):
            i = int(np.argmax(values - duration))
            raise ConfigError(f"collectives[{kind!r}]: {values[i]:.6g} s inside {schedule.ops[i]}, which lasts "
                              f"only {duration[i]:.6g} s (are they of this schedule and hardware?)")
        if np.any(values > 0):
            out.append((kind, values))
    return tuple(out)


def op_collectives(configuration: Configuration, schedule: Schedule | None = None,
                   hw: Hardware | None = None) -> dict[str, np.ndarray]:
    """``{kind: seconds per op of schedule.ops}`` of the collectives left exposed inside each op of
    ``configuration``'s step (``Configuration.exposed_collectives``: tensor-parallel all-reduces or
    all-gathers and reduce-scatters, expert all-to-alls, ZeRO-3 gathers, the context ring): an op
    of stage ``s`` holds ``size[m]`` x the sum over the stage's layers of its kind's row (``F``: the
    forward row, ``I``: input-grad, ``W``: weight, ``B``: both), as its duration does
    (``Configuration.workload``). ``schedule``/``hw`` default to the configuration's own."""
    schedule = configuration.schedule() if schedule is None else schedule
    hw = configuration.hardware() if hw is None else hw
    rows = configuration.stage_rows()
    size = np.broadcast_to(np.asarray(hw.size, np.float64), (schedule.microbatches,))
    out = {}
    for kind, table in configuration.exposed_collectives().items():
        table = np.asarray(table, np.float64)
        per_stage = np.zeros((3, schedule.stages))
        np.add.at(per_stage.T, rows, table.T)
        per_kind = {"F": per_stage[0], "I": per_stage[1], "W": per_stage[2], "B": per_stage[1] + per_stage[2]}
        out[kind] = np.array([size[op.microbatch] * per_kind[op.kind][op.stage] if op.kind in per_kind else 0.0
                              for op in schedule.ops])
    return out


def configuration_step(configuration: Configuration, evaluation: ConfigResult | None, what: str,
                       **given: Any) -> tuple[ConfigResult, Schedule, Hardware]:
    """``(evaluation, schedule, hardware)`` of ``configuration``'s step as ``gantt`` and ``trace`` draw
    it: ``evaluation`` is a ``ConfigResult`` of ``configuration.evaluate()`` (evaluated here when None;
    pass one to draw the step already evaluated, its breakdown with a jitter's entry), ``schedule`` and
    ``hardware`` are the configuration's own. ``given``: the arguments a configuration brings itself
    (``hw``, ``schedule``, ...); any one of them given is refused, named in one line."""
    extra = [name for name, value in given.items() if value is not None and value is not False]
    if extra:
        raise ConfigError(f"{what}: a Configuration brings its own {extra[0]}; give the configuration alone "
                          f"(or its Result with hw= and schedule=)")
    if evaluation is None:
        evaluation = configuration.evaluate()
    elif not isinstance(evaluation, ConfigResult):
        raise ConfigError(f"{what}: evaluation= must be the configuration's ConfigResult (Configuration.evaluate()), "
                          f"got {type(evaluation).__name__}")
    return evaluation, configuration.schedule(), configuration.hardware()


def _syncs(schedule: Schedule, hw: Any, mode: AbstractCommunication, per_node: int | None,
           step: float) -> tuple[SyncOp, ...]:
    """The gradient-sync nodes of ``schedule`` on ``hw`` under ``mode`` with ``per_node`` devices
    per node, timed by the simulator; ``step`` (the simulated step being drawn) must be the one
    they belong to."""
    graph = compile_graph(schedule, communication=mode, devices_per_node=per_node, gradient_sync=True)
    times = simulate_graph(graph, hw)
    if not np.isclose(float(times.makespan), step, rtol=1e-5, atol=0.0):
        raise ConfigError(f"gradient_sync=True: the Result's step ({step:.6g} s) is not the gradient-synced step "
                          f"on this hardware ({float(times.makespan):.6g} s); simulate it with gradient_sync=True")
    kind, op_index = np.asarray(graph.kind), np.asarray(graph.op_index)
    stage, pipeline, device = np.asarray(graph.stage), np.asarray(graph.pipeline), np.asarray(graph.device)
    start, finish = np.asarray(times.start, np.float64), np.asarray(times.finish, np.float64)
    placement = schedule.placement
    out = []
    for i in np.flatnonzero((op_index < 0) & ((kind == KIND_CODES["R"]) | (kind == KIND_CODES["U"]))):
        s, p = int(stage[i]), int(pipeline[i])
        if kind[i] == KIND_CODES["R"]:
            devices = tuple(sorted({placement.device(q, s) for q in range(schedule.pipelines)}))
            out.append(SyncOp("R", s, p, devices, float(start[i]), float(finish[i])))
        else:
            out.append(SyncOp("U", s, p, (int(device[i]),), float(start[i]), float(finish[i])))
    out.sort(key=lambda op: (op.start, op.kind, op.devices))
    return tuple(out)


@bounded(1)
def _jitted_costs():
    return eqx.filter_jit(nan_checked(lambda graph, hw: hw.costs(graph)))


def _costs(graph: Any, hw: Any):
    """``hw.costs(graph)`` under one jit (eagerly, each of its many small ops would compile alone)."""
    return _jitted_costs()(graph, hw)


def _timed_transfers(schedule: Schedule, hw: Any, mode: AbstractCommunication, devices_per_node: int | None,
                     start: np.ndarray, finish: np.ndarray) -> tuple[list[Transfer], str]:
    graph = compile_graph(schedule, communication=mode, devices_per_node=devices_per_node)
    per_node = graph.devices_per_node
    dur, delay = (np.asarray(x, dtype=np.float64) for x in _costs(graph, hw))
    kind = np.asarray(graph.kind)
    op_index = np.asarray(graph.op_index)
    pred, edge = np.asarray(graph.pred), np.asarray(graph.edge)
    src_of, dst_of = np.asarray(graph.device), np.asarray(graph.dst)
    ops = schedule.ops
    # Finish of every graph row: ops from the simulation, transfer nodes computed below in row
    # order (rows are sorted by topological level, so a transfer's predecessors come first).
    row_finish = np.full(kind.shape[0], -np.inf)
    real = op_index >= 0
    row_finish[real] = finish[op_index[real]]
    transfers = []
    if mode.transfer_nodes:
        consumer_of = {}
        for i in np.flatnonzero(real):
            for k in np.flatnonzero(edge[i] == EDGE_FEED):
                consumer_of[int(pred[i, k])] = int(i)
        for t in np.flatnonzero(kind == KIND_CODES["T"]):
            preds = pred[t][edge[t] > 0]
            ready = max(0.0, float(np.max(row_finish[preds], initial=0.0)))
            row_finish[t] = ready + dur[t]
            producer = int(pred[t][np.flatnonzero(edge[t] == EDGE_FEED)[0]])
            consumer = consumer_of[int(t)]
            p_op, c_op = ops[op_index[producer]], ops[op_index[consumer]]
            kind_name = "activation" if c_op.kind == "F" else "gradient"
            s, d = int(src_of[t]), int(dst_of[t])
            transfers.append(Transfer(p_op, c_op, s, d, kind_name, _lane_name(s, d, per_node, mode),
                                      ready, ready + float(dur[t])))
    else:
        edge_src, edge_dst = np.asarray(graph.edge_src), np.asarray(graph.edge_dst)
        for i in np.flatnonzero(real):
            for k in np.flatnonzero((edge[i] == EDGE_ACTIVATION) | (edge[i] == EDGE_GRADIENT)):
                producer = int(pred[i, k])
                s, d = int(edge_src[i, k]), int(edge_dst[i, k])
                begin = float(row_finish[producer])
                transfers.append(Transfer(
                    ops[op_index[producer]], ops[op_index[i]], s, d,
                    "activation" if edge[i, k] == EDGE_ACTIVATION else "gradient",
                    _lane_name(s, d, per_node, mode), begin, begin + float(delay[i, k])))
    transfers.sort(key=lambda t: (t.start, t.src, t.dst))
    return transfers, mode.name


def _memory(schedule: Schedule, hw: Any, start: np.ndarray, finish: np.ndarray):
    """Per device, the step curve of memory: static bytes plus activations stored at each F's
    start and freed at the end of the op that last needs them (B, or W when split). The static
    part is the simulator's (``static_memory``), the one the peak memory counts."""
    static = np.zeros(schedule.devices)
    unit = "activations"
    if hw is not None:
        act, size = activation_table(schedule, hw.activation_bytes, hw.size)
        if any(v > 0 for row in act for v in row):
            unit = "bytes"
            static = np.asarray(static_memory(compile_graph(schedule), hw), dtype=np.float64)
    index = {op: i for i, op in enumerate(schedule.ops)}
    tolerance = 1e-6 * float(np.max(finish, initial=0.0))
    curves = []
    for d, order in enumerate(schedule.orders):
        events = []
        for op in order:
            i = index[op]
            delta = activation_delta(op)
            if delta:
                amount = act[op.pipeline][op.stage] * size[op.microbatch] if unit == "bytes" else 1.0
                events.append((start[i] if delta > 0 else finish[i], delta * amount))
        # Events at the same instant (within float32 noise) are merged: a free and the next
        # allocation back to back must not draw a spike.
        events.sort(key=lambda e: e[0])
        times, deltas = [0.0], [0.0]
        for t, v in events:
            if t - times[-1] <= tolerance:
                deltas[-1] += v
            else:
                times.append(t)
                deltas.append(v)
        curves.append((np.asarray(times), static[d] + np.cumsum(deltas)))
    return tuple(curves), unit


# -- writing files ------------------------------------------------------------------------------------
def check_paths(path: Any, allowed: Sequence[str], what: str) -> list[Path]:
    """Target paths as ``Path``s: suffix among ``allowed`` and an existing parent directory."""
    if isinstance(path, (str, os.PathLike)):
        paths = [path]
    elif isinstance(path, (list, tuple)):
        paths = list(path)
    else:
        raise ConfigError(f"{what}: path must be a string or a Path (or a list of them), got {type(path).__name__}")
    if not paths:
        raise ConfigError(f"{what}: no path given")
    out = []
    for p in paths:
        if not isinstance(p, (str, os.PathLike)):
            raise ConfigError(f"{what}: path must be a string or a Path, got {type(p).__name__}")
        p = Path(p)
        if p.suffix.lower() not in allowed:
            raise ConfigError(f"{what}: cannot write {str(p)!r}: the suffix must be one of {', '.join(allowed)}")
        out.append(_io.check_output(p, what))
    return out


def write_atomic(path: Path, write: Callable[[Path], None], what: str = "output") -> None:
    """``write(tmp)`` to a temporary file next to ``path``, then rename it over ``path``: an error
    never leaves a half-written file behind (``diffpipe._io.write_atomic``, the one writer)."""
    _io.write_atomic(path, write, what)
