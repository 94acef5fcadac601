"""``v-schedule``: a memory budget chooses a V schedule (Qi et al., "Pipeline Parallelism with
Controllable Memory", NeurIPS 2024), and the zero-bubble condition at half memory.

Bubbles are counted at the paper's equal pass times t_F = t_I = t_W = 1 (per chunk): the makespan
beyond the 6N passes every device runs. Memory is read off the orders (``peak_activations``, in
chunk-microbatches: a full-stage microbatch is two).
"""

import itertools

import numpy as np
import pytest

import diffpipe as dp
from diffpipe.schedules import formula, get, peak_activations, table
from diffpipe.schedules._reference import evaluate
from diffpipe.schedules._schedule import Op
from diffpipe.schedules.families.controllable_memory import (
    BLOCKS,
    cap,
    choose,
    least_peak,
    ranked,
    search_size,
    strided_blocks,
    strided_offsets,
)

UNIT = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}


def bubble(s):
    return table(s, UNIT).makespan - 6 * s.microbatches


def budget(d, n, chunks):
    """v-schedule at a budget of ``chunks`` chunk-microbatches, or None where it is refused."""
    try:
        return get("v-schedule", devices=d, microbatches=n, memory=chunks / (2 * d))
    except dp.ScheduleError as error:
        assert "the smallest block" in str(error)
        return None


@pytest.mark.parametrize("d", range(2, 13))
def test_strides_one_and_two_are_v_min_and_v_half(d):
    """The strided family contains the paper's two blocks: V-Min is stride 1, V-Half stride 2."""
    v_min = strided_offsets(d, (1,) * (d - 1), (0, 2 if d % 3 == 0 else 0, 0))
    v_half = strided_offsets(d, (2,) * (d - 1), (0, 3 if d % 2 == 0 else 0, 1))
    assert v_min == tuple(BLOCKS["v-min"](d, i) for i in range(d))
    assert v_half == tuple(BLOCKS["v-half"](d, i) for i in range(d))


@pytest.mark.parametrize("d", [1, 2, 3, 4, 5])
def test_every_candidate_block_is_a_valid_order(d):
    """Each strided block builds a validated schedule (construction validates) running every
    pass once, at N below, at and above the block's length."""
    from diffpipe.schedules.families.controllable_memory import _build

    for name in strided_blocks(d):
        for n in (1, d, 2 * d + 1):
            s = _build(name, d, n)
            ops = [op for order in s.orders for op in order]
            assert len(ops) == len(set(ops)) == 6 * d * n


@pytest.mark.parametrize("d, n", [(d, n) for d in (2, 3, 4, 5, 6) for n in (d, 2 * d + 1)])
def test_a_budget_bounds_memory_and_the_bubble_falls_as_it_grows(d, n):
    """For every budget from 1 to 2D+1 chunk-microbatches: the chosen schedule's peak fits on
    every device, its bubble never rises with the budget, and it is no worse than zb-v, v-half
    or v-min wherever their peak fits the budget."""
    named = [get(name, devices=d, microbatches=n) for name in ("zb-v", "v-half", "v-min")]
    previous = None
    for chunks in range(1, 2 * d + 2):
        s = budget(d, n, chunks)
        if s is None:
            assert previous is None  # refused budgets are the smallest ones only
            assert all(max(peak_activations(r)) > chunks for r in named)
            continue
        assert s.family == "v-schedule" and s.placement == dp.schedules.Placement.v(d)
        assert max(peak_activations(s)) <= chunks
        if previous is not None:
            assert bubble(s) <= previous
        previous = bubble(s)
        for r in named:
            if max(peak_activations(r)) <= chunks:
                assert bubble(s) <= bubble(r)
    assert previous is not None


def test_the_table_at_8_devices_and_32_microbatches():
    """k = 4..8 full-stage microbatches (1F1B holds 8): bubbles 23, 17, 11, 9, 7 slots. V-Min
    holds 4 with 27, V-Half 5 with 17, ZB-V 8 with 7; the strided block at 4 beats V-Min."""
    d, n = 8, 32
    got = {}
    for k in range(4, 9):
        s = get("v-schedule", devices=d, microbatches=n, memory=k / d)
        assert max(peak_activations(s)) <= 2 * k
        got[k] = (bubble(s), choose(d, n, k / d))
    assert {k: b for k, (b, _) in got.items()} == {4: 23, 5: 17, 6: 11, 7: 9, 8: 7}
    assert got[5][1] == "v-half" and got[8][1] == "zb-v"
    assert bubble(get("v-min", devices=d, microbatches=n)) == 27


def test_named_blocks_are_chosen_with_their_own_orders():
    s = get("v-schedule", devices=8, microbatches=16, memory=5 / 8)
    assert choose(8, 16, 5 / 8) == "v-half" and s.option("memory") == 5 / 8
    assert s.orders == get("v-half", devices=8, microbatches=16).orders
    s = get("v-schedule", devices=4, microbatches=8)  # memory 1.0: ZB-V, 1F1B's activations
    assert choose(4, 8, 1.0) == "zb-v" and s.orders == get("zb-v", devices=4, microbatches=8).orders


def test_cap_counts_chunk_microbatches():
    assert cap(8, 0.5) == 8 and cap(8, 0.6) == 9 and cap(8, 1.0) == 16 and cap(3, 0.5) == 3


@pytest.mark.parametrize("d, memory, need", [(8, 0.49, 4), (4, 0.2, 2), (3, 0.5, 2)])
def test_a_budget_below_every_block_is_one_line(d, memory, need):
    """The smallest block's need is V-Min's, (D+4)//3 full-stage microbatches."""
    assert need == (d + 4) // 3
    with pytest.raises(dp.ScheduleError, match=rf"^v-schedule: memory={memory} .*the smallest block "
                                               rf"\(.*\) needs {need}, memory >= ") as info:
        get("v-schedule", devices=d, microbatches=2 * d, memory=memory)
    assert "\n" not in str(info.value)
    with pytest.raises(dp.ScheduleError, match="memory must be > 0"):
        get("v-schedule", devices=d, microbatches=8, memory=0.0)


def test_the_least_peak_is_v_mins_closed_form_and_checking_builds_nothing():
    for d in range(1, 7):  # D <= 12 checked once; the suite keeps the small sizes
        for n in range(1, 2 * d + 1):  # ranked at min(N, 2D): larger N repeat N = 2D
            assert least_peak(d, n) == min(p for _, p, _ in ranked(d, search_size(d, n))), (d, n)
    ranked.cache_clear()
    # The CLI's size guards check requests far too large to build (tests/test_bad_inputs.py's
    # grid-huge): accepting one must not rank a single block.
    family = dp.schedules.family("v-schedule")
    family.check(4096, 8192, {"memory": 0.5})
    assert ranked.cache_info().currsize == 0


def test_the_jax_simulator_equals_the_reference():
    """dp.simulate on a v-schedule of a strided block (per-stage F, I, W times and a p2p delay)
    against the pure-Python longest-path evaluator. (Every family's default size runs in every
    communication mode in ``tests/test_simulator.py``.)"""
    d, n = 5, 10
    s = get("v-schedule", devices=d, microbatches=n, memory=0.7)
    assert choose(d, n, 0.7).startswith("strides")
    rng = np.random.default_rng(d * 100 + n)
    f, i, w = (rng.uniform(0.5, 2.0, s.stages) for _ in range(3))
    p2p = 0.3
    hw = dp.Hardware.from_times(forward=f.tolist(), input_grad=i.tolist(), weight=w.tolist(), p2p_time=p2p)
    result = dp.simulate(s, hw)
    times = {"F": f, "I": i, "W": w}
    start, finish = evaluate(s, lambda op: float(times[op.kind][op.stage]),
                             lambda op, dep: p2p if dep.is_transfer else 0.0)
    np.testing.assert_allclose(np.asarray(result.finish), [finish[op] for op in s.ops], rtol=2e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(result.start), [start[op] for op in s.ops], rtol=2e-5, atol=1e-4)


# -- zero bubble at half memory ------------------------------------------------------------------


def steady_idle(s, durations):
    """The steady-state bubble: the largest idle time of a device between the starts of its
    chunk-0 forwards of microbatches 2D and 4D (N = 6D: 2D microbatches of warm-up before and
    of cool-down after the window), at the given pass times."""
    t = table(s, durations)
    a, b = 2 * s.devices, 4 * s.devices
    worst = 0.0
    for device, order in enumerate(s.orders):
        lo, hi = t.start[Op("F", device, a)], t.start[Op("F", device, b)]
        busy = sum(min(t.finish[op], hi) - max(t.start[op], lo) for op in order
                   if t.finish[op] > lo and t.start[op] < hi)
        worst = max(worst, hi - lo - busy)
    return worst


TIMES = (0.5, 1.0, 1.5, 2.0, 3.0)


@pytest.mark.parametrize("d", [5, 8])
def test_half_memory_has_zero_steady_bubble_exactly_when_the_condition_holds(d):
    """Qi et al.: at half of 1F1B's memory the bubble can vanish if W + 2B >= 2F and W + 2F >= 2B
    (B: the input gradient I). V-Half's orders (built at unit times, (D+2)//2 microbatches held)
    simulated at every (F, I, W) of a grid: the steady-state idle is zero on the grid points where
    the condition holds (the boundary included) and positive on every other."""
    s = get("v-half", devices=d, microbatches=6 * d)
    assert max(peak_activations(s)) == 2 * ((d + 2) // 2)
    for f, i, w in itertools.product(TIMES, repeat=3):
        holds = w + 2 * i >= 2 * f and w + 2 * f >= 2 * i
        idle = steady_idle(s, {"F": f, "I": i, "W": w, "B": i + w})
        assert (idle == pytest.approx(0.0, abs=1e-9)) == holds, (f, i, w, idle)


def test_less_memory_idles_and_full_memory_does_not_at_the_same_times():
    """The condition is about half memory: V-Min (a third) idles in the steady state at times that
    satisfy it, ZB-V (1F1B's memory) does not idle even at times that violate it."""
    d = 8
    v_min, zb_v = (get(name, devices=d, microbatches=6 * d) for name in ("v-min", "zb-v"))
    assert steady_idle(v_min, {"F": 1.5, "I": 1.0, "W": 1.0, "B": 2.0}) > 0
    assert steady_idle(v_min, UNIT) == 0
    for f, i, w in ((2.0, 1.0, 0.5), (1.0, 2.0, 1.0)):
        assert steady_idle(zb_v, {"F": f, "I": i, "W": w, "B": i + w}) == 0



def test_its_options_rebuild_it():
    """A schedule's options are its family's (the budget and the times it was ranked at), so
    ``compare`` and friends can look the family up again with them (no closed form is registered)."""
    s = get("v-schedule", devices=4, microbatches=8, memory=0.75)
    assert dict(s.options) == {"memory": 0.75, "forward": 1.0, "input_grad": 1.0, "weight": 1.0}
    assert formula(s.family, devices=4, microbatches=8, **dict(s.options)) is None
    assert get(s.family, devices=4, microbatches=8, **dict(s.options)).orders == s.orders


@pytest.mark.parametrize("times", [(1.5, 1.0, 1.0), (1.0, 1.0, 0.5), (2.0, 1.0, 3.0), (1.0, 2.0, 1.0),
                                   (2.0, 1.0, 0.5), (0.5, 2.0, 2.0)])
def test_a_half_budget_ranked_at_the_times_is_zero_bubble_when_the_condition_holds(times):
    """v-schedule at V-Half's budget, ranked at the given (F, I, W): whichever block it picks, its
    steady state is idle-free exactly when W + 2B >= 2F and W + 2F >= 2B (the first three
    times satisfy it, the first on the boundary; the last three do not). At D = 4 the budget,
    3 of 1F1B's 4 microbatches, is far from half, and a wider block idles at no times."""
    d = 5
    f, i, w = times
    s = get("v-schedule", devices=d, microbatches=6 * d, memory=((d + 2) // 2) / d,
            forward=f, input_grad=i, weight=w)
    assert max(peak_activations(s)) <= 2 * ((d + 2) // 2)
    holds = w + 2 * i >= 2 * f and w + 2 * f >= 2 * i
    idle = steady_idle(s, {"F": f, "I": i, "W": w, "B": i + w})
    assert (idle == pytest.approx(0.0, abs=1e-9)) == holds


def test_the_ranking_estimate_bounds_the_candidates_and_refuses_long_rankings():
    """``_ranking_ops`` counts ``candidates_bound(D)`` blocks; it must not undercount them, and a
    ranking of minutes (issue 20: 64 devices x 2048 microbatches ranked at F = 2) is refused before
    any block is built."""
    from diffpipe.schedules.families.controllable_memory import candidates_bound

    for d in range(1, 9):
        assert len(strided_blocks(d)) + 3 <= candidates_bound(d), d
    ranked.cache_clear()
    with pytest.raises(dp.ScheduleError, match="over the limit"):
        get("v-schedule", devices=64, microbatches=2048, forward=2.0)
    assert ranked.cache_info().currsize == 0
