"""``plan``: the best whole configuration for a model on a cluster, by exhaustive search and simulation.

``plan(model, cluster, global_batch)`` enumerates tensor x context x pipeline x data (x expert) splits,
schedule families, virtual stages, microbatch sizes, recomputation, ZeRO stages and sequence
parallelism, and answers with a ``PlanTable``: every configuration the simulator evaluated (the
same numbers ``Configuration.evaluate()`` gives for it), the best first, and why the others were
rejected. The search:

1. **Enumerate** every combination (``explored``). Structural constraints reject without
   computing anything: sizes multiplying to the GPU count, a tensor group inside a node dividing
   the heads (``Parallelism.check``, ``placement``), ``pipeline x virtual`` stages within the
   model's layers, a global batch divisible by ``microbatch_size x data``, a context size dividing
   ``gpus / (tensor x pipeline)`` (``rejected["context"]``; the sizes searched: ``context``).
2. **Closed forms, per device, before simulating** (numpy over the per-layer table of
   ``diffpipe._workload._parallel.parallel_costs``, computed once per tensor/expert/data/ZeRO/sequence-parallel/
   context and microbatch-size/recompute variant; stage sums are cumulative sums over the uniform split):
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

The search space is ``_space`` (candidates, default sizes), the closed forms ``_bounds``, the
answer ``_table`` (``PlanTable``). Why this module is past 500 lines: ``_search`` is one pass whose
four steps share its state (per-plan caches, bounds, the running best), which ``plan``, the
infeasibility answer and the balancing wrap.
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .. import schedules
from .._checks import check_int
from .._choices import RECOMPUTE, ZERO_STAGES
from .._engine._batch import simulate_members as _simulate_members
from .._engine._communication import AbstractCommunication
from .._engine._communication import communication as get_communication
from .._engine._graph import Graph, bucket_sizes, common_sizes
from .._errors import ConfigError, ScheduleError
from .._machine._cluster import Cluster
from .._model._transformer import Transformer
from .._optimize._knobs import StageBalance
from .._optimize._optimize import optimize
from .._progress import Progress
from .._workload._frameworks import Framework
from .._workload._frameworks import framework as get_framework
from .._workload._parallel import placement
from .._workload._workload import Workload
from ..schedules._analysis import peak_activations
from ._bounds import COSTS, Costs, closed_form, cluster_key
from ._configuration import HEADROOM, Configuration, check_headroom, usable_memory
from ._export import EXPORT_TARGETS, export_problem
from ._space import (
    CHUNK_ONE_IS_OTHER,
    DEFAULT_FAMILIES,
    DEFAULT_MICROBATCH_SIZES,
    DEFAULT_VIRTUAL,
    Candidate,
    checked_values,
    context_sizes,
    divisors,
    family_shape,
)
from ._table import PlanTable, ranked

#: Relative slack on the step-time bound (float32 simulation against float64 closed forms).
_BOUND_SLACK = 1e-4


# -- evaluation -----------------------------------------------------------------------------------------
#: ``_Shapes``: a graph's exact evaluation runs on a shape the call already uses when that shape
#: has at most this many times the rows of the graph's own size bucket (one compiled program for
#: several buckets; a padded evaluation costs about its rows: a few milliseconds here, against about
#: one second to compile a program). ``_shared_sizes``: stage balancing shares one descent among
#: graphs within this ratio of nodes.
SHAPE_RATIO = 8
#: ``_Shapes``: the graphs of the first this many groups (in bound order, the ones the search
#: simulates first) choose the call's first shape, so that the larger of them do not each compile one.
SHAPE_LOOKAHEAD = 16


class _Shapes:
    """The padded sizes (``pad_graph``'s) of ``plan``'s exact evaluations in one call, per
    communication setting: a graph runs on the smallest shape already in use that holds its size
    bucket (``bucket_sizes``) within ``SHAPE_RATIO`` of its rows, else on its bucket, which is then
    in use. ``seed`` starts a setting with one shape holding several graphs' buckets (the largest,
    and each other within the ratio of it). Padding never changes a result (``pad_graph``), so this
    chooses only how many programs the call compiles (docs/architecture.md, "Compilation")."""

    def __init__(self) -> None:
        self.used: dict[tuple, list[dict[str, int]]] = {}

    def seed(self, graphs: Sequence[Graph]) -> None:
        by_setting: dict[tuple, list[dict[str, int]]] = {}
        for g in graphs:
            by_setting.setdefault(self._setting(g), []).append(bucket_sizes(g))
        for setting, buckets in by_setting.items():
            buckets.sort(key=lambda b: b["nodes"], reverse=True)
            shape = buckets[0]
            for b in buckets[1:]:
                merged = {name: max(shape[name], b[name]) for name in shape}
                if merged["nodes"] <= SHAPE_RATIO * b["nodes"]:
                    shape = merged
            self.used.setdefault(setting, []).append(shape)

    def pad_to(self, graph: Graph) -> dict[str, int]:
        own = bucket_sizes(graph)
        shapes = self.used.setdefault(self._setting(graph), [])
        holding = [s for s in shapes if s["nodes"] <= SHAPE_RATIO * own["nodes"] and all(
            s[name] >= own[name] for name in own)]
        if holding:
            return min(holding, key=lambda s: s["nodes"])
        shapes.append(own)
        return own

    @staticmethod
    def _setting(graph: Graph) -> tuple:
        return (graph.communication, graph.devices_per_node)


#: The ``ConfigResult`` figures a plan row reports.
FIGURES = ("step_time", "tokens_per_second_per_gpu", "mfu", "memory_per_gpu", "capacity", "bubble_ratio",
           "communication_share")


def _metrics(cfg: Configuration, schedule: Any, step: float, bubble: float, memory: np.ndarray) -> dict[str, Any]:
    """The figures ``Configuration.evaluate`` reports, from a simulated step (``Configuration.figures``)."""
    figures = cfg.figures(schedule, step, bubble, memory)
    return {name: figures[name] for name in FIGURES}


def _row(c: Candidate, cfg: Configuration, counts: tuple[int, ...], balanced: bool, figures: dict) -> dict:
    return {"family": c.family, "tensor": c.tensor, "context": c.context, "pipeline": c.pipeline, "data": c.data,
            "virtual": c.virtual,
            "expert": c.expert, "expert_tensor": c.tensor if c.expert_tensor is None else c.expert_tensor,
            "microbatch_size": c.microbatch_size, "microbatches": cfg.microbatches,
            "recompute": c.recompute, "zero": c.zero, "sequence_parallel": c.sequence_parallel,
            "layers_per_stage": tuple(int(x) for x in counts), "balanced": balanced, **figures}


def _blocks(rows_per_stage: Sequence[int]) -> tuple[int, ...]:
    """Transformer blocks per stage from ``Workload`` rows per stage (embedding and head rows off)."""
    counts = [int(x) for x in rows_per_stage]
    counts[0] -= 1
    counts[-1] -= 1
    return tuple(counts)


#: Set while ``plan`` checks a suggested change: the search stops at the first configuration that
#: fits, and an infeasible answer is not checked again (no recursion).
_CHECKING: contextvars.ContextVar[bool] = contextvars.ContextVar("diffpipe_plan_checking", default=False)
#: The most suggested changes an infeasible plan checks (each is a search of its own).
MAX_SUGGESTIONS = 4


def _infeasible(model: Transformer, cluster: Cluster, global_batch: int, rejected: Counter, best_memory: float,
                capacity: float, recompute: tuple, zero: tuple, tensors: list[int], simulated: bool = False,
                contexts: tuple[int, ...] = (1,)) -> tuple[str, list]:
    """Why nothing fits (one line, with the binding constraint's numbers) and the changes that
    might make it fit, smallest first: ``(text, plan keyword overrides)`` (checked by the caller).
    ``best_memory``: the smallest simulated peak (the figure ``simulate`` prints for that
    configuration), else the smallest closed-form lower bound (``simulated`` says which)."""
    g, node = cluster.gpus, cluster.devices_per_node
    if rejected.get("memory", 0) + rejected.get("memory (simulated)", 0) == 0 or not math.isfinite(best_memory):
        main = max(rejected, key=rejected.get) if rejected else "nothing to evaluate"
        if main == "batch":
            unit = g // max(1, min(tensors or [1]))
            multiple = -(-global_batch // unit) * unit
            return (f"plan: no split divides global_batch={global_batch} by microbatch_size x data on {g} GPUs",
                    [(f"use a global batch that is a multiple of {unit} (e.g. {multiple})",
                      {"global_batch": multiple})])
        if main == "tensor":
            return (f"plan: no tensor size inside a {node}-GPU node divides the model's heads "
                    f"({model.heads}) and the GPU count {g}", [])
        return f"plan: no configuration can be evaluated on {g} GPUs (most rejected for: {main})", []
    reason = (f"plan: no configuration fits {capacity / 1e9:.1f} GB per GPU (memory is the binding constraint: "
              + (f"the smallest simulated needs {best_memory / 1e9:.1f} GB)" if simulated else
                 f"the smallest candidate needs at least {best_memory / 1e9:.1f} GB)"))
    changes: list[tuple[str, dict[str, Any]]] = []
    if "full" not in recompute:
        changes.append(("allow recompute='full'", {"recompute": (*recompute, "full")}))
    if 3 not in zero:
        changes.append(("allow zero=3", {"zero": (*zero, 3)}))
    if node not in tensors and g % node == 0:
        changes.append((f"allow tensor={node}", {"tensor": (*tensors, node)}))
    wider = 2 * max(contexts)  # split the sequence further: activations per GPU fall by the context size
    if model.flash_attention and model.sequence % (2 * wider) == 0 and g % wider == 0:
        changes.append((f"allow context={wider}", {"context": (*contexts, wider)}))
    # a first guess at the GPU count; _checked_suggestion searches from it for the fewest that fit
    more = _resized(cluster, max(2, math.ceil(best_memory / capacity)) * g)
    if more is not None:
        changes.append((f"use {more.gpus} GPUs", {"cluster": more}))
    return reason, changes


def _resized(cluster: Cluster, gpus: int) -> Cluster | None:
    """``cluster`` with ``gpus`` GPUs (its device, node size, link bandwidths and latencies), or
    None past ``MAX_GPUS`` or for a count that is not whole nodes."""
    try:
        return Cluster(cluster.device, gpus, cluster.devices_per_node,
                       intra=(cluster.intra_bandwidth, cluster.intra_latency),
                       inter=(cluster.inter_bandwidth, cluster.inter_latency))
    except ConfigError:
        return None


def _fits(request: dict[str, Any], change: dict[str, Any]) -> bool:
    """Whether the search finds a configuration that fits with ``change`` applied to ``request``."""
    try:
        plan(**{**request, **change}, top_k=0, balance=False, progress=False)
    except ConfigError:
        return False
    return True


def _fewest_gpus(request: dict[str, Any], guess: Cluster) -> tuple[Cluster, int] | None:
    """The fewest GPUs from which the search finds a configuration that fits, in whole nodes (in
    multiples of the request's GPUs below a node), and the largest count checked not to fit (one
    unit fewer, or the request's own): ``(cluster, gpus)``; None when neither ``guess`` (the memory
    bound's estimate) nor twice it fits. From the first of those that fits it bisects down to the
    largest count that did not."""
    base = request["cluster"]
    unit = base.devices_per_node if base.gpus % base.devices_per_node == 0 else base.gpus
    low, high, cluster = base.gpus // unit, guess.gpus // unit, guess
    failed = base.gpus  # the largest count checked not to fit
    if not _fits(request, {"cluster": cluster}):  # the guess, then twice it (each failed search is a whole one)
        low, high, failed = high, 2 * high, high * unit
        cluster = _resized(base, high * unit)
        if cluster is None or not _fits(request, {"cluster": cluster}):
            return None
    while high - low > 1:
        middle = (low + high) // 2
        trial = _resized(base, middle * unit)  # None: not whole nodes (a request below one node)
        if trial is not None and _fits(request, {"cluster": trial}):
            high, cluster = middle, trial
        else:
            low, failed = middle, (middle * unit if trial is not None else failed)
    return cluster, failed


def _checked_suggestion(reason: str, changes: list, request: dict[str, Any], bar: Progress | None = None) -> str:
    """``reason`` and the first of ``changes`` after which the search finds a configuration that
    fits (each re-run with the change; a GPU count is searched for the fewest that fit,
    ``_fewest_gpus``); when none does, the line says so. ``bar`` shows which change is checked."""
    if _CHECKING.get():
        return reason
    tried = []
    token = _CHECKING.set(True)
    try:
        singles = [(text, change) for text, change in changes[:MAX_SUGGESTIONS]]
        together = {k: v for _, change in singles for k, v in change.items()}  # the largest GPU count last
        texts = [t for t, c in singles if "cluster" not in c] + [t for t, c in singles if "cluster" in c][-1:]
        combined = [("together: " + ", ".join(texts), together)] if len(singles) > 1 else []
        for text, change in singles + combined:
            tried.append(text)
            if bar is not None:
                bar.stage(f"checking what fits: {text}")
            if "cluster" in change and change is not together:
                if found := _fewest_gpus(request, change["cluster"]):
                    more, below = found
                    return f"{reason}: use {more.gpus} GPUs ({below} do not fit)"
                tried[-1] = f"use {change['cluster'].gpus} or {2 * change['cluster'].gpus} GPUs"  # what it checked
            elif _fits(request, change):
                return f"{reason}: {text}"
        if combined:
            tried.pop()
    finally:
        _CHECKING.reset(token)
    if not tried:
        return reason
    return f"{reason}; none of these alone makes it fit: {'; '.join(tried)} (use a smaller model or more GPUs)"


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
    expert_tensor: int | Sequence[int] | None = None,
    virtual: int | Sequence[int] | None = None,
    context: int | Sequence[int] | None = None,
    microbatch_sizes: int | Sequence[int] = DEFAULT_MICROBATCH_SIZES,
    recompute: str | Sequence[str] = RECOMPUTE,
    zero: int | Sequence[int] = ZERO_STAGES,
    sequence_parallel: bool | Sequence[bool] = (True, False),
    headroom: float = HEADROOM,
    top_k: int = 3,
    balance: bool = True,
    communication: str | AbstractCommunication = "overlap",
    progress: bool | None = None,
    export: str | None = None,
    framework: str | Framework | None = None,
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
            node, pipeline up to the layers, expert dividing data and the experts of a MoE model; with
            ``expert_tensor`` given, every expert size the folding allows: ``expert_tensor x expert``
            dividing ``tensor x context x data``).
        expert_tensor: expert tensor-parallel sizes to try (``Parallelism.expert_tensor``; default:
            the tensor size only, Megatron-LM's default; 1 with ``export="megatron"`` for a MoE
            model with biases, the only size Megatron-LM runs it at; the tensor size and 1 with
            ``export="torchtitan"``, whose main runs experts at 1 with expert parallelism and at the
            tensor size without); sizes that do not fit a
            configuration (``expert_tensor x expert`` not dividing ``tensor x context x data``) are
            skipped for it.
        virtual: virtual stages per pipeline rank for families with chunks (default
            ``DEFAULT_VIRTUAL``; given, at least one of ``families`` must take chunks).
        context: context-parallel sizes to try (default: 1, and from a sequence of
            ``CONTEXT_SEQUENCE`` tokens on with flash attention every power of two ``c`` with at least
            ``CONTEXT_MIN_TOKENS`` tokens per rank and the sequence a multiple of ``2c``); each must
            divide ``gpus / (tensor x pipeline)``.
        microbatch_sizes, recompute, zero, sequence_parallel: the other axes.
        headroom: fraction of each GPU's memory kept free (``HEADROOM``, 0.1: plans use at most 90%;
            ``Configuration.evaluate`` applies the same rule to ``fits``).
        top_k: how many of the best configurations get their stages balanced.
        balance: run the stage balancing (``optimize`` with ``StageBalance``).
        communication: the pipeline's communication mode: a name (``overlap`` by default) or an
            ``AbstractCommunication`` (a calibrated machine's ``calibrate.TorchRuntime``), as
            ``Configuration`` takes it.
        progress: progress on stderr with the stage (enumerating, searching: compiling / simulating,
            balancing): a bar on a terminal, plain lines elsewhere (``diffpipe._progress``); None
            (default): once the plan has run ``DELAY`` (2) seconds; True: from the start; False: never.
        export: ``"megatron"`` or ``"torchtitan"``: search only what that framework runs
            (``export_problem``; ``rejected["megatron export"]``, ...), so that every row exports.
        framework: the training framework each configuration is priced for (``Configuration``'s
            ``framework``: its overlap and gradient precision); None: nothing overlapped.

    Returns:
        A ``PlanTable``; ``table.best`` is the fastest configuration that fits.

    Raises:
        ConfigError: on bad arguments, or (one line, naming the smallest change that makes it
            feasible) when no configuration fits.
    """
    if not isinstance(progress, bool) and progress is not None:
        raise ConfigError(f"plan: progress must be True, False or None, got {progress!r}")
    bar = Progress("plan", progress is not False, show_now=progress is True)
    try:
        return _search(model, cluster, global_batch, sequence=sequence, families=families, tensor=tensor,
                       pipeline=pipeline, expert=expert, expert_tensor=expert_tensor, virtual=virtual,
                       context=context, microbatch_sizes=microbatch_sizes,
                       recompute=recompute, zero=zero, sequence_parallel=sequence_parallel, headroom=headroom,
                       top_k=top_k, balance=balance, communication=communication, export=export, bar=bar,
                       framework=None if framework is None else get_framework(framework))
    finally:
        bar.close()


def _search(model: Transformer, cluster: Cluster, global_batch: int, *, sequence: int | None, families: Any,
            tensor: Any, pipeline: Any, expert: Any, expert_tensor: Any, virtual: Any, context: Any,
            microbatch_sizes: Any,
            recompute: Any, zero: Any,
            sequence_parallel: Any, headroom: float, top_k: int, balance: bool,
            communication: str | AbstractCommunication,
            export: str | None, bar: Progress, framework: Framework | None = None) -> PlanTable:
    """``plan``'s search (its arguments; ``bar`` the progress)."""
    t0 = time.perf_counter()
    if not isinstance(model, Transformer):
        raise ConfigError(f"plan: model must be a Transformer, got {type(model).__name__}")
    if not isinstance(cluster, Cluster):
        raise ConfigError(f"plan: cluster must be a Cluster, got {type(cluster).__name__}")
    global_batch = check_int("plan: global_batch", global_batch)
    headroom = check_headroom("plan", headroom)
    top_k = check_int("plan: top_k", top_k, 0)
    if not isinstance(balance, bool):
        raise ConfigError(f"plan: balance must be True or False, got {balance!r}")
    get_communication(communication, what="plan: communication")  # a name or a mode object, else one line
    if sequence is not None:
        model = dataclasses.replace(model, sequence=check_int("plan: sequence", sequence))
    families = checked_values("families", families)
    for f in families:
        try:
            schedules.family(f)
        except ScheduleError as error:
            raise ConfigError(f"plan: {error}") from None
    recompute = checked_values("recompute", recompute, RECOMPUTE)
    zero = checked_values("zero", zero, ZERO_STAGES)
    sps = checked_values("sequence_parallel", sequence_parallel, (True, False))
    sizes = tuple(check_int("plan: microbatch size", b) for b in checked_values("microbatch_sizes", microbatch_sizes))
    if virtual is not None and not any(family_shape(f)[0] for f in families):
        raise ConfigError(f"plan: virtual={virtual!r} cannot take effect: none of {', '.join(families)} takes "
                          "chunks (e.g. interleaved-1f1b does)")
    virtuals = tuple(check_int("plan: virtual", v) for v in checked_values("virtual", DEFAULT_VIRTUAL if virtual is None
                                                                     else virtual))
    contexts = context_sizes(model, context)
    if expert is not None:
        experts_given = [check_int("plan: expert", e) for e in checked_values("expert", expert)]
        if model.experts == 1 and experts_given != [1]:
            raise ConfigError(f"plan: expert={expert!r} needs a mixture-of-experts model (this one is dense)")
        for e in experts_given:
            if model.experts % e:
                raise ConfigError(f"plan: expert={e} does not divide the model's {model.experts} experts")
    expert_tensors: list[int | None] = [None]  # the tensor size, Megatron-LM's default
    if expert_tensor is None and export == "megatron" and model.experts > 1 and model.bias:
        expert_tensors = [1]  # the only expert tensor size Megatron-LM runs MoE layers with biases at
    if expert_tensor is None and export == "torchtitan" and model.experts > 1:
        # torchtitan's main has no expert tensor degree: the experts shard like the tensor group without
        # expert parallelism (None) and over the expert ranks alone with it (1)
        expert_tensors = [None, 1]
    if expert_tensor is not None:
        expert_tensors = [check_int("plan: expert_tensor", x) for x in checked_values("expert_tensor", expert_tensor)]
        if model.experts == 1:
            raise ConfigError(f"plan: expert_tensor={expert_tensor!r} needs a mixture-of-experts model (this one "
                              "is dense)")
    g, node = cluster.gpus, cluster.devices_per_node
    tensors = [check_int("plan: tensor", t) for t in checked_values("tensor", tensor)] if tensor is not None else [
        t for t in divisors(node) if g % t == 0]
    if tuple(sps) == (True,) and all(t == 1 for t in tensors):
        raise ConfigError("plan: sequence_parallel=True needs a tensor size above 1 (it splits the tensor group); "
                          f"tensor sizes searched: {', '.join(map(str, tensors))}")
    capacity = usable_memory(cluster.device.memory, headroom)

    if export is not None and export not in EXPORT_TARGETS:
        raise ConfigError(f"plan: export must be one of {', '.join(EXPORT_TARGETS)} (or None), got {export!r}")
    rejected: Counter = Counter()
    export_reasons: Counter = Counter()
    explored = 0
    candidates: list[Candidate] = []
    for t in tensors:
        pipelines = [check_int("plan: pipeline", p) for p in checked_values("pipeline", pipeline)] \
            if pipeline is not None else [p for p in divisors(g // t) if p <= model.layers] if g % t == 0 else []
        for p, cp in ((p, cp) for p in pipelines for cp in contexts):
            if g % (t * p):
                explored += 1
                rejected["tensor"] += 1
                continue
            if (g // (t * p)) % cp:
                explored += 1
                rejected["context"] += 1
                continue
            d = g // (t * p * cp)
            splits = []  # (expert, expert_tensor): the expert layers' decomposition
            for et in expert_tensors:
                if et is not None and et == t and None in expert_tensors:
                    continue  # the tensor size twice (None is it): one search
                if (t * cp * d) % (t if et is None else et):
                    explored += 1
                    rejected["expert"] += 1
                    continue
                folded = t * cp * d // (t if et is None else et)  # the ranks an expert group may span
                experts = [1] if model.experts == 1 else (
                    [e for e in divisors(d if et is None else folded) if model.experts % e == 0] if expert is None
                    else list(checked_values("expert", expert)))
                for e in experts:
                    if folded % e:
                        explored += 1
                        rejected["expert"] += 1
                    else:
                        splits.append((e, et))
            shapes = []
            for f in families:
                chunks, per, _ = family_shape(f)
                if p == 1:  # no pipeline: every family is the same run; keep one
                    if f == families[0]:
                        shapes.append((f, 1))
                    continue
                if chunks:
                    shapes += [(f, v) for v in virtuals if not (v == 1 and f in CHUNK_ONE_IS_OTHER)]
                    if f not in CHUNK_ONE_IS_OTHER and 1 not in virtuals:
                        shapes.append((f, 1))
                else:
                    shapes.append((f, per))
            for e, et in splits:
                for f, v in shapes:
                    for b in sizes:
                        for r in recompute:
                            for z in zero:
                                for sp in sps:
                                    if sp and t == 1:
                                        continue  # sequence parallelism needs a tensor group
                                    explored += 1
                                    c = Candidate(f, t, p, d, v, e, b, r, z, sp, cp, et)
                                    if p * v > model.layers:
                                        rejected["stages"] += 1
                                    elif global_batch % (b * d):
                                        rejected["batch"] += 1
                                    elif export and (why := _export_problem(export, c, global_batch, model)):
                                        rejected[f"{export} export"] += 1
                                        export_reasons[why] += 1
                                    else:
                                        candidates.append(c)

    # structural checks and closed forms, cached per cost variant
    costs: dict[tuple, Costs | str] = {}
    split_rows: dict[int, np.ndarray] = {}
    closed: dict[tuple, tuple[np.ndarray, ...]] = {}
    cluster_id = cluster_key(cluster)
    lower: list[tuple[float, int]] = []
    static_lb: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    needs: dict[int, float] = {}  # candidate -> the tightest known lower bound on its peak memory
    bar.stage("enumerating (closed-form bounds)", len(candidates))
    for index, c in enumerate(candidates):
        bar.update(1)
        key = (c.tensor, c.expert, c.expert_tensor, c.data, c.zero, c.sequence_parallel, c.microbatch_size,
               c.recompute, c.context)
        if key not in costs:
            variant = dataclasses.replace(model, microbatch_size=c.microbatch_size, recompute=c.recompute)
            par = dataclasses.replace(c.parallelism(), pipeline=1, virtual=1)
            try:
                par.check(variant)
                where = placement(dataclasses.replace(par, pipeline=c.pipeline), cluster)
            except ConfigError as error:
                costs[key] = str(error)
            else:
                full = (variant, par, cluster_id, framework)
                if full not in COSTS:
                    COSTS[full] = Costs(variant, par, cluster, where.links, framework, cluster_id)
                costs[key] = COSTS[full]
        k = costs[key]
        if isinstance(k, str):
            rejected["tensor"] += 1
            continue
        style = family_shape(c.family)[2]
        shape = (key, c.pipeline, c.virtual, style)
        if shape not in closed:
            closed[shape] = closed_form(k, model, c.pipeline, c.virtual, style, split_rows)
        dev_static, dev_act, fwd_before, dev_work, dev_update = closed[shape]
        needs[index] = float(np.max(dev_static + dev_act))
        if needs[index] > capacity:
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
        key = (c.family, c.pipeline, c.virtual, m, spn, c.data, c.context)
        if key not in groups:
            order.append(key)
        groups[key].append(index)
    bound = dict((i, b) for b, i in lower)
    shapes = _Shapes()
    if not _CHECKING.get():  # checking a suggestion stops at its first fit: no look ahead
        shapes.seed(_first_graphs(order[:SHAPE_LOOKAHEAD], groups, candidates, model, cluster, global_batch,
                                  communication, framework))

    rows_out: list[dict[str, Any]] = []
    best = math.inf
    best_memory = math.inf  # the smallest simulated peak
    simulated = 0
    graphs: dict[tuple, Any] = {}
    bar.stage("searching", len(lower))
    t1 = time.perf_counter()
    t_graph = t_hardware = t_simulate = 0.0
    try:
        for key in order:
            members = [i for i in groups[key] if bound[i] < best * (1 + _BOUND_SLACK)]
            rejected["bound"] += len(groups[key]) - len(members)
            if not members:
                bar.update(len(groups[key]))
                continue
            bar.phase(f"searching: compiling {key[0]} PP{key[1]}" + (f" V{key[2]}" if key[2] > 1 else "")
                      + f", {key[3]} microbatches")
            try:
                cfgs = []
                for i in members:
                    c = candidates[i]
                    variant = dataclasses.replace(model, microbatch_size=c.microbatch_size, recompute=c.recompute)
                    cfgs.append(Configuration(variant, c.parallelism(), cluster, global_batch, schedule=c.family,
                                              communication=communication, framework=framework))
                schedule = cfgs[0].schedule()
            except (ScheduleError, ConfigError):  # the family refuses these sizes
                rejected["schedule"] += len(members)
                for i in members:
                    needs.pop(i, None)
                bar.update(len(groups[key]))
                continue
            count = np.asarray(peak_activations(schedule), np.float64)
            keep = []
            for i, cfg in zip(members, cfgs):
                dev_static, dev_act = static_lb[i]
                needs[i] = max(needs[i], float(np.max(dev_static + count * dev_act)))
                if needs[i] > capacity:
                    rejected["memory"] += 1
                else:
                    keep.append((i, cfg))
            if keep:
                if key not in graphs:
                    tg = time.perf_counter()
                    graphs[key] = cfgs[0].graph(schedule)
                    t_graph += time.perf_counter() - tg
                graph = graphs[key]
                bar.phase(f"searching: simulating {len(keep)} configuration(s)")
                th = time.perf_counter()
                hws = [cfg.hardware() for _, cfg in keep]
                ts = time.perf_counter()
                steps, bubbles, memory = _simulate_members(graph, hws, shapes.pad_to(graph))
                t_hardware += ts - th
                t_simulate += time.perf_counter() - ts
                simulated += len(keep)
                for j, (i, cfg) in enumerate(keep):
                    peak = float(np.max(memory[j]))
                    needs[i] = peak
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
            if rows_out and _CHECKING.get():  # checking a suggestion: one configuration that fits is enough
                break
    finally:
        bar.phase("searching: done")
    t_evaluate = time.perf_counter() - t1
    if not rows_out and export_reasons and rejected[f"{export} export"] == max(rejected.values()):
        why, _ = export_reasons.most_common(1)[0]
        raise ConfigError(f"plan: no configuration of this search exports to {export}: {why} "
                          f"({rejected[f'{export} export']} of {explored} rejected for it)")
    if not rows_out:
        simulated = math.isfinite(best_memory)
        if not simulated:
            best_memory = min(needs.values(), default=math.inf)
        reason, changes = _infeasible(model, cluster, global_batch, rejected, best_memory, capacity, recompute,
                                      zero, tensors, simulated, contexts)
        request = dict(model=model, cluster=cluster, global_batch=global_batch, sequence=sequence, families=families,
                       tensor=tensor,
                       pipeline=pipeline, expert=expert, expert_tensor=expert_tensor, virtual=virtual,
                       context=context, microbatch_sizes=sizes, recompute=recompute, zero=zero, sequence_parallel=sps,
                       headroom=headroom, communication=communication, framework=framework)
        raise ConfigError(_checked_suggestion(reason, changes, request, bar))
    rows_out = ranked(rows_out)

    t2 = time.perf_counter()
    if balance:
        bar.stage("balancing the best stages", min(top_k, len(rows_out)))
        problems = [_balance_problem(row, model, cluster, global_batch, communication, framework)
                    for row in rows_out[:top_k]]
        shared = _shared_sizes([p.graph for p in problems if p is not None])
        for row, problem in zip(list(rows_out[:top_k]), problems):
            balanced = None if problem is None else _balance(row, problem, capacity, shared.get(id(problem.graph)),
                                                             shapes)
            if balanced is not None:
                rows_out.append(balanced)
            bar.update(1)
        rows_out = ranked(rows_out)
    t_balance = time.perf_counter() - t2
    seconds = {"enumerate": t_enumerate, "evaluate": t_evaluate, "graphs": t_graph, "hardware": t_hardware,
               "simulate": t_simulate, "balance": t_balance, "total": time.perf_counter() - t0}
    return PlanTable(tuple(rows_out), dict(rejected), explored, simulated, seconds, model, cluster, global_batch,
                     communication, headroom, framework)


def _first_graphs(keys: Sequence[tuple], groups: dict[tuple, list[int]], candidates: Sequence[Candidate],
                  model: Transformer, cluster: Cluster, global_batch: int, communication: Any,
                  framework: Framework | None) -> list[Graph]:
    """The graphs of the groups ``keys`` (each of its first candidate; kept, so the search does not
    build them again); a group whose family refuses its sizes is left out (the search says why)."""
    graphs = []
    for key in keys:
        c = candidates[groups[key][0]]
        variant = dataclasses.replace(model, microbatch_size=c.microbatch_size, recompute=c.recompute)
        try:
            cfg = Configuration(variant, c.parallelism(), cluster, global_batch, schedule=c.family,
                                communication=communication, framework=framework)
            graphs.append(cfg.graph(cfg.schedule()))
        except (ScheduleError, ConfigError):
            continue
    return graphs


def _export_problem(framework: str, c: Candidate, global_batch: int, model: Transformer) -> str | None:
    """``export_problem`` of a candidate (its microbatches per pipeline from the global batch); and,
    for Megatron-LM, ZeRO-2: its export is the distributed optimizer, which keeps the whole gradient
    buffer (Megatron-LM ``docs/user-guide/features/dist_optimizer.md``: ``4 + 16/d`` bytes per
    parameter with fp16 parameters and gradients), i.e. ZeRO-1's memory, which zero=1 searches."""
    if framework == "megatron" and c.zero == 2:
        return "Megatron-LM runs ZeRO-2 as its distributed optimizer, whose memory is ZeRO-1's: search zero=1"
    microbatches = global_batch // (c.microbatch_size * c.data)
    return export_problem(framework, c.family, c.parallelism(), microbatches, model)


class _BalanceProblem(NamedTuple):
    """What ``_balance`` optimizes: a row's candidate, its model variant and configuration, graph and workload."""

    candidate: Candidate
    variant: Transformer
    config: Configuration
    graph: Graph
    workload: Workload


def _balance_problem(row: dict, model: Transformer, cluster: Cluster, global_batch: int,
                     communication: str | AbstractCommunication,
                     framework: Framework | None) -> _BalanceProblem | None:
    """The stage-balancing problem of ``row``; None when it has fewer than two stages."""
    if row["pipeline"] * row["virtual"] < 2:
        return None
    et = row.get("expert_tensor", row["tensor"])
    c = Candidate(row["family"], row["tensor"], row["pipeline"], row["data"], row["virtual"], row["expert"],
                   row["microbatch_size"], row["recompute"], row["zero"], row["sequence_parallel"],
                   row.get("context", 1), None if et == row["tensor"] else et)
    variant = dataclasses.replace(model, microbatch_size=c.microbatch_size, recompute=c.recompute)
    cfg = Configuration(variant, c.parallelism(), cluster, global_batch, schedule=c.family,
                        communication=communication, framework=framework)
    return _BalanceProblem(c, variant, cfg, cfg.graph(), cfg.workload())


def _shared_sizes(graphs: Sequence[Graph]) -> dict[int, dict[str, int]]:
    """Per graph (by ``id``), the sizes ``optimize`` pads it to (``pad_to``): the common sizes of the
    graphs with its communication setting, stage counts included (a smaller one runs as a padded
    stage split, ``PaddedStageBalance``), so that one compiled descent and exact evaluator serve
    them all (``docs/architecture.md``, "Compilation"). A graph shares only with graphs whose common
    sizes have at most ``SHAPE_RATIO`` times its nodes (from the largest down: the descent and the
    local search cost about the padded graph's rows, so a 2-stage row is not run on a 32-stage
    row's graph); a graph alone in its group is not padded."""
    settings: dict[tuple, list[Graph]] = {}
    for g in graphs:
        settings.setdefault((g.communication,), []).append(g)
    groups: list[list[Graph]] = []
    for members in settings.values():
        members = sorted(members, key=_nodes, reverse=True)
        while members:
            group = [g for g in members if _nodes(members[0]) <= SHAPE_RATIO * _nodes(g)]
            groups.append(group)
            members = [g for g in members if all(g is not h for h in group)]
    return {id(g): common_sizes(group) for group in groups if len(group) > 1 for g in group}


def _nodes(graph: Graph) -> int:
    return common_sizes([graph])["nodes"]


def _balance(row: dict, problem: _BalanceProblem, capacity: float, pad_to: dict[str, int] | None,
             shapes: _Shapes) -> dict | None:
    """``optimize`` the stage split of ``row`` (its graph padded to ``pad_to`` when given); the
    balanced row when the exact evaluation confirms it is faster and fits (on the search's shapes),
    else None."""
    c, variant, cfg, graph, workload = problem
    try:
        found = optimize(graph, workload, StageBalance(stages=graph.stages), pad_to=pad_to)
    except ConfigError:
        return None
    counts = _blocks(found.plan.layers_per_stage)
    if counts == row["layers_per_stage"] or min(counts[1:-1] or (1,)) < 1 or min(counts) < 0:
        return None
    try:
        balanced = Configuration(variant, c.parallelism(), cfg.cluster, cfg.global_batch, schedule=c.family,
                                 communication=cfg.communication, layers_per_stage=counts, framework=cfg.framework)
        # the search's own batched program of this graph's shape (compiled already): no program
        # per graph structure; the figures are ``evaluate()``'s bit for bit (tests/test_plan.py)
        steps, bubbles, memory = _simulate_members(graph, [balanced.hardware()], shapes.pad_to(graph))
        if math.isfinite(float(steps[0])):
            figures = _metrics(balanced, cfg.schedule(), float(steps[0]), float(bubbles[0]), memory[0])
        else:  # a check failed inside the program: evaluate reruns the checks eagerly, naming the culprit
            result = balanced.evaluate()
            figures = {name: getattr(result, name) for name in FIGURES}
    except ConfigError:
        return None
    if figures["step_time"] >= row["step_time"] or figures["memory_per_gpu"] > capacity:
        return None
    return _row(c, balanced, counts, True, figures | {"bound": row["bound"]})


__all__ = ["plan"]
