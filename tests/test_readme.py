"""The README's Python tour runs as written, and its command transcripts are what the commands print."""

import re
import shlex
from pathlib import Path

import pytest
from _helpers import run

README = Path(__file__).resolve().parents[1] / "README.md"


def test_tour_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python block"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})


def _transcripts() -> list[tuple[list[str], list[str]]]:
    """Each ``$ diffpipe ...`` block of the README: (the command's arguments, the output lines shown)."""
    found = []
    for block in re.findall(r"```\n(\$ diffpipe .*?)```", README.read_text(), flags=re.S):
        lines = block.splitlines()
        command = lines.pop(0)
        while command.endswith("\\"):
            command = command[:-1] + lines.pop(0)
        found.append((shlex.split(command)[2:], lines))
    return found


def test_readme_has_a_transcript():
    assert _transcripts()


@pytest.mark.parametrize("argv, shown", _transcripts(), ids=[" ".join(a[:2]) for a, _ in _transcripts()])
def test_transcript_is_what_the_command_prints(argv, shown, tmp_path):
    """The README shows what the command prints today, line for line (files it writes go to ``tmp_path``)."""
    argv = [str(tmp_path / Path(a).name) if a.endswith((".png", ".json", ".html", ".csv")) else a for a in argv]
    code, out, _ = run(argv)
    assert code == 0
    assert out.splitlines() == shown
