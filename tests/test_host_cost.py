"""kdkit.perf.host_cost, the probe of run()'s host time: a shape it cannot read is refused in one
line; on a GPU, a split shape's row says the plan fused the merge (one launch) and every time is a
positive number."""
from __future__ import annotations

import argparse
import json

import pytest

from kdkit import backends
from kdkit.perf import host_cost


def test_a_shape_it_cannot_read_is_refused():
    with pytest.raises(argparse.ArgumentTypeError, match=r"'1x21q9': write a shape as BSxPREFIXqQ_LENhHEADS"):
        host_cost._shape("1x21q9")
    assert host_cost._shape("4x8192q257h16").label == "4x8192 q257 H16"


@pytest.mark.gpu
@pytest.mark.skipif(backends.unavailable("cuda") is not None, reason=backends.unavailable("cuda") or "")
def test_a_split_shape_runs_in_one_launch(tmp_path):
    out = tmp_path / "host.json"
    assert host_cost.main(["--shapes", "1x1024q9h8", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    (row,) = got["rows"]
    # an empty kernel's eager call is the floor: nothing of run()'s can cost less
    assert 0 < got["floor"]["launcher_us"] <= row["run_us"] and 0 < got["floor"]["eager_us"] < row["eager_us"]
    assert row["nsplit"] > 1 and row["fused"] and row["kernels"] == 1
    assert all(row[k] > 0 for k in ("bind_us", "launcher_us", "run_us", "bare_driver_us", "eager_us", "gpu_us"))
