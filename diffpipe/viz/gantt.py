"""Gantt charts of a simulated step (matplotlib, Agg backend, imported on first use).

One row per device (a box per op, coloured by kind, labelled with its microbatch; a prime marks
the second pipeline of Chimera-like schedules and the box is hatched), one row per link lane
when the hardware times transfers (boxes for transfers, sub-lanes where they overlap); with
``gradient_sync=True``, a sync row per device beneath the device rows (``d0 sync``: the all-reduce
``R`` of each stage it holds) and the optimizer steps ``U`` at the end of each device's row, both
labelled ``s<stage>``; arrows from each producer to its consumer on another device, and
beneath, each device's memory over
time (bytes of stored activations plus static memory, or a count of stored activations when the
hardware has no activation sizes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ._timeline import Timeline, check_paths, timeline, write_atomic

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
    "compute_launch": "#7f7f7f", "compute_roofline": "#1f77b4", "exposed_tensor": "#d62728",
    "exposed_expert": "#ff7f0e", "exposed_gather": "#e377c2", "exposed_context": "#2ca02c", "bubble": "#dddddd",
    "jitter": "#bcbd22",
    "other": "#8c564b",
}


def _breakdown_bar(ax: Any, breakdown: dict[str, float], step: float, scale: float, unit: str) -> None:
    """One horizontal bar of the step split into ``breakdown``'s parts (seconds per pipeline rank),
    the remainder of ``step`` as "other" (optimizer, gradient-sync tail, pipeline transfers)."""
    parts = {k: float(v) for k, v in breakdown.items() if float(v) > 0 and k != "jitter"}
    rest = step - sum(parts.values())
    if rest > 1e-9 * step:
        parts["other"] = rest
    if float(breakdown.get("jitter", 0.0)) > 0:
        parts["jitter"] = float(breakdown["jitter"])  # beyond the deterministic step
    left = 0.0
    for name, seconds in parts.items():
        ax.barh(0, seconds * scale, left=left, color=_BREAKDOWN_COLORS.get(name, "#444444"), edgecolor="white",
                height=0.6, label=f"{name.replace('_', ' ')} {seconds * scale:.3g} {unit}")
        left += seconds * scale
    ax.set_xlim(0, max(ax.get_xlim()[1], left * 1.01))  # the expected step with jitter runs past the step
    ax.set_yticks([0], ["step"], fontsize=8)
    ax.set_ylim(-0.6, 0.6)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.3), fontsize=6, frameon=False, ncol=2)
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)


def draw(tl: Timeline, *, title: str | None = None, memory: bool = True, arrows: bool = True,
         breakdown: dict[str, float] | None = None):
    """A matplotlib ``Figure`` of ``tl`` (see the module docstring); ``breakdown``
    (``ConfigResult.breakdown``) adds a stacked bar of where the step goes."""
    # A bare Figure with the Agg canvas: no pyplot, so no global backend or figure state is touched.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    s = tl.schedule
    span = tl.makespan or 1.0
    scale, unit = _time_unit(span)
    sync_row = {d: s.devices + i for i, d in enumerate(tl.sync_devices)}
    rows = [f"d{d}" for d in range(s.devices)] + [f"d{d} sync" for d in sync_row] + list(tl.lanes)
    lane_row = {lane: s.devices + len(sync_row) + i for i, lane in enumerate(tl.lanes)}
    n_ops = len(tl.ops)
    width = min(24.0, max(9.0, 6.0 + n_ops / 25))
    top_h = 0.42 * len(rows) + 1.2
    mem_h = 2.4 if memory else 0.0
    bar_h = 1.2 if breakdown else 0.0
    heights = [h for h in (top_h, mem_h, bar_h) if h]
    fig = Figure(figsize=(width, sum(heights)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(np.atleast_1d(fig.subplots(len(heights), 1, sharex=True, height_ratios=heights)))
    ax = axes.pop(0)
    axm = axes.pop(0) if memory else None
    axb = axes.pop(0) if breakdown else None

    # Text fits in a box when its width exceeds the text's (about 0.6 em per character).
    axis_points = width * 72 * 0.85
    fontsize = 7 if len(rows) <= 12 else 6
    char = span * scale * fontsize * 0.62 / axis_points

    kinds_seen: set[str] = set()
    for i, op in enumerate(tl.ops):
        t0, t1 = tl.start[i] * scale, tl.finish[i] * scale
        kinds_seen.add(op.kind)
        for d in s.devices_of(op):
            ax.add_patch(Rectangle((t0, d - 0.4), t1 - t0, 0.8, facecolor=COLORS[op.kind], edgecolor="white",
                                   linewidth=0.4, hatch="////" if op.pipeline else None))
            text = _label(op, s) if op.kind in ("F", "B", "I", "W") else op.kind
            if t1 - t0 > char * (len(text) + 0.6):
                ax.text((t0 + t1) / 2, d, text, ha="center", va="center", fontsize=fontsize, color="white",
                        fontweight="bold")
    sync_kinds: set[str] = set()
    for op in tl.syncs:
        t0, t1 = op.start * scale, op.finish * scale
        sync_kinds.add(op.kind)
        for d in op.devices:
            row = sync_row[d] if op.kind == "R" else d
            ax.add_patch(Rectangle((t0, row - 0.4), t1 - t0, 0.8, facecolor=COLORS[op.kind], edgecolor="white",
                                   linewidth=0.4))
            text = f"s{op.stage}" + "'" * op.pipeline
            if t1 - t0 > char * (len(text) + 0.6):
                ax.text((t0 + t1) / 2, row, text, ha="center", va="center", fontsize=fontsize, color="white",
                        fontweight="bold")
    for t in tl.transfers:
        if t.start is None:
            continue
        kinds_seen.add(t.kind)
        row = lane_row.get(t.lane)
        if row is not None:
            t0, t1 = t.start * scale, t.finish * scale
            ax.add_patch(Rectangle((t0, row - 0.35), max(t1 - t0, 0.0), 0.7, facecolor=COLORS[t.kind],
                                   edgecolor="white", linewidth=0.3))
            text = _label(t.consumer, s)
            if t1 - t0 > char * (len(text) + 0.6):
                ax.text((t0 + t1) / 2, row, text, ha="center", va="center", fontsize=fontsize - 1, color="white")
    if arrows:
        index = {op: i for i, op in enumerate(tl.ops)}
        for t in tl.transfers:
            x0 = (t.start if t.start is not None else tl.finish[index[t.producer]]) * scale
            x1 = (t.finish if t.finish is not None else tl.start[index[t.consumer]]) * scale
            y0 = t.src + (0.4 if t.dst > t.src else -0.4)
            y1 = t.dst - (0.4 if t.dst > t.src else -0.4)
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                        arrowprops=dict(arrowstyle="-|>", color="#333333", lw=0.5, alpha=0.55,
                                        mutation_scale=6, shrinkA=0, shrinkB=0))
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlim(0, span * scale * 1.01)
    if tl.lanes or sync_row:
        ax.axhline(s.devices - 0.5, color="black", linewidth=0.6)
    if tl.lanes and sync_row:
        ax.axhline(s.devices + len(sync_row) - 0.5, color="black", linewidth=0.6)
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    handles = [Patch(facecolor=COLORS[k], label=_NAMES[k]) for k in COLORS if k in kinds_seen]
    handles += [Patch(facecolor=COLORS[k], label=_SYNC_NAMES[k]) for k in _SYNC_NAMES if k in sync_kinds]
    if s.pipelines > 1:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="////", label="pipeline ≥ 1 (')"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    heading = title or (f"{s.family}: {s.devices} devices, {s.stages} stages, {s.microbatches} microbatches, "
                        f"communication {tl.communication} — step {span * scale:.4g} {unit}")
    ax.set_title(heading, fontsize=10, loc="left")

    if axm is not None:
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
    if axb is not None:
        _breakdown_bar(axb, breakdown, span, scale, unit)
    (axb if axb is not None else axm if axm is not None else ax).set_xlabel(f"time ({unit})", fontsize=8)
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
):
    """Draw a Gantt chart of one simulated step.

    Args:
        result_or_schedule: a ``Schedule`` (simulated on ``hw``) or a ``Result`` (pass its
            ``schedule=``).
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

    Returns:
        The written ``Path``s (a list), or the matplotlib ``Figure`` when ``path`` is None.
    """
    paths = None if path is None else check_paths(path, (".png", ".svg"), "gantt")
    tl = timeline(result_or_schedule, hw, schedule=schedule, gradient_sync=gradient_sync)
    fig = draw(tl, title=title, memory=memory, arrows=arrows, breakdown=breakdown)
    if paths is None:
        return fig
    for p in paths:
        fmt = p.suffix.lower().lstrip(".")
        write_atomic(p, lambda tmp, fmt=fmt: fig.savefig(tmp, format=fmt, dpi=dpi), "gantt")
    return paths
