"""One shape through kdkit's kernel a few times, for a profiler:

    ncu --clock-control none -k regex:kd_mla_tc -c 2 \
        python -m kdkit.perf.profile_one BS PREFIX Q_LEN [NSPLIT [NT [NH [HEADS]]]] [--knockout NAME]

NSPLIT, NT (query n-tiles per block; 8 is the 64-row build) and NH (warp halves: 2 = 16 warps)
default to the plan's choice; 0 also means the plan's choice. HEADS defaults to the bench's 8.
--knockout profiles a timing-only build with one part of the step off (kdkit/kernel/knockouts.py;
wrong results by design), e.g. `qk` to see PV and the rest of the step without QK's MMAs.
"""
from __future__ import annotations

import sys

import torch

from .. import kernel
from ..backends import cuda
from ..kernel import knockouts
from .bench import Shape, make_case


USAGE = "usage: python -m kdkit.perf.profile_one BS PREFIX Q_LEN [NSPLIT [NT [NH [HEADS]]]] [--knockout NAME]"


def _knockout(argv: list[str]) -> tuple[list[str], str | None]:
    """argv without its `--knockout NAME` (or `--knockout=NAME`), and the name."""
    rest, name = [], None
    it = iter(argv)
    for a in it:
        if a == "--knockout" or a.startswith("--knockout="):
            name = a.partition("=")[2] if "=" in a else next(it, "")
            if name not in knockouts.KNOCKOUTS:
                raise ValueError(f"--knockout {name!r}: choose one of {sorted(knockouts.KNOCKOUTS)}\n{USAGE}")
        else:
            rest.append(a)
    return rest, name


def parse(argv: list[str]) -> tuple[Shape, kernel.PlanOptions]:
    """The shape and plan options the arguments name; ValueError (with the usage line) on bad ones."""
    argv, knockout = _knockout(argv)
    if not 3 <= len(argv) <= 7:
        raise ValueError(f"{len(argv)} arguments given, 3 to 7 expected\n{USAGE}")
    names = ("BS", "PREFIX", "Q_LEN", "NSPLIT", "NT", "NH", "HEADS")
    vals = []
    for name, a in zip(names, argv):
        try:
            vals.append(int(a))
        except ValueError:
            raise ValueError(f"{name} {a!r}: not an integer\n{USAGE}") from None
    bs, prefix, q_len = vals[:3]
    nsplit, nt, nh, heads = (v or None for v in (vals[3:] + [0] * 4)[:4])
    return Shape(bs, prefix, q_len, heads or Shape.heads), kernel.PlanOptions(nsplit=nsplit, nt=nt, nh=nh,
                                                                              knockout=knockout)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        shape, opts = parse(argv)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    case = make_case(shape)
    x = cuda.to_device(case)
    p = cuda.plan_case(case, x, opts)
    print(p.info, flush=True)
    for _ in range(3):
        kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
