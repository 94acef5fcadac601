"""diffpipe: pipeline-parallel schedules as data, and a differentiable makespan simulator in JAX.

The discrete layer (``diffpipe.schedules``, ``diffpipe.table``) imports no JAX; the simulator
names below are loaded on first use so that ``import diffpipe`` and the CLI start fast.
"""

from . import schedules as schedules
from ._errors import ConfigError as ConfigError
from ._errors import ScheduleError as ScheduleError
from .schedules import table as table
