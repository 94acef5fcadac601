"""Extending diffpipe from outside the package: a schedule family registered here is listed,
validated, simulated, swept and exported with no edit to diffpipe."""

import json

import jax.numpy as jnp
import pytest

import diffpipe as dp
from diffpipe import cli
from diffpipe.schedules import Family, Formula, Op, Option, Placement, Schedule

NAME = "gpipe-lifo"


def generate(*, devices, microbatches, reverse):
    """GPipe whose backwards run last-in first-out (newest microbatch first) when ``reverse``."""
    backwards = range(microbatches - 1, -1, -1) if reverse else range(microbatches)
    orders = [[Op("F", d, m) for m in range(microbatches)] + [Op("B", d, m) for m in backwards]
              for d in range(devices)]
    return Schedule(Placement.linear(devices), orders, microbatches, family=NAME, options={"reverse": reverse})


def formula(*, devices, microbatches, durations, reverse):
    """Fill and drain as GPipe: ``(N+D-1)(t_F+t_B)``."""
    d, n = devices, microbatches
    return Formula((n + d - 1) * (durations["F"] + durations["B"]), (d - 1) / (n + d - 1), "uniform times")


def accepts(*, devices, microbatches, reverse):
    return None if microbatches >= 2 else f"microbatches must be >= 2 to have an order, got {microbatches}"


LIFO = Family(
    NAME,
    generate,
    summary="GPipe with last-in first-out backwards",
    source="tests/test_extending.py",
    options=(Option("reverse", bool, True, help="backwards newest first"),),
    accepts=accepts,
    formula=formula,
    placement=lambda *, devices, reverse: Placement.linear(devices),
)


@pytest.fixture(autouse=True)
def registered():
    dp.schedules.register(LIFO)
    yield
    dp.schedules.unregister(NAME)


def test_family_is_listed(capsys):
    assert NAME in dp.schedules.names() and dp.schedules.family(NAME) is LIFO
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert NAME in out and "--option reverse=..." in out
    assert cli.main(["list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[NAME]["options"] == {"reverse": "backwards newest first (default True)"}


def test_family_is_validated():
    s = dp.schedules.get(NAME, devices=3, microbatches=4)
    assert s.orders[0][4] == Op("B", 0, 3) and s.replace() == s
    with pytest.raises(dp.ScheduleError, match=f"^{NAME}: reverse must be True or False, got 1$"):
        dp.schedules.get(NAME, devices=3, microbatches=4, reverse=1)
    with pytest.raises(dp.ScheduleError, match=f"^{NAME}: microbatches must be >= 2 to have an order, got 1$"):
        dp.schedules.get(NAME, devices=3, microbatches=1)
    with pytest.raises(dp.ScheduleError, match=f"^{NAME}: unknown option 'chunks'; its options: reverse$"):
        dp.schedules.get(NAME, devices=3, microbatches=4, chunks=2)
    with pytest.raises(dp.ScheduleError, match="needs about 24 ops, over the limit of 10; pass max_ops=24"):
        dp.schedules.get(NAME, devices=3, microbatches=4, max_ops=10)
    with pytest.raises(dp.ScheduleError, match="already registered"):
        dp.schedules.register(LIFO.__class__(NAME, generate))


@pytest.mark.parametrize("reverse", [True, False])
def test_family_is_simulated_against_the_reference(reverse):
    durations = {"F": 1.25, "B": 2.75}
    s = dp.schedules.get(NAME, devices=4, microbatches=6, reverse=reverse)
    reference = dp.table(s, durations)
    closed = dp.schedules.formula(NAME, devices=4, microbatches=6, durations=durations, reverse=reverse)
    assert reference.makespan == pytest.approx(closed.makespan)
    result = dp.simulate(s, dp.Hardware.from_times(forward=1.25, input_grad=2.75))
    assert float(result.makespan) == pytest.approx(reference.makespan, rel=1e-6)
    for op in s.ops:
        assert result.time_of(op) == pytest.approx((reference.start[op], reference.finish[op]), rel=1e-6)


def test_family_is_swept():
    hw = dp.Hardware.from_times(forward=jnp.asarray([1.0, 1.5, 0.5, 1.0]), input_grad=2.0, p2p_time=0.1)
    result = dp.sweep(hw, families=[NAME, "gpipe"], devices=4, microbatches=[4, 8],
                      options={NAME: {"reverse": [True, False]}})
    assert not result.skipped and len(result) == 3 * 2
    for row in result.filter(family=NAME).rows():
        s = dp.schedules.get(NAME, devices=4, microbatches=row["microbatches"], **row["options"])
        assert row["makespan"] == pytest.approx(float(dp.simulate(s, hw).makespan), rel=1e-6)
    # FIFO backwards are GPipe: the same makespan
    fifo = result.filter(family=NAME, options="reverse=False")["makespan"]
    assert fifo == pytest.approx(result.filter(family="gpipe")["makespan"])


def test_family_is_exported(tmp_path):
    s = dp.schedules.get(NAME, devices=3, microbatches=4)
    path = tmp_path / "lifo.csv"
    dp.schedules.to_torch_csv(s, path)
    back = dp.schedules.from_torch_csv(path)
    assert back.orders == s.orders and back.placement == s.placement
