"""The claims of papers/amdp/README.md, each a test: fails when diffpipe's model stops supporting it.

Numbers come from ``papers/amdp/reproduce.py`` itself (imported by path), on the authors' GPT
configuration (8 devices, 48 layers, hidden 1600, 25 heads, sequence 1024, microbatch 4, fp16, global
batch 32 so N = 8 microbatches per step) on a modelled NVLink node of A100s, with ``--fast`` windows.
"""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import diffpipe as dp

#: A paper's reproduction: slow (``-m 'not slow'`` leaves it out; CI runs it).
pytestmark = pytest.mark.slow

pytest.importorskip("jax")

PAPER = Path(__file__).resolve().parents[1] / "papers" / "amdp"
_spec = importlib.util.spec_from_file_location("amdp_reproduce", PAPER / "reproduce.py")
rp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rp)

SYNCHRONOUS = ("gpipe", "1f1b", "interleaved-1f1b")


@pytest.fixture(scope="module")
def runs():
    return {name: rp.evaluate(name, rp.MICROBATCHES, fast=True) for name in rp.SCHEDULES}


def samples(run, key="throughput"):
    return run[key]["samples_per_s"]


def test_steady_state_is_reached(runs):
    """The asynchronous windows are long enough: every interior step takes the same time."""
    for name in rp.ASYNCHRONOUS:
        assert runs[name]["throughput"]["period_spread"] < 1e-3, name


def test_claim_1_amdp_beats_every_synchronous_schedule(runs):
    """Throughput above GPipe, 1F1B and interleaved 1F1B, with a much smaller bubble."""
    amdp = runs["amdp"]
    for name in SYNCHRONOUS:
        assert samples(amdp) > 1.5 * samples(runs[name]), name
        assert amdp["throughput"]["bubble"] < runs[name]["throughput"]["bubble"] - 0.3, name
    assert amdp["throughput"]["bubble"] < 0.06
    # GPipe and 1F1B take the same time; interleaving helps but does not close the gap.
    assert samples(runs["gpipe"]) == pytest.approx(samples(runs["1f1b"]), rel=1e-3)
    assert samples(runs["1f1b"]) < samples(runs["interleaved-1f1b"]) < samples(amdp)


def test_claim_1_holds_at_a_larger_global_batch():
    """At N = 32 (global batch 128) the synchronous bubble shrinks, still short of AMDP."""
    amdp = rp.evaluate("amdp", rp.MICROBATCHES_LARGE, fast=True)["throughput"]
    best = rp.evaluate("interleaved-1f1b", rp.MICROBATCHES_LARGE, fast=True)["throughput"]
    assert best["samples_per_s"] < amdp["samples_per_s"]
    assert best["bubble"] > 0.25


def test_claim_2_amdp_beats_the_asynchronous_baselines_on_the_authors_split(runs):
    """Ahead of PipeDream and PipeDream-2BW by 10-40% (the paper: up to about 17%)."""
    for name in ("pipedream", "pipedream-2bw"):
        gain = samples(runs["amdp"]) / samples(runs[name])
        assert 1.1 < gain < 1.4, (name, gain)


def test_claim_2_gain_comes_from_spreading_the_lm_head(runs):
    """With balanced stage times (same total work) PipeDream and 2BW are ahead: their steady state
    has no bubble, AMDP's rounds keep a few percent. The LM head makes the last stage of a linear
    pipeline the bottleneck; AMDP places the last stage of its four pipelines on four devices."""
    for name in ("pipedream", "pipedream-2bw"):
        assert samples(runs[name], "balanced") > samples(runs["amdp"], "balanced"), name
        assert runs[name]["balanced"]["bubble"] < 0.01
        # On the authors' split their bubble is the imbalance: 1 - mean stage time / slowest.
        assert runs[name]["throughput"]["bubble"] > 0.2
    assert 0.02 < runs["amdp"]["balanced"]["bubble"] < 0.06
    # AMDP is insensitive to the imbalance.
    assert samples(runs["amdp"], "balanced") == pytest.approx(samples(runs["amdp"]), rel=0.02)


def test_ranking_is_the_same_on_h100():
    a = rp.evaluate("amdp", fast=True, device="H100", link="nvlink4")
    p = rp.evaluate("pipedream-2bw", fast=True, device="H100", link="nvlink4")
    i = rp.evaluate("interleaved-1f1b", fast=True, device="H100", link="nvlink4")
    assert samples(i) < samples(p) < samples(a)


def test_claim_3_at_most_one_update_between_forward_and_backward(runs):
    assert runs["amdp"]["staleness"]["max_updates_between_f_and_b"] == 1
    assert runs["pipedream-2bw"]["staleness"]["max_updates_between_f_and_b"] == 1
    assert runs["pipedream"]["staleness"]["max_updates_between_f_and_b"] == rp.DEVICES - 1
    for name in SYNCHRONOUS:
        assert runs[name]["staleness"]["max_updates_between_f_and_b"] == 0


def test_claim_3_first_stage_runs_at_most_two_forwards_before_a_backward():
    """Each pipeline's first stage runs at most two forwards in a row; with the previous round's
    backward carried over (no flush) it holds up to three activations at once."""
    s = rp.schedule("amdp", fast=True)
    for order in s.orders:
        run: dict[int, int] = {}
        for op in order:
            if op.stage == 0 and op.kind in ("F", "B"):
                run[op.pipeline] = run.get(op.pipeline, 0) + 1 if op.kind == "F" else 0
                assert run[op.pipeline] <= 2, op
    assert rp.first_stage_in_flight(s) == 3
    assert rp.first_stage_in_flight(rp.schedule("pipedream", fast=True)) == rp.DEVICES


@pytest.mark.parametrize("microbatches", [8, 16, 32])
def test_claim_4_mismatch_is_bounded_per_step(microbatches):
    """Only the first round of a step (D microbatches) sees an update between forward and backward:
    D mismatched microbatches per step whatever N, a fraction D/N, which is all of them at the
    authors' global batch (N = D = 8)."""
    summary = rp.staleness_summary(rp.schedule("amdp", microbatches, fast=True))
    assert summary["stale_per_step"] == rp.DEVICES
    assert summary["mismatched_fraction"] == pytest.approx(rp.DEVICES / microbatches)
    assert summary["mismatched_pairs_fraction"] <= summary["mismatched_fraction"]
    for name in ("pipedream", "pipedream-2bw"):  # stashing: delayed, never mismatched
        assert rp.staleness_summary(rp.schedule(name, microbatches, fast=True))["mismatched_fraction"] == 0


def test_claim_5_memory(runs):
    """Four replicas per device, but one weight version and a sharded optimizer state: the peak is
    within 5% of 1F1B's worst device and below PipeDream's, and even across devices."""
    amdp, one, pipedream = runs["amdp"]["memory"], runs["1f1b"]["memory"], runs["pipedream"]["memory"]
    assert max(amdp["replicas"]) == rp.DEVICES // 2 and max(amdp["weight_versions"]) == 1
    assert max(pipedream["weight_versions"]) == rp.DEVICES
    assert max(runs["pipedream-2bw"]["memory"]["weight_versions"]) == 2
    # ZeRO-1 sharding halves AMDP's static bytes; PipeDream's stashed versions cost more still.
    assert max(amdp["static_bytes"]) < 0.5 * max(amdp["static_unsharded_bytes"])
    assert max(one["static_bytes"]) < max(amdp["static_bytes"]) < max(pipedream["static_bytes"])
    # Activations: at most D stage-microbatches on any device, like 1F1B's first device.
    assert max(amdp["peak_activations"]) == max(one["peak_activations"]) == rp.DEVICES
    assert max(amdp["total_bytes"]) <= 1.05 * max(one["total_bytes"])
    assert max(amdp["total_bytes"]) < max(pipedream["total_bytes"])
    assert min(amdp["total_bytes"]) > 0.9 * max(amdp["total_bytes"])
    assert min(one["total_bytes"]) < 0.3 * max(one["total_bytes"])
    for run in runs.values():  # by plan's rule: 10% of the memory kept free
        assert dp.fits_memory(max(run["memory"]["total_bytes"]), run["memory"]["capacity_bytes"])


def test_committed_outputs_are_current(runs):
    """papers/amdp/results.json matches the model: rerun reproduce.py when this fails."""
    committed = json.loads((PAPER / "results.json").read_text())
    table = {
        r["schedule"]: r for r in committed["runs"] if r["microbatches"] == rp.MICROBATCHES and r["device"] == rp.DEVICE
    }
    for name, run in runs.items():
        for key in ("throughput", "balanced"):
            assert table[name][key]["samples_per_s"] == pytest.approx(samples(run, key), rel=1e-3), (name, key)
        np.testing.assert_allclose(table[name]["memory"]["total_bytes"], run["memory"]["total_bytes"], rtol=1e-3)
        assert table[name]["staleness"] == run["staleness"]
    for name in ("amdp.png", "throughput.md", "memory.md", "staleness.md"):
        assert (PAPER / name).stat().st_size > 0
