"""Launch exports: a chosen whole configuration as Megatron-LM arguments, a torchtitan Python
configuration (torchtitan's current main) or a torchtitan TOML fragment (torchtitan v0.2.0-v0.2.2).

``Launch`` is the small frozen record ``plan`` hands back for its best rows (and that a user can
write by hand): a ``Parallelism`` (the parallel degrees), the batch, the schedule family and the
layers of every pipeline stage. ``megatron_args`` / ``torchtitan_config`` / ``torchtitan_toml`` turn it into
what those frameworks read;
``parse_megatron_layout`` reads Megatron-Core's ``--pipeline-model-parallel-layout`` notation back
into layers per stage, so a hand-written layout can be evaluated with diffpipe. The torch
compute-only CSV of the chosen schedule is ``diffpipe.schedules.to_torch_csv``.

Flag and field names were checked against the frameworks' own sources (``tests/test_export.py``
keeps the list, citing file and commit):

- Megatron-LM ``megatron/training/arguments.py`` (most parallelism flags are generated from the
  ``ModelParallelConfig`` / ``TransformerConfig`` / ``TrainingConfig`` / ``DistributedInitConfig``
  dataclass fields by ``ArgumentGroupFactory``: ``--`` + the field name with ``-`` for ``_``) and
  ``megatron/core/transformer/pipeline_parallel_layer_layout.py`` (the layout grammar: ``E``
  embedding, ``t`` transformer layer, ``m`` MTP layer, ``L`` loss, ``|`` between stages, ``x*n`` and
  ``(...)*n`` repetition, commas cosmetic; stages listed in layer order, i.e. virtual stage ``v`` of
  pipeline rank ``r`` is entry ``v * pipeline + r``, the same model-order stage numbering as diffpipe's
  looped placement).
- torchtitan's current main (``torchtitan_config``): since 9810191bb (pytorch/torchtitan#2386, "Config
  System Refactor: TOML to Python Dataclass Registry") a run is a Python function returning a
  ``Trainer.Config``, chosen with ``--module`` and ``--config`` (``torchtitan/config/README.md``); the
  fields were read at b5bcd76c (Aug 2026): ``torchtitan/config/configs.py`` ``TrainingConfig`` (batch in
  tokens: ``num_tokens_per_microbatch_per_dp_rank``, ``num_tokens_per_train_step``,
  ``max_context_length``) and ``ParallelismConfig`` (``num_pp_microbatches``, ``enable_sequence_parallel``,
  ``expert_parallel_degree``; no expert tensor degree any more), ``torchtitan/trainer.py``
  ``Trainer.Config.activation_checkpoint`` (``SelectiveAC.Config`` by default, ``FullAC.Config`` or
  None), ``torchtitan/distributed/pipeline_parallel.py`` (the stage count and split, the head named
  ``lm_head``). ``tests/data/torchtitan_config_fields_b5bcd76.txt`` lists them.
- torchtitan ``torchtitan/config/job_config.py`` at the last commit that read TOML files
  (e347b1e5, Feb 2026; torchtitan v0.2.2 and earlier: ``torchtitan_toml``). Schedule
  names are torch's (``torch.distributed.pipelining.schedules.get_schedule_class``).

Why one module past 500 lines: the Megatron-LM and both torchtitan writers read one ``Launch`` and share
what either framework refuses (``export_problem``) and the sources above; Megatron's layout grammar
(``megatron_layout``, ``parse_megatron_layout``) is the seam to split along if it grows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from .._checks import check_int
from .._choices import RECOMPUTE
from .._errors import ConfigError
from .._io import toml_value
from .._model._transformer import Transformer
from .._workload._frameworks import Framework
from .._workload._parallelism import Parallelism
from ..schedules._torch import TORCH_NAMES

#: Schedule families Megatron-LM runs: 1F1B without, interleaved 1F1B with virtual stages.
MEGATRON_FAMILIES = ("1f1b", "interleaved-1f1b")
#: ZeRO stage -> Megatron-LM flags, as Megatron users run them: ZeRO-1 and ZeRO-2 are the distributed
#: optimizer (optimizer state sharded, gradients reduce-scattered into it; Megatron keeps the whole
#: gradient buffer, so a ZeRO-2 plan's gradient memory is below what Megatron holds by
#: ``2 x parameters x (1 - 1/data)`` bytes: ``plan(..., export="megatron")`` searches zero=1 for
#: it); ZeRO-3 is Megatron-FSDP sharding everything, which
#: ``validate_args`` accepts only with ``--ckpt-format fsdp_dtensor`` (Megatron-LM d98e8a6,
#: ``megatron/training/arguments.py``: "Megatron-FSDP requires the `fsdp_dtensor` checkpointing
#: format"; FSDP v1 runs on the distributed optimizer).
_MEGATRON_ZERO = {
    0: [],
    1: ["--use-distributed-optimizer"],
    2: ["--use-distributed-optimizer"],
    3: ["--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
        "optim_grads_params", "--ckpt-format", "fsdp_dtensor"],
}
#: The frameworks ``export_problem`` knows: Megatron-LM, torchtitan's current main (Python configurations)
#: and torchtitan v0.2.0-v0.2.2 (TOML job files).
EXPORT_TARGETS = ("megatron", "torchtitan", "torchtitan-v0.2")
#: The torchtitan commit whose configuration fields ``torchtitan_config`` writes (pytorch/torchtitan main,
#: 2026-08-21); the Python configuration system dates from 9810191bb (pytorch/torchtitan#2386).
TORCHTITAN_COMMIT = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"
#: diffpipe model presets -> torchtitan's own configuration function of that model (``--module``
#: ``torchtitan.models.<model>.config_registry``, ``--config <function>``, at ``TORCHTITAN_COMMIT``).
TORCHTITAN_BASES = {
    "llama-3-8b": "torchtitan.models.llama3.config_registry:llama3_8b",
    "llama-3-70b": "torchtitan.models.llama3.config_registry:llama3_70b",
    "llama-3.1-405b": "torchtitan.models.llama3.config_registry:llama3_405b",
    "deepseek-v3": "torchtitan.models.deepseek_v3.config_registry:deepseek_v3_671b",
}


def export_problem(framework: str, family: str, parallelism: Parallelism, microbatches: int,
                   model: Transformer | None = None) -> str | None:
    """Why ``framework`` cannot run ``family`` with ``parallelism`` and ``microbatches`` per
    pipeline (one line), or None; with ``model``, its rules that depend on the model too. The one
    list of each export's limits: ``megatron_args`` and ``torchtitan_toml`` refuse with it, and
    ``plan(..., export=...)`` filters its search with it before evaluating anything.

    Megatron-LM (d98e8a6): it runs ``1f1b`` and, with virtual stages, ``interleaved-1f1b``, whose
    microbatches must be a multiple of the pipeline size (``megatron/core/pipeline_parallel/
    schedules.py``, the interleaved schedule: the microbatch group per virtual stage is the pipeline
    size by default, and a remainder below it is a ``RuntimeError``); its expert folding is
    ``Parallelism``'s own rule; MoE layers with biases (``add_bias_linear``) only at expert tensor
    size 1 (``megatron/core/transformer/transformer_config.py:2612-2615``, ``TransformerConfig``'s
    check: "Bias in Moe is only supported when ETP==1"). torchtitan (v0.2.x): no ZeRO-1 (FSDP2
    shards gradients too), tensor parallelism always with sequence parallelism, a schedule torch's
    pipelining has (``TORCH_NAMES``), and experts as ``torchtitan/distributed/parallel_dims.py``
    (v0.2.1, v0.2.2, e347b1e5) builds them: ``expert_tensor_parallel_degree`` 1 or the tensor size
    (``"Currently we only support ETP=TP or ETP=1"``) and only with expert parallelism (``"No
    effect ... when ep = 1"``: the experts then shard like the tensor group), the expert groups
    inside the sharded ranks (sparse mesh ``["pp", "dp_replicate", "efsdp", "ep", "etp"]``,
    ``efsdp = dp_shard x cp x tp / (etp x ep)``). v0.2.0's stricter expert rule is a note in the
    TOML, not a refusal (``torchtitan_v020_problem``). torchtitan's current main (``"torchtitan"``,
    ``TORCHTITAN_COMMIT``) has ``enable_sequence_parallel`` (tensor parallelism without it is
    expressible) and no expert tensor degree: with expert parallelism the experts shard over the
    expert ranks only (expert tensor size 1), without it like the tensor group
    (``torchtitan/models/common/moe_sharding.py``), and ``expert_parallel_degree`` must divide
    ``dp_shard x cp x tp`` (``torchtitan/distributed/parallel_dims.py``); ZeRO-1, schedules and the
    context ranks in FSDP as before.
    """
    par = parallelism
    if framework == "megatron":
        if par.pipeline > 1 and family not in MEGATRON_FAMILIES:
            return (f"Megatron-LM has no schedule {family!r} (it runs {' and '.join(MEGATRON_FAMILIES)})")
        if family == "1f1b" and par.virtual > 1:
            return f"1f1b with virtual={par.virtual}: use interleaved-1f1b"
        if par.pipeline > 1 and par.virtual > 1 and microbatches % par.pipeline:
            return (f"Megatron-LM's interleaved schedule needs microbatches a multiple of the pipeline size: "
                    f"{microbatches} microbatches on {par.pipeline} stages")
        if model is not None and model.experts > 1 and model.bias and par.etp > 1:
            return (f"Megatron-LM runs MoE layers with biases only at expert_tensor=1 (\"Bias in Moe is only "
                    f"supported when ETP==1\"), not {par.etp}")
        return None
    if framework in ("torchtitan", "torchtitan-v0.2"):
        if par.zero == 1:
            return "torchtitan has no ZeRO-1 (FSDP2 shards gradients too): use zero=2 or 3"
        if framework == "torchtitan-v0.2" and par.tensor > 1 and not par.sequence_parallel:
            return ("torchtitan's tensor parallelism always uses sequence parallelism: plan with "
                    "sequence_parallel=True")
        if par.pipeline > 1 and family not in TORCH_NAMES:
            return f"torch's pipelining has no schedule {family!r} (known: {', '.join(TORCH_NAMES)})"
        if par.context > 1 and par.zero == 0:
            return ("torchtitan shards parameters over the context-parallel ranks (FSDP) whenever "
                    "context_parallel_degree > 1: use zero=2 or 3")
        return _torchtitan_expert_problem(par, main=framework == "torchtitan")
    raise ConfigError(f"export: unknown framework {framework!r}; known: {', '.join(EXPORT_TARGETS)}")


def _torchtitan_expert_problem(par: Parallelism, main: bool = False) -> str | None:
    """What torchtitan v0.2.1-v0.2.2 (or, ``main``, its current main) refuses in ``par``'s expert
    layers (``export_problem``), or None."""
    e, et = par.expert, par.etp
    if e == 1:
        if et == par.tensor:
            return None
        if main:
            return (f"torchtitan shards the experts like the tensor group ({par.tensor}) without expert "
                    f"parallelism: expert_tensor={et}")
        return (f"torchtitan applies expert_tensor_parallel_degree only with expert parallelism (experts "
                f"shard like the tensor group, {par.tensor}, at expert=1): expert_tensor={et}")
    if main and et != 1:
        return (f"torchtitan (main) has no expert tensor parallelism: with expert={e} the experts shard over "
                f"the expert ranks only; plan with expert_tensor=1, not {et}")
    if et not in (1, par.tensor):
        return f"torchtitan runs expert tensor parallelism of 1 or the tensor size {par.tensor}, not {et}"
    shard = 1 if par.zero == 0 else par.data  # data_parallel_shard_degree
    region = shard * par.context * par.tensor
    if region % (et * e) == 0:
        return None
    fix = ": use zero=2 or 3 (FSDP shards the data ranks)" if par.zero == 0 else ""
    if main:
        return (f"torchtitan needs expert_parallel_degree ({e}) to divide data_parallel_shard_degree x context x "
                f"tensor = {region}{fix}")
    return (f"torchtitan forms the expert groups inside data_parallel_shard_degree x context x tensor = "
            f"{region} ranks, which expert_tensor x expert = {et} x {e} does not divide{fix}")


def torchtitan_v020_problem(parallelism: Parallelism) -> str | None:
    """What torchtitan v0.2.0 refuses in ``parallelism``'s expert layers that v0.2.1-v0.2.2 run, or
    None: its expert group takes all the context ranks (and, at expert tensor size 1, all the tensor
    ranks) rather than any ranks of the sharded region (torchtitan v0.2.0, 29624e3,
    ``torchtitan/distributed/parallel_dims.py:57-64``: ``ep % cp == 0`` at ETP = TP,
    ``ep % (cp * tp) == 0`` at ETP 1; v0.2.1 dropped both)."""
    par = parallelism
    if par.expert == 1:
        return None
    borrowed = par.context if par.etp == par.tensor else par.context * par.tensor
    if par.expert % borrowed:
        what = "context_parallel_degree" + ("" if par.etp == par.tensor else " x tensor_parallel_degree")
        return (f"torchtitan v0.2.0 needs expert_parallel_degree ({par.expert}) a multiple of {what} ({borrowed}); "
                "v0.2.1 and v0.2.2 run it")
    return None


@dataclass(frozen=True, init=False)
class Launch:
    """One whole training configuration, as a framework launches it.

    ``Launch(family, parallelism, microbatch_size=..., global_batch=..., sequence=...,
    layers_per_stage=..., recompute=...)``. The parallel sizes, their checks and the derived counts
    (``gpus``, ``stages``) are the ``Parallelism``'s (``launch.parallelism.tensor``, ...).

    Attributes:
        family: the pipeline schedule family (``diffpipe.schedules.names()``).
        parallelism: the ``Parallelism`` (tensor, pipeline, data, virtual, expert, expert tensor, ZeRO
            stage, sequence parallelism); a mapping of its fields is accepted too (``to_dict``'s form).
        microbatch_size: samples per microbatch.
        global_batch: samples per optimizer step, over all data-parallel ranks.
        sequence: tokens per sample.
        layers_per_stage: transformer layers of every stage in model order (``parallelism.stages``
            entries; the embedding sits on the first stage, the head and loss on the last).
        recompute: ``"none"``, ``"selective"`` or ``"full"``.
    """

    family: str
    parallelism: Parallelism
    microbatch_size: int
    global_batch: int
    sequence: int
    layers_per_stage: tuple[int, ...]
    recompute: str

    def __init__(self, family: str, parallelism: Parallelism | Mapping[str, Any] | None = None, *,
                 microbatch_size: int, global_batch: int, sequence: int, layers_per_stage: Any,
                 recompute: str = "none", **unknown: Any) -> None:
        if unknown:
            sizes = sorted(set(unknown) & {f.name for f in fields(Parallelism)})
            where = f" (the parallel sizes go in parallelism=Parallelism({', '.join(sizes)}=...))" if sizes else ""
            raise ConfigError(f"launch: unknown field(s) {', '.join(sorted(unknown))}{where}")
        if isinstance(parallelism, Mapping):
            parallelism = Parallelism(**parallelism)
        if not isinstance(parallelism, Parallelism):
            raise ConfigError(f"launch: parallelism must be a Parallelism, got {type(parallelism).__name__}")
        if not isinstance(family, str):
            raise ConfigError(f"launch: family must be a schedule family name, got {family!r}")
        for name, value in (("microbatch_size", microbatch_size), ("global_batch", global_batch),
                            ("sequence", sequence)):
            check_int(f"launch: {name}", value)
        if recompute not in RECOMPUTE:
            raise ConfigError(f"launch: recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
        counts = tuple(check_int("launch: layers_per_stage entry", c, 0) for c in layers_per_stage)
        if len(counts) != parallelism.stages:
            raise ConfigError(f"launch: layers_per_stage has {len(counts)} entries, pipeline x virtual is "
                              f"{parallelism.stages}")
        if sum(counts) < 1:
            raise ConfigError("launch: layers_per_stage holds no layer")
        per_step = microbatch_size * parallelism.data
        if global_batch % per_step:
            raise ConfigError(f"launch: global_batch {global_batch} is not a multiple of microbatch_size "
                              f"x data = {per_step}")
        for name, value in (("family", family), ("parallelism", parallelism),
                            ("microbatch_size", int(microbatch_size)), ("global_batch", int(global_batch)),
                            ("sequence", int(sequence)), ("layers_per_stage", counts), ("recompute", recompute)):
            object.__setattr__(self, name, value)

    @property
    def layers(self) -> int:
        return sum(self.layers_per_stage)

    @property
    def microbatches(self) -> int:
        """Microbatches per data-parallel rank and step (the pipeline's microbatch count)."""
        return self.global_batch // (self.microbatch_size * self.parallelism.data)

    @property
    def uniform(self) -> bool:
        return len(set(self.layers_per_stage)) == 1

    def to_dict(self) -> dict[str, Any]:
        """Plain data; ``Launch(**launch.to_dict())`` is ``launch``."""
        return {"family": self.family, "parallelism": asdict(self.parallelism),
                "microbatch_size": self.microbatch_size, "global_batch": self.global_batch,
                "sequence": self.sequence, "layers_per_stage": list(self.layers_per_stage),
                "recompute": self.recompute}


# -- Megatron-LM --------------------------------------------------------------------------------------


def megatron_layout(layers_per_stage: Any) -> str:
    """Megatron-Core's ``--pipeline-model-parallel-layout`` for blocks per stage in model order:
    the embedding ``E`` on the first stage, the loss ``L`` on the last, runs of ``t`` written ``t*n``.

    ``megatron_layout([3, 3, 3, 2])`` is ``"Et*3|t*3|t*3|t*2L"``.
    """
    counts = [check_int("megatron layout: layers per stage", c, 0) for c in layers_per_stage]
    if not counts:
        raise ConfigError("megatron layout: no stages")

    def run(n: int) -> str:
        return "" if n == 0 else "t" if n == 1 else f"t*{n}"

    stages = [run(n) for n in counts]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "L"
    return "|".join(stages)


_TOKEN = re.compile(r"(\(|\)|\*\d+|[|ELtm,])")
#: The most layer symbols a layout may unroll to, and the deepest nesting of its groups: checked
#: from the repetition counts before anything is unrolled (no model has a million layers).
MAX_LAYOUT = 1_000_000
MAX_LAYOUT_DEPTH = 64


def _expand(text: str) -> str:
    """The layout with its repetitions unrolled and commas dropped (nested groups allowed)."""
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ConfigError(f"megatron layout {text!r}: unexpected {text[pos]!r} at position {pos} "
                              "(known: E t m L | , ( ) *n; no spaces, as in Megatron)")
        tokens.append(match.group(1))
        pos = match.end()

    def sequence(i: int, depth: int) -> tuple[str, int]:
        if depth > MAX_LAYOUT_DEPTH:
            raise ConfigError(f"megatron layout: groups nested past {MAX_LAYOUT_DEPTH} deep")
        out: list[str] = []
        while i < len(tokens):
            token = tokens[i]
            if token == ")":
                if depth == 0:
                    raise ConfigError(f"megatron layout {text!r}: unmatched ')'")
                return "".join(out), i
            if token == "(":
                inner, i = sequence(i + 1, depth + 1)
                if i >= len(tokens):
                    raise ConfigError(f"megatron layout {text!r}: unmatched '('")
                out.append(inner)
            elif token.startswith("*"):
                if not out or out[-1] in ("", ","):
                    raise ConfigError(f"megatron layout {text!r}: '{token}' repeats nothing")
                count = int(token[1:]) if len(token) <= 8 else MAX_LAYOUT + 1
                if len(out[-1]) * count + sum(map(len, out[:-1])) > MAX_LAYOUT:
                    shown = token if len(token) <= 16 else token[:13] + "..."
                    raise ConfigError(f"megatron layout {text[:60]!r}: '{shown}' unrolls past {MAX_LAYOUT:,} "
                                      "layer symbols")
                out[-1] = out[-1] * count
            elif token != ",":
                out.append(token)
            i += 1
        if depth:
            raise ConfigError(f"megatron layout {text!r}: unmatched '('")
        return "".join(out), i

    return sequence(0, 0)[0]


def parse_megatron_layout(layout: str, pipeline: int | None = None) -> tuple[int, ...]:
    """Transformer layers per stage (model order) of a Megatron-Core layout string.

    ``parse_megatron_layout("Et*3|t*3|t*3|t*2L")`` is ``(3, 3, 3, 2)``; ``"E|(t*4|)*2,t*3L"`` is
    ``(0, 4, 4, 3)``. diffpipe places the embedding on the first stage and the head with the loss on
    the last, as Megatron's default does; a layout placing them elsewhere, or holding MTP layers
    (``m``), is refused in one line. With ``pipeline`` the stage count must be a multiple of it
    (virtual stages per rank = stages / pipeline, as Megatron derives it).

    A hand-written layout is evaluated by passing the counts on:
    ``dp.Configuration(model, par, cluster, batch, layers_per_stage=dp.parse_megatron_layout(text, par.pipeline))``.
    """
    if not isinstance(layout, str) or not layout.strip():
        raise ConfigError(f"megatron layout must be a non-empty string, got {layout!r}")
    stages = _expand(layout).split("|")
    if "m" in "".join(stages):
        raise ConfigError(f"megatron layout {layout!r}: MTP layers ('m') are not modelled by diffpipe")
    flat = "".join(stages)
    if flat.count("E") != 1 or flat.count("L") != 1:
        raise ConfigError(f"megatron layout {layout!r}: needs exactly one 'E' and one 'L'")
    if not stages[0].startswith("E"):
        raise ConfigError(f"megatron layout {layout!r}: the embedding 'E' must open the first stage")
    if not stages[-1].endswith("L"):
        raise ConfigError(f"megatron layout {layout!r}: the loss 'L' must close the last stage")
    if pipeline is not None:
        check_int("megatron layout: pipeline", pipeline)
        if len(stages) % pipeline:
            raise ConfigError(f"megatron layout {layout!r}: {len(stages)} stages are not a multiple of "
                              f"pipeline {pipeline}")
    return tuple(stage.count("t") for stage in stages)


def megatron_model_args(model: Transformer, sequence: int | None = None) -> list[str]:
    """Megatron-LM arguments for the shape of ``model`` (``pretrain_gpt.py``; names as in Megatron-LM
    d98e8a6, most generated from ``TransformerConfig``'s fields): layers, hidden size, heads, query
    groups, FFN size, SwiGLU, RMSNorm, rotary positions, untied embeddings, biases, QK-norm,
    dropout, the attention backend (with flash attention ``auto`` for the device's own fused kernel,
    ``flash_version=3``: Transformer Engine's choice, cuDNN's on Hopper; else ``flash``; without it
    ``unfused``), bf16, the
    vocabulary, the sequence (``sequence``, default the model's) and the maximum positions, mixture
    of experts and multi-head latent attention. The tokenizer, data and optimizer flags stay the user's.

    Raises:
        ConfigError: for a model Megatron's GPT cannot express: a FFN width that is not an integer,
            a value head dimension other than the key's outside latent attention.
    """
    if not isinstance(model, Transformer):
        raise ConfigError(f"megatron export: model must be a Transformer, got {type(model).__name__}")
    m = model
    seq = m.sequence if sequence is None else sequence
    ffn = float(m.ffn)
    if ffn != int(ffn):
        raise ConfigError(f"megatron export: the FFN width {ffn} is not an integer (give ffn_hidden)")
    args = ["--num-layers", str(m.layers), "--hidden-size", str(m.hidden), "--num-attention-heads", str(m.heads),
            "--ffn-hidden-size", str(int(ffn)), "--seq-length", str(seq),
            "--max-position-embeddings", str(seq), "--vocab-size", str(m.vocabulary)]
    mla = m.kv_lora_rank > 0
    if mla:
        args += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank),
                 "--qk-head-dim", str(m.dh - m.rope_head_dim), "--qk-pos-emb-head-dim", str(m.rope_head_dim),
                 "--v-head-dim", str(m.dv)]
        if m.q_lora_rank > 0:
            args += ["--q-lora-rank", str(m.q_lora_rank)]
    else:
        if m.dv != m.dh:
            raise ConfigError(f"megatron export: value heads of {m.dv} dimensions, keys of {m.dh}: Megatron's "
                              "GPT has one head dimension (--kv-channels) outside latent attention")
        if m.kv != m.heads:
            args += ["--group-query-attention", "--num-query-groups", str(m.kv)]
        if m.dh * m.heads != m.hidden:
            args += ["--kv-channels", str(m.dh)]
    if m.activation == "swiglu":
        args.append("--swiglu")
    if m.norm == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if m.positions == "rotary":
        args += ["--position-embedding-type", "rope"]
    if not m.tied_embedding:
        args.append("--untie-embeddings-and-output-weights")
    if not m.bias:
        args.append("--disable-bias-linear")
        if m.qkv_bias:
            args.append("--add-qkv-bias")
    if m.qk_norm:
        args.append("--qk-layernorm")
    if not m.dropout:
        args += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    backend = "unfused" if not m.flash_attention else "auto" if m.flash_generation == 3 else "flash"
    args += ["--attention-backend", backend]
    if m.dtype_bytes == 2:
        args.append("--bf16")
    if m.experts > 1:
        args += ["--num-experts", str(m.experts), "--moe-router-topk", str(m.experts_per_token),
                 "--moe-ffn-hidden-size", str(int(m.expert_ffn))]
        if m.shared_experts:
            args += ["--moe-shared-expert-intermediate-size", str(int(m.shared_experts * m.expert_ffn))]
        moe = set(m.moe_blocks())
        if len(moe) != m.layers:
            args += ["--moe-layer-freq", "[" + ",".join("1" if i in moe else "0" for i in range(m.layers)) + "]"]
        if m.capacity_factor is not None:
            args += ["--moe-expert-capacity-factor", repr(float(m.capacity_factor))]
    return args


def megatron_args(launch: Launch, model: Transformer | None = None) -> list[str]:
    """Megatron-LM command-line arguments for ``launch`` (``pretrain_gpt.py`` and friends).

    Parallel degrees (context parallelism as ``--context-parallel-size`` with ``--cp-comm-type p2p``,
    the ring diffpipe prices; ``--expert-model-parallel-size`` and, when it differs from the tensor
    size, ``--expert-tensor-parallel-size``), ``--num-layers``, ``--seq-length``, the batch, then the
    stage split: nothing for an even split without virtual stages,
    ``--num-layers-per-virtual-pipeline-stage`` for an even interleaved split,
    ``--pipeline-model-parallel-layout`` (with the embedding and loss
    placement) for an uneven one. Recompute: ``--recompute-granularity selective`` (Megatron's default
    selective module is the attention core, as diffpipe's), or ``full`` with ``--recompute-method
    uniform --recompute-num-layers 1`` (every layer from its input). ZeRO: see ``_MEGATRON_ZERO``.
    With ``model`` the model's shape too (``megatron_model_args``): the arguments then start a run
    once the tokenizer and data are added.

    Raises:
        ConfigError: for what Megatron-LM does not run (``export_problem``: a family other than
            ``1f1b`` and ``interleaved-1f1b``, interleaving with microbatches not a multiple of the
            pipeline size, a biased MoE model at expert tensor size above 1), or a model it cannot
            express.
    """
    if not isinstance(launch, Launch):
        got = repr(launch) if isinstance(launch, (str, int, float, type(None))) else type(launch).__name__
        raise ConfigError(f"megatron_args: launch must be a Launch (e.g. PlanTable.launch(i)), got {got}")
    par = launch.parallelism
    problem = export_problem("megatron", launch.family, par, launch.microbatches, model)
    if problem:
        raise ConfigError(f"megatron export: {problem}")
    args = [
        "--tensor-model-parallel-size", str(par.tensor),
        "--pipeline-model-parallel-size", str(par.pipeline),
    ]
    if par.context > 1:  # the K,V ring diffpipe prices (p2p, also Megatron's default)
        args += ["--context-parallel-size", str(par.context), "--cp-comm-type", "p2p"]
    if par.expert > 1:
        args += ["--expert-model-parallel-size", str(par.expert)]
    if par.etp != par.tensor:  # unset, Megatron takes the tensor size (validate_args)
        args += ["--expert-tensor-parallel-size", str(par.etp)]
    if par.sequence_parallel and par.tensor > 1:
        args.append("--sequence-parallel")
    if model is not None:
        if model.layers != launch.layers:
            raise ConfigError(f"megatron export: the model has {model.layers} layers, the launch {launch.layers}")
        args += megatron_model_args(model, launch.sequence)
    else:
        args += ["--num-layers", str(launch.layers), "--seq-length", str(launch.sequence)]
    args += [
        "--micro-batch-size", str(launch.microbatch_size),
        "--global-batch-size", str(launch.global_batch),
    ]
    if not launch.uniform:
        args += ["--pipeline-model-parallel-layout", megatron_layout(launch.layers_per_stage)]
    elif par.virtual > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", str(launch.layers_per_stage[0])]
    if launch.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif launch.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    args += _MEGATRON_ZERO[par.zero]
    return args


def megatron_overlap_args(framework: Framework | None, parallelism: Parallelism) -> list[str]:
    """Megatron-LM's overlap flags for what ``framework`` hides on ``parallelism`` (the ``Framework``
    a ``plan`` priced; nothing for None or another framework's buckets): ``--overlap-grad-reduce`` for
    Megatron's gradient buckets; ``--overlap-param-gather`` for the distributed optimizer's (ZeRO-1/2)
    or Megatron-FSDP's (ZeRO-3) gathers, which Megatron-LM's ``validate_args`` accepts only with the
    first (``megatron/training/arguments.py`` at d98e8a6); ``--tp-comm-overlap`` with sequence
    parallelism over a tensor group, which it requires."""
    if framework is None or framework.buckets != "megatron":
        return []
    args = ["--overlap-grad-reduce"]
    zero = parallelism.zero
    if (framework.param_gather and zero in (1, 2)) or (framework.prefetch and zero == 3):
        args.append("--overlap-param-gather")
    if framework.tensor_overlap and parallelism.sequence_parallel and parallelism.tensor > 1:
        args.append("--tp-comm-overlap")
    return args


# -- torchtitan --------------------------------------------------------------------------------------


def torchtitan_modules(layers_per_stage: Any) -> list[list[str]]:
    """torchtitan's ``module_fqns_per_model_part`` for an uneven split: the module names of every
    stage (torchtitan's decoder models name them ``tok_embeddings``, ``layers.<i>``, ``norm``, ``output``)."""
    parts, layer = [], 0
    counts = list(layers_per_stage)
    for i, n in enumerate(counts):
        part = (["tok_embeddings"] if i == 0 else []) + [f"layers.{layer + j}" for j in range(n)]
        layer += n
        parts.append(part + (["norm", "output"] if i == len(counts) - 1 else []))
    return parts


def torchtitan_toml(launch: Launch) -> str:
    """A torchtitan TOML fragment (``[training]``, ``[parallelism]``, ``[activation_checkpoint]``)
    for ``launch``; merge it into a job's ``--job.config_file`` (torchtitan <= v0.2.2).

    Data parallelism is DDP (``data_parallel_replicate_degree``) for ZeRO-0 and FSDP2
    (``data_parallel_shard_degree``) for ZeRO-3, or ZeRO-2 with ``fsdp_reshard_after_forward =
    "never"`` (weights kept gathered from forward to backward). Expert parallelism names both
    ``expert_parallel_degree`` and ``expert_tensor_parallel_degree`` (torchtitan's default for the
    latter is 1, diffpipe's the tensor size). With pipelining, ``local_batch_size``
    is the data-parallel rank's share of the batch and ``pipeline_parallel_microbatch_size`` splits it
    into the pipeline's microbatches; without, ``local_batch_size`` is the microbatch and torchtitan
    accumulates gradients up to ``global_batch_size``. The split is
    ``pipeline_parallel_layers_per_stage`` when even (with the first- and last-stage weights of the
    embedding and head set to 0, so that torchtitan's ``ceil((layers + first + last) /
    layers_per_stage)`` is the stage count: ``torchtitan/distributed/pipeline_parallel.py``,
    v0.2.0-v0.2.2), ``module_fqns_per_model_part`` when not.
    Recompute ``selective`` maps to torchtitan's per-op selective checkpointing (``selective_ac_option
    = "op"``), the closest it has to recomputing the attention core: not the same op set. An expert
    layout v0.2.0 refuses (``torchtitan_v020_problem``) is said in a comment on the first line.

    Raises:
        ConfigError: for what torchtitan does not run (``export_problem``): ZeRO-1 (FSDP2 always
            shards gradients too), tensor parallelism without sequence parallelism (torchtitan
            applies it with every tensor-parallel plan), or a family torch's pipelining has no
            schedule for.
    """
    if not isinstance(launch, Launch):
        got = repr(launch) if isinstance(launch, (str, int, float, type(None))) else type(launch).__name__
        raise ConfigError(f"torchtitan_toml: launch must be a Launch (e.g. PlanTable.launch(i)), got {got}")
    par = launch.parallelism
    problem = export_problem("torchtitan-v0.2", launch.family, par, launch.microbatches)
    if problem:
        raise ConfigError(f"torchtitan export: {problem}")
    older = torchtitan_v020_problem(par)
    lines = ([f"# {older}", ""] if older else []) + ["[training]"]
    pipelined = par.pipeline > 1
    local = launch.global_batch // par.data if pipelined else launch.microbatch_size
    lines += [f"local_batch_size = {local}", f"global_batch_size = {launch.global_batch}",
              f"seq_len = {launch.sequence}", "", "[parallelism]"]
    replicate, shard = (par.data, 1) if par.zero == 0 else (1, par.data)
    values: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": par.tensor,
        "pipeline_parallel_degree": par.pipeline,
    }
    if par.context > 1:
        values["context_parallel_degree"] = par.context
    if par.zero == 2:
        values["fsdp_reshard_after_forward"] = "never"
    if pipelined:
        values["pipeline_parallel_schedule"] = TORCH_NAMES[launch.family]
        values["pipeline_parallel_microbatch_size"] = launch.microbatch_size
        if launch.uniform:
            # torchtitan counts the embedding and the head as this many layers each when it derives
            # the stages from pipeline_parallel_layers_per_stage (default 1: 80 layers at 20 a stage
            # would be ceil(82 / 20) = 5 stages, not 4); 0 makes its stages these.
            values["pipeline_parallel_layers_per_stage"] = launch.layers_per_stage[0]
            values["pipeline_parallel_first_stage_less_layers"] = 0
            values["pipeline_parallel_last_stage_less_layers"] = 0
        else:
            values["module_fqns_per_model_part"] = torchtitan_modules(launch.layers_per_stage)
    if par.expert > 1:  # torchtitan's expert tensor degree defaults to 1, diffpipe's (Megatron's) to the tensor size
        values["expert_parallel_degree"] = par.expert
        values["expert_tensor_parallel_degree"] = par.etp
    lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    lines += ["", "[activation_checkpoint]", f"mode = {toml_value(launch.recompute)}"]
    if launch.recompute == "selective":
        lines.append('selective_ac_option = "op"')
    return "\n".join(lines) + "\n"


_BASE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
#: diffpipe recompute -> torchtitan's ``Trainer.Config.activation_checkpoint`` (``torchtitan/distributed/
#: activation_checkpoint.py``: the default is per-op ``SelectiveAC``, so "none" must be said).
_TORCHTITAN_AC = {"none": "None", "selective": "SelectiveAC.Config()", "full": "FullAC.Config()"}


def check_torchtitan_base(base: Any, what: str = "torchtitan_config: base") -> str:
    """``base`` if it names a configuration function as ``"module:function"``, else a ``ConfigError``."""
    if not isinstance(base, str) or not _BASE.fullmatch(base):
        raise ConfigError(f"{what} must be the model's torchtitan configuration as 'module:function' (e.g. "
                          f"{TORCHTITAN_BASES['llama-3-70b']!r}), got {base!r}")
    return base


def torchtitan_config(launch: Launch, base: str, *, name: str = "diffpipe_plan") -> str:
    """A Python module for torchtitan's current main (``TORCHTITAN_COMMIT``; configurations in Python
    since 9810191bb): a function ``name`` that takes the model's own torchtitan configuration
    (``base``, ``"module:function"``, e.g. ``TORCHTITAN_BASES["llama-3-70b"]``) and sets ``launch``'s
    parallelism, batch and recomputation on it. Save it as ``<module>.py`` on the Python path and run
    ``NGPU=<gpus> MODULE=<module> CONFIG=<name> ./run_train.sh`` (or ``torchrun ... -m torchtitan.train
    --module <module> --config <name>`` on several nodes).

    Data parallelism as in ``torchtitan_toml`` (DDP replicas for ZeRO-0, FSDP2 shards for ZeRO-3 and,
    with ``fsdp_reshard_after_forward = "never"``, ZeRO-2). The batch is in tokens: a microbatch of
    ``microbatch_size x sequence`` tokens per data-parallel rank, ``global_batch x sequence`` tokens a
    step; with pipelining ``num_pp_microbatches`` is the pipeline's microbatches (no gradient
    accumulation), without it torchtitan accumulates the microbatches (``torchtitan/trainer.py``:
    ``num_tokens_per_train_step // (tokens per microbatch x pp microbatches x dp)``). An even split is
    ``pipeline_parallel_layers_per_stage`` with the embedding's and head's layer weights 0 (torchtitan's
    stage count is ``ceil((layers + first + last) / layers_per_stage)``, its default weights 1); an
    uneven one ``module_fqns_per_model_part`` (``tok_embeddings``, ``layers.<i>``, ``norm``, ``lm_head``).
    The function checks that ``base``'s model has the planned layer count before setting anything.

    Raises:
        ConfigError: ``base`` not ``"module:function"``, or what torchtitan does not run
            (``export_problem("torchtitan", ...)``: ZeRO-1, a schedule torch's pipelining lacks, the
            context ranks without FSDP, expert tensor parallelism).
    """
    if not isinstance(launch, Launch):
        got = repr(launch) if isinstance(launch, (str, int, float, type(None))) else type(launch).__name__
        raise ConfigError(f"torchtitan_config: launch must be a Launch (e.g. PlanTable.launch(i)), got {got}")
    check_torchtitan_base(base)
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"torchtitan_config: name must be a Python identifier, got {name!r}")
    par = launch.parallelism
    problem = export_problem("torchtitan", launch.family, par, launch.microbatches)
    if problem:
        raise ConfigError(f"torchtitan export: {problem}")
    module, function = base.split(":")
    pipelined = par.pipeline > 1
    replicate, shard = (par.data, 1) if par.zero == 0 else (1, par.data)
    values: list[tuple[str, Any]] = [
        ("parallelism.data_parallel_replicate_degree", replicate),
        ("parallelism.data_parallel_shard_degree", shard),
        ("parallelism.tensor_parallel_degree", par.tensor),
        ("parallelism.enable_sequence_parallel", bool(par.sequence_parallel) and par.tensor > 1),
        ("parallelism.context_parallel_degree", par.context),
        ("parallelism.pipeline_parallel_degree", par.pipeline),
        ("parallelism.expert_parallel_degree", par.expert),
    ]
    if par.zero == 2:
        values.append(("parallelism.fsdp_reshard_after_forward", "never"))
    if pipelined:
        values += [("parallelism.pipeline_parallel_schedule", TORCH_NAMES[launch.family]),
                   ("parallelism.num_pp_microbatches", launch.microbatches)]
        if launch.uniform:
            values += [("parallelism.pipeline_parallel_layers_per_stage", launch.layers_per_stage[0]),
                       ("parallelism.pipeline_parallel_first_stage_less_layers", 0),
                       ("parallelism.pipeline_parallel_last_stage_less_layers", 0),
                       ("parallelism.module_fqns_per_model_part", None)]
        else:
            parts = [[("lm_head" if m == "output" else m) for m in part]
                     for part in torchtitan_modules(launch.layers_per_stage)]
            values += [("parallelism.pipeline_parallel_layers_per_stage", None),
                       ("parallelism.module_fqns_per_model_part", parts)]
    values += [("training.num_tokens_per_microbatch_per_dp_rank", launch.microbatch_size * launch.sequence),
               ("training.num_tokens_per_train_step", launch.global_batch * launch.sequence),
               ("training.max_context_length", launch.sequence)]
    layers = sum(launch.layers_per_stage)
    lines = [f'"""torchtitan configuration from diffpipe: {launch.family}, TP{par.tensor} CP{par.context} '
             f'PP{par.pipeline} DP{par.data} EP{par.expert} ZeRO-{par.zero},',
             f"{launch.global_batch} x {launch.sequence} tokens a step, recompute {launch.recompute}.",
             "",
             f"Run: NGPU={par.gpus} MODULE=<this module> CONFIG={name} ./run_train.sh (torchtitan main since "
             f"9810191bb; fields as of {TORCHTITAN_COMMIT[:8]}).",
             '"""', "",
             *([] if launch.recompute == "none" else
               [f"from torchtitan.distributed.activation_checkpoint import {_TORCHTITAN_AC[launch.recompute][:-9]}"]),
             f"from {module} import {function} as base", "", "",
             f"def {name}():",
             "    config = base()",
             "    layers = len(config.model_spec.model.layers)",
             f"    if layers != {layers}:",
             f'        raise ValueError(f"diffpipe planned {layers} layers; {base} makes {{layers}}")']
    lines += [f"    config.{path} = {_python_value(value)}" for path, value in values]
    lines += [f"    config.activation_checkpoint = {_TORCHTITAN_AC[launch.recompute]}", "    return config"]
    return "\n".join(lines) + "\n"


def _python_value(value: Any) -> str:
    """``value`` (None, bool, int, str or nested lists of them) as Python source."""
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "[" + ", ".join(_python_value(v) for v in value) + "]"


__all__ = ["EXPORT_TARGETS", "MEGATRON_FAMILIES", "RECOMPUTE", "TORCHTITAN_BASES", "TORCHTITAN_COMMIT", "Launch",
           "export_problem", "megatron_args", "megatron_overlap_args", "megatron_layout", "megatron_model_args",
           "parse_megatron_layout", "check_torchtitan_base", "torchtitan_config", "torchtitan_modules",
           "torchtitan_toml", "torchtitan_v020_problem"]
