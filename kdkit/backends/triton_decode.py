"""SGLang's Triton decode kernel fed one query per tree node: the baseline a verify step would get
from a decode kernel that knows no tree mask.

Each tree node (query token) becomes its own one-query "request" whose KV index list is its
request's prefix rows followed by the draft slots it may see (its ancestors and itself,
kdkit.layout.draft_visibility), so the decode kernel, which attends to every row it is given,
computes exactly the tree-masked attention: every case with a mask, causal or not, can run. The
price is that a prefix shared by the q_len nodes of a request is read q_len times.

The call: decode_attention_fwd(q, k_buffer = the [N, 1, 576] pool, v_buffer = its first 512 dims,
o, kv_indptr / kv_indices per node, attn_logits / attn_lse scratch [T, H, splits], num_kv_splits
= 8 per node (SGLang's default triton_attention_num_kv_splits), max_kv_splits 8, sm_scale, k_scale
= v_scale = 1, logit_cap, has_mla where the release takes it). The kernel keeps only per-split
LSEs, so the Result has no LSE (judged on the output alone). Runs on the GPU, or on the CPU under
Triton's interpreter as triton_sglang does (kdkit.backends.triton_sglang.RunDevice).
"""
from __future__ import annotations

import warnings

import torch

from .. import layout, sglang_source
from ..constants import V_HEAD_DIM as DV
from . import BackendUnavailable, Prepared, Result
from . import triton_sglang

NAME = "triton_decode"
LABEL = "SGLang Triton decode, one query per tree node"
SPLITS = 8  # SGLang's default triton_attention_num_kv_splits


def unavailable(case=None) -> str | None:
    """Where SGLang's extend kernel can run, so can its decode kernel (the same files and triton)."""
    why = triton_sglang.unavailable(case)
    return why.replace(triton_sglang.NAME, NAME, 1) if why else None


def per_node_indices(case) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_indptr [T+1], kv_indices) int64 on the CPU, one entry per tree node (query token) in
    token order: node i of request b attends to the request's prefix rows and to the draft slots
    it may see (its ancestors and itself, layout.draft_visibility). `case` in either layout."""
    u = case if case.layout == "unified" else layout.to_unified(case)
    kvp = u.kv_indptr.long()
    idx, indptr = [], [0]
    for b in range(u.batch_size):
        qs, qe = (int(v) for v in u.qo_indptr[b:b + 2])
        n = qe - qs
        seg = u.kv_indices[int(kvp[b]):int(kvp[b + 1])].long()
        prefix, draft = seg[: len(seg) - n], seg[len(seg) - n:]
        vis = layout.draft_visibility(u, b)
        for i in range(n):
            idx.append(torch.cat([prefix, draft[vis[i]]]))
            indptr.append(indptr[-1] + len(idx[-1]))
    return torch.tensor(indptr, dtype=torch.int64), torch.cat(idx).to(torch.int64) if idx else torch.zeros(0, dtype=torch.int64)


def run(case) -> Result:
    """SGLang's decode_attention_fwd over per_node_indices(case) (the case is never mutated)."""
    p = prepare(case)
    p.launch()
    return p.result()


def prepare(case) -> Prepared:
    """The call ready to launch on device copies made here; result() is the last launch's
    [T, H, 512] output (no LSE), waited for."""
    why = sglang_source.prepare_triton()  # before the first import of triton
    if why:
        raise BackendUnavailable(f"{NAME}: {why}")
    import triton

    src = sglang_source.locate()
    fwd = sglang_source.load_module("decode_attention", src).decode_attention_fwd
    names = sglang_source.kernel_params(fwd)
    u = layout.to_unified(case)  # the draft's K/V are pool rows there, addressed like the prefix's
    dev = triton_sglang.RunDevice(u)
    kv_indptr, kv_indices = (dev(t) for t in per_node_indices(u))
    T, H = u.num_tokens, u.num_heads
    q, kv_buffer = dev(u.q), dev(u.kv_buffer)
    o = torch.empty(T, H, DV, dtype=q.dtype, device=dev.device)
    logits = torch.empty(T, H, SPLITS, DV, dtype=torch.float32, device=dev.device)
    lse = torch.empty(T, H, SPLITS, dtype=torch.float32, device=dev.device)
    nks = torch.full((T,), SPLITS, dtype=torch.int32, device=dev.device)
    kw = {"logit_cap": float(u.logit_cap)}
    if "has_mla" in names:
        kw["has_mla"] = True
    args = (q, kv_buffer, kv_buffer[..., :DV], o, kv_indptr, kv_indices, logits, lse, nks, SPLITS,
            float(u.sm_scale), 1.0, 1.0)

    def launch():
        if not T:
            return
        with warnings.catch_warnings():
            if dev.interpret:  # NumPy warns about a block's padding rows, which the GPU computes silently
                warnings.simplefilter("ignore", RuntimeWarning)
            fwd(*args, **kw)
    info = {"sglang_release": src.release, "device": dev.name, "interpreter": dev.interpret,
            "triton": triton.__version__, "kv_splits": SPLITS,
            "ran": (f"SGLang {src.release} ({src.origin}) Triton decode kernel, one query per tree node, "
                    f"triton {triton.__version__} on {dev.name}" + (" under TRITON_INTERPRET=1" if dev.interpret else ""))}
    if dev.interpret:
        info["note"] = dev.note()

    def result() -> Result:
        dev.sync()
        return Result(out=dev.output(o), lse=None, info=info)
    # graph-safe on a GPU: SGLang captures this kernel in its decode graphs; no host reads in launch
    return Prepared(launch, result, graph_safe=not dev.interpret, info=info)
