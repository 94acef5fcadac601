"""Configuration: a model x parallelism x cluster x global batch simulated as one step, checked
against hand arithmetic (the step of a small TP x PP x DP case, tokens/s/GPU, MFU), finite
differences, and one compilation per structure."""

from __future__ import annotations

import contextlib
import json
import logging
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffpipe as dp
from diffpipe._machine._cluster import Cluster
from diffpipe._workload._parallelism import Parallelism

H, S, V, B = 256, 128, 32000, 2  # hidden, sequence, vocabulary, microbatch size
PEAK, EFF, MEMBW = 1e14, 0.5, 1e12
BW, LAT = 1e10, 5e-7  # the intra-node link


def gpt(layers=2, **kw):
    return dp.Transformer(layers=layers, hidden=H, heads=8, sequence=S, vocabulary=V, microbatch_size=B, **kw)


def cluster(gpus=8, **kw):
    kw = {"devices_per_node": 8, "intra": (BW, LAT), "inter": (BW / 10, 5 * LAT), "memory_bandwidth": MEMBW, **kw}
    return Cluster(dp.Device(PEAK, 80e9, EFF, name="test"), gpus=gpus, **kw)


def config(model=None, par=None, clu=None, batch=16, **kw):
    par = Parallelism(tensor=2, pipeline=2, data=2) if par is None else par
    return dp.Configuration(gpt() if model is None else model, par, cluster(par.gpus) if clu is None else clu,
                            batch, **kw)


def hand_stages(t=2, full=False):
    """Per-stage (forward, backward) seconds of ``gpt()`` split [embedding, block] | [block, head]
    under tensor parallelism ``t``, by hand: GPT FLOPs (Narayanan et al. SC'21 §5.1) over t, plus
    the Megatron all-reduces of the d b s h activation on the intra link, plus the embedding's
    memory-bound gather (``memory_traffic``: ``3 d b s h`` bytes with learned positions, in F and
    again as the scatter-add in W) over the device's memory bandwidth, split by t."""
    thr = PEAK * EFF
    m, a = 24 * B * S * H * H, 4 * B * S * S * H  # block weight matmuls, attention core
    head = 2 * B * S * H * V
    x = 2 * B * S * H
    ring = 2 * (t - 1) / t * x / BW + 2 * (t - 1) * LAT
    block_f, block_b = (m + a) / t / thr, (2 * m + 2 * a + (m + a if full else 0)) / t / thr
    gather = 3 * x / t / MEMBW
    f0 = block_f + (2 + 1) * ring + gather  # the block's two all-reduces, the vocabulary-parallel embedding's one
    b0 = block_b + (4 if full else 2) * ring + gather
    f1 = block_f + head / t / thr + 2 * ring
    b1 = block_b + 2 * head / t / thr + (4 if full else 2) * ring + ring  # the head's input gradient
    return f0, b0, f1, b1


def test_sizes_and_schedule():
    cfg = config(batch=16)
    assert cfg.microbatches == 4
    s = cfg.schedule()
    assert (s.family, s.devices, s.microbatches) == ("1f1b", 2, 4)
    m = gpt(layers=4)
    par = Parallelism(tensor=2, pipeline=2, data=2, virtual=2)
    s = config(m, par).schedule()
    assert (s.family, s.stages, dict(s.options)["chunks"]) == ("interleaved-1f1b", 4, 2)
    zb = config(m, Parallelism(pipeline=2, virtual=2), clu=cluster(2), batch=8, schedule="zb-h1")
    assert zb.schedule().stages == 4
    assert config(gpt(layers=4), Parallelism(pipeline=2, virtual=2), clu=cluster(2), batch=8,
                  schedule="zb-v").schedule().stages == 4


@pytest.mark.parametrize("kwargs, culprit", [
    (dict(batch=10), "global_batch=10 is not a multiple of microbatch_size x data = 2 x 2 = 4"),
    (dict(par=Parallelism(tensor=3, pipeline=1, data=2), clu=cluster(6)), "tensor=3 must divide the model's heads"),
    (dict(par=Parallelism(tensor=2, pipeline=2, data=2), clu=cluster(16)), "= 8, but the cluster has 16 GPUs"),
    (dict(schedule="no-such-family"), "no-such-family"),
    (dict(options={"chunks": 2}), "chunks comes from parallelism.virtual"),
    (dict(batch=0), "global_batch"),
    (dict(layers_per_stage=(1, 1, 0)), "layers_per_stage has 3 entries"),
    (dict(layers_per_stage=(1, 2)), "sums to 3, the model has 2 layers"),
])
def test_configuration_rejects(kwargs, culprit):
    with pytest.raises((dp.ConfigError, dp.ScheduleError), match=culprit) as info:
        config(**kwargs)
    assert "\n" not in str(info.value)


def test_embedding_and_head_alone_on_their_stages():
    """A stage may hold the embedding or the head alone (0 blocks: Megatron's layout "E|t|t|L"), so a
    pipeline can have up to blocks + 2 stages, as ``stage_of_layers`` allows."""
    par = Parallelism(tensor=1, pipeline=4, data=2)
    alone = config(gpt(layers=2), par, cluster(8), layers_per_stage=(0, 1, 1, 0)).evaluate()
    assert alone.fits and alone.step_time > 0
    with pytest.raises(dp.ConfigError, match="give layers_per_stage with the embedding or head alone"):
        config(gpt(layers=2), par, cluster(8)).schedule()


def test_layers_per_stage_moves_blocks():
    even = config(gpt(layers=4)).evaluate()
    uneven = config(gpt(layers=4), layers_per_stage=(3, 1)).evaluate()
    assert uneven.memory[0] > even.memory[0] and uneven.step_time != even.step_time


def test_family_stages_must_match_virtual():
    with pytest.raises(dp.ConfigError, match="zb-v places 4 stages on 2 devices; set virtual=2"):
        config(gpt(4), Parallelism(pipeline=2), clu=cluster(2), batch=8, schedule="zb-v").schedule()
    with pytest.raises(dp.ConfigError, match="1f1b places 2 stages on 2 devices; set virtual=1"):
        config(gpt(4), Parallelism(pipeline=2, virtual=2), clu=cluster(2), batch=8, schedule="1f1b").schedule()


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_tp_pp_dp_step_is_the_pipeline_step_plus_the_blocking_collectives(recompute):
    # 1F1B on 2 stages, the second the bottleneck (it holds the LM head): device 1 runs its
    # forwards and backwards back to back, so its last backward ends at f0 + c + m (f1 + b1) and
    # device 0's at c + b0 later, with c the boundary transfer (1/t of the activation per rank,
    # Megatron's scatter/gather) on the intra link; f and b include the blocking TP collectives.
    full = recompute == "full"
    cfg = config(gpt(recompute=recompute), batch=16)
    m = cfg.microbatches
    f0, b0, f1, b1 = hand_stages(full=full)
    assert f1 + b1 > 2 * f0 + b0 + 0.1 * (f1 + b1)  # the premise: stage 1 bounds the pipeline
    c = LAT + 2 * B * S * H / 2 / BW
    t1 = f0 + c + m * (f1 + b1)  # device 1's last backward ends
    t0 = t1 + c + b0
    # then each device's gradient sync (ring all-reduce over the data group, on its sync lane) and
    # optimizer step (Adam's memory traffic over the memory bandwidth): docs/architecture.md, gradient sync
    t, n = 2, 2
    block = 12 * H * H + 13 * H
    params = [((V + S) * H + block) / t, (block + V * H + 2 * H) / t]  # per device: stage 0, stage 1 (tied copy)
    sync = [2 * (n - 1) / n * 2 * p / BW + 2 * (n - 1) * LAT for p in params]  # the data group is in the node
    update = [2 * (12 + 2) * p / MEMBW for p in params]
    expected = max(t0 + sync[0] + update[0], t1 + sync[1] + update[1])
    r = cfg.evaluate()
    assert r.gradient_sync
    assert r.step_time == pytest.approx(expected, rel=1e-5)
    assert r.step_time > t0  # the sync tail is not hidden: nothing runs after the last backward


def test_schedules_with_their_own_sync_compile_without_the_lane():
    r = config(gpt(layers=4), schedule="chimera", options={"sync": True}).evaluate()
    assert not r.gradient_sync and r.step_time > 0
    assert config().evaluate().gradient_sync


def test_tokens_per_second_and_mfu_definitions():
    model = gpt(layers=4, recompute="full")
    par = Parallelism(tensor=2, pipeline=2, data=2)
    cfg = config(model, par, batch=32)
    r = cfg.evaluate()
    batch, layers = 32, 4
    assert r.tokens_per_second_per_gpu == pytest.approx(batch * S / r.step_time / 8)
    # model FLOPs of one iteration (Narayanan et al. SC'21, eq. 3 without recomputation, the
    # PaLM / Korthikanti et al. §6.3 definition): 72 B s l h^2 (1 + s/(6h) + V/(12 h l))
    flops = 72 * batch * S * layers * H * H * (1 + S / (6 * H) + V / (12 * H * layers))
    assert r.mfu == pytest.approx(flops / (r.step_time * 8 * PEAK), rel=1e-6)
    assert 0 < r.mfu < EFF  # recomputation, collectives and the bubble cost utilisation
    assert r.gpus == 8 and r.microbatches == 8 and r.family == "1f1b"
    assert 0 < r.bubble_ratio < 1 and 0 < r.communication_share < 1
    data = json.loads(r.to_json())
    assert data["step_time"] == pytest.approx(r.step_time) and "result" not in data


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_memory_per_gpu_is_zero_static_plus_activations(zero):
    cfg = config(par=Parallelism(tensor=2, pipeline=2, data=2, zero=zero))
    r = cfg.evaluate()
    costs = cfg.costs()
    per = {0: 16, 1: 4 + 12 / 2, 2: 2 + 14 / 2, 3: 16 / 2}[zero]
    static = [per * costs.parameters[:2].sum(), per * costs.parameters[2:].sum()]
    in_flight = [2, 1]  # 1F1B: device d holds D - d microbatches
    acts = [costs.activation_bytes[:2].sum(), costs.activation_bytes[2:].sum()]
    expected = [s + k * a for s, k, a in zip(static, in_flight, acts)]
    np.testing.assert_allclose(r.memory, expected, rtol=1e-6)
    assert r.memory_per_gpu == pytest.approx(max(expected), rel=1e-6)
    assert r.capacity == 80e9 and r.fits


def test_does_not_fit():
    r = config(clu=Cluster(dp.Device(PEAK, 1e6, EFF), gpus=8, intra=(BW, LAT), inter=(BW, LAT),
                           memory_bandwidth=MEMBW)).evaluate()
    assert not r.fits and r.memory_per_gpu > r.capacity


def _leaves(clu):
    return [clu.intra_bandwidth, clu.intra_latency, clu.device.memory_bandwidth, clu.device.efficiency,
            clu.inter_bandwidth]


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_makespan_gradients_match_finite_differences(schedule):
    with jax.enable_x64(True):
        par = Parallelism(tensor=2, pipeline=2, data=2, zero=3)
        base = cluster(8, inter=(BW / 10, 5 * LAT))
        cfg = config(gpt(layers=4), par, base, schedule=schedule)
        graph = cfg.graph()

        def step(values):
            clu = eqx.tree_at(_leaves, base, list(values))
            return dp.makespan(graph, dp.Configuration(cfg.model, par, clu, 16, schedule=schedule).hardware())

        x = jnp.asarray([float(v) for v in _leaves(base)])
        grad = jax.grad(step)(x)
        for i in range(x.shape[0]):
            h = 1e-6 * x[i]
            fd = (step(x.at[i].add(h)) - step(x.at[i].add(-h))) / (2 * h)
            assert float(grad[i]) == pytest.approx(float(fd), rel=1e-4, abs=1e-12), i
        assert float(grad[0]) < 0 and float(grad[1]) > 0 and float(grad[3]) < 0  # faster link, device: shorter


@contextlib.contextmanager
def count_compilations():
    count = [0]

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            count[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield count
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


@contextlib.contextmanager
def compiled_programs():
    """The names of the XLA programs compiled inside (``jax.log_compiles``' records)."""
    names: list[str] = []

    class Listen(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            if message.startswith("Compiling "):
                names.append(message.split()[1])

    handler, logger = Listen(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            yield names
    finally:
        logger.removeHandler(handler)


#: What a concrete ``Configuration.evaluate`` may compile: the simulator, the stage fields
#: (``Workload.stage_fields``) and, with gradient buckets, the stage sums of ``sync_scale`` (XLA's dot).
SET_UP_PROGRAMS = {"jit(_simulate_graph)", "jit(_fields_at)", "jit(matmul)"}


@pytest.mark.parametrize("framework, layers", [("megatron", 37), ("fsdp", 41), (None, 43)])
def test_concrete_cost_side_runs_no_eager_jax(framework, layers):
    # layer counts and shapes no other test uses, so that an eager operation could not hide behind
    # a program an earlier test compiled; context parallelism for the ring, MoE for the expert terms
    model = dp.Transformer(layers=layers, hidden=320, heads=10, sequence=1280, vocabulary=31000, flash_attention=True,
                           flash_version=3 if framework is None else None, experts=4, experts_per_token=2,
                           activation="swiglu", positions="rotary")
    par = Parallelism(tensor=2, pipeline=2, data=2, context=2, expert=2, zero=3 if framework == "fsdp" else 1,
                      sequence_parallel=True)
    cfg = dp.Configuration(model, par, Cluster("H100", gpus=16), 16, framework=framework)
    with compiled_programs() as names:
        tables = [*cfg.compute_seconds().values(), *cfg.exposed_collectives().values(), cfg.update_seconds()]
        result = cfg.evaluate()
    assert math.isfinite(result.step_time)
    assert set(names) <= SET_UP_PROGRAMS, sorted(set(names) - SET_UP_PROGRAMS)
    assert all(type(t) is np.ndarray and t.dtype == np.float32 for t in tables)
    assert names.count("jit(_simulate_graph)") <= 1


def test_new_values_do_not_recompile():
    model = gpt(layers=4)
    par = Parallelism(tensor=2, pipeline=2, data=2, virtual=2, zero=1, sequence_parallel=True)
    config(model, par).evaluate()  # compiles once for this structure
    with count_compilations() as count:
        other = Cluster(dp.Device(2 * PEAK, 40e9, 0.4), gpus=8, intra=(BW * 3, LAT / 2), inter=(BW, LAT),
                        memory_bandwidth=MEMBW * 2)
        r = config(model, par, other).evaluate()
        math.isfinite(r.step_time)
    assert count[0] == 0


def test_evaluate_with_jitter_samples_the_step():
    cfg = config(par=Parallelism(tensor=2, pipeline=2, data=2))
    plain = cfg.evaluate()
    assert plain.expected_step_time is None and "jitter" not in plain.breakdown
    # no randomness: every sample is the deterministic step
    still = cfg.evaluate(jitter=dp.Jitter(0.0), samples=8)
    assert still.expected_step_time == pytest.approx(plain.step_time, rel=1e-6)
    assert still.breakdown["jitter"] == pytest.approx(0.0, abs=1e-6 * plain.step_time)
    noisy = cfg.evaluate(jitter=dp.Jitter(0.1), samples=64, seed=3)
    assert noisy.step_time == plain.step_time  # the deterministic figures are kept
    assert plain.step_time < noisy.expected_step_time <= noisy.p95_step_time
    assert noisy.breakdown["jitter"] == pytest.approx(noisy.expected_step_time - plain.step_time)
    again = cfg.evaluate(jitter=dp.Jitter(0.1), samples=64, seed=3)
    assert again.expected_step_time == noisy.expected_step_time  # the seed fixes the samples
    # lock-step tensor ranks and data-parallel replicas: the slowest of more draws lasts longer
    wider = config(par=Parallelism(tensor=8, pipeline=1, data=1), clu=cluster(8))
    narrow = config(par=Parallelism(tensor=1, pipeline=1, data=1), clu=cluster(1))
    excess = [c.evaluate(jitter=dp.Jitter(0.1), samples=256).breakdown["jitter"] / c.evaluate().step_time
              for c in (narrow, wider)]
    assert excess[1] > excess[0]
    json.loads(noisy.to_json())


@pytest.mark.parametrize("bad, culprit", [(dict(jitter=0.1), "jitter must be a dp.Jitter"),
                                          (dict(jitter=dp.Jitter(0.1), samples=0), "samples"),
                                          (dict(jitter=dp.Jitter(0.1), seed=-1), "seed")])
def test_evaluate_refuses_bad_jitter_arguments(bad, culprit):
    with pytest.raises(dp.ConfigError, match=culprit):
        config().evaluate(**bad)


def test_communication_may_be_a_mode_object():
    # a calibrated machine's mode (torch's runtime over gloo) prices a configuration too; a built-in mode
    # given as its object equals its name, and anything else is refused in one line
    from diffpipe._engine._communication import MODES
    from diffpipe.calibrate import TorchRuntime

    by_name = config(communication="blocking").evaluate()
    by_object = config(communication=MODES["blocking"]()).evaluate()
    assert by_object.step_time == by_name.step_time
    assert math.isfinite(config(communication=TorchRuntime()).evaluate().step_time)
    with pytest.raises(dp.ConfigError, match="communication must be a mode name or an AbstractCommunication"):
        config(communication=3)
