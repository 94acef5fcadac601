"""The V-shaped families: V-Half and V-Min (Qi et al., "Pipeline Parallelism with Controllable
Memory", NeurIPS 2024; the memory-budget ``v-schedule`` in ``tests/test_v_schedule.py``), and
DualPipe (DeepSeek-V3 report).

Memory is read off the orders (``peak_activations``, exact for any timing); bubbles come from
``table`` at the paper's equal pass times. Their simulation in every communication mode, against
the pure-Python oracle, comes from the registry-driven matrix of ``tests/_helpers.py``.
"""

import itertools

import pytest

import diffpipe as dp
from diffpipe.schedules import formula, get, names, peak_activations, table
from diffpipe.schedules.families.controllable_memory import held

#: Per-chunk pass times of the paper's comparison, t_F = t_I = t_W (a full B is I + W).
UNIT = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}
#: The same times for a whole stage (two chunks): what 1F1B runs per device.
STAGE = {"F": 2.0, "I": 2.0, "W": 2.0, "B": 4.0}


def bubble_time(name, d, n):
    """Idle time of one step beyond the 6N unit passes every device runs (chunk units)."""
    return table(get(name, devices=d, microbatches=n), UNIT).makespan - 6 * n


def one_f_one_b_bubble(d, n):
    return table(get("1f1b", devices=d, microbatches=n), STAGE).makespan - 6 * n


def test_v_and_dualpipe_families_are_registered_with_sources():
    for name in ("v-half", "v-min", "v-schedule", "dualpipe"):
        assert name in names()
        fam = dp.schedules.family(name)
        assert fam.source and fam.summary


@pytest.mark.parametrize("name", ["v-half", "v-min"])
@pytest.mark.parametrize("d, n", [(d, n) for d in (1, 2, 3, 4, 5, 8) for n in (1, 2, d, 2 * d + 1, 3 * d)])
def test_v_blocks_run_every_pass_once_on_a_v(name, d, n):
    s = get(name, devices=d, microbatches=n)
    assert s.placement == dp.schedules.Placement.v(d) and s.family == name
    ops = [op for order in s.orders for op in order]
    assert len(ops) == len(set(ops)) == 3 * 2 * d * n
    assert {op.kind for op in ops} == {"F", "I", "W"}


@pytest.mark.parametrize("d", [2, 3, 4, 5, 6, 7, 8, 12, 16])
def test_v_half_and_v_min_hold_the_published_activations(d):
    """Table 1: 1F1B holds D microbatches, V-Half (D+2)//2, V-Min (D+4)//3 (a chunk-microbatch is
    half a stage's activations, so the peaks in chunk units are twice these)."""
    n = 3 * d
    assert max(peak_activations(get("1f1b", devices=d, microbatches=n))) == d
    assert max(peak_activations(get("zb-v", devices=d, microbatches=n))) == 2 * d
    for name, expected in (("v-half", (d + 2) // 2), ("v-min", (d + 4) // 3)):
        assert held(name, d) == expected
        assert max(peak_activations(get(name, devices=d, microbatches=n))) == 2 * expected
    if d >= 8:  # about a half and a third of 1F1B's
        assert held("v-half", d) / d == pytest.approx(1 / 2, abs=0.13)
        assert held("v-min", d) / d == pytest.approx(1 / 3, abs=0.17)


@pytest.mark.parametrize("d", [4, 5, 6, 8, 12, 16])
def test_bubbles_are_the_published_fractions_of_1f1b(d):
    """Table 1 at t_F = t_B = t_W: V-Half's bubble is (at most, and for deep pipelines about) half of
    1F1B's, V-Min's two thirds; ZB-V's is the one-step fill, a sixth. None depends on N."""
    sizes = (2 * d, 4 * d + 1)
    for n in sizes:
        reference = one_f_one_b_bubble(d, n)
        assert reference == 6 * (d - 1)
        half, low = bubble_time("v-half", d, n) / reference, bubble_time("v-min", d, n) / reference
        assert 1 / 4 < half <= 1 / 2 and 1 / 2 < low <= 2 / 3
        if d >= 16:
            assert half == pytest.approx(1 / 2, abs=0.05) and low == pytest.approx(2 / 3, abs=0.05)
        assert bubble_time("zb-v", d, n) / reference == pytest.approx(1 / 6)
        assert bubble_time("zb-v", d, n) < bubble_time("v-half", d, n) < bubble_time("v-min", d, n)
    for name in ("v-half", "v-min"):
        assert len({bubble_time(name, d, n) for n in sizes}) == 1


@pytest.mark.parametrize(
    "name, d, bubble",
    [("v-half", 4, 5), ("v-half", 8, 17), ("v-half", 16, 41), ("v-min", 4, 11), ("v-min", 8, 27), ("v-min", 16, 59)],
)
def test_bubbles_equal_the_authors_greedy(name, d, bubble):
    """Bubble slots of the authors' zbv_greedy.py at unit costs (run on these sizes while writing
    the family; their orders and ours agreed op for op)."""
    assert bubble_time(name, d, 2 * d) == bubble


def test_v_blocks_have_no_closed_form():
    assert formula("v-half", devices=4, microbatches=8) is None
    assert formula("v-min", devices=4, microbatches=8) is None


@pytest.mark.parametrize("name", ["v-half", "v-min"])
def test_v_blocks_export_to_torch_csv_and_back(tmp_path, name):
    s = get(name, devices=4, microbatches=8)
    path = tmp_path / f"{name}.csv"
    dp.schedules.to_torch_csv(s, path)
    back = dp.schedules.from_torch_csv(path)
    assert back.orders == s.orders and back.placement == s.placement


@pytest.mark.parametrize("name, d, n", list(itertools.product(["v-half", "v-min"], [2, 4], [4, 9])))
def test_orders_run_at_any_durations(name, d, n):
    """The order is built at unit times but is valid at any: uneven passes lengthen, never deadlock."""
    s = get(name, devices=d, microbatches=n)
    slow = table(s, {"F": 1.0, "I": 2.0, "W": 0.5, "B": 2.5})
    assert slow.makespan >= 3.5 * 2 * n


# -- DualPipe -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("d, n", [(2, 4), (2, 6), (4, 8), (4, 10), (6, 12), (8, 16), (8, 34)])
def test_dualpipe_is_dualpipe_v_on_each_half_rank(d, n):
    """deepseek-ai/DualPipe: rank r runs DualPipe-V's program of half rank min(r, D-1-r), with its
    two chunks meaning the two directions (two model copies on a mirrored placement)."""
    s = get("dualpipe", devices=d, microbatches=n)
    v = get("dualpipe-v", devices=d // 2, microbatches=n // 2)
    assert s.placement == dp.schedules.Placement.mirrored(d) and s.pipelines == 2
    for r in range(d):
        half = min(r, d - 1 - r)
        # The same pass kinds in the same order; pipeline 0 takes microbatches 0..N/2-1.
        assert [op.kind for op in s.orders[r]] == [op.kind for op in v.orders[half]]
        for op in s.orders[r]:
            assert (op.microbatch < n // 2) == (op.pipeline == 0)
            assert s.placement.device(op.pipeline, op.stage) == r
    ops = [op for order in s.orders for op in order]
    assert len(ops) == len(set(ops)) == len(s.ops)


@pytest.mark.parametrize("times", [(1, 1, 1), (1, 1, 0.5), (1, 1.5, 0.5), (2, 1, 1), (1, 2, 1)])
@pytest.mark.parametrize("d, n", [(4, 16), (8, 32), (8, 40)])
def test_dualpipe_table_of_the_authors(times, d, n):
    """The DualPipe README's table (PP = d stages): DualPipe on PP devices, DualPipe-V on PP/2, both
    with 2x parameters and PP + 1 activations per device; 1F1B holds PP on PP devices.

    Bubble: with F&B = F + B (no overlap) each device idles exactly as long as DualPipe-V's, and
    the busiest device idles the published ``(PP/2-1)(F&B+B-3W)`` exactly when t_F = t_I (more
    when the forward is the longer pass, less when the input-gradient one is)."""
    f, i, w = times
    durations = {"F": f, "I": i, "W": w, "B": i + w}
    dual, half = get("dualpipe", devices=d, microbatches=n), get("dualpipe-v", devices=d // 2, microbatches=n // 2)
    assert (dual.devices, half.devices) == (d, d // 2)
    for s in (dual, half):  # 2x parameters: two stages of the PP-stage model on every device
        assert all(len(s.placement.held(r)) == 2 for r in range(s.devices))
        assert peak_activations(s) == (d + 1,) * s.devices
    assert max(peak_activations(get("1f1b", devices=d, microbatches=n))) == d
    a, b = table(dual, durations), table(half, durations)
    assert a.makespan == b.makespan
    idle = a.makespan - max(a.busy)
    assert idle == b.makespan - max(b.busy)
    fb = f + i + w
    published = (d // 2 - 1) * (fb + (i + w) - 3 * w)
    assert 0 < idle and (idle > published if f > i else idle < published if f < i else idle == published)


@pytest.mark.parametrize("d, n", [(4, 8), (8, 32), (6, 24)])
def test_dualpipe_closed_form_at_equal_times(d, n):
    closed = formula("dualpipe", devices=d, microbatches=n, durations=UNIT)
    t = table(get("dualpipe", devices=d, microbatches=n), UNIT)
    assert closed.makespan == t.makespan == 3 * n + d - 2
    assert closed.peak_activations == peak_activations(get("dualpipe", devices=d, microbatches=n))
    assert formula("dualpipe", devices=d, microbatches=n, durations={"F": 1.0, "I": 2.0, "W": 1.0, "B": 3.0}) is None


def test_dualpipe_pairs_a_forward_with_a_backward():
    """The overlapped F&B pairs of the main phase are an F immediately followed by a B (of the
    other direction's chunk) on the same device."""
    s = get("dualpipe", devices=4, microbatches=16)
    for order in s.orders:
        pairs = [(a, b) for a, b in zip(order, order[1:]) if a.kind == "F" and b.kind == "B"]
        assert len(pairs) >= 8 and all(a.pipeline != b.pipeline or a.stage != b.stage for a, b in pairs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(devices=3, microbatches=12), r"^dualpipe: devices must be even \(two pipelines in opposite .*got 3$"),
        (dict(devices=4, microbatches=6), r"^dualpipe: microbatches must be even and at least 2 \* devices = 8"),
        (dict(devices=4, microbatches=9), r"^dualpipe: microbatches must be even"),
    ],
)
def test_dualpipe_wrong_sizes_are_one_line(kwargs, message):
    with pytest.raises(dp.ScheduleError, match=message) as info:
        get("dualpipe", **kwargs)
    assert "\n" not in str(info.value)


def test_dualpipe_cannot_be_a_torch_csv():
    """torch's pipeline CSV has one pipeline; DualPipe's two model copies are refused in one line."""
    with pytest.raises(dp.ScheduleError, match="dualpipe runs 2 pipelines"):
        dp.schedules.to_torch_csv(get("dualpipe", devices=4, microbatches=8))
