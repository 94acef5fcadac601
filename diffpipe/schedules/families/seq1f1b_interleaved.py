"""Seq1F1B-I: interleaved 1F1B (virtual stages) over sequence segments.

Source: Sun et al., "Seq1F1B: Efficient Sequence-Level Pipeline Parallelism for Large Language Model
Training", NAACL 2025 (arXiv 2406.03488), §3 (Seq1F1B-I); the authors' Megatron-LM fork
(thunlp/Seq1F1B, ``megatron/core/pipeline_parallel/schedules.py``,
``forward_backward_pipelining_with_interleaving``, with one ``sp_utils.sp_queue`` per model chunk).

Units are as in ``seq1f1b``: microbatch id ``u = sample * k + j`` is segment ``j`` of ``sample``, so
``microbatches`` counts units (samples x ``segments``), and the ``D * chunks`` stages sit on a loop
placement as in ``interleaved-1f1b``. The fork's order, per device d, over ``N v`` unit-chunk steps
(``N`` units, ``v`` chunks):

- warm-up: ``(v-1) r + 2 (D-d-1) + k - 1`` forwards (at most ``N v``): Megatron's interleaved warm-up
  plus the ``k - 1`` of Seq1F1B (``num_warmup_microbatches += pipe_sp_splits - 1``), ``r = D`` units per
  round; then one forward and one backward in turn; then the remaining backwards;
- forward number i runs chunk ``(i // r) mod v`` (``get_model_chunk_id``) on that chunk's next unit in
  unit order; backward number i runs chunk ``v - 1 - (i // r) mod v`` on the unit its ``sp_queue`` pops:
  the newest segment of the oldest sample the chunk holds, i.e. samples in order, each one's segments
  last to first (``seq1f1b.backward_units``), as long as the oldest sample is complete at every pop.

Sizes. The fork requires the samples to be a multiple of D (so ``r = D``); diffpipe also takes
torch's flexible rounds over units, as ``interleaved-1f1b`` does (``max(1, N // D)`` rounds of
``r = N // rounds`` units), so that ``segments=1`` is exactly ``interleaved-1f1b`` at every size it
accepts. Read literally, the rule is causal only when every round holds whole samples, ``k`` divides
``r`` (the fork's ``exp.sh``: 8 stages, 4 splits, virtual sizes 2 and 4): otherwise a chunk's queue
pops a segment whose later segments have not yet run forward on that chunk, the devices disagree
about which unit a backward step is, and the literal replay deadlocks or breaks the causal order
(the fork itself was not run at such sizes); ``tests/test_seq1f1b_interleaved.py`` replays the fork
over several hundred sizes and finds this refusal exact. Such sizes are refused, except
with one chunk (no rounds to cross: the order is then causal at every size). Deviation: like
Megatron-LM, the fork runs every forward first when the samples equal D; ``interleaved-1f1b`` does
not take that branch (torch's order), and neither does this family, so that ``segments=1`` stays
``interleaved-1f1b``.

The fork's figure (thunlp/Seq1F1B ``picture/seq1f1b-I.png``, 4 devices, 2 chunks, 2 segments) draws
rounds of D *samples* (``D k`` units) instead, device 0 running 16 forwards before its first backward
where the code's rule runs 12: a different order; the code is what the paper's runs executed and
what is reproduced here.

Closed form (derived, not quoted; tested against ``table``): at equal per-unit times f, b the
makespan is interleaved 1F1B's over ``N`` units, ``max(N v + D - 1, v D + N - 1)(f + b)``: the extra
``k - 1`` warm-up forwards fill slots the device would otherwise wait in for its first backward,
they do not lengthen the critical path (as in ``seq1f1b``). With ``N = k m`` units each ``1/k`` of a
sample, the bubble ``(D-1)/(k m v + D - 1)`` is interleaved 1F1B's at ``m`` microbatches with
``k m`` in place of ``m``. Peak stored unit-chunks on device d: ``min((v-1) r + 2 (D-d-1) + k, N v)``,
the warm-up plus the steady state's forward before its first backward; each is ``1/k`` of a
sample's activations for ``1/(v D)`` of the model (equal lengths).

Communication: like ``interleaved-1f1b``, the order deadlocks under ``blocking`` sends (send and
receive orders disagree); ``overlap``, ``contention`` and ``rendezvous`` simulate it.

torch. ``to_torch_csv`` exports the order (a loop placement, as interleaved 1F1B), but torch's
runtime cannot run it as Seq1F1B-I, for the reason given in ``seq1f1b``: its microbatches are
independent autograd graphs, while a segment needs its stage's keys and values of the earlier
segments of its sample (state across microbatches) and its backward adds into their gradients.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._ir import Op
from .._registry import Family, Formula, register
from .._schedule import Placement, Schedule
from .interleaved import CHUNKS, accepts_rounds, formula_interleaved, rounds
from .seq1f1b import DEFAULT_SEGMENTS, SEGMENTS, accepts_segments, backward_units, segment_order_violation


def warmup(devices: int, device: int, microbatches: int, chunks: int, segments: int) -> int:
    """Forwards device ``device`` runs before its first backward: ``(v-1) r + 2(D-d-1) + k - 1``."""
    per_round = rounds(devices, microbatches)[1]
    return min((chunks - 1) * per_round + 2 * (devices - device - 1) + segments - 1, microbatches * chunks)


def _order(device: int, devices: int, microbatches: int, chunks: int, segments: int) -> list[Op]:
    per_round = rounds(devices, microbatches)[1]
    backward = backward_units(microbatches, segments)
    done = {"F": [0] * chunks, "B": [0] * chunks}

    def step(kind: str, i: int) -> Op:
        chunk = (i // per_round) % chunks
        chunk = chunk if kind == "F" else chunks - 1 - chunk
        n = done[kind][chunk]
        done[kind][chunk] += 1
        return Op(kind, chunk * devices + device, n if kind == "F" else backward[n])

    total = microbatches * chunks
    w = warmup(devices, device, microbatches, chunks, segments)
    order = [step("F", i) for i in range(w)]
    for i in range(total - w):
        order += [step("F", w + i), step("B", i)]
    return order + [step("B", i) for i in range(total - w, total)]


def generate(*, devices: int, microbatches: int, chunks: int = 2, segments: int = DEFAULT_SEGMENTS) -> Schedule:
    orders = [_order(d, devices, microbatches, chunks, segments) for d in range(devices)]
    schedule = Schedule(Placement.loop(devices, chunks), orders, microbatches, family="seq1f1b-i",
                        options={"chunks": chunks, "segments": segments})
    problem = segment_order_violation(schedule.orders, segments)
    assert problem is None, problem  # ``_accepts`` keeps to the sizes where the rule is causal
    return schedule


def _accepts(*, devices: int, microbatches: int, chunks: int, segments: int) -> str | None:
    reason = accepts_segments(devices=devices, microbatches=microbatches, segments=segments) \
        or accepts_rounds(devices, microbatches)
    if reason:
        return reason
    per_round = rounds(devices, microbatches)[1]
    if chunks > 1 and per_round % segments:
        return (f"a round of {per_round} units must hold whole samples of segments={segments} (the fork's "
                f"interleaved order is causal only then); use segments dividing {per_round}, or chunks=1")
    return None


def formula(*, devices: int, microbatches: int, durations: Mapping[str, float], chunks: int = 2,
            segments: int = DEFAULT_SEGMENTS) -> Formula:
    """At equal per-unit times: interleaved 1F1B's makespan and bubble over the ``N`` units; peak
    stored unit-chunks ``min((v-1) r + 2(D-d-1) + k, N v)`` on device d (module docstring)."""
    base = formula_interleaved(devices=devices, microbatches=microbatches, durations=durations, chunks=chunks)
    n, k = microbatches, segments
    return Formula(
        makespan=base.makespan,
        bubble_ratio=base.bubble_ratio,
        assumption="equal per-segment chunk times (a compute-balanced split), no communication, "
                   "N in max(1, N // D) equal rounds",
        peak_activations=tuple(min(warmup(devices, d, n, chunks, k) + 1, n * chunks) for d in range(devices)),
    )


SEQ1F1B_I = register(Family(
    name="seq1f1b-i",
    generate=generate,
    summary="interleaved 1F1B over sequence segments (Seq1F1B-I): v chunks per device, causal order",
    source="Sun et al., Seq1F1B, NAACL 2025 (arXiv 2406.03488), §3; thunlp/Seq1F1B schedules.py "
           "forward_backward_pipelining_with_interleaving",
    options=(CHUNKS, SEGMENTS),
    accepts=_accepts,
    formula=formula,
    placement=lambda *, devices, chunks, **_: Placement.loop(devices, chunks),
    units_per_sample=lambda *, segments, **_: segments,
))
