"""Eager PyTorch reference, CPU or GPU: what a correct bf16 kernel should produce.

From the case's bf16 inputs: scores in fp32, (q . k) * sm_scale, SGLang's tanh soft cap when
logit_cap > 0, SGLang's mask semantics (every prefix column visible, draft columns from the
custom mask, or causal / all when there is no mask), fp32 softmax, P @ V in fp32, output cast to
bf16 (what a production kernel writes) and LSE in fp32 [T, H].

Only the KV rows a request references are gathered, so NaN-poisoned unreferenced pool rows are
never touched. The case is never mutated.

Options:
  device      where the math runs (default: the device of case.q)
  p_bf16      round P to bf16 before P @ V, as Triton/FlashAttention-style kernels do (default
              False); used to check that the tolerance floor admits real kernels
  chunk_elems bound on one score block (rows x heads x kv), to keep q_len 1025 x 128 heads small
"""
from __future__ import annotations

import torch

from .. import layout
from ..layout import request_kv
from . import Result

NAME = "torch"


def unavailable(case=None):
    return None


def draft_visibility(case, b: int, device) -> torch.Tensor:
    """[q_len, q_len] bool on `device` (kdkit.layout.draft_visibility, moved)."""
    return layout.draft_visibility(case, b).to(device)


def _request(case, b, device, p_bf16, chunk_elems):
    qs, qe = (int(x) for x in case.qo_indptr[b: b + 2])
    n, H = qe - qs, case.num_heads
    K, V, p = request_kv(case, b)                       # referenced rows only; checks the layout rule
    K = K.to(device=device, dtype=torch.float32)        # [kv, 576]
    V = V.to(device=device, dtype=torch.float32)        # [kv, 512]
    kv = K.shape[0]
    vis = torch.cat([torch.ones(n, p, dtype=torch.bool, device=device),
                     draft_visibility(case, b, device)], dim=1)  # [n, kv]
    q = case.q[qs:qe].to(device=device, dtype=torch.float32)     # [n, H, 576]
    out = torch.empty(n, H, V.shape[1], dtype=torch.float32, device=device)
    lse = torch.empty(n, H, dtype=torch.float32, device=device)
    rows = max(1, chunk_elems // max(1, H * kv))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        s = (q[r0:r1].reshape(-1, q.shape[-1]) @ K.T).reshape(r1 - r0, H, kv) * case.sm_scale
        if case.logit_cap > 0:
            s = case.logit_cap * torch.tanh(s / case.logit_cap)
        s = s.masked_fill(~vis[r0:r1, None, :], float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)                     # -inf where a row sees nothing
        P = torch.exp(s - torch.where(torch.isfinite(row_lse), row_lse, 0.0)[..., None])
        if p_bf16:
            P = P.bfloat16().float()
        # masked columns are exactly 0 in P, but 0 * NaN would still be NaN: zero the V rows no
        # row of this block can see (all referenced rows are finite in a sane case anyway)
        Vb = torch.where(vis[r0:r1].any(dim=0)[:, None], V, 0.0)
        out[r0:r1] = (P.reshape(-1, kv) @ Vb).reshape(r1 - r0, H, -1)
        lse[r0:r1] = row_lse
    return qs, qe, out, lse


def run(case, *, device=None, p_bf16: bool = False, chunk_elems: int = 1 << 24) -> Result:
    device = torch.device(device) if device is not None else case.q.device
    T, H, Dv = case.num_tokens, case.num_heads, case.v_head_dim
    out = torch.zeros(T, H, Dv, dtype=torch.float32, device=device)
    lse = torch.full((T, H), float("-inf"), dtype=torch.float32, device=device)
    with torch.no_grad():
        for b in range(case.batch_size):
            qs, qe, o, l = _request(case, b, device, p_bf16, chunk_elems)
            out[qs:qe], lse[qs:qe] = o, l
    info = {"device": str(device), "dtype": "bf16 out, fp32 math" + (", bf16 P" if p_bf16 else ""),
            "ran": f"eager PyTorch {torch.__version__} on {device}: fp32 math"
                   + (", P rounded to bf16" if p_bf16 else "") + ", bf16 output"}
    return Result(out.bfloat16(), lse, info)
