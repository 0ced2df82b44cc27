"""The warp-specialized step probe (ws_step.cu) against kdkit's kernel, on one GPU:

    python -m kdkit.perf.probes.ws_step [--check-only | --variants | --profile] [--define NAME=VALUE] [--out FILE]

It builds only kernels it generates its own inputs for (the unified layout, every column visible);
it is a measurement of a design, not a backend: nothing in kdkit calls it. benchmarks/LOG.md has
what it measured.

1. Its build for sm_90 and sm_120: registers, spills, shared memory (sm_120's limits hold?).
2. Correctness: its split partials (normalised fp32 rows and their LSE) against a float64 torch
   reference on ragged requests (KV lengths off the 16-row step, an empty split, H 8 and 16).
3. Timing (kdkit.perf.timing.Timer: L2 flushed before each call, CUDA events, median): the probe's
   partial kernel and kdkit's kernel (partial + merge) on the same inputs (unified layout, every
   column visible, 40-row blocks, the same split count), at several prefixes per batch size. The
   time per KV step of each is the slope of the line through those points, so the fixed work
   (launch, prologue, the merge that the probe lacks) drops out; one "step" here is 32 KV rows
   of a block, mla_tc.cu's step.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

from ... import kernel
from ...constants import QK_DIM as D, V_HEAD_DIM as DL
from ...kernel import jit
from ...kernel.launch import cupy_stream
from ..timing import Timer

PROBE = Path(__file__).with_name("ws_step.cu")
ROWS = 40  # query rows per block of the probe (and of the kdkit build it is timed against)


def build(arch: str, defines: dict | None = None):
    defines = dict(defines or {})
    return jit.build(PROBE, defines, arch, tags={"probe": "ws", **defines})


def make_inputs(kv_lens, q_len, H, seed, dev):
    g = torch.Generator().manual_seed(seed)
    bs, total = len(kv_lens), sum(kv_lens)
    spare = 64
    pool = torch.randn(total + spare, 1, D, generator=g).to(torch.bfloat16)
    slots = torch.randperm(total + spare, generator=g)[:total].to(torch.int32)  # scattered, as SGLang's pool
    kv_indptr = torch.tensor([0] + list(np.cumsum(kv_lens)), dtype=torch.int32)
    qo_indptr = torch.arange(bs + 1, dtype=torch.int32) * q_len
    q = torch.randn(bs * q_len, H, D, generator=g).to(torch.bfloat16)
    x = {"pool": pool, "kv_indices": slots, "kv_indptr": kv_indptr, "qo_indptr": qo_indptr, "q": q}
    x = {k: v.to(dev) for k, v in x.items()}
    x.update(kv_lens=list(kv_lens), q_len=q_len, H=H, sm_scale=1.0 / math.sqrt(192.0))
    return x


class Probe:
    def __init__(self, dev, defines: dict | None = None):
        self.mod = build(jit.device_arch(), defines)
        self.fn = jit.load(self.mod).get_function("ws_partial")
        self.smem = self.mod.meta()["smem_bytes"]
        self.fn.max_dynamic_shared_size_bytes = self.smem

    def launcher(self, x, nsplit):
        bs, H, q_len = len(x["kv_lens"]), x["H"], x["q_len"]
        total_rows = bs * q_len * H
        o_part = torch.empty(nsplit, total_rows, DL, dtype=torch.float32, device=x["q"].device)
        lse_part = torch.empty(nsplit, total_rows, dtype=torch.float32, device=x["q"].device)
        q = x["q"]
        args = (np.uint64(q.data_ptr()), np.int64(q.stride(0)), np.int64(q.stride(1)),
                np.uint64(x["pool"].data_ptr()), np.int64(x["pool"].stride(0)),
                np.uint64(x["qo_indptr"].data_ptr()), np.uint64(x["kv_indptr"].data_ptr()),
                np.uint64(x["kv_indices"].data_ptr()), np.uint64(o_part.data_ptr()), np.uint64(lse_part.data_ptr()),
                np.int32(H), np.int32(nsplit), np.int32(total_rows), np.float32(x["sm_scale"]))
        grid = (-(-q_len * H // ROWS), nsplit, bs)

        def launch():
            with cupy_stream():
                self.fn(grid, (256,), args, shared_mem=self.smem)
        return launch, o_part, lse_part


def reference(x, nsplit):
    """float64 split partials: rows normalised within the split, LSE natural log; an empty split
    gives zeros and -inf."""
    H, q_len = x["H"], x["q_len"]
    rows = q_len * H
    out_o = torch.zeros(nsplit, len(x["kv_lens"]) * rows, DL, dtype=torch.float64, device=x["q"].device)
    out_l = torch.full((nsplit, len(x["kv_lens"]) * rows), -math.inf, dtype=torch.float64, device=x["q"].device)
    for b, kv_len in enumerate(x["kv_lens"]):
        start = int(x["kv_indptr"][b])
        kv = x["pool"][x["kv_indices"][start:start + kv_len].long(), 0].double()
        qb = x["q"][b * q_len:(b + 1) * q_len].reshape(rows, D).double()
        span = -(-(-(-kv_len // nsplit)) // 32) * 32
        for s in range(nsplit):
            lo, hi = s * span, min(kv_len, (s + 1) * span)
            if lo >= hi:
                continue
            sc = qb @ kv[lo:hi].T * x["sm_scale"]
            lse = torch.logsumexp(sc, dim=1)
            out_o[s, b * rows:(b + 1) * rows] = torch.softmax(sc, dim=1) @ kv[lo:hi, :DL]
            out_l[s, b * rows:(b + 1) * rows] = lse
    return out_o, out_l


def check(probe, dev) -> list[dict]:
    results = []
    for kv_lens, q_len, H, nsplit in (([1000, 4103, 40], 9, 8, 4), ([777, 16, 2048], 3, 16, 2), ([33], 9, 8, 1),
                                      ([5000], 1, 8, 3)):
        x = make_inputs(kv_lens, q_len, H, seed=len(results), dev=dev)
        launch, o_part, lse_part = probe.launcher(x, nsplit)
        launch()
        torch.cuda.synchronize()
        ro, rl = reference(x, nsplit)
        # P is rounded to bf16 before PV (as in mla_tc.cu): each weight within 2^-9 of its own, so a
        # normalised row is off by at most 2^-9 x max|V|; twice that for fp32 summation order
        tol_o = 2.0 ** -8 * float(x["pool"].float().abs().max())
        err_o = float((o_part.double() - ro).abs().max())
        fin = torch.isfinite(rl)
        # the LSE from fp32 sums of ex2.approx terms (2 ulp each): 1e-4 relative, plus 1e-5
        err_l = float(((lse_part.double() - rl).abs() / (1e-5 + 1e-4 * rl.abs()))[fin].max()) if bool(fin.any()) else 0.0
        empty_ok = bool(torch.isneginf(lse_part.double()[~fin]).all()) and bool((o_part[~fin] == 0).all())
        ok = err_o <= tol_o and err_l <= 1.0 and empty_ok and bool(torch.isfinite(o_part).all())
        results.append({"kv_lens": kv_lens, "q_len": q_len, "H": H, "nsplit": nsplit, "max_err_o": err_o,
                        "tol_o": tol_o, "lse_err_over_tol": err_l, "empty_splits_ok": empty_ok, "ok": ok})
        print(("ok  " if ok else "FAIL"), results[-1], flush=True)
    return results


def kdkit_launcher(x, nsplit):
    bs, q_len, H = len(x["kv_lens"]), x["q_len"], x["H"]
    T = bs * q_len
    pfx = torch.tensor([n - q_len for n in x["kv_lens"]], dtype=torch.int64, device=x["q"].device)
    p = kernel.plan(qo_indptr=x["qo_indptr"], kv_indptr=x["kv_indptr"], kv_indices=x["kv_indices"], num_heads=H,
                    sm_scale=x["sm_scale"], prefix_lens=pfx, layout="unified", causal=False,
                    options=kernel.PlanOptions(nsplit=nsplit, nt=5, skip=False))
    k = torch.zeros(T, 1, D, dtype=torch.bfloat16, device=x["q"].device)
    v = torch.zeros(T, 1, DL, dtype=torch.bfloat16, device=x["q"].device)
    return (lambda: kernel.run(p, x["q"], k, v, x["pool"])), p


def timing(probe, dev, budget_s: float) -> list[dict]:
    timer = Timer(dev)
    rows = []
    # (bs, prefixes, nsplit): 2 row blocks a request (72 rows), bs x 2 x nsplit ~ 132 blocks
    for bs, prefixes, nsplit in ((1, (32768, 65536, 131072), 66), (8, (8192, 16384, 32768), 8),
                                 (32, (4096, 8192, 16384), 2)):
        pts = {"probe": [], "kdkit": []}
        for prefix in prefixes:
            kv_len = prefix + 9
            x = make_inputs([kv_len] * bs, 9, 8, seed=prefix, dev=dev)
            launch, o_part, lse_part = probe.launcher(x, nsplit)
            run_k, plan = kdkit_launcher(x, nsplit)
            steps = -(-(-(-kv_len // nsplit)) // 32)  # 32-row steps per split
            t_p = timer.us(launch, budget_s=budget_s)
            t_k = timer.us(run_k, budget_s=budget_s)
            # the probe's partials against kdkit's output, merged here in float64 (a sanity check
            # that the timed probe computed the same attention)
            run_k()
            out_k, _ = run_k()
            w = torch.softmax(lse_part.double(), dim=0)
            merged = (w[..., None] * o_part.double()).sum(0)
            err = float((merged - out_k.double().reshape(merged.shape)).abs().max())
            pts["probe"].append((steps, t_p))
            pts["kdkit"].append((steps, t_k))
            row = {"bs": bs, "prefix": prefix, "nsplit": nsplit, "steps": steps, "probe_us": round(t_p, 2),
                   "kdkit_us": round(t_k, 2), "probe_vs_kdkit_out_maxdiff": err}
            rows.append(row)
            print(row, flush=True)
            del x, o_part, lse_part
        for name, p in pts.items():
            a, b0 = np.polyfit([s for s, _ in p], [u for _, u in p], 1)
            line = {"bs": bs, "nsplit": nsplit, "kernel": name, "us_per_step": round(float(a), 4),
                    "fixed_us": round(float(b0), 2)}
            rows.append(line)
            print(line, flush=True)
    return rows


# (WS_STAGES, WS_KO, WS_PF, WS_FENCE, WS_OCOPY): the ring's depth (6: 110 KB, beyond sm_120, an sm_90-only experiment:
# do more bytes in flight shorten the step?), the timing-only knockouts of ws_step.cu, and an L2
# prefetch WS_PF steps past the ring (bytes in flight without shared memory), the fence before
# the S warps' arrival, and the copies on the O warps
VARIANTS = ((4, 0, 0, 1, 0), (4, 0, 0, 0, 0), (4, 1, 0, 0, 0), (4, 0, 4, 0, 0), (4, 0, 0, 0, 1), (4, 1, 0, 0, 1),
            (4, 0, 0, 1, 1), (4, 3, 0, 0, 1), (4, 2, 0, 0, 1))


def variants(dev, budget_s: float) -> list[dict]:
    timer = Timer(dev)
    rows = []
    inputs = {prefix: make_inputs([prefix + 9], 9, 8, seed=prefix, dev=dev) for prefix in (32768, 131072)}
    base = {}
    for stages, ko, pf, fence, ocopy in VARIANTS:
        probe = Probe(dev, {"WS_STAGES": stages, "WS_KO": ko, "WS_PF": pf, "WS_FENCE": fence, "WS_OCOPY": ocopy})
        if ko == 0 and (stages, pf, fence, ocopy) != (4, 0, 1, 0):
            assert all(r["ok"] for r in check(probe, dev)), f"WS_STAGES {stages}: wrong partials"
        for prefix, x in inputs.items():
            launch, _, _ = probe.launcher(x, 66)
            us = timer.us(launch, budget_s=budget_s)
            base.setdefault(prefix, us)
            row = {"stages": stages, "ko": ko, "pf": pf, "fence": fence, "ocopy": ocopy, "prefix": prefix, "us": round(us, 2), "vs_base": round(us / base[prefix], 3)}
            rows.append(row)
            print(row, flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--variants", action="store_true", help="the ring depths and knockouts (VARIANTS) at bs 1")
    ap.add_argument("--profile", action="store_true", help="only launch the probe at 1 x 128K (for ncu -k ws_partial)")
    ap.add_argument("--budget-s", type=float, default=0.3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--define", action="append", default=[], metavar="NAME=VALUE",
                    help="a build option of ws_step.cu for the check and timing (WS_OCOPY=1, ...)")
    args = ap.parse_args(argv)
    report = {"builds": {}}
    for arch in ("sm_120", "sm_90"):
        mod = build(arch)
        res = mod.kernels["ws_partial"]
        report["builds"][arch] = {"registers": res.registers, "spill_stores": res.spill_stores,
                                  "spill_loads": res.spill_loads, "smem_bytes": mod.meta()["smem_bytes"],
                                  "forbidden": mod.forbidden_instructions()}
        print(arch, report["builds"][arch], flush=True)
    if not torch.cuda.is_available():
        print("no GPU: builds only")
        return 0
    dev = torch.device("cuda")
    defines = dict(d.split("=", 1) for d in args.define)
    report["defines"] = defines
    probe = Probe(dev, defines)
    if args.profile:
        launch, _, _ = probe.launcher(make_inputs([131072 + 9], 9, 8, seed=0, dev=dev), 66)
        for _ in range(3):
            launch()
        torch.cuda.synchronize()
        return 0
    report["gpu"] = torch.cuda.get_device_name(dev)
    report["check"] = check(probe, dev)
    ok = all(r["ok"] for r in report["check"])
    if ok and args.variants:
        report["variants"] = variants(dev, args.budget_s)
    elif ok and not args.check_only:
        report["timing"] = timing(probe, dev, args.budget_s)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
