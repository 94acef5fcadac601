"""The roofline op-time model: ``Device`` (memory bandwidth, kernel-efficiency curve),
``memory_traffic`` / ``LayerCosts`` bytes, ``LayerCosts.times``, the presets' datasheet bandwidth and
fitted curves, and ``calibrate.fit_kernel_efficiency``."""

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffpipe as dp
from diffpipe._model._transformer import _block_matmuls, memory_traffic
from diffpipe._workload._workload import hardware_from_model

ROOT = Path(__file__).resolve().parents[1]
TINY = dp.Transformer(layers=2, hidden=8, heads=2, sequence=4, vocabulary=16, microbatch_size=3)
MODELS = [TINY, dp.Transformer(layers=2, hidden=64, heads=4, sequence=32, vocabulary=100, recompute="selective",
                               flash_attention=True),
          dp.presets.model("llama-3-8b"), dp.presets.model("mixtral-8x7b"), dp.presets.model("deepseek-v3")]


def test_traffic_of_a_tiny_gpt_by_hand():
    # b=3, s=4, h=8, a=2, V=16, F=32, d=2: T = 12 rows. Matmuls (rows, K, N): QKV (12, 8, 24),
    # output (12, 8, 8), MLP (12, 8, 32) and (12, 32, 8): (M K + K N + M N) = 576 + 256 + 736 + 736.
    gemm = 2 * (576 + 256 + 736 + 736)
    core = 2 * 12 * (8 + 8 + 8 + 8) + 2 * 2 * 3 * 2 * 4 * 4  # Q, K, V, O and the two s x s tensors
    head = 2 * (12 * 8 + 8 * 16 + 12 * 16)
    gather = 3 * 2 * 12 * 8  # word rows read, position rows read, output written
    c = dp.layer_costs(TINY)
    np.testing.assert_array_equal(c.forward_bytes, [gather, gemm + core, gemm + core, head])
    np.testing.assert_array_equal(c.input_grad_bytes, [0, gemm + 2 * core, gemm + 2 * core, head])
    np.testing.assert_array_equal(c.weight_bytes, [gather, gemm, gemm, head])
    np.testing.assert_array_equal(c.tokens, 12)
    full = dp.layer_costs(dp.Transformer(**{**TINY.__dict__, "recompute": "full"}))
    np.testing.assert_array_equal(full.input_grad_bytes[1:-1], c.input_grad_bytes[1:-1] + c.forward_bytes[1:-1])


@pytest.mark.parametrize("model", MODELS)
def test_matmul_list_matches_the_flop_count(model):
    # the matmuls the traffic counts are exactly those whose FLOPs layer_costs counts
    c = dp.layer_costs(model)
    moe = set(model.moe_blocks())
    flops = [sum(2 * model.microbatch_size * r * k * n * m for r, k, n, m in _block_matmuls(model, i in moe))
             for i in range(model.layers)]
    np.testing.assert_allclose(flops, c.weight[1:-1], rtol=1e-12)
    t = memory_traffic(model)["tokens"]
    tokens = model.microbatch_size * model.sequence
    assert t[0] == t[-1] == tokens and np.all(t[1:-1] <= tokens) and np.all(t > 0)
    if not moe:
        np.testing.assert_array_equal(t, tokens)


def test_flat_device_without_bandwidth_is_the_old_model():
    # Device(peak, memory, efficiency): a flat curve and no memory roof, FLOPs / (peak x efficiency)
    c = dp.layer_costs(MODELS[2])
    device = dp.Device(989e12, 80e9, 0.5)
    for flops, seconds in zip((c.forward, c.input_grad, c.weight), c.times(device)):
        np.testing.assert_allclose(seconds, flops / (989e12 * 0.5), rtol=1e-6)
    assert float(device.kernel_efficiency(1.0)) == pytest.approx(0.5)


def test_efficiency_rises_with_tokens_and_saturates():
    h100 = dp.presets.device("H100")
    tokens = jnp.asarray([64.0, 256.0, 1024.0, 4096.0, 65536.0])
    e = np.asarray(h100.kernel_efficiency(tokens))
    assert np.all(np.diff(e) > 0) and e[-1] == pytest.approx(float(h100.efficiency), rel=1e-6)
    assert e[1] == pytest.approx(0.7858 * (1 - np.exp(-256 / 313.7)), rel=1e-5)
    # a block's achieved FLOP/s rises with the microbatch size (the same block, more tokens)
    achieved = []
    for b in (1, 2, 4, 8):
        c = dp.layer_costs(dp.Transformer(layers=2, hidden=2048, heads=16, sequence=128, vocabulary=1000,
                                          microbatch_size=b))
        achieved.append(c.forward[1] / float(c.times(h100)[0][1]))
    assert np.all(np.diff(achieved) > 0) and achieved[-1] < 0.7858 * 989e12


def test_roofline_crossover_memory_bound_at_few_tokens():
    flat = dp.presets.device("H100", efficiency=0.7858)  # the fitted maximum as a flat curve
    regimes = {}
    for s in (4, 4096):
        c = dp.layer_costs(dp.Transformer(layers=1, hidden=4096, heads=32, sequence=s, vocabulary=1000))
        compute = c.forward[1] / (989e12 * 0.7858)
        memory = c.forward_bytes[1] / 3.35e12
        assert float(c.times(flat)[0][1]) == pytest.approx(max(compute, memory), rel=1e-5)
        regimes[s] = memory > compute
    assert regimes == {4: True, 4096: False}  # 4 tokens: reading the weights dominates
    # The fitted curve falls linearly at few tokens (e T / T0), so a matmul's compute term tends to
    # the constant 2 K N T0 / (peak e): for the H100 fit 2 T0 bw / (peak e d) = 1.35 times the
    # weights' read time at the datasheet bandwidth (measured small matmuls reach ~74% of it).
    h100 = dp.presets.device("H100")
    c = dp.layer_costs(dp.Transformer(layers=1, hidden=4096, heads=32, sequence=1, vocabulary=1000))
    compute = c.forward[1] / (989e12 * float(h100.kernel_efficiency(1.0)))
    memory = c.forward_bytes[1] / 3.35e12
    assert compute / memory == pytest.approx(2 * 313.7 * 3.35e12 / (989e12 * 0.7858 * 2), rel=0.02)
    assert float(c.times(h100)[0][1]) == pytest.approx(compute, rel=1e-5)
    # the embedding has no FLOPs: always at the memory roof
    c = dp.layer_costs(TINY)
    assert float(c.times(h100)[0][0]) == pytest.approx(c.forward_bytes[0] / 3.35e12, rel=1e-6)


def test_microbatch_size_has_an_interior_optimum():
    # global batch 64 on 8 stages of 1F1B: bigger microbatches run better kernels but fill fewer
    # microbatches into the pipeline (bubble (D-1)/(N+D-1)); the step is fastest in between
    net = dp.presets.network("nvlink4")
    step = {}
    for b in (1, 2, 4, 8, 16):
        model = dp.Transformer(layers=16, hidden=2048, heads=16, sequence=256, vocabulary=32000, microbatch_size=b)
        hw = dp.hardware_from_model(model, dp.presets.device("H100"), net, stages=8)
        step[b] = float(dp.simulate(dp.schedules.get("1f1b", devices=8, microbatches=64 // b), hw).makespan)
    best = min(step, key=step.get)
    assert best not in (1, 16), step
    assert step[best] < 0.95 * step[1] and step[best] < 0.95 * step[16], step


def test_gradients_wrt_the_curve_and_bandwidth_match_finite_differences():
    model = dp.Transformer(layers=4, hidden=1024, heads=8, sequence=64, vocabulary=8000, microbatch_size=2)
    g = dp.compile(dp.schedules.get("1f1b", devices=2, microbatches=4))
    with jax.enable_x64(True):
        net = dp.presets.network("nvlink4")

        def step(x):
            device = dp.Device(989e12, 80e9, x[0], x[1], x[2])
            return dp.makespan(g, hardware_from_model(model, device, net, stages=2))

        x = jnp.asarray([0.75, 3.0e12, 300.0])
        grad = np.asarray(jax.grad(step)(x))
        for i, h in enumerate((1e-6, 1e6, 1e-3)):
            e = jnp.zeros(3).at[i].set(h)
            fd = (step(x + e) - step(x - e)) / (2 * h)
            np.testing.assert_allclose(grad[i], fd, rtol=1e-5)
        assert grad[0] < 0 and grad[1] < 0 and grad[2] > 0  # the embedding sits at the memory roof
        # vmap over the curve parameter
        batch = jax.vmap(lambda t0: step(jnp.stack([x[0], x[1], t0])))(jnp.asarray([0.0, 300.0, 1000.0]))
        assert np.all(np.diff(np.asarray(batch)) > 0)


def test_presets_carry_datasheet_bandwidth_and_their_curve():
    for name, spec in dp.presets.DEVICES.items():
        d = dp.presets.device(name)
        assert float(d.memory_bandwidth) == pytest.approx(spec.memory_bandwidth, rel=1e-6)
        maximum, tokens = (0.5, 0.0) if spec.curve is None else spec.curve
        assert (float(d.efficiency), float(d.saturation_tokens)) == pytest.approx((maximum, tokens), rel=1e-6)
    for name, bandwidth in (("A100", 2039e9), ("H100", 3.35e12), ("H200", 4.8e12), ("B200", 8e12),
                            ("MI300X", 5.3e12), ("TPU-v5e", 819e9)):
        assert float(dp.presets.device(name).memory_bandwidth) == pytest.approx(bandwidth)
    flat = dp.presets.device("H100", efficiency=0.4)  # a constant efficiency: the flat curve, bandwidth kept
    assert float(flat.saturation_tokens) == 0.0 and float(flat.kernel_efficiency(8.0)) == pytest.approx(0.4)
    assert float(flat.memory_bandwidth) == pytest.approx(3.35e12)
    same = dp.presets.device("H100").flat(0.4)  # the CLI's machine-file efficiency= on a base device
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(a == b), same, flat)) and same.name == flat.name


def _fit_study():
    spec = importlib.util.spec_from_file_location("kernel_efficiency_fit", ROOT / "papers/kernel-efficiency/fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("preset", ["H100", "B200"])
def test_preset_curves_are_the_fit_of_the_published_table(preset):
    study = _fit_study()
    key = {v: k for k, v in study.DEVICES.items()}[preset]
    spec = dp.presets.DEVICES[preset]
    base = dp.Device(spec.peak_flops, spec.memory, memory_bandwidth=spec.memory_bandwidth)
    m, flops, seconds, traffic = study.rows(key)
    assert m.tolist() == [256, 512, 1024, 2048, 4096]
    fitted = dp.calibrate.fit_kernel_efficiency(m, flops, seconds, base, bytes=traffic)
    assert (float(fitted.efficiency), float(fitted.saturation_tokens)) == pytest.approx(spec.curve, abs=1e-4,
                                                                                          rel=1e-3)
    committed = json.loads((ROOT / "papers/kernel-efficiency/fit.json").read_text())[preset]
    assert (committed["efficiency"], committed["saturation_tokens"]) == spec.curve


def test_fit_recovers_a_known_curve_with_memory_bound_points():
    with jax.enable_x64(True):
        true = dp.Device(989e12, 80e9, 0.7, 3.35e12, 100.0)  # T0 small enough for a memory roof
        tokens = np.asarray([16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0])
        k = n = 4096.0
        flops, traffic = 2 * tokens * k * n, 2 * (tokens * k + k * n + tokens * n)
        seconds = np.asarray(true.seconds(flops, traffic, tokens))
        np.testing.assert_allclose(seconds[:3], traffic[:3] / 3.35e12)  # the smallest points are memory-bound
        base = dp.Device(989e12, 80e9, memory_bandwidth=3.35e12, name="probe")
        fitted = dp.calibrate.fit_kernel_efficiency(tokens, flops, seconds, base, bytes=traffic)
    assert float(fitted.efficiency) == pytest.approx(0.7, rel=1e-4)
    assert float(fitted.saturation_tokens) == pytest.approx(100.0, rel=1e-4)
    assert fitted.name == "probe" and float(fitted.memory_bandwidth) == pytest.approx(3.35e12)


@pytest.mark.parametrize(("call", "culprit"), [
    (lambda: dp.Device(1e15, 80e9, memory_bandwidth=0.0), "memory_bandwidth"),
    (lambda: dp.Device(1e15, 80e9, saturation_tokens=-1.0), "saturation_tokens"),
    (lambda: dp.calibrate.fit_kernel_efficiency([512, 512], [1e12, 2e12], [1e-3, 2e-3], dp.Device(1e15, 8e10)),
     "two or more token counts"),
    (lambda: dp.calibrate.fit_kernel_efficiency([1, 2], [1e12], [1e-3, 2e-3], dp.Device(1e15, 8e10)), "one of each"),
    (lambda: dp.calibrate.fit_kernel_efficiency([1, 2], [1e12, 0.0], [1e-3, 2e-3], dp.Device(1e15, 8e10)), "flops"),
    (lambda: dp.calibrate.fit_kernel_efficiency([1, 2], [1e12, 1e12], [1e-3, 2e-3], "H100"), "Device"),
])
def test_errors_name_the_culprit(call, culprit):
    with pytest.raises(dp.ConfigError, match=culprit) as err:
        call()
    assert "\n" not in str(err.value)
