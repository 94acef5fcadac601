"""The cost-model protocol: anything that prices a ``Graph``'s ops and transfers.

A cost model answers ``tables(graph) -> CostTables`` (``Hardware.tables``' rows: a node lasts
``base + size[m] x per_size``, a transfer edge delays by ``edge_base + size[m] x edge_per_size``).
``Hardware`` (built by ``Hardware.from_times`` or ``hardware_from_model``) is one; a ``Workload``
(the transformer model, or any measured per-layer table) is another, priced at its default split.
A new cost model is one class with that method (docs/architecture.md, "Recipes").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ._graph import Graph
    from ._hardware import CostTables


@runtime_checkable
class CostModel(Protocol):
    """Prices every op and transfer of a graph (see the module docstring)."""

    def tables(self, graph: Graph) -> CostTables:
        """The cost rows of ``graph`` (``Graph.node_cost`` / ``edge_cost``)."""
        ...


__all__ = ["CostModel"]
