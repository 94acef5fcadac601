"""Context parallelism (``Parallelism(context=c)``): the sequence split over ``c`` ranks next to the tensor
group, ring attention's K,V exchange, gradients and ZeRO over data x context; against hand computations
and against the unsplit model (per-rank work times ``c`` is the whole)."""

from __future__ import annotations

import dataclasses
import json

import chex
import numpy as np
import pytest
from _helpers import hf_config, run

import diffpipe as dp
from diffpipe._model._kernels import layer_kernels
from diffpipe._model._transformer import activation_bytes, layer_costs
from diffpipe._plan._space import CONTEXT_MIN_TOKENS, CONTEXT_SEQUENCE, context_sizes
from diffpipe._workload._parallel import Parallelism, parallel_costs, placement, ring_exchange, shard_flops


def llama(**kw):
    """A small Llama-shaped model: GQA (2 K,V heads of 8), SwiGLU, RMSNorm, rotary, flash attention."""
    fields = dict(layers=4, hidden=256, heads=8, sequence=1024, vocabulary=1000, microbatch_size=2, kv_heads=2,
                  ffn_hidden=512, activation="swiglu", norm="rmsnorm", positions="rotary", bias=False, dropout=False,
                  tied_embedding=False, flash_attention=True)
    return dp.Transformer(**{**fields, **kw})


def one_line(info) -> str:
    text = str(info.value)
    assert "\n" not in text
    return text


# -- the ring exchange: bytes against a hand computation ---------------------------------------------
def test_ring_block_and_volumes_by_hand():
    m = llama()  # b = 2, s = 1024, a_kv = 2, d_h = d_v = 256 / 8 = 32, 2-byte elements
    c, t = 4, 2
    costs = parallel_costs(m, Parallelism(tensor=t, context=c))
    block = 2 * 2 * (1024 // 4) * (2 // 2) * (32 + 32)  # d x b x s/c tokens x a_kv/t heads x (d_h + d_v)
    assert block == 65536
    np.testing.assert_array_equal(costs.context_block, [0.0, block, block, block, block, 0.0])
    # bandwidth 1 byte/s, no latency, no overlap: the seconds are the bytes each op waits for
    ring = np.asarray(ring_exchange(costs.context_block, c, 1.0, 0.0))
    np.testing.assert_array_equal(ring[0], (c - 1) * costs.context_block)  # forward: c - 1 blocks
    np.testing.assert_array_equal(ring[1], 2 * (c - 1) * costs.context_block)  # backward: K,V then dK,dV
    np.testing.assert_array_equal(ring[2], 0.0)
    # TransformerEngine's backward loop: K,V; (c - 2) x [K,V + dK,dV]; dK,dV
    assert ring[1, 1] == block + (c - 2) * 2 * block + block
    recomputed = np.asarray(ring_exchange(costs.context_block, c, 1.0, 0.0, recompute_step=0.0))
    np.testing.assert_array_equal(recomputed[1], 3 * (c - 1) * costs.context_block)


def test_ring_overlap_exposes_only_what_a_step_does_not_hide():
    block = np.array([0.0, 100.0, 0.0])
    c, bw, lat = 4, 10.0, 1.0  # one block: 1 + 10 = 11 s; K,V + dK,dV: 1 + 20 = 21 s
    ring = np.asarray(ring_exchange(block, c, bw, lat, forward_step=4.0, backward_step=15.0))
    assert ring[0, 1] == pytest.approx(3 * (11 - 4))
    assert ring[1, 1] == pytest.approx(2 * 0 + 2 * (21 - 15))  # the single-block steps are hidden
    np.testing.assert_array_equal(ring[:, [0, 2]], 0.0)  # no block, no latency either
    hidden = np.asarray(ring_exchange(block, c, bw, lat, forward_step=30.0, backward_step=30.0))
    np.testing.assert_array_equal(hidden, 0.0)


def test_configuration_prices_the_ring_on_its_link():
    m = llama(sequence=8192, microbatch_size=1, kv_heads=8)
    par = Parallelism(tensor=8, context=2)  # the context group strides by 8: two nodes
    slow = dp.Cluster("H100", gpus=16, inter=(1e9, 1e-5))
    cfg = dp.Configuration(m, par, slow, 4)
    assert cfg.placement.links["context"] == "inter"
    costs = cfg.costs()
    bw, lat = slow.bus_bandwidth("inter", 1), slow.step_latency("inter")
    no_overlap = np.asarray(ring_exchange(costs.context_block, 2, bw, lat))
    got = np.asarray(cfg.context_seconds())
    assert np.all(got >= 0) and np.all(got <= no_overlap + 1e-12) and got[0, 1] > 0
    # a device without a kernel model has no attention kernel to overlap: the whole ring is exposed
    bare = dp.Cluster(slow.device.without_kernels(), gpus=16, inter=(1e9, 1e-5))
    chex.assert_trees_all_close(np.asarray(dp.Configuration(m, par, bare, 4).context_seconds()), no_overlap,
                                rtol=1e-6)
    # the exposed ring is part of the step and of its breakdown
    fast = dp.Configuration(m, par, dp.Cluster("H100", gpus=16), 4).evaluate()
    res = cfg.evaluate()
    assert res.breakdown["exposed_context"] > 0 and res.step_time > fast.step_time


# -- per-rank work sums to the unsplit model's ---------------------------------------------------------
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("c", [2, 4])
def test_per_rank_flops_and_activations_sum_to_the_unsplit_total(recompute, c):
    m = llama(recompute=recompute)
    whole = parallel_costs(m, Parallelism(tensor=2, sequence_parallel=True))
    part = parallel_costs(m, Parallelism(tensor=2, context=c, sequence_parallel=True))
    for name in ("forward", "input_grad", "weight"):
        chex.assert_trees_all_close(c * getattr(part.costs, name), getattr(whole.costs, name), rtol=1e-12)
    chex.assert_trees_all_close(c * part.kernels.gemm_flops(), whole.kernels.gemm_flops(), rtol=1e-12)

    def attention_flops(kernels):
        out = np.zeros((3, kernels.rows))
        at = kernels.attention
        np.add.at(out, (at[:, 1].astype(int), at[:, 0].astype(int)), at[:, 2])
        return out

    chex.assert_trees_all_close(c * attention_flops(part.kernels), attention_flops(whole.kernels), rtol=1e-12)
    assert len(part.kernels.attention) == c * len(whole.kernels.attention)  # one kernel per ring step
    chex.assert_trees_all_close(c * part.activation_bytes, whole.activation_bytes, rtol=1e-12)
    chex.assert_trees_all_close(c * part.output_bytes, whole.output_bytes, rtol=1e-12)
    chex.assert_trees_all_close(c * part.collective_bytes["tensor"], whole.collective_bytes["tensor"], rtol=1e-12)
    # parameters are not split by the context group
    chex.assert_trees_all_close(part.parameters, whole.parameters)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_gradients_and_zero_shard_over_data_times_context(zero):
    m = llama()
    cp = parallel_costs(m, Parallelism(data=2, context=2, zero=zero))
    dp4 = parallel_costs(m, Parallelism(data=4, zero=zero))
    for name in ("static_bytes", "gradient_bytes", "update_bytes"):
        chex.assert_trees_all_close(getattr(cp, name), getattr(dp4, name))
    if zero == 3:
        chex.assert_trees_all_close(cp.gather_bytes, dp4.gather_bytes)
    cfg = dp.Configuration(m, Parallelism(data=2, context=2, zero=zero), dp.Cluster("H100", gpus=4), 8)
    assert cfg.network().data_parallel == 4 and cfg.microbatches == 8 // (2 * 2)  # b = 2, data = 2


def test_context_one_is_the_model_without_it():
    # the c = 1 path is the pre-context-parallel one: the same calls, bit for bit
    m = llama(recompute="selective")
    got = parallel_costs(m, Parallelism(tensor=2, data=2, zero=1, sequence_parallel=True))
    assert got.context_block is None and got.context == 1
    want_kernels = layer_kernels(m, tensor=2, sequence_parallel=True)
    for table in ("gemm", "attention", "memory"):
        np.testing.assert_array_equal(getattr(got.kernels, table), getattr(want_kernels, table))
    want = shard_flops(layer_costs(m), 2)
    for f in dataclasses.fields(want):
        np.testing.assert_array_equal(getattr(got.costs, f.name), getattr(want, f.name))
    np.testing.assert_array_equal(got.activation_bytes, activation_bytes(m, tensor=2, sequence_parallel=True))
    res = dp.Configuration(m, Parallelism(tensor=2, data=2, zero=1), dp.Cluster("H100", gpus=4), 8).evaluate()
    assert "exposed_context" not in res.breakdown


# -- sizes, placement and bad input ------------------------------------------------------------------------
def test_gpus_and_placement_next_to_the_tensor_group():
    p = Parallelism(tensor=8, context=16, pipeline=16, data=8)  # Llama 3 405B, Table 4 row 3
    assert p.gpus == 16384 and p.shards == 128
    got = placement(Parallelism(tensor=8, context=2), dp.Cluster(gpus=16))
    assert got.links["context"] == "inter" and got.links["data"] == "inter" and got.ranks_per_node["context"] == 1
    got = placement(Parallelism(tensor=2, context=2, data=2), dp.Cluster(gpus=8))
    assert got.links == {"tensor": "intra", "context": "intra", "expert": "intra", "data": "intra"}
    assert got.ranks_per_node["data"] == 4  # data x context ranks of one gradient ring, stride 2
    # pipeline neighbours stride by tensor x context x data
    assert placement(Parallelism(tensor=2, context=2, pipeline=4), dp.Cluster(gpus=16)).stages_per_node == 2
    assert placement(Parallelism(tensor=2, pipeline=4, data=2), dp.Cluster(gpus=16)).stages_per_node == 2


@pytest.mark.parametrize("kwargs, model, gpus, culprit", [
    (dict(context=2), llama(sequence=1026), None, "context=2 needs a sequence that is a multiple of 2 x 2 = 4"),
    (dict(context=4), llama(sequence=1020), None, "multiple of 2 x 4 = 8 .*, got sequence=1020"),
    (dict(context=2), llama(flash_attention=False), None, "context=2 needs flash attention"),
    (dict(tensor=8, context=256, sequence_parallel=True), llama(kv_heads=8), None,
     "tensor=8 must divide the 4 tokens per context rank"),
    (dict(tensor=2, context=2), llama(), 8, "tensor x context x pipeline x data = 2 x 2 x 1 x 1 = 4, but the "
     "cluster has 8 GPUs"),
])
def test_bad_context_is_one_line_naming_it(kwargs, model, gpus, culprit):
    with pytest.raises(dp.ConfigError, match=culprit) as info:
        Parallelism(**kwargs).check(model, gpus)
    one_line(info)


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_context_size_must_be_a_positive_int(value):
    with pytest.raises(dp.ConfigError, match="context") as info:
        Parallelism(context=value)
    one_line(info)


# -- plan --------------------------------------------------------------------------------------------------
def test_default_context_sizes():
    assert (CONTEXT_SEQUENCE, CONTEXT_MIN_TOKENS) == (16384, 4096)
    assert context_sizes(llama(sequence=8192), None) == (1,)
    assert context_sizes(llama(sequence=16384), None) == (1, 2, 4)
    assert context_sizes(llama(sequence=131072), None) == (1, 2, 4, 8, 16, 32)
    assert context_sizes(llama(sequence=131072, flash_attention=False), None) == (1,)
    assert context_sizes(llama(sequence=24576), None) == (1, 2, 4)  # 24576 = 2^13 x 3: 8 would leave 3,072 per rank
    assert context_sizes(llama(), (1, 2)) == (1, 2)
    with pytest.raises(dp.ConfigError, match="context=3 needs a sequence that is a multiple of 2 x 3") as info:
        context_sizes(llama(), 3)
    one_line(info)
    with pytest.raises(dp.ConfigError, match="context=2 needs flash attention"):
        dp.plan(llama(flash_attention=False), dp.Cluster("H100", gpus=8), 8, context=2)


SMALL_AXES = dict(families=("1f1b",), tensor=(1,), pipeline=(1, 2), microbatch_sizes=(1,), recompute=("none",),
                  zero=(1,), sequence_parallel=(False,), balance=False, progress=False)


def test_plan_searches_context_and_its_rows_reproduce():
    m = llama(sequence=4096, microbatch_size=1)
    cluster = dp.Cluster("H100", gpus=8)
    table = dp.plan(m, cluster, 8, context=(1, 2, 4), **SMALL_AXES)
    # (context, pipeline, data): (1, 1, 8) (1, 2, 4) (2, 1, 4) (2, 2, 2) (4, 1, 2) (4, 2, 1); on this small
    # model the split only adds kernels, and the step-time bound prunes every context split unsimulated
    assert table.explored == 6 and table.rows[0]["context"] == 1
    for c in (2, 4):
        table = dp.plan(m, cluster, 8, context=c, **SMALL_AXES)
        assert {r["context"] for r in table.rows} == {c}
        for i, row in enumerate(table.rows):
            assert table.parallelism(i).context == c and row["data"] * row["pipeline"] * c == 8
            res = table.configuration(i).evaluate()
            assert res.step_time == pytest.approx(row["step_time"], rel=1e-5)
            assert res.memory_per_gpu == pytest.approx(row["memory_per_gpu"], rel=1e-6)
        assert "| cp |" in table.to_markdown()


def test_plan_splits_the_sequence_when_memory_needs_it():
    # one GPU's usable memory below a whole sequence's activations: only a context split fits
    m = llama(sequence=65536, microbatch_size=1, layers=8)
    cluster = dp.Cluster("H100", gpus=8)
    need = {c: float(parallel_costs(m, Parallelism(context=c, data=8 // c, zero=1)).activation_bytes.sum()
                     + parallel_costs(m, Parallelism(context=c, data=8 // c, zero=1)).static_bytes.sum())
            for c in (1, 2, 4, 8)}
    usable = (need[2] + need[4]) / 2  # between CP 2 and CP 4
    headroom = 1 - usable / float(cluster.device.memory)
    axes = {**SMALL_AXES, "pipeline": (1,)}
    table = dp.plan(m, cluster, 8, headroom=headroom, **axes)  # default context sizes: 1 ... 16
    assert {r["context"] for r in table.rows} <= {4, 8} and table.best["context"] in (4, 8)
    # an infeasible search that stopped short of the split suggests the next context size
    from collections import Counter

    from diffpipe._plan._search import _infeasible

    _, changes = _infeasible(m, cluster, 8, Counter(memory=3), need[2], usable, ("none",), (1,), [1], False, (1, 2))
    assert ("allow context=4", {"context": (1, 2, 4)}) in changes


# -- exports -------------------------------------------------------------------------------------------------
def _launch(context=2, zero=1):
    par = Parallelism(tensor=2, context=context, pipeline=2, data=2, zero=zero, sequence_parallel=True)
    return dp.Launch("1f1b", par, microbatch_size=1, global_batch=8, sequence=8192, layers_per_stage=(2, 2))


def test_megatron_export_names_the_context_size():
    from pathlib import Path

    args = dp.megatron_args(_launch())
    i = args.index("--context-parallel-size")
    assert args[i + 1] == "2" and args[args.index("--cp-comm-type") + 1] == "p2p"
    data = Path(__file__).resolve().parent / "data"
    known = {x.strip() for x in (data / "megatron_arguments_d98e8a6.txt").read_text().splitlines()}
    novalue = {x.strip() for x in (data / "megatron_arguments_d98e8a6_novalue.txt").read_text().splitlines()}
    assert {"--context-parallel-size", "--cp-comm-type"} <= known and not {"--context-parallel-size",
                                                                          "--cp-comm-type"} & novalue
    assert "--context-parallel-size" not in dp.megatron_args(_launch(context=1))
    again = dp.Launch(**_launch().to_dict())
    assert again == _launch() and again.parallelism.context == 2


def test_torchtitan_export_names_the_context_degree():
    text = dp.torchtitan_toml(_launch(zero=3))
    assert "context_parallel_degree = 2" in text and "data_parallel_shard_degree = 2" in text
    assert "context_parallel_degree" not in dp.torchtitan_toml(_launch(context=1, zero=3))
    with pytest.raises(dp.ConfigError, match="FSDP") as info:
        dp.torchtitan_toml(_launch(zero=0))
    one_line(info)


# -- the command line ------------------------------------------------------------------------------------------
TINY = dict(model_type="llama", num_hidden_layers=4, hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
            intermediate_size=512, vocab_size=1000, max_position_embeddings=4096, hidden_act="silu",
            tie_word_embeddings=False)


@pytest.fixture
def tiny(tmp_path):
    return hf_config(tmp_path, TINY)


def test_cli_cp_simulates_the_library_s_configuration(tiny):
    flags = ["--hf-config", tiny, "--sequence", "4096", "--tp", "2", "--cp", "2", "--gpus", "8", "--global-batch", "8"]
    code, out, err = run(["simulate", *flags, "--json"])
    assert code == 0, err
    got = json.loads(out)
    model = dp.Transformer.from_hf_config(tiny, sequence=4096, flash_attention=True)
    want = dp.Configuration(model, Parallelism(tensor=2, context=2, data=2), dp.Cluster("H100", gpus=8), 8).evaluate()
    assert (got["tensor"], got["context"], got["data"]) == (2, 2, 2)
    assert got["step_time_s"] == pytest.approx(want.step_time, rel=1e-6)
    code, text, err = run(["simulate", *flags])
    assert code == 0 and "TP2 CP2 PP1 DP2" in text, err
    code, text, err = run(["plan", "--hf-config", tiny, "--sequence", "4096", "--gpus", "8", "--global-batch", "8",
                           "--cp", "2", "--tp", "2", "--pp", "1", "--microbatch-size", "1", "--recompute", "none",
                           "--zero", "1", "--no-sequence-parallel", "--balance-top", "0", "--json"])
    assert code == 0, err
    assert {r["context"] for r in json.loads(text)["rows"]} == {2}


@pytest.mark.parametrize("extra, message", [
    (["--gpus", "8", "--cp", "0"], "argument --cp: expected an integer >= 1, got '0'"),
    (["--gpus", "6", "--cp", "3"], "context=3 needs a sequence that is a multiple of 2 x 3 = 6"),
    (["--gpus", "8", "--cp", "2", "--no-flash-attention"], "context=2 needs flash attention"),
    (["--gpus", "8", "--cp", "2", "--dp", "3"], "tensor x context x pipeline x data = 1 x 2 x 1 x 3 = 6, but the "
     "cluster has 8 GPUs"),
    (["--gpus", "8", "--cp", "3"], "--gpus 8 is not a multiple of --tp x --cp x --pp = 3"),
])
def test_cli_bad_cp_is_one_line_and_exit_2(tiny, extra, message):
    code, out, err = run(["simulate", "--hf-config", tiny, "--sequence", "4096", "--global-batch", "24", *extra])
    assert code == 2, (out, err)
    assert message in err and err.count("\n") == 1, err


def test_toml_context_key_is_the_flag(tiny, tmp_path):
    config = tmp_path / "cp.toml"
    config.write_text(f'[training]\nhf_config = "{tiny}"\nsequence = 4096\nglobal_batch = 8\n'
                      "[parallelism]\ntensor = 2\ncontext = 2\n[cluster]\ngpus = 8\n")
    code, out, err = run(["simulate", "--config", config, "--json"])
    assert code == 0, err
    by_file = json.loads(out)
    code, out, err = run(["simulate", "--hf-config", tiny, "--sequence", "4096", "--global-batch", "8", "--tp", "2",
                          "--cp", "2", "--gpus", "8", "--json"])
    assert code == 0, err
    assert by_file["context"] == 2 and by_file["step_time_s"] == json.loads(out)["step_time_s"]
