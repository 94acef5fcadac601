"""Pictures and traces of a simulated step: ``gantt`` (PNG/SVG via matplotlib) and ``trace``
(Chrome/Perfetto JSON). matplotlib is imported only when a chart is drawn."""

from .gantt import gantt as gantt
from .trace import trace as trace

__all__ = ["gantt", "trace"]
