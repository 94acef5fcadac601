"""``Workload``: per-layer seconds and bytes of a model on a device, and the one path from a model,
a device and a network to a ``Hardware`` (``hardware_from_model``, ``Workload.hardware``).

Stage boundaries may be fractional: stage fields interpolate the cumulative per-layer curves
(exact at integers), which is what ``StageBalance`` differentiates through.

Why one module past 500 lines: ``Workload`` and ``hardware_from_model`` are the one model x device ->
``Hardware`` path, and the interpolation of fractional stage boundaries (``_fields_at``) and
``check_static_memory`` are written against ``Workload``'s per-layer curves and nothing else.
"""


from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._arrays import concrete, on_host, power_of_two
from .._checks import is_positive_int
from .._engine._cost_model import AbstractCostModel, CostTables
from .._engine._graph import Graph
from .._engine._hardware import (
    OVERHEAD_KINDS,
    Hardware,
    Network,
    _kind_overhead,
    _optional,
    _required,
    check_split_known,
)
from .._engine._jit_checks import check_values, checked_float
from .._errors import ConfigError
from .._machine._device import Device
from .._model._transformer import Transformer, layer_costs, stage_of_layers
from .._partition import partition, uniform_partition

#: Layers without compute (an embedding) still take this fraction of the mean layer's cost on the
#: cumulative cost curve, so that the curve is strictly increasing and a boundary placed on it
#: maps to a unique layer position.
FLAT_LAYER_WEIGHT = 1e-2


def _counts(value: Any, what: str) -> tuple[int, ...]:
    try:
        counts = tuple(operator.index(c) for c in value)
    except TypeError:
        raise ConfigError(f"{what} must be a sequence of ints, got {value!r}") from None
    return counts


class Workload(AbstractCostModel):
    """A cost model: a model as a per-layer table, plus the machine terms a ``Hardware`` needs besides stages.

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
        split_known: False when ``input_grad`` is a whole measured backward and ``weight`` 0 because
            the ``I``/``W`` split was never measured (``Calibration.workload`` of full-backward
            runs); its hardware is ``Hardware(split_known=False)`` and refuses ``I``/``W`` ops.
        full_backward: optional per-layer seconds of a full ``B`` where it is not ``I + W`` (a
            measured full backward); a stage's ``Hardware.full_backward`` sums its layers'.
        kind_overhead, setup, wind_down, send_cost, recv_cost: optional, passed to the hardware as
            they are (``Hardware``: per-kind overheads ``[4]``, the step's fixed time before its
            first op and after its last, the host time of a cross-device transfer on the device
            that sends it and on the one that receives it); ``None`` is the plain model.

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
    shared_static_bytes: Float[Array, ""] = eqx.field(converter=checked_float, default=0.0)
    shared_gradient_bytes: Float[Array, ""] = eqx.field(converter=checked_float, default=0.0)
    samples: float | None = eqx.field(static=True, default=None)
    layers_per_stage: tuple[int, ...] | None = eqx.field(static=True, default=None)
    split_known: bool = eqx.field(static=True, default=True)
    full_backward: Float[Array, " layers"] | None = None
    kind_overhead: Float[Array, "4"] | None = None
    setup: Float[Array, ""] | None = None
    wind_down: Float[Array, ""] | None = None
    send_cost: Float[Array, ""] | None = None
    recv_cost: Float[Array, ""] | None = None

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
            check_values(f"workload {name}", getattr(self, name))
        for name in _OPTIONAL:
            if getattr(self, name) is not None:
                check_values(f"workload {name}", getattr(self, name))
        if self.full_backward is not None and jnp.shape(self.full_backward) != shape:
            raise ConfigError(f"workload: full_backward has shape {jnp.shape(self.full_backward)}, forward has {shape}")
        if self.kind_overhead is not None and jnp.shape(self.kind_overhead) != (len(OVERHEAD_KINDS),):
            raise ConfigError(f"workload: kind_overhead has shape {jnp.shape(self.kind_overhead)}; give one value "
                              f"per kind {', '.join(OVERHEAD_KINDS)}")
        check_values("workload capacity", self.capacity, positive=True, allow_inf=True)
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
        split_known: bool = True,
        full_backward: Any = None,
        kind_overhead: Any = None,
        setup: Any = None,
        wind_down: Any = None,
        send_cost: Any = None,
        recv_cost: Any = None,
    ) -> Workload:
        """A workload from per-layer sequences (scalars broadcast to every layer).

        ``forward`` fixes the number of layers; ``weight`` defaults to 0 (``input_grad`` is then the
        whole backward). ``network`` defaults to an idealized one (no latency, infinite bandwidth).
        ``split_known=False``: the table's backward is unsplit (the class docstring).
        ``full_backward`` (per layer), ``kind_overhead`` (a mapping by kind or four values, as
        ``Hardware.from_times`` takes it), ``setup``, ``wind_down``, ``send_cost`` and
        ``recv_cost``: the class docstring; None leaves them out.
        """
        input_grad = _required("workload", "input_grad", input_grad)
        f = checked_float(forward)
        if f.ndim != 1 or f.shape[0] < 1:
            raise ConfigError(f"workload: forward must be a non-empty sequence of per-layer times, got shape "
                              f"{f.shape}")

        def layer(x: Any, name: str) -> Array:
            x = checked_float(x)
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
            output_bytes=layer(output_bytes, "output_bytes"), overhead=checked_float(overhead),
            capacity=checked_float(capacity), size=checked_float(size),
            network=Network.uniform() if network is None else network, samples=samples,
            layers_per_stage=None if layers_per_stage is None else _counts(layers_per_stage, "layers_per_stage"),
            shared_static_bytes=shared_static_bytes, shared_gradient_bytes=shared_gradient_bytes,
            split_known=bool(split_known),
            full_backward=None if full_backward is None else layer(full_backward, "full_backward"),
            kind_overhead=_kind_overhead(kind_overhead, overhead),
            setup=_optional(setup, "setup"), wind_down=_optional(wind_down, "wind_down"),
            send_cost=_optional(send_cost, "send_cost"), recv_cost=_optional(recv_cost, "recv_cost"),
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
        is dropped when one stage holds both (as ``hardware_from_model`` does).
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
            update=(jnp.asarray(update, dtype) * jnp.asarray(share, dtype) if isinstance(update, jax.core.Tracer)
                    else jax.device_put(np.asarray(update, dtype) * np.asarray(share, dtype))),
            static_bytes=jnp.asarray(costs.static_bytes, dtype),
            gradient_bytes=jnp.asarray(costs.gradient_bytes, dtype),
            activation_bytes=jnp.asarray(costs.activation_bytes, dtype),
            output_bytes=jnp.asarray(costs.output_bytes, dtype),
            overhead=overhead, capacity=device.memory if capacity is None else capacity,
            network=Network.uniform() if network is None else network,
            samples=float(model.microbatch_size), layers_per_stage=layers_per_stage,
            shared_static_bytes=costs.shared_parameters * model.bytes_per_parameter,
            shared_gradient_bytes=costs.shared_parameters * model.reduction_bytes,
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
        """Per-layer ``F + I + W`` seconds: the cost curve stage boundaries are placed on (NumPy for
        concrete curves: no eager program)."""
        forward, input_grad, weight = on_host((self.forward, self.input_grad, self.weight))
        return forward + input_grad + weight

    def boundaries(self, layers_per_stage: Sequence[int] | Array) -> Float[Array, "... stages+1"]:
        """Stage boundary positions ``[0, c_0, c_0 + c_1, ..., layers]`` of integer splits."""
        if not isinstance(layers_per_stage, (jax.Array, jax.core.Tracer)):  # sums of small integers: exact
            counts = np.asarray(layers_per_stage).astype(self.forward.dtype)
            zero = np.zeros((*counts.shape[:-1], 1), dtype=counts.dtype)
            return jax.device_put(np.concatenate([zero, np.cumsum(counts, axis=-1)], axis=-1))
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
        curves = {name: getattr(self, name) for name in _CURVES if getattr(self, name) is not None}
        if any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves((curves, x))):
            return _fields_at(curves, x)
        # Concrete: one compiled program per bucket of stage counts, not one per operation or per
        # workload: only the per-layer curves enter it, and more than one stage pads the boundaries
        # with copies of the last (empty stages past the real ones; every output is elementwise
        # in the boundaries, so the real stages' values are unchanged) to a power of two.
        n = x.shape[0]
        if n == 2:
            return _fields_compiled(curves, x)
        bounds = np.asarray(x)
        padded = np.concatenate([bounds, np.full(power_of_two(n - 1, STAGE_BUCKET) + 1 - n, bounds[-1])])
        out = _fields_compiled(curves, jax.device_put(padded))
        return {name: jax.device_put(np.asarray(v)[: n - 1]) for name, v in out.items()}  # host slices

    def fields(self, boundaries: Float[Array, " stages+1"], size: Any = None) -> dict[str, Any]:
        """Every ``Hardware`` field (``stage_fields`` plus overhead, size, capacity, network,
        ``split_known``, and the optional ``kind_overhead``, ``setup``, ``wind_down``,
        ``send_cost`` and ``recv_cost``); ``size`` (relative microbatch sizes) defaults to
        ``self.size``."""
        stage = self.stage_fields(boundaries)
        size = self.size if size is None else jnp.asarray(size, dtype=stage["forward"].dtype)
        return dict(stage, overhead=self.overhead, size=size, capacity=self.capacity, network=self.network,
                    split_known=self.split_known,
                    **{name: getattr(self, name) for name in _OPTIONAL if name != "full_backward"})

    def hardware(self, boundaries: Float[Array, " stages+1"], size: Any = None) -> Hardware:
        """``Hardware`` for stages between ``boundaries`` (see ``stage_fields``); ``size``
        defaults to ``self.size``."""
        return Hardware(**self.fields(boundaries, size))

    # -- the cost model (``AbstractCostModel``): the ``Hardware`` of the default split -----------------
    def priced(self, graph: Graph) -> Hardware:
        """The ``Hardware`` pricing ``graph``: this workload at its default split
        (``layers_per_stage``, uniform when ``None``)."""
        return self.hardware(self.default_boundaries(graph.stages))

    def tables(self, graph: Graph) -> CostTables:
        """``graph``'s cost rows under the default split (``priced``)."""
        return self.priced(graph).tables(graph)

    def check(self, graph: Graph) -> None:
        """The split check (``check_split_known``)."""
        check_split_known(self.split_known, graph)

    def per_stage(self, name: str, graph: Graph) -> Array:
        """``Hardware.per_stage`` of the default split."""
        return self.priced(graph).per_stage(name, graph)

    def per_microbatch(self, graph: Graph) -> Array:
        """``Hardware.per_microbatch`` of the default split."""
        return self.priced(graph).per_microbatch(graph)

    def per_device(self, graph: Graph) -> Array:
        """``Hardware.per_device`` of the default split."""
        return self.priced(graph).per_device(graph)

    def step_terms(self, graph: Graph) -> tuple[Array, Array]:
        """``Hardware.step_terms`` of the default split."""
        return self.priced(graph).step_terms(graph)


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
    (``hardware_from_model``): ``Workload.from_model(...).hardware(...)`` at the split's integer
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
    dtype = device.peak_flops.dtype  # the throughput's, without an eager multiply
    size = jnp.asarray(size, dtype=dtype)
    if microbatches is not None:
        if not is_positive_int(microbatches):
            raise ConfigError(f"from_model: microbatches must be a positive int, got {microbatches!r}")
        if size.ndim > 1 or (size.ndim == 1 and size.shape[0] != microbatches):
            raise ConfigError(f"from_model: size has shape {size.shape}, expected a scalar or [{microbatches}]")
        size = jnp.broadcast_to(size, (microbatches,))
    workload = Workload.from_model(model, device, network, overhead=overhead)
    hw = workload.hardware(workload.boundaries(tuple(rows.tolist())), size)
    return eqx.tree_at(lambda h: h.update, hw, jnp.asarray(update, dtype=dtype))  # per stage, as given


#: The per-layer curves ``Workload.stage_fields`` reads (``full_backward`` where given).
_CURVES = ("forward", "input_grad", "weight", "update", "static_bytes", "gradient_bytes", "activation_bytes",
           "output_bytes", "shared_static_bytes", "shared_gradient_bytes", "full_backward")
#: The optional fields (None: left out of the hardware).
_OPTIONAL = ("full_backward", "kind_overhead", "setup", "wind_down", "send_cost", "recv_cost")
#: Concrete boundaries of more than one stage are padded to a power of two stages, at least this.
STAGE_BUCKET = 32


def _fields_at(w: dict[str, Array], x: Float[Array, " stages+1"]) -> dict[str, Array]:
    """``Workload.stage_fields`` of the per-layer curves ``w`` (``_CURVES``) at boundaries ``x``."""
    def per_stage(q: Array) -> Array:
        return jnp.diff(_cumulative_at(q, x))

    static, gradient = per_stage(w["static_bytes"]), per_stage(w["gradient_bytes"])
    if x.shape[0] == 2:  # one stage holds the first and the last layer
        static = static - w["shared_static_bytes"]
        gradient = gradient - w["shared_gradient_bytes"]
    message = jnp.concatenate([jnp.zeros((1,), x.dtype), _boundary_bytes(w["output_bytes"], x[1:-1])])
    out = dict(forward=per_stage(w["forward"]), input_grad=per_stage(w["input_grad"]),
               weight=per_stage(w["weight"]), update=per_stage(w["update"]), message_bytes=message,
               gradient_bytes=gradient, static_bytes=static, activation_bytes=per_stage(w["activation_bytes"]))
    if w.get("full_backward") is not None:
        out["full_backward"] = per_stage(w["full_backward"])
    return out


#: ``_fields_at`` of concrete curves, compiled once per layer count and bucket of stage counts.
_fields_compiled = jax.jit(_fields_at)


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


def check_static_memory(workload: Workload, holder: np.ndarray, versions: np.ndarray, devices: int,
                        fixed: Sequence[int] | None = None) -> None:
    """Raise ``ConfigError`` when no split of the layers into stages can hold the static bytes.

    ``holder[p, s]`` is the device of stage ``s`` of pipeline ``p``; ``versions[p, s]`` the weight
    versions it holds. With ``fixed`` layers per stage the check is exact. Otherwise it is exact
    when every device holds one stage (a dynamic program over splits), and for other placements
    uses two necessary conditions: every device can hold the largest layer, and all devices
    together can hold every stage's static bytes.
    """
    static = concrete(workload.static_bytes)
    capacity = concrete(workload.capacity)
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

