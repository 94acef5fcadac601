"""Issue 13's cost-model terms in ``Hardware``: per-kind per-op overhead (``kind_overhead``), a
full-backward time that is not ``I + W`` (``full_backward``), and the step's ``setup`` and
``wind_down``; against the pure-Python reference evaluator and by hand."""

import zlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import SIZES, schedules
from test_simulator import MODES, build

import diffpipe as dp
from diffpipe.schedules._reference import evaluate_gradient_sync, evaluate_network

SCHEDULES = schedules()


def with_terms(s, hw, rng, *, full=True):
    """``hw`` with random per-kind overheads, full backward (when ``full``), setup and wind-down."""
    kind_overhead = rng.uniform(0.0, 0.3, 4)
    full_backward = rng.uniform(0.5, 3.0, (s.pipelines, s.stages)) if full else None
    setup, wind_down = rng.uniform(0.1, 1.0, 2)
    return eqx.tree_at(
        lambda h: (h.kind_overhead, h.full_backward, h.setup, h.wind_down), hw,
        (jnp.asarray(kind_overhead, jnp.float32), None if full_backward is None else jnp.asarray(
            full_backward, jnp.float32), jnp.asarray(setup, jnp.float32), jnp.asarray(wind_down, jnp.float32)),
        is_leaf=lambda x: x is None)


def reference_duration(s, hw, base):
    """Durations written from the docstring: ``kind_overhead[k] + size[m] * time``, a full ``B``
    at ``full_backward`` when given; other kinds as ``base`` (test_simulator's reference)."""
    arrays = {name: np.broadcast_to(np.asarray(getattr(hw, name), np.float64), (s.pipelines, s.stages))
              for name in ("forward", "input_grad", "weight")}
    full = (arrays["input_grad"] + arrays["weight"] if hw.full_backward is None
            else np.broadcast_to(np.asarray(hw.full_backward, np.float64), (s.pipelines, s.stages)))
    kinds = {"F": arrays["forward"], "B": full, "I": arrays["input_grad"], "W": arrays["weight"]}
    overhead = dict(zip("FBIW", np.asarray(hw.kind_overhead, np.float64), strict=True))
    size = np.broadcast_to(np.asarray(hw.size, np.float64), (s.microbatches,))

    def duration(op):
        if op.kind not in kinds:
            return base(op)
        return overhead[op.kind] + size[op.microbatch] * kinds[op.kind][op.pipeline, op.stage]

    return duration


@pytest.mark.parametrize("case, s", SCHEDULES, ids=[c for c, _ in SCHEDULES])
@pytest.mark.parametrize("mode", MODES)
def test_matches_reference(case, s, mode):
    rng = np.random.default_rng(zlib.crc32(f"terms/{case}/{mode}".encode()))
    per_node = 2 if s.devices >= 4 else None
    hw, base, transfer, comm = build(s, rng, mode, per_node)
    hw = with_terms(s, hw, rng, full=zlib.crc32(case.encode()) % 3 != 0)
    try:
        result = dp.simulate(s, hw, communication=mode, devices_per_node=per_node)
    except dp.ScheduleError as error:
        assert mode == "blocking" and "deadlocks under blocking" in str(error)
        return
    setup, wind_down = float(hw.setup), float(hw.wind_down)
    start, finish, xfer = evaluate_network(s, reference_duration(s, hw, base), transfer, comm, per_node, setup=setup)
    np.testing.assert_allclose(np.asarray(result.start), [start[op] for op in s.ops], rtol=2e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(result.finish), [finish[op] for op in s.ops], rtol=2e-5, atol=1e-4)
    assert min(start.values()) >= setup
    want = max([*finish.values(), *(end for _, end in xfer.values())]) + wind_down
    assert float(result.makespan) == pytest.approx(want, rel=2e-5)
    # busy is the ops' own work: neither setup nor wind-down
    if not comm.busy_weight:
        own = reference_duration(s, hw, base)
        busy = [sum(own(op) for op in order) for order in s.orders]
        np.testing.assert_allclose(np.asarray(result.busy), busy, rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("family", ["1f1b", "zb-v", "dualpipe-v"])
@pytest.mark.parametrize("mode", ["overlap", "blocking"])
def test_with_gradient_sync_matches_reference(family, mode):
    devices, microbatches, options = SIZES[family]
    s = dp.schedules.get(family, devices=devices, microbatches=microbatches, **options)
    rng = np.random.default_rng(zlib.crc32(f"terms-sync/{family}/{mode}".encode()))
    hw, base, transfer, comm = build(s, rng, mode)
    hw = with_terms(s, hw, rng)
    try:
        graph = dp.compile(s, communication=mode, gradient_sync=True)
    except dp.ScheduleError:
        return
    setup, wind_down = float(hw.setup), float(hw.wind_down)
    _, finish, xfer = evaluate_network(s, reference_duration(s, hw, base), transfer, comm, setup=setup)
    upd = np.broadcast_to(np.asarray(hw.update), (s.pipelines, s.stages))
    syncs, updates = evaluate_gradient_sync(s, finish, xfer, lambda stage: 0.0,
                                            lambda p, stage: float(hw.overhead) + float(upd[p, stage]), comm)
    want = max([*finish.values(), *(e for _, e in xfer.values()), *(e for _, e in syncs.values()),
                *(e for _, e in updates.values())]) + wind_down
    assert float(dp.makespan(graph, hw)) == pytest.approx(want, rel=2e-5)


def test_hand_computed_1f1b():
    """1F1B, 2 devices x 2 microbatches, F = 1 s, B = 2 s, per-op overheads F 0.1 s, B 0.2 s,
    setup 0.5 s, wind-down 0.25 s, free transfers: F ops last 1.1 s, B ops 2.2 s.

    Device 0: F0 [0.5, 1.6], F1 [1.6, 2.7], B0 [4.9, 7.1] (after device 1's B0), B1 [8.2, 10.4];
    device 1: F0 [1.6, 2.7], B0 [2.7, 4.9], F1 [4.9, 6.0], B1 [6.0, 8.2]. The step: 10.4 + 0.25
    = 10.65 s (the plain model: 9 s).
    """
    s = dp.schedules.get("1f1b", devices=2, microbatches=2)
    hw = dp.Hardware.from_times(1.0, 2.0, overhead=0.05, kind_overhead={"F": 0.1, "B": 0.2}, setup=0.5,
                                wind_down=0.25)
    np.testing.assert_allclose(np.asarray(hw.kind_overhead), [0.1, 0.2, 0.05, 0.05])
    r = dp.simulate(s, hw)
    want = {"0F0": (0.5, 1.6), "0F1": (1.6, 2.7), "0B0": (4.9, 7.1), "0B1": (8.2, 10.4),
            "1F0": (1.6, 2.7), "1B0": (2.7, 4.9), "1F1": (4.9, 6.0), "1B1": (6.0, 8.2)}
    for op in s.ops:
        assert r.time_of(op) == pytest.approx(want[f"{op.stage}{op.kind}{op.microbatch}"], abs=1e-5), op
    assert float(r.makespan) == pytest.approx(10.65)
    assert float(r.step_finish[0]) == pytest.approx(10.65)
    np.testing.assert_allclose(np.asarray(r.busy), [6.6, 6.6], rtol=1e-6)
    assert float(r.bubble_ratio) == pytest.approx(1 - 13.2 / (2 * 10.65), rel=1e-5)
    assert float(dp.makespan(dp.compile(s), dp.Hardware.from_times(1.0, 2.0))) == pytest.approx(9.0)


def test_full_backward_replaces_i_plus_w_only_for_full_b_ops():
    """DualPipeV runs both full ``B`` ops and split ``I``/``W`` ops: ``full_backward`` changes only
    the former (per op, against the same hardware without it; without the overlapped pairs, whose
    backward's time is its forward's node's: tests/test_overlap_pairs.py)."""
    s = dp.schedules.get("dualpipe-v", devices=2, microbatches=4).replace(overlapped=frozenset())
    plain = dp.Hardware.from_times(1.0, 1.0, 1.0)
    full = dp.Hardware.from_times(1.0, 1.0, 1.0, full_backward=1.5)
    graph = dp.compile(s)
    dur_plain, dur_full = (np.asarray(h.costs(graph)[0]) for h in (plain, full))
    kind = np.asarray(graph.kind)
    b = kind == 1
    assert b.any() and (kind == 2).any()
    np.testing.assert_allclose(dur_plain[b], 2.0)
    np.testing.assert_allclose(dur_full[b], 1.5)
    np.testing.assert_array_equal(dur_plain[~b & (kind >= 0)], dur_full[~b & (kind >= 0)])


@pytest.mark.parametrize("case, s", SCHEDULES[:6], ids=[c for c, _ in SCHEDULES[:6]])
def test_defaults_reproduce_the_plain_model_exactly(case, s):
    hw, *_ = build(s, np.random.default_rng(zlib.crc32(case.encode())), "overlap")
    explicit = eqx.tree_at(
        lambda h: (h.kind_overhead, h.full_backward), hw,
        (jnp.broadcast_to(hw.overhead, (4,)), hw.input_grad + hw.weight), is_leaf=lambda x: x is None)
    graph = dp.compile(s)
    assert float(dp.makespan(graph, explicit)) == float(dp.makespan(graph, hw))
    a, b = dp.simulate(s, hw), dp.simulate(s, explicit)
    np.testing.assert_array_equal(np.asarray(a.start), np.asarray(b.start))
    np.testing.assert_array_equal(np.asarray(a.finish), np.asarray(b.finish))
    # and the old constructor (no new fields) still builds the same hardware
    same = dp.Hardware(hw.forward, hw.input_grad, hw.weight, hw.update, hw.overhead, hw.size, hw.message_bytes,
                       hw.gradient_bytes, hw.static_bytes, hw.activation_bytes, hw.capacity, hw.network)
    assert same.kind_overhead is same.full_backward is same.setup is same.wind_down is None
    assert len(jax.tree.leaves(same)) == len(jax.tree.leaves(dp.Hardware.from_times(1.0, 2.0)))  # no new leaves
    assert float(dp.makespan(graph, same)) == float(dp.makespan(graph, hw))


def test_gradients_match_finite_differences():
    with jax.enable_x64(True):
        s = dp.schedules.get("dualpipe-v", devices=2, microbatches=4)
        graph = dp.compile(s)
        rng = np.random.default_rng(3)
        f, i, w, full = (jnp.asarray(rng.uniform(0.5, 2.0, s.stages)) for _ in range(4))

        def step(terms):
            hw = dp.Hardware.from_times(f, i, w, 0.01, kind_overhead=terms["kind_overhead"],
                                        full_backward=terms["full_backward"], setup=terms["setup"],
                                        wind_down=terms["wind_down"])
            return dp.makespan(graph, hw)

        x = {"kind_overhead": jnp.asarray([0.11, 0.23, 0.07, 0.05]), "full_backward": full,
             "setup": jnp.asarray(0.3), "wind_down": jnp.asarray(0.2)}
        got = jax.grad(step)(x)
        assert float(got["setup"]) == pytest.approx(1.0) and float(got["wind_down"]) == pytest.approx(1.0)
        h = 1e-6
        for name, value in x.items():
            flat = np.asarray(value).reshape(-1)
            for j in range(flat.size):
                e = np.zeros_like(flat)
                e[j] = h
                up = {**x, name: jnp.asarray((flat + e).reshape(np.shape(value)))}
                down = {**x, name: jnp.asarray((flat - e).reshape(np.shape(value)))}
                fd = (float(step(up)) - float(step(down))) / (2 * h)
                assert float(np.asarray(got[name]).reshape(-1)[j]) == pytest.approx(fd, abs=1e-6), (name, j)
        assert np.any(np.asarray(got["full_backward"]) > 0)  # B ops on the critical path


def test_vmap_builds_a_batch():
    s = dp.schedules.get("1f1b", devices=2, microbatches=2)
    graph = dp.compile(s)
    setups = jnp.asarray([0.0, 0.5, 1.0])
    hws = jax.vmap(lambda su: dp.Hardware.from_times(1.0, 2.0, setup=su, wind_down=0.25))(setups)
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda h: dp.makespan(graph, h))(hws)),
                               9.0 + 0.25 + np.asarray(setups), rtol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    ({"kind_overhead": {"X": 1.0}}, "unknown kind"),
    ({"kind_overhead": [0.1, 0.2]}, "one value per kind"),
    ({"setup": -1.0}, "setup must be non-negative"),
    ({"wind_down": float("nan")}, "wind_down must be non-negative"),
    ({"full_backward": [-1.0, 1.0]}, "full_backward must be non-negative"),
    ({"kind_overhead": {"F": "fast"}}, r"kind_overhead\[F\] must be a number"),
])
def test_bad_inputs(kwargs, message):
    with pytest.raises(dp.ConfigError, match=message):
        dp.Hardware.from_times(1.0, 2.0, **kwargs)


def test_trace_starts_after_the_setup():
    s = dp.schedules.get("1f1b", devices=2, microbatches=2)
    hw = dp.Hardware.from_times(1.0, 2.0, setup=0.5, wind_down=0.25)
    data = dp.viz.trace(s, hw)
    starts = [e["ts"] for e in data["traceEvents"] if e.get("ph") == "X"]
    assert min(starts) == pytest.approx(0.5e6)
