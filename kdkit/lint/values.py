"""Family 6: the values: non-finite inputs and pool rows, the pool against the draft's k/v, V as
the latent of K, and the no-mask case."""
from __future__ import annotations

from typing import Iterator

import torch

from .context import Finding, Context, _show, _n


def _nonfinite_rows(x: torch.Tensor) -> torch.Tensor:
    """bool [R]: which rows of x ([R, ...]) hold NaN/Inf. A row sum is cheap and non-finite whenever
    the row is (NaN and Inf propagate); a finite row whose sum overflows is re-checked exactly."""
    out = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    if not x.is_floating_point() or x.numel() == 0:
        return out
    flat = x.reshape(x.shape[0], -1)
    cand = (~torch.isfinite(flat.sum(dim=1))).nonzero().reshape(-1)
    if cand.numel():
        out[cand] = ~torch.isfinite(flat[cand]).all(dim=1)
    return out


def check_nonfinite_inputs(ctx: Context) -> Iterator[Finding]:
    for name in ("q", "k", "v"):
        if not ctx.need(name):
            continue
        x = ctx.get(name)
        if x.numel() == 0:
            continue
        rows = _nonfinite_rows(x.reshape(-1, x.shape[-1]))
        if not bool(rows.any()):
            continue
        bad_rows = x.reshape(-1, x.shape[-1])[rows]
        bad = ~torch.isfinite(bad_rows)
        r0 = int(rows.nonzero()[0, 0])
        t, h = divmod(r0, x.shape[1])
        d = int((~torch.isfinite(x[t, h])).nonzero()[0, 0])
        n_nan = int(torch.isnan(bad_rows).sum())
        read = name == "q" or ctx.layout != "unified"
        sev = "error" if read else "warning"
        yield Finding("nonfinite-input", sev, name,
                      f"{name} has {_n(int(bad.sum()), 'non-finite value', 'non-finite values')} ({n_nan} NaN), first at "
                      f"token {t}, head {h}, dim {d}"
                      + ("" if read else "; the unified layout reads the draft from the pool, not from k/v"),
                      f"NaN/Inf in {name} makes every output it touches NaN: capture a step whose activations are finite, "
                      "or (for a NaN hunt) compare against the layer's input to find where it starts.")


def check_nonfinite_pool(ctx: Context) -> Iterator[Finding]:
    """NaN in pool rows the case reads; unreferenced rows may hold anything (synthetic cases poison them)."""
    if not ctx.need("kv_buffer", "kv_indices", "kv_indptr"):
        return
    kb = ctx.get("kv_buffer")
    idx = ctx.get("kv_indices").reshape(-1).long()[: ctx.kvp[-1]].to(kb.device)
    if idx.numel() == 0:
        return
    read = torch.zeros(kb.shape[0], dtype=torch.bool, device=kb.device)
    read[idx] = True
    bad = (_nonfinite_rows(kb) & read).cpu()
    if bool(bad.any()):
        hit = bad.nonzero().reshape(-1).tolist()
        slots = ""
        if ctx.need("slot_ids") and ctx.get("slot_ids").numel() == kb.shape[0]:
            sid = ctx.get("slot_ids").reshape(-1).cpu().long()
            slots = f" (pool slots {_show([int(sid[r]) for r in hit], 5)})"
        yield Finding("nonfinite-pool-row", "error", "kv_buffer",
                      f"{len(hit)} of the {int(read.sum())} kv_buffer rows read through kv_indices hold NaN/Inf: rows "
                      f"{_show(hit, 5)}{slots}",
                      "A referenced KV row with NaN/Inf poisons every row that sees it: the indices probably point at "
                      "freed or never-written slots (capture the pool and the indices of the same layer and step).")


def _differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise a != b, with NaN == NaN (non-finite values are reported by their own checks)."""
    return (a != b) & ~(torch.isnan(a) & torch.isnan(b))


def check_pool_matches_draft(ctx: Context) -> Iterator[Finding]:
    """sglang layout: forward_extend writes k into the pool at out_cache_loc before the kernel runs."""
    if ctx.layout != "sglang" or not ctx.need("kv_buffer", "k", "out_cache_loc"):
        return
    kb, k = ctx.get("kv_buffer"), ctx.get("k")
    loc = ctx.get("out_cache_loc").reshape(-1).long().to(kb.device)
    if loc.numel() == 0 or loc.numel() != k.shape[0] or k.shape[1:] != kb.shape[1:]:
        return  # lengths/shapes already reported by the structure checks
    # exact: the pool holds k rounded to the pool dtype, and that is what we compare against
    diff = _differs(kb[loc], k.to(kb.device, kb.dtype)).reshape(loc.numel(), -1).any(dim=1).cpu()
    if bool(diff.any()):
        t = int(diff.nonzero()[0, 0])
        yield Finding("pool-draft-mismatch", "warning", "kv_buffer",
                      f"{int(diff.sum())} of {loc.numel()} pool rows at out_cache_loc differ from k (first: draft token {t}, "
                      f"kv_buffer row {int(loc[t])}); forward_extend writes k there before the attention kernel runs",
                      "Capture the pool at the kernel call (after set_kv_buffer), and out_cache_loc of the same step; "
                      "a unified-layout replay would read those pool rows instead of k.")


def check_v_is_latent_of_k(ctx: Context) -> Iterator[Finding]:
    if ctx.layout != "sglang" or not ctx.need("k", "v") or "dims" in ctx.bad:
        return
    k, v = ctx.get("k"), ctx.get("v")
    dv = v.shape[-1]
    if k.shape[:2] != v.shape[:2] or k.shape[-1] < dv:
        return
    diff = _differs(v.to(k.dtype), k[..., :dv])
    if bool(diff.any()):
        t = int(diff.nonzero()[0, 0])
        yield Finding("v-not-latent-of-k", "warning", "v",
                      f"v differs from k[..., :{dv}] at {int(diff.sum())} entries (first at token {t}); in MLA the value "
                      f"is the latent part of the key",
                      "Capture v as forward_extend receives it (the latent k_nope); check that k is [latent || rope].")


def check_no_mask(ctx: Context) -> Iterator[Finding]:
    if ctx.get("custom_mask") is not None or "custom_mask" in ctx.bad or "mask_indptr" in ctx.bad:
        return
    if not isinstance(ctx.get("q"), torch.Tensor) or not isinstance(getattr(ctx.case, "causal", None), bool):
        return
    how = ("each draft row sees the rows before it (a chain)" if ctx.case.causal
           else "every draft row sees every draft token")
    yield Finding("no-custom-mask", "info", "custom_mask",
                  f"no custom_mask: {how}; tree verify normally passes a tree mask",
                  "Fine for a chain draft; for a tree draft capture forward_metadata.custom_mask and mask_indptr.")
