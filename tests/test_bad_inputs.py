"""Nothing lost, nothing silent: every bad input is one stderr line naming the culprit, exit code 2,
no traceback, and no file on disk changes (issue 8).

The table ``CASES`` names each bad input (TOML values of every documented key, file encodings,
torch CSV cells, flags, contradictory options, output paths, sizes past ``--max-ops``); each runs
in a directory holding a pre-existing output file that must stay byte-identical, and nothing new
may appear. Library entry points get their own table. A hypothesis test mutates valid TOML, CSV
and argv and checks the same contract; subprocess tests check all-or-nothing outputs under a
file-size limit and that the size guard refuses before allocating under an address-space limit.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import diffpipe as dp
from diffpipe import _io
from diffpipe import cli
from diffpipe.schedules import Op, Placement, Schedule, from_torch_csv, to_torch_csv

ROOT = Path(__file__).resolve().parents[1]
GOOD_CSV = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
KEEP = b"pre-existing output: must survive\n"


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    culprit: str
    files: tuple[tuple[str, bytes], ...] = ()


def run_cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"<dir>")
            for p in sorted(folder.rglob("*"))}


def assert_one_line(code, err, culprit):
    assert code == 2, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("diffpipe: error: "), err
    assert "Traceback" not in err
    assert culprit in err, err


# -- the table ----------------------------------------------------------------------------------------
#: Bad TOML values for each kind of key in ``cli._inputs.SCHEMA`` (written as TOML), chosen by hand.
BAD_VALUES = {
    "name": ['true', '1', '""', '[1]', '{ a = 1 }', '1.5'],
    "count": ['"abc"', 'true', '0', '-3', '1.5', '"4"', '[4]', 'nan', 'inf'],
    "times": ['"abc"', 'true', '-1', 'nan', 'inf', '"1e-3"', '[1, "x"]', '[]', '[[1]]', '{ a = 1 }', '[true]'],
    "seconds": ['"abc"', 'true', '-1', 'nan', 'inf', '"1e-3"', '[1]', '{ a = 1 }'],
    "positive": ['"abc"', 'true', '0', '-1', 'nan', 'inf', '"1"'],
    "bandwidth": ['"abc"', 'true', '0', '-1', 'nan', '"fast"'],
    "fraction": ['"high"', 'true', '0', '1.5', '-0.1', 'nan'],
    "shares": ['"high"', 'true', '1.5', 'nan', '[0.5, 2]', '[]'],
    "bool": ['1', '"yes"', '0', '[true]'],
    "mode": ['"fast"', '1', 'true', '""'],
    "options": ['3', '"chunks=2"', '[1]', '{ chunks = [1, 2] }', '{ chunks = { a = 1 } }'],
    "zero": ['"1"', 'true', '-1', '4', '1.0'],
    "recompute": ['true', '"some"', '1', '""'],
}
#: What each section needs besides the bad key to be otherwise complete.
COMPANION = {"times": {"forward": "1", "backward": "2"}}


def toml_value_cases() -> list[Case]:
    cases = []
    for section, keys in cli._inputs.SCHEMA.items():
        for key, kind in keys.items():
            for i, bad in enumerate(BAD_VALUES[kind]):
                body = {**COMPANION.get(section, {}), key: bad}
                text = f"[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in body.items())
                argv = ("simulate", "1f1b", "--config", "a.toml", "--trace", "keep.json")
                cases.append(Case(f"toml-{section}-{key}-{i}", argv, f"a.toml: [{section}] {key} must be",
                                  (("a.toml", text.encode()),)))
    return cases


def toml_structure_cases() -> list[Case]:
    sim = ("simulate", "1f1b", "--config", "a.toml", "--trace", "keep.json")
    texts = [
        ("unknown-section", "[machine]\nx = 1\n", "unknown section [machine]"),
        ("unknown-key", "[model]\nlayerz = 4\n", "unknown key 'layerz' in [model]"),
        ("section-not-table", "schedule = 3\n", "[schedule] must be a table"),
        ("malformed", "[model]\nlayers = 'x\n", "malformed TOML"),
        ("duplicate-key", "[model]\nlayers = 4\nlayers = 5\n", "malformed TOML"),
        ("times-and-model", "[times]\nforward = 1\nbackward = 1\n[model]\nlayers = 4\n", "cannot be combined"),
        ("times-and-device", "[times]\nforward = 1\nbackward = 1\n[device]\npreset = 'A100'\n",
         "cannot be combined with [device]"),
        ("times-no-backward", "[times]\nforward = 1\n", "backward is missing"),
        ("times-network-latency", "[times]\nforward = 1\nbackward = 1\n[network]\nlatency = 1e-3\n",
         "[network] latency cannot be combined with per-stage times"),
        ("times-network-intra", "[times]\nforward = 1\nbackward = 1\n[network]\nintra = 'nvlink3'\n",
         "[network] intra cannot be combined"),
        ("times-network-dpn", "[times]\nforward = 1\nbackward = 1\n[network]\ndevices_per_node = 2\n",
         "[network] devices_per_node cannot be combined"),
        ("intra-and-latency", "[network]\nintra = 'nvlink3'\nlatency = 1e-6\n", "cannot be combined with"),
        ("peak-without-memory", "[device]\npeak_flops = 1e15\n", "needs [device] memory"),
        ("memory-without-peak", "[device]\nmemory = 8e10\n", "needs [device] peak_flops"),
        ("unknown-preset", "[device]\npreset = 'B300'\n", "B300"),
        ("unknown-network", "[network]\nintra = 'warp'\n", "warp"),
        ("unknown-family", "[schedule]\nfamily = 'nope'\n", "nope"),
        ("bad-family-option", "[schedule]\nfamily = '1f1b'\noptions = { chunks = 2 }\n", "chunks"),
        ("model-too-few-layers", "[model]\nlayers = 2\n", "layers"),
        ("latency-beyond-float32", "[network]\nlatency = 1e300\n", "[network] latency = 1e+300 does not fit"),
        ("times-list-beyond-float32", "[times]\nforward = [1, 1e39, 1, 1]\nbackward = 1\n",
         "[times] forward = 1e+39 does not fit"),
        ("peak-beyond-float32", "[device]\npeak_flops = 1e50\nmemory = 1e10\n", "[device] peak_flops = 1e+50"),
    ]
    cases = [Case(f"toml-{n}", sim[:1] + (() if "family" in t else sim[1:2]) + sim[2:], c,
                  (("a.toml", t.encode()),)) for n, t, c in texts]
    unusable = [
        ("show", ("show", "1f1b", "--config", "a.toml"), "[model]\nlayers = 4\n", "[model] cannot be used by 'show'"),
        ("export-csv", ("export", "1f1b", "--csv", "keep.csv", "--config", "a.toml"),
         "[times]\nforward = 1\nbackward = 1\n", "[times] cannot be used by 'export --csv'"),
        ("optimize-times", ("optimize", "1f1b", "--config", "a.toml"), "[times]\nforward = 1\nbackward = 1\n",
         "[times] cannot be used by 'optimize'"),
    ]
    cases += [Case(f"toml-unusable-{n}", a, c, (("a.toml", t.encode()),)) for n, a, t, c in unusable]
    return cases


#: Bytes that are not UTF-8 text: (name, bytes, line of the first bad byte or None for NUL).
ENCODINGS = [
    ("latin-1", "[schedule]\nfamily = \"caf\xe9\"\n".encode("latin-1"), 2),
    ("utf-16", "[schedule]\nfamily = \"1f1b\"\n".encode("utf-16"), 1),
    ("binary", bytes(range(256)), 2),  # the first byte past 0x7f follows one newline (0x0a)
    ("nul", b"[schedule]\nfamily = \"1f1b\"\n\x00\n", 3),
    ("bad-continuation", b"[schedule]\n\n# \xe2\x28\xa1\n", 3),
    ("cp1252-quote", b"0F0,0F1\n\x93x\x94\n", 2),
]


def encoding_cases() -> list[Case]:
    cases = []
    for name, data, line in ENCODINGS:
        for label, argv in (("config-show", ("show", "1f1b", "--config", "f.in")),
                            ("config-simulate", ("simulate", "1f1b", "--config", "f.in", "--trace", "keep.json")),
                            ("csv-show", ("show", "--torch-csv", "f.in")),
                            ("csv-simulate", ("simulate", "--torch-csv", "f.in", "--forward", "1", "--backward", "1",
                                              "--gantt", "keep.png"))):
            cases.append(Case(f"encoding-{name}-{label}", argv, f"f.in:{line}: not", (("f.in", data),)))
    return cases


def csv_cases() -> list[Case]:
    bad = [
        ("unknown-action", "0F0,0F1,0B0,0B1\n1F0,1X0,1F1,1B1\n", "'1X0'"),
        ("no-microbatch", "0F0,0F,0B0\n", "'0F'"),
        ("duplicate", "0F0,0F0,0B0\n", "duplicated"),
        ("empty", "\n\n", "no actions"),
        ("only-communication", "0SEND_F0,0RECV_B0\n", "no compute actions"),
        ("missing-op", "0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n", "f.csv"),
        ("wrong-rank", "1F0,1B0\n0F0,0B0\n", "f.csv"),
        ("compound", "(0F0;1Q1)OVERLAP_F_B\n", "not a torch action"),
        ("bad-quote", '0F0,"0F1\n', "f.csv"),
        ("stages-neither", "0F0,2F0\n1F0\n", "fit neither"),
    ]
    cases = []
    for name, text, culprit in bad:
        for label, argv in (("show", ("show", "--torch-csv", "f.csv")),
                            ("export", ("export", "--torch-csv", "f.csv", "--csv", "keep.csv"))):
            cases.append(Case(f"csv-{name}-{label}", argv, culprit, (("f.csv", text.encode()),)))
    return cases


def flag_cases() -> list[Case]:
    cases = []
    schedule_commands = {
        "show": ("show", "1f1b"),
        "simulate": ("simulate", "1f1b", "--forward", "1", "--backward", "1", "--trace", "keep.json"),
        "export": ("export", "1f1b", "--csv", "keep.csv"),
        "optimize": ("optimize", "1f1b", "--device", "A100"),
    }
    per_command = [
        ("devices-word", ("--devices", "x"), "--devices"), ("devices-zero", ("--devices", "0"), "--devices"),
        ("devices-negative", ("--devices", "-2"), "--devices"), ("devices-float", ("--devices", "1.5"), "--devices"),
        ("microbatches-zero", ("--microbatches", "0"), "--microbatches"),
        ("microbatches-word", ("--microbatches", "many"), "--microbatches"),
        ("option-no-value", ("--option", "chunks"), "expected NAME=VALUE"),
        ("option-no-name", ("--option", "=2"), "expected NAME=VALUE"),
        ("option-empty-value", ("--option", "chunks="), "expected NAME=VALUE"),
        ("option-unknown", ("--option", "bogus=1"), "bogus"),
        ("max-ops-zero", ("--max-ops", "0"), "--max-ops"),
        ("max-ops-word", ("--max-ops", "lots"), "--max-ops"),
        ("huge-devices", ("--devices", "100000"), "past the limit"),
        ("huge-microbatches", ("--microbatches", "10000000"), "past the limit"),
        ("past-max-ops", ("--max-ops", "10"), "past the limit"),
        ("unknown-flag", ("--frobnicate",), "--frobnicate"),
        ("torch-csv-and-family", ("--torch-csv", "ok.csv"), "--torch-csv"),
        ("unknown-family-flag", ("--family", "x"), "--family"),
    ]
    for command, base in schedule_commands.items():
        for name, extra, culprit in per_command:
            cases.append(Case(f"flag-{command}-{name}", base + extra, culprit, (("ok.csv", GOOD_CSV.encode()),)))
    sim = ("simulate", "1f1b", "--trace", "keep.json")
    machine = [
        ("forward-word", ("--forward", "abc", "--backward", "1"), "--forward"),
        ("forward-nan", ("--forward", "nan", "--backward", "1"), "--forward"),
        ("forward-inf", ("--forward", "inf", "--backward", "1"), "--forward"),
        ("forward-negative", ("--forward", "-1", "--backward", "1"), "--forward"),
        ("backward-nan", ("--forward", "1", "--backward", "nan"), "--backward"),
        ("weight-negative", ("--forward", "1", "--backward", "1", "--weight", "-1"), "--weight"),
        ("p2p-inf", ("--forward", "1", "--backward", "1", "--p2p", "inf"), "--p2p"),
        ("forward-only", ("--forward", "1"), "backward is missing"),
        ("backward-only", ("--backward", "1"), "forward is missing"),
        ("times-and-intra", ("--forward", "1", "--backward", "1", "--intra", "nvlink3"), "--intra"),
        ("times-and-device", ("--forward", "1", "--backward", "1", "--device", "A100"), "--device"),
        ("times-and-dpn", ("--forward", "1", "--backward", "1", "--devices-per-node", "2"), "--devices-per-node"),
        ("dpn-zero", ("--devices-per-node", "0"), "--devices-per-node"),
        ("dpn-without-intra", ("--devices-per-node", "2"), "need --intra"),
        ("inter-without-intra", ("--inter", "ib-ndr"), "need --intra"),
        ("dpn-without-inter", ("--intra", "nvlink3", "--devices-per-node", "2"), "needs --inter"),
        ("mode-unknown", ("--mode", "fast"), "--mode"),
        ("device-unknown", ("--device", "V100"), "V100"),
        ("intra-unknown", ("--intra", "warp"), "warp"),
        ("inter-unknown", ("--intra", "nvlink3", "--inter", "carrier-pigeon"), "carrier-pigeon"),
        ("overflow-float32", ("--forward", "1e38", "--backward", "1e38"), "float32"),
        ("beyond-float32", ("--forward", "1e39", "--backward", "1"), "--forward = 1e+39 does not fit float32"),
        ("p2p-beyond-float32", ("--forward", "1", "--backward", "1", "--p2p", "1e300"), "--p2p = 1e+300"),
        ("gantt-suffix", ("--forward", "1", "--backward", "1", "--gantt", "x.txt"), "--gantt"),
        ("trace-suffix-twice", ("--trace", "x.png"), "--trace"),
    ]
    cases += [Case(f"flag-simulate-{n}", sim + e, c) for n, e, c in machine]
    others = [
        ("no-command", (), "required"),
        ("unknown-command", ("frobnicate",), "frobnicate"),
        ("list-extra", ("list", "--bogus"), "--bogus"),
        ("no-family", ("show",), "no schedule family"),
        ("unknown-family", ("show", "nope"), "nope"),
        ("interleaved-bad-sizes", ("show", "interleaved-1f1b", "--microbatches", "9", "--option", "chunks=2"),
         "microbatches"),
        ("huge-chunks", ("show", "interleaved-1f1b", "--option", "chunks=1000000000"), "past the limit"),
        ("huge-waves", ("show", "hanayo", "--option", "waves=100000000"), "past the limit"),
        ("huge-steps", ("show", "amdp", "--option", "steps=100000000"), "past the limit"),
        ("torch-csv-devices", ("show", "--torch-csv", "ok.csv", "--devices", "4"), "--devices"),
        ("torch-csv-microbatches", ("show", "--torch-csv", "ok.csv", "--microbatches", "4"), "--microbatches"),
        ("torch-csv-option", ("show", "--torch-csv", "ok.csv", "--option", "chunks=2"), "--option"),
        ("torch-csv-family", ("show", "1f1b", "--torch-csv", "ok.csv"), "a family"),
        ("torch-csv-missing", ("show", "--torch-csv", "missing.csv"), "missing.csv"),
        ("torch-csv-directory", ("show", "--torch-csv", "."), "is a directory"),
        ("config-missing", ("show", "1f1b", "--config", "missing.toml"), "missing.toml"),
        ("config-directory", ("show", "1f1b", "--config", "."), "is a directory"),
        ("compare-json-markdown", ("compare", "--json", "--markdown"), "--markdown"),
        ("compare-option-default-set", ("compare", "--option", "bogus=1"), "--option"),
        ("compare-option-unknown", ("compare", "1f1b", "--option", "bogus=1", "--devices", "2",
                                    "--microbatches", "2"), "bogus"),
        ("compare-unknown-family", ("compare", "nope", "--devices", "2", "--microbatches", "2"), "nope"),
        ("compare-huge", ("compare", "--devices", "5000"), "past the limit"),
        ("compare-devices-zero", ("compare", "--devices", "0"), "--devices"),
        ("optimize-batch-zero", ("optimize", "1f1b", "--batch", "0"), "--batch"),
        ("optimize-batch-with-stages", ("optimize", "1f1b", "--batch", "8", "--device", "A100"), "--batch"),
        ("optimize-steps-zero", ("optimize", "1f1b", "--steps", "0"), "--steps"),
        ("optimize-steps-huge", ("optimize", "1f1b", "--steps", "1000000000"), "past the limit"),
        ("optimize-too-long", ("optimize", "1f1b", "--devices", "8", "--microbatches", "2048", "--device", "A100"),
         "over 300 gradient steps is about"),
        ("optimize-knob", ("optimize", "1f1b", "--knob", "layers"), "--knob"),
        ("optimize-times", ("optimize", "1f1b", "--forward", "1", "--backward", "1"), "needs a model"),
        ("export-nothing", ("export", "1f1b"), "give --csv"),
        ("export-machine-unused", ("export", "1f1b", "--csv", "keep.csv", "--forward", "1"), "--forward"),
        ("export-chimera-csv", ("export", "chimera", "--devices", "4", "--microbatches", "4", "--csv", "keep.csv"),
         "pipelines"),
        ("export-hanayo-csv", ("export", "hanayo", "--option", "waves=2", "--csv", "keep.csv"), "placement"),
    ]
    cases += [Case(f"flag-{n}", a, c, (("ok.csv", GOOD_CSV.encode()),)) for n, a, c in others]
    sweep = ("sweep", "--csv", "keep.csv")
    sweeps = [
        ("families-empty", ("--families", ""), "--families"),
        ("families-hole", ("--families", "gpipe,,1f1b"), "--families"),
        ("families-unknown", ("--families", "nope"), "nope"),
        ("devices-empty", ("--devices", ""), "--devices"),
        ("devices-hole", ("--devices", "4,,8"), "--devices"),
        ("devices-word", ("--devices", "4,x"), "--devices"),
        ("devices-zero", ("--devices", "0"), "--devices"),
        ("microbatches-negative", ("--microbatches", "-8"), "--microbatches"),
        ("modes-empty", ("--modes", ""), "--modes"),
        ("modes-unknown", ("--modes", "overlap,fast"), "fast"),
        ("limit-negative", ("--limit", "-1"), "--limit"),
        ("limit-with-json", ("--limit", "3", "--json"), "--limit"),
        ("option-no-values", ("--option", "chunks"), "expected NAME=V1,V2"),
        ("option-no-name", ("--option", "=1,2"), "expected NAME=V1,V2"),
        ("grid-huge", ("--devices", "64,128", "--microbatches", "4096,8192"), "past the limit"),
        ("grid-devices-squared", ("--families", "gpipe", "--devices", "5000", "--microbatches", "1"),
         "past the limit"),
        ("times-and-intra", ("--forward", "1", "--backward", "1", "--intra", "nvlink3"), "--intra"),
    ]
    cases += [Case(f"flag-sweep-{n}", sweep + e, c) for n, e, c in sweeps]
    # plan takes the configuration flags of simulate (lists where it searches): refused before any search
    plan = ("plan", "--model", "llama-3-8b", "--gpus", "8", "--global-batch", "8")
    plans = [
        ("tp-word", ("--tp", "2,x"), "--tp"),
        ("tp-hole", ("--tp", "2,,4"), "--tp"),
        ("tensor-zero", ("--tensor", "0"), "--tensor"),
        ("pp-empty", ("--pp", ""), "--pp"),
        ("microbatch-size-zero", ("--microbatch-size", "1,0"), "--microbatch-size"),
        ("vpp-negative", ("--vpp", "-2"), "--vpp"),
        ("ep-word", ("--ep", "two"), "--ep"),
        ("zero-five", ("--zero", "0,5"), "--zero"),
        ("zero-word", ("--zero", "x"), "--zero"),
        ("recompute-unknown", ("--recompute", "none,sometimes"), "sometimes"),
        ("families-hole", ("--families", "1f1b,,gpipe"), "--families"),
        ("families-unknown", ("--families", "nope"), "nope"),
        ("dp", ("--dp", "2"), "--dp"),
        ("sequence-parallel-value", ("--sequence-parallel=yes",), "--sequence-parallel"),
        ("sequence-zero", ("--sequence", "0"), "--sequence"),
        ("cluster-shape", ("--cluster", "H100"), "GPUSxDEVICE"),
        ("cluster-contradicts", ("--cluster", "16xH100"), "contradicts --gpus 8"),
        ("two-models", ("--hf-config", "ok.csv"), "not both"),
        ("unknown-device", ("--device", "Z80"), "Z80"),
        ("headroom", ("--headroom", "1.5"), "headroom"),
        ("out-without-export", ("--out", "keep.csv"), "--out needs --export"),
        ("export-unknown", ("--export", "deepspeed"), "--export"),
    ]
    cases += [Case(f"flag-plan-{n}", plan + e, c, (("ok.csv", GOOD_CSV.encode()),)) for n, e, c in plans]
    cases += [
        Case("flag-plan-no-model", ("plan", "--gpus", "8", "--global-batch", "8"), "--model NAME"),
        Case("flag-plan-no-gpus", ("plan", "--model", "llama-3-8b", "--global-batch", "8"), "--gpus N"),
        Case("flag-plan-no-batch", ("plan", "--model", "llama-3-8b", "--cluster", "8xH100"), "--global-batch"),
        Case("flag-plan-unknown-model", ("plan", "--model", "gpt-5", "--gpus", "8", "--global-batch", "8"), "gpt-5"),
        Case("flag-simulate-config-zero-word", ("simulate", "--model", "llama-3-8b", "--global-batch", "8", "--zero",
                                                "x"), "--zero"),
    ]
    return cases


def output_cases() -> list[Case]:
    outputs = [
        ("simulate-gantt", ("simulate", "1f1b", "--forward", "1", "--backward", "1", "--gantt"), ".png"),
        ("simulate-trace", ("simulate", "1f1b", "--forward", "1", "--backward", "1", "--trace"), ".json"),
        ("sweep-csv", ("sweep", "--families", "gpipe", "--csv"), ".csv"),
        ("sweep-json-out", ("sweep", "--families", "gpipe", "--json-out"), ".json"),
        ("sweep-markdown-out", ("sweep", "--families", "gpipe", "--markdown-out"), ".md"),
        ("export-csv", ("export", "1f1b", "--csv"), ".csv"),
        ("export-gantt", ("export", "1f1b", "--gantt"), ".svg"),
        ("export-trace", ("export", "1f1b", "--trace"), ".json"),
    ]
    cases = []
    for name, argv, suffix in outputs:
        flag = argv[-1]
        cases.append(Case(f"output-{name}-directory", argv + (f"sub{suffix}",), "is a directory"))
        cases.append(Case(f"output-{name}-no-directory", argv + (f"missing/x{suffix}",), "does not exist"))
        cases.append(Case(f"output-{name}-empty", argv + ("",), flag))
        cases.append(Case(f"output-{name}-under-a-file", argv + (f"keep.csv/x{suffix}",), "does not exist"))
    twice = [
        ("simulate", ("simulate", "1f1b", "--forward", "1", "--backward", "1", "--gantt", "o.png",
                      "--trace", "o.json", "--gantt", "o.svg", "--trace", "o.svg"), "--trace"),
        ("sweep", ("sweep", "--families", "gpipe", "--csv", "o.csv", "--json-out", "o.csv"), "also the target"),
        ("sweep-three", ("sweep", "--families", "gpipe", "--csv", "o.txt", "--json-out", "o.json",
                         "--markdown-out", "./o.txt"), "also the target"),
        ("export", ("export", "1f1b", "--csv", "keep.json", "--trace", "keep.json"), "also the target"),
    ]
    cases += [Case(f"output-twice-{n}", a, c) for n, a, c in twice]
    return cases


CASES = (toml_value_cases() + toml_structure_cases() + encoding_cases() + csv_cases() + flag_cases()
         + output_cases())


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("keep.json", "keep.csv", "keep.png"):
        (tmp_path / name).write_bytes(KEEP)
    (tmp_path / "sub.png").mkdir()
    for suffix in (".json", ".csv", ".md", ".svg"):
        (tmp_path / f"sub{suffix}").mkdir()
    return tmp_path


def test_the_table_is_large_and_names_are_unique():
    assert len(CASES) >= 400
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case, workdir):
    for name, data in case.files:
        (workdir / name).write_bytes(data)
    before = snapshot(workdir)
    code, _, err = run_cli(case.argv)
    assert_one_line(code, err, case.culprit)
    assert snapshot(workdir) == before  # pre-existing files byte-identical, nothing new (no temp files)


# -- the library ----------------------------------------------------------------------------------------
def _schedule(**changes):
    args = {"placement": Placement.linear(2), "orders": [[Op("F", 0, 0), Op("B", 0, 0)],
                                                         [Op("F", 1, 0), Op("B", 1, 0)]], "microbatches": 1}
    return Schedule(**{**args, **changes})


LIBRARY = [
    ("table-str", lambda: dp.table("x"), "table"),
    ("table-none", lambda: dp.table(None), "table"),
    ("schedule-orders-int", lambda: _schedule(orders=5), "orders"),
    ("schedule-orders-str", lambda: _schedule(orders="0F0"), "orders"),
    ("schedule-orders-ints", lambda: _schedule(orders=[1, 2]), "orders"),
    ("schedule-placement-str", lambda: _schedule(placement="linear"), "placement"),
    ("schedule-microbatches-bool", lambda: _schedule(microbatches=True), "microbatches"),
    ("schedule-microbatches-float", lambda: _schedule(microbatches=1.0), "microbatches"),
    ("schedule-steps-str", lambda: _schedule(steps="1"), "steps"),
    ("placement-devices-bool", lambda: Placement(True, ((0,),)), "devices"),
    ("placement-devices-float", lambda: Placement(2.0, ((0, 1),)), "devices"),
    ("placement-table-int", lambda: Placement(2, 5), "table"),
    ("placement-table-str", lambda: Placement(2, "01"), "table"),
    ("placement-entry-bool", lambda: Placement(2, ((True, 0),)), "device True"),
    ("placement-entry-float", lambda: Placement(2, ((0.0, 1),)), "device 0.0"),
    ("from-torch-csv-none", lambda: from_torch_csv(None), "path"),
    ("from-torch-csv-int", lambda: from_torch_csv(5), "path"),
    ("from-torch-csv-directory", lambda: from_torch_csv("."), "is a directory"),
    ("from-torch-csv-missing", lambda: from_torch_csv("missing.csv"), "missing.csv"),
    ("to-torch-csv-str", lambda: to_torch_csv("1f1b", "x.csv"), "expected a Schedule"),
    ("to-torch-csv-directory", lambda: to_torch_csv(dp.schedules.get("1f1b", devices=2, microbatches=2), "."),
     "is a directory"),
    ("to-torch-csv-bad-path", lambda: to_torch_csv(dp.schedules.get("1f1b", devices=2, microbatches=2), 5),
     "file path"),
    ("write-atomic-missing-dir", lambda: _io.write_atomic("missing/x.txt", "x"), "does not exist"),
    ("read-text-binary", lambda: (Path("b.bin").write_bytes(b"\xff\xfe"), _io.read_text("b.bin"))[1],
     "b.bin:1: not UTF-8"),
]


@pytest.mark.parametrize("make, culprit", [c[1:] for c in LIBRARY], ids=[c[0] for c in LIBRARY])
def test_library_bad_input(make, culprit, workdir):
    before = {k: v for k, v in snapshot(workdir).items()}
    with pytest.raises((dp.ScheduleError, dp.ConfigError)) as info:
        make()
    message = str(info.value)
    assert "\n" not in message and culprit in message
    assert {k: v for k, v in snapshot(workdir).items() if k != "b.bin"} == before


# -- unexpected errors, --debug, signals -------------------------------------------------------------------
def test_unexpected_error_is_one_line_asking_for_a_report(monkeypatch, capsys):
    def boom(*args, **kwargs):
        raise RuntimeError("something nobody expected\nsecond line")

    monkeypatch.setattr(dp.schedules, "table", boom)
    code, _, err = run_cli(["show", "1f1b"])
    assert code == 1 and err.count("\n") == 1 and "please report" in err and "RuntimeError" in err
    code, _, err = run_cli(["show", "1f1b", "--debug"])
    assert code == 1 and "Traceback" in err and "please report" in err.splitlines()[-1]


def test_debug_shows_the_traceback_of_a_known_error():
    code, _, err = run_cli(["--debug", "show", "nope"])
    assert code == 2 and "Traceback" in err and err.splitlines()[-1].startswith("diffpipe: error: ")


def test_sigterm_while_writing_leaves_nothing(workdir, monkeypatch):
    from matplotlib.figure import Figure

    def killed(self, path, **kwargs):
        Path(path).write_bytes(b"half a png")
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Figure, "savefig", killed)
    before = snapshot(workdir)
    code, _, err = run_cli(["simulate", "1f1b", "--forward", "1", "--backward", "1",
                            "--trace", "keep.json", "--gantt", "keep.png"])
    assert code == 143 and err.count("\n") == 1 and "terminated" in err
    assert snapshot(workdir) == before


def test_a_failing_later_output_changes_nothing(workdir, monkeypatch):
    """--gantt is staged first, then the disk refuses --trace: neither target changes."""
    import errno

    fill, calls = _io._fill, []

    def second_fails(tmp, data):
        calls.append(tmp)
        if len(calls) == 2:
            raise OSError(errno.EFBIG, "File too large")
        fill(tmp, data)

    monkeypatch.setattr(_io, "_fill", second_fails)
    before = snapshot(workdir)
    code, _, err = run_cli(["simulate", "1f1b", "--forward", "1", "--backward", "1",
                            "--gantt", "keep.png", "--trace", "keep.json"])
    assert len(calls) == 2
    assert_one_line(code, err, "--trace: cannot write 'keep.json': File too large")
    assert snapshot(workdir) == before


#: Runs the CLI in a fresh interpreter that first applies resource limits to itself (no
#: preexec_fn: forking a process that has JAX loaded may deadlock).
_CHILD = ("import resource, runpy, sys\n"
          "for name, value in eval(sys.argv.pop(1)).items():\n"
          "    resource.setrlimit(getattr(resource, name), (value, value))\n"
          "sys.argv[0] = 'diffpipe'\n"
          "runpy.run_module('diffpipe', run_name='__main__')\n")


def _python(argv, cwd, **limits):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", _CHILD, repr(limits), *argv], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def test_multi_output_sweep_is_all_or_nothing_under_a_file_size_limit(tmp_path):
    argv = ["sweep", "--families", "gpipe,1f1b,zb-h1", "--forward", "1", "--backward", "1"]
    free = _python(argv + ["--csv", "a.csv", "--json-out", "a.json"], tmp_path)
    assert free.returncode == 0, free.stderr
    small, large = sorted((tmp_path / n).stat().st_size for n in ("a.csv", "a.json"))
    assert small < large
    folder = tmp_path / "limited"
    folder.mkdir()
    (folder / "out.csv").write_bytes(KEEP)
    before = snapshot(folder)
    done = _python(argv + ["--csv", "out.csv", "--json-out", "out.json"], folder,
                   RLIMIT_FSIZE=(small + large) // 2)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "out.json" in done.stderr and "File too large" in done.stderr
    assert snapshot(folder) == before


@pytest.mark.parametrize("argv", [
    ["show", "1f1b", "--devices", "3000", "--microbatches", "3000"],
    ["simulate", "1f1b", "--devices", "2000", "--microbatches", "5000", "--forward", "1", "--backward", "1"],
    ["sweep", "--families", "gpipe", "--devices", "4000", "--microbatches", "4000"],
    ["compare", "--devices", "2000", "--microbatches", "2000"],
    ["show", "interleaved-1f1b", "--option", "chunks=100000000"],
])
def test_size_guard_refuses_before_allocating(argv, tmp_path):
    """Under a 300 MiB address space (too little to import JAX, or to build these schedules), the
    guard must answer first: a missing guard fails fast with a different message."""
    done = _python(argv, tmp_path, RLIMIT_AS=300 * 2**20)
    assert done.returncode == 2, done.stderr
    assert "past the limit" in done.stderr and "--max-ops" in done.stderr and done.stderr.count("\n") == 1
    assert not list(tmp_path.iterdir())


# -- defaults --------------------------------------------------------------------------------------------
def test_compare_cli_and_library_agree_on_the_default_question():
    code, out, err = run_cli(["compare", "--json"])
    assert code == 0, err
    assert json.loads(out) == json.loads(_io.dumps_json(json.loads(dp.compare().to_json())))
    chimera = [e for e in json.loads(out)["schedules"] if e["family"] == "chimera"]
    assert [e["options"] for e in chimera] == [{"sync": True}]


def test_single_schedule_defaults_are_the_sweeps():
    import inspect

    params = inspect.signature(dp.sweep).parameters
    assert (params["devices"].default, params["microbatches"].default) == (cli._args.DEFAULT_DEVICES,
                                                                           cli._args.DEFAULT_MICROBATCHES)


# -- numbers ---------------------------------------------------------------------------------------------
def test_zero_durations_are_valid_and_undefined_ratios_are_null():
    code, out, err = run_cli(["simulate", "1f1b", "--forward", "0", "--backward", "0", "--json"])
    assert code == 0, err
    data = json.loads(out)
    assert data["makespan_s"] == 0 and data["bubble_ratio"] is None and data["microbatches_per_s"] is None
    code, out, err = run_cli(["simulate", "1f1b", "--forward", "0", "--backward", "0"])
    assert code == 0 and "undefined" in out


def _strict_loads(text):
    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_json_outputs_are_strict(workdir):
    for argv in (["simulate", "1f1b", "--forward", "0", "--backward", "0", "--json"],
                 ["show", "1f1b", "--json"], ["list", "--json"],
                 ["sweep", "--families", "gpipe", "--forward", "0", "--backward", "0", "--json",
                  "--json-out", "s.json"],
                 ["simulate", "1f1b", "--forward", "0", "--backward", "0", "--trace", "t.json"]):
        code, out, err = run_cli(argv)
        assert code == 0, err
        if "--json" in argv:
            _strict_loads(out)
    _strict_loads((workdir / "s.json").read_text())
    _strict_loads((workdir / "t.json").read_text())


# -- hypothesis: mutated valid inputs keep the contract ------------------------------------------------------
VALID_TOML = '[schedule]\nfamily = "1f1b"\ndevices = 3\nmicrobatches = 4\noptions = {}\n'
VALID_CSV = to_torch_csv(dp.schedules.get("zb-h1", devices=2, microbatches=3))
VALID_ARGV = ["show", "interleaved-1f1b", "--devices", "2", "--microbatches", "4", "--option", "chunks=2"]


def _mutate(text: str, data) -> str:
    kind = data.draw(st.sampled_from(["delete", "insert", "replace", "duplicate-line"]))
    i = data.draw(st.integers(0, len(text)))
    if kind == "delete":
        j = data.draw(st.integers(i, min(len(text), i + 8)))
        return text[:i] + text[j:]
    piece = data.draw(st.sampled_from(['"', "=", "[", "]", "\n", ",", "0", "-1", "true", "x", "1e400", "{",
                                       "F", "B", "W", "9", ";", "(", "\x00", "é", "99999"]))
    if kind == "insert":
        return text[:i] + piece + text[i:]
    if kind == "replace":
        return text[:i] + piece + text[i + 1:]
    lines = text.splitlines(keepends=True)
    k = data.draw(st.integers(0, max(0, len(lines) - 1)))
    return "".join(lines[:k + 1] + lines[k:])


def _contract(argv, folder: Path):
    before = snapshot(folder)
    code, _, err = run_cli(argv)
    assert code in (0, 2), err
    assert "Traceback" not in err
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("diffpipe: error: "), err
        assert snapshot(folder) == before
    return code


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(data=st.data())
def test_mutated_toml_keeps_the_contract(data, workdir):
    text = VALID_TOML
    for _ in range(data.draw(st.integers(1, 3))):
        text = _mutate(text, data)
    (workdir / "m.toml").write_bytes(text.encode("utf-8", "surrogatepass"))
    _contract(["show", "--config", "m.toml", "--max-ops", "20000", "--json"], workdir)


@FAST
@given(data=st.data())
def test_mutated_torch_csv_keeps_the_contract(data, workdir):
    text = VALID_CSV
    for _ in range(data.draw(st.integers(1, 3))):
        text = _mutate(text, data)
    (workdir / "m.csv").write_bytes(text.encode())
    (workdir / "out.csv").unlink(missing_ok=True)
    code = _contract(["export", "--torch-csv", "m.csv", "--csv", "out.csv", "--max-ops", "20000"], workdir)
    assert (workdir / "out.csv").exists() == (code == 0)


@FAST
@given(data=st.data())
def test_mutated_argv_keeps_the_contract(data, workdir):
    argv = list(VALID_ARGV)
    for _ in range(data.draw(st.integers(1, 3))):
        kind = data.draw(st.sampled_from(["drop", "insert", "swap"]))
        i = data.draw(st.integers(0, len(argv)))
        token = data.draw(st.sampled_from(["--devices", "--microbatches", "--option", "0", "-1", "x", "",
                                           "chunks=0", "chunks=x", "--json", "--torch-csv", "keep.csv",
                                           "--config", "keep.json", "1f1b", "99999", "nan", "--max-ops"]))
        if kind == "drop" and argv:
            argv.pop(min(i, len(argv) - 1))
        elif kind == "insert":
            argv.insert(i, token)
        elif argv:
            argv[min(i, len(argv) - 1)] = token
    if argv[:1] != ["show"]:  # keep the mutation on one cheap command (no JAX, no outputs)
        argv = ["show", *argv]
    _contract(argv + ["--max-ops", "20000"], workdir)


def test_a_failed_check_inside_jit_is_one_line(monkeypatch):
    """``eqx.error_if`` inside jit: one line with the check's own message, none of JAX's log."""
    import equinox as eqx
    import jax

    checked = jax.jit(lambda x: eqx.error_if(x, x < 0, "hardware: bandwidth must be positive, got -1.0"))
    monkeypatch.setattr(dp.schedules, "table", lambda schedule: checked(-1.0))
    code, _, err = run_cli(["show", "1f1b"])
    assert_one_line(code, err, "diffpipe: error: hardware: bandwidth must be positive, got -1.0")
