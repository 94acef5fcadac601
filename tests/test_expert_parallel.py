"""Expert parallelism as its own dimension (Megatron-LM's MoE parallel folding): the sizes and their
checks, the placement of the expert groups against Megatron's own rank arithmetic, the all-to-all and
expert-tensor collectives and the expert weights' shards by hand, the plan axis and the exports.

Rules (Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553): ``megatron/core/parallel_state.py``
``initialize_model_parallel`` builds the expert layers' ranks with ``RankGenerator(tp=etp, ep=ep,
dp=world // (etp x ep x pp), pp=pp, cp=1)`` in the order ``tp-ep-dp-pp`` and raises unless ``world %
(etp x ep x pp) == 0``; ``megatron/training/arguments.py`` sets ``expert_tensor_parallel_size`` to
the tensor size when unset and asserts ``num_experts % expert_model_parallel_size == 0``. The rank of
an orthogonal decomposition is ``sum(rank_i x prod(sizes before i))`` (the docstring of
``generate_masked_orthogonal_rank_groups``, equation (1)): the first axis of the order varies fastest.
torchtitan v0.2.2 (73a0e6979dd10b6b1904098eb3c8f62c18ab87ce) ``torchtitan/distributed/parallel_dims.py``:
``etp`` is 1 or ``tp`` when ``ep > 1``; sparse mesh ``("pp", "dp_replicate", "efsdp", "ep", "etp")``
with ``efsdp = dp_shard x cp x tp // (etp x ep)``.
"""

from __future__ import annotations

import json
import shlex
import tomllib

import chex
import numpy as np
import pytest
from _helpers import run
from test_export import MEGATRON_LIST, megatron_parser

import diffpipe as dp
from diffpipe._model._kernels import layer_kernels
from diffpipe._model._transformer import layer_costs
from diffpipe._plan._export import export_problem
from diffpipe._workload._parallel import Parallelism, parallel_costs, placement


def small(**kw):
    fields = dict(layers=4, hidden=256, heads=8, sequence=128, vocabulary=1000, microbatch_size=2)
    return dp.Transformer(**{**fields, **kw})


def moe(**kw):
    return small(**{"activation": "swiglu", "experts": 8, "experts_per_token": 2, "moe_ffn_hidden": 512, **kw})


#: Routed-expert parameters of one block of ``moe()``: 8 SwiGLU experts (3 h F weights, 2F + h biases).
ROUTED = 8 * (3 * 256 * 512 + 2 * 512 + 256)
#: One block's activation on one rank, d b s h bytes.
X = 2.0 * 2 * 128 * 256


def one_line(info) -> str:
    text = str(info.value)
    assert "\n" not in text, text
    return text


# -- sizes and checks ------------------------------------------------------------------------------------
def test_expert_tensor_defaults_to_the_tensor_size_as_megatron_does():
    p = Parallelism(tensor=4, data=2, expert=2)
    assert p.expert_tensor is None and p.etp == 4 and p.expert_data == 1
    folded = Parallelism(tensor=4, data=2, expert=8, expert_tensor=1, sequence_parallel=True)
    assert folded.etp == 1 and folded.expert_data == 1 and folded.gpus == 8  # 8 = 4 x 2 = 1 x 8 x 1
    assert Parallelism(tensor=2, context=2, data=2, expert=4).expert_data == 1  # the group spans context ranks


@pytest.mark.parametrize("kwargs, message", [
    (dict(data=4, expert=3), "parallelism: expert=3 must divide data=4"),
    (dict(data=2, context=2, expert=8), "parallelism: expert=8 must divide context x data = 4"),
    (dict(tensor=2, data=2, expert=8, expert_tensor=1), "parallelism: expert_tensor x expert = 1 x 8 = 8 must "
     "divide tensor x context x data = 4"),
    (dict(tensor=2, data=4, expert=2, expert_tensor=8), "expert_tensor x expert = 8 x 2 = 16 must divide"),
    (dict(expert_tensor=0), "parallelism: expert_tensor"),
    (dict(expert_tensor=1.5), "parallelism: expert_tensor"),
])
def test_bad_folding_is_one_line_naming_it(kwargs, message):
    with pytest.raises(dp.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        Parallelism(**kwargs)
    one_line(info)


@pytest.mark.parametrize("kwargs, model, message", [
    (dict(tensor=2, data=4, expert_tensor=1, sequence_parallel=True), small(), "expert_tensor=1 needs a "
     "mixture-of-experts model"),
    (dict(data=6, expert=2, expert_tensor=3), moe(), "expert_tensor=3 must divide the model's "
     "moe_ffn_hidden=512"),
    (dict(tensor=2, data=4, expert=8, expert_tensor=1), moe(), "expert_tensor=1 other than tensor=2 needs "
     "sequence_parallel"),
    (dict(tensor=2, data=4, expert=8, expert_tensor=1, sequence_parallel=True), moe(experts=4),
     "expert=8 must divide the model's experts=4"),
])
def test_bad_expert_tensor_for_a_model_is_one_line(kwargs, model, message):
    with pytest.raises(dp.ConfigError, match=message) as info:
        Parallelism(**kwargs).check(model)
    one_line(info)


def test_an_expert_tensor_group_stays_in_a_node():
    with pytest.raises(dp.ConfigError, match="expert_tensor=16 must divide the 8 GPUs of a node") as info:
        placement(Parallelism(tensor=8, data=2, expert=1, expert_tensor=16), dp.Cluster(gpus=16))
    one_line(info)


# -- placement against Megatron's rank arithmetic ---------------------------------------------------------
def megatron_expert_groups(par: Parallelism) -> list[list[int]]:
    """The expert-parallel groups of Megatron-LM's expert RankGenerator (order tp-ep-dp-pp, tp = etp):
    rank = etp_rank + etp x (ep_rank + ep x (edp_rank + edp x pp_rank))."""
    et, e, edp, pp = par.etp, par.expert, par.expert_data, par.pipeline
    return [[t + et * (r + e * (j + edp * p)) for r in range(e)] for p in range(pp) for j in range(edp)
            for t in range(et)]


@pytest.mark.parametrize("par", [
    Parallelism(tensor=4, data=4, expert=4),  # expert_tensor = tensor: 16 ranks, crosses nodes
    Parallelism(tensor=4, data=4, expert=4, expert_tensor=1, sequence_parallel=True),  # folded: 4 ranks
    Parallelism(tensor=2, data=8, expert=8, expert_tensor=1, sequence_parallel=True),  # 8 ranks: one node
    Parallelism(tensor=2, data=8, expert=8),  # 16 ranks
    Parallelism(tensor=2, pipeline=2, data=4, expert=8, expert_tensor=1, sequence_parallel=True),
    Parallelism(tensor=1, data=16, expert=16, expert_tensor=1),
])
def test_expert_groups_sit_where_megatron_puts_them(par):
    cluster = dp.Cluster(gpus=16)  # 8 GPUs a node
    node = cluster.devices_per_node
    groups = megatron_expert_groups(par)
    assert sorted(r for g in groups for r in g) == list(range(16))  # a partition of the world
    crosses = any(len({r // node for r in g}) > 1 for g in groups)
    per_node = max(sum(1 for r in g if r // node == g[0] // node) for g in groups)
    got = placement(par, cluster)
    assert got.links["expert"] == ("inter" if crosses else "intra")
    assert got.ranks_per_node["expert"] == per_node


def test_folding_moves_the_all_to_all_onto_nvlink():
    # Mixtral-like: 8 experts on 16 GPUs with TP2 DP8; EP8 with the tensor ranks folded in stays in a node
    cluster = dp.Cluster(gpus=16)
    assert placement(Parallelism(tensor=2, data=8, expert=8), cluster).links["expert"] == "inter"
    folded = Parallelism(tensor=2, data=8, expert=8, expert_tensor=1, sequence_parallel=True)
    assert placement(folded, cluster).links["expert"] == "intra"


# -- collectives and shards by hand -------------------------------------------------------------------------
@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("t, d, e, et", [(2, 4, 8, 1), (4, 2, 4, 2), (2, 4, 2, 1), (1, 8, 4, 2)])
def test_folded_collectives_and_shards_by_hand(recompute, t, d, e, et):
    model = moe(recompute=recompute)
    sp = t > 1
    par = Parallelism(tensor=t, data=d, expert=e, expert_tensor=et, sequence_parallel=sp, zero=1)
    c = parallel_costs(model, par)
    blocks = slice(1, 1 + model.layers)
    again = 2 if recompute == "full" else 1  # full recomputation re-runs the forward's collectives
    # dispatch and combine: every rank's k = 2 copies of its t-sharded tokens, (e - 1)/e of them moved
    a2a = (e - 1) / e * 2 * X / t
    np.testing.assert_allclose(c.collective_bytes["expert"][0, blocks], 2 * a2a)
    np.testing.assert_allclose(c.collective_bytes["expert"][1, blocks], 2 * again * a2a)
    np.testing.assert_allclose(c.collective_hops["expert"][0, blocks], 2 * (e - 1))
    # the attention's all-gather + reduce-scatter over t, the experts' over e_t
    tensor = 2 * (t - 1) / t * X + 2 * (et - 1) / et * X
    np.testing.assert_allclose(c.collective_bytes["tensor"][0, blocks], tensor)
    np.testing.assert_allclose(c.collective_bytes["tensor"][1, blocks], again * tensor)
    np.testing.assert_allclose(c.collective_hops["tensor"][0, blocks], 2 * (t - 1) + 2 * (et - 1))
    # weights: the dense part over t, the routed experts over e_t x e; ZeRO-1 over their own data groups
    base = layer_costs(model)
    dense = base.parameters - np.r_[0, [ROUTED] * model.layers, 0]
    routed = np.r_[0, [ROUTED] * model.layers, 0] / (et * e)
    np.testing.assert_allclose(c.parameters, dense / t + routed)
    n_e = t * d // (et * e)
    np.testing.assert_allclose(c.static_bytes, dense / t * (4 + 12 / d) + routed * (4 + 12 / n_e))
    np.testing.assert_allclose(c.update_bytes, 2 * 14 * (dense / t / d + routed / n_e))
    # the same FLOPs per device: the work is balanced over the folded ranks however they are cut
    np.testing.assert_allclose(c.costs.forward, base.forward / t)


def test_explicit_expert_tensor_equal_to_tensor_is_the_default():
    model = moe(recompute="selective")
    a = parallel_costs(model, Parallelism(tensor=2, data=4, expert=2, sequence_parallel=True, zero=3))
    b = parallel_costs(model, Parallelism(tensor=2, data=4, expert=2, sequence_parallel=True, zero=3,
                                          expert_tensor=2))
    chex.assert_trees_all_equal(a, b)


def test_expert_kernels_keep_the_flops_and_reshape_the_gemms():
    model = moe()
    default = layer_kernels(model, tensor=2, sequence_parallel=True, expert=2)
    folded = layer_kernels(model, tensor=2, sequence_parallel=True, expert=8, expert_tensor=1)
    chex.assert_trees_all_close(default.gemm_flops(), folded.gemm_flops())
    # a routed expert's fused gate and up projection (K = h, N = 2 F_e): E/e = 1 expert of
    # k T e e_t / (t E) = 2 x 256 x 8 / 16 rows, N unsplit; the default's: E/e = 4 experts of
    # k T e / E = 128 rows, N / t
    def expert_up(kernels):
        g = kernels.gemm
        rows = g[(g[:, 0] == 1) & (g[:, 1] == 0) & (g[:, 4] == 256) & np.isin(g[:, 3], (1024, 512))]
        return {(m, n, count) for m, n, count in rows[:, [2, 3, 6]]}
    assert expert_up(folded) == {(256.0, 1024.0, 1.0)} and expert_up(default) == {(128.0, 512.0, 4.0)}


# -- plan ---------------------------------------------------------------------------------------------------
AXES = dict(families=("1f1b",), tensor=(2,), pipeline=(1,), microbatch_sizes=(1,), recompute=("none",), zero=(1,),
            sequence_parallel=(True,), balance=False, progress=False)


def test_plan_searches_expert_tensor_only_when_asked():
    model = moe()
    cluster = dp.Cluster("H100", gpus=8)
    default = dp.plan(model, cluster, 8, **AXES)
    assert {(r["expert"], r["expert_tensor"]) for r in default.rows} <= {(1, 2), (2, 2), (4, 2)}  # e | data
    table = dp.plan(model, cluster, 8, expert_tensor=(1, 2), top_k=0, **AXES)
    found = {(r["expert"], r["expert_tensor"]) for r in table.rows}
    assert (8, 1) in found and (8, 2) not in found  # e_t x e divides t x d = 8
    for i, row in enumerate(table.rows):
        par = table.parallelism(i)
        assert par.etp == row["expert_tensor"] and par.expert == row["expert"]
        assert par.expert_tensor == (None if row["expert_tensor"] == 2 else row["expert_tensor"])
        res = table.configuration(i).evaluate()
        assert res.step_time == pytest.approx(row["step_time"], rel=1e-5)
        assert res.memory_per_gpu == pytest.approx(row["memory_per_gpu"], rel=1e-6)
    assert any("(etp 1)" in line for line in table.to_markdown().splitlines())
    assert table.to_csv().splitlines()[0].split(",")[6:8] == ["expert", "expert_tensor"]
    with pytest.raises(dp.ConfigError, match="expert_tensor=1 needs a mixture-of-experts model") as info:
        dp.plan(small(), cluster, 8, expert_tensor=1, **AXES)
    one_line(info)


def test_cli_etp_reaches_plan_simulate_and_the_exports(tmp_path):
    cfg = dict(model_type="mixtral", num_hidden_layers=2, hidden_size=256, num_attention_heads=8,
               num_key_value_heads=2, intermediate_size=512, vocab_size=1000, max_position_embeddings=4096,
               hidden_act="silu", num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    flags = ["--hf-config", path, "--sequence", "1024", "--gpus", "8", "--global-batch", "8"]
    code, out, err = run(["simulate", *flags, "--tp", "2", "--ep", "8", "--etp", "1", "--sequence-parallel", "--json"])
    assert code == 0, err
    got = json.loads(out)
    assert (got["expert"], got["expert_tensor"]) == (8, 1)
    code, out, err = run(["plan", *flags, "--tp", "2", "--pp", "1", "--ep", "8", "--etp", "1", "--microbatch-size", "1",
                          "--recompute", "none", "--zero", "1", "--sequence-parallel", "--balance-top", "0",
                          "--export", "megatron", "--json"])
    assert code == 0, err
    data = json.loads(out)
    assert {(r["expert"], r["expert_tensor"]) for r in data["rows"]} == {(8, 1)}
    args = shlex.split(data["export"]["text"])
    assert args[args.index("--expert-tensor-parallel-size") + 1] == "1"
    assert args[args.index("--expert-model-parallel-size") + 1] == "8"
    code, out, err = run(["simulate", *flags, "--tp", "2", "--ep", "8", "--etp", "1"])
    assert code == 2 and "expert_tensor=1 other than tensor=2 needs sequence_parallel" in err, err
    assert err.count("\n") == 1
    code, out, err = run(["simulate", *flags, "--etp", "0"])
    assert code == 2 and "--etp" in err and err.count("\n") == 1, err


# -- exports ------------------------------------------------------------------------------------------------
def launch(**kw) -> dp.Launch:
    sizes = dict(tensor=2, pipeline=2, data=4, expert=8, expert_tensor=1, zero=3, sequence_parallel=True)
    sizes.update(kw)
    return dp.Launch("1f1b", Parallelism(**sizes), microbatch_size=1, global_batch=16, sequence=4096,
                     layers_per_stage=(2, 2))


def test_megatron_export_names_the_expert_tensor_size_only_when_it_differs():
    known = {x.strip() for x in MEGATRON_LIST.read_text().splitlines() if x.startswith("--")}
    assert {"--expert-model-parallel-size", "--expert-tensor-parallel-size"} <= known  # Megatron-LM d98e8a6
    ns = megatron_parser().parse_args(dp.megatron_args(launch()))
    assert (ns.expert_model_parallel_size, ns.expert_tensor_parallel_size) == (8, 1)
    # Megatron's own checks, as initialize_model_parallel and validate_args run them
    world = ns.tensor_model_parallel_size * ns.pipeline_model_parallel_size * 4
    assert world % (ns.expert_tensor_parallel_size * ns.expert_model_parallel_size
                    * ns.pipeline_model_parallel_size) == 0
    default = megatron_parser().parse_args(dp.megatron_args(launch(expert=2, expert_tensor=None)))
    assert default.expert_tensor_parallel_size is None  # Megatron takes the tensor size, as diffpipe did


def test_megatron_runs_moe_layers_with_biases_only_at_expert_tensor_1():
    """Megatron-LM d98e8a6 ``megatron/core/transformer/transformer_config.py:2612-2615``: with
    ``add_bias_linear`` (no ``--disable-bias-linear``) and experts, ``TransformerConfig`` asserts
    "Bias in Moe is only supported when ETP==1"; the export refuses it and ``plan`` searches ETP 1."""
    model = moe(layers=4)  # GPT-style: biases on every linear layer
    assert model.bias and model.experts > 1
    etp2 = launch(expert=2, expert_tensor=None)  # the expert tensor size is the tensor size, 2
    with pytest.raises(dp.ConfigError, match=r"megatron export: .*expert_tensor=1 .*Bias in Moe") as info:
        dp.megatron_args(etp2, model)
    one_line(info)
    assert "--disable-bias-linear" in dp.megatron_args(etp2, moe(layers=4, bias=False))  # no biases: any ETP
    assert "--expert-tensor-parallel-size" in dp.megatron_args(launch(), model)  # ETP 1
    table = dp.plan(model, dp.Cluster("H100", gpus=8), 8, export="megatron", **AXES)
    assert table.rows and {r["expert_tensor"] for r in table.rows} == {1}
    args = table.megatron_args(0)
    assert args[args.index("--expert-tensor-parallel-size") + 1] == "1" and "--disable-bias-linear" not in args


def test_torchtitan_export_names_both_expert_degrees_and_its_mesh_divides():
    par = tomllib.loads(dp.torchtitan_toml(launch()))["parallelism"]
    assert (par["expert_parallel_degree"], par["expert_tensor_parallel_degree"]) == (8, 1)
    # torchtitan v0.2.2's sparse mesh: efsdp = dp_shard x cp x tp // (etp x ep), an integer >= 1
    region = par["data_parallel_shard_degree"] * par.get("context_parallel_degree", 1) * par["tensor_parallel_degree"]
    assert region % (par["expert_tensor_parallel_degree"] * par["expert_parallel_degree"]) == 0
    # diffpipe's default (e_t = t) is written out: torchtitan's own default is 1
    par = tomllib.loads(dp.torchtitan_toml(launch(expert=2, expert_tensor=None)))["parallelism"]
    assert par["expert_tensor_parallel_degree"] == 2


def torchtitan_v020_accepts(dp_shard, cp, tp, ep, etp):
    """torchtitan v0.2.0 (29624e37f) ``torchtitan/distributed/parallel_dims.py:57-64``, ``_validate``'s
    expert rule as written there (v0.2.1 kept only its first assert)."""
    if ep > 1:
        assert etp == tp or etp == 1, "Currently we only support ETP=TP or ETP=1"
        if etp == tp:
            return ep % cp == 0 and (dp_shard * cp) % ep == 0  # EP would borrow all cp and some dp_shard degree
        return ep % (cp * tp) == 0 and (dp_shard * cp * tp) % ep == 0  # ... all cp and tp and some dp_shard
    return True


@pytest.mark.parametrize("kwargs", [
    dict(),  # ETP 1, EP 8 over TP 2 x DP 4
    dict(tensor=4, data=2, expert=2),  # ETP 1, EP 2 < TP 4: v0.2.0 wants all the tensor ranks
    dict(tensor=1, context=4, data=2, expert=2, expert_tensor=None, sequence_parallel=False),  # EP 2 < CP 4
    dict(tensor=2, context=2, data=2, expert=2, expert_tensor=None),  # ETP = TP, EP = CP
    dict(expert=2, expert_tensor=None),  # ETP = TP 2, EP 2 of DP 4
])
def test_torchtitan_toml_says_when_v020_would_refuse_its_experts(kwargs):
    text = dp.torchtitan_toml(launch(**kwargs))
    par = tomllib.loads(text)["parallelism"]
    accepted = torchtitan_v020_accepts(par["data_parallel_shard_degree"], par.get("context_parallel_degree", 1),
                                       par["tensor_parallel_degree"], par["expert_parallel_degree"],
                                       par["expert_tensor_parallel_degree"])
    noted = text.startswith("# torchtitan v0.2.0 needs expert_parallel_degree")
    assert noted == (not accepted), text
    assert text.count("v0.2.0") == noted  # one line, only when it applies


@pytest.mark.parametrize("kwargs, message", [
    (dict(tensor=4, data=2, expert=4, expert_tensor=2), "expert tensor parallelism of 1 or the tensor size 4, not 2"),
    (dict(expert=1, expert_tensor=1), "expert_tensor_parallel_degree only with expert parallelism"),
    (dict(tensor=1, data=8, expert=2, expert_tensor=None, zero=0, sequence_parallel=False),
     "inside data_parallel_shard_degree x context x tensor = 1 ranks, which expert_tensor x expert = 1 x 2 does not "
     "divide: use zero=2 or 3"),
])
def test_torchtitan_refuses_expert_layouts_it_cannot_build(kwargs, message):
    cfg = launch(**kwargs)
    assert message in export_problem("torchtitan-v0.2", "1f1b", cfg.parallelism, cfg.microbatches)
    with pytest.raises(dp.ConfigError, match="torchtitan export") as info:
        dp.torchtitan_toml(cfg)
    one_line(info)
