"""The transformer cost model (``layer_costs``, ``hardware_from_model``) and the presets."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffpipe as dp
from diffpipe._model._transformer import stage_of_layers
from diffpipe._workload._workload import hardware_from_model

TINY = dp.Transformer(layers=2, hidden=8, heads=2, sequence=4, vocabulary=16, microbatch_size=3)
SMALL = dp.Transformer(layers=8, hidden=1024, heads=16, sequence=1024, vocabulary=50304, microbatch_size=1)
# GPT-3 175B (Brown et al. 2020): 175e9 parameters, 16 bytes each, cannot fit in 4 x 80 GB.
HUGE = dp.Transformer(layers=96, hidden=12288, heads=96, sequence=2048, vocabulary=50304, microbatch_size=1)


def test_tiny_model_by_hand():
    # b=3, s=4, h=8, a=2, V=16: b s h = 96, b s h^2 = 768, b s^2 h = 384.
    c = dp.layer_costs(TINY)
    assert c.forward.shape == (4,)  # embedding, 2 blocks, head
    np.testing.assert_array_equal(c.forward, [0, 24 * 768 + 4 * 384, 24 * 768 + 4 * 384, 2 * 96 * 16])
    np.testing.assert_array_equal(c.input_grad, [0, 24 * 768 + 8 * 384, 24 * 768 + 8 * 384, 2 * 96 * 16])
    np.testing.assert_array_equal(c.weight, [0, 24 * 768, 24 * 768, 2 * 96 * 16])
    np.testing.assert_array_equal(c.parameters, [(16 + 4) * 8, 12 * 64 + 13 * 8, 12 * 64 + 13 * 8, 16 * 8 + 2 * 8])
    np.testing.assert_array_equal(c.static_bytes, 16 * c.parameters)
    np.testing.assert_array_equal(c.gradient_bytes, 2 * c.parameters)
    # Korthikanti et al.: s b h (34 + 5 a s / h) per block; 4 s b h (1 + V/h) for the output layer
    np.testing.assert_array_equal(c.activation_bytes, [96, 96 * (34 + 5 * 2 * 4 / 8), 96 * (34 + 5 * 2 * 4 / 8),
                                                       4 * 96 * (1 + 16 / 8)])
    np.testing.assert_array_equal(c.output_bytes, [2 * 96, 2 * 96, 2 * 96, 0])
    assert c.shared_parameters == 16 * 8


def test_recomputation():
    plain = dp.layer_costs(TINY)
    again = dp.layer_costs(dp.Transformer(**{**TINY.__dict__, "recompute": True}))
    np.testing.assert_array_equal(again.forward, plain.forward)
    np.testing.assert_array_equal(again.weight, plain.weight)
    np.testing.assert_array_equal(again.input_grad[1:-1], plain.input_grad[1:-1] + plain.forward[1:-1])
    np.testing.assert_array_equal(again.activation_bytes[1:-1], 2 * 96)  # only the block input
    assert again.input_grad[-1] == plain.input_grad[-1] and again.activation_bytes[-1] == plain.activation_bytes[-1]


@pytest.mark.parametrize("model", [TINY, SMALL, HUGE])
def test_totals_match_megatron(model):
    B, s, l, h, V = model.microbatch_size, model.sequence, model.layers, model.hidden, model.vocabulary
    c = dp.layer_costs(model)
    total = c.forward.sum() + c.input_grad.sum() + c.weight.sum()
    np.testing.assert_allclose(total, 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * h * l)), rtol=1e-12)
    np.testing.assert_allclose(c.forward.sum(), total / 3, rtol=1e-12)
    rc = dp.layer_costs(dp.Transformer(**{**model.__dict__, "recompute": True}))
    total = rc.forward.sum() + rc.input_grad.sum() + rc.weight.sum()
    np.testing.assert_allclose(total, 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h)), rtol=1e-12)
    # unique parameters (without the tied copy and the final layer norm), Narayanan et al. §5.1
    unique = c.parameters.sum() - c.shared_parameters - 2 * h
    np.testing.assert_allclose(unique, 12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h)), rtol=1e-12)


def test_gpt3_parameter_count():
    c = dp.layer_costs(HUGE)
    assert 174e9 < c.parameters.sum() - c.shared_parameters < 176e9


def _hw(model=SMALL, **kw):
    if "layers_per_stage" not in kw:
        kw.setdefault("stages", 4)
    return dp.hardware_from_model(model, dp.presets.device("H100"), dp.presets.network("nvlink4"), **kw)


@pytest.mark.parametrize("split", [{"stages": 4}, {"stages": 3}, {"layers_per_stage": [0, 4, 4, 0]},
                                   {"layers_per_stage": [1, 3, 3, 1]}, {"stages": 1}])
def test_stage_sums_equal_model_totals(split):
    c = dp.layer_costs(SMALL)
    hw = _hw(**split)
    # the per-layer roofline times of the H100 preset (tests/test_roofline.py checks them)
    for stage, layer in zip((hw.forward, hw.input_grad, hw.weight), c.times(dp.presets.device("H100"))):
        np.testing.assert_allclose(np.sum(stage), np.sum(layer), rtol=1e-5)
    np.testing.assert_allclose(np.sum(hw.activation_bytes), c.activation_bytes.sum(), rtol=1e-6)
    one_stage = hw.static_bytes.shape == (1,)
    held = c.parameters.sum() - (c.shared_parameters if one_stage else 0.0)  # the tied copy
    np.testing.assert_allclose(np.sum(hw.static_bytes), 16 * held, rtol=1e-6)
    np.testing.assert_allclose(np.sum(hw.gradient_bytes), 2 * held, rtol=1e-6)
    boundary = 2 * SMALL.sequence * SMALL.hidden * SMALL.microbatch_size
    np.testing.assert_allclose(hw.message_bytes, [0.0] + [boundary] * (hw.forward.shape[0] - 1))


def test_uneven_first_and_last_stages():
    np.testing.assert_array_equal(stage_of_layers(SMALL, stages=3), [0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(stage_of_layers(SMALL, layers_per_stage=[0, 8]), [0, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    hw = _hw(stages=4)
    f, static, act = (np.asarray(x) for x in (hw.forward, hw.static_bytes, hw.activation_bytes))
    # the embedding costs no FLOPs: only its gather's bytes at the memory bandwidth
    gather = dp.layer_costs(SMALL).forward_bytes[0] / 3.35e12
    assert f[0] == pytest.approx(f[1] + gather, rel=1e-5) and f[1] == pytest.approx(f[2])
    assert f[3] > 1.5 * f[1]  # the LM head (V = 50304 >> h) dominates the last stage
    assert static[0] > 3 * static[1] and static[3] > 3 * static[1]  # word embedding and its tied copy
    assert act[3] > act[1]  # fp32 logits
    alone = _hw(layers_per_stage=[0, 4, 4, 0])
    assert float(alone.forward[0]) == pytest.approx(gather, rel=1e-5) and float(alone.forward[3]) > f[1]


def test_simulate_1f1b_fits_small_not_huge():
    s = dp.schedules.get("1f1b", devices=4, microbatches=8)
    small = dp.simulate(s, _hw(SMALL))
    assert float(small.makespan) > 0 and bool(np.all(small.fits))
    hw = _hw(SMALL)
    per_microbatch = float(jnp.max(hw.forward + hw.input_grad + hw.weight))
    assert float(small.makespan) >= 8 * per_microbatch  # the slowest stage runs every microbatch
    assert np.all(np.asarray(small.peak_memory) <= 80e9)
    huge = dp.simulate(s, _hw(HUGE))
    assert not bool(np.any(huge.fits))
    sized = _hw(SMALL, microbatches=8, size=0.5)  # microbatches= gives per-microbatch sizes
    assert sized.size.shape == (8,) and float(sized.size[3]) == 0.5


def test_differentiable_and_vmappable():
    s = dp.schedules.get("1f1b", devices=4, microbatches=8)
    with jax.enable_x64(True):
        net = dp.presets.network("nvlink4")
        g = dp.compile(s)

        def step(efficiency, bandwidth):
            device = dp.Device(989e12, 80e9, efficiency)
            network = dp.Network(net.latency, bandwidth, net.inter_latency, bandwidth)
            return dp.makespan(g, hardware_from_model(SMALL, device, network, stages=4))

        e, bw = jnp.asarray(0.5), jnp.asarray(450e9)
        de, dbw = jax.grad(step, argnums=(0, 1))(e, bw)
        assert np.isfinite(de) and de < 0 and np.isfinite(dbw) and dbw <= 0
        batch = jax.vmap(lambda x: step(x, bw))(jnp.asarray([0.5 - 1e-6, 0.5 + 1e-6, 0.25, 0.5, 1.0]))
        np.testing.assert_allclose(de, (batch[1] - batch[0]) / 2e-6, rtol=1e-5)  # central difference
        assert np.all(np.diff(batch[2:]) < 0)


def test_presets():
    names = dp.presets.preset_names()
    assert {"A100", "H100", "H200"} <= set(names["devices"])
    assert {"nvlink3", "nvlink4", "ib-ndr", "100gbe"} <= set(names["networks"])
    h200 = dp.presets.device("h200", efficiency=0.4)
    assert float(h200.memory) == pytest.approx(143_771 * 2**20) and h200.name == "H200"  # nvidia-smi's MiB
    assert float(h200.efficiency) == pytest.approx(0.4)
    assert float(dp.presets.device("A100").peak_flops) == pytest.approx(312e12)
    two = dp.presets.network("NVLink4", "InfiniBand NDR")
    assert float(two.bandwidth) == pytest.approx(450e9) and float(two.inter_bandwidth) == pytest.approx(50e9)
    assert not hasattr(two, "mode") and not hasattr(two, "devices_per_node")  # the graph's, both
    one = dp.presets.network("nvlink3")
    assert float(one.inter_bandwidth) == float(one.bandwidth)  # no inter link given: intra between nodes too


def test_import_stays_light():
    code = ("import sys, diffpipe; diffpipe.presets.preset_names(); "
            "assert 'jax' not in sys.modules, 'jax imported'; print(diffpipe.Transformer)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("call", "culprit"), [
    (lambda: dp.presets.device("V100"), "known: A100, H100, H200"),
    (lambda: dp.presets.network("nvlink4", "carrier-pigeon"), "carrier-pigeon"),
    (lambda: dp.presets.device("H100", efficiency=1.5), "efficiency"),
    (lambda: dp.Device(-1.0, 80e9), "peak_flops"),
    (lambda: dp.Transformer(layers=0, hidden=8, heads=2, sequence=4, vocabulary=16), "layers"),
    (lambda: dp.Transformer(layers=2, hidden=8.5, heads=2, sequence=4, vocabulary=16), "hidden"),
    (lambda: dp.Transformer(layers=2, hidden=8, heads=2, sequence=4, vocabulary=16, ffn_multiplier=0), "ffn"),
    (lambda: dp.layer_costs("gpt"), "Transformer"),
    (lambda: _hw(stages=None), "stages"),
    (lambda: _hw(stages=2, layers_per_stage=[4, 4]), "exactly one"),
    (lambda: _hw(stages=9), "stages=9"),
    (lambda: _hw(layers_per_stage=[4, 3]), "sums to 7"),
    (lambda: _hw(layers_per_stage=[4, 0, 4]), "middle"),
    (lambda: _hw(microbatches=0), "microbatches"),
    (lambda: _hw(microbatches=4, size=[1.0, 2.0]), "size"),
    (lambda: dp.hardware_from_model(SMALL, dp.presets.device("H100"), "nvlink4", stages=2), "Network"),
])
def test_errors_are_one_line(call, culprit):
    with pytest.raises(dp.ConfigError) as err:
        call()
    message = str(err.value)
    assert culprit in message and "\n" not in message


def test_microbatch_is_no_longer_a_name_of_microbatch_size():
    """``microbatch_size`` was once ``microbatch``: the old keyword is an unknown field, the old
    attribute is gone (neither wins silently)."""
    with pytest.raises(dp.ConfigError, match="transformer: unknown field.s. microbatch$"):
        dp.Transformer(layers=2, hidden=8, heads=2, sequence=4, vocabulary=16, microbatch=3)
    with pytest.raises(dp.ConfigError, match="unknown field.s. microbatch$"):  # both names given
        dp.Transformer(**{**SMALL.__dict__, "microbatch": 2})
    with pytest.raises(AttributeError, match="microbatch"):
        SMALL.microbatch  # noqa: B018
