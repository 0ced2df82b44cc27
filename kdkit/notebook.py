"""What the notebooks call, so that they stay a parameters cell and a few calls:

    resolve(path)              a repo-relative path that works from the repo root and from notebooks/
    ReplayView.load(path, backends)   one case replayed, and its figures (the same with or without widgets)
    ReplayPage(view)           the parts of a page about one case (case, lint, verdict, figures,
                               outcome), each shown where a cell calls show(), redrawn together
    ReplayExplorer(view, cases_dir)   the widgets: case picker, backends, token/head; they drive the page
    use_offline_figures()      figure.show() emits figures that survive export (done on import)
    capture_rows(directory, limit=None)   the table of a capture directory (layer, rank, step, shapes,
                               lint, verdict), with a progress bar
    pick_replayable(rows)      the row capture.ipynb replays: the first passing case, else the first
                               one that replays at all, else None
    emit(result)               the structured output a notebook leaves for its test (read_result reads it)
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import lint as _lint
from . import plots, replay, report
from .backends import BACKENDS
from .backends import resolve as resolve_backends
from .case import Case, load
from .case import case_files as find_case_files

RESULT_MIME = "application/vnd.kdkit.result+json"
REPO = Path(__file__).resolve().parents[1]
BUNDLED_DIR = "data/captured_tensors"
# <model>-L<layer>-r<rank>-s<step>.pt, the capture hook's file names
CAPTURE_NAME = re.compile(r"^(?P<model>.+)-L(?P<layer>\d+)-r(?P<rank>\d+)-s(?P<step>\d+)$")


# ---- paths ------------------------------------------------------------------------------------
def resolve(path: str | os.PathLike) -> Path:
    """`path` as given (absolute, or relative to the working directory), else relative to the
    repository this kdkit lives in: JupyterLab runs a notebook in notebooks/, papermill and the
    CLI usually in the repository root, and one default has to work from both."""
    p = Path(path).expanduser()
    tried = [p if p.is_absolute() else Path.cwd() / p]
    if p.exists():
        return p.resolve()
    if not p.is_absolute():
        cand = REPO / p
        tried.append(cand)
        if cand.exists():
            return cand
    raise FileNotFoundError(f"{path}: not found (tried {', '.join(str(t) for t in tried)})")


def resolve_paths(spec) -> Path | list[Path] | None:
    """A notebook's path parameter that may be empty, one path or a list of them, each resolved
    as resolve() does ("" or None: None)."""
    if not spec:
        return None
    if isinstance(spec, (list, tuple)):
        return [resolve(p) for p in spec]
    return resolve(spec)


def case_files(directory: str | os.PathLike) -> list[Path]:
    """Every case file (*.pt) under `directory` (resolve()d), sorted; [] for a folder without any.
    kdkit.case.case_files lists them, as for the command line (a link to nowhere is listed)."""
    return find_case_files(resolve(directory), empty_ok=True)


def backend_list(spec) -> list[str]:
    """'all', 'oracle,torch' or a list -> backend names (kdkit.backends.resolve; ValueError names
    the unknown ones)."""
    return resolve_backends(spec)


# ---- one replayed case ------------------------------------------------------------------------
@dataclass
class ReplayView:
    """A case, its replay, and the figures drawn from them. token/head choose the row of the
    probability and KV-error figures (default: the worst row of the worst judged backend)."""
    case: Case
    rep: object
    path: Path | None = None

    @classmethod
    def load(cls, path, backends="oracle,torch", against: str = "oracle") -> "ReplayView":
        path = resolve(path)
        case = load(path)
        return cls(case, replay.replay(case, backend_list(backends), against=against), path)

    def figures(self, token: int | None = None, head: int | None = None) -> dict:
        """name -> figure (kdkit.plots.replay_figures). None or -1 for token/head: the worst row."""
        return plots.replay_figures(self.case, self.rep, token, head)

    def text(self) -> str:
        ok, line = report.outcome(self.rep)
        return "\n".join([self.rep.table(), "", *self.rep.seed_lines(), "",
                          "PASS" if ok else "FAIL: " + line])

    def result(self, figures: dict | None = None) -> dict:
        """What a test asserts: per backend status and max_abs, lint codes, the figures drawn."""
        ok, line = report.outcome(self.rep)
        rows = {r.backend: {"status": r.status,
                            "max_abs": r.verdict.metrics.max_abs if r.verdict else None,
                            "limit": r.verdict.limit if r.verdict else None} for r in self.rep.rows}
        out = {"case_id": self.case.case_id, "path": str(self.path) if self.path else None,
               "ok": ok, "outcome": line, "rows": rows,
               "lint": sorted({f.code for f in (self.rep.lint or [])}),
               "bs": self.case.batch_size, "tokens": self.case.num_tokens, "heads": self.case.num_heads}
        if figures is not None:
            out["figures"] = {k: _title_text(f) for k, f in figures.items()}
        return out


def _title_text(fig) -> str:
    return fig.layout.title.text or ""


def show_figures(figs: dict) -> None:
    for fig in figs.values():
        fig.show()


# ---- figures that survive export -------------------------------------------------------------
# A figure's output carries two forms: plotly's own JSON (what JupyterLab's plotly extension
# draws) and HTML (a div and the Plotly.newPlot call: what nbconvert's HTML export and any viewer
# without the extension draw). The HTML needs plotly.js on the page: the first figure a kernel
# shows carries it, inlined (about 4.6 MB, once per notebook; the machines have no network, so
# never a CDN link). A cell re-run later in the same kernel does not carry it again: export a
# notebook run top to bottom (nbconvert --execute, papermill), as shared notebooks are.
PLOTLY_MIME = "application/vnd.plotly.v1+json"
RENDERER = "kdkit_offline"
_js_shown = False


def plotly_js_html() -> str:
    """plotly.js inlined as <script>s that define window.Plotly even where require.js is on the
    page (nbconvert's HTML template loads it): plotly.js registers as an AMD module, not as
    window.Plotly, when it finds `define`, so `define` is hidden while it runs."""
    from plotly.offline import get_plotlyjs
    return ("<script>window.PlotlyConfig = {MathJaxConfig: 'local'};"
            "window._kdkitDefine = window.define; window.define = undefined;</script>\n"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script>\n"
            "<script>window.define = window._kdkitDefine;</script>")


def take_plotly_js() -> str:
    """plotly_js_html() the first time in this kernel, "" after."""
    global _js_shown
    if _js_shown:
        return ""
    _js_shown = True
    return plotly_js_html()


def figure_bundle(fig, js: str = "") -> dict:
    """A figure's display bundle: plotly's JSON and the offline HTML (after `js`, plotly.js)."""
    import json

    import plotly.io as pio
    fig_dict = fig if isinstance(fig, dict) else fig.to_dict()
    div = pio.to_html(fig_dict, include_plotlyjs=False, include_mathjax=False, full_html=False,
                      validate=False)
    return {PLOTLY_MIME: json.loads(pio.to_json(fig_dict, validate=False, remove_uids=False)),
            "text/html": js + div, "text/plain": f"<{_title_plain(fig_dict)}>"}


def _title_plain(fig_dict: dict) -> str:
    text = ((fig_dict.get("layout") or {}).get("title") or {}).get("text") or "plotly figure"
    return re.sub(r"<[^>]+>", " ", text).strip()


def use_offline_figures() -> bool:
    """Make figure.show() in this Jupyter kernel emit figure_bundle (kdkit.notebook does it on
    import). Not in a plain Python or a terminal IPython, and not when the user chose a renderer
    (PLOTLY_RENDERER). Returns whether it did."""
    try:
        from IPython import get_ipython
        import plotly.io as pio
        from plotly.io._base_renderers import MimetypeRenderer
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell" or os.environ.get("PLOTLY_RENDERER"):
        return False

    class OfflineRenderer(MimetypeRenderer):
        def to_mimebundle(self, fig_dict):
            return figure_bundle(fig_dict, take_plotly_js())

    pio.renderers[RENDERER] = OfflineRenderer()
    pio.renderers.default = RENDERER
    return True


# ---- one case on a page --------------------------------------------------------------------------
def _text_bundle(text: str) -> dict:
    return {"text/plain": text}


_EMPTY = {"text/plain": ""}


class ReplayPage:
    """Every part of a notebook about one case (what it holds, the lint, the verdict table, the
    figures, the PASS/FAIL line), each shown where a cell calls show(part) and redrawn in place,
    through display ids, when the case changes (set_view): one case on the whole page, never two.
    The outputs are ordinary cell outputs, so an exported notebook keeps them."""

    PARTS = ("case", "lint", "verdict", "figures", "outcome")

    def __init__(self, view: ReplayView | None, token: int | None = None, head: int | None = None):
        self.view, self.token, self.head = view, token, head
        self.error: str | None = None      # why the picked case could not be replayed
        self.slots = 0                     # figure outputs kept for redraws (ReplayExplorer sets it)
        self._handles: dict[str, list] = {}
        self._figs: tuple | None = None    # (view, token, head, figures): drawn once per state

    def figures(self) -> dict:
        """name -> figure of the current case and row ({} without a case)."""
        if self.view is None:
            return {}
        key = (id(self.view), self.token, self.head)
        if self._figs is None or self._figs[0] != key:
            self._figs = (key, self.view.figures(self.token, self.head))
        return self._figs[1]

    def _figure_bundles(self) -> list[dict]:
        try:
            return [figure_bundle(f) for f in self.figures().values()]
        except Exception as e:  # e.g. a mis-marshaled case the oracle cannot read
            return [_text_bundle(f"figures unavailable: {type(e).__name__}: {e}")]

    def bundles(self, part: str) -> list[dict]:
        if part not in self.PARTS:
            raise ValueError(f"part = {part!r}: one of {', '.join(self.PARTS)}")
        if self.view is None:
            why = self.error or "no case picked"
            return [_text_bundle(why)] if part in ("case", "outcome") else [_EMPTY]
        if part == "figures":
            return self._figure_bundles()
        if part == "case":
            return [_text_bundle(report.describe_case(self.view.case, self.view.path))]
        if part == "lint":
            return [_text_bundle(_lint.format_findings(self.view.rep.lint or []))]
        ok, line = report.outcome(self.view.rep)
        if part == "verdict":
            return [_text_bundle("\n".join([self.view.rep.table(), "", report.table_legend(self.view.rep), "",
                                             *self.view.rep.seed_lines()]).rstrip())]
        return [_text_bundle(f"{self.view.case.case_id}: " + ("PASS" if ok else "FAIL: " + line))]

    def show(self, *parts: str) -> None:
        """Display these parts in the current cell; later set_view() calls redraw them there."""
        from IPython.display import display
        for part in parts:
            got = self.bundles(part)
            if part == "figures":
                js = take_plotly_js()
                if js:  # plotly.js once, in an output of its own that is never redrawn
                    display({"text/html": js, "text/plain": ""}, raw=True)
                got = got + [_EMPTY] * (self.slots - len(got))
            handles = [display(b, raw=True, display_id=True) for b in got]
            self._handles.setdefault(part, []).extend(handles)

    def redraw(self) -> None:
        for part, handles in self._handles.items():
            got = self.bundles(part)
            for i, h in enumerate(handles):
                if part == "figures":
                    # JupyterLab's plotly renderer ignores a new figure for an output it has drawn
                    # in (it keeps the first): blank the output first, so a fresh one draws it
                    h.update(_EMPTY, raw=True)
                h.update(got[i] if i < len(got) else _EMPTY, raw=True)

    def set_view(self, view: ReplayView | None, token: int | None = None, head: int | None = None,
                 error: str | None = None) -> None:
        self.view, self.token, self.head, self.error = view, token, head, error
        self.redraw()

    def result(self) -> dict:
        """ReplayView.result of the current case, with its figures' titles (what a test reads)."""
        if self.view is None:
            return {"ok": False, "outcome": self.error}
        return self.view.result(self.figures())


# ---- widgets ----------------------------------------------------------------------------------

def _esc(text) -> str:
    """Text from a case (its id, file name, a reason) for a widget's HTML: the HTML widget sets
    innerHTML, and a shared case's id is not to be trusted."""
    import html
    return html.escape(str(text))


class ReplayExplorer:
    """A case picker over a directory, a backend selector and token and head sliders that drive a
    ReplayPage: every part of the page shown so far is redrawn for the picked case. `.widget` is
    the controls and a status line; `.page.show(...)` places the parts."""

    def __init__(self, view: ReplayView | None = None, cases_dir=BUNDLED_DIR, backends="oracle,torch",
                 against: str = "oracle", page: ReplayPage | None = None):
        import ipywidgets as w
        self.against = against
        self.page = page or ReplayPage(view)
        # the most figures a case can have (the metrics, an error heatmap per backend but the
        # reference, the KV error, tree, visibility, probabilities): a case picked later with
        # more figures than the first one still has outputs to be drawn in
        self.page.slots = len(BACKENDS) + 4
        view = view or self.page.view
        # the first row drawn: the page's token/head when given (>= 0), else the worst row
        self._start = (self.page.token, self.page.head)
        self.files = case_files(cases_dir)
        root = resolve(cases_dir)
        if view is not None and view.path is not None and view.path.resolve() not in [f.resolve() for f in self.files]:
            self.files.insert(0, view.path)
        label = (lambda p: str(p.relative_to(root)) if root in p.parents else str(p))
        self.case = w.Dropdown(options=[(label(p), str(p)) for p in self.files], description="case",
                               layout=w.Layout(width="420px"))
        self.backends = w.SelectMultiple(options=list(BACKENDS), description="backends", rows=len(BACKENDS))
        self.token = w.IntSlider(description="token", min=0, max=0, continuous_update=False)
        self.head = w.IntSlider(description="head", min=0, max=0, continuous_update=False)
        self.status = w.HTML()
        for x, cls in ((self.case, "kdkit-case"), (self.backends, "kdkit-backends"), (self.token, "kdkit-token"),
                       (self.head, "kdkit-head"), (self.status, "kdkit-status")):
            x.add_class(cls)
        self.view = view
        self.backends.value = tuple(backend_list(backends))
        if view is not None and view.path is not None:
            self.case.value = str(view.path)
        self._replay()
        self.case.observe(lambda _: self._replay(), names="value")
        self.backends.observe(lambda _: self._replay(), names="value")
        self.token.observe(lambda _: self._draw(), names="value")
        self.head.observe(lambda _: self._draw(), names="value")
        self.widget = w.VBox([w.HBox([w.VBox([self.case, self.token, self.head]), self.backends]), self.status])

    def _replay(self) -> None:
        self.status.value = f"<b>replaying</b> {_esc(self.case.label)} ..."
        path = Path(self.case.value)
        picked = list(self.backends.value) or ["oracle"]
        if self.view is None or self.view.path != path or [r.backend for r in self.view.rep.rows] != picked:
            try:
                self.view = ReplayView.load(path, picked, self.against)
            except Exception as e:  # a broken case file: said on the page, the widgets stay alive
                self.view = None
                why = f"cannot replay {path.name}: {type(e).__name__}: {e}"
                self.page.set_view(None, error=why)
                self.status.value = f"<b style='color:#b00020'>{_esc(why)}</b>"
                return
        _, t, h = plots.worst_row(self.view.rep)
        t0, h0 = self._start
        self._start = (None, None)
        t = t0 if t0 is not None and t0 >= 0 else t
        h = h0 if h0 is not None and h0 >= 0 else h
        self._quiet = True
        T = self.view.case.num_tokens  # 0: a case without query rows; the slider has nothing to pick
        self.token.min, self.token.max = 0, max(T - 1, 0)
        self.token.disabled = T == 0
        self.head.max = self.view.case.num_heads - 1
        self.token.value, self.head.value = min(t, max(T - 1, 0)), min(h, self.head.max)
        self._quiet = False
        self._draw()

    def _draw(self) -> None:
        if getattr(self, "_quiet", False) or self.view is None:
            return
        self.page.set_view(self.view, self.token.value, self.head.value)
        ok, line = report.outcome(self.view.rep)
        self.status.value = (f"<b>{_esc(self.view.case.case_id)}</b>: "
                             f"<span style='color:{'#1b5e20' if ok else '#b00020'}'>{'pass' if ok else _esc(line)}</span>"
                             f"; row token {self.token.value} head {self.head.value}"
                             "; every output below shows this case")


# ---- capture directories ------------------------------------------------------------------------
def capture_rows(directory, backends="oracle,torch", limit: int | None = None,
                 progress: bool = True) -> list[dict]:
    """One row per case file: layer, rank, step (from the case's meta, else from the capture file
    name), shapes, the lint one-liner and the replay verdict. A file that cannot be loaded is a
    row that says why. limit: the first `limit` files only (a capture directory of a long run
    holds thousands, each replayed); progress: a tqdm bar (a widget in JupyterLab, text elsewhere)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit = {limit!r}: a positive number of case files, or None for all of them")
    names = backend_list(backends)  # an unknown name: refused once, here, not once per case
    rows = []
    root = resolve(directory)
    files = case_files(root)[:limit]
    for p in progress_bar(files, progress, desc="replaying cases", unit="case"):
        m = CAPTURE_NAME.match(p.stem)
        row = {"file": str(p.relative_to(root)) if root in p.parents else p.name, "path": str(p),
               "layer": m and int(m["layer"]), "rank": m and int(m["rank"]), "step": m and int(m["step"])}
        try:
            case = load(p)
        except Exception as e:
            rows.append({**row, "case_id": "-", "shapes": "-", "lint": "-",
                         "verdict": f"cannot load: {type(e).__name__}: {e}"})
            continue
        meta = case.meta
        for k, keys in (("layer", ("layer", "layer_id")), ("rank", ("tp_rank",)), ("step", ("step",))):
            v = next((meta[x] for x in keys if meta.get(x) is not None), None)
            row[k] = v if v is not None else row[k]
        ql, pf = case.q_lens, [int(x) for x in case.prefix_lens]
        row.update(case_id=case.case_id, source=meta.get("source"),
                   shapes=(f"bs {case.batch_size}, H {case.num_heads}, q_len {_span(ql)}, prefix {_span(pf)}"),
                   lint=report.lint_line(_lint.check(case)))
        try:
            ok, line = report.outcome(replay.replay(case, names))
            row["verdict"] = "pass" if ok else line
        except Exception as e:
            row["verdict"] = f"replay stopped: {type(e).__name__}: {e}"
        rows.append(row)
    return rows


def progress_bar(items, show: bool, **kw):
    """items wrapped in tqdm.auto's bar when `show` (notebook-friendly: an ipywidgets bar in a
    Jupyter kernel that has ipywidgets, text on stderr elsewhere)."""
    if not show:
        return items
    from tqdm.auto import tqdm
    return tqdm(items, **kw)


def is_replayable(row: dict) -> bool:
    """A capture_rows row whose case loaded and whose replay ran to a verdict (pass or fail)."""
    return row.get("case_id") not in (None, "-") and not str(row.get("verdict", "")).startswith(
        ("cannot load", "replay stopped"))


def pick_replayable(rows: list[dict]) -> dict | None:
    """What capture.ipynb replays without widgets: the first passing case; else (a directory of
    bad captures, what a user debugging one has) the first case that loads and replays, with its
    failure; else None: nothing there can be replayed."""
    return (next((r for r in rows if r.get("verdict") == "pass"), None)
            or next((r for r in rows if is_replayable(r)), None))


def _span(xs: list[int]) -> str:
    return str(xs[0]) if len(set(xs)) == 1 else f"{min(xs)}..{max(xs)}"


def html_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """rows as an HTML table (pass in green, anything else in red in a 'verdict' column)."""
    import jinja2
    columns = columns or (list(rows[0]) if rows else [])
    tpl = jinja2.Environment(autoescape=True).from_string(
        "<table class='kdkit-table'><tr>{% for c in cols %}<th>{{ c }}</th>{% endfor %}</tr>"
        "{% for r in rows %}<tr>{% for c in cols %}<td{% if c == 'verdict' %} style='color:"
        "{{ '#1b5e20' if r[c] == 'pass' else '#b00020' }}'{% endif %}>{{ '-' if r[c] is none else r[c] }}</td>"
        "{% endfor %}</tr>{% endfor %}</table>")
    return tpl.render(rows=rows, cols=columns)


# ---- results for tests -------------------------------------------------------------------------
def emit(result: dict) -> None:
    """Leave `result` in the notebook as a structured output (RESULT_MIME) for its test to read."""
    from IPython.display import display
    display({RESULT_MIME: result, "text/plain": f"kdkit result: {', '.join(sorted(result))}"}, raw=True)


def read_result(nb) -> dict:
    """The last structured result an executed notebook (nbformat node) emitted."""
    found = [o["data"][RESULT_MIME] for c in nb.cells if c.get("cell_type") == "code"
             for o in c.get("outputs", []) if RESULT_MIME in o.get("data", {})]
    if not found:
        raise LookupError(f"the notebook emitted no {RESULT_MIME} output (kdkit.notebook.emit)")
    return found[-1]


use_offline_figures()
