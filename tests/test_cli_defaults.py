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
