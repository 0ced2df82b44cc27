"""Input checks of the kernel: bad input is refused with an InputError naming the field and the
fix, before anything launches (a wrong pointer or length is a CUDA fault or a wrong answer).

`check_metadata` and `check_tensors` look at shapes, dtypes, strides and devices only (no device
read, safe inside CUDA-graph capture); `read_sizes` reads the index arrays once (plan time) and,
with `values=True`, checks their contents too: the seed's two marshaling bugs included.
"""
from __future__ import annotations

import torch

import math

from ..constants import KV_INDICES_COVER, LAYOUTS, kv_indices_len, prefix_of
from .spec import DL, DR

D = DL + DR
MAX_BATCH = 65535  # requests per launch: CUDA's gridDim.z


class InputError(ValueError):
    """Input the kernel must not be launched on; the message names the field and the fix."""


def require(cond, field_name: str, msg: str) -> None:
    if not cond:
        raise InputError(f"field '{field_name}': {msg}")


def _index(t, name, n=None):
    require(t is not None, name, "missing")
    require(t.dtype in (torch.int32, torch.int64), name, f"dtype {t.dtype}; int32 or int64")
    require(t.dim() == 1 and t.is_contiguous() and t.is_cuda, name, "must be a contiguous 1-D CUDA tensor")
    if n is not None:
        require(t.numel() == n, name, f"{t.numel()} entries, want {n}")


def check_metadata(m) -> None:
    """The batch metadata of a plan (kdkit.kernel.api.Metadata)."""
    _index(m.qo_indptr, "qo_indptr")
    bs = m.qo_indptr.numel() - 1
    require(bs >= 1, "qo_indptr", "needs bs+1 >= 2 entries")
    _index(m.kv_indptr, "kv_indptr", bs + 1)
    _index(m.kv_indices, "kv_indices")
    require(m.layout in LAYOUTS, "layout", f"{m.layout!r}: one of {', '.join(LAYOUTS)}")
    if m.layout == "unified":
        _index(m.prefix_lens, "prefix_lens", bs)
    elif m.prefix_lens is not None:
        _index(m.prefix_lens, "prefix_lens", bs)
    require((m.custom_mask is None) == (m.mask_indptr is None), "mask_indptr",
            "custom_mask and mask_indptr come together")
    if m.custom_mask is not None:
        require(m.custom_mask.dtype in (torch.uint8, torch.bool) and m.custom_mask.is_contiguous()
                and m.custom_mask.is_cuda, "custom_mask", "bool or uint8, contiguous, on the GPU")
        _index(m.mask_indptr, "mask_indptr")
        require(m.mask_indptr.numel() == bs + 1, "mask_indptr",
                f"{m.mask_indptr.numel()} entries, want bs+1 = {bs + 1} start offsets as SGLang passes them "
                "(a kernel-side [:bs] slice is the seed's mask_indptr bug; run `kdkit inspect`)")
    check_scalars(m, bs)
    for name, t in (("kv_indptr", m.kv_indptr), ("kv_indices", m.kv_indices), ("prefix_lens", m.prefix_lens),
                    ("custom_mask", m.custom_mask), ("mask_indptr", m.mask_indptr)):
        require(t is None or t.device == m.qo_indptr.device, name, f"on {t.device if t is not None else ''}, "
                f"qo_indptr on {m.qo_indptr.device}: the batch metadata lives on one GPU (.to(qo_indptr.device))")


def check_scalars(m, bs: int) -> None:
    """The plan's numbers (no tensor read): heads, scale, cap, batch size."""
    require(m.num_heads >= 1, "num_heads", f"{m.num_heads}; at least 1")
    # finite: an infinite scale or cap makes every score inf or inf x 0 = NaN, a silent NaN output
    require(math.isfinite(m.sm_scale) and m.sm_scale > 0, "sm_scale",
            f"{m.sm_scale} must be finite and > 0 (the attention layer's scaling)")
    require(math.isfinite(m.logit_cap) and m.logit_cap >= 0, "logit_cap",
            f"{m.logit_cap} must be finite and >= 0 (0 = no cap)")
    # gridDim.z holds the requests: CUDA's limit
    require(bs <= MAX_BATCH, "qo_indptr", f"{bs} requests; the kernel's grid holds at most {MAX_BATCH}: "
            "split the batch")


def read_sizes(m, values: bool = True) -> dict:
    """Per-batch sizes from the index arrays (one host read); with values=True, their contents
    are checked too. Returns bs, num_tokens, max_q_len, max_kv_len, pool_rows_needed."""
    qo = m.qo_indptr.long().cpu()
    kvp = m.kv_indptr.long().cpu()
    q_lens, pool_lens = qo.diff(), kvp.diff()
    T = int(qo[-1])
    if values:
        require(int(qo[0]) == 0 and bool((q_lens >= 0).all()), "qo_indptr", "must rise from 0")
        require(int(kvp[0]) == 0 and bool((pool_lens >= 0).all()) and int(kvp[-1]) <= m.kv_indices.numel(),
                "kv_indptr", f"must rise from 0 to at most len(kv_indices)={m.kv_indices.numel()}")
    pfx = m.prefix_lens.long().cpu() if m.prefix_lens is not None else None
    if values and pfx is not None:
        require(bool((pfx >= 0).all()), "prefix_lens", f"negative prefix length {int(pfx.min())}: "
                "prefix_lens are the requests' committed KV lengths (forward_batch.seq_lens - q_len)")
    if values and pfx is not None:  # unified always has prefix_lens (check_metadata)
        why = {"unified": "(prefix + out_cache_loc); kv_indices covering only the prefix is the seed's bug "
                          "(run `kdkit inspect`)",
               "sglang": "(kv_indptr must span each prefix_lens entry)"}[m.layout]
        require(bool((pool_lens == kv_indices_len(m.layout, pfx, q_lens)).all()),
                "kv_indices" if m.layout == "unified" else "kv_indptr",
                f"{m.layout} layout: each request's kv_indices cover {KV_INDICES_COVER[m.layout]} {why}")
    # the committed prefix: unified reads it from prefix_lens, sglang from what kv_indices cover
    prefix = pfx if m.layout == "unified" else prefix_of(m.layout, pool_lens, q_lens)
    used = m.kv_indices[: int(kvp[-1])]
    pool_rows = int(used.max()) + 1 if used.numel() else 0
    if values and used.numel():
        require(int(used.min()) >= 0, "kv_indices", f"negative slot {int(used.min())}: slots index the "
                "KV pool's rows from 0; capture kv_indices as SGLang built them")
    if values and m.custom_mask is not None:
        mip = m.mask_indptr.long().cpu()
        need = q_lens * (prefix + q_lens)
        require(bool((mip.diff() == need).all()) and int(mip[0]) == 0, "mask_indptr",
                f"offsets {mip.tolist()[:6]}... do not match the blocks q_len*(prefix+q_len) = {need.tolist()[:6]}...")
        # <=: SGLang's CUDA-graph mask is a preallocated buffer, longer than the live blocks
        require(int(mip[-1]) <= m.custom_mask.numel(), "custom_mask",
                f"{m.custom_mask.numel()} entries, the mask_indptr says {int(mip[-1])}: pass the whole "
                "mask (spec_info.custom_mask), not a slice of it")
    kv_lens = prefix + q_lens
    return {"bs": int(q_lens.numel()), "num_tokens": T, "max_q_len": int(q_lens.max()),
            "max_kv_len": int(kv_lens.max()), "pool_rows_needed": pool_rows}


def bound_kv_len(sizes: dict, max_kv_len: int | None) -> dict:
    """The sizes the plan chooses its split count from: the caller's max_kv_len where given (the
    longest KV a plan captured in a graph will run), refused below the batch's own longest."""
    if max_kv_len is None:
        return sizes
    require(int(max_kv_len) >= sizes["max_kv_len"], "max_kv_len",
            f"{max_kv_len} is below the longest request now ({sizes['max_kv_len']} KV rows: prefix + q_len); "
            "pass the longest KV the plan will run, or None for the batch's own")
    return {**sizes, "max_kv_len": int(max_kv_len)}


def _rows16(t, name):
    require(t.dtype == torch.bfloat16, name, f"dtype {t.dtype}; the kernel is bf16 (cast before the call)")
    require(t.stride(-1) == 1 and all(s % 8 == 0 for s in t.stride()[:-1]), name,
            f"strides {t.stride()}: each row's 16-byte chunks are copied whole, so the last dim must be "
            "contiguous and every other stride a multiple of 8 elements (.contiguous())")
    # (a contiguous view at an odd offset passes the strides; .contiguous() returns it unchanged)
    require(t.data_ptr() % 16 == 0, name, f"starts at address {t.data_ptr():#x}, not 16-byte aligned (a view at "
            f"element offset {t.storage_offset()}): pass a fresh allocation (.clone()) or a view at a multiple "
            "of 8 elements")
    require(t.is_cuda, name, "not on a CUDA device")


def check_tensors(plan, q, k, v, kv_buffer, out, lse) -> None:
    """The tensors of one layer against the plan (metadata only: no device read)."""
    T, H = plan.num_tokens, plan.num_heads
    require(q.dim() == 3 and tuple(q.shape) == (T, H, D), "q", f"shape {tuple(q.shape)}, want [T={T}, H={H}, {D}]")
    require(tuple(k.shape) == (T, 1, D), "k", f"shape {tuple(k.shape)}, want ({T}, 1, {D})")
    require(tuple(v.shape) == (T, 1, DL), "v", f"shape {tuple(v.shape)}, want ({T}, 1, {DL})")
    require(kv_buffer.dim() == 3 and tuple(kv_buffer.shape[1:]) == (1, D), "kv_buffer",
            f"shape {tuple(kv_buffer.shape)}, want [N, 1, {D}]")
    require(kv_buffer.shape[0] >= plan.pool_rows_needed, "kv_buffer",
            f"{kv_buffer.shape[0]} rows, but kv_indices reach slot {plan.pool_rows_needed - 1}")
    for name, t in (("q", q), ("k", k), ("v", v), ("kv_buffer", kv_buffer)):
        _rows16(t, name)
        require(t.device == plan.device, name, f"on {t.device}, the plan is for {plan.device}")
    if out is not None:
        require(tuple(out.shape) == (T, H, DL) and out.dtype == torch.bfloat16, "out",
                f"{tuple(out.shape)} {out.dtype}, want ({T}, {H}, {DL}) bfloat16")
        _rows16(out, "out")
        require(out.device == plan.device, "out", f"on {out.device}, the plan is for {plan.device}")
        # every (token, head) row its own memory: a stride of 0 (an expanded tensor) would have
        # the rows overwrite each other
        require(all(st > 0 for st, n in zip(out.stride()[:-1], out.shape[:-1]) if n > 1), "out",
                f"strides {out.stride()}: rows share memory (an .expand()ed tensor?); allocate it with torch.empty")
    if lse is not None:
        require(tuple(lse.shape) == (T, H) and lse.dtype == torch.float32 and lse.is_contiguous(), "lse",
                f"{tuple(lse.shape)} {lse.dtype}, want contiguous ({T}, {H}) float32")
        require(lse.device == plan.device, "lse", f"on {lse.device}, the plan is for {plan.device}")
