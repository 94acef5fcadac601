"""diffpipe: pipeline-parallel schedules as data, and a differentiable makespan simulator in JAX.

The discrete layer (``diffpipe.schedules``, ``diffpipe.table``) imports no JAX; every other public
name is loaded on first use, so that ``import diffpipe`` and the CLI start fast. The public names are
listed once, as the imports of the ``TYPE_CHECKING`` block below: type checkers read them there, and
``__getattr__`` reads the same block (with ``ast``) to know where each name lives.
"""

import ast as _ast
import importlib as _importlib
from pathlib import Path as _Path
from typing import TYPE_CHECKING

from . import schedules as schedules
from ._errors import ConfigError as ConfigError
from ._errors import ScheduleError as ScheduleError
from .schedules import table as table

if TYPE_CHECKING:
    from . import calibrate as calibrate
    from . import presets as presets
    from . import viz as viz
    from ._caches import clear_caches as clear_caches
    from ._caches import enable_compilation_cache as enable_compilation_cache
    from ._compare import Comparison as Comparison
    from ._compare import Machine as Machine
    from ._compare import compare as compare
    from ._engine._communication import AbstractCommunication as AbstractCommunication
    from ._engine._communication import AbstractLaneCommunication as AbstractLaneCommunication
    from ._engine._communication import Blocking as Blocking
    from ._engine._communication import Contention as Contention
    from ._engine._communication import NoCommunication as NoCommunication
    from ._engine._communication import Overlap as Overlap
    from ._engine._communication import communication as communication
    from ._engine._cost_model import AbstractCostModel as AbstractCostModel
    from ._engine._cost_model import CostTables as CostTables
    from ._engine._evaluate import AbstractAdjoint as AbstractAdjoint
    from ._engine._evaluate import AutodiffAdjoint as AutodiffAdjoint
    from ._engine._evaluate import SweepAdjoint as SweepAdjoint
    from ._engine._graph import Graph as Graph
    from ._engine._graph import compile as compile
    from ._engine._graph import stack_graphs as stack_graphs
    from ._engine._hardware import Hardware as Hardware
    from ._engine._hardware import Network as Network
    from ._engine._jitter import Jitter as Jitter
    from ._engine._jitter import expected_makespan as expected_makespan
    from ._engine._jitter import sample_makespans as sample_makespans
    from ._engine._jitter import step_time_summary as step_time_summary
    from ._engine._simulate import Result as Result
    from ._engine._simulate import makespan as makespan
    from ._engine._simulate import peak_memory as peak_memory
    from ._engine._simulate import simulate as simulate
    from ._io import Staged as Staged
    from ._io import dumps_json as dumps_json
    from ._io import write_atomic as write_atomic
    from ._levels import formula_level as formula_level
    from ._levels import kendall_tau as kendall_tau
    from ._levels import table_level as table_level
    from ._machine._cluster import Cluster as Cluster
    from ._machine._device import Device as Device
    from ._machine._kernels import KernelModel as KernelModel
    from ._machine_file import FileMachine as FileMachine
    from ._machine_file import load_machine as load_machine
    from ._model._transformer import Transformer as Transformer
    from ._model._transformer import layer_costs as layer_costs
    from ._optimize._baselines import StagePlan as StagePlan
    from ._optimize._baselines import brute_force_partition as brute_force_partition
    from ._optimize._baselines import compositions as compositions
    from ._optimize._baselines import evaluate_plans as evaluate_plans
    from ._optimize._baselines import minmax_partition as minmax_partition
    from ._optimize._knobs import AbstractKnob as AbstractKnob
    from ._optimize._knobs import MicrobatchSplit as MicrobatchSplit
    from ._optimize._knobs import SequenceSplit as SequenceSplit
    from ._optimize._knobs import StageBalance as StageBalance
    from ._optimize._optimize import OptimizeResult as OptimizeResult
    from ._optimize._optimize import optimize as optimize
    from ._partition import uniform_partition as uniform_partition
    from ._plan._configuration import HEADROOM as HEADROOM
    from ._plan._configuration import ConfigResult as ConfigResult
    from ._plan._configuration import Configuration as Configuration
    from ._plan._configuration import fits_memory as fits_memory
    from ._plan._export import TORCHTITAN_BASES as TORCHTITAN_BASES
    from ._plan._export import Launch as Launch
    from ._plan._export import megatron_args as megatron_args
    from ._plan._export import megatron_layout as megatron_layout
    from ._plan._export import megatron_model_args as megatron_model_args
    from ._plan._export import parse_megatron_layout as parse_megatron_layout
    from ._plan._export import torchtitan_config as torchtitan_config
    from ._plan._export import torchtitan_toml as torchtitan_toml
    from ._plan._search import plan as plan
    from ._plan._table import PlanTable as PlanTable
    from ._sweep import SweepResult as SweepResult
    from ._sweep import sweep as sweep
    from ._workload._frameworks import Framework as Framework
    from ._workload._overlap import CommunicationOverlap as CommunicationOverlap
    from ._workload._overlap import transformer_engine_tensor_overlap as transformer_engine_tensor_overlap
    from ._workload._parallelism import Parallelism as Parallelism
    from ._workload._workload import Workload as Workload
    from ._workload._workload import hardware_from_model as hardware_from_model


def _lazy_names() -> dict[str, tuple[str, str | None]]:
    """Public name -> (module, attribute or None for a module), read from the block above."""
    tree = _ast.parse(_Path(__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, _ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    names: dict[str, tuple[str, str | None]] = {}
    for node in block.body:
        assert isinstance(node, _ast.ImportFrom)
        for alias in node.names:
            if node.module is None:  # ``from . import viz``: a public submodule
                names[alias.asname or alias.name] = ("." + alias.name, None)
            else:
                names[alias.asname or alias.name] = ("." * node.level + node.module, alias.name)
    return names


_LAZY = _lazy_names()
__all__ = sorted(["ConfigError", "ScheduleError", "schedules", "table", *_LAZY])


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'diffpipe' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = _importlib.import_module(module, __name__)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__():
    return __all__
