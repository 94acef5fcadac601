"""The command line: every --help example runs, bad input is one line and exit code 2."""

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diffpipe import cli

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["list", "show", "simulate", "compare", "optimize", "sweep", "export"]


def run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def example_of(command):
    sub = cli.build_parser()._subparsers._group_actions[0].choices[command]
    line = sub.epilog.split("example:", 1)[1].strip()
    return shlex.split(line)[1:]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_example_runs(command, tmp_path, monkeypatch, capsys):
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "machine.toml", tmp_path / "examples" / "machine.toml")
    monkeypatch.chdir(tmp_path)
    argv = example_of(command)
    if command == "compare":  # the default machine is large: a smaller pipeline keeps the test quick
        argv = ["compare", "gpipe", "1f1b", "--devices", "4", "--microbatches", "4"]
    if command == "optimize":
        argv += ["--steps", "30"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert out.strip()


def test_json_outputs_are_valid(capsys):
    code, out, _ = run(["list", "--json"], capsys)
    assert code == 0 and {r["name"] for r in json.loads(out)} >= {"gpipe", "amdp"}
    code, out, _ = run(["show", "1f1b", "--devices", "2", "--microbatches", "2", "--json"], capsys)
    data = json.loads(out)
    assert data["makespan"] == 9 and data["orders"][0] == ["0F0", "0F1", "0B0", "0B1"]
    code, out, _ = run(["simulate", "1f1b", "--forward", "1", "--backward", "2", "--json"], capsys)
    data = json.loads(out)
    assert data["makespan_s"] == pytest.approx(33.0) and data["bubble_ratio"] == pytest.approx(9 / 33)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["show", "nope"], "unknown schedule family 'nope'"),
        (["show", "interleaved-1f1b", "--devices", "4", "--microbatches", "9", "--option", "chunks=2"], "microbatches"),
        (["show", "1f1b", "--option", "chunks"], "expected NAME=VALUE"),
        (["simulate", "1f1b", "--device", "V100"], "unknown device preset 'V100'"),
        (["simulate", "1f1b", "--intra", "warp"], "warp"),
        (["simulate", "1f1b", "--forward", "1"], "forward and backward"),
        (["simulate", "1f1b", "--forward", "-1", "--backward", "2"], "argument --forward: expected seconds"),
        (["sweep", "--devices", "x"], "comma-separated integers"),
        (["show", "1f1b", "--devices", "0"], "argument --devices: expected an integer >= 1, got '0'"),
        (["simulate", "1f1b", "--inter", "100gbe"], "need --intra"),
        (["simulate", "1f1b", "--forward", "1", "--backward", "2", "--intra", "nvlink3"],
         "--intra cannot be combined with per-stage times"),
    ],
)
def test_bad_input_is_one_line(argv, message, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_malformed_and_unknown_config(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nlayers = 'x\n")
    code, _, err = run(["simulate", "1f1b", "--config", str(bad)], capsys)
    assert code == 2 and "malformed TOML" in err
    bad.write_text("[model]\nlayerz = 4\n")
    code, _, err = run(["simulate", "1f1b", "--config", str(bad)], capsys)
    assert code == 2 and "unknown key 'layerz' in [model]" in err
    code, _, err = run(["simulate", "1f1b", "--config", str(tmp_path / "missing.toml")], capsys)
    assert code == 2 and "No such file" in err and "missing.toml" in err


def test_bad_csv_action_and_nothing_half_written(tmp_path, capsys):
    csv = tmp_path / "bad.csv"
    csv.write_text("0F0,0F1,0B0,0B1\n1F0,1X0,1F1,1B1\n")
    code, _, err = run(["show", "--torch-csv", str(csv)], capsys)
    assert code == 2 and "1X0" in err and err.count("\n") == 1
    out = tmp_path / "chimera.csv"
    code, _, err = run(["export", "chimera", "--devices", "4", "--microbatches", "4", "--csv", str(out)], capsys)
    assert code == 2 and "pipeline" in err
    assert not out.exists() and not list(tmp_path.glob("chimera*"))


def test_torch_csv_round_trip_through_the_cli(tmp_path, capsys):
    path = tmp_path / "s.csv"
    assert run(["export", "zb-h1", "--devices", "3", "--microbatches", "4", "--csv", str(path)], capsys)[0] == 0
    code, out, _ = run(["show", "--torch-csv", str(path), "--json"], capsys)
    assert code == 0 and json.loads(out)["devices"] == 3


def test_installed_entry_point_starts_without_jax():
    code = ("import sys; from diffpipe import cli; cli.main(['list']); "
            "assert 'jax' not in sys.modules, 'list imported jax'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_documented_device_keys_work(tmp_path, capsys):
    """[device] peak_flops and memory (documented) build a custom device, or override a preset's."""
    cfg = tmp_path / "d.toml"
    sizes = ["--devices", "2", "--microbatches", "2", "--json"]
    base = json.loads(run(["simulate", "1f1b", "--device", "A100", *sizes], capsys)[1])
    cfg.write_text('[device]\npreset = "A100"\npeak_flops = 624e12\n')
    faster = json.loads(run(["simulate", "1f1b", "--config", str(cfg), *sizes], capsys)[1])
    assert faster["makespan_s"] < base["makespan_s"]
    cfg.write_text("[device]\npeak_flops = 312e12\nmemory = 80e9\n")
    code, out, err = run(["simulate", "1f1b", "--config", str(cfg), *sizes], capsys)
    assert code == 0, err
    assert "custom device" in json.loads(out)["machine"]


def test_compare_uses_the_schedule_section_and_options(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[schedule]\nfamily = "interleaved-1f1b"\ndevices = 2\nmicrobatches = 4\n'
                   "options = { chunks = 2 }\n[times]\nforward = 1\nbackward = 2\n")
    code, out, err = run(["compare", "--config", str(cfg), "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert (data["devices"], data["microbatches"]) == (2, 4)
    assert [(e["family"], e["options"]) for e in data["schedules"]] == [("interleaved-1f1b", {"chunks": 2})]


def test_per_stage_time_lists_and_mode_with_times(tmp_path, capsys):
    cfg = tmp_path / "t.toml"
    cfg.write_text('[times]\nforward = [1, 1, 1, 1]\nbackward = [2, 2, 2, 2]\n[network]\nmode = "none"\n')
    code, out, err = run(["simulate", "1f1b", "--config", str(cfg), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["makespan_s"] == pytest.approx(33.0)


def test_a_check_inside_jit_is_one_line_naming_it():
    import equinox as eqx
    import jax

    checked = jax.jit(lambda x: eqx.error_if(x, x < 0, "hardware: bandwidth must be positive, got a negative"))
    with pytest.raises(Exception) as info:
        checked(-1.0)
    code, line = cli._main._error_line(info.value)
    assert (code, line) == (2, "diffpipe: error: hardware: bandwidth must be positive, got a negative")
    code, line = cli._main._error_line(RuntimeError("RESOURCE_EXHAUSTED: out of memory while allocating 8 GiB"))
    assert code == 2 and "out of memory" in line


def test_sweep_and_compare_tables_state_units(capsys):
    code, out, _ = run(["sweep", "--families", "gpipe", "--forward", "1", "--backward", "1"], capsys)
    assert code == 0 and "makespan in s" in out and "peak memory in GB" in out and "| peak memory (GB) |" in out
    code, out, _ = run(["compare", "gpipe", "--devices", "2", "--microbatches", "2", "--forward", "1e-3",
                        "--backward", "2e-3"], capsys)
    assert code == 0 and "sim makespan (µs)" in out  # 9 ms of work: shown in µs


def test_cli_mode_names_are_the_librarys():
    """The mode names (``_choices``, JAX-free so that parsing never imports JAX) are the names of
    the library's mode classes (``_communication.MODES``)."""
    from diffpipe._choices import COMMUNICATION_MODES, MACHINE_MODES
    from diffpipe._engine._communication import MODES
    from diffpipe.calibrate import TorchRuntime

    assert cli._args.MACHINE_MODES is MACHINE_MODES
    assert [cls.name for cls in MODES.values()] == list(COMMUNICATION_MODES) == list(MODES)
    assert MACHINE_MODES == (*COMMUNICATION_MODES, TorchRuntime.name)


def test_schedule_simulate_fits_by_plan_s_headroom(capsys):
    """``simulate`` of a schedule on a device says "fits" by plan's rule (capacity less the headroom,
    ``fits_memory``), states the rule, and takes ``--headroom``; without a device memory every device fits."""
    from diffpipe._plan._configuration import HEADROOM, fit_rule

    sizes = ["simulate", "1f1b", "--device", "A100", "--devices", "2", "--microbatches", "2"]
    fits = {}
    for headroom in (0.0, HEADROOM, 0.2):
        code, out, err = run([*sizes, "--headroom", str(headroom), "--json"], capsys)
        assert code == 0, err
        data = json.loads(out)
        assert data["headroom"] == headroom
        assert data["usable_gb"] == pytest.approx([c * (1 - headroom) for c in data["capacity_gb"]])
        fits[headroom] = data["fits"]
        assert fits[headroom] == [p / 1e9 <= u for p, u in zip(data["peak_memory_bytes"], data["usable_gb"])]
    assert fits[0.0] != fits[0.2]  # the last device's 70.6 GB fits the whole memory, not 80% of it
    code, out, err = run(sizes, capsys)
    assert code == 0, err
    assert f"({fit_rule(data['capacity_gb'][0] * 1e9)}, as plan does)" in out
    code, out, err = run(["simulate", "1f1b", "--forward", "1", "--backward", "2"], capsys)
    assert "no device memory given: every device fits" in out
    code, _, err = run([*sizes, "--headroom", "1"], capsys)
    assert code == 2 and err.strip().endswith("simulate: headroom must be below 1, got 1.0")
