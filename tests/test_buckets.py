"""Size buckets: a graph padded to its bucket (``bucketed``) with its hardware padded to match
(``pad_hardware``) gives the unpadded graph's results bit for bit, and graphs of one bucket share
one compiled program (``plan``'s batched evaluator), whatever their data-parallel sizes."""

from __future__ import annotations

import chex
import equinox as eqx
import numpy as np
import pytest

import diffpipe as dp
from diffpipe._engine._batch import batched_simulation as _batched
from diffpipe._engine._batch import simulate_members as _simulate_members
from diffpipe._engine._graph import bucket_sizes, bucketed, common_sizes
from diffpipe._engine._hardware import pad_hardware
from diffpipe._engine._simulate import simulate_graph
from diffpipe._workload._parallelism import Parallelism

TINY = dp.Transformer(layers=8, hidden=512, heads=8, sequence=512, vocabulary=4096, activation="swiglu",
                      norm="rmsnorm", positions="rotary", bias=False, dropout=False, kv_heads=4)
CLUSTER = dp.Cluster(device=dp.Device(peak_flops=1e15, memory=8e10, efficiency=0.5, name="small"), gpus=32,
                     devices_per_node=8, memory_bandwidth=3e12)


def config(family, pipeline, data, virtual=1, global_batch=64):
    par = Parallelism(tensor=32 // (pipeline * data), pipeline=pipeline, data=data, virtual=virtual, zero=1)
    return dp.Configuration(TINY, par, CLUSTER, global_batch, schedule=family)


@pytest.mark.parametrize("family, pipeline, data, virtual", [("1f1b", 2, 4, 1), ("interleaved-1f1b", 4, 2, 2),
                                                             ("zb-h1", 4, 4, 1), ("gpipe", 2, 16, 1)])
def test_a_bucketed_graph_gives_the_graph_s_results_bit_for_bit(family, pipeline, data, virtual):
    cfg = config(family, pipeline, data, virtual=virtual)
    graph, hw = cfg.graph(), cfg.hardware()
    padded = bucketed(graph)
    sizes, real = bucket_sizes(graph), common_sizes([graph])
    assert all(sizes[name] >= real[name] for name in real) and padded.devices >= graph.devices
    assert bucketed(graph) is padded  # cached
    want = simulate_graph(graph, hw)
    traced = eqx.tree_at(lambda h: h.network, hw, hw.network.with_traced_data_parallel())
    got = simulate_graph(padded, pad_hardware(traced, padded))
    d = graph.devices
    chex.assert_trees_all_equal((got.makespan, got.busy[:d], got.peak_memory[:d], got.peak_activations[:d]),
                                (want.makespan, want.busy, want.peak_memory, want.peak_activations))
    assert np.all(np.asarray(got.busy[d:]) == 0) and np.all(np.asarray(got.peak_memory[d:]) == 0)
    steps, bubbles, memory = _simulate_members(graph, [hw])  # the plan's path: bubble with the real devices
    chex.assert_trees_all_equal((steps[0], bubbles[0], memory[0]),
                                tuple(np.asarray(x) for x in (want.makespan, want.bubble_ratio, want.peak_memory)))


def test_graphs_of_one_bucket_share_one_compiled_program():
    # different families, graph sizes and data-parallel sizes, one bucket (and one data-parallel link)
    a, b = config("1f1b", 2, 4), config("zb-h1", 2, 8, global_batch=128)
    ga, gb = a.graph(), b.graph()
    assert common_sizes([ga]) != common_sizes([gb]) and a.workload().network.data_parallel != \
        b.workload().network.data_parallel
    assert bucket_sizes(ga) == bucket_sizes(gb)
    _batched._cached.clear_cache()
    _simulate_members(ga, [a.hardware()])
    _simulate_members(gb, [b.hardware(), b.hardware()])
    assert _batched._cached._cache_size() == 1  # one program for both
    c = config("1f1b", 8, 1)  # a larger bucket: its own program
    assert bucket_sizes(c.graph()) != bucket_sizes(ga)
    _simulate_members(c.graph(), [c.hardware()])
    assert _batched._cached._cache_size() == 2


def test_plan_shapes_share_a_larger_bucket_within_the_ratio_and_change_no_result():
    # plan's exact evaluation: a graph runs on a shape already in use when it holds the graph's bucket
    # within SHAPE_RATIO of its rows; the figures are those of the graph's own bucket bit for bit
    from diffpipe._plan._search import SHAPE_RATIO, _Shapes

    small, large, huge = config("1f1b", 2, 4), config("interleaved-1f1b", 4, 2, virtual=2), config("1f1b", 4, 2,
                                                                                                 global_batch=512)
    tiny = config("gpipe", 2, 16)
    gs, gl, gh, gt = small.graph(), large.graph(), huge.graph(), tiny.graph()
    bs, bl, bh, bt = bucket_sizes(gs), bucket_sizes(gl), bucket_sizes(gh), bucket_sizes(gt)
    assert bt["nodes"] * SHAPE_RATIO < bl["nodes"] <= SHAPE_RATIO * bs["nodes"] < bh["nodes"]
    shapes = _Shapes()
    assert shapes.pad_to(gl) == bl  # the first graph: its own bucket
    assert shapes.pad_to(gs) == bl  # the larger shape in use holds it within the ratio
    assert shapes.pad_to(gt) == bt  # past the ratio of every shape in use: its own bucket
    assert shapes.pad_to(gh) == bh  # larger than any shape in use: its own
    assert shapes.pad_to(gs) == bl  # the smallest shape in use that holds it
    seeded = _Shapes()
    seeded.seed([gs, gh, gl])  # one shape for the large and huge graphs; the small one is past the ratio of it
    assert seeded.used[(gs.communication, gs.devices_per_node)] == [
        {name: max(bh[name], bl[name]) for name in bh}]
    hw = small.hardware()
    own = _simulate_members(gs, [hw])
    shared = _simulate_members(gs, [hw], shapes.pad_to(gs))
    chex.assert_trees_all_equal(shared, own)
    want = simulate_graph(gs, hw)
    chex.assert_trees_all_equal((shared[0][0], shared[1][0], shared[2][0]), tuple(
        np.asarray(x) for x in (want.makespan, want.bubble_ratio, want.peak_memory)))


def test_stage_balancing_shares_a_descent_only_within_the_ratio():
    # plan's balanced rows share one padded descent per communication setting, but a graph more than
    # SHAPE_RATIO times smaller than the group's largest gets its own (or its own group)
    from diffpipe._plan._search import SHAPE_RATIO, _shared_sizes

    tiny, small, large = (config("gpipe", 2, 16).graph(), config("1f1b", 2, 4).graph(),
                          config("interleaved-1f1b", 4, 2, virtual=2).graph())
    nodes = {id(g): common_sizes([g])["nodes"] for g in (tiny, small, large)}
    assert nodes[id(large)] > SHAPE_RATIO * nodes[id(tiny)] and nodes[id(large)] <= SHAPE_RATIO * nodes[id(small)]
    shared = _shared_sizes([tiny, large, small])
    assert id(tiny) not in shared  # alone in its group: not padded
    assert shared[id(small)] == shared[id(large)] == common_sizes([small, large])
    assert _shared_sizes([tiny, small])[id(tiny)] == common_sizes([tiny, small])  # within the ratio
