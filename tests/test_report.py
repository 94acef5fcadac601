"""``plan --report``: one self-contained HTML page (issue 24): the scatter, the table, the chosen
step's Gantt chart and breakdown, the exports; no external reference; written whole or not at all;
and, where a headless browser is installed, rendered by it with every image decoded."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from _helpers import hf_config, run

#: A small Llama-style model; on 4 H100s with TP 2 its step has tensor-parallel collectives.
TINY = dict(model_type="llama", num_hidden_layers=8, hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
            intermediate_size=1024, vocab_size=4096, max_position_embeddings=4096, hidden_act="silu",
            tie_word_embeddings=False)
PLAN = ["plan", "--gpus", 4, "--global-batch", 16, "--sequence", 512, "--tp", 2, "--pp", 2,
        "--families", "1f1b,interleaved-1f1b", "--microbatch-size", 1, "--recompute", "none", "--balance-top", 0]


class Page(HTMLParser):
    """Every start tag with its attributes, the ids of the sections, the text of each ``<pre>`` and
    of every table cell, in order."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.sections, self.pre, self.cells, self.text = [], [], [], [], []
        self._in = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "section":
            self.sections.append(attrs.get("id"))
        self._in.append(tag)
        if tag in ("pre", "td", "th"):
            (self.pre if tag == "pre" else self.cells).append("")

    def handle_endtag(self, tag):
        while self._in and self._in.pop() != tag:
            pass

    def handle_data(self, data):
        self.text.append(data)
        if "pre" in self._in:
            self.pre[-1] += data
        elif self._in and self._in[-1] in ("td", "th"):
            self.cells[-1] += data


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """The report and the JSON of one plan (one run: the page's figures are checked against it)."""
    tmp = tmp_path_factory.mktemp("report")
    config = hf_config(tmp, TINY)
    code, out, err = run([*PLAN, "--hf-config", config, "--report", tmp / "report.html", "--json"])
    assert code == 0, err
    return tmp, (tmp / "report.html").read_text(encoding="utf-8"), json.loads(out)


def test_report_has_its_parts_and_no_external_reference(planned):
    tmp, text, data = planned
    assert sorted(p.name for p in tmp.iterdir()) == ["config.json", "report.html"]  # no temporary left
    page = Page()
    page.feed(text)
    page.close()
    assert page.sections == ["scatter", "table", "chosen", "export"]
    tags = [t for t, _ in page.tags]
    assert not {"script", "link", "iframe", "object", "embed", "base"} & set(tags)
    for tag, attrs in page.tags:  # nothing fetched: every reference is inline
        for name in ("src", "href", "srcset", "data", "action", "poster"):
            if name in attrs:
                assert attrs[name].startswith("data:image/png;base64,"), (tag, name)
    assert "http:" not in text and "https:" not in text and "url(" not in text and "@import" not in text
    images = [attrs["src"] for tag, attrs in page.tags if tag == "img"]
    assert len(images) == 2  # the scatter and the chosen step's Gantt chart
    for src in images:
        png = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    # the table: the plan's rows, the first one the chosen; the chosen step's figures: Configuration.evaluate's
    best = data["rows"][0]
    assert f"{best['step_time_s']:.3f}" in page.cells and f"{best['step_time_s']:.4g} s" in page.cells
    assert f"{best['memory_per_gpu_gb']:.1f}" in page.cells
    assert sum(1 for tag, attrs in page.tags if tag == "tr" and attrs.get("class") == "chosen") == 1
    for part in ("compute gemm", "exposed tensor", "bubble"):  # the breakdown, as a table
        assert part in page.cells
    # the exports: Megatron-LM's arguments and torchtitan's TOML of the fastest row each runs
    assert len(page.pre) == 2
    assert "--tensor-model-parallel-size" in page.pre[0] and "--pipeline-model-parallel-size 2" in page.pre[0]
    assert "[parallelism]" in page.pre[1] and "pipeline_parallel_degree = 2" in page.pre[1]


def test_report_bad_path_is_one_line_before_any_work(tmp_path):
    config = hf_config(tmp_path, TINY)
    for target, message in [(tmp_path / "missing" / "r.html", "does not exist"),
                            (tmp_path / "r.pdf", "the suffix must be one of .html, .htm"),
                            (tmp_path, "is a directory")]:
        code, out, err = run([*PLAN, "--hf-config", config, "--report", target])
        assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err
        assert err.startswith("diffpipe: error: --report") and "searching" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def _browser():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.mark.skipif(_browser() is None, reason="no headless browser (chromium, google-chrome) on PATH; "
                                               "Debian: apt-get install chromium")
def test_report_renders_in_a_headless_browser(planned):
    """The page as a browser sees it, every network request refused: both images decode (their
    natural width, written into the DOM by a probe appended to a copy), and a screenshot."""
    tmp, text, _ = planned
    probe = ("<script>window.addEventListener('load', () => document.body.setAttribute('data-images', "
             "Array.from(document.images).map(i => i.complete ? i.naturalWidth : -1).join(',')));</script>")
    copy = tmp / "probe.html"
    copy.write_text(text.replace("</body>", probe + "</body>"), encoding="utf-8")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=5000"]
    dom = subprocess.run([_browser(), *flags, "--dump-dom", copy.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    page = Page()
    page.feed(dom)
    body = next(attrs for tag, attrs in page.tags if tag == "body")
    widths = [int(w) for w in body["data-images"].split(",")]
    assert len(widths) == 2 and all(w > 500 for w in widths), widths
    assert page.sections == ["scatter", "table", "chosen", "export"]
    shot = tmp / "report.png"
    subprocess.run([_browser(), *flags, "--window-size=1500,3600", f"--screenshot={shot}",
                    (tmp / "report.html").as_uri()], capture_output=True, timeout=120, check=True)
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 50_000
    keep = os.environ.get("DIFFPIPE_SCREENSHOTS")  # a folder to keep the screenshot in, to look at
    if keep:
        shutil.copy(shot, os.path.join(keep, "plan-report.png"))
    print(f"screenshot of the report: {shot}")


def test_report_of_the_library(tmp_path):
    """``dp.viz.report(table, path)``: the page it returns is the file it writes; bad arguments are
    one ``ConfigError`` each and write nothing."""
    import diffpipe as dp

    model = dp.Transformer(layers=4, hidden=256, heads=4, sequence=256, vocabulary=2048, flash_attention=True)
    table = dp.plan(model, dp.Cluster("H100", gpus=4), 8, tensor=(2,), pipeline=(2,), families=("1f1b",),
                    microbatch_sizes=(1,), recompute=("none",), zero=(0,), balance=False, progress=False)
    page = dp.viz.report(table, tmp_path / "r.html", title="tiny <model>")
    assert (tmp_path / "r.html").read_text(encoding="utf-8") == page
    assert "<h1>diffpipe plan: tiny &lt;model&gt;</h1>" in page  # text is escaped
    with pytest.raises(dp.ConfigError, match="suffix must be one of .html, .htm"):
        dp.viz.report(table, tmp_path / "r.txt")
    with pytest.raises(dp.ConfigError, match="expected a PlanTable"):
        dp.viz.report(table.rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]
