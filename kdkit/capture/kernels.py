"""What validate and replace run beside (or instead of) SGLang's Triton kernel.

cuda: kdkit's kernel (kdkit.kernel): `plan` once per batch, `run` per layer, straight on the
      server's tensors. The plan is made with check=False and host-side sizes only (T, the
      metadata's max_extend_len, a KV-length bound), so planning reads nothing from the device and
      works inside CUDA-graph capture, where the metadata tensors are the graph's persistent
      buffers: their addresses (and so the plan) stay valid for every replay. Plans used during
      capture (made there, or made eagerly by a warm-up and reused) are kept for the life of the
      process (the graphs point into their workspace); eager plans for the last few batches only.
torch: kdkit's eager PyTorch reference on the case built from the call (validate only: it reads
      sizes back from the device).
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from . import record

EAGER_PLANS = 4  # eager batches whose plans are kept (the current one and a few before it)


def cuda_unavailable() -> str | None:
    """Why kdkit's CUDA kernel cannot run in this process (None: it can)."""
    try:
        from .. import kernel
    except ImportError as e:
        return f"kdkit.kernel cannot be imported ({e})"
    return kernel.unavailable()


class CudaKernel:
    def __init__(self):
        from .. import kernel
        self.kernel = kernel
        self._eager: OrderedDict = OrderedDict()
        self._captured: dict = {}

    @staticmethod
    def _key(call: record.KernelCall) -> tuple:
        ptr = lambda t: None if t is None else (t.data_ptr(), t.numel(), t.dtype)  # noqa: E731
        return (ptr(call.qo_indptr), ptr(call.kv_indptr), ptr(call.kv_indices), ptr(call.custom_mask),
                ptr(call.mask_indptr), int(call.q.shape[0]), call.num_heads, call.sm_scale, call.logit_cap,
                call.causal, call.max_len_extend, call.q.device)

    def plan(self, call: record.KernelCall, max_kv_len: int, capturing: bool):
        from ..kernel.options import PlanOptions
        key = self._key(call)
        p = self._captured.get(key)
        if p is not None:
            return p
        p = self._eager.get(key)
        if p is not None:
            if capturing:  # a graph now points into its workspace: keep it as long as the graph
                del self._eager[key]
                self._captured[key] = p
            else:
                self._eager.move_to_end(key)  # the current batch's plan is the last to go
            return p
        p = self.kernel.plan(
            qo_indptr=call.qo_indptr, kv_indptr=call.kv_indptr, kv_indices=call.kv_indices,
            custom_mask=call.custom_mask, mask_indptr=call.mask_indptr, num_heads=call.num_heads,
            sm_scale=call.sm_scale, logit_cap=call.logit_cap, causal=call.causal, layout="sglang",
            dtype=call.q.dtype,
            options=PlanOptions(check=False, num_tokens=int(call.q.shape[0]), max_q_len=int(call.max_len_extend),
                                max_kv_len=int(max_kv_len)))
        if capturing:
            self._captured[key] = p
        else:
            self._eager[key] = p
            while len(self._eager) > EAGER_PLANS:
                self._eager.popitem(last=False)
        return p

    def run(self, call: record.KernelCall, max_kv_len: int, capturing: bool, out=None):
        """kdkit's output [T, H, 512] for this call (into `out` when given). Launches only."""
        if call.q.dtype != torch.bfloat16 or call.k_buffer.dtype != torch.bfloat16:
            raise record.Unsupported(f"kdkit's kernel takes bf16, this model runs {call.q.dtype}")
        v_view = call.k_buffer[..., : record.MLA_V]
        if call.v_buffer.data_ptr() != v_view.data_ptr() or call.v_buffer.stride() != v_view.stride():
            raise record.Unsupported("v_buffer is not the latent view of k_buffer: not MLATokenToKVPool")
        p = self.plan(call, max_kv_len, capturing)
        o, _ = self.kernel.run(p, call.q, call.k, call.v, call.k_buffer, out=out)
        return o


def torch_reference(case) -> torch.Tensor:
    """kdkit's eager PyTorch reference output of a case, on the device of its tensors."""
    from ..backends import torch_ref
    return torch_ref.run(case).out
