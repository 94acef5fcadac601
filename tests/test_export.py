"""Launch exports parse back with the frameworks' own argument names.

The argument lists below were read from the frameworks' sources (not imported: Megatron-LM needs
GPUs and Transformer Engine to import its parser; torchtitan's TOML era is a past commit):

- Megatron-LM, commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (Aug 2026):
  ``megatron/core/model_parallel_config.py`` (``tensor_model_parallel_size``,
  ``pipeline_model_parallel_size``, ``sequence_parallel``, ``expert_model_parallel_size``,
  ``expert_tensor_parallel_size``: Optional[int], None meaning the tensor size),
  ``megatron/core/transformer/transformer_config.py`` (``num_layers``; ``recompute_granularity``
  Literal['full', 'selective'], ``recompute_method`` Literal['uniform', 'block'], ``recompute_num_layers``),
  ``megatron/training/config/training_config.py`` (``micro_batch_size``, ``global_batch_size``),
  ``megatron/training/config/common_config.py`` (``use_megatron_fsdp``) -- turned into flags by
  ``megatron/training/argument_utils.py`` ``ArgumentGroupFactory`` ("--" + name with "-" for "_"; a
  False bool is store_true) -- and ``megatron/training/arguments.py`` (``--seq-length``,
  ``--pipeline-model-parallel-layout``, ``--num-layers-per-virtual-pipeline-stage``,
  ``--use-distributed-optimizer``, ``--data-parallel-sharding-strategy`` with choices no_shard, optim,
  optim_grads, optim_grads_params). Layout grammar: ``megatron/core/transformer/pipeline_parallel_layer_layout.py``.
  The model's shape: ``TransformerConfig`` fields ``hidden_size``, ``num_attention_heads``,
  ``num_query_groups``, ``ffn_hidden_size``, ``kv_channels``, ``normalization`` Literal['LayerNorm',
  'RMSNorm'], ``add_bias_linear`` (its flag ``--disable-bias-linear``), ``add_qkv_bias``,
  ``qk_layernorm``, ``hidden_dropout``, ``attention_dropout``, ``attention_backend`` (``AttnBackend``:
  flash, fused, unfused, local, auto), ``multi_latent_attention``, ``moe_router_topk``,
  ``moe_ffn_hidden_size``, ``moe_shared_expert_intermediate_size``, ``moe_expert_capacity_factor``,
  ``bf16`` (``ModelParallelConfig``); ``TokenizerConfig.vocab_size``; ``TrainingConfig.ckpt_format``
  Literal['torch', 'torch_dist', 'torch_dcp', 'fsdp_dtensor'] (``megatron/training/config/``); and
  ``arguments.py``'s own ``--group-query-attention``, ``--swiglu``, ``--position-embedding-type``,
  ``--untie-embeddings-and-output-weights``, ``--max-position-embeddings``, ``--num-experts``,
  ``--moe-layer-freq``, ``--q-lora-rank``, ``--kv-lora-rank``, ``--qk-head-dim``,
  ``--qk-pos-emb-head-dim``, ``--v-head-dim``.
- torchtitan, commit e347b1e5e6b6941d789d16d340145294d82dc71e (Feb 2026, the last that read TOML):
  ``torchtitan/config/job_config.py`` classes ``Training``, ``Parallelism`` (``expert_parallel_degree`` and
  ``expert_tensor_parallel_degree``, ints defaulting to 1), ``ActivationCheckpoint``;
  the stage count from ``pipeline_parallel_layers_per_stage``: ``torchtitan/distributed/pipeline_parallel.py``
  (v0.2.0-v0.2.2), ``ceil((n_layers + first_stage_less_layers + last_stage_less_layers) / layers_per_stage)``.
  Schedule names: torch's own ``get_schedule_class`` (imported: torch is installed).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import tomllib
from pathlib import Path

import pytest

import diffpipe as dp
from diffpipe._plan._export import Launch, megatron_layout, torchtitan_modules

MEGATRON_FLAGS: dict[str, dict] = {
    "--tensor-model-parallel-size": {"type": int},
    "--pipeline-model-parallel-size": {"type": int},
    "--expert-model-parallel-size": {"type": int},
    "--expert-tensor-parallel-size": {"type": int},
    "--sequence-parallel": {"action": "store_true"},
    "--num-layers": {"type": int},
    "--seq-length": {"type": int},
    "--micro-batch-size": {"type": int},
    "--global-batch-size": {"type": int},
    "--pipeline-model-parallel-layout": {"type": str},
    "--num-layers-per-virtual-pipeline-stage": {"type": int},
    "--recompute-granularity": {"type": str, "choices": ["full", "selective"]},
    "--recompute-method": {"type": str, "choices": ["uniform", "block"]},
    "--recompute-num-layers": {"type": int},
    "--use-distributed-optimizer": {"action": "store_true"},
    "--use-megatron-fsdp": {"action": "store_true"},
    "--data-parallel-sharding-strategy": {"type": str,
                                          "choices": ["no_shard", "optim", "optim_grads", "optim_grads_params"]},
    "--ckpt-format": {"type": str, "choices": ["torch", "torch_dist", "torch_dcp", "fsdp_dtensor"]},
    # the model's shape
    "--hidden-size": {"type": int}, "--num-attention-heads": {"type": int}, "--ffn-hidden-size": {"type": int},
    "--group-query-attention": {"action": "store_true"}, "--num-query-groups": {"type": int},
    "--kv-channels": {"type": int}, "--swiglu": {"action": "store_true"},
    "--normalization": {"type": str, "choices": ["LayerNorm", "RMSNorm"]},
    "--position-embedding-type": {"type": str, "choices": ["learned_absolute", "rope", "mrope", "relative", "none"]},
    "--untie-embeddings-and-output-weights": {"action": "store_true"},
    "--disable-bias-linear": {"action": "store_false", "dest": "add_bias_linear"},
    "--add-qkv-bias": {"action": "store_true"}, "--qk-layernorm": {"action": "store_true"},
    "--attention-dropout": {"type": float}, "--hidden-dropout": {"type": float},
    "--attention-backend": {"type": str, "choices": ["flash", "fused", "unfused", "local", "auto"]},
    "--bf16": {"action": "store_true"}, "--vocab-size": {"type": int}, "--max-position-embeddings": {"type": int},
    "--num-experts": {"type": int}, "--moe-router-topk": {"type": int}, "--moe-ffn-hidden-size": {"type": int},
    "--moe-shared-expert-intermediate-size": {"type": int}, "--moe-layer-freq": {"type": str},
    "--moe-expert-capacity-factor": {"type": float}, "--multi-latent-attention": {"action": "store_true"},
    "--q-lora-rank": {"type": int}, "--kv-lora-rank": {"type": int}, "--qk-head-dim": {"type": int},
    "--qk-pos-emb-head-dim": {"type": int}, "--v-head-dim": {"type": int},
}

TORCHTITAN_FIELDS = {
    "training": {"local_batch_size": int, "global_batch_size": int, "seq_len": int},
    "parallelism": {
        "data_parallel_replicate_degree": int, "data_parallel_shard_degree": int, "fsdp_reshard_after_forward": str,
        "tensor_parallel_degree": int, "pipeline_parallel_degree": int, "module_fqns_per_model_part": list,
        "pipeline_parallel_layers_per_stage": int, "pipeline_parallel_schedule": str,
        "pipeline_parallel_microbatch_size": int, "expert_parallel_degree": int, "expert_tensor_parallel_degree": int,
        "pipeline_parallel_first_stage_less_layers": int, "pipeline_parallel_last_stage_less_layers": int,
    },
    "activation_checkpoint": {"mode": str, "selective_ac_option": str},
}
TORCHTITAN_CHOICES = {("activation_checkpoint", "mode"): {"selective", "full", "memory_budget", "none"},
                      ("parallelism", "fsdp_reshard_after_forward"): {"default", "always", "never"}}


def megatron_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    for flag, kwargs in MEGATRON_FLAGS.items():
        parser.add_argument(flag, **kwargs)
    return parser


PARALLEL = {f.name for f in dataclasses.fields(dp.Parallelism)}


def launch(**kw) -> Launch:
    """A Llama-70B-like launch; keywords override (the parallel sizes go into its ``Parallelism``)."""
    base = dict(family="interleaved-1f1b", tensor=8, pipeline=4, data=8, virtual=2, microbatch_size=1,
                global_batch=256, sequence=8192, layers_per_stage=(10,) * 8, recompute="selective", zero=1,
                sequence_parallel=True)
    given = {**base, **kw}
    par = dp.Parallelism(**{k: v for k, v in given.items() if k in PARALLEL})
    return Launch(parallelism=par, **{k: v for k, v in given.items() if k not in PARALLEL})


LAUNCHES = [
    launch(),
    launch(family="1f1b", virtual=1, layers_per_stage=(21, 20, 20, 19), recompute="full", zero=0),
    launch(layers_per_stage=(9, 10, 10, 10, 10, 10, 10, 11), zero=3, expert=4),
    launch(family="1f1b", pipeline=1, virtual=1, tensor=1, data=16, layers_per_stage=(32,), recompute="none",
           zero=2, sequence_parallel=False, global_batch=64),
    launch(family="1f1b", virtual=1, layers_per_stage=(20,) * 4, zero=2, expert=8, expert_tensor=1),  # folded
]


@pytest.mark.parametrize("cfg", LAUNCHES)
def test_megatron_args_parse_back(cfg):
    args = dp.megatron_args(cfg)
    ns = megatron_parser().parse_args(shlex.split(shlex.join(args)))
    assert ns.tensor_model_parallel_size == cfg.parallelism.tensor
    assert ns.pipeline_model_parallel_size == cfg.parallelism.pipeline
    assert ns.micro_batch_size == cfg.microbatch_size and ns.global_batch_size == cfg.global_batch
    assert ns.num_layers == cfg.layers and ns.seq_length == cfg.sequence
    assert ns.sequence_parallel == (cfg.parallelism.sequence_parallel and cfg.parallelism.tensor > 1)
    assert (ns.expert_model_parallel_size or 1) == cfg.parallelism.expert
    # unset, Megatron's expert tensor size is the tensor size (validate_args)
    assert (ns.expert_tensor_parallel_size or ns.tensor_model_parallel_size) == cfg.parallelism.etp
    # the split: one of the two stage flags, as Megatron requires (arguments.py: at most one)
    if ns.pipeline_model_parallel_layout is not None:
        assert ns.num_layers_per_virtual_pipeline_stage is None
        stages = dp.parse_megatron_layout(ns.pipeline_model_parallel_layout, ns.pipeline_model_parallel_size)
        assert stages == cfg.layers_per_stage
        assert len(stages) // ns.pipeline_model_parallel_size == cfg.parallelism.virtual
    else:
        assert cfg.uniform
        per = ns.num_layers_per_virtual_pipeline_stage
        virtual = 1 if per is None else ns.num_layers // ns.pipeline_model_parallel_size // per
        assert virtual == cfg.parallelism.virtual
        assert ns.num_layers % (ns.pipeline_model_parallel_size * virtual) == 0
    assert ns.recompute_granularity == {"none": None, "selective": "selective", "full": "full"}[cfg.recompute]
    # ZeRO-1 and 2: the distributed optimizer, as Megatron users run it; ZeRO-3: Megatron-FSDP, with the
    # checkpoint format its validate_args requires
    zero = cfg.parallelism.zero
    assert ns.use_distributed_optimizer == (zero >= 1) and ns.use_megatron_fsdp == (zero == 3)
    assert ns.data_parallel_sharding_strategy == ("optim_grads_params" if zero == 3 else None)
    assert ns.ckpt_format == ("fsdp_dtensor" if zero == 3 else None)


@pytest.mark.parametrize("cfg", LAUNCHES)
def test_torchtitan_toml_parses_back(cfg):
    from torch.distributed.pipelining.schedules import get_schedule_class

    if cfg.parallelism.zero == 1:
        with pytest.raises(dp.ConfigError, match="ZeRO-1"):
            dp.torchtitan_toml(cfg)
        cfg = dataclasses.replace(cfg, parallelism=dataclasses.replace(cfg.parallelism, zero=3))
    doc = tomllib.loads(dp.torchtitan_toml(cfg))
    for section, fields in doc.items():
        assert section in TORCHTITAN_FIELDS, section
        for name, value in fields.items():
            assert name in TORCHTITAN_FIELDS[section], (section, name)
            assert isinstance(value, TORCHTITAN_FIELDS[section][name]), (section, name, value)
            if (section, name) in TORCHTITAN_CHOICES:
                assert value in TORCHTITAN_CHOICES[section, name]
    par, training = doc["parallelism"], doc["training"]
    degrees = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    if cfg.parallelism.expert > 1:  # torchtitan v0.2.2 parallel_dims.py: ETP 1 or TP, efsdp an integer
        ep, etp = par["expert_parallel_degree"], par["expert_tensor_parallel_degree"]
        assert (ep, etp) == (cfg.parallelism.expert, cfg.parallelism.etp) and etp in (1, par["tensor_parallel_degree"])
        assert par["data_parallel_shard_degree"] * par["tensor_parallel_degree"] % (etp * ep) == 0
    assert degrees * par["tensor_parallel_degree"] * par["pipeline_parallel_degree"] == cfg.parallelism.gpus
    assert training["global_batch_size"] == cfg.global_batch and training["seq_len"] == cfg.sequence
    assert doc["activation_checkpoint"]["mode"] == cfg.recompute
    if cfg.parallelism.pipeline > 1:
        get_schedule_class(par["pipeline_parallel_schedule"])  # torch's parser accepts the name
        microbatches = training["local_batch_size"] // par["pipeline_parallel_microbatch_size"]
        assert microbatches == cfg.microbatches
        if "module_fqns_per_model_part" in par:
            parts = par["module_fqns_per_model_part"]
            assert tuple(sum(m.startswith("layers.") for m in p) for p in parts) == cfg.layers_per_stage
        else:
            per, first = par["pipeline_parallel_layers_per_stage"], par["pipeline_parallel_first_stage_less_layers"]
            assert per * cfg.parallelism.stages == cfg.layers
            # torchtitan's own count of stages (module docstring) is the launch's
            stages = -(-(cfg.layers + first + par["pipeline_parallel_last_stage_less_layers"]) // per)
            assert stages == cfg.parallelism.stages
    else:
        steps = training["global_batch_size"] // (training["local_batch_size"] * degrees)
        assert steps * cfg.microbatch_size * cfg.parallelism.data == cfg.global_batch


@pytest.mark.parametrize("family", ["gpipe", "zb-h1", "zb-v", "dualpipe-v", "looped-bfs"])
def test_torchtitan_schedule_names_are_torchs(family):
    from torch.distributed.pipelining.schedules import get_schedule_class

    virtual = 2 if family in ("zb-v", "dualpipe-v", "looped-bfs") else 1
    cfg = launch(family=family, virtual=virtual, layers_per_stage=(10,) * (4 * virtual), zero=0)
    par = tomllib.loads(dp.torchtitan_toml(cfg))["parallelism"]
    get_schedule_class(par["pipeline_parallel_schedule"])


def test_megatron_refuses_families_it_does_not_run():
    with pytest.raises(dp.ConfigError, match="zb-h1") as info:
        dp.megatron_args(launch(family="zb-h1", virtual=1, layers_per_stage=(20,) * 4))
    assert "\n" not in str(info.value)


def test_torchtitan_refuses_what_it_cannot_express():
    with pytest.raises(dp.ConfigError, match="sequence parallelism"):
        dp.torchtitan_toml(launch(zero=0, sequence_parallel=False))
    with pytest.raises(dp.ConfigError, match="chimera"):
        dp.torchtitan_toml(launch(family="chimera", virtual=1, layers_per_stage=(20,) * 4, zero=0))


@pytest.mark.parametrize(("text", "stages"), [
    ("Et*3|t*3|t*3|t*2L", (3, 3, 3, 2)),
    ("E|(t*4|)*2,t*3L", (0, 4, 4, 3)),
    ("Ettt|(tt|)*3tL", (3, 2, 2, 2, 1)),
    ("E,t*2|t|tL", (2, 1, 1)),
    ("E((t|)*2)*2tL", (1, 1, 1, 1, 1)),
])
def test_parse_megatron_layout(text, stages):
    assert dp.parse_megatron_layout(text) == stages


@pytest.mark.parametrize("counts", [(3, 3, 3, 2), (0, 5, 5, 0), (1,), (7, 1)])
def test_layout_round_trip(counts):
    assert dp.parse_megatron_layout(megatron_layout(counts)) == counts


@pytest.mark.parametrize(("text", "match"), [
    ("Et*3|t*3m|L", "MTP"),
    ("t*3|Et*3|L", "first stage"),
    ("Et*3|L|t", "last stage"),
    ("Et*3|x|L", "unexpected 'x'"),
    ("E(t|*2L", "unmatched"),
    ("Et|tL|EtL", "exactly one"),
    ("E*2t|L", "exactly one"),
    ("Et*3 |tL", "unexpected ' '"),
])
def test_parse_megatron_layout_refuses(text, match):
    with pytest.raises(dp.ConfigError, match=match) as info:
        dp.parse_megatron_layout(text)
    assert "\n" not in str(info.value)


def test_parse_megatron_layout_checks_pipeline():
    assert dp.parse_megatron_layout("Et|t|t|tL", 2) == (1, 1, 1, 1)
    with pytest.raises(dp.ConfigError, match="multiple of pipeline 3"):
        dp.parse_megatron_layout("Et|t|t|tL", 3)


def test_torchtitan_modules_cover_the_model_once():
    parts = torchtitan_modules((2, 0, 3))
    flat = [m for p in parts for m in p]
    assert flat == ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "layers.4", "norm", "output"]
    assert parts[1] == []


def test_launch_checks():
    with pytest.raises(dp.ConfigError, match="entries"):
        launch(layers_per_stage=(10,) * 4)
    with pytest.raises(dp.ConfigError, match="global_batch"):
        launch(global_batch=100)
    with pytest.raises(dp.ConfigError, match="recompute"):
        launch(recompute="some")


def test_hand_written_layout_is_evaluated():
    model = dp.Transformer(layers=8, hidden=256, heads=4, sequence=256, vocabulary=2048)
    par = dp.Parallelism(tensor=1, pipeline=2, data=1, virtual=2)
    cluster = dp.Cluster(device="H100", gpus=2)
    counts = dp.parse_megatron_layout("Et|t*3|t*3|tL", par.pipeline)
    result = dp.Configuration(model, par, cluster, 8, layers_per_stage=counts).evaluate()
    uniform = dp.Configuration(model, par, cluster, 8).evaluate()
    assert result.step_time > 0 and result.step_time != uniform.step_time


# The exported text, byte for byte, as diffpipe wrote it before Launch held a Parallelism.
MEGATRON_TEXT = {
    1: "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --sequence-parallel --num-layers 80 "
       "--seq-length 8192 --micro-batch-size 1 --global-batch-size 256 --pipeline-model-parallel-layout "
       "'Et*21|t*20|t*20|t*19L' --recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
    2: "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --expert-model-parallel-size 4 "
       "--sequence-parallel --num-layers 80 --seq-length 8192 --micro-batch-size 1 --global-batch-size 256 "
       "--pipeline-model-parallel-layout 'Et*9|t*10|t*10|t*10|t*10|t*10|t*10|t*11L' --recompute-granularity "
       "selective --use-distributed-optimizer --use-megatron-fsdp --data-parallel-sharding-strategy "
       "optim_grads_params --ckpt-format fsdp_dtensor",
}
TORCHTITAN_TEXT = {
    3: '[training]\nlocal_batch_size = 1\nglobal_batch_size = 64\nseq_len = 8192\n\n[parallelism]\n'
       'data_parallel_replicate_degree = 1\ndata_parallel_shard_degree = 16\ntensor_parallel_degree = 1\n'
       'pipeline_parallel_degree = 1\nfsdp_reshard_after_forward = "never"\n\n[activation_checkpoint]\n'
       'mode = "none"\n',
}


@pytest.mark.parametrize("i", sorted(MEGATRON_TEXT))
def test_megatron_text_is_unchanged(i):
    assert shlex.join(dp.megatron_args(LAUNCHES[i])) == MEGATRON_TEXT[i]


@pytest.mark.parametrize("i", sorted(TORCHTITAN_TEXT))
def test_torchtitan_text_is_unchanged(i):
    assert dp.torchtitan_toml(LAUNCHES[i]) == TORCHTITAN_TEXT[i]


@pytest.mark.parametrize("cfg", LAUNCHES)
def test_launch_sizes_live_in_the_parallelism_only(cfg):
    """``Launch`` once took the parallel sizes as keywords and attributes of its own: they are
    refused now (the sizes are ``launch.parallelism``'s)."""
    par = cfg.parallelism
    old = {"family": cfg.family, "microbatch_size": cfg.microbatch_size, "global_batch": cfg.global_batch,
           "sequence": cfg.sequence, "layers_per_stage": cfg.layers_per_stage, "recompute": cfg.recompute,
           **dataclasses.asdict(par)}
    with pytest.raises(dp.ConfigError,
                       match=r"launch: unknown field\(s\) context, data, expert, expert_tensor, pipeline, "):
        Launch(**old)
    for name in ("tensor", "gpus", "stages"):
        with pytest.raises(AttributeError, match=name):
            getattr(cfg, name)
    assert cfg.parallelism.gpus == par.tensor * par.pipeline * par.data
    assert Launch(**cfg.to_dict()) == cfg  # to_dict round-trips


def test_launch_sizes_are_the_parallelism_s():
    # One home for the size checks: Parallelism's own messages.
    with pytest.raises(dp.ConfigError, match="parallelism: expert=3 must divide data=8"):
        launch(expert=3)
    with pytest.raises(dp.ConfigError, match=r"unknown field\(s\) tensor \(the parallel sizes go in parallelism="):
        Launch("1f1b", dp.Parallelism(pipeline=2), tensor=2, microbatch_size=1, global_batch=8, sequence=8,
               layers_per_stage=(1, 1))
    with pytest.raises(dp.ConfigError, match="parallelism must be a Parallelism, got int"):
        Launch("1f1b", 2, microbatch_size=1, global_batch=8, sequence=8, layers_per_stage=(1, 1))
    with pytest.raises(dp.ConfigError, match="unknown field"):
        Launch("1f1b", dp.Parallelism(), tensors=2, microbatch_size=1, global_batch=8, sequence=8,
               layers_per_stage=(1,))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        launch().nothing  # noqa: B018


# -- exports that launch (issue 24) -----------------------------------------------------------------------
def test_megatron_args_carry_the_model_shape():
    model = dp.presets.model("llama-3-70b", flash_attention=True)
    cfg = launch(layers_per_stage=(10,) * 8)
    ns = megatron_parser().parse_args(dp.megatron_args(cfg, model))
    assert (ns.num_layers, ns.hidden_size, ns.num_attention_heads, ns.ffn_hidden_size) == (80, 8192, 64, 28672)
    assert ns.group_query_attention and ns.num_query_groups == 8 and ns.kv_channels is None
    assert ns.swiglu and ns.normalization == "RMSNorm" and ns.position_embedding_type == "rope"
    assert ns.untie_embeddings_and_output_weights and not ns.add_bias_linear and not ns.add_qkv_bias
    assert ns.vocab_size == 128256 and ns.seq_length == ns.max_position_embeddings == 8192
    assert ns.attention_dropout == ns.hidden_dropout == 0.0 and ns.attention_backend == "auto" and ns.bf16
    with pytest.raises(dp.ConfigError, match="the model has 32 layers, the launch 80"):
        dp.megatron_args(cfg, dp.presets.model("llama-3-8b"))
    # the device's own fused kernel (the default, and what the megatron preset prices): Megatron's default,
    # Transformer Engine's choice (cuDNN's on Hopper); FlashAttention-1/2 as stated: TE's flash-attn backend
    native = dp.presets.framework("megatron").model(model)
    assert megatron_parser().parse_args(dp.megatron_args(cfg, native)).attention_backend == "auto"
    for version in (1, 2):
        stated = dataclasses.replace(model, flash_version=version)
        assert megatron_parser().parse_args(dp.megatron_args(cfg, stated)).attention_backend == "flash"
    unfused = dataclasses.replace(model, flash_attention=False)
    assert megatron_parser().parse_args(dp.megatron_args(cfg, unfused)).attention_backend == "unfused"


def test_megatron_args_carry_experts_and_latent_attention():
    model = dp.presets.model("deepseek-v3")
    ns = megatron_parser().parse_args(dp.megatron_model_args(model))
    assert ns.multi_latent_attention and (ns.q_lora_rank, ns.kv_lora_rank) == (1536, 512)
    assert (ns.qk_head_dim, ns.qk_pos_emb_head_dim, ns.v_head_dim) == (128, 64, 128)
    assert (ns.num_experts, ns.moe_router_topk, ns.moe_ffn_hidden_size) == (256, 8, 2048)
    assert ns.moe_shared_expert_intermediate_size == 2048 and ns.group_query_attention is False
    assert eval(ns.moe_layer_freq) == [0] * 3 + [1] * 58  # Megatron evaluates the list (moe_freq_type)
    qwen = megatron_parser().parse_args(dp.megatron_model_args(dp.presets.model("qwen2.5-72b"), 4096))
    assert qwen.add_qkv_bias and not qwen.add_bias_linear and qwen.seq_length == 4096
    gpt = megatron_parser().parse_args(dp.megatron_model_args(dp.presets.model("gpt-3-175b")))
    assert gpt.add_bias_linear and gpt.normalization is None and not gpt.untie_embeddings_and_output_weights
    assert gpt.attention_backend == "unfused" and gpt.attention_dropout is None


def test_megatron_interleaving_needs_microbatches_a_multiple_of_the_pipeline():
    # 10 microbatches on 4 stages: Megatron's interleaved schedule raises (schedules.py, d98e8a6)
    with pytest.raises(dp.ConfigError, match="multiple of the pipeline size: 10 microbatches on 4"):
        dp.megatron_args(launch(global_batch=80))
    assert dp.megatron_args(launch(global_batch=64))  # 8 microbatches


def test_export_problem_is_one_list():
    from diffpipe._plan._export import export_problem

    par = dp.Parallelism(tensor=8, pipeline=4, data=8, virtual=2, zero=1, sequence_parallel=True)
    assert export_problem("megatron", "interleaved-1f1b", par, 32) is None
    assert "multiple" in export_problem("megatron", "interleaved-1f1b", par, 10)
    assert "ZeRO-1" in export_problem("torchtitan", "interleaved-1f1b", par, 32)
    with pytest.raises(dp.ConfigError, match="unknown framework"):
        export_problem("deepspeed", "1f1b", par, 8)


MEGATRON_LIST = Path(__file__).resolve().parent / "data" / "megatron_arguments_d98e8a6.txt"


@pytest.mark.parametrize("name", ["llama-3-70b", "mixtral-8x7b", "deepseek-v3", "qwen2.5-72b", "gpt-3-175b"])
def test_megatron_flags_are_in_megatron_s_own_list(name):
    # tests/data/megatron_arguments_d98e8a6*.txt: every option string of Megatron-LM d98e8a6's parser
    # (add_megatron_arguments), and those that take no value (docs/framework-notes.md §1a)
    known = {line.strip() for line in MEGATRON_LIST.read_text().splitlines() if line.startswith("--")}
    novalue_path = MEGATRON_LIST.with_name("megatron_arguments_d98e8a6_novalue.txt")
    novalue = {line.strip() for line in novalue_path.read_text().splitlines() if line.startswith("--")}
    model = dp.presets.model(name, flash_attention=True)
    for cfg in LAUNCHES:
        for zero in (0, 1, 2, 3):
            cfg = dataclasses.replace(cfg, parallelism=dataclasses.replace(cfg.parallelism, zero=zero))
            per = model.layers // cfg.parallelism.stages
            split = (per,) * (cfg.parallelism.stages - 1) + (model.layers - per * (cfg.parallelism.stages - 1),)
            args = dp.megatron_args(dataclasses.replace(cfg, layers_per_stage=split), model)
            for i, arg in enumerate(args):
                if not arg.startswith("--"):
                    continue
                assert arg in known, arg
                takes_value = i + 1 < len(args) and not args[i + 1].startswith("--")
                assert takes_value == (arg not in novalue), arg


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_megatron_overlap_flags_are_megatron_s_and_pass_its_rules(zero):
    # Megatron-LM d98e8a6's validate_args: --overlap-param-gather needs --overlap-grad-reduce and the distributed
    # optimizer or Megatron-FSDP; --tp-comm-overlap needs --sequence-parallel
    from diffpipe._plan._export import megatron_overlap_args

    known = {line.strip() for line in MEGATRON_LIST.read_text().splitlines() if line.startswith("--")}
    novalue = {line.strip() for line in MEGATRON_LIST.with_name("megatron_arguments_d98e8a6_novalue.txt")
               .read_text().splitlines() if line.startswith("--")}
    mega = dp.presets.framework("megatron")
    for sp in (True, False):
        par = dp.Parallelism(tensor=4, pipeline=2, data=4, zero=zero, sequence_parallel=sp)
        flags = megatron_overlap_args(mega, par)
        base = dp.megatron_args(launch(tensor=4, pipeline=2, data=4, virtual=1, family="1f1b",
                                       layers_per_stage=(40, 40), zero=zero, sequence_parallel=sp))
        assert set(flags) <= known and set(flags) <= novalue
        assert flags[0] == "--overlap-grad-reduce"
        if "--overlap-param-gather" in flags:
            assert "--use-distributed-optimizer" in base or "--use-megatron-fsdp" in base
        assert ("--overlap-param-gather" in flags) == (zero > 0)
        assert ("--tp-comm-overlap" in flags) == sp and (not sp or "--sequence-parallel" in base)
    assert megatron_overlap_args(None, par) == []
    assert megatron_overlap_args(dp.presets.framework("torchtitan"), par) == []
