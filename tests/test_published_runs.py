"""The claims of papers/published-runs/README.md, each a test.

Most tests read the committed ``results.json`` (the full run takes minutes); the published numbers in it
must be the ones of ``data.toml`` (quoted from the sources), and ``test_quick_rows_recompute_the_committed_numbers``
reruns a CI-sized subset with ``run.py`` and requires the committed predictions back: a change to the cost
model that moves them fails here until ``python papers/published-runs/run.py`` is rerun and the README's
claims rechecked.
"""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import diffpipe as dp

pytest.importorskip("jax")

PAPER = Path(__file__).resolve().parents[1] / "papers" / "published-runs"
_spec = importlib.util.spec_from_file_location("published_runs_run", PAPER / "run.py")
rp = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = rp
_spec.loader.exec_module(rp)

RESULTS = json.loads((PAPER / "results.json").read_text())
DATA = rp.DATA


def rows(study):
    return {r["name"]: r for r in RESULTS["studies"][study]["rows"]}


def summary(study):
    return RESULTS["studies"][study]["summary"]


# -- the published data: transcribed correctly (each table checked against its own formulas) -------------
def test_sc21_table1_is_consistent_with_its_own_formulas():
    """Eq. (2) gives the parameter column, GPUs = TP x PP x DP, teraFLOP/s x GPUs the aggregate column,
    teraFLOP/s / 312 the percentage, and the scripts' microbatches and virtual stages divide evenly."""
    for r in DATA["sc21"]["table1"]:
        l, h, v, s = r["layers"], r["hidden"], 51200, 2048
        p = 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h))
        assert p / 1e9 == pytest.approx(r["parameters"], rel=0.03), r["name"]
        assert r["gpus"] % (r["tp"] * r["pp"]) == 0
        # teraFLOP/s are rounded to integers: the aggregate agrees within gpus x 0.5 teraFLOP/s
        assert r["tflops"] * r["gpus"] / 1e3 == pytest.approx(r["aggregate_pflops"], abs=r["gpus"] * 0.5e-3 + 0.05)
        assert r["tflops"] / 312 == pytest.approx(r["peak"], abs=0.006), r["name"]
        data = r["gpus"] // (r["tp"] * r["pp"])
        assert r["batch"] % (r["mbs"] * data) == 0, r["name"]
        if r["layers_per_virtual"]:
            assert r["layers"] % (r["pp"] * r["layers_per_virtual"]) == 0, r["name"]


def test_korthikanti_table5_mfu_follows_from_its_iteration_times():
    """MFU = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) / (time x GPUs x 312 TFLOP/s), and the throughput
    increase is full / present - 1: both within the table's rounding."""
    for r in DATA["korthikanti"]["table5"]:
        b, s, l, h, v = r["batch"], 2048, r["layers"], r["hidden"], 51200
        flops = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
        assert flops / (r["present_s"] * r["gpus"] * 312e12) == pytest.approx(r["mfu"], abs=0.006), r["name"]
        assert r["full_s"] / r["present_s"] - 1 == pytest.approx(r["increase"], abs=0.003), r["name"]


def test_h100_tables_mfu_is_teraflops_over_the_dense_peak():
    for r in DATA["llama3"]["table4"] + DATA["megatron_h100"]["table"]:
        assert r["tflops"] / 989 == pytest.approx(r["mfu"], abs=0.007), r["name"]
    for r in DATA["llama3"]["table4"]:
        assert r["tp"] * r["cp"] * r["pp"] * r["dp"] == r["gpus"]
        assert r["dp"] * r["batch_per_dp"] * r["sequence"] == pytest.approx(16e6, rel=0.05)
    for r in DATA["megatron_h100"]["table"]:
        assert r["tp"] * r["pp"] * r["dp"] == r["gpus"]
        assert r["tflops"] * r["gpus"] / 1e3 == pytest.approx(r["aggregate_pflops"], abs=0.1)


def test_results_quote_the_data_file():
    """Every published number in results.json is the one in data.toml (no number edited by hand)."""
    table1 = {r["name"]: r["tflops"] for r in DATA["sc21"]["table1"]}
    for name, r in rows("sc21_table1").items():
        assert r["published"] == table1[name]
    t5 = {r["name"]: r for r in DATA["korthikanti"]["table5"]}
    for r in rows("korthikanti_table5").values():
        if r["mode"] == "full recompute":
            assert r["published"] == t5[r["model"]]["full_s"]
        elif r["mode"] == "present work":
            assert r["published"] == t5[r["model"]]["present_s"]
    llama = {r["name"]: r["tflops"] for r in DATA["llama3"]["table4"]}
    for name, r in rows("llama3_table4").items():
        assert r["published"] == llama[name]
    mh = {r["name"]: r["tflops"] for r in DATA["megatron_h100"]["table"]}
    for name, r in rows("megatron_h100").items():
        assert r["published"] == mh[name]
    for r in RESULTS["studies"]["sc21_table1"]["rows"]:
        assert r["error"] == pytest.approx(r["predicted"] / r["published"] - 1)


# -- claim 1: SC'21 Table 1 ---------------------------------------------------------------------------------
def test_claim_1_sc21_table1_within_10_percent_mostly_too_fast():
    """With the kernel model (the A100's training ceiling fitted on the FIT set, this table among it): every
    row within 10%, MAPE under 4% (9.0% with the flat 50%), all but the 1T row too fast; the rise of
    teraFLOP/s from 1.7B to 1T shows."""
    r, s = rows("sc21_table1"), summary("sc21_table1")
    assert s["max_abs_error"] < 0.10
    assert s["mape"] < 0.04
    assert sum(x["error"] > 0 for x in r.values()) == len(r) - 1 and r["1008.0B"]["error"] < 0
    assert r["1008.0B"]["predicted"] > r["1.7B"]["predicted"]


# -- claim 2: SC'21 Table 2 (fixed batch, more GPUs) ----------------------------------------------------------
def test_claim_2_sc21_table2_direction_reproduced_magnitude_not():
    """Per-GPU throughput falls as the GPUs double at a fixed batch, in the paper and in the model, but the
    model's fall is under half the published one."""
    r = rows("sc21_table2")
    assert summary("sc21_table2")["mape"] < 0.09
    for model in ("174.6B", "529.6B"):
        series = [x for name, x in r.items() if name.startswith(model)]
        pub = [x["published"] for x in series]
        pred = [x["predicted"] for x in series]
        assert all(a > b for a, b in zip(pub, pub[1:])), model
        assert all(a > b for a, b in zip(pred, pred[1:])), model
        assert (pred[0] - pred[-1]) / pred[0] < 0.5 * (pub[0] - pub[-1]) / pub[0], model


# -- claim 3: Korthikanti Tables 4-5 ---------------------------------------------------------------------------
def test_claim_3_selective_plus_sp_speedup_reproduced():
    """The speedup of sequence parallelism + selective recomputation over full recomputation is within 5%
    of the published one for all four models (1.29-1.32 published)."""
    speed = RESULTS["studies"]["korthikanti_table5"]["speedup"]
    assert set(speed) == {"22B", "175B", "530B", "1T"}
    for model, v in speed.items():
        assert v["predicted"] == pytest.approx(v["published"], rel=0.05), model


def test_claim_3_iteration_times_within_13_percent():
    """Every iteration time within 13% (MAPE under 6.5%; 23.1% with the flat 50%), in the published order;
    since the A100's training ceiling (fitted to SC'21's tables and this one together) the larger models run
    too slow, the 1T rows by 11-13%, the 22B within 3%."""
    r, s = rows("korthikanti_table5"), summary("korthikanti_table5")
    assert s["max_abs_error"] < 0.13 and s["mape"] < 0.065
    assert s["order_reproduced"]
    for name in ("22B full recompute", "22B present work"):
        assert abs(r[name]["error"]) < 0.03, name


def test_claim_3_one_22b_layer():
    """Every forward within 5%, every backward within 10% (Table 4 is where the A100's kernel ceiling was
    fitted: within 4.7% under the collective fit of that time, kernels_a100.json; the training ceiling fitted
    to whole runs since slows every kernel by 4%), and
    sequence parallelism now shortens the forward (its norms and dropout are sharded memory-bound kernels),
    as measured (7.7 -> 7.2 ms)."""
    t4 = {r["experiment"]: r for r in RESULTS["studies"]["korthikanti_table4"]["rows"]}
    for r in t4.values():
        assert r["forward_ms"]["predicted"] == pytest.approx(r["forward_ms"]["published"], rel=0.05)
        assert r["backward_ms"]["predicted"] == pytest.approx(r["backward_ms"]["published"], rel=0.10)
    base, sp = t4["Baseline no recompute"], t4["Sequence Parallelism"]
    assert sp["forward_ms"]["predicted"] < base["forward_ms"]["predicted"]
    assert sp["forward_ms"]["published"] < base["forward_ms"]["published"]
    b = {k: v["backward_ms"]["predicted"] for k, v in t4.items()}
    assert b["Baseline no recompute"] < b["Selective Recompute"] < b["Baseline with recompute"]


# -- claim 4: H100 runs (Llama 3, torchtitan, Megatron-LM README) -------------------------------------------
def test_claim_4_h100_predictions():
    """Llama 3 405B too fast by 6-10% (rows 1-2), its context-parallel row 3 too slow by 5% (its 131k-token
    attention at the FlashAttention papers' per-pass rates; its K/V all-gather is not modelled); torchtitan's
    8B FSDP far too fast, outside its bracket; Megatron-LM's H100 table (with its stated overlaps, and Hopper's
    own fused attention) within 18% (MAPE under 7.5%; 17% until every gradient bucket paid its ring latency, which
    took the 32B row from -16.1% to -17.3% through the refitted ceiling), the 32B row the slowest (its exposed
    collectives and bubble), the 1.7B the fastest (+13.9%)."""
    for name, r in rows("llama3_table4").items():
        low = -0.08 if "CP" in name else 0.03
        assert low < r["error"] < 0.11, name
    for case, c in summary("torchtitan")["fsdp_bracket"].items():
        assert c["full"] > c["published"] and not c["inside_bracket"], case
    s, mh = summary("megatron_h100"), rows("megatron_h100")
    assert s["max_abs_error"] < 0.18 and s["mape"] < 0.075
    assert mh["32B"]["error"] < -0.05 and 0.0 < mh["1.7B"]["error"] < 0.16


def test_claim_4_orderings_on_h100():
    """Llama 3: 8K GPUs at DP 64 above 16K GPUs at DP 128 per GPU (reproduced); torchtitan 405B:
    interleaved 1F1B above 1F1B (reproduced, 1.55 against 1.28); Megatron-LM weak scaling: not reproduced."""
    assert summary("llama3_table4")["order_reproduced"]
    pair = summary("torchtitan")["pipeline_pair"]
    assert pair["order_reproduced"] and pair["predicted_ratio"] > pair["published_ratio"]
    assert not summary("megatron_h100")["order_reproduced"]


# -- claim 5: SC'21 §5 orderings ---------------------------------------------------------------------------
def test_claim_5_sc21_stated_orderings():
    """Figures 12, 13 (tensor <= 8) and 14 (both batches): reproduced; Figure 16 (best microbatch 2): not,
    but microbatch size now matters: at batch 512 sizes 2 and 4 tie at the top (the model picks 4), at
    batch 128 size 1 wins."""
    got = {o["id"]: o for o in RESULTS["studies"]["sc21_orderings"]["orderings"]}
    assert got["fig12_interleaved"]["reproduced"]
    assert got["fig13_tensor_vs_pipeline"]["reproduced"]
    assert got["fig14_pipeline_vs_data"]["reproduced"]
    fig16 = got["fig16_microbatch"]
    assert not fig16["reproduced"]
    big = {p["mbs"]: p["tflops"] for p in fig16["points"] if p["batch"] == 512}
    assert big[2] > big[1] and big[2] > big[8]


# -- claim 6: plan -------------------------------------------------------------------------------------------
def test_claim_6_plan_never_slower_than_the_published_configuration():
    """On both requests plan's best is at least as fast as the published configuration by the simulator."""
    cases = RESULTS["studies"]["plan"]["cases"]
    assert len(cases) == 2
    for c in cases:
        assert c["speedup"] >= 1.0 - 1e-6, c["case"]
        # plan's fit rule on the A100 80GB preset's capacity (81,920 MiB, what nvidia-smi reports)
        assert c["best"]["memory_per_gpu"] <= 0.9 * dp.presets.DEVICES["A100"].memory


# -- the committed numbers are the script's --------------------------------------------------------------------
def test_quick_rows_recompute_the_committed_numbers():
    """Rerun the CI-sized rows (``run.py --quick``'s row subset) and get the committed predictions back."""
    fresh = rp.run(quick=True, studies=("sc21_table1", "korthikanti_table5"), log=lambda _: None)
    for study, entry in fresh["studies"].items():
        committed = rows(study)
        for r in entry["rows"]:
            c = committed[r["name"]]
            assert r["predicted"] == pytest.approx(c["predicted"], rel=1e-4), (study, r["name"])
            assert r["step_time"] == pytest.approx(c["step_time"], rel=1e-4), (study, r["name"])
            assert r["memory_per_gpu_gb"] == pytest.approx(c["memory_per_gpu_gb"], rel=1e-4), (study, r["name"])


def test_summary_statistics():
    """MAPE, Kendall tau and the ordered-pair count of a small table, by hand."""
    fake = [{"published": 1.0, "predicted": 1.1}, {"published": 2.0, "predicted": 1.8},
            {"published": 3.0, "predicted": 3.3}]
    s = rp.summary(fake)
    assert s["mape"] == pytest.approx(np.mean([0.1, 0.1, 0.1]))
    assert s["mean_error"] == pytest.approx(0.1 / 3)
    assert s["pairs"] == 3 and s["pairs_ordered"] == 3 and s["order_reproduced"]
    assert s["kendall_tau"] == pytest.approx(1.0)
    swapped = [{"published": 1.0, "predicted": 2.0}, {"published": 2.0, "predicted": 1.0}]
    assert rp.summary(swapped)["pairs_ordered"] == 0 and rp.summary(swapped)["kendall_tau"] == pytest.approx(-1.0)


def test_eq3_flops_is_the_papers_formula():
    """SC'21 Eq. (3) for the 1T row: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)); the published 163 teraFLOP/s
    then means an iteration of F / (163e12 x 3072) seconds."""
    m = rp.gpt(128, 25600, 160)
    f = rp.eq3_flops(3072, m)
    assert f == pytest.approx(96 * 3072 * 2048 * 128 * 25600**2 * (1 + 2048 / (6 * 25600) + 51200 / (16 * 128 * 25600)),
                              rel=1e-12)
    assert f / (163e12 * 3072) == pytest.approx(102.6, rel=0.001)


# -- the TEST set (test_data.toml, test_runs.py): never fitted ----------------------------------------------------
_tspec = importlib.util.spec_from_file_location("published_runs_test", PAPER / "test_runs.py")
tr = importlib.util.module_from_spec(_tspec)
sys.modules[_tspec.name] = tr
_tspec.loader.exec_module(tr)
TEST_RESULTS = json.loads((PAPER / "test_results.json").read_text())


def test_test_set_sources_are_not_fit_sources():
    assert not set(tr.TEST) & set(DATA)
    fit = json.loads((PAPER / "fit_ceilings.json").read_text())
    for device in fit.values():  # the one whole-run parameter per device saw FIT rows only
        assert set(device["studies"]) <= set(rp.STUDIES)


def test_test_results_quote_the_test_data_file():
    published = {}  # a few llm-foundry rows share a name (e.g. two precisions): every value of a name
    for section in ("h100_bf16_large", "h100_bf16", "a100_80gb", "a100_40gb"):
        for r in tr.TEST["llm_foundry"][section]:
            published.setdefault(f"{section}: {r['name']}", set()).add(r["tps_per_gpu"])
    for r in tr.TEST["flash_attention"]["rows"]:
        published.setdefault(r["name"], set()).add(r["tps"] / r["gpus"])
    for r in tr.TEST["bloom"]["rows"]:
        published.setdefault(r["name"], set()).add(r["step_s"])
    assert TEST_RESULTS["rows"]
    for r in TEST_RESULTS["rows"]:
        assert r["published"] in published[r["name"]], r["name"]


def test_test_summary_follows_from_the_committed_rows():
    fresh = tr.summarise(TEST_RESULTS["rows"])
    for key, value in TEST_RESULTS["summary"].items():
        for k, v in value.items():
            assert fresh[key][k] == pytest.approx(v, rel=1e-9), (key, k)


def test_straggler_results_are_the_deterministic_rows_slowed():
    # test_runs.py --stragglers: the same rows, each at most as fast as deterministically, its summary its rows'
    path = Path(tr.HERE) / "test_results_stragglers.json"
    with_stragglers = json.loads(path.read_text())
    assert with_stragglers["stragglers"]["slow_fraction"] == tr.stragglers().slow_fraction
    pairs = zip(TEST_RESULTS["rows"], with_stragglers["rows"], strict=True)
    for det, slow in pairs:
        assert det["name"] == slow["name"] and det["published"] == slow["published"]
        assert slow["error"] <= det["error"] + 1e-9, det["name"]
    fresh = tr.summarise(with_stragglers["rows"])
    for key, value in with_stragglers["summary"].items():
        for k, v in value.items():
            assert fresh[key][k] == pytest.approx(v, rel=1e-9), (key, k)


def test_test_quick_rows_recompute_the_committed_numbers():
    """Rerun ``test_runs.py --quick``'s rows and get the committed predictions back."""
    fresh = tr.run(quick=True, log=lambda _: None)
    committed = {r["name"]: r for r in TEST_RESULTS["rows"]}
    assert len(fresh["rows"]) == len(tr.QUICK)
    for r in fresh["rows"]:
        assert r["predicted"] == pytest.approx(committed[r["name"]]["predicted"], rel=1e-4), r["name"]


def _paper_script(name: str):
    """The module of ``papers/published-runs/<name>.py`` (its folder on ``sys.path`` while it imports ``test_runs``)."""
    sys.path.insert(0, str(PAPER))
    try:
        spec = importlib.util.spec_from_file_location(f"published_runs_{name}", PAPER / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(PAPER))
    return mod


# -- decompose.py: a TEST row's step by kernel class and the attention speed-up that would meet it (a diagnosis) --
@pytest.mark.parametrize("name", ["h100_bf16: MPT-7b seq 65536 8x h100_80gb",
                                  "a100_80gb: MPT-3b seq 32768 8x a100_80gb"])
def test_decompose_attention_speedup_meets_the_published_throughput(name):
    """The speed-up ``decompose.py`` reports, applied to the row's FlashAttention-1 kernels alone (the device's
    ``attention_older`` times it), gives the published throughput back; its shares are of the predicted step."""
    import equinox as eqx

    dc = _paper_script("decompose")
    row = next(r for r in dc.test_runs.rows() if r.name == name)
    d = dc.decompose(row)
    assert 0.99 < sum(d["shares"].values()) < 1.01
    assert d["attention_speedup"] > 1 and d["error"] < 0  # these rows are predicted too slow
    model, cluster, r, zero = row.build.__defaults__
    assert model.flash_version == 1
    device = dp.presets.device(cluster["device"])
    faster = eqx.tree_at(lambda dv: dv.kernels.attention_older, device,
                         device.kernels.attention_older * d["attention_speedup"])
    cfg = dc.test_runs.configuration(model, dict(cluster, device=faster), r["gpus"], r["batch"], zero=zero,
                                     framework=dc.test_runs.FSDP)
    assert cfg.evaluate().tokens_per_second_per_gpu == pytest.approx(row.published, rel=0.005)
    assert d["attention_tflops"] == pytest.approx(d["priced_tflops"] * d["attention_speedup"], rel=1e-6)


# -- host_overhead.py: the host's dispatch against the GPU's block time (a diagnosis; issue 22) ------------------
def _host_overhead():
    return _paper_script("host_overhead")


def test_host_overhead_break_even_makes_a_host_bound_block_the_published_one():
    """At the break-even host cost per op, ``max(GPU, ops x cost)`` is ``1 + error`` times the GPU block (the
    row's published throughput if every block were so host-bound); none for a row predicted too slow."""
    ho = _host_overhead()
    gpu, error, ops = 0.0129, 0.072, 110
    cost = ho.break_even(gpu, error, ops)
    assert max(gpu, ops * cost) == pytest.approx(gpu * (1 + error), rel=1e-12)
    assert ho.break_even(gpu, -0.01, ops) is None


def test_host_overhead_counts_at_least_the_models_kernels_and_a_block_inside_the_step():
    """An eager MPT block dispatches at least one ATen op per kernel of the model's list for it (its forward at
    least the ``F`` kernels, its backward at least ``I + W``); and the GPU block time the script compares with is
    one block of the step: blocks x microbatches x it is within the row's predicted step."""
    pytest.importorskip("torch")
    ho = _host_overhead()
    counts = ho.count_ops()
    row = next(r for r in ho.test_runs_rows() if r.name == "h100_bf16: MPT-1b seq 2048 8x h100_80gb")
    cfg = row.build()
    kernels = cfg.costs().kernels.count()[:, 1]
    assert counts["forward"] >= kernels[0] and counts["backward"] >= kernels[1] + kernels[2]
    block = ho.gpu_block_seconds(cfg)
    step = float(cfg.evaluate().step_time)
    assert 0.5 * step < block * cfg.model.layers * cfg.microbatches < step
