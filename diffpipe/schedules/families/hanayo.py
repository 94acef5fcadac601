"""Hanayo: wave-like pipelines without model replicas.

Source: Liu et al., "Hanayo: Harnessing Wave-like Pipeline Parallelism for Enhanced Large Model
Training Efficiency", SC'23, §3 (the wave placement and its scheduling).

The model is cut into ``S = 2·W·D`` stages placed by ``Placement.wave(D, W)``: stage j runs on
device r if r < D, else on 2D-1-r, with r = j mod 2D, so each microbatch goes down devices
0..D-1 and back up D-1..0, W times, and each device holds 2W chunks (the turn at either end stays
on one device: no transfer). There are no weight replicas. Each device's order is a
backward-first greedy list schedule (``list_schedule``) over this placement at the table's
durations (F=1, B=2 per stage), oldest microbatch first.

Operating point: Hanayo is designed for, and evaluated at, N = D microbatches per step. Other N
are accepted, not rejected, because sweeps over N need every family defined there and the greedy
still yields a valid, deterministic schedule; but for N ≠ D the orders are this library's
extrapolation, not the paper's, and the greedy has no activation cap, so peak in-flight
activations grow with N (for W=1: at most 2D at N = D, just under 3D at N = 2D). Compare against the
paper only at N = D. Stage times are per chunk: give each stage 1/(2W) of a device's share of the
model when comparing with a D-stage schedule.
"""

from __future__ import annotations

from .._list_scheduler import greedy_run
from .._registry import Family, Option, at_least, register
from .._schedule import Placement, Schedule


def generate(*, devices: int, microbatches: int, waves: int = 1) -> Schedule:
    placement = Placement.wave(devices, waves)
    orders, _ = greedy_run(placement, microbatches, priority="backward-first")
    return Schedule(placement, orders, microbatches, family="hanayo", options={"waves": waves})


HANAYO = register(Family(
    name="hanayo",
    generate=generate,
    summary="wave-like placement (2·W·D stages down and up the devices), greedy backward-first orders",
    source="Liu et al., Hanayo, SC'23, §3",
    options=(Option("waves", int, 1, at_least(1), "number of down-and-up passes W; 2·W chunks per device"),),
    placement=lambda *, devices, waves: Placement.wave(devices, waves),
))
