"""diffpipe: pipeline-parallel schedules as data, and a differentiable makespan simulator in JAX.

The discrete layer (``diffpipe.schedules``, ``diffpipe.table``) imports no JAX; the simulator
names are loaded on first use so that ``import diffpipe`` and the CLI start fast.
"""

from typing import TYPE_CHECKING

from . import schedules as schedules
from ._errors import ConfigError as ConfigError
from ._errors import ScheduleError as ScheduleError
from .schedules import table as table

# Public name -> module that defines it (imported on first attribute access).
_LAZY = {
    "AbstractCommunication": "._communication",
    "AbstractLaneCommunication": "._communication",
    "Blocking": "._communication",
    "Contention": "._communication",
    "NoCommunication": "._communication",
    "Overlap": "._communication",
    "communication": "._communication",
    "Comparison": "._compare",
    "Machine": "._compare",
    "compare": "._compare",
    "CostModel": "._cost_model",
    "AbstractAdjoint": "._evaluate",
    "AutodiffAdjoint": "._evaluate",
    "SweepAdjoint": "._evaluate",
    "Graph": "._graph",
    "compile": "._graph",
    "stack_graphs": "._graph",
    "Hardware": "._hardware",
    "Network": "._hardware",
    "Result": "._simulate",
    "makespan": "._simulate",
    "peak_memory": "._simulate",
    "simulate": "._simulate",
    "SweepResult": "._sweep",
    "sweep": "._sweep",
    "Device": "._transformer",
    "Transformer": "._transformer",
    "layer_costs": "._transformer",
    "Plan": "._baselines",
    "brute_force_partition": "._baselines",
    "minmax_partition": "._baselines",
    "uniform_partition": "._baselines",
    "AbstractKnob": "._knobs",
    "MicrobatchSplit": "._knobs",
    "StageBalance": "._knobs",
    "Workload": "._knobs",
    "Launch": "._export",
    "megatron_args": "._export",
    "megatron_layout": "._export",
    "parse_megatron_layout": "._export",
    "torchtitan_toml": "._export",
    "PlanTable": "._plan",
    "plan": "._plan",
    "OptimizeResult": "._optimize",
    "optimize": "._optimize",
    "Cluster": "._parallel",
    "Parallelism": "._parallel",
    "ConfigResult": "._configuration",
    "Configuration": "._configuration",
}
# Public submodules loaded on first access (``diffpipe.presets.device("H100")``).
_LAZY_MODULES = {"presets": "._presets", "viz": ".viz", "calibrate": ".calibrate"}

if TYPE_CHECKING:
    from . import _presets as presets  # noqa: F401  (public as a module: diffpipe.presets)
    from . import calibrate as calibrate  # noqa: F401
    from . import viz as viz  # noqa: F401
    from ._baselines import Plan as Plan
    from ._baselines import brute_force_partition as brute_force_partition
    from ._baselines import minmax_partition as minmax_partition
    from ._baselines import uniform_partition as uniform_partition
    from ._communication import AbstractCommunication as AbstractCommunication
    from ._communication import AbstractLaneCommunication as AbstractLaneCommunication
    from ._communication import Blocking as Blocking
    from ._communication import Contention as Contention
    from ._communication import NoCommunication as NoCommunication
    from ._communication import Overlap as Overlap
    from ._communication import communication as communication
    from ._compare import Comparison as Comparison
    from ._compare import Machine as Machine
    from ._compare import compare as compare
    from ._configuration import ConfigResult as ConfigResult
    from ._configuration import Configuration as Configuration
    from ._cost_model import CostModel as CostModel
    from ._evaluate import AbstractAdjoint as AbstractAdjoint
    from ._evaluate import AutodiffAdjoint as AutodiffAdjoint
    from ._evaluate import SweepAdjoint as SweepAdjoint
    from ._export import Launch as Launch
    from ._export import megatron_args as megatron_args
    from ._export import megatron_layout as megatron_layout
    from ._export import parse_megatron_layout as parse_megatron_layout
    from ._export import torchtitan_toml as torchtitan_toml
    from ._graph import Graph as Graph
    from ._graph import compile as compile
    from ._graph import stack_graphs as stack_graphs
    from ._hardware import Hardware as Hardware
    from ._hardware import Network as Network
    from ._knobs import AbstractKnob as AbstractKnob
    from ._knobs import MicrobatchSplit as MicrobatchSplit
    from ._knobs import StageBalance as StageBalance
    from ._knobs import Workload as Workload
    from ._optimize import OptimizeResult as OptimizeResult
    from ._optimize import optimize as optimize
    from ._parallel import Cluster as Cluster
    from ._parallel import Parallelism as Parallelism
    from ._plan import PlanTable as PlanTable
    from ._plan import plan as plan
    from ._simulate import Result as Result
    from ._simulate import makespan as makespan
    from ._simulate import peak_memory as peak_memory
    from ._simulate import simulate as simulate
    from ._sweep import SweepResult as SweepResult
    from ._sweep import sweep as sweep
    from ._transformer import Device as Device
    from ._transformer import Transformer as Transformer
    from ._transformer import layer_costs as layer_costs


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    if name in _LAZY_MODULES:
        import importlib

        value = importlib.import_module(_LAZY_MODULES[name], __name__)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'diffpipe' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY) + list(_LAZY_MODULES))
