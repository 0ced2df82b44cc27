"""Every notebook runs under papermill on the bundled cases (CPU paths), its structured result
(kdkit.notebook.emit) is read back and asserted; a failing cell fails the test with the notebook's
own error. Notebooks are committed without outputs.

Most runs below pass interactive=False (the same content without widgets). nbclient used to block
for good on a cell whose ipywidgets Output widget was written to in the cell that made it
(jupyter/nbclient#312; capture.ipynb's default hung every time): the explorer now sets its output
area's contents instead, and test_the_default_interactive_notebooks_finish runs both notebooks'
widget paths under papermill. The widgets are tested in-process below and in a real JupyterLab by
test_notebook_browser.py."""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time

import pytest
import torch

from conftest import BUNDLED, DATA, ROOT

nbformat = pytest.importorskip("nbformat")
papermill = pytest.importorskip("papermill")

from kdkit import notebook as knb  # noqa: E402  (after the skips: needs IPython)

NOTEBOOKS = ROOT / "notebooks"
ALL = ("replay", "nsplit", "capture", "failures", "develop")
FIXTURE = ROOT / "tests" / "data" / "bench-results-fixture.json"
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"


def execute(name: str, tmp_path, cwd=ROOT, **params):
    """(executed notebook, its kdkit result, seconds). papermill raises PapermillExecutionError
    carrying the failing cell's traceback."""
    out = tmp_path / f"{name}-out.ipynb"
    t0 = time.perf_counter()
    papermill.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(out), cwd=str(cwd), parameters=params,
                               progress_bar=False, kernel_name="python3")
    secs = time.perf_counter() - t0
    nb = nbformat.read(out, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "a cell did not run"
    return nb, knb.read_result(nb), secs


def outputs(nb, mime: str) -> list:
    return [o["data"][mime] for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if mime in o.get("data", {})]


def texts(nb) -> str:
    """Everything a reader sees as text: printed streams and text/plain displays."""
    return "\n".join(o.get("text", "") or o.get("data", {}).get("text/plain", "")
                     for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def exported(nb) -> str:
    """The executed notebook as nbconvert's HTML export writes it (no re-execution)."""
    from nbconvert import HTMLExporter
    return HTMLExporter().from_notebook_node(nb)[0]


def assert_figures_exported(nb, html: str | None = None) -> int:
    """Every plotly figure of the executed notebook is drawn by the exported HTML offline: one
    Plotly.newPlot per figure, each figure's title in it, plotly.js inlined exactly once and no
    plotly script from a CDN. Returns the number of figures."""
    html = exported(nb) if html is None else html
    figs = outputs(nb, PLOTLY)
    assert html.count("Plotly.newPlot(") == len(figs), (html.count("Plotly.newPlot("), len(figs))
    from plotly.io.json import to_json_plotly
    for f in figs:   # each figure's data: its title, as plotly's JSON writes it (/ as \u002f)
        assert to_json_plotly(f["layout"]["title"]["text"]) in html, f["layout"]["title"]["text"]
    if figs:
        assert html.count(knb.plotly_js_html()[:120]) == 1, "plotly.js must be inlined once"
    srcs = re.findall(r"<script[^>]*\bsrc=[\"']([^\"']+)", html)
    assert not [u for u in srcs if "plotly" in u], srcs     # (nbconvert's own require.js/MathJax links stay)
    return len(figs)


@pytest.fixture(autouse=True)
def kernel_env(monkeypatch):
    # the kernel is started as `python` from PATH and must import this checkout's kdkit
    monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


@pytest.mark.parametrize("name", ALL)
def test_committed_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    dirty = [i for i, c in enumerate(code) if c.outputs or c.execution_count is not None]
    assert not dirty, f"{name}.ipynb: code cells {dirty} carry outputs: clear them before committing"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{name}.ipynb needs exactly one cell tagged 'parameters' for papermill"
    assert "kdkit.notebook.emit" in "".join(c.source for c in code) or "nb.emit(" in "".join(c.source for c in code)


def test_replay_seed_static_under_60s(tmp_path):
    nb, res, secs = execute("replay", tmp_path, interactive=False)      # the default case, from the root
    assert secs < 60, f"replay.ipynb took {secs:.1f} s on the seed case"
    assert res["case_id"] == "seed-shape" and res["ok"] and res["lint"] == []
    assert res["rows"]["torch"]["status"] == "pass" and 0 < res["rows"]["torch"]["max_abs"] < res["rows"]["torch"]["limit"]
    assert res["rows"]["oracle"]["max_abs"] == 0
    assert set(res["figures"]) == {"metrics", "error torch", "kv error torch", "tree", "visibility", "probabilities"}
    figs = outputs(nb, PLOTLY)
    assert len(figs) == len(res["figures"]) and not outputs(nb, WIDGET)
    assert assert_figures_exported(nb) == 6
    metrics = next(f for f in figs if f["layout"]["title"]["text"].startswith("seed-shape: backends"))
    assert any("exact" in a["text"] for a in metrics["layout"]["annotations"])  # the oracle's 0, not a 1e-12 bar
    text = texts(nb)
    assert "lint: clean" in text and "max_abs_diff=" in text and "seed-shape: PASS" in text


def test_replay_default_case_path_from_notebooks_dir(tmp_path):
    nb, res, _ = execute("replay", tmp_path, cwd=NOTEBOOKS, interactive=False)   # where JupyterLab runs it
    assert res["case_id"] == "seed-shape" and res["ok"]
    assert res["path"] == str((ROOT / "data" / "captured_tensors" / "seed-shape.pt").resolve())


def test_explorer_widgets_redraw_on_a_new_case():
    pytest.importorskip("ipywidgets")
    view = knb.ReplayView.load(DATA / "seed-shape.pt")
    ex = knb.ReplayExplorer(view, DATA, "oracle,torch")
    names = [label for label, _ in ex.case.options]
    assert "seed-shape.pt" in names and "failures/mask-indptr-sliced.pt" in names
    assert ex.view is view and "seed-shape" in ex.status.value and "pass" in ex.status.value
    assert (ex.token.max, ex.head.max) == (8, 7)
    ex.case.value = str(DATA / "ragged-bs4.pt")                         # what a click in the picker does
    assert ex.view.case.case_id == "ragged-bs4" and "ragged-bs4" in ex.status.value
    assert (ex.token.max, ex.token.value) == (58, plots_worst(ex.view.rep)[1])
    ex.backends.value = ("oracle",)                                      # a new backend set replays
    assert [r.backend for r in ex.view.rep.rows] == ["oracle"]
    ex.case.value = str(DATA / "failures" / "mask-indptr-sliced.pt")    # broken inputs: said, not raised
    assert "mask-indptr-sliced" in ex.status.value
    first = knb.ReplayExplorer(None, DATA / "failures")                  # capture.ipynb: no case given
    assert first.view.case.case_id.startswith("failure-") and "lint errors" in first.status.value


def test_explorer_shows_a_hostile_case_id_as_text(tmp_path):
    """The status line is an HTML widget (innerHTML): a case id like <img onerror=...> ran as
    markup in JupyterLab (found by a review, 2026-12-02)."""
    pytest.importorskip("ipywidgets")
    from kdkit.case import load
    case = load(DATA / "seed-shape.pt")
    case.meta["case_id"] = "<img src=x onerror=alert(1)>"
    case.save(tmp_path / "hostile.pt")
    ex = knb.ReplayExplorer(None, tmp_path, "oracle,torch")
    assert "<img" not in ex.status.value and "&lt;img src=x onerror=alert(1)&gt;" in ex.status.value


@pytest.mark.parametrize("name", ["capture", "replay"])
def test_the_default_interactive_notebooks_finish(tmp_path, name):
    """With their default parameters (the widgets) both notebooks finish under papermill, and the
    figures of the explorer's case are ordinary outputs that the exported HTML draws (found by a
    review, 2026-12-02: capture.ipynb hung in the explorer's cell on every run; issue 33: nbconvert's
    export of the interactive default had no figures)."""
    pytest.importorskip("ipywidgets")
    out = tmp_path / f"{name}-out.ipynb"
    t0 = time.perf_counter()
    papermill.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(out), cwd=str(NOTEBOOKS), progress_bar=False,
                               kernel_name="python3", execution_timeout=120)
    wall = time.perf_counter() - t0
    nb = nbformat.read(out, as_version=4)
    # A hang detector, not a benchmark: the hang stalled the run for 60-130 s (and sometimes for
    # good) without any one cell passing its timeout. Without a GPU (CI) the run takes 6-9 s on 2
    # cores, so it is held under 45 s. On a GPU the cells replay live and their time follows the
    # host's load (51 s beside 11 other pytest workers on the H200), so there only the time that no
    # cell accounts for is held (under 30 s: a kernel's start and shutdown take a few).
    cells = [(c.metadata.get("papermill", {}).get("duration") or 0.0, i) for i, c in enumerate(nb.cells)]
    gap = wall - sum(d for d, _ in cells)
    slowest = ", ".join(f"cell {i} {d:.1f} s" for d, i in sorted(cells, reverse=True)[:3])
    assert gap < 30, f"nbclient stalled: {gap:.1f} s of {wall:.1f} s in no cell (slowest: {slowest})"
    if not torch.cuda.is_available():
        assert wall < 45, f"the run took {wall:.1f} s (slowest: {slowest})"
    assert outputs(nb, WIDGET), "the explorer's controls"
    assert assert_figures_exported(nb) >= 3


def test_nbconvert_execute_exports_the_replay_figures(tmp_path):
    """`jupyter nbconvert --execute --to html notebooks/replay.ipynb`, the defaults (the explorer):
    the page holds every figure and plotly.js once, and every verdict on it is the case's."""
    pytest.importorskip("ipywidgets")
    import subprocess
    run = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--execute", "--to", "html",
                          str(NOTEBOOKS / "replay.ipynb"), "--output-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    html = (tmp_path / "replay.html").read_text()
    assert html.count("Plotly.newPlot(") == 6 and html.count(knb.plotly_js_html()[:120]) == 1
    for title in ("seed-shape: backends vs oracle", "seed-shape: torch vs oracle", "error along KV",
                  "tree and mask", "visibility of request 0", "oracle probabilities"):
        assert title in html, title
    assert "lint: clean" in html and "seed-shape: PASS" in html


def plots_worst(rep):
    from kdkit import plots
    return plots.worst_row(rep)


def test_replay_ragged_marks_request_boundaries(tmp_path):
    nb, res, _ = execute("replay", tmp_path, case_path=str(DATA / "ragged-bs4.pt"), interactive=False,
                         token=40, head=2)
    assert res["bs"] == 4 and res["ok"]
    heat = next(f for f in outputs(nb, PLOTLY) if "max |diff| per head x query token" in f["layout"]["title"]["text"])
    xs = sorted(s["x0"] for s in heat["layout"]["shapes"])
    assert xs == [8.5, 9.5, 42.5]                                        # qo_indptr 0, 9, 10, 43, 59
    assert {a["text"] for a in heat["layout"]["annotations"]} == {"r0", "r1", "r2", "r3"}
    assert "token 40 head 2" in res["figures"]["probabilities"] and "request 2 row 30" in res["figures"]["probabilities"]


def test_a_failing_cell_fails_with_the_notebooks_error(tmp_path):
    with pytest.raises(papermill.PapermillExecutionError, match="no-such-case.pt: not found"):
        execute("replay", tmp_path, case_path="no-such-case.pt", interactive=False)


def test_nsplit_shows_committed_results_labelled(tmp_path):
    fixture = json.loads(FIXTURE.read_text())
    nb, res, _ = execute("nsplit", tmp_path, results_path=str(FIXTURE), live=False)
    assert res["gpu"] == fixture["gpu"] and res["date"] == fixture["date"]
    assert fixture["gpu"] in res["source"] and fixture["date"] in res["source"]
    auto = {r["prefix"]: r["nsplit"] for r in fixture["rows"]
            if r["backend"] == "cuda" and r["nsplit_auto"] and not r["graph"]}
    assert {r["prefix"]: r["auto_nsplit"] for r in res["summary"]} == auto and res["shape"] == [1, 9, 8]
    ratios = [r["auto_over_best"] for r in res["summary"] if r["auto_over_best"] is not None]
    assert ratios and all(x == round(x, 3) for x in ratios)                # the table shows 1.032, not 1.0318142734
    assert set(res["figures"]) == {"gbps", "roofline", "lines", "backends", "graph"}
    assert all(fixture["gpu"] in t for t in res["figures"].values())   # every figure names the run
    assert len(outputs(nb, PLOTLY)) == 5 and assert_figures_exported(nb) == 5


def test_nsplit_defaults_show_the_latest_committed_run(tmp_path):
    from kdkit.perf import bench, results as bench_results
    latest = bench_results.latest()
    if latest is None:
        pytest.skip(f"no results committed under {bench_results.RESULTS_DIR} yet (kdkit bench on a GPU writes them)")
    if bench.gpu_here():
        pytest.skip("a GPU is here: the notebook's default measures live (the GPU tests' business)")
    committed = bench_results.combine(latest)  # the newest run set's slices, as obtain() reads them
    nb, res, _ = execute("nsplit", tmp_path)
    assert (res["gpu"], res["date"]) == (committed["gpu"], committed["date"])
    assert res["source"].startswith("committed results of the last GPU run") and all(p.name in res["source"] for p in latest)
    assert len(outputs(nb, PLOTLY)) == 5 and res["summary"]


def test_nsplit_another_shape_of_the_run(tmp_path):
    """bs / q_len / heads parameters reach the other shapes of a run (the committed one measured
    bs 8 and 32, q_len 64 and 257 beside the sweep's bs 1, q_len 9)."""
    data = json.loads(FIXTURE.read_text())
    extra = [{**r, "bs": 8, "us": round(r["us"] * 3, 2), "gbps": round(r["gbps"] * 2.5, 1)}
             for r in data["rows"] if r["prefix"] in (8192, 32768)]
    for r in extra:   # bs 8 fills the GPU sooner: its automatic NSPLIT is lower
        if r["backend"] == "cuda" and r["nsplit_auto"]:
            r["nsplit"] = max(1, r["nsplit"] // 4)
    data["rows"] += extra
    path = tmp_path / "two-shapes.json"
    path.write_text(json.dumps(data))
    nb, res, _ = execute("nsplit", tmp_path, results_path=str(path), live=False, bs=8)
    assert res["shape"] == [8, 9, 8]
    want = {r["prefix"]: r["nsplit"] for r in extra if r["backend"] == "cuda" and r["nsplit_auto"] and not r["graph"]}
    assert {r["prefix"]: r["auto_nsplit"] for r in res["summary"]} == want
    assert all("bs 8, q_len 9, H 8" in t for k, t in res["figures"].items()), res["figures"]
    assert len(outputs(nb, PLOTLY)) == 5


def _capture_dir(tmp_path):
    d = tmp_path / "capture"
    d.mkdir()
    from kdkit.case import load
    seed = load(DATA / "seed-shape.pt")                                 # meta as the capture hook writes it
    seed.clone(meta={**seed.meta, "layer_id": 3, "tp_rank": 1, "step": 7}).save(d / "kimi-k2-L3-r1-s7.pt")
    shutil.copy(DATA / "failures" / "mask-indptr-sliced.pt", d / "kimi-k2-L3-r0-s7.pt")
    (d / "kimi-k2-L4-r0-s7.pt").write_bytes(b"not a case")              # a truncated capture
    return d


def test_capture_table_of_a_capture_dir(tmp_path):
    nb, res, _ = execute("capture", tmp_path, capture_dir=str(_capture_dir(tmp_path)), interactive=False)
    rows = {r["file"]: r for r in res["rows"]}
    assert set(rows) == {"kimi-k2-L3-r0-s7.pt", "kimi-k2-L3-r1-s7.pt", "kimi-k2-L4-r0-s7.pt"}
    good, bad, broken = rows["kimi-k2-L3-r1-s7.pt"], rows["kimi-k2-L3-r0-s7.pt"], rows["kimi-k2-L4-r0-s7.pt"]
    assert (good["layer"], good["rank"], good["step"], good["verdict"]) == (3, 1, 7, "pass")
    assert "bs 1, H 8, q_len 9, prefix 21" == good["shapes"] and good["lint"] == "lint: clean"
    assert "mask-indptr-sliced" in bad["lint"] and bad["verdict"] != "pass"
    assert broken["verdict"].startswith("cannot load") and broken["layer"] == 4
    assert len(outputs(nb, PLOTLY)) >= 5                               # the picked case, replayed
    assert assert_figures_exported(nb) >= 5
    text = texts(nb)
    assert "KDKIT_MODE=capture" in text and "--disable-decode-cuda-graph" in text   # the capture command


def test_capture_dir_of_failing_cases_replays_the_first_loadable(tmp_path):
    """A user debugging a bad capture: no case passes. The notebook replays the first case that
    loads (its failure shown), not a StopIteration; with nothing replayable it says so."""
    d = tmp_path / "bad-capture"
    d.mkdir()
    (d / "a-truncated.pt").write_bytes(b"not a case")                  # sorts first, cannot load
    shutil.copy(DATA / "failures" / "mask-indptr-sliced.pt", d / "mask-indptr-sliced.pt")
    nb, res, _ = execute("capture", tmp_path, capture_dir=str(d), interactive=False)
    assert [r["file"] for r in res["rows"]] == ["a-truncated.pt", "mask-indptr-sliced.pt"]
    assert res["replayed"] == "mask-indptr-sliced.pt"
    text = texts(nb)
    assert "replaying mask-indptr-sliced.pt" in text
    assert outputs(nb, WIDGET)                                          # tqdm's bar, a widget in the kernel
    # no backend judged (the oracle cannot read it): its index arrays against the layout, the bug named
    figs = [f["layout"]["title"]["text"] for f in outputs(nb, PLOTLY)]
    assert figs == ["failure-mask-indptr-sliced: the index arrays against the sglang layout"
                    "<br><sup>lint: mask-indptr-sliced [mask_indptr]</sup>"], figs

    nb, res, _ = execute("capture", tmp_path, capture_dir=str(d), interactive=False, limit=1)
    assert [r["file"] for r in res["rows"]] == ["a-truncated.pt"]        # the limit, from the notebook
    assert res["replayed"] is None and not outputs(nb, PLOTLY)
    text = texts(nb)
    assert "no replayable case" in text and "1 of 2 case files" in text


def test_capture_rows_limit_and_progress(capsys):
    rows = knb.capture_rows(DATA, "oracle", limit=2)
    assert [r["file"] for r in rows] == [str(p.relative_to(DATA)) for p in knb.case_files(DATA)[:2]]
    err = capsys.readouterr().err
    assert "replaying cases" in err and "2/2" in err                    # tqdm's bar, outside a notebook
    assert len(knb.capture_rows(DATA / "failures", "oracle", progress=False)) == 2
    assert not capsys.readouterr().err
    with pytest.raises(ValueError, match="limit = 0"):
        knb.capture_rows(DATA, limit=0)
    assert knb.pick_replayable([{"case_id": "-", "verdict": "cannot load: x"}]) is None


def test_capture_without_a_dir_uses_the_bundled_cases(tmp_path):
    nb, res, _ = execute("capture", tmp_path, capture_dir="", interactive=False)
    manifest = json.loads((DATA / "manifest.json").read_text())
    assert sorted(r["file"] for r in res["rows"]) == sorted(c["path"] for c in manifest["cases"])
    for c in manifest["cases"]:
        row = next(r for r in res["rows"] if r["file"] == c["path"])
        if (row["verdict"] == "pass") != (c["expected_replay"] == "pass"):
            # (seen once, not reproduced: torch's LSE on ddtree-b64 at 29.9 fp32 units in a full
            # run; say whether the same replay in this process agrees, with the untruncated reasons)
            from kdkit import replay
            from kdkit.case import load
            again = replay.replay(load(DATA / c["path"]), ["oracle", "torch"])
            pytest.fail(f"{c['path']}: the notebook's verdict {row['verdict']!r}, expected "
                        f"{c['expected_replay']!r}; the same replay here: "
                        + "; ".join(f"{r.backend} {r.status} {r.reason}" for r in again.rows))


def test_failures_gallery(tmp_path):
    nb, res, _ = execute("failures", tmp_path)
    assert assert_figures_exported(nb) >= 2          # the mutants' heatmaps and KV errors
    entries = {e["failure"]: e for e in res["entries"]}
    assert {"mask-indptr-sliced", "prefix-only-kv-indices"} <= set(entries)
    for e in res["entries"]:
        assert e["caught"] and e["after"] == "pass", e       # each one caught, and clean after the fix
    assert entries["mask-indptr-sliced"]["by"] == "lint" and "mask-indptr-sliced" in entries["mask-indptr-sliced"]["before"]
    mutants = [e for e in res["entries"] if e["kind"] == "mutant"]
    from kdkit.judge.wrong_kernels import MUTANTS
    assert {e["failure"] for e in mutants} == set(MUTANTS)


# ---- develop.ipynb: a kernel developed (the Triton starter on the CPU, under Triton's interpreter) ----
def test_develop_the_triton_starter_on_every_bundled_case(tmp_path):
    """The defaults: the Triton starter on the bundled cases, on the CPU (about 90 s here on 2
    shared cores: the interpreter's replays ~20 s, the planted bugs on 4 cases ~30 s). On a GPU
    with shapes=[], which skips the timing (test_develop_times_and_sweeps_on_a_gpu times)."""
    from kdkit.judge.wrong_kernels import MUTANTS
    gpu = torch.cuda.is_available()
    nb, res, secs = execute("develop", tmp_path, **({"shapes": []} if gpu else {}))
    assert secs < 300, f"develop.ipynb took {secs:.0f} s"
    assert res["kernel"] == "kdkit_starter" and res["ok"], res["summary"]
    assert res["cases"] == {c: "pass" for c in BUNDLED}
    assert res["summary"] == "kdkit_starter: 4 of 4 case(s) pass against the oracle"
    assert set(res["bugs"]) == set(MUTANTS) and res["awake"]
    assert all("caught" in row.values() and "NOT caught" not in row.values() for row in res["bugs"].values())
    assert set(res["figures"]) == {"margin", "bugs"} and res["timing"] is None
    assert assert_figures_exported(nb) == 2
    text = texts(nb)
    assert "Triton kernel" in text and "no report is made up here" in text      # what is known of its build
    assert "failed on none of the 4 case(s): no error heatmap to draw" in text
    if gpu:
        assert "shapes = []: timing and the sweep skipped" in text
    else:
        assert "no CUDA GPU here: timing skipped" in text and "swept: nsplit" in text


MASK_LINE = "        seen = seen & visible\n"   # the starter's one line that applies the tree (or causal) mask


def test_develop_a_kernel_that_ignores_the_mask(tmp_path):
    """A user's Triton kernel with a bug (the starter without its mask line), given as a file spec:
    each case fails, its error is drawn, and the planted bugs are still caught on the same cases."""
    from kdkit.byok.starter import TEMPLATES
    text = (TEMPLATES / "triton" / "kernel.py").read_text()
    assert text.count(MASK_LINE) == 1, "the starter's mask line moved: update MASK_LINE"
    (tmp_path / "kernel.py").write_text(text.replace(MASK_LINE, ""))
    (tmp_path / "backend.py").write_text(
        "from pathlib import Path\nfrom kdkit.byok.triton import TritonKernel\n"
        "_k = TritonKernel('kd_nomask', Path(__file__).with_name('kernel.py'))\n"
        "NAME, LINT_CLEAN, unavailable, run, prepare = _k.NAME, _k.LINT_CLEAN, _k.unavailable, _k.run, _k.prepare\n")
    cases = [str(DATA / "seed-shape.pt"), str(DATA / "ragged-bs4.pt")]
    nb, res, _ = execute("develop", tmp_path, kernel=str(tmp_path / "backend.py"), cases=cases, shapes=[])
    assert res["kernel"] == "kd_nomask" and not res["ok"]
    assert res["cases"] == {"seed-shape": "fail", "ragged-bs4": "fail"}
    assert res["summary"] == "kd_nomask: 0 of 2 case(s) pass against the oracle; fail: seed-shape, ragged-bs4"
    assert set(res["figures"]) == {"margin", "error seed-shape", "kv error seed-shape", "error ragged-bs4",
                                   "kv error ragged-bs4", "bugs"}
    assert assert_figures_exported(nb) == 6
    assert res["awake"] and res["bugs"]["merge-no-rescale"] == {"seed-shape": "inert here", "ragged-bs4": "caught"}


@pytest.mark.gpu
def test_develop_times_and_sweeps_on_a_gpu(tmp_path):
    nb, res, _ = execute("develop", tmp_path, cases=str(DATA / "seed-shape.pt"), shapes=[[1, 4096, 9]],
                         sweep_values=[1, 8])
    assert res["ok"] and {"timing", "sweep"} <= set(res["figures"])
    assert {r["backend"] for r in res["timing"]} >= {"kdkit_starter", "cuda", "triton_sglang"}
    assert all(r["verdict"] == "pass" for r in res["timing"]), res["timing"]
    assert assert_figures_exported(nb) == len(res["figures"])


# ---- on a GPU: the CUDA kernel in replay.ipynb, a live sweep in nsplit.ipynb -----------------------
@pytest.mark.gpu
def test_replay_notebook_runs_the_cuda_kernel(tmp_path):
    nb, res, _ = execute("replay", tmp_path, case_path=str(DATA / "ragged-bs4.pt"),
                         backends="oracle,torch,cuda", interactive=False)
    assert res["rows"]["cuda"]["status"] == "pass", res["rows"]["cuda"]
    assert res["ok"] and "error cuda" in res["figures"]


@pytest.mark.gpu
def test_nsplit_measures_live_on_a_gpu(tmp_path):
    nb, res, _ = execute("nsplit", tmp_path, live=True, prefixes=[21, 4096], nsplits=[1, 4])
    assert res["source"].startswith("measured live on"), res["source"]
    assert [r["prefix"] for r in res["summary"]] == [21, 4096]
    assert all(r["auto_us"] > 0 for r in res["summary"]) and len(outputs(nb, PLOTLY)) == 5


# ---- found by an audit (2026-12-02): each failed deep inside pandas, traitlets or pathlib ------------
def test_explorer_takes_a_case_without_query_rows(tmp_path):
    pytest.importorskip("ipywidgets")
    from kdkit import synth
    path = synth.make_case(q_len=0, prefix=5, tree="causal", case_id="empty").save(tmp_path / "empty.pt")
    ex = knb.ReplayExplorer(knb.ReplayView.load(path), tmp_path, "oracle,torch")
    assert (ex.token.max, ex.token.value, ex.token.disabled) == (0, 0, True)


def test_notebook_parameters_are_checked_by_name(tmp_path):
    from kdkit import plots, shapes
    from kdkit.perf import bench
    from kdkit.perf import results as br
    from kdkit.replay import replay
    case = shapes.seed_shape()
    rep = replay(case, ["oracle", "torch"])
    with pytest.raises(ValueError, match=r"token = 3\.0: a whole number"):
        plots.replay_figures(case, rep, token=3.0)
    with pytest.raises(ValueError, match="unknown backend"):
        knb.capture_rows(DATA, backends="nope", progress=False)
    with pytest.raises(KeyError, match="against='nope'"):
        replay(case, ["torch"], against="nope")
    with pytest.raises(ValueError, match=r"prefixes = 5: a list"):
        br.nsplit_sweep("nsplit", prefixes=5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="results_path = .*no kdkit bench results"):
        bench.obtain(str(tmp_path / "empty"), live=False)
    res, where = bench.obtain(str(ROOT / "benchmarks" / "results"), live=False)  # a directory: its newest run
    assert res["rows"] and "committed results" in where
    assert knb.resolve_paths("") is None and len(knb.resolve_paths([str(DATA / "seed-shape.pt")] * 2)) == 2
    if bench.gpu_here() is None:
        with pytest.raises(ValueError, match="live = True measures on a CUDA GPU"):
            bench.obtain(None, live=True)
    with pytest.raises(br.ResultsError, match="no rows"):
        br.check({**res, "rows": []})
