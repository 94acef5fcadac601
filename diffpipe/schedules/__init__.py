"""The discrete world: schedules as data, and the pure-Python reference evaluators (``evaluate``,
``evaluate_network``, ``evaluate_gradient_sync``: the simulator's oracle). Plain Python, no JAX."""

from ._analysis import in_flight as in_flight
from ._analysis import peak_activations as peak_activations
from ._analysis import staleness as staleness
from ._analysis import weight_versions as weight_versions
from ._list_scheduler import list_schedule as list_schedule
from ._reference import DEFAULT_DURATIONS as DEFAULT_DURATIONS
from ._reference import evaluate as evaluate
from ._reference import evaluate_gradient_sync as evaluate_gradient_sync
from ._reference import evaluate_network as evaluate_network
from ._registry import MAX_OPS as MAX_OPS
from ._registry import Family as Family
from ._registry import Formula as Formula
from ._registry import Option as Option
from ._registry import at_least as at_least
from ._registry import family as family
from ._registry import formula as formula
from ._registry import get as get
from ._registry import names as names
from ._registry import register as register
from ._registry import units_per_sample as units_per_sample
from ._registry import unregister as unregister
from ._rules import Dep as Dep
from ._schedule import KINDS as KINDS
from ._schedule import Op as Op
from ._schedule import Placement as Placement
from ._schedule import Schedule as Schedule
from ._schedule import orders_from_strings as orders_from_strings
from ._table import Table as Table
from ._table import table as table
from ._torch import from_torch as from_torch
from ._torch import from_torch_csv as from_torch_csv
from ._torch import to_torch_csv as to_torch_csv

# The built-in families register themselves on import, in this order (``names()``: synchronous first).
from .families import gpipe, one_f_one_b, interleaved, chimera, hanayo, zero_bubble, dualpipe  # noqa: E402, F401, I001  isort: skip
from .families import controllable_memory, pipedream, amdp  # noqa: E402, F401, I001  isort: skip
from .families import seq1f1b, seq1f1b_interleaved  # noqa: E402, F401, I001  isort: skip
