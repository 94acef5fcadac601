"""The planner's search space: the sizes and families ``plan`` searches by default, a candidate
configuration (``Candidate``), and the enumeration helpers (divisors, a family's shape, the
context-parallel sizes, checked value lists)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import schedules
from .._caches import bounded
from .._checks import check_int
from .._errors import ConfigError
from .._model._transformer import Transformer
from .._workload._parallelism import Parallelism

#: Families searched by default: synchronous single-pipeline schedules a framework runs
#: (Megatron-LM: 1f1b, interleaved-1f1b; torch/torchtitan: all four).
DEFAULT_FAMILIES = ("1f1b", "interleaved-1f1b", "zb-h1", "gpipe")
DEFAULT_MICROBATCH_SIZES = (1, 2, 4, 8)
DEFAULT_VIRTUAL = (2, 4)
#: Context parallelism is searched by default from this sequence length on (below it, sizes 1 only):
#: the published recipes that split the sequence start at 16,384 tokens (NeMo's Llama 3 8B 16k: CP 2).
CONTEXT_SEQUENCE = 16384
#: The fewest tokens per context rank the default search goes down to: context sizes are the powers of
#: two ``c`` with ``sequence / c >= CONTEXT_MIN_TOKENS`` (and ``sequence`` a multiple of ``2c``). Below
#: a few thousand tokens a ring step's attention kernel no longer hides its K,V transfer across nodes
#: and the matmuls' rows shrink; the published long-sequence recipes keep 8,192 to 16,384 per rank.
CONTEXT_MIN_TOKENS = 4096
#: Families whose ``chunks = 1`` is another family (interleaved-1f1b is 1f1b, looped-bfs is gpipe).
CHUNK_ONE_IS_OTHER = ("interleaved-1f1b", "looped-bfs")


@dataclass(frozen=True)
class Candidate:
    """One configuration of the search: family, parallel sizes, microbatch size, recomputation,
    ZeRO stage and sequence parallelism (``plan``'s step 1)."""

    family: str
    tensor: int
    pipeline: int
    data: int
    virtual: int
    expert: int
    microbatch_size: int
    recompute: str
    zero: int
    sequence_parallel: bool
    context: int = 1
    expert_tensor: int | None = None

    def parallelism(self) -> Parallelism:
        return Parallelism(tensor=self.tensor, pipeline=self.pipeline, data=self.data, virtual=self.virtual,
                           expert=self.expert, zero=self.zero, sequence_parallel=self.sequence_parallel,
                           context=self.context, expert_tensor=self.expert_tensor)


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending, in O(sqrt n) steps."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@bounded(64)
def family_shape(family: str) -> tuple[bool, int, str]:
    """(takes chunks, stages per device without chunks, placement style ``loop`` or ``v``) of a family."""
    fam = schedules.family(family)
    chunks = "chunks" in fam.option_names
    probe = schedules.get(family, devices=4, microbatches=8)
    per = probe.stages // probe.devices
    devices = [probe.placement.device(0, s) for s in range(probe.stages)]
    style = "v" if per == 2 and devices[:8] == [0, 1, 2, 3, 3, 2, 1, 0] else "loop"
    return chunks, per, style


def stage_devices(style: str, pipeline: int, stages: int) -> np.ndarray:
    """The pipeline rank holding each stage under placement ``style`` (``loop`` or ``v``)."""
    s = np.arange(stages)
    if style == "v":
        return np.where(s < pipeline, s, 2 * pipeline - 1 - s)
    return s % pipeline


def checked_values(name: str, value: Any, allowed: Sequence[Any] | None = None) -> tuple:
    """``value`` (one or a collection) as a non-empty tuple, each in ``allowed`` when given;
    ``ConfigError`` naming ``name`` otherwise."""
    items = tuple(value) if isinstance(value, (list, tuple, set, frozenset)) else (value,)
    if not items:
        raise ConfigError(f"plan: {name} has no values")
    if allowed is not None:
        for v in items:
            if v not in allowed:
                raise ConfigError(f"plan: {name} {v!r} is not one of {', '.join(map(str, allowed))}")
    return items


def context_sizes(model: Transformer, context: Any) -> tuple[int, ...]:
    """The context-parallel sizes ``plan`` searches (its ``context`` argument, or the default: the
    docstring); a given size the model cannot split its sequence by is refused in one line."""
    s = model.sequence
    if context is None:
        if s < CONTEXT_SEQUENCE or not model.flash_attention:
            return (1,)
        out, c = [1], 2
        while s % (2 * c) == 0 and s // c >= CONTEXT_MIN_TOKENS:
            out.append(c)
            c *= 2
        return tuple(out)
    sizes = tuple(check_int("plan: context", c) for c in checked_values("context", context))
    for c in sizes:
        if c > 1 and s % (2 * c):
            raise ConfigError(f"plan: context={c} needs a sequence that is a multiple of 2 x {c} = {2 * c} (the "
                              f"load-balanced causal split), got sequence={s}")
        if c > 1 and not model.flash_attention:
            raise ConfigError(f"plan: context={c} needs flash attention (context parallelism runs "
                              "TransformerEngine's fused attention)")
    return sizes


__all__ = ["CHUNK_ONE_IS_OTHER", "CONTEXT_MIN_TOKENS", "CONTEXT_SEQUENCE", "DEFAULT_FAMILIES",
           "DEFAULT_MICROBATCH_SIZES", "DEFAULT_VIRTUAL", "Candidate", "checked_values", "context_sizes", "divisors",
           "family_shape", "stage_devices"]
