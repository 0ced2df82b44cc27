"""Backends as a user writes them, named by file spec (tests/sglang_env/user_kernels.py:right):
the registry's tests and the plugin's. Their base is kdkit's own torch reference (they run on a
CPU); `fault` plants what a user's kernel gets wrong, and the plugin tests switch it per step.

  right, wrong   run(case) only: kdkit's torch reference; wrong scales the output by 1.5
  paired         run(case) and the live pair plan(batch) / launch(...): attention in plain torch
                 on SGLang's tensors, all on the device (no host read: it can be captured in a
                 CUDA graph), fp32 math, output in the server's dtype
"""
from __future__ import annotations

import torch

from kdkit.backends import Result, torch_ref

FAULTS = (None, "scale", "raise", "shape", "nan", "dtype", "device", "unwritten")


def _planted(out: torch.Tensor, fault: str | None) -> torch.Tensor:
    if fault == "scale":
        return out * 1.5
    if fault == "raise":
        raise RuntimeError("injected fault in the user's kernel")
    if fault == "shape":
        return out[:, :, :256]
    if fault == "nan":
        out = out.clone()
        out[0, 0, 0] = float("nan")
        return out
    if fault == "dtype":
        return out.to(torch.int32)
    if fault == "device":
        return torch.empty(out.shape, dtype=out.dtype, device="meta")
    return out


class Backend:
    """kdkit's torch reference under the user's name, with `fault` planted."""

    def __init__(self, name: str, fault: str | None = None):
        self.NAME, self.fault = name, fault

    def unavailable(self, case=None):
        return None

    def run(self, case, *, nsplit: int | None = None) -> Result:
        res = torch_ref.run(case, nsplit=nsplit)
        out = _planted(res.out, self.fault)
        return Result(out, res.lse if self.fault is None else None,
                      {"ran": f"user kernel {self.NAME}: kdkit's torch reference"
                              + (f", fault {self.fault}" if self.fault else "")})


class Paired(Backend):
    """Backend, plus the live pair replace needs."""

    def plan(self, batch):
        return batch  # nothing to size: the launch reads the metadata tensors as they are at launch

    def launch(self, plan, q, k, v, kv_buffer, out):
        if self.fault == "unwritten":
            return
        res = _planted(_attention(plan, q, k, kv_buffer), self.fault)
        out.copy_(res)  # (a shape or device that does not fit raises here)

    def unsupported(self, batch):
        return None if batch.num_heads <= 128 else f"{batch.num_heads} heads; this kernel takes up to 128"


def _attention(b, q, k, kv_buffer) -> torch.Tensor:
    """Attention of every draft token over its request's prefix (through kv_indices) and draft
    (k, where the tree mask allows): [T, H, 512] fp32, every index computed on the device."""
    T, L = q.shape[0], b.max_kv_len
    dev = q.device
    t = torch.arange(T, device=dev)
    qo, kvp = b.qo_indptr.long(), b.kv_indptr.long()
    r = torch.searchsorted(qo[1:], t, right=True)                 # each token's request
    i = t - qo[r]                                                 # its row in the request
    n, p = qo[r + 1] - qo[r], kvp[r + 1] - kvp[r]                 # the request's q_len and prefix
    j = torch.arange(L, device=dev)[None, :]                      # a column of the request's KV
    in_prefix, in_draft = j < p[:, None], (j >= p[:, None]) & (j < (p + n)[:, None])
    slot = b.kv_indices.long()[(kvp[r][:, None] + j).clamp(max=b.kv_indices.numel() - 1)]
    draft_row = (qo[r][:, None] + j - p[:, None]).clamp(0, T - 1)
    K = torch.where(in_prefix[..., None], kv_buffer[slot, 0].float(), k[draft_row, 0].float())  # [T, L, 576]
    if b.custom_mask is not None:
        at = b.mask_indptr.long()[r][:, None] + i[:, None] * (p + n)[:, None] + j
        seen = b.custom_mask.reshape(-1)[at.clamp(max=b.custom_mask.numel() - 1)].bool()
    else:
        seen = (j - p[:, None] <= i[:, None]) if b.causal else torch.ones_like(in_draft)
    visible = in_prefix | (in_draft & seen)
    s = torch.einsum("thd,tld->thl", q.float(), K) * b.sm_scale
    if b.logit_cap > 0:
        s = b.logit_cap * torch.tanh(s / b.logit_cap)
    s = s.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.einsum("thl,tld->thd", torch.softmax(s, dim=-1), K[..., :512])


right = Backend("right")
wrong = Backend("wrong", "scale")
paired = Paired("paired")
