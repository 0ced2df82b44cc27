"""One shape through kdkit's kernel a few times, for a profiler:

    ncu --clock-control none -k regex:kd_mla_tc -c 2 python3 scripts/profile_one.py BS PREFIX Q_LEN [NSPLIT [NT [NH]]]

NSPLIT, NT (query n-tiles per block) and NH (warp halves: 2 = 16 warps) default to the plan's choice;
0 also means the plan's choice.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from kdkit import kernel  # noqa: E402
from kdkit.bench import Shape, make_case  # noqa: E402
from kdkit.backends import cuda  # noqa: E402

bs, prefix, q_len = (int(a) for a in sys.argv[1:4])
nsplit, nt, nh = (int(a) or None for a in (sys.argv[4:7] + ["0"] * 3)[:3])
case = make_case(Shape(bs, prefix, q_len))
x = cuda.to_device(case)
p = cuda.plan_case(case, x, kernel.PlanOptions(nsplit=nsplit, nt=nt, nh=nh))
print(p.info, flush=True)
for _ in range(3):
    kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])
torch.cuda.synchronize()
