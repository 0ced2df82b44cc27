"""A representative subset of kernel cases, small enough to run under compute-sanitizer.

    compute-sanitizer --tool memcheck  python3 scripts/gpu_selfcheck.py
    compute-sanitizer --tool racecheck python3 scripts/gpu_selfcheck.py
Exit status 1 if any case misses the tolerance rule (compare.judge against the float64 oracle).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kdkit import compare, oracle, synth  # noqa: E402
from kdkit.backends import cuda  # noqa: E402

CASES = [
    ("seed-shape", dict(bs=1, prefix=21, q_len=9, tree="eagle"), {}),
    ("ragged + prefix 0", dict(bs=4, prefix=[0, 5, 300, 2000], q_len=[9, 1, 33, 17], tree="ddtree"), {}),
    ("unified layout", dict(bs=2, prefix=[40, 900], q_len=9, tree="ddtree", layout="unified"), {}),
    ("one split", dict(bs=2, prefix=[40, 900], q_len=9, tree="chain"), {"nsplit": 1}),
    ("many splits", dict(bs=1, prefix=4000, q_len=9, tree="ddtree"), {"nsplit": 256}),
    ("q_len 1025, H 1", dict(bs=1, prefix=64, q_len=1025, heads=1, tree="ddtree"), {}),
    ("H 128, uint8 mask, int64 idx", dict(bs=2, prefix=[7, 60], q_len=5, heads=128, tree="eagle",
                                          mask_dtype=__import__("torch").uint8,
                                          index_dtype=__import__("torch").int64), {}),
    ("causal, no mask, capped", dict(bs=2, prefix=[0, 100], q_len=17, tree="causal", logit_cap=30.0,
                                     magnitude=30.0), {}),
    ("rows that see only themselves", dict(bs=1, prefix=10, q_len=9, tree="diagonal"), {}),
]


def main() -> int:
    bad = 0
    for name, kw, opts in CASES:
        case = synth.make_case(seed=7, **kw)
        res = cuda.run(case, **opts)
        ref, ref_lse = oracle.run(case)
        m = compare.metrics(res.out, ref, res.lse, ref_lse, lse_cond=oracle.lse_condition(case))
        v = compare.judge("cuda", m, ref)
        bad += not v.passed
        print(f"{'ok  ' if v.passed else 'FAIL'} {name:32s} nsplit={res.info['nsplit']:<4d} {v.reasons[0]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
