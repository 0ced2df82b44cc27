"""What kdkit's run() costs the CPU, part by part:

    python -m kdkit.perf.host_cost [--shapes 1x21q9h8,1x8192q9h8,4x8192q257h16] [--out x.json]

Per shape, at the plan's own choices (one launch where it fuses the merge or does not split, two
where the merge is a kernel of its own), in kdkit.perf.timing's host_us (the mean per call over 20
calls queued behind a GPU sleep, the median of 5 such means): bind (the tensors' check and the
argument's bytes), the launcher alone, run() whole, and the bare cuda-bindings driver calls with the
same arguments (the floor: what the driver itself takes); then the eager call with its host work in
view (Timer.eager_us: flush, events around the call, no GPU sleep) and the GPU time (Timer.us).
Last, the floor of any eager call from Python on this host: an empty kernel (one block of one warp)
through the same driver call, its host time and its eager time.
"""
from __future__ import annotations

import argparse
import json
import re

from .. import kernel
from ..backends import cuda
from ..kernel import launch
from . import bench
from .timing import Timer, empty_launch


def _shape(text: str) -> bench.Shape:
    m = re.fullmatch(r"(\d+)x(\d+)q(\d+)h(\d+)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: write a shape as BSxPREFIXqQ_LENhHEADS, e.g. 1x21q9h8")
    return bench.Shape(*(int(g) for g in m.groups()))


DEFAULT = "1x21q9h8,1x21q9h16,1x1024q9h8,1x8192q9h8,32x4096q9h8,1x131072q9h16,1x32768q64h8,4x8192q257h16"


def measure(shape: bench.Shape, timer: Timer) -> dict:
    """The row of one shape."""
    from cuda.bindings import driver
    case = bench.make_case(shape)
    x = cuda.to_device(case)
    p = cuda.plan_case(case, x)
    q, k, v, kvb = x["q"], x["k"], x["v"], x["kv_buffer"]
    kernel.run(p, q, k, v, kvb)
    stream = launch.current_raw_stream(p.device_index)
    calls = p.launcher.calls

    def bare():
        for _, fn, gx, gy, gz, bx, by, bz, smem, kp, coop in calls:
            if coop:
                driver.cuLaunchCooperativeKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, kp)
            else:
                driver.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, kp, 0)

    return {"shape": shape.label, "kernels": len(calls), "nsplit": p.nsplit, "fused": p.fused,
            "bind_us": timer.host_us(lambda: kernel.bind(p, q, k, v, kvb)),
            "launcher_us": timer.host_us(lambda: p.launcher(stream)),
            "run_us": timer.host_us(lambda: kernel.run(p, q, k, v, kvb)),
            "bare_driver_us": timer.host_us(bare),
            "eager_us": timer.eager_us(lambda: kernel.run(p, q, k, v, kvb)),
            "gpu_us": timer.us(lambda: kernel.run(p, q, k, v, kvb))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=lambda s: [_shape(t) for t in s.split(",")],
                    default=[_shape(t) for t in DEFAULT.split(",")])
    ap.add_argument("--out", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    timer = Timer("cuda")
    rows = []
    keys = ("bind_us", "launcher_us", "run_us", "bare_driver_us", "eager_us", "gpu_us")
    print("shape | kernels | " + " | ".join(keys))
    for s in args.shapes:
        r = measure(s, timer)
        rows.append(r)
        way = f" (fused merge, {r['fused']})" if r["fused"] else ""
        print(f"{r['shape']} | {r['kernels']}{way} | " +
              " | ".join(f"{r[k]:.2f}" for k in keys), flush=True)
    floor = empty_launch(timer)  # (after the shapes: the GPU's clocks up, as they were for those)
    print(f"floor: an empty kernel, one launch: host {floor['launcher_us']:.2f} us, eager {floor['eager_us']:.2f} us, "
          f"GPU (flushed, events) {floor['gpu_us']:.2f} us", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"floor": floor, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
