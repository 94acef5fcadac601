"""``sweep``: exhaustive what-if evaluation of discrete pipeline choices against hardware variants.

A sweep crosses schedule family x devices x microbatches x family options (chunks, waves, ...) x
placement variants (greedy list schedules over named placements) x communication mode, and
evaluates every resulting schedule on every hardware variant with the exact simulator. The
result is a plain table (``SweepResult``: numpy columns, CSV/JSON/Markdown, Pareto front, best per
hardware). No pandas.

How the work is organised (DESIGN.md, "Knobs, optimization and sweeps"):

1. **Grouping.** Each (schedule, mode) compiles to a ``Graph``. The sweep's evaluator (the exact
   simulator's batched fast path plus busy time and peak memory), like ``diffpipe.makespan``, is an
   ``eqx.filter_jit`` function whose cache key is the graph's array shapes (``Graph.structure``)
   plus its static fields (devices, stages, pipelines, microbatches, steps, communication,
   devices per node): graphs with equal keys share one compiled function, evaluated on the
   batched fast path (hardware batch last inside).
2. **Stacking rule.** Different keys can still share one compiled function by padding every graph
   to common sizes (``pad_graph``; padding never changes a result). That costs evaluation time on
   the padding and saves a compilation. The cost of evaluating a set of keys as one stack is
   modelled as ``COMPILE_CELLS + sum over its points of cells(padded sizes)``, where
   ``cells = levels * width * k + rows * k`` counts the scan's per-level block updates plus the
   cost model's per-edge work, and ``COMPILE_CELLS`` is one compilation expressed in evaluated cells
   (measured, see below). Keys of one communication setting are sorted by their cells and split
   into contiguous runs by an exact dynamic programme minimising the total cost: a run is padded
   and stacked; a run of one key is evaluated as is. ``stacking="never"`` compiles one function
   per key; ``stacking="always"`` one per communication setting.
3. **Chunks with a stated memory bound.** Each stack is evaluated in chunks of ``[graphs,
   hardware]`` points of one fixed shape (the last chunk is padded by repeating a point, so a stack
   compiles once). The evaluator's working memory per point is estimated from the padded graph's
   sizes by ``bytes_per_point`` (``benchmarks/bench_sweep.py`` compares it with XLA's own memory
   analysis: the estimate is 2.2-2.5x XLA's arguments + outputs + temporaries) and per graph by
   ``bytes_per_graph``; a chunk is sized so that on every device
   ``graphs_on_device * bytes_per_graph + points_on_device * bytes_per_point <= max_bytes``.
   ``SweepResult.chunk_bytes`` states the largest estimate used.
4. **Scale-out.** The chunk's batch axis (the hardware axis when there are at least as many
   hardware variants as devices, else the graph axis) is sharded over every device JAX sees
   (``jax.sharding.NamedSharding`` on a 1-D ``Mesh`` over ``jax.devices()``, padded to a multiple
   of the device count) and each device evaluates its slice with ``jax.shard_map``: no
   communication. Multi-host: call ``jax.distributed.initialize()`` in every process first and run
   the same ``sweep`` call in every process; ``jax.devices()`` then spans all hosts, each process
   feeds its own devices (``jax.make_array_from_callback``) and every process receives the whole
   table. Launch example::

       # on each of 2 hosts (process_id 0 and 1); SLURM, TPU pods and Kubernetes auto-detect the
       # arguments: jax.distributed.initialize() then needs none
       python - <<'EOF'
       import jax
       jax.distributed.initialize(coordinator_address="host0:12345", num_processes=2, process_id=PID)
       import diffpipe as dp
       result = dp.sweep(hardware, families=["1f1b", "zb-h1"], devices=[4, 8], microbatches=[8, 16, 32])
       if jax.process_index() == 0:
           result.to_csv("sweep.csv")
       EOF

   See docs/scale-out.md.

Measured constants (2-core CPU shared with other jobs, jax 0.10, float32): compiling one stack's
evaluator takes 4-7 s; evaluation runs at 2.5e7-1e8 cells per second (time per point tracks
``levels * width * k`` within about 2x across the families); so ``COMPILE_CELLS = 1.5e8``, about
4 s of evaluation. On such a machine padding a small graph into a stack with a large one pays off
until a few tens of thousands of hardware variants per graph.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array

from ._errors import ConfigError, ScheduleError
from ._evaluate import finish_times, sink_max
from ._graph import COMMUNICATION_MODES, KIND_CODES, PAD, Graph, common_sizes, compile, pad_graph
from ._hardware import Hardware, Network
from ._io import write_atomic
from ._simulate import _tables, peak_memory
from .schedules import Placement, Schedule, get
from .schedules import family as family_of
from .schedules._list_scheduler import PRIORITIES, list_schedule

#: One compilation of a stack's evaluator, in evaluated cells (see the module docstring): ~4 s of
#: compile time at ~4e7 cells/s on a 2-core CPU.
COMPILE_CELLS = 1.5e8
#: Points from which a sweep shows a progress bar by default (when stderr is a terminal).
LONG_RUN = 100_000
#: Default bound on the evaluator's working memory per device, bytes, by backend. On CPU small
#: chunks stay in cache: 16-32 MiB chunks ran fastest on the 2-core benchmark machine (4 MiB and
#: 256 MiB were 20-50% slower); accelerators run the level scan as one kernel launch per level
#: per chunk, so they want large chunks.
DEFAULT_MAX_BYTES = {"cpu": 32 * 2**20}
DEFAULT_MAX_BYTES_ACCELERATOR = 2**30
#: Bytes of one float32 / int32 element.
_WORD = 4
#: Placement variants, scheduled by the greedy list scheduler (``list_schedule``).
PLACEMENTS = ("linear", "loop", "v", "wave", "mirrored")
#: Hardware leaves given per stage, ``[pipelines, stages]`` after normalisation.
_PER_STAGE = ("forward", "backward", "weight", "update", "message_bytes", "gradient_bytes", "static_bytes",
              "activation_bytes")
_NETWORK_SCALARS = ("latency", "bandwidth", "inter_latency", "inter_bandwidth")
#: Columns of a ``SweepResult``, in table order.
COLUMNS = ("family", "options", "devices", "microbatches", "stages", "communication", "hardware", "makespan",
           "throughput", "bubble_ratio", "peak_memory", "fits")


# ------------------------------------------------------------------------------------------------
# The result table
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class SweepResult:
    """The table of a sweep: one row per evaluated (schedule, communication mode, hardware variant).

    Columns (numpy arrays of equal length, ``columns[name]``; also ``result[name]``):

    - ``family``, ``options`` (``"chunks=2"``-style, sorted, ``""`` for none), ``devices``,
      ``microbatches`` (all microbatches of the window: ``K * N`` for asynchronous schedules),
      ``stages``, ``communication``, ``hardware`` (index of the hardware variant);
    - ``makespan``: seconds of one step (of the unrolled window for asynchronous schedules), the
      exact simulator's value (``diffpipe.makespan``);
    - ``throughput``: microbatches per second, ``sum_m size[m] / makespan``: the hardware's
      relative microbatch sizes summed over every microbatch of the window (so with ``size = 1``,
      microbatches per step over the step time). Multiply by samples per microbatch for samples/s.
      Unlike the makespan it compares schedules with different microbatch counts or windows;
    - ``bubble_ratio``: idle fraction of ``devices x makespan`` (as ``diffpipe.simulate``);
    - ``peak_memory``: the largest per-device peak, bytes (static + stored activations);
    - ``fits``: whether every device's peak is within its ``capacity``.

    Attributes:
        skipped: one mapping per combination that was not evaluated (``family``, ``options``,
            ``devices``, ``microbatches``, ``communication``, ``reason``), e.g. a family rejecting a size.
        max_bytes: the memory bound per device the sweep was given; ``chunk_bytes`` the largest
            estimated per-device working memory of a chunk actually used (``<= max_bytes``).
        devices_used: JAX devices the chunks were sharded over; ``compiled``: stacks evaluated
            (each compiles one function); ``hardware_variants``: number of hardware variants.
    """

    columns: Mapping[str, np.ndarray]
    skipped: tuple[Mapping[str, Any], ...] = ()
    max_bytes: int = 0
    chunk_bytes: int = 0
    devices_used: int = 1
    compiled: int = 0
    hardware_variants: int = 0
    option_values: tuple[Mapping[str, Any], ...] = field(default=(), repr=False)

    def __len__(self) -> int:
        return len(self.columns["makespan"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def __repr__(self) -> str:
        return (f"SweepResult({len(self)} points, {len(self.skipped)} skipped, "
                f"{self.hardware_variants} hardware variants)")

    # -- selection ------------------------------------------------------------------------------
    def where(self, mask: Any) -> SweepResult:
        """The rows where ``mask`` (a boolean array over rows, or row indices) holds, in that order."""
        index = np.asarray(mask)
        if index.dtype == bool:
            if index.shape != (len(self),):
                raise ConfigError(f"where: mask has shape {index.shape}, the table has {len(self)} rows")
            index = np.flatnonzero(index)
        columns = {name: value[index] for name, value in self.columns.items()}
        return self._replace(columns)

    def filter(self, **equals: Any) -> SweepResult:
        """Rows whose columns equal the given values, e.g. ``filter(family="1f1b", hardware=0)``."""
        mask = np.ones(len(self), dtype=bool)
        for name, value in equals.items():
            if name not in self.columns:
                raise ConfigError(f"filter: no column {name!r}; columns: {', '.join(COLUMNS)}")
            mask &= self.columns[name] == value
        return self.where(mask)

    def rows(self) -> list[dict[str, Any]]:
        """Every row as a dict of plain Python values (``options`` as a dict when known)."""
        header = self._header()
        values = {name: self.columns[name].tolist() for name in header}
        entry = self.columns["_entry"].tolist() if "_entry" in self.columns and self.option_values else None
        out = []
        for i in range(len(self)):
            row = {name: values[name][i] for name in header}
            if entry is not None:
                row["options"] = dict(self.option_values[entry[i]])
            out.append(row)
        return out

    def _replace(self, columns: Mapping[str, np.ndarray]) -> SweepResult:
        return SweepResult(columns, self.skipped, self.max_bytes, self.chunk_bytes, self.devices_used,
                           self.compiled, self.hardware_variants, self.option_values)

    # -- analysis ---------------------------------------------------------------------------------
    def _time(self, metric: str) -> np.ndarray:
        """A cost to minimise: the makespan, or the time per microbatch (``1 / throughput``)."""
        if metric == "makespan":
            return self.columns["makespan"].astype(np.float64)
        if metric == "throughput":
            return -self.columns["throughput"].astype(np.float64)
        raise ConfigError(f"metric {metric!r} is not 'throughput' or 'makespan'")

    def pareto(self, *, metric: str = "throughput", per_hardware: bool = True) -> SweepResult:
        """The points no other point beats in both time and ``peak_memory``.

        A point is dominated when another has no more time and no more memory, and strictly less of
        one. ``metric="throughput"`` (default) measures time per microbatch (``1 / throughput``),
        which compares schedules with different microbatch counts; ``"makespan"`` the step time.
        With ``per_hardware`` (default) the front is taken within each hardware variant (a schedule
        is chosen for a machine); otherwise over all rows. Sorted by hardware, then time.
        """
        time = self._time(metric)
        memory = self.columns["peak_memory"].astype(np.float64)
        groups = self.columns["hardware"] if per_hardware else np.zeros(len(self), dtype=np.int64)
        order = np.lexsort((memory, time, groups))
        keep = []
        current, best_memory, best_time = None, math.inf, math.inf
        for i in order.tolist():
            if groups[i] != current:
                current, best_memory, best_time = groups[i], math.inf, math.inf
            if memory[i] < best_memory or (memory[i] == best_memory and time[i] == best_time):
                keep.append(i)
                best_memory, best_time = memory[i], time[i]
        return self.where(np.asarray(keep, dtype=np.int64))

    def best(self, k: int = 1, *, metric: str = "throughput", fits_only: bool = True) -> SweepResult:
        """The ``k`` best points of every hardware variant, ranked (a ``rank`` column, 1 = best).

        Ranked by highest throughput (default) or lowest makespan, ties by lower peak memory, then
        table order. With ``fits_only`` (default) only points whose memory fits are ranked; a
        variant on which nothing fits has no rows.
        """
        if not isinstance(k, int) or k < 1:
            raise ConfigError(f"best: k must be a positive int, got {k!r}")
        time = self._time(metric)
        memory = self.columns["peak_memory"].astype(np.float64)
        hardware = self.columns["hardware"]
        candidates = np.flatnonzero(self.columns["fits"]) if fits_only else np.arange(len(self))
        order = candidates[np.lexsort((candidates, memory[candidates], time[candidates], hardware[candidates]))]
        picked, ranks = [], []
        previous, rank = None, 0
        for i in order.tolist():
            rank = rank + 1 if hardware[i] == previous else 1
            previous = hardware[i]
            if rank <= k:
                picked.append(i)
                ranks.append(rank)
        out = self.where(np.asarray(picked, dtype=np.int64))
        columns = dict(out.columns)
        columns["rank"] = np.asarray(ranks, dtype=np.int32)
        return out._replace(columns)

    # -- formats ----------------------------------------------------------------------------------
    def _header(self) -> list[str]:
        return [*COLUMNS, "rank"] if "rank" in self.columns else list(COLUMNS)

    def to_csv(self, path: Any = None) -> str:
        """The table as CSV (header row, one row per point; floats at full precision). Written to
        ``path`` when given; the text is returned either way."""
        header = self._header()
        values = [self.columns[c].tolist() for c in header]
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(zip(*values))
        text = buffer.getvalue()
        if path is not None:
            write_atomic(path, text, "to_csv")
        return text

    def to_json(self, path: Any = None) -> str:
        """``{"columns", "points": [row dicts], "skipped", "max_bytes", "chunk_bytes", ...}`` as
        JSON (``options`` as an object; non-finite numbers as strings). Written to ``path`` when
        given; the text is returned either way."""
        def clean(x: Any) -> Any:
            if isinstance(x, float) and not math.isfinite(x):
                return str(x)
            return x

        points = [{k: clean(v) for k, v in row.items()} for row in self.rows()]
        doc = {
            "columns": self._header(), "points": points, "skipped": [dict(s) for s in self.skipped],
            "max_bytes": self.max_bytes, "chunk_bytes": self.chunk_bytes, "devices_used": self.devices_used,
            "compiled": self.compiled, "hardware_variants": self.hardware_variants,
            "throughput_unit": "microbatches per second (sum of relative microbatch sizes / makespan)",
        }
        text = json.dumps(doc, indent=1, default=_json_default)
        if path is not None:
            write_atomic(path, text, "to_json")
        return text

    def to_markdown(self, limit: int | None = None) -> str:
        """A GitHub-flavoured Markdown table (first ``limit`` rows when given), then the skipped
        combinations as a list."""
        header = self._header()
        rows = self.columns
        n = len(self) if limit is None else min(limit, len(self))
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        for i in range(n):
            cells = [_format(c, rows[c][i]) for c in header]
            lines.append("| " + " | ".join(cells) + " |")
        if n < len(self):
            lines.append(f"\n({len(self) - n} more rows)")
        if self.skipped:
            lines.append("\nSkipped:\n")
            for s in self.skipped:
                what = " ".join(f"{k}={s[k]}" for k in ("family", "options", "devices", "microbatches",
                                                         "communication") if s.get(k) not in (None, ""))
                lines.append(f"- {what}: {s['reason']}")
        return "\n".join(lines) + "\n"


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


def _format(column: str, value: Any) -> str:
    if column in ("makespan", "throughput", "bubble_ratio"):
        return f"{float(value):.6g}"
    if column == "peak_memory":
        return f"{float(value):.4g}"
    text = str(value)
    return text.replace("|", "\\|") if text else "-"


# ------------------------------------------------------------------------------------------------
# The grid of discrete choices
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Choice:
    family: str
    options: tuple[tuple[str, Any], ...]
    devices: int
    microbatches: int
    make: Callable[[], Schedule] = field(compare=False)

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.options)


def _values(name: str, value: Any) -> list:
    """A grid axis: a scalar becomes one value; a sequence (or range) its values; never empty."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        return [value]
    values = list(value)
    if not values:
        raise ConfigError(f"sweep: the grid is empty: {name} has no values")
    return values


def _sizes(name: str, value: Any) -> list[int]:
    values = _values(name, value)
    for v in values:
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"sweep: {name} must be positive ints, got {v!r}")
    return [int(v) for v in values]


def _option_grid(names: Sequence[str], declared: Mapping[str, Sequence[str]], options: Mapping[str, Any]):
    """Per family, a list of option dicts (the cross product of its grid axes)."""
    shared, per_family = {}, {}
    known = {o for opts in declared.values() for o in opts}
    for key, value in options.items():
        if key in declared:
            if not isinstance(value, Mapping):
                raise ConfigError(f"sweep: options[{key!r}] must map option names to values, got {value!r}")
            for option in value:
                if option not in declared[key]:
                    raise ConfigError(f"sweep: {option!r} is not an option of {key} "
                                      f"(its options: {', '.join(declared[key]) or 'none'})")
            per_family[key] = {o: _values(f"options[{key!r}][{o!r}]", v) for o, v in value.items()}
        elif key in known:
            shared[key] = _values(f"options[{key!r}]", value)
        else:
            raise ConfigError(
                f"sweep: option {key!r} is neither a selected family nor an option of one "
                f"(options: {', '.join(sorted(known)) or 'none'})"
            )
    grids = {}
    for name in names:
        axes = {o: v for o, v in shared.items() if o in declared[name]}
        axes.update(per_family.get(name, {}))
        keys = sorted(axes)
        grids[name] = [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]
    return grids


def _placement(name: str, devices: int, options: Mapping[str, Any]) -> Placement:
    if name == "linear":
        return Placement.linear(devices)
    if name == "loop":
        return Placement.loop(devices, options["chunks"])
    if name == "v":
        return Placement.v(devices)
    if name == "wave":
        return Placement.wave(devices, options["waves"])
    return Placement.mirrored(devices)


def _choices(families, devices, microbatches, options, placements, priorities, schedules) -> list[_Choice]:
    if families is None:
        from .schedules import names

        families = names()
    families = [families] if isinstance(families, str) else list(families)
    declared: dict[str, tuple[str, ...]] = {}
    for name in families:
        try:
            declared[name] = tuple(family_of(name).options)
        except ScheduleError as error:
            raise ConfigError(f"sweep: {error}") from None
    placements = [placements] if isinstance(placements, str) else list(placements)
    for p in placements:
        if p not in PLACEMENTS:
            raise ConfigError(f"sweep: placement {p!r} is not one of {', '.join(PLACEMENTS)}")
    priorities = _values("priorities", priorities)
    for p in priorities:
        if p not in PRIORITIES:
            raise ConfigError(f"sweep: priority {p!r} is not one of {', '.join(PRIORITIES)}")
    placement_options = {"loop": ("chunks",), "wave": ("waves",)}
    for p in placements:
        declared[f"list:{p}"] = placement_options.get(p, ())
    schedules = list(schedules)
    for s in schedules:
        if not isinstance(s, Schedule):
            raise ConfigError(f"sweep: schedules must be Schedule objects, got {type(s).__name__}")
    if not families and not placements and not schedules:
        raise ConfigError("sweep: the grid is empty: no families, placements or schedules given")
    device_values = _sizes("devices", devices) if families or placements else []
    microbatch_values = _sizes("microbatches", microbatches) if families or placements else []
    grids = _option_grid(list(declared), declared, dict(options or {}))

    out: list[_Choice] = []
    for name in families:
        for opts, d, n in itertools.product(grids[name], device_values, microbatch_values):
            out.append(_Choice(name, tuple(sorted(opts.items())), d, n,
                               lambda name=name, d=d, n=n, opts=opts: get(name, devices=d, microbatches=n, **opts)))
    defaults = {"chunks": 2, "waves": 2}
    for p in placements:
        for opts, prio, d, n in itertools.product(grids[f"list:{p}"], priorities, device_values, microbatch_values):
            full = {**{o: defaults[o] for o in placement_options.get(p, ())}, **opts}

            def make(p=p, d=d, n=n, full=full, prio=prio) -> Schedule:
                for o, v in full.items():
                    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                        raise ScheduleError(f"list:{p}: {o} must be an int >= 1, got {v!r}")
                return list_schedule(_placement(p, d, full), n, priority=prio,
                                     split_backward=prio == "zero-bubble")

            out.append(_Choice("list", tuple(sorted({"placement": p, "priority": prio, **full}.items())), d, n, make))
    for s in schedules:
        out.append(_Choice(s.family, s.options, s.devices, s.microbatches, lambda s=s: s))
    return out


# ------------------------------------------------------------------------------------------------
# Hardware variants, normalised to a graph's shapes
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Variants:
    """``B`` hardware variants as numpy arrays with a leading batch axis, normalised to one
    schedule's shapes: per-stage leaves ``[B, P, S]``, ``size [B, M]``, ``capacity [B, D]``,
    scalars ``[B]``, pairs ``[B, D, D]`` (or absent)."""

    leaves: Mapping[str, np.ndarray]
    data_parallel: int
    devices_per_node: int | None
    mode: str

    @property
    def count(self) -> int:
        return self.leaves["overhead"].shape[0]


class _ShapeMismatch(ConfigError):
    """A hardware variant whose shapes do not fit one schedule: that schedule is skipped."""


def _batch_size(hw: Hardware) -> int | None:
    """A batched Hardware (every leaf with a leading batch axis) has a 1-D ``overhead``."""
    return int(hw.overhead.shape[0]) if hw.overhead.ndim == 1 else None


def _normalise(hw: Hardware, schedule: Schedule) -> _Variants:
    """``hw`` (batched or one variant) as ``_Variants`` at ``schedule``'s sizes."""
    batch = _batch_size(hw)
    single = batch is None
    batch = 1 if single else batch
    p, s, m, d = schedule.pipelines, schedule.stages, schedule.microbatches, schedule.devices
    dtype = np.asarray(hw.forward).dtype

    def get(x: Any) -> np.ndarray:
        x = np.asarray(x, dtype=dtype)
        x = x[None] if single else x
        if x.ndim == 0 or x.shape[0] != batch:
            raise ConfigError(f"hardware: a batched leaf has shape {x.shape}, expected a leading axis of {batch}")
        return x

    def shaped(name: str, x: np.ndarray, options: Sequence[tuple[int, ...]], target: tuple[int, ...]) -> np.ndarray:
        rest = x.shape[1:]
        if rest not in options:
            raise _ShapeMismatch(
                f"hardware: {name} has shape {rest}, but the {schedule.family} schedule has {p} pipeline(s) x "
                f"{s} stages, {m} microbatches, {d} devices"
            )
        aligned = x.reshape((batch,) + (1,) * (len(target) - len(rest)) + rest)  # numpy's right alignment
        return np.broadcast_to(aligned, (batch, *target))

    leaves = {}
    for name in _PER_STAGE:
        leaves[name] = shaped(name, get(getattr(hw, name)), [(), (s,), (p, s)], (p, s))
    leaves["size"] = shaped("size", get(hw.size), [(), (m,)], (m,))
    leaves["capacity"] = shaped("capacity", get(hw.capacity), [(), (d,)], (d,))
    leaves["overhead"] = shaped("overhead", get(hw.overhead), [()], ())
    net = hw.network
    for name in _NETWORK_SCALARS:
        leaves[name] = shaped(f"network {name}", get(getattr(net, name)), [()], ())
    for name in ("pair_latency", "pair_bandwidth"):
        value = getattr(net, name)
        if value is not None:
            leaves[name] = shaped(f"network {name}", get(value), [(d, d)], (d, d))
    return _Variants(leaves, net.data_parallel, net.devices_per_node, net.mode)


def _concatenate(variants: Sequence[_Variants]) -> _Variants:
    first = variants[0]
    for v in variants[1:]:
        if set(v.leaves) != set(first.leaves):
            raise ConfigError("hardware variants differ in which network pair matrices they give")
        if (v.data_parallel, v.devices_per_node) != (first.data_parallel, first.devices_per_node):
            raise ConfigError(
                f"hardware variants differ in network data_parallel/devices_per_node: "
                f"{(first.data_parallel, first.devices_per_node)} vs {(v.data_parallel, v.devices_per_node)}"
            )
        if v.mode != first.mode:
            raise ConfigError(
                f"hardware variants have different communication modes ({first.mode!r}, {v.mode!r}): "
                "pass sweep(communication=...) to choose the modes"
            )
    if len(variants) == 1:
        return first
    leaves = {k: np.concatenate([v.leaves[k] for v in variants]) for k in first.leaves}
    return _Variants(leaves, first.data_parallel, first.devices_per_node, first.mode)


class _HardwareSource:
    """Resolves the ``hardware`` argument to ``_Variants`` per schedule (cached by shape when the
    hardware does not depend on the schedule)."""

    def __init__(self, hardware: Any, override: bool):
        if hardware is None:
            raise ConfigError("sweep: hardware is required (a Hardware, a list of Hardware, or a function)")
        self.function = callable(hardware) and not isinstance(hardware, (Hardware, Sequence))
        if not self.function:
            self._check(hardware, "hardware")
        self.hardware = hardware
        self.override = override
        self.cache: dict[tuple, _Variants] = {}
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

    def variants(self, schedule: Schedule) -> _Variants:
        if self.function:
            hardware = self.hardware(schedule)
            self._check(hardware, f"hardware({schedule.family}) result")
        else:
            hardware = self.hardware
            key = (schedule.pipelines, schedule.stages, schedule.microbatches, schedule.devices)
            if key in self.cache:
                return self.cache[key]
        items = hardware if isinstance(hardware, Sequence) else [hardware]
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


def _pad_variants(v: _Variants, index: np.ndarray, p: int, s: int, m: int, d: int) -> dict[str, np.ndarray]:
    """The variants ``index`` (one chunk: host memory stays proportional to the chunk), padded to a
    stack's sizes: unread padding is 0, capacity ``inf``, bandwidth ``inf``."""
    out = {}
    for name, x in v.leaves.items():
        x = x[index]
        if name in _PER_STAGE:
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


def _as_hardware(leaves: Mapping[str, np.ndarray], v: _Variants, mode: str, devices_per_node: int) -> Hardware:
    """A Hardware over numpy leaves (cheap value checks on the host; sharded afterwards), for a
    stacked graph compiled with ``devices_per_node`` (the variants' own, or all on one node)."""
    network = Network(leaves["latency"], leaves["bandwidth"], leaves["inter_latency"], leaves["inter_bandwidth"],
                      leaves.get("pair_latency"), leaves.get("pair_bandwidth"), mode=mode,
                      devices_per_node=devices_per_node, data_parallel=v.data_parallel)
    fields = {name: leaves[name] for name in (*_PER_STAGE, "overhead", "size", "capacity")}
    return Hardware(**fields, network=network)


# ------------------------------------------------------------------------------------------------
# Grouping, stacking and memory estimates
# ------------------------------------------------------------------------------------------------
@dataclass
class _Entry:
    """One (schedule, communication mode): a graph and the index of its first table row."""

    choice: int
    schedule: Schedule
    mode: str
    graph: Graph
    variants: _Variants
    row: int = 0


def _stack_class(e: _Entry) -> tuple:
    """Entries that can share one evaluator: graphs ``stack_graphs`` accepts together, hardware of
    one pytree structure (static network fields, pair matrices present or not)."""
    g, v = e.graph, e.variants
    return (g.communication, g.devices_per_node if g.devices_per_node < g.devices else None, v.data_parallel,
            v.devices_per_node, tuple(sorted(v.leaves)))


def _key(e: _Entry) -> tuple:
    """Entries that share one compiled function as they are: ``Graph.structure`` + static fields."""
    g = e.graph
    return (g.structure, g.devices, g.stages, g.pipelines, g.microbatches, g.steps, g.devices_per_node,
            _stack_class(e))


@dataclass(frozen=True)
class _Sizes:
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

    @classmethod
    def of(cls, graph: Graph) -> _Sizes:
        return cls(int(np.sum(np.asarray(graph.kind) != PAD)), graph.pred.shape[-1], graph.offsets.shape[-1],
                   graph.width, graph.lane_nodes.shape[-1], graph.devices, graph.stages, graph.pipelines,
                   graph.microbatches)

    def join(self, other: _Sizes) -> _Sizes:
        return _Sizes(*(max(a, b) for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    @property
    def rows(self) -> int:
        return self.nodes + self.width + 1

    @property
    def cells(self) -> int:
        """Evaluation work per point: the scan's level blocks plus the per-edge cost model."""
        return self.levels * self.width * self.k + self.rows * self.k


def bytes_per_point(sizes: _Sizes, pairs: bool = False) -> int:
    """Estimated evaluator working memory per (graph, hardware) point, bytes.

    ``[rows, k]`` float arrays (delays and the cost model's per-edge temporaries: about two per
    edge slot), ``[rows]`` arrays (durations, finish times and the cost model's per-node terms:
    about six), per-lane memory prefix sums (three), and the point's hardware leaves. Calibrated
    against XLA's ``memory_analysis``, which it exceeds by 2.2-2.5x (``benchmarks/bench_sweep.py``):
    a bound, not a forecast.
    """
    p_s = sizes.pipelines * sizes.stages
    hardware = len(_PER_STAGE) * p_s + sizes.microbatches + sizes.devices + 1 + len(_NETWORK_SCALARS)
    hardware += 2 * sizes.devices**2 if pairs else 0
    words = sizes.rows * (2 * sizes.k + 6) + 3 * sizes.lane + 2 * sizes.devices + 8 + 2 * hardware
    return _WORD * words


def bytes_per_graph(sizes: _Sizes) -> int:
    """Bytes of one padded graph's int32 arrays (held by every device that evaluates it): per node
    and per edge slot a dozen codes and indices, with room to spare for the cost tables."""
    words = sizes.rows * (16 + 8 * sizes.k) + 2 * sizes.levels + 3 * sizes.lane + 2 * sizes.pipelines * sizes.stages
    return _WORD * words


def _plan_stacks(entries: Sequence[_Entry], hardware: int, stacking: str) -> list[list[int]]:
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
        sizes = {key: _Sizes.of(entries[by_key[key][0]].graph) for key in keys}
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


# ------------------------------------------------------------------------------------------------
# The evaluator: one chunk of [graphs, hardware] points, sharded over the devices
# ------------------------------------------------------------------------------------------------
def _stack(graphs: Sequence[Graph]) -> Graph:
    """``stack_graphs`` on the host: the same padding (``pad_graph`` to the common sizes), stacked
    with numpy so that a new stack shape compiles nothing (``jnp.stack`` compiles per shape)."""
    sizes = common_sizes(graphs)
    per_node = {g.devices_per_node for g in graphs}  # one value within a stack class, unless all on one node
    per_node = per_node.pop() if len(per_node) == 1 else sizes["devices"]
    padded = [pad_graph(g, **sizes, devices_per_node=per_node) for g in graphs]
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *padded)


def _busy_weights(graph: Graph) -> np.ndarray:
    """Per node, how many device lanes its duration keeps busy: a compute op one, a collective one
    per participant (its lane entries), a blocking transfer two (sender and receiver). The total
    busy time ``sum(weights * dur)`` is then one product, not a per-device gather and scatter."""
    kind = np.asarray(graph.kind)
    weights = np.bincount(np.asarray(graph.lane_nodes), minlength=kind.shape[-1]).astype(np.float32)
    if graph.communication == "blocking":
        weights += 2 * (kind == KIND_CODES["T"])
    return weights


def _point_metrics(stack: tuple[Graph, Array], hw: Hardware):
    """Exact makespan, total busy time, microbatch work, largest peak memory and fit of one graph
    (and its ``_busy_weights``) on a hardware batch (leading axis; the batch is last inside, the
    fast path)."""
    graph, weights = stack
    tables = _tables(graph, hw, True)  # the simulator's internals: the batched fast path
    dur, _ = tables.expand(graph)
    # One sweep over the whole chunk: with several graphs vmapped here, splitting the batch into
    # cache-sized pieces (as makespan(batched=True) does) measured slower (62k vs 89k points/s).
    total = sink_max(graph, finish_times(graph, tables, None), None)
    busy = jnp.sum(weights.astype(dur.dtype)[:, None] * dur, axis=0)
    memory = jax.vmap(lambda h: peak_memory(graph, h)[0])(hw)
    capacity = jax.vmap(lambda h: h.per_device(graph))(hw)
    work = jnp.sum(jax.vmap(lambda h: h.per_microbatch(graph))(hw), axis=-1)
    return total, busy, work, jnp.max(memory, axis=-1), jnp.all(memory <= capacity, axis=-1)


_EVALUATORS: dict[tuple, Callable] = {}


def _evaluator(mesh: Mesh, axis: int, shared: bool) -> Callable:
    """The jitted, sharded evaluator of a chunk: graphs ``[G]``, hardware ``[B]`` (``shared``) or
    ``[G, B]``; ``axis`` 1 shards the hardware axis, 0 the graph axis. One object per layout, so
    ``eqx.filter_jit`` caches compilations across chunks and sweeps."""
    key = (mesh, axis, shared)
    if key not in _EVALUATORS:
        local = jax.vmap(_point_metrics, in_axes=(0, None if shared else 0))
        batch = P("points")
        if axis == 1:
            specs = (P(), batch if shared else P(None, "points"))
            out = P(None, "points")
        else:
            specs = (batch, P() if shared else batch)
            out = batch
        if mesh.devices.size == 1:  # nothing to split: skip shard_map's tracing and compile overhead
            mapped = local
        else:  # check_vma=False: equinox's runtime checks (error_if) are not annotated for shard_map
            mapped = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=out, check_vma=False)
        _EVALUATORS[key] = eqx.filter_jit(mapped)
    return _EVALUATORS[key]


def _put(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global array from the same host array on every process (each feeds its own devices)."""
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def _fetch(x: jax.Array) -> np.ndarray:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


@dataclass
class _Chunking:
    graphs: int  # per chunk (a multiple of the device count when axis == 0)
    hardware: int  # per chunk (a multiple of the device count when axis == 1)
    axis: int
    bytes: int  # estimated per-device working memory


def _chunking(n_graphs: int, n_hardware: int, per_point: int, per_graph: int, devices: int,
              max_bytes: int) -> _Chunking:
    if per_graph + per_point > max_bytes:
        raise ConfigError(
            f"sweep: max_bytes={max_bytes} is below one point's working memory ({per_graph + per_point} bytes)"
        )

    def up(n: int) -> int:
        return -(-n // devices) * devices

    if n_hardware >= devices or per_graph + n_hardware * per_point > max_bytes:
        # shard the hardware axis (padded to a multiple of the devices); every device holds the chunk's graphs
        local = min(up(n_hardware) // devices, (max_bytes - per_graph) // per_point)
        graphs = max(1, min(n_graphs, max_bytes // (per_graph + local * per_point)))
        return _Chunking(graphs, local * devices, 1, graphs * per_graph + graphs * local * per_point)
    local = min(up(n_graphs) // devices, max_bytes // (per_graph + n_hardware * per_point))
    return _Chunking(local * devices, n_hardware, 0, local * (per_graph + n_hardware * per_point))


class _Progress:
    """tqdm when installed, else one rewritten stderr line; silent when disabled."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.bar, self.enabled = total, 0, None, enabled
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return
        self.bar = tqdm(total=total, unit="pt", unit_scale=True, desc="sweep", file=sys.stderr)

    def update(self, n: int) -> None:
        if not self.enabled:
            return
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        else:
            sys.stderr.write(f"\rsweep: {self.done}/{self.total} points ({100 * self.done / self.total:.0f}%)")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


def _evaluate_stack(entries: Sequence[_Entry], hardware: int, mesh: Mesh, max_bytes: int, progress: _Progress,
                    out: Mapping[str, np.ndarray]) -> int:
    """Evaluate one stack chunk by chunk into the ``out`` columns; returns the chunk bytes used."""
    sizes = _Sizes.of(entries[0].graph)
    for e in entries[1:]:
        sizes = sizes.join(_Sizes.of(e.graph))
    pairs = "pair_latency" in entries[0].variants.leaves or "pair_bandwidth" in entries[0].variants.leaves
    per_point, per_graph = bytes_per_point(sizes, pairs), bytes_per_graph(sizes)
    devices = mesh.devices.size
    plan = _chunking(len(entries), hardware, per_point, per_graph, devices, max_bytes)
    stacked = _stack([e.graph for e in entries])
    weights = np.stack([_busy_weights(jax.tree.map(lambda x, i=i: x[i], stacked)) for i in range(len(entries))])
    hw_sizes = (sizes.pipelines, sizes.stages, sizes.microbatches, sizes.devices)
    # Hardware shared by the whole stack (one normalisation) unless it depends on the schedule's shape.
    shared = all(e.variants is entries[0].variants for e in entries)
    mode = entries[0].mode
    evaluate = _evaluator(mesh, plan.axis, shared)
    split = NamedSharding(mesh, P("points"))
    whole = NamedSharding(mesh, P())
    split_second = NamedSharding(mesh, P(None, "points"))
    graph_def = jax.tree.structure((stacked, weights))
    stacked_leaves = jax.tree.leaves((stacked, weights))
    for g0 in range(0, len(entries), plan.graphs):
        members = list(range(g0, min(g0 + plan.graphs, len(entries))))
        members += [members[0]] * (plan.graphs - len(members))  # pad: one compiled shape per stack
        graph_leaves = [x[members] for x in stacked_leaves]
        graph_sharding = split if plan.axis == 0 else whole
        graphs = jax.tree.unflatten(graph_def, [_put(x, graph_sharding) for x in graph_leaves])
        for b0 in range(0, hardware, plan.hardware):
            index = np.arange(b0, b0 + plan.hardware)
            index = np.where(index < hardware, index, b0)  # pad with a real variant
            if shared:
                chunk = _pad_variants(entries[0].variants, index, *hw_sizes)
                sharding = split if plan.axis == 1 else whole
            else:
                parts = [_pad_variants(entries[i].variants, index, *hw_sizes) for i in members]
                chunk = {k: np.stack([part[k] for part in parts]) for k in parts[0]}
                sharding = split_second if plan.axis == 1 else split
            hw = _as_hardware(chunk, entries[0].variants, mode, stacked.devices_per_node)
            hw = jax.tree.map(lambda x, s=sharding: _put(x, s), hw)
            results = [_fetch(x) for x in evaluate(graphs, hw)]
            real_g = min(g0 + plan.graphs, len(entries)) - g0
            real_b = min(b0 + plan.hardware, hardware) - b0
            for j in range(real_g):
                rows = slice(entries[g0 + j].row + b0, entries[g0 + j].row + b0 + real_b)
                for name, value in zip(("makespan", "_busy", "_work", "peak_memory", "fits"), results):
                    out[name][rows] = value[j, :real_b]
            progress.update(real_g * real_b)
    return plan.bytes


# ------------------------------------------------------------------------------------------------
# The entry point
# ------------------------------------------------------------------------------------------------
def sweep(
    hardware: Hardware | Sequence[Hardware] | Callable[[Schedule], Hardware | Sequence[Hardware]],
    *,
    families: str | Sequence[str] | None = None,
    devices: int | Sequence[int] = 4,
    microbatches: int | Sequence[int] = 8,
    options: Mapping[str, Any] | None = None,
    placements: str | Sequence[str] = (),
    priorities: str | Sequence[str] = ("backward-first",),
    schedules: Sequence[Schedule] = (),
    communication: str | Sequence[str] | None = None,
    max_bytes: int | None = None,
    stacking: str = "auto",
    progress: bool | None = None,
) -> SweepResult:
    """Evaluate every discrete choice of the grid on every hardware variant with the exact simulator.

    Args:
        hardware: the hardware/workload variants. One ``Hardware`` (a single variant, or a batch
            when every leaf has a leading batch axis, as from ``jax.vmap(Hardware.from_times)``:
            recognised by a 1-D ``overhead``), a list of ``Hardware`` (one variant each; per-stage
            leaves may differ in shape, each is broadcast against the schedule), or a function
            ``schedule -> Hardware | list[Hardware]`` called once per schedule, so per-stage arrays
            can match each schedule's stage count (e.g. ``Hardware.from_model(..., stages=s.stages)``).
            Every schedule must get the same number of variants: ``hardware`` indexes them. A
            variant whose shapes do not fit a schedule is skipped with the reason.
        families: schedule family names (``diffpipe.schedules.names()``; default all of them).
        devices, microbatches: ints or sequences of ints (the grid axes).
        options: the family-option grid. ``{"chunks": [1, 2, 4]}`` applies to every selected family
            (and placement) declaring ``chunks``; ``{"hanayo": {"waves": [1, 2]}}`` to one family.
            Values are a scalar or a sequence. Families without the option use their default.
        placements: placement variants scheduled by the greedy list scheduler (family ``list``):
            any of ``"linear"``, ``"loop"`` (``chunks``, default 2), ``"v"``, ``"wave"``
            (``waves``, default 2), ``"mirrored"``; crossed with ``priorities`` (``"zero-bubble"``
            splits the backward into I and W).
        schedules: extra ready-made ``Schedule`` objects (evaluated as given).
        communication: mode(s) to evaluate (``none``, ``overlap``, ``contention``, ``blocking``),
            overriding the hardware's own; default: the hardware's mode.
        max_bytes: bound on the estimated evaluator working memory per device, per chunk
            (default 32 MiB on CPU, 1 GiB on accelerators).
        stacking: ``"auto"`` (pad and stack different structures when the cost model says it is
            cheaper than compiling each: see the module docstring), ``"never"``, ``"always"``.
        progress: show a progress bar (tqdm when installed, else a stderr line); default: when
            stderr is a terminal and the sweep has more than one chunk's worth of points.

    Returns:
        A ``SweepResult``, rows ordered by choice (family, options, devices, microbatches),
        communication mode, then hardware variant. Combinations a family rejects
        (``ScheduleError``), that deadlock under a mode, or whose shapes the hardware does not
        fit are in ``result.skipped`` with the reason.

    Raises:
        ConfigError: on an empty or contradictory grid (no values on an axis, an option no selected
            family has, nothing left to evaluate), bad arguments, or ``max_bytes`` below one point.
    """
    if stacking not in ("auto", "never", "always"):
        raise ConfigError(f"sweep: stacking {stacking!r} is not 'auto', 'never' or 'always'")
    if max_bytes is None:
        max_bytes = DEFAULT_MAX_BYTES.get(jax.default_backend(), DEFAULT_MAX_BYTES_ACCELERATOR)
    if not isinstance(max_bytes, (int, np.integer)) or isinstance(max_bytes, bool) or max_bytes < 1:
        raise ConfigError(f"sweep: max_bytes must be a positive int, got {max_bytes!r}")
    modes = None if communication is None else _values("communication", communication)
    for m in modes or ():
        if m not in COMMUNICATION_MODES:
            raise ConfigError(f"sweep: communication {m!r} is not one of {', '.join(COMMUNICATION_MODES)}")
    source = _HardwareSource(hardware, override=modes is not None)
    choices = _choices(families, devices, microbatches, options, placements, priorities, schedules)

    skipped: list[dict[str, Any]] = []
    entries: list[_Entry] = []

    def skip(c: _Choice, mode: str | None, reason: Any) -> None:
        skipped.append({"family": c.family, "options": c.label, "devices": c.devices,
                        "microbatches": c.microbatches, "communication": mode, "reason": str(reason)})

    for index, c in enumerate(choices):
        try:
            schedule = c.make()
        except ScheduleError as error:
            skip(c, None, error)
            continue
        try:
            variants = source.variants(schedule)
        except _ShapeMismatch as error:
            skip(c, None, error)
            continue
        for mode in modes or [variants.mode]:
            try:
                graph = compile(schedule, communication=mode, devices_per_node=variants.devices_per_node)
            except ScheduleError as error:
                skip(c, mode, error)
                continue
            entries.append(_Entry(index, schedule, mode, graph, variants))
    if not entries:
        reason = skipped[0]["reason"] if skipped else "nothing to evaluate"
        raise ConfigError(f"sweep: no combination of the grid can be evaluated ({len(skipped)} skipped; "
                          f"first: {reason})")

    count = source.count
    for i, e in enumerate(entries):
        e.row = i * count
    total = len(entries) * count
    columns: dict[str, np.ndarray] = {
        "makespan": np.zeros(total, np.float32), "_busy": np.zeros(total, np.float32),
        "_work": np.zeros(total, np.float32), "peak_memory": np.zeros(total, np.float32),
        "fits": np.zeros(total, bool),
    }
    mesh = Mesh(np.asarray(jax.devices()), ("points",))
    stacks = _plan_stacks(entries, count, stacking)
    if progress is None:
        progress = sys.stderr.isatty() and total >= LONG_RUN
    bar = _Progress(total, bool(progress))
    chunk_bytes = 0
    try:
        for stack in stacks:
            members = [entries[i] for i in stack]
            chunk_bytes = max(chunk_bytes, _evaluate_stack(members, count, mesh, int(max_bytes), bar, columns))
    finally:
        bar.close()

    per_entry = {
        "family": np.asarray([choices[e.choice].family for e in entries], dtype=object),
        "options": np.asarray([choices[e.choice].label for e in entries], dtype=object),
        "devices": np.asarray([e.schedule.devices for e in entries], dtype=np.int32),
        "microbatches": np.asarray([e.schedule.microbatches for e in entries], dtype=np.int32),
        "stages": np.asarray([e.schedule.stages for e in entries], dtype=np.int32),
        "communication": np.asarray([e.mode for e in entries], dtype=object),
        "_entry": np.arange(len(entries), dtype=np.int32),
    }
    table = {name: np.repeat(value, count) for name, value in per_entry.items()}
    table["hardware"] = np.tile(np.arange(count, dtype=np.int32), len(entries))
    makespan = columns["makespan"]
    table["makespan"] = makespan
    with np.errstate(divide="ignore", invalid="ignore"):
        table["throughput"] = (columns["_work"] / makespan).astype(np.float32)
        used = table["devices"].astype(np.float32) * makespan
        table["bubble_ratio"] = (np.float32(1.0) - columns["_busy"] / used).astype(np.float32)
    table["peak_memory"] = columns["peak_memory"]
    table["fits"] = columns["fits"]
    table = {name: table[name] for name in (*COLUMNS, "_entry")}
    return SweepResult(
        table, tuple(skipped), int(max_bytes), int(chunk_bytes), int(mesh.devices.size), len(stacks), count,
        tuple(dict(choices[e.choice].options) for e in entries),
    )
