"""Reproduce the "Tabular Schedule Abstraction" study in diffpipe's model.

Barley, Leis, Klenk and Fröning, "A Tabular Schedule Abstraction for Communication-Aware
Evaluation of Pipeline-Parallel LLM Training" (ISPDC 2026, arXiv:2605.24006) compare GPipe,
1F1B, Chimera and Hanayo (restricted regime N = D), and an asymmetric Chimera-style placement, at
three levels of abstraction: closed-form formulas, idealized unit-time tables and a
communication-aware simulation, on several modelled systems. This script redoes that with
``diffpipe.compare`` on a GPT-3 6.7B-style model and H100s over four kinds of network.

Usage::

    python papers/tabular-abstraction/reproduce.py           # everything (a few minutes on 2 cores)
    python papers/tabular-abstraction/reproduce.py --fast    # D = 4 only, fewer points

Writes ``results.md`` (each claim, its evidence and verdict), ``results.json``,
``comparisons.md`` (every three-level comparison), ``bandwidth_sweep.md``,
``bandwidth_sweep.png``, ``chimera_microbatches.png`` and ``gantt_hanayo_ethernet.png`` next to
this file (or into ``--out``). ``tests/test_paper_tabular.py`` checks every claim through the
functions below.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import diffpipe as dp
from diffpipe import Comparison, Machine
from diffpipe.schedules import get, table

HERE = Path(__file__).resolve().parent

#: GPT-3 6.7B (Brown et al. 2020, Table 2.1) with GPT-2's vocabulary, microbatch 1, fp16.
MODEL = dict(layers=32, hidden=4096, heads=32, sequence=2048, vocabulary=50257)
DEVICE = "H100"
#: The study's compute model: a fixed 50% of peak (its README), kept explicitly now that the preset
#: defaults to a fitted kernel-efficiency curve (papers/kernel-efficiency): a flat curve, the
#: datasheet bandwidth as the roof.
EFFICIENCY = 0.5
#: The schedules, by the names the tables use. Both Chimera variants synchronise the gradients of
#: their two replicas once per step (``sync``: a ring all-reduce per stage, at the end of the
#: step on the compute stream, so an upper bound on its cost); ``grid(sync=False)`` drops it.
SCHEDULES = {
    "gpipe": ("gpipe", {}),
    "1f1b": ("1f1b", {}),
    "chimera": ("chimera", {"sync": True}),
    "chimera-asymmetric": ("chimera-asymmetric", {"sync": True}),
    "hanayo": ("hanayo", {}),
}
FAMILIES = tuple(SCHEDULES)


@dataclass(frozen=True)
class System:
    """A modelled interconnect: per-device egress bandwidth (bytes/s) and latency (s)."""

    name: str
    bandwidth: float
    latency: float
    description: str


#: The modelled systems. Every device's outgoing transfers share one lane (mode ``contention``
#: with one device per "node", as ``diffpipe.compare``'s default machine): inside an NVSwitch node
#: a GPU's NVLink bandwidth is shared by all its destinations; across nodes each pipeline stage
#: sits on its own node behind one NIC.
#: Figures from ``diffpipe.presets.NETWORKS`` (vendors' datasheets).
SYSTEMS = {
    "nvlink": System("nvlink", 450e9, 3e-6, "one node, NVLink4/NVSwitch: 450 GB/s per GPU and direction, 3 µs"),
    "infiniband": System("infiniband", 50e9, 5e-6, "one stage per node, InfiniBand NDR: 50 GB/s per NIC, 5 µs"),
    "ethernet": System("ethernet", 12.5e9, 10e-6, "one stage per node, 100 GbE: 12.5 GB/s per NIC, 10 µs"),
}
#: The bandwidth sweep (bytes/s per device egress, 10 µs latency): 0.5 GB/s to NVLink's 450 GB/s.
SWEEP = tuple(float(x) for x in np.geomspace(0.5e9, 450e9, 13))
SWEEP_FAST = tuple(float(x) for x in np.geomspace(0.5e9, 450e9, 5))
SWEEP_LATENCY = 10e-6


def machine(system: System, *, uniform_stages: bool = True) -> Machine:
    """The modelled machine: ``MODEL`` on ``DEVICE``s over ``system``, link contention.

    ``uniform_stages`` (the closed forms' assumption, used throughout) spreads the model's cost
    evenly over the stages; without it the layers are split evenly and the LM head (about one
    transformer block of FLOPs) weighs on the last stage.
    """
    lat, bw = jnp.asarray(system.latency), jnp.asarray(system.bandwidth)
    network = dp.Network(lat, bw, lat, bw)
    return Machine(dp.Transformer(**MODEL), dp.presets.device(DEVICE, efficiency=EFFICIENCY), network,
                   name=f"{system.name}: {system.description}", uniform_stages=uniform_stages,
                   communication="contention", devices_per_node=1)  # every GPU's egress one lane


def families_at(devices: int, microbatches: int, *, sync: bool = True) -> dict[str, tuple[str, dict]]:
    """The schedules to compare: Hanayo only at its operating point N = D (the restricted regime)."""
    return {label: (family, {k: sync if k == "sync" else v for k, v in options.items()})
            for label, (family, options) in SCHEDULES.items() if family != "hanayo" or microbatches == devices}


def grid(systems=SYSTEMS, sizes=((8, 8), (8, 16), (8, 32), (4, 4), (4, 8), (4, 16)), *,
         uniform_stages: bool = True, sync: bool = True) -> dict[tuple[str, int, int], Comparison]:
    """``compare`` at every system and ``(devices, microbatches)``."""
    out = {}
    for name, system in systems.items():
        for devices, microbatches in sizes:
            out[(name, devices, microbatches)] = dp.compare(
                families_at(devices, microbatches, sync=sync), machine(system, uniform_stages=uniform_stages),
                devices=devices, microbatches=microbatches)
    return out


def bandwidth_sweep(devices: int, microbatches: int, bandwidths=SWEEP) -> dict[str, list[float]]:
    """Simulated makespan (s) of every family at each per-device egress bandwidth."""
    out: dict[str, list[float]] = {}
    for family, (name, options) in families_at(devices, microbatches).items():
        schedule = get(name, devices=devices, microbatches=microbatches, **options)
        out[family] = [
            float(dp.simulate(schedule, machine(System("sweep", bw, SWEEP_LATENCY, ""))(schedule),
                              communication="contention", devices_per_node=1).makespan)
            for bw in bandwidths
        ]
    return out


def _sim(c: Comparison, name: str) -> float:
    return c.entry(name).simulation["makespan_s"]


def _best_flush(c: Comparison) -> float:
    return min(_sim(c, "gpipe"), _sim(c, "1f1b"))


# -- the claims ---------------------------------------------------------------------------------------
def claim_gpipe_1f1b(results: dict) -> dict:
    """GPipe and 1F1B runtime-equivalent; 1F1B with the lower activation peak."""
    rows = []
    for (system, d, n), c in sorted(results.items()):
        g, o = c.entry("gpipe"), c.entry("1f1b")
        rows.append(dict(
            system=system, devices=d, microbatches=n,
            formula_equal=g.formula["makespan"] == o.formula["makespan"],
            table_equal=g.table["makespan"] == o.table["makespan"],
            sim_ratio=o.simulation["makespan_s"] / g.simulation["makespan_s"],
            activation_ratio=o.simulation["peak_activation_bytes"] / g.simulation["peak_activation_bytes"],
        ))
    fast = [r for r in rows if r["system"] == "nvlink"]
    slow = [r for r in rows if r["system"] != "nvlink"]
    return dict(
        rows=rows,
        equal_formula_and_table=all(r["formula_equal"] and r["table_equal"] for r in rows),
        nvlink_max_deviation=max(abs(r["sim_ratio"] - 1) for r in fast),
        slow_max_ratio=max((r["sim_ratio"] for r in slow), default=1.0),
        # 1F1B stores min(D, N) activations per stage where GPipe stores N.
        memory_lower_when_n_above_d=all(r["activation_ratio"] < 1 for r in rows if r["microbatches"] > r["devices"]),
        memory_equal_when_n_is_d=all(abs(r["activation_ratio"] - 1) < 1e-6 for r in rows
                                     if r["microbatches"] == r["devices"]),
        activation_ratio_expected=all(abs(r["activation_ratio"] - min(r["devices"], r["microbatches"])
                                          / r["microbatches"]) < 1e-6 for r in rows),
    )


def claim_chimera(results: dict, table_microbatches=(1, 2, 3, 4, 6, 8)) -> dict:
    """Chimera ahead mainly at low microbatch counts and with favourable communication.

    ``speedup`` = best of GPipe and 1F1B over Chimera, minus 1 (positive: Chimera ahead).
    Table-level speedups for ``N = k D`` (``table_microbatches`` gives k) locate the crossover
    without communication.
    """
    speedup = {key: _best_flush(c) / _sim(c, "chimera") - 1 for key, c in results.items()}
    systems = sorted({s for s, _, _ in speedup}, key=list(SYSTEMS).index)
    depths = sorted({d for _, d, _ in speedup})
    decreasing, favourable = True, True
    for d in depths:
        ns = sorted({n for _, dd, n in speedup if dd == d})
        series = [speedup[("nvlink", d, n)] for n in ns]
        decreasing &= all(a > b for a, b in zip(series, series[1:]))
        for n in ns:
            across = [speedup[(s, d, n)] for s in systems]
            favourable &= all(a > b for a, b in zip(across, across[1:]))  # faster link, larger lead
    table_speedup = {}
    for d in depths:
        for k in table_microbatches:
            n = k * d
            base = table(get("1f1b", devices=d, microbatches=n)).makespan
            table_speedup[(d, n)] = base / table(get("chimera", devices=d, microbatches=n)).makespan - 1
    return dict(
        speedup={f"{s}/D={d}/N={n}": v for (s, d, n), v in sorted(speedup.items())},
        table_speedup={f"D={d}/N={n}": v for (d, n), v in sorted(table_speedup.items())},
        decreasing_in_microbatches_on_nvlink=decreasing,
        larger_on_faster_links=favourable,
        ahead_at_n_equal_d_on_nvlink=all(v > 0 for (s, d, n), v in speedup.items() if n == d and s == "nvlink"),
        behind_on_ethernet=all(v < 0 for (s, _, _), v in speedup.items() if s == "ethernet"),
        best_lead=max(speedup.values()),
        table_behind_from={d: min((n for (dd, n), v in table_speedup.items() if dd == d and v < 0), default=None)
                           for d in depths},
    )


def claim_hanayo(results: dict, sweep: dict[str, list[float]], bandwidths=SWEEP) -> dict:
    """Hanayo good at its operating point, sensitive to network bottlenecks."""
    at_point = {key: {f: _sim(c, f) for f in ("gpipe", "1f1b", "chimera", "hanayo")}
                for key, c in results.items() if key[1] == key[2]}
    beats_flush_fast = all(v["hanayo"] < min(v["gpipe"], v["1f1b"]) for (s, _, _), v in at_point.items()
                           if s == "nvlink")
    slowdown = {f: ms[0] / ms[-1] for f, ms in sweep.items()}  # slowest link over fastest
    behind = [bw for bw, h, g, o in zip(bandwidths, sweep["hanayo"], sweep["gpipe"], sweep["1f1b"])
              if h > min(g, o)]
    return dict(
        at_operating_point={f"{s}/D={d}": v for (s, d, _), v in sorted(at_point.items())},
        beats_gpipe_and_1f1b_on_nvlink=beats_flush_fast,
        slowdown=slowdown,
        # Among the single-replica schedules; Chimera's replicas add a gradient all-reduce.
        more_sensitive_than_gpipe_and_1f1b=slowdown["hanayo"] > max(slowdown["gpipe"], slowdown["1f1b"]),
        behind_flush_below_bandwidth=max(behind) if behind else None,
        ahead_of_flush_at_fastest=sweep["hanayo"][-1] < min(sweep["gpipe"][-1], sweep["1f1b"][-1]),
    )


def claim_asymmetric(results: dict, shallow: int = 4) -> dict:
    """The asymmetric Chimera placement does not lower the global peak; limited gains when shallow."""
    rows = []
    for (system, d, n), c in sorted(results.items()):
        a, o, m = c.entry("chimera-asymmetric"), c.entry("1f1b"), c.entry("chimera")
        rows.append(dict(
            system=system, devices=d, microbatches=n,
            peak_vs_1f1b=a.simulation["peak_activation_bytes"] / o.simulation["peak_activation_bytes"],
            peak_vs_chimera=a.simulation["peak_activation_bytes"] / m.simulation["peak_activation_bytes"],
            table_peak=a.table["peak_activations"], table_peak_1f1b=o.table["peak_activations"],
            gain_vs_1f1b=o.simulation["makespan_s"] / a.simulation["makespan_s"] - 1,
            gain_vs_chimera=m.simulation["makespan_s"] / a.simulation["makespan_s"] - 1,
        ))
    shallow_rows = [r for r in rows if r["devices"] == shallow and r["microbatches"] > r["devices"]]
    return dict(
        rows=rows,
        peak_not_lower=all(r["peak_vs_1f1b"] >= 1 - 1e-6 and r["peak_vs_chimera"] >= 1 - 1e-6 for r in rows),
        shallow_max_gain_vs_1f1b=max(r["gain_vs_1f1b"] for r in shallow_rows),
        shallow_gain_limited=all(r["gain_vs_1f1b"] < 0.10 for r in shallow_rows),
        gain_at_n_equal_d=max(r["gain_vs_1f1b"] for r in rows if r["microbatches"] == r["devices"]),
    )


def claim_not_invariant(results: dict, sweep: dict[str, list[float]] | None = None, bandwidths=SWEEP,
                        sweep_devices: int = 8, table_microbatches=(1, 2, 4, 8)) -> dict:
    """Rankings are not abstraction-invariant: some pair flips between levels.

    Flips are collected from every comparison of ``results``, from each point of the bandwidth
    ``sweep`` (at ``D = N = sweep_devices``) against the table order at the same sizes, and from
    the formula and table levels alone at ``N = k D`` for each depth (``table_microbatches`` gives
    k; no simulation needed).
    """
    from itertools import combinations

    from diffpipe import formula_level, kendall_tau, table_level
    from diffpipe.schedules import DEFAULT_DURATIONS

    def order(a: float, b: float) -> int:
        return 0 if abs(a - b) <= 1e-4 * max(abs(a), abs(b)) else (-1 if a < b else 1)

    def flipped(x: dict, y: dict) -> list[list[str]]:
        return [[a, b] for a, b in combinations(x, 2) if order(x[a], x[b]) * order(y[a], y[b]) < 0]

    flips, taus = [], {}
    for (system, d, n), c in sorted(results.items()):
        for p in c.pairs:
            taus[f"{system}/D={d}/N={n}/{p.levels[0]}-{p.levels[1]}"] = p.kendall_tau
            for a, b in p.flips:
                flips.append(dict(where=f"{system}, D={d}, N={n}", levels=list(p.levels), pair=[a, b]))
    if sweep is not None:
        d = n = sweep_devices
        table_order = {f: table_level(get(f, devices=d, microbatches=n), DEFAULT_DURATIONS)["makespan"]
                       for f in sweep}
        for i, bw in enumerate(bandwidths):
            sim = {f: ms[i] for f, ms in sweep.items()}
            taus[f"sweep/{bw / 1e9:.3g}GB/s/table-simulation"] = kendall_tau(list(table_order.values()),
                                                                               list(sim.values()))
            flips += [dict(where=f"sweep {bw / 1e9:.3g} GB/s, D=N={d}", levels=["table", "simulation"], pair=p)
                      for p in flipped(table_order, sim)]
    for d in sorted({d for _, d, _ in results}):
        for k in table_microbatches:
            schedules = {f: get(f, devices=d, microbatches=k * d) for f in ("gpipe", "1f1b", "chimera")}
            formula = {f: formula_level(s, DEFAULT_DURATIONS)[0]["bubble_ratio"] for f, s in schedules.items()}
            tab = {f: table_level(s, DEFAULT_DURATIONS)["makespan"] for f, s in schedules.items()}
            flips += [dict(where=f"D={d}, N={k * d} (no simulation)", levels=["formula", "table"], pair=p)
                      for p in flipped(formula, tab)]
    kinds = {tuple(f["levels"]) for f in flips}
    return dict(
        flips=flips, kendall_tau=taus,
        formula_table_flip=("formula", "table") in kinds,
        table_simulation_flip=("table", "simulation") in kinds,
        min_tau=min((t for t in taus.values() if t is not None), default=None),
    )


# -- writing ------------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def _order(c: Comparison, level: str) -> str:
    """``a < b = c``: best first, ties joined by ``=``."""
    groups: dict[int, list[str]] = {}
    for name in c.ranking(level):
        groups.setdefault(c.rank(name, level), []).append(name)
    return " < ".join(" = ".join(g) for _, g in sorted(groups.items()))


def overview(results: dict) -> str:
    """Simulated makespan (ms) and rank of every schedule in every configuration."""
    header = ["system", "D", "N", *[f"{f} (ms)" for f in FAMILIES], "table order", "simulation order"]
    rows = []
    for (system, d, n), c in sorted(results.items(), key=lambda kv: (list(SYSTEMS).index(kv[0][0]), -kv[0][1],
                                                                      kv[0][2])):
        cells = []
        for f in FAMILIES:
            if f in c.names:
                cells.append(f"{_sim(c, f) * 1e3:.1f} ({c.rank(f, 'simulation')})")
            else:
                cells.append("—")
        rows.append([system, str(d), str(n), *cells, _order(c, "table"), _order(c, "simulation")])
    return _md_table(header, rows)


def sweep_markdown(sweep: dict[str, list[float]], bandwidths) -> str:
    header = ["bandwidth (GB/s)", *[f"{f} (ms)" for f in sweep]]
    rows = [[f"{bw / 1e9:.3g}", *[f"{sweep[f][i] * 1e3:.1f}" for f in sweep]] for i, bw in enumerate(bandwidths)]
    return _md_table(header, rows)


def plot_sweep(sweep: dict[str, list[float]], bandwidths, devices: int, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax, ax2 = fig.subplots(1, 2)
    gb = np.asarray(bandwidths) / 1e9
    for f, ms in sweep.items():
        ms = np.asarray(ms)
        ax.plot(gb, ms * 1e3, marker="o", markersize=3, label=f)
        ax2.plot(gb, ms / ms[-1], marker="o", markersize=3, label=f)
    for a in (ax, ax2):
        a.set_xscale("log")
        a.set_xlabel("per-device egress bandwidth (GB/s)")
        a.grid(alpha=0.3, which="both", linewidth=0.4)
        for s in SYSTEMS.values():
            a.axvline(s.bandwidth / 1e9, color="grey", linestyle=":", linewidth=0.8)
            a.text(s.bandwidth / 1e9, 0.03, f" {s.name}", transform=a.get_xaxis_transform(), fontsize=7,
                   va="bottom", ha="right", rotation=90, color="grey")
    ax.set_yscale("log")
    ax.set_ylabel("simulated step time (ms)")
    ax.set_title(f"Step time, D = N = {devices}, GPT-3 6.7B on H100", fontsize=10)
    ax2.set_yscale("log")
    ax2.set_ylabel("slowdown vs. 450 GB/s")
    ax2.set_title("Sensitivity to the network", fontsize=10)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=130)


def plot_chimera(results: dict, chimera: dict, path: Path, hidden: dict | None = None) -> None:
    """Chimera's lead against N: simulated per system (solid: replicas' all-reduce at the end of the
    step; dashed, from ``hidden``: without it), the table and the formula."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    depths = sorted({d for _, d, _ in results})
    fig = Figure(figsize=(5.2 * len(depths), 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(depths), squeeze=False)[0]
    for ax, d in zip(axes, depths):
        for i, system in enumerate(SYSTEMS):
            ns = sorted(n for s, dd, n in results if s == system and dd == d)
            if ns:
                ax.plot(ns, [100 * chimera["speedup"][f"{system}/D={d}/N={n}"] for n in ns], marker="o",
                        color=f"C{i}", label=f"simulation, {system}")
            if ns and hidden is not None:
                ax.plot(ns, [100 * hidden["speedup"][f"{system}/D={d}/N={n}"] for n in ns], marker=".",
                        color=f"C{i}", linestyle="--", alpha=0.6, label=f"{system}, all-reduce hidden")
        table_ns = sorted(int(k.split("N=")[1]) for k in chimera["table_speedup"] if k.startswith(f"D={d}/"))
        ax.plot(table_ns, [100 * chimera["table_speedup"][f"D={d}/N={n}"] for n in table_ns], color="black",
                linestyle="-.", marker="x", label="table (F=1, B=2)")
        formula = [100 * ((n + d - 1) / (n + d / 2 - 1) - 1) for n in table_ns]  # bubble ratios at t_F = t_B
        ax.plot(table_ns, formula, color="grey", linestyle=":", label="formula (t_F = t_B)")
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("microbatches N")
        ax.set_ylabel("Chimera's lead over the best of GPipe/1F1B (%)")
        ax.set_title(f"D = {d}", fontsize=10)
        ax.grid(alpha=0.3, linewidth=0.4)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    fig.savefig(path, dpi=130)


def verdicts(c1, c2, c3, c4, c5) -> list[tuple[str, str, str]]:
    """``(claim, status, one-line evidence)``; status is ``supported``, ``partly supported`` (true
    in part of the modelled space, the rest stated in the evidence) or ``not supported``."""

    def status(core: bool, everywhere: bool = True) -> str:
        return "not supported" if not core else "supported" if everywhere else "partly supported"

    flush = max(c3["slowdown"]["gpipe"], c3["slowdown"]["1f1b"])
    behind = c3["behind_flush_below_bandwidth"]
    return [
        ("GPipe and 1F1B are runtime-equivalent",
         status(c1["equal_formula_and_table"] and c1["nvlink_max_deviation"] < 0.01, c1["slow_max_ratio"] < 1.01),
         f"identical at the formula and table levels and within {100 * c1['nvlink_max_deviation']:.2f}% in "
         f"simulation on NVLink, but 1F1B up to {_pct(c1['slow_max_ratio'] - 1)} slower on slow links"),
        ("1F1B has the lower peak activation memory",
         status(c1["memory_lower_when_n_above_d"] and c1["activation_ratio_expected"], False),
         "1F1B's activation peak is min(D, N)/N of GPipe's: lower for N > D, equal at N = D"),
        ("Chimera is ahead mainly at low microbatch counts and with favourable communication",
         status(c2["decreasing_in_microbatches_on_nvlink"] and c2["larger_on_faster_links"]
                and c2["ahead_at_n_equal_d_on_nvlink"]),
         f"ahead of the best of GPipe/1F1B by up to {_pct(c2['best_lead'])} on NVLink at N = D, a lead that "
         "falls with N and with the link's bandwidth"
         + (" (behind everywhere on Ethernet, where the replicas' gradient all-reduce dominates)"
            if c2["behind_on_ethernet"] else "")
         + "; without communication behind from N = "
         + ", ".join(f"{n} (D = {d})" for d, n in c2["table_behind_from"].items())),
        ("Hanayo is good at its operating point but sensitive to network bottlenecks",
         status(c3["beats_gpipe_and_1f1b_on_nvlink"] and c3["more_sensitive_than_gpipe_and_1f1b"]
                and behind is not None),
         f"faster than GPipe/1F1B at N = D on NVLink; {c3['slowdown']['hanayo']:.2f}x slower at 0.5 than at "
         f"450 GB/s (GPipe/1F1B at most {flush:.2f}x); behind GPipe/1F1B at or below "
         f"{(behind or 0) / 1e9:.3g} GB/s"),
        ("Asymmetric Chimera does not lower the global peak memory and gains little in shallow pipelines",
         status(c4["peak_not_lower"] and c4["shallow_gain_limited"], c4["gain_at_n_equal_d"] < 0.10),
         f"global activation peak equal to 1F1B's and Chimera's everywhere; at D = 4 and N > D at most "
         f"{_pct(c4['shallow_max_gain_vs_1f1b'])} faster than 1F1B, but up to {_pct(c4['gain_at_n_equal_d'])} "
         "at N = D"),
        ("Rankings are not abstraction-invariant",
         status(c5["formula_table_flip"] and c5["table_simulation_flip"]),
         f"{len(c5['flips'])} flipped pairs across the configurations; smallest Kendall tau {c5['min_tau']:+.2f}"),
    ]


def run(out: Path = HERE, *, fast: bool = False) -> dict:
    sizes = ((4, 4), (4, 8)) if fast else ((8, 8), (8, 16), (8, 32), (4, 4), (4, 8), (4, 16))
    sweep_devices = 4 if fast else 8
    bandwidths = SWEEP_FAST if fast else SWEEP
    results = grid(SYSTEMS, sizes)
    sweep = bandwidth_sweep(sweep_devices, sweep_devices, bandwidths)
    c1 = claim_gpipe_1f1b(results)
    c2 = claim_chimera(results)
    c3 = claim_hanayo(results, sweep, bandwidths)
    c4 = claim_asymmetric(results)
    c5 = claim_not_invariant(results, sweep, bandwidths, sweep_devices)
    layer_split = grid({"nvlink": SYSTEMS["nvlink"]}, sizes[:1] + sizes[2:3] if not fast else sizes,
                       uniform_stages=False)
    # The replicas' all-reduce sits at the end of the step, on the compute stream: an upper bound
    # on its cost. Without it (a perfectly overlapped all-reduce) is the lower bound.
    no_sync = grid(SYSTEMS, sizes, sync=False)
    c2_free, c4_free = claim_chimera(no_sync), claim_asymmetric(no_sync)
    found = verdicts(c1, c2, c3, c4, c5)

    out.mkdir(parents=True, exist_ok=True)
    md = ["# Tabular Schedule Abstraction: results in diffpipe's model", "",
          f"Generated by `reproduce.py{' --fast' if fast else ''}`. Model: GPT-3 6.7B-style "
          f"({MODEL['layers']} layers, hidden {MODEL['hidden']}, {MODEL['heads']} heads, sequence "
          f"{MODEL['sequence']}, vocabulary {MODEL['vocabulary']}, microbatch 1, fp16) on {DEVICE} "
          "(989 dense TFLOP/s at 50%), uniform stage costs, link contention.", "",
          "## Verdicts", ""]
    md += [f"- **{status}**: {claim} — {why}." for claim, status, why in found]
    md += ["", "## Simulated step time (rank) and the order at the table and simulation levels", "",
           overview(results), "",
           "## 1. GPipe vs 1F1B", "",
           _md_table(["system", "D", "N", "1F1B / GPipe time", "1F1B / GPipe activation peak"],
                     [[r["system"], str(r["devices"]), str(r["microbatches"]), f"{r['sim_ratio']:.4f}",
                       f"{r['activation_ratio']:.3f}"] for r in c1["rows"]]), "",
           "## 2. Chimera's lead over the best of GPipe and 1F1B", "",
           "With the replicas' gradient all-reduce at the end of the step (upper bound on its cost) and "
           "without it (a perfectly overlapped all-reduce, lower bound):", "",
           _md_table(["configuration", "lead, all-reduce at the end", "lead, all-reduce hidden"],
                     [[k, _pct(v), _pct(c2_free["speedup"][k])] for k, v in c2["speedup"].items()]), "",
           "Without the all-reduce: lead decreasing in N on NVLink: "
           f"{c2_free['decreasing_in_microbatches_on_nvlink']}; "
           f"larger on faster links: {c2_free['larger_on_faster_links']}; ahead at N = D on NVLink: "
           f"{c2_free['ahead_at_n_equal_d_on_nvlink']}.", "",
           _md_table(["configuration", "lead (table, F=1, B=2)"],
                     [[k, _pct(v)] for k, v in c2["table_speedup"].items()]), "",
           f"## 3. Hanayo (N = D) over the bandwidth sweep (D = {sweep_devices})", "",
           sweep_markdown(sweep, bandwidths), "",
           "Slowdown from 450 to 0.5 GB/s: " + ", ".join(f"{f} {v:.2f}x" for f, v in c3["slowdown"].items()) + ".", "",
           "## 4. Asymmetric Chimera", "",
           _md_table(["system", "D", "N", "peak / 1F1B's", "peak / Chimera's", "gain vs 1F1B", "gain vs Chimera",
                      "gain vs 1F1B, all-reduce hidden"],
                     [[r["system"], str(r["devices"]), str(r["microbatches"]), f"{r['peak_vs_1f1b']:.3f}",
                       f"{r['peak_vs_chimera']:.3f}", _pct(r["gain_vs_1f1b"]), _pct(r["gain_vs_chimera"]),
                       _pct(f["gain_vs_1f1b"])] for r, f in zip(c4["rows"], c4_free["rows"])]), "",
           f"All-reduce hidden: global peak not lowered: {c4_free['peak_not_lower']}; gain over 1F1B at D = 4, "
           f"N > D at most {_pct(c4_free['shallow_max_gain_vs_1f1b'])}.", "",
           "## 5. Rank flips between levels", "",
           _md_table(["where", "levels", "pair"],
                     [[f["where"], " vs ".join(f["levels"]), " / ".join(f["pair"])] for f in c5["flips"]]), "",
           "## Extra: the even layer split (LM head on the last stage), NVLink", "",
           overview(layer_split), ""]
    (out / "results.md").write_text("\n".join(md))
    comparisons = ["# Every three-level comparison", ""]
    for (system, d, n), c in sorted(results.items()):
        comparisons += [f"## {system}, D = {d}, N = {n}", "", c.to_markdown()]
    (out / "comparisons.md").write_text("\n".join(comparisons))
    (out / "bandwidth_sweep.md").write_text(
        f"# Simulated step time over the bandwidth sweep (D = N = {sweep_devices}, latency 10 µs)\n\n"
        + sweep_markdown(sweep, bandwidths))
    plot_sweep(sweep, bandwidths, sweep_devices, out / "bandwidth_sweep.png")
    plot_chimera(results, c2, out / "chimera_microbatches.png", hidden=c2_free)
    from diffpipe.viz import gantt

    s = get("hanayo", devices=4, microbatches=4)
    gantt(s, machine(SYSTEMS["ethernet"])(s), path=out / "gantt_hanayo_ethernet.png", dpi=110,
          communication="contention", devices_per_node=1)
    summary = dict(
        fast=fast, verdicts=[dict(claim=c, status=st, evidence=e) for c, st, e in found],
        gpipe_1f1b={k: v for k, v in c1.items() if k != "rows"}, chimera=c2, chimera_allreduce_hidden=c2_free,
        hanayo=c3, asymmetric={k: v for k, v in c4.items() if k != "rows"},
        asymmetric_allreduce_hidden={k: v for k, v in c4_free.items() if k != "rows"},
        not_invariant={k: v for k, v in c5.items() if k != "kendall_tau"},
    )
    (out / "results.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="D = 4 only and a coarse sweep (about a minute)")
    parser.add_argument("--out", type=Path, default=HERE, help="output folder (default: next to this script)")
    args = parser.parse_args()
    summary = run(args.out, fast=args.fast)
    for v in summary["verdicts"]:
        print(f"{v['status']:>16}  {v['claim']}: {v['evidence']}")


if __name__ == "__main__":
    main()
