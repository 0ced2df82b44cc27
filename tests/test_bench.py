"""kdkit bench on a CPU: its grid, its arithmetic, its summary of committed results, its argument
checks (the GPU run itself is `kdkit bench` on a GPU host; its results are committed)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kdkit import bench, bench_results, shapes
from kdkit.cli import main

RESULTS = sorted(Path(bench.RESULTS).glob("*.json"))


def test_grid_comes_from_shapes_json():
    quick = bench.grid(quick=True)
    assert len(quick) == 9 and bench.Shape(1, 32768, 9, 8) in quick and bench.Shape(4, 8192, 257, 8) in quick
    full = bench.grid()
    assert set(quick) <= set(full)
    assert all(s.bs * s.prefix <= 262144 for s in full if s not in quick)


def test_bytes_and_flops_of_a_shape():
    s = bench.Shape(1, 32768, 9, 8)
    # every KV row once (prefix + draft) x 576 x 2 bytes, plus q (576) and out (512) per row, bf16
    assert s.nbytes() == (32768 + 9) * 576 * 2 + 9 * 8 * (576 + 512) * 2
    # 2 x rows x KV length x (576 + 512)
    assert s.flops() == 2 * 9 * 8 * (32768 + 9) * (576 + 512)


@pytest.mark.skipif(not RESULTS, reason="no committed results under benchmarks/results")
@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_committed_results_are_well_formed_and_summarise(path):
    res = bench_results.load(path)  # the notebook's checks: every field of every row
    raw = json.loads(path.read_text())
    for key in ("gpu", "sms", "copy_gbps", "mma_tflops", "driver", "versions", "date"):
        assert key in raw
    text = bench.summary(raw)
    assert raw["gpu"] in text
    for r in raw["rows"]:
        assert f"{r['bs']} x {r['prefix']}, {r['q_len']}, {r['heads']}" in text
        # the roofline fraction is the floor over the time, as the README defines it
        assert r["roofline_frac"] == pytest.approx(r["floor_us"] / r["us"], rel=2e-2, abs=2e-4)
    assert res is not None


@pytest.mark.parametrize("argv", [["--backends", "bogus"], ["--nsplit", "x"], ["--nsplit", "0"],
                                  ["--shapes", "no-such-shape"]])
def test_bad_arguments_exit_2_before_the_gpu(argv, capsys):
    try:
        rc = main(["bench", *argv])
    except SystemExit as e:  # argparse's own refusal of a bad value
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert err.strip() and "Traceback" not in err


def _shapes_file(tmp_path, bench_set):
    doc = {"format": "kdkit-shapes", "version": 1, "defaults": {"heads": 8, "tree": "ddtree", "seed": 0},
           "sets": {"bench": bench_set, "bench-quick": bench_set}}
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_ragged_bench_shape_is_refused_by_name(tmp_path):
    """A per-request prefix or q_len has no one byte count or row in the results: refused with the
    shapes module's error naming the set and the shape, not a TypeError deep in the arithmetic."""
    path = _shapes_file(tmp_path, {"shapes": [{"bs": 1, "prefix": 21, "q_len": 9},
                                              {"name": "ragged", "bs": 2, "prefix": [21, 300], "q_len": 9}]})
    for quick in (False, True):
        with pytest.raises(shapes.ShapeError, match=r"set 'bench(-quick)?' shape 1 \(ragged\): prefix given per request"):
            bench.grid(quick, path=path)


def test_a_bench_shape_keeps_its_tree_and_seed(tmp_path):
    path = _shapes_file(tmp_path, {"defaults": {"seed": 5}, "shapes": [
        {"bs": 1, "prefix": 40, "q_len": 9, "tree": "chain"}, {"name": "other", "bs": 1, "prefix": 40, "q_len": 9, "seed": 6}]})
    chain, other = bench.grid(path=path)
    assert (chain.tree, chain.seed, other.tree, other.seed) == ("chain", 5, "ddtree", 6)
    case = bench.make_case(chain)
    assert case.custom_mask is not None
    want = shapes.make_case({"bs": 1, "prefix": 40, "q_len": 9, "heads": 8, "tree": "chain", "seed": 5})
    assert torch.equal(case.q, want.q)      # the seed reached the data
    assert torch.equal(case.custom_mask, want.custom_mask)  # and the tree the mask
    # the committed grid: tree and seed as kdkit bench has always made them (ddtree, seed 1)
    assert {(s.tree, s.seed) for s in bench.grid() + bench.grid(quick=True)} == {("ddtree", 1)}
