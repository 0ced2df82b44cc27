"""kdkit's CUDA kernel as a backend: a case in, the kernel's output out (kdkit.kernel does the work).

prepare() plans once and puts the case on the device once; its launch is kernel.run on those
buffers (graph-capturable: no sync, allocation or device read), which the bench times. run() is
prepare, one launch, and the result."""
from __future__ import annotations

from dataclasses import replace

import torch

from .. import kernel
from ..kernel import PlanOptions
from . import Prepared, Result

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


def problem(case, x: dict) -> dict:
    """plan()'s problem keywords for a case whose tensors `x` are on the device."""
    return dict(qo_indptr=x["qo_indptr"], kv_indptr=x["kv_indptr"], kv_indices=x["kv_indices"],
                prefix_lens=x["prefix_lens"], custom_mask=x["custom_mask"], mask_indptr=x["mask_indptr"],
                num_heads=case.num_heads, sm_scale=case.sm_scale, logit_cap=case.logit_cap, causal=case.causal,
                layout=case.layout, dtype=case.q.dtype)


def case_options(case, options: PlanOptions = PlanOptions()) -> PlanOptions:
    """A one-off run knows its requests, so the grid is sized for the longest (max_q_len) rather
    than for all T tokens, unless the options say otherwise."""
    return options if options.max_q_len is not None else replace(options, max_q_len=max(case.q_lens))


def plan_case(case, x: dict, options: PlanOptions = PlanOptions()) -> kernel.Plan:
    """A plan for a case's batch (its tensors `x` on the device)."""
    return kernel.plan(**problem(case, x), options=case_options(case, options))


def prepare(case, *, nsplit: int | None = None, mutant: str | None = None, nt: int | None = None,
            nh: int | None = None, skip: bool | str | None = None, device: str = "cuda",
            knockout: str | None = None, fused: bool | str | None = None) -> Prepared:
    """The case on the device and its plan, made once; launch = kernel.run on them. knockout: a
    timing-only build with one part switched off (kdkit/kernel/knockouts.py), wrong by design; its
    label says so, as a mutant's does. fused: the split blocks merge in place, one launch ("wait" or
    "last", the way: PlanOptions; None: the plan's choice)."""
    opts = PlanOptions(nsplit=nsplit, mutant=mutant, nt=nt, nh=nh, skip=skip, knockout=knockout, fused=fused)
    x = to_device(case, device)
    p = plan_case(case, x, opts)
    q, k, v, pool = x["q"], x["k"], x["v"], x["kv_buffer"]
    info = {"device": torch.cuda.get_device_name(p.device), **p.info}
    wrong = opts.wrong_by_design
    info["ran"] = (f"{info['device']}, nsplit {p.nsplit}{f' (merge fused, {p.fused})' if p.fused else ''}, grid {p.grid}, {p.key}"
                   + (f", {wrong}" if wrong else ""))

    def launch() -> None:
        kernel.run(p, q, k, v, pool)

    def result() -> Result:
        torch.cuda.synchronize(p.device)
        return Result(p.out.clone(), p.lse.clone(), dict(info))

    return Prepared(launch, result, graph_safe=True, info=info, plan=lambda: plan_case(case, x, opts))


def run(case, *, nsplit: int | None = None, mutant: str | None = None, nt: int | None = None,
        nh: int | None = None, skip: bool | str | None = None, device: str = "cuda",
        knockout: str | None = None, fused: bool | str | None = None) -> Result:
    prepared = prepare(case, nsplit=nsplit, mutant=mutant, nt=nt, nh=nh, skip=skip, device=device,
                       knockout=knockout, fused=fused)
    prepared.launch()
    return prepared.result()
