"""Seq1F1B: 1F1B over sequence segments of each sample.

Source: Sun, Zhao, Han, Yang, Zhang, Liu, Shi and Sun, "Seq1F1B: Efficient Sequence-Level Pipeline
Parallelism for Large Language Model Training", NAACL 2025 (arXiv 2406.03488), §3; the authors'
Megatron-LM fork (thunlp/Seq1F1B, ``megatron/core/pipeline_parallel/schedules.py``:
``forward_backward_pipelining_without_interleaving`` and ``sp_utils.sp_queue``).

Each sample's sequence is cut into ``segments`` consecutive pieces and every piece is a schedule
unit: here a *microbatch id* ``u = sample * segments + j`` (``j`` the segment), so ``microbatches``
counts segments (``samples * segments``) and a Seq1F1B at ``k`` segments does the work of a 1F1B
at ``microbatches / k`` microbatches. The order is the authors' 1F1B over those units: device d
runs ``min(D - d - 1 + k - 1, N)`` warm-up forwards (the fork's ``num_warmup_microbatches``), then
alternates F and B, then drains its backwards; forwards run in unit order, backwards sample by
sample with the segments of a sample in *reverse* order (the fork's ``sp_queue.pop``: the newest
entry of the oldest sample first).

Dependencies. Causal attention makes segment j read the keys and values of segments ``< j`` of the
same sample at the same stage, so ``F(s, j) <- F(s, j-1)``, and its backward adds gradients into
them, so ``B(s, j) <- B(s, j+1)`` (the backward order reverses). Both ends are on one device (a
stage lives on one device), so these edges are never transfers, and they hold exactly when the
device's order runs a sample's forwards in segment order and its backwards in reverse segment
order: the lane order then implies them and the simulator needs nothing more. The dependency
rules (``_rules``) do not know about segments, so a hand-made order that breaks the rule would
not be refused there; ``segment_order_violation`` checks it and the generator asserts it (the one
IR change that would make the rule general: a ``segments`` field on ``Schedule`` and the two edges
above in ``_rules.data_predecessor``, which then refuse such orders as deadlocks).

Costs. A segment's cost is ``Hardware.size[u]`` times the per-stage time of a whole sample
(``diffpipe._workload._segments``: linear parts in proportion to its length ``L_j``, attention to its causal
query-key pairs ``L_j (P_j + L_j / 2)`` after a prefix ``P_j``). At equal per-unit times the order
is a 1F1B over ``N`` units (measured: ``tests/test_seq1f1b.py``): makespan ``(N + D - 1)(t_F + t_B)``,
bubble ``(D - 1)/(N + D - 1)`` -- with ``N = k m`` units each ``1/k`` of a sample, the bubble of 1F1B
at ``m`` microbatches shrinks from ``(D-1)/(m+D-1)`` to ``(D-1)/(k m+D-1)``: ``D - 1`` segment times
of fill and drain instead of microbatch times. (Derived from the order and tested against the table;
not a formula quoted from the paper, whose Fig. 1 shows the timeline.) Peak stored units on device d:
``min(D - d + k - 1, N)``, in sample terms ``(D + k - 1)/k`` on device 0 against 1F1B's ``D``
(equal segment lengths; the MindSpore Seq1F1B notes: ``s + p - 1`` units before the first backward).

torch. ``to_torch_csv`` exports the order (a valid 1F1B action list over the units; torch's validator
accepts it), but torch.distributed.pipelining's runtime cannot run it *as Seq1F1B*: it splits the
batch into microbatches along a batch dimension and runs each microbatch's forward and backward as
an independent autograd graph, while segment j needs the keys and values its stage computed for
segments ``< j`` (state kept across microbatches) and its backward must add into their gradients.
Run in torch, the CSV trains on independent chunks, not on segments of one sequence; it is left out
of the real torch run for that reason.

Interleaved variant: ``seq1f1b_interleaved`` (Seq1F1B-I, ``chunks`` model chunks per device).

Equal work. ``Family.units`` (``units_per_sample``) says a sample is ``segments`` units: ``compare``,
``sweep`` and their CLI commands count ``microbatches`` in samples and price each unit at its
segment's share of a sample (``diffpipe._workload._segments.unit_sizes``), so a Seq1F1B is compared with a
1F1B on the same data; ``get`` itself keeps taking units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._ir import Op
from .._registry import Family, Formula, Option, at_least, register
from .._schedule import Placement, Schedule

#: Default segments per sample (the paper's experiments split into 2-8; 4 is a middle value).
DEFAULT_SEGMENTS = 4
SEGMENTS = Option("segments", int, DEFAULT_SEGMENTS, at_least(1),
                  "segments per sample (microbatches must be a multiple)")


def unit(sample: int, segment: int, segments: int) -> int:
    """The microbatch id of segment ``segment`` of ``sample``."""
    return sample * segments + segment


def backward_units(microbatches: int, segments: int) -> list[int]:
    """Units in backward order: samples in order, each sample's segments last to first."""
    return [unit(u // segments, segments - 1 - u % segments, segments) for u in range(microbatches)]


def warmup(devices: int, device: int, microbatches: int, segments: int) -> int:
    """Forwards device ``device`` runs before its first backward: ``D - d - 1 + k - 1`` (at most N)."""
    return min(devices - device - 1 + segments - 1, microbatches)


def generate(*, devices: int, microbatches: int, segments: int = DEFAULT_SEGMENTS) -> Schedule:
    backward = backward_units(microbatches, segments)
    orders = []
    for d in range(devices):
        w = warmup(devices, d, microbatches, segments)
        order = [Op("F", d, u) for u in range(w)]
        for i in range(microbatches - w):
            order += [Op("F", d, w + i), Op("B", d, backward[i])]
        order += [Op("B", d, u) for u in backward[microbatches - w:]]
        orders.append(order)
    schedule = Schedule(Placement.linear(devices), orders, microbatches, family="seq1f1b",
                        options={"segments": segments})
    problem = segment_order_violation(schedule.orders, segments)
    assert problem is None, problem  # the construction above keeps the rule by design
    return schedule


def segment_order_violation(orders: Sequence[Sequence[Op]], segments: int) -> str | None:
    """The first place where ``orders`` break the causal-attention rule, or None.

    Microbatch ``u`` is segment ``u % segments`` of sample ``u // segments``. On every device and
    stage, a sample's forwards must run in segment order (segment j reads the keys and values of
    the earlier ones) and its backwards (``B``, or ``I`` in split orders) in reverse segment order
    (segment j's backward adds into the key/value gradients of the earlier ones).
    """
    for device, order in enumerate(orders):
        last: dict[tuple[str, int, int, int], int] = {}
        for op in order:
            if op.kind not in ("F", "B", "I"):
                continue
            kind = "F" if op.kind == "F" else "B"
            sample, j = divmod(op.microbatch, segments)
            key = (kind, op.pipeline, op.stage, sample)
            previous = last.get(key)
            if previous is not None and (j < previous if kind == "F" else j > previous):
                before = Op(op.kind, op.stage, unit(sample, previous, segments), op.pipeline)
                return (f"device {device} runs {op} after {before}: segment {j} of sample {sample} must "
                        f"{'follow' if kind == 'F' else 'precede'} segment {previous} "
                        f"({'forward' if kind == 'F' else 'backward'} order of causal attention)")
            last[key] = j
    return None


def formula(*, devices: int, microbatches: int, durations: Mapping[str, float],
            segments: int = DEFAULT_SEGMENTS) -> Formula:
    """At equal per-unit times: makespan ``(N+D-1)(t_F+t_B)``, bubble ``(D-1)/(N+D-1)``, peak
    stored units ``min(D-d+k-1, N)`` on device d (derived from the order; module docstring)."""
    d, n, k = devices, microbatches, segments
    return Formula(
        makespan=(n + d - 1) * (durations["F"] + durations["B"]),
        bubble_ratio=(d - 1) / (n + d - 1),
        assumption="equal per-segment stage times (a compute-balanced split), no communication",
        peak_activations=tuple(min(d - i + k - 1, n) for i in range(d)),
    )


def accepts_segments(*, devices: int, microbatches: int, segments: int) -> str | None:
    """None when the microbatches are whole samples of ``segments`` units, else the reason."""
    if microbatches % segments:
        return (f"microbatches count segments (samples x segments): {microbatches} is not a multiple of "
                f"segments={segments}")
    return None


SEQ1F1B = register(Family(
    name="seq1f1b",
    generate=generate,
    summary="1F1B over sequence segments: microbatch ids are segments (samples x segments), causal order",
    source="Sun et al., Seq1F1B, NAACL 2025 (arXiv 2406.03488), §3; thunlp/Seq1F1B schedules.py",
    options=(SEGMENTS,),
    accepts=accepts_segments,
    formula=formula,
    placement=lambda *, devices, **_: Placement.linear(devices),
    units_per_sample=lambda *, segments: segments,
))
