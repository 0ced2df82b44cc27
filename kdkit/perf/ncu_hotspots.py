"""Where a kernel's time goes, from Nsight Compute's source page: warp-stall samples per SASS
instruction summed into the stall reasons, the opcode mix (executed vs sampled), the regions
between barriers, and the hottest instructions.

On the GPU host (the kernel built by kdkit, one shape, caches flushed by ncu):
    ncu --clock-control none --set full -k regex:kd_mla_tc_partial -c 1 -o prof \\
        python -m kdkit.perf.profile_one 1 32768 9
    ncu -i prof.ncu-rep --page source --csv --print-source sass > prof_sass.csv
Anywhere (no GPU, no ncu needed):
    python -m kdkit.perf.ncu_hotspots prof_sass.csv [--top 25] [--kernel NAME]
"""
from __future__ import annotations

import argparse
import collections
import csv
import sys


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read(path: str, kernel: str | None = None) -> list[dict]:
    """The instruction rows of one kernel of the CSV (the first one, or the one named)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"]
    if not starts:
        raise SystemExit(f"{path}: no 'Kernel Name' line: is this `ncu --page source --csv --print-source sass`?")
    pick = 0
    if kernel is not None:
        names = [rows[i][1] for i in starts]
        if kernel not in names:
            raise SystemExit(f"{path}: kernel {kernel!r} not found; it holds {', '.join(names)}")
        pick = names.index(kernel)
    lo = starts[pick] + 1
    hi = starts[pick + 1] if pick + 1 < len(starts) else len(rows)
    header = rows[lo]
    if "Source" not in header or "# Samples" not in header:
        raise SystemExit(f"{path}: no 'Source' / '# Samples' columns (run ncu with --set full)")
    return [dict(zip(header, r)) for r in rows[lo + 1:hi] if r]


def opcode(source: str) -> str:
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def stall_columns(row: dict) -> list[str]:
    return [k for k in row if k.startswith("stall_") and "Not Issued" not in k]


def report(rows: list[dict], top: int = 25) -> str:
    stalls = stall_columns(rows[0])
    samples = sum(_num(r["# Samples"]) for r in rows) or 1.0
    executed = sum(_num(r["Instructions Executed"]) for r in rows) or 1.0
    out = [f"{len(rows)} SASS instructions, {samples:.0f} stall samples, {executed:.0f} warp instructions executed"]

    tot = collections.Counter()
    for r in rows:
        for k in stalls:
            tot[k[len("stall_"):]] += _num(r[k])
    out.append("stalls: " + ", ".join(f"{k} {100 * v / samples:.1f}%" for k, v in tot.most_common(8)))

    ex, sm = collections.Counter(), collections.Counter()
    for r in rows:
        op = opcode(r["Source"])
        ex[op] += _num(r["Instructions Executed"])
        sm[op] += _num(r["# Samples"])
    out.append("opcodes (share of executed / of samples):")
    for op, n in ex.most_common(12):
        out.append(f"  {op:<10} {100 * n / executed:5.1f}% / {100 * sm[op] / samples:5.1f}%")

    # regions end at a barrier (or the end): the phases of a step in a pipelined kernel
    out.append("regions between barriers (first-last instruction, samples, executed, top stalls):")
    start, acc, exe, st = 0, 0.0, 0.0, collections.Counter()
    for i, r in enumerate(rows):
        acc += _num(r["# Samples"])
        exe += _num(r["Instructions Executed"])
        for k in stalls:
            st[k[len("stall_"):]] += _num(r[k])
        if "BAR.SYNC" in r["Source"] or "EXIT" in r["Source"] or i == len(rows) - 1:
            if acc:
                tops = ", ".join(f"{k} {int(v)}" for k, v in st.most_common(3) if v)
                out.append(f"  {start:5d}-{i:5d} {100 * acc / samples:5.1f}% {exe:10.0f}  {tops}")
            start, acc, exe, st = i + 1, 0.0, 0.0, collections.Counter()

    out.append(f"hottest {top} instructions (index, samples %, executed, top stalls, SASS):")
    hot = sorted(range(len(rows)), key=lambda i: -_num(rows[i]["# Samples"]))[:top]
    for i in sorted(hot):
        r = rows[i]
        s = _num(r["# Samples"])
        if not s:
            continue
        tops = ", ".join(f"{k[len('stall_'):]} {int(_num(r[k]))}"
                         for k in sorted(stalls, key=lambda k: -_num(r[k]))[:2] if _num(r[k]))
        out.append(f"  {i:5d} {100 * s / samples:5.1f}% {_num(r['Instructions Executed']):9.0f}  "
                   f"{tops:<32} {r['Source'][:70]}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu -i REPORT --page source --csv --print-source sass > FILE")
    ap.add_argument("--top", type=int, default=25, help="how many of the hottest instructions to list")
    ap.add_argument("--kernel", default=None, help="which kernel of the file (default: the first)")
    args = ap.parse_args(argv)
    print(report(read(args.csv, args.kernel), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
