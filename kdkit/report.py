"""Text about cases and replays: `describe_case` (what `kdkit inspect` prints) and `write_report`,
a self-contained Markdown or HTML report of one or more ReplayReports.

An HTML report is viewable offline: plotly.js is inlined once (about 4.6 MB) ahead of the first
figure (a report folder's pages share one copy beside them instead); without plotly, or when a figure cannot be drawn, the report says why and has no figures.
A Markdown report's figures are PNGs in a folder beside it (<stem>-figures/), drawn by kaleido
where it is installed (it drives a local Chrome or Chromium); elsewhere one line says why not.
A report never overwrites an existing file unless asked (force=True / --force): by default a
`-YYYYmmdd-HHMMSS` suffix is added to the name and the path actually written is returned.
"""
from __future__ import annotations

import datetime as _dt
import html
import os
import re
import sys
import platform
import tempfile
from importlib import metadata
from pathlib import Path

import torch

from .case import TENSOR_FIELDS, Case
from .constants import KV_INDICES_COVER
from .layout import request_rows
from .files import publish

FORMATS = {".md": "markdown", ".html": "html", ".htm": "html"}


# ---- case description ----------------------------------------------------------------------
def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _table(header: list[str], rows: list[list], right: bool = True) -> str:
    from tabulate import tabulate
    align = "right" if right else "left"
    return tabulate(rows, header, tablefmt="simple", disable_numparse=True, stralign=align, numalign=align)


def _mark(val, want) -> str:
    """'-' for missing, and a '*' where a value differs from what the layout implies."""
    if val is None:
        return "-"
    return f"{val}*" if want is not None and val != want else str(val)


def describe_case(case: Case, path: str | os.PathLike | None = None, max_requests: int = 32) -> str:
    """Meta, params, every tensor's shape and dtype, a per-request table and the size on disk."""
    out = [f"case {case.case_id}" + (f"  ({path})" if path else "")]
    out.append("meta:")
    for k in sorted(case.meta):
        v = case.meta[k]
        if v not in (None, ""):
            out.append(f"  {k}: {v}")
    out.append("params:")
    out.append(f"  num_heads={case.num_heads} sm_scale={case.sm_scale:.6f} logit_cap={case.logit_cap} "
               f"causal={case.causal} layout={case.layout}")
    out.append(f"  kv_lora_rank={case.kv_lora_rank} qk_rope_head_dim={case.qk_rope_head_dim} "
               f"v_head_dim={case.v_head_dim}  bs={case.batch_size} tokens={case.num_tokens}")
    trows, total = [], 0
    for name in TENSOR_FIELDS:
        t = getattr(case, name)
        if t is None:
            trows.append([name, "-", "(absent)", "-"])
            continue
        nbytes = t.numel() * t.element_size()
        total += nbytes
        trows.append([name, _dtype(t), "x".join(str(s) for s in t.shape) or "scalar", _human(nbytes)])
    out.append("tensors:")
    out.append(_indent(_table(["name", "dtype", "shape", "bytes"], trows, right=False)))
    rows = request_rows(case)
    header = ["b", "q_len", "prefix", "kv_len", "mask_start", "mask_len"]
    body = [[r["b"], r["q_len"], _mark(r["prefix"], None), _mark(r["kv_len"], r["kv_expected"]),
             _mark(r["mask_start"], None), _mark(r["mask_len"], r["mask_expected"])]
            for r in rows[:max_requests]]
    out.append(f"requests ({case.layout} layout; * = differs from what the layout implies: "
               f"kv_len {KV_INDICES_COVER[case.layout]}, "
               f"mask_len q_len*(prefix+q_len)):")
    out.append(_indent(_table(header, body)))
    if len(rows) > max_requests:
        out.append(f"  ... {len(rows) - max_requests} more requests")
    size = f"in memory {_human(total)}"
    if path is not None and Path(path).is_file():
        size = f"on disk {_human(Path(path).stat().st_size)}, " + size
    out.append(f"size: {size}")
    return "\n".join(out)


def _indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + ln for ln in text.splitlines())


def lint_line(findings) -> str:
    """One line about a lint result: clean, or the counts and the fields at fault."""
    if not findings:
        return "lint: clean"
    errs = [f for f in findings if f.severity == "error"]
    warns = [f for f in findings if f.severity == "warning"]
    parts = []
    if errs:
        parts.append(f"{len(errs)} error{'s' * (len(errs) != 1)} "
                     f"({', '.join(sorted({f'{f.code} [{f.field}]' for f in errs}))})")
    if warns:
        parts.append(f"{len(warns)} warning{'s' * (len(warns) != 1)}")
    if not parts:
        return f"lint: clean ({len(findings)} note{'s' * (len(findings) != 1)})"
    return "lint: " + ", ".join(parts) + ("; `kdkit inspect CASE` explains" if errs else "")


# ---- the machine -----------------------------------------------------------------------------
def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu() -> str:
    """The CPU's model, the instruction set torch's CPU kernels dispatch to and torch's threads: the
    torch and oracle backends' last bits depend on them, so a report that differs on another
    machine says which one it came from."""
    model, flags = platform.processor() or platform.machine(), set()
    try:  # Linux; a VM's model name may be generic ("Intel Xeon Processor"): its flags tell the generation
        with open("/proc/cpuinfo") as f:
            info = f.read()
        model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), model)
        flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []))
    except OSError:
        pass
    has = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile") if f in flags]
    if has:
        model += " (" + " ".join(has) + ")"
    try:
        isa = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        isa = "unknown"
    return f"{model}; torch CPU kernels {isa}, {torch.get_num_threads()} threads"


def machine() -> dict:
    """What the replay ran on; versions read from package metadata (importing triton is slow)."""
    from . import __version__
    if torch.cuda.is_available():
        gpu = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    else:
        gpu = "CPU only"
    return {"kdkit": __version__, "python": platform.python_version(),
            "platform": platform.platform(terse=True), "cpu": cpu(), "torch": str(torch.__version__),
            "triton": _version("triton"), "numpy": _version("numpy"), "gpu": gpu,
            "cuda (torch)": str(torch.version.cuda or "none")}


# ---- pieces of a ReplayReport ------------------------------------------------------------------
def rows_of(rep) -> list:
    return list(getattr(rep, "rows", []) or [])


def skipped(rep) -> list[tuple[str, str]]:
    """(backend, why) for each skipped backend; unavailable() reasons often open with the name."""
    out = []
    for r in rows_of(rep):
        if r.status == "skipped":
            why = r.reason or ""
            out.append((r.backend, why[len(r.backend) + 1:].strip() if why.startswith(f"{r.backend}:") else why))
    return out


def ran_line(row) -> str | None:
    """`backend: what ran` for a backend that ran: its Result.info["ran"], as the backend said it."""
    what = (row.info or {}).get("ran")
    if row.status not in ("pass", "fail") or not what:
        return None
    return f"{row.backend}: {what}"


def ran(rep) -> list[str]:
    return [line for line in (ran_line(r) for r in rows_of(rep)) if line]


def failed(rep) -> list:
    return [r for r in rows_of(rep) if r.status in ("fail", "error")]


def outcome(rep) -> tuple[bool, str]:
    """(ok, one line): the backends that failed or errored, and lint errors, or 'pass'. A replay
    in which no backend was judged against the reference (all skipped, or only the reference
    itself asked for) is not a pass: nothing was checked."""
    bad = failed(rep)
    lint_errors = sorted({f.code for f in _findings(rep) if f.severity == "error"})
    parts = []
    if bad:  # each with why: a one-line verdict must be enough to tell a failed check from a crash
        parts.append(f"{len(bad)} backend(s) failed: " + ", ".join(_why_bad(r) for r in bad))
    against = getattr(rep, "against", "oracle")
    if not bad and not any(r.status == "pass" and r.backend != against for r in rows_of(rep)):
        sk = skipped(rep)
        parts.append("nothing judged" + (": " + "; ".join(f"{b} skipped ({why})" for b, why in sk) if sk
                                         else f": no backend beside {against} was asked for"))
    if lint_errors:
        parts.append(f"lint errors: {', '.join(lint_errors)}")
    return (not parts, "; ".join(parts) if parts else "pass")


def _why_bad(row, width: int = 120) -> str:
    """'torch (fail: ulp_row 1.3 > ...)' or 'torch (error: RuntimeError: ...)', the reason cut to one
    short line."""
    why = " ".join(str(getattr(row, "reason", "") or "").split())
    if len(why) > width:  # cut between words: "kdkit inspect" cut to "kdkit insp..." read as a typo
        head = why[:width - 4]
        # (a single word longer than the room is cut inside it: dropping it would drop the reason)
        why = (head.rsplit(" ", 1)[0] if " " in head[width // 2:] else head) + " ..."
    return f"{row.backend} ({row.status}{': ' + why if why else ''})"


# One line per column of ReplayReport.table(), printed under it (the column names are short)
TOLERANCE_DOCS = "docs/judge.md"


def table_legend(rep) -> str:
    """What each column of the results table means, the limit's dependence on the production
    path said with this replay's own names, and where the tolerances are explained."""
    against = getattr(rep, "against", "oracle")
    prod = getattr(rep, "production", None)
    asked = ", ".join(r.backend for r in rows_of(rep))
    if prod:
        limit = (f"the max_abs allowed: 2 x the production path's error on this case ({prod}, the "
                 f"best-known path among those asked for: {asked}) + a rounding floor; asking for "
                 f"another set of backends can change it. {prod}'s own limit: the floor alone")
    else:
        limit = ("the max_abs allowed: a rounding floor (no production path was asked for; with one, "
                 "2 x its error on this case + a smaller floor)")
    lines = [f"status    pass / fail against {against}; error: it could not run or its output was unusable;"
             f" skipped: not runnable here (why below). {against}'s own row is the reference, not a test",
             f"max_abs   largest |out - {against}| over every output element; mean_abs: their mean",
             "rel       ||out - ref|| / ||ref||;  cos_dist: 1 - cosine similarity (0 = same direction)",
             f"lse_err   largest |lse - {against}'s lse| (the log-sum-exp the kernels return)",
             f"limit     {limit}",
             "nearest   the check closest to its limit, as value / limit (ulp_mean 0.27: 27% of its "
             "limit; above 1 fails)",
             "time      wall time of that backend's run (host included; not a benchmark)",
             f"tolerances, and why they are what they are: {TOLERANCE_DOCS}"]
    return "\n".join(lines)


def _summary(rep) -> str:
    s = getattr(rep, "summary", "")
    return s() if callable(s) else str(s)


def _findings(rep) -> list:
    return list(getattr(rep, "lint", None) or [])


def _lint_text(rep) -> str:
    why = getattr(rep, "lint_error", None)
    if why:
        return f"lint: {why}"
    from . import lint
    return lint.format_findings(_findings(rep))


def report_figures(rep, case: Case | None = None) -> list:
    """The figures of one replay: the metrics per backend, and given the case the rest of
    kdkit.plots.replay_figures (error heatmaps, error along KV, tree and mask, visibility,
    probabilities on the worst row): what replay.ipynb draws."""
    from . import plots
    if case is None:
        return [plots.metrics_bar(rep)] + [plots.error_heatmap(r.verdict, rep.case_id, r.backend)
                                           for r in rows_of(rep) if r.verdict is not None and r.backend != rep.against]
    return list(plots.replay_figures(case, rep).values())


def _figures(rep, case=None) -> tuple[list, str | None]:
    """(plotly figures, None) or ([], why not)."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        return [], "plotly is not installed (pip install 'kdkit[reports]'): no figures"
    try:
        return report_figures(rep, case), None
    except Exception as e:  # a figure that cannot be drawn must not cost the whole report
        return [], f"figures unavailable: {type(e).__name__}: {e}"


# ---- writing ---------------------------------------------------------------------------------
def free_path(path: str | os.PathLike, force: bool = False) -> Path:
    """`path`, or when it exists (and not force) the same name with a timestamp suffix."""
    path = Path(path)
    if force or not os.path.lexists(path):  # lexists: a dangling link is a name taken too
        return path
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    cand = path.with_name(f"{path.stem}-{stamp}{path.suffix}")
    n = 2
    while os.path.lexists(cand):
        cand = path.with_name(f"{path.stem}-{stamp}-{n}{path.suffix}")
        n += 1
    return cand


def render_markdown(reports: list, sources: list | None = None, stopped: list | None = None,
                    pngs: list | None = None, pngs_note: str | None = None) -> str:
    """The Markdown report. pngs[i]: report i's figures, [(path relative to the report, alt text)],
    or the line saying why it has none (write_pngs); pngs_note: that line for every report."""
    m = machine()
    out = ["# kdkit replay report", "",
           f"Written {_dt.datetime.now().astimezone().isoformat(timespec='seconds')} by kdkit {m['kdkit']}.",
           "", "## Machine", ""]
    out += [f"- {k}: {v}" for k, v in m.items()]
    for i, rep in enumerate(reports):
        src = sources[i] if sources and i < len(sources) else None
        out += ["", f"## {_md(getattr(rep, 'case_id', f'case {i}'))}", ""]
        if src:
            out.append(f"File: `{src}`  ")
        ok, line = outcome(rep)
        lint_text, table = _lint_text(rep), rep.table()
        out += [_md(_summary(rep)), "", f"**Result: {_md(line) if ok else 'FAIL (' + _md(line) + ')'}**", "",
                "### Lint", "", *_fenced(lint_text), "",
                "### Backends", "", *_fenced(table), "", *_fenced(table_legend(rep)), ""]
        figs = pngs[i] if pngs and i < len(pngs) else pngs_note
        if isinstance(figs, str):
            out += ["### Figures", "", _md(figs), ""]
        elif figs:
            out += ["### Figures", ""] + [f"![{alt}](<{png}>)" for png, alt in figs] + [""]
        if ran(rep):
            out += ["### What ran", ""] + [f"- {line}" for line in ran(rep)] + [""]
        seeds = list(rep.seed_lines())
        if seeds:
            out += ["### Seed-style diff lines", "", *_fenced("\n".join(seeds)), ""]
        sk = skipped(rep)
        if sk:
            out += ["### Skipped", ""] + [f"- {name}: {why}" for name, why in sk] + [""]
    if stopped:
        out += ["", "## Not replayed", ""] + [f"- `{src}`: {_md(why)}" for src, why in stopped]
    return "\n".join(out).rstrip() + "\n"


def _fenced(text: str) -> list[str]:
    """A code block around `text` that nothing in it can close: a fence of more backticks than the
    longest run in it (a case id is the user's, and may hold a fence of its own)."""
    runs = [len(r) for r in re.findall(r"`+", text)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return [fence, text, fence]


def _md(text) -> str:
    """Text from a case (its id, note, a reason) in Markdown prose: HTML-escaped, since Markdown
    viewers render raw HTML (a shared case's id is data, not markup)."""
    # (on one line: a newline in a case id would end its heading and could open a block)
    return html.escape(" ".join(str(text).splitlines()), quote=False)


def _templates():
    import jinja2
    return jinja2.Environment(loader=jinja2.PackageLoader("kdkit", "templates"), autoescape=True,
                              trim_blocks=True, lstrip_blocks=True)


def _written() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def _section(rep, source=None, case=None, figures: bool = True, with_js: bool = True) -> dict:
    """What the HTML template shows of one replay; figures as HTML snippets, plotly.js inlined in
    the first one when with_js (once per page, so that the page works without a network)."""
    ok, line = outcome(rep)
    sec = {"case_id": str(getattr(rep, "case_id", "case")), "source": source, "summary": _summary(rep),
           "ok": ok, "outcome": line, "lint": _lint_text(rep), "table": rep.table(),
           "legend": table_legend(rep), "ran": ran(rep),
           "seeds": list(rep.seed_lines()), "skipped": skipped(rep), "figures": [], "figures_note": None}
    if figures:
        figs, sec["figures_note"] = _figures(rep, case)
        for fig in figs:
            sec["figures"].append(fig.to_html(full_html=False, include_plotlyjs=with_js, include_mathjax=False))
            with_js = False
    return sec


# A report folder's pages share one copy of plotly.js beside them (a relative <script src>: still
# offline), instead of 4.6 MB inlined in each page
PLOTLY_JS = "plotly.min.js"


def render_html(reports: list, sources: list | None = None, figures: bool = True,
                cases: list | None = None, stopped: list | None = None, index: str | None = None,
                plotly_src: str | None = None) -> str:
    """One HTML page; plotly.js inlined once (self-contained) unless plotly_src names the copy
    the page loads instead (a report folder's shared one)."""
    at = (lambda xs, i: xs[i] if xs and i < len(xs) else None)
    sections = []
    for i, rep in enumerate(reports):
        first = plotly_src is None and not any(s["figures"] for s in sections)
        sections.append(_section(rep, at(sources, i), at(cases, i), figures, with_js=first))
    return _templates().get_template("report.html.j2").render(
        title="kdkit report", written=_written(), machine=machine(), sections=sections,
        stopped=stopped or [], index=index,
        plotly_src=plotly_src if any(s["figures"] for s in sections) else None)


def write_plotly_js(out_dir: Path, force: bool = False) -> str:
    """plotly.js in out_dir, once (kept when the same copy is there); the name pages load it by."""
    from plotly.offline import get_plotlyjs
    js = get_plotlyjs()
    path = out_dir / PLOTLY_JS
    if path.is_file() and path.read_text(errors="replace") == js:
        return path.name
    path = free_path(path, force)
    publish(path, js, overwrite=force)
    return path.name


PNG_SIZE = (900, 560)   # px: the figures' width and default height in a Markdown report (a viewer scales them down)


def _alt(fig) -> str:
    """A figure's title head as Markdown alt text: plain, one line, no brackets to end it early."""
    head = str(fig.layout.title.text or "figure").split("<br>")[0]
    return re.sub(r"[\[\]\\]", "", _md(re.sub("<[^>]+>", "", head)))


def write_pngs(reports: list, cases: list | None, target: Path, force: bool = False) -> tuple[list, str | None]:
    """Each report's figures as PNGs in a folder beside the Markdown file `target` (<stem>-figures/),
    drawn by kaleido (plotly's static export, which drives a local Chrome or Chromium):
    ([per report: [(path relative to target, alt text), ...] or why it has none], None), or
    ([], the one line the Markdown says instead: no kaleido, no browser for it, a failed export)."""
    try:
        import kaleido
    except ImportError:
        return [], "No figures: PNG export needs kaleido (pip install 'kdkit[reports]'); the HTML report (.html) has them."
    folder = free_path(target.with_name(f"{page_stem(target.stem)}-figures"), force)
    drawn, specs, taken = [], [], set()
    for i, rep in enumerate(reports):
        figs, why = _figures(rep, cases[i] if cases and i < len(cases) else None)
        stem = _page_name(str(rep.case_id), taken)[:-len(".html")]
        names = [(f"{stem}-{n}.png", _alt(fig)) for n, fig in enumerate(figs, 1)]
        specs += [{"fig": fig.to_dict(), "name": name,
                   "opts": {"format": "png", "width": fig.layout.width or PNG_SIZE[0],
                            "height": fig.layout.height or PNG_SIZE[1]}} for fig, (name, _) in zip(figs, names)]
        drawn.append(why or names)
    try:
        with tempfile.TemporaryDirectory() as tmp:  # drawn there, then published (never over a file unasked)
            for spec in specs:
                spec["path"] = Path(tmp) / spec.pop("name")
            # one browser for every figure (a launch per figure took 4 s); no MathJax: kaleido would
            # fetch it from a CDN, and no title here is LaTeX (plotly.js comes from plotly's package)
            if specs:
                kaleido.write_fig_from_object_sync(specs, kopts={"mathjax": False}, cancel_on_error=True)
            for spec in specs:
                publish(folder / spec["path"].name, spec["path"].read_bytes(), overwrite=force)
    except Exception as e:  # no Chrome for kaleido, a browser that died: the report goes out without figures
        first = (str(e).strip().splitlines() or [""])[0]
        return [], f"No figures: the PNG export failed ({type(e).__name__}: {first})"
    return [d if isinstance(d, str) else [(f"{folder.name}/{name}", alt) for name, alt in d] for d in drawn], None


def write_report(reports, path: str | os.PathLike, force: bool = False, sources: list | None = None,
                 cases: list | None = None, stopped: list | None = None, figures: bool = True) -> Path:
    """Write `reports` (one ReplayReport or a list) as Markdown (.md) or HTML (.html).

    Returns the path written: `path` itself, or `path` with a timestamp suffix when it exists and
    force is False. sources: the case file of each report, shown in the report; cases: the Case
    of each report, for the figures that need its inputs (visibility, oracle probabilities);
    stopped: (case file, why) for cases that could not be replayed at all.
    """
    if not isinstance(reports, (list, tuple)):
        reports = [reports]
    path = Path(path)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"{path}: a report is .md (Markdown) or .html (HTML); got suffix {path.suffix!r}")
    target = free_path(path, force)
    if kind == "markdown":
        pngs, note = write_pngs(reports, cases, target, force) if figures else ([], None)
        text = render_markdown(reports, sources, stopped, pngs, note)
    else:
        text = render_html(reports, sources, figures=figures, cases=cases, stopped=stopped)
    publish(target, text, overwrite=force)
    return target


def is_report_dir(out: str | os.PathLike) -> bool:
    """--out names a directory (per-case pages + index.html): an existing one, or a name without a
    suffix; anything else is one report file (.html/.md; another suffix is refused)."""
    return Path(out).is_dir() or not Path(out).suffix


# A case's id is data from a shared file, never a path: a page takes only [A-Za-z0-9._-] of it
# (no "../", no "/"), at most PAGE_STEM_MAX characters (file names stop at 255 bytes)
PAGE_STEM_MAX = 120


def page_stem(case_id) -> str:
    """The file-name stem a report page of this case id takes."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", str(case_id)).strip("._")
    return base[:PAGE_STEM_MAX].rstrip("._") or "case"


def _page_name(case_id: str, taken: set) -> str:
    base = page_stem(case_id)
    name, n = f"{base}.html", 2
    while name in taken or name == "index.html":
        name, n = f"{base}-{n}.html", n + 1
    taken.add(name)
    return name


def write_report_dir(reports, out_dir: str | os.PathLike, sources: list | None = None,
                     cases: list | None = None, stopped: list | None = None, force: bool = False,
                     backends: str = "", against: str = "oracle", progress: bool = True) -> Path:
    """One HTML page per case in out_dir, all loading the one plotly.js beside them (plotly.min.js:
    the folder opens offline, ten pages weigh 5 MB, not 50) and index.html: pass/fail per case,
    linked to its page, and the cases that could not be replayed. Existing files are kept
    (timestamped names) unless force.
    Returns the index's path; a progress bar runs on stderr when it is a terminal."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    index = free_path(out / "index.html", force)
    try:
        import plotly  # noqa: F401
        plotly_src = write_plotly_js(out, force)
    except ImportError:  # the pages say why they have no figures
        plotly_src = None
    at = (lambda xs, i: xs[i] if xs and i < len(xs) else None)
    todo = range(len(reports))
    if progress:
        try:
            from tqdm import tqdm
            todo = tqdm(todo, desc="report pages", unit="case", file=sys.stderr, disable=None)
        except ImportError:
            pass
    rows, taken = [], set()
    for i in todo:
        rep, src = reports[i], at(sources, i)
        page = free_path(out / _page_name(str(rep.case_id), taken), force)
        publish(page, render_html([rep], [src], cases=[at(cases, i)], index=index.name,
                                  plotly_src=plotly_src), overwrite=force)
        ok, line = outcome(rep)
        rows.append({"case_id": rep.case_id, "page": page.name, "ok": ok, "outcome": line, "source": src,
                     "lint": lint_line(_findings(rep)),
                     "backends": [f"{r.backend}: {r.status}" + (f" {r.verdict.metrics.max_abs:.2e}" if r.verdict else "")
                                  for r in rows_of(rep)]})
    for src, why in stopped or []:
        rows.append({"case_id": Path(str(src)).stem, "page": None, "ok": False, "outcome": why,
                     "source": src, "lint": "-", "backends": []})
    text = _templates().get_template("index.html.j2").render(
        title="kdkit reports", written=_written(), machine=machine(), rows=rows, backends=backends,
        against=against, passed=sum(r["ok"] for r in rows), total=len(rows))
    publish(index, text, overwrite=force)
    return index


__all__ = ["describe_case", "lint_line", "machine", "write_report", "write_report_dir", "free_path", "page_stem",
           "report_figures", "rows_of", "outcome",
           "render_markdown", "render_html", "skipped", "failed"]
