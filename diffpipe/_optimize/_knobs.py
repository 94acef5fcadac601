"""Knobs: equinox Modules that map continuous parameters and a ``Workload`` to a ``Hardware``.

A loss is then plain composition (docs/architecture.md, "Knobs, optimization and sweeps")::

    knob = dp.StageBalance(stages=4)
    loss = lambda p: dp.makespan(graph, knob(p, workload), temperature=tau)
    jax.grad(loss)(knob.init())

``Workload`` is a per-layer table (forward, input-gradient and weight-gradient seconds; static,
gradient, stored-activation and output bytes) plus what a ``Hardware`` needs besides stage costs
(network, capacity, overhead). ``StageBalance`` places continuous stage boundaries on the
cumulative per-layer cost curve and reads every per-stage quantity off the cumulative curves by
linear interpolation; ``MicrobatchSplit`` turns logits into positive microbatch sizes summing to
the global batch. With integer boundaries the interpolation is exact, so the same function gives
the hardware of a rounded plan (``Workload.hardware``).

Why one module past 500 lines: the knob base, its three knobs and their shared rounding and moves
(cumulative-curve interpolation, boundary repair) read the same helpers.
"""


from __future__ import annotations

import abc
import itertools
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._caches import bounded
from .._checks import is_positive_int
from .._engine._hardware import STAGE_FIELDS, Hardware
from .._engine._jit_checks import compiled_unless_traced
from .._errors import ConfigError
from .._model._transformer import Transformer
from .._partition import partition, uniform_partition
from .._workload._segments import attention_share, balanced_fractions, check_lengths, segment_costs
from .._workload._workload import (
    FLAT_LAYER_WEIGHT,
    Workload,
    _counts,
    _cumulative_at,
    check_static_memory,
)


class Problem(NamedTuple):
    """What a knob may read when it checks itself and proposes baselines and starts (``optimize``).

    Attributes:
        workload: the workload being optimized.
        stages, microbatches, devices: the schedule's sizes.
        holder: ``[pipelines, stages]`` device of every stage.
        versions: ``[pipelines, stages]`` weight versions each stage holds.
        in_flight: ``[devices]`` peak stored activations (timing-free, ``schedules._analysis``).
        size: the largest relative microbatch size other knobs leave (1.0 when a knob sets sizes).
    """

    workload: Workload
    stages: int
    microbatches: int
    devices: int
    holder: np.ndarray
    versions: np.ndarray
    in_flight: np.ndarray
    size: float


class AbstractKnob(eqx.Module):
    """A continuous relaxation of one integer choice, as ``optimize`` needs it.

    A knob has *params* (unconstrained floats the optimizer moves), a continuous *value* ``x``
    (what the hardware is built from; differentiable in the params) and integer *plans* (what is
    finally run). ``contribute`` maps params to ``Hardware`` fields; ``apply`` does it from a value,
    so that ``apply(encode(plan))`` gives the exact hardware of a plan. ``optimize`` only calls these
    methods: a new knob is one subclass (``tests/test_knobs.py`` defines one outside the package).

    Class attributes:
        name: the plan's name in results (``StagePlan.values``), e.g. ``"layers_per_stage"``.
        label: the plan's name in messages, e.g. ``"layers per stage"``.
        sets: the ``Hardware`` fields the knob sets (two knobs of one ``optimize`` may not share one).
    """

    name: eqx.AbstractClassVar[str]
    label: eqx.AbstractClassVar[str]
    sets: eqx.AbstractClassVar[tuple[str, ...]]

    @abc.abstractmethod
    def check(self, problem: Problem) -> None:
        """Eager: raise ``ConfigError`` when the knob does not fit the schedule or workload."""

    @abc.abstractmethod
    def init(self, workload: Workload, plan: Any = None) -> Array:
        """Starting params: the knob's neutral start, or params whose value is ``plan``."""

    @abc.abstractmethod
    def relax(self, params: Array, workload: Workload) -> Array:
        """The continuous value of ``params`` (jit-able, differentiable)."""

    @abc.abstractmethod
    def encode(self, plan: np.ndarray, workload: Workload) -> np.ndarray:
        """The exact value of an integer ``plan`` (numpy float64)."""

    @abc.abstractmethod
    def apply(self, value: Array, workload: Workload, fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` (``Hardware`` constructor arguments) with the knob's fields set from ``value``."""

    @abc.abstractmethod
    def round(self, params: Array, workload: Workload) -> np.ndarray:
        """Integer candidate plans ``[n, ...]`` around ``params``' continuous optimum."""

    @abc.abstractmethod
    def neighbours(self, plan: np.ndarray) -> np.ndarray:
        """The plans one move away from ``plan`` (``[n, ...]``, possibly ``n = 0``)."""

    @abc.abstractmethod
    def baselines(self, problem: Problem) -> dict[str, np.ndarray]:
        """Named plans to beat (at least one); the first is the knob's default."""

    @abc.abstractmethod
    def starts(self, problem: Problem) -> list[tuple[np.ndarray, bool]]:
        """Extra plans to start the gradient descent from, each with whether the exact local
        search also starts there."""

    @abc.abstractmethod
    def fractional(self, params: Array, workload: Workload) -> np.ndarray:
        """The continuous optimum in the plan's units (fractional layers, samples), for reports."""

    def contribute(self, params: Array, workload: Workload, fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` with the knob's ``Hardware`` fields set from ``params`` (``apply . relax``)."""
        return self.apply(self.relax(params, workload), workload, fields)

    def __call__(self, params: Array, workload: Workload) -> Hardware:
        """The hardware of ``params`` alone (other fields from the workload's default split)."""
        return knob_hardware((self,), (params,), workload, _stages_of(self, workload))


def _stages_of(knob: AbstractKnob, workload: Workload) -> int:
    stages = getattr(knob, "stages", None)
    if stages is None:
        if workload.layers_per_stage is None:
            raise ConfigError(f"{type(knob).__name__}: the workload has no layers_per_stage (use "
                              "workload.with_split, or combine with StageBalance)")
        stages = len(workload.layers_per_stage)
    return stages


def _build(knobs: Sequence[AbstractKnob], values: Sequence[Any], workload: Workload, stages: int, method: str
           ) -> Hardware:
    default = workload
    if any(set(k.sets) & set(STAGE_FIELDS) for k in knobs):  # a knob places the stages: ignore the given split
        default = workload.with_split(None)
    fields = workload.fields(default.default_boundaries(stages))
    for k, v in zip(knobs, values):
        fields = getattr(k, method)(v, workload, fields)
    return Hardware(**fields)


def knob_hardware(knobs: Sequence[AbstractKnob], params: Sequence[Array], workload: Workload, stages: int
                  ) -> Hardware:
    """The hardware of several knobs' params at once (``params`` follows ``knobs``): the
    workload's fields at its default split (``layers_per_stage``, uniform when ``None``), then each
    knob's ``contribute`` in turn."""
    return _build(knobs, params, workload, stages, "contribute")


def value_hardware(knobs: Sequence[AbstractKnob], values: Sequence[Array], workload: Workload, stages: int
                   ) -> Hardware:
    """``knob_hardware`` from the knobs' continuous values (``apply`` instead of ``contribute``)."""
    return _build(knobs, values, workload, stages, "apply")


class StageBalance(AbstractKnob):
    """Continuous stage boundaries: parameters are logits of the stages' shares of compute.

    ``softmax(params)`` gives each stage's fraction of the model's total ``F + I + W``; the
    fractions' running sums are placed on the cumulative per-layer cost curve and mapped back to
    (fractional) layer positions by inverting it (linear between layers). Every per-stage quantity
    then follows by interpolating its own cumulative curve (``Workload.stage_fields``). Zero
    parameters give a compute-balanced split. Stages are the schedule's stages (virtual stages of
    interleaved schedules); concurrent pipelines (Chimera, AMDP) replicate them. Value: the stage
    boundaries ``[stages + 1]``; plan: layers per stage. Baselines: the uniform and the min-max
    split (``_partition``); the min-max split under the memory limit is a further start.

    Attributes:
        stages: number of stages (the schedule's ``stages``).
    """

    stages: int = eqx.field(static=True)
    name: ClassVar[str] = "layers_per_stage"
    label: ClassVar[str] = "layers per stage"
    sets: ClassVar[tuple[str, ...]] = STAGE_FIELDS

    def __check_init__(self) -> None:
        if not is_positive_int(self.stages):
            raise ConfigError(f"StageBalance: stages must be a positive int, got {self.stages!r}")

    def _check_workload(self, workload: Workload) -> None:
        if not isinstance(workload, Workload):
            raise ConfigError(f"StageBalance expects a Workload, got {type(workload).__name__}")
        if self.stages > workload.layers:
            raise ConfigError(f"StageBalance: {self.stages} stages exceed the workload's {workload.layers} layers")

    def check(self, problem: Problem) -> None:
        if self.stages != problem.stages:
            raise ConfigError(f"optimize: StageBalance has {self.stages} stages, the schedule has {problem.stages}")
        self._check_workload(problem.workload)
        check_static_memory(problem.workload, problem.holder, problem.versions, problem.devices)

    def init(self, workload: Workload | None = None, layers_per_stage: Sequence[int] | None = None
             ) -> Float[Array, " stages"]:
        """Logits: zeros (compute-balanced), or the logits that reproduce ``layers_per_stage``."""
        if layers_per_stage is None:
            dtype = jnp.result_type(float) if workload is None else workload.forward.dtype
            return jax.device_put(np.zeros((self.stages,), dtype))  # an eager jnp.zeros compiles a program
        if workload is None:
            raise ConfigError("StageBalance.init: layers_per_stage needs the workload")
        counts = _counts(layers_per_stage, "layers_per_stage")
        if len(counts) != self.stages or any(c < 1 for c in counts) or sum(counts) != workload.layers:
            raise ConfigError(f"StageBalance.init: layers_per_stage {list(counts)} needs {self.stages} positive "
                              f"entries summing to {workload.layers}")
        return compiled_unless_traced(_init_logits, workload, workload.boundaries(counts))

    def boundaries(self, params: Float[Array, " stages"], workload: Workload) -> Float[Array, " stages+1"]:
        """Positions ``[0, x_1, ..., x_{S-1}, layers]`` on the layer axis."""
        self._check_workload(workload)
        params = jnp.asarray(params)
        if params.shape != (self.stages,):
            raise ConfigError(f"StageBalance: params have shape {params.shape}, expected ({self.stages},)")
        return compiled_unless_traced(StageBalance._boundaries, params, workload)

    @staticmethod
    def _boundaries(params: Float[Array, " stages"], workload: Workload) -> Float[Array, " stages+1"]:
        return _boundaries_on(params, _curve_weights(workload), workload.layers)


    def layers(self, params: Float[Array, " stages"], workload: Workload) -> Float[Array, " stages"]:
        """Continuous layers per stage (sums to ``workload.layers``)."""
        return jnp.diff(self.boundaries(params, workload))

    def relax(self, params: Array, workload: Workload) -> Array:
        return self.boundaries(params, workload)

    def encode(self, plan: np.ndarray, workload: Workload) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(np.asarray(plan, np.int64))]).astype(np.float64)

    def apply(self, value: Array, workload: Workload, fields: dict[str, Any]) -> dict[str, Any]:
        return {**fields, **workload.stage_fields(value)}

    def round(self, params: Array, workload: Workload) -> np.ndarray:
        return _round_boundaries(np.asarray(self.boundaries(params, workload)), workload.layers)

    def neighbours(self, plan: np.ndarray) -> np.ndarray:
        return _split_neighbours(np.asarray(plan, np.int64), _split_moves(self.stages))

    def baselines(self, problem: Problem) -> dict[str, np.ndarray]:
        return {"uniform": np.asarray(uniform_partition(problem.workload.layers, self.stages)),
                "minmax": np.asarray(partition(np.asarray(problem.workload.compute, np.float64), self.stages))}

    def starts(self, problem: Problem) -> list[tuple[np.ndarray, bool]]:
        # A fixed number of starts: one compiled loop per graph and workload shape.
        base = self.baselines(problem)
        fitted = _memory_minmax(problem)
        return [(base["uniform"], False), (base["minmax"], False),
                (base["minmax"], False) if fitted is None else (fitted, True)]

    def fractional(self, params: Array, workload: Workload) -> np.ndarray:
        return np.diff(np.asarray(self.boundaries(params, workload)))  # ``layers``, without an eager jnp.diff

def _boundaries_on(params: Float[Array, " stages"], w: Float[Array, " layers"], layers: int
               ) -> Float[Array, " stages+1"]:
    """``StageBalance``'s boundaries of ``params`` on the curve weights ``w`` (``_curve_weights``)."""
    cumulative = jnp.concatenate([jnp.zeros((1,), w.dtype), jnp.cumsum(w)])
    targets = cumulative[-1] * jnp.cumsum(jax.nn.softmax(params.astype(w.dtype)))[:-1]
    k = jnp.clip(jnp.searchsorted(cumulative, targets, side="right") - 1, 0, layers - 1)
    inner = k.astype(w.dtype) + (targets - cumulative[k]) / w[k]
    inner = jnp.clip(inner, 0.0, float(layers))
    ends = jnp.zeros((1,), w.dtype), jnp.full((1,), layers, w.dtype)
    return jnp.concatenate([ends[0], inner, ends[1]])


class PaddedStageBalance(AbstractKnob):
    """``StageBalance`` of ``real`` stages run in ``stages`` (padded) entries, so that one compiled
    descent and exact evaluator serve every stage count up to ``stages`` (``optimize(...,
    pad_to=)`` with a larger ``stages``; ``docs/architecture.md``, "Compilation").

    ``real`` is an array leaf (traced, not static). Params: ``[stages]`` logits, the padded ones
    masked out of the softmax (no gradient reaches them); value: boundaries ``[stages + 1]``, those
    past ``real`` equal to ``layers``; every per-stage field of a padded stage is 0, as
    ``pad_hardware`` pads it, and every real stage's field is ``StageBalance(real)``'s (elementwise in
    the boundaries). Plans are the real knob's (``real`` entries): ``optimize`` checks, baselines
    and moves with ``StageBalance(real)``, and runs every program (descent, exact search, starts,
    rounding) with this knob. Made by ``of``.
    """

    stages: int = eqx.field(static=True)
    real: Array
    name: ClassVar[str] = StageBalance.name
    label: ClassVar[str] = StageBalance.label
    sets: ClassVar[tuple[str, ...]] = StageBalance.sets

    @classmethod
    def of(cls, knob: StageBalance, stages: int) -> PaddedStageBalance:
        if not is_positive_int(stages) or stages < knob.stages:
            raise ConfigError(f"PaddedStageBalance: {stages} stages cannot hold {knob.stages}")
        return cls(stages, np.asarray(knob.stages, np.int32))

    def unpadded(self) -> StageBalance:
        return StageBalance(int(np.asarray(self.real)))

    def pad_params(self, params: Any) -> Any:
        """Real logits ``[..., real]`` padded with zeros to ``[..., stages]`` (NumPy when concrete)."""
        width = self.stages - params.shape[-1]
        pads = [(0, 0)] * (params.ndim - 1) + [(0, width)]
        if isinstance(params, jax.core.Tracer):
            return jnp.pad(params, pads)
        return jax.device_put(np.pad(np.asarray(params), pads))

    def check(self, problem: Problem) -> None:
        self.unpadded().check(problem)

    def init(self, workload: Workload | None = None, layers_per_stage: Sequence[int] | None = None) -> Array:
        """``StageBalance.init`` padded with zeros (one program for every real stage count)."""
        if layers_per_stage is None or workload is None:
            return self.pad_params(self.unpadded().init(workload, layers_per_stage))
        counts = _counts(layers_per_stage, "layers_per_stage")
        if len(counts) != int(np.asarray(self.real)) or any(c < 1 for c in counts) or sum(counts) != workload.layers:
            raise ConfigError(f"PaddedStageBalance.init: layers_per_stage {list(counts)} needs "
                              f"{int(np.asarray(self.real))} positive entries summing to {workload.layers}")
        bounds = self.encode(np.asarray(counts), workload).astype(workload.forward.dtype)
        # on the cost curve alone: one program for every workload of this layer count
        logits = np.asarray(compiled_unless_traced(_init_logits_on, workload.compute, jax.device_put(bounds)))
        return jax.device_put(np.where(np.arange(self.stages) < len(counts), logits, 0).astype(logits.dtype))

    def relax(self, params: Array, workload: Workload) -> Array:
        # concrete: on the cost curve alone, one program for every workload of this layer count
        return compiled_unless_traced(PaddedStageBalance._relax, self, params, workload.compute)

    def _relax(self, params: Array, compute: Float[Array, " layers"]) -> Array:
        layers = compute.shape[0]
        masked = jnp.where(jnp.arange(self.stages) < self.real, params, -jnp.inf)
        bounds = _boundaries_on(masked, _weights(compute), layers)
        return jnp.where(jnp.arange(self.stages + 1) >= self.real, float(layers), bounds)

    def encode(self, plan: np.ndarray, workload: Workload) -> np.ndarray:
        bounds = self.unpadded().encode(plan, workload)
        return np.concatenate([bounds, np.full(self.stages + 1 - bounds.shape[0], bounds[-1])])

    def apply(self, value: Array, workload: Workload, fields: dict[str, Any]) -> dict[str, Any]:
        real = jnp.arange(self.stages) < self.real
        stage = {name: jnp.where(real, v, jnp.zeros((), v.dtype)) for name, v in workload.stage_fields(value).items()}
        return {**fields, **stage}

    def _real_bounds(self, params: Array, workload: Workload) -> np.ndarray:
        """The real boundaries of real (or padded) logits, by the padded program."""
        real = int(np.asarray(self.real))
        return np.asarray(self.relax(self.pad_params(np.asarray(params)[..., :real]), workload))[..., :real + 1]

    def round(self, params: Array, workload: Workload) -> np.ndarray:
        return _round_boundaries(self._real_bounds(params, workload), workload.layers)

    def neighbours(self, plan: np.ndarray) -> np.ndarray:
        return self.unpadded().neighbours(plan)

    def baselines(self, problem: Problem) -> dict[str, np.ndarray]:
        return self.unpadded().baselines(problem)

    def starts(self, problem: Problem) -> list[tuple[np.ndarray, bool]]:
        return self.unpadded().starts(problem)

    def fractional(self, params: Array, workload: Workload) -> np.ndarray:
        return np.diff(self._real_bounds(params, workload))


def _init_logits(workload: Workload, boundaries: Array) -> Array:
    return jnp.log(jnp.diff(_cumulative_at(_curve_weights(workload), boundaries)))


def _init_logits_on(compute: Float[Array, " layers"], boundaries: Array) -> Array:
    """``_init_logits`` on the per-layer compute curve alone."""
    return jnp.log(jnp.diff(_cumulative_at(_weights(compute), boundaries)))


def _curve_weights(workload: Workload) -> Float[Array, " layers"]:
    return _weights(workload.compute)


def _weights(compute: Float[Array, " layers"]) -> Float[Array, " layers"]:
    """The cost curve stage boundaries are placed on (``compute`` plus a flat share per layer)."""
    mean = jnp.mean(compute)
    return compute + FLAT_LAYER_WEIGHT * jnp.where(mean > 0, mean, 1.0)


def _memory_minmax(problem: Problem) -> np.ndarray | None:
    """The split minimising the largest stage compute subject to every stage fitting its device's
    memory (static bytes x versions + activation bytes x peak stored activations x size): a start
    for the search that is feasible where the unconstrained min-max is not. Only for placements with
    one stage per device (else ``None``), and ``None`` when no split fits."""
    workload, holder = problem.workload, problem.holder
    capacity = np.broadcast_to(np.asarray(workload.capacity, np.float64), problem.in_flight.shape)
    pipelines, stages = holder.shape
    if pipelines != 1 or len(set(holder.ravel().tolist())) != stages or np.all(np.isinf(capacity)):
        return None
    device = holder[0]
    static, act = (np.asarray(x, np.float64) for x in (workload.static_bytes, workload.activation_bytes))
    memory = (problem.versions[0][:, None] * static[None, :]
              + (problem.in_flight[device] * problem.size)[:, None] * act[None, :])
    split = partition(np.asarray(workload.compute, np.float64), stages, memory=memory, limit=capacity[device])
    return None if split is None else np.asarray(split, dtype=np.int64)


class MicrobatchSplit(AbstractKnob):
    """A global batch split into ``microbatches`` positive sizes: ``batch x softmax(params)``.

    The sizes feed ``Hardware.size`` relative to the workload's ``samples`` per microbatch (by
    default the mean, ``batch / microbatches``): compute time, message bytes and stored
    activations all scale with it (``Hardware``'s cost model). For unrolled asynchronous schedules
    the microbatches are every id of the window (all its steps). Value: the relative sizes;
    plan: samples per microbatch (largest-remainder rounding; moves shift one sample). Baseline:
    equal sizes.

    Attributes:
        batch: samples in the global batch (at least one per microbatch).
        microbatches: the schedule's ``microbatches``.
    """

    batch: int = eqx.field(static=True)
    microbatches: int = eqx.field(static=True)
    name: ClassVar[str] = "samples"
    label: ClassVar[str] = "samples per microbatch"
    sets: ClassVar[tuple[str, ...]] = ("size",)

    def __check_init__(self) -> None:
        if not is_positive_int(self.microbatches):
            raise ConfigError(f"MicrobatchSplit: microbatches must be a positive int, got {self.microbatches!r}")
        if not is_positive_int(self.batch):
            raise ConfigError(f"MicrobatchSplit: batch must be a positive int, got {self.batch!r}")
        if self.batch < self.microbatches:
            raise ConfigError(f"MicrobatchSplit: batch {self.batch} is smaller than the {self.microbatches} "
                              "microbatches (each needs at least one sample)")

    def check(self, problem: Problem) -> None:
        if self.microbatches != problem.microbatches:
            raise ConfigError(f"optimize: MicrobatchSplit has {self.microbatches} microbatches, the schedule has "
                              f"{problem.microbatches}")

    def init(self, workload: Workload | None = None, samples: Sequence[int] | None = None
             ) -> Float[Array, " microbatches"]:
        """Logits: zeros (equal sizes), or the logits of ``samples`` per microbatch."""
        dtype = jnp.result_type(float) if workload is None else workload.forward.dtype
        if samples is None:
            return jnp.zeros((self.microbatches,), dtype)
        counts = np.asarray(_counts(samples, "samples"), dtype=np.float64)
        if counts.shape != (self.microbatches,) or np.any(counts < 1) or counts.sum() != self.batch:
            raise ConfigError(f"MicrobatchSplit.init: samples {counts.astype(int).tolist()} need "
                              f"{self.microbatches} positive entries summing to {self.batch}")
        return jnp.asarray(np.log(counts), dtype)

    def samples(self, params: Float[Array, " microbatches"]) -> Float[Array, " microbatches"]:
        """Samples per microbatch (positive, summing to ``batch``)."""
        params = jnp.asarray(params)
        if params.shape != (self.microbatches,):
            raise ConfigError(f"MicrobatchSplit: params have shape {params.shape}, expected ({self.microbatches},)")
        return self.batch * jax.nn.softmax(params)

    def relative(self, samples: Float[Array, "... microbatches"], workload: Workload) -> Array:
        """``Hardware.size`` of ``samples`` per microbatch."""
        reference = workload.samples if workload.samples is not None else self.batch / self.microbatches
        return samples / reference

    def relax(self, params: Array, workload: Workload) -> Array:
        if not isinstance(workload, Workload):
            raise ConfigError(f"MicrobatchSplit expects a Workload, got {type(workload).__name__}")
        return self.relative(self.samples(params).astype(workload.forward.dtype), workload)

    def encode(self, plan: np.ndarray, workload: Workload) -> np.ndarray:
        return np.asarray(self.relative(np.asarray(plan).astype(np.float64), workload))

    def apply(self, value: Array, workload: Workload, fields: dict[str, Any]) -> dict[str, Any]:
        return {**fields, "size": jnp.asarray(value, dtype=workload.forward.dtype)}

    def round(self, params: Array, workload: Workload) -> np.ndarray:
        return _round_samples(np.asarray(self.samples(params)), self.batch)[None, :]

    def neighbours(self, plan: np.ndarray) -> np.ndarray:
        return _sample_neighbours(np.asarray(plan, np.int64))

    def baselines(self, problem: Problem) -> dict[str, np.ndarray]:
        return {"equal": _round_samples(np.full(self.microbatches, self.batch / self.microbatches), self.batch)}

    def starts(self, problem: Problem) -> list[tuple[np.ndarray, bool]]:
        return []

    def fractional(self, params: Array, workload: Workload) -> np.ndarray:
        return np.asarray(self.samples(params))



class SequenceSplit(AbstractKnob):
    """Each sample's sequence cut into ``segments`` consecutive lengths: ``sequence x softmax(params)``
    (Seq1F1B's segment lengths; the schedule's microbatch ``u`` is segment ``u % segments`` of a
    sample, ``diffpipe.schedules.families.seq1f1b``).

    Unlike unequal samples per microbatch, unequal segment lengths are what a runtime can execute
    (the Seq1F1B authors' compute-wise partition). The value is ``Hardware.size`` of every unit:
    segment j's share of a sample's cost, ``diffpipe._workload._segments.segment_costs`` (linear parts in
    proportion to its length, attention to its causal query-key pairs), repeated for every sample;
    the workload's per-layer costs are those of a whole microbatch at the full sequence. Plan: tokens
    per segment, multiples of ``multiple`` (the authors round to the tensor-parallel size under
    sequence parallelism); moves shift ``multiple`` tokens. Baselines: equal lengths (the authors'
    ``average``), then the compute-balanced split (``_segments.balanced_fractions``, their default).

    Attributes:
        sequence: tokens per sample; segments: segments per sample; microbatches: the schedule's
            ``microbatches`` (samples x segments); share: the attention share of a sample's cost
            (``_segments.attention_share(model)``; ``from_model``); multiple: token granularity.
    """

    sequence: int = eqx.field(static=True)
    segments: int = eqx.field(static=True)
    microbatches: int = eqx.field(static=True)
    share: float = eqx.field(static=True)
    multiple: int = eqx.field(static=True, default=1)
    name: ClassVar[str] = "segment_lengths"
    label: ClassVar[str] = "tokens per segment"
    sets: ClassVar[tuple[str, ...]] = ("size",)

    def __check_init__(self) -> None:
        for field in ("sequence", "segments", "microbatches", "multiple"):
            if not is_positive_int(getattr(self, field)):
                raise ConfigError(f"SequenceSplit: {field} must be a positive int, got {getattr(self, field)!r}")
        if self.microbatches % self.segments:
            raise ConfigError(f"SequenceSplit: {self.microbatches} microbatches are not whole samples of "
                              f"{self.segments} segments")
        if self.sequence % self.multiple or self.sequence // self.multiple < self.segments:
            raise ConfigError(f"SequenceSplit: sequence {self.sequence} must be a multiple of {self.multiple} "
                              f"with at least one such block per segment ({self.segments})")
        segment_costs(jnp.ones(1), self.share)  # checks the share

    @classmethod
    def from_model(cls, model: Transformer, segments: int, microbatches: int, multiple: int = 1) -> SequenceSplit:
        """The knob for ``model``'s sequence, with its attention share."""
        return cls(int(model.sequence), segments, microbatches, attention_share(model), multiple)

    def check(self, problem: Problem) -> None:
        if self.microbatches != problem.microbatches:
            raise ConfigError(f"optimize: SequenceSplit has {self.microbatches} microbatches (segments), the "
                              f"schedule has {problem.microbatches}")

    def init(self, workload: Workload | None = None, lengths: Sequence[float] | None = None
             ) -> Float[Array, " segments"]:
        """Logits: zeros (equal lengths), or the logits of ``lengths`` tokens per segment."""
        dtype = jnp.result_type(float) if workload is None else workload.forward.dtype
        if lengths is None:
            return jnp.zeros((self.segments,), dtype)
        x = check_lengths(lengths, self.sequence)
        if x.shape != (self.segments,):
            raise ConfigError(f"SequenceSplit.init: {x.size} lengths for {self.segments} segments")
        return jnp.asarray(np.log(x), dtype)

    def lengths(self, params: Float[Array, " segments"]) -> Float[Array, " segments"]:
        """Tokens per segment (positive, summing to ``sequence``)."""
        params = jnp.asarray(params)
        if params.shape != (self.segments,):
            raise ConfigError(f"SequenceSplit: params have shape {params.shape}, expected ({self.segments},)")
        return self.sequence * jax.nn.softmax(params)

    def sizes(self, lengths: Any) -> Array:
        """``Hardware.size`` of every unit for ``lengths`` tokens per segment: ``[microbatches]``."""
        costs = segment_costs(jnp.asarray(lengths) / self.sequence, self.share)
        return jnp.tile(costs, self.microbatches // self.segments)

    def relax(self, params: Array, workload: Workload) -> Array:
        if not isinstance(workload, Workload):
            raise ConfigError(f"SequenceSplit expects a Workload, got {type(workload).__name__}")
        return self.sizes(self.lengths(params).astype(workload.forward.dtype))

    def encode(self, plan: np.ndarray, workload: Workload) -> np.ndarray:
        return np.asarray(self.sizes(np.asarray(plan, np.float64)))

    def apply(self, value: Array, workload: Workload, fields: dict[str, Any]) -> dict[str, Any]:
        return {**fields, "size": jnp.asarray(value, dtype=workload.forward.dtype)}

    def _plan(self, lengths: np.ndarray) -> np.ndarray:
        blocks = self.sequence // self.multiple
        return _round_samples(np.asarray(lengths, np.float64) / self.multiple, blocks) * self.multiple

    def round(self, params: Array, workload: Workload) -> np.ndarray:
        return self._plan(np.asarray(self.lengths(params)))[None, :]

    def neighbours(self, plan: np.ndarray) -> np.ndarray:
        return _sample_neighbours(np.asarray(plan, np.int64) // self.multiple) * self.multiple

    def baselines(self, problem: Problem) -> dict[str, np.ndarray]:
        return {"equal": self._plan(np.full(self.segments, self.sequence / self.segments)),
                "balanced": self._plan(self.sequence * balanced_fractions(self.segments, self.share))}

    def starts(self, problem: Problem) -> list[tuple[np.ndarray, bool]]:
        return [(self.baselines(problem)["balanced"], True)]

    def fractional(self, params: Array, workload: Workload) -> np.ndarray:
        return np.asarray(self.lengths(params))


def as_knobs(knob: Any) -> tuple[AbstractKnob, ...]:
    """A knob or a sequence of knobs (no two setting the same ``Hardware`` field) as a tuple."""
    knobs = tuple(knob) if isinstance(knob, (tuple, list)) else (knob,)
    if not knobs:
        raise ConfigError("optimize: give at least one knob (StageBalance, MicrobatchSplit)")
    seen: dict[str, str] = {}
    for k in knobs:
        if not isinstance(k, AbstractKnob):
            raise ConfigError(f"knob must be an AbstractKnob (StageBalance, MicrobatchSplit, ...), got "
                              f"{type(k).__name__}")
        for name in k.sets:
            if name in seen:
                raise ConfigError(f"knobs: {type(k).__name__} and {seen[name]} both set {name}; give at most "
                                  "one knob per Hardware field")
            seen[name] = type(k).__name__
    return knobs


# -- rounding and moves (numpy) ------------------------------------------------------------------------
#: Floor/ceiling combinations of the continuous boundaries tried when rounding (2^(stages-1) of
#: them when at most this many, else nearest only).
ROUNDING_COMBINATIONS = 256
#: The local search moves any subset of boundaries by ±1 when there are at most this many such
#: moves (3^(stages-1) - 1: up to 8 stages); beyond, one or two boundaries at a time.
NEIGHBOURHOOD_LIMIT = 2186


def _repair(cuts: np.ndarray, layers: int) -> np.ndarray:
    """Integer interior boundaries made strictly increasing within ``1 .. layers-1``."""
    cuts = cuts.astype(np.int64).copy()
    n = cuts.shape[-1]
    low = np.arange(1, n + 1)
    high = layers - n + np.arange(n)
    cuts = np.clip(cuts, low, high)
    for j in range(1, n):
        cuts[..., j] = np.maximum(cuts[..., j], cuts[..., j - 1] + 1)
    for j in range(n - 2, -1, -1):
        cuts[..., j] = np.minimum(cuts[..., j], cuts[..., j + 1] - 1)
    return cuts


def _counts_of(cuts: np.ndarray, layers: int) -> np.ndarray:
    rows = cuts.reshape(-1, cuts.shape[-1])
    edges = np.concatenate([np.zeros((rows.shape[0], 1), np.int64), rows,
                            np.full((rows.shape[0], 1), layers, np.int64)], axis=1)
    return np.diff(edges, axis=1)


def _round_boundaries(x: np.ndarray, layers: int) -> np.ndarray:
    """Candidate integer splits ``[n, stages]`` around continuous boundaries ``x`` ``[stages+1]``."""
    inner = x[1:-1]
    if inner.size == 0:
        return np.array([[layers]], dtype=np.int64)
    if 2 ** inner.size <= ROUNDING_COMBINATIONS:
        choices = np.array(list(itertools.product((0, 1), repeat=inner.size)), dtype=np.int64)
        cuts = np.floor(inner).astype(np.int64)[None, :] + choices
    else:
        cuts = np.rint(inner).astype(np.int64)[None, :]
    cuts = _repair(cuts, layers)
    return np.unique(_counts_of(cuts, layers), axis=0)


def _round_samples(samples: np.ndarray, batch: int) -> np.ndarray:
    """Largest-remainder rounding to positive integers summing to ``batch``."""
    base = np.maximum(np.floor(samples).astype(np.int64), 1)
    while base.sum() > batch:  # the floor of 1 took too many: take back from the largest
        base[np.argmax(base)] -= 1
    remainder = samples - base
    for i in np.argsort(-remainder, kind="stable")[: batch - base.sum()]:
        base[i] += 1
    return base


@bounded(64)
def _split_moves(stages: int) -> np.ndarray:
    n = stages - 1
    if n == 0:
        return np.zeros((0, 0), np.int64)
    if 3 ** n - 1 <= NEIGHBOURHOOD_LIMIT:
        moves = np.array(list(itertools.product((-1, 0, 1), repeat=n)), dtype=np.int64)
        return moves[np.any(moves != 0, axis=1)]
    moves = []
    for j in range(n):
        for d in (-1, 1):
            m = np.zeros(n, np.int64)
            m[j] = d
            moves.append(m)
    for i, j in itertools.combinations(range(n), 2):
        for a, b in itertools.product((-1, 1), repeat=2):
            m = np.zeros(n, np.int64)
            m[i], m[j] = a, b
            moves.append(m)
    return np.array(moves)


def _split_neighbours(counts: np.ndarray, moves: np.ndarray) -> np.ndarray:
    layers = int(counts.sum())
    if moves.shape[0] == 0:
        return np.zeros((0, counts.shape[0]), np.int64)
    cuts = np.cumsum(counts)[:-1][None, :] + moves
    edges = np.concatenate([np.zeros((cuts.shape[0], 1), np.int64), cuts,
                            np.full((cuts.shape[0], 1), layers, np.int64)], axis=1)
    new = np.diff(edges, axis=1)
    return new[np.all(new >= 1, axis=1)]


def _sample_neighbours(samples: np.ndarray) -> np.ndarray:
    m = samples.shape[0]
    out = []
    for i, j in itertools.permutations(range(m), 2):
        if samples[i] > 1:
            new = samples.copy()
            new[i] -= 1
            new[j] += 1
            out.append(new)
    return np.array(out, dtype=np.int64).reshape(-1, m)

