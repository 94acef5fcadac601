"""1F1B (PipeDream-Flush / DAPPLE): a warm-up of forwards, then one forward one backward.

Source: Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training" (PipeDream-Flush),
ICML 2021, §3.1; Fan et al., "DAPPLE", PPoPP 2021. Device d runs ``min(D-d-1, N)`` warm-up
forwards, then alternates F and B, then drains its backwards; peak activations ``min(D-d, N)``.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._registry import Family, Formula, register
from .._schedule import Op, Placement, Schedule


def generate(*, devices: int, microbatches: int) -> Schedule:
    orders = []
    for d in range(devices):
        warmup = min(devices - d - 1, microbatches)
        order = [Op("F", d, m) for m in range(warmup)]
        for m in range(microbatches - warmup):
            order += [Op("F", d, warmup + m), Op("B", d, m)]
        order += [Op("B", d, m) for m in range(microbatches - warmup, microbatches)]
        orders.append(order)
    return Schedule(Placement.linear(devices), orders, microbatches, family="1f1b")


def formula(*, devices: int, microbatches: int, durations: Mapping[str, float]) -> Formula:
    """Makespan ``(N+D-1)(t_F+t_B)``, bubble ``(D-1)/(N+D-1)``, peak activations ``min(D-d, N)``."""
    d, n = devices, microbatches
    return Formula(
        makespan=(n + d - 1) * (durations["F"] + durations["B"]),
        bubble_ratio=(d - 1) / (n + d - 1),
        assumption="uniform stage times, no communication",
        peak_activations=tuple(min(d - i, n) for i in range(d)),
    )


ONE_F_ONE_B = register(Family(
    name="1f1b",
    generate=generate,
    summary="PipeDream-Flush / DAPPLE: warm-up forwards, then alternate F and B",
    source="Narayanan et al., PipeDream-Flush, ICML 2021, §3.1; Fan et al., DAPPLE, PPoPP 2021",
    formula=formula,
    placement=lambda *, devices: Placement.linear(devices),
))
