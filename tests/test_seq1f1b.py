"""Seq1F1B (Sun et al., NAACL 2025): 1F1B over sequence segments, their causal costs and the
``SequenceSplit`` knob.

The order is checked against the authors' Megatron-LM fork (warm-up counts, reversed backward
segments), the closed form against ``table``, per-segment costs against the transformer model run at
the segments' end positions and against a brute-force count of causal query-key pairs, and the
balanced split against the authors' split-solver equations. Simulation in every communication mode,
against the pure-Python oracle, comes from the registry matrix (``tests/_helpers.py``).
"""

import csv
import dataclasses
import itertools
import json
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import diffpipe as dp
from diffpipe._model._transformer import layer_costs
from diffpipe._workload import _segments
from diffpipe.schedules import Op, formula, from_torch_csv, get, peak_activations, table, to_torch_csv
from diffpipe.schedules._analysis import activation_peaks
from diffpipe.schedules.families.seq1f1b import segment_order_violation

DURATIONS = [None, {"F": 2.0, "B": 1.0}, {"F": 1.5, "B": 3.7}]
#: (devices, samples, segments): 1 and several devices, segments below, at and above them.
GRID = list(itertools.product((1, 2, 3, 5), (1, 2, 3), (1, 2, 3, 4)))


def test_registered_with_source_and_listed():
    out = subprocess.run([sys.executable, "-m", "diffpipe", "list"], capture_output=True, text=True, check=True)
    rows = out.stdout.splitlines()
    for name, option in (("seq1f1b", "segments=..."), ("seq1f1b-i", "chunks=...")):
        fam = dp.schedules.family(name)
        assert "Seq1F1B" in fam.source and "NAACL 2025" in fam.source and fam.summary
        at = next(i for i, row in enumerate(rows) if row.startswith(name + " "))
        assert rows[at + 1].split() == ["source:", *fam.source.split()]
        assert rows[at + 2].split()[:2] == ["--option", option]


def test_one_segment_is_1f1b():
    for d, n in ((1, 1), (3, 5), (4, 8)):
        assert get("seq1f1b", devices=d, microbatches=n, segments=1).orders == \
            get("1f1b", devices=d, microbatches=n).orders


def test_order_is_the_authors():
    """thunlp/Seq1F1B ``forward_backward_pipelining_without_interleaving``: warm-up
    ``world - rank + splits - 2`` forwards (at most all units), then 1F1B; the backward queue pops
    the newest segment of the oldest sample (``sp_queue.pop``)."""
    for d, m, k in GRID:
        n = m * k
        s = get("seq1f1b", devices=d, microbatches=n, segments=k)
        for rank, order in enumerate(s.orders):
            kinds = [op.kind for op in order]
            warm = min(d - rank + k - 2, n)
            assert kinds[:warm] == ["F"] * warm and (warm == n or kinds[warm:warm + 2] == ["F", "B"])
            assert [op.microbatch for op in order if op.kind == "F"] == list(range(n))
            queue, popped, appended = [[]], [], 0
            for op in order:  # the authors' two-level queue, re-played: k appends fill a sample's list
                if op.kind == "F":
                    queue[-1].append(op.microbatch)
                    appended += 1
                    if appended % k == 0:
                        queue.append([])
                else:
                    popped.append(queue[0].pop())
                    if not queue[0]:
                        queue.pop(0)
            assert popped == [op.microbatch for op in order if op.kind == "B"], (d, m, k)
        assert segment_order_violation(s.orders, k) is None


def test_order_is_the_sail_sg_scheduler():
    """The second implementation, sail-sg/zero-bubble-pipeline-parallelism
    ``zerobubble/scheduler/seq1f1b.py`` ``create_schedule``, restated: warm-up
    ``min(stages - stage - 2 + splits, micro * splits)``, then ``(F, i + warm-up)`` and
    ``(BW, sample i // k, segment k - 1 - i % k)`` pairs, then the remaining backwards."""
    for d, m, k in GRID:
        n = m * k
        s = get("seq1f1b", devices=d, microbatches=n, segments=k)
        for stage, order in enumerate(s.orders):
            warm = min(d - stage - 2 + k, n)
            want = [("F", i) for i in range(warm)]
            for i in range(n - warm):
                want += [("F", warm + i), ("B", (i // k) * k + k - 1 - i % k)]
            want += [("B", (i // k) * k + k - 1 - i % k) for i in range(n - warm, n)]
            assert [(op.kind, op.microbatch) for op in order] == want, (d, m, k)


def test_closed_form_and_memory_match_the_table():
    for d, m, k in GRID:
        n = m * k
        s = get("seq1f1b", devices=d, microbatches=n, segments=k)
        for durations in DURATIONS:
            closed = formula("seq1f1b", devices=d, microbatches=n, segments=k, durations=durations)
            t = table(s, durations)
            assert t.makespan == pytest.approx(closed.makespan), (d, m, k, durations)
            assert t.bubble_ratio == pytest.approx(closed.bubble_ratio, abs=1e-12)
        assert peak_activations(s) == closed.peak_activations == tuple(min(d - i + k - 1, n) for i in range(d))


def test_bubble_and_memory_against_1f1b_at_the_same_data():
    """m samples as 1F1B microbatches against k segments each: bubble (D-1)/(km+D-1) instead of
    (D-1)/(m+D-1); device 0 holds (D+k-1)/k samples' activations instead of D (equal lengths)."""
    d, m, k = 8, 8, 4
    one = table(get("1f1b", devices=d, microbatches=m), {"F": 1.0, "B": 2.0})
    seq = table(get("seq1f1b", devices=d, microbatches=m * k, segments=k), {"F": 1.0 / k, "B": 2.0 / k})
    assert one.bubble_ratio == pytest.approx((d - 1) / (m + d - 1))
    assert seq.bubble_ratio == pytest.approx((d - 1) / (k * m + d - 1))
    assert seq.makespan == pytest.approx((k * m + d - 1) * 3.0 / k) and seq.makespan < one.makespan
    s = get("seq1f1b", devices=d, microbatches=m * k, segments=k)
    held = activation_peaks(s, lambda p, stage, u: 1.0 / k)  # samples' worth of activations
    assert held[0] == pytest.approx((d + k - 1) / k) and max(peak_activations(get("1f1b", devices=d,
                                                                                   microbatches=m))) == d
    # Balanced (non-uniform) lengths: the first segments are longer, so device 0 holds more than
    # (D+k-1)/k samples' worth: exact, read off the order with stored bytes proportional to L_j.
    x = _segments.balanced_fractions(k, 0.6)
    exact = activation_peaks(s, lambda p, stage, u: float(x[u % k]))
    assert exact[0] >= 1 + _window(x, d, k) - 1e-12 and exact[0] > held[0]


def _window(x, d, k):
    """Samples' worth device 0 holds just before its first backward, beyond the first sample:
    units k .. d+k-2 (the next d-1 segments, cycling through later samples)."""
    return float(sum(x[u % k] for u in range(k, d + k - 1)))


def test_wrong_sizes_are_one_line():
    with pytest.raises(dp.ScheduleError, match=r"^seq1f1b: microbatches count segments .*: 6 is not a multiple "
                                                r"of segments=4$"):
        get("seq1f1b", devices=4, microbatches=6, segments=4)
    with pytest.raises(dp.ScheduleError, match="segments must be >= 1"):
        get("seq1f1b", devices=4, microbatches=6, segments=0)


def test_a_causal_violation_is_named():
    s = get("seq1f1b", devices=2, microbatches=4, segments=2)
    order = list(s.orders[1])
    i, j = order.index(Op("B", 1, 1)), order.index(Op("B", 1, 0))
    order[i], order[j] = order[j], order[i]  # segment 0's backward before segment 1's
    problem = segment_order_violation([s.orders[0], order], 2)
    assert problem == ("device 1 runs 1B1 after 1B0: segment 1 of sample 0 must precede segment 0 "
                       "(backward order of causal attention)")
    forward = [Op("F", 0, 1), Op("F", 0, 0)]
    assert "segment 0 of sample 0 must follow segment 1" in segment_order_violation([forward], 2)


# -- per-segment costs -----------------------------------------------------------------------------------
MODELS = {
    "gpt": dp.Transformer(layers=4, hidden=256, heads=4, sequence=4096, vocabulary=1000),
    "llama-flash": dp.presets.model("llama-3-8b", sequence=8192, flash_attention=True, layers=4),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_segment_costs_are_the_model_at_the_segment_ends(name):
    """c_j = (cost of a causal sequence ending at e_j) - (ending at e_{j-1}), relative to the whole
    sample: the transformer model evaluated at those lengths gives the same numbers."""
    model = MODELS[name]
    share = _segments.attention_share(model)
    assert 0 < share < 1

    def flops(seq):
        c = layer_costs(dataclasses.replace(model, sequence=seq))
        return float(np.sum(c.forward + c.input_grad + c.weight))

    s = model.sequence
    lengths = [s // 2, s // 4, s // 8, s // 8]
    ends = np.cumsum([0, *lengths])
    # Everything linear in s (embedding included) is counted the same way at every length.
    direct = [(flops(int(ends[j + 1])) - (flops(int(ends[j])) if ends[j] else 0.0)) / flops(s) for j in range(4)]
    got = np.asarray(_segments.segment_costs(np.asarray(lengths, np.float32) / s, share))
    np.testing.assert_allclose(got, direct, rtol=1e-6)  # float32
    assert got.sum() == pytest.approx(1.0)


def test_segment_costs_count_causal_pairs():
    """Pure attention (share 1): segment j's cost is its share of the causal query-key pairs,
    ``L (P + L/2)`` (continuous; the discrete count adds ``L/2`` per segment)."""
    lengths = [5, 4, 2, 1]
    total = sum(lengths)
    pairs, start = [], 0
    for length in lengths:
        pairs.append(sum(i + 1 for i in range(start, start + length)) - length / 2)
        start += length
    got = np.asarray(_segments.segment_costs(np.asarray(lengths, np.float32) / total, 1.0))
    np.testing.assert_allclose(got, np.asarray(pairs) / (total**2 / 2), rtol=1e-6)
    np.testing.assert_allclose(_segments.segment_costs(jnp.asarray([0.25, 0.75]), 0.0), [0.25, 0.75])


def _authors_prefix_tflops(seqlen, prefix, layers, hidden, ffn, heads, dim_head, vocab):
    """thunlp/Seq1F1B ``SeqTFlops.get_prefix_tflops`` (``prefix``: the segment's end position)."""
    attn = (seqlen * prefix * (dim_head * 4 + 3) * heads + seqlen * 8 * hidden * heads * dim_head
            - seqlen**2 * (4 * dim_head + 3) * heads / 2)
    return 4 * seqlen * hidden * vocab + layers * (attn + 4 * seqlen * hidden * ffn)


def test_balanced_split_solves_the_authors_equations():
    """Their solver gives every segment 1/k of the sequence's FLOPs; so does the closed form, with
    the attention share of their own FLOPs formula."""
    cfg = dict(layers=24, hidden=4096, ffn=16384, heads=32, dim_head=128, vocab=32000)
    s = 16384
    whole = _authors_prefix_tflops(s, s, **cfg)
    quadratic = whole - _authors_prefix_tflops(s, s, **{**cfg, "heads": 0}) - 0.0
    linear_attention = cfg["layers"] * s * 8 * cfg["hidden"] * cfg["heads"] * cfg["dim_head"]
    share = (quadratic - linear_attention) / whole
    for k in (2, 3, 8):
        x = _segments.balanced_fractions(k, share)
        ends = np.cumsum(x) * s
        lengths = x * s
        per = [_authors_prefix_tflops(lengths[j], ends[j], **cfg) for j in range(k)]
        np.testing.assert_allclose(per, whole / k, rtol=1e-9)
        assert np.all(np.diff(lengths) < 0)  # later segments are shorter


def test_bad_shares_and_lengths_are_one_line():
    with pytest.raises(dp.ConfigError, match=r"attention share must be a number in \[0, 1\], got 1.5"):
        _segments.balanced_fractions(4, 1.5)
    with pytest.raises(dp.ConfigError, match="must be positive and sum to the sequence 100"):
        _segments.check_lengths([50, 40], 100)


# -- the knob ----------------------------------------------------------------------------------------------
def _setup(k=4, samples=2, devices=4):
    model = dp.Transformer(layers=8, hidden=1024, heads=8, sequence=16384, vocabulary=32000, flash_attention=True)
    workload = dp.Workload.from_model(model, dp.presets.device("H100")).with_split([3, 2, 2, 3])
    schedule = get("seq1f1b", devices=devices, microbatches=samples * k, segments=k)
    return model, workload, schedule, dp.SequenceSplit.from_model(model, k, samples * k, multiple=128)


def test_knob_sizes_plans_gradients_and_optimize():
    """Sizes, plans, moves, and a finite gradient that moves the logits; equal lengths leave the last
    segments costliest, the compute-balanced split evens them out, and the optimizer never returns
    worse than the best baseline (exact simulator)."""
    model, workload, schedule, knob = _setup()
    params = knob.init(workload)
    sizes = knob.relax(params, workload)
    assert sizes.shape == (8,) and float(jnp.sum(sizes)) == pytest.approx(2.0)
    lengths = [8192, 4096, 2048, 2048]
    assert np.allclose(knob.fractional(knob.init(workload, lengths), workload), lengths)
    plan = knob.round(knob.init(workload, [8000.3, 4000.2, 2200.0, 2183.5]), workload)[0]
    assert plan.sum() == 16384 and np.all(plan % 128 == 0)
    moves = knob.neighbours(plan)
    assert len(moves) == 12 and np.all(moves.sum(axis=1) == 16384) and np.all(moves % 128 == 0)
    graph = dp.compile(schedule)
    with pytest.raises(dp.ConfigError, match="not whole samples of 4 segments"):
        dp.SequenceSplit(16384, 4, 6, 0.5)
    with pytest.raises(dp.ConfigError, match="SequenceSplit has 4 microbatches .* the schedule has 8"):
        dp.optimize(schedule, workload, dp.SequenceSplit(16384, 4, 4, 0.5), steps=2)

    def exact(lengths):
        return float(dp.makespan(graph, dp.Hardware(**workload.fields(workload.default_boundaries(4),
                                                                       knob.encode(np.asarray(lengths), workload)))))

    base = knob.baselines(None)
    equal, balanced = exact(base["equal"]), exact(base["balanced"])
    assert balanced < equal
    result = dp.optimize(schedule, workload, knob, steps=10)
    # the smoothed makespan's gradient reaches the logits: finite, and it moves them
    assert np.all(np.isfinite(result.loss)) and np.any(np.asarray(result.params[0]) != np.asarray(params))
    assert result.plan.makespan <= balanced * (1 + 1e-6)
    got = dict(result.plan.values)["segment_lengths"]
    assert sum(got) == 16384 and all(v % 128 == 0 for v in got)


@pytest.mark.parametrize("family, mode", [("seq1f1b", "overlap"), ("seq1f1b", "blocking"), ("seq1f1b-i", "contention")])
def test_simulates_with_segment_sizes(family, mode):
    """Equal per-unit costs and no communication: the simulator gives the closed form (edge-delay,
    link-lane and sender-receiver-lane modes; the registry matrix runs every mode against the oracle;
    seq1f1b-i, like interleaved-1f1b, deadlocks under blocking sends)."""
    d, m, k = 4, 4, 2
    s = get(family, devices=d, microbatches=m * k, segments=k)
    hw = dp.Hardware.from_times(1.0, 2.0, size=jnp.full((m * k,), 1.0 / k))
    closed = formula(family, devices=d, microbatches=m * k, segments=k, durations={"F": 0.5, "B": 1.0})
    assert float(dp.simulate(s, hw, communication=mode).makespan) == pytest.approx(closed.makespan, rel=1e-6)


def test_torch_csv_round_trip_and_torch_accepts_it(tmp_path):
    from torch.distributed.pipelining.schedules import _Action, _validate_schedule

    s = get("seq1f1b", devices=4, microbatches=8, segments=2)
    path = tmp_path / "seq1f1b.csv"
    to_torch_csv(s, path)
    back = from_torch_csv(path)
    assert back.orders == s.orders and back.microbatches == 8
    with open(path, newline="") as handle:
        actions = {rank: [_Action.from_str(cell) for cell in row] for rank, row in enumerate(csv.reader(handle))}
    _validate_schedule(actions, 4, s.stages, 8)


# -- equal work: compare, the CLI and the sweep count samples ---------------------------------------------
def test_unit_sizes_and_per_unit_hardware():
    """Balanced: every unit 1/k of its sample; equal lengths: c_j = (1-a)/k + a(2j+1)/k^2; a per-sample
    size vector is spread over its units; per-unit sizes, and one unit per sample, pass unchanged."""
    np.testing.assert_allclose(_segments.unit_sizes(4, 2), np.full(8, 0.25))
    a, k = 0.4, 4
    want = [(1 - a) / k + a * (2 * j + 1) / k**2 for j in range(k)]
    np.testing.assert_allclose(_segments.unit_sizes(k, 2, "equal", a), want * 2, rtol=1e-6)
    s = get("seq1f1b", devices=2, microbatches=6, segments=3)
    hw = dp.Hardware.from_times(1.0, 2.0, size=jnp.asarray([1.0, 2.0]))
    np.testing.assert_allclose(_segments.per_unit_hardware(hw, s).size, np.repeat([1.0, 2.0], 3) / 3, rtol=1e-6)
    priced = dp.Hardware.from_times(1.0, 2.0, size=jnp.ones(6))
    assert _segments.per_unit_hardware(priced, s) is priced
    one = get("1f1b", devices=2, microbatches=2)
    assert _segments.per_unit_hardware(hw, one) is hw
    with pytest.raises(dp.ConfigError, match="equal split's costs depend on the attention share"):
        _segments.unit_sizes(4, 1, "equal")
    with pytest.raises(dp.ConfigError, match=r"size has shape \(4,\); seq1f1b has 2 samples of 3 units"):
        _segments.per_unit_hardware(dp.Hardware.from_times(1.0, 2.0, size=jnp.ones(4)), s)


def test_compare_prices_equal_work():
    """``microbatches`` counts samples: seq1f1b at segments=1 is 1f1b at every level; at k segments
    each unit costs 1/k and the makespan is the closed form with unit times t/k."""
    d, m, k, f, b = 4, 4, 2, 1.0, 2.0  # the sizes of test_simulates_with_segment_sizes: compiled once
    hw = dp.Hardware.from_times(f, b)
    c = dp.compare(["1f1b", ("seq1f1b", {"segments": 1}), ("seq1f1b", {"segments": k}),
                    ("seq1f1b-i", {"segments": k, "chunks": 1})], hw, devices=d, microbatches=m)
    one, same, seq, inter = c.entries
    assert c.microbatches == m and seq.units_per_sample == k and one.units_per_sample == 1
    assert same.table == one.table
    assert {k: v for k, v in same.formula.items() if k != "assumption"} == \
        {k: v for k, v in one.formula.items() if k != "assumption"}
    assert same.simulation["makespan_s"] == pytest.approx(one.simulation["makespan_s"], rel=1e-6)
    closed = (k * m + d - 1) * (f + b) / k
    assert seq.table["makespan"] == pytest.approx(closed) and seq.formula["makespan"] == pytest.approx(closed)
    assert seq.simulation["makespan_s"] == pytest.approx(closed, rel=1e-6)
    assert seq.table["peak_activations"] == pytest.approx((d + k - 1) / k)  # a sample's activations
    assert inter.simulation["makespan_s"] == pytest.approx(closed, rel=1e-6)  # chunks=1: no interleaving
    assert c.to_dict()["schedules"][2]["units_per_sample"] == k and "2 units per sample" in str(c)
    with pytest.raises(dp.ConfigError, match="seq1f1b has 4 devices and 2 microbatches \\(samples of 4 units\\), "
                                             "the comparison 4 and 4"):
        dp.compare([get("seq1f1b", devices=4, microbatches=8, segments=4)], hw, devices=4, microbatches=4)
    with pytest.raises(dp.ConfigError, match="segment_split='equal' .* pass a Machine"):
        dp.compare(["seq1f1b"], hw, devices=4, microbatches=4, segment_split="equal")


def test_compare_equal_split_prices_later_segments_higher():
    """With equal lengths the model's attention share makes later segments costlier: compare's
    simulation uses those sizes (peak activation bytes read them too), the table keeps 1/k."""
    model = dp.Transformer(layers=8, hidden=256, heads=4, sequence=8192, vocabulary=1000)
    default = dp.Machine.default()
    machine = dp.Machine(model, dp.presets.device("H100"), default.network, uniform_stages=True,
                         communication=default.communication)
    runs = {split: dp.compare([("seq1f1b", {"segments": 2})], machine, devices=2, microbatches=2,
                              segment_split=split).entries[0] for split in ("balanced", "equal")}
    assert runs["equal"].table == runs["balanced"].table
    assert runs["equal"].simulation["makespan_s"] != pytest.approx(runs["balanced"].simulation["makespan_s"])


def test_cli_compare_counts_samples(capsys):
    from diffpipe import cli

    code = cli.main(["compare", "1f1b", "seq1f1b", "seq1f1b-i", "--option", "segments=2", "--devices", "2",
                     "--microbatches", "2", "--forward", "1", "--backward", "2", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["microbatches"] == 2
    assert [(e["family"], e["options"], e["units_per_sample"]) for e in data["schedules"]] == [
        ("1f1b", {}, 1), ("seq1f1b", {"segments": 2}, 2), ("seq1f1b-i", {"chunks": 2, "segments": 2}, 2)]
    assert cli.main(["compare", "1f1b", "--option", "segments=2"]) == 2
    assert "--option segments is not an option of 1f1b" in capsys.readouterr().err


def test_sweep_counts_samples():
    hw = dp.Hardware.from_times(1.0, 2.0, size=1.0)
    result = dp.sweep(hw, families=["1f1b", "seq1f1b"], devices=4, microbatches=[2, 3],
                      options={"seq1f1b": {"segments": [1, 4]}})
    cols = result.columns
    rows = {(f, o, int(n)): (float(t), float(w)) for f, o, n, t, w in
            zip(cols["family"], cols["options"], cols["microbatches"], cols["makespan"], cols["throughput"])}
    for n in (2, 3):
        assert rows[("seq1f1b", "segments=1", n)] == pytest.approx(rows[("1f1b", "", n)])
        closed = (4 * n + 3) * 3.0 / 4
        assert rows[("seq1f1b", "segments=4", n)] == pytest.approx((closed, n / closed), rel=1e-6)
    varied = dp.Hardware.from_times(1.0, 2.0, size=jnp.arange(1.0, 9.0))
    with pytest.raises(dp.ConfigError, match="seq1f1b prices its 4 units per sample itself: give one size"):
        dp.sweep(varied, families=["seq1f1b"], devices=4, microbatches=2)
