"""Family 4: the tree mask. The seed's sliced mask_indptr first (a named bug), then lengths,
offsets and values."""
from __future__ import annotations

from typing import Iterator

import torch

from .context import Finding, Context, _ints, _show, _n, _cumsum0
from .indices import _indptr


MASK_INDPTR_FIX = ("Pass forward_metadata.mask_indptr whole (bs+1 entries, starting at 0, ending at "
                   "len(custom_mask)); a kernel that wants per-request start offsets takes "
                   "mask_indptr[:bs] - never mask_indptr[1:], which are END offsets.")


def _mask_ready(ctx: Context) -> bool:
    return (ctx.get("custom_mask") is not None
            and ctx.need("custom_mask", "mask_indptr", "qo_indptr", "prefix_lens"))


def check_mask_indptr_sliced(ctx: Context) -> Iterator[Finding]:
    if not _mask_ready(ctx):
        return
    mi, bs = _ints(ctx.get("mask_indptr")), ctx.bs
    if len(mi) != bs:
        return
    sizes = ctx.block_sizes
    full = _cumsum0(sizes)
    L = ctx.get("custom_mask").numel()
    sizes_s = ", ".join(f"{q}x{p + q}" for q, p in zip(ctx.q_lens[:4], ctx.prefix[:4])) + (", ..." if bs > 4 else "")
    ctx.named.add("mask-indptr-sliced")
    if mi == full[:bs] and (mi != full[1:]):
        ctx.mask_starts = mi
        yield Finding("mask-indptr-sliced", "warning", "mask_indptr",
                      f"mask_indptr has {_n(bs, 'entry', 'entries')} for bs={bs} (SGLang's has bs+1 = {bs + 1}): these are the "
                      f"per-request START offsets {_show(mi)} (mask_indptr[:bs]), so the mask is readable, but the end "
                      f"of the last block ({full[-1]}) is not recorded",
                      MASK_INDPTR_FIX + f" Whole, this case's mask_indptr is {_show(full)}.")
        return
    if mi == full[1:] or (mi and sizes and sizes[0] != 0 and mi[0] == sizes[0]):
        exact = "" if mi == full[1:] else " (the first entry matches; later ones differ too)"
        def where(off):
            if off >= L:
                return f"past the end of the {L}-entry mask"
            owner = max(i for i in range(bs) if full[i] <= off)
            return f"request {owner}'s block" if full[owner] == off else f"inside request {owner}'s block"
        last = (f", and request {bs - 1} (the last) from {mi[-1]}, {where(mi[-1])}" if bs > 1 else "")
        yield Finding("mask-indptr-sliced", "error", "mask_indptr",
                      f"mask_indptr has {_n(bs, 'entry', 'entries')} for bs={bs} instead of bs+1 = {bs + 1}, and holds END offsets: "
                      f"{_show(mi)} == cumsum of the block sizes q_len x (prefix + q_len) ({sizes_s} = {_show(sizes)}), i.e. "
                      f"mask_indptr[1:] was passed{exact}. Read as start offsets, request 0 takes its mask from "
                      f"offset {mi[0]} ({where(mi[0])}) instead of 0{last}"
                      + (": each request reads the next one's mask" if bs > 1 else ""),
                      MASK_INDPTR_FIX + f" Whole, this case's mask_indptr is {_show(full)}.")
        return
    yield Finding("mask-indptr-sliced", "error", "mask_indptr",
                  f"mask_indptr has {_n(bs, 'entry', 'entries')} for bs={bs} instead of bs+1 = {bs + 1}: {_show(mi)}; from q_len and "
                  f"prefix_lens it should be {_show(full)} (neither its start nor its end offsets)",
                  MASK_INDPTR_FIX)


def check_mask_offsets(ctx: Context) -> Iterator[Finding]:
    """mask_indptr == [0, cumsum(q_len x (prefix + q_len))] and the mask is exactly that long."""
    if not _mask_ready(ctx):
        return
    mask = ctx.get("custom_mask")
    sizes, bs, L = ctx.block_sizes, ctx.bs, mask.numel()
    full = _cumsum0(sizes)
    found = []
    if L != full[-1]:
        sev = "error" if L < full[-1] else "warning"
        terms = " + ".join(f"{q}x{p + q}" for q, p in zip(ctx.q_lens[:4], ctx.prefix[:4])) + (" + ..." if bs > 4 else "")
        found.append(Finding("mask-length", sev, "custom_mask",
                             f"custom_mask has {L} entries but sum over requests of q_len x (prefix + q_len) = "
                             f"{terms} = {full[-1]}" + ("" if sev == "error" else "; the tail is never read"),
                             "custom_mask holds, per request, a row-major q_len x (prefix + q_len) block; capture "
                             "forward_metadata.custom_mask with the seq_lens (prefix_lens) of the same call"
                             + ("" if sev == "error" else ", or trim it to the blocks' total") + "."))
    if "mask-indptr-sliced" in ctx.named:
        yield from found
        return
    mi = _ints(ctx.get("mask_indptr"))
    shape = list(_indptr("mask_indptr", "mask-indptr", mi, bs + 1, "mask block sizes"))
    if not shape and mi != full:
        b = next(i for i in range(len(mi)) if mi[i] != full[i])
        shape.append(Finding("mask-indptr-offsets", "error", "mask_indptr",
                             f"mask_indptr[{b}] = {mi[b]} but the cumulative block sizes q_len x (prefix + q_len) give "
                             f"{full[b]}: {_show(mi)} vs {_show(full)}",
                             "mask_indptr[b+1] - mask_indptr[b] must be q_len_b x (prefix_b + q_len_b); check that "
                             "prefix_lens is seq_lens of the same batch and that mask_indptr was not rebuilt."))
    if not shape and L >= full[-1]:
        ctx.mask_starts = mi[:bs]
    yield from found + shape


def check_mask_values(ctx: Context) -> Iterator[Finding]:
    if not _mask_ready(ctx):
        return
    m = ctx.get("custom_mask")
    if m.dtype == torch.uint8 and bool((m > 1).any()):
        yield Finding("mask-uint8-values", "warning", "custom_mask",
                      f"uint8 custom_mask holds values other than 0/1 (max {int(m.max())}, {int((m > 1).sum())} entries)",
                      "Store the mask as bool (or 0/1 uint8, as SGLang's CUDA-graph buffer holds it).")


def check_mask_prefix_true(ctx: Context) -> Iterator[Finding]:
    blocks = ctx.blocks()
    if not blocks:
        return
    bad = [(b, blk[2]) for b, blk in enumerate(blocks) if blk is not None and blk[2] is not None]
    if bad:
        b, (r, c, n) = bad[0]
        yield Finding("mask-prefix-false", "warning", "custom_mask",
                      f"request {b}: mask row {r}, prefix column {c} is False ({n} False prefix entries in this request, "
                      f"{len(bad)} request(s)); SGLang's Triton kernel skips the prefix columns "
                      "(skip_prefix_custom_mask=True), so production attends to them anyway",
                      "Prefix columns must be all True; if some prefix tokens really must be hidden, SGLang's "
                      "kernel cannot do it: the oracle and kdkit follow production and ignore them.")
