"""What a training framework does with a step's communication and gradient precision: ``Framework``
and its presets ``FRAMEWORKS`` (``diffpipe.presets.framework(name)``).

A ``Configuration`` prices a step as its framework runs it: which collectives hide behind compute
(``CommunicationOverlap``) and in what precision the data-parallel group reduces the gradients
(``Transformer.reduce_bytes``). The published-run studies (``papers/published-runs``) simulate every
run with the preset of its framework, so a ``plan`` or ``simulate`` with the same preset prices a step
as the validated model does. Each preset states its source:

- ``"none"``: nothing overlapped (tensor collectives on the critical path, the gradient sync after the
  backward, ZeRO-3 gathers not prefetched), gradients reduced in the training precision. The
  default of ``Configuration``, and Megatron-LM's own defaults in 2021-22 (Korthikanti et al. 2022,
  §6.3: the gradient all-reduce not overlapped).
- ``"megatron"``: Megatron-LM as its README's performance table runs it ("Fine-grained overlapping
  with DP (--overlap-grad-reduce, --overlap-param-gather), TP (--tp-comm-overlap)"; README.md at
  d98e8a6). The gradient sync in buckets of ``max(40M, 1M x data)`` parameters
  (``megatron/core/distributed/distributed_data_parallel.py``), the distributed optimizer's weight
  all-gather under the next forward (ZeRO-1/2), Transformer Engine's userbuffer overlap of the
  tensor collectives where sequence parallelism is on (Megatron-LM refuses ``--tp-comm-overlap``
  without it; ``transformer_engine_tensor_overlap``), ZeRO-3 (Megatron-FSDP) gathers prefetched;
  gradients reduced in fp32 (``megatron/training/arguments.py`` at d98e8a6: "bfloat16 requires
  gradient accumulation and all-reduce to be done in fp32" unless ``--grad-reduce-in-bf16``);
  attention by the device's own fused kernel (``flash_version=3``): Megatron-LM's default
  ``--transformer-impl transformer_engine`` (``arguments.py`` at f2e5db402c and d98e8a6) runs
  Transformer Engine's attention, which on Hopper prefers cuDNN's fused attention over FlashAttention
  "for performance reasons" (``transformer_engine/pytorch/attention.py``, TE v1.5 to v2.0).
- ``"torchtitan"``: torchtitan's FSDP2, ``fully_shard`` on every transformer block
  (``torchtitan/parallelisms/parallelize_llama.py`` at 9dec370): each block's gradients
  reduce-scattered as its backward ends (one block's gradients are the last bucket), its parameters
  all-gathered ahead; gradients reduced in fp32 (``--training.mixed_precision_reduce``, whose one
  choice is ``float32`` at 9dec370).
- ``"fsdp"``: PyTorch FSDP wrapping every block, as llm-foundry's MPT does (``fsdp_wrap_fn``), with
  Composer's ``mixed_precision: DEFAULT`` (``get_mixed_precision`` at Composer v0.16.4 and v0.17.2):
  the same overlap as ``"torchtitan"``, gradients reduced in fp32, and reduced after every
  microbatch: Composer enters no ``no_sync`` for a model that is not DDP (``_train_microbatches`` in
  ``composer/trainer/trainer.py`` at v0.16.4 and v0.17.2: ``if ... not isinstance(self.state.model,
  DistributedDataParallel): sync_context = contextlib.nullcontext()``); and its blocks are eager PyTorch
  modules (``Transformer.eager_blocks``: MPT's ``low_precision_layernorm`` is ``F.layer_norm``, its
  attention splits the fused ``Wqkv`` output, ``llmfoundry/models/layers/{norm,attention}.py`` at 5e85bd62d),
  and its gradients take FSDP1's flat-parameter path (``Transformer.flat_gradients``: concatenated into the
  flat gradient, cast to the reduce dtype and pre-divided, ``torch/distributed/fsdp/_runtime_utils.py``);
  its host dispatches every op eagerly (``host_op_seconds``, ``EAGER_OP_SECONDS``) and its optimizer is
  Composer's ``DecoupledAdamW``, a loop over the parameter tensors with a host sync in each
  (``optimizer_ops``, ``COMPOSER_ADAMW_OPS``).
- ``"ddp"``: PyTorch DDP under autocast (fp32 parameters, hence fp32 gradients): the gradient
  all-reduce in DDP's default 25 MiB buckets (``bucket_cap_mb=25``) during the backward.

Where the model states its own ``reduce_bytes`` or ``flash_version``, the framework keeps it. The other
presets name no attention kernel (their sources do not say which SDPA or flash-attention backend ran), so
those models price the default, the device's own fused kernel (``Transformer.flash_version``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .._errors import ConfigError
from .._model._transformer import FLASH_VERSIONS, Transformer, attention_kernel, layer_costs
from ._overlap import CommunicationOverlap, transformer_engine_tensor_overlap
from ._parallelism import Parallelism

#: How a framework buckets the data-parallel gradient sync during the backward.
BUCKETS = ("none", "megatron", "block", "ddp")
#: PyTorch DDP's default gradient bucket (``bucket_cap_mb=25``).
DDP_BUCKET = 25 * 2 ** 20


def megatron_bucket(data: int, reduce_bytes: float) -> float:
    """Bytes of Megatron-LM's ``--overlap-grad-reduce`` bucket: ``max(40M, 1M x data)`` parameters of
    ``reduce_bytes`` each (``megatron/core/distributed/distributed_data_parallel.py``)."""
    return float(reduce_bytes) * max(40e6, 1e6 * data)


@dataclass(frozen=True)
class Framework:
    """What a training framework hides behind compute and how it reduces gradients.

    Attributes:
        name: the preset's name.
        buckets: how the gradient sync overlaps the backward (``BUCKETS``): ``"none"`` (after the
            backward), ``"megatron"`` (Megatron-LM's buckets, ``megatron_bucket``), ``"block"`` (one
            transformer block's gradients per bucket: FSDP wrapping every block), ``"ddp"`` (DDP's 25 MiB).
        prefetch: ZeRO-3 parameter all-gathers run ahead, under the previous block's compute.
        param_gather: ZeRO-1/2's weight all-gather runs under the next step's forward.
        tensor_overlap: Transformer Engine's userbuffer overlap of the tensor collectives (with
            sequence parallelism only).
        every_microbatch: the gradients are reduced after every microbatch's backward
            (``CommunicationOverlap.every_microbatch``), not once a step.
        reduce_bytes: bytes of a gradient element in the data-parallel reduction (None: the model's
            training precision).
        flash_version: the fused-attention generation the framework runs (``Transformer.flash_version``;
            None: the model's, the device's own kernel by default).
        eager_blocks: the framework's blocks are eager PyTorch modules (``Transformer.eager_blocks``; a
            model that says so keeps it either way).
        flat_gradients: the weight gradients take PyTorch FSDP's flat-parameter path
            (``Transformer.flat_gradients``; likewise).
        recompute_early_stop: full recomputation by PyTorch's non-reentrant checkpoint, which stops at the
            last saved tensor (``Transformer.recompute_early_stop``; likewise).
        host_op_seconds: host (CPU) seconds the framework's eager stack takes to dispatch one op (0: the host is
            never the bottleneck). CUDA launches are asynchronous, so the host runs ahead of the GPU and an op
            (``F``, ``I``, ``W`` of a layer) takes ``max(its kernels' GPU time, kernels launched x this)``: the GPU
            idles only where the host issues the op's kernels slower than the GPU runs them.
        optimizer_ops: ops the optimizer step dispatches per parameter tensor when it loops over the parameters
            with a host synchronisation in each iteration (0: none, a fused or ``foreach`` step). The sync stops the
            host running ahead, so a layer's update takes ``max(its GPU time, parameter tensors x optimizer_ops x
            host_op_seconds)`` (``diffpipe._model._transformer.parameter_tensors``).
        source: where the preset comes from.
    """

    name: str
    buckets: str = "none"
    prefetch: bool = False
    param_gather: bool = False
    tensor_overlap: bool = False
    every_microbatch: bool = False
    reduce_bytes: int | None = None
    flash_version: int | None = None
    eager_blocks: bool = False
    flat_gradients: bool = False
    recompute_early_stop: bool = False
    host_op_seconds: float = 0.0
    optimizer_ops: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"framework: name must be a non-empty string, got {self.name!r}")
        if self.buckets not in BUCKETS:
            raise ConfigError(f"framework {self.name!r}: buckets must be one of {', '.join(BUCKETS)}, "
                              f"got {self.buckets!r}")
        for field in ("prefetch", "param_gather", "tensor_overlap", "every_microbatch", "eager_blocks",
                      "flat_gradients", "recompute_early_stop"):
            if not isinstance(getattr(self, field), bool):
                raise ConfigError(f"framework {self.name!r}: {field} must be a bool, got {getattr(self, field)!r}")
        r = self.reduce_bytes
        if r is not None and (isinstance(r, bool) or r not in (1, 2, 4)):
            raise ConfigError(f"framework {self.name!r}: reduce_bytes must be 1, 2, 4 or None, got {r!r}")
        v = self.flash_version
        if v is not None and (isinstance(v, bool) or v not in FLASH_VERSIONS):
            raise ConfigError(f"framework {self.name!r}: flash_version must be 1, 2, 3 or None, got {v!r}")
        c = self.host_op_seconds
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0:
            raise ConfigError(f"framework {self.name!r}: host_op_seconds must be a finite number >= 0, got {c!r}")
        n = self.optimizer_ops
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"framework {self.name!r}: optimizer_ops must be an int >= 0, got {n!r}")
        if n and not c:
            raise ConfigError(f"framework {self.name!r}: optimizer_ops={n} needs a host_op_seconds > 0 to price them")

    def model(self, model: Transformer) -> Transformer:
        """``model`` reducing its gradients in this framework's precision, running its attention
        kernel (each unless the model states its own) and its eager blocks (``eager_blocks``)."""
        fields: dict[str, int | bool] = {}
        for flag in ("eager_blocks", "flat_gradients", "recompute_early_stop"):
            if getattr(self, flag) and not getattr(model, flag):
                fields[flag] = True
        if self.reduce_bytes is not None and model.reduce_bytes is None:
            fields["reduce_bytes"] = self.reduce_bytes
        version, source = attention_kernel(model.flash_version, self.flash_version)
        if source == "framework":
            fields["flash_version"] = version
        return dataclasses.replace(model, **fields) if fields else model

    def overlap(self, model: Transformer, parallelism: Parallelism) -> CommunicationOverlap:
        """The ``CommunicationOverlap`` of a step of ``model`` (as ``self.model`` returns it) on
        ``parallelism`` under this framework."""
        bucket: float | None = None
        if self.buckets == "megatron":
            bucket = megatron_bucket(parallelism.data, model.reduction_bytes)
        elif self.buckets == "block":
            bucket = float(layer_costs(model).gradient_bytes[1])
        elif self.buckets == "ddp":
            bucket = float(DDP_BUCKET)
        tensor = 0.0
        if self.tensor_overlap and parallelism.sequence_parallel and parallelism.tensor > 1:
            tensor = transformer_engine_tensor_overlap(parallelism.tensor)
        return CommunicationOverlap(tensor=tensor, data_bucket=bucket, prefetch=self.prefetch,
                                    param_gather=self.param_gather, every_microbatch=self.every_microbatch)


#: Host seconds of one eager PyTorch op on CUDA: "4 us per op on CUDA" (pytorch/pytorch issue #82793, an A100
#: model the profiler's maintainer called "completely dispatch bound"); PyTorch's own
#: ``benchmarks/overrides_benchmark/README.md`` puts a torch function's overhead "on the order of 2 us", and
#: flagos-ai/Torch-FL pull request #27 measured 8 us a submitted ``add`` on an A100 host.
EAGER_OP_SECONDS = 4e-6
#: ATen ops Composer's ``DecoupledAdamW`` (v0.16.4 and v0.17.2, llm-foundry's pins at b2a43a147 and 5e85bd62d;
#: the MPT yamls' ``decoupled_adamw`` with ``weight_decay: 0.0``) dispatches per parameter tensor: the step
#: increment, ``state_steps[i].item()`` (a host sync: the step is a device tensor), ``exp_avg.mul_().add_()``,
#: ``exp_avg_sq.mul_().addcmul_()``, ``sqrt``, the division by ``sqrt(bias_correction2)``, ``add_(eps)`` and
#: ``param.addcdiv_`` (``composer/optim/decoupled_weight_decay.py``, a Python loop over the parameters, not
#: ``foreach``); Composer's FSDP keeps the original parameters (``use_orig_params`` defaults to True,
#: ``composer/trainer/dist_strategy.py`` at v0.16.4).
COMPOSER_ADAMW_OPS = 10
_MEGATRON = "Megatron-LM README.md (performance table's flags) and sources at d98e8a6"
_FSDP_BLOCK = dict(buckets="block", prefetch=True, reduce_bytes=4)
#: The presets (module docstring): name -> ``Framework``.
FRAMEWORKS: dict[str, Framework] = {
    "none": Framework("none", source="nothing overlapped; gradients reduced in the training precision"),
    "megatron": Framework("megatron", buckets="megatron", prefetch=True, param_gather=True, tensor_overlap=True,
                          reduce_bytes=4, flash_version=3, source=_MEGATRON),
    "torchtitan": Framework("torchtitan", **_FSDP_BLOCK, source="torchtitan 9dec370: FSDP2 per block, fp32 reduce"),
    "fsdp": Framework("fsdp", **_FSDP_BLOCK, every_microbatch=True, eager_blocks=True, flat_gradients=True,
                      host_op_seconds=EAGER_OP_SECONDS, optimizer_ops=COMPOSER_ADAMW_OPS,
                      source="PyTorch FSDP per block, Composer v0.16.4 DEFAULT (fp32 reduce, every microbatch), "
                             "llm-foundry 5e85bd62d's eager MPT blocks, Composer's DecoupledAdamW loop"),
    "ddp": Framework("ddp", buckets="ddp", reduce_bytes=4, source="PyTorch DDP, bucket_cap_mb=25, autocast"),
}


def framework(name: str | Framework) -> Framework:
    """The ``Framework`` preset ``name`` (``FRAMEWORKS``; case-insensitive), or ``name`` itself if it is
    one."""
    if isinstance(name, Framework):
        return name
    if not isinstance(name, str) or name.lower() not in FRAMEWORKS:
        raise ConfigError(f"framework must be one of {', '.join(FRAMEWORKS)} or a Framework, got {name!r}")
    return FRAMEWORKS[name.lower()]


__all__ = ["BUCKETS", "COMPOSER_ADAMW_OPS", "DDP_BUCKET", "EAGER_OP_SECONDS", "FRAMEWORKS", "Framework", "framework",
           "megatron_bucket"]
