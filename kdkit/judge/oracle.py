"""NumPy float64 reference: output, LSE and per-row probabilities, from the bf16 inputs.

Semantics are SGLang's: every prefix column is visible; draft column j of request b is visible to
row i iff custom_mask says so (prefix columns of the mask are skipped, as the kernel does with
skip_prefix_custom_mask=True); without a mask, causal=True means j <= i and causal=False means all.
Scores are (q . k) * sm_scale, soft-capped by logit_cap * tanh(s / logit_cap) when logit_cap > 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..case import Case
from .. import layout
from ..layout import request_kv


def _f64(t) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def draft_visibility(case: Case, b: int) -> np.ndarray:
    """[q_len, q_len] bool: which draft columns each draft row of request b sees."""
    return layout.draft_visibility(case, b).cpu().numpy()


@dataclass
class RequestProbs:
    """Softmax probabilities of one request: [q_len, H, prefix + q_len], and the logits."""
    probs: np.ndarray
    logits: np.ndarray
    visible: np.ndarray  # [q_len, prefix + q_len]
    prefix_len: int


def _request(case: Case, b: int, rows: slice = slice(None), heads: slice = slice(None)):
    """Masked, scaled, capped logits of request b ([n, H, kv]); `rows`/`heads` select a part."""
    qs, qe = (int(x) for x in case.qo_indptr[b: b + 2])
    K, V, p = request_kv(case, b)  # raises if kv_indices do not cover what the layout says
    q = _f64(case.q[qs:qe][rows, heads])        # [n, H, 576]
    K, V = _f64(K), _f64(V)                     # [kv, 576], [kv, 512]
    n, H = q.shape[0], q.shape[1]
    # (explicit sizes: a request of q_len 0 has no rows, and -1 cannot be inferred from 0 elements)
    s = (q.reshape(n * H, q.shape[-1]) @ K.T).reshape(n, H, K.shape[0]) * case.sm_scale  # matmul: BLAS, threaded
    if case.logit_cap > 0:
        s = case.logit_cap * np.tanh(s / case.logit_cap)
    vis = np.concatenate([np.ones((qe - qs, p), bool), draft_visibility(case, b)], axis=1)[rows]
    s = np.where(vis[:, None, :], s, -np.inf)
    return qs, qe, s, V, vis, p


def _softmax(s: np.ndarray):
    """(P, lse) along the last axis; a row with every column masked gets P = 0, lse = -inf."""
    m = s.max(axis=-1, keepdims=True)
    # only a row whose every column is masked (-inf) is empty; a NaN logit (a NaN input the
    # row really sees, an infinite cap) must poison the row, never pass as "sees nothing"
    empty = m == -np.inf
    e = np.exp(s - np.where(empty, 0.0, m))
    den = e.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        P = np.where(empty, 0.0, e / np.where(empty, 1.0, den))
        lse = np.where(empty[..., 0], -np.inf, np.log(den[..., 0]) + m[..., 0])
    return P, lse


def row_probs(case: Case, b: int, i: int, head: int) -> RequestProbs:
    """The oracle's probabilities of one row (row i of request b, one head) along the request's
    KV, computed for that row alone: one q . K row, not a second run of the whole oracle.
    Fields as in run(with_probs=True)[2][b], with the row and head axes of length 1."""
    _, _, s, _, vis, p = _request(case, b, rows=slice(i, i + 1), heads=slice(head, head + 1))
    return RequestProbs(_softmax(s)[0], s, vis, p)


def run(case: Case, with_probs: bool = False, with_cond: bool = False, with_scale: bool = False):
    """(out [T,H,512] float64, lse [T,H] float64[, list of RequestProbs][, cond [T,H]][, scale [T,H,2]]).
    with_cond adds lse_condition's array, with_scale out_scale's, computed in the same pass.

    A row that sees nothing gets out = 0 and lse = -inf (the kernels are not required to agree
    there; lint flags such rows as errors).
    """
    T, H, Dv = case.num_tokens, case.num_heads, case.v_head_dim
    out = np.zeros((T, H, Dv))
    lse = np.full((T, H), -np.inf)
    per_req = []
    cond = np.zeros((T, H)) if with_cond else None
    scale = np.zeros((T, H, 2)) if with_scale else None
    for b in range(case.batch_size):
        qs, qe, s, V, vis, p = _request(case, b)
        if qe == qs:
            per_req.append(None)
            continue
        P, lse[qs:qe] = _softmax(s)
        if with_cond:
            K = np.abs(_f64(request_kv(case, b)[0]))
            q = np.abs(_f64(case.q[qs:qe]))
            a = (q.reshape(-1, q.shape[-1]) @ K.T).reshape(s.shape) * case.sm_scale
            cond[qs:qe] = np.nan_to_num((P * a).sum(axis=-1), nan=0.0)
        # masked-out columns are exactly 0 in P; 0 * NaN from a poisoned row would still be NaN,
        # which is right: a visible NaN row should poison the oracle too.
        Vz = np.where(vis.any(axis=0)[:, None], V, 0.0)
        n, H, kv = P.shape
        out[qs:qe] = (P.reshape(n * H, kv) @ Vz).reshape(n, H, -1)
        if with_scale:  # sqrt(sum_j p_j^2 mean_d / max_d v_jd^2): two matrix-vector products
            v2 = Vz ** 2
            with np.errstate(invalid="ignore", over="ignore"):  # a non-finite V row: the reference check fails it
                ms = (P.reshape(n * H, kv) ** 2) @ np.stack([v2.mean(axis=1), v2.max(axis=1, initial=0.0)], axis=1)
                sc = np.sqrt(ms).reshape(n, H, 2)
            scale[qs:qe] = np.where(np.isfinite(sc), sc, 0.0)
        if with_probs:
            per_req.append(RequestProbs(P, s, vis, p))
    return ((out, lse) + ((per_req,) if with_probs else ()) + ((cond,) if with_cond else ())
            + ((scale,) if with_scale else ()))


def lse_condition(case: Case) -> np.ndarray:
    """[T, H] the size of the numbers a row's LSE is computed from: sm_scale x sum_j p_j sum_d |q_d k_jd|
    (the probability-weighted absolute logit before cancellation; the tanh cap only shrinks it).

    An fp32 kernel's logit s_j carries an error of about 2^-24 x sm_scale x sum_d |q_d k_jd| (a 576-term
    fp32 dot product), and its LSE is the probability-weighted mean of those errors plus the rounding
    of the LSE itself; kdkit.judge.compare scales the LSE tolerance by this. Rows that see nothing: 0.
    run(case, with_cond=True) gives it with the output in one pass."""
    return run(case, with_cond=True)[2]


def out_scale(case: Case) -> np.ndarray:
    """[T, H, 2] the size of each output row before its V rows cancel: [..., 0] sqrt(sum_j p_j^2
    mean_d v_jd^2), the RMS over the row's dims of the random-walk size of its terms p_j v_jd, and
    [..., 1] sqrt(sum_j p_j^2 max_d v_jd^2), its largest dim's (V with a few large channels, as
    kdkit.synth draws and real models have, errs most there).

    A correct bf16 kernel rounds P to bf16 (each p_j moves by up to 2^-8 p_j), so an output element
    errs by about 2^-8 x that size, whatever the element's own size: where the row's V rows cancel
    (opposite rows under nearly equal weights) the output is tiny but its error is not.
    kdkit.judge.compare measures error against this size where it exceeds the row's own. Where V rows do
    not cancel more than random signs do, it is about the row's RMS or smaller, and nothing changes.
    Rows that see nothing: 0. run(case, with_scale=True) gives it with the output in one pass."""
    return run(case, with_scale=True)[2]
