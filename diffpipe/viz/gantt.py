"""Gantt charts of a simulated step (matplotlib, Agg backend, imported on first use).

One row per device (a box per op, coloured by kind, labelled with its microbatch; a prime marks
the second pipeline of Chimera-like schedules and the box is hatched), one row per link lane
when the hardware times transfers (boxes for transfers, sub-lanes where they overlap); with
``gradient_sync=True``, a sync row per device beneath the device rows (``d0 sync``: the all-reduce
``R`` of each stage it holds) and the optimizer steps ``U`` at the end of each device's row, both
labelled ``s<stage>``; with ``collectives`` (a configuration's, ``op_collectives``), a ``comm`` row
right under each device with the collectives left exposed inside each op (tensor-parallel, expert,
ZeRO-3 gathers, the context ring: one block per op, ending with it); arrows from each producer to
its consumer on another device, and beneath, each device's memory over time (bytes of stored
activations plus static memory, or a count of stored activations when the hardware has no
activation sizes), and a configuration's breakdown bar.

A long step (more than ``LONG_OPS`` ops on a device: hundreds of microbatches) would be a solid
wall at any width, so it is drawn as three zoomed windows side by side, chosen from the schedule
(``windows``: the warm-up, a slice of steady state, the drain, each titled with its time range, all
at one time scale), above the whole step's memory (the windows shaded) and breakdown bar.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ConfigError
from .._plan._configuration import ConfigResult, Configuration
from ._timeline import Timeline, check_paths, configuration_step, op_collectives, timeline, write_atomic

#: One colour per op kind (colour-blind-safe Okabe-Ito palette) and for transfers.
COLORS = {
    "F": "#0072B2",  # blue
    "B": "#009E73",  # green
    "I": "#56B4E9",  # sky blue
    "W": "#E69F00",  # orange
    "U": "#CC79A7",  # purple
    "R": "#D55E00",  # vermillion
    "activation": "#999999",  # grey
    "gradient": "#555555",  # dark grey
}
_NAMES = {"F": "forward F", "B": "backward B", "I": "input grad I", "W": "weight grad W", "U": "update U",
          "R": "all-reduce R", "activation": "activation transfer", "gradient": "gradient transfer"}
#: Legend entries of the gradient sync (``gradient_sync=True``): the same colours as R and U ops.
_SYNC_NAMES = {"R": "gradient all-reduce R (sync row)", "U": "optimizer step U"}


#: Resolution of PNG output (dots per inch).
DEFAULT_DPI = 150


def _time_unit(span: float) -> tuple[float, str]:
    if span >= 1.0:
        return 1.0, "s"
    if span >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def _label(op: Any, schedule: Any) -> str:
    """Microbatch, ``.c`` for a device's chunk c > 0 (as ``schedules.Table.label``), ``'`` per pipeline."""
    text = f"{op.microbatch}"
    if op.kind in ("F", "B", "I", "W"):
        chunk = schedule.placement.chunk(op.pipeline, op.stage)
        if chunk:
            text += f".{chunk}"
    return text + "'" * op.pipeline


#: Colours of the breakdown bar's segments (``ConfigResult.breakdown`` keys; "other" is the rest of the step).
_BREAKDOWN_COLORS = {
    "compute_gemm": "#1f77b4", "compute_attention": "#9467bd", "compute_memory": "#17becf",
    "compute_launch": "#7f7f7f", "compute_host": "#393b79", "compute_roofline": "#1f77b4", "exposed_tensor": "#d62728",
    "exposed_expert": "#ff7f0e", "exposed_gather": "#e377c2", "exposed_context": "#2ca02c",
    "exposed_reduce": "#c49c94", "bubble": "#dddddd",
    "jitter": "#bcbd22",
    "other": "#8c564b",
}


def breakdown_parts(breakdown: dict[str, float], step: float) -> dict[str, float]:
    """``breakdown``'s positive parts (seconds per pipeline rank), the remainder of ``step`` as
    "other" (optimizer, gradient-sync tail, pipeline transfers), then any jitter (beyond the step)."""
    parts = {k: float(v) for k, v in breakdown.items() if float(v) > 0 and k != "jitter"}
    rest = step - sum(parts.values())
    if rest > 1e-9 * step:
        parts["other"] = rest
    if float(breakdown.get("jitter", 0.0)) > 0:
        parts["jitter"] = float(breakdown["jitter"])  # beyond the deterministic step
    return parts


def _breakdown_bar(ax: Any, breakdown: dict[str, float], step: float, scale: float, unit: str) -> None:
    """One horizontal bar of the step split into its parts (``breakdown_parts``)."""
    left = 0.0
    for name, seconds in breakdown_parts(breakdown, step).items():
        ax.barh(0, seconds * scale, left=left, color=_BREAKDOWN_COLORS.get(name, "#444444"), edgecolor="white",
                height=0.6, label=f"{name.replace('_', ' ')} {seconds * scale:.3g} {unit}")
        left += seconds * scale
    ax.set_xlim(0, max(ax.get_xlim()[1], left * 1.01))  # the expected step with jitter runs past the step
    ax.set_yticks([0], ["step"], fontsize=8)
    ax.set_ylim(-0.6, 0.6)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.3), fontsize=6, frameon=False, ncol=2)
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)


#: Colours and legend names of the collectives inside ops (``Timeline.collectives``), as the
#: breakdown bar's ``exposed_<kind>`` segments.
_COLLECTIVE_NAMES = {"tensor": "tensor-parallel collectives", "expert": "expert all-to-all",
                     "gather": "ZeRO-3 all-gather", "context": "context-parallel K,V ring",
                     "reduce": "gradient reduction per microbatch"}

#: A schedule whose busiest device runs more than ``LONG_OPS`` ops is drawn as zoomed windows
#: (``zoom=None``); each window spans about ``WINDOW_OPS`` of its ops.
LONG_OPS = 96
WINDOW_OPS = 20


@dataclass(frozen=True)
class Window:
    """A zoomed time range of a long step: ``name`` (``warm-up``, ``steady state``, ``drain``),
    ``start``/``finish`` in seconds."""

    name: str
    start: float
    finish: float


def windows(tl: Timeline, *, force: bool = False) -> tuple[Window, ...]:
    """The zoomed windows of ``tl``: none when its busiest device runs at most ``LONG_OPS`` ops
    (unless ``force``), else three of one width, ``WINDOW_OPS`` mean op durations (at most a third
    of the step):

    - warm-up, from 0: the pipeline fills until every device has begun its first backward;
    - drain, ending with the step: it begins when the first device has run its last forward;
    - steady state, centred between the two (between the end of warm-up and the start of drain),
      kept clear of both windows.
    """
    s = tl.schedule
    compute = [i for i, op in enumerate(tl.ops) if op.kind in ("F", "B", "I", "W")]
    per_device = np.zeros(s.devices, int)
    for i in compute:
        for d in s.devices_of(tl.ops[i]):
            per_device[d] += 1
    if not compute or (not force and per_device.max() <= LONG_OPS):
        return ()
    end = tl.makespan
    mean = float(np.mean(tl.finish[compute] - tl.start[compute]))
    first_backward = np.full(s.devices, np.inf)
    last_forward = np.zeros(s.devices)
    for i in compute:
        op = tl.ops[i]
        for d in s.devices_of(op):
            if op.kind == "F":
                last_forward[d] = max(last_forward[d], tl.finish[i])
            else:
                first_backward[d] = min(first_backward[d], tl.start[i])
    warm = float(np.max(np.where(np.isfinite(first_backward), first_backward, 0.0)))
    drain = float(np.min(last_forward))
    width = min(WINDOW_OPS * mean, end / 3)
    centre = (warm + drain) / 2 if warm < drain else end / 2
    middle = min(max(centre - width / 2, width), end - 2 * width)
    return (Window("warm-up", 0.0, width), Window("steady state", middle, middle + width),
            Window("drain", end - width, end))


def _rows(tl: Timeline) -> tuple[list[str], dict[int, int], dict[int, int], dict[int, int], dict[str, int]]:
    """Row labels and the row of each device, each device's collectives row (right under it),
    sync row and link lane."""
    s = tl.schedule
    rows: list[str] = []
    device_row, comm_row = {}, {}
    for d in range(s.devices):
        device_row[d] = len(rows)
        rows.append(f"d{d}")
        if tl.collectives:
            comm_row[d] = len(rows)
            rows.append(f"d{d} comm")
    sync_row = {}
    for d in tl.sync_devices:
        sync_row[d] = len(rows)
        rows.append(f"d{d} sync")
    lane_row = {}
    for lane in tl.lanes:
        lane_row[lane] = len(rows)
        rows.append(lane)
    return rows, device_row, comm_row, sync_row, lane_row


def _boxes(ax: Any, tl: Timeline, scale: float, span: tuple[float, float], axis_points: float, fontsize: int,
           arrows: bool) -> set[str]:
    """Draw every box (and arrow) of ``tl`` that overlaps ``span`` (seconds) on ``ax``; returns the
    kinds drawn, for the legend."""
    from matplotlib.patches import Rectangle

    s = tl.schedule
    lo, hi = span
    rows, device_row, comm_row, sync_row, lane_row = _rows(tl)
    char = (hi - lo) * scale * fontsize * 0.62 / axis_points  # text fits when the box is wider (0.6 em a char)
    thinnest = (hi - lo) * scale * 0.8 / axis_points  # a box narrower than 0.8 pt is drawn 0.8 pt wide, unedged
    seen: set[str] = set()

    def box(t0: float, t1: float, row: int, color: str, text: str | None, height: float = 0.8,
            hatch: str | None = None, size: float = fontsize, bold: bool = True) -> None:
        if t1 < lo or t0 > hi:
            return
        x0, x1 = t0 * scale, t1 * scale
        wide = x1 - x0 > 3 * thinnest  # a white edge would hide a thin box
        ax.add_patch(Rectangle((x0, row - height / 2), max(x1 - x0, thinnest), height, facecolor=color,
                               edgecolor="white" if wide else "none", linewidth=0.4 if wide else 0.0,
                               hatch=hatch))
        inside = t0 >= lo - 1e-9 * hi and t1 <= hi * (1 + 1e-9)  # a box cut by a window's edge goes unlabelled
        if text and inside and (t1 - t0) * scale > char * (len(text) + 0.6):
            ax.text((t0 + t1) / 2 * scale, row, text, ha="center", va="center", fontsize=size, color="white",
                    fontweight="bold" if bold else "normal")

    for i, op in enumerate(tl.ops):
        seen.add(op.kind)
        text = _label(op, s) if op.kind in ("F", "B", "I", "W") else op.kind
        for d in s.devices_of(op):
            box(tl.start[i], tl.finish[i], device_row[d], COLORS[op.kind], text,
                hatch="////" if op.pipeline else None)
    for kind, seconds in tl.collectives:
        color = _BREAKDOWN_COLORS[f"exposed_{kind}"]
        for i in np.flatnonzero(seconds > 0):
            seen.add(kind)
            for d in s.devices_of(tl.ops[i]):
                # one block per op, ending with it (the op's collectives run layer by layer inside it)
                box(tl.finish[i] - seconds[i], tl.finish[i], comm_row[d], color, None, height=0.6)
    for op in tl.syncs:
        seen.add(f"sync {op.kind}")
        for d in op.devices:
            box(op.start, op.finish, sync_row[d] if op.kind == "R" else device_row[d], COLORS[op.kind],
                f"s{op.stage}" + "'" * op.pipeline)
    index = {op: i for i, op in enumerate(tl.ops)} if arrows else {}
    for t in tl.transfers:
        if t.start is not None:
            seen.add(t.kind)
            if t.lane in lane_row:
                box(t.start, t.finish, lane_row[t.lane], COLORS[t.kind], _label(t.consumer, s), height=0.7,
                    size=fontsize - 1, bold=False)
        if arrows:
            a = t.start if t.start is not None else tl.finish[index[t.producer]]
            b = t.finish if t.finish is not None else tl.start[index[t.consumer]]
            if b < lo or a > hi:
                continue
            down = t.dst > t.src
            y0 = device_row[t.src] + (0.4 if down else -0.4)
            y1 = device_row[t.dst] - (0.4 if down else -0.4)
            ax.annotate("", xy=(b * scale, y1), xytext=(a * scale, y0),
                        arrowprops=dict(arrowstyle="-|>", color="#333333", lw=0.5, alpha=0.55,
                                        mutation_scale=6, shrinkA=0, shrinkB=0), annotation_clip=True)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    for boundary in sorted({min(sync_row.values(), default=None), min(lane_row.values(), default=None)} - {None}):
        ax.axhline(boundary - 0.5, color="black", linewidth=0.6)
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    return seen


def _legend(tl: Timeline, seen: set[str]) -> list[Any]:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=COLORS[k], label=_NAMES[k]) for k in COLORS if k in seen]
    handles += [Patch(facecolor=_BREAKDOWN_COLORS[f"exposed_{k}"], label=f"{name} (exposed, comm row)")
                for k, name in _COLLECTIVE_NAMES.items() if k in seen]
    handles += [Patch(facecolor=COLORS[k], label=_SYNC_NAMES[k]) for k in _SYNC_NAMES if f"sync {k}" in seen]
    if tl.schedule.pipelines > 1:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="////", label="pipeline ≥ 1 (')"))
    return handles


def _memory_panel(axm: Any, tl: Timeline, scale: float, span: float) -> None:
    s = tl.schedule
    gb = tl.memory_unit == "bytes"
    for d, (times, values) in enumerate(tl.memory):
        times = list(times * scale) + [span * scale]
        values = list(values / 1e9 if gb else values)
        axm.step(times, values + values[-1:], where="post", linewidth=1.0, label=f"d{d}",
                 linestyle="-" if d < (s.devices + 1) // 2 else "--")
    axm.set_ylabel("memory (GB)" if gb else "stored activations", fontsize=8)
    axm.grid(linewidth=0.3, alpha=0.5)
    axm.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False,
               ncol=1 if s.devices <= 8 else 2)


def _heading(tl: Timeline, title: str | None, span: float, scale: float, unit: str) -> str:
    s = tl.schedule
    return title or (f"{s.family}: {s.devices} devices, {s.stages} stages, {s.microbatches} microbatches, "
                     f"communication {tl.communication} — step {span * scale:.4g} {unit}")


def draw(tl: Timeline, *, title: str | None = None, memory: bool = True, arrows: bool = True,
         breakdown: dict[str, float] | None = None, zoom: bool | None = None):
    """A matplotlib ``Figure`` of ``tl`` (see the module docstring); ``breakdown``
    (``ConfigResult.breakdown``) adds a stacked bar of where the step goes. ``zoom``: draw the
    step as three zoomed windows (``windows``) over the whole step's memory and breakdown; None:
    when the schedule is long (more than ``LONG_OPS`` ops on a device)."""
    if zoom is not None and not isinstance(zoom, bool):
        raise ConfigError(f"zoom must be True, False or None, got {zoom!r}")
    chosen = windows(tl, force=bool(zoom)) if zoom is not False else ()
    if chosen:
        return _draw_zoomed(tl, chosen, title=title, memory=memory, arrows=arrows, breakdown=breakdown)
    # A bare Figure with the Agg canvas: no pyplot, so no global backend or figure state is touched.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    span = tl.makespan or 1.0
    scale, unit = _time_unit(span)
    rows = _rows(tl)[0]
    width = min(24.0, max(9.0, 6.0 + len(tl.ops) / 25))
    heights = [h for h in (0.42 * len(rows) + 1.2, 2.4 if memory else 0.0, 1.2 if breakdown else 0.0) if h]
    fig = Figure(figsize=(width, sum(heights)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(np.atleast_1d(fig.subplots(len(heights), 1, sharex=True, height_ratios=heights)))
    ax = axes.pop(0)
    axm = axes.pop(0) if memory else None
    axb = axes.pop(0) if breakdown else None
    seen = _boxes(ax, tl, scale, (0.0, span), width * 72 * 0.85, 7 if len(rows) <= 12 else 6, arrows)
    ax.set_xlim(0, span * scale * 1.01)
    ax.legend(handles=_legend(tl, seen), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    ax.set_title(_heading(tl, title, span, scale, unit), fontsize=10, loc="left")
    if axm is not None:
        _memory_panel(axm, tl, scale, span)
    if axb is not None:
        _breakdown_bar(axb, breakdown, span, scale, unit)
    (axb if axb is not None else axm if axm is not None else ax).set_xlabel(f"time ({unit})", fontsize=8)
    return fig


def _draw_zoomed(tl: Timeline, chosen: Sequence[Window], *, title: str | None, memory: bool, arrows: bool,
                 breakdown: dict[str, float] | None):
    """The windows side by side (one time scale, each titled with its range), and under them the
    whole step: memory (the windows shaded) and the breakdown bar."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    span = tl.makespan or 1.0
    scale, unit = _time_unit(span)
    wscale, wunit = _time_unit(chosen[0].finish - chosen[0].start)
    rows = _rows(tl)[0]
    width = 22.0
    heights = [h for h in (0.36 * len(rows) + 1.4, 2.2 if memory else 0.0, 1.1 if breakdown else 0.0) if h]
    fig = Figure(figsize=(width, sum(heights)), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(len(heights), len(chosen), height_ratios=heights)
    panels = []
    seen: set[str] = set()
    for k, w in enumerate(chosen):
        ax = fig.add_subplot(grid[0, k], sharey=panels[0] if panels else None)
        seen |= _boxes(ax, tl, wscale, (w.start, w.finish), width / len(chosen) * 72 * 0.8, 6, arrows)
        ax.set_xlim(w.start * wscale, w.finish * wscale)
        ax.set_title(f"{w.name}: {w.start * wscale:.4g}–{w.finish * wscale:.4g} {wunit}", fontsize=9)
        ax.set_xlabel(f"time ({wunit})", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        if k:
            ax.tick_params(axis="y", labelleft=False)
        panels.append(ax)
    fig.legend(handles=_legend(tl, seen), loc="outside right upper", fontsize=7, frameon=False)
    fig.suptitle(_heading(tl, title, span, scale, unit) + f" — zoomed: {len(chosen)} windows of "
                 f"{(chosen[0].finish - chosen[0].start) * wscale:.3g} {wunit}", fontsize=10, x=0.01, ha="left")
    row = 1
    last = panels[-1]
    if memory:
        axm = fig.add_subplot(grid[row, :])
        _memory_panel(axm, tl, scale, span)
        for w in chosen:
            axm.axvspan(w.start * scale, w.finish * scale, color="#f0c000", alpha=0.25, linewidth=0)
            axm.text((w.start + w.finish) / 2 * scale, 0.97, w.name, transform=axm.get_xaxis_transform(),
                     ha="center", va="top", fontsize=7, bbox=dict(facecolor="white", edgecolor="none", pad=1))
        axm.set_xlim(0, span * scale * 1.01)
        axm.set_title("memory over the whole step (the zoomed windows shaded)", fontsize=8, loc="left")
        last = axm
        row += 1
    if breakdown:
        axb = fig.add_subplot(grid[row, :], sharex=last if memory else None)
        _breakdown_bar(axb, breakdown, span, scale, unit)
        last = axb
    if last is not panels[-1]:
        last.set_xlabel(f"time ({unit})", fontsize=8)
    return fig


def gantt(
    result_or_schedule: Any,
    hw: Any = None,
    *,
    path: str | Path | list | tuple | None = None,
    schedule: Any = None,
    title: str | None = None,
    memory: bool = True,
    arrows: bool = True,
    dpi: int = DEFAULT_DPI,
    gradient_sync: bool = False,
    breakdown: dict[str, float] | None = None,
    collectives: Mapping[str, Any] | None = None,
    zoom: bool | None = None,
    evaluation: ConfigResult | None = None,
    communication: Any = None,
    devices_per_node: int | None = None,
):
    """Draw a Gantt chart of one simulated step.

    Args:
        result_or_schedule: a ``Schedule`` (simulated on ``hw``), a ``Result`` (pass its
            ``schedule=``) or a ``Configuration``: its step (``Configuration.evaluate()``) on its own
            schedule and hardware, with its gradient sync, its breakdown bar and its collectives per
            op (``op_collectives``); then give none of ``hw``, ``schedule``, ``gradient_sync``,
            ``breakdown``, ``collectives``, ``communication``, ``devices_per_node``.
        hw: the ``Hardware``; default for a schedule: unit times (F = 1 s, B = 2 s, free
            communication). Link lanes appear when it times transfers (``overlap``: a lane per
            directed link, ``contention``: the contended links and NICs).
        path: where to write: ``.png`` or ``.svg`` (or a list of such paths). Written to a
            temporary file and renamed, so an error leaves nothing behind. None: return the figure.
        title, memory, arrows: heading (default: family, sizes, step time), the memory panel,
            the producer-to-consumer arrows.
        dpi: resolution of PNG output.
        gradient_sync: simulate (or, for a ``Result``, expect: pass ``hw``) the step with the
            data-parallel gradient sync (``simulate``'s flag; what ``Configuration.evaluate``
            simulates) and draw its ``R`` on a sync row per device and its ``U`` on the device rows.
        breakdown: a ``ConfigResult.breakdown`` (``Configuration.evaluate()``): a stacked bar under
            the chart of where the step goes (kernel classes, exposed collectives, bubble, the rest).
        collectives: ``{kind: seconds per op}`` of the collectives inside the ops
            (``diffpipe.viz.op_collectives(configuration)``): a ``comm`` row under each device with
            one block per op, coloured by kind as the breakdown bar.
        zoom: draw three zoomed windows (warm-up, a slice of steady state, drain: ``windows``)
            over the whole step's memory and breakdown; None (default): when a device runs more
            than ``LONG_OPS`` ops, where one view of the whole step would be a solid wall.
        evaluation: with a ``Configuration``, its ``ConfigResult`` already evaluated (drawn as it is,
            a jitter's breakdown entry included); default: ``configuration.evaluate()``.
        communication: the mode the schedule is compiled under (the graph's; a name or an
            ``AbstractCommunication``, default ``overlap``; for a ``Result``, the one it was
            simulated under); a ``Configuration`` brings its own.
        devices_per_node: the devices sharing a node the schedule is compiled for (the graph's;
            default all on one node; for a ``Result``, the topology it was simulated under); a
            ``Configuration`` brings its own.

    Returns:
        The written ``Path``s (a list), or the matplotlib ``Figure`` when ``path`` is None.
    """
    paths = None if path is None else check_paths(path, (".png", ".svg"), "gantt")
    if isinstance(result_or_schedule, Configuration):
        cfg = result_or_schedule
        evaluation, schedule, hw = configuration_step(cfg, evaluation, "gantt", hw=hw, schedule=schedule,
                                                      gradient_sync=gradient_sync, breakdown=breakdown,
                                                      collectives=collectives, communication=communication,
                                                      devices_per_node=devices_per_node)
        result_or_schedule, gradient_sync, breakdown = evaluation.result, evaluation.gradient_sync, evaluation.breakdown
        communication, devices_per_node = cfg.communication, cfg.placement.stages_per_node
        collectives = op_collectives(cfg, schedule, hw)
    elif evaluation is not None:
        raise ConfigError("gantt: evaluation= goes with a Configuration (its ConfigResult)")
    tl = timeline(result_or_schedule, hw, schedule=schedule, gradient_sync=gradient_sync, collectives=collectives,
                  communication=communication, devices_per_node=devices_per_node)
    fig = draw(tl, title=title, memory=memory, arrows=arrows, breakdown=breakdown, zoom=zoom)
    if paths is None:
        return fig
    for p in paths:
        fmt = p.suffix.lower().lstrip(".")
        write_atomic(p, lambda tmp, fmt=fmt: fig.savefig(tmp, format=fmt, dpi=dpi), "gantt")
    return paths
