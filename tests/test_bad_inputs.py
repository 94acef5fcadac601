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
import functools
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import diffpipe as dp
from diffpipe import _io, _machine_format, cli
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
#: Bad TOML values for each kind of key in ``_machine_format.SCHEMA`` (written as TOML), chosen by hand.
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
    "framework": ['"deepspeed"', 'true', '1', '""', '"Megatron"'],
    "sequence": ['"abc"', 'true', '0', '-3', '1.5', '"4"', '[4]', '"longest"'],
    "flash_version": ['0', '4', '"3"', 'true', '2.0', '[2]'],
}
#: What each section needs besides the bad key to be otherwise complete.
COMPANION = {"times": {"forward": "1", "backward": "2"}}


def toml_value_cases() -> list[Case]:
    cases = []
    for section, keys in _machine_format.SCHEMA.items():
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
        ("old-key-microbatch", "[model]\nmicrobatch = 2\n", "unknown key 'microbatch' in [model]"),
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
        ("tp-zero", ("--tp", "0"), "--tp"),
        ("old-flag-tensor", ("--tensor", "2"), "unrecognized arguments: --tensor"),
        ("old-flag-pipeline", ("--pipeline", "2"), "unrecognized arguments: --pipeline"),
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


# -- issue 20: the newer surfaces (plan, calibrate, Hugging Face configs, sizes, outputs) --------------------
HF = ROOT / "tests" / "data" / "hf"
HF_BASES = ("llama-3-8b", "mixtral-8x7b", "qwen2-57b-a14b", "deepseek-v3")
#: Bad values by the kind of a Hugging Face key (``_model._hf._FIELDS``), as JSON.
HF_BAD = {
    "count": ["0", "-1", '"32"', "1.5", "true", "[32]", "{}"],
    "natural": ["-1", '"1"', "0.5", "false"],
    "bool": ['"false"', '"true"', "0", "1", "[]"],
    "name": ['["llama"]', "5", "true", "{}"],
    "blocks": ['"0"', "[-1]", '["a"]', "5", "[1.5]"],
}
#: Consistency: (base, key, JSON value, culprit).
HF_INCONSISTENT = [
    ("qwen2-57b-a14b", "decoder_sparse_step", "0", "decoder_sparse_step"),
    ("qwen2-57b-a14b", "moe_intermediate_size", "0", "moe_intermediate_size"),
    ("deepseek-v3", "moe_layer_freq", "0", "moe_layer_freq"),
    ("deepseek-v3", "moe_intermediate_size", "0", "moe_intermediate_size"),
    ("mixtral-8x7b", "num_experts_per_tok", "9", "num_experts_per_tok"),
    ("qwen2-57b-a14b", "mlp_only_layers", "[99]", "mlp_only_layers"),
    ("deepseek-v3", "first_k_dense_replace", "1000", "first_k_dense_replace"),
    ("qwen2-57b-a14b", "decoder_sparse_step", "100", "decoder_sparse_step"),
    ("llama-3-8b", "model_type", '"gpt2"', "model_type"),
    ("llama-3-8b", "hidden_act", '"gelu"', "hidden_act"),
    ("llama-3-8b", "num_hidden_layers", "1000000000", "layers"),
    ("llama-3-8b", "num_hidden_layers", "null", "num_hidden_layers"),
]


def hf_configs() -> list[tuple[str, str, str]]:
    """``(name, JSON text, culprit)`` of bad Hugging Face configs: every key diffpipe reads, with
    each bad value of its kind, in each base config holding it, and the consistency cases."""
    from diffpipe._model._hf import _FIELDS

    out = []
    for base in HF_BASES:
        data = json.loads((HF / f"{base}.json").read_text())
        for key, kind in _FIELDS.items():
            if key not in data and base != "llama-3-8b":
                continue  # every key is tried once on llama (present or not), then where it is present
            for i, bad in enumerate(HF_BAD[kind]):
                text = json.dumps({**data, key: "@"}).replace('"@"', bad)
                out.append((f"hf-{base}-{key}-{i}", text, key))
    for base, key, bad, culprit in HF_INCONSISTENT:
        data = json.loads((HF / f"{base}.json").read_text())
        out.append((f"hf-{base}-{key}-{bad}", json.dumps({**data, key: "@"}).replace('"@"', bad), culprit))
    deep = "[" * 200_000
    out += [("hf-nested", deep, "nested too deeply"), ("hf-nan", '{"model_type": NaN}', "NaN"),
            ("hf-list", "[1, 2]", "JSON object"), ("hf-truncated", '{"model_type": "llama",', "not JSON")]
    return out


def _event(name, ts, dur):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


#: A valid two-rank GPipe-ordered step (calibrates; ``test_good_trace_calibrates``).
GOOD_TRACE = [[_event("PP:0F0", 0, 100), _event("PP:0F1", 110, 100), _event("PP:0B0", 400, 200),
               _event("PP:0B1", 610, 200)],
              [_event("PP:1F0", 120, 100), _event("PP:1B0", 230, 150), _event("PP:1F1", 390, 100),
               _event("PP:1B1", 500, 150)]]


def _trace_text(rank, events=None, info=None, raw=None):
    info = {"rank": rank, "world_size": 2} if info is None else info
    text = json.dumps({"distributedInfo": info, "host_name": "h",
                       "traceEvents": GOOD_TRACE[rank] if events is None else events})
    return text if raw is None else text.replace('"@"', raw)


def trace_cases() -> list[Case]:
    argv = ("calibrate", "r0.json", "r1.json", "--out", "out.toml")
    good1 = _trace_text(1)
    bad = []
    for key, value, culprit in (("ts", "NaN", "NaN"), ("ts", '"nan"', "ts must be"), ("ts", "1e400", "ts must be"),
                                ("ts", '"5"', "ts must be"), ("ts", "null", "ts must be"),
                                ("ts", "true", "ts must be"), ("dur", "-5", "dur must be"),
                                ("dur", '"nan"', "dur must be"), ("dur", "1e400", "dur must be"),
                                ("dur", '"20"', "dur must be"), ("dur", "-1e-9", "dur must be")):
        events = [dict(e) for e in GOOD_TRACE[0]]
        events[2][key] = "@"
        bad.append((f"{key}-{value}", _trace_text(0, events, raw=value), good1, culprit))
    infos = [("rank-negative", {"rank": -1, "world_size": 2}, "rank"),
             ("rank-string", {"rank": "0", "world_size": 2}, "rank"),
             ("rank-bool", {"rank": True, "world_size": 2}, "rank"),
             ("rank-float", {"rank": 0.0, "world_size": 2}, "rank"),
             ("rank-outside", {"rank": 5, "world_size": 2}, "outside world_size"),
             ("rank-huge", {"rank": 10**12}, "outside world_size"),
             ("world-float", {"rank": 0, "world_size": 1e12}, "world_size"),
             ("world-huge", {"rank": 0, "world_size": 10**12}, "world_size"),
             ("world-zero", {"rank": 0, "world_size": 0}, "world_size"),
             ("world-string", {"rank": 0, "world_size": "2"}, "world_size"),
             ("world-differs", {"rank": 0, "world_size": 3}, "world_size")]
    for name, info, culprit in infos:
        bad.append((name, _trace_text(0, info=info), good1, culprit))
    labels = [("stage-huge", "PP:999999999999F0", "stage"), ("microbatch-huge", "PP:0F999999999", "microbatch"),
              ("gpipe-huge", "Forward 99999999999", "microbatch"), ("both-huge", "PP:99999F99999", "stage")]
    for name, label, culprit in labels:
        events = [dict(e) for e in GOOD_TRACE[0]]
        events[1]["name"] = label
        bad.append((name, _trace_text(0, events), good1, culprit))
    bad += [("nested", "[" * 200_000, good1, "nested too deeply"), ("same-rank-twice", _trace_text(1), good1,
                                                                       "no trace of rank 0")]
    return [Case(f"trace-{n}", argv, c, (("r0.json", t0.encode()), ("r1.json", t1.encode())))
            for n, t0, t1, c in bad]


def issue20_cases() -> list[Case]:
    files = (("ok.csv", GOOD_CSV.encode()), ("f.json", (HF / "llama-3-8b.json").read_bytes()),
             ("r0.json", _trace_text(0).encode()), ("r1.json", _trace_text(1).encode()))
    plan = ("plan", "--model", "llama-3-8b", "--gpus", "8", "--global-batch", "8")
    cases = []
    # argparse never abbreviates: every prefix of a flag is an unknown argument
    abbreviations = [
        (plan + ("--mode", "blocking"), "--mode"), (plan + ("--mod", "x"), "--mod"),
        (("plan", "--mod", "llama-3-8b", "--gpus", "8", "--global-batch", "8"), "--mod"),
        (("plan", "--model", "llama-3-8b", "--gpu", "8", "--global-batch", "8"), "--gpu"),
        (plan + ("--fam", "1f1b"), "--fam"), (plan + ("--head", "0.2"), "--head"),
        (plan + ("--export", "megatron", "--ou", "keep.csv"), "--ou"),
        (("simulate", "1f1b", "--forw", "1", "--backward", "1"), "--forw"),
        (("simulate", "1f1b", "--forward", "1", "--back", "1"), "--back"),
        (("show", "1f1b", "--dev", "4"), "--dev"), (("show", "1f1b", "--micro", "4"), "--micro"),
        (("show", "1f1b", "--opt", "chunks=2"), "--opt"), (("show", "--torch", "ok.csv"), "--torch"),
        (("sweep", "--fam", "gpipe"), "--fam"), (("sweep", "--families", "gpipe", "--json-o", "x.json"), "--json-o"),
        (("compare", "--mark"), "--mark"), (("export", "1f1b", "--cs", "keep.csv"), "--cs"),
        (("optimize", "1f1b", "--kno", "stages"), "--kno"), (("list", "--js"), "--js"),
        (("calibrate", "r0.json", "r1.json", "--sched", "1f1b"), "--sched"),
        (("calibrate", "r0.json", "r1.json", "--o", "x.toml"), "--o"),
        (("simulate", "--model", "llama-3-8b", "--global", "8"), "--global"),
        (("show", "1f1b", "--max", "10"), "--max"),
    ]
    cases += [Case(f"abbrev-{i}", a, f"unrecognized arguments: {c}", files) for i, (a, c) in enumerate(abbreviations)]
    # flags a command cannot use
    unusable = [
        (plan + ("--families", "1f1b", "--vpp", "4"), "virtual=(4,) cannot take effect"),
        (plan + ("--families", "1f1b,gpipe", "--vpp", "2,4"), "cannot take effect"),
        (plan + ("--ep", "2"), "needs a mixture-of-experts model"),
        (plan + ("--ep", "1,2"), "needs a mixture-of-experts model"),
        (plan + ("--sequence-parallel", "--tp", "1"), "sequence_parallel=True needs a tensor size above 1"),
        (("plan", "--model", "mixtral-8x7b", "--gpus", "8", "--global-batch", "8", "--ep", "3"),
         "does not divide the model's 8 experts"),
        (("compare", "--model", "llama-3-8b", "--global-batch", "8", "--option", "chunks=2"), "--option"),
        (("compare", "--model", "llama-3-8b", "--global-batch", "8", "--option", "segments=2"), "--option"),
        (("compare", "1f1b", "--model", "llama-3-8b", "--global-batch", "8", "--pp", "2", "--gpus", "2", "--vpp",
          "2"), "--vpp"),
        (("compare", "1f1b", "gpipe", "--model", "llama-3-8b", "--global-batch", "8", "--option", "segments=2"),
         "segments is not an option of 1f1b, gpipe"),
        (plan + ("--mode", "overlap"), "--mode"),
        (plan + ("--option", "chunks=2"), "--option"),
        (plan + ("--devices", "4"), "--devices"),
        (("calibrate", "r0.json", "--max-ops", "5"), "--max-ops"),
    ]
    cases += [Case(f"unusable-{i}", a, c, files) for i, (a, c) in enumerate(unusable)]
    # sizes, refused from the sizes alone
    sizes = [
        (("plan", "--model", "llama-3-8b", "--gpus", "1000000000", "--global-batch", "8"), "gpus must be"),
        (("plan", "--model", "llama-3-8b", "--cluster", "1000000000xH100", "--global-batch", "8"), "gpus must be"),
        (("plan", "--model", "llama-3-8b", "--cluster", "H100x99999999999999", "--global-batch", "8"), "gpus must be"),
        (("simulate", "--model", "llama-3-8b", "--global-batch", "8", "--gpus", "2000000"), "gpus must be"),
        (("show", "v-schedule", "--devices", "64", "--microbatches", "2048", "--option", "forward=2"),
         "past the limit"),
        (("show", "v-schedule", "--devices", "32"), "past the limit"),
        (("simulate", "v-schedule", "--devices", "24", "--forward", "1", "--backward", "1"), "past the limit"),
        (("sweep", "--families", "v-schedule", "--devices", "32,64"), "past the limit"),
        (("compare", "v-schedule", "--devices", "40"), "past the limit"),
    ]
    cases += [Case(f"size-{i}", a, c, files) for i, (a, c) in enumerate(sizes)]
    for i, cell in enumerate(("999999999999B0", "0F999999999999", "99999F99999", "(1F1;999999999I0)OVERLAP_F_B")):
        text = f"0F0,0B0\n1F0,{cell}\n".encode()
        for label, argv in (("show", ("show", "--torch-csv", "big.csv")),
                            ("export", ("export", "--torch-csv", "big.csv", "--csv", "keep.csv"))):
            cases.append(Case(f"size-csv-{i}-{label}", argv, "compute actions", (("big.csv", text),)))
    # --option values past a float's range, in every command that takes family options
    for value in ("inf", "-inf", "nan", "1e400"):
        for name, argv in (("show", ("show", "v-schedule")),
                           ("simulate", ("simulate", "v-schedule", "--forward", "1", "--backward", "1")),
                           ("export", ("export", "v-schedule", "--csv", "keep.csv")),
                           ("optimize", ("optimize", "v-schedule", "--device", "A100")),
                           ("compare", ("compare", "v-schedule")),
                           ("sweep", ("sweep", "--families", "v-schedule", "--csv", "keep.csv"))):
            for option in ("memory", "forward"):
                cases.append(Case(f"option-{option}-{value}-{name}", argv + ("--option", f"{option}={value}"),
                                  f"{option} must be"))
    # an output that is one of the inputs
    same = [
        (("calibrate", "r0.json", "r1.json", "--out", "r0.json"), "also an input"),
        (("calibrate", "r0.json", "r1.json", "--out", "./r1.json"), "also an input"),
        (("calibrate", "r0.json", "r1.json", "--schedule", "ok.csv", "--out", "ok.csv"), "also an input"),
        (("export", "--torch-csv", "ok.csv", "--csv", "ok.csv"), "also the input of --torch-csv"),
        (("export", "--torch-csv", "ok.csv", "--csv", "./ok.csv"), "also the input of --torch-csv"),
        (("sweep", "--families", "gpipe", "--config", "a.toml", "--csv", "a.toml"), "also the input of --config"),
        (("simulate", "1f1b", "--config", "a.json", "--trace", "a.json"), "also the input of --config"),
        (plan[:1] + ("--hf-config", "f.json", "--gpus", "8", "--global-batch", "8", "--export", "megatron",
                     "--out", "f.json"), "also the input of --hf-config"),
    ]
    toml = (("a.toml", b"[schedule]\nfamily = 'gpipe'\n"), ("a.json", b"[schedule]\nfamily = '1f1b'\n"))
    cases += [Case(f"same-{i}", a, c, files + toml) for i, (a, c) in enumerate(same)]
    # Hugging Face configs through the command line (the library table tries them all)
    hf = hf_configs()
    for name, text, _ in hf[::7] + hf[-4:]:
        argv = ("plan", "--hf-config", "h.json", "--gpus", "8", "--global-batch", "8")
        cases.append(Case(f"cli-{name}", argv, "h.json", (("h.json", text.encode()),)))
    return cases + trace_cases()


CASES = (toml_value_cases() + toml_structure_cases() + encoding_cases() + csv_cases() + flag_cases()
         + output_cases() + issue20_cases())


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
    # the communication mode left the network for the graph: each old spelling says where it went
    ("network-mode-moved", lambda: dp.Network(0.0, 1.0, 0.0, 1.0, mode="contention"),
     "Network: mode= moved to compile(communication=...)"),
    ("network-uniform-mode-moved", lambda: dp.Network.uniform(1e-6, mode="contention"),
     "Network.uniform: mode= moved to compile(communication=...)"),
    ("from-times-mode-moved", lambda: dp.Hardware.from_times(1.0, 2.0, mode="blocking"),
     "Hardware.from_times: mode= moved to compile(communication=...)"),
    ("presets-network-mode-moved", lambda: dp.presets.network("nvlink4", "ib-ndr", mode="contention"),
     "presets.network: mode= moved to compile(communication=...)"),
    ("calibration-hardware-mode-moved",
     lambda: dp.calibrate.Calibration(forward=(1.0,), backward=(2.0,)).hardware(mode="torch-runtime"),
     "Calibration.hardware: mode= moved to predict(mode=...)"),
    ("calibration-workload-mode-moved",
     lambda: dp.calibrate.Calibration(forward=(1.0,), backward=(2.0,)).workload(mode="torch-runtime"),
     "Calibration.workload: mode= moved to predict(mode=...)"),
    # so did the topology: devices_per_node is the graph's
    ("network-devices-per-node-moved", lambda: dp.Network(0.0, 1.0, 0.0, 1.0, devices_per_node=8),
     "Network: devices_per_node= moved to compile(devices_per_node=...)"),
    ("network-uniform-devices-per-node-moved", lambda: dp.Network.uniform(1e-6, devices_per_node=8),
     "Network.uniform: devices_per_node= moved to compile(devices_per_node=...)"),
    ("presets-network-devices-per-node-moved",
     lambda: dp.presets.network("nvlink4", "ib-ndr", devices_per_node=4),
     "presets.network: devices_per_node= moved to compile(devices_per_node=...)"),
    ("simulate-graph-devices-per-node",
     lambda: dp.simulate(dp.compile(dp.schedules.get("1f1b", devices=4, microbatches=4), devices_per_node=2),
                         dp.Hardware.from_times(1.0, 2.0), devices_per_node=1),
     "simulate: devices_per_node=1 applies to a Schedule; this graph was compiled for 2"),
]


_TINY = dict(layers=8, hidden=256, heads=8, sequence=128, vocabulary=1000)


def _tiny():
    return dp.Transformer(**_TINY)


def _empty_table():
    from diffpipe._plan._table import PlanTable

    return PlanTable((), {}, 0, 0, {}, _tiny(), dp.Cluster(gpus=8), 8)


def _launch():
    return dp.Launch("1f1b", dp.Parallelism(pipeline=2, data=4), microbatch_size=1, global_batch=8, sequence=128,
                     layers_per_stage=(4, 4))


def _configuration(**changes):
    args = dict(model=_tiny(), parallelism=dp.Parallelism(pipeline=2, data=4), cluster=dp.Cluster(gpus=8),
                global_batch=8)
    args.update(changes)
    return dp.Configuration(args.pop("model"), args.pop("parallelism"), args.pop("cluster"), args.pop("global_batch"),
                            **args)


def _plan(**changes):
    return dp.plan(_tiny(), dp.Cluster(gpus=8), 8, **{"progress": False, "balance": False, **changes})


def _trace_files(t0, t1=None):
    Path("r0.json").write_text(t0)
    Path("r1.json").write_text(_trace_text(1) if t1 is None else t1)
    return ["r0.json", "r1.json"]


#: Issue 20's library entry points: (name, call, culprit). Files they write are removed by the
#: test (``LIBRARY_SCRATCH``); nothing else may change.
LIBRARY_SCRATCH = ("b.bin", "r0.json", "r1.json", "h.json", "big.csv")
LIBRARY_20 = [
    ("trace-schedule-str", lambda: dp.calibrate.from_torch_trace(_trace_files(_trace_text(0)), schedule="gpipe"),
     "schedule must be a diffpipe Schedule"),
    ("trace-schedule-int", lambda: dp.calibrate.from_torch_trace(_trace_files(_trace_text(0)), schedule=3),
     "schedule must be"),
    ("trace-paths-int", lambda: dp.calibrate.from_torch_trace(5), "paths"),
    ("trace-paths-none", lambda: dp.calibrate.from_torch_trace(None), "paths"),
    ("trace-paths-mixed", lambda: dp.calibrate.from_torch_trace(["r0.json", 3]), "paths"),
    ("trace-nan-ts", lambda: dp.calibrate.from_torch_trace(_trace_files(_trace_text(0).replace('"ts": 110',
                                                                                               '"ts": NaN'))), "NaN"),
    ("trace-negative-dur", lambda: dp.calibrate.from_torch_trace(_trace_files(
        _trace_text(0).replace('"dur": 200', '"dur": -200', 1))), "dur must be"),
    ("megatron-args-str", lambda: dp.megatron_args("1f1b"), "launch must be a Launch"),
    ("megatron-args-none", lambda: dp.megatron_args(None), "launch must be a Launch"),
    ("torchtitan-str", lambda: dp.torchtitan_toml("1f1b"), "launch must be a Launch"),
    ("torchtitan-config", lambda: dp.torchtitan_toml(_configuration()), "launch must be a Launch"),
    ("table-row-99", lambda: _empty_table().configuration(99), "row i must be"),
    ("table-row-str", lambda: _empty_table().launch("0"), "row i must be"),
    ("table-row-float", lambda: _empty_table().parallelism(0.0), "row i must be"),
    ("table-row-0-empty", lambda: _empty_table().configuration(0), "row i must be"),
    ("cluster-bandwidth-zero", lambda: dp.Cluster(memory_bandwidth=0), "memory_bandwidth must be positive"),
    ("cluster-bandwidth-negative", lambda: dp.Cluster(memory_bandwidth=-1e12), "memory_bandwidth must be positive"),
    ("cluster-bandwidth-nan", lambda: dp.Cluster(memory_bandwidth=float("nan")), "memory bandwidth"),
    ("cluster-gpus-huge", lambda: dp.Cluster(gpus=10**9), "gpus must be"),
    ("cluster-gpus-float", lambda: dp.Cluster(gpus=8.0), "gpus must be"),
    ("cluster-gpus-bool", lambda: dp.Cluster(gpus=True), "gpus must be"),
    ("configuration-layers-float", lambda: _configuration(layers_per_stage=[4.5, 3.5]), "layers_per_stage entry"),
    ("configuration-layers-truncated", lambda: _configuration(layers_per_stage=[4.9, 3.1]), "layers_per_stage entry"),
    ("configuration-layers-str", lambda: _configuration(layers_per_stage="44"), "layers_per_stage must be"),
    ("configuration-layers-int", lambda: _configuration(layers_per_stage=8), "layers_per_stage must be"),
    ("configuration-layers-negative", lambda: _configuration(layers_per_stage=[9, -1]), "layers_per_stage entry"),
    ("configuration-layers-bool", lambda: _configuration(layers_per_stage=[True, 7]), "layers_per_stage entry"),
    ("plan-balance-str", lambda: _plan(balance="no"), "balance must be True or False"),
    ("plan-balance-int", lambda: _plan(balance=0), "balance must be True or False"),
    ("plan-progress-str", lambda: _plan(progress="yes"), "progress must be"),
    ("plan-communication-int", lambda: _plan(communication=3), "communication"),
    ("plan-virtual-no-chunks", lambda: _plan(virtual=4, families=("1f1b",)), "cannot take effect"),
    ("plan-expert-dense", lambda: _plan(expert=2), "mixture-of-experts"),
    ("plan-sp-no-tensor", lambda: _plan(sequence_parallel=True, tensor=1), "sequence_parallel=True"),
    ("plan-headroom-str", lambda: _plan(headroom="0.1"), "headroom"),
    ("plan-global-batch-float", lambda: dp.plan(_tiny(), dp.Cluster(gpus=8), 8.0), "global_batch"),
    ("layout-huge-repeat", lambda: dp.parse_megatron_layout("Et*100000000000L"), "unrolls past"),
    ("layout-nested-repeat", lambda: dp.parse_megatron_layout("E" + "(t*1000)*1000" * 3 + "L"), "unrolls past"),
    ("layout-deep", lambda: dp.parse_megatron_layout("(" * 100_000 + "t"), "nested past"),
    ("layout-many-digits", lambda: dp.parse_megatron_layout("Et*" + "9" * 5000 + "L"), "unrolls past"),
    ("layout-int", lambda: dp.parse_megatron_layout(5), "megatron layout"),
    ("transformer-layers-huge", lambda: dp.Transformer(**{**_TINY, "layers": 10**9}), "layers must be at most"),
    ("v-schedule-memory-inf", lambda: dp.schedules.get("v-schedule", devices=4, microbatches=8, memory=math.inf),
     "memory must be a finite number"),
    ("v-schedule-memory-nan", lambda: dp.schedules.get("v-schedule", devices=4, microbatches=8, memory=math.nan),
     "memory must be a finite number"),
    ("v-schedule-forward-inf", lambda: dp.schedules.get("v-schedule", devices=4, microbatches=8, forward=math.inf),
     "forward must be a finite number"),
    ("v-schedule-ranking-huge", lambda: dp.schedules.get("v-schedule", devices=64, microbatches=2048, forward=2.0),
     "over the limit"),
    ("csv-huge-stage", lambda: (Path("big.csv").write_text("0F0,999999999999B0\n"), from_torch_csv("big.csv"))[1],
     "compute actions"),
    ("load-json-nested", lambda: (Path("h.json").write_text("[" * 200_000), _io.load_json("h.json"))[1],
     "nested too deeply"),
    ("load-json-nan", lambda: (Path("h.json").write_text("[NaN]"), _io.load_json("h.json"))[1], "NaN"),
    ("load-json-infinity", lambda: (Path("h.json").write_text('{"a": -Infinity}'), _io.load_json("h.json"))[1],
     "-Infinity"),
]


def _hf_file(text):
    Path("h.json").write_text(text)
    return dp.Transformer.from_hf_config("h.json")


LIBRARY_20 += [(name, functools.partial(_hf_file, text), culprit) for name, text, culprit in hf_configs()]


@pytest.mark.parametrize("name, make, culprit", LIBRARY_20, ids=[c[0] for c in LIBRARY_20])
def test_library_bad_input_issue_20(name, make, culprit, workdir):
    before = snapshot(workdir)
    with pytest.raises((dp.ScheduleError, dp.ConfigError)) as info:
        make()
    message = str(info.value)
    assert "\n" not in message and culprit in message, message
    if name.startswith("hf-") and culprit != "layers":
        assert message.startswith("h.json"), message  # the file, then the key
    assert {k: v for k, v in snapshot(workdir).items() if k not in LIBRARY_SCRATCH} == before


def test_good_inputs_of_issue_20_still_work(workdir):
    """The valid neighbours of the bad inputs above: unchanged behaviour."""
    cal = dp.calibrate.from_torch_trace(_trace_files(_trace_text(0)))
    assert cal.stages == 2 and cal.orders == (("0F0", "0F1", "0B0", "0B1"), ("1F0", "1B0", "1F1", "1B1"))
    for base in HF_BASES:
        dp.Transformer.from_hf_config(HF / f"{base}.json")
    assert dp.parse_megatron_layout("E|(t*4|)*2,t*3L") == (0, 4, 4, 3)
    assert _configuration(layers_per_stage=[5, 3]).layers_per_stage == (5, 3)
    assert dp.Cluster(gpus=2**20).gpus == 2**20


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


def test_a_signal_wrapped_by_an_import_still_ends_as_that_signal(monkeypatch):
    # a SIGTERM that lands inside an extension's initialisation comes back as that import's error
    from diffpipe.cli import _main

    def import_interrupted(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except BaseException as error:
            raise ImportError("Encountered an error while initializing the extension.") from error

    monkeypatch.setattr(_main, "_cmd_list", import_interrupted)
    code, _, err = run_cli(["list"])
    assert code == 143 and err.strip() == "diffpipe: terminated (no file was changed)"


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


def _long_trace(folder: Path, microbatches: int = 8000) -> list[str]:
    """Two ranks of a GPipe-ordered step: calibrating it simulates the traced schedule (about 15 s on
    an idle 2-core machine at 8,000 microbatches; 2,000 took 3 s, the test's own wait)."""
    names = []
    for rank in range(2):
        events, t = [], 0
        for kind, dur in (("F", 10), ("B", 20)):
            for i in range(microbatches):
                events.append({"ph": "X", "name": f"PP:{rank}{kind}{i}", "ts": t, "dur": dur, "pid": 1, "tid": 1})
                t += dur + 2
        (folder / f"r{rank}.json").write_text(json.dumps({"distributedInfo": {"rank": rank, "world_size": 2},
                                                          "host_name": "h", "traceEvents": events}))
        names.append(f"r{rank}.json")
    return names


@pytest.mark.parametrize("command", ["plan", "sweep", "calibrate"])
def test_sigterm_ends_a_long_command_promptly_leaving_nothing(command, tmp_path):
    """SIGTERM a few seconds into a long plan, sweep or calibrate (each runs for tens of seconds
    or more): exit code 143 within 5 s, one line, and nothing new in the output directory. The
    signal's exception may land where it is swallowed (JAX's callbacks) or wait behind a compiled
    call: the CLI then ends itself after its grace (``cli._main.GRACE_S``)."""

    argv = {"plan": ["plan", "--model", "llama-3-70b", "--gpus", "64", "--global-batch", "64", "--export",
                     "megatron", "--out", "out.txt"],
            "sweep": ["sweep", "--families", "gpipe,1f1b,zb-h1,interleaved-1f1b", "--devices", "4,8,16",
                      "--microbatches", "16,32,64,128", "--csv", "out.csv", "--max-ops", "100000000"],
            "calibrate": ["calibrate", *_long_trace(tmp_path), "--out", "out.toml"]}[command]
    before = snapshot(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-m", "diffpipe", *argv], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)
        assert child.poll() is None, child.stderr.read()  # still working: the input is long enough
        child.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, err = child.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 143, err
    assert err.count("\n") == 1 and "terminated" in err, err
    assert took < 5, took
    assert snapshot(tmp_path) == before


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


# -- hypothesis, issue 20: Hugging Face configs, traces, plan flags, the API's constructors ------------------
def _library_contract(make):
    """A call either succeeds or raises one line of diffpipe's own errors."""
    try:
        make()
    except (dp.ConfigError, dp.ScheduleError) as error:
        assert "\n" not in str(error), str(error)
        return False
    return True


_JSON_VALUES = st.sampled_from(["0", "-1", "1", "2", "7", "1.5", "1e400", '"8"', '"false"', "true", "false", "null",
                                "[]", "[0]", "[1, 99]", "{}", '"llama"', '"mixtral"', '"qwen2_moe"', '"deepseek_v3"',
                                "100000000000", '"silu"', '"gelu"', "NaN"])


@FAST
@given(data=st.data())
def test_mutated_hf_config_keeps_the_contract(data, workdir):
    """A valid config.json with keys given other JSON values (and text mutations): a Transformer,
    or one ConfigError line."""
    from diffpipe._model._hf import _FIELDS

    base = data.draw(st.sampled_from(HF_BASES))
    parsed = json.loads((HF / f"{base}.json").read_text())
    keys = data.draw(st.lists(st.sampled_from(sorted(_FIELDS) + sorted(parsed)), min_size=1, max_size=3))
    values = [data.draw(_JSON_VALUES) for _ in keys]
    text = json.dumps({**parsed, **{k: f"@{i}" for i, k in enumerate(keys)}})
    for i, value in enumerate(values):
        text = text.replace(f'"@{i}"', value)
    if data.draw(st.booleans()):
        text = _mutate(text, data)
    (workdir / "h.json").write_text(text)
    _library_contract(lambda: dp.Transformer.from_hf_config("h.json"))


@FAST
@given(data=st.data())
def test_mutated_trace_keeps_the_contract(data, workdir):
    """A valid two-rank trace with event fields, ranks and labels replaced (and text mutations):
    calibrate succeeds or prints one line, and its --out is written only on success."""
    rank = data.draw(st.sampled_from([0, 1]))
    events = [dict(e) for e in GOOD_TRACE[rank]]
    for _ in range(data.draw(st.integers(1, 3))):
        event = data.draw(st.sampled_from(events))
        key = data.draw(st.sampled_from(["ts", "dur", "name", "ph"]))
        event[key] = data.draw(st.sampled_from([-1, 0, 1e9, 1e400, "5", None, True, "PP:0F9", "PP:9F0",
                                                "PP:0F99999999999", "Forward 0", "PP:1B1", "X", "B", -1e-3]))
    info = {"rank": rank, "world_size": 2}
    if data.draw(st.booleans()):
        info[data.draw(st.sampled_from(["rank", "world_size"]))] = data.draw(st.sampled_from(
            [-1, 0, 1, 2, 3, 10**12, 1e12, "1", None, True]))
    text = json.dumps({"distributedInfo": info, "host_name": "h", "traceEvents": events})
    if data.draw(st.booleans()):
        text = _mutate(text, data)
    (workdir / f"r{rank}.json").write_text(text)
    (workdir / f"r{1 - rank}.json").write_text(_trace_text(1 - rank))
    code = _contract(["calibrate", "r0.json", "r1.json", "--out", "out.toml"], workdir)
    assert (workdir / "out.toml").exists() == (code == 0)
    (workdir / "out.toml").unlink(missing_ok=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_plan_flags_keep_the_contract(data, workdir, monkeypatch):
    """plan's flags mutated: validated before any search. The search is made infeasible (every
    candidate's closed-form memory is past the GPU), so that an accepted argv ends in its one
    infeasible line quickly instead of a full search."""
    from diffpipe._plan import _search

    real = _search.closed_form

    def huge(*args, **kwargs):
        static, act, *rest = real(*args, **kwargs)
        return (static + 1e30, act, *rest)

    monkeypatch.setattr(_search, "closed_form", huge)
    argv = ["plan", "--model", "llama-3-8b", "--gpus", "8", "--global-batch", "8", "--families", "1f1b"]
    tokens = ["--tp", "--pp", "--ep", "--vpp", "--zero", "--recompute", "--microbatch-size", "--gpus", "--cluster",
              "--sequence", "--families", "--headroom", "--top", "--export", "--out", "--mode", "--mod", "--dp",
              "--sequence-parallel", "--no-sequence-parallel", "--hf-config", "keep.json", "0", "1", "2", "3", "8",
              "-1", "x", "", "1,2", "2,,4", "none,full", "1f1b,gpipe", "interleaved-1f1b", "8xH100", "H100",
              "1000000000", "1e18", "nan", "0.5", "megatron", "mixtral-8x7b", "keep.csv"]
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["drop", "insert", "swap"]))
        i = data.draw(st.integers(1, len(argv)))
        token = data.draw(st.sampled_from(tokens))
        if kind == "drop" and len(argv) > 1:
            argv.pop(min(i, len(argv) - 1))
        elif kind == "insert":
            argv.insert(i, token)
        elif len(argv) > 1:
            argv[min(i, len(argv) - 1)] = token
    assert _contract(argv, workdir) == 2  # nothing fits: every argv is refused, in one line


_CONSTRUCTOR_VALUES = st.sampled_from([0, 1, 2, 8, -1, 1.5, 2.0, math.inf, math.nan, 10**9, True, None, "2", "H100",
                                       (1, 2), [4, 4], 1e30, -0.0])


@FAST
@given(data=st.data())
def test_mutated_constructors_keep_the_contract(data):
    """Cluster, Parallelism, Transformer, Configuration and Launch with fields replaced by other
    values: an object, or one line of diffpipe's own errors (never TypeError, IndexError, ...)."""
    which = data.draw(st.sampled_from(["cluster", "parallelism", "transformer", "configuration", "launch"]))
    fields = {"cluster": ["gpus", "devices_per_node", "memory_bandwidth", "device", "intra", "inter"],
              "parallelism": ["tensor", "pipeline", "data", "virtual", "expert", "zero", "sequence_parallel"],
              "transformer": [*_TINY, "microbatch_size", "kv_heads", "experts", "experts_per_token", "recompute",
                              "ffn_multiplier", "moe_layers", "tied_embedding"],
              "configuration": ["global_batch", "layers_per_stage", "schedule", "communication"],
              "launch": ["microbatch_size", "global_batch", "sequence", "layers_per_stage", "recompute"]}[which]
    changes = {k: data.draw(_CONSTRUCTOR_VALUES) for k in data.draw(st.lists(st.sampled_from(fields), min_size=1,
                                                                             max_size=3, unique=True))}

    def make():
        if which == "cluster":
            return dp.Cluster(**{"gpus": 8, **changes})
        if which == "parallelism":
            return dp.Parallelism(**{"pipeline": 2, "data": 4, **changes})
        if which == "transformer":
            return dp.Transformer(**{**_TINY, **changes})
        if which == "configuration":
            return _configuration(**changes)
        return dp.Launch("1f1b", dp.Parallelism(pipeline=2, data=4), **{
            "microbatch_size": 1, "global_batch": 8, "sequence": 128, "layers_per_stage": (4, 4), **changes})

    _library_contract(make)


def test_a_failed_check_inside_jit_is_one_line(monkeypatch):
    """``eqx.error_if`` inside jit: one line with the check's own message, none of JAX's log."""
    import equinox as eqx
    import jax

    checked = jax.jit(lambda x: eqx.error_if(x, x < 0, "hardware: bandwidth must be positive, got -1.0"))
    monkeypatch.setattr(dp.schedules, "table", lambda schedule: checked(-1.0))
    code, _, err = run_cli(["show", "1f1b"])
    assert_one_line(code, err, "diffpipe: error: hardware: bandwidth must be positive, got -1.0")
