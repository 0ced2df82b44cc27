"""kdkit_starter: MLA tree-verify attention in Triton, plainly written (split-KV, tree mask, LSE merge).

What it computes (SGLang's TARGET_VERIFY extend call, the "sglang" KV layout):
  request b has q_len draft tokens (rows qo_indptr[b]..qo_indptr[b+1] of q, k, v) and a committed
  prefix of kv_indptr[b+1] - kv_indptr[b] tokens, read from the pool kv_buffer through kv_indices.
  Token i of b attends to every prefix column, and to draft column j where the tree mask says so:
  custom_mask[mask_indptr[b] + i * (prefix + q_len) + prefix + j] (the prefix columns of the mask
  are all True and skipped). Without a mask: causal (j <= i), or every column when causal is False.
  Scores are (q . k) * sm_scale over the 576 dims (512 latent + 64 rope), soft-capped by
  logit_cap * tanh(s / logit_cap) when logit_cap > 0; V is the 512-dim latent part.

How (two kernels):
  1. _partial: one program per (request, block of BLOCK_M (token, head) rows, KV split). All heads
     of a token share its K/V (MLA has one KV head), so rows are (token, head) pairs: row r of a
     request is token r // H, head r % H. Each split walks its share of the request's prefix + q_len
     columns with an online softmax and writes a normalised partial output and its LSE.
  2. _merge: one program per BLOCK_R rows: the splits' partials weighted by exp(lse_s - max lse).

`launch` is what kdkit calls (kdkit.byok.triton reads its signature: the case's tensors and scalars
by name, then the tuning options with their defaults); `workspace` allocates the partials once
per batch, so a launch allocates nothing (CUDA-graph safe).
"""
import os

import torch
import triton
import triton.language as tl

DL = 512        # latent dims: K's first part, V, and the output
DR = 64         # rope dims: K's second part
# (token, head) rows per program x KV columns per step: 32 x 32 on a GPU. Under Triton's CPU
# interpreter (TRITON_INTERPRET=1) an operation costs about the same at any block size, so larger
# blocks run the bundled cases ~3x faster there.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0").strip() not in ("", "0")
BLOCK_M, BLOCK_N = (128, 128) if INTERPRET else (32, 32)
BLOCK_R = 16    # rows per merge program


@triton.jit
def _attend(acc, m_i, l_i, q_lat, q_rope, k_lat, k_rope, v, seen, sm_scale, logit_cap):
    """One online-softmax step over a block of KV columns; `seen` [M, N] says which count."""
    s = tl.dot(q_lat, tl.trans(k_lat)) + tl.dot(q_rope, tl.trans(k_rope))
    s = s * sm_scale
    if logit_cap > 0:
        s = logit_cap * (2 * tl.sigmoid(2 * s / logit_cap) - 1)    # logit_cap * tanh(s / logit_cap)
    s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)           # a row that has seen nothing yet
    alpha = tl.exp(m_i - m_use)
    p = tl.exp(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _partial(Q, K, V, KV, QO_INDPTR, KV_INDPTR, KV_INDICES, MASK, MASK_INDPTR, O_PART, LSE_PART,
             stride_qt, stride_qh, stride_kt, stride_vt, stride_kvr,
             num_heads, num_rows, nsplit, sm_scale, logit_cap,
             USE_MASK: tl.constexpr, CAUSAL: tl.constexpr,
             DL: tl.constexpr, DR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    split = tl.program_id(2)
    q_start = tl.load(QO_INDPTR + b)
    q_len = tl.load(QO_INDPTR + b + 1) - q_start
    kv_start = tl.load(KV_INDPTR + b)
    prefix = tl.load(KV_INDPTR + b + 1) - kv_start

    if tl.program_id(1) * BLOCK_M >= q_len * num_heads:
        return    # past this request's rows: the grid is sized for the longest request
    r = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)     # (token, head) rows of this request
    row_ok = r < q_len * num_heads
    tok = r // num_heads
    head = r % num_heads
    dl = tl.arange(0, DL)
    dr = tl.arange(0, DR)
    q_row = Q + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh
    q_lat = tl.load(q_row + dl[None, :], mask=row_ok[:, None], other=0.0)
    q_rope = tl.load(q_row + DL + dr[None, :], mask=row_ok[:, None], other=0.0)

    # this split's columns: [lo, hi) of the request's prefix + q_len, in whole blocks
    kv_len = prefix + q_len
    per_split = tl.cdiv(tl.cdiv(kv_len, nsplit), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, kv_len)

    acc = tl.zeros([BLOCK_M, DL], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # the prefix, from the pool: every row sees every prefix column
    prefix_hi = tl.minimum(hi, prefix)
    for start in range(lo, prefix_hi, BLOCK_N):
        col = start + tl.arange(0, BLOCK_N)
        ok = col < prefix_hi
        slot = tl.load(KV_INDICES + kv_start + col, mask=ok, other=0)
        kv_row = KV + slot.to(tl.int64)[:, None] * stride_kvr
        k_lat = tl.load(kv_row + dl[None, :], mask=ok[:, None], other=0.0)
        k_rope = tl.load(kv_row + DL + dr[None, :], mask=ok[:, None], other=0.0)
        seen = row_ok[:, None] & ok[None, :]
        # MLA: a pool row's value is its latent part, the K tile already loaded
        acc, m_i, l_i = _attend(acc, m_i, l_i, q_lat, q_rope, k_lat, k_rope, k_lat, seen, sm_scale, logit_cap)

    # the draft, from k and v: draft column j is visible to token i where the tree says so
    mask_start = 0
    if USE_MASK:
        mask_start = tl.load(MASK_INDPTR + b)
    for start in range(tl.maximum(lo, prefix), hi, BLOCK_N):
        j = start - prefix + tl.arange(0, BLOCK_N)
        ok = j < hi - prefix
        k_row = K + (q_start + j)[:, None] * stride_kt
        k_lat = tl.load(k_row + dl[None, :], mask=ok[:, None], other=0.0)
        k_rope = tl.load(k_row + DL + dr[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(V + (q_start + j)[:, None] * stride_vt + dl[None, :], mask=ok[:, None], other=0.0)
        seen = row_ok[:, None] & ok[None, :]
        if USE_MASK:   # row tok's block of the mask, its prefix columns skipped
            visible = tl.load(MASK + mask_start + tok[:, None] * kv_len + prefix + j[None, :],
                              mask=seen, other=0) != 0
        elif CAUSAL:
            visible = j[None, :] <= tok[:, None]
        else:
            visible = seen
        seen = seen & visible
        acc, m_i, l_i = _attend(acc, m_i, l_i, q_lat, q_rope, k_lat, k_rope, v, seen, sm_scale, logit_cap)

    # this split's normalised output and LSE (a split a row saw nothing of: 0 and -inf)
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    row = q_start * num_heads + r                              # = token * H + head over the batch
    tl.store(O_PART + (split * num_rows + row)[:, None] * DL + dl[None, :], o, mask=row_ok[:, None])
    tl.store(LSE_PART + split * num_rows + row, lse, mask=row_ok)


@triton.jit
def _merge(O_PART, LSE_PART, OUT, LSE, num_rows, nsplit, DL: tl.constexpr, BLOCK_R: tl.constexpr):
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = row < num_rows
    dl = tl.arange(0, DL)
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    for s in range(nsplit):
        m = tl.maximum(m, tl.load(LSE_PART + s * num_rows + row, mask=ok, other=float("-inf")))
    m_use = tl.where(m == float("-inf"), 0.0, m)
    den = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, DL], dtype=tl.float32)
    for s in range(nsplit):
        w = tl.exp(tl.load(LSE_PART + s * num_rows + row, mask=ok, other=float("-inf")) - m_use)
        den += w
        acc += w[:, None] * tl.load(O_PART + (s * num_rows + row)[:, None] * DL + dl[None, :],
                                    mask=ok[:, None], other=0.0)
    has = den > 0
    out = acc / tl.where(has, den, 1.0)[:, None]
    tl.store(OUT + row[:, None] * DL + dl[None, :], out.to(OUT.dtype.element_ty), mask=ok[:, None])
    tl.store(LSE + row, tl.where(has, m_use + tl.log(tl.where(has, den, 1.0)), float("-inf")), mask=ok)


def workspace(*, num_tokens, num_heads, nsplit, device):
    """The partials of every split, allocated once per batch (launch allocates nothing)."""
    if not 1 <= nsplit <= 256:
        raise ValueError(f"field 'nsplit': {nsplit}; 1..256 KV splits per request")
    rows = num_tokens * num_heads
    return {"o_part": torch.empty((nsplit, rows, DL), dtype=torch.float32, device=device),
            "lse_part": torch.empty((nsplit, rows), dtype=torch.float32, device=device)}


def launch(q, k, v, kv_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, mask_indptr, out, lse,
           o_part, lse_part, *, bs, num_heads, num_tokens, max_q_len, sm_scale, logit_cap, causal,
           nsplit=4):
    """q [T, H, 576], k [T, 1, 576], v [T, 1, 512], kv_buffer [N, 1, 576]; out [T, H, 512] and
    lse [T, H] (fp32) contiguous, written here. custom_mask is uint8 or None."""
    use_mask = custom_mask is not None
    rows = num_tokens * num_heads
    grid = (bs, triton.cdiv(max_q_len * num_heads, BLOCK_M), nsplit)
    _partial[grid](q, k, v, kv_buffer, qo_indptr, kv_indptr, kv_indices,
                   custom_mask if use_mask else qo_indptr, mask_indptr if use_mask else qo_indptr,
                   o_part, lse_part,
                   q.stride(0), q.stride(1), k.stride(0), v.stride(0), kv_buffer.stride(0),
                   num_heads, rows, nsplit, sm_scale, logit_cap,
                   USE_MASK=use_mask, CAUSAL=bool(causal), DL=DL, DR=DR, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    _merge[(triton.cdiv(rows, BLOCK_R),)](o_part, lse_part, out, lse, rows, nsplit, DL=DL, BLOCK_R=BLOCK_R)
