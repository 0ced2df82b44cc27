"""Synthetic cases: the shapes, trees and magnitudes of Kimi K2.6 tree-verify on one TP rank."""
from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np
import torch

from . import trees
from .case import Case, new_meta
from .constants import KV_LORA_RANK, QK_DIM, check_layout
from .layout import compact, to_unified

# Kimi K2.6: sm_scale = 192**-0.5 * mscale**2 with yarn factor 64 (mscale = 0.1*ln(64)+1)
KIMI_SM_SCALE = 192 ** -0.5 * (0.1 * math.log(64) + 1.0) ** 2  # 0.144680
KIMI_HEADS_PER_RANK = 8  # 64 heads, TP8
TREES = ("ddtree", "chain", "eagle", "diagonal", "causal")


def _per_request(x, bs: int, name: str) -> list[int]:
    vals = [int(x)] * bs if np.isscalar(x) else [int(v) for v in x]
    if len(vals) != bs:
        raise ValueError(f"{name}: {len(vals)} values for bs={bs}")
    return vals


def _tree(kind: str, n: int, rng) -> list:
    if n == 0 and kind in TREES:  # a request without draft tokens: no tree (its mask block is empty)
        return []
    if kind == "chain" or kind == "causal":
        return trees.chain(n)
    if kind == "eagle":
        return trees.eagle(n, rng=rng)
    if kind == "ddtree":
        return trees.ddtree(n - 1, rng=rng)
    if kind == "diagonal":
        return trees.diagonal(n)
    raise ValueError(f"tree {kind!r}: choose one of {TREES}")


# What make_case will take at its peak (estimated): the fp32 pool and its rows' temporary (4 B x
# 576 dims each, twice), q in fp32 and bf16, and the mask (a byte per (token, column), twice
# while it is built): 0.56 GiB at 1 x 128K, 18 GiB at 32 x 128K. The CLI refuses what passes
# SYNTH_RAM_FRACTION of this machine's memory (the OOM killer would end it without a word).
SYNTH_RAM_FRACTION = 0.8


def memory_limit_bytes() -> int:
    """SYNTH_RAM_FRACTION of the machine's physical memory (8 GiB where it cannot be read)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        total = 10 << 30
    return int(SYNTH_RAM_FRACTION * total)


def peak_bytes(prefixes: Sequence[int], q_lens: Sequence[int], heads: int) -> int:
    T = sum(q_lens)
    rows = 1 + sum(prefixes) + T
    return (2 * 4 * QK_DIM * rows + 6 * QK_DIM * T * heads
            + 2 * sum(q * (p + q) for p, q in zip(prefixes, q_lens)))


def synth_id(tree: str, bs: int, prefixes, q_lens, heads: int, seed: int, layout: str = "sglang",
             sm_scale: float = KIMI_SM_SCALE, logit_cap: float = 0.0, magnitude: float = 1.0) -> str:
    """A synthetic case's default id: its shape and seed, then whatever else changes its numbers
    (layout, scale, cap, magnitude), each only when not the default: two cases that differ there
    got one id, and the default ids stay what they were."""
    parts = [f"synth-{tree}-bs{bs}-p{max(prefixes)}-q{max(q_lens)}-h{heads}-s{seed}"]
    if layout != "sglang":
        parts.append(layout)
    if sm_scale != KIMI_SM_SCALE:
        parts.append(f"scale{sm_scale:g}")
    if logit_cap:
        parts.append(f"cap{logit_cap:g}")
    if magnitude != 1.0:
        parts.append(f"mag{magnitude:g}")
    return "-".join(parts)


def make_case(bs: int = 1, prefix: int | Sequence[int] = 21, q_len: int | Sequence[int] = 9,
              heads: int = KIMI_HEADS_PER_RANK, tree: str = "ddtree", seed: int = 0,
              layout: str = "sglang", sm_scale: float = KIMI_SM_SCALE, logit_cap: float = 0.0,
              magnitude: float = 1.0, index_dtype=torch.int32, mask_dtype=torch.bool,
              shuffle_slots: bool = True, poison_unused: bool = True, spare_rows: int = 16,
              keep_pool: bool = False, case_id: str | None = None, note: str = "") -> Case:
    """A case as SGLang would have captured it in TARGET_VERIFY, compacted.

    magnitude scales q: 1.0 gives logits with a spread of a few units (realistic); 8-30 gives the
    large-magnitude logits that stress the online softmax. `tree="causal"` uses no custom mask.
    keep_pool keeps the whole (shuffled, NaN-poisoned) pool instead of compacting it.
    """
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    prefixes, q_lens = _per_request(prefix, bs, "prefix"), _per_request(q_len, bs, "q_len")
    check_layout(layout)
    T, H, Dl, D = sum(q_lens), heads, KV_LORA_RANK, QK_DIM

    # realistic magnitudes: latent ~ unit RMS after the kv_a layernorm with a few hot channels,
    # rope part of similar size; q_nope absorbed through W_UK is larger and spikier.
    def kv_rows(n):
        x = torch.randn(n, 1, D, generator=gen) * 0.6
        hot = torch.randint(0, Dl, (4,), generator=gen)
        x[..., hot] *= 6.0
        return x

    q = torch.randn(T, H, D, generator=gen) * 0.5 * magnitude
    q[..., torch.randint(0, Dl, (8,), generator=gen)] *= 4.0
    k = kv_rows(T)
    n_pool = 1 + sum(prefixes) + T + spare_rows
    pool = torch.full((n_pool, 1, D), float("nan") if poison_unused else 0.0)
    slots = (rng.permutation(n_pool - 1) + 1) if shuffle_slots else np.arange(1, n_pool)
    slots = torch.from_numpy(slots.astype(np.int64))
    prefix_slots = slots[: sum(prefixes)]
    out_cache_loc = slots[sum(prefixes): sum(prefixes) + T]
    pool[prefix_slots] = kv_rows(len(prefix_slots))
    pool[out_cache_loc] = k  # forward_extend writes the draft K into the pool before attention

    q, k, pool = q.bfloat16(), k.bfloat16(), pool.bfloat16()
    v = k[..., :Dl].clone()
    kv_indptr = torch.tensor(np.concatenate([[0], np.cumsum(prefixes)]), dtype=index_dtype)
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=index_dtype)
    mask = mask_indptr = None
    if tree != "causal":
        blocks = [trees.tree_block(_tree(tree, n, rng)) for n in q_lens]
        mask, mask_indptr = trees.build_mask(prefixes, blocks, mask_dtype)
        mask_indptr = mask_indptr.to(index_dtype)
    elif tree not in TREES:
        raise ValueError(f"tree {tree!r}: choose one of {TREES}")

    kv_indices = prefix_slots.to(index_dtype)
    if keep_pool:
        kv_buffer, slot_ids = pool, torch.arange(n_pool)
    else:
        kv_buffer, kv_indices, out_cache_loc, slot_ids = compact(pool, kv_indices, out_cache_loc)
    case_id = case_id or synth_id(tree, bs, prefixes, q_lens, H, seed, layout, sm_scale, logit_cap, magnitude)
    meta = new_meta("synthetic", case_id=case_id, model="Kimi-K2.6 shapes (synthetic)",
                    layer_id=None, tp_rank=0, step=0, forward_mode="TARGET_VERIFY",
                    note=note or f"synthetic {tree} tree, seed {seed}, magnitude {magnitude}")
    case = Case(meta=meta, num_heads=H, sm_scale=float(sm_scale), logit_cap=float(logit_cap),
                causal=True, layout="sglang", q=q, k=k, v=v, kv_buffer=kv_buffer,
                kv_indptr=kv_indptr, kv_indices=kv_indices.to(index_dtype), qo_indptr=qo_indptr,
                out_cache_loc=out_cache_loc.to(index_dtype),
                prefix_lens=torch.tensor(prefixes, dtype=torch.int64), slot_ids=slot_ids,
                custom_mask=mask, mask_indptr=mask_indptr)
    return to_unified(case) if layout == "unified" else case


def random_case(seed: int, work_budget: float = 4e6) -> Case:
    """One case of the seeded stress sweep: bs 1..64, prefix 0..128K, q_len 1..1025,
    H in {1, 8, 16, 64, 128}, chains/trees/causal, both layouts, int32/int64 indices, bool/uint8
    masks, NaN-poisoned unused slots, shuffled slots, sometimes large-magnitude logits or a cap.

    Sizes are drawn, then shrunk until sum(rows x kv_len) <= work_budget so that the float64 oracle
    stays around a second per case."""
    rng = np.random.default_rng(10_000 + seed)
    H = int(rng.choice([1, 8, 16, 64, 128]))
    bs = int(rng.choice([1, 1, 2, 3, 4, 8, 16, 64]))
    ql_choices = [1, 2, 5, 9, 17, 33, 65, 129, 257, 1025]
    q_lens = [int(rng.choice(ql_choices)) for _ in range(bs)] if rng.random() < 0.5 else [int(rng.choice(ql_choices))] * bs
    prefixes = [int(rng.choice([0, 1, 7, 21, 100, 1000, 4096, 8192, 32768, 131072])) for _ in range(bs)]

    def work():
        return sum(q * H * (p + q) for q, p in zip(q_lens, prefixes))

    while work() > work_budget:
        b = int(np.argmax([q * H * (p + q) for q, p in zip(q_lens, prefixes)]))
        if prefixes[b] > 4 * q_lens[b] or q_lens[b] == 1:
            prefixes[b] //= 2
        else:
            q_lens[b] = max(1, q_lens[b] // 2 + (1 if q_lens[b] > 2 else 0))
    tree = str(rng.choice(["ddtree", "chain", "eagle", "causal", "ddtree"]))
    if max(q_lens) < 2 and tree == "ddtree":
        tree = "chain"
    return make_case(bs=bs, prefix=prefixes, q_len=q_lens, heads=H, tree=tree, seed=seed,
                     layout=str(rng.choice(["sglang", "unified"])),
                     magnitude=float(rng.choice([1.0, 1.0, 1.0, 8.0, 30.0])),
                     logit_cap=float(rng.choice([0.0, 0.0, 0.0, 30.0])),
                     index_dtype=rng.choice([torch.int32, torch.int64]),
                     mask_dtype=rng.choice([torch.bool, torch.uint8]),
                     spare_rows=int(rng.integers(0, 64)), case_id=f"sweep-{seed}")
