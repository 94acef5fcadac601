"""How much communication a framework hides behind compute: ``CommunicationOverlap`` (fractions, not
switches), what the hidden part still costs the compute it runs under (``CONTENTION``,
``hidden_cost``), and the fraction Transformer Engine's tensor-parallel overlap hides
(``transformer_engine_tensor_overlap``). The framework presets that fill it in:
``diffpipe._workload._frameworks``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jaxtyping import Array

from .._arrays import array_module
from .._checks import is_positive_int
from .._errors import ConfigError

#: Compute slowdown while a collective overlaps it: the average measured in "Characterizing
#: Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance and Power
#: Implications" (arXiv:2507.03114, 2025, abstract: "an average computational slowdown of 18.9%, with a
#: maximum of 40.0%", GPT and LLaMA models on 4 A100s, H100s, MI250s and MI210s), against the same
#: compute with no communication beside it.
CONTENTION = 0.189


@dataclass(frozen=True)
class CommunicationOverlap:
    """How much communication a framework hides behind compute (fractions, not switches).

    Attributes:
        tensor: fraction of the tensor-parallel collectives' time hidden behind the GEMMs they feed
            (Megatron-LM ``--tp-comm-overlap``, Transformer Engine's userbuffers; 0: on the critical path,
            Megatron-LM's default).
        data_bucket: bytes of one gradient bucket when the data-parallel sync runs bucket by bucket
            during the backward (Megatron-LM ``--overlap-grad-reduce``, PyTorch DDP and FSDP): only
            the last bucket, and whatever the last microbatch's backward of the stage cannot hide, is
            left after the stage's last backward. None: the sync starts after the backward
            (Megatron-LM's default in 2021-22: Korthikanti et al. §6.3).
        prefetch: ZeRO-3 parameter all-gathers are prefetched during the previous layer's compute
            (FSDP's forward/backward prefetch): each layer's gather costs only what its neighbour's
            compute does not cover.
        param_gather: ZeRO-1/2's all-gather of the updated weights runs under the next step's forward
            (Megatron-LM ``--overlap-param-gather``), leaving the gradient reduce-scatter in the sync.
        contention: seconds of compute lost per second of communication hidden behind it (NCCL's
            kernels take SMs and memory bandwidth from the kernels they overlap); ``CONTENTION`` by
            default. Only hidden communication pays it, so with nothing overlapped it changes nothing.
        every_microbatch: the data-parallel gradient reduction runs during every microbatch's
            backward, not once a step (PyTorch FSDP outside ``no_sync``, as Composer runs it): each
            microbatch but the last, whose reduction is the step's sync, pays it under its backward.
        bucket_latency: with ``data_bucket``, every bucket of the step's gradient sync is a collective
            of its own and pays its ring's step latencies (``n - 1`` a reduce-scatter or all-gather,
            ``2 (n - 1)`` an all-reduce: NCCL's ring latency model, ``src/graph/tuning.cc``, is per
            collective), not the stage's sync once: the buckets before the last run under the backward
            (``contention`` of their latency, and whatever the backward left after the bandwidth part
            cannot hide), the last one's is the sync lane's own. False: one ring's latency a stage.
    """

    tensor: float = 0.0
    data_bucket: float | None = None
    prefetch: bool = False
    param_gather: bool = False
    contention: float = CONTENTION
    every_microbatch: bool = False
    bucket_latency: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.tensor, bool) or not isinstance(self.tensor, (int, float)) or not 0 <= self.tensor <= 1:
            raise ConfigError(f"overlap: tensor must be a fraction in [0, 1], got {self.tensor!r}")
        b = self.data_bucket
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or not b > 0):
            raise ConfigError(f"overlap: data_bucket must be a positive number of bytes or None, got {b!r}")
        for name in ("prefetch", "param_gather", "every_microbatch", "bucket_latency"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"overlap: {name} must be a bool, got {getattr(self, name)!r}")
        k = self.contention
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not 0 <= k <= 1:
            raise ConfigError(f"overlap: contention must be a fraction in [0, 1], got {k!r}")

    def hidden_cost(self, communication: Any, compute: Any) -> Array:
        """Seconds ``communication`` adds to the ``compute`` it runs under (``hidden_cost``)."""
        return hidden_cost(communication, compute, self.contention)


def hidden_cost(communication: Any, compute: Any, contention: float) -> Array:
    """Seconds ``communication`` adds to the ``compute`` it runs under: what it exceeds the compute by,
    plus ``contention`` times the part it hides (``jnp``, differentiable; NumPy for NumPy operands)."""
    hidden = array_module(communication, compute).minimum(communication, compute)
    return communication - hidden + contention * hidden


def transformer_engine_tensor_overlap(tensor: int) -> float:
    """The fraction of tensor-parallel collective time Transformer Engine's userbuffer overlap hides
    (Megatron-LM ``--tp-comm-overlap``), for ``CommunicationOverlap.tensor``.

    Transformer Engine's default configuration (``transformer_engine/pytorch/module/base.py``,
    ``initialize_ub``, ``methods`` and ``get_default_config``) runs the eight collectives of a layer
    three ways: the forward all-gathers before the QKV and FC1 GEMMs and the backward all-gathers
    before the projection's and FC2's input-gradient GEMMs as a *ring exchange* in ``tensor`` chunks,
    each chunk's transfer under the previous chunk's GEMM, so the first chunk's ``1 / tensor`` is
    exposed; the forward reduce-scatters after the projection and FC2 *pipelined* in 4 chunks, the
    last chunk's ``1 / 4`` exposed; the backward reduce-scatters of QKV's and FC1's input gradients
    *in bulk* under the independent weight-gradient GEMM, hidden. With the collectives of equal size
    (sequence parallelism: every one moves ``b s h`` elements) the exposed fraction is
    ``(4 / tensor + 2 / 4) / 8``. It assumes each chunk's GEMM is at least as long as its transfer
    (NVLink inside a node); where it is not, the model overstates the overlap."""
    if not is_positive_int(tensor):
        raise ConfigError(f"transformer_engine_tensor_overlap: tensor must be a positive int, got {tensor!r}")
    if tensor == 1:
        return 0.0
    return 1.0 - (4.0 / tensor + 2.0 / 4.0) / 8.0
