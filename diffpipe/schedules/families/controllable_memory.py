"""Controllable-memory V schedules: V-Half, V-Min, and a memory budget that chooses among them.

Source: Qi, Wan, Huang and Lin, "Pipeline Parallelism with Controllable Memory", NeurIPS 2024
(arXiv 2405.15362), §3 (building blocks: a schedule's peak memory is set by the lifespan of one
microbatch's block), §4 (V-Min, V-Half on the V placement) and the authors' scheduler
(sail-sg/zero-bubble-pipeline-parallelism, ``zbv_greedy.py``: the block offsets used below).

All three put two chunks on each device in a V (``Placement.v``: stage s on device s for s < D,
else 2D-1-s) and split the backward into I and W, so each device runs six unit passes per
microbatch: F, I, W of both of its chunks. The construction, at unit pass times:

1. *Building block*: device i starts microbatch m's chunk-0 forward, chunk-1 forward, chunk-1
   input-gradient and chunk-0 input-gradient at ``offset + 6m``, with the offsets of the paper's
   block (V-Min: ``i, 2D-1-i, 2D+g+i, 4D+g-1-i`` with g = 2 when 3 divides D, else 0; V-Half:
   ``2i, 3D-2-i, 3D+g+2i-1, 6D+g-2-i`` with g = 3 when D is even, else 0).
2. Each W pass takes the first free slot after its I (oldest first, chunk 1's before chunk 0's).
3. *Squeeze* (the compaction of the repeated blocks): visiting passes in slot order, each moves
   to the earliest free slot after its inputs (and after the same pass of the previous microbatch,
   and after the block's previous pass of the same microbatch on its device) that keeps the
   block's peak of held activations; the steady state (from device 0's first chunk-0 I to the
   first chunk-0 forward of the last microbatch) stays put. The slots are then re-timed eagerly,
   the W passes taken out, the cool-down squeezed again (each idle slot then runs a pending W),
   and the W passes put back (chunk 1's first).

These are the steps of the authors' greedy (``zbv_greedy.py``), re-implemented here; on every size
tried (D = 2..12, N = D..3D+1) the orders equal the ones that code produces, op for op (checked
while writing this module, not in the test suite, which does not vendor their code).
A device's order is its passes sorted by slot; like every order, it runs at any durations.
Memory is that of the block, exactly, read off the orders (``_analysis.peak_activations``): in
chunk-microbatches ``2·((D+2)//2)`` for V-Half and ``2·((D+4)//3)`` for V-Min, against 1F1B's (and
ZB-V's) ``2D`` -- full-stage microbatches ``(D+2)//2`` and ``(D+4)//3`` against ``D``. The bubble
at ``t_F = t_I = t_W`` is at most half of 1F1B's for V-Half and at most two thirds for V-Min,
approaching those fractions as D grows (the paper's Table 1; measured in
``tests/test_families_v_and_dualpipe.py``), and does not depend on N. No closed form is published,
so none is registered.

``v-schedule``: the paper's point that memory chooses the schedule. ``memory`` is the activation
budget as a fraction of 1F1B's (``D`` full-stage microbatches, ``2D`` chunk-microbatches held;
``cap`` rounds it down to chunk-microbatches). The candidates are ZB-V, V-Half, V-Min and the
*strided blocks* (``strided_blocks``): the authors' search space of ``v_auto_schedule.py``
(stride d0 of 1..5 slots between neighbouring devices for the first j hops of the V, then
d1 <= d0), each with the fewest idle slots at the V's three turns that give every device's passes
distinct slots of the 6-slot period (``strided_offsets``; V-Min is stride 1, V-Half stride 2).
Each goes through steps 2-3 above; a block's lifespans, so its memory, grow with its strides,
and its bubble shrinks. ``ranked`` measures every candidate at unit pass times (bubble: the
makespan beyond the 6N passes of each device; peak: read off the orders) at
``search_size`` = min(N, 2D) microbatches; the family returns the lowest-bubble one whose orders
at N hold at most the budget on every device. Because the feasible set only grows with the
budget, the bubble never rises with it, and it is never above that of zb-v, v-half or v-min at a
budget they fit. At D = 8, N = 32 (``tests/test_v_schedule.py``): 4, 5, 6, 7 and 8 full-stage
microbatches give bubbles of 23, 17, 11, 9 and 7 slots (V-Min: 27 at 4, V-Half 17 at 5, ZB-V 7
at 8). Two departures from ``v_auto_schedule.py``: it tries every first-device pattern (here:
every gap), where the gaps here are the smallest (trying all gaps and d1 > d0 on D = 8 bettered
one budget by one slot, 4.5 microbatches: 21 against 22); and its blocks go through its own
warm-up and cool-down reordering, where these go through this module's squeeze (``zbv_greedy``'s).
A budget below every candidate's peak is refused in one line. The ranking costs one construction
per candidate (about 4D of them; seconds at D = 16), cached per size.

``forward``, ``input_grad`` and ``weight`` (per-chunk pass times, default 1 each) make the
ranking that of the given times, as the authors' search ranks with its costs: each candidate's
orders (built at unit slots, valid at any times) are timed eagerly at N microbatches.

*Zero bubble at half memory* (the paper, and the authors' README: the necessary condition
``W + 2B >= 2F`` and ``W + 2F >= 2B``, B the input gradient I). Simulated in
``tests/test_v_schedule.py``: the steady-state idle (defined there: between the chunk-0 forwards
of microbatches 2D and 4D of N = 6D) of V-Half's orders is zero exactly where the condition holds,
on every point of a (F, I, W) grid of 0.5..3 at D = 5 and 8; so is that of ``v-schedule`` at
V-Half's budget ranked at those times (every point of a 4^3 grid at D = 5, 6, 8, measured while
writing; six points tested). V-Min's orders idle there at unequal times even where it holds; ZB-V's
(1F1B's memory) do not idle where it fails. At D = 4 V-Half's budget is 3 of 1F1B's 4
microbatches, far from half, and v-schedule then finds a wider block that idles at no time tried.

Why one module past 500 lines: V-Half, V-Min and the memory-budget ``v-schedule`` share one
construction (block, W placement, squeeze).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ..._caches import bounded
from ..._errors import ScheduleError
from .._analysis import activation_delta, peak_activations
from .._registry import Family, Option, register
from .._rules import data_predecessor
from .._schedule import Op, Placement, Schedule
from .._table import table
from .zero_bubble import generate_zb_v

#: Unit slots one microbatch occupies on a device: F, I and W of each of its two chunks.
PASSES = 6
#: The unit pass times the blocks are laid out in (a full B would be I + W).
UNIT = {"F": 1, "I": 1, "W": 1, "B": 2}
#: What each pass kind adds to a device's held activations (``_analysis.activation_delta``).
_DELTA = {kind: activation_delta(Op(kind, 0, 0)) for kind in ("F", "I", "W")}


class _Split(dict):
    """Every stage's input gradient is an I (the backward is split): ``data_predecessor``'s map."""

    def __missing__(self, key: object) -> str:
        return "I"


_SPLIT = _Split()


def _v_min_offsets(devices: int, i: int) -> tuple[int, int, int, int]:
    gap = 2 if devices % 3 == 0 else 0
    return i, 2 * devices - 1 - i, 2 * devices + gap + i, 4 * devices + gap - 1 - i


def _v_half_offsets(devices: int, i: int) -> tuple[int, int, int, int]:
    gap = 3 if devices % 2 == 0 else 0
    return 2 * i, 3 * devices - 2 - i, 3 * devices + gap + 2 * i - 1, 6 * devices + gap - 2 - i


BLOCKS: dict[str, Callable[[int, int], tuple[int, int, int, int]]] = {
    "v-half": _v_half_offsets,
    "v-min": _v_min_offsets,
}


def held(name: str, devices: int) -> int:
    """Full-stage microbatches of activations a device holds at most: ``D`` (zb-v),
    ``(D+2)//2`` (v-half), ``(D+4)//3`` (v-min) (Qi et al. 2024, Table 1)."""
    return {"zb-v": devices, "v-half": (devices + 2) // 2, "v-min": (devices + 4) // 3}[name]


def _fill_w(slots: dict[Op, int], device_ops: list[Op], chunk1: int | None) -> None:
    """Give each W of ``device_ops`` the first free slot after its I: oldest I first, or with
    ``chunk1`` given, that chunk's W passes before the other's."""
    passes = sorted((op for op in device_ops if op.kind != "W"), key=slots.__getitem__)
    pending: tuple[list[Op], list[Op]] = ([], [])
    k = slot = 0
    while k < len(passes) or pending[0] or pending[1]:
        if k < len(passes) and slots[passes[k]] == slot:
            if passes[k].kind == "I":
                pending[0 if chunk1 is None or passes[k].stage == chunk1 else 1].append(passes[k])
            k += 1
        else:
            queue = pending[0] or pending[1]
            if queue:
                done = queue.pop(0)
                w = Op("W", done.stage, done.microbatch)
                device_ops.append(w)
                slots[w] = slot
        slot += 1


def _peak(device_ops: list[Op], slots: dict[Op, int]) -> int:
    """Peak held activations of a device's passes in slot order; when the list has no W passes,
    each idle slot runs one pending W (as ``_fill_w`` will place them)."""
    return _timeline_peak(sorted((slots[op], op.kind) for op in device_ops))


def _timeline_peak(timeline: list[tuple[int, str]], cap: float = math.inf) -> int:
    """``_peak`` of a device's sorted (slot, kind) pairs; stops at the first count above ``cap``."""
    implicit = all(kind != "W" for _, kind in timeline)
    total = peak = pending = 0
    last = -1
    for slot, kind in timeline:
        if implicit:
            freed = min(slot - last - 1, pending)
            total, pending = total - freed, pending - freed
            pending += kind == "I"
        total += _DELTA[kind]
        last = slot
        if total > peak:
            peak = total
            if peak > cap:
                break
    return peak


def _squeeze(slots: dict[Op, int], by_device: list[list[Op]], placement: Placement, warm_up: bool) -> None:
    """Move passes, in slot order, to the earliest free slot after their inputs that keeps the
    block's peak activations (of its busiest device); step 3 of the module docstring. The
    cool-down is squeezed, the warm-up too if ``warm_up``; the steady state stays put."""
    stages, last = placement.stages, max(op.microbatch for op in slots)
    backward = {(0, op.stage, op.microbatch): "I" for op in slots}
    cap = max(_peak(ops, slots) for ops in by_device)  # the block's peak, on its busiest device
    taken = [{slots[op] for op in ops} for ops in by_device]
    explicit = [any(op.kind == "W" for op in ops) for ops in by_device]
    lines = [sorted((slots[op], op.kind) for op in ops) for ops in by_device]
    inputs = [sorted(slots[op] for op in ops if op.kind == "I") for ops in by_device]
    w_order = [sorted((op for op in ops if op.kind == "W"), key=slots.__getitem__) for ops in by_device]
    w_rank = {op: k for order in w_order for k, op in enumerate(order)}
    # On each device a microbatch's passes keep the block's order: F0, F1, I1, I0 (chunk 0, 1).
    before: dict[tuple[str, int], tuple[str, int]] = {}
    for i in range(placement.devices):
        chunk0, chunk1 = i, stages - 1 - i
        before |= {("F", chunk1): ("F", chunk0), ("I", chunk1): ("F", chunk1), ("I", chunk0): ("I", chunk1)}
    phase = 0
    for op in sorted(slots, key=lambda o: (slots[o], placement.device(0, o.stage))):
        device = placement.device(0, op.stage)
        if phase == 0 and op.kind == "I" and op.stage == 0:
            phase = 1
        if phase == 1:
            if op.kind == "F" and op.microbatch == last and op.stage < placement.devices:
                phase = 2
            continue
        if phase == 0 and not warm_up:
            continue
        if op.kind == "W":  # W passes are interchangeable tokens here: the k-th follows the k-th I
            k = w_rank[op]
            ready = inputs[device][k] + 1
            if k:
                ready = max(ready, slots[w_order[device][k - 1]] + 1)
        else:
            found = data_predecessor(op, backward, stages)
            ready = slots[found[0]] + 1 if found else 0
            if op.microbatch > 0:
                ready = max(ready, slots[Op(op.kind, op.stage, op.microbatch - 1)] + 1)
            if before.get((op.kind, op.stage)):  # the block's previous pass of this microbatch here
                kind, stage = before[(op.kind, op.stage)]
                ready = max(ready, slots[Op(kind, stage, op.microbatch)] + 1)
        current = slots[op]
        # With the W passes listed, moving an I or a W earlier never raises the held activations.
        check = op.kind == "F" or not explicit[device]
        others = None
        for slot in range(ready, current):
            if slot in taken[device]:
                continue
            if others is None:
                others = [item for item in lines[device] if item != (current, op.kind)]
            trial = others.copy()
            bisect.insort(trial, (slot, op.kind))
            if not check or _timeline_peak(trial, cap) <= cap:
                slots[op] = slot
                lines[device] = trial
                taken[device].discard(current)
                taken[device].add(slot)
                if op.kind == "I":
                    inputs[device].remove(current)
                    bisect.insort(inputs[device], slot)
                break


def _retime(slots: dict[Op, int], by_device: list[list[Op]], placement: Placement,
            preds: dict[Op, Op | None]) -> None:
    """Replace the slots by the eager start times of the orders they imply, at unit pass times.

    The W passes were interchangeable while squeezing: the k-th W slot of a device becomes the W
    of its k-th I first."""
    for ops in by_device:
        w_slots = sorted(slots.pop(op) for op in ops if op.kind == "W")
        inputs = sorted((op for op in ops if op.kind == "I"), key=slots.__getitem__)[: len(w_slots)]
        ws = [Op("W", op.stage, op.microbatch) for op in inputs]
        slots.update(zip(ws, w_slots))
        ops[:] = [op for op in ops if op.kind != "W"] + ws
    slots.update(_eager(slots, placement, preds))


def _eager(slots: dict[Op, int], placement: Placement, preds: dict[Op, Op | None],
           durations: Mapping[str, float] = UNIT) -> dict[Op, Any]:
    """Eager start times, at per-kind ``durations``, of the device orders that ``slots`` imply
    (what ``table`` gives their ``Schedule``; slot order is a topological order, as every pass
    sits after its input and its device's previous pass). ``preds`` memoizes each pass's data
    predecessor. Integer durations (``UNIT``) give integer times: the slots."""
    start: dict[Op, Any] = {}
    free: list[Any] = [0] * placement.devices
    for op in sorted(slots, key=slots.__getitem__):
        if op not in preds:
            found = data_predecessor(op, _SPLIT, placement.stages)
            preds[op] = found[0] if found else None
        device = placement.device(0, op.stage)
        before = preds[op]
        start[op] = max(free[device], start[before] + durations[before.kind] if before is not None else 0)
        free[device] = start[op] + durations[op.kind]
    return start


def _drop_w(slots: dict[Op, int], by_device: list[list[Op]]) -> None:
    for ops in by_device:
        for op in [op for op in ops if op.kind == "W"]:
            del slots[op]
        ops[:] = [op for op in ops if op.kind != "W"]


Offsets = tuple[tuple[int, int, int, int], ...]


def _block_orders(offsets: Offsets, devices: int, microbatches: int) -> tuple[dict[Op, int], list[list[Op]]]:
    """Steps 1-3 of the module docstring for a block given as each device's offsets of F0, F1, I1,
    I0: every pass's final slot (its start at unit pass times), and each device's passes."""
    placement = Placement.v(devices)
    slots: dict[Op, int] = {}
    preds: dict[Op, Op | None] = {}
    by_device: list[list[Op]] = []
    for i in range(devices):
        chunk0, chunk1 = i, 2 * devices - 1 - i
        ops = []
        for offset, (kind, stage) in zip(offsets[i], (("F", chunk0), ("F", chunk1), ("I", chunk1), ("I", chunk0))):
            for m in range(microbatches):
                op = Op(kind, stage, m)
                slots[op] = offset + PASSES * m
                ops.append(op)
        _fill_w(slots, ops, None)
        by_device.append(ops)
    _squeeze(slots, by_device, placement, warm_up=True)
    _retime(slots, by_device, placement, preds)
    # Squeeze the cool-down again with the W passes out of the way, then put them back.
    _drop_w(slots, by_device)
    _squeeze(slots, by_device, placement, warm_up=False)
    for ops in by_device:
        _fill_w(slots, ops, None)
    _retime(slots, by_device, placement, preds)
    _drop_w(slots, by_device)
    for i, ops in enumerate(by_device):
        _fill_w(slots, ops, 2 * devices - 1 - i)
    slots.update(_eager(slots, placement, preds))
    return slots, by_device


def _block_schedule(name: str, devices: int, microbatches: int) -> Schedule:
    offsets = tuple(BLOCKS[name](devices, i) for i in range(devices))
    slots, by_device = _block_orders(offsets, devices, microbatches)
    orders = [sorted(ops, key=slots.__getitem__) for ops in by_device]
    return Schedule(Placement.v(devices), orders, microbatches, family=name)


def generate_v_half(*, devices: int, microbatches: int) -> Schedule:
    return _block_schedule("v-half", devices, microbatches)


def generate_v_min(*, devices: int, microbatches: int) -> Schedule:
    return _block_schedule("v-min", devices, microbatches)


# -- a memory budget chooses the block ---------------------------------------------------------


def strided_offsets(devices: int, strides: Sequence[int], gaps: tuple[int, int, int]) -> Offsets:
    """A V block from its strides: device i+1 starts the chunk-0 forward ``strides[i]`` slots after
    device i, and the chunk-1 input-gradient as many after; the chunk-1 forward and the chunk-0
    input-gradient step back one slot a device (they travel the V's other arm). ``gaps`` (a, b, c)
    are the idle slots at the three turns: before the chunk-1 forward of device D-1, the chunk-1
    I of device 0 and the chunk-0 I of device D-1. V-Min is strides 1 with gaps (0, g, 0), V-Half
    strides 2 with (0, g, 1) (g of ``_v_min_offsets``/``_v_half_offsets``)."""
    f0 = [0]
    for stride in strides:
        f0.append(f0[-1] + stride)
    last = devices - 1
    f1 = [f0[last] + 1 + gaps[0] + last - i for i in range(devices)]
    i1 = [f1[0] + 1 + gaps[1] + f0[i] for i in range(devices)]
    i0 = [i1[last] + 1 + gaps[2] + last - i for i in range(devices)]
    return tuple(zip(f0, f1, i1, i0))


def _fits_period(offsets: Offsets) -> bool:
    """Whether every device's four passes take distinct slots of the 6-slot period (the two W
    passes then take the other two)."""
    return all(len({offset % PASSES for offset in device}) == 4 for device in offsets)


@bounded(64)
def strided_blocks(devices: int) -> Mapping[str, Offsets]:
    """The candidate blocks: the strides of the authors' search (``v_auto_schedule.py``: a stride
    d0 in 1..5 for the first j hops of the V, then d1 <= d0), each with the smallest gaps (fewest
    idle slots, then the earliest turns) that fit the period. Keyed ``"strides d0xj+d1xk"``
    (``"strides none"`` on one device)."""
    hops = devices - 1
    period = range(PASSES)
    gaps = sorted(itertools.product(period, period, period), key=lambda g: (sum(g), g))
    blocks: dict[str, Offsets] = {}
    for d0 in range(1, PASSES):
        for d1 in range(1, d0 + 1):
            for j in range(hops + 1) if d1 < d0 else (hops,):
                strides = (d0,) * j + (d1,) * (hops - j)
                for gap in gaps:
                    offsets = strided_offsets(devices, strides, gap)
                    if _fits_period(offsets):
                        name = "+".join(f"{d}x{n}" for d, n in ((d0, j), (d1, hops - j)) if n)
                        if offsets not in blocks.values():
                            blocks[f"strides {name or 'none'}"] = offsets
                        break
    return MappingProxyType(blocks)


def _offsets(name: str, devices: int) -> Offsets:
    if name in BLOCKS:
        return tuple(BLOCKS[name](devices, i) for i in range(devices))
    return strided_blocks(devices)[name]


def _build(name: str, devices: int, microbatches: int) -> Schedule:
    if name == "zb-v":
        return generate_zb_v(devices=devices, microbatches=microbatches)
    slots, by_device = _block_orders(_offsets(name, devices), devices, microbatches)
    orders = [sorted(ops, key=slots.__getitem__) for ops in by_device]
    return Schedule(Placement.v(devices), orders, microbatches, family=name if name in BLOCKS else "custom")


def search_size(devices: int, microbatches: int, times: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> int:
    """The microbatch count the candidates are ranked at. At equal times: N, or 2D when N is
    larger. A block's bubble beyond its 6N passes and its peak are the block's from about N = 2D
    on: of the 98 candidates of D = 3, 4, 6, 8, all but 3 measure the same at N = 2D, 3D+1 and
    4D+3 (two of those hold one more activation than 2D at larger N, one idles a slot less);
    ``_select`` re-checks the peak at N. At other times a block's steady state may idle, so that
    its bubble grows with N: they rank at N."""
    return min(microbatches, 2 * devices) if times == (1.0, 1.0, 1.0) else microbatches


#: Per-chunk (F, I, W) times of the paper's comparison, at which ``ranked`` defaults to rank.
EQUAL = (1.0, 1.0, 1.0)


@bounded(64)
def ranked(devices: int, microbatches: int, times: tuple[float, float, float] = EQUAL
           ) -> tuple[tuple[float, int, str], ...]:
    """Every candidate as (bubble, peak chunk activations, name), best first: zb-v, v-half, v-min
    and the ``strided_blocks``. The bubble is the makespan of their orders at per-chunk pass
    times ``times`` = (F, I, W) beyond the 2N(F+I+W) each device computes; ties keep that order."""
    durations = {"F": times[0], "I": times[1], "W": times[2], "B": times[1] + times[2]}
    work = 2 * microbatches * sum(times)
    blocks = ["v-half", "v-min"]
    seen = {_offsets(name, devices) for name in blocks}
    blocks += [name for name, offsets in strided_blocks(devices).items() if offsets not in seen]
    zb_v = _build("zb-v", devices, microbatches)
    scored = [(table(zb_v, durations).makespan - work, max(peak_activations(zb_v)), "zb-v")]
    for name in blocks:
        slots, by_device = _block_orders(_offsets(name, devices), devices, microbatches)
        peak = max(_peak(ops, slots) for ops in by_device)
        start = slots if times == EQUAL else _eager(slots, Placement.v(devices), {}, durations)
        makespan = max(start[op] + durations[op.kind] for op in start)
        scored.append((makespan - work, peak, name))
    rank = {name: k for k, (_, _, name) in enumerate(scored)}
    return tuple(sorted(scored, key=lambda t: (t[0], t[1], rank[t[2]])))


def cap(devices: int, memory: float) -> int:
    """A budget of ``memory`` x 1F1B's activations in chunk-microbatches: 1F1B holds ``D``
    full-stage microbatches, and a full-stage microbatch is two chunk-microbatches."""
    return math.floor(min(2 * memory * devices, 2.0**62) + 1e-9)  # past every block's need: no overflow


def least_peak(devices: int, microbatches: int) -> int:
    """The fewest chunk-microbatches any candidate holds: V-Min's (stride 1, the shortest
    lifespan) ``2·((D+4)//3)``, or every microbatch's two chunks when N is smaller. A closed form,
    so that checking a request (``accepts``, the CLI's size guards) never builds a block; equal to
    the least peak of ``ranked`` on every D <= 12, N <= 3D+1 (checked once; ``tests/test_v_schedule.py``
    keeps D <= 6)."""
    return min(2 * ((devices + 4) // 3), 2 * microbatches)


def _accepts_budget(*, devices: int, microbatches: int, memory: float, **times: float) -> str | None:
    need = least_peak(devices, microbatches)
    if need > cap(devices, memory):
        return (f"memory={memory} of 1F1B's {devices} microbatches holds {memory * devices:g}; the smallest "
                f"block (v-min) needs {need / 2:g}, memory >= {need / (2 * devices):.4g}")
    return None


@bounded(64)
def _select(devices: int, microbatches: int, memory: float, times: tuple[float, float, float]
            ) -> tuple[str, Schedule]:
    budget = cap(devices, memory)
    for _, peak, name in ranked(devices, search_size(devices, microbatches, times), times):
        if peak <= budget:
            built = _build(name, devices, microbatches)
            if max(peak_activations(built)) <= budget:
                return name, built
    raise ScheduleError(f"v-schedule: no block holds at most {budget / 2:g} microbatches at "
                        f"{microbatches} microbatches (memory={memory})")


def choose(devices: int, microbatches: int, memory: float, times: tuple[float, float, float] = EQUAL) -> str:
    """The block ``v-schedule`` builds for ``memory`` at per-chunk pass times ``times``: the
    lowest-bubble candidate (``ranked`` at ``search_size``) whose orders at N hold at most
    ``cap(devices, memory)`` chunk-microbatches of activations on every device ("zb-v", "v-half",
    "v-min" or a ``strided_blocks`` key)."""
    return _select(devices, microbatches, memory, tuple(map(float, times)))[0]


def generate_budget(*, devices: int, microbatches: int, memory: float = 1.0, forward: float = 1.0,
                    input_grad: float = 1.0, weight: float = 1.0) -> Schedule:
    """``choose``'s block as family ``v-schedule``, its options recorded."""
    times = (float(forward), float(input_grad), float(weight))
    _, built = _select(devices, microbatches, memory, times)
    options = {"memory": memory, "forward": forward, "input_grad": input_grad, "weight": weight}
    return built.replace(family="v-schedule", options=options)


def candidates_bound(devices: int) -> int:
    """At most how many blocks ``ranked`` measures: zb-v, v-half, v-min and the strided blocks, of
    which there are 4D + 1 for 4 <= D <= 12 (5, 15 at D = 2, 3; ``tests/test_v_schedule.py``)."""
    return 4 * devices + 6


def _ranking_ops(*, devices: int, microbatches: int, memory: float = 1.0, forward: float = 1.0,
                 input_grad: float = 1.0, weight: float = 1.0) -> int:
    """The ranking's work, in op units, from the sizes alone (the block at N adds its 6DN ops):
    each candidate's construction at ``search_size`` microbatches costs about its
    6D·n ops times D (the squeeze walks the devices for each op), and finding the strided blocks
    about 150 D^2. Measured on 2 CPU cores while writing: 10-17 µs per unit (D = 8: 2.0 s at
    N = 16, 5.2 s at N = 32 ranked at F = 2; D = 16: 35 s at N = 32, 109 s at N = 64, F = 2), so
    the default limit of a million ops stops a ranking past about 10-20 s."""
    times = (float(forward), float(input_grad), float(weight))
    ranked_at = search_size(devices, microbatches, times)
    return candidates_bound(devices) * 6 * devices * ranked_at * devices + 150 * devices * devices


def _positive(value: float) -> str | None:
    return None if value > 0 else "must be > 0"


_V = dict(ops_per_cell=3, placement=lambda *, devices, **_: Placement.v(devices))
_SOURCE = "Qi et al., Pipeline Parallelism with Controllable Memory, NeurIPS 2024, §4; sail-sg zbv_greedy"
_BUDGET_SOURCE = _SOURCE + ", v_auto_schedule (the strides searched)"

V_HALF = register(Family(
    name="v-half",
    generate=generate_v_half,
    summary="V placement, zero-bubble split, half of 1F1B's activations ((D+2)//2); bubble about 1F1B's / 2",
    source=_SOURCE,
    **_V,
))

V_MIN = register(Family(
    name="v-min",
    generate=generate_v_min,
    summary="V placement, zero-bubble split, a third of 1F1B's activations ((D+4)//3); bubble about 2/3 of 1F1B's",
    source=_SOURCE,
    **_V,
))

V_SCHEDULE = register(Family(
    name="v-schedule",
    generate=generate_budget,
    summary="a memory budget (fraction of 1F1B's activations) picks the lowest-bubble V block that fits it",
    source=_BUDGET_SOURCE,
    options=(
        Option("memory", float, 1.0, _positive, "activation budget as a fraction of 1F1B's"),
        *(Option(name, float, 1.0, _positive, f"{kind} time of a chunk the blocks are ranked at")
          for name, kind in (("forward", "F"), ("input_grad", "I"), ("weight", "W"))),
    ),
    accepts=_accepts_budget,
    setup_ops=_ranking_ops,
    **_V,
))
