"""The shapes of an MLA tree-verify call and the one rule for how long a request's KV is.

Everything that checks, builds or explains a case imports these (case, lint, layout, synth,
oracle, the torch backend, the report, the kernel's host code) instead of writing 576 or the
layout rule again.

DeepSeek / Kimi MLA with the weights absorbed, as SGLang's Triton backend sees it: q and k rows are
576 wide (the 512-dim latent first, then the 64-dim rope part); v is the latent itself, 512 wide.
"""
from __future__ import annotations

import torch

KV_LORA_RANK = 512                          # the latent: K's first 512 dims, and all of V
QK_ROPE_HEAD_DIM = 64                       # the rope part of q and k, after the latent
QK_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM    # 576: the width of q, k and a KV-pool row
V_HEAD_DIM = KV_LORA_RANK                   # 512: V is read from the latent (MLA)

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # q, k, v, the pool
INDEX_DTYPES = (torch.int32, torch.int64)                      # indptrs, indices, lengths
MASK_DTYPES = (torch.bool, torch.uint8)    # bool in eager mode, uint8 in SGLang's CUDA-graph buffer

# Where a request's KV rows come from:
#   sglang   kv_indices cover the committed prefix only (TARGET_VERIFY's metadata); the draft
#            tokens' K/V come from the k and v arguments (what SGLang's Triton kernel reads).
#   unified  kv_indices cover prefix + the draft slots (out_cache_loc), all read from the pool
#            (what the seed's kernel did).
LAYOUTS = ("sglang", "unified")
KV_INDICES_COVER = {"sglang": "prefix", "unified": "prefix+q_len"}  # the rule in words, for messages


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: choose one of {LAYOUTS}")
    return layout


def kv_indices_len(layout: str, prefix, q_len):
    """How many kv_indices entries a request has in `layout`: prefix (sglang) or prefix + q_len
    (unified). Works on ints and elementwise on tensors and arrays."""
    return prefix if check_layout(layout) == "sglang" else prefix + q_len


def prefix_of(layout: str, kv_indices_len, q_len):
    """The committed prefix implied by a request's kv_indices length (the inverse of the above)."""
    return kv_indices_len if check_layout(layout) == "sglang" else kv_indices_len - q_len


__all__ = ["KV_LORA_RANK", "QK_ROPE_HEAD_DIM", "QK_DIM", "V_HEAD_DIM", "FLOAT_DTYPES",
           "INDEX_DTYPES", "MASK_DTYPES", "LAYOUTS", "KV_INDICES_COVER", "check_layout",
           "kv_indices_len", "prefix_of"]
