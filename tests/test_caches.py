"""Every cache diffpipe keeps is bounded and registered with ``diffpipe/_caches.py``, so that
``dp.clear_caches()`` empties them all."""

import ast
from pathlib import Path

import numpy as np

import diffpipe as dp
from diffpipe import _caches
from diffpipe._engine import _simulate
from diffpipe._sweep import graph_of, grid
from diffpipe.schedules.families import controllable_memory

PACKAGE = Path(dp.__file__).resolve().parent


def _sizes():
    return {
        "baked graphs": len(_simulate._BAKED),
        "graphs seen": len(_simulate._SEEN),
        "sweep graphs": graph_of.cache_info().currsize,
        "sweep schedules": grid._cached_build.cache_info().currsize,
        "v-schedule blocks": controllable_memory.strided_blocks.cache_info().currsize,
    }


def test_clear_caches_empties_every_cache():
    hw = dp.Hardware.from_times(1.0, 2.0)
    dp.makespan(dp.compile(dp.schedules.get("1f1b", devices=2, microbatches=4)), hw)  # bakes a graph
    dp.sweep(hw, families=["1f1b"], devices=[2], microbatches=[2])  # compiles through graph_of
    dp.schedules.get("v-schedule", devices=4, microbatches=8, memory=0.75)  # ranks the strided V blocks
    filled = _sizes()
    assert all(n > 0 for n in filled.values()), filled
    dp.clear_caches()
    assert _sizes() == dict.fromkeys(filled, 0)


def test_bounded_dict_drops_its_oldest_entry_and_is_registered():
    table = _caches.BoundedDict(2)
    table["a"], table["b"], table["c"] = 1, 2, 3
    assert list(table) == ["b", "c"]
    dp.clear_caches()
    assert len(table) == 0


def test_no_cache_bypasses_the_registry():
    """No ``functools.cache``/``lru_cache`` outside ``_caches`` (use ``@bounded``), and no
    module-level ``OrderedDict()`` (use ``BoundedDict``)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "_caches.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("cache", "lru_cache") and getattr(
                    node.value, "id", "") == "functools":
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} functools.{node.attr}")
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "OrderedDict":
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} OrderedDict()")
    assert not offenders, offenders


def test_memoized_keeps_read_only_results_and_computes_unhashable_calls():
    from diffpipe._model._kernels import layer_kernels
    from diffpipe._model._transformer import layer_costs

    model = dp.presets.model("llama-3-8b")
    costs = layer_costs(model)
    assert layer_costs(model) is costs and not costs.forward.flags.writeable
    kernels = layer_kernels(model, tensor=2, sequence_parallel=True)
    assert layer_kernels(model, tensor=2, sequence_parallel=True) is kernels and not kernels.gemm.flags.writeable
    calls = []

    @_caches.memoized(4)
    def square(x):
        calls.append(x)
        return np.full(2, float(sum(x)) if isinstance(x, list) else float(x))

    assert square(3) is square(3) and calls == [3] and not square(3).flags.writeable
    assert square([1, 2]) is not square([1, 2]) and calls == [3, [1, 2], [1, 2]]  # unhashable: not kept
    dp.clear_caches()
    square(3)
    assert calls[-1] == 3 and len(calls) == 4


def test_a_plan_s_schedules_and_graphs_are_kept():
    from diffpipe._workload._parallelism import Parallelism

    model = dp.presets.model("llama-3-8b")
    cluster = dp.Cluster(device="H100", gpus=16)
    a, b = (dp.Configuration(model, Parallelism(tensor=2, pipeline=4, data=2, virtual=2), cluster, 64,
                             schedule="interleaved-1f1b") for _ in range(2))
    assert a.schedule() is b.schedule() and a.graph() is b.graph()
    assert a.graph() is not dp.Configuration(model, Parallelism(tensor=2, pipeline=4, data=2, virtual=2), cluster,
                                             64, schedule="interleaved-1f1b", communication="none").graph()
    kept = a.schedule()
    dp.clear_caches()
    assert a.schedule() is not kept and a.schedule().ops == kept.ops  # built again after clearing, the same
