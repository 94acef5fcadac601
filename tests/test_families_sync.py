"""Synchronous families against their closed forms: gpipe, 1f1b, interleaved-1f1b, looped-bfs,
zb-h1, zb-h2, zb-v, dualpipe-v.

Each generator's schedule is valid (construction validates), holds every op exactly once, and its
``table`` makespan and peak activations equal the family's closed form wherever that form applies.
"""

import itertools
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import diffpipe as dp
from diffpipe.schedules import family, formula, get, peak_activations, table

UNIT = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}
#: Per-kind times: the table's default, unit F/I/W, and uneven ones (B = I + W throughout).
DURATIONS = [
    None,
    UNIT,
    {"F": 1.0, "B": 3.0, "I": 2.0, "W": 1.0},
    {"F": 2.0, "B": 1.5, "I": 1.0, "W": 0.5},
    {"F": 1.5, "B": 1.75, "I": 1.5, "W": 0.25},
]
DEVICES = [1, 2, 3, 4, 5]
MICROBATCHES = [1, 2, 3, 4, 5, 6, 8, 9, 12]


def sizes(name):
    """(devices, microbatches, options) the family accepts, over the test grid."""
    fam = family(name)
    chunk_values = [1, 2, 3] if "chunks" in fam.option_names else [None]
    for d, n, v in itertools.product(DEVICES, MICROBATCHES, chunk_values):
        options = {} if v is None else {"chunks": v}
        if fam.accepts is None or fam.accepts(devices=d, microbatches=n, **fam.resolve(options)) is None:
            yield d, n, options


FAMILIES = ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v", "dualpipe-v"]
CASES = [(name, d, n, opts) for name in FAMILIES for d, n, opts in sizes(name)]


def case_id(case):
    name, d, n, opts = case
    return f"{name}-D{d}-N{n}" + "".join(f"-{k}{v}" for k, v in opts.items())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_op_once_and_closed_form(case):
    name, d, n, opts = case
    s = get(name, devices=d, microbatches=n, **opts)
    assert s.family == name and s.devices == d and s.microbatches == n
    # Every op exactly once: F at every stage for every microbatch, and one backward (B, or I + W).
    ops = [op for order in s.orders for op in order]
    assert len(ops) == len(set(ops)) == len(s.ops)
    for m, stage in itertools.product(range(n), range(s.stages)):
        kinds = {op.kind for op in ops if op.microbatch == m and op.stage == stage}
        assert kinds in ({"F", "B"}, {"F", "I", "W"}), (m, stage, kinds)

    checked = 0
    for durations in DURATIONS:
        closed = formula(name, devices=d, microbatches=n, durations=durations, **opts)
        if closed is None:
            continue
        t = table(s, durations)
        assert t.makespan == pytest.approx(closed.makespan), durations
        assert t.bubble_ratio == pytest.approx(closed.bubble_ratio, abs=1e-12), durations
        assert peak_activations(s) == closed.peak_activations
        checked += 1
    # Each family's closed form covers the default unit table wherever the literature gives one.
    covered = {
        "zb-h1": opts.get("chunks") == 1 and n >= d,
        "zb-h2": n >= 2 * d - 1,
        "zb-v": n >= 2 * d - 1,
    }.get(name, True)
    assert checked > 0 or not covered


def test_closed_forms_by_hand():
    """A few values worked out on paper, independent of the formula code."""
    # Interleaved, D=4, N=8, v=2, f=1, b=2: N·v(f+b) + (D-1)(f+b) = 48 + 9.
    assert table(get("interleaved-1f1b", devices=4, microbatches=8)).makespan == 57
    # Looped BFS, D=4, N=2 < D, v=2: ((v-1)·D + N + D - 1)(f+b) = 9·3.
    assert table(get("looped-bfs", devices=4, microbatches=2)).makespan == 27
    # ZB-H1, D=4, N=8 at unit F/I/W: 3N + (D-1) — a third of 1F1B's bubble 3(D-1).
    assert table(get("zb-h1", devices=4, microbatches=8), UNIT).makespan == 27
    assert table(get("1f1b", devices=4, microbatches=8), UNIT).makespan == 24 + 9
    # ZB-H2 and ZB-V at unit times: one step is 3N (6N chunk passes) plus the fill D-1.
    assert table(get("zb-h2", devices=4, microbatches=8), UNIT).makespan == 27
    assert table(get("zb-v", devices=4, microbatches=8), UNIT).makespan == 51
    # DualPipe-V: 6N + 2D - 2, (D - 1) more than ZB-V: an overlapped pair waits for both inputs.
    assert table(get("dualpipe-v", devices=4, microbatches=8), UNIT).makespan == 54


@pytest.mark.parametrize("d, n, v", [(4, 8, 2), (4, 4, 2), (2, 6, 3), (3, 3, 4), (4, 8, 1)])
def test_interleaved_peak_is_megatron_warmup_plus_one(d, n, v):
    """REFERENCE: Megatron's warm-up holds (D-d-1)·2 + (v-1)·D chunk activations; the steady
    state's forward before its first backward adds one (all N·v when the warm-up covers them)."""
    s = get("interleaved-1f1b", devices=d, microbatches=n, chunks=v)
    warmup = [min((d - i - 1) * 2 + (v - 1) * d, n * v) for i in range(d)]
    assert peak_activations(s) == tuple(min(w + 1, n * v) for w in warmup)


@pytest.mark.parametrize(
    "name, d, n, expected",
    [
        ("gpipe", 4, 6, (6, 6, 6, 6)),
        ("1f1b", 4, 6, (4, 3, 2, 1)),
        ("1f1b", 4, 2, (2, 2, 2, 1)),
        ("looped-bfs", 3, 4, (8, 8, 8)),
        ("zb-h1", 4, 8, (4, 4, 4, 4)),  # 1F1B's maximum on every device (W frees the activation)
        ("zb-h1", 4, 2, (2, 2, 2, 2)),
        ("zb-h2", 4, 8, (7, 7, 7, 7)),  # the paper's 2p-1
        ("zb-v", 4, 8, (8, 8, 8, 8)),  # 2D chunk activations = 1F1B's D full stages
        ("dualpipe-v", 4, 8, (9, 9, 9, 9)),  # DeepSeek: PP+1
    ],
)
def test_known_peak_activations(name, d, n, expected):
    assert peak_activations(get(name, devices=d, microbatches=n)) == expected


@pytest.mark.parametrize("name, d, n", [("zb-h2", 4, 8), ("zb-h2", 3, 5), ("zb-v", 4, 8), ("zb-v", 2, 3)])
def test_zero_bubble_per_device(name, d, n):
    """At equal F/I/W every device is busy from its first op to its last (the parallelogram)."""
    s = get(name, devices=d, microbatches=n)
    t = table(s, UNIT)
    for order, busy in zip(s.orders, t.busy, strict=True):
        assert max(t.finish[op] for op in order) - min(t.start[op] for op in order) == busy


@given(
    d=st.integers(1, 5),
    extra=st.integers(0, 8),
    times=st.lists(st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0]), min_size=3, max_size=3),
)
def test_zb_h1_and_h2_closed_forms_over_times(d, extra, times):
    f, i, w = times
    durations = {"F": f, "I": i, "W": w, "B": i + w}
    for name, n in (("zb-h1", d + extra), ("zb-h2", 2 * d - 1 + extra)):
        closed = formula(name, devices=d, microbatches=n, durations=durations)
        if closed is not None:
            assert table(get(name, devices=d, microbatches=n), durations).makespan == pytest.approx(
                closed.makespan
            )
    applies = w <= min(f, i)
    assert (formula("zb-h1", devices=d, microbatches=d + extra, durations=durations) is not None) == applies


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        (
            "interleaved-1f1b",
            dict(devices=4, microbatches=9),
            r"2 equal rounds \(as in torch\); try microbatches=8 or 10, or a multiple of devices \(4\)$",
        ),
        ("interleaved-1f1b", dict(devices=4, microbatches=8, chunks=0), "interleaved-1f1b: chunks must be >= 1, got 0"),
        ("looped-bfs", dict(devices=4, microbatches=8, chunks="2"), "looped-bfs: chunks must be an integer, got '2'"),
        ("zb-h1", dict(devices=4, microbatches=9, chunks=2), r"2 equal rounds .*multiple of devices \(4\)"),
        ("dualpipe-v", dict(devices=4, microbatches=7), r"at least 2 \* devices = 8"),
        (
            "zb-v",
            dict(devices=4, microbatches=8, chunks=2),
            "zb-v: unknown option 'chunks'; its options: none",
        ),
        ("zb-h2", dict(devices=0, microbatches=8), "zb-h2: devices must be an integer >= 1, got 0"),
    ],
)
def test_bad_arguments(name, kwargs, message):
    with pytest.raises(dp.ScheduleError, match=message) as info:
        get(name, **kwargs)
    assert "\n" not in str(info.value)


def test_families_follow_the_exemplar_pattern():
    for name in FAMILIES:
        fam = family(name)
        module = sys.modules[fam.generate.__module__]
        assert fam.name == name and module.__doc__ and fam.source and fam.summary
        assert fam.formula is not None and fam.formula.__doc__


def test_schedule_layer_imports_neither_jax_nor_torch():
    code = (
        "import sys, diffpipe.schedules as S\n"
        f"for name in {FAMILIES!r}:\n"
        "    S.table(S.get(name, devices=2, microbatches=4))\n"
        "bad = sorted(m for m in ('jax', 'torch') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", dp.schedules.names())
def test_op_estimate_bounds_the_op_count(name):
    # The size guard's estimate of the schedule's ops: never below the real count, and within 1.5x of
    # it; one-time work (v-schedule's ranking, ``setup_estimate``) is counted on top of it.
    fam = family(name)
    for d, n in ((4, 8), (8, 16)):
        options = fam.resolve({})
        if fam.accepts is not None and fam.accepts(devices=d, microbatches=n, **options):
            continue
        ops = len(get(name, devices=d, microbatches=n).ops)
        setup = fam.setup_estimate(d, n, options)
        assert ops <= fam.estimate_ops(d, n, options) - setup <= 1.5 * ops


def test_requests_over_the_op_limit_are_refused_before_generating():
    with pytest.raises(dp.ScheduleError, match=r"^hanayo: 4096 devices x 4096 microbatches needs about "
                       r"67,108,864 ops, over the limit of 1,000,000; pass max_ops=67108864 \(or more\)"):
        get("hanayo", devices=4096, microbatches=4096)
    with pytest.raises(dp.ScheduleError, match="over the limit of 100; pass max_ops=128"):
        get("1f1b", devices=8, microbatches=8, max_ops=100)
    assert len(get("1f1b", devices=8, microbatches=8, max_ops=128).ops) == 128
    with pytest.raises(dp.ScheduleError, match="max_ops must be an integer >= 1, got 0"):
        get("1f1b", devices=8, microbatches=8, max_ops=0)
