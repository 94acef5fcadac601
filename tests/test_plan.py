"""``plan``: the chosen configuration fits, is never slower than anything evaluated, and every
reported number is ``Configuration.evaluate()``'s; bounds are bounds; infeasible requests get one line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys

import numpy as np
import pytest

import diffpipe as dp
from diffpipe import _caches
from diffpipe._engine._simulate import _simulate_graph
from diffpipe._optimize import _optimize
from diffpipe._plan import _search
from diffpipe._plan._bounds import Costs, closed_form
from diffpipe._plan._space import family_shape
from diffpipe._plan._table import TIE

TINY = dp.Transformer(layers=8, hidden=512, heads=8, sequence=512, vocabulary=4096, activation="swiglu",
                      norm="rmsnorm", positions="rotary", bias=False, dropout=False, kv_heads=4)
#: A device small enough that memory decides (about 60 MB), with a preset-like memory bandwidth.
SMALL = dp.Device(peak_flops=1e15, memory=6e7, efficiency=0.5, name="small")


def cluster(device=SMALL, gpus=16):
    return dp.Cluster(device=device, gpus=gpus, devices_per_node=8, memory_bandwidth=3e12)


@pytest.fixture(scope="module")
def table():
    # few graph structures (each compiles once): two tensor and two pipeline sizes, Megatron's families
    return dp.plan(TINY, cluster(), 64, tensor=(2, 4), pipeline=(2, 4), families=("1f1b", "interleaved-1f1b"),
                   virtual=(2,), microbatch_sizes=(1, 2), balance=False, progress=False)


def test_best_fits_and_is_never_slower(table):
    best = table.best
    assert best["memory_per_gpu"] <= best["capacity"] * 0.9
    steps = [r["step_time"] for r in table.rows]
    assert best["step_time"] <= min(steps) * (1 + TIE)  # ties go to less memory (test_cli_defaults)
    assert all(r["memory_per_gpu"] <= r["capacity"] * 0.9 for r in table.rows)
    assert table.simulated >= len([r for r in table.rows if not r["balanced"]])
    assert table.explored >= table.simulated + sum(v for k, v in table.rejected.items() if k != "memory (simulated)")
    assert table.rejected.get("memory", 0) > 0  # the small device makes memory matter


def test_rows_equal_configuration_evaluate(table):
    for i in sorted({0, len(table.rows) - 1}):
        row, result = table.rows[i], table.configuration(i).evaluate()
        # the batched simulation gives evaluate's step and memory; the figures are its formulas
        for name in ("step_time", "memory_per_gpu", "tokens_per_second_per_gpu", "mfu", "communication_share"):
            assert row[name] == getattr(result, name), name
        assert row["bubble_ratio"] == pytest.approx(result.bubble_ratio, rel=1e-6, abs=1e-7)


def test_bound_is_a_lower_bound(table):
    for row in table.rows:
        if not row["balanced"]:
            assert row["bound"] <= row["step_time"] * (1 + 1e-5)


@pytest.mark.parametrize(("family", "pipeline", "virtual"), [("1f1b", 4, 1), ("interleaved-1f1b", 2, 2),
                                                              ("zb-h1", 4, 1)])
def test_closed_form_memory_is_a_lower_bound(family, pipeline, virtual):
    clu = cluster(dp.presets.device("H100"))
    par = dp.Parallelism(tensor=2, pipeline=pipeline, data=16 // (2 * pipeline), virtual=virtual, zero=1,
                         sequence_parallel=True)
    cfg = dp.Configuration(TINY, par, clu, 64, schedule=family)
    result = cfg.evaluate()
    links = cfg.placement.links
    k = Costs(TINY, dataclasses.replace(par, pipeline=1, virtual=1), clu, links)
    static, act, before, work, update = closed_form(k, TINY, pipeline, virtual, family_shape(family)[2], {})
    peak = np.asarray(dp.schedules.peak_activations(cfg.schedule()), float)
    assert np.all(static + act <= np.asarray(result.memory) * (1 + 1e-6))
    assert np.all(static + peak * act <= np.asarray(result.memory) * (1 + 1e-6))
    assert np.max(before + cfg.microbatches * work + update) <= result.step_time * (1 + 1e-5)


def test_balanced_rows_are_verified():
    heavy = dataclasses.replace(TINY, vocabulary=65536)  # a heavy head: the uniform split is unbalanced
    _simulate_graph._cached.clear_cache()
    table = dp.plan(heavy, cluster(dp.presets.device("H100")), 64, pipeline=4, tensor=1,
                    families=("1f1b",), microbatch_sizes=(1,), recompute=("none",), zero=(1,),
                    sequence_parallel=(False,), top_k=1, progress=False)
    balanced = [i for i, r in enumerate(table.rows) if r["balanced"]]
    assert balanced, "a heavy head should move layers off the last stage"
    assert _simulate_graph._cached._cache_size() == 0  # balancing compiled no evaluator per graph structure
    i = balanced[0]
    row, result = table.rows[i], table.configuration(i).evaluate()
    # the balanced row comes from the search's batched program on the graph's bucket (no program of
    # its own): every figure is evaluate's bit for bit
    for name in ("step_time", "memory_per_gpu", "tokens_per_second_per_gpu", "mfu", "communication_share",
                 "bubble_ratio", "capacity"):
        assert row[name] == getattr(result, name), name
    assert row["layers_per_stage"] != (2, 2, 2, 2) and sum(row["layers_per_stage"]) == heavy.layers
    assert table.best["step_time"] <= min(r["step_time"] for r in table.rows if not r["balanced"]) * (1 + TIE)


def test_a_plan_from_kept_results_is_the_computed_plan(tmp_path, monkeypatch):
    """``optimize``'s results kept on disk (``diffpipe._store``; the same request as above, so the
    programs are compiled already): a fresh process's plan read from them is the computed plan,
    table and ``to_dict()`` (its timings aside) byte for byte, and balances nothing again."""
    heavy = dataclasses.replace(TINY, vocabulary=65536)
    request = dict(pipeline=4, tensor=1, families=("1f1b",), microbatch_sizes=(1,), recompute=("none",), zero=(1,),
                   sequence_parallel=(False,), top_k=1, progress=False)
    monkeypatch.setattr(_caches, "_RESULT_DIR", [tmp_path])
    runs = []
    real = _optimize._descend
    monkeypatch.setattr(_optimize, "_descend", lambda *a: runs.append(1) or real(*a))
    _optimize._STORED.clear()  # this process's results: every hit below is read from disk
    computed = dp.plan(heavy, cluster(dp.presets.device("H100")), 64, **request)
    assert runs and any(r["balanced"] for r in computed.rows) and list(tmp_path.glob("*.npz"))
    runs.clear()
    _optimize._STORED.clear()
    kept = dp.plan(heavy, cluster(dp.presets.device("H100")), 64, **request)
    _optimize._STORED.clear()
    assert not runs  # every balancing read back
    assert kept.to_markdown(top=None) == computed.to_markdown(top=None)
    no_timing = lambda t: json.dumps({k: v for k, v in t.to_dict().items() if k != "seconds"})  # noqa: E731
    assert no_timing(kept) == no_timing(computed)


@pytest.mark.slow
def test_shared_descents_leave_the_plan_unchanged(monkeypatch):
    """The balanced rows share one descent padded to their common sizes, stage counts included (4
    and 8 stages: a padded stage split); the table is the one each row's own descent gives, number
    for number."""
    heavy = dataclasses.replace(TINY, vocabulary=65536)  # a heavy head: the uniform split is unbalanced
    # the best three: zb-h1 (4 stages), zb-h1 at 2 virtual stages (8) and 1f1b (4, fewer levels)
    request = dict(pipeline=4, tensor=1, families=("1f1b", "zb-h1"), microbatch_sizes=(2,), recompute=("none",),
                   zero=(1,), sequence_parallel=(False,), top_k=3, progress=False)
    shared = []
    real = _search._shared_sizes
    monkeypatch.setattr(_search, "_shared_sizes", lambda graphs: shared.append(real(graphs)) or shared[-1])
    table = dp.plan(heavy, cluster(dp.presets.device("H100")), 64, **request)
    assert len(shared) == 1 and len(shared[0]) == 3  # the three graphs (4, 8, 4 stages), padded to one size
    assert len({tuple(sorted(s.items())) for s in shared[0].values()}) == 1
    assert any(r["balanced"] for r in table.rows)
    monkeypatch.setattr(_search, "_shared_sizes", lambda graphs: {})
    alone = dp.plan(heavy, cluster(dp.presets.device("H100")), 64, **request)
    assert table.rows == alone.rows


def test_best_exports_to_megatron(table):
    launch = table.launch(0)
    parser = argparse.ArgumentParser()
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--num-layers", "--micro-batch-size",
                 "--global-batch-size", "--seq-length", "--num-layers-per-virtual-pipeline-stage"):
        parser.add_argument(flag, type=int)
    for flag in ("--pipeline-model-parallel-layout", "--recompute-granularity", "--recompute-method",
                 "--data-parallel-sharding-strategy", "--ckpt-format"):
        parser.add_argument(flag)
    parser.add_argument("--recompute-num-layers", type=int)
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp"):
        parser.add_argument(flag, action="store_true")
    ns = parser.parse_args(shlex.split(shlex.join(dp.megatron_args(launch))))
    assert ns.tensor_model_parallel_size * ns.pipeline_model_parallel_size * table.best["data"] == 16
    assert ns.global_batch_size == 64


def test_infeasible_memory_is_one_line():
    tiny_memory = dp.Device(peak_flops=1e15, memory=1e6, name="tiny")
    with pytest.raises(dp.ConfigError, match="no configuration fits") as info:
        dp.plan(TINY, cluster(tiny_memory), 64, recompute=("none",), microbatch_sizes=(1,), progress=False)
    message = str(info.value)
    assert "\n" not in message and "recompute='full'" in message


def test_infeasible_batch_is_one_line():
    with pytest.raises(dp.ConfigError, match="global batch") as info:
        dp.plan(TINY, cluster(dp.presets.device("H100")), 7, pipeline=(1,), microbatch_sizes=(1,), progress=False)
    assert "\n" not in str(info.value)


def test_table_outputs(table):
    data = table.to_dict()
    assert data["rows"][0]["step_time"] == table.best["step_time"]
    assert '"explored"' in table.to_json()
    assert table.to_csv().splitlines()[0].startswith("family,tensor")
    assert "configurations explored" in table.to_markdown(3)


def test_communication_may_be_a_mode_object():
    # as Configuration takes it (test_configuration): a built-in mode as its object plans as its name, a
    # calibrated machine's mode (torch's runtime) plans too, and anything else is one line naming plan
    from diffpipe._engine._communication import MODES
    from diffpipe.calibrate import TorchRuntime

    request = dict(tensor=2, pipeline=2, families=("1f1b",), microbatch_sizes=(1,), recompute=("full",), zero=(3,),
                   sequence_parallel=(True,), balance=False, progress=False)
    by_name = dp.plan(TINY, cluster(), 64, communication="blocking", **request)
    by_object = dp.plan(TINY, cluster(), 64, communication=MODES["blocking"](), **request)
    assert [r["step_time"] for r in by_object.rows] == [r["step_time"] for r in by_name.rows]
    assert by_object.configuration().communication == MODES["blocking"]()
    runtime = dp.plan(TINY, cluster(), 64, communication=TorchRuntime(), **request)
    assert runtime.configuration().communication == TorchRuntime()
    assert runtime.best["step_time"] == runtime.configuration().evaluate().step_time
    for bad in (3, "warp"):
        with pytest.raises(dp.ConfigError, match=f"plan: communication {bad!r} is not one of"):
            dp.plan(TINY, cluster(), 64, communication=bad, **request)


def test_bad_arguments():
    with pytest.raises(dp.ConfigError, match="recompute"):
        dp.plan(TINY, cluster(), 64, recompute=("sometimes",))
    with pytest.raises(dp.ConfigError, match="headroom"):
        dp.plan(TINY, cluster(), 64, headroom=1.5)
    with pytest.raises(dp.ConfigError, match="nope"):
        dp.plan(TINY, cluster(), 64, families=("nope",))


def test_cli_plan_exports(tmp_path, capsys):
    import json
    import tomllib

    from diffpipe.cli import main

    out = tmp_path / "job.toml"
    code = main(["plan", "--model", "llama-3-8b", "--cluster", "8xH100", "--global-batch", "8", "--families", "1f1b",
                 "--tp", "4,8", "--pp", "1,2", "--microbatch-size", "1", "--recompute", "full",
                 "--zero", "0", "--sequence-parallel", "--balance-top", "0", "--export", "torchtitan-v0.2",
                 "--out", str(out), "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rows"] and data["explored"] >= len(data["rows"])
    doc = tomllib.loads(out.read_text())
    best = data["rows"][0]
    assert doc["parallelism"]["tensor_parallel_degree"] == best["tensor"]
    assert {(r["tensor"], r["pipeline"]) for r in data["rows"]} <= {(4, 1), (4, 2), (8, 1)}
    assert all(r["sequence_parallel"] and r["recompute"] == "full" and r["zero"] == 0 for r in data["rows"])


def test_cli_plan_flags_are_the_configuration_s():
    """plan parses the simulate/compare configuration flags (one definition, lists where it
    searches); its older names --tensor and --pipeline are refused (a usage error)."""
    from diffpipe.cli import build_parser

    parser = build_parser()
    new = parser.parse_args(["plan", "--model", "m", "--gpus", "8", "--global-batch", "8", "--tp", "2,4", "--pp", "1",
                             "--microbatch-size", "1,2", "--recompute", "none,full", "--zero", "1,3", "--vpp", "2",
                             "--ep", "1", "--no-sequence-parallel", "--flash-attention", "--families", "1f1b,zb-h1"])
    old = parser.parse_args(["plan", "--model", "m", "--gpus", "8", "--global-batch", "8", "--tp", "2,4",
                             "--pp", "1", "--microbatch-sizes", "1,2", "--recompute", "none,full", "--zero",
                             "1,3", "--vpp", "2", "--ep", "1", "--no-sequence-parallel", "--flash-attention",
                             "--families", "1f1b,zb-h1"])
    assert vars(new) == vars(old)
    from diffpipe.cli._args import _UsageError

    for flag in ("--tensor", "--pipeline"):
        with pytest.raises(_UsageError, match=f"unrecognized arguments: {flag} 2"):
            parser.parse_args(["plan", "--model", "m", "--gpus", "8", "--global-batch", "8", flag, "2"])
    assert (new.tensor, new.pipeline, new.microbatch_size, new.recompute, new.zero) == (
        [2, 4], [1], [1, 2], ["none", "full"], [1, 3])
    assert new.sequence_parallel is False and new.flash_attention is True and new.families == ["1f1b", "zb-h1"]
    one = parser.parse_args(["simulate", "--model", "m", "--global-batch", "8", "--tp", "2", "--zero", "1"])
    assert (one.tensor, one.zero, one.model, one.global_batch) == (2, 1, "m", 8)
    # the help states dp.plan's defaults (the CLI parses without importing JAX, so it cannot read them)
    from diffpipe._plan import _space as _plan
    from diffpipe.cli._args import _CONFIG_FLAGS

    defaults = {f.flag: f.default for f in _CONFIG_FLAGS}
    assert defaults["--microbatch-size"] == ",".join(map(str, _plan.DEFAULT_MICROBATCH_SIZES))
    assert defaults["--vpp"].startswith(",".join(map(str, _plan.DEFAULT_VIRTUAL)) + " ")


def test_cli_plan_infeasible_is_one_line(capsys):
    from diffpipe.cli import main

    code = main(["plan", "--model", "llama-3.1-405b", "--gpus", "8", "--global-batch", "8", "--families", "1f1b",
                 "--microbatch-sizes", "1", "--recompute", "none", "--zero", "0", "--balance-top", "0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "no configuration fits" in err


def test_progress_says_plan(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # the plain stderr line, whether tqdm is installed or not
    dp.plan(TINY, cluster(dp.presets.device("H100")), 64, tensor=2, pipeline=2, families=("1f1b",),
            microbatch_sizes=(1,), recompute=("none",), zero=(0,), sequence_parallel=(False,), balance=False,
            progress=True)
    err = capsys.readouterr().err  # not a terminal: plain lines with the stage, no bar
    assert err.startswith("diffpipe plan: ") and "\r" not in err and "sweep" not in err
    assert "searching" in err and err.rstrip().splitlines()[-1].startswith("diffpipe plan: done in")


def test_cli_plan_reads_a_hf_config(tmp_path, capsys):
    import json

    from diffpipe.cli import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(model_type="llama", num_hidden_layers=8, hidden_size=512, num_attention_heads=8,
                                      num_key_value_heads=4, intermediate_size=1024, vocab_size=4096,
                                      max_position_embeddings=1024, hidden_act="silu", tie_word_embeddings=False)))
    code = main(["plan", "--hf-config", str(config), "--cluster", "8xH100", "--global-batch", "16", "--families",
                 "1f1b", "--tp", "1,2", "--pp", "2", "--microbatch-size", "1", "--recompute", "none", "--zero", "1",
                 "--no-sequence-parallel", "--balance-top", "0", "--sequence", "512", "--export", "megatron", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert all(not r["sequence_parallel"] and r["pipeline"] == 2 for r in data["rows"])
    assert "--seq-length 512" in data["export"]["text"] and "--num-layers 8" in data["export"]["text"]


def _apply(suggestion, request):
    """The plan keyword change a suggestion's text names (``_infeasible``'s wording)."""
    import re

    changes = {}
    for part in suggestion.removeprefix("together: ").split(", "):
        if part == "allow recompute='full'":
            changes["recompute"] = (*request.get("recompute", ()), "full")
        elif part == "allow zero=3":
            changes["zero"] = (*request.get("zero", ()), 3)
        elif found := re.match(r"allow tensor=(\d+)$", part):
            changes["tensor"] = (*request.get("tensor", (1, 2, 4)), int(found[1]))
        elif found := re.match(r"use (\d+) GPUs( \(\d+ do not fit\))?$", part):
            changes["cluster"] = cluster(request["cluster"].device, int(found[1]))
        elif found := re.match(r"use a global batch that is a multiple of \d+ \(e\.g\. (\d+)\)$", part):
            changes["global_batch"] = int(found[1])
        else:
            raise AssertionError(f"unknown suggestion {part!r}")
    return changes


@pytest.mark.parametrize("request_", [
    dict(cluster=cluster(dp.Device(peak_flops=1e15, memory=2.2e7, name="d")), global_batch=64, recompute=("none",),
         microbatch_sizes=(1,), families=("1f1b",)),
    dict(cluster=cluster(dp.Device(peak_flops=1e15, memory=1.5e7, name="d")), global_batch=64,
         recompute=("none", "selective"), zero=(0,), microbatch_sizes=(1,), families=("1f1b",)),
    dict(cluster=cluster(SMALL), global_batch=7, pipeline=(1,), microbatch_sizes=(1,), families=("1f1b",)),
])
def test_every_infeasible_suggestion_applied_makes_the_request_feasible(request_):
    """Issue 20: the binding constraint is named with its numbers, and the change suggested (each
    is re-checked by a search before it is printed) makes the request feasible when applied."""
    with pytest.raises(dp.ConfigError) as info:
        dp.plan(TINY, **request_, balance=False, progress=False)
    message = str(info.value)
    assert "\n" not in message and "inf GB" not in message and "none of these" not in message, message
    if "no configuration fits" in message:
        assert "binding constraint" in message and " GB" in message
    suggestion = message.rsplit(": ", 1)[1]
    table = dp.plan(TINY, **{**request_, **_apply(suggestion, request_)}, balance=False, progress=False)
    assert table.rows


def test_suggested_gpu_count_is_the_fewest_that_fit():
    """Issue 24, "hints that point the wrong way": the GPU count suggested for a memory-infeasible
    request is the fewest whole nodes the same search fits in (it used to double the memory bound's
    guess: 32 here, where 24 fit), and the count one node fewer was checked not to fit."""
    import re

    device = dp.Device(peak_flops=1e15, memory=4e7, name="d")
    request = dict(global_batch=64, microbatch_sizes=(1,), families=("1f1b",), balance=False, progress=False)
    with pytest.raises(dp.ConfigError, match="binding constraint") as info:
        dp.plan(TINY, cluster(device, 16), **request)
    found = re.search(r": use (\d+) GPUs \((\d+) do not fit\)$", str(info.value))
    assert found, str(info.value)
    gpus, below = int(found[1]), int(found[2])
    assert (gpus, below) == (24, 16)  # 16 is the request itself
    assert dp.plan(TINY, cluster(device, gpus), **request).rows


def test_export_limits_filter_the_search():
    # 16 GPUs at TP2 PP4: DP2, 20 samples -> 10 microbatches: Megatron cannot interleave them on 4 stages
    table = dp.plan(TINY, cluster(dp.presets.device("H100")), 20, tensor=(2,), pipeline=(4,),
                    families=("1f1b", "interleaved-1f1b", "zb-h1"), virtual=(2,), microbatch_sizes=(1,),
                    recompute=("none",), zero=(0,), sequence_parallel=(False,), balance=False, progress=False,
                    export="megatron")
    # interleaved (10 microbatches) and zb-h1 (chunks 1 and 2) are not searched
    assert {r["family"] for r in table.rows} == {"1f1b"} and table.rejected["megatron export"] == 3
    dp.megatron_args(table.launch(0))  # every row exports


def test_export_limits_refuse_at_once():
    with pytest.raises(dp.ConfigError, match="no configuration of this search exports to torchtitan: torchtitan has "
                                             "no ZeRO-1") as info:
        dp.plan(TINY, cluster(), 64, zero=1, progress=False, export="torchtitan")
    assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def megatron_table():
    return dp.plan(TINY, cluster(), 64, tensor=(2, 4), pipeline=(2, 4), families=("1f1b", "interleaved-1f1b"),
                   virtual=(2,), microbatch_sizes=(1, 2), balance=False, progress=False, framework="megatron")


def test_plan_prices_the_framework(table, megatron_table):
    assert megatron_table.framework.name == "megatron"
    for i in sorted({0, len(megatron_table.rows) - 1}):
        row, cfg = megatron_table.rows[i], megatron_table.configuration(i)
        assert cfg.framework.name == "megatron"
        assert row["step_time"] == cfg.evaluate().step_time
        if not row["balanced"]:
            assert row["bound"] <= row["step_time"] * (1 + 1e-5)
    # Megatron's overlaps hide tensor collectives and the gradient sync: its best step is faster
    assert megatron_table.best["step_time"] < table.best["step_time"]
    # the export launches what was priced: Megatron's overlap flags
    _, text = megatron_table.export("megatron")
    assert "--overlap-grad-reduce" in text and "--overlap-grad-reduce" not in table.export("megatron")[1]


@pytest.mark.parametrize(("framework", "zero"), [("megatron", 1), ("torchtitan", 3), ("ddp", 0)])
def test_closed_form_time_bound_holds_under_a_framework(framework, zero):
    clu = cluster(dp.presets.device("H100"))
    par = dp.Parallelism(tensor=2, pipeline=2, data=4, zero=zero, sequence_parallel=True)
    cfg = dp.Configuration(TINY, par, clu, 64, framework=framework)
    result = cfg.evaluate()
    fw = dp.presets.framework(framework)
    k = Costs(TINY, dataclasses.replace(par, pipeline=1, virtual=1), clu, cfg.placement.links, fw)
    unhidden = Costs(TINY, dataclasses.replace(par, pipeline=1, virtual=1), clu, cfg.placement.links)
    static, act, before, work, update = closed_form(k, TINY, 2, 1, family_shape("1f1b")[2], {})
    assert np.max(before + cfg.microbatches * work + update) <= result.step_time * (1 + 1e-5)
    if framework == "megatron":  # the tensor collectives' unhideable share is counted, not all of them
        assert np.all(k.work <= unhidden.work) and np.any(k.work < unhidden.work)


def test_shared_evaluation_shapes_compile_fewer_programs_and_leave_the_plan_unchanged(monkeypatch):
    """The search's exact evaluations run on shapes shared across size buckets (``_search._Shapes``):
    fewer compiled batched simulations than one per bucket, and the same rows, number for number."""
    from diffpipe._engine._batch import batched_simulation

    request = dict(tensor=(2, 4), pipeline=(2, 4), families=("1f1b", "interleaved-1f1b"), virtual=(2,),
                   microbatch_sizes=(1, 2), balance=False, progress=False)
    batched_simulation._cached.clear_cache()
    shared = dp.plan(TINY, cluster(), 64, **request)
    programs = batched_simulation._cached._cache_size()
    monkeypatch.setattr(_search, "SHAPE_RATIO", 1)  # every graph on its own bucket
    monkeypatch.setattr(_search, "SHAPE_LOOKAHEAD", 0)
    batched_simulation._cached.clear_cache()
    alone = dp.plan(TINY, cluster(), 64, **request)
    assert programs < batched_simulation._cached._cache_size()
    assert shared.rows == alone.rows
