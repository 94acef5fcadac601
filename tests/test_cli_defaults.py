"""What a Megatron-LM or torchtitan user expects of the command line (issue 24): today's defaults,
stated with where they came from; the presets listed; ``--version``; one set of units."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from diffpipe.cli import _inputs, _main

#: A small Llama-style config.json whose longest context (4096) is not the default sequence.
TINY = dict(model_type="llama", num_hidden_layers=8, hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
            intermediate_size=1024, vocab_size=4096, max_position_embeddings=4096, hidden_act="silu",
            tie_word_embeddings=False)


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _main.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return path


def settings(argv, config=None):
    args = _main.build_parser().parse_args(["simulate", *map(str, argv)])
    return _inputs._configuration_values(args, _inputs._load_config(config, "simulate"))[3]


def test_default_sequence_and_flash_attention_are_stated(tiny):
    s = settings(["--hf-config", tiny, "--global-batch", 8])
    assert s["sequence"] == {"value": 8192, "from": "default", "longest": 4096}
    assert s["flash_attention"] == {"value": True, "from": "default"}
    line = _inputs._settings_line(s)
    assert "sequence 8,192 tokens (default; --sequence max: 4,096)" in line
    assert "flash attention on (default; --no-flash-attention: off)" in line


def test_sequence_max_and_no_flash_attention(tiny):
    s = settings(["--hf-config", tiny, "--global-batch", 8, "--sequence", "max", "--no-flash-attention"])
    assert s["sequence"]["value"] == 4096 and s["sequence"]["from"].startswith("--sequence max")
    assert s["flash_attention"] == {"value": False, "from": "--flash-attention"}
    s = settings(["--model", "llama-3.1-405b", "--global-batch", 8, "--sequence", "max"])
    assert s["sequence"]["value"] == 131072  # its config.json's max_position_embeddings


def test_sequence_from_a_file_names_the_file(tiny, tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(f'[training]\nhf_config = "{tiny}"\nglobal_batch = 8\nsequence = 1024\nflash_attention = false\n')
    s = settings([], path)
    assert s["sequence"]["value"] == 1024 and s["sequence"]["from"] == f"{path}: [training] sequence"
    assert s["flash_attention"] == {"value": False, "from": f"{path}: [training] flash_attention"}


def test_bad_sequence_is_one_line(tiny):
    code, _, err = run(["simulate", "--hf-config", tiny, "--global-batch", 8, "--sequence", "long"])
    assert code == 2 and "expected an integer >= 1 or 'max'" in err and len(err.strip().splitlines()) == 1


def test_base_install_brings_matplotlib_and_tqdm():
    import tomllib
    from pathlib import Path

    data = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    names = {d.split(">")[0].split("=")[0].split("[")[0].strip() for d in data["project"]["dependencies"]}
    assert {"matplotlib", "tqdm"} <= names


def test_version(capsys):
    with pytest.raises(SystemExit) as exit:
        _main.main(["--version"])
    assert exit.value.code == 0 and capsys.readouterr().out.startswith("diffpipe ")


@pytest.mark.parametrize("what, name", [("devices", "MI300X"), ("networks", "nvl72"), ("models", "deepseek-v3")])
def test_list_presets(what, name):
    from diffpipe import presets

    code, out, _ = run(["list", what])
    assert code == 0 and name in out and f"diffpipe list {what} --json" in out
    code, out, _ = run(["list", what, "--json"])
    rows = json.loads(out)
    assert [r["name"] for r in rows] == list(presets.preset_names()[what])
    if what == "devices":
        h100 = next(r for r in rows if r["name"] == "H100")
        assert h100["memory_gb"] == pytest.approx(presets.DEVICES["H100"].memory / 1e9)


def test_device_help_says_where_all_presets_are():
    code, out, _ = 0, io.StringIO(), None
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        _main.main(["plan", "--help"])
    text = " ".join(out.getvalue().split())
    assert "all: diffpipe list devices" in text and "all: diffpipe list models" in text
