"""The parallel cost model (diffpipe._workload._parallel; the sizes in ._parallelism): sizes and their
checks, placement, per-device FLOPs, collectives and ZeRO memory against the papers' formulas, computed
by hand here."""

from __future__ import annotations

import numpy as np
import pytest

import diffpipe as dp
from diffpipe._machine._cluster import Cluster
from diffpipe._model._transformer import activation_bytes, layer_costs
from diffpipe._workload._parallel import (
    all_gather,
    all_reduce,
    parallel_costs,
    placement,
    zero_static_bytes,
)
from diffpipe._workload._parallelism import Parallelism


def small(**kw):
    fields = dict(layers=4, hidden=256, heads=8, sequence=128, vocabulary=1000, microbatch_size=2)
    return dp.Transformer(**{**fields, **kw})


def moe(**kw):
    return small(activation="swiglu", experts=8, experts_per_token=2, moe_ffn_hidden=512, **kw)


# -- sizes and checks ------------------------------------------------------------------------------
def test_sizes():
    p = Parallelism(tensor=8, pipeline=4, data=2, virtual=2, zero=1, sequence_parallel=True)
    assert (p.gpus, p.stages) == (64, 8)
    assert Parallelism().gpus == 1


@pytest.mark.parametrize("kwargs, culprit", [
    (dict(tensor=0), "tensor"),
    (dict(pipeline=1.5), "pipeline"),
    (dict(data=True), "data"),
    (dict(zero=4), "zero"),
    (dict(zero=True), "zero"),
    (dict(sequence_parallel=1), "sequence_parallel"),
    (dict(data=4, expert=3), "expert=3 must divide data=4"),
])
def test_parallelism_rejects_bad_sizes(kwargs, culprit):
    with pytest.raises(dp.ConfigError, match=culprit):
        Parallelism(**kwargs)


@pytest.mark.parametrize("kwargs, model, gpus, culprit", [
    (dict(tensor=3), small(), None, "tensor=3 must divide the model's heads=8"),
    (dict(tensor=4), small(kv_heads=2), None, "kv_heads=2"),
    (dict(tensor=8), small(heads=8, ffn_hidden=1004), None, "ffn_hidden=1004"),
    (dict(tensor=2, pipeline=2, data=2), small(), 16, "= 8, but the cluster has 16 GPUs"),
    (dict(pipeline=7), small(), None, "7 stages exceed the model's 4 layers plus its embedding and head"),
    (dict(pipeline=2, virtual=4), small(), None, "8 stages exceed"),
    (dict(data=2, expert=2), small(), None, "needs a mixture-of-experts model"),
    (dict(data=3, expert=3), moe(), None, "expert=3 must divide the model's experts=8"),
])
def test_check_names_the_culprit(kwargs, model, gpus, culprit):
    with pytest.raises(dp.ConfigError, match=culprit) as info:
        Parallelism(**kwargs).check(model, gpus)
    assert "\n" not in str(info.value)


# -- the cluster and the placement -----------------------------------------------------------------
def test_cluster_presets_and_defaults():
    c = Cluster("H100", gpus=64, intra="nvlink4", inter="ib-ndr")
    spec = dp.presets.NETWORKS
    assert c.devices_per_node == 8 and c.nodes == 8
    assert float(c.intra_bandwidth) == pytest.approx(spec["nvlink4"].bandwidth)
    assert float(c.inter_latency) == pytest.approx(spec["ib-ndr"].latency)
    assert float(c.memory_bandwidth) == pytest.approx(dp.presets.DEVICES["H100"].memory_bandwidth)
    assert Cluster("GB200", gpus=72, intra="nvl72").devices_per_node == 72
    custom = Cluster(dp.presets.device("A100"), gpus=2, intra=(1e9, 1e-6), inter=(1e8, 1e-5))
    assert custom.intra == "custom" and float(custom.inter_bandwidth) == pytest.approx(1e8)


@pytest.mark.parametrize("kwargs, culprit", [
    (dict(device="H999"), "unknown device preset"),
    (dict(intra="warp-drive"), "unknown network preset"),
    (dict(inter=3), "inter must be a link preset"),
    (dict(gpus=12), "gpus=12 is not a whole number of 8-GPU nodes"),
    (dict(intra=(0.0, 1e-6)), "intra_bandwidth must be positive"),
    (dict(inter=(1e9, -1.0)), "inter_latency must be non-negative"),
    (dict(device=dp.Device(1e12, 1e9)), "has no memory bandwidth"),
])
def test_cluster_rejects(kwargs, culprit):
    with pytest.raises(dp.ConfigError, match=culprit):
        Cluster(**{"gpus": 16, **kwargs})


@pytest.mark.parametrize("sizes, links, stages_per_node", [
    # Megatron's rank order tp-dp-pp: tensor innermost, then data, then pipeline.
    ((8, 4, 2), {"tensor": "intra", "context": "intra", "expert": "intra", "data": "inter"}, 1),
    ((4, 4, 2), {"tensor": "intra", "context": "intra", "expert": "intra", "data": "intra"}, 1),
    ((2, 4, 2), {"tensor": "intra", "context": "intra", "expert": "intra", "data": "intra"}, 2),
    ((1, 8, 1), {"tensor": "intra", "context": "intra", "expert": "intra", "data": "intra"}, 8),
])
def test_placement(sizes, links, stages_per_node):
    t, p, d = sizes
    got = placement(Parallelism(tensor=t, pipeline=p, data=d), Cluster(gpus=t * p * d, devices_per_node=8))
    assert got.links == links and got.stages_per_node == stages_per_node


def test_placement_of_expert_groups():
    got = placement(Parallelism(tensor=4, pipeline=1, data=4, expert=4), Cluster(gpus=16))
    assert got.links == {"tensor": "intra", "context": "intra", "expert": "inter", "data": "inter"}
    got = placement(Parallelism(tensor=2, pipeline=1, data=8, expert=4), Cluster(gpus=16))
    assert got.links == {"tensor": "intra", "context": "intra", "expert": "intra", "data": "inter"}


@pytest.mark.parametrize("sizes, culprit", [
    ((16, 1, 1), "tensor=16 must divide the 8 GPUs of a node"),
    ((3, 1, 1), "tensor=3 must divide"),
    ((1, 2, 3), "tensor x data = 3 must divide"),
])
def test_placement_rejects(sizes, culprit):
    t, p, d = sizes
    with pytest.raises(dp.ConfigError, match=culprit):
        placement(Parallelism(tensor=t, pipeline=p, data=d), Cluster(gpus=t * p * d, devices_per_node=8))


# -- collectives -----------------------------------------------------------------------------------
def test_ring_formulas():
    assert all_reduce(4, 100.0) == (2 * 3 / 4 * 100.0, 6.0)
    assert all_gather(4, 100.0) == (3 / 4 * 100.0, 3.0)
    assert all_reduce(1, 100.0) == all_gather(1, 100.0) == (0.0, 0.0)


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_tensor_parallel_flops_collectives_and_activations(sp, recompute):
    model = small(recompute=recompute)
    t = 4
    c = parallel_costs(model, Parallelism(tensor=t, sequence_parallel=sp))
    base = layer_costs(model)
    np.testing.assert_allclose(c.costs.forward, base.forward / t)
    np.testing.assert_allclose(c.costs.input_grad, base.input_grad / t)
    np.testing.assert_allclose(c.costs.weight, base.weight / t)
    x = 2.0 * 2 * 128 * 256  # d b s h
    ring = 2 * (t - 1) / t * x  # one all-reduce (or all-gather + reduce-scatter)
    blocks = slice(1, 1 + model.layers)
    tb = c.collective_bytes["tensor"]
    np.testing.assert_allclose(tb[0, blocks], 2 * ring)  # two in the forward (Megatron-LM)
    np.testing.assert_allclose(tb[1, blocks], (4 if recompute == "full" else 2) * ring)  # the recomputed two
    np.testing.assert_allclose(tb[2], 0.0)
    np.testing.assert_allclose(c.collective_hops["tensor"][0, blocks], 2 * 2 * (t - 1))
    # the vocabulary-parallel embedding and head: one all-reduce's volume each
    assert tb[0, 0] == pytest.approx(ring / 2 if sp else ring)
    assert tb[0, -1] + tb[1, -1] == pytest.approx(ring)
    np.testing.assert_allclose(c.activation_bytes, activation_bytes(model, tensor=t, sequence_parallel=sp))
    np.testing.assert_allclose(c.output_bytes, base.output_bytes / t)
    np.testing.assert_allclose(c.parameters, base.parameters / t)
    assert c.collective_bytes["expert"].sum() == c.collective_bytes["data"].sum() == 0


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_expert_parallel_all_to_alls_and_expert_shards(recompute):
    model = moe(recompute=recompute)
    e, d = 4, 8
    c = parallel_costs(model, Parallelism(data=d, expert=e))
    x = 2.0 * 2 * 128 * 256
    a2a = (e - 1) / e * 2 * x  # every token to k = 2 experts
    eb = c.collective_bytes["expert"]
    np.testing.assert_allclose(eb[0, 1:-1], 2 * a2a)  # dispatch and combine (GShard)
    np.testing.assert_allclose(eb[1, 1:-1], (4 if recompute == "full" else 2) * a2a)
    assert eb[:, [0, -1]].sum() == 0
    np.testing.assert_allclose(c.collective_hops["expert"][0, 1:-1], 2 * (e - 1))
    # each device holds E / e of the routed experts
    base = layer_costs(model)
    np.testing.assert_allclose(base.parameters[1:-1] - c.parameters[1:-1], ROUTED * (1 - 1 / e))


#: Routed-expert parameters of one block of ``moe()``: 8 SwiGLU experts (3 h F weights, 2F + h biases).
ROUTED = 8 * (3 * 256 * 512 + 2 * 512 + 256)


# -- ZeRO ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("zero, per_parameter", [
    (0, lambda n: 16.0), (1, lambda n: 4 + 12 / n), (2, lambda n: 2 + 14 / n), (3, lambda n: 16 / n)])
@pytest.mark.parametrize("data", [1, 2, 8, 64])
def test_zero_static_bytes_match_the_paper(zero, per_parameter, data):
    # Rajbhandari et al. SC'20, Figure 1: mixed-precision Adam, K = 12.
    assert zero_static_bytes(1.0, zero, data, 2, 16) == pytest.approx(per_parameter(data))
    model = small()
    c = parallel_costs(model, Parallelism(tensor=2, data=data, zero=zero))
    np.testing.assert_allclose(c.static_bytes, c.parameters * per_parameter(data))
    owned = c.parameters / (data if zero >= 1 else 1)  # the parameters this device's optimizer steps
    np.testing.assert_allclose(c.update_bytes, 2 * (12 + 2) * owned)


def test_zero_gradient_sync_bytes():
    model = small()
    for zero in (0, 1, 2):
        c = parallel_costs(model, Parallelism(data=4, zero=zero))
        np.testing.assert_allclose(c.gradient_bytes, 2 * c.parameters)  # an all-reduce's volume
    c = parallel_costs(model, Parallelism(data=4, zero=3))
    np.testing.assert_allclose(c.gradient_bytes, c.parameters)  # a reduce-scatter only
    gather = 3 / 4 * 2 * c.parameters  # the weights all-gathered before each forward and backward
    np.testing.assert_allclose(c.collective_bytes["data"][0], gather)
    np.testing.assert_allclose(c.collective_bytes["data"][1], gather)


def test_expert_gradients_sync_over_their_own_group():
    model = moe()
    c = parallel_costs(model, Parallelism(data=8, expert=4))
    experts = np.array([0.0] + [ROUTED / 4] * model.layers + [0.0])  # what one device holds of them
    n, ne = 8, 2  # the expert data group: 8 / 4 ranks
    expected = 2 * (c.parameters - experts) + 2 * experts * ((ne - 1) / ne) / ((n - 1) / n)
    np.testing.assert_allclose(c.gradient_bytes, expected)
    shards = np.array([0.0] + [ROUTED / 4] * model.layers + [0.0])
    np.testing.assert_allclose(c.static_bytes, 16 * (c.parameters - shards) + 16 * shards)
    z = parallel_costs(model, Parallelism(data=8, expert=4, zero=1))
    np.testing.assert_allclose(z.static_bytes, (4 + 12 / 8) * (z.parameters - shards) + (4 + 12 / 2) * shards)


# NCCL's tuner (NVIDIA/nccl commit 5067397c2676d5aed50042fc39e5c8ee96eb0027, src/graph/tuning.cc,
# ncclTopoTuneModel and ncclTunerConstantsDefaults): a Ring/Simple all-gather or reduce-scatter over
# ``n`` ranks on ``nodes`` nodes costs baseLatencies[Ring][Simple] + (n - 1 - (nodes - 1)) x
# max(hwLatencies[NVLINK][Ring][Simple], 3 x netOverhead) + (nodes - 1) x hwLatencies[NET][Ring][Simple]
# microseconds (netOverhead 1 us on x86 Intel hosts, getNetOverhead; the IB plugin's own latency 0,
# src/transport/net_ib/init.cc).
NCCL_RING_SIMPLE_BASE_US, NCCL_NVLINK_RING_SIMPLE_US = 8.4, 3.4
NCCL_NET_RING_SIMPLE_US, NCCL_NET_OVERHEAD_US = 14.0, 1.0


def nccl_ring_gather_latency(n: int, nodes: int) -> float:
    intra = max(NCCL_NVLINK_RING_SIMPLE_US, 3 * NCCL_NET_OVERHEAD_US)
    inter_steps = nodes - 1
    return 1e-6 * (NCCL_RING_SIMPLE_BASE_US + (n - 1 - inter_steps) * intra + inter_steps * NCCL_NET_RING_SIMPLE_US)


@pytest.mark.parametrize("gpus", [128, 256, 512])
def test_data_parallel_gather_latency_is_nccl_tuners(gpus):
    """A ZeRO-3 data-parallel all-gather over every GPU of H100 nodes (the llm-foundry weak-scaling
    runs' group): its latency hops times the cluster's step latency is NCCL's own ring estimate
    within 10% (the model has no per-collective base latency, and prices every step at the slower link)."""
    cluster = Cluster("H100", gpus=gpus)
    par = Parallelism(data=gpus, zero=3)
    where = placement(par, cluster)
    assert where.links["data"] == "inter"
    model = small()
    costs = parallel_costs(model, par)
    hops = costs.collective_hops["data"][0]
    assert np.all(hops[hops > 0] == gpus - 1)
    ours = (gpus - 1) * float(cluster.step_latency(where.links["data"]))
    nccl = nccl_ring_gather_latency(gpus, gpus // cluster.devices_per_node)
    assert abs(ours / nccl - 1) < 0.10, (ours, nccl)
