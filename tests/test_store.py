"""``optimize``'s results kept on disk (``diffpipe._store``): a kept result is the computed one bit for
bit, any changed input or code misses, a corrupt entry is recomputed and replaced, the off switch
writes nothing (``tests/test_plan.py``: the plan read from kept results is the computed plan byte for
byte).

One small problem throughout (1F1B, 4 devices x 8 microbatches, 12 layers, 10 steps), so the
compiled programs are shared by every test."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

import diffpipe as dp
from diffpipe import _caches, _store
from diffpipe._optimize import _optimize
from diffpipe.cli import main

ROOT = Path(__file__).resolve().parents[1]
STEPS = 10


@pytest.fixture(scope="module")
def graph():
    return dp.compile(dp.schedules.get("1f1b", devices=4, microbatches=8))


def workload(forward=None):
    rng = np.random.default_rng(3)
    f = rng.lognormal(0.0, 0.5, 12).astype(np.float32) if forward is None else forward
    return dp.Workload.from_table(f, 1.3 * f, 0.6 * f, static_bytes=np.full(12, 2.0), activation_bytes=np.full(12, 0.5),
                                  output_bytes=np.full(12, 1.0), network=dp.Network.uniform(0.05, 4.0))


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """A result cache in ``tmp_path`` for this test, and a count of the descents run (a call served
    from the cache runs none); the in-process store is emptied, so every hit is read from disk."""
    folder = tmp_path / "results"
    monkeypatch.setattr(_caches, "_RESULT_DIR", [folder])
    _optimize._STORED.clear()
    runs = []
    real = _optimize._descend
    monkeypatch.setattr(_optimize, "_descend", lambda *a: runs.append(1) or real(*a))
    yield folder, runs
    _optimize._STORED.clear()


def optimize(graph, w):
    _optimize._STORED.clear()  # a hit must come from disk
    return dp.optimize(graph, w, dp.StageBalance(4), steps=STEPS)


def assert_bit_identical(a, b):
    assert type(a) is type(b)
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_bit_identical(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_bit_identical(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_bit_identical(a[k], b[k])
    elif isinstance(a, (np.ndarray, np.generic, jax.Array)):
        x, y = np.asarray(a), np.asarray(b)
        assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes())
    elif isinstance(a, float):
        assert a.hex() == b.hex()
    else:
        assert a == b


def test_a_kept_result_is_the_computed_one_bit_for_bit(graph, kept):
    folder, runs = kept
    first = optimize(graph, workload())
    assert len(runs) == 1 and len(list(folder.glob("*.npz"))) == 1
    again = optimize(graph, workload())  # equal inputs built afresh
    assert len(runs) == 1  # read back, not computed
    assert again is not first
    assert_bit_identical(again, first)
    assert again.to_json() == first.to_json()
    assert not again.loss.flags.writeable and not again.continuous_layers.flags.writeable


def test_one_bit_of_an_input_misses(graph, kept):
    folder, runs = kept
    forward = np.random.default_rng(3).lognormal(0.0, 0.5, 12).astype(np.float32)
    first = optimize(graph, workload(forward))
    flipped = forward.copy()
    flipped.view(np.uint32)[5] ^= 1  # the last bit of one layer's forward time
    assert flipped[5] != forward[5]
    other = optimize(graph, workload(flipped))
    assert len(runs) == 2 and len(list(folder.glob("*.npz"))) == 2
    assert other.continuous_makespan != first.continuous_makespan or other.loss.tobytes() != first.loss.tobytes()
    # and every other argument is part of the key too
    dp.optimize(graph, workload(forward), dp.StageBalance(4), steps=STEPS, memory_penalty=50.0)
    assert len(runs) == 3


def test_a_changed_code_fingerprint_misses(graph, kept, monkeypatch):
    folder, runs = kept
    optimize(graph, workload())
    monkeypatch.setattr(_store, "code_fingerprint", lambda: "0" * 64)  # another diffpipe, JAX or NumPy
    optimize(graph, workload())
    assert len(runs) == 2 and len(list(folder.glob("*.npz"))) == 2


def test_the_fingerprint_reads_every_file_of_the_package(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    (package / "sub" / "__pycache__").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    (package / "sub" / "__pycache__" / "b.cpython.pyc").write_bytes(b"compiled")
    monkeypatch.setattr(_store, "PACKAGE", package)
    fingerprint = _store.code_fingerprint.__wrapped__  # the cached one is this process's package's
    before = fingerprint()
    assert fingerprint() == before
    (package / "sub" / "__pycache__" / "b.cpython.pyc").write_bytes(b"recompiled")
    assert fingerprint() == before  # bytecode caches are not the code
    (package / "sub" / "b.py").write_text("y = 3\n")  # one byte of one file
    changed = fingerprint()
    assert changed != before
    (package / "c.py").write_text("")  # a new, empty file
    assert fingerprint() != changed
    monkeypatch.setattr(_store, "_version", lambda name: "1.0")
    same = fingerprint()
    monkeypatch.setattr(_store, "_version", lambda name: "1.1" if name == "numpy" else "1.0")
    assert fingerprint() != same  # a dependency's version


def test_the_key_is_unambiguous():
    digest = lambda *values: _store.Key("t").add(*values).digest()  # noqa: E731
    assert digest(1) != digest(1.0) != digest(True) and digest(1) != digest("1")
    assert digest(("ab",), "c") != digest(("a",), "bc") != digest(("a", "b"), "c")
    x = np.arange(4, dtype=np.float32)
    assert digest(x) != digest(x.astype(np.float64)) != digest(x.reshape(2, 2))
    assert digest(-0.0) != digest(0.0)
    assert digest(x) == digest(x.copy())
    with pytest.raises(_store.Unkeyable):
        digest(lambda: 0)


def test_one_walk_keys_both_stores(graph):
    """``_input_parts`` walks an ``optimize`` call's inputs once; the in-process key and the disk key are
    both made of it: equal inputs built afresh give equal parts (and the same digest), one bit of a leaf
    changes both, a hashable leaf no ``Key`` can encode (a function) is kept in the process only, and a
    tracer gives neither."""
    taus = np.geomspace(1.0, 1e-2, STEPS)

    def parts(w, init=None):
        return _optimize._input_parts(graph, w, (dp.StageBalance(4),), init, None, STEPS, taus, 1.0, 0, True, None)

    first, again = parts(workload()), parts(workload())
    assert first == again and first is not again
    adam = _optimize.DEFAULT_OPTIMIZER
    assert _optimize._stored_key(first, adam) == _optimize._stored_key(again, adam)
    assert _optimize._disk_key(first, adam).digest() == _optimize._disk_key(again, adam).digest()
    forward = np.random.default_rng(3).lognormal(0.0, 0.5, 12).astype(np.float32)
    flipped = forward.copy()
    flipped.view(np.uint32)[0] ^= 1
    other = parts(workload(flipped))
    assert _optimize._stored_key(other, adam) != _optimize._stored_key(first, adam)
    assert _optimize._disk_key(other, adam).digest() != _optimize._disk_key(first, adam).digest()
    odd = parts(workload(), init=(abs,))
    assert _optimize._stored_key(odd, adam) is not None and _optimize._disk_key(odd, adam) is None
    assert _optimize._disk_key(first, optax.adam(5e-2)) is None  # an optimizer of its own: this process only
    seen = []
    jax.jit(lambda f: seen.append(parts(dataclasses.replace(workload(), forward=f))) or f)(forward)
    assert seen == [None] and _optimize._stored_key(None, adam) is None and _optimize._disk_key(None, adam) is None


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "another key's entry"])
def test_a_corrupt_entry_is_recomputed_and_replaced(graph, kept, damage):
    folder, runs = kept
    first = optimize(graph, workload())
    (entry,) = folder.glob("*.npz")
    data = entry.read_bytes()
    if damage == "another key's entry":
        forward = np.random.default_rng(3).lognormal(0.0, 0.5, 12).astype(np.float32) * 2
        optimize(graph, workload(forward))
        (other,) = set(folder.glob("*.npz")) - {entry}
        broken = other.read_bytes()
        other.unlink()
    else:
        broken = {"garbage": b"\x00not an entry" * 50, "truncated": data[: len(data) // 2], "empty": b""}[damage]
    entry.write_bytes(broken)
    runs.clear()
    again = optimize(graph, workload())
    assert len(runs) == 1  # a miss: computed again, never an error
    assert_bit_identical(again, first)
    assert entry.read_bytes() != broken  # replaced by the computed result
    optimize(graph, workload())
    assert len(runs) == 1  # which now reads back


def test_the_off_switch_writes_nothing(graph, tmp_path, monkeypatch):
    monkeypatch.setattr(_caches, "_RESULT_DIR", [None])
    monkeypatch.setenv("DIFFPIPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DIFFPIPE_CACHE", "0")
    assert _caches.enable_compilation_cache() is None and _caches.result_cache_dir() is None
    optimize(graph, workload())
    assert not (tmp_path / "cache").exists()


def test_cache_info_counts_the_kept_results_apart(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIFFPIPE_CACHE_DIR", str(tmp_path))
    results = _caches.compilation_cache_dir() / _caches.RESULTS
    results.mkdir(parents=True)
    (results / "entry.npz").write_bytes(b"x" * 7)
    (results.parent / "program").write_bytes(b"y" * 3)
    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["entries"], info["bytes"]) == (1, 3)
    assert info["results"] == {"path": str(results), "entries": 1, "bytes": 7}
    assert main(["cache", "info"]) == 0
    assert str(results) in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert not results.exists()


def test_the_store_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(_caches, "_RESULT_DIR", [tmp_path])
    monkeypatch.setattr(_store, "MAX_ENTRIES", 3)
    keys = [_store.Key("t").add(i) for i in range(5)]
    for i, key in enumerate(keys):
        assert _store.save(key, {"i": i, "x": np.arange(i)}, {}) is not None
        os.utime(tmp_path / f"{key.digest()}.npz", ns=(i * 10**9, i * 10**9))  # distinct ages
        if i == 2:
            assert _store.load(keys[0], {})["i"] == 0  # used: now the newest
            os.utime(tmp_path / f"{keys[0].digest()}.npz", ns=(10**12, 10**12))
    assert len(list(tmp_path.glob("*.npz"))) == 3
    assert [_store.load(k, {}) is not None for k in keys] == [True, False, False, True, True]
    monkeypatch.setattr(_store, "MAX_BYTES", 1)  # one entry is more than this: nothing stays
    _store.save(keys[1], 1, {})
    assert not list(tmp_path.glob("*.npz"))


@pytest.mark.slow
def test_the_command_line_reads_kept_results(tmp_path):
    argv = ["optimize", "1f1b", "--devices", "2", "--microbatches", "4", "--config", "examples/machine.toml",
            "--steps", str(STEPS), "--json"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIFFPIPE_CACHE")}
    env.update(PYTHONPATH=str(ROOT), DIFFPIPE_CACHE_DIR=str(tmp_path / "cache"), JAX_LOG_COMPILES="1")

    def run():
        done = subprocess.run([sys.executable, "-m", "diffpipe", *argv], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        return done.stdout, done.stderr

    first, log = run()
    assert "_descend" in log  # computed: the descent compiled
    (folder,) = (tmp_path / "cache").iterdir()
    (entry,) = (folder / _caches.RESULTS).iterdir()
    again, log = run()
    assert again == first  # the kept result: byte for byte the computed answer
    assert "_descend" not in log  # read back: no descent traced, compiled or loaded
    assert list((folder / _caches.RESULTS).iterdir()) == [entry]
    # (--no-cache and DIFFPIPE_CACHE=0 write no folder at all: tests/test_compilation_cache.py)
