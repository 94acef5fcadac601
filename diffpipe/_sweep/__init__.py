"""``sweep``: exhaustive what-if evaluation of discrete pipeline choices against hardware variants.

A sweep crosses schedule family x devices x microbatches x family options (chunks, waves, ...) x
placement variants (greedy list schedules over named placements) x communication mode, and
evaluates every resulting schedule on every hardware variant with the exact simulator. The
result is a plain table (``SweepResult``: numpy columns, CSV/JSON/Markdown, Pareto front, best per
hardware). No pandas.

One job per module, imports pointing one way: ``result`` (the table) and ``grid`` (discrete
choices) import no JAX; ``variants`` (hardware normalisation) -> ``plan`` (stacking plan, memory
model) -> ``evaluate`` (sharded evaluator) -> this entry point.

How the work is organised (summarised in docs/architecture.md, "Knobs, optimization and sweeps"):

1. **Grouping.** Each (schedule, mode) compiles to a ``Graph``. The sweep's evaluator (the exact
   simulator's batched fast path plus busy time and peak memory), like ``diffpipe.makespan``, is an
   ``eqx.filter_jit`` function whose cache key is the graph's array shapes (``Graph.structure``)
   plus its static fields (devices, stages, pipelines, microbatches, steps, communication,
   devices per node): graphs with equal keys share one compiled function.
2. **Stacking rule.** Different keys can still share one compiled function by padding every graph
   to common sizes (``pad_graph``; padding never changes a result). That costs evaluation time on
   the padding and saves a compilation. The cost of evaluating a set of keys as one stack is
   modelled as ``COMPILE_CELLS + sum over its points of cells(padded sizes)``, where
   ``cells = levels * width * k + rows * k`` counts the scan's per-level block updates plus the
   cost model's per-edge work, and ``COMPILE_CELLS`` is one compilation expressed in evaluated cells
   (see below). Keys of one communication setting are sorted by their cells and split
   into contiguous runs by an exact dynamic programme minimising the total cost: a run is padded
   and stacked; a run of one key is evaluated as is. ``stacking="never"`` compiles one function
   per key; ``stacking="always"`` one per communication setting.
3. **Chunks with a stated memory bound.** Each stack is sent to the devices once (replicated) and
   evaluated in chunks of ``[graphs, hardware]`` points of one fixed shape (the last chunk is
   padded by repeating a point, so a stack compiles once); a chunk's graphs run one after the
   other, each on all of the chunk's hardware, batch last. The working memory per hardware variant
   is estimated by ``bytes_per_point`` and per graph (its arrays and the level scan's working set
   on one batch chunk) by ``bytes_per_graph`` (``benchmarks/bench_sweep.py`` compares them with
   XLA's own memory analysis: the estimate is 2.3-2.8x XLA's arguments + outputs + temporaries); a
   chunk is sized so that on every device ``graphs * (bytes_per_graph + hardware * OUT_BYTES) +
   hardware * bytes_per_point <= max_bytes``, the bound split about evenly between graphs and
   hardware (the most points per call). ``SweepResult.chunk_bytes`` states the largest estimate
   used; the stacks' graph arrays stay on the devices besides (cached).
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

Caches (all bounded, keyed by arguments that fully determine the value): schedules on (family,
devices, microbatches, options) (``grid.build``), graphs on (schedule, mode, devices per node)
(``graph_of``), stacks on their graphs (``evaluate.stack``, on the devices), compiled evaluators on
their layout and shapes. A repeated sweep therefore normalises its hardware and evaluates, nothing
else.

Measured constants (2-core CPU shared with other jobs, jax 0.10, float32): ``COMPILE_CELLS = 1.9e9``
is one compilation of a stack's evaluator (10-12 s at load ~15, ~1 s on an idle machine) times the
cells per second the same evaluator then evaluates (``benchmarks/bench_sweep.py`` reports both and
their product per representative graph; medians of 1.9e9 and 3.7e9 in two runs: the lower is
used, since an overpriced compilation pads more and slows warm sweeps). The
previous 1.5e8 dated from an earlier evaluator and priced a compilation at 1/13 of its cost; on
the benchmark's 1M-point grid (28 graphs) the measured value plans 2 stacks instead of 4, the
cold sweep took 26 s instead of 83 s and the warm one 1.56 s instead of 1.76 s (same run
conditions, load ~15).
"""


from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from .._caches import bounded
from .._checks import check_int
from .._engine._communication import communication as as_communication
from .._engine._graph import compile
from .._engine._hardware import Hardware
from .._errors import ConfigError, ScheduleError
from .._workload._segments import unit_sizes
from ..schedules import Schedule, units_per_sample
from .evaluate import Progress, evaluate_stack
from .grid import CACHE_SIZE, Choice, values
from .grid import PLACEMENTS as PLACEMENTS
from .grid import choices as grid_choices
from .plan import COMPILE_CELLS as COMPILE_CELLS
from .plan import DEFAULT_MAX_BYTES, DEFAULT_MAX_BYTES_ACCELERATOR, Entry, plan_stacks
from .result import COLUMNS as COLUMNS
from .result import SweepResult as SweepResult
from .variants import HardwareSource, ShapeMismatch, SplitUnknown, Variants

#: The mode a sweep compiles under when given none (``communication=None``).
DEFAULT_MODE = as_communication("overlap")


@bounded(CACHE_SIZE)
def graph_of(schedule: Schedule, mode: str, devices_per_node: int | None):
    """``compile(schedule, ...)``, cached across sweeps (a pure function of its arguments; the same
    ``Graph`` object each time, so the stacks built from it are cached too: ``evaluate.stack``)."""
    return compile(schedule, communication=mode, devices_per_node=devices_per_node)




def _per_unit(variants: Variants, schedule: Schedule) -> Variants:
    """``variants`` with a sequence-level schedule's unit sizes: each variant's per-sample size (one
    value) times the segments' shares of the compute-balanced split (``_segments.unit_sizes``)."""
    k = units_per_sample(schedule)
    if k == 1:
        return variants
    size = variants.leaves["size"]
    if np.any(size != size[:, :1]):
        raise ShapeMismatch(f"hardware: {schedule.family} prices its {k} units per sample itself: give one "
                            "size per variant (a sample's), not one per microbatch")
    shares = unit_sizes(k, schedule.microbatches // k).astype(size.dtype)
    return dataclasses.replace(variants, leaves={**variants.leaves, "size": size * shares})


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
    devices_per_node: int | None = None,
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
            can match each schedule's stage count (e.g. ``hardware_from_model(..., stages=s.stages)``).
            Every schedule must get the same number of variants: ``hardware`` indexes them. A
            variant whose shapes do not fit a schedule is skipped with the reason.
        families: schedule family names (``diffpipe.schedules.names()``; default all of them).
        devices, microbatches: ints or sequences of ints (the grid axes). ``microbatches`` counts
            samples (microbatches of the global batch) for every family: a sequence-level family
            (``Family.units``: Seq1F1B's ``segments``) runs ``microbatches x units`` microbatch ids,
            each priced at its segment's share (``1/units``, the compute-balanced split) of the
            variant's size, so that rows compare equal work; ``throughput`` is then samples per
            second and the ``microbatches`` column samples.
        options: the family-option grid. ``{"chunks": [1, 2, 4]}`` applies to every selected family
            (and placement) declaring ``chunks``; ``{"hanayo": {"waves": [1, 2]}}`` to one family.
            Values are a scalar or a sequence. Families without the option use their default.
        placements: placement variants scheduled by the greedy list scheduler (family ``list``):
            any of ``"linear"``, ``"loop"`` (``chunks``, default 2), ``"v"``, ``"wave"``
            (``waves``, default 2), ``"mirrored"``; crossed with ``priorities`` (``"zero-bubble"``
            splits the backward into I and W).
        schedules: extra ready-made ``Schedule`` objects (evaluated as given).
        communication: mode(s) to compile every schedule under (``none``, ``overlap``,
            ``contention``, ``blocking``, ... or ``AbstractCommunication`` objects); default
            ``overlap``. The mode is the graph's: the hardware holds none.
        devices_per_node: devices sharing a node, every schedule is compiled for (default: all on
            one node); the topology is the graph's too, the hardware's network holds only links.
        max_bytes: bound on the estimated evaluator working memory per device, per chunk
            (default 32 MiB on CPU, 1 GiB on accelerators).
        stacking: ``"auto"`` (pad and stack different structures when the cost model says it is
            cheaper than compiling each: see the module docstring), ``"never"``, ``"always"``.
        progress: progress on stderr (``diffpipe._progress``: a bar on a terminal, plain lines
            elsewhere); None (default): once the sweep has run 2 seconds; True: at once; False: never.

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
    max_bytes = check_int("sweep: max_bytes", max_bytes)
    modes = None if communication is None else values("communication", communication)
    for m in modes or ():
        as_communication(m, what="sweep: communication")  # one-line error naming the mode
    source = HardwareSource(hardware)
    choices = grid_choices(families, devices, microbatches, options, placements, priorities, schedules)

    skipped: list[dict[str, Any]] = []
    entries: list[Entry] = []

    def skip(c: Choice, mode: str | None, reason: Any) -> None:
        skipped.append({"family": c.family, "options": c.label, "devices": c.devices,
                        "microbatches": c.microbatches, "communication": mode, "reason": str(reason)})

    for index, c in enumerate(choices):
        try:
            schedule = c.make()
        except ScheduleError as error:
            skip(c, None, error)
            continue
        try:
            variants = _per_unit(source.variants(schedule), schedule)
        except (ShapeMismatch, SplitUnknown) as error:
            skip(c, None, error)
            continue
        for mode in modes or [DEFAULT_MODE]:
            try:
                graph = graph_of(schedule, mode, devices_per_node)
            except ScheduleError as error:
                skip(c, mode, error)
                continue
            entries.append(Entry(index, schedule, mode, graph, variants))
    if not entries:
        reason = skipped[0]["reason"] if skipped else "nothing to evaluate"
        raise ConfigError(f"sweep: no combination of the grid can be evaluated ({len(skipped)} skipped; "
                          f"first: {reason})")

    count = source.count
    first: dict[tuple[int, int], int] = {}  # peak memory is per (schedule, hardware), not per mode
    for i, e in enumerate(entries):
        e.row = i * count
        e.memory_from = first.setdefault((id(e.schedule), id(e.variants)), i)
        e.memory_from = -1 if e.memory_from == i else e.memory_from
    total = len(entries) * count
    columns: dict[str, np.ndarray] = {
        "makespan": np.zeros(total, np.float32), "_busy": np.zeros(total, np.float32),
        "_work": np.zeros(total, np.float32), "peak_memory": np.zeros(total, np.float32),
        "fits": np.zeros(total, bool),
    }
    mesh = Mesh(np.asarray(jax.devices()), ("points",))
    stacks = plan_stacks(entries, count, stacking)
    bar = Progress(total, progress)
    chunk_bytes = 0
    try:
        for stack in stacks:
            members = [entries[i] for i in stack]
            chunk_bytes = max(chunk_bytes, evaluate_stack(members, count, mesh, int(max_bytes), bar, columns))
    finally:
        bar.close()
    for e in entries:
        if e.memory_from >= 0:
            source_rows = slice(entries[e.memory_from].row, entries[e.memory_from].row + count)
            for name in ("peak_memory", "fits"):
                columns[name][e.row:e.row + count] = columns[name][source_rows]

    per_entry = {
        "family": np.asarray([choices[e.choice].family for e in entries], dtype=object),
        "options": np.asarray([choices[e.choice].label for e in entries], dtype=object),
        "devices": np.asarray([e.schedule.devices for e in entries], dtype=np.int32),
        "microbatches": np.asarray([e.schedule.microbatches // units_per_sample(e.schedule) for e in entries],
                                   dtype=np.int32),
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
