"""The stacking plan and the memory model of a sweep.

Entries (one schedule under one communication mode) with equal ``Graph.structure`` and static
fields share one compiled evaluator; different structures are padded and stacked when the cost
model ``COMPILE_CELLS + sum over points of cells(padded sizes)`` says that is cheaper than compiling
each (an exact dynamic programme over runs of keys sorted by cells). Chunks are sized so that every
device's estimated working memory stays within the sweep's bound (``bytes_per_point``,
``bytes_per_graph``). Measured constants: see the package docstring.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .._caches import BoundedDict
from .._engine._evaluate import BATCH_CHUNK
from .._engine._graph import Graph, common_sizes
from .._engine._hardware import STAGE_FIELDS
from .._errors import ConfigError
from ..schedules import Schedule
from .variants import NETWORK_SCALARS, Variants

#: One compilation of a stack's evaluator, in evaluated cells: compile seconds x evaluated cells per
#: second of the same evaluator (``benchmarks/bench_sweep.py``, "compile in cells"; see the package
#: docstring).
COMPILE_CELLS = 1.9e9
#: Default bound on the evaluator's working memory per device, bytes, by backend. On CPU small
#: chunks stay in cache: 16-32 MiB chunks ran fastest on the 2-core benchmark machine (4 MiB and
#: 256 MiB were 20-50% slower); accelerators run the level scan as one kernel launch per level
#: per chunk, so they want large chunks.
DEFAULT_MAX_BYTES = {"cpu": 32 * 2**20}
DEFAULT_MAX_BYTES_ACCELERATOR = 2**30
#: Bytes of one float32 / int32 element.
_WORD = 4


@dataclass
class Entry:
    """One (schedule, communication mode): a graph and the index of its first table row."""

    choice: int
    schedule: Schedule
    mode: str
    graph: Graph
    variants: Variants
    row: int = 0
    memory_from: int = -1  # the entry whose peak memory and fit this one shares (same schedule and
    # hardware, another mode: memory does not depend on timing); -1: this entry computes them


def _stack_class(e: Entry) -> tuple:
    """Entries that can share one evaluator: graphs ``stack_graphs`` accepts together, hardware of
    one pytree structure (static network fields, pair matrices present or not)."""
    g, v = e.graph, e.variants
    return (g.communication, g.devices_per_node if g.devices_per_node < g.devices else None, v.data_parallel,
            tuple(sorted(v.leaves)))


def _key(e: Entry) -> tuple:
    """Entries that share one compiled function as they are: ``Graph.structure`` + static fields."""
    g = e.graph
    return (g.structure, g.devices, g.stages, g.pipelines, g.microbatches, g.steps, g.devices_per_node,
            _stack_class(e))


@dataclass(frozen=True)
class Sizes:
    """The array sizes of a graph that memory and work grow with (after padding: the maxima)."""

    nodes: int
    k: int
    levels: int
    width: int
    lane: int
    devices: int
    stages: int
    pipelines: int
    microbatches: int
    costs: int
    edge_costs: int

    @classmethod
    def of(cls, graph: Graph) -> Sizes:
        held = _SIZES.get(id(graph))  # graphs are cached across sweeps (graph_of): so are their sizes
        if held is not None and held[0] is graph:
            return held[1]
        sizes = common_sizes([graph])
        out = cls(**{name: sizes[name] for name in _SIZE_FIELDS})
        _SIZES[id(graph)] = (graph, out)
        return out

    def join(self, other: Sizes) -> Sizes:
        return Sizes(*(max(getattr(self, name), getattr(other, name)) for name in _SIZE_FIELDS))

    @property
    def rows(self) -> int:
        return self.nodes + self.width + 1

    @property
    def cells(self) -> int:
        """Evaluation work per point: the scan's level blocks plus the per-edge cost model."""
        return self.levels * self.width * self.k + self.rows * self.k


_SIZE_FIELDS = tuple(f.name for f in dataclasses.fields(Sizes))
_SIZES_KEPT = 4096
_SIZES: BoundedDict = BoundedDict(_SIZES_KEPT)  # id(graph) -> (graph, its sizes), oldest first


def bytes_per_point(sizes: Sizes, pairs: bool = False, normalisations: int = 1) -> int:
    """Estimated evaluator working memory per hardware variant of the graph being evaluated, bytes.

    The evaluator runs a chunk's graphs one after the other, each on all of the chunk's hardware
    with the batch last: per variant it holds the hardware leaves (input and normalised), the cost
    tables ``[costs + edge_costs, 2] + [microbatches]`` (and the evaluator's chunked copies), the
    memory model's per-lane terms (allocations, their prefix sums and gathers: about five) and a
    few per-stage and per-device terms; the hardware once per distinct normalisation in the stack
    (``normalisations``: one per schedule shape). The scan's own carry is per batch chunk, so it is counted
    per graph (``bytes_per_graph``). Calibrated against XLA's ``memory_analysis``
    (``benchmarks/bench_sweep.py``): a bound, not a forecast.
    """
    p_s = sizes.pipelines * sizes.stages
    hardware = len(STAGE_FIELDS) * p_s + sizes.microbatches + sizes.devices + 1 + len(NETWORK_SCALARS)
    hardware += 2 * sizes.devices**2 if pairs else 0
    tables = 2 * (sizes.costs + sizes.edge_costs) + sizes.microbatches
    words = (1 + normalisations) * hardware + 3 * tables + 5 * sizes.lane + 3 * p_s + 4 * sizes.devices + 16
    return _WORD * words


def bytes_per_graph(sizes: Sizes) -> int:
    """Bytes of one padded graph's int32 arrays (per node and per edge slot a dozen codes and
    indices, with room to spare for the cost tables) plus the level scan's working set on one batch
    chunk (``BATCH_CHUNK`` variants: finish times and a level's edge arguments and weights)."""
    words = sizes.rows * (16 + 8 * sizes.k) + 2 * sizes.levels + 3 * sizes.lane + 2 * sizes.pipelines * sizes.stages
    words += BATCH_CHUNK * (3 * sizes.rows + 4 * sizes.width * (sizes.k + 1))
    return _WORD * words


def plan_stacks(entries: Sequence[Entry], hardware: int, stacking: str) -> list[list[int]]:
    """Entry indices per stack (the stacking rule of the module docstring)."""
    by_key: dict[tuple, list[int]] = {}
    for i, e in enumerate(entries):
        by_key.setdefault(_key(e), []).append(i)
    if stacking == "never":
        return list(by_key.values())
    classes: dict[tuple, list[tuple]] = {}
    for key, members in by_key.items():
        classes.setdefault(_stack_class(entries[members[0]]), []).append(key)
    stacks = []
    for keys in classes.values():
        sizes = {key: Sizes.of(entries[by_key[key][0]].graph) for key in keys}
        if stacking == "always":
            stacks.append([i for key in keys for i in by_key[key]])
            continue
        keys = sorted(keys, key=lambda key: (sizes[key].cells, key))
        n = len(keys)
        best = [0.0] + [math.inf] * n  # best[j]: cheapest split of keys[:j]
        cut = [0] * (n + 1)
        for j in range(1, n + 1):
            joined, points = None, 0
            for i in range(j - 1, -1, -1):  # the run keys[i:j]
                joined = sizes[keys[i]] if joined is None else joined.join(sizes[keys[i]])
                points += len(by_key[keys[i]]) * hardware
                cost = best[i] + COMPILE_CELLS + points * joined.cells
                if cost < best[j]:
                    best[j], cut[j] = cost, i
        j = n
        while j > 0:
            i = cut[j]
            stacks.append([m for key in keys[i:j] for m in by_key[key]])
            j = i
    return stacks


#: Bytes per (graph, hardware) point of a chunk's outputs (makespan, busy, work, memory, fits).
OUT_BYTES = 5 * _WORD


@dataclass
class Chunking:
    graphs: int  # per chunk (a multiple of the device count when axis == 0)
    hardware: int  # per chunk (a multiple of the device count when axis == 1)
    axis: int
    bytes: int  # estimated per-device working memory


def chunking(n_graphs: int, n_hardware: int, per_point: int, per_graph: int, devices: int,
              max_bytes: int) -> Chunking:
    """Chunk sizes such that every device's ``graphs * (per_graph + hardware * OUT_BYTES) +
    hardware * per_point <= max_bytes`` (``graphs`` and ``hardware`` local to the device): a chunk's
    graphs are evaluated one after the other, each on all of the chunk's hardware."""
    if per_graph + per_point + OUT_BYTES > max_bytes:
        raise ConfigError(
            f"sweep: max_bytes={max_bytes} is below one point's working memory ({per_graph + per_point} bytes)"
        )

    def up(n: int) -> int:
        return -(-n // devices) * devices

    if n_hardware >= devices or per_graph + n_hardware * (per_point + OUT_BYTES) > max_bytes:
        # shard the hardware axis (padded to a multiple of the devices); every device holds the
        # chunk's graphs. Points per call (graphs x hardware) are largest with the bound split
        # about evenly between graphs and hardware: half for graphs first, the rest for hardware.
        graphs = min(n_graphs, max(1, max_bytes // 2 // per_graph))
        local = min(up(n_hardware) // devices, (max_bytes - graphs * per_graph) // (per_point + graphs * OUT_BYTES))
        if local < 1:
            graphs, local = 1, (max_bytes - per_graph) // (per_point + OUT_BYTES)
        graphs = max(1, min(n_graphs, (max_bytes - local * per_point) // (per_graph + local * OUT_BYTES)))
        return Chunking(graphs, local * devices, 1, graphs * (per_graph + local * OUT_BYTES) + local * per_point)
    per_local_graph = per_graph + n_hardware * OUT_BYTES
    local = min(up(n_graphs) // devices, (max_bytes - n_hardware * per_point) // per_local_graph)
    return Chunking(local * devices, n_hardware, 0, local * per_local_graph + n_hardware * per_point)
