"""Extending diffpipe from outside the package, as README "Extending" and the recipes of
docs/architecture.md say: a schedule family registered here is listed, validated, simulated,
swept and exported with no edit to diffpipe; a cost model from a per-layer table; both adjoints.
The communication-mode and knob recipes are tested where their worked examples live
(tests/test_communication.py, tests/test_knobs.py); the last tests check that the documents name
only paths and public names that exist."""

import json
import re
from pathlib import Path

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffpipe as dp
from diffpipe import cli
from diffpipe._engine._graph import COST_F, COST_W
from diffpipe.schedules import Family, Formula, Op, Option, Placement, Schedule
from diffpipe.schedules._reference import evaluate

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", ROOT / "docs" / "architecture.md")

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


# -- a cost model: per-layer times grouped into stages ---------------------------------------------
def test_cost_model_from_a_per_layer_table():
    """The recipe's ``Workload.from_table(...).hardware(boundaries)`` prices each stage at the sum
    of its layers: the same timeline as per-stage times summed by hand."""
    rng = np.random.default_rng(3)
    f, i, w = (rng.uniform(0.5, 2.0, 8) for _ in range(3))
    work = dp.Workload.from_table(forward=f, input_grad=i, weight=w)
    hw = work.hardware(work.boundaries((3, 3, 2)))
    cuts = [0, 3, 6, 8]
    sums = [[float(x[a:b].sum()) for a, b in zip(cuts, cuts[1:])] for x in (f, i, w)]
    by_hand = dp.Hardware.from_times(forward=sums[0], input_grad=sums[1], weight=sums[2])
    s = dp.schedules.get("zb-h1", devices=3, microbatches=6)
    ours, theirs = dp.simulate(s, hw), dp.simulate(s, by_hand)
    chex.assert_trees_all_close((ours.start, ours.finish), (theirs.start, theirs.finish), rtol=1e-6)
    assert isinstance(work, dp.AbstractCostModel) and isinstance(hw, dp.AbstractCostModel)


class Straggler(dp.AbstractCostModel):
    """A cost model written outside the package: ``hardware``'s costs with the compute ops of one
    stage ``slowdown`` times slower (a throttled device). Memory and traffic: the defaults (none)."""

    hardware: dp.Hardware
    slowdown: jax.Array
    stage: int = eqx.field(static=True)

    def tables(self, graph):
        tables = self.hardware.tables(graph)
        kind, stage = graph.node_cost[:, 0], graph.node_cost[:, 2]
        slow = (kind >= COST_F) & (kind <= COST_W) & (stage == self.stage)
        return eqx.tree_at(lambda t: t.per_size, tables, jnp.where(slow, self.slowdown, 1.0) * tables.per_size)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "interleaved-1f1b"])
def test_a_cost_model_subclass_simulates_like_the_reference(name):
    """``makespan`` and ``simulate`` take any ``AbstractCostModel``: a user's subclass gives the
    start and finish times of the pure-Python reference evaluator under the same op durations,
    and differentiates in its own fields."""
    options = {"chunks": 2} if name == "interleaved-1f1b" else {}
    s = dp.schedules.get(name, devices=3, microbatches=5, **options)
    f, i, w = np.array([1.0, 1.5, 0.7, 1.2, 0.9, 1.1][: s.stages]), 0.8, 0.6
    model = Straggler(dp.Hardware.from_times(forward=f, input_grad=i, weight=w), jnp.asarray(2.5), stage=1)
    assert isinstance(model, dp.AbstractCostModel) and not isinstance(model, dp.Hardware)

    def duration(op):
        t = {"F": f[op.stage], "B": i + w, "I": i, "W": w}[op.kind]
        return t * (2.5 if op.stage == 1 else 1.0)

    start, finish = evaluate(s, duration)
    ours = dp.simulate(s, model)
    chex.assert_trees_all_close(ours.start, np.array([start[op] for op in s.ops]), rtol=1e-6)
    chex.assert_trees_all_close(ours.finish, np.array([finish[op] for op in s.ops]), rtol=1e-6)
    graph = dp.compile(s)
    chex.assert_trees_all_close(dp.makespan(graph, model), max(finish.values()), rtol=1e-6)
    assert float(ours.peak_memory.max()) == 0.0 and bool(ours.fits.all())  # the defaults: no bytes
    with pytest.raises(dp.ConfigError, match="per_stage 'forward' is not one of activation_bytes"):
        model.per_stage("forward", graph)  # the defaults price bytes only
    # d makespan / d slowdown by forward differences of the exact makespan (piecewise linear in it)
    grad = jax.grad(lambda m: dp.makespan(graph, m))(model).slowdown
    step = 1e-2
    bumped = dp.makespan(graph, eqx.tree_at(lambda m: m.slowdown, model, jnp.asarray(2.5 + step)))
    chex.assert_trees_all_close(grad, (bumped - dp.makespan(graph, model)) / step, rtol=1e-3, atol=1e-4)


def test_makespan_refuses_what_is_not_a_cost_model():
    graph = dp.compile(dp.schedules.get("1f1b", devices=2, microbatches=2))
    with pytest.raises(dp.ConfigError, match="expected a Hardware \\(or another AbstractCostModel\\), got dict"):
        dp.makespan(graph, {"forward": 1.0})
    with pytest.raises(TypeError):
        dp.AbstractCostModel()  # abstract: no tables


# -- an adjoint -------------------------------------------------------------------------------------
def test_both_adjoints_give_the_same_gradients():
    graph = dp.compile(dp.schedules.get("1f1b", devices=3, microbatches=5))
    hw = dp.Hardware.from_times(forward=jnp.asarray([1.0, 1.3, 0.8]), input_grad=2.0, weight=0.5, p2p_time=0.1)

    def grads(adjoint):
        return jax.grad(lambda h: dp.makespan(graph, h, temperature=0.05, adjoint=adjoint))(hw)

    sweep, autodiff = grads(dp.SweepAdjoint()), grads(dp.AutodiffAdjoint())
    chex.assert_trees_all_close(sweep.forward, autodiff.forward, rtol=1e-4, atol=1e-6)
    chex.assert_trees_all_close(sweep.input_grad, autodiff.input_grad, rtol=1e-4, atol=1e-6)
    assert float(jnp.sum(sweep.forward)) > 0  # the makespan grows with every stage's forward


# -- the documents match the tree -------------------------------------------------------------------
def test_documented_paths_exist():
    """Every path (``a/b.py``, ``.toml``, ``.md``, ``.json``) and every bare module name (``b.py``)
    the README and docs/architecture.md name exists: from the repository root, under ``diffpipe/``,
    ``examples/`` or ``benchmarks/``. (Bare data-file names such as ``config.json`` are not paths.)"""
    missing = []
    for doc in DOCS:
        named = set(re.findall(r"`([A-Za-z0-9_./-]+\.(?:py|toml|md|json))`", doc.read_text()))
        for path in sorted(p for p in named if "/" in p or p.endswith(".py")):
            if not any((ROOT / base / path).exists() for base in ("", "diffpipe", "examples", "benchmarks")):
                missing.append(f"{doc.name}: {path}")
    assert not missing, missing


def test_documented_public_names_exist():
    """Every ``dp.x.y`` the README and docs/architecture.md name resolves on ``diffpipe``."""
    missing = []
    for doc in DOCS:
        for name in sorted(set(re.findall(r"\bdp\.([A-Za-z_][A-Za-z0-9_.]*[A-Za-z0-9_])", doc.read_text()))):
            value = dp
            for part in name.split("."):
                value = getattr(value, part, None)
            if value is None:
                missing.append(f"{doc.name}: dp.{name}")
    assert not missing, missing
