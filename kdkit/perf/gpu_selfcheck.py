"""A representative subset of kernel cases, small enough to run under compute-sanitizer.

    compute-sanitizer --tool memcheck  python -m kdkit.perf.gpu_selfcheck
    compute-sanitizer --tool racecheck python -m kdkit.perf.gpu_selfcheck
The cases are kdkit/shapes.json's set "gpu-selfcheck"; what a shape cannot hold (a forced split
count, the mask and index dtypes) is added here by name. Exit status 1 if any case misses the
tolerance rule (compare.judge against the float64 oracle).
"""
from __future__ import annotations

import sys

import torch

from .. import shapes
from ..kernel.spec import PAIR_NT
from ..judge import compare, oracle

SET = "gpu-selfcheck"
MAKE = {"h128-uint8-mask-int64-idx": dict(mask_dtype=torch.uint8, index_dtype=torch.int64)}  # -> make_case
# -> cuda.run; "q1025-h1" is where the plan takes the skip build itself, "ragged-prefix-0" forces it
RUN = {"one-split": {"nsplit": 1}, "many-splits": {"nsplit": 256}, "ragged-prefix-0": {"skip": True}}
# run again with each of these options: 256 splits merged by the last split block of each row block
# (fused "last", a grid no GPU holds at once) beside the merge kernel of the first run; the 64-row
# build (kd_pair.cuh: named barriers between warp pairs) writing the output itself, through
# the merge kernel and through both ways of the fused merge, over 64-bit indices and a uint8 mask,
# causal with a cap, and on a deep tree
PAIR = {"nt": PAIR_NT}
AGAIN = {"many-splits": ({"nsplit": 256, "fused": "last"}, {**PAIR, "nsplit": 16},
                         {**PAIR, "nsplit": 16, "fused": "last"}),
         "one-split": ({**PAIR, "nsplit": 1},), "ragged-prefix-0": (PAIR,), "h128-uint8-mask-int64-idx": (PAIR,),
         "causal-no-mask-capped": ({**PAIR, "nsplit": 2}, {**PAIR, "nsplit": 2, "fused": True}), "q1025-h1": (PAIR,)}


def cases():
    """(name, case, options of cuda.run) for every shape of the set, in its order."""
    for s in shapes.get(SET):
        yield s["name"], shapes.make_case(s, **MAKE.get(s["name"], {})), RUN.get(s["name"], {})


def main() -> int:
    from ..backends import cuda
    bad = 0
    runs = ((name, case, o) for name, case, opts in cases() for o in (opts, *AGAIN.get(name, ())))
    for name, case, opts in runs:
        res = cuda.run(case, **opts)
        # the oracle once, with the rows' LSE conditions and sizes, as replay and the trials judge
        ref, ref_lse, cond, scale = oracle.run(case, with_cond=True, with_scale=True)
        m = compare.metrics(res.out, ref, res.lse, ref_lse, lse_cond=cond, out_scale=scale)
        v = compare.judge("cuda", m, ref)
        bad += not v.passed
        merge = f"fused-{res.info['fused']}" if res.info["fused"] else "kernel" if res.info["nsplit"] > 1 else "-"
        rows = "64-pair" if f"-nt{PAIR_NT}-" in res.ran else "8-40"
        print(f"{'ok  ' if v.passed else 'FAIL'} {name:32s} nsplit={res.info['nsplit']:<4d} merge={merge:<10s} "
              f"rows={rows:<7s} {v.reasons[0]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
