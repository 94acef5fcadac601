"""One self-contained HTML page of a plan (``diffpipe plan ... --report report.html``).

The page holds, in order: the request; step time against memory per GPU of every evaluated
configuration that fits, by schedule family (a scatter: the chosen one ringed, the usable memory and
the device's capacity as vertical lines); the table of the fastest rows (``PlanTable.cells``) and
its notes; the chosen configuration (row 0, the fastest that fits): its figures, its Gantt chart
(``gantt`` with the collectives on rows of their own, zoomed windows for a long step) and where its
step goes (``ConfigResult.breakdown``, as a bar in the chart and a table); the exports, for
Megatron-LM and torchtitan the fastest row each runs (``PlanTable.export``) or why none does.

Self-contained: no scripts, no style sheets or fonts fetched, every image a base64 PNG in a
``data:`` URI, so the file can be mailed, archived or opened offline.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._io import write_atomic
from .._plan._table import PlanTable
from ._timeline import check_paths
from .gantt import breakdown_parts, gantt

#: Resolution of the report's pictures (dots per inch; lower than a Gantt file's, to keep the page light).
DPI = 110

#: The exports the report shows, with their headings.
EXPORTS = {"megatron": "Megatron-LM arguments (append the tokenizer and data flags to pretrain_gpt.py)",
           "torchtitan": "torchtitan configuration (Python, torchtitan main since 9810191bb)",
           "torchtitan-v0.2": "torchtitan job configuration (TOML, v0.2.0-v0.2.2)"}

_STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1500px; color: #222; line-height: 1.35; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #f2f2f2; } td:first-child, th:first-child { text-align: left; }
tr.chosen td { background: #fff4cc; font-weight: bold; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
pre { background: #f6f6f6; padding: 0.6em; white-space: pre-wrap; word-break: break-all; font-size: 0.85em; }
.note { color: #555; font-size: 0.85em; white-space: pre-wrap; }
"""


def _png(fig: Any, dpi: int = DPI) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _family(row: dict[str, Any]) -> str:
    return "no pipeline (PP1)" if row["pipeline"] == 1 else row["family"]


def scatter(table: PlanTable, chosen: int = 0):
    """A matplotlib ``Figure``: step time against memory per GPU of ``table``'s rows, one colour and
    marker per family (balanced splits hollow), row ``chosen`` ringed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 5.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    markers = "os^Dvp*hX<>"
    families = sorted({_family(r) for r in table.rows})
    for k, family in enumerate(families):
        for balanced in (False, True):
            rows = [r for r in table.rows if _family(r) == family and r["balanced"] == balanced]
            if not rows:
                continue
            color = f"C{k % 10}"
            ax.scatter([r["memory_per_gpu"] / 1e9 for r in rows], [r["step_time"] for r in rows], s=28,
                       marker=markers[k % len(markers)], facecolors="none" if balanced else color,
                       edgecolors=color, linewidths=1.2, label=family + (" (balanced)" if balanced else ""))
    best = table.rows[chosen]
    ax.scatter([best["memory_per_gpu"] / 1e9], [best["step_time"]], s=220, facecolors="none", edgecolors="black",
               linewidths=1.5, label="chosen")
    capacity = float(table.cluster.device.memory) / 1e9
    usable = capacity * (1 - table.headroom)
    heading = f"{len(table.rows)} evaluated configurations that fit, by schedule family"
    if max(r["memory_per_gpu"] for r in table.rows) / 1e9 >= 0.25 * usable:  # the device's limits in view
        ax.axvline(usable, color="#c00", linestyle="--", linewidth=1,
                   label=f"usable {usable:.1f} GB ({table.headroom:.0%} kept free)")
        ax.axvline(capacity, color="#c00", linewidth=1, label=f"capacity {capacity:.1f} GB")
        ax.set_xlim(0, capacity * 1.03)
    else:  # far below them: the points spread out, the limits named
        heading += f" (usable: {usable:.1f} of {capacity:.1f} GB, off the chart)"
    ax.set_xlabel("memory per GPU (GB, the peak over pipeline ranks)")
    ax.set_ylabel("step time (s)")
    ax.set_title(heading, fontsize=10, loc="left")
    ax.grid(linewidth=0.3, alpha=0.5)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return fig


def _table(header: Any, cells: Any, chosen: int | None = None) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = []
    for i, row in enumerate(cells):
        mark = ' class="chosen"' if i == chosen else ""
        body.append(f"<tr{mark}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def report(table: PlanTable, path: str | Path | None = None, *, title: str | None = None,
           settings: str | None = None, top: int = 10, torchtitan_base: str | None = None) -> str:
    """The HTML page of ``table`` (module docstring); written atomically to ``path`` (``.html``)
    when given. ``title`` heads the page (default: the model's size and the cluster), ``settings``
    is shown under it (the CLI's defaults line), ``top``: rows in the table; ``torchtitan_base``: the
    model's torchtitan configuration for the Python export (``PlanTable.export``; None: the page says
    why there is none)."""
    if not isinstance(table, PlanTable):
        raise ConfigError(f"report: expected a PlanTable (dp.plan's answer), got {type(table).__name__}")
    if not table.rows:
        raise ConfigError("report: the plan has no configuration that fits; there is nothing to draw")
    paths = None if path is None else check_paths(path, (".html", ".htm"), "report")
    cfg = table.configuration(0)
    result = cfg.evaluate(table.headroom)
    chart = gantt(cfg, evaluation=result)
    best = table.rows[0]
    heading = title or (f"{table.model.layers}-layer model on {table.cluster.gpus} x {table.cluster.device.name}, "
                        f"global batch {table.global_batch}")
    par = cfg.parallelism
    summary = (f"{_family(best)}: TP{par.tensor} CP{par.context} PP{par.pipeline} DP{par.data}"
               + (f" VPP{par.virtual}" if par.virtual > 1 else "") + (f" EP{par.expert}" if par.expert > 1 else "")
               + (f" ETP{par.etp}" if par.etp != par.tensor else "")
               + f" ZeRO-{par.zero}" + (" SP" if par.sequence_parallel else "")
               + f", microbatch size {best['microbatch_size']}, {result.microbatches} microbatches, "
               f"recompute {best['recompute']}, layers per stage {' '.join(map(str, best['layers_per_stage']))}")
    figures = [("step time", f"{result.step_time:.4g} s"),
               ("tokens/s/GPU", f"{result.tokens_per_second_per_gpu:,.0f}"),
               ("MFU", f"{100 * result.mfu:.1f}%"),
               ("memory/GPU", f"{result.memory_per_gpu / 1e9:.1f} GB of {result.capacity / 1e9:.1f} GB"),
               ("bubble", f"{100 * result.bubble_ratio:.1f}%"),
               ("collectives inside ops", f"{100 * result.communication_share:.1f}% of the step")]
    breakdown = [(k.replace("_", " "), f"{v:.4g}", f"{100 * v / result.step_time:.1f}")
                 for k, v in breakdown_parts(result.breakdown, result.step_time).items()]
    exports = []
    for framework, label in EXPORTS.items():
        try:
            row, text = table.export(framework, torchtitan_base=torchtitan_base)
        except ConfigError as error:
            exports.append(f"<h3>{html.escape(label)}</h3><p>{html.escape(str(error))}</p>")
            continue
        which = "the chosen configuration" if row == 0 else f"row {row + 1}, the fastest it runs"
        exports.append(f"<h3>{html.escape(label)}: {which}</h3><pre>{html.escape(text)}</pre>")
    header, cells = table.cells(top)
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>diffpipe plan: {html.escape(heading)}</title>
<style>{_STYLE}</style>
</head>
<body>
<h1>diffpipe plan: {html.escape(heading)}</h1>
{f'<p class="note">{html.escape(settings)}</p>' if settings else ''}
<section id="scatter">
<h2>Step time against memory per GPU, by schedule family</h2>
<img src="{_png(scatter(table))}" alt="step time against memory per GPU of every evaluated configuration">
</section>
<section id="table">
<h2>The fastest configurations</h2>
{_table(header, cells, chosen=0)}
<p class="note">{html.escape(table.notes())}</p>
</section>
<section id="chosen">
<h2>The chosen configuration</h2>
<p>{html.escape(summary)}</p>
{_table(("figure", "value"), figures)}
<h3>One simulated step</h3>
<img src="{_png(chart)}" alt="Gantt chart of one simulated step of the chosen configuration">
<h3>Where the step goes</h3>
{_table(("part", "seconds", "% of the step"), breakdown)}
<p class="note">seconds per step, the mean over pipeline ranks: compute by kernel class, the collectives left
exposed inside ops, the pipeline bubble, and the rest (optimizer step, gradient-sync tail, transfers)</p>
</section>
<section id="export">
<h2>Exports</h2>
{''.join(exports)}
</section>
</body>
</html>
"""
    for p in paths or ():
        write_atomic(p, page, "report")
    return page
