"""Pictures and traces of a simulated step: ``gantt`` (PNG/SVG via matplotlib) and ``trace``
(Chrome/Perfetto JSON); ``report``, one self-contained HTML page of a plan. matplotlib is imported
only when a chart is drawn."""

from ._timeline import op_collectives as op_collectives
from .gantt import gantt as gantt
from .gantt import windows as windows
from .report import report as report
from .trace import trace as trace

__all__ = ["gantt", "op_collectives", "report", "trace", "windows"]
