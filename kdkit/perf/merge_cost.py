"""What the split-KV merge costs beside the partial kernel, under CUDA graph replay (kdkit.perf.timing's
timer: a 256 MiB L2 flush before each replay, median):

    python -m kdkit.perf.merge_cost [--shapes 1x32768q9,1x131072q9,8x8192q9,32x4096q9,1x1024q9]

Per shape, at the plan's own split count and merge groups, five graphs: the partial kernel alone
(P); P then an empty kernel of the merge's grid and block (P+E); P then the merge (P+M); P then the merge twice
(P+M+M: the second finds its instructions and partials where the first left them); P twice (P+P:
the second partial kernel finds its instructions, indices and Q warm, its KV in L2 only where the
KV fits there: at 1 x 128K, 151 MB, mostly not); the empty
kernel alone (E); the merge alone (M, its partials read from DRAM). P+E - P is what a second
kernel costs by being one (the launch and the boundary between the two); P+M - P - (P+E - P) is
the merge's own work with its partials where the partial kernel left them; P+M+M - P+M is the
merge's work again with its code and data warm (if it is much less, the first one waits on
fetching its instructions or on its data).
"""
from __future__ import annotations

import argparse
import re

from .. import kernel
from ..backends import cuda
from ..kernel import launch, spec
from . import bench
from .timing import Timer, graph_of

_EMPTY = r'extern "C" __global__ void kd_empty(float* x) { if (blockIdx.x == 0x7fffffff) x[0] = 1.f; }'


def _shape(text: str) -> bench.Shape:
    m = re.fullmatch(r"(\d+)x(\d+)q(\d+)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: write a shape as BSxPREFIXqQ_LEN, e.g. 1x32768q9")
    return bench.Shape(*(int(g) for g in m.groups()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=lambda s: [_shape(x) for x in s.split(",")],
                    default=[_shape(x) for x in ("1x32768q9", "1x131072q9", "8x8192q9", "32x4096q9", "1x1024q9")])
    args = ap.parse_args(argv)
    import cupy  # the GPU host's; --help needs none

    timer = Timer("cuda")
    empty_fn = cupy.RawKernel(_EMPTY, "kd_empty")
    sink = cupy.zeros(1, dtype=cupy.float32)
    print("shape | nsplit | merge grid x block | P | P+E | P+M | P+M+M | E | M | boundary (P+E - P) | "
          "merge's work (P+M - P+E) | again (P+M+M - P+M) | partial again (P+P - P)")
    for s in args.shapes:
        case = bench.make_case(s)
        x = cuda.to_device(case)
        p = cuda.plan_case(case, x, kernel.PlanOptions(fused=False))  # the merge as its own kernel, to time apart
        if p.nsplit == 1:
            print(f"{s.bs}x{s.prefix} q{s.q_len}: one split, no merge")
            continue
        kernel.bind(p, x["q"], x["k"], x["v"], x["kv_buffer"])  # the plan's argument holds this layer
        rows, block = p.num_tokens * p.num_heads, (spec.MERGE_THREADS, p.merge_groups)

        def partial():
            p.launcher(launch.current_raw_stream(p.device.index), only=spec.PARTIAL)

        def merge():
            p.launcher(launch.current_raw_stream(p.device.index), only=spec.MERGE)

        def empty():
            with launch.cupy_stream():
                empty_fn((rows,), block, (sink,))

        us = {name: timer.us(graph_of(fn), reps=40) for name, fn in (
            ("P", partial), ("P+E", lambda: (partial(), empty())), ("P+M", lambda: (partial(), merge())),
            ("P+M+M", lambda: (partial(), merge(), merge())), ("P+P", lambda: (partial(), partial())),
            ("E", empty), ("M", merge))}
        print(f"{s.bs}x{s.prefix} q{s.q_len} | {p.nsplit} | {rows} x {block[0] * block[1]} | "
              + " | ".join(f"{us[k]:.2f}" for k in ("P", "P+E", "P+M", "P+M+M", "E", "M"))
              + f" | {us['P+E'] - us['P']:.2f} | {us['P+M'] - us['P+E']:.2f} | {us['P+M+M'] - us['P+M']:.2f}"
              + f" | {us['P+P'] - us['P']:.2f}",
              flush=True)
        del x, case
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
