"""Text about cases and replays: `describe_case` (what `kdkit inspect` prints) and `write_report`,
a self-contained Markdown or HTML report of one or more ReplayReports.

An HTML report is viewable offline: plotly.js is inlined once (about 4.6 MB) ahead of the first
figure; without plotly, or when a figure cannot be drawn, the report says why and has no figures.
A report never overwrites an existing file unless asked (force=True / --force): by default a
`-YYYYmmdd-HHMMSS` suffix is added to the name and the path actually written is returned.
"""
from __future__ import annotations

import datetime as _dt
import html
import os
import platform
from importlib import metadata
from pathlib import Path

import torch

from .case import TENSOR_FIELDS, Case
from .constants import KV_INDICES_COVER, kv_indices_len
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


def _at(t: torch.Tensor | None, i: int):
    """t[i] as an int, or None where the array is missing or too short (a broken capture)."""
    if t is None or i < 0 or i >= t.numel():
        return None
    return int(t[i])


def request_rows(case: Case) -> list[dict]:
    """Per request: q_len, prefix, KV length, mask block, and what the layout says they should be.

    Reads the index arrays defensively: a case that loads may still have a mask_indptr or kv_indptr
    of the wrong length (the seed's bugs); those entries show as None, for lint to explain.
    """
    rows = []
    bs = case.batch_size
    for b in range(bs):
        q_len = _at(case.qo_indptr, b + 1) - _at(case.qo_indptr, b)
        prefix = _at(case.prefix_lens, b)
        ks, ke = _at(case.kv_indptr, b), _at(case.kv_indptr, b + 1)
        kv_len = None if ks is None or ke is None else ke - ks
        kv_want = kv_indices_len(case.layout, prefix, q_len)
        row = {"b": b, "q_len": q_len, "prefix": prefix, "kv_len": kv_len, "kv_expected": kv_want,
               "mask_start": None, "mask_len": None, "mask_expected": None}
        if case.custom_mask is not None:
            ms, me = _at(case.mask_indptr, b), _at(case.mask_indptr, b + 1)
            row["mask_start"] = ms
            row["mask_len"] = None if ms is None or me is None else me - ms
            row["mask_expected"] = q_len * (prefix + q_len)  # q_len x (prefix + q_len), row-major
        rows.append(row)
    return rows


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


def machine() -> dict:
    """What the replay ran on; versions read from package metadata (importing triton is slow)."""
    from . import __version__
    if torch.cuda.is_available():
        gpu = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    else:
        gpu = "CPU only"
    return {"kdkit": __version__, "python": platform.python_version(),
            "platform": platform.platform(terse=True), "torch": str(torch.__version__),
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
    """(ok, one line): the backends that failed or errored, and lint errors, or 'pass'."""
    bad = failed(rep)
    lint_errors = sorted({f.code for f in _findings(rep) if f.severity == "error"})
    parts = []
    if bad:
        parts.append(f"{len(bad)} backend(s) failed: {', '.join(r.backend for r in bad)}")
    if lint_errors:
        parts.append(f"lint errors: {', '.join(lint_errors)}")
    return (not parts, "; ".join(parts) if parts else "pass")


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
    """The figures of one replay: metrics per backend, the error heatmap (head x query token) of
    every judged backend but the reference itself, and, given the case, the visibility of the
    request that holds the worst backend's worst row and the oracle's probabilities on that row."""
    from . import plots
    figs = [plots.metrics_bar(rep)]
    judged = [r for r in rows_of(rep) if r.verdict is not None and r.backend != rep.against]
    for r in judged:
        figs.append(plots.error_heatmap(r.verdict, rep.case_id, r.backend))
    if case is not None:
        if not judged:
            figs.append(plots.visibility_heatmap(case, 0))
            return figs
        worst = max(judged, key=lambda r: r.verdict.metrics.max_abs)
        token, head, _ = (int(x) for x in worst.verdict.metrics.worst)
        starts = case.qo_indptr.long().tolist()
        b = max(i for i in range(case.batch_size) if starts[i] <= token)  # the request of that row
        figs.append(plots.visibility_heatmap(case, b))
        figs.append(plots.kv_profile(case, token, head, backend=worst.backend))
    return figs


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
    if force or not path.exists():
        return path
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    cand = path.with_name(f"{path.stem}-{stamp}{path.suffix}")
    n = 2
    while cand.exists():
        cand = path.with_name(f"{path.stem}-{stamp}-{n}{path.suffix}")
        n += 1
    return cand


def render_markdown(reports: list, sources: list | None = None, stopped: list | None = None) -> str:
    m = machine()
    out = ["# kdkit replay report", "",
           f"Written {_dt.datetime.now().astimezone().isoformat(timespec='seconds')} by kdkit {m['kdkit']}.",
           "", "## Machine", ""]
    out += [f"- {k}: {v}" for k, v in m.items()]
    for i, rep in enumerate(reports):
        src = sources[i] if sources and i < len(sources) else None
        out += ["", f"## {getattr(rep, 'case_id', f'case {i}')}", ""]
        if src:
            out.append(f"File: `{src}`  ")
        ok, line = outcome(rep)
        out += [_summary(rep), "", f"**Result: {line if ok else 'FAIL (' + line + ')'}**", "",
                "### Lint", "", "```", _lint_text(rep), "```", "",
                "### Backends", "", "```", rep.table(), "```", ""]
        if ran(rep):
            out += ["### What ran", ""] + [f"- {line}" for line in ran(rep)] + [""]
        seeds = list(rep.seed_lines())
        if seeds:
            out += ["### Seed-style diff lines", "", "```", *seeds, "```", ""]
        sk = skipped(rep)
        if sk:
            out += ["### Skipped", ""] + [f"- {name}: {why}" for name, why in sk] + [""]
    if stopped:
        out += ["", "## Not replayed", ""] + [f"- `{src}`: {why}" for src, why in stopped]
    return "\n".join(out).rstrip() + "\n"


_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
pre{background:#f6f8fa;padding:.8em;overflow-x:auto;font-size:13px;line-height:1.35}
table.m td{padding:.1em .8em .1em 0} h2{border-bottom:1px solid #ddd;padding-bottom:.2em}
.fail{color:#b00020;font-weight:bold} .ok{color:#1b5e20;font-weight:bold} .note{color:#666}"""


def render_html(reports: list, sources: list | None = None, figures: bool = True,
                cases: list | None = None, stopped: list | None = None) -> str:
    esc = html.escape
    m = machine()
    body = [f"<h1>kdkit replay report</h1><p class='note'>Written "
            f"{esc(_dt.datetime.now().astimezone().isoformat(timespec='seconds'))} by kdkit {esc(m['kdkit'])}.</p>",
            "<h2>Machine</h2><table class='m'>"]
    body += [f"<tr><td>{esc(k)}</td><td>{esc(str(v))}</td></tr>" for k, v in m.items()]
    body.append("</table>")
    js_included = False
    for i, rep in enumerate(reports):
        src = sources[i] if sources and i < len(sources) else None
        ok, line = outcome(rep)
        verdict = f"<span class='{'ok' if ok else 'fail'}'>{esc(line if ok else 'FAIL: ' + line)}</span>"
        body.append(f"<h2>{esc(str(getattr(rep, 'case_id', f'case {i}')))}</h2>")
        if src:
            body.append(f"<p>File: <code>{esc(str(src))}</code></p>")
        body.append(f"<p>{esc(_summary(rep))}</p><p>{verdict}</p>")
        body.append(f"<h3>Lint</h3><pre>{esc(_lint_text(rep))}</pre>")
        body.append(f"<h3>Backends</h3><pre>{esc(rep.table())}</pre>")
        if ran(rep):
            body.append("<h3>What ran</h3><ul>" + "".join(f"<li>{esc(x)}</li>" for x in ran(rep)) + "</ul>")
        seeds = list(rep.seed_lines())
        if seeds:
            body.append(f"<h3>Seed-style diff lines</h3><pre>{esc(chr(10).join(seeds))}</pre>")
        sk = skipped(rep)
        if sk:
            body.append("<h3>Skipped</h3><ul>" + "".join(
                f"<li><b>{esc(n)}</b>: {esc(w)}</li>" for n, w in sk) + "</ul>")
        if not figures:
            continue
        figs, why = _figures(rep, cases[i] if cases and i < len(cases) else None)
        if why:
            body.append(f"<p class='note'>{esc(why)}</p>")
        if figs:
            body.append("<h3>Figures</h3>")
        for fig in figs:
            # plotly.js goes in once, inline, so that the file works without a network
            body.append(fig.to_html(full_html=False, include_plotlyjs=not js_included))
            js_included = True
    if stopped:
        body.append("<h2>Not replayed</h2><ul>" + "".join(
            f"<li><code>{esc(str(src))}</code>: <span class='fail'>{esc(why)}</span></li>" for src, why in stopped)
            + "</ul>")
    return ("<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>kdkit report</title>"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


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
    text = (render_markdown(reports, sources, stopped) if kind == "markdown"
            else render_html(reports, sources, figures=figures, cases=cases, stopped=stopped))
    target = free_path(path, force)
    publish(target, text, overwrite=force)
    return target


__all__ = ["describe_case", "request_rows", "lint_line", "machine", "write_report", "free_path",
           "report_figures", "rows_of", "outcome",
           "render_markdown", "render_html", "skipped", "failed"]
