"""kdkit.perf.kernel_ab: exporting commits' kdkit, the shapes it times, its table; the timing
itself on a GPU."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kdkit import backends
from kdkit.perf import bench
from kdkit.perf import kernel_ab as ab

ROOT = Path(__file__).resolve().parents[1]

HAS_GIT = shutil.which("git") is not None and subprocess.run(
    ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode == 0
needs_git = pytest.mark.skipif(not HAS_GIT, reason="needs git and this tree's history")


@needs_git
def test_export_writes_each_refs_package(tmp_path):
    refs = ab.export(tmp_path, ["base=HEAD", "HEAD"])  # (a shallow clone has no HEAD~1)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert list(refs) == ["base", "HEAD"] and refs["base"]["commit"] == head
    for name in refs:
        assert (tmp_path / name / "kdkit" / "kernel" / "cuda" / "mla_tc.cu").is_file()
        assert not (tmp_path / name / "tests").exists()  # the package only
    assert json.loads((tmp_path / "refs.json").read_text()) == refs
    # the committed file, not the working tree's
    shown = subprocess.run(["git", "-C", str(ROOT), "show", "HEAD:kdkit/kernel/schedule.py"],
                           capture_output=True, text=True).stdout
    assert (tmp_path / "base" / "kdkit" / "kernel" / "schedule.py").read_text() == shown


@needs_git
def test_export_refuses_what_would_be_lost_or_wrong(tmp_path):
    ab.export(tmp_path, ["a=HEAD"])
    with pytest.raises(SystemExit, match="exists"):
        ab.export(tmp_path, ["a=HEAD"])  # a variant already written is never overwritten
    with pytest.raises(SystemExit, match="not a commit"):
        ab.export(tmp_path, ["b=HEAD", "d=no-such-ref-anywhere"])
    assert not (tmp_path / "b").exists()  # nothing written when one ref is bad
    with pytest.raises(SystemExit, match="share a name"):
        ab.export(tmp_path, ["c=HEAD", "c=HEAD"])
    with pytest.raises(SystemExit, match="variant name"):
        ab.export(tmp_path, ["../x=HEAD"])
    # an experiment's define the commit's kernel source never mentions (mma_peak.cu's own do not count)
    for define in ("KP_NOT_READ_ANYWHERE", "KD_CHAINS"):
        with pytest.raises(SystemExit, match=f"{define} .variant e.: the kernel's source at HEAD never reads it"):
            ab.export(tmp_path, [f"e=HEAD:extra_defines={define}=1"])
        assert not (tmp_path / "e").exists()


def test_variant_names():
    assert ab._variant("HEAD~1") == ("HEAD-1", "HEAD~1", {})
    assert ab._variant("origin/kernel-skip") == ("origin-kernel-skip", "origin/kernel-skip", {})
    assert ab._variant("new=abc123") == ("new", "abc123", {})


def test_variant_plan_options():
    assert ab._variant("g=main:skip=gather,nt=3") == ("g", "main", {"skip": "gather", "nt": 3})
    assert ab._variant("f0=kernel-fused:fused=false") == ("f0", "kernel-fused", {"fused": False})
    assert ab._variant("p=main:skip=false,nsplit=none") == ("p", "main", {"skip": False, "nsplit": None})
    assert ab._variant("main:skip=true") == ("main", "main", {"skip": True})
    assert ab._variant("ko=main:knockout=copy-wait") == ("ko", "main", {"knockout": "copy-wait"})
    assert ab._variant("m=main:mutant=skip-rope") == ("m", "main", {"mutant": "skip-rope"})
    for bad in ("a=main:warps=8", "a=main:skip"):
        with pytest.raises(SystemExit, match="KEY=VALUE"):
            ab._variant(bad)


def test_variant_extra_defines():
    """An experiment's defines ride along as a dict of whole numbers, several joined by '+'."""
    assert ab._variant("s=main:extra_defines=KD_MAX_SLACK=0") == ("s", "main", {"extra_defines": {"KD_MAX_SLACK": 0}})
    assert ab._variant("s=br:nt=8,extra_defines=KP_A=1+KP_B=-2") == (
        "s", "br", {"nt": 8, "extra_defines": {"KP_A": 1, "KP_B": -2}})
    for bad in ("s=main:extra_defines=KP_A", "s=main:extra_defines=KP_A=x", "s=main:extra_defines=KP_A=1+",
                "s=main:extra_defines=KP_A=1+KP_A=2"):
        with pytest.raises(SystemExit, match="NAME=INTEGER, several joined by '[+]', each name once"):
            ab._variant(bad)
    # the names as the plan checks them, before anything is exported
    for bad, why in (("KD_NT=2", "sets it itself"), (".=1", "in capitals"), ("KD_MUT_SCALE=1", "sets it itself")):
        with pytest.raises(SystemExit, match=why):
            ab._variant(f"s=main:extra_defines={bad}")


def test_shapes_are_the_quick_set_and_the_deep_trees():
    quick = [(s.bs, s.prefix, s.q_len, s.heads) for s in bench.grid(quick=True)]
    got = ab.shapes(None)
    assert got[:len(quick)] == quick and set(ab.DEEP) <= set(got)
    assert ab.shapes("32x131072 q9") == [(32, 131072, 9, 8), (32, 131072, 9, 16)]
    assert ab.shapes("1x21 q9 H8, 32x131072 q9 H16") == [(1, 21, 9, 8), (32, 131072, 9, 16)]
    with pytest.raises(SystemExit, match="matches no shape"):
        ab.shapes("7x7")
    # the cases are kdkit bench's: the grid's tree and seed ride along to the timing process
    grid = {(s.bs, s.prefix, s.q_len, s.heads): (s.tree, s.seed) for s in bench.grid()}
    full = ab._grid_shapes(None)
    assert [f[:4] for f in full] == got and all(tuple(f[4:]) == grid[f[:4]] for f in full)


def test_table_gives_each_variants_range_and_ratio(tmp_path):
    (tmp_path / "refs.json").write_text(json.dumps({"main": {"ref": "main", "commit": "a" * 40},
                                                    "new": {"ref": "x", "commit": "b" * 40}}))
    rows = [dict(variant=v, bs=1, prefix=21, q_len=9, heads=8, us=us)
            for v, us in [("main", 8.0), ("new", 6.0), ("new", 6.5), ("main", 8.4)]]
    (tmp_path / "times.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = ab.table(tmp_path).splitlines()
    assert lines[0] == "shape | main (aaaaaaa) | new (bbbbbbb)"
    # rows of "new" from another commit (exported again under the same name) are left out
    with open(tmp_path / "times.jsonl", "a") as f:
        f.write(json.dumps(dict(variant="new", commit="c" * 40, bs=1, prefix=21, q_len=9, heads=8, us=1.0)) + "\n")
        f.write(json.dumps(dict(variant="new", commit="b" * 40, bs=1, prefix=21, q_len=9, heads=8, us=6.2)) + "\n")
    assert ab.table(tmp_path).splitlines() == lines
    assert lines[2] == "1x21 q9 H8 | 8.00-8.40 us | 6.00-6.50 us x0.750"
    # a shape the baseline lacks: no ratio against another variant
    (tmp_path / "times.jsonl").write_text(json.dumps(dict(variant="new", bs=1, prefix=21, q_len=9, heads=8, us=6.0)))
    assert ab.table(tmp_path).splitlines()[2] == "1x21 q9 H8 | - | 6.00-6.00 us"


def test_table_marks_a_variant_judged_wrong(tmp_path):
    """A variant whose output was judged wrong at a shape (a row with no time) reads WRONG there,
    whatever a later round timed; the other shapes keep its times."""
    (tmp_path / "refs.json").write_text(json.dumps({"main": {"ref": "main", "commit": "a" * 40},
                                                    "bad": {"ref": "x", "commit": "b" * 40}}))
    rows = [dict(variant="main", bs=1, prefix=21, q_len=9, heads=8, us=8.0),
            dict(variant="bad", bs=1, prefix=21, q_len=9, heads=8, us=None, verdict="FAIL against ..."),
            dict(variant="bad", bs=1, prefix=21, q_len=9, heads=8, us=5.0),
            dict(variant="main", bs=1, prefix=1024, q_len=9, heads=8, us=14.0),
            dict(variant="bad", bs=1, prefix=1024, q_len=9, heads=8, us=7.0)]
    (tmp_path / "times.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = ab.table(tmp_path).splitlines()
    assert lines[2] == "1x21 q9 H8 | 8.00-8.00 us | WRONG"
    assert lines[3] == "1x1024 q9 H8 | 14.00-14.00 us | 7.00-7.00 us x0.500"


def test_table_titles_a_variant_as_it_was_written(tmp_path):
    (tmp_path / "refs.json").write_text(json.dumps({"s": {"ref": "br", "commit": "a" * 40, "opts": {
        "nt": 8, "extra_defines": {"KP_A": 1, "KP_B": -2}}}}))
    (tmp_path / "times.jsonl").write_text(json.dumps(dict(variant="s", bs=1, prefix=21, q_len=9, heads=8, us=6.0)))
    assert ab.table(tmp_path).splitlines()[0] == "shape | s (aaaaaaa nt=8,extra_defines=KP_A=1+KP_B=-2)"


def test_table_without_rows_says_so(tmp_path):
    (tmp_path / "refs.json").write_text(json.dumps({"main": {"ref": "main", "commit": "a" * 40}}))
    assert "no rows" in ab.table(tmp_path)


@pytest.mark.gpu
@needs_git
@pytest.mark.skipif(backends.unavailable("cuda") is not None, reason=backends.unavailable("cuda") or "")
def test_times_two_variants_on_the_gpu(tmp_path):
    ab.export(tmp_path, ["a=HEAD", "b=HEAD:nt=2,nsplit=1"])
    assert ab.time_all(tmp_path, "1x21 q9 H8", rounds=2, budget_s=0.05) == 0
    rows = [json.loads(line) for line in (tmp_path / "times.jsonl").read_text().splitlines()]
    assert sorted((r["variant"], r["round"]) for r in rows) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert all(r["us"] > 0 and r["module"].startswith("mla_tc-") for r in rows)
    assert {r["module"].split("-")[1] for r in rows if r["variant"] == "b"} == {"nt2"}  # its options reached the plan
    assert "b (" in ab.table(tmp_path) and "nt=2,nsplit=1" in ab.table(tmp_path)
    # the first round judged each variant's output before timing it (the later ones do not)
    assert all(r["verdict"].startswith("PASS against the float64 oracle") for r in rows if r["round"] == 0)
    assert not any("verdict" in r for r in rows if r["round"] == 1)


@pytest.mark.gpu
@needs_git
@pytest.mark.skipif(backends.unavailable("cuda") is not None, reason=backends.unavailable("cuda") or "")
def test_a_wrong_variant_is_not_timed(tmp_path):
    """A mutant is judged wrong in the first round: its row has the verdict and no time, and the
    table says WRONG; a knockout (wrong by design) is timed unjudged; --no-judge times everything."""
    ab.export(tmp_path, ["a=HEAD", "m=HEAD:mutant=no-scale", "k=HEAD:knockout=softmax"])
    assert ab.time_all(tmp_path, "1x21 q9 H8", rounds=2, budget_s=0.05) == 0
    rows = [json.loads(line) for line in (tmp_path / "times.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows if r["variant"] == "m"] == [0]  # not timed again in round 1
    rows = {r["variant"]: r for r in rows if r["round"] == 0}
    assert rows["m"]["us"] is None and rows["m"]["verdict"].startswith("FAIL")
    assert rows["a"]["us"] > 0 and rows["k"]["us"] > 0 and "verdict" not in rows["k"]
    assert ab.table(tmp_path).splitlines()[2].split(" | ")[2] == "WRONG"
    (tmp_path / "times.jsonl").unlink()
    assert ab.time_all(tmp_path, "1x21 q9 H8", rounds=1, budget_s=0.05, judge=False) == 0
    rows = [json.loads(line) for line in (tmp_path / "times.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["us"] > 0 and "verdict" not in r for r in rows)
