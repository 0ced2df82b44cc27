"""Family 3: the layout. The seed's prefix-only kv_indices first (a named bug), then the generic
KV length checks it explains."""
from __future__ import annotations

from typing import Iterator

import torch

from ..constants import LAYOUTS, kv_indices_len
from .context import Finding, Context, _show


UNIFIED_FIX = ("In TARGET_VERIFY kv_indices cover only the committed prefix; build unified indices per "
               "request as cat(kv_indices[kv_indptr[b]:kv_indptr[b+1]], "
               "out_cache_loc[qo_indptr[b]:qo_indptr[b+1]]) (kdkit.layout.to_unified does this), "
               "or replay in the sglang layout, reading the draft K/V from k/v.")


def _kv_ready(ctx: Context) -> bool:
    return ctx.need("kv_indptr", "qo_indptr", "prefix_lens") and ctx.layout in LAYOUTS


def check_prefix_only_kv_indices(ctx: Context) -> Iterator[Finding]:
    if not _kv_ready(ctx) or ctx.layout != "unified":
        return
    kvp, ql, p = ctx.kvp, ctx.q_lens, ctx.prefix
    kv_len = [b - a for a, b in zip(kvp[:-1], kvp[1:])]
    drafted = [b for b in range(len(ql)) if ql[b] > 0]
    if not drafted or any(kv_len[b] != p[b] for b in drafted):
        return
    ctx.named.add("prefix-only-kv-indices")
    has_mask = ctx.get("custom_mask") is not None
    parts = []
    for b in drafted[:4]:
        s = f"request {b}: KV length {kv_len[b]} but prefix + draft = {p[b]} + {ql[b]} = {p[b] + ql[b]} columns"
        if has_mask:
            s += f" (the mask has {ql[b]} x {p[b] + ql[b]} = {ql[b] * (p[b] + ql[b])} entries)"
        parts.append(s)
    more = f"; and {len(drafted) - 4} more requests" if len(drafted) > 4 else ""
    if len(drafted) == 1 and len(ql) == 1:
        b = drafted[0]
        head = (f"KV length {kv_len[0]} per request but the mask has {ql[b]} x {p[b] + ql[b]} = "
                f"{ql[b] * (p[b] + ql[b])} entries" if has_mask else
                f"KV length {kv_len[0]} but prefix + draft = {p[b] + ql[b]} rows")
        body = (f"{head}: layout 'unified' needs kv_indices to cover prefix + draft, yet they cover only the "
                f"{p[b]}-token committed prefix; the {ql[b]} draft tokens (out_cache_loc) are missing, so a kernel "
                "reading every KV row through kv_indices never sees the draft")
    else:
        body = ("layout 'unified' needs kv_indices to cover prefix + draft, yet every request's kv_indices cover "
                "only its committed prefix: " + "; ".join(parts) + more)
    yield Finding("prefix-only-kv-indices", "error", "kv_indices", body, UNIFIED_FIX)


def check_layout_lengths(ctx: Context) -> Iterator[Finding]:
    if not _kv_ready(ctx):
        return
    kvp, ql, p = ctx.kvp, ctx.q_lens, ctx.prefix
    kv_len = [b - a for a, b in zip(kvp[:-1], kvp[1:])]
    want = [kv_indices_len(ctx.layout, a, b) for a, b in zip(p, ql)]
    wrong = [b for b in range(len(want)) if kv_len[b] != want[b]]
    if not wrong:
        return
    ctx.bad.add("layout-lengths")
    b = wrong[0]
    if ctx.layout == "sglang":
        msg = (f"layout 'sglang': kv_indptr diffs must equal prefix_lens, but request {b} has KV length {kv_len[b]} "
               f"against prefix {p[b]} ({len(wrong)} of {len(want)} requests differ)")
        if all(kv_len[i] == p[i] + ql[i] for i in range(len(want))):
            msg += "; every KV length equals prefix + q_len, so these are unified indices"
            fix = "Set layout='unified' (kv_indices already include the draft slots), or store only the prefix indices."
        else:
            fix = ("In TARGET_VERIFY kv_indptr/kv_indices cover the committed prefix (seq_lens): capture "
                   "forward_metadata.kv_indptr and forward_batch.seq_lens of the same call.")
    else:
        msg = (f"layout 'unified': kv_indptr diffs must equal prefix_lens + q_len, but request {b} has KV length "
               f"{kv_len[b]} against {p[b]} + {ql[b]} = {want[b]} ({len(wrong)} of {len(want)} requests differ)")
        fix = UNIFIED_FIX
    yield Finding("layout-kv-length", "error", "kv_indptr", msg, fix)


def check_unified_draft_tail(ctx: Context) -> Iterator[Finding]:
    if (ctx.layout != "unified" or not _kv_ready(ctx) or "layout-lengths" in ctx.bad
            or not ctx.need("kv_indices", "out_cache_loc")):
        return
    idx = ctx.get("kv_indices").reshape(-1).cpu().long()
    loc = ctx.get("out_cache_loc").reshape(-1).cpu().long()
    kvp, qo, p = ctx.kvp, ctx.qo, ctx.prefix
    wrong = []
    for b in range(len(p)):
        tail, want = idx[kvp[b] + p[b]: kvp[b + 1]], loc[qo[b]: qo[b + 1]]
        if not torch.equal(tail, want):
            wrong.append((b, tail.tolist(), want.tolist()))
    if wrong:
        b, tail, want = wrong[0]
        yield Finding("unified-draft-tail", "error", "kv_indices",
                      f"layout 'unified': request {b}'s last {len(want)} kv_indices {_show(tail)} should be its "
                      f"out_cache_loc {_show(want)} (the draft tokens' pool rows); {len(wrong)} request(s) differ",
                      UNIFIED_FIX)
