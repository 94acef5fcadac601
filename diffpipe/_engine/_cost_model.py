"""The cost model: an equinox abstract module that prices a ``Graph``, and its ``CostTables``.

A cost model subclasses ``AbstractCostModel`` (as diffrax's solvers subclass ``AbstractSolver``)
and implements ``tables(graph) -> CostTables``: a node lasts ``base + size[m] x per_size`` of its
cost row (``Graph.node_cost``), a transfer edge delays by ``edge_base + size[m] x edge_per_size``
(``Graph.edge_cost``). That is all ``makespan`` needs. ``simulate`` also reads what the model
holds in memory and sends (``per_stage``, ``per_microbatch``, ``per_device``), the step's own terms
(``step_terms``) and the graph it compiles a ``Schedule`` to (``compile_schedule``); their defaults
are those of ``Hardware.from_times``: no bytes held or sent, unit sizes, unbounded memory, no
setup or wind-down, one node unless told. The communication mode and the topology (devices per
node) are the graph's, never the model's.

``Hardware`` is the built-in cost model; a ``Workload`` (the transformer model, or any measured
per-layer table) is another, priced as the ``Hardware`` of its default split. A new cost model is
one subclass (docs/architecture.md, "Recipes"; ``tests/test_extending.py``).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._errors import ConfigError
from ._graph import Graph, compile

if TYPE_CHECKING:
    from ..schedules import Schedule


class CostTables(eqx.Module):
    """Cost rows of a graph under one cost model (or a batch, along the last axis after
    ``batch_last``): a node lasts ``base[row] + size[microbatch] * per_size[row]``, a transfer edge
    delays by ``edge_base[row] + size[microbatch] * edge_per_size[row]``."""

    base: Float[Array, "costs ..."]
    per_size: Float[Array, "costs ..."]
    edge_base: Float[Array, "edge_costs ..."]
    edge_per_size: Float[Array, "edge_costs ..."]
    size: Float[Array, "microbatches ..."]

    def batch_last(self, batched: bool = False) -> CostTables:
        """Unbatched tables get a trailing batch axis of 1; batched ones (leading axis) move it last."""
        if batched:
            return jax.tree.map(lambda x: jnp.moveaxis(x, 0, -1), self)
        return jax.tree.map(lambda x: x[..., None], self)

    def expand(self, graph: Graph) -> tuple[Float[Array, "nodes batch"], Float[Array, "nodes k batch"]]:
        """Per-node durations and per-edge delays (batch last)."""
        size = self.size[graph.microbatch]
        dur = self.base[graph.node_row] + size * self.per_size[graph.node_row]
        delay = self.edge_base[graph.edge_row] + size[:, None, :] * self.edge_per_size[graph.edge_row]
        return dur, delay


#: The per-stage byte terms ``simulate`` reads (``AbstractCostModel.per_stage``).
BYTE_TERMS = ("activation_bytes", "static_bytes", "message_bytes")


class AbstractCostModel(eqx.Module):
    """Prices every op and transfer of a graph (see the module docstring). Subclasses implement
    ``tables``; the other methods have the defaults of a model of time alone."""

    @abc.abstractmethod
    def tables(self, graph: Graph) -> CostTables:
        """The cost rows of ``graph`` (``Graph.node_cost`` / ``edge_cost``)."""

    @property
    def dtype(self) -> Any:
        """The float type the model computes in: that of its first float leaf (float32 by default)."""
        for leaf in jax.tree.leaves(self):
            if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating):
                return leaf.dtype
        return jnp.dtype(jnp.float32)

    def compile_schedule(self, schedule: Schedule, *, communication: Any = "overlap",
                         devices_per_node: int | None = None, gradient_sync: bool = False) -> Graph:
        """``schedule`` compiled under ``communication`` (a mode name or an
        ``AbstractCommunication``) for ``devices_per_node`` devices per node (default: one node):
        the mode and the topology are the graph's, which ``tables`` reads."""
        return compile(schedule, communication=communication, devices_per_node=devices_per_node,
                       gradient_sync=gradient_sync)

    def check(self, graph: Graph) -> None:
        """Eager checks of ``graph`` against this model, before anything is traced: one
        ``ConfigError`` line naming the culprit (default: none)."""

    def recheck(self) -> None:
        """Rerun the model's eager value checks, which name the culprit, after a check traced inside
        a program failed: each field's that is a cost model (``recheck``) or another module (a
        ``Network``: ``__check_init__``), then this model's ``__check_init__``."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, AbstractCostModel):
                value.recheck()
            elif isinstance(value, eqx.Module) and hasattr(value, "__check_init__"):
                value.__check_init__()
        if hasattr(self, "__check_init__"):
            self.__check_init__()

    def per_stage(self, name: str, graph: Graph) -> Float[Array, "pipelines stages"]:
        """Per stage, the bytes ``name`` (one of ``BYTE_TERMS``: stored activations of a microbatch
        of size 1, bytes held for the step, bytes of a boundary message); default 0."""
        if name not in BYTE_TERMS:
            raise ConfigError(f"cost model: per_stage {name!r} is not one of {', '.join(BYTE_TERMS)}")
        return jnp.zeros((graph.pipelines, graph.stages), self.dtype)

    def per_microbatch(self, graph: Graph) -> Float[Array, " microbatches"]:
        """Per microbatch, its relative size (scales its activation and message bytes); default 1."""
        return jnp.ones((graph.microbatches,), self.dtype)

    def per_device(self, graph: Graph) -> Float[Array, " devices"]:
        """Per device, its memory capacity in bytes; default unbounded."""
        return jax.device_put(np.full((graph.devices,), np.inf, self.dtype))  # no eager op to compile

    def step_terms(self, graph: Graph) -> tuple[Float[Array, " nodes"], Float[Array, " nodes"]]:
        """Per node, the part of its duration (within ``tables``) that is the step's set-up and
        wind-down rather than its own work; default none."""
        zero = jnp.zeros(graph.kind.shape, self.dtype)
        return zero, zero


__all__ = ["AbstractCostModel", "CostTables"]
