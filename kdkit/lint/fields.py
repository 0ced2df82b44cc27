"""Family 1: params, dtypes and shapes. These run first and mark broken fields (ctx.bad) so that
later checks skip what they cannot read."""
from __future__ import annotations

from typing import Iterator

import torch

from ..constants import (FLOAT_DTYPES, INDEX_DTYPES, KV_LORA_RANK, LAYOUTS, MASK_DTYPES, QK_ROPE_HEAD_DIM,
                         V_HEAD_DIM)
from .context import Finding, Context, _dt


def check_params(ctx: Context) -> Iterator[Finding]:
    c = ctx.case
    if ctx.layout not in LAYOUTS:
        ctx.bad.add("layout")
        yield Finding("param-invalid", "error", "layout", f"layout is {ctx.layout!r}, not one of {LAYOUTS}",
                      "Use 'sglang' (prefix from kv_indices, draft from k/v, what SGLang captures) or "
                      "'unified' (prefix + draft slots all in kv_indices).")
    H = ctx.scalar("num_heads", int)
    if H is None or H < 1:
        ctx.bad.add("num_heads")
        yield Finding("param-invalid", "error", "num_heads", f"num_heads is {getattr(c, 'num_heads', None)!r}",
                      "Set num_heads to the heads of one TP rank (q.shape[1]; Kimi K2.x at TP8: 8).")
    sc = getattr(c, "sm_scale", None)
    if isinstance(sc, bool) or not isinstance(sc, (int, float)) or not (0 < sc < 1e4):
        yield Finding("param-invalid", "error", "sm_scale", f"sm_scale is {sc!r}, not a softmax scale (0 < sm_scale < 1e4)",
                      "Capture layer.scaling (Kimi K2.6: 192**-0.5 * mscale**2 = 0.144680).")
    cap = getattr(c, "logit_cap", None)
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap < 0:
        yield Finding("param-invalid", "error", "logit_cap", f"logit_cap is {cap!r}",
                      "Use 0.0 for no soft cap (MLA models use none), else layer.logit_cap.")
    if not isinstance(getattr(c, "causal", None), bool):
        yield Finding("param-invalid", "error", "causal", f"causal is {getattr(c, 'causal', None)!r}, not a bool",
                      "TARGET_VERIFY calls the kernel with causal=True.")
    Dl, Dr, Dv = (ctx.scalar(n, int) for n in ("kv_lora_rank", "qk_rope_head_dim", "v_head_dim"))
    if None in (Dl, Dr, Dv) or Dv != Dl:
        ctx.bad.add("dims")
        yield Finding("param-invalid", "error", "v_head_dim",
                      f"kv_lora_rank {Dl!r}, qk_rope_head_dim {Dr!r}, v_head_dim {Dv!r}: MLA reads V from the "
                      "latent, so v_head_dim must equal kv_lora_rank",
                      "Kimi/DeepSeek MLA: kv_lora_rank 512, qk_rope_head_dim 64, v_head_dim 512.")
    meta = getattr(c, "meta", None)
    if not isinstance(meta, dict) or meta.get("source") not in ("captured", "synthetic"):
        src = meta.get("source") if isinstance(meta, dict) else None
        yield Finding("meta-source", "warning", "meta", f"meta.source is {src!r}",
                      "Set meta['source'] to 'captured' (from a live server) or 'synthetic'.")


# where each tensor comes from in SGLang (for the fix text of a missing field)
_SOURCE_OF = {
    "q": "the q argument of forward_extend, [T, H, 576]",
    "k": "the k argument of forward_extend, [T, 1, 576]",
    "v": "the v argument of forward_extend, [T, 1, 512]",
    "kv_buffer": "the layer's pool (token_to_kv_pool.get_key_buffer(layer_id)), compacted with kdkit.layout.compact",
    "kv_indptr": "attn_backend.forward_metadata.kv_indptr, [bs+1]",
    "kv_indices": "attn_backend.forward_metadata.kv_indices, [kv_indptr[-1]]",
    "qo_indptr": "attn_backend.forward_metadata.qo_indptr, [bs+1]",
    "out_cache_loc": "forward_batch.out_cache_loc, [T]",
    "prefix_lens": "forward_batch.seq_lens (the committed prefix in TARGET_VERIFY), [bs]",
    "slot_ids": "the slot_ids kdkit.layout.compact returns (original pool slot of each kv_buffer row)",
}

_REQUIRED = ("q", "k", "v", "kv_buffer", "kv_indptr", "kv_indices", "qo_indptr", "out_cache_loc",
             "prefix_lens", "slot_ids")


def check_tensors(ctx: Context) -> Iterator[Finding]:
    """Type, dtype, rank and shape of every tensor field; broken fields are marked bad."""
    kinds = {n: (FLOAT_DTYPES, 3) for n in ("q", "k", "v", "kv_buffer", "ref_out")}
    kinds.update({n: (INDEX_DTYPES, 1) for n in ("kv_indptr", "kv_indices", "qo_indptr", "out_cache_loc",
                                                 "prefix_lens", "slot_ids", "mask_indptr")})
    kinds["custom_mask"] = (MASK_DTYPES, 1)
    kinds["ref_lse"] = ((torch.float32, torch.float64), 2)
    for name, (dtypes, ndim) in kinds.items():
        t = ctx.get(name)
        if t is None and name not in _REQUIRED:
            continue
        if not isinstance(t, torch.Tensor):
            ctx.bad.add(name)
            yield Finding("tensor-missing", "error", name, f"{name} is {type(t).__name__}, not a tensor",
                          f"Capture {name}: {_SOURCE_OF.get(name, 'see kdkit.case.Case')}.")
            continue
        if t.dtype not in dtypes:
            ctx.bad.add(name)
            yield Finding("tensor-dtype", "error", name,
                          f"{name} has dtype {_dt(t)}; allowed: {', '.join(_dt(torch.empty(0, dtype=d)) for d in dtypes)}",
                          "Store tensors as SGLang holds them: activations and the pool in bf16/fp16/fp32, "
                          "index arrays int32/int64, the mask bool (eager) or uint8 (CUDA-graph buffer).")
            continue
        if t.dim() != ndim:
            ctx.bad.add(name)
            yield Finding("tensor-rank", "error", name, f"{name} is {t.dim()}-D with shape {tuple(t.shape)}; expected {ndim}-D",
                          f"Store {name} with its forward_extend shape (index arrays and the mask flat, 1-D).")
    if (ctx.get("custom_mask") is None) != (ctx.get("mask_indptr") is None):
        have, miss = ("custom_mask", "mask_indptr") if ctx.get("mask_indptr") is None else ("mask_indptr", "custom_mask")
        ctx.bad.update(("custom_mask", "mask_indptr"))
        yield Finding("mask-pair", "error", miss, f"{have} is present but {miss} is not",
                      "Capture forward_metadata.custom_mask and forward_metadata.mask_indptr together (both or neither).")
    yield from _shapes(ctx)


def _shapes(ctx: Context) -> Iterator[Finding]:
    H = ctx.scalar("num_heads", int)
    Dl = ctx.scalar("kv_lora_rank", int) or KV_LORA_RANK
    Dr = ctx.scalar("qk_rope_head_dim", int) or QK_ROPE_HEAD_DIM
    Dv = ctx.scalar("v_head_dim", int) or V_HEAD_DIM
    D = Dl + Dr
    T = ctx.T
    want = {"q": (T, H, D), "k": (T, 1, D), "v": (T, 1, Dv), "ref_out": (T, H, Dv), "ref_lse": (T, H)}
    for name, shape in want.items():
        if not ctx.need(name) or None in shape:
            continue
        t = ctx.get(name)
        if tuple(t.shape) != shape:
            ctx.bad.add(name)
            why = f"T={T} tokens (q.shape[0]), H={H} heads (num_heads), {D} = {Dl} latent + {Dr} rope"
            yield Finding("tensor-shape", "error", name, f"{name} has shape {tuple(t.shape)}, expected {shape} ({why})",
                          f"Capture {name} as forward_extend receives it for one TP rank; set num_heads to q.shape[1].")
    if ctx.need("kv_buffer"):
        kb = ctx.get("kv_buffer")
        if tuple(kb.shape[1:]) != (1, D) or kb.shape[0] < 1:
            ctx.bad.add("kv_buffer")
            yield Finding("tensor-shape", "error", "kv_buffer", f"kv_buffer has shape {tuple(kb.shape)}, expected [N>=1, 1, {D}]",
                          "Store the layer's MLA pool rows (latent first, then rope), e.g. via kdkit.layout.compact.")
