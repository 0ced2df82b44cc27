"""Building a case from a live pool (compaction) and converting between the two KV layouts."""
from __future__ import annotations

import torch

from .case import Case, CaseError
from .constants import KV_INDICES_COVER, kv_indices_len, prefix_of


def compact(kv_pool: torch.Tensor, kv_indices: torch.Tensor, out_cache_loc: torch.Tensor):
    """Keep only the pool rows a call references (kv_indices plus out_cache_loc).

    Returns (kv_buffer, new_kv_indices, new_out_cache_loc, slot_ids). Row 0 of the compact buffer
    is the pool's scratch slot 0 (kept so that a case which wrongly reads slot 0 still reads what
    the server would have read); referenced slots follow in ascending order.
    """
    kv_pool = kv_pool.reshape(kv_pool.shape[0], 1, -1) if kv_pool.dim() == 2 else kv_pool
    n_pool = kv_pool.shape[0]
    idx = torch.cat([kv_indices.reshape(-1).long().cpu(), out_cache_loc.reshape(-1).long().cpu()])
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n_pool):
        bad = int(idx[(idx < 0) | (idx >= n_pool)][0])
        raise CaseError("kv_indices", f"slot {bad} is outside the pool ({n_pool} rows): "
                        "capture the indices and the pool of the same layer and step")
    used = torch.unique(idx)
    used = used[used != 0]
    slot_ids = torch.cat([torch.zeros(1, dtype=torch.long), used])
    remap = torch.zeros(n_pool, dtype=torch.long)
    remap[slot_ids] = torch.arange(slot_ids.numel())
    rows = kv_pool[slot_ids.to(kv_pool.device)].detach().cpu().clone()
    new_idx = remap[kv_indices.reshape(-1).long().cpu()].to(kv_indices.dtype)
    new_loc = remap[out_cache_loc.reshape(-1).long().cpu()].to(out_cache_loc.dtype)
    return rows, new_idx, new_loc, slot_ids


def _segments(indptr: torch.Tensor):
    p = indptr.long().tolist()
    return list(zip(p[:-1], p[1:]))


def to_unified(case: Case) -> Case:
    """prefix-from-pool + draft-from-k/v  ->  every KV row from the pool (prefix + out_cache_loc).

    The draft rows are written into the pool at out_cache_loc from k (rope included), as
    forward_extend does before the kernel runs; v must be the latent part of k, as in MLA.
    """
    if case.layout == "unified":
        return case.clone()
    kv = case.kv_buffer.clone()
    loc = case.out_cache_loc.long()
    kv[loc] = case.k.to(kv.dtype)
    kv[loc, :, : case.v_head_dim] = case.v.to(kv.dtype)
    pieces, indptr = [], [0]
    for (ks, ke), (qs, qe) in zip(_segments(case.kv_indptr), _segments(case.qo_indptr)):
        pieces += [case.kv_indices[ks:ke].long(), loc[qs:qe]]
        indptr.append(indptr[-1] + (ke - ks) + (qe - qs))
    idt = case.kv_indices.dtype
    return case.clone(layout="unified", kv_buffer=kv,
                      kv_indices=torch.cat(pieces).to(idt) if pieces else case.kv_indices.clone(),
                      kv_indptr=torch.tensor(indptr, dtype=case.kv_indptr.dtype))


def to_sglang(case: Case) -> Case:
    """every KV row from the pool  ->  prefix from the pool, draft K/V read back into k and v."""
    if case.layout == "sglang":
        return case.clone()
    prefix = case.prefix_lens.long().tolist()
    qo = case.qo_indptr.long().tolist()
    pieces, tails, indptr = [], [], [0]
    for b, (ks, ke) in enumerate(_segments(case.kv_indptr)):
        _require_cover(case, b, ke - ks, prefix[b], qo[b + 1] - qo[b])
        pieces.append(case.kv_indices[ks:ks + prefix[b]].long())
        tails.append(case.kv_indices[ks + prefix[b]:ke].long())
        indptr.append(indptr[-1] + prefix[b])
    # the draft's K/V are the rows the unified case attends to (its kv_indices' tails, as
    # request_kv reads them), not out_cache_loc's: a case whose two disagree keeps its own answer
    loc = torch.cat(tails) if tails else case.out_cache_loc.long()[:0]
    k = case.kv_buffer[loc].to(case.k.dtype)
    return case.clone(layout="sglang", k=k, v=k[..., : case.v_head_dim].clone(),
                      kv_indices=torch.cat(pieces).to(case.kv_indices.dtype),
                      kv_indptr=torch.tensor(indptr, dtype=case.kv_indptr.dtype))


def to_layout(case: Case, layout: str) -> Case:
    return to_unified(case) if layout == "unified" else to_sglang(case)


def _require_cover(case: Case, b: int, rows: int, p: int, n: int) -> None:
    """ValueError unless request b's kv_indices cover what its layout says (prefix p, q_len n)."""
    if rows != kv_indices_len(case.layout, p, n):
        raise ValueError(f"request {b}: {rows} KV rows but prefix "
                         f"{p} + q_len {n} = {p + n} columns to attend to (layout {case.layout!r}: "
                         f"kv_indices must cover {KV_INDICES_COVER[case.layout]}; covering only the prefix "
                         "is the seed's prefix-only bug); run `kdkit inspect` for the marshaling lint")


def request_kv(case: Case, b: int):
    """(K rows [prefix + q_len, 576], V rows [prefix + q_len, 512], prefix_len) of request b, as
    the kernel sees them.

    sglang: prefix from the pool through kv_indices, draft from k/v.
    unified: every row from the pool through kv_indices; the draft is the tail after prefix_lens[b].
    Raises ValueError when kv_indices do not cover what the layout says (the seed's prefix-only bug).
    """
    ks, ke = (int(x) for x in case.kv_indptr[b: b + 2])
    qs, qe = (int(x) for x in case.qo_indptr[b: b + 2])
    n = qe - qs
    p = prefix_of(case.layout, ke - ks, n) if case.layout == "sglang" else int(case.prefix_lens[b])
    _require_cover(case, b, ke - ks, p, n)  # only the unified layout can break it
    rows = case.kv_buffer[case.kv_indices[ks:ke].long(), 0]
    dv = case.v_head_dim
    if case.layout == "sglang":
        K = torch.cat([rows, case.k[qs:qe, 0].to(rows.dtype)])
        V = torch.cat([rows[:, :dv], case.v[qs:qe, 0].to(rows.dtype)])
        return K, V, p
    return rows, rows[:, :dv], p


def draft_visibility(case: Case, b: int) -> torch.Tensor:
    """[q_len, q_len] bool (on the case's device): which draft columns each draft row of request b
    sees. SGLang's semantics: the request's mask block is q_len x (prefix + q_len) from
    mask_indptr[b], its prefix columns skipped; no mask means causal (j <= i) or, if not causal, all.
    """
    qs, qe = (int(x) for x in case.qo_indptr[b: b + 2])
    n = qe - qs
    if case.custom_mask is None:
        full = torch.ones(n, n, dtype=torch.bool, device=case.q.device)
        return torch.tril(full) if case.causal else full
    p = int(case.prefix_lens[b])
    start = int(case.mask_indptr[b])
    blk = case.custom_mask[start: start + n * (p + n)]
    if blk.numel() != n * (p + n):
        raise ValueError(f"custom_mask: request {b} needs {n}x{p + n} entries from offset {start}, "
                         f"only {blk.numel()} left; run `kdkit inspect` for the marshaling lint")
    return blk.reshape(n, p + n)[:, p:].bool()


def _at(t: torch.Tensor | None, i: int):
    """t[i] as an int, or None where the array is missing or too short (a broken capture)."""
    if t is None or i < 0 or i >= t.numel():
        return None
    return int(t[i])


def request_rows(case: Case) -> list[dict]:
    """Per request: q_len, prefix, KV length, mask block, and what the layout says they should be.

    Reads the index arrays defensively: a case that loads may still have a mask_indptr or kv_indptr
    of the wrong length (the seed's bugs); those entries show as None, for lint to explain.
    """
    rows = []
    bs = case.batch_size
    for b in range(bs):
        q_len = _at(case.qo_indptr, b + 1) - _at(case.qo_indptr, b)
        prefix = _at(case.prefix_lens, b)
        ks, ke = _at(case.kv_indptr, b), _at(case.kv_indptr, b + 1)
        kv_len = None if ks is None or ke is None else ke - ks
        kv_want = kv_indices_len(case.layout, prefix, q_len)
        row = {"b": b, "q_len": q_len, "prefix": prefix, "kv_len": kv_len, "kv_expected": kv_want,
               "mask_start": None, "mask_len": None, "mask_expected": None}
        if case.custom_mask is not None:
            ms, me = _at(case.mask_indptr, b), _at(case.mask_indptr, b + 1)
            row["mask_start"] = ms
            row["mask_len"] = None if ms is None or me is None else me - ms
            row["mask_expected"] = q_len * (prefix + q_len)  # q_len x (prefix + q_len), row-major
        rows.append(row)
    return rows
