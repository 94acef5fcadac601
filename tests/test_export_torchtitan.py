"""The torchtitan export for its current main (Python configurations, ``dp.torchtitan_config``).

torchtitan reads Python configurations since 9810191bb (pytorch/torchtitan#2386, "Config System Refactor:
TOML to Python Dataclass Registry"): a run is a function returning a ``Trainer.Config``, named with
``--module`` / ``--config``. It is not installed here (its imports need ``spmd_types`` and GPUs), so the
export is checked against a committed list of its configuration fields, derived from its sources at
commit b5bcd76c66d0acb1a08b176d9639425bc55e0b2a: ``tests/data/torchtitan_config_fields_b5bcd76.txt``
(names and annotated types of ``Trainer.Config``, ``TrainingConfig``, ``ParallelismConfig``, the
activation-checkpointing classes, and the models' configuration functions). Each generated module is
run against stand-ins whose attributes are exactly those fields (``__slots__``, as torchtitan's
``slots=True`` dataclasses: an unknown field is an ``AttributeError``), every value is checked against
its field's annotation, and the stage and token arithmetic is torchtitan's at that commit:

- ``torchtitan/distributed/pipeline_parallel.py`` ``_get_pipeline_metadata``: with
  ``pipeline_parallel_layers_per_stage``, ``ceil((layers + first_stage_less_layers + last_stage_less_layers)
  / layers_per_stage)`` virtual stages, divisible by the pipeline degree, one per rank for a single-stage
  schedule and at least two for a multi-stage one; ``_generate_llm_fqn_per_model_part``: the effective
  layers (embedding and head counted at their weights) spread evenly, the first ``remainder`` stages one
  more; ``module_fqns_per_model_part`` taken as given; modules ``tok_embeddings``, ``layers.<i>``,
  ``norm``, ``lm_head``.
- ``torchtitan/trainer.py``: tokens per data-parallel rank ``num_tokens_per_microbatch_per_dp_rank x
  num_pp_microbatches`` (microbatches 1 without pipelining), gradient accumulation
  ``num_tokens_per_train_step // (that x dp_replicate x dp_shard)``, which must divide exactly.
- ``torchtitan/distributed/parallel_dims.py``: ``dp_replicate x dp_shard x cp x tp x pp`` is the world
  size; ``expert_parallel_degree`` divides ``dp_shard x cp x tp``.
"""

from __future__ import annotations

import ast
import json
import math
import sys
import types
from pathlib import Path

import pytest
from test_export import launch as toml_launch

import diffpipe as dp
from diffpipe._plan._export import TORCHTITAN_COMMIT, Launch, export_problem

FIELDS_FILE = Path(__file__).resolve().parent / "data" / "torchtitan_config_fields_b5bcd76.txt"


def read_fields() -> tuple[dict[str, str], set[str], set[str]]:
    """(config path -> annotation, importable classes, configuration functions) of the committed list."""
    paths, classes, functions = {}, set(), set()
    for line in FIELDS_FILE.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        kind, _, rest = line.partition(" ")
        if kind == "class":
            classes.add(rest)
        elif kind == "function":
            functions.add(rest)
        elif kind.startswith("config."):
            paths[kind] = rest
    return paths, classes, functions


FIELDS, CLASSES, FUNCTIONS = read_fields()


def launch(**kw) -> Launch:
    """tests/test_export.py's Llama-70B-like launch at ZeRO-3 (torchtitan has no ZeRO-1); keywords override."""
    return toml_launch(**{"zero": 3, **kw})


LAUNCHES = [
    launch(),
    launch(family="1f1b", virtual=1, layers_per_stage=(21, 20, 20, 19), recompute="full", zero=0),
    launch(layers_per_stage=(9, 10, 10, 10, 10, 10, 10, 11), expert=4, expert_tensor=1),
    launch(family="1f1b", pipeline=1, virtual=1, tensor=1, data=16, layers_per_stage=(32,), recompute="none",
           zero=2, sequence_parallel=False, global_batch=64, microbatch_size=2),
    launch(family="1f1b", virtual=1, layers_per_stage=(20,) * 4, zero=2, expert=8, expert_tensor=1),
    launch(family="gpipe", virtual=1, tensor=4, sequence_parallel=False, layers_per_stage=(20,) * 4, context=2,
           data=4, recompute="none"),
    launch(family="zb-v", virtual=2, layers_per_stage=(10,) * 8, zero=2),
]


def slotted(name: str, fields: list[str]) -> object:
    """An object that takes exactly ``fields`` (an unknown one raises AttributeError)."""
    return type(name, (), {"__slots__": tuple(fields)})()


def fake_torchtitan(monkeypatch, base: str, layers: int) -> dict[str, type]:
    """Stand-ins for the modules a generated configuration imports: the activation-checkpointing classes
    and ``base``'s module, whose function returns a config with exactly the listed fields."""
    classes = {}
    module = types.ModuleType("torchtitan.distributed.activation_checkpoint")
    for path in CLASSES:
        owner, cls, leaf = path.rsplit(".", 2)
        assert (owner, leaf) == ("torchtitan.distributed.activation_checkpoint", "Config")
        config_class = type(f"{cls}.Config", (), {})
        setattr(module, cls, type(cls, (), {"Config": config_class}))
        classes[cls] = config_class
    names = ["torchtitan", "torchtitan.distributed", "torchtitan.distributed.activation_checkpoint"]
    for name in names[:2]:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, names[2], module)
    mod, function = base.split(":")

    def make():
        config = slotted("Config", [p.split(".")[1] for p in FIELDS if p.count(".") == 1])
        for section in ("training", "parallelism"):
            setattr(config, section, slotted(section, [p.split(".")[2] for p in FIELDS
                                                        if p.startswith(f"config.{section}.")]))
        config.model_spec = types.SimpleNamespace(model=types.SimpleNamespace(layers=[None] * layers))
        return config

    base_module = types.ModuleType(mod)
    setattr(base_module, function, make)
    monkeypatch.setitem(sys.modules, mod, base_module)
    return classes


def run_export(monkeypatch, text: str, base: str, layers: int, name: str = "diffpipe_plan"):
    classes = fake_torchtitan(monkeypatch, base, layers)
    namespace: dict = {}
    exec(compile(text, "<torchtitan export>", "exec"), namespace)
    return namespace[name](), classes


def conforms(value, annotation: str) -> bool:
    """Whether ``value`` is of the field annotation ``annotation`` (the forms the list uses)."""
    for part in annotation.split(" | "):
        if part == "None" and value is None:
            return True
        if part == "bool" and isinstance(value, bool):
            return True
        if part == "int" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if part == "str" and isinstance(value, str):
            return True
        if part == "list[list[str]]" and isinstance(value, list) and all(
                isinstance(p, list) and all(isinstance(m, str) for m in p) for p in value):
            return True
        if part.startswith("Literal[") and value in ast.literal_eval("(" + part[len("Literal["):-1] + ",)"):
            return True
    return False


def assigned(text: str) -> list[tuple[str, object]]:
    """``config.<path> = <literal>`` assignments of a generated module, in order."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            path = ast.unparse(node.targets[0])
            if path.startswith("config.") and path != "config.activation_checkpoint":
                out.append((path, ast.literal_eval(node.value)))
    return out


def torchtitan_parts(par, layers: int) -> list[list[str]]:
    """The module names of every virtual stage, as torchtitan's pipeline set-up derives them (docstring)."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    if par.module_fqns_per_model_part is not None:
        return par.module_fqns_per_model_part
    single = issubclass(get_schedule_class(par.pipeline_parallel_schedule), PipelineScheduleSingle)
    first, last = par.pipeline_parallel_first_stage_less_layers, par.pipeline_parallel_last_stage_less_layers
    per, pp = par.pipeline_parallel_layers_per_stage, par.pipeline_parallel_degree
    if per is None:
        stages = pp * (1 if single else 2)
    else:
        stages = math.ceil((layers + first + last) / per)
        assert stages % pp == 0, (stages, pp)
        assert stages // pp == 1 if single else stages // pp >= 2
    effective = layers + first + last
    each, extra = divmod(effective, stages)
    assert each >= 1 and first <= each and last <= each
    parts, layer = [], 0
    for i in range(stages):
        n = each + (i < extra) - (first if i == 0 else 0) - (last if i == stages - 1 and i else 0)
        part = (["tok_embeddings"] if i == 0 else []) + [f"layers.{layer + j}" for j in range(n)]
        layer += n
        parts.append(part + (["norm", "lm_head"] if i == stages - 1 else []))
    return parts


def test_the_field_list_is_torchtitan_main_s():
    assert TORCHTITAN_COMMIT.startswith("b5bcd76c") and TORCHTITAN_COMMIT in FIELDS_FILE.read_text()
    # the fields the export writes are there, and the TOML era's are gone (renamed in 9810191bb)
    for path in ("config.parallelism.num_pp_microbatches", "config.training.num_tokens_per_train_step",
                 "config.parallelism.enable_sequence_parallel", "config.activation_checkpoint"):
        assert path in FIELDS
    for gone in ("config.training.local_batch_size", "config.parallelism.pipeline_parallel_microbatch_size",
                 "config.parallelism.expert_tensor_parallel_degree"):
        assert gone not in FIELDS
    for base in dp.TORCHTITAN_BASES.values():
        assert base.replace(":", ".") in FUNCTIONS, base


@pytest.mark.parametrize("cfg", LAUNCHES)
def test_torchtitan_config_runs_on_torchtitan_s_fields(cfg, monkeypatch):
    base = dp.TORCHTITAN_BASES["llama-3-70b"]
    text = dp.torchtitan_config(cfg, base)
    compile(text, "<export>", "exec")
    for path, value in assigned(text):
        assert path in FIELDS, path
        assert conforms(value, FIELDS[path]), (path, value, FIELDS[path])
    config, classes = run_export(monkeypatch, text, base, cfg.layers)
    par, training = config.parallelism, config.training
    want = {"none": None, "selective": classes["SelectiveAC"], "full": classes["FullAC"]}[cfg.recompute]
    assert (config.activation_checkpoint is None) if want is None else isinstance(config.activation_checkpoint, want)
    # the world, the data-parallel split and the experts (parallel_dims.py)
    p = cfg.parallelism
    assert (par.data_parallel_replicate_degree * par.data_parallel_shard_degree * par.context_parallel_degree
            * par.tensor_parallel_degree * par.pipeline_parallel_degree) == p.gpus
    assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == ((p.data, 1) if p.zero == 0
                                                                                      else (1, p.data))
    assert (par.data_parallel_shard_degree * par.context_parallel_degree * par.tensor_parallel_degree
            % par.expert_parallel_degree == 0) and par.expert_parallel_degree == p.expert
    assert par.enable_sequence_parallel == (p.sequence_parallel and p.tensor > 1)
    # tokens (trainer.py): the step's microbatches are the launch's
    dp_degree = par.data_parallel_replicate_degree * par.data_parallel_shard_degree
    microbatches = par.num_pp_microbatches if par.pipeline_parallel_degree > 1 else 1
    per_iteration = training.num_tokens_per_microbatch_per_dp_rank * microbatches * dp_degree
    assert training.num_tokens_per_train_step % per_iteration == 0
    accumulation = training.num_tokens_per_train_step // per_iteration
    assert accumulation * microbatches == cfg.microbatches and (accumulation == 1 or p.pipeline == 1)
    assert training.num_tokens_per_microbatch_per_dp_rank == cfg.microbatch_size * cfg.sequence
    assert training.max_context_length == cfg.sequence
    # the stages (pipeline_parallel.py): torchtitan's split is the launch's
    if p.pipeline > 1:
        from torch.distributed.pipelining.schedules import get_schedule_class

        get_schedule_class(par.pipeline_parallel_schedule)
        parts = torchtitan_parts(par, cfg.layers)
        assert tuple(sum(m.startswith("layers.") for m in part) for part in parts) == cfg.layers_per_stage
        names = [m for part in parts for m in part]
        assert names == ["tok_embeddings", *[f"layers.{i}" for i in range(cfg.layers)], "norm", "lm_head"]


def test_the_configuration_checks_the_model_s_layers(monkeypatch):
    cfg = LAUNCHES[0]
    text = dp.torchtitan_config(cfg, "my_configs.llama:seventy", name="planned")
    with pytest.raises(ValueError, match="diffpipe planned 80 layers; my_configs.llama:seventy makes 32"):
        run_export(monkeypatch, text, "my_configs.llama:seventy", 32, name="planned")
    config, _ = run_export(monkeypatch, text, "my_configs.llama:seventy", 80, name="planned")
    assert config.parallelism.pipeline_parallel_schedule == "Interleaved1F1B"


def test_what_torchtitan_main_runs_and_v0_2_did_not():
    # tensor parallelism without sequence parallelism: main has enable_sequence_parallel, v0.2 had not
    cfg = launch(family="1f1b", virtual=1, layers_per_stage=(20,) * 4, sequence_parallel=False)
    assert export_problem("torchtitan", cfg.family, cfg.parallelism, cfg.microbatches) is None
    assert "sequence parallelism" in export_problem("torchtitan-v0.2", cfg.family, cfg.parallelism, cfg.microbatches)
    assert "enable_sequence_parallel = False" in dp.torchtitan_config(cfg, dp.TORCHTITAN_BASES["llama-3-70b"])
    with pytest.raises(dp.ConfigError, match="sequence parallelism"):
        dp.torchtitan_toml(cfg)


@pytest.mark.parametrize("kwargs, message", [
    (dict(zero=1), "no ZeRO-1"),
    (dict(expert=4, expert_tensor=None), "no expert tensor parallelism: with expert=4"),
    (dict(expert=1, expert_tensor=1), "shards the experts like the tensor group (8)"),
    (dict(tensor=1, data=64, expert=2, expert_tensor=1, zero=0, sequence_parallel=False),
     "expert_parallel_degree (2) to divide data_parallel_shard_degree x context x tensor = 1: use zero=2 or 3"),
    (dict(family="chimera", virtual=1, layers_per_stage=(20,) * 4), "no schedule 'chimera'"),
    (dict(context=2, data=4, zero=0), "context-parallel ranks"),
])
def test_torchtitan_config_refuses_what_main_cannot_run(kwargs, message):
    with pytest.raises(dp.ConfigError, match="torchtitan export") as info:
        dp.torchtitan_config(launch(**kwargs), dp.TORCHTITAN_BASES["llama-3-70b"])
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("bad, message", [
    ((LAUNCHES[0], "llama3_70b"), "base must be the model's torchtitan configuration as 'module:function'"),
    ((LAUNCHES[0], "a.b:c d"), "base must be"), (("1f1b", "a:b"), "launch must be a Launch"),
])
def test_torchtitan_config_bad_arguments(bad, message):
    with pytest.raises(dp.ConfigError, match=message):
        dp.torchtitan_config(*bad)
    with pytest.raises(dp.ConfigError, match="name must be a Python identifier"):
        dp.torchtitan_config(LAUNCHES[0], "a:b", name="not one")


def test_cli_plan_exports_torchtitan_main(tmp_path, capsys, monkeypatch):
    from diffpipe.cli import main

    out = tmp_path / "plan_config.py"
    request = ["plan", "--model", "llama-3-8b", "--cluster", "8xH100", "--global-batch", "8", "--families", "1f1b",
               "--tp", "4,8", "--pp", "1,2", "--microbatch-size", "1", "--recompute", "full", "--zero", "3",
               "--sequence-parallel", "--balance-top", "0"]
    assert main([*request, "--export", "torchtitan", "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    text = out.read_text()
    assert data["export"]["format"] == "torchtitan" and data["export"]["text"] == text
    assert "from torchtitan.models.llama3.config_registry import llama3_8b as base" in text  # the preset's own
    best = data["rows"][data["export"]["row"]]
    config, _ = run_export(monkeypatch, text, dp.TORCHTITAN_BASES["llama-3-8b"], 32)
    assert config.parallelism.tensor_parallel_degree == best["tensor"]
    assert config.parallelism.pipeline_parallel_degree == best["pipeline"]
    # another base by name; a model without a known torchtitan configuration is refused before any search
    assert main([*request, "--export", "torchtitan", "--torchtitan-base", "mine.models:llama_8b"]) == 0
    assert "from mine.models import llama_8b as base" in capsys.readouterr().out
    hf = Path(__file__).resolve().parent / "data" / "hf" / "qwen3-8b.json"  # no torchtitan configuration named
    code = main(["plan", "--hf-config", str(hf), "--gpus", "8", "--global-batch", "8", "--export", "torchtitan"])
    err = capsys.readouterr().err
    assert code == 2 and "give --torchtitan-base MODULE:FUNCTION" in err and "explored" not in err
    code = main([*request, "--export", "megatron", "--torchtitan-base", "a:b"])
    assert code == 2 and "--torchtitan-base applies to --export torchtitan" in capsys.readouterr().err
    code = main([*request, "--export", "torchtitan", "--torchtitan-base", "llama3_8b"])  # refused before the search
    assert code == 2 and "plan: --torchtitan-base must be the model's torchtitan configuration as 'module:function'" \
        in capsys.readouterr().err


def test_plan_for_torchtitan_searches_the_expert_layouts_main_runs():
    # main runs experts at expert tensor size 1 with expert parallelism and at the tensor size without:
    # plan(export="torchtitan") searches both (not the tensor size twice at tensor 1), and every row exports
    model = dp.Transformer(layers=4, hidden=256, heads=8, sequence=128, vocabulary=1000, microbatch_size=1,
                           activation="swiglu", experts=8, experts_per_token=2, moe_ffn_hidden=512)
    cluster = dp.Cluster("H100", gpus=8)
    axes = dict(families=("1f1b",), pipeline=(1,), microbatch_sizes=(1,), recompute=("none",), zero=(3,),
                balance=False, progress=False, top_k=0)
    table = dp.plan(model, cluster, 8, export="torchtitan", tensor=(2,), sequence_parallel=(True,), **axes)
    found = {(r["expert"], r["expert_tensor"]) for r in table.rows}
    assert any(e > 1 for e, _ in found)  # at the tensor size alone (the default) every e > 1 was refused
    assert all(et == (1 if e > 1 else 2) for e, et in found)
    for i in range(len(table.rows)):
        dp.torchtitan_config(table.launch(i), "my.models:moe")
    ones = dp.plan(model, cluster, 8, export="torchtitan", tensor=(1,), sequence_parallel=(False,), **axes)
    keys = [(r["expert"], r["expert_tensor"]) for r in ones.rows]
    assert len(keys) == len(set(keys)) and ones.simulated == len(keys)  # at tensor 1 the two sizes are one
