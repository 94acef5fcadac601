"""Every script under examples/ runs with ``--fast`` (new scripts are picked up automatically) and
prints what it promises (``EXPECTED``, where listed).

The scripts in ``FRESH`` run as the README says, ``python examples/X.py --fast`` in a fresh
interpreter: a script may rely on nothing the test process set up. The others run in this process
as ``__main__`` (``runpy``, the same argv and working folder), which spares CI a Python, JAX and
torch start-up per script; the strict promotion rules of ``conftest.py`` then apply to them too.
``DIFFPIPE_FULL_MATRIX=1`` runs every script in a fresh interpreter.
"""

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

#: Examples run as users run them: slow (``-m 'not slow'`` leaves it out; CI runs it).
pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

EXPECTED = {
    "quickstart.py": ["1f1b: 4 devices", "closed form: makespan 33", "d makespan / d forward", "p2p 1.00 ms"],
    "what_if_bandwidth.py": ["step time (ms), 4 devices", "interleaved-1f1b", "fastest"],
    "torch_round_trip.py": ["Interleaved1F1B", "torch validates it", "read back: the same schedule"],
}


SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))
#: Run in a fresh interpreter: the README's first example.
FRESH = set(SCRIPTS) if os.environ.get("DIFFPIPE_FULL_MATRIX") == "1" else {"quickstart.py"}


def test_the_examples_are_there():
    assert set(EXPECTED) <= set(SCRIPTS)


def _run_fresh(script, folder):
    """(stdout, stderr) of ``python examples/SCRIPT --fast`` run in ``folder``; fails on a non-zero exit."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--fast"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr


def _run_here(script, monkeypatch, capsys):
    """(stdout, stderr) of the script run as ``__main__`` in this process, from the current folder."""
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / script), "--fast"])
    monkeypatch.syspath_prepend(str(EXAMPLES))  # as ``python examples/X.py`` puts the script's folder first
    try:
        runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    except SystemExit as e:  # argparse or an explicit exit: only a clean one passes
        assert e.code in (0, None), capsys.readouterr().err[-3000:]
    return capsys.readouterr()


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_fast(script, tmp_path, monkeypatch, capsys):
    if script.startswith("torch"):  # the torch round trip needs torch
        pytest.importorskip("torch.distributed.pipelining")
    monkeypatch.chdir(tmp_path)
    stdout, stderr = _run_fresh(script, tmp_path) if script in FRESH else _run_here(script, monkeypatch, capsys)
    for expected in EXPECTED.get(script, ()):
        assert expected in stdout, (expected, stdout[-2000:])
    assert "Traceback" not in stderr
