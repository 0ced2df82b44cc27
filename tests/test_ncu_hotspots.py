"""kdkit.perf.ncu_hotspots on a small source page in ncu's CSV layout (no GPU, no ncu)."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from kdkit.perf import ncu_hotspots as hot

HEADER = ["Address", "Source", "# Samples", "Instructions Executed", "stall_wait", "stall_long_sb",
          "stall_barrier", "stall_wait (Not Issued)"]
# two phases split by a barrier; the load-use stall dominates
BODY = [
    ["0x10", "LDG.E R2, desc[UR4][R4.64]", "2", "100", "0", "0", "0", "0"],
    ["0x20", "@!P1 SHF.R.S32.HI R3, RZ, 0x1f, R2", "60", "100", "0", "60", "0", "7"],
    ["0x30", "BAR.SYNC.DEFER_BLOCKING 0x0", "8", "100", "0", "0", "8", "0"],
    ["0x40", "HMMA.16816.F32.BF16 R8, R12, R16, R8", "20", "400", "20", "0", "0", "0"],
    ["0x50", "HMMA.16816.F32.BF16 R8, R12, R18, R8", "10", "400", "10", "0", "0", "0"],
    ["0x60", "EXIT", "0", "100", "0", "0", "0", "0"],
]


def _write(path: Path, kernels=("kd_mla_tc_partial",)) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        for k in kernels:
            w.writerow(["Kernel Name", k])
            w.writerow(HEADER)
            w.writerows(BODY)
    return path


def test_summary_sums_stalls_opcodes_and_phases(tmp_path):
    text = hot.report(hot.read(str(_write(tmp_path / "p.csv"))), top=3)
    assert "6 SASS instructions, 100 stall samples, 1200 warp instructions executed" in text
    assert "long_sb 60.0%" in text and "wait 30.0%" in text and "barrier 8.0%" in text
    assert "HMMA        66.7% /  30.0%" in text  # 800 of 1200 executed, 30 of 100 samples
    # phase 1 ends at the barrier (70 samples), phase 2 at EXIT (30)
    assert "    0-    2  70.0%" in text and "    3-    5  30.0%" in text
    hottest = text.split("hottest 3 instructions")[1]
    assert "SHF.R.S32.HI" in hottest and "LDG.E" not in hottest  # 2 samples: not among the top 3


def test_picks_the_named_kernel_and_names_what_is_there(tmp_path):
    path = _write(tmp_path / "two.csv", kernels=("kd_mla_tc_partial", "kd_mla_tc_merge"))
    assert len(hot.read(str(path), "kd_mla_tc_merge")) == len(BODY)
    with pytest.raises(SystemExit, match="kd_mla_tc_partial, kd_mla_tc_merge"):
        hot.read(str(path), "nope")


def test_not_a_source_page_says_how_to_make_one(tmp_path):
    bad = tmp_path / "details.csv"
    bad.write_text('"ID","Metric Name"\n"0","Duration"\n')
    with pytest.raises(SystemExit, match="--page source --csv --print-source sass"):
        hot.read(str(bad))
