"""`kdkit report DIR -o OUT`: one self-contained HTML page per case and an index with pass/fail."""
from __future__ import annotations

import os
import re
import shutil
import sys

import pytest

from conftest import DATA
from kdkit.cli import main

pytest.importorskip("plotly")
pytest.importorskip("jinja2")


def test_report_over_a_directory(capsys, tmp_path):
    src = tmp_path / "cases"
    (src / "failures").mkdir(parents=True)
    shutil.copy(DATA / "seed-shape.pt", src / "seed-shape.pt")
    shutil.copy(DATA / "failures" / "mask-indptr-sliced.pt", src / "failures" / "mask-indptr-sliced.pt")
    (src / "truncated.pt").write_bytes(b"\x80\x02 not a case")
    out = tmp_path / "out"
    assert main(["report", str(src), "-o", str(out)]) == 2    # a file that is not a case: nothing is run
    assert not (out / "index.html").exists()
    (src / "truncated.pt").unlink()
    rc = main(["report", str(src), "-o", str(out), "--backends", "oracle,torch"])
    text = capsys.readouterr().out
    assert rc == 1                                             # the failure case fails
    assert f"reports: {out / 'index.html'} (2 case pages, 0 not replayed)" in text
    pages = sorted(p.name for p in out.iterdir())
    assert pages == ["failure-mask-indptr-sliced.html", "index.html", "plotly.min.js", "seed-shape.html"]
    index = (out / "index.html").read_text()
    rows = re.findall(r"<tr><td>(.*?)</tr>", index, re.S)
    assert len(rows) == 2 and "1 of 2 cases pass" in index
    seed = next(r for r in rows if "seed-shape" in r)
    assert 'href="seed-shape.html"' in seed and ">pass<" in seed
    bad = next(r for r in rows if "mask-indptr-sliced" in r)
    assert "FAIL" in bad and "mask-indptr-sliced" in bad
    page = (out / "seed-shape.html").read_text()
    # the pages share the one plotly.js beside them (offline: a relative src), none inlines it
    assert re.findall(r'<script src="([^"]+)"', page) == ["plotly.min.js"]
    assert "window.PlotlyConfig" not in page and (out / "plotly.min.js").stat().st_size > 1_000_000
    assert page.count("Plotly.newPlot") == 6 and 'href="index.html"' in page
    assert "error along KV" in page and "tree and mask" in page
    # a second run keeps the first one's files (timestamped names) unless --force
    before = (out / "seed-shape.html").read_bytes()
    assert main(["report", str(src / "seed-shape.pt"), "-o", str(out)]) == 0
    assert (out / "seed-shape.html").read_bytes() == before
    assert len(list(out.glob("index-*.html"))) == 1 and len(list(out.glob("seed-shape-*.html"))) == 1
    assert [p.name for p in out.glob("plotly*.js")] == ["plotly.min.js"]      # the same copy, kept once


def test_report_folder_is_light(tmp_path):
    """Issue 33: ten pages of 5 MB each (plotly.js inlined in every one). Now one copy is shared:
    the bundled cases' whole folder measured 7.0 MB (the 8k-prefix pages weigh 0.8 MB of figure
    data); here four cases, each page far below plotly.js's own size."""
    src = tmp_path / "cases"
    src.mkdir()
    for name in ("seed-shape", "ragged-bs4", "ddtree-b64"):
        shutil.copy(DATA / f"{name}.pt", src / f"{name}.pt")
    shutil.copy(DATA / "failures" / "mask-indptr-sliced.pt", src / "mask-indptr-sliced.pt")
    out = tmp_path / "out"
    assert main(["report", str(src), "-o", str(out), "--backends", "oracle,torch"]) == 1
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    js = sizes.pop("plotly.min.js")
    assert all(n < 1_000_000 for n in sizes.values()), sizes
    assert js + sum(sizes.values()) < 15 * 2**20 / 2


def test_a_single_page_report_stays_self_contained(tmp_path):
    target = tmp_path / "one.html"
    assert main(["replay", str(DATA / "seed-shape.pt"), "--backends", "oracle,torch", "--report", str(target)]) == 0
    page = target.read_text()
    assert page.count("window.PlotlyConfig") == 1 and "<script src=" not in page
    assert page.count("Plotly.newPlot") == 6 and not (tmp_path / "plotly.min.js").exists()


def test_report_one_case_still_writes_one_file(capsys, tmp_path):
    target = tmp_path / "one.md"
    assert main(["report", str(DATA / "seed-shape.pt"), "-o", str(target), "--backends", "oracle"]) == 1  # nothing judged
    assert target.read_text().startswith("# kdkit replay report")


def test_the_results_table_has_a_legend(tmp_path):
    """Issue 33: limit, nearest, production were not explained where they were printed."""
    target = tmp_path / "one.md"
    assert main(["report", str(DATA / "seed-shape.pt"), "-o", str(target), "--backends", "oracle,torch"]) == 0
    text = target.read_text()
    legend = text.split("### Backends")[1]
    for col in ("status", "max_abs", "rel", "lse_err", "limit", "nearest", "time"):
        assert re.search(rf"^{col} +\S", legend, re.M), col
    assert "oracle's own row is the reference" in legend and "docs/judge.md" in legend
    assert "no production path was asked for" in legend


def _a_browser() -> bool:
    """kaleido drives a local Chrome or Chromium (found on PATH, or BROWSER_PATH)."""
    return bool(os.environ.get("BROWSER_PATH") or any(shutil.which(b) for b in
                                                      ("chromium", "chromium-browser", "google-chrome", "chrome")))


def test_a_markdown_report_has_its_figures_as_pngs_beside_it(capsys, tmp_path):
    """Issue 33: the Markdown report had no figures. With kaleido (and a browser for it) each
    case's figures are PNGs in <stem>-figures/ beside the .md, linked from it."""
    pytest.importorskip("kaleido")
    if not _a_browser():
        pytest.skip("kaleido finds no Chrome or Chromium here (set BROWSER_PATH)")
    target = tmp_path / "r.md"
    cases = [str(DATA / "seed-shape.pt"), str(DATA / "failures" / "mask-indptr-sliced.pt")]
    assert main(["replay", *cases, "--backends", "oracle,torch", "--report", str(target)]) == 1
    text = target.read_text()
    links = re.findall(r"^!\[([^\]]*)\]\(<([^>]+)>\)$", text, re.M)
    assert len(links) == 6 + 1, text                       # the seed case's six figures, the failure's layout one
    for alt, rel in links:
        png = (target.parent / rel).read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5_000, rel   # a drawn picture, not an empty one
        assert rel.startswith("r-figures/") and alt
    assert "failure-mask-indptr-sliced: the index arrays" in text.split("## failure-mask-indptr-sliced")[1]
    assert "No figures" not in text


def test_a_markdown_report_without_kaleido_says_so_in_a_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "kaleido", None)      # as where it is not installed: import fails
    target = tmp_path / "r.md"
    assert main(["replay", str(DATA / "seed-shape.pt"), "--backends", "torch", "--report", str(target)]) == 0
    text = target.read_text()
    figures = text.split("### Figures\n\n")[1].split("\n\n")[0]
    assert figures == "No figures: PNG export needs kaleido (pip install 'kdkit[reports]'); the HTML report (.html) has them."
    assert [p.name for p in tmp_path.iterdir()] == ["r.md"]


def test_a_markdown_report_whose_browser_is_missing_says_so_in_a_line(capsys, tmp_path, monkeypatch):
    """kaleido installed, no Chrome where it looks: the report is written, its figures line says why."""
    pytest.importorskip("kaleido")
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chrome"))
    target = tmp_path / "r.md"
    assert main(["replay", str(DATA / "seed-shape.pt"), "--backends", "torch", "--report", str(target)]) == 0
    figures = target.read_text().split("### Figures\n\n")[1].split("\n\n")[0]
    assert figures.startswith("No figures: the PNG export failed (") and "\n" not in figures and "no-chrome" in figures
    assert "Traceback" not in capsys.readouterr().err
