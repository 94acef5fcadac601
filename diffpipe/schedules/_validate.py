"""Validation of a schedule: every op exactly once, on the right device, complete, deadlock-free.

Validation never mutates or repairs; it raises ``ScheduleError`` with one line naming the first
problem, or returns the derived structure (topological op order, dependencies, lanes).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._errors import ScheduleError
from . import _rules
from ._ir import COMPUTE_KINDS, Op

if TYPE_CHECKING:
    from ._schedule import Schedule


@dataclass(frozen=True)
class Derived:
    """What validation computes once and a ``Schedule`` keeps."""

    ops: tuple[Op, ...]  # topological order
    deps: dict[Op, tuple[_rules.Dep, ...]]
    lanes: dict[Op, tuple[int, ...]]  # devices whose order holds the op


def _positive_int(value: object, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ScheduleError(f"schedule: {name} must be a positive int, got {value!r}")


def validate(schedule: Schedule) -> Derived:
    """Check ``schedule`` and return its derived structure; raise ``ScheduleError`` otherwise."""
    placement = schedule.placement
    _positive_int(schedule.microbatches, "microbatches")
    _positive_int(schedule.steps, "steps")
    if schedule.microbatches % schedule.steps:
        raise ScheduleError(
            f"schedule: {schedule.microbatches} microbatches do not split into {schedule.steps} steps"
        )
    if len(schedule.orders) != placement.devices:
        raise ScheduleError(
            f"schedule has {len(schedule.orders)} device orders but the placement has "
            f"{placement.devices} devices"
        )
    lanes = _check_ops(schedule)
    backward_kind = _check_complete(schedule, lanes)
    _check_collectives(schedule, lanes)
    deps = _rules.dependencies(schedule.orders, placement, backward_kind)
    ops = _topological_order(schedule, deps, lanes)
    return Derived(ops, deps, {op: tuple(devs) for op, devs in lanes.items()})


def _check_ops(schedule: Schedule) -> dict[Op, list[int]]:
    """Ranges, devices and duplicates; returns op -> devices holding it."""
    placement = schedule.placement
    lanes: dict[Op, list[int]] = {}
    for device, order in enumerate(schedule.orders):
        for position, op in enumerate(order):
            if not isinstance(op, Op):
                raise ScheduleError(f"device {device}, position {position}: {op!r} is not an Op")
            where = f"op {op} on device {device} (position {position})"
            if op.pipeline >= placement.pipelines:
                raise ScheduleError(f"{where}: pipeline {op.pipeline} outside 0..{placement.pipelines - 1}")
            if op.stage >= placement.stages:
                raise ScheduleError(f"{where}: stage {op.stage} outside 0..{placement.stages - 1}")
            if op.kind in COMPUTE_KINDS and op.microbatch >= schedule.microbatches:
                raise ScheduleError(
                    f"{where}: microbatch {op.microbatch} outside 0..{schedule.microbatches - 1}"
                )
            if op.kind in ("U", "R") and op.step >= schedule.steps:
                raise ScheduleError(f"{where}: step {op.step} outside 0..{schedule.steps - 1}")
            if op.kind == "R":
                if all(s != op.stage for _, s in placement.held(device)):
                    raise ScheduleError(f"{where}: device {device} holds no replica of stage {op.stage}")
            else:
                home = placement.device(op.pipeline, op.stage)
                if home != device:
                    raise ScheduleError(
                        f"{where}: the placement puts stage {op.stage} of pipeline {op.pipeline} "
                        f"on device {home}"
                    )
            seen = lanes.setdefault(op, [])
            if seen and (op.kind != "R" or device in seen):
                raise ScheduleError(f"op {op} is duplicated (device {device}, and device {seen[0]})")
            seen.append(device)
    return lanes


def _check_complete(schedule: Schedule, lanes: dict[Op, list[int]]) -> dict[tuple[int, int, int], str]:
    """Every microbatch runs F and a backward (B, or I and W) at every stage of one pipeline."""
    stages = schedule.stages
    pipeline_of: dict[int, int] = {}
    for op in lanes:
        if op.kind in COMPUTE_KINDS:
            if pipeline_of.setdefault(op.microbatch, op.pipeline) != op.pipeline:
                raise ScheduleError(
                    f"op {op}: microbatch {op.microbatch} also runs on pipeline "
                    f"{pipeline_of[op.microbatch]}; a microbatch belongs to one pipeline"
                )
    backward_kind: dict[tuple[int, int, int], str] = {}
    for m in range(schedule.microbatches):
        if m not in pipeline_of:
            raise ScheduleError(f"microbatch {m} has no ops: missing op 0F{m}")
        p = pipeline_of[m]
        for s in range(stages):
            def has(kind: str, s: int = s, m: int = m, p: int = p) -> bool:
                return Op(kind, s, m, p) in lanes

            home = f"(expected on device {schedule.placement.device(p, s)})"
            if not has("F"):
                raise ScheduleError(f"missing op {Op('F', s, m, p)} {home}")
            if has("B") and (has("I") or has("W")):
                raise ScheduleError(f"op {Op('B', s, m, p)} duplicates the split backward I/W of that stage")
            if has("I") != has("W"):
                present, absent = ("I", "W") if has("I") else ("W", "I")
                raise ScheduleError(f"op {Op(present, s, m, p)} has no matching {Op(absent, s, m, p)}")
            if not (has("B") or has("I")):
                raise ScheduleError(f"missing op {Op('B', s, m, p)} (or its split I/W) {home}")
            backward_kind[(p, s, m)] = "B" if has("B") else "I"
    return backward_kind


def _check_collectives(schedule: Schedule, lanes: dict[Op, list[int]]) -> None:
    """An ``R`` runs on every device holding a replica of its stage, after all their gradients."""
    placement = schedule.placement
    for op, devices in lanes.items():
        if op.kind != "R":
            continue
        holders = sorted({d for p in range(placement.pipelines) for d in [placement.device(p, op.stage)]})
        if sorted(devices) != holders:
            raise ScheduleError(
                f"collective {op} runs on devices {sorted(devices)} but stage {op.stage} is held by "
                f"devices {holders}"
            )
        for device in devices:
            order = schedule.orders[device]
            position = order.index(op)
            for later in order[position + 1 :]:
                if (
                    later.kind in ("B", "W")
                    and later.stage == op.stage
                    and schedule.step_of(later) == op.step
                ):
                    raise ScheduleError(
                        f"collective {op} on device {device} runs before {later}, whose gradient it reduces"
                    )


def _topological_order(
    schedule: Schedule, deps: dict[Op, tuple[_rules.Dep, ...]], lanes: dict[Op, list[int]]
) -> tuple[Op, ...]:
    """Kahn's algorithm; on a cycle, raise a deadlock error naming the wait-for chain."""
    waiting = {op: len(incoming) for op, incoming in deps.items()}
    successors: dict[Op, list[Op]] = {op: [] for op in deps}
    for op, incoming in deps.items():
        for dep in incoming:
            successors[dep.op].append(op)
    ready = deque(op for op, count in waiting.items() if count == 0)
    order: list[Op] = []
    while ready:
        op = ready.popleft()
        order.append(op)
        for succ in successors[op]:
            waiting[succ] -= 1
            if waiting[succ] == 0:
                ready.append(succ)
    if len(order) != len(deps):
        raise ScheduleError(_deadlock_message(schedule, deps, set(order)))
    return tuple(order)


def _deadlock_message(schedule: Schedule, deps: dict[Op, tuple[_rules.Dep, ...]], done: set[Op]) -> str:
    """Follow 'device d waits at its first unfinished op for X' until a device repeats."""
    heads = {}
    for device, order in enumerate(schedule.orders):
        for op in order:
            if op not in done:
                heads[device] = op
                break
    device = next(iter(heads))
    visited: list[int] = []
    links: list[str] = []
    while device not in visited:
        visited.append(device)
        head = heads[device]
        blocker = next(dep for dep in deps[head] if dep.op not in done)
        next_device = blocker.src
        where = "later in its own order" if next_device == device else f"device {next_device}"
        if blocker.edge == _rules.LANE and blocker.src != device:
            links.append(f"device {device} waits at {head} for device {next_device} to reach it")
        else:
            links.append(f"device {device} waits at {head} for {blocker.op} ({where})")
        device = next_device
    cycle = links[visited.index(device) :]
    return "deadlock: " + ", ".join(cycle)
