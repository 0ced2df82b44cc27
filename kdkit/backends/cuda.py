"""kdkit's CUDA kernel as a backend: a case in, the kernel's output out (kdkit.kernel does the work)."""
from __future__ import annotations

import torch

from .. import kernel
from . import Result

NAME = "cuda"
LABEL = "kdkit CUDA kernel"
LINT_CLEAN = True  # replay does not launch it on a case with lint errors (the lint names the bug)


def unavailable(case=None):
    why = kernel.unavailable()
    if why:
        return f"cuda: {why}"
    if case is not None and case.q.dtype != torch.bfloat16:
        return f"cuda: the kernel takes bf16 q/k/v/pool, this case is {case.q.dtype}"
    return None


def to_device(case, device="cuda") -> dict:
    """The case's tensors on the GPU, named as plan()/run() take them."""
    dev = torch.device(device)
    to = lambda t: None if t is None else t.to(dev, non_blocking=True)  # noqa: E731
    return {name: to(getattr(case, name)) for name in
            ("q", "k", "v", "kv_buffer", "qo_indptr", "kv_indptr", "kv_indices", "prefix_lens",
             "custom_mask", "mask_indptr")}


def plan_case(case, x: dict, **opts) -> kernel.Plan:
    """A plan for a case's batch; a one-off run knows its requests, so the grid is sized for the
    longest (max_q_len) rather than for all T tokens."""
    opts.setdefault("max_q_len", max(case.q_lens))
    return kernel.plan(qo_indptr=x["qo_indptr"], kv_indptr=x["kv_indptr"], kv_indices=x["kv_indices"],
                       prefix_lens=x["prefix_lens"], custom_mask=x["custom_mask"],
                       mask_indptr=x["mask_indptr"], num_heads=case.num_heads, sm_scale=case.sm_scale,
                       logit_cap=case.logit_cap, causal=case.causal, layout=case.layout, **opts)


def run(case, nsplit: int | None = None, mutant: str | None = None, nt: int | None = None,
        nh: int | None = None, skip: bool | str | None = None, device: str = "cuda",
        knockout: str | None = None) -> Result:
    """knockout: a timing-only build with one part switched off (kdkit/kernel/knockouts.py), wrong
    by design; its label says so."""
    x = to_device(case, device)
    p = plan_case(case, x, nsplit=nsplit, mutant=mutant, nt=nt, nh=nh, skip=skip, knockout=knockout)
    out, lse = kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])
    torch.cuda.synchronize()
    info = {"device": torch.cuda.get_device_name(), **p.info}
    info["ran"] = (f"{info['device']}, nsplit {p.nsplit}, grid {p.grid}, {p.key}"
                   + (f", MUTANT {mutant}" if mutant else "") + (f", KNOCKOUT {knockout}" if knockout else ""))
    return Result(out.clone(), lse.clone(), info)
