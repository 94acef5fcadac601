"""``compile``: a validated ``Schedule`` becomes a ``Graph`` of dependency tensors.

The graph is an equinox Module of int32 arrays. Nodes are the schedule's ops, plus one transfer
node per cross-device data edge when communication is modelled as a resource (``contention``,
``blocking``). Nodes are numbered by topological level, so level ``l`` is the contiguous row range
``offsets[l] : offsets[l] + sizes[l]``: the evaluator reads and writes each level with one
dynamic slice instead of a scatter. Every ``[nodes]`` array has ``width`` scratch rows after the
real nodes (a level's fixed-width write may spill into them) and one sentinel row at the end,
which padded predecessors point to and which always holds ``-inf``.

Overlapped pairs (``Schedule.overlapped``, DualPipe's F&B): the pair's backward gets an *entry*
node (kind ``B``, ``op_index`` -1, no lane) that carries the backward's incoming edges and waits
and lasts 0; the forward waits for it and lasts the whole pair (a ``COST_PAIR`` row:
``Hardware.tables``), and the backward's own node follows the forward with duration 0. So the
pair starts when both members' inputs are ready, and both outputs leave at its end
(``_reference``'s semantics). Schedules without pairs compile exactly as before.

``compile(..., gradient_sync=True)`` adds the data-parallel gradient sync (docs/architecture.md,
"The data-parallel gradient sync"): per stage an ``R`` node on a per-device *sync lane*, and per
(pipeline, stage) a ``U`` node (the optimizer step) at the end of its device's compute lane; see
``_gradient_sync``.

Why one module past 500 lines: nodes, levels, padding, stacking and the gradient sync build one data
structure whose invariants each step relies on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array, Int

from .._arrays import power_of_two
from .._caches import BoundedDict
from .._errors import ConfigError, ScheduleError
from ..schedules import Op, Schedule
from ..schedules._analysis import weight_versions
from ..schedules._reference import as_duration_fn, evaluate
from ..schedules._rules import ACTIVATION, DATA, GRADIENT, LANE
from ._communication import BLOCK, LINK, AbstractCommunication, node_size, topology, transfers
from ._communication import communication as as_communication

#: Node kind codes (``Graph.kind``); -1 marks padding.
KIND_CODES = {"F": 0, "B": 1, "I": 2, "W": 3, "U": 4, "R": 5, "T": 6}
PAD = -1
#: Edge type codes (``Graph.edge``); 0 marks padding.
EDGE_PAD, EDGE_LANE, EDGE_DATA, EDGE_ACTIVATION, EDGE_GRADIENT, EDGE_FEED, EDGE_LINK, EDGE_BLOCK = range(8)
_EDGE_CODES = {LANE: EDGE_LANE, DATA: EDGE_DATA, ACTIVATION: EDGE_ACTIVATION, GRADIENT: EDGE_GRADIENT,
               LINK: EDGE_LINK, BLOCK: EDGE_BLOCK}

#: Cost-row types (``Graph.node_cost[:, 0]``): zero, the four compute kinds, optimizer step,
#: all-reduce (args: participants, first and last device), transfer (args: src, dst, boundary),
#: overlapped pair (pipeline and stage of its forward; args: the cost row of its backward alone,
#: the forward's and the backward's microbatch).
COST_ZERO, COST_F, COST_B, COST_I, COST_W, COST_U, COST_R, COST_T, COST_PAIR = range(9)
#: Step-boundary roles (bits of ``Graph.node_cost[:, 6]``): a source (no predecessor) also lasts the
#: step's ``setup``, a sink (no successor) its ``wind_down`` (``Hardware.tables``).
ROLE_SOURCE, ROLE_SINK = 1, 2
#: ``Graph.node_cost`` columns of a compute (or pair) row: the cross-device transfers the op sends
#: and receives, each costing its device host time (``Hardware.send_cost`` / ``recv_cost``).
COST_SENDS, COST_RECEIVES = 7, 8


class Graph(eqx.Module):
    """Dependency tensors of one schedule (or, from ``stack_graphs``, of several, stacked).

    Per node ``[nodes]``: ``kind``, ``stage``, ``pipeline``, ``microbatch`` (the step for U/R),
    ``device`` (its compute lane; a transfer's sender; an R's first participant), ``dst`` (a
    transfer's receiver), ``boundary`` (stage boundary a transfer crosses, else -1), ``group``
    (participants of a collective), ``op_index`` (position in ``schedule.ops``, -1 otherwise).
    Per edge ``[nodes, k]``: ``pred`` (sentinel-padded), ``edge`` (type code), and for transfer edges
    ``edge_src``, ``edge_dst``, ``edge_boundary``. Per level: ``offsets``, ``sizes``.
    Costs: nodes that cost the same share a *cost row* ``node_row`` described by ``node_cost``
    (``COST_*`` type, pipeline, stage, three arguments, ``ROLE_*`` bits, the cross-device transfers
    a compute op sends and receives: ``COST_SENDS``, ``COST_RECEIVES``); a node lasts
    ``base[row] + size[microbatch] * per_size[row]`` (``Hardware.tables``). Transfer edges likewise
    share ``edge_row`` rows described by ``edge_cost`` (src, dst, pipeline, boundary); row 0 is free.
    ``xfer_node``/``xfer_slot`` list the transfer edges (sentinel-padded) for the gradient.
    Lanes: ``lane_nodes``/``lane_device`` list every device's compute-lane ops in order (a
    collective once per participant; gradient_sync's ``U`` nodes last; its sync-lane ``R`` nodes,
    which keep no compute lane busy, are not listed); ``release`` is
    +1 where an op stores an activation (F), -1 where it frees one (B, or W when split), else 0;
    ``holder[p, s]`` is the device of stage s of pipeline p; ``versions[p, s]`` weight versions held.
    """

    kind: Int[Array, " nodes"]
    stage: Int[Array, " nodes"]
    pipeline: Int[Array, " nodes"]
    microbatch: Int[Array, " nodes"]
    device: Int[Array, " nodes"]
    dst: Int[Array, " nodes"]
    boundary: Int[Array, " nodes"]
    group: Int[Array, " nodes"]
    op_index: Int[Array, " nodes"]
    release: Int[Array, " nodes"]
    node_row: Int[Array, " nodes"]
    edge_row: Int[Array, "nodes k"]
    node_cost: Int[Array, "costs 9"]
    edge_cost: Int[Array, "edge_costs 4"]
    xfer_node: Int[Array, " transfers"]
    xfer_slot: Int[Array, " transfers"]
    pred: Int[Array, "nodes k"]
    edge: Int[Array, "nodes k"]
    edge_src: Int[Array, "nodes k"]
    edge_dst: Int[Array, "nodes k"]
    edge_boundary: Int[Array, "nodes k"]
    offsets: Int[Array, " levels"]
    sizes: Int[Array, " levels"]
    sinks: Int[Array, " sinks"]
    step_last: Int[Array, " steps"]
    lane_nodes: Int[Array, " lane"]
    lane_device: Int[Array, " lane"]
    holder: Int[Array, "pipelines stages"]
    versions: Int[Array, "pipelines stages"]
    width: int = eqx.field(static=True)
    devices: int = eqx.field(static=True)
    stages: int = eqx.field(static=True)
    pipelines: int = eqx.field(static=True)
    microbatches: int = eqx.field(static=True)
    steps: int = eqx.field(static=True)
    communication: AbstractCommunication = eqx.field(static=True)
    devices_per_node: int = eqx.field(static=True)

    @property
    def sentinel(self) -> int:
        return self.kind.shape[-1] - 1

    @property
    def structure(self) -> tuple[int, ...]:
        """Array sizes: graphs of equal structure (and equal static fields) stack without padding."""
        return (self.kind.shape[-1], self.pred.shape[-1], self.offsets.shape[-1], self.width,
                self.sinks.shape[-1], self.lane_nodes.shape[-1], self.node_cost.shape[-2],
                self.edge_cost.shape[-2], self.step_last.shape[-1], self.xfer_node.shape[-1])


def _int_array(x) -> Array:
    """A host int32 array on the default device. ``jax.device_put`` rather than ``jnp.asarray``,
    which compiles a small conversion per new shape (about 0.1 s per compiled graph, measured)."""
    return jax.device_put(np.asarray(x, dtype=np.int32))


@dataclass
class _Node:
    kind: str
    stage: int
    pipeline: int
    microbatch: int
    device: int
    dst: int
    boundary: int = -1
    group: int = 1
    op_index: int = -1
    preds: list = field(default_factory=list)  # [(node id, edge code, src, dst, boundary)]
    pair: tuple | None = None  # a pair's forward: (kind, pipeline, stage, microbatch) of its backward
    free: bool = False  # lasts 0 (a pair's backward and its entry)


def compile(  # noqa: A001 - the public name dp.compile
    schedule: Schedule,
    *,
    communication: str | AbstractCommunication = "overlap",
    devices_per_node: int | None = None,
    gradient_sync: bool = False,
) -> Graph:
    """Compile ``schedule`` into dependency tensors.

    Args:
        schedule: a (validated) ``Schedule``.
        communication: an ``AbstractCommunication`` or its name (``none``, ``overlap``,
            ``contention``, ``blocking``, ``rendezvous``). ``none`` and ``overlap`` put transfers
            on edges; the others make each transfer a node (structure differs).
        devices_per_node: devices sharing a node (default: all on one node): the one home of the
            topology (``Graph.devices_per_node``). ``Hardware.tables`` reads it to price each pair
            over the intra- or the inter-node link; under ``contention`` inter-node transfers
            share their sending node's NIC.
        gradient_sync: add the data-parallel gradient sync of every stage and the optimizer
            steps (``_gradient_sync``); the step then ends when every sync and update has
            ended. Schedules that already contain ``R`` or ``U`` ops (chimera's ``sync``
            option, the asynchronous pipedream/amdp) are refused: they model their own.

    Returns:
        A ``Graph``, which carries its mode and topology: any ``Hardware`` prices it under them.
    """
    if not isinstance(schedule, Schedule):
        raise ConfigError(f"compile expects a Schedule, got {type(schedule).__name__}")
    mode = as_communication(communication)
    per_node = node_size(devices_per_node, schedule.devices)
    if not isinstance(per_node, int) or per_node < 1:
        raise ConfigError(f"devices_per_node must be a positive int, got {devices_per_node!r}")

    ops = schedule.ops
    index = {op: i for i, op in enumerate(ops)}
    nodes: list[_Node] = []
    for i, op in enumerate(ops):
        lanes = schedule.devices_of(op)
        nodes.append(_Node(op.kind, op.stage, op.pipeline, op.microbatch, lanes[0], lanes[-1],
                           group=len(lanes), op_index=i))
    # A pair's backward receives its inputs (edges, waits) on its entry node (module docstring).
    entry = dict(index)
    for f, b in schedule.pairs.items():
        e = len(nodes)
        nodes.append(_Node("B", b.stage, b.pipeline, b.microbatch, nodes[index[b]].device, nodes[index[b]].dst,
                           free=True))
        entry[b] = e
        nodes[index[b]].free = True
        nodes[index[f]].pair = (b.kind, b.pipeline, b.stage, b.microbatch)
        nodes[index[f]].preds.append((e, EDGE_LANE, -1, -1, -1))
    partner = {b: f for f, b in schedule.pairs.items()}
    # Nodes: an op, or (its mode's ``transfer_nodes``) a transfer, keyed by (producer, consumer).
    node_of: dict[Op | tuple[Op, Op], int] = dict(index)
    for i, op in enumerate(ops):
        for dep in schedule.dependencies[op]:
            code = _EDGE_CODES[dep.edge]
            if op in partner and dep.op == partner[op]:
                nodes[i].preds.append((index[dep.op], code, dep.src, dep.dst, dep.boundary))  # after the pair
                continue
            to = entry[op]
            if mode.transfer_nodes and dep.is_transfer:
                t = len(nodes)
                nodes.append(_Node("T", op.stage, op.pipeline, op.microbatch, dep.src, dep.dst,
                                   boundary=dep.boundary))
                nodes[t].preds.append((index[dep.op], EDGE_FEED, dep.src, dep.src, -1))
                nodes[to].preds.append((t, EDGE_FEED, dep.dst, dep.dst, -1))
                node_of[(dep.op, op)] = t
            else:
                nodes[to].preds.append((index[dep.op], code, dep.src, dep.dst, dep.boundary))
    wait = _EDGE_CODES[mode.wait_edge]
    for waiter, waited in mode.waits(schedule, per_node):
        nodes[entry.get(waiter, node_of.get(waiter))].preds.append((node_of[waited], wait, -1, -1, -1))
    if not isinstance(gradient_sync, bool):
        raise ConfigError(f"compile: gradient_sync must be True or False, got {gradient_sync!r}")
    if gradient_sync:
        _gradient_sync(schedule, nodes, node_of, mode)

    level = _levels(nodes, mode=mode, ops=ops)
    return _arrays(schedule, nodes, level, mode, per_node)


def sync_order(schedule: Schedule) -> tuple[dict[tuple[int, int], Op], list[int]]:
    """The last backward op of every (pipeline, stage) -- its last ``B`` or ``W`` in its device's
    order -- and the stages in the order their syncs are issued: by when their last backward
    (the latest over pipeline replicas) ends at the default unit durations (F=1, B=2, I=W=1),
    ties by stage. On one device that is the order of the last backwards in the device's order;
    across devices it is one global order, so devices that sync a stage together agree on it."""
    last: dict[tuple[int, int], Op] = {}
    for order in schedule.orders:
        for op in order:
            if op.kind in ("B", "W"):
                last[(op.pipeline, op.stage)] = op
    _, unit = evaluate(schedule, as_duration_fn(None))
    pipes = range(schedule.pipelines)
    stages = sorted(range(schedule.stages), key=lambda s: (max(unit[last[(p, s)]] for p in pipes), s))
    return last, stages


def _gradient_sync(schedule: Schedule, nodes: list[_Node], node_of: dict, mode: AbstractCommunication) -> None:
    """Append the gradient-sync nodes (docs/architecture.md, gradient sync) to ``nodes``.

    - ``R`` of stage ``s``: the all-reduce of that stage's gradients over the devices holding it
      (one, except for schedules with pipeline replicas: chimera, dualpipe) and the network's
      data-parallel group. It runs on each holder's *sync lane* (a communication stream of its
      own: it neither occupies the compute lane nor a link lane) once the last backward of every
      replica of ``s`` and the previous sync on each holder's sync lane have ended. Syncs are
      issued in ``sync_order``. Its cost row is an all-reduce row (``Hardware.tables``) of
      ``holders x network.data_parallel`` participants moving ``gradient_bytes[0, s]`` (pipeline
      replicas hold the same stage). With one pipeline this is one R per (pipeline, stage).
    - ``U`` of (pipeline, stage): the optimizer step, on the holder's compute lane after the
      device's last op (and whatever holds the device past it: ``mode.tail_waits``), the previous
      ``U`` and that stage's ``R``; a device updates its stages in sync order.

    Neither stores nor frees activations (peak memory is unchanged).
    """
    found = sorted({op.kind for op in schedule.ops} & {"R", "U"})
    if found:
        raise ConfigError(f"compile: gradient_sync=True, but the {schedule.family} schedule already has its own "
                          f"{'/'.join(found)} ops; compile it with gradient_sync=False")
    last, stages = sync_order(schedule)
    placement = schedule.placement
    sync_lane: dict[int, int] = {}  # device -> its latest R node
    sync_node: dict[int, int] = {}  # stage -> its R node
    for s in stages:
        holders = sorted({placement.device(p, s) for p in range(schedule.pipelines)})
        r = len(nodes)
        nodes.append(_Node("R", s, 0, 0, holders[0], holders[-1], group=len(holders)))
        for p in range(schedule.pipelines):
            op = last[(p, s)]
            nodes[r].preds.append((node_of[op], EDGE_DATA, -1, -1, -1))
        for d in holders:
            if d in sync_lane:
                nodes[r].preds.append((sync_lane[d], EDGE_LANE, -1, -1, -1))
            sync_lane[d] = r
        sync_node[s] = r
    rank = {s: i for i, s in enumerate(stages)}
    block = _EDGE_CODES[mode.wait_edge]
    for d, order in enumerate(schedule.orders):
        held = sorted({(op.pipeline, op.stage) for op in order}, key=lambda ps: (rank[ps[1]], ps[0]))
        previous = node_of[order[-1]]
        tail = [(node_of[node], block, -1, -1, -1) for node in mode.tail_waits(schedule, d)]
        for p, s in held:
            u = len(nodes)
            nodes.append(_Node("U", s, p, 0, d, d))
            nodes[u].preds.extend([(previous, EDGE_LANE, -1, -1, -1), (sync_node[s], EDGE_DATA, -1, -1, -1), *tail])
            previous, tail = u, []


def _levels(nodes: list[_Node], *, mode: AbstractCommunication, ops: Sequence[Op]) -> list[int]:
    """Longest-path level of every node (Kahn); a cycle only arises from a mode's waits."""
    successors: list[list[int]] = [[] for _ in nodes]
    waiting = [len(n.preds) for n in nodes]
    for i, n in enumerate(nodes):
        for p, *_ in n.preds:
            successors[p].append(i)
    level = [0] * len(nodes)
    ready = deque(i for i, w in enumerate(waiting) if w == 0)
    seen = 0
    while ready:
        i = ready.popleft()
        seen += 1
        for j in successors[i]:
            level[j] = max(level[j], level[i] + 1)
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    if seen != len(nodes):
        stuck = [i for i, w in enumerate(waiting) if w > 0 and nodes[i].op_index >= 0]
        names = ", ".join(str(ops[nodes[i].op_index]) for i in stuck[:4])
        raise ScheduleError(
            f"the schedule deadlocks under {mode} communication ({mode.deadlock}); stuck ops include {names}; "
            "use communication='overlap' or 'contention'"
        )
    return level


def _cost_rows(nodes: list[_Node], new: dict[int, int], rows: int, k: int, schedule: Schedule):
    """Group nodes (and transfer edges) that cost the same into rows of small cost tables."""
    kinds = {"F": COST_F, "B": COST_B, "I": COST_I, "W": COST_W, "U": COST_U, "R": COST_R, "T": COST_T}
    node_rows: dict[tuple, int] = {(COST_ZERO, 0, 0, 0, 0, 0, 0, 0, 0): 0}
    sends: dict[Op, int] = {}
    receives: dict[Op, int] = {}
    for producer, consumer, _ in transfers(schedule):
        sends[producer] = sends.get(producer, 0) + 1
        receives[consumer] = receives.get(consumer, 0) + 1

    def host(n: _Node) -> tuple[int, int]:
        """The transfers a compute node sends and receives (a pair: both members')."""
        if n.free or n.op_index < 0 or n.kind not in ("F", "B", "I", "W"):
            return 0, 0
        ops = [schedule.ops[n.op_index]]
        if n.pair is not None:
            kind, pipeline, stage, microbatch = n.pair
            ops.append(Op(kind, stage, microbatch, pipeline))
        return sum(sends.get(op, 0) for op in ops), sum(receives.get(op, 0) for op in ops)

    has_successor = {p for n in nodes for p, *_ in n.preds}
    edge_rows: dict[tuple, int] = {(0, 0, 0, -1): 0}
    node_row = np.zeros(rows, dtype=np.int32)
    edge_row = np.zeros((rows, k), dtype=np.int32)
    for old, n in enumerate(nodes):
        if n.kind == "R":
            key = (COST_R, n.pipeline, n.stage, n.group, n.device, n.dst)
        elif n.kind == "T":
            key = (COST_T, n.pipeline, n.stage, n.device, n.dst, n.boundary)
        elif n.free:
            key = (COST_ZERO, 0, 0, 0, 0, 0)
        elif n.pair is not None:
            kind, pipeline, stage, microbatch = n.pair
            alone = node_rows.setdefault((kinds[kind], pipeline, stage, 0, 0, 0, 0, 0, 0), len(node_rows))
            key = (COST_PAIR, n.pipeline, n.stage, alone, n.microbatch, microbatch)
        else:
            key = (kinds[n.kind], n.pipeline, n.stage, 0, 0, 0)
        role = (ROLE_SOURCE if not n.preds else 0) | (ROLE_SINK if old not in has_successor else 0)
        node_row[new[old]] = node_rows.setdefault((*key, role, *host(n)), len(node_rows))
        for slot, (_, code, src, dst, boundary) in enumerate(n.preds):
            if code in (EDGE_ACTIVATION, EDGE_GRADIENT):
                edge_row[new[old], slot] = edge_rows.setdefault((src, dst, n.pipeline, boundary), len(edge_rows))
    node_cost = np.asarray(list(node_rows), dtype=np.int32)
    edge_cost = np.asarray(list(edge_rows), dtype=np.int32)
    edge_cost[0, 3] = 0
    return node_row, edge_row, node_cost, edge_cost


def _arrays(schedule: Schedule, nodes: list[_Node], level: list[int], communication: AbstractCommunication,
            per_node: int) -> Graph:
    count = len(nodes)
    order = sorted(range(count), key=lambda i: (level[i], i))
    new = {old: pos for pos, old in enumerate(order)}
    levels = max(level) + 1 if count else 0
    sizes = np.bincount(np.asarray(level, dtype=np.int64), minlength=levels)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
    width = int(sizes.max()) if count else 1
    k = max((len(n.preds) for n in nodes), default=0) or 1
    rows = count + width + 1
    sentinel = rows - 1

    def column(fill: int) -> np.ndarray:
        return np.full(rows, fill, dtype=np.int32)

    kind, stage, pipe, mb, dev, dst, bnd, grp, opi, rel = (column(v) for v in (PAD, 0, 0, 0, 0, 0, -1, 1, -1, 0))
    pred = np.full((rows, k), sentinel, dtype=np.int32)
    edge = np.zeros((rows, k), dtype=np.int32)
    esrc, edst, ebnd = (np.zeros((rows, k), dtype=np.int32) for _ in range(3))
    has_successor = np.zeros(rows, dtype=bool)
    for old, n in enumerate(nodes):
        i = new[old]
        kind[i], stage[i], pipe[i], mb[i] = KIND_CODES[n.kind], n.stage, n.pipeline, n.microbatch
        dev[i], dst[i], bnd[i], grp[i], opi[i] = n.device, n.dst, n.boundary, n.group, n.op_index
        if n.kind == "F":
            rel[i] = 1
        for slot, (p, code, src, to, boundary) in enumerate(n.preds):
            pred[i, slot], edge[i, slot] = new[p], code
            esrc[i, slot], edst[i, slot], ebnd[i, slot] = max(src, 0), max(to, 0), boundary
            has_successor[new[p]] = True
    ops = schedule.ops
    backward_split = {(op.pipeline, op.stage, op.microbatch) for op in ops if op.kind == "W"}
    for old, n in enumerate(nodes):
        if n.op_index < 0:  # a pair's entry node: no activation (lane nodes only are read)
            continue
        if n.kind == "W" or (n.kind == "B" and (n.pipeline, n.stage, n.microbatch) not in backward_split):
            rel[new[old]] = -1
    node_row, edge_row, node_cost, edge_cost = _cost_rows(nodes, new, rows, k, schedule)
    xfer = [(i, slot) for i in range(rows) for slot in range(k) if edge_row[i, slot] > 0] or [(sentinel, 0)]
    xfer_node = np.asarray([i for i, _ in xfer], dtype=np.int32)
    xfer_slot = np.asarray([slot for _, slot in xfer], dtype=np.int32)
    sinks = np.array([new[i] for i in range(count) if not has_successor[new[i]]], dtype=np.int32)
    # The last op of each step (by topological level) marks when that step's work has finished.
    step_last = np.full(schedule.steps, sentinel, dtype=np.int32)
    for old, n in enumerate(nodes):
        if n.op_index >= 0 or n.kind in ("R", "U"):  # gradient-sync nodes end the (one) step
            step = schedule.step_of(ops[n.op_index]) if n.op_index >= 0 else schedule.steps - 1
            if step_last[step] == sentinel or level[old] >= level[order[step_last[step]]]:
                step_last[step] = new[old]
    lane_nodes, lane_device = [], []
    op_node = {nodes[old].op_index: new[old] for old in range(count) if nodes[old].op_index >= 0}
    index = {op: i for i, op in enumerate(ops)}
    updates: list[list[int]] = [[] for _ in schedule.orders]  # gradient_sync's optimizer steps, in order
    for old, n in enumerate(nodes):
        if n.kind == "U" and n.op_index < 0:
            updates[n.device].append(new[old])
    for d, lane in enumerate(schedule.orders):
        for op in lane:
            lane_nodes.append(op_node[index[op]])
            lane_device.append(d)
        lane_nodes.extend(updates[d])
        lane_device.extend([d] * len(updates[d]))

    return Graph(
        kind=_int_array(kind), stage=_int_array(stage), pipeline=_int_array(pipe),
        microbatch=_int_array(mb), device=_int_array(dev), dst=_int_array(dst),
        boundary=_int_array(bnd), group=_int_array(grp), op_index=_int_array(opi),
        release=_int_array(rel), node_row=_int_array(node_row), edge_row=_int_array(edge_row),
        node_cost=_int_array(node_cost), edge_cost=_int_array(edge_cost),
        xfer_node=_int_array(xfer_node), xfer_slot=_int_array(xfer_slot),
        pred=_int_array(pred), edge=_int_array(edge),
        edge_src=_int_array(esrc), edge_dst=_int_array(edst), edge_boundary=_int_array(ebnd),
        offsets=_int_array(offsets), sizes=_int_array(sizes.astype(np.int32)),
        sinks=_int_array(sinks), step_last=_int_array(step_last),
        lane_nodes=_int_array(np.asarray(lane_nodes, dtype=np.int32)),
        lane_device=_int_array(np.asarray(lane_device, dtype=np.int32)),
        holder=_int_array(np.asarray(schedule.placement.table, dtype=np.int32)),
        versions=_int_array(np.asarray(weight_versions(schedule), dtype=np.int32)),
        width=width, devices=schedule.devices, stages=schedule.stages,
        pipelines=schedule.pipelines, microbatches=schedule.microbatches, steps=schedule.steps,
        communication=communication, devices_per_node=per_node,
    )


def pad_graph(graph: Graph, *, nodes: int, k: int, levels: int, width: int, sinks: int, lane: int,
              steps: int, devices: int, stages: int, pipelines: int, microbatches: int,
              costs: int | None = None, edge_costs: int | None = None, transfers: int | None = None,
              devices_per_node: int | None = None) -> Graph:
    """``graph`` padded to larger sizes without changing any result: padded predecessors, sinks and
    lane entries point to the sentinel (``-inf``, no activation), padded levels to scratch rows."""
    n = int(np.sum(np.asarray(graph.kind) != PAD))
    costs = costs or graph.node_cost.shape[0]
    edge_costs = edge_costs or graph.edge_cost.shape[0]
    transfers = transfers or graph.xfer_node.shape[0]
    old_sentinel = graph.sentinel
    rows = nodes + width + 1
    sentinel = rows - 1
    if nodes < n or width < graph.width or k < graph.pred.shape[-1] or levels < graph.offsets.shape[-1]:
        raise ConfigError("pad_graph: target sizes are smaller than the graph's")

    def rowwise(x: Array, fill: int) -> Array:
        x = np.asarray(x)
        out = np.full((rows, *x.shape[1:]), fill, dtype=x.dtype)
        out[:n] = x[:n]
        return out

    def columns(x: Array, fill: int) -> Array:
        x = rowwise(x, fill)
        out = np.full((rows, k), fill, dtype=x.dtype)
        out[:, : x.shape[1]] = x
        return out

    def extend(x: Array, size: int, fill: int) -> np.ndarray:
        x = np.asarray(x)
        return np.concatenate([x, np.full(size - x.shape[0], fill, dtype=x.dtype)])

    def remap(x: np.ndarray) -> np.ndarray:
        return np.where(x == old_sentinel, sentinel, x).astype(np.int32)

    def table(x: Array) -> np.ndarray:
        x = np.asarray(x)
        out = np.zeros((pipelines, stages), dtype=x.dtype)
        out[: x.shape[0], : x.shape[1]] = x
        return out

    def cost_table(x: Array, size: int) -> np.ndarray:
        x = np.asarray(x)
        out = np.zeros((size, x.shape[1]), dtype=x.dtype)
        out[: x.shape[0]] = x
        return out

    pred = remap(columns(graph.pred, old_sentinel))
    pred[n:] = sentinel
    lane_nodes = remap(extend(graph.lane_nodes, lane, old_sentinel))
    return Graph(
        kind=_int_array(rowwise(graph.kind, PAD)), stage=_int_array(rowwise(graph.stage, 0)),
        pipeline=_int_array(rowwise(graph.pipeline, 0)), microbatch=_int_array(rowwise(graph.microbatch, 0)),
        device=_int_array(rowwise(graph.device, 0)), dst=_int_array(rowwise(graph.dst, 0)),
        boundary=_int_array(rowwise(graph.boundary, -1)), group=_int_array(rowwise(graph.group, 1)),
        op_index=_int_array(rowwise(graph.op_index, -1)), release=_int_array(rowwise(graph.release, 0)),
        node_row=_int_array(rowwise(graph.node_row, 0)), edge_row=_int_array(columns(graph.edge_row, 0)),
        node_cost=_int_array(cost_table(graph.node_cost, costs)),
        edge_cost=_int_array(cost_table(graph.edge_cost, edge_costs)),
        xfer_node=_int_array(remap(extend(graph.xfer_node, transfers, old_sentinel))),
        xfer_slot=_int_array(extend(graph.xfer_slot, transfers, 0)),
        pred=_int_array(pred), edge=_int_array(columns(graph.edge, EDGE_PAD)),
        edge_src=_int_array(columns(graph.edge_src, 0)), edge_dst=_int_array(columns(graph.edge_dst, 0)),
        edge_boundary=_int_array(columns(graph.edge_boundary, -1)),
        offsets=_int_array(extend(graph.offsets, levels, nodes)), sizes=_int_array(extend(graph.sizes, levels, 0)),
        sinks=_int_array(remap(extend(graph.sinks, sinks, old_sentinel))),
        step_last=_int_array(remap(extend(graph.step_last, steps, old_sentinel))),
        lane_nodes=_int_array(lane_nodes),
        lane_device=_int_array(extend(graph.lane_device, lane, devices - 1)),
        holder=_int_array(table(graph.holder)), versions=_int_array(table(graph.versions)),
        width=width, devices=devices, stages=stages, pipelines=pipelines, microbatches=microbatches,
        steps=steps, communication=graph.communication,
        devices_per_node=devices_per_node or graph.devices_per_node,
    )


def common_sizes(graphs: Sequence[Graph]) -> dict[str, int]:
    """The smallest sizes every graph pads to (``pad_graph``'s keyword arguments)."""
    return dict(
        nodes=max(int(np.sum(np.asarray(g.kind) != PAD)) for g in graphs),
        k=max(g.pred.shape[-1] for g in graphs), levels=max(g.offsets.shape[-1] for g in graphs),
        width=max(g.width for g in graphs), sinks=max(g.sinks.shape[-1] for g in graphs),
        lane=max(g.lane_nodes.shape[-1] for g in graphs), steps=max(g.steps for g in graphs),
        devices=max(g.devices for g in graphs), stages=max(g.stages for g in graphs),
        pipelines=max(g.pipelines for g in graphs), microbatches=max(g.microbatches for g in graphs),
        costs=max(g.node_cost.shape[0] for g in graphs), edge_costs=max(g.edge_cost.shape[0] for g in graphs),
        transfers=max(g.xfer_node.shape[0] for g in graphs),
    )


#: Smallest bucket of levels and of level width (``bucket_sizes``): below these, padding costs less
#: than one more compiled program.
BUCKET_LEVELS = 16
BUCKET_WIDTH = 16
#: Devices pad to at least ``levels / BUCKET_DEVICES`` (a schedule over ``d`` devices has at least
#: about ``2 d`` levels, fill and drain), so the device count rarely splits a bucket; per-device
#: arrays are small (the largest, the pair links, ``devices^2``).
BUCKET_DEVICES = 8
#: Padded graphs kept (``bucketed``), keyed by the graph object.
_BUCKETED_KEPT = 256
_BUCKETED: BoundedDict = BoundedDict(_BUCKETED_KEPT)  # id(graph) -> (graph, padded)


def bucket_sizes(graph: Graph) -> dict[str, int]:
    """The size bucket of ``graph`` (``pad_graph``'s keyword arguments): levels and level width up
    to powers of two (at least ``BUCKET_LEVELS``, ``BUCKET_WIDTH``), devices and pipelines up to
    powers of two, and every other size up to ``levels x width`` rows (the most nodes a graph of
    that many levels of that width has; a size past it goes to its own power of two), devices to
    at least ``levels / BUCKET_DEVICES``. So a bucket is, in practice, the pair (levels, width) of
    powers of two: graphs of one bucket and
    one communication setting share every compiled evaluator, and padding never changes a result
    (``pad_graph``)."""
    s = common_sizes([graph])
    levels, width = power_of_two(s["levels"], BUCKET_LEVELS), power_of_two(s["width"], BUCKET_WIDTH)
    nodes, k = levels * width, power_of_two(s["k"])
    out = dict(nodes=nodes, k=k, levels=levels, width=width, pipelines=power_of_two(s["pipelines"]),
               devices=max(power_of_two(s["devices"]), levels // BUCKET_DEVICES))
    for name in ("sinks", "lane", "steps", "stages", "microbatches", "costs"):
        out[name] = max(nodes, power_of_two(s[name]))
    for name in ("edge_costs", "transfers"):
        out[name] = max(nodes * k, power_of_two(s[name]))
    return out


def bucketed(graph: Graph) -> Graph:
    """``graph`` padded to its size bucket (``bucket_sizes``), cached by graph object: one compiled
    evaluator then serves every graph of the bucket. Results are those of ``graph`` on its own
    rows, devices, stages and microbatches (``pad_hardware`` pads the hardware to match)."""
    held = _BUCKETED.get(id(graph))
    if held is not None and held[0] is graph:
        return held[1]
    padded = pad_graph(graph, **bucket_sizes(graph))
    _BUCKETED[id(graph)] = (graph, padded)
    return padded


def stack_graphs(graphs: Sequence[Graph]) -> Graph:
    """Pad graphs to common sizes and stack them (a leading axis on every array), so that one
    ``jax.vmap`` evaluates several schedules; padding never changes a result. Per-stage hardware
    is then broadcast against the largest ``stages``/``pipelines``/``microbatches``/``devices``."""
    graphs = list(graphs)
    if not graphs:
        raise ConfigError("stack_graphs needs at least one graph")
    modes = {(g.communication, topology(g.devices_per_node, g.devices)) for g in graphs}
    if len(modes) > 1:
        settings = sorted(f"{mode} with {per_node or 'all'} devices per node" for mode, per_node in modes)
        raise ConfigError(f"stack_graphs: graphs compiled for different communication settings: {', '.join(settings)}")
    sizes = common_sizes(graphs)
    ((_, per_node),) = modes
    per_node = node_size(per_node, sizes["devices"])
    padded = [pad_graph(g, **sizes, devices_per_node=per_node) for g in graphs]
    return jax.tree.map(lambda *xs: _int_array(np.stack([np.asarray(x) for x in xs])), *padded)
