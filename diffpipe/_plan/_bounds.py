"""The closed forms the search bounds candidates by, before simulating (``_search``'s docstring,
step 2): per-variant per-layer costs in float64 NumPy (``Costs``, cached across plans) and, per
pipeline rank of the uniform split, static and activation bytes and a lower bound on the step."""

from __future__ import annotations

import numpy as np

from .._caches import BoundedDict
from .._machine._cluster import Cluster
from .._model._kernels import kernel_times
from .._model._transformer import Transformer, stage_of_layers
from .._workload._frameworks import Framework
from .._workload._overlap import CommunicationOverlap
from .._workload._parallel import parallel_costs
from .._workload._parallelism import Parallelism
from ._space import stage_devices


def exposed_at_least(overlap: CommunicationOverlap | None) -> dict[str, float]:
    """The smallest share of each collective group's time that ``overlap`` leaves on the step
    (``Configuration.exposed_collectives``): the tensor collectives ``1 - tensor + contention x tensor``;
    the ZeRO-3 gathers (group ``data``), prefetched, at least their contention (all hidden); the expert
    all-to-alls in full."""
    if overlap is None:
        return {}
    out = {"tensor": 1.0 - overlap.tensor + overlap.contention * overlap.tensor}
    if overlap.prefetch:
        out["data"] = overlap.contention
    return out


class Costs:
    """The closed-form per-layer numbers of one (model variant, tensor, expert, data, ZeRO, SP), in
    float64 numpy: F and I with the collectives they wait for, the whole F + I + W work, the optimizer
    step, static and activation bytes. Only bounds are computed from them (never a reported number).
    With a ``framework``, each group's collectives count only the share its overlap can never hide
    (``exposed_at_least``), so the bound stays below the step the ``Configuration`` prices."""

    def __init__(self, model: Transformer, par: Parallelism, cluster: Cluster, links: dict[str, str],
                 framework: Framework | None = None, cluster_id: tuple | None = None):
        if framework is not None:
            model = framework.model(model)
        costs = parallel_costs(model, par)
        least = exposed_at_least(None if framework is None else framework.overlap(model, par))
        cluster_id = cluster_key(cluster) if cluster_id is None else cluster_id
        numbers = CLUSTERS.get(cluster_id)
        if numbers is None:
            numbers = CLUSTERS[cluster_id] = _ClusterNumbers(cluster)
        key = (model, par.tensor, par.sequence_parallel, par.expert, par.etp, par.context, cluster_id)
        if key not in TIMES:
            if numbers.kernels and costs.kernels is not None:  # Configuration.compute_seconds
                times = sum(kernel_times(costs.kernels, cluster.device, float(model.dtype_bytes)).values())
            else:
                times = costs.costs.times(cluster.device)
            TIMES[key] = tuple(np.asarray(x, np.float64) for x in times)
        f, i, w = TIMES[key]
        comm = np.zeros((3, model.layers + 2))
        for group, link in links.items():  # Configuration.collective_seconds, in numpy
            if group not in costs.collective_bytes:
                continue  # the context ring: what it exposes is >= 0, left out of the lower bound
            bandwidth, latency = numbers.link(link)
            seconds = costs.collective_bytes[group] / bandwidth + costs.collective_hops[group] * latency
            comm = comm + least.get(group, 1.0) * seconds
        self.forward = f + comm[0]
        self.work = self.forward + i + comm[1] + w + comm[2]
        self.update = np.asarray(costs.update_bytes, np.float64) / numbers.memory_bandwidth
        self.static = np.asarray(costs.static_bytes, np.float64)
        self.activation = np.asarray(costs.activation_bytes, np.float64)
        self.shared_static = float(costs.shared_static_bytes)


class _ClusterNumbers:
    """The floats ``Costs`` reads of a cluster, read once per cluster (``CLUSTERS``): each link's
    bandwidth and latency, the memory bandwidth the optimizer step streams at, whether the device
    has a ``KernelModel``."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.links: dict[str, tuple[float, float]] = {}
        self.kernels = cluster.device.kernels is not None
        bandwidth = float(cluster.memory_bandwidth)
        if self.kernels:
            bandwidth *= float(cluster.device.kernels.memory_efficiency)
        self.memory_bandwidth = bandwidth

    def link(self, name: str) -> tuple[float, float]:
        if name not in self.links:
            bandwidth, latency = (float(x) for x in self.cluster.link(name))
            self.links[name] = (bandwidth, latency)
        return self.links[name]


#: Bounded caches across plans (warm plans skip the per-variant cost tables): model variant and
#: parallel sizes and the cluster's values -> ``Costs``; model variant and tensor -> op seconds;
#: the cluster's values -> its numbers.
CACHE_SIZE = 50_000
COSTS: BoundedDict = BoundedDict(CACHE_SIZE)
TIMES: BoundedDict = BoundedDict(CACHE_SIZE)
CLUSTERS: BoundedDict = BoundedDict(64)


def cluster_key(cluster: Cluster) -> tuple:
    """The cluster's values that the closed forms read, as a hashable key (``COSTS``, ``TIMES``)."""
    leaves = (cluster.device.peak_flops, cluster.device.efficiency, cluster.device.memory, cluster.intra_bandwidth,
              cluster.intra_latency, cluster.inter_bandwidth, cluster.inter_latency, cluster.memory_bandwidth)
    return (cluster.device.name, cluster.gpus, cluster.devices_per_node, *(float(x) for x in leaves))


def _stage_sums(values: np.ndarray, rows: np.ndarray, stages: int) -> np.ndarray:
    return np.bincount(rows, weights=values, minlength=stages)


def closed_form(k: Costs, model: Transformer, pipeline: int, virtual: int, style: str,
                 split_rows: dict[int, np.ndarray]) -> tuple[np.ndarray, ...]:
    """Per pipeline rank, under the uniform split: static bytes, the smallest stage's activations
    (one microbatch), the forward of microbatch 0 before its first stage, per-microbatch work (F + I +
    W with collectives) and the optimizer step (seconds)."""
    stages = pipeline * virtual
    if stages not in split_rows:
        split_rows[stages] = stage_of_layers(model, stages)
    rows = split_rows[stages]
    device_of = stage_devices(style, pipeline, stages)
    static = _stage_sums(k.static, rows, stages)
    if stages == 1:
        static = static - k.shared_static
    act = _stage_sums(k.activation, rows, stages)
    dev_static = np.bincount(device_of, weights=static, minlength=pipeline)
    dev_act = np.full(pipeline, np.inf)
    np.minimum.at(dev_act, device_of, act)
    first = np.full(pipeline, stages)
    np.minimum.at(first, device_of, np.arange(stages))
    before = np.concatenate([[0.0], np.cumsum(_stage_sums(k.forward, rows, stages))])[first]
    work = np.bincount(device_of, weights=_stage_sums(k.work, rows, stages), minlength=pipeline)
    update = np.bincount(device_of, weights=_stage_sums(k.update, rows, stages), minlength=pipeline)
    return dev_static, dev_act, before, work, update


__all__ = ["CACHE_SIZE", "CLUSTERS", "COSTS", "TIMES", "Costs", "closed_form", "cluster_key"]
