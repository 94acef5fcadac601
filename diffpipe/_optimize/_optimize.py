"""``optimize``: gradient descent on the smoothed makespan, then rounding and an exact local search.

The loss of parameters ``p`` of knobs ``k`` (``AbstractKnob``s: ``StageBalance``, ``MicrobatchSplit``,
or a user's own; each sets its own ``Hardware`` fields) is

    makespan(graph, k(p, workload), temperature=tau) / scale
        + memory_penalty * sum_d max(0, peak_memory_d / capacity_d - 1)^2

with ``scale`` the exact makespan of the best baseline, so that temperatures and the penalty are
relative and the loss is about 1. An optax transformation runs it for ``steps`` steps inside one
``lax.scan`` while ``tau`` anneals geometrically towards exact. The continuous optimum is then
rounded by every knob (``round``: floor/ceiling combinations of the stage boundaries, largest
remainders for samples), and a steepest-descent local search over the knobs' ``neighbours`` (any
combination of boundaries moving by one layer; one sample moving between two microbatches) runs
with the batched exact simulator, from the rounded plan, from the best baseline and from the knobs'
other starts. The chosen plan is evaluated afresh by the exact simulator at the end; nothing else
is ever reported. ``optimize`` only calls the knobs' methods: it never branches on a knob's type.

Why one module past 500 lines: the descent, the rounding and the exact local search are one
algorithm over one ``Problem`` and one batched exact evaluator.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from .._caches import BoundedDict, result_cache_dir
from .._checks import is_positive_int
from .._engine._batch import evaluate_batched
from .._engine._communication import node_size, topology
from .._engine._graph import Graph, common_sizes, compile, pad_graph
from .._engine._hardware import STAGE_FIELDS, Hardware, check_split_known, pad_hardware
from .._engine._jit_checks import nan_checked
from .._engine._simulate import makespan, peak_in_flight, peak_memory
from .._errors import ConfigError
from .._partition import uniform_partition
from .._results import csv_text, json_text, markdown_table
from .._store import Key, Unkeyable
from .._store import load as load_kept
from .._store import save as keep
from .._workload._workload import Workload, check_static_memory
from ..schedules import Schedule
from ..schedules._analysis import peak_activations, weight_versions
from ._baselines import StagePlan, make_plan
from ._knobs import AbstractKnob, PaddedStageBalance, Problem, StageBalance, as_knobs, knob_hardware, value_hardware

#: Default optimizer: Adam (Kingma and Ba, ICLR 2015) on the knobs' logits. One module-level object,
#: so repeated calls reuse the compiled loop.
DEFAULT_OPTIMIZER = optax.adam(5e-2)
#: Default annealing: temperature relative to the baseline makespan, from the first to the second
#: value geometrically over the steps.
DEFAULT_TEMPERATURE = (1e-2, 1e-4)
#: Weight of the squared relative memory overflow in the loss (the makespan term is about 1).
DEFAULT_MEMORY_PENALTY = 100.0
#: Rounds of steepest descent at most (each round evaluates the whole neighbourhood at once).
LOCAL_SEARCH_ROUNDS = 200
#: Plans per call of the exact evaluator in the search: a round's neighbourhood (450 to 2,186 plans
#: for 8 to 16 stages) runs as calls of this size, and so do the few calls of single plans and
#: starts (``evaluate_batched(..., buckets=())``), so a graph compiles one batch shape where the
#: evaluator's default buckets compiled three (and padded 2,186 plans to 4,096): a single plan
#: costs a 512-plan call (about 10 ms more, 16 such calls in the README plan's balancing) and the
#: cold process one compilation less (about 2.5 s).
SEARCH_CHUNK = 512


@dataclass(frozen=True)
class OptimizeResult:
    """What ``optimize`` found. Every plan in it was evaluated by the exact simulator.

    Attributes:
        plan: the optimized integer plan (``layers_per_stage``, ``samples``, exact ``makespan``,
            ``peak_memory``, ``fits``).
        fits: whether ``plan`` fits memory (when False, no plan found did: see ``message``).
        message: one line saying what was found, or why nothing fits.
        baseline: name of the best baseline (``"uniform"``, ``"minmax"``, ``"given"``).
        baseline_plan: that baseline, exactly evaluated.
        rounded: the continuous optimum rounded, before the local search.
        params: the continuous optimum (a tuple following the knobs).
        continuous: per knob ``name``, the continuous optimum in the plan's units (fractional);
            ``continuous_layers`` / ``continuous_samples`` read it (None without that knob).
        continuous_makespan: exact makespan of the continuous (fractional) optimum.
        loss: the loss at every step.
        temperatures: the temperature (seconds) at every step.
        evaluations: plans the exact simulator evaluated (baselines, rounding, local search).
    """

    plan: StagePlan
    fits: bool
    message: str
    baseline: str
    baseline_plan: StagePlan
    rounded: StagePlan
    params: tuple
    continuous: Mapping[str, np.ndarray]
    continuous_makespan: float
    loss: np.ndarray
    temperatures: np.ndarray
    evaluations: int

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return self.plan.layers_per_stage

    @property
    def samples(self) -> tuple[int, ...] | None:
        return self.plan.samples

    @property
    def makespan(self) -> float:
        return self.plan.makespan

    @property
    def continuous_layers(self) -> np.ndarray | None:
        return self.continuous.get("layers_per_stage")

    @property
    def continuous_samples(self) -> np.ndarray | None:
        return self.continuous.get("samples")

    @property
    def peak_memory(self) -> tuple[float, ...]:
        return self.plan.peak_memory

    @property
    def baseline_makespan(self) -> float:
        return self.baseline_plan.makespan

    @property
    def speedup(self) -> float:
        """``baseline_makespan / makespan`` (>= 1 whenever the baseline fits)."""
        return self.baseline_plan.makespan / self.plan.makespan if self.plan.makespan > 0 else 1.0

    # -- output (the result protocol, ``diffpipe._results``) ----------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain data: ``plan``, ``baseline_plan``, ``rounded`` (each ``{layers_per_stage, samples,
        makespan_s, peak_memory_bytes, capacity_bytes, fits, values}``), ``fits``, ``message``,
        ``baseline``, ``speedup``, ``params`` (per knob), ``continuous`` (per knob name),
        ``continuous_makespan_s``, ``loss``, ``temperatures_s``, ``evaluations``."""
        return {
            "plan": _plan_dict(self.plan), "fits": self.fits, "message": self.message, "baseline": self.baseline,
            "baseline_plan": _plan_dict(self.baseline_plan), "rounded": _plan_dict(self.rounded),
            "speedup": self.speedup, "params": [np.asarray(p) for p in self.params],
            "continuous": {k: np.asarray(v) for k, v in self.continuous.items()},
            "continuous_makespan_s": self.continuous_makespan, "loss": self.loss,
            "temperatures_s": self.temperatures, "evaluations": self.evaluations,
        }

    def to_json(self, path: str | os.PathLike | None = None, indent: int | None = 2) -> str:
        """Strict JSON text of ``to_dict()``; also written atomically to ``path`` when given."""
        return json_text(self.to_dict(), path, indent)

    def _rows(self) -> tuple[list[str], list[list[Any]]]:
        header = ["plan", "layers_per_stage", "samples", "makespan_s", "peak_memory_bytes", "fits"]
        rows = [[name, " ".join(map(str, p.layers_per_stage)),
                 "" if p.samples is None else " ".join(map(str, p.samples)), p.makespan, max(p.peak_memory),
                 p.fits]
                for name, p in ((f"baseline ({self.baseline})", self.baseline_plan), ("rounded", self.rounded),
                                ("optimized", self.plan))]
        return header, rows

    def to_csv(self, path: str | os.PathLike | None = None) -> str:
        """The baseline, rounded and optimized plans, one row each; written atomically to ``path`` when given."""
        return csv_text(*self._rows(), path)

    def to_markdown(self) -> str:
        """The three plans as a Markdown table, then ``message``."""
        header, rows = self._rows()
        cells = [[r[0], r[1], r[2], f"{r[3]:.6g}", f"{r[4]:.4g}", "yes" if r[5] else "NO"] for r in rows]
        return markdown_table(header, cells) + "\n" + self.message + "\n"


def _plan_dict(plan: StagePlan) -> dict[str, Any]:
    return {"layers_per_stage": list(plan.layers_per_stage),
            "samples": None if plan.samples is None else list(plan.samples), "makespan_s": plan.makespan,
            "peak_memory_bytes": list(plan.peak_memory), "capacity_bytes": list(plan.capacity), "fits": plan.fits,
            "values": {name: list(v) for name, v in plan.values}}


# -- the continuous phase ----------------------------------------------------------------------------
@eqx.filter_jit
@nan_checked
def _descend(graph, workload, knobs, params, optimizer, taus, weight, scale, capacity, stages, padded):
    """Run ``optimizer`` from every start (``params`` leaves carry a leading ``starts`` axis).

    ``capacity``: ``[graph.devices]``. ``padded``: ``graph`` is a padded graph (``pad_graph``) and
    the knobs' hardware is padded to it (``pad_hardware``: no padded node reads a padded value, and
    a padded device holds nothing, so its memory term is 0)."""

    def loss_fn(p, tau):
        hw = knob_hardware(knobs, p, workload, stages)
        if padded:
            hw = pad_hardware(hw, graph)
        time = makespan(graph, hw, temperature=tau)
        memory = peak_memory(graph, hw)[0]
        over = jnp.maximum(memory / capacity - 1.0, 0.0)  # 0 where capacity is inf
        return time / scale + weight * jnp.sum(over * over)

    def run(p):
        def step(carry, tau):
            p, state = carry
            loss, grad = jax.value_and_grad(loss_fn)(p, tau)
            with jax.numpy_dtype_promotion("standard"):  # optax mixes int counters and floats
                updates, state = optimizer.update(grad, state, p)
                p = optax.apply_updates(p, updates)
            return (p, state), loss

        with jax.numpy_dtype_promotion("standard"):
            state = optimizer.init(p)
        (p, _), losses = lax.scan(step, (p, state), taus)
        return p, losses, tuple(k.relax(q, workload) for k, q in zip(knobs, p))

    return jax.vmap(run)(params)


def _temperatures(temperature: Any, steps: int) -> np.ndarray:
    if isinstance(temperature, tuple) and len(temperature) == 2:
        first, last = (float(t) for t in temperature)
        if not all(math.isfinite(t) and t > 0 for t in (first, last)):
            raise ConfigError(f"optimize: temperatures must be positive and finite, got {temperature!r}")
        return np.geomspace(first, last, steps)
    taus = np.asarray(temperature, dtype=np.float64)
    if taus.shape != (steps,) or not np.all(np.isfinite(taus) & (taus > 0)):
        raise ConfigError(f"optimize: temperature must be a (start, end) pair or {steps} positive values, got "
                          f"shape {taus.shape}")
    return taus


# -- exact evaluation and local search -----------------------------------------------------------------
def _key(time: float, memory: np.ndarray, capacity: np.ndarray) -> tuple:
    """Order of plans: fitting ones by time, then the rest by overflow, then time."""
    fits = bool(np.all(memory <= capacity))
    if fits:
        return (0, 0.0, float(time))
    finite = np.isfinite(capacity)
    overflow = float(np.max(np.where(finite, (memory - capacity) / np.where(finite, capacity, 1.0), -np.inf)))
    return (1, overflow, float(time))


def _plan_key(plan: tuple[np.ndarray, ...]) -> tuple:
    return tuple(tuple(np.asarray(p).ravel().tolist()) for p in plan)


class _Build(eqx.Module):
    """The hashable map from the knobs' values to a ``Hardware`` that ``evaluate_batched`` vmaps;
    padded to ``padded`` (``pad_hardware``) when the search runs on a padded graph."""

    knobs: tuple[AbstractKnob, ...]
    workload: Workload
    stages: int = eqx.field(static=True)
    padded: Graph | None = None

    def __call__(self, values: tuple) -> Hardware:
        hw = value_hardware(self.knobs, values, self.workload, self.stages)
        return hw if self.padded is None else pad_hardware(hw, self.padded)


class _Search:
    """Exact evaluation of integer plans (a tuple following the knobs) with a cache and a counter.

    ``evaluated``: the graph the evaluator runs, ``graph`` itself or ``graph`` padded (``pad_graph``;
    every makespan and every real device's memory are then ``graph``'s, bit for bit) with
    ``workload`` of a traced data-parallel size, so that graphs of one padded size share its
    programs; ``capacity`` per device of ``evaluated`` (``inf`` on the padded ones)."""

    def __init__(self, graph: Graph, workload: Workload, knobs: tuple[AbstractKnob, ...], stages: int,
                 evaluated: Graph, evaluated_workload: Workload, capacity: np.ndarray,
                 programs: tuple[AbstractKnob, ...]):
        self.graph, self.workload, self.knobs, self.programs = graph, workload, knobs, programs
        self.evaluated, self.evaluated_capacity = evaluated, capacity
        self.build = _Build(programs, evaluated_workload, stages, None if evaluated is graph else evaluated)
        self.capacity = np.broadcast_to(np.asarray(workload.capacity, np.float64), (graph.devices,))
        self.cache: dict[tuple, tuple[float, np.ndarray]] = {}
        self.evaluations = 0

    def exact(self, values: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Exact makespan, memory and fit of a batch of values (``[B, ...]`` per knob)."""
        times, memory, fits = evaluate_batched(self.evaluated, self.build, values, self.evaluated_capacity,
                                               self.workload.forward.dtype, chunk=SEARCH_CHUNK, buckets=())
        return times, memory[:, :self.graph.devices], fits

    def evaluate(self, plans: list[tuple[np.ndarray, ...]]) -> list[tuple[float, np.ndarray]]:
        todo: dict[tuple, tuple[np.ndarray, ...]] = {}
        for plan in plans:
            key = _plan_key(plan)
            if key not in self.cache and key not in todo:
                todo[key] = plan
        if todo:
            values = tuple(np.stack([k.encode(plan[i], self.workload) for plan in todo.values()])
                           for i, k in enumerate(self.programs))
            times, memory, _ = self.exact(values)
            self.evaluations += len(todo)
            for key, t, m in zip(todo, times, memory):
                self.cache[key] = (float(t), m)
        return [self.cache[_plan_key(plan)] for plan in plans]

    def key(self, plan: tuple[np.ndarray, ...]) -> tuple:
        time, memory = self.evaluate([plan])[0]
        return _key(time, memory, self.capacity)

    def best(self, plans: list[tuple[np.ndarray, ...]]) -> tuple[tuple, tuple]:
        results = self.evaluate(plans)
        keys = [_key(t, m, self.capacity) for t, m in results]
        i = min(range(len(plans)), key=lambda j: keys[j])
        return plans[i], keys[i]

    def descend(self, start: tuple[np.ndarray, ...]) -> tuple:
        """Steepest descent over every knob's ``neighbours`` (one knob moves at a time)."""
        current, key = start, self.key(start)
        for _ in range(LOCAL_SEARCH_ROUNDS):
            neighbours = [current[:i] + (n,) + current[i + 1:]
                          for i, k in enumerate(self.knobs) for n in k.neighbours(current[i])]
            if not neighbours:
                break
            plan, plan_key = self.best(neighbours)
            if not plan_key < key:
                break
            current, key = plan, plan_key
        return current, key


# -- the entry point ---------------------------------------------------------------------------------
def optimize(
    graph: Graph | Schedule,
    workload: Workload,
    knob: AbstractKnob | Sequence[AbstractKnob],
    *,
    optimizer: optax.GradientTransformation = DEFAULT_OPTIMIZER,
    steps: int = 300,
    temperature: tuple[float, float] | Sequence[float] = DEFAULT_TEMPERATURE,
    memory_penalty: float = DEFAULT_MEMORY_PENALTY,
    init: Any = None,
    restarts: int = 0,
    key: jax.Array | None = None,
    local_search: bool = True,
    throw: bool = False,
    pad_to: Mapping[str, int] | None = None,
    communication: Any = "overlap",
    devices_per_node: int | None = None,
) -> OptimizeResult:
    """Optimize the knobs' choices (stage boundaries, microbatch sizes, ...) of ``graph`` for ``workload``.

    Args:
        graph: a ``Graph``, or a ``Schedule`` (compiled under ``communication`` for
            ``devices_per_node`` after every argument has been checked).
        workload: the per-layer table and machine terms (``Workload``).
        knob: an ``AbstractKnob`` (``StageBalance``, ``MicrobatchSplit``, or one of your own), or a
            tuple of knobs setting different ``Hardware`` fields. Without a knob setting the stages'
            fields the split is ``workload.layers_per_stage`` (uniform when None).
        optimizer: any optax transformation (default Adam, learning rate 0.05, on logits).
        steps: gradient steps.
        temperature: ``(start, end)`` relative to the baseline makespan, annealed geometrically,
            or one relative temperature per step.
        memory_penalty: weight of the squared relative overflow of each device's capacity.
        init: one start (a tuple following the knobs). Default: the knobs' neutral start and the
            knobs' ``starts`` (for ``StageBalance``: the uniform, min-max and memory-limited
            min-max splits), run at once.
        restarts: extra starts, logits drawn around the first start with ``key`` (a PRNG key).
        local_search: run the exact local search over the knobs' ``neighbours`` after rounding.
        throw: raise ``ConfigError`` when no plan fits memory (default: say so in the result).
        pad_to: sizes to pad the graph to (``pad_graph``'s keyword arguments, each at least the
            graph's own; ``common_sizes`` of several graphs), so that calls on graphs of one padded
            size with the same knobs and workloads of one shape share one compiled descent and
            exact evaluator (the data-parallel size is then traced too); a ``StageBalance`` then
            runs padded to the padded stage count (``PaddedStageBalance``), so that graphs of
            different stage counts share them too. Every exact figure is the unpadded graph's
            (``pad_graph``); the descent's loss is the unpadded one up to float rounding.
        communication: the mode a ``Schedule`` is compiled under (a name or an
            ``AbstractCommunication``; a ``Graph`` carries its own).
        devices_per_node: the devices sharing a node a ``Schedule`` is compiled for (default: all
            on one node; a ``Graph`` carries its own): the topology is the graph's, the workload's
            network holds only the links.

    Returns:
        An ``OptimizeResult``: the best plan found (never worse than the best combination of the
        knobs' ``baselines``, by the exact simulator), with the continuous optimum, the loss curve
        and that baseline. A call with the same inputs as an earlier one in this process (equal
        graph, workload and knob arrays and structure, and the same other arguments) returns that
        call's result (``clear_caches()`` empties the store); its arrays are read-only. With the
        compilation cache on (``enable_compilation_cache``: the CLI and the examples), results of
        the default optimizer are also kept on disk and read back, bit for bit, by a later process
        running the same diffpipe code on the same inputs (``diffpipe._store``).
    """
    knobs = as_knobs(knob)
    if not isinstance(workload, Workload):
        raise ConfigError(f"optimize expects a Workload, got {type(workload).__name__}")
    if isinstance(graph, Schedule):
        stages, micro, devices = graph.stages, graph.microbatches, graph.devices
        holder = np.asarray(graph.placement.table)
        versions = np.asarray(weight_versions(graph))
    elif isinstance(graph, Graph):
        if graph.kind.ndim != 1:
            raise ConfigError("optimize expects one graph, not a stack")
        stages, micro, devices = graph.stages, graph.microbatches, graph.devices
        holder, versions = np.asarray(graph.holder), np.asarray(graph.versions)
    else:
        raise ConfigError(f"optimize expects a Graph or Schedule, got {type(graph).__name__}")
    check_split_known(workload.split_known, graph)  # an unsplit table must not price I as B, W as 0
    sets = {name for k in knobs for name in k.sets}
    fixed_split = not sets & set(STAGE_FIELDS)
    if fixed_split:
        if stages > workload.layers:
            raise ConfigError(f"optimize: the schedule's {stages} stages exceed the workload's {workload.layers} "
                              "layers")
        workload = workload.with_split(workload.layers_per_stage or uniform_partition(workload.layers, stages))
        if len(workload.layers_per_stage) != stages:
            raise ConfigError(f"optimize: workload.layers_per_stage has {len(workload.layers_per_stage)} stages, "
                              f"the schedule has {stages}")
    else:
        workload = workload.with_split(None)  # unused; dropping it lets workloads share compiled code
    if "size" not in sets and workload.samples is not None:
        workload = dataclasses.replace(workload, samples=None)  # unused here; lets workloads share compiled code
    problem = Problem(workload, stages, micro, devices, holder, versions, _peak_in_flight(graph),
                      1.0 if "size" in sets else float(np.max(np.asarray(workload.size))))
    for k in knobs:
        k.check(problem)
    if not isinstance(restarts, int) or isinstance(restarts, bool) or restarts < 0:
        raise ConfigError(f"optimize: restarts must be a non-negative int, got {restarts!r}")
    if restarts and key is None:
        raise ConfigError("optimize: restarts need a PRNG key (key=jax.random.key(0))")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ConfigError(f"optimize: steps must be a positive int, got {steps!r}")
    if not (isinstance(memory_penalty, (int, float)) and math.isfinite(memory_penalty) and memory_penalty >= 0):
        raise ConfigError(f"optimize: memory_penalty must be a finite non-negative number, got {memory_penalty!r}")
    if not isinstance(optimizer, optax.GradientTransformation):
        raise ConfigError(f"optimize: optimizer must be an optax GradientTransformation, got "
                          f"{type(optimizer).__name__}")
    taus = _temperatures(temperature, steps)
    if fixed_split:
        check_static_memory(workload, holder, versions, devices, fixed=workload.layers_per_stage)
    dtype = workload.forward.dtype
    baselines = _baselines(knobs, problem)
    starts = [k.starts(problem) for k in knobs]
    # The knobs the programs run: with pad_to, a stage split padded to the padded stage count, so
    # that its programs (descent, exact search, starts, rounding) serve every stage count.
    program_stages = stages
    if isinstance(pad_to, Mapping) and is_positive_int(pad_to.get("stages")):
        program_stages = max(stages, pad_to["stages"])
    programs = tuple(PaddedStageBalance.of(k, program_stages)
                     if pad_to is not None and type(k) is StageBalance and k.stages >= 2 else k for k in knobs)
    params0 = _starts(knobs if init is not None else programs, workload, init, baselines, starts, restarts, key,
                      dtype)
    params0 = tuple(p.pad_params(x) if init is not None and isinstance(p, PaddedStageBalance) else x
                    for p, x in zip(programs, params0))
    if isinstance(graph, Schedule):
        graph = compile(graph, communication=communication, devices_per_node=devices_per_node)
    # The graph and workload the descent and the exact search run: padded ones share compiled programs.
    sizes = None if pad_to is None else _padded_sizes(graph, pad_to)
    evaluated, evaluated_workload = graph, workload
    if sizes is not None:
        evaluated = pad_graph(graph, **sizes)
        evaluated_workload = eqx.tree_at(lambda w: w.network, workload, workload.network.with_traced_data_parallel())
    inputs = _input_parts(graph, workload, knobs, init, key, steps, taus, memory_penalty, restarts, local_search,
                          sizes)
    stored_key = _stored_key(inputs, optimizer)
    stored = _STORED.get(stored_key) if stored_key is not None else None
    if stored is not None:
        _STORED.move_to_end(stored_key)
    disk_key = None
    if stored is None and stored_key is not None and result_cache_dir() is not None:  # on with the compile cache
        disk_key = _disk_key(inputs, optimizer)
        stored = _from_disk(disk_key)
        if stored is not None:
            _STORED[stored_key] = stored
    if stored is not None:
        if throw and not stored.fits:
            raise ConfigError(stored.message)
        return stored

    # Baselines, exactly evaluated.
    capacity = np.full(evaluated.devices, np.inf, dtype)  # a padded device holds nothing: no penalty
    capacity[:devices] = np.broadcast_to(np.asarray(workload.capacity, dtype), (devices,))
    padded_split = any(isinstance(p, PaddedStageBalance) for p in programs)
    search = _Search(graph, workload, knobs, program_stages if padded_split else stages, evaluated,
                     evaluated_workload, capacity, programs)
    keys = {name: search.key(plan) for name, plan in baselines.items()}
    baseline = min(keys, key=lambda n: keys[n])
    scale = keys[baseline][2] if keys[baseline][2] > 0 else 1.0

    # The continuous phase, from every start at once.
    params, losses, xs = _descend(evaluated, evaluated_workload, programs, params0, optimizer,
                                  *(jax.device_put(np.asarray(x, dtype)) for x in (taus * scale, memory_penalty,
                                                                                   scale)),
                                  jax.device_put(capacity), search.build.stages, sizes is not None)
    losses = np.asarray(losses)
    if not np.all(np.isfinite(losses)):
        bad = int(np.argmin(np.all(np.isfinite(losses), axis=0)))
        raise ConfigError(f"optimize: the loss became non-finite at step {bad}; lower the learning rate or raise "
                          "the temperature")
    best = int(np.argmin(losses[:, -1]))
    # the real knobs' params (a padded stage split's real logits)
    params = tuple(np.asarray(x)[:, :k.stages] if isinstance(p, PaddedStageBalance) else x
                   for k, p, x in zip(knobs, programs, params))
    chosen = tuple(jax.device_put(np.asarray(p)[best]) for p in params)
    continuous_makespan = float(search.exact(tuple(np.asarray(x)[best:best + 1] for x in xs))[0][0])

    # Rounding every start's optimum, then the exact local search from the best rounded plan, from
    # the best baseline and from the knobs' other starts.
    candidates = []
    rows = [np.asarray(p) for p in params]  # NumPy rows: indexing a device array compiles eager programs
    for r in range(losses.shape[0]):
        candidates += list(itertools.product(*(k.round(jax.device_put(p[r]), workload)
                                               for k, p in zip(programs, rows))))
    rounded, _ = search.best(candidates)
    origins = [rounded, baselines[baseline]]
    for i, knob_starts in enumerate(starts):
        origins += [baselines[baseline][:i] + (plan,) + baselines[baseline][i + 1:]
                    for plan, origin in knob_starts if origin]
    found = [search.descend(s) if local_search else (s, search.key(s)) for s in origins]
    plan_values, _ = min(found, key=lambda f: f[1])

    # Final check: the chosen plan evaluated afresh (not from the search's cache).
    time, memory, _ = search.exact(tuple(k.encode(v, workload)[None] for k, v in zip(programs, plan_values)))
    plan = _make_plan(graph, workload, knobs, plan_values, float(time[0]), memory[0])
    base_plan = _make_plan(graph, workload, knobs, baselines[baseline], *search.evaluate([baselines[baseline]])[0])
    rounded_plan = _make_plan(graph, workload, knobs, rounded, *search.evaluate([rounded])[0])
    message = _message(plan, base_plan, baseline, knobs)
    result = OptimizeResult(
        plan=plan, fits=plan.fits, message=message, baseline=baseline, baseline_plan=base_plan,
        rounded=rounded_plan, params=chosen,
        continuous={k.name: _read_only(k.fractional(p, workload)) for k, p in zip(programs, chosen)},
        continuous_makespan=continuous_makespan, loss=_read_only(losses[best]),
        temperatures=_read_only(taus * scale), evaluations=search.evaluations,
    )
    if stored_key is not None:
        _STORED[stored_key] = result
    if disk_key is not None:
        keep(disk_key, _to_disk(result), _DISK_CLASSES)
    if throw and not plan.fits:
        raise ConfigError(message)
    return result


# -- results kept across calls ---------------------------------------------------------------------
#: ``optimize`` results kept in this process (keyed by every input, arrays by their bytes).
STORED_RESULTS = 32
_STORED: BoundedDict = BoundedDict(STORED_RESULTS)


def _read_only(x: Any) -> np.ndarray:
    out = np.array(x)
    out.flags.writeable = False
    return out


def _input_parts(graph, workload, knobs, init, key, steps, taus, memory_penalty, restarts, local_search,
                 pad_to) -> tuple | None:
    """Every input of an ``optimize`` call but the optimizer, walked once, as one tuple of plain values that
    both stores key by (``_stored_key`` in this process, ``_disk_key`` on disk): each tree's structure node
    by node (its child count and node data: a module's class and static fields), then its leaves (arrays
    and numbers by dtype, shape and all their bytes, never a digest that two inputs could share; a PRNG key
    by its implementation and data; any other leaf by its type and value), then the other arguments. None
    when an input cannot be keyed at all: a tracer, or an array of objects."""
    parts: list[Any] = []
    for tree in (graph, workload, knobs, init, key):
        leaves, treedef = jax.tree.flatten(tree)

        def walk(node) -> None:
            children = node.children()
            parts.append((len(children), node.node_data()))  # None for a leaf
            for child in children:
                walk(child)

        walk(treedef)
        for leaf in leaves:
            if isinstance(leaf, jax.core.Tracer):
                return None
            if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                parts.append(("prng", str(jax.random.key_impl(leaf))))
                leaf = jax.random.key_data(leaf)
            if isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, bool, complex)):
                a = np.asarray(leaf)
                if a.dtype.hasobject:
                    return None
                parts.append(("array", a.dtype.str, a.shape, a.tobytes()))
            else:
                parts.append((type(leaf), leaf))
    parts += [steps, ("array", taus.dtype.str, taus.shape, taus.tobytes()), float(memory_penalty), restarts,
              local_search, None if pad_to is None else tuple(sorted(pad_to.items()))]
    return tuple(parts)


def _stored_key(inputs: tuple | None, optimizer: Any) -> tuple | None:
    """The in-process key of an ``optimize`` call of ``inputs`` (``_input_parts``), or None when it has
    none (an input that cannot be keyed or hashed: then nothing is stored). The optimizer is keyed by
    its functions (identity: two equal-looking ``optax.adam`` objects do not share results)."""
    if inputs is None:
        return None
    out = (inputs, optimizer)
    try:
        hash(out)
    except TypeError:
        return None
    return out


# -- results kept across processes (``diffpipe._store``; on with the compilation cache) -------------------
_DISK_CLASSES = {"OptimizeResult": OptimizeResult, "StagePlan": StagePlan}


def _disk_key(inputs: tuple | None, optimizer: Any) -> Key | None:
    """The on-disk key of an ``optimize`` call of ``inputs`` (``_input_parts``) as a ``_store.Key``
    (diffpipe's code, its dependencies' versions, the backend, and ``inputs``), or None when it has
    none: an optimizer other than ``DEFAULT_OPTIMIZER`` (an optax transformation is functions, which no
    key can encode), or an input ``Key`` cannot encode."""
    if inputs is None or optimizer is not DEFAULT_OPTIMIZER:
        return None
    try:
        device = jax.devices()[0]
        return Key("optimize").add(jax.default_backend(), device.platform, device.device_kind,
                                   bool(jax.config.jax_enable_x64), str(jax.config.jax_default_matmul_precision),
                                   os.environ.get("XLA_FLAGS", ""), inputs)
    except Unkeyable:
        return None


def _to_disk(result: OptimizeResult) -> dict[str, Any]:
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    return fields | {"params": tuple(np.asarray(p) for p in result.params)}


def _from_disk(key: Key | None) -> OptimizeResult | None:
    """The result kept under ``key``, as ``optimize`` returned it (``params`` on the device), or
    None (no cache on, no entry, or one that does not read back as a result)."""
    fields = None if key is None else load_kept(key, _DISK_CLASSES)
    if not isinstance(fields, dict):
        return None
    try:
        result = OptimizeResult(**(fields | {"params": tuple(jax.device_put(p) for p in fields["params"])}))
    except (TypeError, KeyError):
        return None
    if not isinstance(result.plan, StagePlan):
        return None
    return result


def _padded_sizes(graph: Graph, pad_to: Mapping[str, int]) -> dict[str, int]:
    """``pad_graph``'s sizes for ``graph``: each of ``pad_to`` and the graph's own, the larger."""
    own = common_sizes([graph])
    if not isinstance(pad_to, Mapping) or set(pad_to) - set(own):
        raise ConfigError(f"optimize: pad_to must map some of {sorted(own)} to sizes, got {pad_to!r}")
    sizes = {}
    for name, size in own.items():
        want = pad_to.get(name, size)
        if not isinstance(want, (int, np.integer)) or isinstance(want, bool) or want < 1:
            raise ConfigError(f"optimize: pad_to[{name!r}] must be a positive int, got {want!r}")
        sizes[name] = max(int(want), size)
    per_node = topology(graph.devices_per_node, graph.devices)  # one node of all devices stays so
    return sizes | {"devices_per_node": node_size(per_node, sizes["devices"])}


def _baselines(knobs: tuple[AbstractKnob, ...], problem: Problem) -> dict[str, tuple[np.ndarray, ...]]:
    """Every combination of the knobs' baselines, named by the names of knobs with a choice
    (``"given"`` when none has one: the workload as given, each knob at its default)."""
    each = [k.baselines(problem) for k in knobs]
    out = {}
    for combination in itertools.product(*(b.items() for b in each)):
        names = [name for (name, _), b in zip(combination, each) if len(b) > 1]
        out["+".join(names) or "given"] = tuple(np.asarray(plan) for _, plan in combination)
    return out


def _peak_in_flight(graph: Graph | Schedule) -> np.ndarray:
    """Per device, the peak number of stored activations (timing-free: the lane order decides)."""
    if isinstance(graph, Schedule):
        return np.asarray(peak_activations(graph), np.float64)
    return peak_in_flight(graph)  # NumPy: no program compiled per graph


#: Spread of the logits of random restarts around the first start.
RESTART_SPREAD = 0.5


def _starts(knobs, workload, init, baselines, starts, restarts, key, dtype) -> tuple:
    """Starting parameters with a leading ``starts`` axis (a tuple following the knobs): the
    neutral start, then row ``r`` of the knobs' ``starts`` (neutral where a knob has fewer); at
    least one such row, so that every knob set compiles one loop shape per graph and workload."""
    if init is not None:
        first = tuple(init) if isinstance(init, (tuple, list)) else (init,)
        if len(first) != len(knobs):
            raise ConfigError(f"optimize: init has {len(first)} entries for {len(knobs)} knobs")
        rows = [tuple(jnp.asarray(p, dtype) for p in first)]
        for k, p in zip(knobs, rows[0]):
            if p.shape != k.init(workload).shape:
                raise ConfigError(f"optimize: init for {type(k).__name__} has shape {p.shape}, expected "
                                  f"{k.init(workload).shape}")
    else:
        rows = [tuple(k.init(workload) for k in knobs)]
        for r in range(max(1, *(len(s) for s in starts))):
            rows.append(tuple(k.init(workload, tuple(s[r][0].tolist())) if r < len(s) else k.init(workload)
                              for k, s in zip(knobs, starts)))
    if restarts:
        for r in range(restarts):
            noise = jax.random.split(jax.random.fold_in(key, r), len(knobs))
            rows.append(tuple(p + RESTART_SPREAD * jax.random.normal(n, p.shape, dtype)
                              for p, n in zip(rows[0], noise)))
    if not restarts:  # concrete rows: stacked in NumPy (an eager jnp.stack compiles a program per shape)
        return tuple(jax.device_put(np.stack([np.asarray(row[i], dtype) for row in rows])) for i in range(len(knobs)))
    return tuple(jnp.stack([jnp.asarray(row[i], dtype) for row in rows]) for i in range(len(knobs)))


def _make_plan(graph: Graph, workload: Workload, knobs: tuple[AbstractKnob, ...], plan: tuple[np.ndarray, ...],
               time: float, memory: np.ndarray) -> StagePlan:
    values = {k.name: v for k, v in zip(knobs, plan)}
    counts = values.get("layers_per_stage", workload.layers_per_stage)
    return make_plan(graph, workload, counts, values.get("samples"), time, memory, values)


def _message(plan: StagePlan, baseline: StagePlan, name: str, knobs: tuple[AbstractKnob, ...]) -> str:
    what = f"layers per stage {list(plan.layers_per_stage)}"
    for k in knobs:
        if k.name != "layers_per_stage":
            what += f", {k.label} {list(dict(plan.values)[k.name])}"
    if not plan.fits:
        memory, capacity = np.asarray(plan.peak_memory), np.asarray(plan.capacity)
        d = int(np.argmax(memory - capacity))
        return (f"no plan fits memory: the best found ({what}) needs {memory[d]:.4g} bytes on device {d}, "
                f"over its capacity {capacity[d]:.4g}")
    gain = (baseline.makespan / plan.makespan - 1.0) * 100 if plan.makespan > 0 else 0.0
    against = f"{gain:.2f}% faster than {name} ({baseline.makespan:.6g} s)" if baseline.fits else \
        f"{name} ({baseline.makespan:.6g} s) does not fit memory"
    return f"{what}: makespan {plan.makespan:.6g} s, {against}"


__all__ = ["DEFAULT_MEMORY_PENALTY", "DEFAULT_OPTIMIZER", "DEFAULT_TEMPERATURE", "OptimizeResult", "optimize"]
