"""The warp-pair probe (pair_step.cu: query rows on the MMA's M dimension, the head dims split over
a pair of warps, 64 rows a block) against kdkit's kernel on the deep-tree shapes, on one GPU:

    python -m kdkit.perf.probes.pair_step [--check-only] [--out FILE]

A measurement of a design, not a backend: nothing in kdkit calls it; benchmarks/LOG.md has what it
measured. Its inputs are ws_step's (the unified layout, every column visible), so kdkit is timed on
the same case: its plan in the unified layout, no mask, not causal.

1. Its build for sm_90 and sm_120: registers, spills, shared memory (sm_120's limits hold?).
2. Correctness: its split partials against the float64 reference (ws_step.check's ragged cases).
3. Timing (kdkit.perf.timing.Timer: L2 flushed, CUDA events, median) at the grid's deep-tree
   shapes (q_len 64 and 257, H 8 and 16), the probe's partial kernel at several split counts
   against kdkit's whole call (its own split count) and its partial kernel alone; the mma.sync
   rate measured in the same process, so each time reads as a fraction of the tensor floor.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from ...kernel import jit, spec
from ...kernel.launch import cupy_stream, current_raw_stream
from ..timing import Timer, mma_tflops
from . import ws_step as ws

PROBE = Path(__file__).with_name("pair_step.cu")
ROWS = 64  # query rows per block
# (bs, prefix, q_len, H): the grid's deep-tree shapes (kdkit/shapes.json), as the bench runs them
SHAPES = ((1, 32768, 64, 8), (1, 32768, 64, 16), (4, 8192, 257, 8), (4, 8192, 257, 16))
SPLITS = (1, 2, 3, 4, 8, 16)


def build(arch: str, defines: dict | None = None):
    defines = dict(defines or {})
    return jit.build(PROBE, defines, arch, tags={"probe": "pair", **defines})


class Probe:
    def __init__(self, dev, defines: dict | None = None):
        self.mod = build(jit.device_arch(), defines)
        self.fn = jit.load(self.mod).get_function("pair_partial")
        meta = self.mod.meta()
        self.smem, self.threads = meta["smem_bytes"], meta["threads"]
        self.fn.max_dynamic_shared_size_bytes = self.smem

    def launcher(self, x, nsplit):
        bs, H, q_len = len(x["kv_lens"]), x["H"], x["q_len"]
        total_rows = bs * q_len * H
        o_part = torch.empty(nsplit, total_rows, ws.DL, dtype=torch.float32, device=x["q"].device)
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
                self.fn(grid, (self.threads,), args, shared_mem=self.smem)
        return launch, o_part, lse_part


def flops(bs, kv_len, q_len, H) -> float:
    """design.md's FLOPs: 2 x rows x kv_len x (576 + 512)."""
    return 2.0 * bs * q_len * H * kv_len * (ws.D + ws.DL)


def timing(probe, dev, budget_s: float) -> list[dict]:
    timer = Timer(dev)
    tflops = mma_tflops(timer, dev)
    print({"mma_tflops": round(tflops, 1)}, flush=True)
    rows = []
    for bs, prefix, q_len, H in SHAPES:
        kv_len = prefix + q_len
        x = ws.make_inputs([kv_len] * bs, q_len, H, seed=prefix + q_len, dev=dev)
        floor_us = flops(bs, kv_len, q_len, H) / (tflops * 1e6)
        run_k, plan = ws.kdkit_launcher(x, None)
        t_k = timer.us(run_k, budget_s=budget_s)
        stream = current_raw_stream(torch.cuda.current_device())
        t_kp = timer.us(lambda: plan.launcher(stream, only=spec.PARTIAL), budget_s=budget_s)
        out_k, _ = run_k()
        torch.cuda.synchronize()
        out_k = out_k.double().reshape(-1, ws.DL)
        best = None
        for nsplit in SPLITS:
            launch, o_part, lse_part = probe.launcher(x, nsplit)
            t_p = timer.us(launch, budget_s=budget_s)
            launch()
            torch.cuda.synchronize()
            w = torch.softmax(lse_part.double(), dim=0)  # the merge, in float64 here (not timed)
            err = float(((w[..., None] * o_part.double()).sum(0) - out_k).abs().max())
            row = {"bs": bs, "prefix": prefix, "q_len": q_len, "H": H, "probe_nsplit": nsplit,
                   "probe_partial_us": round(t_p, 2), "probe_frac": round(floor_us / t_p, 4),
                   "kdkit_nsplit": plan.nsplit, "kdkit_us": round(t_k, 2), "kdkit_partial_us": round(t_kp, 2),
                   "kdkit_frac": round(floor_us / t_k, 4), "tensor_floor_us": round(floor_us, 2),
                   "probe_vs_kdkit_out_maxdiff": err}
            rows.append(row)
            print(row, flush=True)
            if best is None or t_p < best["probe_partial_us"]:
                best = row
            del o_part, lse_part
        rows.append({"best": best})
        print({"best": best}, flush=True)
        del x
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--budget-s", type=float, default=0.3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    report = {"builds": {}}
    for arch in ("sm_120", "sm_90"):
        mod = build(arch)
        res = mod.kernels["pair_partial"]
        report["builds"][arch] = {"registers": res.registers, "spill_stores": res.spill_stores,
                                  "spill_loads": res.spill_loads, "smem_bytes": mod.meta()["smem_bytes"],
                                  "forbidden": mod.forbidden_instructions()}
        print(arch, report["builds"][arch], flush=True)
    if not torch.cuda.is_available():
        print("no GPU: builds only")
        return 0
    dev = torch.device("cuda")
    probe = Probe(dev)
    report["gpu"] = torch.cuda.get_device_name(dev)
    report["check"] = ws.check(probe, dev)
    ok = all(r["ok"] for r in report["check"])
    if ok and not args.check_only:
        report["timing"] = timing(probe, dev, args.budget_s)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
