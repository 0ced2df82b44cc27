"""What FlashAttention-2 reaches on this GPU, as a share of kdkit's measured mma.sync rate.

Issue 9's unmet targets ask the tensor pipes to be busy 50-59% of a whole call (README,
Performance). FlashAttention-2 is the reference attention kernel built on mma.sync, and torch's
SDPA flash backend is FlashAttention-2's code, so its forward prefill in its easiest case (no
mask, head dims up to 256, long sequences: compute-bound) is a measured anchor for what that
instruction reaches inside an attention loop. Both rates are measured here, in one process, with
kdkit bench's timer (kdkit.perf.timing: CUDA events, median).

    python -m kdkit.perf.probes.fa2_rate [--seq 8192] [--batch 2] [--heads 16] [--dims 64,128,256]
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from ..timing import Timer, mma_tflops


def flops(batch: int, heads: int, seq: int, dim: int) -> int:
    """Forward, no mask: S = QK^T and O = PV, each 2 x seq x seq x dim per (batch, head)."""
    return 4 * batch * heads * seq * seq * dim


def sdpa_us(timer: Timer, batch: int, heads: int, seq: int, dim: int) -> float:
    """Median time of one forward through SDPA's flash backend only (an error, not a fallback,
    where that backend cannot take the shape)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return timer.us(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), reps=10)


def measure(seq: int, batch: int, heads: int, dims) -> dict:
    timer = Timer("cuda")
    mma = mma_tflops(timer, "cuda")
    rows = []
    for dim in dims:
        us = sdpa_us(timer, batch, heads, seq, dim)
        tflops = flops(batch, heads, seq, dim) / us / 1e6
        rows.append({"dim": dim, "us": round(us, 1), "tflops": round(tflops, 1),
                     "share_of_mma_sync": round(tflops / mma, 3)})
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "mma_tflops": round(mma, 1),
            "batch": batch, "heads": heads, "seq": seq, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dims", default="64,128,256", help="head dims, comma-separated (the flash backend takes <= 256)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fa2_rate: needs a CUDA GPU", file=sys.stderr)
        return 2
    res = measure(a.seq, a.batch, a.heads, [int(d) for d in a.dims.split(",")])
    print(f"{res['gpu']}, torch {res['torch']}: mma.sync {res['mma_tflops']} TFLOP/s; SDPA flash "
          f"(FlashAttention-2) forward, no mask, {a.batch} x {a.heads} heads x {a.seq}:")
    for r in res["rows"]:
        print(f"  head dim {r['dim']:4d}: {r['us']:9.1f} us  {r['tflops']:6.1f} TFLOP/s  "
              f"{100 * r['share_of_mma_sync']:.1f}% of mma.sync")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
