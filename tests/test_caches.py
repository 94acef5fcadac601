"""Every cache diffpipe keeps is bounded and registered with ``diffpipe/_caches.py``, so that
``dp.clear_caches()`` empties them all."""

import ast
from pathlib import Path

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
