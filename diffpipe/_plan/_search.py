"""``plan``: the best whole configuration for a model on a cluster, by exhaustive search and simulation.

``plan(model, cluster, global_batch)`` enumerates tensor x pipeline x data (x expert) splits,
schedule families, virtual stages, microbatch sizes, recomputation, ZeRO stages and sequence
parallelism, and answers with a ``PlanTable``: every configuration the simulator evaluated (the
same numbers ``Configuration.evaluate()`` gives for it), the best first, and why the others were
rejected. The search:

1. **Enumerate** every combination (``explored``). Structural constraints reject without
   computing anything: sizes multiplying to the GPU count, a tensor group inside a node dividing
   the heads (``Parallelism.check``, ``placement``), ``pipeline x virtual`` stages within the
   model's layers, a global batch divisible by ``microbatch_size x data``.
2. **Closed forms, per device, before simulating** (numpy over the per-layer table of
   ``diffpipe._workload._parallel.parallel_costs``, computed once per tensor/expert/data/ZeRO/sequence-parallel
   and microbatch-size/recompute variant; stage sums are cumulative sums over the uniform split):
   - memory: static bytes (ZeRO applied) plus one microbatch's activations of the device's
     smallest stage must fit the capacity less the headroom (a lower bound on the simulated peak);
     once the schedule is built, its exact peak count of stored activations (``peak_activations``)
     times that smallest stage's activations tightens the bound;
   - step time: no device can start before microbatch 0's forward reached its first stage, and its
     lane runs its own work one op at a time, so ``max_d (F_<first stage of d> + work_d + U_d)`` (F,
     I, W with the collectives inside them, x microbatches, plus the optimizer step) is a lower
     bound on the simulated step. Candidates are taken in order of this bound, and the search stops
     when the next bound is no better than the best simulated step (``rejected["bound"]``).
3. **Simulate** the survivors grouped by graph (family, pipeline, virtual stages, microbatches,
   pipeline ranks per node, data-parallel size: one compiled, batched exact simulation per group;
   ``Configuration.hardware()`` builds each member's ``Hardware``, so numbers equal
   ``Configuration.evaluate()``), rejecting those whose simulated peak memory exceeds the capacity
   less the headroom (``rejected["memory (simulated)"]``).
4. **Balance** the stages of the best ``top_k`` by ``optimize`` with ``StageBalance`` (gradient
   descent on the smoothed makespan, rounding, and exact +-1-layer moves); a balanced split is kept,
   as its own row, only when ``Configuration(..., layers_per_stage=...).evaluate()`` confirms it is
   faster and fits.

An infeasible request raises ``ConfigError`` with one line naming the smallest change that makes
it feasible (more GPUs, recomputation, a larger tensor size, ZeRO, a divisible batch, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import schedules
from .._checks import check_int, check_number
from .._engine._simulate import simulate_graph
from .._errors import ConfigError, ScheduleError
from .._machine._cluster import Cluster
from .._model._kernels import kernel_times
from .._model._transformer import Transformer, stage_of_layers
from .._optimize._knobs import StageBalance
from .._optimize._optimize import optimize
from .._results import csv_text, json_text, markdown_table
from .._sweep.evaluate import Progress
from .._workload._parallel import ZERO_STAGES, Parallelism, parallel_costs, placement
from ..schedules._analysis import peak_activations
from ._configuration import Configuration
from ._export import Launch

#: Families searched by default: synchronous single-pipeline schedules a framework runs
#: (Megatron-LM: 1f1b, interleaved-1f1b; torch/torchtitan: all four).
DEFAULT_FAMILIES = ("1f1b", "interleaved-1f1b", "zb-h1", "gpipe")
DEFAULT_MICROBATCH_SIZES = (1, 2, 4, 8)
DEFAULT_VIRTUAL = (2, 4)
RECOMPUTE = ("none", "selective", "full")
#: Families whose ``chunks = 1`` is another family (interleaved-1f1b is 1f1b, looped-bfs is gpipe).
_CHUNK_ONE_IS_OTHER = ("interleaved-1f1b", "looped-bfs")
#: Candidates evaluated together by default: enough to show a bar on long plans only.
LONG_PLAN = 2_000
#: Relative slack on the step-time bound (float32 simulation against float64 closed forms).
_BOUND_SLACK = 1e-4

COLUMNS = ("family", "tensor", "pipeline", "data", "virtual", "expert", "microbatch_size", "microbatches",
           "recompute", "zero", "sequence_parallel", "layers_per_stage", "balanced", "step_time",
           "tokens_per_second_per_gpu", "mfu", "memory_per_gpu", "capacity", "bubble_ratio",
           "communication_share", "bound")


@dataclass(frozen=True)
class _Candidate:
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

    def parallelism(self) -> Parallelism:
        return Parallelism(tensor=self.tensor, pipeline=self.pipeline, data=self.data, virtual=self.virtual,
                           expert=self.expert, zero=self.zero, sequence_parallel=self.sequence_parallel)


@dataclass(frozen=True)
class PlanTable:
    """What ``plan`` found: the evaluated configurations, fastest first, and the rejections.

    Attributes:
        rows: one dict per evaluated configuration that fits (``COLUMNS``; seconds, bytes), sorted
            by ``step_time``; balanced splits (``balanced=True``) are rows of their own. ``bound`` is
            the closed-form lower bound on the step time of the uniform split (module docstring).
        rejected: reason -> count (``tensor``, ``batch``, ``stages``, ``schedule``, ``memory``,
            ``memory (simulated)``, ``bound``).
        explored: configurations enumerated (every combination of the search axes).
        simulated: configurations the exact simulator evaluated.
        seconds: wall time per phase: ``enumerate`` (enumeration and closed forms), ``evaluate``
            (of which ``graphs``: schedule compilation, ``hardware``: building each member's
            ``Hardware``, ``simulate``: the batched exact simulation, its XLA compilation included),
            ``balance``, ``total``.
        model, cluster, global_batch: the request.
    """

    rows: tuple[dict[str, Any], ...]
    rejected: dict[str, int]
    explored: int
    simulated: int
    seconds: dict[str, float]
    model: Transformer
    cluster: Cluster
    global_batch: int
    communication: str = "overlap"

    @property
    def best(self) -> dict[str, Any]:
        """The fastest configuration that fits (never slower than any evaluated one)."""
        return self.rows[0]

    def configuration(self, i: int = 0) -> Configuration:
        """Row ``i`` as a ``Configuration`` (``.evaluate()`` reproduces its numbers)."""
        row = self.rows[i]
        model = dataclasses.replace(self.model, microbatch_size=row["microbatch_size"], recompute=row["recompute"])
        return Configuration(model, self.parallelism(i), self.cluster, self.global_batch, schedule=row["family"],
                             communication=self.communication, layers_per_stage=row["layers_per_stage"])

    def parallelism(self, i: int = 0) -> Parallelism:
        """The ``Parallelism`` of row ``i``."""
        row = self.rows[i]
        return Parallelism(**{f.name: row[f.name] for f in dataclasses.fields(Parallelism)})

    def launch(self, i: int = 0) -> Launch:
        """Row ``i`` as a ``Launch`` (for ``megatron_args`` / ``torchtitan_toml``)."""
        row = self.rows[i]
        return Launch(row["family"], self.parallelism(i), microbatch_size=row["microbatch_size"],
                      global_batch=self.global_batch, sequence=self.model.sequence,
                      layers_per_stage=row["layers_per_stage"], recompute=row["recompute"])

    def to_dict(self) -> dict[str, Any]:
        return {"global_batch": self.global_batch, "gpus": self.cluster.gpus, "explored": self.explored,
                "simulated": self.simulated, "rejected": dict(self.rejected), "seconds": dict(self.seconds),
                "rows": [dict(r, layers_per_stage=list(r["layers_per_stage"])) for r in self.rows]}

    def to_json(self, path: Any = None, indent: int | None = 2) -> str:
        return json_text(self.to_dict(), path, indent)

    def to_csv(self, path: Any = None) -> str:
        rows = [[" ".join(map(str, r[c])) if c == "layers_per_stage" else r[c] for c in COLUMNS] for r in self.rows]
        return csv_text(COLUMNS, rows, path)

    def to_markdown(self, top: int | None = 10) -> str:
        """The first ``top`` rows (all when None) and the rejection counts, as Markdown."""
        header = ("family", "tp", "pp", "dp", "v", "ep", "mbs", "recompute", "zero", "sp", "step (s)", "tok/s/GPU",
                  "MFU", "mem/GPU (GB)", "bubble", "comm")
        cells = []
        for r in self.rows[: top if top is not None else len(self.rows)]:
            family = r["family"] + (" (balanced)" if r["balanced"] else "")
            cells.append((family, r["tensor"], r["pipeline"], r["data"], r["virtual"], r["expert"],
                          r["microbatch_size"], r["recompute"], r["zero"], "y" if r["sequence_parallel"] else "n",
                          f"{r['step_time']:.3f}", f"{r['tokens_per_second_per_gpu']:.0f}", f"{r['mfu']:.3f}",
                          f"{r['memory_per_gpu'] / 1e9:.1f}", f"{r['bubble_ratio']:.3f}",
                          f"{r['communication_share']:.3f}"))
        text = markdown_table(header, cells)
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.rejected.items()))
        return (text + f"\n{self.explored} configurations explored, {self.simulated} simulated; rejected: "
                f"{reasons or 'none'}\n")


# -- enumeration ---------------------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@functools.lru_cache(maxsize=64)
def _family_shape(family: str) -> tuple[bool, int, str]:
    """(takes chunks, stages per device without chunks, placement style ``loop`` or ``v``) of a family."""
    fam = schedules.family(family)
    chunks = "chunks" in fam.option_names
    probe = schedules.get(family, devices=4, microbatches=8)
    per = probe.stages // probe.devices
    devices = [probe.placement.device(0, s) for s in range(probe.stages)]
    style = "v" if per == 2 and devices[:8] == [0, 1, 2, 3, 3, 2, 1, 0] else "loop"
    return chunks, per, style


def _stage_devices(style: str, pipeline: int, stages: int) -> np.ndarray:
    s = np.arange(stages)
    if style == "v":
        return np.where(s < pipeline, s, 2 * pipeline - 1 - s)
    return s % pipeline


def _values(name: str, value: Any, allowed: Sequence[Any] | None = None) -> tuple:
    items = tuple(value) if isinstance(value, (list, tuple, set, frozenset)) else (value,)
    if not items:
        raise ConfigError(f"plan: {name} has no values")
    if allowed is not None:
        for v in items:
            if v not in allowed:
                raise ConfigError(f"plan: {name} {v!r} is not one of {', '.join(map(str, allowed))}")
    return items


class _Costs:
    """The closed-form per-layer numbers of one (model variant, tensor, expert, data, ZeRO, SP), in
    float64 numpy: F and I with the collectives they wait for, the whole F + I + W work, the optimizer
    step, static and activation bytes. Only bounds are computed from them (never a reported number)."""

    def __init__(self, model: Transformer, par: Parallelism, cluster: Cluster, links: dict[str, str]):
        costs = parallel_costs(model, par)
        key = (model, par.tensor, par.sequence_parallel, par.expert, _cluster_key(cluster))
        if key not in _TIMES:
            if cluster.device.kernels is not None and costs.kernels is not None:  # Configuration.compute_seconds
                times = sum(kernel_times(costs.kernels, cluster.device, float(model.dtype_bytes)).values())
            else:
                times = costs.costs.times(cluster.device)
            _remember(_TIMES, key, tuple(np.asarray(x, np.float64) for x in times))
        f, i, w = _TIMES[key]
        comm = np.zeros((3, model.layers + 2))
        for group, link in links.items():  # Configuration.collective_seconds, in numpy
            bandwidth, latency = (float(x) for x in cluster.link(link))
            comm = comm + costs.collective_bytes[group] / bandwidth + costs.collective_hops[group] * latency
        self.forward = f + comm[0]
        self.work = self.forward + i + comm[1] + w + comm[2]
        bandwidth = float(cluster.memory_bandwidth)
        if cluster.device.kernels is not None:
            bandwidth *= float(cluster.device.kernels.memory_efficiency)
        self.update = np.asarray(costs.update_bytes, np.float64) / bandwidth
        self.static = np.asarray(costs.static_bytes, np.float64)
        self.activation = np.asarray(costs.activation_bytes, np.float64)
        self.shared_static = float(costs.shared_static_bytes)


#: Bounded caches across plans (warm plans skip the per-variant cost tables): model variant and
#: parallel sizes and the cluster's values -> ``_Costs``; model variant and tensor -> op seconds.
CACHE_SIZE = 50_000
_COSTS: OrderedDict = OrderedDict()
_TIMES: OrderedDict = OrderedDict()


def _remember(cache: OrderedDict, key: Any, value: Any) -> None:
    cache[key] = value
    if len(cache) > CACHE_SIZE:
        cache.popitem(last=False)


def _cluster_key(cluster: Cluster) -> tuple:
    leaves = (cluster.device.peak_flops, cluster.device.efficiency, cluster.device.memory, cluster.intra_bandwidth,
              cluster.intra_latency, cluster.inter_bandwidth, cluster.inter_latency, cluster.memory_bandwidth)
    return (cluster.device.name, cluster.gpus, cluster.devices_per_node, *(float(x) for x in leaves))


def _stage_sums(values: np.ndarray, rows: np.ndarray, stages: int) -> np.ndarray:
    return np.bincount(rows, weights=values, minlength=stages)


def _closed_form(k: _Costs, model: Transformer, pipeline: int, virtual: int, style: str,
                 split_rows: dict[int, np.ndarray]) -> tuple[np.ndarray, ...]:
    """Per pipeline rank, under the uniform split: static bytes, the smallest stage's activations
    (one microbatch), the forward of microbatch 0 before its first stage, per-microbatch work (F + I +
    W with collectives) and the optimizer step (seconds)."""
    stages = pipeline * virtual
    if stages not in split_rows:
        split_rows[stages] = stage_of_layers(model, stages)
    rows = split_rows[stages]
    device_of = _stage_devices(style, pipeline, stages)
    static = _stage_sums(k.static, rows, stages)
    if stages == 1:
        static = static - k.shared_static
    act = _stage_sums(k.activation, rows, stages)
    dev_static = np.bincount(device_of, weights=static, minlength=pipeline)
    dev_act = np.full(pipeline, np.inf)
    np.minimum.at(dev_act, device_of, act)
    first = np.full(pipeline, stages)
    np.minimum.at(first, device_of, np.arange(stages))
    before = np.concatenate([[0.0], np.cumsum(_stage_sums(k.forward, rows, stages))])[first]
    work = np.bincount(device_of, weights=_stage_sums(k.work, rows, stages), minlength=pipeline)
    update = np.bincount(device_of, weights=_stage_sums(k.update, rows, stages), minlength=pipeline)
    return dev_static, dev_act, before, work, update


# -- evaluation -----------------------------------------------------------------------------------------


@eqx.filter_jit
def _batched(graph, hws):
    """Exact makespan, bubble ratio and per-device peak memory of a batch of hardware on one graph
    (``simulate``'s own terms, vmapped: the evaluator folds the batch into its batch-last layout)."""
    def one(hw):
        out = simulate_graph(graph, hw)
        return out.makespan, out.bubble_ratio, out.peak_memory

    return jax.vmap(one)(hws)


def _stack(hws: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *x: jnp.stack(x), *hws)


#: The ``ConfigResult`` figures a plan row reports.
FIGURES = ("step_time", "tokens_per_second_per_gpu", "mfu", "memory_per_gpu", "capacity", "bubble_ratio",
           "communication_share")


def _metrics(cfg: Configuration, schedule: Any, step: float, bubble: float, memory: np.ndarray) -> dict[str, Any]:
    """The figures ``Configuration.evaluate`` reports, from a simulated step (``Configuration.figures``)."""
    figures = cfg.figures(schedule, step, bubble, memory)
    return {name: figures[name] for name in FIGURES}


def _row(c: _Candidate, cfg: Configuration, counts: tuple[int, ...], balanced: bool, figures: dict) -> dict:
    return {"family": c.family, "tensor": c.tensor, "pipeline": c.pipeline, "data": c.data, "virtual": c.virtual,
            "expert": c.expert, "microbatch_size": c.microbatch_size, "microbatches": cfg.microbatches,
            "recompute": c.recompute, "zero": c.zero, "sequence_parallel": c.sequence_parallel,
            "layers_per_stage": tuple(int(x) for x in counts), "balanced": balanced, **figures}


def _blocks(rows_per_stage: Sequence[int]) -> tuple[int, ...]:
    """Transformer blocks per stage from ``Workload`` rows per stage (embedding and head rows off)."""
    counts = [int(x) for x in rows_per_stage]
    counts[0] -= 1
    counts[-1] -= 1
    return tuple(counts)


def _infeasible(model: Transformer, cluster: Cluster, global_batch: int, rejected: Counter, best_memory: float,
                capacity: float, recompute: tuple, zero: tuple, tensors: list[int]) -> str:
    """One line: why nothing fits, and the smallest change that would."""
    g = cluster.gpus
    if rejected.get("memory", 0) + rejected.get("memory (simulated)", 0) == 0:
        main = max(rejected, key=rejected.get) if rejected else "nothing to evaluate"
        if main == "batch":
            return (f"plan: no split divides global_batch={global_batch} by microbatch_size x data on {g} GPUs: "
                    f"use a global batch that is a multiple of {g // max(1, min(tensors or [1]))}")
        if main == "tensor":
            return (f"plan: no tensor size inside a {cluster.devices_per_node}-GPU node divides the model's heads "
                    f"({model.heads}) and the GPU count {g}")
        return f"plan: no configuration can be evaluated on {g} GPUs (most rejected for: {main})"
    hints = []
    if "full" not in recompute:
        hints.append("allow recompute='full'")
    if 3 not in zero:
        hints.append("allow zero=3")
    if cluster.devices_per_node not in tensors:
        hints.append(f"allow tensor={cluster.devices_per_node}")
    need = max(1, math.ceil(best_memory / capacity)) if math.isfinite(best_memory) else 2
    more = f"about {need}x the GPUs ({need * g})" if need > 1 else "more GPUs"
    change = hints[0] if hints else f"use {more} or a smaller model"
    return (f"plan: no configuration fits {capacity / 1e9:.1f} GB per GPU (the smallest needs "
            f"{best_memory / 1e9:.1f} GB): {change}")


def plan(
    model: Transformer,
    cluster: Cluster,
    global_batch: int,
    *,
    sequence: int | None = None,
    families: str | Sequence[str] = DEFAULT_FAMILIES,
    tensor: int | Sequence[int] | None = None,
    pipeline: int | Sequence[int] | None = None,
    expert: int | Sequence[int] | None = None,
    virtual: int | Sequence[int] = DEFAULT_VIRTUAL,
    microbatch_sizes: int | Sequence[int] = DEFAULT_MICROBATCH_SIZES,
    recompute: str | Sequence[str] = RECOMPUTE,
    zero: int | Sequence[int] = ZERO_STAGES,
    sequence_parallel: bool | Sequence[bool] = (True, False),
    headroom: float = 0.1,
    top_k: int = 3,
    balance: bool = True,
    communication: str = "overlap",
    progress: bool | None = None,
) -> PlanTable:
    """Search the configurations of ``model`` on ``cluster`` for ``global_batch`` samples per step.

    Args:
        model: the ``Transformer`` (its ``microbatch_size`` and ``recompute`` are search axes here).
        cluster: the ``Cluster`` (its ``gpus`` are all used).
        global_batch: samples per optimizer step.
        sequence: tokens per sample (default: the model's).
        families: schedule families (default ``DEFAULT_FAMILIES``); families with ``chunks`` take
            ``virtual`` values, others their own stages per device (``zb-v``: 2).
        tensor, pipeline, expert: sizes to try (default: every divisor that fits: tensor within a
            node, pipeline up to the layers, expert dividing data and the experts of a MoE model).
        virtual: virtual stages per pipeline rank for families with chunks.
        microbatch_sizes, recompute, zero, sequence_parallel: the other axes.
        headroom: fraction of each GPU's memory kept free (0.1: plans use at most 90%).
        top_k: how many of the best configurations get their stages balanced.
        balance: run the stage balancing (``optimize`` with ``StageBalance``).
        communication: the pipeline's communication mode.
        progress: a progress bar on stderr (default: when stderr is a terminal and the plan is long).

    Returns:
        A ``PlanTable``; ``table.best`` is the fastest configuration that fits.

    Raises:
        ConfigError: on bad arguments, or (one line, naming the smallest change that makes it
            feasible) when no configuration fits.
    """
    t0 = time.perf_counter()
    if not isinstance(model, Transformer):
        raise ConfigError(f"plan: model must be a Transformer, got {type(model).__name__}")
    if not isinstance(cluster, Cluster):
        raise ConfigError(f"plan: cluster must be a Cluster, got {type(cluster).__name__}")
    global_batch = check_int("plan: global_batch", global_batch)
    headroom = check_number("plan: headroom", headroom)
    if headroom >= 1:
        raise ConfigError(f"plan: headroom must be below 1, got {headroom!r}")
    top_k = check_int("plan: top_k", top_k, 0)
    if sequence is not None:
        model = dataclasses.replace(model, sequence=check_int("plan: sequence", sequence))
    families = _values("families", families)
    for f in families:
        try:
            schedules.family(f)
        except ScheduleError as error:
            raise ConfigError(f"plan: {error}") from None
    recompute = _values("recompute", recompute, RECOMPUTE)
    zero = _values("zero", zero, ZERO_STAGES)
    sps = _values("sequence_parallel", sequence_parallel, (True, False))
    sizes = tuple(check_int("plan: microbatch size", b) for b in _values("microbatch_sizes", microbatch_sizes))
    virtuals = tuple(check_int("plan: virtual", v) for v in _values("virtual", virtual))
    g, node = cluster.gpus, cluster.devices_per_node
    tensors = [check_int("plan: tensor", t) for t in _values("tensor", tensor)] if tensor is not None else [
        t for t in _divisors(node) if g % t == 0]
    capacity = float(cluster.device.memory) * (1.0 - headroom)

    rejected: Counter = Counter()
    explored = 0
    candidates: list[_Candidate] = []
    for t in tensors:
        pipelines = [check_int("plan: pipeline", p) for p in _values("pipeline", pipeline)] if pipeline is not None \
            else [p for p in _divisors(g // t) if p <= model.layers] if g % t == 0 else []
        for p in pipelines:
            if g % (t * p):
                explored += 1
                rejected["tensor"] += 1
                continue
            d = g // (t * p)
            experts = [1] if model.experts == 1 else (
                [e for e in _divisors(d) if model.experts % e == 0] if expert is None
                else list(_values("expert", expert)))
            shapes = []
            for f in families:
                chunks, per, _ = _family_shape(f)
                if p == 1:  # no pipeline: every family is the same run; keep one
                    if f == families[0]:
                        shapes.append((f, 1))
                    continue
                if chunks:
                    shapes += [(f, v) for v in virtuals if not (v == 1 and f in _CHUNK_ONE_IS_OTHER)]
                    if f not in _CHUNK_ONE_IS_OTHER and 1 not in virtuals:
                        shapes.append((f, 1))
                else:
                    shapes.append((f, per))
            for e in experts:
                for f, v in shapes:
                    for b in sizes:
                        for r in recompute:
                            for z in zero:
                                for sp in sps:
                                    if sp and t == 1:
                                        continue  # sequence parallelism needs a tensor group
                                    explored += 1
                                    c = _Candidate(f, t, p, d, v, e, b, r, z, sp)
                                    if p * v > model.layers:
                                        rejected["stages"] += 1
                                    elif global_batch % (b * d):
                                        rejected["batch"] += 1
                                    else:
                                        candidates.append(c)

    # structural checks and closed forms, cached per cost variant
    costs: dict[tuple, _Costs | str] = {}
    split_rows: dict[int, np.ndarray] = {}
    closed: dict[tuple, tuple[np.ndarray, ...]] = {}
    cluster_key = _cluster_key(cluster)
    lower: list[tuple[float, int]] = []
    static_lb: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for index, c in enumerate(candidates):
        key = (c.tensor, c.expert, c.data, c.zero, c.sequence_parallel, c.microbatch_size, c.recompute)
        if key not in costs:
            variant = dataclasses.replace(model, microbatch_size=c.microbatch_size, recompute=c.recompute)
            par = dataclasses.replace(c.parallelism(), pipeline=1, virtual=1)
            try:
                par.check(variant)
                where = placement(dataclasses.replace(par, pipeline=c.pipeline), cluster)
            except ConfigError as error:
                costs[key] = str(error)
            else:
                full = (variant, par, cluster_key)
                if full not in _COSTS:
                    _remember(_COSTS, full, _Costs(variant, par, cluster, where.links))
                costs[key] = _COSTS[full]
        k = costs[key]
        if isinstance(k, str):
            rejected["tensor"] += 1
            continue
        style = _family_shape(c.family)[2]
        shape = (key, c.pipeline, c.virtual, style)
        if shape not in closed:
            closed[shape] = _closed_form(k, model, c.pipeline, c.virtual, style, split_rows)
        dev_static, dev_act, fwd_before, dev_work, dev_update = closed[shape]
        if np.max(dev_static + dev_act) > capacity:
            rejected["memory"] += 1
            continue
        m = global_batch // (c.microbatch_size * c.data)
        lower.append((float(np.max(fwd_before + m * dev_work + dev_update)), index))
        static_lb[index] = (dev_static, dev_act)

    lower.sort()
    t_enumerate = time.perf_counter() - t0
    # group by graph: the same schedule, pipeline ranks per node and data-parallel size
    groups: dict[tuple, list[int]] = defaultdict(list)
    order: list[tuple] = []
    for _, index in lower:
        c = candidates[index]
        m = global_batch // (c.microbatch_size * c.data)
        spn = placement(c.parallelism(), cluster).stages_per_node
        key = (c.family, c.pipeline, c.virtual, m, spn, c.data)
        if key not in groups:
            order.append(key)
        groups[key].append(index)
    bound = dict((i, b) for b, i in lower)

    rows_out: list[dict[str, Any]] = []
    best = math.inf
    best_memory = min((float(np.max(s + a)) for s, a in static_lb.values()), default=math.inf)
    simulated = 0
    graphs: dict[tuple, Any] = {}
    if progress is None:
        progress = sys.stderr.isatty() and len(lower) >= LONG_PLAN
    bar = Progress(len(lower), bool(progress), label="plan")
    t1 = time.perf_counter()
    t_graph = t_hardware = t_simulate = 0.0
    try:
        for key in order:
            members = [i for i in groups[key] if bound[i] < best * (1 + _BOUND_SLACK)]
            rejected["bound"] += len(groups[key]) - len(members)
            if not members:
                bar.update(len(groups[key]))
                continue
            try:
                cfgs = []
                for i in members:
                    c = candidates[i]
                    variant = dataclasses.replace(model, microbatch_size=c.microbatch_size, recompute=c.recompute)
                    cfgs.append(Configuration(variant, c.parallelism(), cluster, global_batch, schedule=c.family,
                                              communication=communication))
                schedule = cfgs[0].schedule()
            except (ScheduleError, ConfigError):  # the family refuses these sizes
                rejected["schedule"] += len(members)
                bar.update(len(groups[key]))
                continue
            count = np.asarray(peak_activations(schedule), np.float64)
            keep = []
            for i, cfg in zip(members, cfgs):
                dev_static, dev_act = static_lb[i]
                if np.max(dev_static + count * dev_act) > capacity:
                    rejected["memory"] += 1
                else:
                    keep.append((i, cfg))
            if keep:
                if key not in graphs:
                    tg = time.perf_counter()
                    graphs[key] = cfgs[0].graph(schedule)
                    t_graph += time.perf_counter() - tg
                graph = graphs[key]
                th = time.perf_counter()
                hws = _stack([cfg.hardware() for _, cfg in keep])
                ts = time.perf_counter()
                steps, bubbles, memory = (np.asarray(x) for x in _batched(graph, hws))
                t_hardware += ts - th
                t_simulate += time.perf_counter() - ts
                simulated += len(keep)
                for j, (i, cfg) in enumerate(keep):
                    peak = float(np.max(memory[j]))
                    best_memory = min(best_memory, peak)
                    if peak > capacity:
                        rejected["memory (simulated)"] += 1
                        continue
                    step = float(steps[j])
                    best = min(best, step)
                    c = candidates[i]
                    counts = _blocks(np.bincount(cfg.stage_rows()))
                    figures = _metrics(cfg, schedule, step, float(bubbles[j]), memory[j]) | {"bound": bound[i]}
                    rows_out.append(_row(c, cfg, counts, False, figures))
            bar.update(len(groups[key]))
    finally:
        bar.close()
    t_evaluate = time.perf_counter() - t1
    if not rows_out:
        raise ConfigError(_infeasible(model, cluster, global_batch, rejected, best_memory,
                                      float(cluster.device.memory) * (1.0 - headroom), recompute, zero, tensors))
    rows_out.sort(key=lambda r: r["step_time"])

    t2 = time.perf_counter()
    if balance:
        for row in list(rows_out[:top_k]):
            balanced = _balance(row, model, cluster, global_batch, communication, capacity)
            if balanced is not None:
                rows_out.append(balanced)
        rows_out.sort(key=lambda r: r["step_time"])
    t_balance = time.perf_counter() - t2
    seconds = {"enumerate": t_enumerate, "evaluate": t_evaluate, "graphs": t_graph, "hardware": t_hardware,
               "simulate": t_simulate, "balance": t_balance, "total": time.perf_counter() - t0}
    return PlanTable(tuple(rows_out), dict(rejected), explored, simulated, seconds, model, cluster, global_batch,
                     communication)


def _balance(row: dict, model: Transformer, cluster: Cluster, global_batch: int, communication: str,
             capacity: float) -> dict | None:
    """``optimize`` the stage split of ``row``; the balanced row when the exact evaluation confirms it
    is faster and fits, else None."""
    if row["pipeline"] * row["virtual"] < 2:
        return None
    c = _Candidate(row["family"], row["tensor"], row["pipeline"], row["data"], row["virtual"], row["expert"],
                   row["microbatch_size"], row["recompute"], row["zero"], row["sequence_parallel"])
    variant = dataclasses.replace(model, microbatch_size=c.microbatch_size, recompute=c.recompute)
    cfg = Configuration(variant, c.parallelism(), cluster, global_batch, schedule=c.family,
                        communication=communication)
    graph = cfg.graph()
    workload = cfg.workload()
    try:
        found = optimize(graph, workload, StageBalance(stages=graph.stages))
    except ConfigError:
        return None
    counts = _blocks(found.plan.layers_per_stage)
    if counts == row["layers_per_stage"] or min(counts[1:-1] or (1,)) < 1 or min(counts) < 0:
        return None
    try:
        balanced = Configuration(variant, c.parallelism(), cluster, global_batch, schedule=c.family,
                                 communication=communication, layers_per_stage=counts)
        result = balanced.evaluate()
    except ConfigError:
        return None
    if result.step_time >= row["step_time"] or result.memory_per_gpu > capacity:
        return None
    figures = {name: getattr(result, name) for name in FIGURES} | {"bound": row["bound"]}
    return _row(c, balanced, counts, True, figures)


__all__ = ["COLUMNS", "DEFAULT_FAMILIES", "PlanTable", "plan"]
