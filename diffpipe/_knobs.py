"""Knobs: equinox Modules that map continuous parameters and a ``Workload`` to a ``Hardware``.

A loss is then plain composition (DESIGN.md, "Knobs, optimization and sweeps")::

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
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import itertools
import math
import operator
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._errors import ConfigError
from ._hardware import Hardware, Network, _check_values, _concrete, _float, _renamed
from ._partition import partition, uniform_partition
from ._transformer import Device, Transformer, layer_costs, stage_of_layers

#: Layers without compute (an embedding) still take this fraction of the mean layer's cost on the
#: cumulative cost curve, so that the curve is strictly increasing and a boundary placed on it
#: maps to a unique layer position.
FLAT_LAYER_WEIGHT = 1e-2


def _positive_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1


def _counts(value: Any, what: str) -> tuple[int, ...]:
    try:
        counts = tuple(operator.index(c) for c in value)
    except TypeError:
        raise ConfigError(f"{what} must be a sequence of ints, got {value!r}") from None
    return counts


class Workload(eqx.Module):
    """A model as a per-layer table, plus the machine terms a ``Hardware`` needs besides stages.

    Per-layer arrays ``[layers]`` (one microbatch of ``samples`` samples; see ``samples``):
        forward, input_grad, weight: seconds of ``F``, ``I`` (input gradient) and ``W`` (weight
            gradient); a full ``B`` is ``I + W``.
        update: seconds of the optimizer step ``U`` for the layer's parameters.
        static_bytes: weights, gradients and optimizer state held by the stage holding the layer.
        gradient_bytes: what a data-parallel all-reduce of the layer's gradients moves.
        activation_bytes: bytes stored from the layer's forward until its backward.
        output_bytes: the layer's output, sent across a stage boundary placed after it (the
            gradient sent back is the same size).
    Other fields:
        overhead: seconds added to every compute op; capacity: device memory, scalar or ``[devices]``;
        network: the links (``Network``); size: relative microbatch sizes used when no
            ``MicrobatchSplit`` sets them (scalar or ``[microbatches]``).
        shared_static_bytes / shared_gradient_bytes: bytes of the last layer that duplicate the
            first's (a tied embedding): dropped when one stage holds both.
        samples: samples per microbatch the per-layer costs are for; ``None`` means "the mean
            microbatch" (``batch / microbatches`` of a ``MicrobatchSplit``).
        layers_per_stage: the split used when no ``StageBalance`` sets one (``None``: uniform).

    Build with ``Workload.from_model`` (the transformer cost model on a ``Device``) or
    ``Workload.from_table`` (any per-layer table, e.g. measured).
    """

    forward: Float[Array, " layers"]
    input_grad: Float[Array, " layers"]
    weight: Float[Array, " layers"]
    update: Float[Array, " layers"]
    static_bytes: Float[Array, " layers"]
    gradient_bytes: Float[Array, " layers"]
    activation_bytes: Float[Array, " layers"]
    output_bytes: Float[Array, " layers"]
    overhead: Float[Array, ""]
    capacity: Float[Array, "..."]
    size: Float[Array, "..."]
    network: Network
    shared_static_bytes: Float[Array, ""] = eqx.field(converter=_float, default=0.0)
    shared_gradient_bytes: Float[Array, ""] = eqx.field(converter=_float, default=0.0)
    samples: float | None = eqx.field(static=True, default=None)
    layers_per_stage: tuple[int, ...] | None = eqx.field(static=True, default=None)

    def __check_init__(self) -> None:
        if not isinstance(self.network, Network):
            raise ConfigError(f"workload: network must be a Network, got {type(self.network).__name__}")
        shape = jnp.shape(self.forward)
        if len(shape) != 1 or shape[0] < 1:
            raise ConfigError(f"workload: forward must be a non-empty [layers] array, got shape {shape}")
        for name in ("input_grad", "weight", "update", "static_bytes", "gradient_bytes", "activation_bytes",
                     "output_bytes"):
            if jnp.shape(getattr(self, name)) != shape:
                raise ConfigError(f"workload: {name} has shape {jnp.shape(getattr(self, name))}, "
                                  f"forward has {shape}")
        for name in ("forward", "input_grad", "weight", "update", "static_bytes", "gradient_bytes",
                     "activation_bytes", "output_bytes", "overhead", "size", "shared_static_bytes",
                     "shared_gradient_bytes"):
            _check_values(f"workload {name}", getattr(self, name))
        _check_values("workload capacity", self.capacity, positive=True, allow_inf=True)
        if self.samples is not None and not (isinstance(self.samples, (int, float)) and self.samples > 0
                                             and math.isfinite(self.samples)):
            raise ConfigError(f"workload: samples must be a positive number or None, got {self.samples!r}")
        if self.layers_per_stage is not None:
            counts = self.layers_per_stage
            if any(c < 1 for c in counts) or sum(counts) != shape[0]:
                raise ConfigError(f"workload: layers_per_stage {list(counts)} must be positive and sum to "
                                  f"the {shape[0]} layers")

    # -- constructors -------------------------------------------------------------------------------
    @classmethod
    def from_table(
        cls,
        forward: Any,
        input_grad: Any = None,
        weight: Any = None,
        *,
        update: Any = 0.0,
        static_bytes: Any = 0.0,
        gradient_bytes: Any = 0.0,
        activation_bytes: Any = 0.0,
        output_bytes: Any = 0.0,
        overhead: Any = 0.0,
        capacity: Any = math.inf,
        size: Any = 1.0,
        network: Network | None = None,
        samples: float | None = None,
        layers_per_stage: Sequence[int] | None = None,
        shared_static_bytes: float = 0.0,
        shared_gradient_bytes: float = 0.0,
        backward: Any = None,
    ) -> Workload:
        """A workload from per-layer sequences (scalars broadcast to every layer).

        ``forward`` fixes the number of layers; ``weight`` defaults to 0 (``input_grad`` is then the
        whole backward). ``network`` defaults to an idealized one (no latency, infinite bandwidth).
        ``backward=`` is the deprecated name of ``input_grad``.
        """
        input_grad = _renamed("workload", "input_grad", input_grad, "backward", backward)
        f = _float(forward)
        if f.ndim != 1 or f.shape[0] < 1:
            raise ConfigError(f"workload: forward must be a non-empty sequence of per-layer times, got shape "
                              f"{f.shape}")

        def layer(x: Any, name: str) -> Array:
            x = _float(x)
            if x.ndim == 0:
                return jnp.broadcast_to(x, f.shape)
            if x.shape != f.shape:
                raise ConfigError(f"workload: {name} has shape {x.shape}, forward has {f.shape}")
            return x

        return cls(
            forward=f, input_grad=layer(input_grad, "input_grad"),
            weight=layer(0.0 if weight is None else weight, "weight"), update=layer(update, "update"),
            static_bytes=layer(static_bytes, "static_bytes"), gradient_bytes=layer(gradient_bytes, "gradient_bytes"),
            activation_bytes=layer(activation_bytes, "activation_bytes"),
            output_bytes=layer(output_bytes, "output_bytes"), overhead=_float(overhead),
            capacity=_float(capacity), size=_float(size),
            network=Network.uniform() if network is None else network, samples=samples,
            layers_per_stage=None if layers_per_stage is None else _counts(layers_per_stage, "layers_per_stage"),
            shared_static_bytes=shared_static_bytes, shared_gradient_bytes=shared_gradient_bytes,
        )

    @classmethod
    def from_model(
        cls,
        model: Any,
        device: Any,
        network: Network | None = None,
        *,
        overhead: Any = 0.0,
        update: Any = 0.0,
        capacity: Any = None,
        layers_per_stage: Sequence[int] | None = None,
    ) -> Workload:
        """The transformer cost model (``diffpipe.layer_costs``) on ``device``.

        Layers are the rows of ``layer_costs(model)``: the embedding, every block, the LM head
        (``model.layers + 2``), so the uneven first and last layers are placed like any other.
        Times are the roofline ``costs.times(device)``; ``samples`` is ``model.microbatch_size``;
        ``capacity`` defaults to the device memory; ``update`` (seconds for the whole model) is
        spread over layers in proportion to their parameters. A tied embedding's copy in the head
        is dropped when one stage holds both (as ``Hardware.from_model`` does).
        """
        if not isinstance(model, Transformer):
            raise ConfigError(f"Workload.from_model expects a Transformer, got {type(model).__name__}")
        if not isinstance(device, Device):
            raise ConfigError(f"Workload.from_model expects a Device, got {type(device).__name__}")
        costs = layer_costs(model)
        forward, input_grad, weight = costs.times(device)
        dtype = forward.dtype
        share = costs.parameters / costs.parameters.sum()
        return cls.from_table(
            forward, input_grad, weight,
            update=jnp.asarray(update, dtype) * jnp.asarray(share, dtype),
            static_bytes=jnp.asarray(costs.static_bytes, dtype),
            gradient_bytes=jnp.asarray(costs.gradient_bytes, dtype),
            activation_bytes=jnp.asarray(costs.activation_bytes, dtype),
            output_bytes=jnp.asarray(costs.output_bytes, dtype),
            overhead=overhead, capacity=device.memory if capacity is None else capacity,
            network=Network.uniform() if network is None else network,
            samples=float(model.microbatch_size), layers_per_stage=layers_per_stage,
            shared_static_bytes=costs.shared_parameters * model.bytes_per_parameter,
            shared_gradient_bytes=costs.shared_parameters * model.dtype_bytes,
        )

    def with_split(self, layers_per_stage: Sequence[int] | None) -> Workload:
        """This workload with another default split (``None``: uniform)."""
        counts = None if layers_per_stage is None else _counts(layers_per_stage, "layers_per_stage")
        return dataclasses.replace(self, layers_per_stage=counts)

    # -- derived ------------------------------------------------------------------------------------
    @property
    def layers(self) -> int:
        return int(self.forward.shape[0])

    @property
    def compute(self) -> Float[Array, " layers"]:
        """Per-layer ``F + I + W`` seconds: the cost curve stage boundaries are placed on."""
        return self.forward + self.input_grad + self.weight

    def boundaries(self, layers_per_stage: Sequence[int] | Array) -> Float[Array, "... stages+1"]:
        """Stage boundary positions ``[0, c_0, c_0 + c_1, ..., layers]`` of integer splits."""
        counts = jnp.asarray(layers_per_stage)
        zero = jnp.zeros((*counts.shape[:-1], 1), dtype=self.forward.dtype)
        return jnp.concatenate([zero, jnp.cumsum(counts.astype(self.forward.dtype), axis=-1)], axis=-1)

    def default_boundaries(self, stages: int) -> Float[Array, " stages+1"]:
        counts = self.layers_per_stage
        if counts is None:
            counts = uniform_partition(self.layers, stages)
        elif len(counts) != stages:
            raise ConfigError(f"workload: layers_per_stage has {len(counts)} stages, the schedule has {stages}")
        return self.boundaries(counts)

    def stage_fields(self, boundaries: Float[Array, " stages+1"]) -> dict[str, Array]:
        """The per-stage ``Hardware`` fields of stages between ``boundaries`` (positions on the
        layer axis, from 0 to ``layers``, non-decreasing; fractional positions split a layer linearly).

        ``F, I, W, U`` seconds, static, gradient and activation bytes are differences of the
        cumulative per-layer curves at the boundaries (linear interpolation); the message entering
        stage ``k`` is ``output_bytes`` of the layer before boundary ``k``, interpolated between
        neighbouring layers. Only array operations: differentiable in every float and vmap-safe.
        """
        x = jnp.asarray(boundaries, dtype=self.forward.dtype)
        if x.ndim != 1 or x.shape[0] < 2:
            raise ConfigError(f"workload: boundaries must be [stages + 1] positions, got shape {x.shape}")

        def per_stage(q: Array) -> Array:
            return jnp.diff(_cumulative_at(q, x))

        static, gradient = per_stage(self.static_bytes), per_stage(self.gradient_bytes)
        if x.shape[0] == 2:  # one stage holds the first and the last layer
            static = static - self.shared_static_bytes
            gradient = gradient - self.shared_gradient_bytes
        message = jnp.concatenate([jnp.zeros((1,), x.dtype), _boundary_bytes(self.output_bytes, x[1:-1])])
        return dict(forward=per_stage(self.forward), input_grad=per_stage(self.input_grad),
                    weight=per_stage(self.weight), update=per_stage(self.update), message_bytes=message,
                    gradient_bytes=gradient, static_bytes=static,
                    activation_bytes=per_stage(self.activation_bytes))

    def fields(self, boundaries: Float[Array, " stages+1"], size: Any = None) -> dict[str, Any]:
        """Every ``Hardware`` field (``stage_fields`` plus overhead, size, capacity and network);
        ``size`` (relative microbatch sizes) defaults to ``self.size``."""
        stage = self.stage_fields(boundaries)
        size = self.size if size is None else jnp.asarray(size, dtype=stage["forward"].dtype)
        return dict(stage, overhead=self.overhead, size=size, capacity=self.capacity, network=self.network)

    def hardware(self, boundaries: Float[Array, " stages+1"], size: Any = None) -> Hardware:
        """``Hardware`` for stages between ``boundaries`` (see ``stage_fields``); ``size``
        defaults to ``self.size``."""
        return Hardware(**self.fields(boundaries, size))

    def tables(self, graph: Any) -> Any:
        """The cost-model protocol (``CostModel``): ``graph``'s cost rows under this workload's
        default split (``layers_per_stage``, uniform when ``None``)."""
        return self.hardware(self.default_boundaries(graph.stages)).tables(graph)


def hardware_from_model(
    model: Transformer,
    device: Device,
    network: Network,
    *,
    stages: int | None = None,
    layers_per_stage: Sequence[int] | None = None,
    microbatches: int | None = None,
    size: Any = 1.0,
    overhead: Any = 0.0,
    update: Any = 0.0,
) -> Hardware:
    """``Hardware`` for ``model`` split into pipeline stages on ``device`` over ``network``
    (``Hardware.from_model``): ``Workload.from_model(...).hardware(...)`` at the split's integer
    boundaries, so a model reaches a ``Hardware`` by one path.

    Per stage (see ``stage_of_layers`` for the grouping: the embedding joins stage 0, the head the
    last stage): times ``F, I, W`` sum its layers' roofline times (``LayerCosts.times``);
    ``static_bytes`` and ``gradient_bytes`` sum its layers' parameters (a tied embedding's copy is
    dropped when embedding and head share the stage); ``activation_bytes`` sums its layers' stored
    activations; ``message_bytes[k]`` is the boundary activation ``d s b h`` entering stage ``k``
    (0 for stage 0). ``capacity`` is the device memory; the network is used as given.

    Args:
        model, device, network: the workload, the accelerator and the links.
        stages, layers_per_stage: the split (exactly one; see ``stage_of_layers``).
        microbatches: when given, ``size`` is broadcast to ``[microbatches]``.
        size: microbatch sizes relative to ``model.microbatch_size`` (every cost above scales linearly;
            the kernel efficiency stays that of ``model.microbatch_size``).
        overhead: fixed seconds per compute op; update: seconds of every stage's optimizer step ``U``.

    Only array operations touch the float inputs (device, size, overhead, update), so the result
    is differentiable in them and the call is vmap-safe.
    """
    if not isinstance(model, Transformer):
        raise ConfigError(f"from_model expects a Transformer, got {type(model).__name__}")
    if not isinstance(device, Device):
        raise ConfigError(f"from_model expects a Device, got {type(device).__name__}")
    if not isinstance(network, Network):
        raise ConfigError(f"from_model expects a Network, got {type(network).__name__}")
    stage = stage_of_layers(model, stages, layers_per_stage)
    rows = np.bincount(stage)  # layer-table rows per stage (every stage has at least one)
    dtype = device.throughput.dtype
    size = jnp.asarray(size, dtype=dtype)
    if microbatches is not None:
        if not _positive_int(microbatches):
            raise ConfigError(f"from_model: microbatches must be a positive int, got {microbatches!r}")
        if size.ndim > 1 or (size.ndim == 1 and size.shape[0] != microbatches):
            raise ConfigError(f"from_model: size has shape {size.shape}, expected a scalar or [{microbatches}]")
        size = jnp.broadcast_to(size, (microbatches,))
    workload = Workload.from_model(model, device, network, overhead=overhead)
    hw = workload.hardware(workload.boundaries(tuple(rows.tolist())), size)
    return eqx.tree_at(lambda h: h.update, hw, jnp.asarray(update, dtype=dtype))  # per stage, as given


def _cumulative_at(q: Float[Array, " layers"], x: Float[Array, " n"]) -> Float[Array, " n"]:
    """``sum(q[:x])`` extended linearly between integers (exact at integer ``x``)."""
    layers = q.shape[0]
    cumulative = jnp.concatenate([jnp.zeros((1,), q.dtype), jnp.cumsum(q)])
    k = jnp.clip(jnp.floor(x), 0, layers - 1).astype(jnp.int32)
    return cumulative[k] + (x - k.astype(x.dtype)) * q[k]


def _boundary_bytes(output: Float[Array, " layers"], x: Float[Array, " n"]) -> Float[Array, " n"]:
    """Bytes crossing a boundary at position ``x``: ``output[k-1]`` at integer ``k``, linear between."""
    layers = output.shape[0]
    if layers < 2:
        return jnp.zeros_like(x)
    knots = jnp.arange(1, layers, dtype=x.dtype)
    return jnp.interp(x, knots, output[:-1])


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


#: ``Hardware`` fields that depend on where the stage boundaries sit (``Workload.stage_fields``).
STAGE_FIELDS = ("forward", "input_grad", "weight", "update", "message_bytes", "gradient_bytes", "static_bytes",
                "activation_bytes")


class AbstractKnob(eqx.Module):
    """A continuous relaxation of one integer choice, as ``optimize`` needs it.

    A knob has *params* (unconstrained floats the optimizer moves), a continuous *value* ``x``
    (what the hardware is built from; differentiable in the params) and integer *plans* (what is
    finally run). ``contribute`` maps params to ``Hardware`` fields; ``apply`` does it from a value,
    so that ``apply(encode(plan))`` gives the exact hardware of a plan. ``optimize`` only calls these
    methods: a new knob is one subclass (``tests/test_knobs.py`` defines one outside the package).

    Class attributes:
        name: the plan's name in results (``Plan.values``), e.g. ``"layers_per_stage"``.
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
        if not _positive_int(self.stages):
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
            return jnp.zeros((self.stages,), dtype)
        if workload is None:
            raise ConfigError("StageBalance.init: layers_per_stage needs the workload")
        counts = _counts(layers_per_stage, "layers_per_stage")
        if len(counts) != self.stages or any(c < 1 for c in counts) or sum(counts) != workload.layers:
            raise ConfigError(f"StageBalance.init: layers_per_stage {list(counts)} needs {self.stages} positive "
                              f"entries summing to {workload.layers}")
        curve = _cumulative_at(_curve_weights(workload), workload.boundaries(counts))
        return jnp.log(jnp.diff(curve))

    def boundaries(self, params: Float[Array, " stages"], workload: Workload) -> Float[Array, " stages+1"]:
        """Positions ``[0, x_1, ..., x_{S-1}, layers]`` on the layer axis."""
        self._check_workload(workload)
        params = jnp.asarray(params)
        if params.shape != (self.stages,):
            raise ConfigError(f"StageBalance: params have shape {params.shape}, expected ({self.stages},)")
        w = _curve_weights(workload)
        cumulative = jnp.concatenate([jnp.zeros((1,), w.dtype), jnp.cumsum(w)])
        targets = cumulative[-1] * jnp.cumsum(jax.nn.softmax(params.astype(w.dtype)))[:-1]
        k = jnp.clip(jnp.searchsorted(cumulative, targets, side="right") - 1, 0, workload.layers - 1)
        inner = k.astype(w.dtype) + (targets - cumulative[k]) / w[k]
        inner = jnp.clip(inner, 0.0, float(workload.layers))
        ends = jnp.zeros((1,), w.dtype), jnp.full((1,), workload.layers, w.dtype)
        return jnp.concatenate([ends[0], inner, ends[1]])

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
        return np.asarray(self.layers(params, workload))

def _curve_weights(workload: Workload) -> Float[Array, " layers"]:
    compute = workload.compute
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
        if not _positive_int(self.microbatches):
            raise ConfigError(f"MicrobatchSplit: microbatches must be a positive int, got {self.microbatches!r}")
        if not _positive_int(self.batch):
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


@functools.cache
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


def check_static_memory(workload: Workload, holder: np.ndarray, versions: np.ndarray, devices: int,
                        fixed: Sequence[int] | None = None) -> None:
    """Raise ``ConfigError`` when no split of the layers into stages can hold the static bytes.

    ``holder[p, s]`` is the device of stage ``s`` of pipeline ``p``; ``versions[p, s]`` the weight
    versions it holds. With ``fixed`` layers per stage the check is exact. Otherwise it is exact
    when every device holds one stage (a dynamic program over splits), and for other placements
    uses two necessary conditions: every device can hold the largest layer, and all devices
    together can hold every stage's static bytes.
    """
    static = _concrete(workload.static_bytes)
    capacity = _concrete(workload.capacity)
    if static is None or capacity is None:
        return
    static = static.astype(np.float64)
    pipelines, stages = holder.shape
    layers = static.shape[0]
    cap = np.broadcast_to(np.asarray(capacity, np.float64), (devices,)) if capacity.ndim == 0 else capacity
    if cap.shape != (devices,):
        raise ConfigError(f"workload: capacity has shape {cap.shape}, the schedule has {devices} devices")
    if np.all(np.isinf(cap)):
        return
    cumulative = np.concatenate([[0.0], np.cumsum(static)])
    shared = float(np.asarray(workload.shared_static_bytes)) if stages == 1 else 0.0
    if fixed is not None:
        edges = np.concatenate([[0], np.cumsum(fixed)]).astype(int)
        per_stage = np.diff(cumulative[edges]) - shared
        held = np.zeros(devices)
        np.add.at(held, holder.ravel(), (versions * per_stage[None, :]).ravel())
        worst = int(np.argmax(held - cap))
        if held[worst] > cap[worst]:
            raise ConfigError(f"workload: device {worst} needs {held[worst]:.4g} static bytes with layers_per_stage "
                              f"{list(fixed)}, over its capacity {cap[worst]:.4g}")
        return
    one_each = pipelines == 1 and len(set(holder.ravel().tolist())) == stages
    if one_each:
        limit = cap[holder[0]] / versions[0] + shared  # the tied copy is dropped when one stage holds both
        fitted = partition(np.zeros(layers), stages, memory=static, limit=limit)
        if fitted is None:
            raise ConfigError(f"workload: no split of {layers} layers into {stages} stages fits the static bytes "
                              f"({cumulative[-1]:.4g} in all) in the memory capacity {cap.min():.4g}")
        return
    least = float(versions.min())
    biggest = float(static.max()) * least
    if biggest > cap.max():
        raise ConfigError(f"workload: layer {int(static.argmax())} alone needs {biggest:.4g} static bytes, over "
                          f"every device's capacity (at most {cap.max():.4g})")
    total = (cumulative[-1] - shared) * pipelines * least
    if total > cap.sum():
        raise ConfigError(f"workload: the {pipelines} pipeline(s) need {total:.4g} static bytes, over the "
                          f"devices' total capacity {cap.sum():.4g}")


__all__ = ["FLAT_LAYER_WEIGHT", "STAGE_FIELDS", "AbstractKnob", "MicrobatchSplit", "Problem", "StageBalance",
           "Workload", "as_knobs", "hardware_from_model", "check_static_memory", "knob_hardware", "value_hardware"]
