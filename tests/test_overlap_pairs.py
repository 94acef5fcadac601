"""DualPipe's overlapped F&B pairs: ``Schedule.overlapped``, ``Hardware.pair_overlap``, the pair in
``compile`` and in the reference evaluators, torch's ``OVERLAP_F_B`` cells, and the closed forms."""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffpipe as dp
from diffpipe._engine._graph import COST_PAIR
from diffpipe.schedules import Op, from_torch, from_torch_csv, get, table, to_torch_csv
from diffpipe.schedules._reference import evaluate_network, overlapped_time

UNIT = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}
LAT, BW = 0.05, 2.0


def test_generators_mark_torchs_compounds_and_csv_round_trips(tmp_path):
    """The pairs are exactly torch's ``add_overlap_f_b`` calls, and a CSV keeps them as compounds."""
    for d, n in [(1, 2), (2, 4), (3, 7), (4, 8)]:
        ours = get("dualpipe-v", devices=d, microbatches=n)
        theirs = from_torch("DualPipeV", d, n)
        assert theirs.overlapped == ours.overlapped and theirs.orders == ours.orders and ours.overlapped
        text = to_torch_csv(ours, tmp_path / "v.csv")
        assert text.count("OVERLAP_F_B") == len(ours.overlapped)
        back = from_torch_csv(tmp_path / "v.csv")
        assert back.orders == ours.orders and back.overlapped == ours.overlapped
    # every pair: an F followed by a B of another stage; the last rank's first step is not a pair
    s = get("dualpipe", devices=4, microbatches=16)
    for d, i in s.overlapped:
        f, b = s.orders[d][i], s.orders[d][i + 1]
        assert f.kind == "F" and b.kind == "B" and (f.pipeline, f.stage) != (b.pipeline, b.stage)
    assert s.pairs == {s.orders[d][i]: s.orders[d][i + 1] for d, i in s.overlapped}


@pytest.mark.parametrize(
    "marks, message",
    [
        ({(0, 0)}, r"is 0F0 then 0F1; a pair is an F followed by a B or I"),
        ({(5, 0)}, r"outside the orders"),
        ({(0, 99)}, r"outside the orders"),
        ({("a", 1)}, r"pairs of ints"),
        ({(1, 2)}, r"1B1 needs the output of 1F1"),
        ({(0, 7), (0, 8)}, r"share an op"),
    ],
)
def test_bad_marks_are_one_line(marks, message):
    s = get("1f1b", devices=2, microbatches=4)  # d0: F0 F1 B0 F2 B1 F3 B2 B3; d1: F0 B0 F1 B1 ...
    if (0, 7) in marks:
        s = get("dualpipe-v", devices=2, microbatches=4).replace(overlapped=frozenset())
    with pytest.raises(dp.ScheduleError, match=message) as info:
        s.replace(overlapped=marks)
    assert "\n" not in str(info.value)


def test_a_pair_that_closes_a_cycle_is_refused():
    """0F0 + 0B0 on two stages: the backward's gradient comes from 1B0, which needs 1F0, which needs
    the pair's own forward: no direct data edge, but a cycle once the pair starts on both inputs."""
    s = get("1f1b", devices=2, microbatches=4)
    assert s.replace(overlapped={(0, 3)}).pairs == {Op("F", 0, 2): Op("B", 0, 1)}  # 0F2 + 0B1 is fine
    orders = ((Op("F", 0, 0), Op("B", 0, 0)), (Op("F", 1, 0), Op("B", 1, 0)))
    with pytest.raises(dp.ScheduleError, match="deadlocks: an input of one member waits for the other"):
        dp.schedules.Schedule(dp.schedules.Placement.linear(2), orders, 1, overlapped={(0, 0)})


def test_families_without_pairs_are_unchanged():
    """No marks: no pair rows, and ``pair_overlap`` is inert; None adds no leaf to the pytree."""
    plain = dp.Hardware.from_times(1.0, 2.0, 0.5, 0.1)
    with_overlap = dp.Hardware.from_times(1.0, 2.0, 0.5, 0.1, pair_overlap=0.7)
    assert len(jax.tree.leaves(with_overlap)) == len(jax.tree.leaves(plain)) + 1
    for name in ("1f1b", "zb-v", "chimera"):
        s = get(name, devices=2, microbatches=4)
        assert s.overlapped == frozenset() and s.pairs == {}
        g = dp.compile(s)
        assert not np.any(np.asarray(g.node_cost)[:, 0] == COST_PAIR)
    costs = jax.jit(lambda h: h.costs(g)[0])  # chimera's: two pipelines
    np.testing.assert_array_equal(costs(plain), costs(with_overlap))


def _machine(s, overlap, seed):
    """Random per-stage times, unequal microbatch sizes, uniform links; the reference's functions."""
    rng = np.random.default_rng(seed)
    P, S, M = s.pipelines, s.stages, s.microbatches
    f, b, w, msg = (rng.uniform(0.5, 2.0, (P, S)) for _ in range(4))
    ov = rng.uniform(0.0, 1.0, (P, S)) if overlap == "per-stage" else np.full((P, S), overlap)
    size = rng.uniform(0.5, 1.5, M)
    hw = dp.Hardware(
        forward=jnp.asarray(f), input_grad=jnp.asarray(b), weight=jnp.asarray(w), update=jnp.zeros(()),
        overhead=jnp.asarray(0.01), size=jnp.asarray(size), message_bytes=jnp.asarray(msg),
        gradient_bytes=jnp.zeros(()), static_bytes=jnp.zeros(()), activation_bytes=jnp.zeros(()),
        capacity=jnp.asarray(np.inf), network=dp.Network.uniform(LAT, BW),
        pair_overlap=jnp.asarray(ov),
    )
    times = {"F": f, "I": b, "W": w, "B": b + w}

    def duration(op):
        return 0.01 + float(size[op.microbatch] * times[op.kind][op.pipeline, op.stage])

    def pair(fw, bw):
        return overlapped_time(duration(fw), duration(bw), float(ov[fw.pipeline, fw.stage]))

    def transfer(op, dep):
        return LAT + size[op.microbatch] * msg[op.pipeline, dep.boundary] / BW

    return hw, duration, transfer, pair


#: The modes on dualpipe-v (none and overlap compile to one edge graph: overlap on dualpipe), and
#: dualpipe (two pipelines) with transfer delays and with rendezvous waits.
PAIRED = [(("dualpipe-v", 2, 4), mode) for mode in ("none", "contention", "blocking", "rendezvous")] + [
    (("dualpipe", 4, 8), mode) for mode in ("overlap", "rendezvous")]


@pytest.mark.parametrize("case, mode", PAIRED, ids=[f"{c[0]}-{c[1]}x{c[2]}-{m}" for c, m in PAIRED])
def test_simulator_agrees_with_the_reference_in_every_mode(case, mode):
    with jax.enable_x64(True):
        name, d, n = case
        s = get(name, devices=d, microbatches=n)
        comm = dp.communication(mode)
        hw, duration, transfer, pair = _machine(s, "per-stage", zlib.crc32(f"{case}/{mode}".encode()))
        try:
            dp.compile(s, communication=comm)
        except dp.ScheduleError as error:
            assert mode == "blocking" and "deadlocks" in str(error)
            pytest.skip(f"{name} deadlocks under blocking sends, with or without its pairs")
        result = dp.simulate(s, hw, communication=comm)
        start, finish, _ = evaluate_network(s, duration, transfer, comm, pair=pair)
        np.testing.assert_allclose(np.asarray(result.finish), [finish[op] for op in s.ops], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(np.asarray(result.start), [start[op] for op in s.ops], rtol=1e-9, atol=1e-9)
        for f, b in s.pairs.items():  # the pair is one interval, reported on its forward
            assert start[b] == finish[b] == finish[f]
        busy = sum(finish[op] - start[op] for op in s.orders[0])
        assert float(result.busy[0]) == pytest.approx(busy, rel=1e-9)


def test_pair_time_and_its_gradient_against_finite_differences():
    """``pair_overlap`` (and every time) is a differentiable leaf: float64 central differences."""
    with jax.enable_x64(True):
        s = get("dualpipe-v", devices=2, microbatches=4)
        g = dp.compile(s)

        def span(ov, forward):
            return dp.makespan(g, dp.Hardware.from_times(forward, 1.3, 0.7, 0.1, pair_overlap=ov))

        ov, fw = 0.4, jnp.asarray([1.0, 1.1, 0.9, 1.2])
        grad_ov, grad_fw = jax.grad(span, argnums=(0, 1))(ov, fw)
        eps = 1e-6
        fd = (span(ov + eps, fw) - span(ov - eps, fw)) / (2 * eps)
        assert float(grad_ov) == pytest.approx(float(fd), rel=1e-6) and float(grad_ov) < 0
        for k in (0, 3):
            e = jnp.zeros(4).at[k].set(eps)
            assert float(grad_fw[k]) == pytest.approx(float((span(ov, fw + e) - span(ov, fw - e)) / (2 * eps)),
                                                      rel=1e-6, abs=1e-9)
        # at unit times the pair lasts 3 - overlap: the table's F&B
        for ov in (0.0, 0.5, 1.0):
            hw = dp.Hardware.from_times(1.0, 1.0, 1.0, pair_overlap=ov)
            step = float(dp.simulate(s, hw, communication="none").makespan)
            assert step == table(s, {**UNIT, "F&B": 3 - ov}).makespan


@pytest.mark.parametrize("value", [-0.1, 1.5, True, float("nan"), [0.5, 2.0]])
def test_bad_pair_overlap_is_one_line(value):
    with pytest.raises(dp.ConfigError, match="pair_overlap") as info:
        dp.Hardware.from_times(1.0, 2.0, pair_overlap=value)
    assert "\n" not in str(info.value)


def test_traced_bad_pair_overlap_is_caught():
    s = get("dualpipe-v", devices=2, microbatches=4)
    g = dp.compile(s)
    f = jax.jit(lambda ov: dp.makespan(g, dp.Hardware.from_times(1.0, 2.0, pair_overlap=ov)))
    assert float(f(0.5)) < float(f(0.0))
    with pytest.raises(Exception, match="pair_overlap must lie in"):
        f(1.5).block_until_ready()


@pytest.mark.parametrize("name", ["dualpipe-v", "dualpipe"])
def test_closed_form_uses_the_pair_time(name):
    """``formula`` at F = I = W and F&B in [2t, 3t] equals the simulated table, and device 0 idles
    DeepSeek's published ``(PP/2-1)(F&B+B-3W)`` at F&B = F + B."""
    for d, n in [(2, 4), (2, 7), (3, 6), (4, 8), (4, 18), (8, 32)]:
        if name == "dualpipe":
            d, n = 2 * d, 2 * n
        s = get(name, devices=d, microbatches=n)
        for fb in (3.0, 2.75, 2.4, 2.0):
            t = table(s, {**UNIT, "F&B": fb})
            closed = dp.schedules.formula(name, devices=d, microbatches=n, durations={**UNIT, "F&B": fb})
            assert closed.makespan == pytest.approx(t.makespan) and closed.bubble_ratio == pytest.approx(t.bubble_ratio)
        pp = d if name == "dualpipe" else 2 * d
        t = table(s, UNIT)
        assert t.makespan - t.busy[0] == (pp // 2 - 1) * (3 + 2 - 3)
    assert dp.schedules.formula(name, devices=4, microbatches=16, durations={**UNIT, "F&B": 1.5}) is None


def test_sweep_carries_pair_overlap_like_simulate():
    s = get("dualpipe-v", devices=2, microbatches=4)
    hws = [dp.Hardware.from_times(1.0, 1.0, 1.0, 0.1, pair_overlap=ov) for ov in (0.0, 0.5, 1.0)]
    out = dp.sweep(hws, families=[], schedules=[s]).columns
    for column, field in [("makespan", "makespan"), ("bubble_ratio", "bubble_ratio")]:
        want = [float(getattr(dp.simulate(s, h), field)) for h in hws]
        np.testing.assert_allclose(out[column][np.argsort(out["hardware"])], want, rtol=1e-5)
    assert len(set(out["makespan"].tolist())) == 3


def test_cli_reads_pair_overlap_from_times(tmp_path, capsys):
    from diffpipe.cli import main

    def run(extra):
        path = tmp_path / "m.toml"
        path.write_text(f"[times]\nforward = 1.0\nbackward = 1.0\nweight = 1.0\n{extra}")
        code = main(["simulate", "dualpipe-v", "--devices", "2", "--microbatches", "4", "--config", str(path),
                     "--json"])
        return code, capsys.readouterr()

    code, plain = run("")
    assert code == 0
    code, hidden = run("pair_overlap = 1.0\n")
    assert code == 0 and hidden.out != plain.out
    import json

    assert json.loads(hidden.out)["makespan_s"] < json.loads(plain.out)["makespan_s"]
    code, bad = run("pair_overlap = 1.5\n")
    assert code == 2 and len(bad.err.strip().splitlines()) == 1 and "pair_overlap" in bad.err
