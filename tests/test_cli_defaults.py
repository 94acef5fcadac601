"""What a Megatron-LM or torchtitan user expects of the command line (issue 24): today's defaults,
stated with where they came from; the presets listed; ``--version``; one set of units."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from _helpers import hf_config, run

from diffpipe.cli import _inputs, _main

#: A small Llama-style config.json whose longest context (4096) is not the default sequence.
TINY = dict(model_type="llama", num_hidden_layers=8, hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
            intermediate_size=1024, vocab_size=4096, max_position_embeddings=4096, hidden_act="silu",
            tie_word_embeddings=False)


@pytest.fixture
def tiny(tmp_path):
    return hf_config(tmp_path, TINY)


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
    assert s["flash_attention"] == {"value": False, "from": "--no-flash-attention"}  # as typed
    assert "flash attention off (--no-flash-attention)" in _inputs._settings_line(s)
    assert settings(["--hf-config", tiny, "--global-batch", 8, "--flash-attention"])["flash_attention"] == {
        "value": True, "from": "--flash-attention"}
    s = settings(["--model", "llama-3.1-405b", "--global-batch", 8, "--sequence", "max"])
    assert s["sequence"]["value"] == 131072  # its config.json's max_position_embeddings


def test_sequence_from_a_file_names_the_file(tiny, tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(f'[training]\nhf_config = "{tiny}"\nglobal_batch = 8\nsequence = 1024\nflash_attention = false\n')
    s = settings([], path)
    assert s["sequence"]["value"] == 1024 and s["sequence"]["from"] == f"{path}: [training] sequence"
    assert s["flash_attention"] == {"value": False, "from": f"{path}: [training] flash_attention"}


def test_the_attention_kernel_is_stated_with_where_it_came_from(tiny, tmp_path):
    # the device's own kernel by default (Transformer.flash_version None -> 3), else the framework's, else as given
    s = settings(["--hf-config", tiny, "--global-batch", 8])
    assert s["flash_kernel"] == {"value": 3, "from": "default"}
    assert "kernel 3: the GPU's own (cuDNN's on Hopper) (default; --flash-version 1|2 for the others)" in \
        _inputs._settings_line(s)
    s = settings(["--hf-config", tiny, "--global-batch", 8, "--framework", "megatron"])
    assert s["flash_kernel"] == {"value": 3, "from": "--framework megatron"}
    s = settings(["--hf-config", tiny, "--global-batch", 8, "--flash-version", 2, "--framework", "megatron"])
    assert s["flash_kernel"] == {"value": 2, "from": "--flash-version"}
    assert "kernel 2: FlashAttention-2 (--flash-version; --flash-version 1|3" in _inputs._settings_line(s)
    path = tmp_path / "run.toml"
    path.write_text(f'[training]\nhf_config = "{tiny}"\nglobal_batch = 8\nflash_version = 1\n')
    assert settings([], path)["flash_kernel"] == {"value": 1, "from": f"{path}: [training] flash_version"}
    assert "kernel" not in _inputs._settings_line(settings(["--hf-config", tiny, "--global-batch", 8,
                                                            "--no-flash-attention"]))


def test_the_stated_kernel_is_priced(tiny):
    def attention(*flags):
        code, out, err = run(["simulate", "1f1b", "--hf-config", tiny, "--global-batch", 8, "--sequence", 1024,
                              "--cluster", "8xH100", "--json", *flags])
        assert code == 0, err
        return json.loads(out)["breakdown"]["compute_attention"]

    assert attention("--flash-version", 3) == attention() < attention("--flash-version", 2)
    assert attention("--flash-version", 2) < attention("--flash-version", 1)


@pytest.mark.parametrize("argv, message", [
    (["--flash-version", "4"], "argument --flash-version: invalid choice: 4"),
    (["--flash-version", "two"], "argument --flash-version: invalid int value: 'two'"),
])
def test_bad_flash_version_is_one_line(tiny, argv, message):
    code, _, err = run(["simulate", "--hf-config", tiny, "--global-batch", 8, *argv])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_bad_flash_version_in_a_file_names_the_key(tiny, tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(f'[training]\nhf_config = "{tiny}"\nglobal_batch = 8\nflash_version = 4\n')
    code, _, err = run(["simulate", "--config", str(path)])
    assert code == 2 and f"{path}: [training] flash_version" in err and len(err.strip().splitlines()) == 1


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
        # the capacity nvidia-smi reports, in decimal GB: 81,559 MiB (the listings in _machine/_specs)
        assert h100["memory_gb"] == pytest.approx(presets.DEVICES["H100"].memory / 1e9)
        assert h100["memory_gb"] == pytest.approx(81_559 * 2**20 / 1e9) == pytest.approx(85.52, abs=5e-3)
        assert h100["memory_from"] == "nvidia-smi" and "nvidia-smi" in h100["source"]
        assert "85.52" in run(["list", "devices"])[1]
        mi300x = next(r for r in rows if r["name"] == "MI300X")
        assert (mi300x["memory_from"], mi300x["memory_gb"]) == ("datasheet", 192.0)


def test_device_help_says_where_all_presets_are():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        _main.main(["plan", "--help"])
    text = " ".join(out.getvalue().split())
    assert "all: diffpipe list devices" in text and "all: diffpipe list models" in text


# -- one set of units, one fit rule, ties ----------------------------------------------------------------
def row(step, memory, tensor=1, pipeline=1, **more):
    return dict(step_time=step, memory_per_gpu=memory, tensor=tensor, pipeline=pipeline, **more)


def test_ties_go_to_less_memory_then_fewer_gpus_per_replica():
    from diffpipe._plan._table import TIE, ranked

    rows = [row(2.0990, 70.1e9), row(2.0991, 49.3e9, tensor=2), row(2.0992, 49.3e9), row(2.5, 10e9)]
    assert [(r["memory_per_gpu"], r["tensor"]) for r in ranked(rows)] == [
        (49.3e9, 1), (49.3e9, 2), (70.1e9, 1), (10e9, 1)]
    apart = [row(1.0, 70e9), row(1.0 + 2 * TIE, 10e9)]
    assert ranked(apart)[0]["memory_per_gpu"] == 70e9  # not a tie: the faster one first


def test_cli_headroom_is_the_library_s():
    from diffpipe._plan._configuration import HEADROOM

    assert _main.HEADROOM == HEADROOM
    assert _main.build_parser().parse_args(["plan"]).headroom == HEADROOM


def test_simulate_fits_with_plan_s_headroom():
    import diffpipe as dp

    model = dp.Transformer.from_hf_config(TINY, sequence=512)
    par = dp.Parallelism(tensor=1, pipeline=2, data=1)
    roomy = dp.Cluster(dp.Device(1e15, 1e12, 0.5), gpus=2, memory_bandwidth=3e12)
    peak = dp.Configuration(model, par, roomy, 4).evaluate().memory_per_gpu
    # a device 5% larger than the peak: no longer "fits" with 10% kept free, as plan would reject it
    tight = dp.Cluster(dp.Device(1e15, peak / 0.95, 0.5), gpus=2, memory_bandwidth=3e12)
    r = dp.Configuration(model, par, tight, 4).evaluate()
    assert r.memory_per_gpu == pytest.approx(peak) and not r.fits and r.usable == pytest.approx(0.9 * peak / 0.95)
    assert dp.Configuration(model, par, tight, 4).evaluate(headroom=0.0).fits


def test_units_in_json_keys():
    from diffpipe.cli._outputs import _with_units

    got = _with_units({"step_time": 2.0, "mfu": 0.627, "memory_per_gpu": 73.3e9, "capacity": 80e9, "headroom": 0.1,
                       "bubble_ratio": 0.012, "communication_share": 0.2, "memory": [1e9, 2e9], "family": "1f1b"})
    assert got.pop("family") == "1f1b" and got.pop("memory_gb") == pytest.approx([1.0, 2.0])
    assert got == pytest.approx({"step_time_s": 2.0, "mfu_percent": 62.7, "memory_per_gpu_gb": 73.3,
                                 "capacity_gb": 80.0, "usable_gb": 72.0, "headroom": 0.1, "bubble_percent": 1.2,
                                 "communication_percent": 20.0})


def test_plan_table_prints_percentages_a_legend_and_no_1f1b_without_a_pipeline():
    import diffpipe as dp
    from diffpipe._plan._table import PlanTable

    base = dict(family="1f1b", data=8, virtual=1, expert=1, microbatch_size=1, microbatches=8, recompute="none",
                zero=1, sequence_parallel=False, layers_per_stage=(32,), balanced=False,
                tokens_per_second_per_gpu=1e4, mfu=0.627, capacity=80e9, bubble_ratio=0.012,
                communication_share=0.05, bound=1.0)
    rows = (row(2.0, 60e9, **base), row(2.1, 50e9, **{**base, "family": "interleaved-1f1b", "virtual": 2},
                                        pipeline=2) | {"pipeline": 2})
    table = PlanTable(rows, {}, 2, 2, {}, dp.presets.model("llama-3-8b"), dp.Cluster("H100", gpus=8), 64)
    text = table.to_markdown()
    first, second = [line for line in text.splitlines() if line.startswith("| ")][1:3]
    assert first.split("|")[1].strip() == "-" and "| 62.7 |" in first and "| 1.2 |" in first
    assert second.split("|")[1].strip() == "interleaved-1f1b"
    assert "MFU (%)" in text and "comm: share of the step in the tensor-" in text
    assert "77.0 GB of 85.5 GB" in text  # an H100's 85.52 GB less 10%


# -- progress ----------------------------------------------------------------------------------------------
def test_progress_off_a_terminal_is_plain_lines_with_the_stage():
    from diffpipe._progress import Progress

    stream = io.StringIO()
    with Progress("plan", show_now=True, stream=stream, interval=1e9) as bar:
        bar.stage("searching", 4)
        bar.update(3)
        bar.phase("searching: compiling 1f1b PP4")
        bar.stage("balancing", 1)
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and lines[0].startswith("diffpipe plan: starting")
    assert lines[1].startswith("diffpipe plan: searching 0/4 (0%)") and lines[2].startswith("diffpipe plan: balancing")
    assert lines[-1].startswith("diffpipe plan: done in")


def test_progress_is_silent_for_short_work_and_when_disabled():
    from diffpipe._progress import Progress

    stream = io.StringIO()
    with Progress("plan", stream=stream, delay=1e9) as bar:  # shorter than the delay: nothing
        bar.stage("searching", 10)
        bar.update(10)
    with Progress("plan", enabled=False, show_now=True, stream=stream) as bar:
        bar.stage("searching", 10)
    assert stream.getvalue() == ""


def test_progress_on_a_terminal_is_a_tqdm_bar():
    pytest.importorskip("tqdm")
    from diffpipe._progress import Progress

    stream = io.StringIO()
    with Progress("sweep", show_now=True, stream=stream, terminal=True) as bar:
        bar.stage("evaluating points", 8)
        bar.update(8)
        assert type(bar.bar).__module__.startswith("tqdm")
    assert "sweep: evaluating points" in stream.getvalue()


def test_progress_environment_switch(monkeypatch):
    from diffpipe import _progress

    stream = io.StringIO()
    monkeypatch.setenv("DIFFPIPE_PROGRESS", "off")
    with _progress.Progress("plan", stream=stream, delay=0.0) as bar:
        bar.stage("searching")
    assert stream.getvalue() == ""


def test_cli_plan_shows_its_stages_in_a_log(tiny, monkeypatch):
    from diffpipe import _progress

    monkeypatch.setenv("DIFFPIPE_PROGRESS", "1")
    monkeypatch.setattr(_progress, "DELAY", 0.0)  # what a plan longer than 2 s shows, at once
    code, out, err = run(["plan", "--hf-config", tiny, "--gpus", 2, "--global-batch", 8, "--sequence", 512,
                          "--tp", 1, "--pp", 2, "--families", "1f1b", "--microbatch-size", 1, "--recompute", "none",
                          "--zero", 0, "--balance-top", 0])
    assert code == 0, err
    lines = err.splitlines()
    assert all(line.startswith("diffpipe plan: ") for line in lines) and "\r" not in err
    for stage in ("enumerating", "searching", "done in"):
        assert any(stage in line for line in lines), (stage, err)
    assert "| family |" in out


def test_examples_use_the_public_api_only():
    import ast
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                parts = name.split(".")
                assert not (parts[0] == "diffpipe" and any(p.startswith("_") for p in parts[1:])), (path.name, name)
