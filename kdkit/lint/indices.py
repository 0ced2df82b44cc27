"""Family 2: the index arrays (qo_indptr, prefix_lens, kv_indptr, the indices' ranges, the scratch
slot)."""
from __future__ import annotations

from typing import Iterator

import torch

from .context import Finding, Context, _show, _n


def _indptr(name: str, code: str, vals: list[int], n_want: int | None, what: str) -> Iterator[Finding]:
    if n_want is not None and len(vals) != n_want:
        yield Finding(f"{code}-length", "error", name, f"{name} has {len(vals)} entries; bs={n_want - 1} needs bs+1 = {n_want}",
                      f"Store the whole {name} (bs+1 entries: 0, then the cumulative {what}).")
        return
    if not vals or vals[0] != 0:
        yield Finding(f"{code}-start", "error", name, f"{name} starts at {vals[0] if vals else 'nothing'}, not 0: {_show(vals)}",
                      f"{name} holds start offsets: entry b is where request b begins, so entry 0 is 0.")
    drops = [i for i in range(1, len(vals)) if vals[i] < vals[i - 1]]
    if drops:
        i = drops[0]
        yield Finding(f"{code}-not-monotone", "error", name,
                      f"{name} decreases at entry {i}: {vals[i - 1]} -> {vals[i]} ({len(drops)} drop(s)); {_show(vals)}",
                      f"{name} must be non-decreasing (cumulative {what}); capture it from the same batch as the other arrays.")


def check_qo_indptr(ctx: Context) -> Iterator[Finding]:
    if not ctx.need("qo_indptr"):
        return
    qo = ctx.qo
    found = list(_indptr("qo_indptr", "qo-indptr", qo, None, "draft tokens per request"))
    if len(qo) < 2:
        found.append(Finding("qo-indptr-length", "error", "qo_indptr", f"qo_indptr has {len(qo)} entries; needs bs+1 >= 2",
                             "Store forward_metadata.qo_indptr whole (bs+1 entries)."))
    T = ctx.T
    if T is not None and qo and qo[-1] != T:
        found.append(Finding("qo-indptr-end", "error", "qo_indptr", f"qo_indptr ends at {qo[-1]} but q has T={T} tokens",
                             "qo_indptr[-1] must equal the number of draft tokens (q.shape[0]); capture both from one call."))
    if found:
        ctx.bad.add("qo_indptr")
    yield from found
    empty = [b for b in range(len(qo) - 1) if qo[b + 1] == qo[b]] if not found else []
    if empty:  # valid (a kernel writes nothing for them), but no verify batch has such a request
        yield Finding("qo-empty-request", "warning", "qo_indptr",
                      f"{_n(len(empty), 'request has', 'requests have')} q_len 0 (no draft tokens): {_show(empty)}; "
                      "nothing of them is computed or compared",
                      "SGLang's verify gives every request its draft tokens: check that qo_indptr and q come from "
                      "the same call, or drop the empty requests.")


def check_lengths(ctx: Context) -> Iterator[Finding]:
    bs, T = ctx.bs, ctx.T
    if bs is not None and ctx.need("prefix_lens"):
        p = ctx.prefix
        if len(p) != bs:
            ctx.bad.add("prefix_lens")
            yield Finding("prefix-lens-length", "error", "prefix_lens", f"prefix_lens has {len(p)} entries for bs={bs}",
                          "Capture forward_batch.seq_lens (in TARGET_VERIFY: the committed prefix length of each request).")
        elif any(x < 0 for x in p):
            ctx.bad.add("prefix_lens")
            yield Finding("prefix-lens-negative", "error", "prefix_lens", f"prefix_lens has negative entries: {_show(p)}",
                          "Prefix lengths count committed tokens; capture seq_lens of the same batch.")
    if T is not None and ctx.need("out_cache_loc") and ctx.get("out_cache_loc").numel() != T:
        ctx.bad.add("out_cache_loc")
        yield Finding("out-cache-loc-length", "error", "out_cache_loc",
                      f"out_cache_loc has {ctx.get('out_cache_loc').numel()} entries for T={T} draft tokens",
                      "Capture forward_batch.out_cache_loc of the same call: one pool slot per draft token.")
    if ctx.need("slot_ids", "kv_buffer") and ctx.get("slot_ids").numel() != ctx.get("kv_buffer").shape[0]:
        ctx.bad.add("slot_ids")
        yield Finding("slot-ids-length", "warning", "slot_ids",
                      f"slot_ids has {ctx.get('slot_ids').numel()} entries for {ctx.get('kv_buffer').shape[0]} kv_buffer rows",
                      "slot_ids[r] is the original pool slot of kv_buffer row r; kdkit.layout.compact returns it.")


def check_kv_indptr(ctx: Context) -> Iterator[Finding]:
    if not ctx.need("kv_indptr"):
        return
    kvp, bs = ctx.kvp, ctx.bs
    found = list(_indptr("kv_indptr", "kv-indptr", kvp, None if bs is None else bs + 1, "KV lengths"))
    if found:
        ctx.bad.add("kv_indptr")
        yield from found
        return
    if ctx.need("kv_indices"):
        n = ctx.get("kv_indices").numel()
        if kvp[-1] > n:
            ctx.bad.add("kv_indptr")
            yield Finding("kv-indptr-end", "error", "kv_indptr",
                          f"kv_indptr ends at {kvp[-1]} but kv_indices has only {n} entries",
                          "kv_indptr[-1] must equal len(kv_indices); capture both from the same forward_metadata.")
        elif kvp[-1] < n:
            yield Finding("kv-indptr-end", "warning", "kv_indptr",
                          f"kv_indptr ends at {kvp[-1]} but kv_indices has {n} entries; the last {n - kvp[-1]} are never read",
                          "Trim kv_indices to kv_indices[:kv_indptr[-1]] (a preallocated buffer was captured whole).")


def check_index_ranges(ctx: Context) -> Iterator[Finding]:
    if not ctx.need("kv_buffer"):
        return
    N = ctx.get("kv_buffer").shape[0]
    for name, code in (("kv_indices", "kv-index-out-of-range"), ("out_cache_loc", "out-cache-loc-out-of-range")):
        if not ctx.need(name):
            continue
        t = ctx.get(name).reshape(-1).cpu().long()
        if name == "kv_indices" and ctx.need("kv_indptr"):
            t = t[: ctx.kvp[-1]]
        bad = (t < 0) | (t >= N)
        if bool(bad.any()):
            ctx.bad.add(name)
            i = int(bad.nonzero()[0, 0])
            yield Finding(code, "error", name,
                          f"{name}[{i}] = {int(t[i])} is outside the {N} kv_buffer rows ({int(bad.sum())} entries out of range)",
                          "Indices must point at kv_buffer rows: capture the pool and the indices of the same layer "
                          "and step, and compact them together (kdkit.layout.compact remaps slots to rows).")


def check_scratch_slot(ctx: Context) -> Iterator[Finding]:
    """Pool slot 0 is SGLang's padded scratch slot; no real token lives there."""
    if ctx.need("slot_ids"):
        rows = set(ctx.get("slot_ids").reshape(-1).cpu().long().eq(0).nonzero().reshape(-1).tolist())
    else:
        rows = {0}
    if not rows:
        return
    scratch = torch.tensor(sorted(rows))
    if ctx.need("kv_indices", "kv_indptr"):
        idx = ctx.get("kv_indices").reshape(-1).cpu().long()[: ctx.kvp[-1]]
        hit = torch.isin(idx, scratch)
        if bool(hit.any()):
            i = int(hit.nonzero()[0, 0])
            yield Finding("scratch-slot-referenced", "error", "kv_indices",
                          f"kv_indices[{i}] = {int(idx[i])} is the scratch slot 0 ({int(hit.sum())} entries read it): "
                          "a request would attend to padding",
                          "Real tokens live in slots >= 1: the indices were probably taken from a padded "
                          "CUDA-graph buffer or before the allocator filled them; capture forward_metadata.kv_indices "
                          "of the live call (eager, --disable-cuda-graph).")
    if ctx.need("out_cache_loc"):
        loc = ctx.get("out_cache_loc").reshape(-1).cpu().long()
        hit = torch.isin(loc, scratch)
        if bool(hit.any()):
            i = int(hit.nonzero()[0, 0])
            yield Finding("scratch-slot-referenced", "warning", "out_cache_loc",
                          f"out_cache_loc[{i}] is the scratch slot 0 ({int(hit.sum())} draft tokens): padded tokens "
                          "write there; their K/V in the pool is not theirs",
                          "Capture out_cache_loc of the live (eager) call; drop padded requests from the case.")
