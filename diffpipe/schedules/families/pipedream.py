"""PipeDream (asynchronous 1F1B with weight stashing) and PipeDream-2BW (double-buffered weights).

Sources: Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training",
SOSP 2019, §3.2-3.3 (1F1B, weight stashing); Narayanan et al., "Memory-Efficient Pipeline-Parallel
DNN Training", ICML 2021, §3.1 (PipeDream-2BW: double-buffered weight updates, gradient coalescing,
``W(t+1) = W(t) - ν·∇f(W(t-1))``).

Both are periodic without a flush; a ``Schedule`` holds a finite, unrolled window of them
(``asynchronous=True``) so that a simulator sees warm-up, steady state and drain. The window is a
1F1B pipeline over all its microbatches (device d: ``D-1-d`` warm-up forwards, then F and B
alternate, then the backwards drain) with optimizer steps ``U`` inserted on each device:

``pipedream``: every microbatch is one optimizer step: ``U`` right after each backward, so
``microbatches`` is the window's length and ``steps = microbatches`` (U of step m follows B of
microbatch m; its ``microbatch`` field holds m). In steady state the forward of microbatch m on
device d sees ``D-1-d`` updates before its backward (``staleness`` = min(m, D-1-d)); weight
stashing (``stashing=True``) makes the backward use the forward's version, so device d holds
``D-d`` weight versions (``weight_versions``).
No bubble in steady state with uniform stages: one microbatch per ``t_F + t_B + t_U``.

``pipedream-2bw``: ``microbatches`` is N, the microbatches coalesced into one step (N >= D), and
option ``steps`` (K, default 3) the number of steps unrolled: the window holds K·N microbatches,
``Schedule.steps = K``, and device d runs ``U`` of step t once, right after its backward of the
last microbatch of step t. Two weight versions (``stashing=True``; ``weight_versions`` at most 2)
suffice because N >= D: a forward on device d is at most ``D-1-d < N`` backwards ahead of its own
backward, so at most one ``U`` falls in between (``staleness`` is 1 for the first ``D-1-d``
microbatches of every step after the first, else 0). 2BW runs every microbatch of step t on one
version, ``W(max(t-1, 0))``, for both its forward and its backward: the update that ends step t-1
becomes visible to new forwards only from step t+1 on. So every gradient is exactly one step stale
(the constant delay of the update rule above), unlike PipeDream's per-stage delay of ``D-1-d``.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._registry import Family, Formula, Option, at_least, register
from .._schedule import Op, Placement, Schedule


def _one_f_one_b(device: int, devices: int, microbatches: int) -> list[Op]:
    """Device ``device``'s flush-free 1F1B order over ``microbatches`` microbatches (no U yet)."""
    warmup = min(devices - device - 1, microbatches)
    order = [Op("F", device, m) for m in range(warmup)]
    for m in range(microbatches - warmup):
        order += [Op("F", device, warmup + m), Op("B", device, m)]
    order += [Op("B", device, m) for m in range(microbatches - warmup, microbatches)]
    return order


def generate(*, devices: int, microbatches: int) -> Schedule:
    orders = []
    for d in range(devices):
        order = []
        for op in _one_f_one_b(d, devices, microbatches):
            order.append(op)
            if op.kind == "B":
                order.append(Op("U", d, op.microbatch))
        orders.append(order)
    return Schedule(
        Placement.linear(devices),
        orders,
        microbatches,
        steps=microbatches,
        family="pipedream",
        asynchronous=True,
        stashing=True,
    )


def _window(devices: int, microbatches: int, updates: int, durations: Mapping[str, float]) -> Formula:
    """A flush-free 1F1B window of N microbatches at uniform stage times with ``updates`` U per
    device: makespan ``(N+D-1)(t_F+t_B) + updates·t_U`` (1F1B's fill and drain, Narayanan et al.
    2019 §3.2, plus each device's serial optimizer steps; checked against ``table`` in the tests),
    bubble = idle fraction (warm-up and drain only: 0 in steady state), peak activations
    ``min(D-d, N)`` as 1F1B."""
    d, n = devices, microbatches
    t_f, t_b, t_u = durations["F"], durations["B"], durations["U"]
    makespan = (n + d - 1) * (t_f + t_b) + updates * t_u
    busy = n * (t_f + t_b) + updates * t_u
    return Formula(
        makespan=makespan,
        bubble_ratio=1.0 - busy / makespan if makespan > 0 else 0.0,
        assumption="uniform stage times, no communication; the unrolled window",
        peak_activations=tuple(min(d - i, n) for i in range(d)),
    )


def formula(*, devices: int, microbatches: int, durations: Mapping[str, float]) -> Formula:
    """The window of N microbatches and N updates: ``(N+D-1)(t_F+t_B) + N·t_U``; at ``t_U = 0`` the
    bubble is ``(D-1)/(N+D-1)``."""
    return _window(devices, microbatches, microbatches, durations)


def _accepts_2bw(*, devices: int, microbatches: int, steps: int) -> str | None:
    if microbatches < devices:
        return (f"microbatches per step ({microbatches}) must be >= devices ({devices}) "
                f"for two weight versions to suffice")
    return None


def generate_2bw(*, devices: int, microbatches: int, steps: int = 3) -> Schedule:
    total = steps * microbatches
    orders = []
    for d in range(devices):
        order = []
        for op in _one_f_one_b(d, devices, total):
            order.append(op)
            if op.kind == "B" and op.microbatch % microbatches == microbatches - 1:
                order.append(Op("U", d, op.microbatch // microbatches))
        orders.append(order)
    return Schedule(
        Placement.linear(devices),
        orders,
        total,
        steps=steps,
        family="pipedream-2bw",
        options={"steps": steps},
        asynchronous=True,
        stashing=True,
    )


def formula_2bw(
    *, devices: int, microbatches: int, durations: Mapping[str, float], steps: int = 3
) -> Formula:
    """The window of K·N microbatches and K updates: ``(KN+D-1)(t_F+t_B) + K·t_U`` (no flush
    between steps); at ``t_U = 0`` the bubble is ``(D-1)/(KN+D-1)``."""
    return _window(devices, steps * microbatches, steps, durations)


def _linear(*, devices: int, **_: object) -> Placement:
    return Placement.linear(devices)


#: The unrolled window of the asynchronous families (pipedream-2bw, amdp).
STEPS = Option("steps", int, 3, at_least(1), "optimizer steps unrolled in the window, K; K·N microbatches in all")

PIPEDREAM = register(Family(
    name="pipedream",
    generate=generate,
    summary="asynchronous 1F1B with weight stashing; U after every backward (window of N steps)",
    source="Narayanan et al., PipeDream, SOSP 2019, §3.2-3.3",
    formula=formula,
    placement=_linear,
    ops_per_cell=3,
    asynchronous=True,
))

PIPEDREAM_2BW = register(Family(
    name="pipedream-2bw",
    generate=generate_2bw,
    summary="asynchronous 1F1B, two weight versions, gradients coalesced over N >= D per step",
    source="Narayanan et al., Memory-Efficient Pipeline-Parallel DNN Training, ICML 2021, §3.1",
    formula=formula_2bw,
    options=(STEPS,),
    accepts=_accepts_2bw,
    placement=_linear,
    ops=lambda *, devices, microbatches, steps: devices * steps * (2 * microbatches + 1),
    asynchronous=True,
))
