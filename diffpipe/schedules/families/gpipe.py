"""GPipe: all forwards, then all backwards (flush at the end of the step).

Source: Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline
Parallelism", NeurIPS 2019, §2.2 and Fig. 2(c). Backwards run in microbatch order 0..N-1, as in
``torch.distributed.pipelining.ScheduleGPipe``.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._registry import Family, Formula, register
from .._schedule import Op, Placement, Schedule


def generate(*, devices: int, microbatches: int) -> Schedule:
    orders = [
        [Op("F", d, m) for m in range(microbatches)] + [Op("B", d, m) for m in range(microbatches)]
        for d in range(devices)
    ]
    return Schedule(Placement.linear(devices), orders, microbatches, family="gpipe")


def formula(*, devices: int, microbatches: int, durations: Mapping[str, float]) -> Formula:
    """Makespan ``(N+D-1)(t_F+t_B)``, bubble ``(D-1)/(N+D-1)``; every device holds all N activations."""
    d, n = devices, microbatches
    return Formula(
        makespan=(n + d - 1) * (durations["F"] + durations["B"]),
        bubble_ratio=(d - 1) / (n + d - 1),
        assumption="uniform stage times, no communication",
        peak_activations=(n,) * d,
    )


GPIPE = register(Family(
    name="gpipe",
    generate=generate,
    summary="all forwards, then all backwards; flush per step",
    source="Huang et al., GPipe, NeurIPS 2019, §2.2",
    formula=formula,
    placement=lambda *, devices: Placement.linear(devices),
))
