"""kdkit/shapes.json through kdkit.shapes: the one data file of named shapes."""
from __future__ import annotations

import json

import pytest

from kdkit import bundled, probes, shapes


def _key(s):
    return (s["bs"], json.dumps(s["prefix"]), json.dumps(s["q_len"]), s["heads"])


def test_every_set_reads_with_the_promised_keys():
    assert {"bundled", "gpu-tests", "bench", "bench-quick", "nsplit"} <= set(shapes.names())
    for name in shapes.names():
        got = shapes.get(name)
        assert got, name
        for s in got:
            assert {"name", "bs", "prefix", "q_len", "heads", "tree", "seed"} <= set(s), (name, s)


def test_bench_grid_is_issue_9s():
    bench = shapes.get("bench")
    grid = {(s["bs"], s["prefix"], s["q_len"], s["heads"]) for s in bench}
    left_out = 0
    for bs in (1, 8, 32):
        for prefix in (21, 1024, 8192, 32768, 131072):
            for q_len in (9, 64, 257):
                for heads in (8, 16):
                    s = dict(bs=bs, prefix=prefix, q_len=q_len, heads=heads)
                    fits = shapes.size(s)["kv_rows"] <= 262144 and shapes.size(s)["scores"] <= 2.5e9
                    assert ((bs, prefix, q_len, heads) in grid) == fits, s
                    left_out += not fits
    assert 0 < left_out < 45  # only the corners too big for one GPU command
    # the target shapes the grid lacks are there too, and --quick is a subset of the whole
    assert {(32, 4096, 9, 8), (4, 8192, 257, 8)} <= grid
    quick = shapes.get("bench-quick")
    assert 0 < len(quick) < len(bench) and {_key(s) for s in quick} <= {_key(s) for s in bench}
    assert len({s["name"] for s in bench}) == len(bench)  # labels are unique ids


def test_bundled_cases_are_the_bundled_shapes():
    """What data/captured_tensors/manifest.json records is what the data file says."""
    manifest = {e["case_id"].removeprefix("failure-"): e["shape"] for e in bundled.load_manifest()["cases"]}
    # the bundled set, and the probes small enough to commit (kdkit.probes.BUNDLED)
    want = shapes.get("bundled") + [s for s in shapes.get("probes") if s["name"] in probes.BUNDLED]
    assert sorted(manifest) == sorted(s["name"] for s in want)
    for s in want:
        shape = manifest[s["name"]]
        per = lambda v: v if isinstance(v, list) else [v] * s["bs"]  # noqa: E731
        assert (shape["bs"], shape["num_heads"]) == (s["bs"], s["heads"]), s["name"]
        assert shape["q_lens"] == per(s["q_len"]) and shape["prefix_lens"] == per(s["prefix"]), s["name"]


def test_make_case_builds_the_shape():
    s = shapes.find("gpu-tests", "split-counts")
    case = shapes.make_case(s)
    assert case.batch_size == 3 and case.q_lens == [9, 1, 33] and case.prefix_lens.tolist() == [0, 700, 5000]
    assert case.case_id == "split-counts"
    assert shapes.make_case(s, layout="unified").layout == "unified"


def test_get_hands_out_copies():
    a = shapes.get("bundled")
    a[0]["bs"] = 99
    assert shapes.get("bundled")[0]["bs"] == 1


@pytest.mark.parametrize("bad,match", [
    ({"bs": 1, "prefix": 21, "q_len": 9, "head": 8}, r"unknown key\(s\) \['head'\]"),
    ({"bs": 2, "prefix": [1, 2, 3], "q_len": 9}, r"prefix \[1, 2, 3\] must be .* a list of 2"),
    ({"bs": 1, "prefix": 21, "q_len": 0}, r"q_len 0 must be an int >= 1"),
    ({"bs": 1, "prefix": 21, "q_len": 9, "tree": "oak"}, r"tree 'oak'"),
])
def test_a_bad_shape_is_named(tmp_path, bad, match):
    doc = {"format": "kdkit-shapes", "version": 1, "defaults": {"heads": 8, "tree": "ddtree", "seed": 0},
           "sets": {"mine": {"shapes": [bad]}}}
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(shapes.ShapeError, match=r"set 'mine' .*" + match):
        shapes.get("mine", path)
    with pytest.raises(KeyError, match="no shape set 'nope'"):
        shapes.get("nope")
