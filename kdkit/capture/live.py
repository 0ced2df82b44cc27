"""The backend KDKIT_KERNEL names, in the server: resolved and checked once per process at plugin
start, then run beside SGLang's Triton kernel (validate) or instead of it (replace).

KDKIT_KERNEL takes what --backends takes (kdkit.backends.registry): cuda, torch, an installed
backend (entry point kdkit.backends), package.module:attr or path/to/file.py[:attr] (give the
server an absolute path: its workers resolve it from their working directory).

  validate  with the live pair (below) the pair runs on the server's own tensors, into a buffer of
            the output's shape filled with NaN (a kernel that writes nothing is caught); without it
            the backend's run(case) runs on the case built from the call (a host sync per call:
            validate is a debugging mode). Whatever the kernel does, the server gets Triton's
            output; a kernel that raises, or returns the wrong shape, dtype or device, or NaN/inf
            where Triton's output is finite, is a fault: said once per kind, and the case written.
  replace   needs the pair: launch writes the server's output in place, eagerly and inside
            SGLang's CUDA graphs; if it raises, Triton serves the call.

The live pair, optional in the backend contract (kdkit's own kernel has its equivalent,
kdkit.capture.kernels.CudaKernel):
  plan(batch: kdkit.backends.LiveBatch) -> plan
        Host only: reads no device value and syncs nothing (it runs inside CUDA-graph capture,
        where the metadata tensors are the graph's persistent buffers, refilled before each
        replay). It may allocate what its launches need (workspace). kdkit calls it once per
        batch of metadata (keyed by the tensors' addresses and the sizes below) and keeps the plan
        as long as a graph captured with it may replay (for the process), eager ones for the last
        EAGER_PLANS batches.
  launch(plan, q, k, v, kv_buffer, out) -> None
        Launches only, on the stream in use: writes out [T, H, 512] in place; no host sync, no
        device read back, nothing kept that the next call allocates anew. q [T, H, 576],
        k [T, 1, 576] and v [T, 1, 512] are this step's draft tokens; kv_buffer [N, 1, 576] the
        layer's pool (its first 512 dims are V).
  unsupported(batch) -> str | None   (optional)
        Why the kernel cannot serve this batch (sizes, dtypes: host only), None if it can;
        Triton serves what it refuses, said once per reason.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch

from ..backends import LiveBatch
from . import kernels, record

EAGER_PLANS = kernels.EAGER_PLANS


class LiveError(ValueError):
    """KDKIT_KERNEL cannot serve this mode here: one line (the plugin stops start-up with it)."""


def batch_of(kc: record.KernelCall, max_kv_len: int, capturing: bool) -> LiveBatch:
    """The call's metadata as the live pair's plan() gets it (host ints only: nothing read back)."""
    return LiveBatch(kc.qo_indptr, kc.kv_indptr, kc.kv_indices, kc.custom_mask, kc.mask_indptr,
                     batch_size=kc.bs, num_tokens=int(kc.q.shape[0]), num_heads=kc.num_heads,
                     max_q_len=kc.max_len_extend, max_kv_len=int(max_kv_len), sm_scale=kc.sm_scale,
                     logit_cap=kc.logit_cap, causal=kc.causal, dtype=kc.q.dtype, device=kc.q.device,
                     capturing=capturing)


class Pair:
    """A backend's plan/launch pair in the server, with its plans kept (see the module doc)."""

    def __init__(self, backend):
        self.backend = backend
        self._plans: OrderedDict = OrderedDict()  # key -> plan, least recently used first
        self._captured: set = set()               # keys of plans a graph captured: never dropped

    def _plan(self, kc: record.KernelCall, batch: LiveBatch):
        key = kernels.CudaKernel._key(kc) + (batch.max_kv_len,)  # (a plan may size a workspace by it)
        p = self._plans.get(key)
        if p is None:
            p = self._plans[key] = self.backend.plan(batch)
        self._plans.move_to_end(key)
        if batch.capturing:  # a graph now points into it: kept as long as the graph
            self._captured.add(key)
        eager = [k for k in self._plans if k not in self._captured]
        for k in eager[: max(0, len(eager) - EAGER_PLANS)]:
            del self._plans[k]
        return p

    def run(self, kc: record.KernelCall, max_kv_len: int, capturing: bool, out=None) -> torch.Tensor:
        """The kernel's output [T, H, 512] for this call, into `out` when given. Launches only."""
        batch = batch_of(kc, max_kv_len, capturing)
        refuse = getattr(self.backend, "unsupported", None)
        why = refuse(batch) if refuse is not None else None
        if why:
            raise record.Unsupported(f"{self.backend.NAME}: {why}")
        if out is None:
            out = torch.empty(kc.o.shape, dtype=kc.o.dtype, device=kc.o.device)
        self.backend.launch(self._plan(kc, batch), kc.q, kc.k, kc.v, kc.k_buffer, out)
        return out


class Live:
    """The resolved KDKIT_KERNEL: its registered name, the backend, and its live pair (None: the
    backend runs through run(case) only, in validate)."""

    def __init__(self, spec: str, mode: str, name: str, backend, pair):
        self.spec, self.mode, self.name, self.backend, self.pair = spec, mode, name, backend, pair


def load(spec: str, mode: str) -> Live:
    """KDKIT_KERNEL resolved for `mode` and checked before anything launches: the contract, the
    pair replace needs, and that it can run in this process. LiveError in one line if not."""
    from .. import backends
    from ..backends import registry
    try:
        name = registry.load(spec)
        backend = backends.get(name)
    except registry.BackendSpecError as e:
        raise LiveError(f"KDKIT_KERNEL={spec!r}: {e}") from None
    if name == "cuda":
        why = kernels.cuda_unavailable()
        if why:
            extra = " (KDKIT_KERNEL=torch validates with kdkit's PyTorch reference instead)" if mode == "validate" else ""
            raise LiveError(f"KDKIT_MODE={mode} needs kdkit's CUDA kernel: {why}{extra}")
        return Live(spec, mode, name, backend, kernels.CudaKernel())
    pair = Pair(backend) if registry.has_live_pair(backend) else None
    if mode == "replace" and pair is None:
        raise LiveError(f"KDKIT_KERNEL={spec!r}: replace needs a kernel with plan(batch) and launch(plan, q, k, "
                        f"v, kv_buffer, out), the pair CUDA graphs replay; {name} has run(case) only "
                        "(validate runs it)")
    why = backends.unavailable(name)
    if why:
        raise LiveError(f"KDKIT_MODE={mode} needs KDKIT_KERNEL={spec}: {why}")
    return Live(spec, mode, name, backend, pair)


def fault_in(out, ref: torch.Tensor) -> tuple[str, str] | None:
    """(kind, what) if the kernel's output `out` cannot stand beside the real one `ref` [T, H, 512]:
    not a tensor, another shape, not a float dtype, on a device that is neither the server's nor
    the host, or NaN/inf where the real output is finite. None if it can be compared."""
    if not isinstance(out, torch.Tensor):
        return "wrong type", f"returned {type(out).__name__}, not a tensor [T, H, 512]"
    if tuple(out.shape) != tuple(ref.shape):
        return "wrong shape", f"returned out of shape {tuple(out.shape)}, the call's is {tuple(ref.shape)}"
    if not out.is_floating_point():
        return "wrong dtype", f"returned out of dtype {out.dtype}, want a float dtype (the server's is {ref.dtype})"
    if out.device not in (ref.device, torch.device("cpu")):
        return "wrong device", f"returned out on {out.device}, want {ref.device} (the server's) or cpu"
    bad = ~torch.isfinite(out.to(ref.device)) & torch.isfinite(ref)
    if bool(bad.any()):  # (one device read: validate reads its metrics back anyway)
        n = int(bad.sum())
        return "non-finite", (f"returned NaN/inf in {n} of {math.prod(ref.shape)} outputs where Triton's "
                              "are finite")
    return None
