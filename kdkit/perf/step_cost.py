"""What one KV step of kdkit's kernel costs at each split count (the plan's own block size: its
rows per block are printed beside the block count), with the pool's slots shuffled (as
`kdkit bench` lays them out) and in order:

    python -m kdkit.perf.step_cost [--prefixes 65536,131072] [--nsplits 1,2,4,8,16,32,64] [--q-len 9] [--heads 8]

For each split count, a batch of one request is timed (CUDA graph replay, kdkit.perf.timing's timer: L2
flushed before each call, median) at every prefix; the time per step and the fixed work are the
line through those points (steps per split = ceil(ceil(KV / 32) / nsplit)). Blocks = row blocks
x splits: the kernel's block count; rows: query rows per block. The README's "What a KV step
costs" reads this table (a step's cost follows the rows per block, not the block count). Each line
also gives the SM clock and power sampled meanwhile (kdkit/perf/clocks.py).

Why the two slot orders: with shuffled slots every 1152-byte KV row sits on its own DRAM page
and, across a 151 MB pool, its own TLB reach; in order, a step's 32 rows are 36 KB in a row. If
a step's cost differs between the two orders, the rows' scatter is part of it (on the H200 it is
not: the same within 0.5%).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from .. import kernel, shapes
from ..backends import cuda
from ..kernel import schedule
from . import clocks
from .timing import Timer, graph_of


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: one or more integers >= 1")
    return vals


def steps_per_split(kv_len: int, nsplit: int) -> int:
    return schedule.cdiv(schedule.cdiv(kv_len, schedule.BLOCK_N), nsplit)


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(us per step, fixed us): the least-squares line through (steps, us)."""
    x = np.array([s for s, _ in points], dtype=float)
    y = np.array([u for _, u in points], dtype=float)
    a, b = np.polyfit(x, y, 1)
    return float(a), float(b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefixes", type=_ints, default=[65536, 131072], help="two or more prefix lengths")
    ap.add_argument("--nsplits", type=_ints, default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--q-len", type=int, default=9)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=0.3, help="timing budget per point")
    args = ap.parse_args(argv)
    if len(args.prefixes) < 2:
        ap.error("--prefixes: two or more, for the line")
    dev = torch.device("cuda")
    timer = Timer(dev)
    print(f"{torch.cuda.get_device_name(dev)}, bs 1, q_len {args.q_len}, H {args.heads}, prefixes {args.prefixes}")
    print(f"{'slots':>9} {'nsplit':>6} {'blocks':>6} {'rows':>4} " + " ".join(f"{f'us@{p}':>11}" for p in args.prefixes)
          + f" {'us/step':>8} {'fixed':>7} {'MHz':>5} {'W':>6}")
    with clocks.ClockSampler(clocks.gpu_id(dev)) as sampler:
        for shuffled in (True, False):
            cases = {p: shapes.make_case({"bs": 1, "prefix": p, "q_len": args.q_len, "heads": args.heads,
                                          "tree": "ddtree"}, spare_rows=0, poison_unused=False,
                                         shuffle_slots=shuffled) for p in args.prefixes}
            xs = {p: cuda.to_device(c) for p, c in cases.items()}
            for ns in args.nsplits:
                points, blocks, rows, t0 = [], None, None, time.monotonic()
                for p in args.prefixes:
                    x, plan = xs[p], cuda.plan_case(cases[p], xs[p], kernel.PlanOptions(nsplit=ns))
                    fn = graph_of(lambda: kernel.run(plan, x["q"], x["k"], x["v"], x["kv_buffer"]))
                    points.append((steps_per_split(p + args.q_len, plan.nsplit), timer.us(fn, budget_s=args.budget_s)))
                    blocks = plan.grid[0] * plan.grid[1] * plan.grid[2]
                    rows = plan.rows_per_cta
                a, b = fit(points)
                clk = sampler.window(t0, time.monotonic())
                print(f"{'shuffled' if shuffled else 'in order':>9} {ns:>6} {blocks:>6} {rows:>4} "
                      + " ".join(f"{u:>11.2f}" for _, u in points)
                      + f" {a:>8.3f} {b:>7.1f} {clk.get('sm_mhz', '-'):>5} {clk.get('power_w', '-'):>6}", flush=True)
            del xs
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
