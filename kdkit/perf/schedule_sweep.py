"""The measurements behind kdkit.kernel.schedule's launch model: every block size (nt = query
n-tiles of 8 rows) x a few split counts around the automatic one, per shape, on this GPU.

    python -m kdkit.perf.schedule_sweep [--out FILE.jsonl]

One JSON line per (shape, nt, nsplit), after a first line of metadata; graph replay, a 256 MiB
L2 flush before each call, median (kdkit.perf.timing.Timer, as `kdkit bench` times). The H200's run is
benchmarks/schedule/; tests/test_compile.py checks the model's choices against it.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from .. import kernel
from ..backends import cuda
from ..kernel import spec
from .bench import Shape, make_case
from .timing import Timer, graph_of

# (bs, prefix, q_len) at H 8: the quick bench set plus the short-KV corners where the block size matters
SHAPES = [(1, 21, 9), (1, 1024, 9), (1, 8192, 9), (1, 32768, 9), (1, 131072, 9), (8, 8192, 9),
          (32, 4096, 9), (1, 32768, 64), (4, 8192, 257), (8, 1024, 9), (32, 1024, 9), (1, 8192, 64),
          (8, 32768, 9), (1, 1024, 64)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="-", help="JSON lines file (default: standard output)")
    ap.add_argument("--budget-s", type=float, default=0.12, help="timing budget per configuration")
    args = ap.parse_args(argv)
    why = kernel.unavailable()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    out = sys.stdout if args.out == "-" else open(args.out, "w")
    dev = torch.device("cuda")
    timer = Timer(dev)
    props = torch.cuda.get_device_properties(dev)
    print(json.dumps({"meta": {"gpu": props.name, "sms": props.multi_processor_count,
                               "empty_graph_us": timer.us(graph_of(lambda: torch.cuda._sleep(1)), reps=30)}}),
          file=out, flush=True)
    for bs, prefix, q_len in SHAPES:
        case = make_case(Shape(bs, prefix, q_len))
        x = cuda.to_device(case)
        auto = cuda.plan_case(case, x)
        # (the 64-row build has 8 warps only)
        builds = [(nt, nh) for nh in spec.NH_CHOICES for nt in spec.NT_CHOICES
                  if nt >= nh and (nt != spec.PAIR_NT or nh == 1)]
        for nt, nh in builds:
            for ns in sorted({auto.nsplit, max(1, auto.nsplit // 4), max(1, auto.nsplit // 2),
                              min(spec.MAX_SPLITS, auto.nsplit * 2)}):
                try:
                    p = cuda.plan_case(case, x, kernel.PlanOptions(nsplit=ns, nt=nt, nh=nh))
                except kernel.InputError as e:  # e.g. a split count over the workspace limit
                    print(f"skip {bs}x{prefix} q{q_len} nt {nt} nsplit {ns}: {e}", file=sys.stderr)
                    continue
                fn = graph_of(lambda: kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"]))
                row = dict(bs=bs, prefix=prefix, q_len=q_len, nt=nt, nh=nh, nsplit=ns, auto_nt=auto.config.nt,
                           auto_ns=auto.nsplit, grid=list(p.grid), us=round(timer.us(fn, budget_s=args.budget_s), 2))
                print(json.dumps(row), file=out, flush=True)
        del x
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
