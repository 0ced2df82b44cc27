"""A quick look at kernel time (the benchmark is `kdkit bench`). CUDA events around run()
(partial + merge together), a 256 MiB L2 flush before each timed call, median of 50."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from kdkit import kernel, synth  # noqa: E402
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


shapes = [(1, 21, 9), (1, 1024, 9), (1, 8192, 9), (1, 32768, 9), (1, 131072, 9), (8, 8192, 9), (32, 4096, 9),
          (1, 32768, 64), (4, 8192, 257)]
extra = [int(a) for a in sys.argv[1:]]  # nsplit values to sweep too
print(f"{'bs':>3s} {'prefix':>7s} {'q_len':>5s} {'nsplit':>6s} {'nt':>3s} {'us':>9s} {'GB/s':>7s}", flush=True)
for bs, prefix, q_len in shapes:
    case = synth.make_case(bs=bs, prefix=prefix, q_len=q_len, heads=8, tree="ddtree", seed=1, spare_rows=0)
    x = cuda.to_device(case)
    nbytes = bs * (prefix + q_len) * 576 * 2 + 2 * bs * q_len * 8 * 576 * 2
    for ns in [None] + extra:
        p = cuda.plan_case(case, x, nsplit=ns)
        us = time_us(lambda: kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"]))
        print(f"{bs:3d} {prefix:7d} {q_len:5d} {p.nsplit:6d} {p.config.nt:3d} {us:9.1f} {nbytes / us / 1e3:7.0f}",
              flush=True)
