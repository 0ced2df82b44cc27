"""Plotly figures over what kdkit.compare, kdkit.oracle, kdkit.replay and kdkit.perf.results
already computed. Every figure is a function of a case, a replay report or a bench results dict.

    metrics_bar(report)                          max_abs / mean_abs / limit per backend
    error_heatmap(metrics, case_id, backend)     max |out - ref| per (head, query token)
    kv_error(case, report, backend)              a backend's error attributed to the KV positions
    kv_profile(case, token, head)                the oracle's probabilities along KV, with the mask
    tree_mask(case, b)                           request b's draft tree drawn next to its mask
    visibility_heatmap(case, b)                  which KV columns each query row sees (prefix | draft)
    layout_check(case, findings)                 the index arrays against the layout (a broken case)
    nsplit_heatmap / nsplit_lines / backends_vs_prefix / graph_replay   (bench results)

Titles are two short lines (what, then the numbers) anchored left, so a notebook's narrow output
area does not clip them; token axes of a ragged batch carry the request boundaries.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .judge import oracle as _oracle
from . import trees as _trees
from .judge.compare import Metrics, Verdict
from .layout import request_kv, request_rows

PREFIX_BINS = 128    # a prefix wider than this is drawn as bins (SGLang sees every prefix column)
TITLE_SIZE = 15      # px; the detail line is drawn smaller (<sup>)
VIS_COLORS = [[0, "#e8e8e8"], [1, "#1f77b4"]]   # masked, visible
PASS_COLOR, FAIL_COLOR = "#2ca02c", "#d62728"
MASKED_COLOR = "#bbbbbb"


# ---- shared pieces ----------------------------------------------------------------------------
def title(head: str, detail: str | None = None) -> dict:
    """A two-line title anchored left: plotly centres titles and clips whatever passes the right
    edge, which in JupyterLab's output area (narrower than plotly's 700 px default) lost the numbers."""
    text = head + (f"<br><sup>{detail}</sup>" if detail else "")
    return {"text": text, "x": 0.0, "xref": "paper", "xanchor": "left", "font": {"size": TITLE_SIZE}}


def finish(fig: go.Figure, head: str, detail: str | None = None, **layout) -> go.Figure:
    fig.update_layout(title=title(head, detail), margin={"t": 80 if detail else 56, "r": 24, "l": 64},
                      **layout)
    return fig


def _bounds(qo_indptr) -> list[int]:
    return [int(x) for x in (qo_indptr.tolist() if hasattr(qo_indptr, "tolist") else qo_indptr)]


MAX_REQUEST_LABELS = 64  # request numbers drawn on an axis at most (every k-th past that): legible


def mark_requests(fig: go.Figure, qo_indptr, axis: str = "x") -> go.Figure:
    """Request boundaries on a query-token axis: a line between requests and each request's number.

    Drawn only for a batch of more than one request (a single request has no boundary)."""
    qo = _bounds(qo_indptr)
    if len(qo) <= 2:
        return fig
    line = {"color": "white", "width": 2, "dash": "dot"}
    # one update of the layout for all requests: plotly's per-call add_vline / add_annotation
    # re-validate the whole figure each time (512 requests took 2 minutes)
    xref, yref = "x", "y"
    shapes, notes = list(fig.layout.shapes), list(fig.layout.annotations)
    label_every = -(-(len(qo) - 1) // MAX_REQUEST_LABELS)  # ceil: at most MAX_REQUEST_LABELS numbers
    for b in range(len(qo) - 1):
        if b:
            if axis == "x":
                shapes.append(dict(type="line", x0=qo[b] - 0.5, x1=qo[b] - 0.5, xref=xref, y0=0, y1=1,
                                   yref=f"{yref} domain", line=line))
            else:
                shapes.append(dict(type="line", y0=qo[b] - 0.5, y1=qo[b] - 0.5, yref=yref, x0=0, x1=1,
                                   xref=f"{xref} domain", line=line))
        if qo[b + 1] > qo[b] and b % label_every == 0:
            mid = (qo[b] + qo[b + 1] - 1) / 2
            where = ({"x": mid, "xref": xref, "y": 1.0, "yref": f"{yref} domain", "yanchor": "bottom"}
                     if axis == "x" else {"y": mid, "yref": yref, "x": 1.0, "xref": f"{xref} domain", "xanchor": "left"})
            notes.append(dict(text=f"r{b}", showarrow=False, font={"size": 10}, **where))
    fig.update_layout(shapes=shapes, annotations=notes)
    return fig


def _request_of(case, token: int) -> tuple[int, int]:
    qo = case.qo_indptr.long().tolist()
    if not 0 <= token < qo[-1]:
        raise IndexError(f"token {token} outside the case's {qo[-1]} query tokens")
    b = int(np.searchsorted(qo, token, side="right")) - 1
    return b, token - qo[b]


def _row(case, b: int, i: int, head: int, probs=None):
    """(probabilities [kv], visible [kv], prefix_len) of row i of request b, one head: from
    `probs` (oracle.run(..., with_probs=True)[2]) when given, else computed for that row alone."""
    if probs is not None:
        rp = probs[b]
        return rp.probs[i, head], rp.visible[i], rp.prefix_len
    rp = _oracle.row_probs(case, b, i, head)
    return rp.probs[0, 0], rp.visible[0], rp.prefix_len


def _check_head(case, head: int) -> None:
    if not 0 <= head < case.num_heads:
        raise IndexError(f"head {head} outside 0..{case.num_heads - 1}")


def _kv_strip(fig: go.Figure, visible: np.ndarray, prefix_len: int) -> None:
    """Row 2 of a KV figure: the row's visibility as one categorical cell per KV column, centred on
    the same integer positions as the bars above (a 0/1 line on a continuous axis sat half a
    column off and grew ticks like 1.03)."""
    x = np.arange(visible.shape[0])
    fig.add_trace(go.Heatmap(z=[visible.astype(float)], x=x, y=["mask"], zmin=0, zmax=1,
                             colorscale=VIS_COLORS, showscale=False, name="visible (mask)", xgap=1,
                             customdata=[np.where(visible, "visible", "masked")],
                             hovertemplate="kv %{x}: %{customdata}<extra></extra>"), row=2, col=1)
    for r in (1, 2):
        if 0 < prefix_len < visible.shape[0]:
            fig.add_vline(x=prefix_len - 0.5, line={"dash": "dash", "color": "#444"}, row=r, col=1)
    fig.add_annotation(x=(prefix_len - 1) / 2 if prefix_len else -0.5, y=1.0, yref="y domain",
                       text=f"prefix ({prefix_len})", showarrow=False, yanchor="bottom", row=1, col=1)
    fig.add_annotation(x=prefix_len + (visible.shape[0] - prefix_len - 1) / 2, y=1.0, yref="y domain",
                       text=f"draft ({visible.shape[0] - prefix_len})", showarrow=False, yanchor="bottom",
                       row=1, col=1)
    fig.update_xaxes(title_text="KV position (prefix, then draft)", row=2, col=1)
    fig.update_xaxes(range=[-0.5, visible.shape[0] - 0.5])


def _kv_figure() -> go.Figure:
    return make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.86, 0.14],
                         vertical_spacing=0.04)


# ---- replay figures ---------------------------------------------------------------------------
def error_heatmap(m: Metrics | Verdict, case_id: str, backend: str, against: str = "oracle",
                  qo_indptr=None) -> go.Figure:
    """Heatmap, head (y) x query token (x), of max |out - ref| over the 512 output dims.
    qo_indptr (the case's) marks the request boundaries of a ragged batch."""
    limit = None
    if isinstance(m, Verdict):
        limit, against, m = m.limit, m.against, m.metrics
    z = np.asarray(m.per_token_head, dtype=float).T            # [H, T]
    z = np.where(np.isfinite(z), z, np.nan)                    # plotly cannot draw inf
    t, h, d = m.worst
    fig = go.Figure(go.Heatmap(z=z, x=list(range(z.shape[1])), y=list(range(z.shape[0])),
                               colorscale="Viridis", colorbar={"title": "max |diff|"},
                               hovertemplate="token %{x} head %{y}: %{z:.3e}<extra></extra>",
                               name="max_abs"))
    if m.nonfinite:
        bad = ~np.isfinite(np.asarray(m.per_token_head, dtype=float))
        tt, hh = np.nonzero(bad)
        fig.add_trace(go.Scatter(x=tt, y=hh, mode="markers", name="non-finite",
                                 marker={"symbol": "x", "color": "red", "size": 9}))
    if qo_indptr is not None:
        mark_requests(fig, qo_indptr, "x")
    where = f" at token {t} head {h} dim {d}" if z.size else " (the case has no query rows)"
    detail = (f"max |diff| per head x query token; worst {m.max_abs:.2e}{where}"
              + (f", limit {limit:.2e}" if limit is not None else ""))
    return finish(fig, f"{case_id}: {backend} vs {against}", detail,
                   xaxis_title="query token", yaxis_title="head")


def kv_profile(case, token: int, head: int, backend: str | None = None, probs=None) -> go.Figure:
    """The oracle's softmax row of (token, head) along the request's KV positions, with its mask.

    A backend's own probabilities are not observable (kernels return only out and LSE), so this
    shows where the mass should be; kv_error shows where a backend's error came from.
    `probs` may pass oracle.run(..., with_probs=True)[2].
    """
    _check_head(case, head)
    b, i = _request_of(case, token)
    p_row, vis, prefix_len = _row(case, b, i, head, probs)
    fig = _kv_figure()
    fig.add_trace(go.Bar(x=np.arange(p_row.shape[0]), y=p_row, name="oracle probability",
                         marker_color="#1f77b4", hovertemplate="kv %{x}: p=%{y:.3e}<extra></extra>"),
                  row=1, col=1)
    _kv_strip(fig, vis, prefix_len)
    fig.update_yaxes(title_text="probability", row=1, col=1)
    who = f", worst row of {backend}" if backend else ""
    return finish(fig, f"{case.case_id}: oracle probabilities",
                   f"token {token} head {head} (request {b} row {i}{who}); "
                   f"{int(vis.sum())} of {vis.shape[0]} KV columns visible",
                   showlegend=False)


def implied_dp(case, out, ref, token: int, head: int, visible=None) -> tuple[np.ndarray, int, float]:
    """(dp [kv_len], request, residual): the change of attention weights along request b's KV
    positions that explains out - ref on (token, head) best, min ||dp @ V - (out - ref)|| (least
    squares; the minimum-norm one when there are more columns than v_head_dim = 512). A column a
    backend missed shows as -p there. residual = the part of the error no weighting of those
    columns explains (wrong V, a column seen that should not be, the output's own rounding)
    relative to |out - ref|.

    visible ([kv_len] bool, the row's mask): solve over the visible columns only, dp is NaN on the
    masked ones. Over every column, a passing backend's rounding noise was spread onto masked
    columns too and read like a mask leak; a real leak shows here as a large residual."""
    b, _ = _request_of(case, token)
    _, V, _ = request_kv(case, b)
    V = V.detach().cpu().double().numpy()                               # [kv, 512]
    cols = np.ones(V.shape[0], bool) if visible is None else np.asarray(visible, bool)
    if cols.shape != (V.shape[0],):
        raise ValueError(f"visible has shape {cols.shape}; request {b} has {V.shape[0]} KV columns")
    dp = np.full(V.shape[0], np.nan)
    d = (np.asarray(_f64(out)[token, head]) - np.asarray(_f64(ref)[token, head]))
    if not np.isfinite(d).all():
        return dp, b, float("nan")
    nd = float(np.linalg.norm(d))
    if not cols.any():
        return dp, b, 1.0 if nd > 0 else 0.0
    dp[cols], *_ = np.linalg.lstsq(V[cols].T, d, rcond=None)
    resid = float(np.linalg.norm(V[cols].T @ dp[cols] - d)) / nd if nd > 0 else 0.0
    return dp, b, resid


def _f64(x) -> np.ndarray:
    return x.detach().cpu().double().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=np.float64)


def kv_error(case, report, backend: str, token: int | None = None, head: int | None = None,
             probs=None) -> go.Figure:
    """A backend's error on one (token, head) row (default: its worst), attributed to the KV
    positions by implied_dp (the oracle's p of each column in the hover), over the row's mask.
    report.outputs must hold the backend's output and the reference's (kdkit.replay keeps them)."""
    row = report.row(backend)
    outs = getattr(report, "outputs", None) or {}
    if backend not in outs or report.against not in outs:
        raise ValueError(f"the report holds no output of {backend!r} or of {report.against!r}: "
                         "replay it with this kdkit (ReplayReport.outputs)")
    if token is None or head is None:
        if row.verdict is None:
            raise ValueError(f"{backend} was not judged ({row.status}): give token and head")
        token, head, _ = (int(x) for x in row.verdict.metrics.worst)
    _check_head(case, head)
    b, i = _request_of(case, token)
    p, vis, prefix_len = _row(case, b, i, head, probs)
    dp, b, resid = implied_dp(case, outs[backend], outs[report.against], token, head, visible=vis)
    fig = _kv_figure()
    # red: weight the backend put where the reference has less; blue: weight it missed (a column
    # dropped entirely shows as -p there, p being the reference's probability, in the hover);
    # masked columns carry no bar (NaN): the strip below marks them
    fig.add_trace(go.Bar(x=np.arange(dp.shape[0]), y=dp, customdata=p, name="implied weight change",
                         marker_color=np.where(~vis, MASKED_COLOR, np.where(dp >= 0, "#d62728", "#1f77b4")),
                         hovertemplate="kv %{x}: dp=%{y:.3e} (oracle p=%{customdata:.3e})<extra></extra>"),
                  row=1, col=1)
    _kv_strip(fig, vis, prefix_len)
    fig.update_yaxes(title_text=f"weight change, {backend} - {report.against}", row=1, col=1)
    nvis = int(vis.sum())
    j = int(np.nanargmax(np.abs(dp))) if np.isfinite(dp).any() else 0
    largest = f"largest {dp[j]:+.1e} at kv {j}"
    if report.row(backend).status == "pass":   # judged within its limit: nothing here is a bug
        how = f"passes, within tolerance (rounding noise); {largest}"
    else:
        how = (f"least squares, {nvis} visible" if nvis <= case.v_head_dim
               else f"min-norm, {nvis} visible")  # more columns than V has dims
        how += f"; {largest} (oracle p {p[j]:.0e}); unexplained {resid:.0%}"
    return finish(fig, f"{case.case_id}: {backend} error along KV",
                   f"token {token} head {head} (request {b} row {i}); {how}", showlegend=False)


def tree_mask(case, b: int = 0) -> go.Figure:
    """Request b's draft tree (left: node i on row i, at its depth, joined to its parent) next to
    its q_len x q_len tree mask (right: row i sees column j), rows aligned."""
    if not 0 <= b < case.batch_size:
        raise IndexError(f"request {b} outside 0..{case.batch_size - 1}")
    blk = _oracle.draft_visibility(case, b)
    n = blk.shape[0]
    parents = _trees.parents_from_block(blk)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        column_widths=[0.4, 0.6], subplot_titles=["draft tree", "tree mask (draft columns)"])
    if parents is not None:
        depth = blk.sum(axis=1) - 1
        ex, ey = [], []
        for i, par in enumerate(parents):
            if par >= 0:
                ex += [depth[par], depth[i], None]
                ey += [par, i, None]
        fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line={"color": "#999", "width": 1},
                                 hoverinfo="skip", name="edge"), row=1, col=1)
        fig.add_trace(go.Scatter(x=depth, y=list(range(n)), mode="markers+text" if n <= 40 else "markers",
                                 text=[str(i) for i in range(n)], textposition="middle right",
                                 marker={"size": 8 if n <= 64 else 5, "color": "#1f77b4"},
                                 customdata=[[p] for p in parents], name="node",
                                 hovertemplate="node %{y} depth %{x} parent %{customdata[0]}<extra></extra>"),
                      row=1, col=1)
        fig.update_xaxes(title_text="depth", dtick=1, row=1, col=1)
        what = f"{n} nodes, depth {int(depth.max()) if n else 0}"
    else:
        fig.add_annotation(text="the mask is not a tree<br>(a row does not see exactly<br>its ancestors)",
                           x=0.5, y=0.5, xref="x domain", yref="y domain", showarrow=False, row=1, col=1)
        what = "not a tree"
    fig.add_trace(go.Heatmap(z=blk.astype(float), x=list(range(n)), y=list(range(n)), zmin=0, zmax=1,
                             colorscale=VIS_COLORS, showscale=False, xgap=1 if n <= 64 else 0,
                             ygap=1 if n <= 64 else 0, name="mask",
                             hovertemplate="row %{y} sees col %{x}: %{z}<extra></extra>"), row=1, col=2)
    fig.update_yaxes(autorange="reversed", title_text="draft row = tree node", row=1, col=1)
    fig.update_xaxes(title_text="draft column", row=1, col=2)
    return finish(fig, f"{case.case_id}: request {b}, tree and mask",
                   f"q_len {n}, prefix {int(case.prefix_lens[b])}; {what}", showlegend=False)


def visibility_heatmap(case, b: int = 0) -> go.Figure:
    """Query token x KV position for request b: prefix columns (left) and draft columns (right)."""
    if not 0 <= b < case.batch_size:
        raise IndexError(f"request {b} outside 0..{case.batch_size - 1}")
    draft = _oracle.draft_visibility(case, b).astype(float)          # [n, n]
    n, p = draft.shape[0], int(case.prefix_lens[b])
    # SGLang's kernel sees every prefix column; bin a long prefix so the figure stays small
    edges = np.linspace(0, p, min(p, PREFIX_BINS) + 1).astype(int) if p else np.zeros(1, int)
    pre = np.ones((n, len(edges) - 1))
    px = [f"{a}..{e - 1}" if e - a > 1 else str(a) for a, e in zip(edges[:-1], edges[1:])]
    widths = [max(1, len(px)), max(1, n)]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.03,
                        column_widths=[w / sum(widths) for w in widths],
                        subplot_titles=[f"prefix ({p}{', binned' if p > PREFIX_BINS else ''})",
                                        f"draft ({n}, tree mask)"])
    fig.add_trace(go.Heatmap(z=pre, x=px, y=list(range(n)), zmin=0, zmax=1, colorscale=VIS_COLORS,
                             showscale=False, name="prefix",
                             hovertemplate="row %{y} prefix %{x}: visible<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Heatmap(z=draft, x=list(range(n)), y=list(range(n)), zmin=0, zmax=1,
                             colorscale=VIS_COLORS, showscale=False, name="draft",
                             hovertemplate="row %{y} draft col %{x}: %{z}<extra></extra>"), row=1, col=2)
    fig.update_yaxes(autorange="reversed", title_text="query row (draft token)", row=1, col=1)
    fig.update_xaxes(title_text="KV position", row=1, col=1)
    fig.update_xaxes(title_text="draft column", row=1, col=2)
    return finish(fig, f"{case.case_id}: visibility of request {b}", f"q_len {n}, prefix {p}")


def layout_check(case, findings=()) -> go.Figure:
    """Per request, what the case's index arrays say against what its layout implies: the KV
    length (kv_indptr) and the mask block (mask_indptr: its start and its length), a value that
    differs in red, the lint's errors named: the picture of a mis-marshaled case, whose inputs the
    oracle cannot read (so there is no error to draw)."""
    rows = request_rows(case)
    bs = [f"r{r['b']}" for r in rows]
    implied_start = np.concatenate([[0], np.cumsum([r["mask_expected"] or 0 for r in rows])[:-1]]).tolist()
    panels = [("KV length (kv_indptr)", "kv_len", "kv_expected", None),
              ("mask block start (mask_indptr)", "mask_start", None, implied_start),
              ("mask block length (mask_indptr)", "mask_len", "mask_expected", None)]
    if case.custom_mask is None:
        panels = panels[:1]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels], horizontal_spacing=0.08)
    for col, (_, got_key, want_key, want_list) in enumerate(panels, start=1):
        got = [r[got_key] for r in rows]
        want = want_list if want_list is not None else [r[want_key] for r in rows]
        bad = [g is None or (w is not None and g != w) for g, w in zip(got, want)]
        fig.add_trace(go.Bar(x=bs, y=[w for w in want], name="the layout implies", marker_color="#c7c7c7",
                             showlegend=col == 1, hovertemplate="%{x}: implied %{y}<extra></extra>"), row=1, col=col)
        fig.add_trace(go.Bar(x=bs, y=[g if g is not None else 0 for g in got], name="the case says",
                             marker_color=[FAIL_COLOR if b else PASS_COLOR for b in bad], showlegend=col == 1,
                             text=["missing" if g is None else ("differs" if b else "") for g, b in zip(got, bad)],
                             textposition="outside", hovertemplate="%{x}: the case says %{y}<extra></extra>"),
                      row=1, col=col)
    errs = sorted({f"{f.code} [{f.field}]" for f in findings if f.severity == "error"})
    fig.update_layout(barmode="group", legend={"orientation": "h", "y": -0.15})
    return finish(fig, f"{case.case_id}: the index arrays against the {case.layout} layout",
                   ("lint: " + ", ".join(errs)) if errs else "red: a value the layout does not imply")


def metrics_bar(report) -> go.Figure:
    """Per backend: max_abs and mean_abs bars and the limit it was held to (log scale). An error
    of exactly 0 (the reference against itself) has no place on a log axis: it is written "exact"."""
    rows = [r for r in report.rows if r.verdict is not None]
    names = [r.backend for r in rows]

    def vals(f):
        return [f(r.verdict) if np.isfinite(f(r.verdict)) and f(r.verdict) > 0 else None for r in rows]

    fig = go.Figure()
    fig.add_trace(go.Bar(x=names, y=vals(lambda v: v.metrics.max_abs), name="max_abs",
                         marker_color=[PASS_COLOR if r.status == "pass" else FAIL_COLOR for r in rows]))
    fig.add_trace(go.Bar(x=names, y=vals(lambda v: v.metrics.mean_abs), name="mean_abs",
                         marker_color="#7f7f7f"))
    fig.add_trace(go.Scatter(x=names, y=vals(lambda v: v.limit), mode="markers", name="limit",
                             marker={"symbol": "line-ew-open", "size": 30, "line": {"width": 3}}))
    for r in rows:
        m = r.verdict.metrics
        if m.max_abs == 0:
            fig.add_annotation(x=r.backend, y=0, yref="y domain", yanchor="bottom", showarrow=False,
                               text="exact<br>(0 error)", font={"color": PASS_COLOR})
        elif not np.isfinite(m.max_abs):
            fig.add_annotation(x=r.backend, y=0, yref="y domain", yanchor="bottom", showarrow=False,
                               text=f"{m.nonfinite} non-finite", font={"color": FAIL_COLOR})
    skipped = [f"{r.backend} ({r.status})" for r in report.rows if r.verdict is None]
    return finish(fig, f"{report.case_id}: backends vs {report.against}",
                   f"not judged: {', '.join(skipped)}" if skipped else "every backend judged",
                   barmode="group", yaxis_type="log", yaxis_title=f"|diff| vs {report.against}")


# ---- bench figures (kdkit.perf.results dicts) ------------------------------------------------
METRIC_NAMES = {"gbps": "GB/s", "roofline_frac": "fraction of roofline", "us": "time (us)"}


def _label(results: dict) -> str:
    return f"{results.get('gpu', '?')} ({results.get('date', '?')})"


AUTO_ROW = "auto"    # the heatmap row of the NSPLIT the kernel picks by itself
CELL_INSET = 0.42    # half the side of a cell's outline, in cells: inside the cell, clear of its neighbours' numbers


def nsplit_heatmap(results: dict, metric: str = "gbps", bs: int = 1, q_len: int | None = None,
                   heads: int | None = None, graph: bool = False) -> go.Figure:
    """The CUDA kernel's NSPLIT (y) x prefix length (x) grid of `metric` ("gbps", "roofline_frac"
    or "us"), one shape (bs, q_len, heads): a row per swept NSPLIT (ascending) and, on top, apart
    from them, one 'auto' row: the kernel's own choice at each prefix, its cells saying which NSPLIT
    it picked ("n=11": a count the sweep may not have). Where the pick is a swept NSPLIT, that
    cell carries a red outline drawn inside it."""
    from .perf import results as br
    bs, q_len, heads = br.pick_shape(results, bs, q_len, heads).values()
    sel = dict(backend="cuda", bs=bs, q_len=q_len, heads=heads, graph=graph)
    swept, auto = br.select(results, nsplit_auto=False, **sel), br.select(results, nsplit_auto=True, **sel)
    if not swept and not auto:
        raise ValueError(f"no cuda rows for bs={bs} q_len={q_len} heads={heads} graph={graph} "
                         f"in {_label(results)}; shapes there: {br.shapes(results)}")
    prefixes = sorted({r["prefix"] for r in swept + auto})
    nsplits = sorted({r["nsplit"] for r in swept})
    # the automatic picks (11, 65, 66 ...) get a row of their own: interleaved with the swept powers
    # of two they made the NSPLIT axis read as a sweep it was not
    ys = [str(s) for s in nsplits] + ([AUTO_ROW] if auto else [])
    z = np.full((len(ys), len(prefixes)), np.nan)
    text = np.full(z.shape, "", dtype=object)        # what follows the number: the auto row's pick
    picked = np.full(z.shape, "", dtype=object)       # the hover's NSPLIT
    for r in swept:
        j, i = nsplits.index(r["nsplit"]), prefixes.index(r["prefix"])
        z[j, i], picked[j, i] = r[metric], str(r["nsplit"])
    outlines, top = [], len(ys) - 1
    for r in auto:
        i = prefixes.index(r["prefix"])
        z[top, i], text[top, i], picked[top, i] = r[metric], f"<br>n={r['nsplit']}", f"{r['nsplit']} (auto)"
        j = nsplits.index(r["nsplit"]) if r["nsplit"] in nsplits else None
        if j is not None and np.isfinite(z[j, i]):  # the pick measured in the sweep too: outlined inside its cell
            outlines.append(dict(type="rect", xref="x", yref="y", x0=i - CELL_INSET, x1=i + CELL_INSET,
                                 y0=j - CELL_INSET, y1=j + CELL_INSET, line={"color": "red", "width": 2}))
    xs = [str(p) for p in prefixes]
    # .1%: most of a small-batch sweep sits below 0.5% of the roofline, which .0% wrote as "0%"
    fmt = {"gbps": ".0f", "roofline_frac": ".1%", "us": ".1f"}.get(metric, ".3g")
    what = METRIC_NAMES.get(metric, metric)
    fig = go.Figure(go.Heatmap(z=z, x=xs, y=ys, text=text, customdata=picked, colorscale="Viridis",
                               colorbar={"title": what}, texttemplate="%{z:" + fmt + "}%{text}", xgap=1, ygap=1,
                               hovertemplate="prefix %{x}, NSPLIT %{customdata}: %{z:" + fmt + "}<extra></extra>"))
    if auto and nsplits:  # a white rule between the sweep and the auto row
        outlines.append(dict(type="line", xref="x domain", yref="y", x0=0, x1=1, y0=len(nsplits) - 0.5,
                             y1=len(nsplits) - 0.5, line={"color": "white", "width": 4}))
    fig.update_layout(shapes=outlines)
    shape = br.shape_text((swept + auto)[0])
    return finish(fig, f"CUDA kernel {what}: NSPLIT x prefix",
                   f"{shape}{', graph replay' if graph else ''}; {_label(results)}; "
                   "auto row: the kernel's pick; red outline: it in the sweep",
                   xaxis={"title": "prefix length", "type": "category"},
                   yaxis={"title": "NSPLIT", "type": "category", "categoryorder": "array", "categoryarray": ys})


def nsplit_lines(results: dict, bs: int = 1, q_len: int | None = None, heads: int | None = None,
                 graph: bool = False) -> go.Figure:
    """GB/s against the prefix length, one line per NSPLIT, the automatic choice as its own line."""
    from .perf import results as br
    bs, q_len, heads = br.pick_shape(results, bs, q_len, heads).values()
    rows = br.select(results, backend="cuda", bs=bs, q_len=q_len, heads=heads, graph=graph)
    if not rows:
        raise ValueError(f"no cuda rows for bs={bs} q_len={q_len} heads={heads} in {_label(results)}")
    fig = go.Figure()
    for ns in sorted({r["nsplit"] for r in rows if not r["nsplit_auto"]}):
        sel = sorted((r for r in rows if r["nsplit"] == ns and not r["nsplit_auto"]), key=lambda r: r["prefix"])
        fig.add_trace(go.Scatter(x=[r["prefix"] for r in sel], y=[r["gbps"] for r in sel],
                                 mode="lines+markers", name=f"nsplit {ns}"))
    auto = sorted((r for r in rows if r["nsplit_auto"]), key=lambda r: r["prefix"])
    if auto:
        fig.add_trace(go.Scatter(x=[r["prefix"] for r in auto], y=[r["gbps"] for r in auto],
                                 mode="lines+markers+text", name="auto", text=[str(r["nsplit"]) for r in auto],
                                 textposition="top center", line={"color": "black", "width": 3, "dash": "dash"}))
    if results.get("copy_gbps"):  # the GPU's copy bandwidth, often 10x the kernel's at small shapes
        fig.add_hline(y=results["copy_gbps"], line_dash="dot",
                      annotation_text=f"device copy {results['copy_gbps']:.0f} GB/s (the memory roof)",
                      annotation_position="bottom left")
    # log y: on a linear axis the copy line squeezed the per-NSPLIT lines into the bottom quarter.
    # The range holds the copy line and its label (autorange covers the traces only: the line sat
    # above the plot, its label unseen)
    ys = [r["gbps"] for r in rows if r["gbps"] and r["gbps"] > 0] + [results.get("copy_gbps") or 0]
    ys = [y for y in ys if y > 0]
    yaxis = {"title": "GB/s", "type": "log"}
    if ys:
        yaxis["range"] = [float(np.log10(min(ys) / 1.5)), float(np.log10(max(ys) * 2.0))]
    return finish(fig, "CUDA kernel GB/s per NSPLIT",
                   f"{br.shape_text(rows[0])}; {_label(results)}; labels on 'auto': the NSPLIT it chose",
                   xaxis={"title": "prefix length", "type": "log"}, yaxis=yaxis)


def backends_vs_prefix(results: dict, bs: int = 1, q_len: int | None = None, heads: int | None = None,
                       metric: str = "us") -> go.Figure:
    """Every backend on the same shapes: time (or GB/s) against the prefix length; for the CUDA
    kernel its automatic NSPLIT, eager launches."""
    from .backends import label
    from .perf import results as br
    bs, q_len, heads = br.pick_shape(results, bs, q_len, heads).values()
    fig = go.Figure()
    shape = None
    for be in dict.fromkeys(r["backend"] for r in results["rows"]):
        rows = br.select(results, backend=be, bs=bs, q_len=q_len, heads=heads, graph=False)
        rows = [r for r in rows if r["nsplit_auto"] or r.get("nsplit") is None]  # its automatic choice
        rows = sorted(rows, key=lambda r: r["prefix"])
        if rows:
            shape = shape or br.shape_text(rows[0])
            fig.add_trace(go.Scatter(x=[r["prefix"] for r in rows], y=[r[metric] for r in rows],
                                     mode="lines+markers", name=label(be)))
    floor = sorted(br.select(results, backend="cuda", bs=bs, q_len=q_len, heads=heads, graph=False,
                             nsplit_auto=True), key=lambda r: r["prefix"])
    if metric == "us" and floor:
        fig.add_trace(go.Scatter(x=[r["prefix"] for r in floor], y=[r["floor_us"] for r in floor],
                                 mode="lines", name="roofline floor", line={"dash": "dot", "color": "#999"}))
    if not fig.data:
        raise ValueError(f"no rows for bs={bs} q_len={q_len} heads={heads} in {_label(results)}")
    return finish(fig, "every backend on the same shapes", f"{shape}; {_label(results)}",
                   xaxis={"title": "prefix length", "type": "log"},
                   yaxis={"title": "median time (us)" if metric == "us" else metric,
                          "type": "log" if metric == "us" else "linear"})


def graph_replay(results: dict, bs: int = 1, q_len: int | None = None, heads: int | None = None) -> go.Figure:
    """The CUDA kernel at its automatic NSPLIT: eager launches against CUDA graph replay."""
    from .perf import results as br
    bs, q_len, heads = br.pick_shape(results, bs, q_len, heads).values()
    fig = go.Figure()
    shape = None
    for graph in (False, True):
        rows = sorted(br.select(results, backend="cuda", bs=bs, q_len=q_len, heads=heads, graph=graph,
                                nsplit_auto=True), key=lambda r: r["prefix"])
        if rows:
            shape = shape or br.shape_text(rows[0])
            fig.add_trace(go.Bar(x=[str(r["prefix"]) for r in rows], y=[r["us"] for r in rows],
                                 name="graph replay" if graph else "eager launch"))
    if not fig.data:
        raise ValueError(f"no automatic-NSPLIT cuda rows for bs={bs} q_len={q_len} heads={heads} in {_label(results)}")
    return finish(fig, "CUDA kernel: eager launch vs graph replay", f"{shape}; {_label(results)}", barmode="group",
                   xaxis={"title": "prefix length", "type": "category"}, yaxis_title="median time (us)")


# ---- the figure set of one replay (notebooks and reports draw the same) ------------------------
def worst_row(report) -> tuple[str | None, int, int]:
    """(backend, token, head) of the largest error among the judged backends but the reference;
    (None, 0, 0) when none was judged."""
    judged = [r for r in report.rows if r.verdict is not None and r.backend != report.against]
    if not judged:
        return None, 0, 0
    w = max(judged, key=lambda r: r.verdict.metrics.max_abs)
    t, h, _ = (int(x) for x in w.verdict.metrics.worst)
    return w.backend, t, h


def replay_figures(case, report, token: int | None = None, head: int | None = None, probs=None) -> dict:
    """name -> figure for one replayed case: the metrics; per judged backend its error heatmap;
    the worst backend's error along KV; the request's tree and mask, its visibility; the oracle's
    probabilities. token/head pick the row (None or -1: the worst row). Needs a case the oracle
    can read (a mis-marshaled one gets the metrics alone)."""
    for name, v in (("token", token), ("head", head)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            raise ValueError(f"{name} = {v!r}: a whole number (0-based), or None / -1 for the worst row")
    # a case no backend was judged on (the oracle could not read it) has no error to draw: its
    # index arrays against the layout instead of an empty chart
    judged = any(r.verdict is not None for r in report.rows)
    figs = {"metrics": metrics_bar(report)} if judged else {"layout": layout_check(case, report.lint or [])}
    for r in report.rows:
        if r.verdict is not None and r.backend != report.against:
            figs[f"error {r.backend}"] = error_heatmap(r.verdict, report.case_id, r.backend,
                                                       qo_indptr=case.qo_indptr)
    if "oracle" not in (getattr(report, "outputs", None) or {}):
        return figs  # the oracle could not run this case: its inputs are broken (see the lint)
    if case.num_tokens == 0:
        return figs  # no query rows: no row to look into
    backend, wt, wh = worst_row(report)
    token = wt if token is None or token < 0 else token
    head = wh if head is None or head < 0 else head
    b = _request_of(case, token)[0]
    if backend is not None:
        figs[f"kv error {backend}"] = kv_error(case, report, backend, token, head, probs=probs)
    figs["tree"] = tree_mask(case, b)
    figs["visibility"] = visibility_heatmap(case, b)
    figs["probabilities"] = kv_profile(case, token, head, probs=probs)
    return figs
