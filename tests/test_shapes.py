"""kdkit/shapes.json through kdkit.shapes: the one data file of named shapes."""
from __future__ import annotations

import ast
import json
import re

import pytest
import torch

from kdkit import bundled, shapes, synth
from kdkit.judge import heavy_cases

from conftest import ROOT


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
                    fits = shapes.size(s)["scores"] <= 2.5e9  # KV unbounded: 4.2M rows are ~4.8 GB
                    assert ((bs, prefix, q_len, heads) in grid) == fits, s
                    left_out += not fits
    assert left_out == 5  # only the corners whose scores are too many for one GPU command
    # the target shapes the grid lacks are there too, and --quick is a subset of the whole
    assert {(32, 4096, 9, 8), (4, 8192, 257, 8)} <= grid
    quick = shapes.get("bench-quick")
    assert 0 < len(quick) < len(bench) and {_key(s) for s in quick} <= {_key(s) for s in bench}
    assert len({s["name"] for s in bench}) == len(bench)  # labels are unique ids


def test_bundled_cases_are_the_bundled_shapes():
    """What data/captured_tensors/manifest.json records is what the data file says."""
    manifest = {e["case_id"].removeprefix("failure-"): e["shape"] for e in bundled.load_manifest()["cases"]}
    # the bundled set, and the probes small enough to commit (kdkit.judge.heavy_cases.BUNDLED)
    want = shapes.get("bundled") + [s for s in shapes.get("probes") if s["name"] in heavy_cases.BUNDLED]
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


def test_make_case_takes_a_shape_written_by_hand():
    """A hand-written shape names bs, prefix and q_len; the rest take make_case's defaults (a GPU
    test met a KeyError for the tree it left out)."""
    case = shapes.make_case({"bs": 1, "prefix": 64, "q_len": 9, "seed": 1})
    assert case.q.shape[:2] == (9, synth.KIMI_HEADS_PER_RANK) and case.custom_mask is not None
    with pytest.raises(shapes.ShapeError, match="no q_len"):
        shapes.make_case({"bs": 1, "prefix": 64})


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


def test_docstring_names_every_set():
    """The module docstring's shapes.names() example is the file's list of sets."""
    listed = re.search(r"shapes\.names\(\)\s*# (\[.*?\])", shapes.__doc__, re.S).group(1)
    assert ast.literal_eval(re.sub(r"\s*#\s*", " ", listed)) == shapes.names()


def test_a_set_has_its_own_defaults_and_no_unknown_key(tmp_path):
    doc = {"format": "kdkit-shapes", "version": 1, "defaults": {"heads": 8, "tree": "ddtree", "seed": 0},
           "sets": {"mine": {"defaults": {"seed": 7, "tree": "chain"},
                             "shapes": [{"bs": 1, "prefix": 21, "q_len": 9},
                                        {"name": "own", "bs": 1, "prefix": 21, "q_len": 9, "seed": 2}]},
                    "typo": {"default": {"seed": 7}, "shapes": [{"bs": 1, "prefix": 21, "q_len": 9}]}}}
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(shapes.ShapeError, match=r"set 'typo': unknown key\(s\) \['default'\]"):
        shapes.get("mine", path)
    del doc["sets"]["typo"]
    path = tmp_path / "fixed.json"
    path.write_text(json.dumps(doc))
    assert [(s["seed"], s["tree"], s["heads"]) for s in shapes.get("mine", path)] == [(7, "chain", 8), (2, "chain", 8)]


# What the GPU-only files built before their shapes moved into shapes.json (synth.make_case
# arguments): the sets must make exactly these cases, so the GPU results stay those of the same cases.
GRAPH_REPLAY = [dict(bs=2, prefix=p, q_len=q, tree="ddtree", seed=s) for p, q, s in
                [([300, 1200], [9, 9], 11), ([1200, 300], [9, 9], 12), ([750, 750], [9, 9], 13),
                 ([800, 700], [1, 17], 14), ([0, 1500], [17, 1], 15)]]
MANY_LAYERS = dict(bs=2, prefix=[40, 900], q_len=9, tree="ddtree", seed=20)
SELFCHECK = {
    "seed-shape": dict(bs=1, prefix=21, q_len=9, tree="eagle"),
    "ragged-prefix-0": dict(bs=4, prefix=[0, 5, 300, 2000], q_len=[9, 1, 33, 17], tree="ddtree"),
    "unified-layout": dict(bs=2, prefix=[40, 900], q_len=9, tree="ddtree", layout="unified"),
    "one-split": dict(bs=2, prefix=[40, 900], q_len=9, tree="chain"),
    "many-splits": dict(bs=1, prefix=4000, q_len=9, tree="ddtree"),
    "q1025-h1": dict(bs=1, prefix=64, q_len=1025, heads=1, tree="ddtree"),
    "h128-uint8-mask-int64-idx": dict(bs=2, prefix=[7, 60], q_len=5, heads=128, tree="eagle",
                                      mask_dtype=torch.uint8, index_dtype=torch.int64),
    "causal-no-mask-capped": dict(bs=2, prefix=[0, 100], q_len=17, tree="causal", logit_cap=30.0, magnitude=30.0),
    "rows-see-only-themselves": dict(bs=1, prefix=10, q_len=9, tree="diagonal"),
}
SELFCHECK_RUN = {"one-split": {"nsplit": 1}, "many-splits": {"nsplit": 256}, "ragged-prefix-0": {"skip": True}}


def _same_case(a, b):
    for f in ("q", "k", "v", "kv_buffer", "qo_indptr", "kv_indptr", "kv_indices", "prefix_lens",
              "custom_mask", "mask_indptr", "out_cache_loc"):
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x.nan_to_num(), y.nan_to_num()), f
    assert (a.layout, a.sm_scale, a.logit_cap, a.causal) == (b.layout, b.sm_scale, b.logit_cap, b.causal)


def test_gpu_test_sets_make_the_gpu_tests_cases():
    """tests/test_cuda_kernel.py's graph replay (in order; max_q_len=9 keeps the first three) and
    its many-layers case."""
    got = shapes.get("gpu-graph-replay")
    assert len(got) == len(GRAPH_REPLAY)
    for s, want in zip(got, GRAPH_REPLAY):
        _same_case(shapes.make_case(s, spare_rows=0, index_dtype=torch.int64),
                   synth.make_case(**want, spare_rows=0, index_dtype=torch.int64))
    assert [max(shapes.per_request(s, "q_len")) <= 9 for s in got] == [True] * 3 + [False] * 2
    _same_case(shapes.make_case(shapes.find("gpu-tests", "many-layers"), poison_unused=False),
               synth.make_case(**MANY_LAYERS, poison_unused=False))


def test_gpu_selfcheck_set_makes_the_scripts_cases():
    """kdkit.perf.gpu_selfcheck's cases (seed 7 each), with its nsplit and dtype overrides."""
    from kdkit.perf import gpu_selfcheck as script  # imports no GPU code until main()
    got = list(script.cases())
    assert [name for name, _, _ in got] == list(SELFCHECK)
    for name, case, opts in got:
        _same_case(case, synth.make_case(seed=7, **SELFCHECK[name]))
        assert opts == SELFCHECK_RUN.get(name, {}), name
