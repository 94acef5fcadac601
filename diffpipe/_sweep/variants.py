"""Hardware variants of a sweep, normalised to each schedule's shapes, padded to a stack's sizes, and
turned back into a batched ``Hardware`` for the evaluator.

Which shapes a leaf may have (scalar, per stage, per pipeline and stage, ...) is decided by
``Hardware.per_stage``, ``per_microbatch`` and ``per_device``; here they are only traced, and the
variants stay numpy views with a leading batch axis until a chunk is evaluated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array

from .._caches import BoundedDict
from .._engine._hardware import OPTIONAL_PER_STAGE as OPTIONAL_PER_STAGE
from .._engine._hardware import STAGE_FIELDS, Hardware, Network, check_split_known
from .._errors import ConfigError
from ..schedules import Schedule

NETWORK_SCALARS = ("latency", "bandwidth", "inter_latency", "inter_bandwidth")
#: Optional Hardware leaves (None unless given): carried when every variant gives them.
OPTIONAL_SCALARS = ("setup", "wind_down")


@dataclass(frozen=True)
class Variants:
    """``B`` hardware variants as numpy arrays with a leading batch axis, normalised to one
    schedule's shapes: per-stage leaves ``[B, P, S]``, ``size [B, M]``, ``capacity [B, D]``,
    scalars ``[B]``, pairs ``[B, D, D]`` (or absent)."""

    leaves: Mapping[str, np.ndarray]
    data_parallel: int
    data_parallel_link: str = "inter"

    @property
    def count(self) -> int:
        return self.leaves["overhead"].shape[0]


class ShapeMismatch(ConfigError):
    """A hardware variant whose shapes do not fit one schedule: that schedule is skipped."""


class SplitUnknown(ConfigError):
    """A hardware variant that knows only full backwards (``Hardware.split_known`` False) and a
    schedule with ``I``/``W`` ops: that schedule is skipped (its stacked leaves would drop the flag
    and price ``I`` as the whole backward, ``W`` as free)."""


def _batch_size(hw: Hardware) -> int | None:
    """A batched Hardware (every leaf with a leading batch axis) has a 1-D ``overhead``."""
    return int(hw.overhead.shape[0]) if hw.overhead.ndim == 1 else None


#: Leaf -> the ``Hardware`` method (and its leading arguments) that broadcasts it against a graph.
_RULES = {**{name: ("per_stage", name) for name in STAGE_FIELDS}, "size": ("per_microbatch",),
          "capacity": ("per_device",)}
#: (leaf, its shape per variant, schedule sizes) -> the broadcast shape per variant, or the error:
#: tracing ``Hardware.per_*`` costs about a millisecond, and a sweep asks the same question often.
_TARGETS: BoundedDict = BoundedDict(65_536)


def _broadcast(name: str, raw: Any, batch: int | None, schedule: Schedule, per: Callable[..., Array],
               dtype) -> np.ndarray:
    """Leaf ``raw`` broadcast as ``per`` (``Hardware.per_stage`` and its siblings: the one home of the
    shape rules and their errors) broadcasts it, with a leading batch axis. ``per`` is only traced
    on one variant (``jax.eval_shape``): the result is a numpy view, so a million variants cost no
    copies."""
    x = np.asarray(raw, dtype=dtype)
    x = x[None] if batch is None else x
    sizes = (schedule.pipelines, schedule.stages, schedule.microbatches, schedule.devices)
    key = (name, x.shape[1:], sizes)
    if key not in _TARGETS:
        one = jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
        try:
            _TARGETS[key] = jax.eval_shape(lambda leaf: per(leaf, schedule), one).shape
        except ConfigError as error:
            _TARGETS[key] = str(error)
    target = _TARGETS[key]
    if isinstance(target, str):
        raise ShapeMismatch(target)
    aligned = x.reshape((x.shape[0],) + (1,) * (len(target) - x.ndim + 1) + x.shape[1:])  # numpy's right alignment
    return np.broadcast_to(aligned, (x.shape[0], *target))


def _normalise(hw: Hardware, schedule: Schedule) -> Variants:
    """``hw`` (batched or one variant) as ``Variants`` at ``schedule``'s sizes."""
    batch = _batch_size(hw)
    dtype = np.asarray(hw.forward).dtype
    for x in jax.tree.leaves(eqx.filter(hw, eqx.is_array)):
        if batch is not None and (x.ndim == 0 or x.shape[0] != batch):
            raise ConfigError(f"hardware: a batched leaf has shape {x.shape}, expected a leading axis of {batch}")
    leaves: dict[str, np.ndarray] = {}
    rules = dict(_RULES)
    for name in OPTIONAL_PER_STAGE:
        if getattr(hw, name) is not None:
            rules[name] = ("per_stage", name)
    for name, (method, *args) in rules.items():
        def per(leaf: Array, graph: Any, name: str = name, method: str = method, args: list = args) -> Array:
            return getattr(eqx.tree_at(lambda h: getattr(h, name), hw, leaf), method)(*args, graph)

        leaves[name] = _broadcast(name, getattr(hw, name), batch, schedule, per, dtype)
    net = hw.network
    scalars = {"overhead": hw.overhead, **{f"network {n}": getattr(net, n) for n in NETWORK_SCALARS},
               **{n: getattr(hw, n) for n in OPTIONAL_SCALARS if getattr(hw, n) is not None}}
    for name, value in scalars.items():
        x = np.asarray(value, dtype=dtype)
        if x.shape != (() if batch is None else (batch,)):
            raise ShapeMismatch(f"hardware: {name} has shape {x.shape[batch is not None:]}, a sweep needs a scalar")
        leaves[name.removeprefix("network ")] = x.reshape(-1)
    if hw.kind_overhead is not None:
        x = np.asarray(hw.kind_overhead, dtype=dtype)
        leaves["kind_overhead"] = x[None] if batch is None else x
    d = schedule.devices
    for name in ("pair_latency", "pair_bandwidth"):
        value = getattr(net, name)
        if value is not None:
            x = np.asarray(value, dtype=dtype)
            x = x[None] if batch is None else x
            if x.shape[1:] != (d, d):
                raise ShapeMismatch(f"hardware: network {name} has shape {x.shape[1:]}, but the "
                                     f"{schedule.family} schedule has {d} devices")
            leaves[name] = x
    return Variants(leaves, net.data_parallel, net.data_parallel_link)


def _concatenate(variants: Sequence[Variants]) -> Variants:
    first = variants[0]
    for v in variants[1:]:
        if set(v.leaves) != set(first.leaves):
            differ = sorted(set(v.leaves) ^ set(first.leaves))
            raise ConfigError(f"hardware variants differ in which optional leaves they give: {', '.join(differ)}")
        ours = (v.data_parallel, v.data_parallel_link)
        theirs = (first.data_parallel, first.data_parallel_link)
        if ours != theirs:
            raise ConfigError(
                f"hardware variants differ in network data_parallel/data_parallel_link: "
                f"{theirs} vs {ours}"
            )
    if len(variants) == 1:
        return first
    leaves = {k: np.concatenate([v.leaves[k] for v in variants]) for k in first.leaves}
    return Variants(leaves, first.data_parallel, first.data_parallel_link)


class HardwareSource:
    """Resolves the ``hardware`` argument to ``Variants`` per schedule (cached by shape when the
    hardware does not depend on the schedule)."""

    def __init__(self, hardware: Any):
        if hardware is None:
            raise ConfigError("sweep: hardware is required (a Hardware, a list of Hardware, or a function)")
        self.function = callable(hardware) and not isinstance(hardware, (Hardware, Sequence))
        if not self.function:
            self._check(hardware, "hardware")
        self.hardware = hardware
        self.cache: dict[tuple, Variants] = {}
        self.count: int | None = None

    @staticmethod
    def _check(hardware: Any, what: str) -> None:
        items = hardware if isinstance(hardware, Sequence) else [hardware]
        if not items:
            raise ConfigError(f"sweep: the grid is empty: {what} is an empty list")
        for h in items:
            if not isinstance(h, Hardware):
                raise ConfigError(f"sweep: {what} must be Hardware, got {type(h).__name__}")
            if isinstance(hardware, Sequence) and _batch_size(h) is not None:
                raise ConfigError(f"sweep: {what} lists a batched Hardware; give one batched Hardware or a list")

    def variants(self, schedule: Schedule) -> Variants:
        if self.function:
            hardware = self.hardware(schedule)
            self._check(hardware, f"hardware({schedule.family}) result")
        else:
            hardware = self.hardware
        items = hardware if isinstance(hardware, Sequence) else [hardware]
        for h in items:
            try:
                check_split_known(h.split_known, schedule)
            except ConfigError as error:
                raise SplitUnknown(str(error)) from None
        if not self.function:
            key = (schedule.pipelines, schedule.stages, schedule.microbatches, schedule.devices)
            if key in self.cache:
                return self.cache[key]
        out = _concatenate([_normalise(h, schedule) for h in items])
        if self.count is None:
            self.count = out.count
        elif out.count != self.count:
            raise ConfigError(
                f"sweep: the hardware function gave {out.count} variants for a {schedule.family} schedule "
                f"and {self.count} for another; the hardware index must mean the same variant everywhere"
            )
        if not self.function:
            self.cache[key] = out
        return out


def pad_variants(v: Variants, index: np.ndarray, p: int, s: int, m: int, d: int) -> dict[str, np.ndarray]:
    """The variants ``index`` (one chunk: host memory stays proportional to the chunk), padded to a
    stack's sizes: unread padding is 0, capacity ``inf``, bandwidth ``inf``."""
    out = {}
    for name, x in v.leaves.items():
        x = x[index]
        if name in STAGE_FIELDS or name in OPTIONAL_PER_STAGE:
            target, fill = (p, s), 0.0
        elif name == "size":
            target, fill = (m,), 0.0
        elif name == "capacity":
            target, fill = (d,), np.inf
        elif name in ("pair_latency", "pair_bandwidth"):
            target, fill = (d, d), 0.0 if name == "pair_latency" else np.inf
        else:
            out[name] = x
            continue
        padded = np.full((x.shape[0], *target), fill, dtype=x.dtype)
        padded[(slice(None), *(slice(0, n) for n in x.shape[1:]))] = x
        out[name] = padded
    return out


def as_hardware(leaves: Mapping[str, np.ndarray], v: Variants) -> Hardware:
    """A Hardware over numpy leaves (cheap value checks on the host; sharded afterwards); the
    topology is the stacked graph's."""
    network = Network(leaves["latency"], leaves["bandwidth"], leaves["inter_latency"], leaves["inter_bandwidth"],
                      leaves.get("pair_latency"), leaves.get("pair_bandwidth"),
                      data_parallel=v.data_parallel, data_parallel_link=v.data_parallel_link)
    names = (*STAGE_FIELDS, "overhead", "size", "capacity", "kind_overhead", *OPTIONAL_PER_STAGE, *OPTIONAL_SCALARS)
    fields = {name: leaves[name] for name in names if name in leaves}
    return Hardware(**fields, network=network)
