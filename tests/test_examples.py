"""Every script under examples/ runs with ``--fast`` in a fresh interpreter (new scripts are picked up
automatically) and prints what it promises (``EXPECTED``, where listed)."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

EXPECTED = {
    "quickstart.py": ["1f1b: 4 devices", "closed form: makespan 33", "d makespan / d forward", "p2p 1.00 ms"],
    "what_if_bandwidth.py": ["step time (ms), 4 devices", "interleaved-1f1b", "fastest"],
    "torch_round_trip.py": ["Interleaved1F1B", "torch validates it", "read back: the same schedule"],
}


SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))


def test_the_examples_are_there():
    assert set(EXPECTED) <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_fast(script, tmp_path):
    if script.startswith("torch"):  # the torch round trip needs torch
        pytest.importorskip("torch.distributed.pipelining")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--fast"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for expected in EXPECTED.get(script, ()):
        assert expected in done.stdout, (expected, done.stdout[-2000:])
    assert "Traceback" not in done.stderr
