"""The result protocol: ``to_dict``, ``to_json(path=None, indent=2)`` (strict JSON, atomic writes),
``to_csv`` / ``to_markdown`` where tabular, for ``Result`` and ``Comparison`` (``OptimizeResult``:
tests/test_knobs.py); the one TOML value writer."""

import csv
import io
import json
import math
import tomllib

import hypothesis.strategies as st
import numpy as np
from hypothesis import given

import diffpipe as dp
from diffpipe._io import toml_value


def test_result_to_json_is_strict_and_written_atomically(tmp_path):
    s = dp.schedules.get("1f1b", devices=3, microbatches=4)
    result = dp.simulate(s, dp.Hardware.from_times(1.0, 2.0, p2p_time=0.5, capacity=math.inf))
    path = tmp_path / "result.json"
    text = result.to_json(path)
    assert path.read_text() == text
    doc = json.loads(text)  # strict: fits are bools, no NaN/Infinity tokens
    assert doc["makespan"] == float(result.makespan)
    assert doc["ops"] == [str(op) for op in s.ops] and len(doc["start"]) == len(s.ops)
    assert doc["peak_activations"] == [3.0, 2.0, 1.0] and doc["fits"] == [True] * 3
    assert result.to_dict()["busy"].shape == (3,)
    assert json.loads(result.to_json(indent=None)) == doc


def test_comparison_protocol(tmp_path):
    c = dp.compare(["gpipe", "1f1b"], dp.Hardware.from_times(1.0, 2.0), devices=4, microbatches=8)
    doc = json.loads(c.to_json(tmp_path / "c.json"))
    assert doc == json.loads((tmp_path / "c.json").read_text())
    assert [e["name"] for e in doc["schedules"]] == list(c.names)
    rows = list(csv.DictReader(io.StringIO(c.to_csv(tmp_path / "c.csv"))))
    assert [r["name"] for r in rows] == list(c.names)
    assert (tmp_path / "c.csv").read_text() == c.to_csv()
    for r, e in zip(rows, c.entries):
        assert np.isclose(float(r["makespan_s"]), e.simulation["makespan_s"])
        assert r["fits"] == "True"
    assert c.to_markdown().startswith("| schedule |")


_TOML_SCALARS = (
    st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text()
)


@given(st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
                       _TOML_SCALARS | st.lists(_TOML_SCALARS, max_size=4), max_size=4))
def test_toml_value_reads_back_as_written(values):
    """The one TOML writer (machine files, torchtitan exports): every scalar or list it spells,
    control characters and non-ASCII text included, reads back equal through ``tomllib``."""
    text = "".join(f"{key} = {toml_value(value)}\n" for key, value in values.items())
    assert tomllib.loads(text) == {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
