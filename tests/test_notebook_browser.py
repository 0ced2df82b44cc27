"""replay.ipynb in a real JupyterLab, driven by headless Chromium (Debian's `chromium` through
Playwright's Python package, no browser download): run all cells, see the heatmaps and the widgets,
pick another case and see the figures change, keep screenshots (reports/browser/ and the test's
tmp dir). The notebook runs on a copy: JupyterLab autosaves, the committed one stays clean.

Skipped, with the reason, where Chromium, Playwright or JupyterLab is missing (`make test` installs
them: chromium through apt-get when run as root, the rest through the dev extra).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT

CHROMIUM = os.environ.get("KDKIT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
STARTUP_S = 90      # JupyterLab's first start builds nothing, but the 2-core CI machine is shared
RUN_S = int(os.environ.get("KDKIT_BROWSER_RUN_S", 180))  # all cells of replay.ipynb, figures and widgets drawn
ARTIFACTS = ROOT / "reports" / "browser"


def _why_not() -> str | None:
    if not Path(CHROMIUM).is_file():
        return (f"no Chromium at {CHROMIUM}: `apt-get install -y chromium` (Debian; `make test` does it "
                "when run as root) or set KDKIT_CHROMIUM")
    for mod, extra in (("playwright.sync_api", "playwright"), ("jupyterlab", "jupyterlab"),
                       ("ipywidgets", "ipywidgets"), ("plotly", "plotly")):
        try:
            __import__(mod)
        except ImportError:
            return f"{mod} is not installed (pip install {extra}; the dev extra has it)"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        return json.loads(r.read() or b"null")


class Lab:
    """A JupyterLab server on 127.0.0.1 with a token, over `root`; stop() ends it and its kernels."""

    def __init__(self, root: Path, home: Path):
        self.port, self.token = _free_port(), os.urandom(12).hex()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
                   JUPYTER_RUNTIME_DIR=str(home / "runtime"), IPYTHONDIR=str(home / "ipython"),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
        # the venv's share/jupyter (kernelspec, plotly's and the widgets' lab extensions) stays on the path
        env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(Path(sys.prefix) / "share" / "jupyter"),
                                                            os.environ.get("JUPYTER_PATH")]))
        self.log = open(home / "jupyter.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
             f"--port={self.port}", "--port-retries=0", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={root}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
             "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             "--ServerApp.shutdown_no_activity_timeout=600", "--MappingKernelManager.cull_idle_timeout=600"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
        deadline = time.monotonic() + STARTUP_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}: {self.tail()}")
            try:
                _get(f"{self.url}/api/status?token={self.token}")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"jupyter lab did not answer within {STARTUP_S} s: {self.tail()}")
                time.sleep(0.5)

    def tail(self, n: int = 2000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-n:]

    def stop(self) -> None:
        try:  # kernels first, through the API; then the server (SIGTERM also shuts its kernels down)
            for k in _get(f"{self.url}/api/kernels?token={self.token}") or []:
                req = urllib.request.Request(f"{self.url}/api/kernels/{k['id']}?token={self.token}", method="DELETE")
                urllib.request.urlopen(req, timeout=10).close()  # noqa: S310 - loopback only
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def lab(tmp_path):
    work = tmp_path / "lab"
    work.mkdir()
    shutil.copy(ROOT / "notebooks" / "replay.ipynb", work / "replay.ipynb")
    server = Lab(work, tmp_path)
    try:
        yield server
    finally:
        server.stop()
        assert server.proc.poll() is not None, "the jupyter server is still running"


FIGURES = ".jp-OutputArea .js-plotly-plot"   # (plotly's renderer is the output element itself)


def _titles(page) -> list[str]:
    return page.eval_on_selector_all(f"{FIGURES} .gtitle", "els => els.map(e => e.textContent)")


# the text of every output on the page but the widgets' (the picker lists every case file's name)
# the figures' (their titles are checked apart) and plotly.js's (a script)
OUTPUT_TEXTS = """() => [...document.querySelectorAll('.jp-OutputArea-output')]
    .filter(e => !e.querySelector('.jupyter-widgets, script') && !e.classList.contains('js-plotly-plot'))
    .map(e => e.textContent.trim()).filter(t => t)"""


def test_replay_notebook_in_jupyterlab(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    shots = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(RUN_S * 1000)
            page.goto(f"{lab.url}/lab/tree/replay.ipynb?token={lab.token}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=STARTUP_S * 1000)
            # cells sent before the kernel is connected are dropped: wait for the status bar's "Idle"
            page.wait_for_function("() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]"
                                   ".some(e => /\\| Idle/.test(e.textContent))", timeout=STARTUP_S * 1000)
            news = page.locator(".jp-Notification-Toast-Close, .jp-toast-button:text-is('No')")
            if news.count():
                news.first.click()
            # Run > Run All Cells, through the menu as a person would
            page.click(".lm-MenuBar-itemLabel:text-is('Run')")
            page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")

            # the widgets: a case picker (a real <select>), backends, token and head sliders
            picker = page.wait_for_selector(".kdkit-case select")
            page.wait_for_selector(".kdkit-backends select")
            page.wait_for_selector(".kdkit-token .slider-container, .kdkit-token .widget-slider")
            page.wait_for_function(f"() => document.querySelectorAll('{FIGURES}').length >= 6")
            page.wait_for_function("() => document.querySelector('.kdkit-status').textContent.includes('seed-shape')")
            # heatmaps are drawn (plotly renders a heatmap as an <image> in its heatmap layer)
            assert page.locator(".jp-OutputArea .heatmaplayer image").count() >= 3
            before = _titles(page)
            assert any(t.startswith("seed-shape: torch vs oracle") for t in before), before
            assert any("error along KV" in t for t in before) and any("tree and mask" in t for t in before)
            # the last cell ran after the figures: the verdict printed, no error output anywhere
            page.wait_for_function("() => [...document.querySelectorAll('.jp-OutputArea-output')]"
                                   ".some(e => e.textContent.trim() === 'seed-shape: PASS')")
            assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
                                ":has-text('Traceback')").count() == 0
            texts = page.evaluate(OUTPUT_TEXTS)
            assert any(t.startswith("case seed-shape") for t in texts) and "lint: clean" in texts, texts
            # no title runs past the right edge of its figure (they were clipped in JupyterLab)
            clipped = page.evaluate(f"""() => [...document.querySelectorAll('{FIGURES}')]
                .map(p => [p.querySelector('.gtitle'), p.querySelector('.main-svg')])
                .filter(([t, s]) => t && s && t.getBoundingClientRect().right > s.getBoundingClientRect().right + 1)
                .map(([t]) => t.textContent)""")
            assert not clipped, clipped
            top = "() => document.querySelector('.kdkit-case').scrollIntoView({block: 'start'})"
            page.evaluate(top)
            shots.append(tmp_path / "replay-seed-shape.png")
            page.screenshot(path=str(shots[-1]), full_page=False)

            # pick another case: the figures are redrawn in place for it
            picker.select_option(label="ragged-bs4.pt")
            page.wait_for_function("() => document.querySelector('.kdkit-status').textContent.includes('ragged-bs4')")
            page.wait_for_function(f"() => [...document.querySelectorAll('{FIGURES} .gtitle')]"
                                   ".some(e => e.textContent.startsWith('ragged-bs4: torch vs oracle'))")
            after = _titles(page)
            assert after != before and all("seed-shape" not in t for t in after), after
            # the ragged batch's request boundaries on the token axis of the heatmap
            assert page.locator(".jp-OutputArea .annotation-text:text-is('r3')").count() >= 1
            shots.append(tmp_path / "replay-ragged-bs4.png")
            page.evaluate(top)
            page.screenshot(path=str(shots[-1]), full_page=False)

            # one case on the whole page: after picking a failing case every verdict on it is that
            # case's (the lint and PASS cells kept the first case's before issue 33)
            picker.select_option(label="failures/mask-indptr-sliced.pt")
            page.wait_for_function("() => document.querySelector('.kdkit-status').textContent.includes('mask-indptr-sliced')")
            page.wait_for_function(f"() => ({OUTPUT_TEXTS})().some(t => t.includes('mask-indptr-sliced: FAIL'))")
            texts = page.evaluate(OUTPUT_TEXTS)
            stale = [t for t in texts if "seed-shape" in t or "ragged-bs4" in t or t == "lint: clean"
                     or t.endswith(": PASS")]
            assert not stale, stale
            assert any(t.startswith("case failure-mask-indptr-sliced") for t in texts), texts
            assert any("ERROR mask-indptr-sliced [mask_indptr]" in t for t in texts), texts
            assert all("ragged-bs4" not in t and "seed-shape" not in t for t in _titles(page)), _titles(page)
            shots.append(tmp_path / "replay-mask-indptr-sliced.png")
            page.evaluate(top)
            page.screenshot(path=str(shots[-1]), full_page=False)
        except Exception as e:  # what the page showed, and what the server said
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "replay-failure.png"), full_page=True)
            raise AssertionError(f"{e}\n-- screenshot: {ARTIFACTS / 'replay-failure.png'}\n-- jupyter log:\n"
                                 f"{lab.tail()}") from e
        finally:
            browser.close()
    try:  # keep the screenshots where a person (or CI's artifacts) finds them
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for s in shots:
            shutil.copy(s, ARTIFACTS / s.name)
    except OSError:
        pass
    assert all(s.stat().st_size > 10_000 for s in shots)


def test_exported_replay_notebook_draws_its_figures_offline(tmp_path):
    """`jupyter nbconvert --execute --to html notebooks/replay.ipynb` (the defaults: the explorer)
    opened from disk in Chromium, with no network: every figure is drawn (issue 33: none were)."""
    from playwright.sync_api import sync_playwright

    run = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--execute", "--to", "html",
                          str(ROOT / "notebooks" / "replay.ipynb"), "--output-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))))
    assert run.returncode == 0, run.stderr[-3000:]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            # the page's require.js and MathJax links (nbconvert's template) go nowhere: refused here
            # as on a machine without a network
            page.route("http*://**", lambda route: route.abort())
            page.goto((tmp_path / "replay.html").as_uri(), timeout=RUN_S * 1000)
            page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 6",
                                   timeout=RUN_S * 1000)
            titles = page.eval_on_selector_all(".js-plotly-plot .gtitle", "els => els.map(e => e.textContent)")
            assert len(titles) == 6 and all(t.startswith("seed-shape") for t in titles), titles
            assert page.locator(".heatmaplayer image").count() >= 3
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "replay-exported.png"), full_page=False)
        finally:
            browser.close()


def test_report_folder_offline_every_figure_drawn_no_text_overflows(tmp_path):
    """`kdkit report DIR -o OUT` opened from disk with no network: the pages load the one shared
    plotly.js, every figure is drawn, a refused case shows its index arrays with the lint's
    finding, no text box runs past its edge, the index cuts no word (issue 33)."""
    from playwright.sync_api import sync_playwright

    from kdkit.cli import main
    src = tmp_path / "cases"
    src.mkdir()
    shutil.copy(ROOT / "data" / "captured_tensors" / "seed-shape.pt", src / "seed-shape.pt")
    for name in ("mask-indptr-sliced", "prefix-only-kv-indices"):
        shutil.copy(ROOT / "data" / "captured_tensors" / "failures" / f"{name}.pt", src / f"{name}.pt")
    out = tmp_path / "out"
    assert main(["report", str(src), "-o", str(out), "--backends", "oracle,torch"]) == 1
    overflow = """() => [...document.querySelectorAll('pre, td, li, p')]
        .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent.slice(0, 80))"""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 900})
            page.route("http*://**", lambda route: route.abort())
            page.goto((out / "index.html").as_uri())
            assert page.evaluate(overflow) == []
            fails = page.eval_on_selector_all("td.fail", "els => els.map(e => e.textContent)")
            assert len(fails) == 2 and all(" ..." in t or "..." not in t for t in fails), fails
            for html, figs, lint in (("seed-shape.html", 6, None),
                                     ("failure-mask-indptr-sliced.html", 1, "mask-indptr-sliced"),
                                     ("failure-prefix-only-kv-indices.html", 1, "prefix-only-kv-indices")):
                page.goto((out / html).as_uri())
                page.wait_for_function(f"() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= {figs}")
                titles = page.eval_on_selector_all(".js-plotly-plot .gtitle", "els => els.map(e => e.textContent)")
                assert len(titles) == figs, titles
                if lint:
                    assert "the index arrays against" in titles[0] and f"lint: {lint}" in titles[0], titles
                    assert page.locator(".js-plotly-plot .bars path").count() > 0      # bars, not an empty axis
                assert page.evaluate(overflow) == [], html
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / f"report-{html[:-5]}.png"), full_page=True)
        finally:
            browser.close()
