"""Plotly figures over what kdkit.compare, kdkit.oracle and kdkit.replay already computed.

    error_heatmap(metrics, case_id, backend)   max |out - ref| per (query token, head)
    kv_profile(case, token, head)              the oracle's probabilities along KV, with the mask
    visibility_heatmap(case, b)                which KV columns each query row sees (prefix | draft)
    metrics_bar(report)                        max_abs / mean_abs / limit per backend

Each returns a plotly Figure whose title names the case and the backend; no numbers are computed
here that the other modules do not already provide.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import oracle as _oracle
from .compare import Metrics, Verdict

PREFIX_BINS = 128  # a prefix wider than this is drawn as bins (SGLang sees every prefix column)


def error_heatmap(m: Metrics | Verdict, case_id: str, backend: str, against: str = "oracle") -> go.Figure:
    """Heatmap, head (y) x query token (x), of max |out - ref| over the 512 output dims."""
    limit = None
    if isinstance(m, Verdict):
        limit, against, m = m.limit, m.against, m.metrics
    z = np.asarray(m.per_token_head, dtype=float).T            # [H, T]
    z = np.where(np.isfinite(z), z, np.nan)                    # plotly cannot draw inf
    t, h, d = m.worst
    title = (f"{case_id}: {backend} vs {against}, max |diff| per head x query token "
             f"(worst {m.max_abs:.2e} at token {t} head {h} dim {d}"
             + (f", limit {limit:.2e})" if limit is not None else ")"))
    fig = go.Figure(go.Heatmap(z=z, x=list(range(z.shape[1])), y=list(range(z.shape[0])),
                               colorscale="Viridis", colorbar={"title": "max |diff|"},
                               hovertemplate="token %{x} head %{y}: %{z:.3e}<extra></extra>",
                               name="max_abs"))
    if m.nonfinite:
        bad = ~np.isfinite(np.asarray(m.per_token_head, dtype=float))
        tt, hh = np.nonzero(bad)
        fig.add_trace(go.Scatter(x=tt, y=hh, mode="markers", name="non-finite",
                                 marker={"symbol": "x", "color": "red", "size": 9}))
    fig.update_layout(title=title, xaxis_title="query token", yaxis_title="head")
    return fig


def _request_of(case, token: int) -> tuple[int, int]:
    qo = case.qo_indptr.long().tolist()
    if not 0 <= token < qo[-1]:
        raise IndexError(f"token {token} outside the case's {qo[-1]} query tokens")
    b = int(np.searchsorted(qo, token, side="right")) - 1
    return b, token - qo[b]


def kv_profile(case, token: int, head: int, backend: str | None = None, probs=None) -> go.Figure:
    """The oracle's softmax row of (token, head) along the request's KV positions, with its mask.

    A backend's own probabilities are not observable (kernels return only out and LSE), so this
    shows where the mass should be: a backend error that peaks on this row usually means a column
    it saw or missed, which the mask trace locates. `probs` may pass oracle.run(..., with_probs=True)[2].
    """
    if not 0 <= head < case.num_heads:
        raise IndexError(f"head {head} outside 0..{case.num_heads - 1}")
    b, i = _request_of(case, token)
    if probs is None:  # this one row only: the oracle itself ran once, in replay
        rp = _oracle.row_probs(case, b, i, head)
        p_row, vis = rp.probs[0, 0], rp.visible[0]
    else:
        rp = probs[b]
        p_row, vis = rp.probs[i, head], rp.visible[i]
    x = np.arange(p_row.shape[0])
    fig = go.Figure()
    fig.add_trace(go.Bar(x=x, y=p_row, name="oracle probability",
                         hovertemplate="kv %{x}: p=%{y:.3e}<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=vis.astype(float), mode="lines", line={"shape": "hv"},
                             name="visible (mask)", yaxis="y2"))
    if rp.prefix_len > 0:
        fig.add_vline(x=rp.prefix_len - 0.5, line_dash="dash",
                      annotation_text=f"prefix {rp.prefix_len} | draft", annotation_position="top")
    who = f", worst row of {backend}" if backend else ""
    fig.update_layout(
        title=f"{case.case_id}: oracle probabilities, token {token} (request {b} row {i}) head {head}{who}",
        xaxis_title="KV position (prefix, then draft)", yaxis_title="probability",
        yaxis2={"overlaying": "y", "side": "right", "range": [-0.05, 1.05], "title": "visible"})
    return fig


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
                        subplot_titles=[f"prefix ({p} columns{', binned' if p > PREFIX_BINS else ''})",
                                        f"draft ({n} columns, tree mask)"])
    cs = [[0, "#f2f2f2"], [1, "#1f77b4"]]
    fig.add_trace(go.Heatmap(z=pre, x=px, y=list(range(n)), zmin=0, zmax=1, colorscale=cs,
                             showscale=False, name="prefix",
                             hovertemplate="row %{y} prefix %{x}: visible<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Heatmap(z=draft, x=list(range(n)), y=list(range(n)), zmin=0, zmax=1,
                             colorscale=cs, showscale=False, name="draft",
                             hovertemplate="row %{y} draft col %{x}: %{z}<extra></extra>"), row=1, col=2)
    fig.update_yaxes(autorange="reversed", title_text="query row (draft token)", row=1, col=1)
    fig.update_xaxes(title_text="KV position", row=1, col=1)
    fig.update_xaxes(title_text="draft column", row=1, col=2)
    fig.update_layout(title=f"{case.case_id}: visibility of request {b} (q_len {n}, prefix {p})")
    return fig


def metrics_bar(report) -> go.Figure:
    """Per backend: max_abs and mean_abs bars and the limit it was held to (log scale)."""
    rows = [r for r in report.rows if r.verdict is not None]
    names = [r.backend for r in rows]
    tiny = 1e-12  # a log axis cannot draw 0 (the reference against itself)

    def vals(f):
        return [max(f(r.verdict), tiny) if np.isfinite(f(r.verdict)) else None for r in rows]

    fig = go.Figure()
    fig.add_trace(go.Bar(x=names, y=vals(lambda v: v.metrics.max_abs), name="max_abs",
                         marker_color=["#2ca02c" if r.status == "pass" else "#d62728" for r in rows]))
    fig.add_trace(go.Bar(x=names, y=vals(lambda v: v.metrics.mean_abs), name="mean_abs",
                         marker_color="#7f7f7f"))
    fig.add_trace(go.Scatter(x=names, y=vals(lambda v: v.limit), mode="markers", name="limit",
                             marker={"symbol": "line-ew-open", "size": 30, "line": {"width": 3}}))
    skipped = [f"{r.backend} ({r.status})" for r in report.rows if r.verdict is None]
    fig.update_layout(barmode="group", yaxis_type="log", yaxis_title=f"|diff| vs {report.against}",
                      title=f"{report.case_id}: backends vs {report.against}"
                            + (f"; not judged: {', '.join(skipped)}" if skipped else ""))
    return fig
