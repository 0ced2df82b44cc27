"""kdkit bench on a CPU: its grid, its arithmetic, its summary of committed results, its argument
checks (the GPU run itself is `kdkit bench` on a GPU host; its results are committed)."""
from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
import torch

from kdkit import shapes
from kdkit.perf import bench, results as bench_results
from kdkit.cli import main

RESULTS = sorted(Path(bench.RESULTS).glob("*.json"))


def test_grid_comes_from_shapes_json():
    quick = bench.grid(quick=True)
    assert len(quick) == 18 and bench.Shape(1, 32768, 9, 8) in quick and bench.Shape(4, 8192, 257, 8) in quick
    assert bench.Shape(4, 8192, 257, 16) in quick and bench.Shape(1, 32768, 64, 16) in quick  # H 16 joins
    full = bench.grid()
    assert set(quick) <= set(full)
    # issue 9's grid: bs 1, 8, 32 x prefix 21..128K x q_len 9, 64, 257 x H 8, 16, KV unbounded (bs 8 x
    # 128K and bs 32 x 32K / 128K included); only the five corners of more than 2.5e9 scores left out
    grid = {(s.bs, s.prefix, s.q_len, s.heads) for s in full}
    assert {(8, 131072, 9, 8), (32, 32768, 64, 16), (32, 131072, 64, 8), (8, 131072, 257, 8)} <= grid
    left_out = {(b, p, q, h) for b in (1, 8, 32) for p in (21, 1024, 8192, 32768, 131072)
                for q in (9, 64, 257) for h in (8, 16)} - grid
    assert left_out == {(8, 131072, 257, 16), (32, 32768, 257, 16), (32, 131072, 64, 16),
                        (32, 131072, 257, 8), (32, 131072, 257, 16)}
    assert all(b * q * h * (p + q) > 2.5e9 for b, p, q, h in left_out)
    assert len(full) == 85 + 4  # and the issues' bs 32 x 4K and bs 4 x 8K q257, at H 8 and H 16


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


@pytest.mark.parametrize("argv,says", [
    (["--backends", "bogus"], "bogus"), (["--nsplit", "x"], "'x'"), (["--nsplit", "0"], "1..256"),
    (["--nsplit", "1,300"], "1..256"), (["--shapes", "no-such-shape"], "no-such-shape"),
    (["--out", "{file}"], "{file}"), (["--out", "{file}/sub"], "{file}/sub")])
def test_bad_arguments_exit_2_before_the_gpu(argv, says, capsys, tmp_path):
    """Refused before any GPU work (on this CPU machine a GPU run would exit 1 instead): a split
    count above spec.MAX_SPLITS, an --out that is a file or lies under one."""
    file = tmp_path / "a-file"
    file.write_text("x")
    argv = [a.format(file=file) for a in argv]
    try:
        rc = main(["bench", *argv])
    except SystemExit as e:  # argparse's own refusal of a bad value
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert err.strip() and "Traceback" not in err and says.format(file=file) in err
    assert file.read_text() == "x"


def test_max_splits_is_the_kernels():
    from kdkit.kernel.spec import MAX_SPLITS
    assert MAX_SPLITS == 256  # the bound test_bad_arguments_exit_2_before_the_gpu names


def test_the_sweep_leaves_out_what_plan_refuses():
    """32 x 4K, q9, H8: 2304 rows; 128 and 256 splits need 576 and 1152 MiB of fp32 workspace,
    above schedule.WORKSPACE_LIMIT (512 MiB), which kernel.plan refuses: not swept. Nor the
    automatic split count (timed as its own row), nor more splits than KV steps of BLOCK_N."""
    from kdkit.kernel import schedule, spec
    every = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    big = bench.Shape(32, 4096, 9, 8)
    assert bench.swept_nsplits(big, every, auto=16) == [1, 2, 4, 8, 32, 64]
    rows = 32 * 9 * 8
    assert 64 * rows * spec.DL * 4 <= schedule.WORKSPACE_LIMIT < 128 * rows * spec.DL * 4
    # the seed's shape: 30 KV rows, one step of 32: only one split
    assert bench.swept_nsplits(bench.Shape(1, 21, 9, 8), every) == [1]
    # 1 x 128K: 4097 steps, 72 rows: every split count
    assert bench.swept_nsplits(bench.Shape(1, 131072, 9, 8), every) == every


def test_a_failing_save_keeps_the_measurements(tmp_path, monkeypatch, capsys):
    """The summary is printed before the file is written, and a save that fails (the directory
    taken away during the run) writes the results elsewhere and says where. The GPU run itself is
    stood in for by the committed results (no GPU here)."""
    if not RESULTS:
        pytest.skip("no committed results under benchmarks/results")
    import kdkit.kernel
    committed = json.loads(RESULTS[-1].read_text())
    out = tmp_path / "out"

    def run_grid(*a, **k):
        out.rmdir()
        out.write_text("now a file")  # the --out checked before the run is no directory now
        return committed
    monkeypatch.setattr(bench, "run_grid", run_grid)
    monkeypatch.setattr(kdkit.kernel, "unavailable", lambda: None)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the fallback goes
    rc = main(["bench", "--quick", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 1 and committed["gpu"] in cap.out  # the summary
    written = re.search(r"wrote (\S+\.json) instead", cap.err)
    assert written and str(out) in cap.err
    assert json.loads(Path(written.group(1)).read_text()) == committed


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


def _slices(tmp_path):
    """The committed run cut in two slices as `kdkit bench --shapes` would write them: the long
    prefixes measured later, with another copy bandwidth and mma rate."""
    runs = [json.loads(p.read_text()) for p in reversed(RESULTS)]  # the newest with rows on both sides
    committed = next(r for r in runs if {row["prefix"] < 32768 for row in r["rows"]} == {True, False})
    a = dict(committed, rows=[r for r in committed["rows"] if r["prefix"] < 32768])
    b = dict(committed, rows=[r for r in committed["rows"] if r["prefix"] >= 32768],
             date=committed["date"][:11] + "23:59:00+00:00",
             copy_gbps=committed["copy_gbps"] - 100, mma_tflops=committed["mma_tflops"] + 7)
    assert a["rows"] and b["rows"] and a["date"][:10] == b["date"][:10] and a["date"] < b["date"]
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    return committed, a, b, pa, pb


@pytest.mark.skipif(not RESULTS, reason="no committed results under benchmarks/results")
def test_slices_combine_into_one_run(tmp_path):
    committed, a, b, pa, pb = _slices(tmp_path)
    both = bench_results.combine([pb, pa])  # any order: slices sorted by date
    assert both["rows"] == a["rows"] + b["rows"]  # every row as measured, floor_us and roofline_frac too
    assert [(s["file"], s["date"], s["copy_gbps"], s["mma_tflops"], s["rows"]) for s in both["slices"]] == [
        ("a.json", a["date"], a["copy_gbps"], a["mma_tflops"], len(a["rows"])),
        ("b.json", b["date"], b["copy_gbps"], b["mma_tflops"], len(b["rows"]))]
    assert (both["date"], both["copy_gbps"], both["gpu"]) == (b["date"], b["copy_gbps"], committed["gpu"])
    text = bench.summary(both)  # the table reads a combined run like a file, and names each slice's ceilings
    assert f"slice a.json ({a['date']}, {len(a['rows'])} rows): copy {a['copy_gbps']} GB/s" in text
    assert f"slice b.json ({b['date']}, {len(b['rows'])} rows): copy {b['copy_gbps']} GB/s" in text
    # the newest run set: both slices, not a run of another driver or another day
    for name, change in (("other-driver.json", {"driver": "1.0"}), ("day-before.json", {"date": "2026-01-01T00:00:00+00:00"})):
        (tmp_path / name).write_text(json.dumps(dict(b, **change, rows=b["rows"][:1])))
    assert bench_results.latest(tmp_path) == [pa, pb]
    res, source = bench.obtain(live=False, results_path=[pa, pb])
    assert res["rows"] == both["rows"] and "a.json, b.json" in source


@pytest.mark.skipif(not RESULTS, reason="no committed results under benchmarks/results")
def test_combine_refuses_other_gpus_and_keeps_the_later_duplicate(tmp_path):
    committed, a, b, pa, pb = _slices(tmp_path)
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(a, gpu="NVIDIA B200")))
    with pytest.raises(bench_results.ResultsError, match=r"different GPUs \(NVIDIA B200, NVIDIA H200"):
        bench_results.combine([pa, other])
    again = dict(b, rows=[dict(a["rows"][0], us=1.0)] + b["rows"])  # a row of slice a measured again in b
    pb.write_text(json.dumps(again))
    both = bench_results.combine([pa, pb])
    same = bench_results._measured(a["rows"][0])  # its backend and shape: all of a's rows of it go
    gone = [r for r in a["rows"] if bench_results._measured(r) == same]
    assert len(both["rows"]) == len(a["rows"]) - len(gone) + len(b["rows"]) + 1
    mine = [r for r in both["rows"] if bench_results._measured(r) == same]
    assert [r["us"] for r in mine] == [1.0]  # the later slice's measurement alone


def test_a_shape_measured_again_keeps_only_the_later_automatic_choice(tmp_path):
    """A later slice measures a shape again and the automatic split count has moved (11 -> 12): the
    earlier slice's automatic and graph rows go with the rest of its rows of that shape, so the
    verdicts read the later choice; its skip notes of that shape go too; a slice cut short leaves
    the set incomplete."""
    def row(us, nsplit, auto, graph=False, backend="cuda"):
        return {"backend": backend, "bs": 1, "prefix": 1024, "q_len": 9, "heads": 8, "nsplit": nsplit,
                "nsplit_auto": auto, "graph": graph, "us": us, "gbps": 1.0, "floor_us": 0.3,
                "roofline_frac": 0.3 / us, "speedup_vs_triton": None}
    head = {"gpu": "NVIDIA H200", "sms": 132, "copy_gbps": 4287.0, "mma_tflops": 642.6, "driver": "580",
            "versions": {}}
    old = dict(head, date="2026-12-02T10:00:00+00:00", complete=True,
               rows=[row(9.0, 11, True), row(8.0, 11, True, graph=True), row(9.5, 16, False),
                     row(20.0, None, False, backend="triton_sglang")],
               skipped={"cuda 1x1024 q9 H8 nsplit 256": "too many splits"})
    new = dict(head, date="2026-12-02T11:00:00+00:00", complete=False, stopped="CUDA error",
               rows=[row(6.0, 12, True), row(5.5, 12, True, graph=True), row(6.5, 16, False)], skipped={})
    po, pn = tmp_path / "old.json", tmp_path / "new.json"
    po.write_text(json.dumps(old))
    pn.write_text(json.dumps(new))
    both = bench_results.combine([po, pn])
    cuda = [(r["nsplit"], r["nsplit_auto"], r["graph"], r["us"]) for r in both["rows"] if r["backend"] == "cuda"]
    assert cuda == [(12, True, False, 6.0), (12, True, True, 5.5), (16, False, False, 6.5)]
    assert [r["us"] for r in both["rows"] if r["backend"] == "triton_sglang"] == [20.0]  # not measured again
    assert both["skipped"] == {} and both["complete"] is False and both["stopped"] == "new.json: CUDA error"
    v = bench_results.verdicts(both)
    assert v["slower"] == [] and v["auto_beat_all"] == 1


def test_a_run_whose_every_write_failed_still_keeps_its_rows(tmp_path):
    """RunFile.partial kept nothing when the write failed, so a run stopped later by an error said
    "stopped before the first shape was measured" and lost what it had measured."""
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    run = bench.RunFile(blocked)
    res = {"gpu": "NVIDIA H200", "date": "2026-12-02T10:00:00+00:00", "rows": [{"backend": "cuda"}], "complete": False}
    run.partial(res)
    assert run.last is res and run.path is None


# the performance page holds the table and the grid's verdicts (the README was cut to five minutes)
PERF_DOC = Path(bench.RESULTS).parents[1] / "docs" / "performance.md"
README_RUN = Path(bench.RESULTS) / "nvidia-h200-20261204T055654.json"


@pytest.mark.skipif(not README_RUN.exists(), reason="the README's run is not committed")
def test_readme_performance_table_is_the_committed_run():
    """docs/performance.md's table is bench.readme_table of the run it names, cell for cell
    (every figure rounded once from the run; "(auto N)" where the automatic split count beat every
    fixed one), and the run holds the eighteen shapes of the quick set."""
    res = json.loads(README_RUN.read_text())
    text = PERF_DOC.read_text()
    assert README_RUN.name in text.split("# Performance", 1)[1].split("\n\n", 2)[1]
    table = text.split("| bs x prefix, q_len, H | roofline |", 1)[1].split("\n\n", 1)[0]
    got = ("| bs x prefix, q_len, H | roofline |" + table).splitlines()
    want = bench.readme_table(res).splitlines()
    assert len(want) == 2 + 18
    for g, w in zip(got, want, strict=True):
        assert g == w


def _graph_auto_us(res: dict) -> dict:
    """kdkit's automatic choice under graph replay, us, by (bs, prefix, q_len, heads)."""
    return {(r["bs"], r["prefix"], r["q_len"], r["heads"]): r["us"] for r in res["rows"]
            if r["backend"] == "cuda" and r["nsplit_auto"] and r["graph"]}


@pytest.mark.skipif(not README_RUN.exists(), reason="the README's run is not committed")
def test_readme_table_agrees_with_every_later_committed_run():
    """The performance page's table is not stale: every run of the same GPU committed after the one it
    quotes (a --quick run or a grid slice) measures kdkit's graph-replay time within noise on each
    of the table's shapes it holds. A kernel change that moves the time must bring a new table.
    Tolerances from the H200's own runs of one kernel (benchmarks/results, 2026-12-02): from 32K
    up runs agree within 2.1%, so 3%; below 32K a call is a few microseconds of launch latency and
    fixed work, and runs of the same kernel differ by up to 4.3% (the seed's shape) and 3.1%
    (1 x 8K), so 6%."""
    base = json.loads(README_RUN.read_text())
    want = _graph_auto_us(base)
    later = [p for p in sorted(Path(bench.RESULTS).glob("*.json")) if p.name > README_RUN.name]
    checked = 0
    for p in later:
        res = json.loads(p.read_text())
        if res["gpu"] != base["gpu"]:
            continue
        for key, us in _graph_auto_us(res).items():
            if key not in want:
                continue
            tol = 0.03 if key[1] >= 32768 else 0.06
            assert abs(us / want[key] - 1) <= tol, (p.name, key, us, want[key])
            checked += 1
    if not checked:
        pytest.skip("no run committed after the README's holds one of its shapes")


GRID_SLICES = [Path(bench.RESULTS) / f"nvidia-h200-20261202T{t}.json" for t in ("123935", "124041", "124308")]


@pytest.mark.skipif(not all(p.exists() for p in GRID_SLICES), reason="the README's grid is not committed")
def test_readme_grid_verdicts_are_the_committed_slices():
    """The performance page's grid paragraph names the three slices it quotes, and its verdicts are
    bench_results.verdicts of their combination: kdkit the fastest on every shape, the least
    speed-ups over Triton extend and torch, the automatic split count within 10% everywhere, how
    often it beat every fixed count and its worst ratio to the best."""
    text = PERF_DOC.read_text()
    para = text.split("The whole grid on main's kernel", 1)[1].split("\n\n#", 1)[0]
    flat = " ".join(para.split())
    for p in GRID_SLICES:
        assert p.name[len("nvidia-h200-20261202"):] in flat, p.name
    v = bench_results.verdicts(bench_results.combine(GRID_SLICES))
    assert v["slower"] == []
    assert f"kdkit is the fastest on all {v['shapes']} shapes" in flat
    assert f"Triton extend (by {v['least']['triton_sglang'][0]:.2f}x at the least" in flat
    assert f"torch eager ({v['least']['torch'][0]:.2f}x at the least" in flat
    assert v["auto_within"] == v["fixed"]
    assert f"within 10% of the best fixed one on all {v['fixed']} shapes" in flat
    assert f"on {v['auto_beat_all']} it beat every fixed" in flat
    assert f"at most {v['auto_worst'][0]:.3f}x off the best" in flat


def test_verdicts_find_a_faster_backend_and_the_worst_automatic_choice():
    """A made-up run: at one shape Triton extend beats kdkit's automatic choice, at the other a
    fixed split count beats it by 1.2x: both are reported, graph rows are left out."""
    def row(backend, prefix, us, **kw):
        return {"backend": backend, "bs": 1, "prefix": prefix, "q_len": 9, "heads": 8, "us": us,
                "roofline_frac": 0.1 / us, "graph": False, "nsplit_auto": False, "nsplit": None, **kw}
    rows = [row("cuda", 21, 8.0, nsplit_auto=True, nsplit=1), row("triton_sglang", 21, 7.0),
            row("cuda", 21, 1.0, graph=True, nsplit_auto=True, nsplit=1),  # graph: not an eager verdict
            row("cuda", 8192, 24.0, nsplit_auto=True, nsplit=64), row("cuda", 8192, 20.0, nsplit=32),
            row("triton_sglang", 8192, 240.0)]
    v = bench_results.verdicts({"rows": rows})
    assert v["shapes"] == 2 and v["fixed"] == 1
    assert v["slower"] == [((1, 21, 9, 8), "triton_sglang", 7.0, 8.0)]
    assert v["least"]["triton_sglang"] == (7.0 / 8.0, (1, 21, 9, 8))
    assert v["auto_worst"] == (24.0 / 20.0, (1, 8192, 9, 8), 64, 32)
    assert v["auto_within"] == 0 and v["auto_beat_all"] == 0
    lines = bench_results.verdict_lines({"rows": rows})
    assert lines[0] == "kdkit fastest on 1 of 2 shapes (eager)"
    assert "worst 1.200x" in lines[-2]


def test_readme_table_rounds_once_and_marks_the_automatic_choice():
    """A made-up run: figures to three significant digits (whole from 100 up), "us" on the first
    row only, "(auto N)" where auto beat every fixed split, "(N; auto M)" where one fixed beat it."""
    def row(backend, prefix, us, **kw):
        return {"backend": backend, "bs": 1, "prefix": prefix, "q_len": 9, "us": us, "floor_us": 0.04,
                "roofline_frac": 0.04 / us, "graph": False, "nsplit_auto": False, "nsplit": None, **kw}
    rows = []
    for prefix, auto_us, fixed_us in ((21, 7.654, 9.0), (1024, 16.04, 14.56)):
        rows += [row("cuda", prefix, auto_us, nsplit_auto=True, nsplit=11),
                 row("cuda", prefix, auto_us - 1.5, graph=True, nsplit_auto=True, nsplit=11),
                 row("cuda", prefix, fixed_us, nsplit=32),
                 row("triton_sglang", prefix, 183.6), row("triton_decode", prefix, 25.46), row("torch", prefix, 1469.2)]
    lines = bench.readme_table({"rows": rows}).splitlines()
    assert lines[2] == "| 1 x 21, 9, 8 | 0.04 us | 6.15 us (0.6%) | 7.65 us | 7.65 (auto 11) | - | 184 us | 25.5 us | 1469 us |"
    assert lines[3] == "| 1 x 1K, 9, 8 | 0.04 | 14.5 (0.3%) | 16.0 | 14.6 (32; auto 11) | - | 184 | 25.5 | 1469 |"


def test_a_run_cut_short_keeps_the_shapes_it_measured(tmp_path, monkeypatch, capsys):
    """On the H200 a CUDA fault at the 83rd shape of the grid once took the whole run with it. The
    results file is now rewritten after every shape: a fault keeps the shapes before it, marked
    incomplete with the reason, and the command fails. The GPU is stood in for by the committed
    results (no GPU here), fed shape by shape."""
    if not RESULTS:
        pytest.skip("no committed results under benchmarks/results")
    import kdkit.kernel
    committed = json.loads(RESULTS[-1].read_text())
    out = tmp_path / "out"
    first, second = committed["rows"][:3], committed["rows"][3:6]

    def run_grid(*a, on_shape=None, **k):
        on_shape({**committed, "rows": first, "complete": False})
        on_shape({**committed, "rows": first + second, "complete": False})
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(bench, "run_grid", run_grid)
    monkeypatch.setattr(kdkit.kernel, "unavailable", lambda: None)
    rc = main(["bench", "--quick", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 1 and "illegal memory access" in cap.err
    [path] = out.glob("*.json")  # one file, rewritten in place
    kept = bench_results.load(path)
    assert kept["rows"] == first + second and kept["complete"] is False
    assert "illegal memory access" in kept["stopped"]


def test_a_finished_run_is_one_complete_file(tmp_path, monkeypatch, capsys):
    if not RESULTS:
        pytest.skip("no committed results under benchmarks/results")
    import kdkit.kernel
    committed = json.loads(RESULTS[-1].read_text())
    out = tmp_path / "out"

    def run_grid(*a, on_shape=None, **k):
        on_shape({**committed, "rows": committed["rows"][:2], "complete": False})
        return {**committed, "complete": True}
    monkeypatch.setattr(bench, "run_grid", run_grid)
    monkeypatch.setattr(kdkit.kernel, "unavailable", lambda: None)
    assert main(["bench", "--quick", "--out", str(out)]) == 0
    [path] = out.glob("*.json")
    assert bench_results.load(path) == {**committed, "complete": True}
    assert f"wrote {path}" in capsys.readouterr().out
    # another run that starts in the same second must not overwrite this one
    with pytest.raises(FileExistsError):
        bench.save(committed, out)


def test_a_cuda_row_names_the_build_that_ran():
    """Which build a cuda row timed (block size, warps, step skip) is in its module key; the
    other backends' rows have none."""
    ceil = {"copy_gbps": 4000.0, "mma_tflops": 600.0}
    shape = bench.Shape(1, 21, 257)
    key = "mla_tc-nt1-qoi32-kvpi32-kvii32-mipi64-pfxi64-skip1-sm_90-0123456789ab"
    assert bench._row("cuda", shape, 25.0, ceil, 1, auto=True, module=key)["module"] == key
    assert "module" not in bench._row("triton_decode", shape, 17.8, ceil)
    clocked = bench._row("cuda", shape, 25.0, ceil, 1, clock={"sm_mhz": 1980, "power_w": 310.5})
    assert (clocked["sm_mhz"], clocked["power_w"]) == (1980, 310.5)
    assert "sm_mhz" not in bench._row("cuda", shape, 25.0, ceil, 1, clock={})


# ---- the SM clock and power beside each row (kdkit/perf/clocks.py) ---------------------------------------
def test_clock_lines_and_windows():
    """nvidia-smi's csv lines parsed (power may read [N/A]); a row gets the medians of the samples
    taken while it was timed, nothing where none fell in its window."""
    from kdkit.perf import clocks
    assert clocks.parse("1980, 312.45\n") == (1980.0, 312.45)
    assert clocks.parse("1755, [N/A]") == (1755.0, None)
    assert clocks.parse("No devices were found") is None and clocks.parse("[N/A], 300") is None
    s = clocks.ClockSampler()
    for t, line in [(1.0, "1980, 100"), (1.1, "1980, 120"), (1.2, "1500, 400"), (1.3, "1500, 420"),
                    (1.4, "1500, [N/A]"), (2.0, "garbage")]:
        s.add(t, line)
    assert s.window(0.95, 1.15) == {"sm_mhz": 1980, "power_w": 110.0}
    assert s.window(1.15, 1.45) == {"sm_mhz": 1500, "power_w": 410.0}
    assert s.window(1.35, 1.45) == {"sm_mhz": 1500}  # no power reading in it
    assert s.window(1.5, 3.0) == {}


def test_clock_sampler_without_nvidia_smi_samples_nothing(monkeypatch):
    """Where nvidia-smi is not on PATH the run goes on and its rows carry no clock."""
    from kdkit.perf import clocks
    monkeypatch.setenv("PATH", "")
    with clocks.ClockSampler() as s:
        pass
    assert s.samples == [] and s.window(0, float("inf")) == {}


@pytest.mark.gpu
def test_clock_sampler_reads_the_gpu():
    """On a GPU host: samples arrive (nvidia-smi for the torch device, by UUID) with a clock."""
    import time

    from kdkit.perf import clocks
    with clocks.ClockSampler(clocks.gpu_id(torch.device("cuda"))) as s:
        t0 = time.monotonic()
        time.sleep(0.5)
        w = s.window(t0, time.monotonic())
    assert w.get("sm_mhz", 0) > 0, (s.samples[:3], w)


@pytest.mark.gpu
def test_a_real_run_of_the_seed_shape_records_its_rows_and_the_eager_floor(tmp_path, capsys):
    """On a GPU host: the bench end to end on the seed's shape through kdkit's kernel; the header
    records an empty kernel's eager call (the floor of every row's eager_us then) and says it."""
    import json

    from kdkit import backends
    from kdkit.perf import bench
    if backends.unavailable("cuda") is not None:
        pytest.skip(backends.unavailable("cuda"))
    assert bench.main(["--quick", "--shapes", "1x21 q9 H8", "--backends", "cuda", "--nsplit", "",
                       "--no-clocks", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*.json")
    res = json.loads(path.read_text())
    assert res["eager_floor_us"] > 0 and "an empty kernel's eager_us" in capsys.readouterr().out
    eager = [r for r in res["rows"] if r["backend"] == "cuda" and r.get("eager_us")]
    assert eager and all(r["eager_us"] > 0 and r["host_us"] > 0 for r in eager)


# ---- correctness before timing ----------------------------------------------------------------------
class CountingTimer:
    """Stands in for the GPU timer on this CPU machine: calls what it is asked to time once and
    counts it, so that a test sees what was timed (CUDA events need a GPU)."""

    def __init__(self):
        self.timed = 0

    def us(self, fn, reps=None, budget_s=1.0):
        fn()
        self.timed += 1
        return 100.0

    def host_us(self, fn, reps=20):
        fn()
        return 10.0

    def eager_us(self, fn, reps=30):
        fn()
        return 110.0

    def plan_us(self, plan, reps=10):
        plan()
        return 50.0


def _wrong_backend(monkeypatch):
    """A backend registered like any other whose output is the torch backend's with one token's
    output shifted: a wrong kernel."""
    import sys
    import types

    from kdkit import backends
    from kdkit.backends import torch_ref
    mod = types.ModuleType("kdkit_test_wrong_backend")
    mod.NAME = "wrong"

    def unavailable(case=None):
        return None

    def prepare(case, *, device=None):
        p = torch_ref.prepare(case, device=device)

        def result():
            r = p.result()
            out = r.out.clone()
            out[0] += 0.5 * out.abs().max()  # one token's 512 dims, every head
            return backends.Result(out, r.lse, {**r.info, "ran": "a deliberately wrong backend"})
        return backends.Prepared(p.launch, result, False, {})

    def run(case, *, device=None):
        p = prepare(case, device=device)
        p.launch()
        return p.result()
    mod.unavailable, mod.prepare, mod.run = unavailable, prepare, run
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(backends.BACKENDS, "wrong", mod.__name__)


@pytest.mark.parametrize("oracle_max", [None, 0], ids=["against-oracle", "against-torch"])
def test_a_wrong_backend_gets_a_fail_row_and_no_time(monkeypatch, oracle_max):
    """Before a (backend, shape) is timed its output is judged: the wrong backend's row is FAIL
    with the verdict line and carries no time (nothing timed), the torch backend's passes and is
    timed; against the float64 oracle, and against the torch backend where the oracle is too
    costly (oracle_max 0). The results file check takes both rows."""
    from kdkit.perf import correctness
    _wrong_backend(monkeypatch)
    shape = bench.Shape(2, 40, 9, 2, "ddtree", 1)
    case = bench.make_case(shape)
    ref = correctness.Reference(case, device="cpu", **({} if oracle_max is None else {"oracle_max_scores": oracle_max}))
    timer = CountingTimer()
    grid = bench.Grid("cpu", timer, {"copy_gbps": 4000.0, "mma_tflops": 600.0})
    [bad] = grid.backend("wrong", shape, case, ref)
    assert timer.timed == 0 and "us" not in bad and "roofline_frac" not in bad
    against = "the float64 oracle" if oracle_max is None else "the torch backend (fp32) on cpu"
    assert bad["verdict"].startswith(f"FAIL against {against}: ") and "max_abs" in bad["verdict"]
    good = grid.backend("torch", shape, case, ref)
    assert timer.timed == 1 and good[0]["us"] == 100.0 and good[0]["verdict"].startswith(f"PASS against {against}")
    assert good[0]["nsplit_auto"] and good[0]["nsplit"] >= 1 and good[0]["host_us"] == 10.0
    res = {"gpu": "cpu", "date": "2026-12-03T00:00:00+00:00", "sms": 0, "copy_gbps": 4000.0,
           "mma_tflops": 600.0, "rows": [bad, *good]}
    assert bench_results.check(res) is res and bench_results.timed(res) == good
    text = bench.summary(res)
    assert bad["nsplit"] is None and f"wrong 2x40 q9 H2: {bad['verdict']}" in text
    assert "wrong = wrong" in text and "torch = PyTorch eager" in text


def test_a_fail_row_with_a_time_is_refused():
    row = {"backend": "wrong", "bs": 1, "prefix": 21, "q_len": 9, "heads": 8, "nsplit": None,
           "nsplit_auto": False, "graph": False, "us": 3.0, "floor_us": 0.1, "verdict": "FAIL against x"}
    with pytest.raises(bench_results.ResultsError, match="FAIL row carries a time"):
        bench_results.check({"gpu": "x", "date": "d", "rows": [row]})


def test_the_sweep_covers_every_backend_declaring_nsplit(monkeypatch):
    """The fixed split counts are swept for any backend that declares `nsplit` (here torch), each
    configuration judged before it is timed; the automatic row comes first."""
    shape = bench.Shape(1, 100, 9, 2, "ddtree", 1)
    case = bench.make_case(shape)
    from kdkit.perf import correctness
    timer = CountingTimer()
    grid = bench.Grid("cpu", timer, {"copy_gbps": 4000.0, "mma_tflops": 600.0}, nsplits=(1, 2, 4))
    rows = grid.backend("torch", shape, case, correctness.Reference(case, device="cpu"))
    assert rows[0]["nsplit_auto"] and [r["nsplit"] for r in rows[1:]] == [n for n in (1, 2, 4) if n != rows[0]["nsplit"]]
    assert all(r["verdict"].startswith("PASS") for r in rows) and timer.timed == len(rows)


def test_cpu_bench_still_refuses(capsys):
    """On a machine without a GPU `kdkit bench` stops before any work, exit 1, one line."""
    import kdkit.kernel
    if kdkit.kernel.unavailable() is None:
        pytest.skip("a GPU is here")
    assert main(["bench", "--quick", "--out", tempfile.mkdtemp()]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kdkit bench: ") and len(err.strip().splitlines()) == 1
