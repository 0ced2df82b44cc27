"""A case as the live pair's batch (kdkit.backends.LiveBatch), so that the adapters' run(case) and
prepare(case) plan through the same plan(batch) the server calls (kdkit.capture.live): one plan,
whichever path asks for it.

Live batches are SGLang's layout only (kv_indices cover each request's prefix; the draft's K/V come
from k and v), so a unified case is converted to it first (kdkit.layout.to_sglang, on the host).
"""
from __future__ import annotations

import torch

from ..backends import LiveBatch
from ..layout import to_sglang

def sglang_case(case):
    """`case` in the layout a live batch has (a unified case converted; a sglang one as it is)."""
    return to_sglang(case) if case.layout == "unified" else case


def case_batch(case, x: dict) -> LiveBatch:
    """The LiveBatch of `case` (sglang layout) over its metadata tensors `x` (on the run device):
    the host ints are read off the case's own host copy, exactly (a server gives bounds)."""
    qo = case.qo_indptr.detach().long().cpu()
    kv = case.kv_indptr.detach().long().cpu()
    q_lens, prefix = qo.diff(), kv.diff()
    return LiveBatch(x["qo_indptr"], x["kv_indptr"], x["kv_indices"], x["custom_mask"], x["mask_indptr"],
                     batch_size=int(q_lens.numel()), num_tokens=int(qo[-1]), num_heads=int(case.num_heads),
                     max_q_len=int(q_lens.max()) if q_lens.numel() else 0,
                     max_kv_len=int((prefix + q_lens).max()) if q_lens.numel() else 0,
                     sm_scale=float(case.sm_scale), logit_cap=float(case.logit_cap), causal=bool(case.causal),
                     dtype=x["q"].dtype, device=x["q"].device, capturing=False)


def as_uint8(mask: torch.Tensor | None) -> torch.Tensor | None:
    """A bool tree mask as the uint8 bytes a kernel reads (a view: same memory, nothing launched)."""
    return mask.view(torch.uint8) if mask is not None and mask.dtype == torch.bool else mask
