"""The greedy list scheduler: known schedules it reproduces, its greedy invariants, its errors, and
property tests over random placements, and over random reorderings of a device (deadlock messages)."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import diffpipe as dp
from diffpipe.schedules import Op, Placement, get, list_schedule, peak_activations, table
from diffpipe.schedules._list_scheduler import _key_function, greedy_run


def data_predecessor(op, backward_kind, stages):
    """The data rule written out again, independently of ``_rules``, to check the scheduler's claims."""
    p, s, m = op.pipeline, op.stage, op.microbatch
    if op.kind == "F":
        return Op("F", s - 1, m, p) if s else None
    if op.kind in ("B", "I"):
        return Op("F", s, m, p) if s == stages - 1 else Op(backward_kind, s + 1, m, p)
    return Op("I", s, m, p)


def expected_ops(placement, microbatches, assignment, split):
    kinds = ("F", "I", "W") if split else ("F", "B")
    return {
        Op(k, s, m, assignment[m])
        for m in range(microbatches)
        for s in range(placement.stages)
        for k in kinds
    }


# -- schedules it must reproduce ------------------------------------------------------------------
@pytest.mark.parametrize("devices, microbatches", [(1, 3), (3, 5), (4, 8), (5, 2), (8, 8)])
def test_backward_first_with_1f1b_cap_is_1f1b_and_forward_first_is_gpipe(devices, microbatches):
    linear = Placement.linear(devices)
    capped = list_schedule(linear, microbatches, memory_limit=[devices - d for d in range(devices)])
    assert capped.orders == get("1f1b", devices=devices, microbatches=microbatches).orders
    gpipe = list_schedule(linear, microbatches, priority="forward-first")
    assert gpipe.orders == get("gpipe", devices=devices, microbatches=microbatches).orders


def test_zero_bubble_split_backward_beats_1f1b_within_its_memory_cap():
    s = list_schedule(Placement.linear(4), 8, split_backward=True, priority="zero-bubble")
    assert max(peak_activations(s)) <= 4  # default cap: placement.stages
    assert table(s).makespan < table(get("1f1b", devices=4, microbatches=8)).makespan
    kinds = {op.kind for order in s.orders for op in order}
    assert kinds == {"F", "I", "W"}


def test_result_is_a_validated_custom_schedule_with_recorded_options():
    s = list_schedule(Placement.mirrored(4), 4, priority="forward-first", memory_limit=3)
    assert s.family == "custom" and s.steps == 1 and not s.asynchronous
    assert s.option("priority") == "forward-first" and s.option("memory_limit") == 3
    assert dp.schedules.list_schedule is list_schedule


def test_deterministic():
    args = dict(assignment=[0, 1, 1, 0, 1], durations={"F": 1.5, "B": 1.5})
    a = list_schedule(Placement.mirrored(4), 5, **args)
    b = list_schedule(Placement.mirrored(4), 5, **args)
    assert a.orders == b.orders


def test_callable_priority():
    deepest_first = list_schedule(Placement.v(2), 3, priority=lambda op: (-op.stage, op.kind == "F"))
    assert deepest_first.option("priority") == "<lambda>"
    assert {op for order in deepest_first.orders for op in order} == expected_ops(
        Placement.v(2), 3, [0, 0, 0], False
    )


# -- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(priority="fastest"), r"priority 'fastest' is not one of backward-first"),
        (dict(assignment=[0, 1]), r"assignment has 2 entries; give one pipeline per microbatch \(3\)"),
        (dict(assignment=[0, 2, 1]), r"assignment\[1\] = 2 is not a pipeline of the placement \(0..1\)"),
        (dict(memory_limit=0), r"memory_limit of device 0 must be an int >= 1"),
        (dict(memory_limit=[2, 2]), r"memory_limit has 2 entries; give an int or one per device \(4\)"),
        (dict(split_backward="yes"), r"split_backward must be a bool"),
        (dict(durations={"X": 1}), r"durations: unknown op kind"),
        (dict(durations={"F": -1}), r"durations: F must be a finite non-negative number"),
        (dict(priority=lambda op: 1 / 0), r"priority\(0F0\) raised ZeroDivisionError"),
        (dict(durations=lambda op: -1.0), r"durations\(0F0\) = -1.0; give a finite non-negative number"),
        (dict(priority=lambda op: "x" if op.microbatch else 1), r"priority keys must be mutually comparable"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(dp.ScheduleError, match=message):
        list_schedule(Placement.mirrored(4), 3, **kwargs)


@pytest.mark.parametrize("microbatches", [0, -1, 2.0, True])
def test_bad_microbatches(microbatches):
    with pytest.raises(dp.ScheduleError, match="microbatches must be an int >= 1"):
        list_schedule(Placement.linear(2), microbatches)


def test_bad_placement():
    with pytest.raises(dp.ScheduleError, match="placement must be a Placement, got tuple"):
        list_schedule((0, 1), 2)


def test_memory_cap_that_stalls_is_reported():
    # On a V, device 0 holds stages 0 and 3: with one slot, F(0) of microbatch 0 blocks F(3).
    with pytest.raises(dp.ScheduleError, match=r"memory_limit 1 stalls device 0.*raise memory_limit"):
        list_schedule(Placement.v(2), 2, memory_limit=1)


# -- greedy invariants, checked on random placements ----------------------------------------------
@st.composite
def problems(draw):
    devices = draw(st.integers(1, 4))
    pipelines = draw(st.integers(1, 3))
    stages = draw(st.integers(1, 5))
    placement = Placement(
        devices,
        tuple(tuple(draw(st.integers(0, devices - 1)) for _ in range(stages)) for _ in range(pipelines)),
    )
    microbatches = draw(st.integers(1, 6))
    assignment = [draw(st.integers(0, pipelines - 1)) for _ in range(microbatches)]
    split = draw(st.booleans())
    times = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0])
    durations = {kind: draw(times) for kind in ("F", "B", "I", "W")}
    priority = draw(
        st.sampled_from(["backward-first", "forward-first", "zero-bubble", "deepest", "latest-microbatch"])
    )
    priority = {
        "deepest": lambda op: -op.stage,
        "latest-microbatch": lambda op: (-op.microbatch, op.kind),
    }.get(priority, priority)
    limit = draw(st.one_of(st.none(), st.integers(1, 6)))
    return dict(
        placement=placement,
        microbatches=microbatches,
        assignment=assignment,
        split_backward=split,
        durations=durations,
        priority=priority,
        memory_limit=limit,
    )


def _run(problem):
    try:
        orders, start = greedy_run(**problem)
    except dp.ScheduleError as error:
        # Only a memory cap can stall the greedy; without one every DAG drains.
        assert problem["memory_limit"] is not None or problem["priority"] == "zero-bubble", error
        assert "stalls device" in str(error)
        return None
    schedule = list_schedule(**problem)  # validates: every op once, complete, deadlock-free
    assert schedule.orders == orders
    return schedule, start


@given(problems())
def test_random_list_schedules_are_valid_and_complete(problem):
    result = _run(problem)
    if result is None:
        return
    schedule, start = result
    placement = problem["placement"]
    ops = [op for order in schedule.orders for op in order]
    assert len(ops) == len(set(ops))
    assert set(ops) == expected_ops(
        placement, problem["microbatches"], problem["assignment"], problem["split_backward"]
    )
    for device, order in enumerate(schedule.orders):
        assert all(placement.device(op.pipeline, op.stage) == device for op in order)
    cap = problem["memory_limit"] or (placement.stages if problem["priority"] == "zero-bubble" else None)
    if cap is not None:
        assert max(peak_activations(schedule), default=0) <= cap


@given(problems())
def test_table_reproduces_the_greedy_timing_and_the_greedy_never_idles_needlessly(problem):
    result = _run(problem)
    if result is None:
        return
    schedule, start = result
    durations = problem["durations"]
    laid_out = table(schedule, durations)
    assert laid_out.start == start
    backward = "I" if problem["split_backward"] else "B"
    stages = problem["placement"].stages

    def ready(op):
        pred = data_predecessor(op, backward, stages)
        return 0.0 if pred is None else laid_out.finish[pred]

    key = _key_function(problem["priority"])
    capped = problem["memory_limit"] is not None or problem["priority"] == "zero-bubble"
    # Completions at time T are all seen before a device picks at T, except those of zero-length
    # ops started at T itself; compare ready times strictly when such ops exist.
    positive = all(value > 0 for value in durations.values())
    for order in schedule.orders:
        free = 0.0
        for i, op in enumerate(order):
            later = order[i:]
            if not capped and start[op] > free:
                # Idle until start[op]: nothing of this device was ready earlier.
                assert all(ready(other) >= start[op] for other in later)
            # Among the ops ready when it started, it had the best key. Under a cap a non-F op may
            # have been chosen because every F was blocked.
            rivals = [
                other
                for other in later
                if (ready(other) <= start[op] if positive else ready(other) < start[op])
                and (op.kind == "F" or not capped or other.kind != "F")
            ]
            assert all(key(op) <= key(other) for other in rivals)
            free = laid_out.finish[op]


# -- random reorderings: valid, or a deadlock message naming a real cycle -------------------------
LINK = re.compile(
    r"device (\d+) waits at (\S+) for "
    r"(?:(\S+) \((?:later in its own order|device (\d+))\)|device (\d+) to reach it)"
)


def check_deadlock_message(message, orders, placement, backward):
    assert message.startswith("deadlock: ")
    links = LINK.findall(message)
    assert links and ", ".join(m.group(0) for m in LINK.finditer(message)) == message[len("deadlock: ") :]
    heads = {}
    for device, head, _, _, reached in links:
        assert not reached, "only collectives wait for another device to reach them"
        device = int(device)
        assert device not in heads, "a device repeats inside the cycle"
        heads[device] = Op.parse(head)
    claims = []
    for device, head, blocker, other, _ in links:
        device, head, blocker = int(device), Op.parse(head), Op.parse(blocker)
        target = device if other == "" else int(other)
        order = orders[device]
        assert head in order
        # The claimed wait is a real data dependency, and the blocker lives where it is said to.
        assert blocker == data_predecessor(head, backward, placement.stages)
        assert placement.device(blocker.pipeline, blocker.stage) == target
        if target == device:
            assert order.index(blocker) > order.index(head)
        else:
            assert target in heads, "the chain leaves the cycle"
            # The target device is stuck at or before the blocker, so the blocker cannot have run.
            assert orders[target].index(heads[target]) <= orders[target].index(blocker)
        claims.append((device, target))
    # The links form one closed cycle, each pointing to the next.
    for (_, target), (device, _) in zip(claims, claims[1:] + claims[:1]):
        assert target == device


@given(problems(), st.data())
def test_reordering_a_device_validates_or_names_a_real_deadlock(problem, data):
    problem = {**problem, "memory_limit": None}
    if problem["priority"] == "zero-bubble":
        problem["priority"] = "backward-first"
    schedule, _ = _run(problem)
    device = data.draw(st.integers(0, schedule.devices - 1))
    order = list(schedule.orders[device])
    if data.draw(st.booleans()):
        order = data.draw(st.permutations(order))
    elif order:  # move one op: more often a cross-device cycle than a full shuffle
        op = order.pop(data.draw(st.integers(0, len(order) - 1)))
        order.insert(data.draw(st.integers(0, len(order))), op)
    orders = list(schedule.orders)
    orders[device] = tuple(order)
    try:
        schedule.replace(orders=orders)
    except dp.ScheduleError as error:
        backward = "I" if problem["split_backward"] else "B"
        check_deadlock_message(str(error), orders, schedule.placement, backward)


def test_a_known_deadlock_message_is_parsed():
    s = get("1f1b", devices=2, microbatches=2)
    orders = [s.orders[0], (Op("F", 1, 0), Op("B", 1, 1), Op("F", 1, 1), Op("B", 1, 0))]
    with pytest.raises(dp.ScheduleError, match="deadlock") as info:
        s.replace(orders=orders)
    check_deadlock_message(str(info.value), orders, s.placement, "B")
    orders = [
        (Op("F", 0, 0), Op("B", 0, 0), Op("F", 0, 1), Op("B", 0, 1)),
        (Op("F", 1, 1), Op("B", 1, 1), Op("F", 1, 0), Op("B", 1, 0)),
    ]
    with pytest.raises(dp.ScheduleError, match="device 1 waits at 1F1 for 0F1") as info:
        s.replace(orders=orders)
    check_deadlock_message(str(info.value), orders, s.placement, "B")
