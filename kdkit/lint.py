"""Consistency checks for a case that explain themselves and never raise.

`check(case)` runs every check in `CHECKS` (in order) and returns `Finding`s: what is wrong, with
the numbers, and what to do about it. The case may come straight from a capture, unvalidated:
the first checks look at types, dtypes and shapes and mark broken fields, and every later check
skips what it cannot read instead of crashing. A check that crashes anyway becomes a
`lint-internal` finding; the others still run.

Severities: "error"   - a replay would be wrong or meaningless;
            "warning" - unusual but computable;
            "info"    - worth knowing.

The seed's two marshaling bugs have their own codes (`mask-indptr-sliced`,
`prefix-only-kv-indices`); generic findings they explain are folded into them (see
`CONSEQUENCES`) so they are not drowned.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from .constants import (FLOAT_DTYPES, INDEX_DTYPES, KV_LORA_RANK, LAYOUTS, MASK_DTYPES,
                        QK_ROPE_HEAD_DIM, V_HEAD_DIM, kv_indices_len)

SEVERITIES = ("error", "warning", "info")

# SGLang's extend_attention_fwd tiles the draft rows in blocks of BLOCK_M: 32 for 576-dim MLA on
# sm_90 (Hopper) and sm_120 (RTX PRO 6000 / 5090), 16 on sm_100. With causal=True and a custom mask
# a row only scans draft columns < min(q_len, (row // BLOCK_M + 1) * BLOCK_M).
TRITON_BLOCK_M = 32
SMALLEST_BLOCK_M = 16  # sm_100


UNIFIED_FIX = ("In TARGET_VERIFY kv_indices cover only the committed prefix; build unified indices per "
               "request as cat(kv_indices[kv_indptr[b]:kv_indptr[b+1]], "
               "out_cache_loc[qo_indptr[b]:qo_indptr[b+1]]) (kdkit.layout.to_unified does this), "
               "or replay in the sglang layout, reading the draft K/V from k/v.")
MASK_INDPTR_FIX = ("Pass forward_metadata.mask_indptr whole (bs+1 entries, starting at 0, ending at "
                   "len(custom_mask)); a kernel that wants per-request start offsets takes "
                   "mask_indptr[:bs] - never mask_indptr[1:], which are END offsets.")


@dataclass(frozen=True)
class Finding:
    code: str        # stable kebab-case id, e.g. "mask-indptr-sliced"
    severity: str    # "error" | "warning" | "info"
    field: str       # the case field concerned, e.g. "mask_indptr"
    message: str     # what is wrong, with the numbers
    fix: str         # what to do, spelled out


# A named bug -> the generic codes it explains (dropped from the output, listed in its message).
CONSEQUENCES = {
    "prefix-only-kv-indices": ("layout-kv-length", "unified-draft-tail", "mask-length"),
    "mask-indptr-sliced": ("mask-indptr-length", "mask-indptr-start", "mask-indptr-not-monotone",
                           "mask-indptr-offsets"),
}


# ---- small helpers ---------------------------------------------------------------------------
def _ints(t: torch.Tensor) -> list[int]:
    return t.detach().reshape(-1).cpu().long().tolist()


def _show(xs, k: int = 8) -> str:
    xs = list(xs)
    if len(xs) <= k:
        return "[" + ", ".join(str(x) for x in xs) + "]"
    return "[" + ", ".join(str(x) for x in xs[:k]) + f", ... (+{len(xs) - k} more)]"


def _n(k: int, one: str, many: str) -> str:
    return f"{k} {one if k == 1 else many}"


def _dt(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _cumsum0(xs: list[int]) -> list[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


class _Ctx:
    """The case plus what the checks so far learned: which fields are unusable (`bad`), and
    derived values (bs, T, q_lens, ...) that later checks may rely on once earlier ones passed."""

    def __init__(self, case):
        self.case = case
        self.bad: set[str] = set()
        self.named: set[str] = set()        # named-bug codes found so far
        self.mask_starts: list[int] | None = None  # per-request mask offsets, once trusted
        self._blocks = None

    def get(self, name):
        return getattr(self.case, name, None)

    def need(self, *names) -> bool:
        return all(n not in self.bad and isinstance(self.get(n), torch.Tensor) for n in names)

    def scalar(self, name, typ, default=None):
        v = getattr(self.case, name, default)
        if typ is int and isinstance(v, bool):
            return default
        return v if isinstance(v, typ) else default

    # derived values: only valid once the checks that guard them have run
    @property
    def layout(self):
        return getattr(self.case, "layout", None)

    @property
    def T(self) -> int | None:
        return int(self.get("q").shape[0]) if self.need("q") else None

    @property
    def bs(self) -> int | None:
        return self.get("qo_indptr").numel() - 1 if self.need("qo_indptr") else None

    @property
    def qo(self) -> list[int]:
        return _ints(self.get("qo_indptr"))

    @property
    def q_lens(self) -> list[int]:
        qo = self.qo
        return [b - a for a, b in zip(qo[:-1], qo[1:])]

    @property
    def prefix(self) -> list[int]:
        return _ints(self.get("prefix_lens"))

    @property
    def kvp(self) -> list[int]:
        return _ints(self.get("kv_indptr"))

    @property
    def block_sizes(self) -> list[int]:
        """Mask entries per request: q_len x (prefix + q_len)."""
        return [q * (p + q) for q, p in zip(self.q_lens, self.prefix)]

    def blocks(self):
        """Per request: None, or (q_len, prefix, prefix_all_true, first_false_prefix_row_col,
        draft [q_len, q_len] numpy bool). Needs trusted mask offsets."""
        if self._blocks is not None:
            return self._blocks
        if self.mask_starts is None or not self.need("custom_mask", "qo_indptr", "prefix_lens"):
            return None
        mask = self.get("custom_mask").reshape(-1)
        out = []
        for b, (n, p) in enumerate(zip(self.q_lens, self.prefix)):
            s, size = self.mask_starts[b], n * (p + n)
            if n == 0 or s < 0 or s + size > mask.numel():
                out.append(None)
                continue
            blk = mask[s: s + size].reshape(n, p + n) != 0
            pre = blk[:, :p]
            first_false = None
            if p and not bool(pre.all()):
                r, c = (int(x) for x in (~pre).nonzero()[0])
                first_false = (r, c, int((~pre).sum()))
            out.append((n, p, first_false, blk[:, p:].cpu().numpy()))
        self._blocks = out
        return out


Check = Callable[[_Ctx], Iterable[Finding]]
CHECKS: list[Check] = []


def _check(fn: Check) -> Check:
    CHECKS.append(fn)
    return fn


# ---- 1. params, dtypes and shapes ----------------------------------------------------------
@_check
def check_params(ctx: _Ctx) -> Iterator[Finding]:
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


@_check
def check_tensors(ctx: _Ctx) -> Iterator[Finding]:
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


def _shapes(ctx: _Ctx) -> Iterator[Finding]:
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


# ---- 2. index arrays ------------------------------------------------------------------------
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


@_check
def check_qo_indptr(ctx: _Ctx) -> Iterator[Finding]:
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


@_check
def check_lengths(ctx: _Ctx) -> Iterator[Finding]:
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


@_check
def check_kv_indptr(ctx: _Ctx) -> Iterator[Finding]:
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


@_check
def check_index_ranges(ctx: _Ctx) -> Iterator[Finding]:
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


@_check
def check_scratch_slot(ctx: _Ctx) -> Iterator[Finding]:
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


# ---- 3. layout: the seed's prefix-only kv_indices, then the generic length checks -----------
def _kv_ready(ctx: _Ctx) -> bool:
    return ctx.need("kv_indptr", "qo_indptr", "prefix_lens") and ctx.layout in LAYOUTS


@_check
def check_prefix_only_kv_indices(ctx: _Ctx) -> Iterator[Finding]:
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


@_check
def check_layout_lengths(ctx: _Ctx) -> Iterator[Finding]:
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


@_check
def check_unified_draft_tail(ctx: _Ctx) -> Iterator[Finding]:
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


# ---- 4. the mask: the seed's sliced mask_indptr, then lengths and offsets -------------------
def _mask_ready(ctx: _Ctx) -> bool:
    return (ctx.get("custom_mask") is not None
            and ctx.need("custom_mask", "mask_indptr", "qo_indptr", "prefix_lens"))


@_check
def check_mask_indptr_sliced(ctx: _Ctx) -> Iterator[Finding]:
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


@_check
def check_mask_offsets(ctx: _Ctx) -> Iterator[Finding]:
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


@_check
def check_mask_values(ctx: _Ctx) -> Iterator[Finding]:
    if not _mask_ready(ctx):
        return
    m = ctx.get("custom_mask")
    if m.dtype == torch.uint8 and bool((m > 1).any()):
        yield Finding("mask-uint8-values", "warning", "custom_mask",
                      f"uint8 custom_mask holds values other than 0/1 (max {int(m.max())}, {int((m > 1).sum())} entries)",
                      "Store the mask as bool (or 0/1 uint8, as SGLang's CUDA-graph buffer holds it).")


@_check
def check_mask_prefix_true(ctx: _Ctx) -> Iterator[Finding]:
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


# ---- 5. the tree ------------------------------------------------------------------------------
def _drafts(ctx: _Ctx):
    blocks = ctx.blocks()
    return [] if not blocks else [(b, blk) for b, blk in enumerate(blocks) if blk is not None]


@_check
def check_rows_see_something(ctx: _Ctx) -> Iterator[Finding]:
    for b, (n, p, _, d) in _drafts(ctx):
        if p:
            continue
        blind = np.flatnonzero(~d.any(axis=1))
        if blind.size:
            yield Finding("row-sees-nothing", "error", "custom_mask",
                          f"request {b} has prefix 0 and draft row(s) {_show(blind.tolist())} see no draft column: "
                          "the softmax has nothing to normalize (kernels return 0, NaN or garbage there)",
                          "Every row must see at least itself (the diagonal) and the root (column 0).")


def _tree_problem(d: np.ndarray):
    """The first way the visible sets fail to be ancestor chains of one tree, or None."""
    m = d | np.eye(d.shape[0], dtype=bool)  # a missing diagonal is reported on its own
    mf = m.astype(np.float32)
    # transitive: i sees j and j sees k  =>  i sees k
    reach = (mf @ mf) > 0
    miss = reach & ~m
    if miss.any():
        i, k = (int(x) for x in np.argwhere(miss)[0])
        j = int(np.flatnonzero(m[i] & m[:, k])[0])
        return i, f"row {i} sees column {j} but not {k}, which row {j} sees (an ancestor of {j} must be an ancestor of {i})"
    # antisymmetric: no two rows see each other
    both = m & m.T & ~np.eye(m.shape[0], dtype=bool)
    if both.any():
        i, j = (int(x) for x in np.argwhere(both)[0])
        return i, f"rows {i} and {j} see each other (a cycle: each would be the other's ancestor)"
    # a chain: any two columns a row sees are comparable (one sees the other)
    incomparable = ~(m | m.T)
    cnt = (mf @ incomparable.astype(np.float32)) * mf  # [i, k]: columns j seen by i not comparable with k
    if cnt.any():
        i, k = (int(x) for x in np.argwhere(cnt > 0)[0])
        j = int(np.flatnonzero(m[i] & incomparable[:, k])[0])
        return i, f"row {i} sees columns {j} and {k}, which are on different branches (neither sees the other)"
    return None


@_check
def check_tree_shape(ctx: _Ctx) -> Iterator[Finding]:
    self_bad, root_bad, non_tree = [], [], []
    for b, (n, p, _, d) in _drafts(ctx):
        rows = np.flatnonzero(~np.diag(d))
        if rows.size:
            self_bad.append((b, rows.tolist()))
        rows = np.flatnonzero(~d[:, 0])
        if rows.size:
            root_bad.append((b, rows.tolist()))
        prob = _tree_problem(d)
        if prob:
            non_tree.append((b, prob[1]))
    if self_bad:
        b, rows = self_bad[0]
        yield Finding("tree-self-not-visible", "warning", "custom_mask",
                      f"request {b}: draft row(s) {_show(rows)} do not see themselves (diagonal False); "
                      f"{len(self_bad)} request(s) affected",
                      "In a tree-verify mask row i sees itself and its ancestors: set the diagonal True.")
    if root_bad:
        b, rows = root_bad[0]
        yield Finding("tree-root-not-visible", "warning", "custom_mask",
                      f"request {b}: draft row(s) {_show(rows)} do not see the root (draft column 0, the bonus token); "
                      f"{len(root_bad)} request(s) affected",
                      "Every node descends from the root: column 0 of the draft block is True in every row "
                      "(a deliberately non-tree mask, e.g. the 'diagonal' hard case, may ignore this).")
    if non_tree:
        b, why = non_tree[0]
        yield Finding("tree-sees-non-ancestor", "warning", "custom_mask",
                      f"request {b}: {why}; the visible set of a row must be the ancestor chain of one tree "
                      f"({len(non_tree)} request(s) affected)",
                      "Build the mask from a parent array (kdkit.trees.tree_block): row i sees itself and the "
                      "chain parent[i], parent[parent[i]], ... up to the root.")


@_check
def check_tree_order(ctx: _Ctx) -> Iterator[Finding]:
    if getattr(ctx.case, "causal", None) is not True:
        return  # causal=False: the Triton kernel scans every draft column, any numbering works
    errs, late = [], []
    for b, (n, p, _, d) in _drafts(ctx):
        upper = np.triu(d, 1)  # row i sees a later-numbered column j > i
        if not upper.any():
            continue
        rows = np.arange(n)[:, None]
        limit = np.minimum(n, (rows // TRITON_BLOCK_M + 1) * TRITON_BLOCK_M)
        cols = np.arange(n)[None, :]
        dropped = d & (cols >= limit)
        if dropped.any():
            i, j = (int(x) for x in np.argwhere(dropped)[0])
            errs.append((b, n, i, j, int(dropped.sum()), int(limit[i, 0])))
        else:
            i, j = (int(x) for x in np.argwhere(upper)[0])
            late.append((b, n, i, j))
    if errs:
        b, n, i, j, cnt, lim = errs[0]
        lo = i // TRITON_BLOCK_M * TRITON_BLOCK_M
        yield Finding("tree-order", "error", "custom_mask",
                      f"request {b} (q_len {n}): row {i} sees draft column {j}, but SGLang's Triton kernel (causal=True "
                      f"+ custom mask, BLOCK_M={TRITON_BLOCK_M} for 576-dim MLA on sm_90/sm_120) scans only columns "
                      f"< {lim} for rows {lo}..{lo + TRITON_BLOCK_M - 1}: production silently drops that column "
                      f"({cnt} visible (row, column) pairs dropped in this request, {len(errs)} request(s))",
                      "Number the tree so parents come before children (every visible column j <= row i: "
                      "breadth-first or best-first order, as kdkit.trees builds them), or, where you control the call, pass "
                      "causal=False so the kernel scans every draft column.")
    elif late:
        b, n, i, j = late[0]
        sev = "warning" if n > SMALLEST_BLOCK_M else "info"
        yield Finding("tree-order-non-topological", sev, "custom_mask",
                      f"request {b} (q_len {n}): row {i} sees later-numbered column {j} (a child numbered before its "
                      f"parent); it works while q_len <= BLOCK_M ({TRITON_BLOCK_M} on sm_90/sm_120), but BLOCK_M is "
                      f"{SMALLEST_BLOCK_M} on sm_100, and any q_len > BLOCK_M silently drops such columns",
                      "Number the tree so parents come before children (parent index < child index).")


# ---- 6. values ----------------------------------------------------------------------------
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


@_check
def check_nonfinite_inputs(ctx: _Ctx) -> Iterator[Finding]:
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


@_check
def check_nonfinite_pool(ctx: _Ctx) -> Iterator[Finding]:
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


@_check
def check_pool_matches_draft(ctx: _Ctx) -> Iterator[Finding]:
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


@_check
def check_v_is_latent_of_k(ctx: _Ctx) -> Iterator[Finding]:
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


@_check
def check_no_mask(ctx: _Ctx) -> Iterator[Finding]:
    if ctx.get("custom_mask") is not None or "custom_mask" in ctx.bad or "mask_indptr" in ctx.bad:
        return
    if not isinstance(ctx.get("q"), torch.Tensor) or not isinstance(getattr(ctx.case, "causal", None), bool):
        return
    how = ("each draft row sees the rows before it (a chain)" if ctx.case.causal
           else "every draft row sees every draft token")
    yield Finding("no-custom-mask", "info", "custom_mask",
                  f"no custom_mask: {how}; tree verify normally passes a tree mask",
                  "Fine for a chain draft; for a tree draft capture forward_metadata.custom_mask and mask_indptr.")


# ---- running the checks ---------------------------------------------------------------------
def _fold_consequences(findings: list[Finding]) -> list[Finding]:
    out = list(findings)
    for named, codes in CONSEQUENCES.items():
        idx = [i for i, f in enumerate(out) if f.code == named]
        if not idx:
            continue
        folded = [f for f in out if f.code in codes]
        if not folded:
            continue
        out = [f for f in out if f.code not in codes]
        i = next(j for j, f in enumerate(out) if f.code == named)
        out[i] = replace(out[i], message=out[i].message + " (this also explains: "
                         + ", ".join(sorted({f.code for f in folded})) + ")")
    return out


def check(case) -> list[Finding]:
    """Every finding for `case`, errors first. Never raises."""
    findings: list[Finding] = []
    try:
        ctx = _Ctx(case)
    except Exception as e:  # pragma: no cover - _Ctx only stores references
        return [Finding("lint-internal", "error", "case", f"could not start the lint: {type(e).__name__}: {e}",
                        "This is a kdkit bug; report it with the case file.")]
    for fn in CHECKS:
        try:
            findings.extend(fn(ctx))
        except Exception as e:
            findings.append(Finding("lint-internal", "error", "case",
                                    f"check {fn.__name__} crashed: {type(e).__name__}: {e}",
                                    "This is a kdkit bug (the other checks ran); report it with the case file."))
    findings = _fold_consequences(findings)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: order.get(f.severity, len(order)))


def errors(case) -> list[Finding]:
    return [f for f in check(case) if f.severity == "error"]


def format_findings(findings) -> str:
    """Human text: a count line, then one block per finding; 'lint: clean' when there are none."""
    findings = list(findings)
    if not findings:
        return "lint: clean"
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    head = "lint: " + ", ".join(f"{n} {s}{'s' if n != 1 and s != 'info' else ''}" for s, n in counts.items() if n)
    blocks = [f"{f.severity.upper()} {f.code} [{f.field}]\n  {f.message}\n  fix: {f.fix}" for f in findings]
    return head + "\n\n" + "\n\n".join(blocks)


__all__ = ["Finding", "check", "errors", "format_findings", "CHECKS", "CONSEQUENCES", "SEVERITIES",
           "TRITON_BLOCK_M"]
