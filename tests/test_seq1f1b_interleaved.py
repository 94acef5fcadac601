"""Seq1F1B-I (Sun et al., NAACL 2025): interleaved 1F1B over sequence segments.

The order is checked against a literal replay of the authors' Megatron-LM fork (its warm-up count,
``get_model_chunk_id`` and one two-level ``sp_queue`` per model chunk, popped by each device on its
own) at every size, and the sizes the family refuses are exactly those where that replay breaks the
causal order or deadlocks; ``segments=1`` is ``interleaved-1f1b``; the derived closed form and memory
against ``table``. Simulation in every mode comes from the registry matrix (``tests/_helpers.py``).
"""

import csv
import itertools

import pytest

import diffpipe as dp
from diffpipe.schedules import (
    Op,
    Placement,
    Schedule,
    formula,
    from_torch_csv,
    get,
    peak_activations,
    table,
    to_torch_csv,
)
from diffpipe.schedules.families.interleaved import rounds
from diffpipe.schedules.families.seq1f1b import segment_order_violation

SIZES = list(itertools.product((1, 2, 3, 4, 6), (1, 2, 3, 4, 6, 8), (1, 2, 3, 4), (1, 2, 3)))  # D, samples, k, v


class SpQueue:
    """thunlp/Seq1F1B ``sp_utils.sp_queue``, restated: a list of per-sample lists; ``append`` fills
    the newest (a new one every ``splits`` appends); ``pop`` takes the newest item of the oldest."""

    def __init__(self, splits):
        self.queues, self.idx, self.splits = [[]], 0, splits

    def append(self, item):
        self.queues[-1].append(item)
        self.idx += 1
        if self.idx == self.splits:
            self.queues.append([])
            self.idx = 0

    def pop(self):
        if len(self.queues[0]) == 1 and len(self.queues) > 1:
            return self.queues.pop(0)[0]
        return self.queues[0].pop(-1)


def fork_order(rank, world, samples, splits, chunks):
    """``forward_backward_pipelining_with_interleaving`` of the fork, its compute calls only: ``total``
    steps, warm-up ``(v-1) world + (world - rank - 1) 2 + splits - 1``, chunk ids from
    ``get_model_chunk_id``; the unit a backward runs is what its chunk's queue pops (torch's flexible
    rounds of ``r`` units replace ``world`` where the fork would refuse the size)."""
    group = rounds(world, samples * splits)[1]
    total = samples * chunks * splits
    warm = min((chunks - 1) * group + (world - rank - 1) * 2 + splits - 1, total)
    queues, sent = [SpQueue(splits) for _ in range(chunks)], [0] * chunks

    def chunk_id(k, forward):
        c = (k % (group * chunks)) // group
        return c if forward else chunks - c - 1

    def forward(k):
        c = chunk_id(k, True)
        queues[c].append(sent[c])
        sent[c] += 1
        return Op("F", c * world + rank, sent[c] - 1)

    def backward(k):
        c = chunk_id(k, False)
        return Op("B", c * world + rank, queues[c].pop())

    order = [forward(k) for k in range(warm)]
    for k in range(total - warm):
        order += [forward(k + warm), backward(k)]
    return order + [backward(k) for k in range(total - warm, total)]


def _replay_is_sound(d, m, k, v):
    orders = [fork_order(r, d, m, k, v) for r in range(d)]
    try:
        s = Schedule(Placement.loop(d, v), orders, m * k)  # validates: a deadlock raises
    except dp.ScheduleError as error:
        assert "deadlock" in str(error)
        return orders, False
    return s.orders, segment_order_violation(s.orders, k) is None


def test_order_is_the_forks_and_refused_exactly_where_the_fork_breaks():
    accepted = refused = 0
    for d, m, k, v in SIZES:
        n = m * k
        if dp.schedules.family("interleaved-1f1b").accepts(devices=d, microbatches=n, chunks=v):
            continue  # torch's rounds refuse N itself (not a Seq1F1B matter)
        replay, sound = _replay_is_sound(d, m, k, v)
        try:
            s = get("seq1f1b-i", devices=d, microbatches=n, segments=k, chunks=v)
        except dp.ScheduleError as error:
            assert not sound and "must hold whole samples" in str(error), (d, m, k, v)
            refused += 1
            continue
        accepted += 1
        assert sound and s.orders == tuple(map(tuple, replay)), (d, m, k, v)
        assert segment_order_violation(s.orders, k) is None
    assert accepted > 250 and refused > 50


def test_one_segment_is_interleaved_1f1b():
    for d, n, v in itertools.product((1, 2, 3, 4, 8), (1, 3, 4, 6, 8, 16), (1, 2, 3)):
        try:
            want = get("interleaved-1f1b", devices=d, microbatches=n, chunks=v)
        except dp.ScheduleError:
            continue
        assert get("seq1f1b-i", devices=d, microbatches=n, segments=1, chunks=v).orders == want.orders


def test_the_forks_runs_sizes_build():
    """The fork's experiments: 8 pipeline stages, virtual sizes 2 and 4, 4 splits, 16 microbatches."""
    for v in (2, 4):
        s = get("seq1f1b-i", devices=8, microbatches=16 * 4, segments=4, chunks=v)
        assert s.stages == 8 * v and segment_order_violation(s.orders, 4) is None


@pytest.mark.parametrize("d, m, k, v", [(2, 3, 2, 2), (2, 2, 2, 2), (2, 4, 2, 3), (3, 3, 3, 2), (4, 4, 2, 2),
                                        (4, 8, 4, 2), (3, 5, 3, 1), (4, 4, 3, 1), (6, 6, 2, 2), (4, 2, 2, 2)])
def test_closed_form_and_memory_match_the_table(d, m, k, v):
    n = m * k
    s = get("seq1f1b-i", devices=d, microbatches=n, segments=k, chunks=v)
    r = rounds(d, n)[1]
    for durations in (None, {"F": 2.0, "B": 1.0}, {"F": 1.5, "B": 3.7}):
        closed = formula("seq1f1b-i", devices=d, microbatches=n, segments=k, chunks=v, durations=durations)
        t = table(s, durations)
        assert t.makespan == pytest.approx(closed.makespan)
        assert t.bubble_ratio == pytest.approx(closed.bubble_ratio, abs=1e-12)
        assert closed.makespan == pytest.approx(
            table(get("interleaved-1f1b", devices=d, microbatches=n, chunks=v), durations).makespan)
    want = tuple(min((v - 1) * r + 2 * (d - i - 1) + k, n * v) for i in range(d))
    assert peak_activations(s) == closed.peak_activations == want


def test_bubble_and_memory_against_interleaved_at_the_same_data():
    """m samples as interleaved-1F1B microbatches against k segments each (unit times 1/k): bubble
    (D-1)/(kmv+D-1) instead of (D-1)/(mv+D-1); device 0 holds ((v-1)D + 2(D-1) + k)/k samples' worth
    of chunk activations instead of (v-1)D + 2(D-1) + 1."""
    d, m, k, v = 4, 8, 2, 2
    one = table(get("interleaved-1f1b", devices=d, microbatches=m, chunks=v), {"F": 1.0, "B": 2.0})
    s = get("seq1f1b-i", devices=d, microbatches=m * k, segments=k, chunks=v)
    seq = table(s, {"F": 1.0 / k, "B": 2.0 / k})
    assert one.bubble_ratio == pytest.approx((d - 1) / (m * v + d - 1))
    assert seq.bubble_ratio == pytest.approx((d - 1) / (k * m * v + d - 1)) and seq.makespan < one.makespan
    assert peak_activations(s)[0] / k == ((v - 1) * d + 2 * (d - 1) + k) / k
    assert peak_activations(s)[0] / k < max(peak_activations(get("interleaved-1f1b", devices=d, microbatches=m,
                                                                   chunks=v)))


def test_wrong_sizes_are_one_line():
    with pytest.raises(dp.ScheduleError, match=r"^seq1f1b-i: microbatches count segments .*: 6 is not a multiple "
                                                r"of segments=4$"):
        get("seq1f1b-i", devices=4, microbatches=6, segments=4)
    with pytest.raises(dp.ScheduleError, match=r"^seq1f1b-i: a round of 4 units must hold whole samples of "
                                                r"segments=3 .*use segments dividing 4, or chunks=1$"):
        get("seq1f1b-i", devices=4, microbatches=12, segments=3, chunks=2)
    with pytest.raises(dp.ScheduleError, match="chunks must be >= 1"):
        get("seq1f1b-i", devices=4, microbatches=8, chunks=0)


def test_registered_with_units_and_estimate():
    fam = dp.schedules.family("seq1f1b-i")
    assert "Seq1F1B" in fam.source and "interleaving" in fam.source and fam.option_names == ("chunks", "segments")
    assert fam.units({"segments": 2}) == 2 and fam.units({}) == 4
    s = get("seq1f1b-i", devices=4, microbatches=16, segments=2, chunks=3)
    assert fam.estimate_ops(4, 16, fam.resolve({"segments": 2, "chunks": 3})) == len(s.ops)
    assert dp.schedules.units_per_sample(s) == 2


def test_torch_csv_round_trip_and_torch_accepts_it(tmp_path):
    from torch.distributed.pipelining.schedules import _Action, _validate_schedule

    s = get("seq1f1b-i", devices=4, microbatches=8, segments=2, chunks=2)
    path = tmp_path / "seq1f1b-i.csv"
    to_torch_csv(s, path)
    back = from_torch_csv(path)
    assert back.orders == s.orders and back.microbatches == 8 and back.stages == 8
    with open(path, newline="") as handle:
        actions = {rank: [_Action.from_str(cell) for cell in row] for rank, row in enumerate(csv.reader(handle))}
    _validate_schedule(actions, 4, s.stages, 8)
