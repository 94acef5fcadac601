"""``compare``: the three abstraction levels of the "Tabular Schedule Abstraction" study side by side.

Source: Barley, Leis, Klenk and Fröning, "A Tabular Schedule Abstraction for Communication-Aware
Evaluation of Pipeline-Parallel LLM Training" (ISPDC 2026, arXiv:2605.24006): a schedule's quality
is judged at three levels, and its ranking among other schedules need not survive the step from
one level to the next.

1. **formula**: the family's closed form from the registry (``schedules.formula``) at the table's
   per-kind durations. Ranked by *bubble ratio*, the quantity every closed form gives. Where the
   closed form only holds under another assumption (Chimera's needs ``t_F = t_B``), it is
   evaluated at ``F = B = 1`` instead and the assumption is reported; a bubble ratio is
   dimensionless, so it still ranks. Families without a closed form (Hanayo, the asymmetric
   Chimera) are *missing* at this level: unranked, and left out of that level's Kendall tau.
2. **table**: ``schedules.table`` at unit-ish durations (default F=1, B=2, I=W=1) and no
   communication. Compute durations are per *device share* of the model: a schedule with ``S``
   stages per pipeline on ``D`` devices runs each stage in ``D/S`` of the time (Hanayo's chunks,
   interleaved virtual stages), so every schedule does the same work. Ranked by makespan.
3. **simulation**: ``simulate`` on the given hardware: per-stage costs, communication in the
   comparison's mode (``communication=``, else the ``Machine``'s), memory. Ranked by makespan. A
   schedule ``fits`` when every device's peak is at most its capacity less ``headroom``
   (``HEADROOM``, 10%: the fit rule of ``plan`` and ``simulate``,
   ``diffpipe._plan._configuration.fits_memory``).

Peak activation memory is reported at every level: in *activation units* (one microbatch's
activations for ``1/D`` of the model: a stage-microbatch count times ``D/S``) for the formula and
the table, in bytes for the simulation (peak stored activations; ``peak_memory`` adds the static
bytes: weights, gradients, optimizer state).

Equal work. ``microbatches`` counts *samples* (microbatches of the global batch) for every family.
A sequence-level family cuts a sample into ``k`` units (``schedules.units_per_sample``: Seq1F1B's and
Seq1F1B-I's ``segments``), so it is generated at ``microbatches * k`` microbatch ids and each unit is
priced at its segment's share of a sample: at the formula and table levels ``1/k`` (the closed
forms' equal per-segment times, a compute-balanced split), at the simulation level the Hardware's
``size`` per unit from ``diffpipe._workload._segments.per_unit_hardware`` under ``segment_split`` (balanced:
``1/k`` each; equal lengths: later segments costlier by the model's attention share, which needs a
``Machine``). A Seq1F1B at ``segments=1`` is then exactly a 1F1B, and activation units are a sample's.

Ranks are competition ranks ("1224"): two values within ``rtol`` of each other tie. For each pair
of levels, Kendall's tau-b over the schedules ranked at both (tau-b corrects for ties; it is
undefined, ``None``, when fewer than two schedules are shared or one level ties them all) and the
*flips*: pairs ordered one way at one level and the other way at the other.

Why one module past 500 lines: the three levels side by side, their rank statistics and the
comparison's table are one study (the JAX-free levels live in ``_levels``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._engine._batch import simulate_members
from ._engine._communication import communication as get_communication
from ._engine._graph import Graph, common_sizes
from ._engine._hardware import Hardware, Network
from ._engine._simulate import simulate
from ._errors import ConfigError, ScheduleError
from ._levels import (
    _COMPUTE,
    DEFAULT_DEVICES,
    DEFAULT_MICROBATCHES,
    DEFAULT_RTOL,
    DEFAULT_SCHEDULES,
    LEVELS,
    RANKED_BY,
    _check_level,
    _order,
    formula_level,
    kendall_tau,
    ranks,
    table_level,
)
from ._machine._presets import device
from ._machine._specs import NETWORKS
from ._model._transformer import Transformer
from ._plan._configuration import HEADROOM, check_headroom, fit_rule, fits_memory
from ._results import csv_text, json_text, markdown_table, percent
from ._workload._segments import SPLITS, attention_share, per_unit_hardware
from ._workload._workload import hardware_from_model
from .schedules import Schedule, units_per_sample
from .schedules import family as family_of
from .schedules import get as get_schedule
from .schedules import names as family_names
from .schedules._analysis import activation_bytes_peaks
from .schedules._reference import DEFAULT_DURATIONS


# -- the modelled machine ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Machine:
    """A modelled machine: a transformer trained on accelerators over a network.

    Each schedule gets its own ``Hardware`` (``hardware_from_model``) with the model's layers
    split evenly into *that schedule's* stages, so Hanayo's ``2D`` chunks and a ``D``-stage 1F1B
    share the same model and devices. Call it with a schedule to get that hardware.
    ``communication`` is the mode its schedules are compiled under (a name or an
    ``AbstractCommunication``) and ``devices_per_node`` their topology (devices sharing a node;
    None: all on one node): the graph holds both, the hardware holds floats only.
    """

    model: Any  # diffpipe.Transformer
    device: Any  # diffpipe.Device
    network: Any  # diffpipe.Network
    name: str = "custom"
    uniform_stages: bool = False
    communication: Any = "overlap"
    devices_per_node: int | None = None

    @classmethod
    def default(cls, mode: str = "contention") -> Machine:
        """The machine ``compare`` models when given none (see ``default_machine``)."""
        return default_machine(mode)

    def __call__(self, schedule: Schedule) -> Any:
        """The ``Hardware`` of ``schedule`` on this machine.

        With ``uniform_stages`` every stage gets the mean of the per-stage compute times, memory
        and gradient bytes (the assumption of the closed forms), instead of whole layers with the
        embedding on the first stage and the LM head on the last; boundary messages are unchanged.
        """
        if schedule.stages > self.model.layers:
            raise ConfigError(
                f"machine {self.name!r}: {schedule.family} needs {schedule.stages} stages, the model has only "
                f"{self.model.layers} layers"
            )
        hw = hardware_from_model(self.model, self.device, self.network, stages=schedule.stages)
        if not self.uniform_stages:
            return hw
        fields = ("forward", "input_grad", "weight", "static_bytes", "gradient_bytes", "activation_bytes")
        return eqx.tree_at(lambda h: [getattr(h, f) for f in fields], hw,
                           [jnp.full_like(getattr(hw, f), jnp.mean(getattr(hw, f))) for f in fields])


def default_machine(mode: str = "contention") -> Machine:
    """The machine ``compare`` models when given no hardware.

    A GPT-3 6.7B-style model (Brown et al. 2020, Table 2.1: 32 layers, hidden 4096, 32 heads,
    sequence 2048; GPT-2 vocabulary 50257; microbatch 1, fp16, mixed-precision Adam) on one node
    of 8 H100 SXM (the preset: 989 dense BF16 TFLOP/s, its fitted kernel-efficiency curve, 80 GB
    at 3.35 TB/s) joined by 4th-generation NVLink through NVSwitch (450 GB/s per GPU and direction,
    3 µs), with the transformer cost model of ``diffpipe._model._transformer``. Under ``contention`` each
    GPU's sends share its NVLink bandwidth, one at a time, whatever their destination
    (``devices_per_node=1``: every GPU's egress is a lane).
    """
    link = NETWORKS["nvlink4"]
    latency, bandwidth = jnp.asarray(link.latency), jnp.asarray(link.bandwidth)
    network = Network(latency, bandwidth, latency, bandwidth)
    model = Transformer(layers=32, hidden=4096, heads=32, sequence=2048, vocabulary=50257)
    return Machine(model, device("H100"), network,
                   name="GPT-3 6.7B (32 layers, h=4096, s=2048, b=1, fp16) on 8x H100 SXM, NVLink4",
                   communication=mode, devices_per_node=1)


# -- results ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One schedule at the three levels (``None`` where a level has no value for it).

    ``formula``: ``bubble_ratio``, ``makespan`` (table time units; None when the closed form was
    evaluated under its own assumption), ``peak_activations`` (activation units, or None),
    ``assumption``. ``table``: ``makespan``, ``bubble_ratio``, ``peak_activations``.
    ``simulation``: ``makespan_s``, ``bubble_ratio``, ``peak_memory_bytes``,
    ``peak_activation_bytes``, ``capacity_bytes`` (the smallest device's), ``fits`` (every device's
    peak within its capacity less the comparison's ``headroom``).
    """

    name: str
    family: str
    options: tuple[tuple[str, Any], ...]
    stages: int
    pipelines: int
    formula: Mapping[str, Any] | None
    formula_missing: str | None
    table: Mapping[str, Any]
    simulation: Mapping[str, Any]
    units_per_sample: int = 1


@dataclass(frozen=True)
class LevelPair:
    """Agreement of two levels: Kendall's tau-b over the schedules ranked at both, and the pairs
    whose order reverses (``flips``) or that tie at exactly one of the two (``ties_changed``)."""

    levels: tuple[str, str]
    compared: tuple[str, ...]
    kendall_tau: float | None
    flips: tuple[tuple[str, str], ...]
    ties_changed: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Comparison:
    """The result of ``compare``: entries, per-level ranks and level-pair agreement.

    ``ranks[level][i]`` is entry i's competition rank at ``level`` (1 = best; None if missing).
    ``str()`` is a human table; ``to_markdown()`` the same as Markdown; ``to_json()`` / ``to_dict()``
    the stable machine-readable form (keys documented in ``to_dict``).
    """

    devices: int
    microbatches: int
    machine: str
    durations: Mapping[str, float]
    rtol: float
    entries: tuple[Entry, ...]
    ranks: Mapping[str, tuple[int | None, ...]]
    pairs: tuple[LevelPair, ...]
    communication: str = field(default="")
    segment_split: str = field(default="balanced")
    headroom: float = field(default=HEADROOM)

    # -- lookups --------------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)

    def entry(self, name: str) -> Entry:
        for e in self.entries:
            if e.name == name:
                return e
        raise ConfigError(f"comparison has no schedule {name!r}; it has {', '.join(self.names)}")

    def rank(self, name: str, level: str) -> int | None:
        _check_level(level)
        return self.ranks[level][self.names.index(self.entry(name).name)]

    def ranking(self, level: str) -> tuple[str, ...]:
        """Names ranked at ``level``, best first (ties in input order); missing ones left out."""
        _check_level(level)
        ranked = [(r, i) for i, r in enumerate(self.ranks[level]) if r is not None]
        return tuple(self.entries[i].name for r, i in sorted(ranked))

    def pair(self, a: str, b: str) -> LevelPair:
        _check_level(a)
        _check_level(b)
        for p in self.pairs:
            if set(p.levels) == {a, b}:
                return p
        raise ConfigError(f"no level pair {a!r}/{b!r}")  # pragma: no cover - every pair is built

    @property
    def invariant(self) -> bool:
        """Whether no pair of schedules flips between any two levels."""
        return not any(p.flips for p in self.pairs)

    # -- output ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain data. Keys: ``devices``, ``microbatches`` (samples), ``machine``, ``communication``,
        ``durations``, ``rtol``, ``segment_split``, ``headroom``, ``levels`` (level -> metric ranked, lower better),
        ``schedules`` (list of ``{name, family, options, stages, pipelines, units_per_sample, formula,
        formula_missing, table, simulation, rank: {level: int|null}}``) and ``pairs`` (list of ``{levels, compared,
        kendall_tau, flips, ties_changed}``). Seconds and bytes are SI; ``null`` marks a missing value."""
        return {
            "devices": self.devices,
            "microbatches": self.microbatches,
            "machine": self.machine,
            "communication": self.communication,
            "durations": dict(self.durations),
            "rtol": self.rtol,
            "segment_split": self.segment_split,
            "headroom": self.headroom,
            "levels": dict(RANKED_BY),
            "schedules": [
                {
                    "name": e.name, "family": e.family, "options": dict(e.options), "stages": e.stages,
                    "pipelines": e.pipelines, "units_per_sample": e.units_per_sample,
                    "formula": None if e.formula is None else dict(e.formula),
                    "formula_missing": e.formula_missing,
                    "table": dict(e.table), "simulation": dict(e.simulation),
                    "rank": {level: self.ranks[level][i] for level in LEVELS},
                }
                for i, e in enumerate(self.entries)
            ],
            "pairs": [
                {"levels": list(p.levels), "compared": list(p.compared), "kendall_tau": p.kendall_tau,
                 "flips": [list(f) for f in p.flips], "ties_changed": [list(t) for t in p.ties_changed]}
                for p in self.pairs
            ],
        }

    def to_json(self, path: str | os.PathLike | None = None, indent: int | None = 2) -> str:
        """Strict JSON text of ``to_dict()``; also written atomically to ``path`` when given."""
        return json_text(self.to_dict(), path, indent)

    #: Columns of ``to_csv``: one row per schedule, raw numbers (SI units), empty where missing.
    CSV_COLUMNS = ("name", "family", "stages", "pipelines", "formula_bubble_ratio", "table_makespan",
                   "table_bubble_ratio", "makespan_s", "bubble_ratio", "peak_activation_bytes", "peak_memory_bytes",
                   "fits", "rank_formula", "rank_table", "rank_simulation")

    def to_csv(self, path: str | os.PathLike | None = None) -> str:
        """One row per schedule (``CSV_COLUMNS``); also written atomically to ``path`` when given."""
        rows = []
        for i, e in enumerate(self.entries):
            s = e.simulation
            rows.append([e.name, e.family, e.stages, e.pipelines,
                         None if e.formula is None else e.formula["bubble_ratio"],
                         e.table["makespan"], e.table["bubble_ratio"], s["makespan_s"], s["bubble_ratio"],
                         s["peak_activation_bytes"], s["peak_memory_bytes"], s["fits"],
                         *(self.ranks[level][i] for level in LEVELS)])
        return csv_text(self.CSV_COLUMNS, rows, path)

    def _rows(self) -> tuple[list[str], list[list[str]]]:
        longest = max((e.simulation["makespan_s"] for e in self.entries), default=0.0)
        scale, unit = (1.0, "s") if longest >= 10 else (1e3, "ms") if longest >= 1e-2 else (1e6, "µs")
        has_bytes = any(e.simulation["peak_memory_bytes"] > 0 for e in self.entries)
        header = ["schedule", "formula bubble (%)", "#", "table makespan", "table bubble (%)", "#",
                  f"sim makespan ({unit})", "sim bubble (%)", "#", "peak act formula", "peak act table",
                  "peak act sim (GB)", "peak mem (GB)", "fits"]
        rows = []
        for i, e in enumerate(self.entries):
            f, t, s = e.formula, e.table, e.simulation
            rank = [_fmt_rank(self.ranks[level], i) for level in LEVELS]
            rows.append([
                e.name,
                "—" if f is None else percent(f["bubble_ratio"]) + ("*" if f["makespan"] is None else ""),
                rank[0],
                f"{t['makespan']:g}", percent(t["bubble_ratio"]), rank[1],
                f"{s['makespan_s'] * scale:.2f}", percent(s["bubble_ratio"]), rank[2],
                "—" if f is None or f["peak_activations"] is None else f"{f['peak_activations']:g}",
                f"{t['peak_activations']:g}",
                f"{s['peak_activation_bytes'] / 1e9:.1f}" if has_bytes else "—",
                f"{s['peak_memory_bytes'] / 1e9:.1f}" if has_bytes else "—",
                "yes" if s["fits"] else "NO",
            ])
        return header, rows

    def _notes(self) -> list[str]:
        notes = [f"{self.devices} devices, {self.microbatches} microbatches; simulation on {self.machine}"
                 + (f" (communication: {self.communication})" if self.communication else "") + "."]
        durations = ", ".join(f"{k}={v:g}" for k, v in self.durations.items() if k in _COMPUTE)
        notes.append(f"formula and table at {durations} per device share, no communication; ranks: formula by "
                     "bubble ratio, table and simulation by makespan; '=' marks a tie (rtol "
                     f"{self.rtol:g}); bubble: share of the step a device idles (%); peak activations of "
                     "formula/table in units of one microbatch (a sample) through 1/D of the model.")
        capacity = min((e.simulation["capacity_bytes"] for e in self.entries), default=math.inf)
        if math.isfinite(capacity):
            notes.append(f"{fit_rule(capacity, self.headroom)}, as plan and simulate.")
        for e in self.entries:
            if e.units_per_sample > 1:
                k = e.units_per_sample
                notes.append(f"{e.name}: {k} units per sample ({self.microbatches * k} microbatch ids), each 1/{k} "
                             f"of a sample at the formula and table levels, its segment's share "
                             f"({self.segment_split} split) in the simulation.")
            if e.formula is None:
                notes.append(f"{e.name}: no formula ({e.formula_missing}).")
            elif e.formula["makespan"] is None:
                notes.append(f"{e.name}: * closed form evaluated under its assumption ({e.formula['assumption']}).")
        for p in self.pairs:
            tau = "undefined" if p.kendall_tau is None else f"{p.kendall_tau:+.3f}"
            text = f"{p.levels[0]} vs {p.levels[1]}: Kendall tau {tau} over {len(p.compared)} schedules"
            if p.flips:
                text += "; flips: " + ", ".join(f"{a}/{b}" for a, b in p.flips)
            if p.ties_changed:
                text += "; tie at one level only: " + ", ".join(f"{a}/{b}" for a, b in p.ties_changed)
            if not p.flips and not p.ties_changed:
                text += "; same order"
            notes.append(text + ".")
        return notes

    def to_markdown(self) -> str:
        return markdown_table(*self._rows()) + "\n" + "\n".join(f"- {n}" for n in self._notes()) + "\n"

    def __str__(self) -> str:
        header, rows = self._rows()
        widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
        line = "  ".join
        out = [line(h.ljust(w) for h, w in zip(header, widths))]
        out.append(line("-" * w for w in widths))
        out += [line(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        return "\n".join(out) + "\n\n" + "\n".join(self._notes())


def _fmt_rank(level_ranks: Sequence[int | None], i: int) -> str:
    rank = level_ranks[i]
    if rank is None:
        return "—"
    return f"{rank}=" if sum(r == rank for r in level_ranks) > 1 else str(rank)


# -- ranking ------------------------------------------------------------------------------------------
def _level_pair(a: str, b: str, names: Sequence[str], values: Mapping[str, Sequence[float | None]],
                rtol: float) -> LevelPair:
    shared = [i for i in range(len(names)) if values[a][i] is not None and values[b][i] is not None]
    xa = [values[a][i] for i in shared]
    xb = [values[b][i] for i in shared]
    flips, ties = [], []
    for i, j in combinations(shared, 2):
        sa, sb = _order(values[a][i], values[a][j], rtol), _order(values[b][i], values[b][j], rtol)
        if sa * sb < 0:
            flips.append((names[i], names[j]))
        elif (sa == 0) != (sb == 0):
            ties.append((names[i], names[j]))
    return LevelPair((a, b), tuple(names[i] for i in shared), kendall_tau(xa, xb, rtol), tuple(flips), tuple(ties))


def _simulation_level(schedule: Schedule, hw: Any, headroom: float, found: tuple | None = None,
                      communication: Any = "overlap", devices_per_node: int | None = None) -> dict:
    """The simulation level of ``schedule`` on ``hw`` under ``communication`` and
    ``devices_per_node``: ``found`` (makespan, bubble ratio, per-device peak memory:
    ``_simulation_levels``), else ``simulate``'s."""
    if found is None:
        result = simulate(schedule, hw, communication=communication, devices_per_node=devices_per_node)
        found = (result.makespan, result.bubble_ratio, result.peak_memory)
    step, bubble, peaks = found
    peaks = np.asarray(peaks)  # numpy, not jnp: an eager jnp op compiles
    capacities = np.broadcast_to(np.asarray(hw.capacity, np.float64), peaks.shape)
    return {
        "makespan_s": float(step),
        "bubble_ratio": float(bubble),
        "peak_memory_bytes": float(np.max(peaks)),
        "peak_activation_bytes": max(activation_bytes_peaks(schedule, hw.activation_bytes, hw.size), default=0.0),
        "capacity_bytes": float(np.min(capacities)),
        "fits": all(fits_memory(m, c, headroom) for m, c in zip(peaks, capacities)),
    }


def _simulation_levels(pairs: Sequence[tuple[Schedule, Any]], headroom: float, communication: Any,
                       devices_per_node: int | None) -> list[dict]:
    """``_simulation_level`` of each (schedule, hardware), compiled under ``communication`` for
    ``devices_per_node``. The
    graphs of one topology pad to their common sizes and run one compiled program
    (``simulate_members``): one compilation and one trace for the comparison, not one per graph
    structure, with ``simulate``'s numbers bit for bit (``tests/test_compare.py``). A cost model
    other than ``Hardware``, or a check failing inside the program (a NaN makespan), goes through
    ``simulate`` itself, which names the culprit."""
    found: list[tuple | None] = [None] * len(pairs)
    groups: dict[tuple, list[tuple[int, Graph]]] = {}
    for i, (schedule, hw) in enumerate(pairs):
        if isinstance(hw, Hardware) and not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(hw)):
            graph = hw.compile_schedule(schedule, communication=communication, devices_per_node=devices_per_node)
            hw.check(graph)  # simulate's eager check
            groups.setdefault((graph.communication, graph.devices_per_node), []).append((i, graph))
    for members in groups.values():
        sizes = common_sizes([graph for _, graph in members])
        for i, graph in members:
            try:
                steps, bubbles, memory = simulate_members(graph, [pairs[i][1]], pad_to=sizes, batch_bucket=1)
            except ConfigError:  # a leaf that does not pad: simulate's own path
                continue
            if np.isfinite(steps[0]):
                found[i] = (steps[0], bubbles[0], memory[0])
    return [_simulation_level(schedule, hw, headroom, f, communication, devices_per_node)
            for (schedule, hw), f in zip(pairs, found)]


# -- inputs -----------------------------------------------------------------------------------------
def _label(family: str, options: Mapping[str, Any]) -> str:
    if not options:
        return family
    return family + "(" + ",".join(f"{k}={v}" for k, v in sorted(options.items())) + ")"


def _schedule_label(schedule: Schedule) -> str:
    """The family name, with the options that differ from the family's defaults."""
    if schedule.family not in family_names():
        return schedule.family
    default = family_of(schedule.family).resolve({})
    return _label(schedule.family, {k: v for k, v in schedule.options if default.get(k, object()) != v})


def _resolve(items: Any, devices: int | None, microbatches: int | None) -> list[tuple[str, Schedule]]:
    """(label, schedule) pairs, every schedule at ``devices`` and ``microbatches`` samples (a
    sequence-level family at ``microbatches x units_per_sample`` microbatch ids)."""
    if isinstance(items, (str, Schedule)):
        items = [items]
    labels: list[str | None]
    if isinstance(items, Mapping):
        labels = [str(k) for k in items]
        items = list(items.values())
    else:
        try:
            items = list(items)
        except TypeError:
            raise ConfigError(f"compare: expected a sequence of schedules or family names, got "
                              f"{type(items).__name__}") from None
        labels = [None] * len(items)
    if not items:
        raise ConfigError("compare: give at least one schedule or family name")
    given = [it for it in items if isinstance(it, Schedule)]
    if devices is None:
        devices = given[0].devices if given else DEFAULT_DEVICES
    if microbatches is None:
        microbatches = given[0].microbatches // units_per_sample(given[0]) if given else DEFAULT_MICROBATCHES

    def generate(name: str, options: Mapping[str, Any]) -> Schedule:
        units = family_of(name).units(options)
        return get_schedule(name, devices=devices, microbatches=microbatches * units, **options)

    out: list[tuple[str, Schedule]] = []
    for given_label, item in zip(labels, items):
        if isinstance(item, Schedule):
            schedule, label = item, _schedule_label(item)
        elif isinstance(item, str):
            schedule, label = generate(item, {}), item
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], Mapping):
            schedule = generate(item[0], item[1])
            label = _label(item[0], item[1])
        else:
            raise ConfigError(f"compare: cannot compare {item!r}: give a family name, (name, options) or a Schedule")
        units = units_per_sample(schedule)
        if schedule.devices != devices or schedule.microbatches != microbatches * units:
            per = f" (samples of {units} units)" if units > 1 else ""
            raise ConfigError(
                f"compare: {schedule.family} has {schedule.devices} devices and {schedule.microbatches // units} "
                f"microbatches{per}, the comparison {devices} and {microbatches}"
            )
        out.append((given_label or label, schedule))
    seen: dict[str, int] = {}
    labelled = []
    for name, schedule in out:
        seen[name] = seen.get(name, 0) + 1
        labelled.append((name if seen[name] == 1 else f"{name}#{seen[name]}", schedule))
    return labelled


def _hardware_for(hardware: Any, schedules: Sequence[tuple[str, Schedule]]) -> tuple[Callable, str, Any, Any]:
    """A ``schedule -> Hardware`` function, a description of the machine, its communication mode and
    its devices per node (a ``Machine``'s; None for a ``Hardware`` or a function, which hold none)."""
    if hardware is None:
        hardware = default_machine()
    if isinstance(hardware, Hardware):
        stages = {s.stages for _, s in schedules}
        scalar = all(getattr(hardware, n).ndim == 0 for n in ("forward", "input_grad", "weight"))
        if len(stages) > 1 and scalar:
            (a, sa), (b, sb) = (min(schedules, key=lambda x: x[1].stages), max(schedules, key=lambda x: x[1].stages))
            raise ConfigError(
                f"compare: {b} has {sb.stages} stages per pipeline and {a} {sa.stages}; one Hardware would give "
                "each stage the same cost: pass a Machine or a callable schedule -> Hardware"
            )
        return (lambda s: hardware), "the given Hardware", None, None
    if isinstance(hardware, Machine):
        return hardware, hardware.name, hardware.communication, hardware.devices_per_node
    if callable(hardware):
        return hardware, getattr(hardware, "__name__", "the given hardware function"), None, None
    raise ConfigError(f"compare: hardware must be a Hardware, a Machine or a callable schedule -> Hardware, "
                      f"got {type(hardware).__name__}")


def compare(
    schedules_or_names: Sequence[Any] | Mapping[str, Any] = DEFAULT_SCHEDULES,
    hardware: Any = None,
    *,
    devices: int | None = None,
    microbatches: int | None = None,
    durations: Mapping[str, float] | None = None,
    rtol: float = DEFAULT_RTOL,
    segment_split: str = "balanced",
    headroom: float = HEADROOM,
    communication: Any = None,
    devices_per_node: int | None = None,
) -> Comparison:
    """Rank schedules at the formula, table and simulation levels and show where rankings flip.

    Args:
        schedules_or_names: family names (generated at ``devices`` x ``microbatches``),
            ``(name, options)`` pairs, or ``Schedule`` objects; or a mapping from labels to those.
            Default ``DEFAULT_SCHEDULES``: GPipe, 1F1B, Chimera (with its replicas' gradient
            all-reduce), Hanayo. Unlabelled entries are named by their family and
            any non-default options (``chimera(sync=True)``).
        hardware: the machine of the simulation level: ``None`` for ``default_machine()`` (a GPT-3
            6.7B-style model on 8x H100 NVLink with link contention), a ``Machine`` (the model is
            split into each schedule's own stages), a callable ``schedule -> Hardware``, or one
            ``Hardware`` (only when every schedule has the same number of stages, or its per-stage
            leaves are arrays that fit them all).
        devices, microbatches: sizes of generated schedules (default: those of the first given
            ``Schedule``, else 8 and 8). Every schedule must have these sizes. ``microbatches``
            counts samples: a family with several units per sample (``segments``) is generated at
            ``microbatches x units`` microbatch ids and each unit priced at its segment's share.
        durations: per-kind durations of the formula and table levels (default F=1, B=2, I=W=1).
        rtol: relative tolerance under which two values tie.
        segment_split: the segment lengths a sequence-level family's simulation is priced at:
            ``"balanced"`` (compute-balanced, every unit ``1/k`` of a sample) or ``"equal"`` (equal
            lengths, the model's attention share making later segments costlier; needs a ``Machine``).
        headroom: the share of each device's memory a schedule must leave free to "fit" (``HEADROOM``,
            0.1, as ``plan`` and ``simulate``).
        communication: the mode the simulation level compiles every schedule under (a name or an
            ``AbstractCommunication``); default the ``Machine``'s (``contention`` for the default
            machine), else ``overlap``.
        devices_per_node: the topology the simulation level compiles every schedule for (devices
            sharing a node); default the ``Machine``'s (1 for the default machine: every GPU's
            egress is a lane under ``contention``), else all on one node.

    Returns:
        A ``Comparison`` (see its ``to_markdown``, ``to_json`` and ``str``).

    Raises:
        ScheduleError: an unknown family or sizes a family rejects.
        ConfigError: inconsistent sizes, unusable hardware, a bad tolerance.
    """
    if not (isinstance(rtol, (int, float)) and math.isfinite(rtol) and 0 <= rtol < 1):
        raise ConfigError(f"compare: rtol must be a number in [0, 1), got {rtol!r}")
    if durations is not None:
        unknown = set(durations) - set(DEFAULT_DURATIONS)
        if unknown:
            raise ScheduleError(f"compare: durations has unknown op kind(s) {sorted(unknown)}")
    merged = {**DEFAULT_DURATIONS, **(durations or {})}
    for kind, value in merged.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ConfigError(f"compare: duration of {kind} must be a finite non-negative number, got {value!r}")
    headroom = check_headroom("compare", headroom)
    if segment_split not in SPLITS:
        raise ConfigError(f"compare: segment_split must be one of {', '.join(SPLITS)}, got {segment_split!r}")
    schedules = _resolve(schedules_or_names, devices, microbatches)
    hw_of, machine, mode, per_node = _hardware_for(hardware, schedules)
    mode = get_communication(communication if communication is not None else mode or "overlap")
    per_node = per_node if devices_per_node is None else devices_per_node
    share = None
    if segment_split == "equal" and any(units_per_sample(s) > 1 for _, s in schedules):
        if hardware is not None and not isinstance(hardware, Machine):
            raise ConfigError("compare: segment_split='equal' prices segments by the model's attention share: "
                              "pass a Machine (or no hardware: the default machine)")
        share = attention_share((hardware or default_machine()).model)

    hws = []
    for name, schedule in schedules:
        hw = hw_of(schedule)
        if not isinstance(hw, Hardware):
            raise ConfigError(f"compare: the hardware function returned {type(hw).__name__} for {name}, "
                              "expected a Hardware")
        hws.append(per_unit_hardware(hw, schedule, segment_split, share))
    simulation = _simulation_levels([(schedule, hw) for (_, schedule), hw in zip(schedules, hws)], headroom, mode,
                                    per_node)
    entries = []
    for (name, schedule), level in zip(schedules, simulation):
        formula, missing = formula_level(schedule, merged)
        entries.append(Entry(
            name=name, family=schedule.family, options=schedule.options, stages=schedule.stages,
            pipelines=schedule.pipelines, formula=formula, formula_missing=missing,
            table=table_level(schedule, merged), simulation=level,
            units_per_sample=units_per_sample(schedule),
        ))
    values = {
        "formula": [None if e.formula is None else e.formula["bubble_ratio"] for e in entries],
        "table": [e.table["makespan"] for e in entries],
        "simulation": [e.simulation["makespan_s"] for e in entries],
    }
    names = [e.name for e in entries]
    return Comparison(
        devices=schedules[0][1].devices, microbatches=schedules[0][1].microbatches // units_per_sample(schedules[0][1]),
        machine=machine,
        durations=merged, rtol=float(rtol), entries=tuple(entries),
        ranks={level: ranks(values[level], rtol) for level in LEVELS},
        pairs=tuple(_level_pair(a, b, names, values, rtol) for a, b in combinations(LEVELS, 2)),
        communication=str(mode), segment_split=segment_split, headroom=headroom,
    )
