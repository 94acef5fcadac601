"""The persistent compilation cache: where it lives, its switch, ``diffpipe cache info|clear``, and
that diffpipe's own programs can be kept (no host callback) while a bad value still names itself."""

import json
import os
import subprocess
import sys
from pathlib import Path

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffpipe as dp
from diffpipe import _caches
from diffpipe._engine import _jit_checks
from diffpipe.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["simulate", "1f1b", "--devices", "2", "--microbatches", "2", "--forward", "1", "--backward", "2"]


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIFFPIPE_CACHE")}
    env.update(PYTHONPATH=str(ROOT), DIFFPIPE_CACHE_DIR=str(tmp_path / "cache"), **extra)
    return env


def _cli(argv, env):
    done = subprocess.run([sys.executable, "-m", "diffpipe", *argv], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("DIFFPIPE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _caches.compilation_cache_root() == tmp_path / "xdg" / "diffpipe" / "jax"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: relative paths are invalid
    assert _caches.compilation_cache_root() == Path.home() / ".cache" / "diffpipe" / "jax"
    monkeypatch.setenv("DIFFPIPE_CACHE_DIR", str(tmp_path / "moved"))
    folder = _caches.compilation_cache_dir()
    assert folder.parent == tmp_path / "moved"
    # keyed by the versions: another diffpipe, JAX or jaxlib never reads these programs
    for name in ("diffpipe", "jax", "jaxlib"):
        assert f"{name}-{_caches._version(name)}" in folder.name
    for off in ("0", "false", "No", "off"):
        monkeypatch.setenv("DIFFPIPE_CACHE", off)
        assert not _caches.compilation_cache_enabled()
        assert _caches.enable_compilation_cache() is None
    monkeypatch.setenv("DIFFPIPE_CACHE", "1")
    assert _caches.compilation_cache_enabled()


def test_cache_info_and_clear(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIFFPIPE_CACHE_DIR", str(tmp_path))
    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["path"] == str(_caches.compilation_cache_dir()) and info["entries"] == 0 and info["bytes"] == 0
    current = _caches.compilation_cache_dir()
    (current / "sub").mkdir(parents=True)
    (current / "sub" / "entry").write_bytes(b"x" * 10)
    stale = tmp_path / "diffpipe-0.0.1-jax-0.0.1-jaxlib-0.0.1"
    stale.mkdir()
    (stale / "old").write_bytes(b"y" * 3)
    (tmp_path / "not-ours.txt").write_text("kept")
    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["entries"], info["bytes"]) == (1, 10)
    assert info["other_versions"] == [{"path": str(stale), "entries": 1, "bytes": 3}]
    assert main(["cache", "info"]) == 0
    assert str(current) in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed" in capsys.readouterr().out
    assert not current.exists() and not stale.exists()
    assert (tmp_path / "not-ours.txt").read_text() == "kept"  # clear removes only its own folders
    assert main(["cache", "clear"]) == 0
    assert "nothing to remove" in capsys.readouterr().out


@pytest.mark.slow
def test_a_command_keeps_its_programs_unless_told_not_to(tmp_path):
    folder = lambda env: Path(json.loads(_cli(["cache", "info", "--json"], env))["path"])  # noqa: E731
    env = _env(tmp_path)
    first = _cli(SMALL, env)
    kept = sorted(p.name for p in folder(env).iterdir())
    assert any(name.startswith("jit__simulate_graph") for name in kept), kept  # the evaluator itself
    assert _cli(SMALL, env) == first  # the kept programs give the same answer
    _cli(["cache", "clear"], env)
    for off in (["--no-cache", *SMALL], SMALL):
        off_env = env if off[0] == "--no-cache" else _env(tmp_path, DIFFPIPE_CACHE="0")
        assert _cli(off, off_env) == first
        assert not folder(env).exists()


def test_diffpipe_programs_of_concrete_hardware_have_no_host_callback():
    # A program with a host callback (equinox's raising check) is never written to the cache.
    g = dp.compile(dp.schedules.get("1f1b", devices=2, microbatches=2))
    hw = dp.Hardware.from_times(1.0, 2.0)
    for on_error, callbacks in (("nan", False), ("raise", True)):
        text = jax.jit(_jit_checks.nan_checked(lambda h: dp.makespan(g, h)) if on_error == "nan" else
                       (lambda h: dp.makespan(g, h))).lower(hw).as_text()
        assert ("callback" in text) == callbacks, on_error


def test_a_nan_check_is_equinox_s_own_program_without_its_stack_walk():
    # diffpipe's NaN checks skip equinox's trace-time stack walk; the program is the same, op for op.
    def ours(x):
        with _jit_checks.checks("nan"):
            y = _jit_checks.error_if(x, x < 0, "negative")
            return jnp.sum(jax.vmap(lambda v: _jit_checks.error_if(v * 2, v > 5, "big"))(y))

    def theirs(x):
        y = eqx.error_if(x, x < 0, "negative", on_error="nan")
        return jnp.sum(jax.vmap(lambda v: eqx.error_if(v * 2, v > 5, "big", on_error="nan"))(y))

    x = jnp.asarray([1.0, 2.0, 3.0])
    text = [jax.jit(f).lower(x).as_text(debug_info=False).split("\n", 1)[1] for f in (ours, theirs)]
    assert text[0] == text[1]
    for value in ([1.0, 2.0, 3.0], [1.0, -2.0, 3.0], [1.0, 6.0, 3.0]):
        a, b = (np.asarray(jax.jit(f)(jnp.asarray(value))) for f in (ours, theirs))
        assert a.tobytes() == b.tobytes() and (np.isnan(a) == (min(value) < 0 or max(value) > 5))
    chex.assert_trees_all_equal(jax.grad(ours)(x), jax.grad(theirs)(x))
    with _jit_checks.checks("nan"), pytest.warns(UserWarning):  # a check known at trace time: equinox's NaN
        assert np.isnan(np.asarray(_jit_checks.error_if(x, True, "always"))).all()


def test_a_bad_value_is_still_named():
    g = dp.compile(dp.schedules.get("1f1b", devices=2, microbatches=2))
    hw = dp.Hardware.from_times(1.0, 2.0)
    bad = type(hw).__new__(type(hw))
    for name, value in vars(hw).items():
        object.__setattr__(bad, name, value)
    object.__setattr__(bad, "forward", jnp.asarray(-1.0))  # past the constructor's checks
    with pytest.raises(dp.ConfigError, match="forward must be non-negative"):
        dp.makespan(g, bad)
    with pytest.raises(dp.ConfigError, match="forward must be non-negative"):
        dp.simulate(g, bad)
    with pytest.raises(Exception, match="forward must be non-negative"):  # in the user's jit: a runtime error
        jax.jit(lambda f: dp.makespan(g, dp.Hardware.from_times(f, 2.0)))(-1.0)


def test_set_up_without_eager_ops_is_bit_identical_to_the_eager_computation():
    # The set-up paths run in NumPy or as one program: bit for bit what JAX computes eagerly.
    from diffpipe._workload._parallelism import Parallelism
    from diffpipe._workload._workload import _CURVES, _fields_at

    model = dp.presets.model("llama-3-70b")
    cluster = dp.Cluster(dp.presets.device("H100"), gpus=64, devices_per_node=8, intra="nvlink4", inter="ib-ndr")
    cfg = dp.Configuration(model, Parallelism(tensor=4, pipeline=4, data=4, zero=1), cluster, 64, schedule="1f1b")
    costs = cfg.costs()
    # (The collective seconds are the kernel model's jax.numpy computation again, so they have no
    # second, NumPy path to compare here.)
    device = cluster.device
    layer = costs.costs
    np.testing.assert_array_equal(np.asarray(device.seconds(layer.forward, layer.forward_bytes, layer.tokens)),
                                  np.asarray(device._seconds(layer.forward, layer.forward_bytes, layer.tokens)))
    workload = cfg.workload()
    assert not np.all(np.asarray(workload.forward) == np.asarray(workload.forward)[0])  # a real table
    curves = {name: getattr(workload, name) for name in _CURVES}
    for boundaries in ([0.0, 20.0, 41.0, 62.0, 82.0], [0.0, 10.5, 33.25, 70.0, 82.0], [0.0, 82.0]):
        x = jnp.asarray(boundaries)
        chex.assert_trees_all_equal(workload.stage_fields(x), _fields_at(curves, x))
    # Padded to a bucket of stage counts, the real stages' values are the unpadded program's.
    for boundaries in (np.linspace(0.0, 82.0, 41), np.arange(0.0, 83.0, 2.0), np.linspace(0.0, 82.0, 34)):
        x = jnp.asarray(boundaries, jnp.float32)
        chex.assert_trees_all_equal(workload.stage_fields(x), jax.jit(_fields_at)(curves, x))
