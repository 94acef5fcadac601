"""Chimera, Chimera-asymmetric, Hanayo, PipeDream, PipeDream-2BW and AMDP against their papers:
completeness, closed forms, peak activations, staleness and AMDP's exact published orders (the
authors' code, github.com/Vinsmoke86/AMDP; papers/amdp/README.md)."""

import pytest

import diffpipe as dp
from diffpipe.schedules import (
    Op,
    Placement,
    family,
    formula,
    get,
    list_schedule,
    peak_activations,
    staleness,
    table,
    weight_versions,
)
from diffpipe.schedules._list_scheduler import greedy_run as simulate

EQUAL = {"F": 1.0, "B": 1.0}  # t_F = t_B, Chimera's closed-form setting

SIZES = {
    "chimera": [(2, 2, {}), (4, 4, {}), (4, 12, {}), (8, 16, {"sync": True}), (6, 6, {"sync": True})],
    "chimera-asymmetric": [(2, 4, {}), (4, 8, {}), (8, 8, {"sync": True})],
    "hanayo": [(1, 1, {}), (4, 4, {}), (4, 8, {"waves": 2}), (3, 3, {"waves": 3})],
    "pipedream": [(1, 3, {}), (4, 4, {}), (4, 10, {}), (8, 20, {})],
    "pipedream-2bw": [(1, 1, {}), (4, 4, {}), (4, 6, {"steps": 2}), (8, 8, {"steps": 4})],
    "amdp": [(4, 4, {}), (4, 8, {"steps": 2}), (8, 8, {}), (8, 16, {"steps": 1})],
}
CASES = [(name, d, n, o) for name, sizes in SIZES.items() for d, n, o in sizes]


def compute_ops(schedule):
    return [op for order in schedule.orders for op in order if op.kind in ("F", "B", "I", "W")]


# -- every family: complete, each op once, on its device ----------------------------------------
@pytest.mark.parametrize("name, devices, microbatches, options", CASES)
def test_every_op_exactly_once_on_its_device(name, devices, microbatches, options):
    s = get(name, devices=devices, microbatches=microbatches, **options)
    assert s.family == name and s.devices == devices
    assert s.asynchronous == family(name).asynchronous
    ops = compute_ops(s)
    assert len(ops) == len(set(ops))
    pipeline_of = {op.microbatch: op.pipeline for op in ops}
    assert sorted(pipeline_of) == list(range(s.microbatches))
    expected = {
        Op(kind, stage, m, pipeline_of[m])
        for m in range(s.microbatches)
        for stage in range(s.stages)
        for kind in "FB"
    }
    assert set(ops) == expected
    for device, order in enumerate(s.orders):
        for op in order:
            if op.kind == "R":
                assert device in {s.placement.device(p, op.stage) for p in range(s.pipelines)}
            else:
                assert s.placement.device(op.pipeline, op.stage) == device
    assert s.replace() == s  # re-validates


@pytest.mark.parametrize("name", list(SIZES))
def test_unknown_option_is_rejected_by_the_registry(name):
    with pytest.raises(dp.ScheduleError, match=f"{name}: unknown option 'chunks'"):
        get(name, devices=4, microbatches=8, chunks=2)


# -- Chimera --------------------------------------------------------------------------------------
def test_chimera_unit_time_checks():
    assert table(get("chimera", devices=4, microbatches=4), EQUAL).makespan == 10
    assert table(get("chimera", devices=8, microbatches=8), EQUAL).makespan == 22


@pytest.mark.parametrize(
    "devices, microbatches", [(2, 2), (2, 6), (4, 4), (4, 8), (4, 16), (6, 12), (8, 8), (8, 24)]
)
@pytest.mark.parametrize("t", [1.0, 2.5])
def test_chimera_matches_its_closed_form_at_equal_times(devices, microbatches, t):
    durations = {"F": t, "B": t}
    s = get("chimera", devices=devices, microbatches=microbatches)
    laid_out = table(s, durations)
    f = formula("chimera", devices=devices, microbatches=microbatches, durations=durations)
    assert (
        laid_out.makespan == pytest.approx((2 * microbatches + devices - 2) * t) == pytest.approx(f.makespan)
    )
    assert laid_out.bubble_ratio == pytest.approx(f.bubble_ratio)
    assert peak_activations(s) == f.peak_activations


@pytest.mark.parametrize("devices, microbatches", [(2, 4), (4, 4), (4, 12), (8, 8), (8, 16), (10, 10)])
def test_chimera_peak_activations_between_half_plus_one_and_d(devices, microbatches):
    peaks = peak_activations(get("chimera", devices=devices, microbatches=microbatches))
    assert all(devices // 2 + 1 <= p <= devices for p in peaks)
    assert max(peaks) == devices and min(peaks) == devices // 2 + 1


def test_chimera_has_no_closed_form_when_backward_differs_from_forward():
    assert formula("chimera", devices=4, microbatches=4) is None  # table defaults: B = 2F


def test_chimera_orders_follow_the_reference():
    s = get("chimera", devices=4, microbatches=4)
    assert s.placement == Placement.mirrored(4)
    # Device 0: F↓ F↓ F↑ B↑ F↑ B↑ B↓ B↓, microbatches 0, 1 down and 2, 3 up.
    assert [str(op) for op in s.orders[0]] == [
        "0F0",
        "0F1",
        "3F2@p1",
        "3B2@p1",
        "3F3@p1",
        "3B3@p1",
        "0B0",
        "0B1",
    ]
    direction = {"0": "v", "1": "v", "2": "^", "3": "^"}
    # Device 1 (d < h, a = b = 1): F_main, (F_other, F_main), (F_other, B_other), (B_main, B_other), B_main.
    assert [op.kind + direction[str(op.microbatch)] for op in s.orders[1]] == [
        "Fv", "F^", "Fv", "F^", "B^", "Bv", "B^", "Bv",
    ]  # fmt: skip
    assert {op.microbatch for op in s.orders[0] if op.pipeline == 0} == {0, 1}


def test_chimera_concatenates_units_with_b_main_f_main_openings():
    s = get("chimera", devices=4, microbatches=8)
    kinds = ["".join(op.kind + ("m" if op.pipeline == 0 else "o") for op in s.orders[0])]
    # a = 2, b = 0 on device 0: unit 1 opens with (B_main, F_main) x 2; B_main x 2 closes once.
    assert kinds == ["FmFm" + "FoBoFoBo" + "BmFmBmFm" + "FoBoFoBo" + "BmBm"]
    assert [op.microbatch for op in s.orders[0] if op.pipeline == 0 and op.kind == "B"] == [0, 1, 4, 5]


def test_chimera_sync_places_one_all_reduce_per_stage_after_the_backwards():
    s = get("chimera", devices=4, microbatches=8, sync=True)
    for device, order in enumerate(s.orders):
        tail = order[-2:]
        assert [op.kind for op in tail] == ["R", "R"]
        assert [op.stage for op in tail] == sorted({device, 3 - device})
    collectives = {op for order in s.orders for op in order if op.kind == "R"}
    assert collectives == {Op("R", stage, 0) for stage in range(4)}
    assert {s.devices_of(op) for op in collectives} == {(0, 3), (1, 2)}
    unsynced = get("chimera", devices=4, microbatches=8)
    assert table(s).makespan == table(unsynced).makespan  # R costs 0 in the table


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        ("chimera", dict(devices=3, microbatches=3), "chimera: devices must be even"),
        ("chimera", dict(devices=1, microbatches=2), r"chimera: devices must be even \(two replicas.*got 1"),
        ("chimera", dict(devices=4, microbatches=6), "chimera: microbatches must be a multiple of 4"),
        ("chimera", dict(devices=4, microbatches=4, sync="yes"), "chimera: sync must be True or False"),
        (
            "chimera-asymmetric",
            dict(devices=4, microbatches=5),
            "asymmetric: microbatches must be a multiple of 2",
        ),
        ("chimera-asymmetric", dict(devices=5, microbatches=4), "chimera-asymmetric: devices must be even"),
    ],
)
def test_chimera_bad_arguments(name, kwargs, message):
    with pytest.raises(dp.ScheduleError, match=message):
        get(name, **kwargs)


# -- Chimera-asymmetric ---------------------------------------------------------------------------
def test_chimera_asymmetric_placement_is_rotated_by_half():
    s = get("chimera-asymmetric", devices=8, microbatches=8)
    assert s.placement.table == ((0, 1, 2, 3, 4, 5, 6, 7), (4, 5, 6, 7, 0, 1, 2, 3))
    assert {m % 2 for op in compute_ops(s) if op.pipeline == 1 for m in [op.microbatch]} == {1}
    expected, _ = simulate(s.placement, 8, assignment=[m % 2 for m in range(8)], memory_limit=8)
    assert s.orders == expected


@pytest.mark.parametrize("devices, microbatches", [(4, 4), (4, 8), (4, 16), (8, 8), (8, 16), (8, 32)])
def test_chimera_asymmetric_does_not_lower_the_global_peak(devices, microbatches):
    asym = peak_activations(get("chimera-asymmetric", devices=devices, microbatches=microbatches))
    one_f_one_b = peak_activations(get("1f1b", devices=devices, microbatches=microbatches))
    chimera = peak_activations(get("chimera", devices=devices, microbatches=microbatches))
    assert max(asym) == max(one_f_one_b) == devices
    # ... and, unlike the mirrored placement, it does not balance it: at least half the devices hit it.
    assert sum(p == devices for p in asym) >= devices // 2 >= sum(p == devices for p in chimera)


@pytest.mark.parametrize("microbatches", [8, 16])
def test_chimera_asymmetric_gains_little_in_a_shallow_pipeline(microbatches):
    devices = 4
    for durations in (EQUAL, None):
        base = table(get("1f1b", devices=devices, microbatches=microbatches), durations).makespan
        asym = table(
            get("chimera-asymmetric", devices=devices, microbatches=microbatches), durations
        ).makespan
        assert 1 - asym / base < 0.1
    base = table(get("1f1b", devices=devices, microbatches=microbatches), EQUAL).makespan
    mirrored = table(get("chimera", devices=devices, microbatches=microbatches), EQUAL).makespan
    asym = table(get("chimera-asymmetric", devices=devices, microbatches=microbatches), EQUAL).makespan
    assert asym > mirrored and asym <= base


# -- Hanayo ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("devices, waves", [(2, 1), (4, 1), (4, 2), (8, 1)])
def test_hanayo_is_the_backward_first_list_schedule_on_the_wave(devices, waves):
    s = get("hanayo", devices=devices, microbatches=devices, waves=waves)
    assert s.placement == Placement.wave(devices, waves)
    assert s.stages == 2 * waves * devices and s.pipelines == 1
    assert s.orders == list_schedule(Placement.wave(devices, waves), devices).orders
    assert s.option("waves") == waves


@pytest.mark.parametrize("devices", [4, 8])
def test_hanayo_beats_1f1b_at_its_operating_point(devices):
    # Each of the 2W chunks of a device carries 1/(2W) of the device's share of the model.
    for waves in (1, 2):
        chunk = {"F": 1.0 / (2 * waves), "B": 2.0 / (2 * waves)}
        hanayo = table(get("hanayo", devices=devices, microbatches=devices, waves=waves), chunk)
        base = table(get("1f1b", devices=devices, microbatches=devices))
        assert hanayo.bubble_ratio < base.bubble_ratio and hanayo.makespan < base.makespan
    assert max(peak_activations(get("hanayo", devices=devices, microbatches=devices))) <= 2 * devices


@pytest.mark.parametrize("waves", [0, -1, 1.5, True])
def test_hanayo_bad_waves(waves):
    with pytest.raises(dp.ScheduleError, match=r"hanayo: waves must be (an integer|>= 1), got "):
        get("hanayo", devices=4, microbatches=4, waves=waves)


# -- PipeDream ------------------------------------------------------------------------------------
@pytest.mark.parametrize("devices, microbatches", [(1, 4), (2, 5), (4, 8), (4, 12), (8, 16)])
@pytest.mark.parametrize(
    "durations", [None, EQUAL, {"F": 1.0, "B": 2.0, "U": 0.5}, {"F": 0.5, "B": 3.0, "U": 2.0}]
)
def test_pipedream_matches_its_window_formula(devices, microbatches, durations):
    s = get("pipedream", devices=devices, microbatches=microbatches)
    laid_out = table(s, durations)
    f = formula("pipedream", devices=devices, microbatches=microbatches, durations=durations)
    assert laid_out.makespan == pytest.approx(f.makespan)
    assert laid_out.bubble_ratio == pytest.approx(f.bubble_ratio)
    assert (
        peak_activations(s)
        == f.peak_activations
        == tuple(min(devices - d, microbatches) for d in range(devices))
    )


@pytest.mark.parametrize("durations", [{"F": 1.0, "B": 2.0}, {"F": 1.0, "B": 2.0, "U": 0.5}])
def test_pipedream_steady_state_has_no_bubble(durations):
    # Every extra microbatch adds exactly one F, one B and one U to the critical path.
    spans = [table(get("pipedream", devices=4, microbatches=n), durations).makespan for n in range(6, 10)]
    period = durations["F"] + durations["B"] + durations.get("U", 0.0)
    assert all(b - a == pytest.approx(period) for a, b in zip(spans, spans[1:]))


def test_pipedream_structure_staleness_and_weight_versions():
    devices, n = 4, 10
    s = get("pipedream", devices=devices, microbatches=n)
    assert s.asynchronous and s.stashing and s.steps == n and s.microbatches == n
    for d, order in enumerate(s.orders):
        assert order[: devices - 1 - d] == tuple(Op("F", d, m) for m in range(devices - 1 - d))
        updates = [i for i, op in enumerate(order) if op.kind == "U"]
        assert [order[i - 1] for i in updates] == [Op("B", d, m) for m in range(n)]
        assert [order[i].step for i in updates] == list(range(n))
    stale = staleness(s)
    assert stale == {Op("F", d, m): min(m, devices - 1 - d) for d in range(devices) for m in range(n)}
    assert weight_versions(s) == (tuple(devices - d for d in range(devices)),)


# -- PipeDream-2BW --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "devices, microbatches, steps", [(1, 2, 1), (4, 4, 3), (4, 6, 2), (8, 8, 3), (8, 12, 4)]
)
@pytest.mark.parametrize("durations", [None, EQUAL, {"F": 1.0, "B": 2.0, "U": 1.5}])
def test_pipedream_2bw_matches_its_window_formula(devices, microbatches, steps, durations):
    s = get("pipedream-2bw", devices=devices, microbatches=microbatches, steps=steps)
    f = formula("pipedream-2bw", devices=devices, microbatches=microbatches, durations=durations, steps=steps)
    laid_out = table(s, durations)
    assert laid_out.makespan == pytest.approx(f.makespan)
    assert laid_out.bubble_ratio == pytest.approx(f.bubble_ratio)
    assert peak_activations(s) == f.peak_activations


def test_pipedream_2bw_structure_staleness_and_two_versions():
    devices, n, k = 4, 6, 3
    s = get("pipedream-2bw", devices=devices, microbatches=n, steps=k)
    assert s.asynchronous and s.stashing and s.steps == k and s.microbatches == n * k
    assert s.microbatches_per_step == n and s.option("steps") == k
    for d, order in enumerate(s.orders):
        updates = [i for i, op in enumerate(order) if op.kind == "U"]
        assert [order[i] for i in updates] == [Op("U", d, t) for t in range(k)]
        assert [order[i - 1] for i in updates] == [Op("B", d, t * n + n - 1) for t in range(k)]
    expected = {
        Op("F", d, m): int(m >= n and m % n < devices - 1 - d) for d in range(devices) for m in range(n * k)
    }
    assert staleness(s) == expected
    assert max(max(row) for row in weight_versions(s)) == 2


def test_pipedream_2bw_default_steps_and_errors():
    assert get("pipedream-2bw", devices=4, microbatches=4).steps == 3
    with pytest.raises(dp.ScheduleError, match=r"microbatches per step \(2\) must be >= devices \(4\)"):
        get("pipedream-2bw", devices=4, microbatches=2)
    with pytest.raises(dp.ScheduleError, match="pipedream-2bw: steps must be >= 1, got 0"):
        get("pipedream-2bw", devices=4, microbatches=4, steps=0)
    with pytest.raises(dp.ScheduleError, match="pipedream: microbatches must be an integer >= 1, got 0"):
        get("pipedream", devices=4, microbatches=0)


# -- AMDP: the authors' published orders, exactly ---------------------------------------------------
# Copied from the authors' code (github.com/Vinsmoke86/AMDP), independently of
# diffpipe/schedules/families/amdp.py.
AMDP_FORWARD = {
    8: ["0 4 1 2 5 6 3 7", "0 1 4 5 2 3 6 7", "1 0 5 4 3 2 7 6", "1 5 0 3 4 7 2 6",
        "2 6 3 0 7 4 1 5", "2 3 6 7 0 1 4 5", "3 2 7 6 1 0 5 4", "3 7 2 1 6 5 0 4"],
    4: ["0 2 1 3", "0 1 2 3", "1 0 3 2", "1 3 0 2"],
}  # fmt: skip
AMDP_BACKWARD = {
    8: ["3 7 2 1 6 5 0 4", "3 2 7 6 1 0 5 4", "2 3 6 7 0 1 4 5", "2 6 3 0 7 4 1 5",
        "1 5 0 3 4 7 2 6", "1 0 5 4 3 2 7 6", "0 1 4 5 2 3 6 7", "0 4 1 2 5 6 3 7"],
    4: ["1 3 0 2", "1 0 3 2", "0 1 2 3", "0 2 1 3"],
}  # fmt: skip
AMDP_PLACEMENT = {
    8: [lambda s: s, lambda s: (11 - s) % 8, lambda s: (s + 4) % 8, lambda s: 7 - s],
    4: [lambda s: s, lambda s: 3 - s],
}


def amdp_template(device, devices, first_round, update):
    """The authors' round templates (github.com/Vinsmoke86/AMDP), spelled out."""
    end = device in ((0, 3, 4, 7) if devices == 8 else (0, 3))
    opening = "FF" if first_round else ("FFB" if end else "BFF")
    if devices == 8:
        body = "F" * 5 + ("B" if end else "") + "F" + ("U" if update else "") + ("" if end else "B") + "B" * 6
    else:
        body = "FB" + ("U" if update else "") + "FBB" if end else "FF" + ("U" if update else "") + "BBB"
    return opening + body


@pytest.mark.parametrize("devices", [4, 8])
@pytest.mark.parametrize("rounds, steps", [(1, 3), (2, 2), (3, 1)])
def test_amdp_reproduces_the_published_orders_exactly(devices, rounds, steps):
    s = get("amdp", devices=devices, microbatches=rounds * devices, steps=steps)
    pipelines = devices // 2
    assert s.placement.table == tuple(
        tuple(AMDP_PLACEMENT[devices][p](stage) for stage in range(devices)) for p in range(pipelines)
    )
    assert (
        s.asynchronous and not s.stashing and s.steps == steps and s.microbatches == steps * rounds * devices
    )
    total_rounds = rounds * steps
    for d, order in enumerate(s.orders):
        forward = [int(m) for m in AMDP_FORWARD[devices][d].split()]
        backward = [int(m) for m in AMDP_BACKWARD[devices][d].split()]
        # Forward and backward microbatch orders: the round's order, round after round.
        expect_f = [r * devices + m for r in range(total_rounds) for m in forward]
        expect_b = [r * devices + m for r in range(total_rounds) for m in backward]
        assert [op.microbatch for op in order if op.kind == "F"] == expect_f
        assert [op.microbatch for op in order if op.kind == "B"] == expect_b
        # Microbatch m runs on pipeline m mod D/2, at this device's stage of that pipeline.
        for op in order:
            if op.kind in "FB":
                assert op.pipeline == op.microbatch % devices % pipelines
        # Kinds: the round templates, the carried-over B, and U in the first round of each step.
        kinds = "".join(
            amdp_template(d, devices, r == 0, r % rounds == 0 and r > 0) for r in range(total_rounds)
        )
        assert "".join(op.kind for op in order) == kinds + "BU"
        assert [op for op in order if op.kind == "U"] == [Op("U", d, t) for t in range(steps)]


def test_amdp_d8_device0_first_rounds_spelled_out():
    s = get("amdp", devices=8, microbatches=16, steps=2)
    first = [f"{op.kind}{op.microbatch}" for op in s.orders[0][:15]]
    assert first == "F0 F4 F1 F2 F5 F6 F3 B3 F7 B7 B2 B1 B6 B5 B0".split()
    second = [f"{op.kind}{op.microbatch}" for op in s.orders[0][15:31]]
    assert second == "F8 F12 B4 F9 F10 F13 F14 F11 B11 F15 B15 B10 B9 B14 B13 B8".split()
    middle = [f"{op.kind}{op.microbatch}" for op in s.orders[1][15:32]]
    assert middle[:3] == ["B4", "F8", "F9"]


@pytest.mark.parametrize("devices", [4, 8])
def test_amdp_staleness_is_at_most_one_update_in_the_first_round_of_a_step(devices):
    rounds, steps = 2, 3
    s = get("amdp", devices=devices, microbatches=rounds * devices, steps=steps)
    stale = staleness(s)
    assert set(stale.values()) == {0, 1}
    for op, value in stale.items():
        if value:
            round_ = op.microbatch // devices
            assert round_ % rounds == 0 and round_ > 0
    assert weight_versions(s) == tuple((1,) * devices for _ in range(devices // 2))


@pytest.mark.parametrize("devices", [4, 8])
def test_amdp_orders_are_one_rounds_arrival_order(devices):
    # Cross-check: a greedy list schedule of one isolated round reproduces the published orders.
    s = get("amdp", devices=devices, microbatches=devices, steps=1)
    orders, _ = simulate(s.placement, devices, assignment=[m % (devices // 2) for m in range(devices)])
    for d in range(devices):
        assert [op.microbatch for op in orders[d] if op.kind == "F"] == [
            int(m) for m in AMDP_FORWARD[devices][d].split()
        ]
        assert [op.microbatch for op in orders[d] if op.kind == "B"] == [
            int(m) for m in AMDP_BACKWARD[devices][d].split()
        ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(devices=6, microbatches=6),
            r"amdp: devices must be 4 or 8 \(the authors' published orders\), got 6",
        ),
        (dict(devices=8, microbatches=12), r"amdp: microbatches per step must be a multiple of devices \(8"),
        (dict(devices=4, microbatches=4, steps=0), "amdp: steps must be >= 1, got 0"),
    ],
)
def test_amdp_bad_arguments(kwargs, message):
    with pytest.raises(dp.ScheduleError, match=message):
        get("amdp", **kwargs)


def test_families_have_the_registered_names_and_sources():
    for name in SIZES:
        fam = family(name)
        assert fam.name == name and fam.source and fam.summary
    assert family("pipedream").asynchronous and family("amdp").asynchronous
    assert not family("chimera").asynchronous and not family("hanayo").asynchronous
