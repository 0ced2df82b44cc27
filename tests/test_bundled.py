"""The bundled cases: the manifest matches the files, the recorded expectations hold, the bundle
stays small, and rebuilding reproduces the same tensors."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kdkit import bundled, lint
from kdkit.judge import oracle
from kdkit.case import TENSOR_FIELDS, load

from conftest import DATA as OUT  # data/captured_tensors, or KDKIT_TEST_DATA

MANIFEST = bundled.load_manifest(OUT)
ENTRIES = MANIFEST["cases"]


def test_manifest_lists_exactly_the_specs_and_the_files():
    assert [e["path"] for e in ENTRIES] == [s.path for s in bundled.SPECS]
    on_disk = sorted(p.relative_to(OUT).as_posix() for p in OUT.rglob("*.pt"))
    assert on_disk == sorted(e["path"] for e in ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["path"])
def test_file_matches_manifest(entry):
    f = OUT / entry["path"]
    assert f.stat().st_size == entry["bytes"]
    assert bundled.sha256(f) == entry["sha256"], "file changed: rebuild with `python -m kdkit.bundled --force`"
    case = load(f)
    assert case.meta["source"] == entry["source"] == "synthetic"
    assert "SYNTHETIC" in case.meta["note"] and case.meta["note"] == entry["note"]
    assert bundled.shape_of(case) == entry["shape"]
    assert entry["expected_replay"] in ("pass", "lint-error")
    assert (entry["expected_replay"] == "pass") == (entry["expected_lint"] == [])


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["path"])
def test_recorded_expectations_hold(entry):
    case = load(OUT / entry["path"])
    assert sorted({f.code for f in lint.errors(case)}) == entry["expected_lint"]
    if entry["expected_replay"] == "pass":
        out, lse = oracle.run(case)
        assert np.isfinite(out).all() and np.isfinite(lse).all()
        assert np.abs(out).max() > 0  # a real output, not the all-zero "saw nothing" fallback


def test_failure_cases_are_the_seed_bugs():
    by_path = {e["path"]: e for e in ENTRIES}
    sliced = load(OUT / "failures/mask-indptr-sliced.pt")
    assert sliced.batch_size == 2 and sliced.mask_indptr.tolist() == [270, 540]
    assert by_path["failures/mask-indptr-sliced.pt"]["expected_lint"] == ["mask-indptr-sliced"]
    prefix_only = load(OUT / "failures/prefix-only-kv-indices.pt")
    assert prefix_only.layout == "unified" and prefix_only.kv_indptr.tolist() == [0, 21]
    assert prefix_only.custom_mask.numel() == 270
    assert by_path["failures/prefix-only-kv-indices.pt"]["expected_lint"] == ["prefix-only-kv-indices"]


def test_good_case_shapes():
    shape = {e["path"]: e["shape"] for e in ENTRIES}
    s = shape["seed-shape.pt"]
    assert (s["bs"], s["prefix_lens"], s["q_lens"], s["num_heads"], s["mask_entries"]) == (1, [21], [9], 8, 270)
    r = shape["ragged-bs4.pt"]
    assert r["bs"] == 4 and 0 in r["prefix_lens"] and 1 in r["q_lens"] and len(set(r["prefix_lens"])) == 4
    assert shape["ddtree-b64.pt"]["q_lens"] == [65] and shape["ddtree-b64.pt"]["num_heads"] == 8
    assert shape["long-prefix-8k.pt"]["prefix_lens"] == [8192] and shape["long-prefix-8k.pt"]["q_lens"] == [9]


def test_total_size_under_50_mb():
    total = sum((OUT / e["path"]).stat().st_size for e in ENTRIES) + (OUT / bundled.MANIFEST).stat().st_size
    assert total < 50 * 1024 * 1024
    assert MANIFEST["total_bytes"] == sum(e["bytes"] for e in ENTRIES)


def test_verify_reports_nothing_for_the_committed_bundle():
    assert bundled.verify(OUT) == []


def _same(a, b) -> bool:
    """Bitwise-equal tensors (NaN == NaN: synthetic pools poison the scratch row)."""
    if a is None or b is None:
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(0), b.nan_to_num(0))
    return torch.equal(a, b)


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle")
    manifest = bundled.build(out, log=lambda *_: None)
    return out, manifest


def test_rebuild_reproduces_the_same_tensors(rebuilt):
    out, manifest = rebuilt
    assert [e["path"] for e in manifest["cases"]] == [e["path"] for e in ENTRIES]
    for e in ENTRIES:
        old, new = load(OUT / e["path"]), load(out / e["path"])
        for name in TENSOR_FIELDS:
            assert _same(getattr(old, name), getattr(new, name)), f"{e['path']}: {name} differs"
        volatile = {"torch_version"}
        assert {k: v for k, v in old.meta.items() if k not in volatile} == \
               {k: v for k, v in new.meta.items() if k not in volatile}
    if manifest["torch_version"] == MANIFEST["torch_version"]:
        # same torch: byte-identical files (fixed seeds, fixed meta.created)
        assert [e["sha256"] for e in manifest["cases"]] == [e["sha256"] for e in ENTRIES]
    assert bundled.verify(out, oracle=False) == []


def test_build_never_overwrites_without_force(rebuilt):
    out, _ = rebuilt
    f = out / "seed-shape.pt"
    before = f.read_bytes()
    f.write_bytes(before[:100])  # a damaged file: verify must notice, build must not touch it
    assert any("seed-shape.pt" in p for p in bundled.verify(out, oracle=False))
    with pytest.raises(FileExistsError, match="--force"):
        bundled.build(out, log=lambda *_: None)
    assert f.read_bytes() == before[:100]
    assert bundled.main(["--out", str(out)]) == 1
    bundled.build(out, force=True, log=lambda *_: None)
    assert bundled.verify(out, oracle=False) == []
    assert json.loads((out / "manifest.json").read_text())["cases"][0]["path"] == "seed-shape.pt"


def test_build_case_by_name_matches_the_file():
    case = bundled.build_case("mask-indptr-sliced")
    assert _same(case.mask_indptr, load(OUT / "failures/mask-indptr-sliced.pt").mask_indptr)
    with pytest.raises(KeyError, match="choose from"):
        bundled.build_case("nope")
