"""One shape through kdkit's kernel a few times, for a profiler:

    ncu --clock-control none -k regex:kd_mla_tc -c 2 python -m kdkit.perf.profile_one BS PREFIX Q_LEN [NSPLIT [NT [NH]]]

NSPLIT, NT (query n-tiles per block) and NH (warp halves: 2 = 16 warps) default to the plan's choice;
0 also means the plan's choice.
"""
from __future__ import annotations

import sys

import torch

from .. import kernel
from ..backends import cuda
from .bench import Shape, make_case


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        print("usage: python -m kdkit.perf.profile_one BS PREFIX Q_LEN [NSPLIT [NT [NH]]]", file=sys.stderr)
        return 2
    bs, prefix, q_len = (int(a) for a in argv[:3])
    nsplit, nt, nh = (int(a) or None for a in (list(argv[3:6]) + ["0"] * 3)[:3])
    case = make_case(Shape(bs, prefix, q_len))
    x = cuda.to_device(case)
    p = cuda.plan_case(case, x, kernel.PlanOptions(nsplit=nsplit, nt=nt, nh=nh))
    print(p.info, flush=True)
    for _ in range(3):
        kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
