"""Chimera: two model replicas in bidirectional pipelines, and an asymmetric (rotated) variant.

Source: Li and Hoefler, "Chimera: Efficiently Training Large-Scale Neural Networks with
Bidirectional Pipelines", SC'21, §3.1-3.3 (Fig. 3, Table 2), and the authors' public code for the
per-device orders and the concatenation of units when N > D.

``chimera``: ``Placement.mirrored(D)``, D even: device d holds stage d of the down pipeline
(pipeline 0) and stage D-1-d of the up pipeline (pipeline 1). Work comes in *units* of D
microbatches: unit u sends microbatches ``uD .. uD+D/2-1`` down and ``uD+D/2 .. uD+D-1`` up, so
each pipeline takes N/2 of them. With ``h = D/2``, on device ``d < h`` main = down, other = up,
``a = h-d``; on ``d >= h`` main = up, other = down, ``a = d-h+1``; ``b = h-a``. One unit runs
``F_main x a, (F_other, F_main) x b, (F_other, B_other) x a, (B_main, B_other) x b, B_main x a``,
first-in-first-out within a direction. For N > D units are concatenated directly, as in the
authors' code: from the second unit on the opening ``F_main x a`` becomes ``(B_main, F_main) x a``
(draining the previous unit's backwards) and the closing ``B_main x a`` runs once, at the end.

Option ``sync`` (default False) appends one ``R`` all-reduce per stage to the orders of both
devices holding a replica of it, after all their backwards, in stage order on every device (the
same relative order on both participants, so the collectives cannot deadlock). Chimera can start
some of these early; here they sit at the end because an ``R`` occupies the compute stream.

``chimera-asymmetric``: the same two replicas and weight memory on a *rotated* rather than
mirrored placement: both pipelines run in the same direction around a ring, the second offset by
half the devices, ``stage s of pipeline 1 on device (s + D/2) mod D`` (using the wrap-around link
D-1 -> 0, as AMDP's rings do). Microbatches alternate between the replicas (``m mod 2``), so each
takes N/2 (N even). Why this placement: it is the simplest two-replica placement that keeps
Chimera's two stages per device and its two pipeline heads on different devices (so each fills
the other's warm-up bubble), while dropping the mirror symmetry that pairs one pipeline's
activation-heavy first stages with the other's light last stages on the same device. That is the
point the "Tabular Schedule Abstraction" study makes about an asymmetric Chimera, and this variant
exhibits both halves of it (``tests/test_families_async.py`` checks them): the global peak of
in-flight activations is not lowered (D, as 1F1B's device 0; at least half the devices reach it, where
mirrored Chimera keeps every device between D/2+1 and D), and the makespan gain over 1F1B is
limited once N > D, most visibly in shallow pipelines. No published per-device order exists, so
the orders are a backward-first greedy list schedule (``list_schedule``) at the table's durations
(F=1, B=2) with an in-flight cap of D activations per device (1F1B's peak: without a cap the greedy
would hold up to about 1.5 D for N = 2D and the memory comparison would be meaningless).
"""

from __future__ import annotations

from collections.abc import Mapping

from .._list_scheduler import greedy_run
from .._registry import Family, Formula, Option, register
from .._schedule import Op, Placement, Schedule

DOWN, UP = 0, 1


def _accepts(unit_is_devices: bool):
    """Both variants: D even (two replicas, offset D/2); N in whole units (of D, or of 2)."""

    def accepts(*, devices: int, microbatches: int, sync: bool) -> str | None:
        if devices % 2:
            return f"devices must be even (two replicas, offset D/2), got {devices}"
        unit = devices if unit_is_devices else 2
        if microbatches % unit:
            why = "units of D microbatches are concatenated" if unit_is_devices else "two replicas"
            return f"microbatches must be a multiple of {unit} ({why}), got {microbatches}"
        return None

    return accepts


def _pipeline_of(m: int, devices: int) -> int:
    """Unit-wise split: the first half of each unit of D microbatches goes down, the second up."""
    return DOWN if m % devices < devices // 2 else UP


def _device_pattern(d: int, devices: int, units: int) -> list[tuple[str, bool]]:
    """Device d's sequence of ``(kind, is_main)`` symbols over ``units`` concatenated units."""
    h = devices // 2
    a = h - d if d < h else d - h + 1
    b = h - a
    main_f, main_b = ("F", True), ("B", True)
    other_f, other_b = ("F", False), ("B", False)
    pattern: list[tuple[str, bool]] = []
    for unit in range(units):
        pattern += [main_f] * a if unit == 0 else [main_b, main_f] * a
        pattern += [other_f, main_f] * b
        pattern += [other_f, other_b] * a
        pattern += [main_b, other_b] * b
    pattern += [main_b] * a
    return pattern


def _stage_sync(orders: list[list[Op]], placement: Placement) -> None:
    """Append one step-0 all-reduce per stage held on each device, in stage order."""
    for device, order in enumerate(orders):
        for stage in sorted({s for _, s in placement.held(device)}):
            order.append(Op("R", stage, 0))


def generate(*, devices: int, microbatches: int, sync: bool = False) -> Schedule:
    h = devices // 2
    placement = Placement.mirrored(devices)
    units = microbatches // devices
    by_pipeline = {p: [m for m in range(microbatches) if _pipeline_of(m, devices) == p] for p in (DOWN, UP)}
    orders = []
    for d in range(devices):
        main, other = (DOWN, UP) if d < h else (UP, DOWN)
        stage = {DOWN: d, UP: devices - 1 - d}
        fifo = {(kind, p): iter(by_pipeline[p]) for kind in "FB" for p in (DOWN, UP)}
        order = []
        for kind, is_main in _device_pattern(d, devices, units):
            p = main if is_main else other
            order.append(Op(kind, stage[p], next(fifo[(kind, p)]), p))
        orders.append(order)
    if sync:
        _stage_sync(orders, placement)
    return Schedule(placement, orders, microbatches, family="chimera", options={"sync": sync})


def formula(
    *, devices: int, microbatches: int, durations: Mapping[str, float], sync: bool = False
) -> Formula | None:
    """Makespan ``(2N+D-2)·t_F`` and bubble ``(D-2)/(2N+D-2)`` at ``t_F = t_B`` (Chimera Table 2);
    None otherwise (the paper's closed form assumes equal forward and backward times).

    N counts all microbatches (both replicas). Peak activations: the paper bounds them between
    D/2+1 and D; read off the orders they are ``D/2 + 1 + min(d, D-1-d)`` on device d (``a`` main
    forwards, then ``2b`` more, then one of the other direction before the first backward).
    """
    t_f, t_b = durations["F"], durations["B"]
    if t_f != t_b or (sync and durations["R"] != 0):
        return None
    d, n = devices, microbatches
    return Formula(
        makespan=(2 * n + d - 2) * t_f,
        bubble_ratio=(d - 2) / (2 * n + d - 2),
        assumption="t_F = t_B, uniform stage times, no communication",
        peak_activations=tuple(d // 2 + 1 + min(i, d - 1 - i) for i in range(d)),
    )


def rotated(devices: int) -> Placement:
    """Two pipelines in the same direction on a ring: stage s of pipeline 1 on ``(s + D/2) mod D``."""
    h = devices // 2
    return Placement(
        devices,
        (tuple(range(devices)), tuple((s + h) % devices for s in range(devices))),
        "rotated",
    )


def generate_asymmetric(*, devices: int, microbatches: int, sync: bool = False) -> Schedule:
    placement = rotated(devices)
    orders, _ = greedy_run(
        placement,
        microbatches,
        assignment=[m % 2 for m in range(microbatches)],
        priority="backward-first",
        memory_limit=devices,
    )
    lists = [list(order) for order in orders]
    if sync:
        _stage_sync(lists, placement)
    return Schedule(placement, lists, microbatches, family="chimera-asymmetric", options={"sync": sync})


SYNC = Option("sync", bool, False, help="append one all-reduce R per stage after its backwards")

CHIMERA = register(Family(
    name="chimera",
    generate=generate,
    summary="two replicas in bidirectional (mirrored) pipelines; units of D microbatches concatenated",
    source="Li and Hoefler, Chimera, SC'21, §3 and the authors' code",
    formula=formula,
    options=(SYNC,),
    accepts=_accepts(True),
    placement=lambda *, devices, sync: Placement.mirrored(devices),
))

CHIMERA_ASYMMETRIC = register(Family(
    name="chimera-asymmetric",
    generate=generate_asymmetric,
    summary="two replicas on a rotated ring placement (offset D/2); greedy backward-first, cap D",
    source="Chimera-style variant studied in the Tabular Schedule Abstraction paper; see module docstring",
    options=(SYNC,),
    accepts=_accepts(False),
    placement=lambda *, devices, sync: rotated(devices),
))
