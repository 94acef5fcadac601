"""``optimize``: gradient descent on the smoothed makespan, then rounding and an exact local search.

The loss of parameters ``p`` of knobs ``k`` (``StageBalance``, ``MicrobatchSplit`` or both) is

    makespan(graph, k(p, workload), temperature=tau) / scale
        + memory_penalty * sum_d max(0, peak_memory_d / capacity_d - 1)^2

with ``scale`` the exact makespan of the best baseline, so that temperatures and the penalty are
relative and the loss is about 1. An optax transformation runs it for ``steps`` steps inside one
``lax.scan`` while ``tau`` anneals geometrically towards exact. The continuous optimum is then
rounded (every floor/ceiling combination of the stage boundaries where there are few; largest
remainders for samples), and a steepest-descent local search of ±1 moves (any combination of
boundaries moving by one layer; one sample moving between two microbatches) runs with the batched
exact simulator, from the rounded plan and from the best baseline. The chosen plan is evaluated
afresh by the exact simulator at the end; nothing else is ever reported.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from ._baselines import Plan, evaluate_boundaries, evaluate_plans, make_plan, minmax_partition
from ._errors import ConfigError
from ._graph import Graph, compile
from ._hardware import Hardware
from ._knobs import MicrobatchSplit, StageBalance, Workload, apply_knobs, as_knobs, check_static_memory
from ._partition import partition, uniform_partition
from ._simulate import makespan, peak_memory
from .schedules import Schedule
from .schedules._analysis import peak_activations, weight_versions

#: Default optimizer: Adam (Kingma and Ba, ICLR 2015) on the knobs' logits. One module-level object,
#: so repeated calls reuse the compiled loop.
DEFAULT_OPTIMIZER = optax.adam(5e-2)
#: Default annealing: temperature relative to the baseline makespan, from the first to the second
#: value geometrically over the steps.
DEFAULT_TEMPERATURE = (1e-2, 1e-4)
#: Weight of the squared relative memory overflow in the loss (the makespan term is about 1).
DEFAULT_MEMORY_PENALTY = 100.0
#: Floor/ceiling combinations of the continuous boundaries tried when rounding (2^(stages-1) of
#: them when at most this many, else nearest only).
ROUNDING_COMBINATIONS = 256
#: The local search moves any subset of boundaries by ±1 when there are at most this many such
#: moves (3^(stages-1) - 1: up to 8 stages); beyond, one or two boundaries at a time.
NEIGHBOURHOOD_LIMIT = 2186
#: Rounds of steepest descent at most (each round evaluates the whole neighbourhood at once).
LOCAL_SEARCH_ROUNDS = 200


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
        continuous_layers: its layers per stage (fractional), or None without ``StageBalance``.
        continuous_samples: its samples per microbatch (fractional), or None without ``MicrobatchSplit``.
        continuous_makespan: exact makespan of the continuous (fractional) optimum.
        loss: the loss at every step.
        temperatures: the temperature (seconds) at every step.
        evaluations: plans the exact simulator evaluated (baselines, rounding, local search).
    """

    plan: Plan
    fits: bool
    message: str
    baseline: str
    baseline_plan: Plan
    rounded: Plan
    params: tuple
    continuous_layers: np.ndarray | None
    continuous_samples: np.ndarray | None
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
    def peak_memory(self) -> tuple[float, ...]:
        return self.plan.peak_memory

    @property
    def baseline_makespan(self) -> float:
        return self.baseline_plan.makespan

    @property
    def speedup(self) -> float:
        """``baseline_makespan / makespan`` (>= 1 whenever the baseline fits)."""
        return self.baseline_plan.makespan / self.plan.makespan if self.plan.makespan > 0 else 1.0


# -- the continuous phase ----------------------------------------------------------------------------
@eqx.filter_jit
def _descend(graph, workload, knobs, params, optimizer, taus, weight, scale, stages):
    """Run ``optimizer`` from every start (``params`` leaves carry a leading ``starts`` axis)."""
    capacity = jnp.broadcast_to(workload.capacity, (graph.devices,))

    def loss_fn(p, tau):
        hw = apply_knobs(knobs, p, workload, stages)
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
        x, size = _continuous(graph, workload, knobs, p, stages)
        return p, losses, x, size

    return jax.vmap(run)(params)


def _continuous(graph, workload, knobs, params, stages):
    """Boundaries and sizes of the continuous optimum (``None`` where no knob sets them)."""
    parts = {}
    for k, p in zip(knobs, params):
        parts.update(k.contribute(p, workload))
    boundaries = parts.get("boundaries", workload.default_boundaries(stages))
    return boundaries, parts.get("size")


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


# -- rounding and local search -----------------------------------------------------------------------
def _repair(cuts: np.ndarray, layers: int) -> np.ndarray:
    """Integer interior boundaries made strictly increasing within ``1 .. layers-1``."""
    cuts = cuts.astype(np.int64).copy()
    n = cuts.shape[-1]
    low = np.arange(1, n + 1)
    high = layers - n + np.arange(n)
    cuts = np.clip(cuts, low, high)
    for j in range(1, n):
        cuts[..., j] = np.maximum(cuts[..., j], cuts[..., j - 1] + 1)
    for j in range(n - 2, -1, -1):
        cuts[..., j] = np.minimum(cuts[..., j], cuts[..., j + 1] - 1)
    return cuts


def _counts_of(cuts: np.ndarray, layers: int) -> np.ndarray:
    rows = cuts.reshape(-1, cuts.shape[-1])
    edges = np.concatenate([np.zeros((rows.shape[0], 1), np.int64), rows,
                            np.full((rows.shape[0], 1), layers, np.int64)], axis=1)
    return np.diff(edges, axis=1)


def _round_boundaries(x: np.ndarray, layers: int) -> np.ndarray:
    """Candidate integer splits ``[n, stages]`` around continuous boundaries ``x`` ``[stages+1]``."""
    inner = x[1:-1]
    if inner.size == 0:
        return np.array([[layers]], dtype=np.int64)
    if 2 ** inner.size <= ROUNDING_COMBINATIONS:
        choices = np.array(list(itertools.product((0, 1), repeat=inner.size)), dtype=np.int64)
        cuts = np.floor(inner).astype(np.int64)[None, :] + choices
    else:
        cuts = np.rint(inner).astype(np.int64)[None, :]
    cuts = _repair(cuts, layers)
    return np.unique(_counts_of(cuts, layers), axis=0)


def _round_samples(samples: np.ndarray, batch: int) -> np.ndarray:
    """Largest-remainder rounding to positive integers summing to ``batch``."""
    base = np.maximum(np.floor(samples).astype(np.int64), 1)
    while base.sum() > batch:  # the floor of 1 took too many: take back from the largest
        base[np.argmax(base)] -= 1
    remainder = samples - base
    for i in np.argsort(-remainder, kind="stable")[: batch - base.sum()]:
        base[i] += 1
    return base


def _split_moves(stages: int) -> np.ndarray:
    n = stages - 1
    if n == 0:
        return np.zeros((0, 0), np.int64)
    if 3 ** n - 1 <= NEIGHBOURHOOD_LIMIT:
        moves = np.array(list(itertools.product((-1, 0, 1), repeat=n)), dtype=np.int64)
        return moves[np.any(moves != 0, axis=1)]
    moves = []
    for j in range(n):
        for d in (-1, 1):
            m = np.zeros(n, np.int64)
            m[j] = d
            moves.append(m)
    for i, j in itertools.combinations(range(n), 2):
        for a, b in itertools.product((-1, 1), repeat=2):
            m = np.zeros(n, np.int64)
            m[i], m[j] = a, b
            moves.append(m)
    return np.array(moves)


def _split_neighbours(counts: np.ndarray, moves: np.ndarray) -> np.ndarray:
    layers = int(counts.sum())
    if moves.shape[0] == 0:
        return np.zeros((0, counts.shape[0]), np.int64)
    cuts = np.cumsum(counts)[:-1][None, :] + moves
    edges = np.concatenate([np.zeros((cuts.shape[0], 1), np.int64), cuts,
                            np.full((cuts.shape[0], 1), layers, np.int64)], axis=1)
    new = np.diff(edges, axis=1)
    return new[np.all(new >= 1, axis=1)]


def _sample_neighbours(samples: np.ndarray) -> np.ndarray:
    m = samples.shape[0]
    out = []
    for i, j in itertools.permutations(range(m), 2):
        if samples[i] > 1:
            new = samples.copy()
            new[i] -= 1
            new[j] += 1
            out.append(new)
    return np.array(out, dtype=np.int64).reshape(-1, m)


def _key(time: float, memory: np.ndarray, capacity: np.ndarray) -> tuple:
    """Order of plans: fitting ones by time, then the rest by overflow, then time."""
    fits = bool(np.all(memory <= capacity))
    if fits:
        return (0, 0.0, float(time))
    finite = np.isfinite(capacity)
    overflow = float(np.max(np.where(finite, (memory - capacity) / np.where(finite, capacity, 1.0), -np.inf)))
    return (1, overflow, float(time))


class _Search:
    """Exact evaluation of (split, samples) plans with a cache and a counter."""

    def __init__(self, graph: Graph, workload: Workload, split: MicrobatchSplit | None):
        self.graph, self.workload, self.split = graph, workload, split
        self.capacity = np.broadcast_to(np.asarray(workload.capacity, np.float64), (graph.devices,))
        self.cache: dict[tuple, tuple[float, np.ndarray]] = {}
        self.evaluations = 0

    def size_of(self, samples: np.ndarray) -> np.ndarray:
        return np.asarray(self.split.relative(samples.astype(np.float64), self.workload))

    def evaluate(self, plans: list[tuple[np.ndarray, np.ndarray | None]]) -> list[tuple[float, np.ndarray]]:
        todo = []
        for counts, samples in plans:
            key = (tuple(counts.tolist()), None if samples is None else tuple(samples.tolist()))
            if key not in self.cache and key not in todo:
                todo.append(key)
        if todo:
            counts = np.array([k[0] for k in todo], dtype=np.int64)
            sizes = None
            if self.split is not None:
                sizes = np.stack([self.size_of(np.asarray(k[1])) for k in todo])
            times, memory, _ = evaluate_plans(self.graph, self.workload, counts, sizes)
            self.evaluations += len(todo)
            for k, t, m in zip(todo, times, memory):
                self.cache[k] = (float(t), m)
        out = []
        for counts, samples in plans:
            key = (tuple(counts.tolist()), None if samples is None else tuple(samples.tolist()))
            out.append(self.cache[key])
        return out

    def key(self, plan: tuple[np.ndarray, np.ndarray | None]) -> tuple:
        time, memory = self.evaluate([plan])[0]
        return _key(time, memory, self.capacity)

    def best(self, plans: list[tuple[np.ndarray, np.ndarray | None]]) -> tuple[tuple, tuple]:
        results = self.evaluate(plans)
        keys = [_key(t, m, self.capacity) for t, m in results]
        i = min(range(len(plans)), key=lambda j: keys[j])
        return plans[i], keys[i]

    def descend(self, start: tuple[np.ndarray, np.ndarray | None], move_split: bool) -> tuple:
        moves = _split_moves(start[0].shape[0]) if move_split else None
        current, key = start, self.key(start)
        for _ in range(LOCAL_SEARCH_ROUNDS):
            counts, samples = current
            neighbours = []
            if move_split:
                neighbours += [(c, samples) for c in _split_neighbours(counts, moves)]
            if samples is not None:
                neighbours += [(counts, s) for s in _sample_neighbours(samples)]
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
    knob: StageBalance | MicrobatchSplit | Sequence[StageBalance | MicrobatchSplit],
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
) -> OptimizeResult:
    """Optimize stage boundaries and/or microbatch sizes of ``graph`` for ``workload``.

    Args:
        graph: a ``Graph``, or a ``Schedule`` (compiled for the workload's communication mode after
            every argument has been checked).
        workload: the per-layer table and machine terms (``Workload``).
        knob: a ``StageBalance``, a ``MicrobatchSplit``, or a tuple of one of each. Without a
            ``StageBalance`` the split is ``workload.layers_per_stage`` (uniform when None).
        optimizer: any optax transformation (default Adam, learning rate 0.05, on logits).
        steps: gradient steps.
        temperature: ``(start, end)`` relative to the baseline makespan, annealed geometrically,
            or one relative temperature per step.
        memory_penalty: weight of the squared relative overflow of each device's capacity.
        init: one start (a tuple following the knobs). Default: three starts run at once, the
            compute-balanced split and the uniform and min-max splits (equal microbatches).
        restarts: extra starts, logits drawn around the first start with ``key`` (a PRNG key).
        local_search: run the ±1 exact local search after rounding.
        throw: raise ``ConfigError`` when no plan fits memory (default: say so in the result).

    Returns:
        An ``OptimizeResult``: the best plan found (never worse than the best baseline, uniform
        and min-max stage splits and the equal-size microbatch split, by the exact simulator),
        with the continuous optimum, the loss curve and that baseline.
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
    balance = next((k for k in knobs if isinstance(k, StageBalance)), None)
    split = next((k for k in knobs if isinstance(k, MicrobatchSplit)), None)
    if balance is not None:
        if balance.stages != stages:
            raise ConfigError(f"optimize: StageBalance has {balance.stages} stages, the schedule has {stages}")
        balance.check(workload)
        workload = workload.with_split(None)  # unused; dropping it lets workloads share compiled code
    else:
        if stages > workload.layers:
            raise ConfigError(f"optimize: the schedule's {stages} stages exceed the workload's {workload.layers} "
                              "layers")
        workload = workload.with_split(workload.layers_per_stage or uniform_partition(workload.layers, stages))
        if len(workload.layers_per_stage) != stages:
            raise ConfigError(f"optimize: workload.layers_per_stage has {len(workload.layers_per_stage)} stages, "
                              f"the schedule has {stages}")
    if split is None and workload.samples is not None:
        workload = dataclasses.replace(workload, samples=None)  # unused here; lets workloads share compiled code
    if split is not None and split.microbatches != micro:
        raise ConfigError(f"optimize: MicrobatchSplit has {split.microbatches} microbatches, the schedule has {micro}")
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
    check_static_memory(workload, holder, versions, devices,
                        fixed=None if balance is not None else workload.layers_per_stage)
    dtype = workload.forward.dtype
    splits = {"given": np.asarray(workload.layers_per_stage)} if balance is None else {
        "uniform": np.asarray(uniform_partition(workload.layers, stages)),
        "minmax": np.asarray(minmax_partition(workload, stages)),
    }
    fitted = None if balance is None else _memory_minmax(workload, holder, versions, _peak_in_flight(graph),
                                                           1.0 if split is not None else float(np.max(workload.size)))
    if balance is not None:  # a fixed number of starts: one compiled loop per graph and workload shape
        splits_to_start = {**splits, "memory": splits["minmax"] if fitted is None else fitted}
    else:
        splits_to_start = splits
    starts = _starts(knobs, workload, init, splits_to_start, restarts, key, dtype)
    if isinstance(graph, Schedule):
        graph = compile(graph, communication=workload.network.mode,
                        devices_per_node=workload.network.devices_per_node)
    _check_mode(graph, workload)

    # Baselines, exactly evaluated.
    search = _Search(graph, workload, split)
    equal = None if split is None else _round_samples(np.full(micro, split.batch / micro), split.batch)
    baselines = {name: (counts, equal) for name, counts in splits.items()}
    keys = {name: search.key(plan) for name, plan in baselines.items()}
    baseline = min(keys, key=lambda n: keys[n])
    scale = keys[baseline][2] if keys[baseline][2] > 0 else 1.0

    # The continuous phase, from every start at once.
    params, losses, xs, sizes = _descend(graph, workload, knobs, starts, optimizer, jnp.asarray(taus * scale, dtype),
                                         jnp.asarray(memory_penalty, dtype), jnp.asarray(scale, dtype), stages)
    losses, xs = np.asarray(losses), np.asarray(xs)
    if not np.all(np.isfinite(losses)):
        bad = int(np.argmin(np.all(np.isfinite(losses), axis=0)))
        raise ConfigError(f"optimize: the loss became non-finite at step {bad}; lower the learning rate or raise "
                          "the temperature")
    best = int(np.argmin(losses[:, -1]))
    chosen = tuple(p[best] for p in params)
    continuous_makespan = float(evaluate_boundaries(graph, workload, xs[best:best + 1],
                                                    None if sizes is None else np.asarray(sizes[best:best + 1]))[0][0])
    fractional = None
    if split is not None:
        fractional = np.asarray(jax.vmap(split.samples)(params[knobs.index(split)]))

    # Rounding every start's optimum, then the exact local search from the best rounded plan and
    # from the best baseline.
    candidates = []
    for r in range(xs.shape[0]):
        counts = (_round_boundaries(xs[r], workload.layers) if balance is not None
                  else np.asarray(workload.layers_per_stage)[None, :])
        samples = None if split is None else _round_samples(fractional[r], split.batch)
        candidates += [(c, samples) for c in counts]
    rounded, _ = search.best(candidates)
    origins = [rounded, baselines[baseline]] + ([] if fitted is None else [(fitted, equal)])
    if local_search:
        found = [search.descend(s, move_split=balance is not None) for s in origins]
    else:
        found = [(s, search.key(s)) for s in origins]
    (counts, samples), _ = min(found, key=lambda f: f[1])

    # Final check: the chosen plan evaluated afresh (not from the search's cache).
    size = None if samples is None else search.size_of(samples)[None, :]
    time, memory, _ = evaluate_plans(graph, workload, counts[None, :], size)
    time, memory = float(time[0]), memory[0]
    plan = make_plan(graph, workload, counts, samples, time, memory)
    base_plan = make_plan(graph, workload, *baselines[baseline], *search.evaluate([baselines[baseline]])[0])
    rounded_plan = make_plan(graph, workload, *rounded, *search.evaluate([rounded])[0])
    message = _message(plan, base_plan, baseline)
    if throw and not plan.fits:
        raise ConfigError(message)
    return OptimizeResult(
        plan=plan, fits=plan.fits, message=message, baseline=baseline, baseline_plan=base_plan,
        rounded=rounded_plan, params=chosen,
        continuous_layers=None if balance is None else np.diff(xs[best]),
        continuous_samples=None if fractional is None else fractional[best],
        continuous_makespan=continuous_makespan, loss=losses[best],
        temperatures=taus * scale, evaluations=search.evaluations,
    )


def _peak_in_flight(graph: Graph | Schedule) -> np.ndarray:
    """Per device, the peak number of stored activations (timing-free: the lane order decides)."""
    if isinstance(graph, Schedule):
        return np.asarray(peak_activations(graph), np.float64)
    return np.asarray(peak_memory(graph, Hardware.from_times(0.0, 0.0))[1], np.float64)


def _memory_minmax(workload: Workload, holder: np.ndarray, versions: np.ndarray, in_flight: np.ndarray,
                   size: float) -> np.ndarray | None:
    """The split minimising the largest stage compute subject to every stage fitting its device's
    memory (static bytes x versions + activation bytes x peak stored activations x size): a start
    for the search that is feasible where the unconstrained min-max is not. Only for placements with
    one stage per device (else ``None``), and ``None`` when no split fits."""
    capacity = np.broadcast_to(np.asarray(workload.capacity, np.float64), in_flight.shape)
    pipelines, stages = holder.shape
    if pipelines != 1 or len(set(holder.ravel().tolist())) != stages or np.all(np.isinf(capacity)):
        return None
    device = holder[0]
    static, act = (np.asarray(x, np.float64) for x in (workload.static_bytes, workload.activation_bytes))
    memory = versions[0][:, None] * static[None, :] + (in_flight[device] * size)[:, None] * act[None, :]
    split = partition(np.asarray(workload.compute, np.float64), stages, memory=memory, limit=capacity[device])
    return None if split is None else np.asarray(split, dtype=np.int64)


#: Spread of the logits of random restarts around the first start.
RESTART_SPREAD = 0.5


def _starts(knobs, workload, init, splits, restarts, key, dtype) -> tuple:
    """Starting parameters with a leading ``starts`` axis (a tuple following the knobs)."""
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
        if any(isinstance(k, StageBalance) for k in knobs):
            for counts in splits.values():
                rows.append(tuple(k.init(workload, tuple(counts.tolist())) if isinstance(k, StageBalance)
                                  else k.init(workload) for k in knobs))
    if restarts:
        for r in range(restarts):
            noise = jax.random.split(jax.random.fold_in(key, r), len(knobs))
            rows.append(tuple(p + RESTART_SPREAD * jax.random.normal(n, p.shape, dtype)
                              for p, n in zip(rows[0], noise)))
    return tuple(jnp.stack([jnp.asarray(row[i], dtype) for row in rows]) for i in range(len(knobs)))


def _check_mode(graph: Graph, workload: Workload) -> None:
    """The graph must have been compiled for the workload network's communication mode."""
    probe = Hardware.from_times(0.0, 0.0)
    eqx.tree_at(lambda hw: hw.network, probe, workload.network).check_graph(graph)


def _message(plan: Plan, baseline: Plan, name: str) -> str:
    what = f"layers per stage {list(plan.layers_per_stage)}"
    if plan.samples is not None:
        what += f", samples per microbatch {list(plan.samples)}"
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
