"""``Framework`` presets: each sets the overlap and the gradient precision its source states, and a
``Configuration(framework=...)`` prices a step exactly as the same overlap given by hand."""

from __future__ import annotations

import dataclasses

import chex
import pytest

import diffpipe as dp
from diffpipe._model._transformer import DEFAULT_FLASH_VERSION, attention_kernel
from diffpipe._workload._frameworks import DDP_BUCKET, megatron_bucket

MODEL = dp.Transformer(layers=4, hidden=1024, heads=8, sequence=1024, vocabulary=32000, microbatch_size=2,
                       flash_attention=True)


def _config(par: dp.Parallelism, model: dp.Transformer = MODEL, **kw) -> dp.Configuration:
    cluster = dp.Cluster(gpus=par.gpus, device="H100", devices_per_node=8, intra="nvlink4", inter="ib-ndr")
    return dp.Configuration(model, par, cluster, 8 * model.microbatch_size * par.data, **kw)


def test_presets_overlap_as_their_sources_state():
    par = dp.Parallelism(tensor=2, data=4, zero=1, sequence_parallel=True)
    mega = dp.presets.framework("megatron")
    model = mega.model(MODEL)
    assert model.reduce_bytes == 4  # bf16 gradients reduced in fp32
    o = mega.overlap(model, par)
    assert o.data_bucket == 4 * 40e6 == megatron_bucket(4, 4)  # max(40M, 1M x 4) parameters of 4 bytes
    assert megatron_bucket(64, 2) == 2 * 64e6
    assert o.param_gather and o.prefetch
    assert o.tensor == dp.transformer_engine_tensor_overlap(2) > 0
    # --tp-comm-overlap needs sequence parallelism: without it the tensor collectives stay exposed
    assert mega.overlap(model, dataclasses.replace(par, sequence_parallel=False)).tensor == 0.0

    for name in ("torchtitan", "fsdp"):
        fw = dp.presets.framework(name)
        m = fw.model(MODEL)
        o = fw.overlap(m, dp.Parallelism(data=8, zero=3))
        assert m.reduce_bytes == 4 and o.prefetch and not o.param_gather and o.tensor == 0.0
        assert o.data_bucket == float(dp.layer_costs(m).gradient_bytes[1])  # one block's gradients

    # llm-foundry's MPT blocks are eager PyTorch modules; the other presets' kernels are the fused list
    assert [n for n, fw in dp.presets.FRAMEWORKS.items() if fw.model(MODEL).eager_blocks] == ["fsdp"]
    assert [n for n, fw in dp.presets.FRAMEWORKS.items() if fw.model(MODEL).flat_gradients] == ["fsdp"]

    o = dp.presets.framework("ddp").overlap(MODEL, dp.Parallelism(data=8))
    assert o.data_bucket == DDP_BUCKET == 25 * 2 ** 20

    none = dp.presets.framework("none")
    assert none.model(MODEL) is MODEL
    assert none.overlap(MODEL, par) == dp.CommunicationOverlap()


def test_the_cli_names_are_the_presets():
    from diffpipe._choices import FRAMEWORK_NAMES
    from diffpipe._workload._frameworks import FRAMEWORKS

    assert tuple(FRAMEWORKS) == FRAMEWORK_NAMES
    assert all(FRAMEWORKS[n].name == n for n in FRAMEWORKS)


def test_a_model_that_states_its_reduction_keeps_it():
    pure = dataclasses.replace(MODEL, reduce_bytes=2)  # Composer's PURE mode
    assert dp.presets.framework("fsdp").model(pure).reduce_bytes == 2


def test_one_rule_picks_the_attention_kernel():
    # the model's own generation, else its framework's, else the device's own kernel: the one rule that
    # Transformer.flash_generation, Framework.model and the CLI's settings line all call
    assert attention_kernel(2, 1) == (2, "model")
    assert attention_kernel(None, 1) == (1, "framework")
    assert attention_kernel(None) == attention_kernel(None, None) == (DEFAULT_FLASH_VERSION, "default")
    for stated in (None, 1, 2, 3):
        model = dataclasses.replace(MODEL, flash_version=stated)
        for name in ("none", "megatron", "torchtitan", "fsdp", "ddp"):
            fw = dp.presets.framework(name)
            assert fw.model(model).flash_generation == attention_kernel(stated, fw.flash_version)[0]


def test_megatron_runs_the_devices_own_attention_kernel():
    # Transformer Engine prefers cuDNN's fused attention on Hopper: the megatron preset prices generation 3,
    # unless the model states its own; the other presets leave the model's (the device's own by default)
    mega = dp.presets.framework("megatron")
    assert MODEL.flash_version is None and MODEL.flash_generation == 3
    assert mega.model(MODEL).flash_version == 3
    assert mega.model(dataclasses.replace(MODEL, flash_version=2)).flash_version == 2
    for name in ("none", "torchtitan", "fsdp", "ddp"):
        assert dp.presets.framework(name).model(MODEL).flash_version is None
    par = dp.Parallelism(data=8)
    stated = _config(par, dataclasses.replace(MODEL, flash_version=2), framework="megatron").evaluate()
    preset = _config(par, framework="megatron").evaluate()
    h100 = float(dp.presets.device("H100").kernels.attention_native)
    chex.assert_trees_all_close(stated.breakdown["compute_attention"],
                                h100 * preset.breakdown["compute_attention"], rtol=1e-5)
    chex.assert_trees_all_close(stated.breakdown["compute_gemm"], preset.breakdown["compute_gemm"])


@pytest.mark.parametrize("device, native", [("H100", True), ("A100", False)])
def test_the_default_kernel_is_the_devices_own(device, native):
    # no framework, no stated kernel: generation 3, i.e. Hopper's cuDNN attention; on a device without one
    # (attention_native 1) that is FlashAttention-2's rate
    par = dp.Parallelism(data=8)

    def attention(version):
        model = dataclasses.replace(MODEL, flash_version=version)
        cfg = dp.Configuration(model, par, dp.Cluster(device, gpus=8), global_batch=16)
        return float(cfg.evaluate().breakdown["compute_attention"])

    assert attention(None) == attention(3)
    assert (attention(None) < attention(2)) == native
    assert (attention(None) == attention(2)) == (not native)


@pytest.mark.parametrize("name, par", [
    ("megatron", dp.Parallelism(tensor=2, data=4, zero=1, sequence_parallel=True)),
    ("torchtitan", dp.Parallelism(data=8, zero=3)),
    ("ddp", dp.Parallelism(data=8)),
])
def test_configuration_with_a_framework_equals_the_overlap_given_by_hand(name, par):
    fw = dp.presets.framework(name)
    by_name = _config(par, framework=name).evaluate()
    model = fw.model(MODEL)
    by_hand = _config(par, model, overlap=fw.overlap(model, par)).evaluate()
    chex.assert_trees_all_close((by_name.step_time, by_name.memory_per_gpu),
                                (by_hand.step_time, by_hand.memory_per_gpu))
    nothing = _config(par).evaluate()
    assert by_name.step_time != nothing.step_time  # the framework changed what is priced


def test_bad_frameworks_are_one_clear_error():
    par = dp.Parallelism(data=8)
    with pytest.raises(dp.ConfigError, match="framework must be one of .*'deepspeed'"):
        _config(par, framework="deepspeed")
    with pytest.raises(dp.ConfigError, match="overlap or framework, not both"):
        _config(par, framework="ddp", overlap=dp.CommunicationOverlap())
    with pytest.raises(dp.ConfigError, match="buckets must be one of"):
        dp.Framework("mine", buckets="sometimes")
    with pytest.raises(dp.ConfigError, match="prefetch must be a bool"):
        dp.Framework("mine", prefetch=1)
    with pytest.raises(dp.ConfigError, match="reduce_bytes must be 1, 2, 4 or None"):
        dp.Framework("mine", reduce_bytes=3)
    with pytest.raises(dp.ConfigError, match="flash_version must be 1, 2, 3 or None"):
        dp.Framework("mine", flash_version=4)
    with pytest.raises(dp.ConfigError, match="eager_blocks must be a bool"):
        dp.Framework("mine", eager_blocks="yes")
    with pytest.raises(dp.ConfigError, match="flat_gradients must be a bool"):
        dp.Framework("mine", flat_gradients=1)


def test_a_user_framework_is_accepted():
    mine = dp.Framework("mine", buckets="ddp", reduce_bytes=4)
    assert dp.presets.framework(mine) is mine
    r = _config(dp.Parallelism(data=8), framework=mine).evaluate()
    assert r.step_time > 0


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_fsdp_reduces_every_microbatch_under_its_backward(zero):
    # Composer runs FSDP outside no_sync: every microbatch's backward reduce-scatters its gradients (an all-reduce
    # without ZeRO); all but the last microbatch pay it inside W, the last is the step's sync
    import jax.numpy as jnp
    import numpy as np

    from diffpipe._workload._overlap import hidden_cost

    par = dp.Parallelism(data=8, zero=zero)
    m = 4
    cfg = dp.Configuration(MODEL, par, dp.Cluster(gpus=8, device="H100"), m * MODEL.microbatch_size * 8,
                           framework="fsdp")
    assert cfg.microbatches == m and cfg.overlap.every_microbatch
    exposed = cfg.exposed_collectives()
    n = 8
    params_r = np.asarray(dp.layer_costs(cfg.model).gradient_bytes)  # parameters x reduce_bytes, one device
    bus = cfg.cluster.bus_bandwidth("intra", 8)
    ring, steps = (2, 2 * (n - 1)) if zero == 0 else (1, n - 1)
    seconds = ring * (n - 1) / n * params_r / bus + steps * cfg.cluster.step_latency("intra")
    compute = sum(cfg.compute_seconds().values())
    want = (m - 1) / m * hidden_cost(jnp.asarray(seconds), compute[1] + compute[2], cfg.overlap.contention)
    chex.assert_trees_all_close(exposed["reduce"][2], want, rtol=1e-5)
    assert np.all(np.asarray(exposed["reduce"][:2]) == 0)
    # torchtitan's FSDP2 steps had one microbatch: nothing of the kind
    assert "reduce" not in dp.Configuration(MODEL, par, dp.Cluster(gpus=8, device="H100"), m * 2 * 8,
                                            framework="torchtitan").exposed_collectives()
    # one microbatch: its reduction is the step's sync
    single = dp.Configuration(MODEL, par, dp.Cluster(gpus=8, device="H100"), 2 * 8, framework="fsdp")
    assert "reduce" not in single.exposed_collectives()
    assert cfg.evaluate().breakdown["exposed_reduce"] > 0


# -- the host's dispatch (Framework.host_op_seconds, Framework.optimizer_ops) -----------------------------------
def test_parameter_tensors_are_the_models_parameters():
    """Every parameter of the model is in one tensor of ``parameter_tensors`` (biased models: exactly; without
    biases the model still counts a LayerNorm's ``2h``, the tensors drop its bias: one ``h`` per norm)."""
    import numpy as np

    from diffpipe._model._transformer import parameter_tensors

    gpt = dp.Transformer(layers=3, hidden=256, heads=4, sequence=128, vocabulary=1000, microbatch_size=1)
    llama = dp.Transformer(layers=3, hidden=256, heads=4, sequence=128, vocabulary=1000, microbatch_size=1,
                           norm="rmsnorm", bias=False, activation="swiglu", positions="rotary", tied_embedding=False)
    mpt = dp.Transformer(layers=3, hidden=256, heads=4, sequence=128, vocabulary=1000, microbatch_size=1, bias=False)
    for model in (gpt, llama):
        assert sum(t.sum() for t in parameter_tensors(model)) == model.parameters()
    t = parameter_tensors(mpt)
    assert [len(x) for x in t] == [2, 6, 6, 6, 1]  # wte + wpe; Wqkv, out, up, down, two norms; the final norm
    assert mpt.parameters() - sum(x.sum() for x in t) == (2 * 3 + 1) * 256  # the 7 LayerNorms' biases
    assert np.all(np.concatenate(t) > 0)


def _host_config(framework, device="H100", par=None, model=MODEL):
    par = par or dp.Parallelism(data=8, zero=3)
    return dp.Configuration(model, par, dp.Cluster(gpus=par.gpus, device=device), 2 * model.microbatch_size * par.data,
                            framework=framework)


def test_an_op_takes_the_larger_of_its_kernels_and_the_hosts_dispatch():
    """``max(GPU, host)`` per op (CUDA launches run asynchronously, so the host is behind only where it issues an
    op's kernels slower than the GPU runs them): at a host cost no kernel list beats, every op takes exactly
    kernels x cost; at a cheap one, nothing changes and the ``host`` class is 0."""
    import numpy as np

    base = dp.Framework("eager", buckets="block", prefetch=True)
    slow = dataclasses.replace(base, host_op_seconds=0.05)
    cheap = dataclasses.replace(base, host_op_seconds=1e-9)
    plain = _host_config(base)
    gpu = sum(np.asarray(v) for v in plain.compute_seconds().values())
    cfg = _host_config(slow)
    compute = cfg.compute_seconds()
    count = cfg.costs().kernels.count()
    np.testing.assert_allclose(sum(np.asarray(v) for v in compute.values()), count * 0.05, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(compute["host"]), count * 0.05 - gpu, rtol=1e-4)
    assert "host" not in plain.compute_seconds()
    c = _host_config(cheap)
    assert float(np.max(np.asarray(c.compute_seconds()["host"]))) == 0.0
    assert c.evaluate().breakdown["compute_host"] == 0.0
    assert float(c.evaluate().step_time) == pytest.approx(float(plain.evaluate().step_time), rel=1e-6)
    assert float(cfg.evaluate().step_time) > 10 * float(plain.evaluate().step_time)


def test_an_optimizer_with_a_host_sync_per_parameter_takes_each_tensors_larger_side():
    """A layer's update under ``optimizer_ops``: the sum over its parameter tensors of ``max(ops x host cost, ops x
    kernel overhead + the tensor's share of the layer's traffic)`` (closed form, both regimes), nothing without."""
    import numpy as np

    from diffpipe._model._transformer import parameter_tensors

    base = dp.Framework("eager", buckets="block", prefetch=True)
    plain = _host_config(base)
    gpu = np.asarray(plain.update_seconds(), np.float64)
    overhead = float(plain.cluster.device.kernels.overhead)
    tensors = parameter_tensors(plain.model)
    for cost in (1e-3, 1e-7):  # host-bound, kernel-bound
        fw = dataclasses.replace(base, host_op_seconds=cost, optimizer_ops=10)
        got = np.asarray(_host_config(fw).update_seconds(), np.float64)
        want = [sum(max(10 * cost, 10 * overhead + g * e / t.sum()) for e in t) for g, t in zip(gpu, tensors)]
        np.testing.assert_allclose(got, want, rtol=1e-5)
    host_bound = dataclasses.replace(base, host_op_seconds=1e-3, optimizer_ops=10)
    np.testing.assert_allclose(np.asarray(_host_config(host_bound).update_seconds()),
                               [10 * 1e-3 * len(t) for t in tensors], rtol=1e-5)
    assert np.all(np.asarray(_host_config(dataclasses.replace(base, host_op_seconds=1e-3)).update_seconds()) == gpu)


def test_the_fsdp_preset_prices_composers_optimizer_loop_and_no_other_does():
    from diffpipe._workload._frameworks import COMPOSER_ADAMW_OPS, EAGER_OP_SECONDS

    fsdp = dp.presets.framework("fsdp")
    assert (fsdp.host_op_seconds, fsdp.optimizer_ops) == (EAGER_OP_SECONDS, COMPOSER_ADAMW_OPS) == (4e-6, 10)
    for name in ("none", "megatron", "torchtitan", "ddp"):
        f = dp.presets.framework(name)
        assert (f.host_op_seconds, f.optimizer_ops) == (0.0, 0)


def test_bad_host_costs_are_one_clear_error():
    for kw, match in ((dict(host_op_seconds=-1e-6), "host_op_seconds must be a finite number >= 0"),
                      (dict(host_op_seconds=float("nan")), "host_op_seconds must be a finite number >= 0"),
                      (dict(host_op_seconds=True), "host_op_seconds must be a finite number >= 0"),
                      (dict(host_op_seconds=1e-6, optimizer_ops=2.5), "optimizer_ops must be an int >= 0"),
                      (dict(host_op_seconds=1e-6, optimizer_ops=-1), "optimizer_ops must be an int >= 0"),
                      (dict(optimizer_ops=10), "optimizer_ops=10 needs a host_op_seconds > 0")):
        with pytest.raises(dp.ConfigError, match=match) as err:
            dp.Framework("mine", **kw)
        assert "\n" not in str(err.value)
