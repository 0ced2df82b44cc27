"""A quick look at kernel time (not the benchmark: bench.py is its own issue). CUDA events around
launch() (partial + reduce together), a 256 MiB L2 flush before each timed call, median of 50."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from kdkit import synth  # noqa: E402
from kdkit.backends import cuda  # noqa: E402

flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def time_us(fn, reps=50):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return sorted(ts)[len(ts) // 2]


print(f"{'bs':>3s} {'prefix':>7s} {'nsplit':>6s} {'us':>9s} {'GB/s':>7s}")
for bs, prefix in [(1, 21), (1, 8192), (1, 32768), (1, 131072), (8, 8192), (32, 4096)]:
    case = synth.make_case(bs=bs, prefix=prefix, q_len=9, heads=8, tree="ddtree", seed=1)
    p = cuda.plan(cuda.Inputs.from_case(case), max_q_len=9)  # verify graphs keep q_len fixed
    us = time_us(lambda: cuda.launch(p))
    nbytes = bs * (prefix + 9) * 576 * 2 + 2 * bs * 9 * 8 * 576 * 2
    print(f"{bs:3d} {prefix:7d} {p.nsplit:6d} {us:9.1f} {nbytes / us / 1e3:7.0f}")
