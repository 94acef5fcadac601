"""Gradients of the makespan: reverse mode (the default sweep adjoint) against forward mode and
float64 at every temperature; the bound on stage-time derivatives; central finite differences in
float64. Each family meets one of the two references (float64 reverse mode or finite differences),
each communication mode meets both (``DIFFPIPE_FULL_MATRIX=1``: every family in every mode)."""

import zlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import FULL_MATRIX, covering, schedules
from test_simulator import build

import diffpipe as dp

SCHEDULES = schedules()
#: Every other family (the ones ``FD_MATRIX`` leaves out), each in one mode, every mode on a quarter
#: of them (``_helpers.covering``): with ``FD_MATRIX`` every family's gradients are checked against an
#: independent reference, and each case here compiles three gradient programmes (float32 reverse and
#: forward, float64 reverse), the file's largest cost on the small machine running CI.
#: ``DIFFPIPE_FULL_MATRIX=1`` runs every family in every mode.
MATRIX = covering(SCHEDULES if FULL_MATRIX else SCHEDULES[1::2], ("overlap", "contention", "none", "blocking"))
#: Temperatures as fractions of the exact makespan.
RELATIVE_TAUS = (1e-2, 1e-4, 1e-6, 1e-8, 1e-9)


def _setup(case, s, mode, dtype=jnp.float32):
    rng = np.random.default_rng(zlib.crc32(f"{case}/{mode}".encode()))
    per_node = 2 if s.devices >= 4 else None
    hw, *_ = build(s, rng, mode, per_node)
    try:
        g = dp.compile(s, communication=mode, devices_per_node=per_node)
    except dp.ScheduleError:  # blocking send/recv orders deadlock (tested in test_simulator)
        pytest.skip("deadlocks under blocking communication")
    return g, jax.tree.map(lambda x: jnp.asarray(x, dtype) if eqx.is_inexact_array(x) else x, hw)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(eqx.filter(tree, eqx.is_inexact_array))]


@pytest.mark.parametrize("case, s, mode", MATRIX, ids=[f"{c}-{m}" for c, _, m in MATRIX])
def test_reverse_mode_agrees_with_forward_mode_and_float64(case, s, mode):
    g, hw = _setup(case, s, mode)
    exact = float(dp.makespan(g, hw))
    params, static = eqx.partition(hw, eqx.is_inexact_array)

    def makespan(p, tau):
        return dp.makespan(g, eqx.combine(p, static), temperature=tau)

    reverse = jax.jit(jax.grad(makespan))
    forward = jax.jit(jax.jacfwd(makespan))
    with jax.enable_x64(True):
        params64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), params)
        static64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64) if eqx.is_inexact_array(x) else x, static)
        reverse64 = jax.jit(jax.grad(lambda p, tau: dp.makespan(g, eqx.combine(p, static64), temperature=tau)))
        want = {rel: _leaves(reverse64(params64, jnp.asarray(rel * exact, jnp.float64))) for rel in RELATIVE_TAUS}
    for rel in RELATIVE_TAUS:
        tau = jnp.asarray(rel * exact, jnp.float32)
        got, fwd = _leaves(reverse(params, tau)), _leaves(forward(params, tau))
        for x, y, z in zip(got, fwd, want[rel]):
            assert np.all(np.isfinite(x))
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-4 * (1 + np.abs(y).max()), err_msg=f"tau {rel:g}")
            np.testing.assert_allclose(x, z, rtol=2e-3, atol=2e-3 * (1 + np.abs(z).max()), err_msg=f"tau {rel:g}")


BOUND_MATRIX = covering(SCHEDULES[1::2], ("contention", "overlap", "blocking", "none"))


@pytest.mark.parametrize("case, s, mode", BOUND_MATRIX, ids=[f"{c}-{m}" for c, _, m in BOUND_MATRIX])
def test_stage_time_derivative_is_bounded_by_the_ops_using_it(case, s, mode):
    g, hw = _setup(case, s, mode)
    hw = eqx.tree_at(lambda h: h.size, hw, jnp.ones_like(hw.size))  # unit sizes: d op / d time = 1
    exact = float(dp.makespan(g, hw))
    uses = {name: np.zeros((s.pipelines, s.stages)) for name in ("forward", "input_grad", "weight")}
    kinds = {"F": ("forward",), "B": ("input_grad", "weight"), "I": ("input_grad",), "W": ("weight",)}
    for op in s.ops:
        for name in kinds.get(op.kind, ()):
            uses[name][op.pipeline, op.stage] += 1
    grad = jax.jit(jax.grad(lambda h, tau: dp.makespan(g, h, temperature=tau)))
    for rel in RELATIVE_TAUS:
        d = grad(hw, jnp.asarray(rel * exact, jnp.float32))
        for name, count in uses.items():
            x = np.asarray(getattr(d, name))
            assert np.all(x >= -1e-5), (name, rel)
            assert np.all(x <= count * (1 + 1e-5) + 1e-5), (name, rel, x, count)


def _fd(fun, x, eps):
    x = np.asarray(x)
    out = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = eps
        out.flat[i] = (fun(jnp.asarray(x + e)) - fun(jnp.asarray(x - e))) / (2 * eps)
    return out


FD_MATRIX = covering(SCHEDULES[::2], ("overlap", "contention", "blocking"))


@pytest.mark.parametrize("case, s, mode", FD_MATRIX, ids=[f"{c}-{m}" for c, _, m in FD_MATRIX])
def test_gradients_match_central_finite_differences_float64(case, s, mode):
    with jax.enable_x64(True):
        g, hw = _setup(case, s, mode, jnp.float64)
        exact = float(dp.makespan(g, hw))
        tau = jnp.asarray(0.02 * exact, jnp.float64)
        shape = hw.forward.shape

        def fun(x):
            h = eqx.tree_at(lambda h: (h.forward, h.network.latency), hw, (x[:-1].reshape(shape), x[-1]))
            return dp.makespan(g, h, temperature=tau)

        x0 = jnp.concatenate([hw.forward.ravel(), hw.network.latency[None]])
        np.testing.assert_allclose(np.asarray(jax.grad(fun)(x0)), _fd(fun, x0, 1e-6), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(np.asarray(jax.jacfwd(fun)(x0)), _fd(fun, x0, 1e-6), rtol=1e-5, atol=1e-7)
        d_tau = jax.grad(lambda t: dp.makespan(g, hw, temperature=t))(tau)
        fd_tau = _fd(lambda t: dp.makespan(g, hw, temperature=t), tau, 1e-6 * exact)
        assert float(d_tau) == pytest.approx(float(fd_tau), rel=1e-5, abs=1e-7)


def test_adjoints_are_objects_and_names_map_to_them():
    s = dp.schedules.get("zb-h1", devices=3, microbatches=5)
    g = dp.compile(s)
    hw, *_ = build(s, np.random.default_rng(3), "overlap")
    for tau in (None, 0.2):
        for name, adjoint in (("sweep", dp.SweepAdjoint()), ("autodiff", dp.AutodiffAdjoint())):
            a = jax.grad(lambda h, adjoint=adjoint, tau=tau: dp.makespan(g, h, temperature=tau, adjoint=adjoint))(hw)
            b = jax.grad(lambda h, name=name, tau=tau: dp.makespan(g, h, temperature=tau, adjoint=name))(hw)
            c = jax.grad(lambda h, tau=tau: dp.makespan(g, h, temperature=tau))(hw)
            for x, y, z in zip(_leaves(a), _leaves(b), _leaves(c)):
                np.testing.assert_array_equal(x, y)
                np.testing.assert_allclose(x, z, rtol=1e-4, atol=1e-5)
    with pytest.raises(dp.ConfigError, match="adjoint 'magic'"):
        dp.makespan(g, hw, adjoint="magic")


def test_forward_mode_on_the_default_path():
    s = dp.schedules.get("1f1b", devices=4, microbatches=8)
    g = dp.compile(s)

    def f(x):
        return dp.makespan(g, dp.Hardware.from_times(x, 2.0 * x, p2p_time=0.1), temperature=0.05)

    x = jnp.linspace(0.8, 1.2, 4)
    value, tangent = jax.jvp(f, (x,), (jnp.ones(4),))
    np.testing.assert_allclose(float(tangent), float(jnp.sum(jax.grad(f)(x))), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(f)(x)), np.asarray(jax.jacrev(f)(x)), rtol=1e-5)
    np.testing.assert_allclose(float(value), float(f(x)))
