"""``Parallelism``: the tensor x context x pipeline x data (x expert) sizes of a training run, Megatron-LM
style, and their checks against a model and a GPU count.

Where the groups sit on a cluster (``placement``) and what they cost a device (``parallel_costs``):
``diffpipe._workload._parallel``, whose docstring gives the rules and sources (parallel folding of the
expert layers, the context split).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._checks import check_int, is_int
from .._choices import ZERO_STAGES
from .._errors import ConfigError
from .._model._transformer import Transformer


@dataclass(frozen=True)
class Parallelism:
    """Parallel sizes of a training run, Megatron-LM style.

    Attributes:
        tensor: tensor-parallel size ``t`` (Megatron ``--tensor-model-parallel-size``).
        pipeline: pipeline-parallel size (devices of one pipeline).
        data: data-parallel size ``N_d`` (replicas of a pipeline).
        virtual: model chunks per pipeline device (interleaved schedules; Megatron
            ``--num-layers-per-virtual-pipeline-stage`` gives it implicitly).
        expert: expert-parallel size ``e`` (Megatron ``--expert-model-parallel-size``, torchtitan
            ``expert_parallel_degree``): the routed experts split over ``e`` ranks of the expert layers'
            own decomposition (``_parallel``'s docstring, "parallel folding"): ``expert_tensor x expert`` must
            divide ``tensor x context x data``.
        expert_tensor: expert tensor-parallel size (Megatron ``--expert-tensor-parallel-size``, torchtitan
            v0.2.x ``expert_tensor_parallel_degree``): every routed expert's matrices split over this many
            ranks. None (default): ``tensor``, Megatron-LM's default (``etp``).
        zero: ZeRO stage 0-3 (1 is Megatron-LM's distributed optimizer).
        sequence_parallel: Megatron's sequence parallelism (Korthikanti et al. 2022).
        context: context-parallel size ``c`` (Megatron ``--context-parallel-size``, torchtitan
            ``context_parallel_degree``): the sequence split over ``c`` ranks placed next to the tensor
            group (``_parallel``'s docstring); ``gpus = tensor x context x pipeline x data``.
    """

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    virtual: int = 1
    expert: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    context: int = 1
    expert_tensor: int | None = None

    def __post_init__(self) -> None:
        for name in ("tensor", "pipeline", "data", "virtual", "expert", "context"):
            check_int(f"parallelism: {name}", getattr(self, name), 1)
        if self.expert_tensor is not None:
            check_int("parallelism: expert_tensor", self.expert_tensor, 1)
        if not is_int(self.zero) or self.zero not in ZERO_STAGES:
            raise ConfigError(f"parallelism: zero must be a ZeRO stage 0, 1, 2 or 3, got {self.zero!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise ConfigError(f"parallelism: sequence_parallel must be a bool, got {self.sequence_parallel!r}")
        e, et = self.expert, self.etp
        if (self.tensor * self.context * self.data) % (et * e):
            # Megatron-LM d98e8a6 initialize_model_parallel: world_size % (etp x ep x pp) == 0
            if et == self.tensor:  # the expert group is carved out of the data (and context) ranks
                what = f"data={self.data}" if self.context == 1 else f"context x data = {self.context * self.data}"
                raise ConfigError(f"parallelism: expert={e} must divide {what} (with expert_tensor = tensor the "
                                  "expert group is carved out of the data and context ranks)")
            raise ConfigError(f"parallelism: expert_tensor x expert = {et} x {e} = {et * e} must divide tensor x "
                              f"context x data = {self.tensor * self.context * self.data} (the expert layers "
                              "fold onto the same ranks)")

    @property
    def etp(self) -> int:
        """The expert tensor-parallel size: ``expert_tensor``, or ``tensor`` when None (Megatron-LM's
        default, ``megatron/core/parallel_state.py`` and ``megatron/training/arguments.py``)."""
        return self.tensor if self.expert_tensor is None else self.expert_tensor

    @property
    def expert_data(self) -> int:
        """The expert data-parallel size: ranks holding the same expert weights, ``tensor x context
        x data / (expert_tensor x expert)`` (Megatron-LM's ``expert_data_parallel_size``)."""
        return self.tensor * self.context * self.data // (self.etp * self.expert)

    @property
    def gpus(self) -> int:
        """``tensor x context x pipeline x data`` (the expert layers fold onto the same ranks)."""
        return self.tensor * self.context * self.pipeline * self.data

    @property
    def shards(self) -> int:
        """Ranks that hold the same parameters and reduce their gradients together: ``data x context``."""
        return self.data * self.context

    @property
    def stages(self) -> int:
        """Model stages of one pipeline: ``pipeline x virtual``."""
        return self.pipeline * self.virtual

    def check_gpus(self, gpus: int) -> None:
        """``ConfigError`` unless ``tensor x context x pipeline x data == gpus``."""
        if self.gpus != gpus:
            if self.context > 1:
                raise ConfigError(f"parallelism: tensor x context x pipeline x data = {self.tensor} x {self.context} "
                                  f"x {self.pipeline} x {self.data} = {self.gpus}, but the cluster has {gpus} GPUs")
            raise ConfigError(f"parallelism: tensor x pipeline x data = {self.tensor} x {self.pipeline} x "
                              f"{self.data} = {self.gpus}, but the cluster has {gpus} GPUs")

    def check(self, model: Transformer, gpus: int | None = None) -> None:
        """Raise ``ConfigError`` (one line) when these sizes cannot run ``model`` (on ``gpus`` devices)."""
        if not isinstance(model, Transformer):
            raise ConfigError(f"parallelism: check expects a Transformer, got {type(model).__name__}")
        if gpus is not None:
            self.check_gpus(gpus)
        t = self.tensor
        for name, value in (("heads", model.heads), ("kv_heads", model.kv), ("ffn_hidden", model.ffn)):
            if float(value) % t:
                raise ConfigError(f"parallelism: tensor={t} must divide the model's {name}={value:g}")
        et = self.etp
        if model.experts > 1:
            if float(model.expert_ffn) % et:
                name = "tensor" if et == t else "expert_tensor"
                raise ConfigError(f"parallelism: {name}={et} must divide the model's moe_ffn_hidden="
                                  f"{model.expert_ffn:g}")
            if et != t and float(model.shared_experts * model.expert_ffn) % t:  # shared experts shard by tensor
                raise ConfigError(f"parallelism: tensor={t} must divide the model's shared experts' width "
                                  f"{model.shared_experts * model.expert_ffn:g}")
            if model.experts % self.expert:
                raise ConfigError(f"parallelism: expert={self.expert} must divide the model's "
                                  f"experts={model.experts}")
            if et != t and t > 1 and not self.sequence_parallel:
                raise ConfigError(f"parallelism: expert_tensor={et} other than tensor={t} needs sequence_parallel "
                                  "(Megatron-LM's MoE layer trains tensor parallelism only with it)")
        elif self.expert > 1:
            raise ConfigError(f"parallelism: expert={self.expert} needs a mixture-of-experts model (this one "
                              "is dense)")
        elif et != t:
            raise ConfigError(f"parallelism: expert_tensor={et} needs a mixture-of-experts model (this one "
                              "is dense)")
        if self.stages > model.layers + 2:  # the first and last stage may hold the embedding or head alone
            raise ConfigError(f"parallelism: pipeline x virtual = {self.pipeline} x {self.virtual} = "
                              f"{self.stages} stages exceed the model's {model.layers} layers plus its "
                              "embedding and head")
        c = self.context
        if c > 1:
            if model.sequence % (2 * c):
                raise ConfigError(f"parallelism: context={c} needs a sequence that is a multiple of 2 x {c} = {2 * c} "
                                  f"(the load-balanced causal split), got sequence={model.sequence}")
            if not model.flash_attention:
                raise ConfigError(f"parallelism: context={c} needs flash attention (context parallelism runs "
                                  "TransformerEngine's fused attention)")
        if self.sequence_parallel and (model.sequence // c) % t:
            what = f"the sequence={model.sequence}" if c == 1 else f"the {model.sequence // c} tokens per context rank"
            raise ConfigError(f"parallelism: tensor={t} must divide {what} with sequence_parallel")
