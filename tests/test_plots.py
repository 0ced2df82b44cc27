"""The figures build, name the case and backend, and hold the numbers compare/oracle computed."""
import json
import re

import numpy as np
import pytest
import torch

from conftest import DATA, ROOT
from kdkit import plots, shapes, synth, trees
from kdkit.judge import oracle
from kdkit.perf import results as bench_results
from kdkit.backends import torch_ref
from kdkit.case import load
from kdkit.judge.compare import judge, metrics
from kdkit.replay import replay

FIXTURE = ROOT / "tests" / "data" / "bench-results-fixture.json"   # synthetic numbers, a test fixture


@pytest.fixture(scope="module")
def case():
    return shapes.seed_shape()


def test_error_heatmap(case):
    o, lse = oracle.run(case)
    res = torch_ref.run(case)
    m = metrics(res.out, o, res.lse, lse)
    fig = plots.error_heatmap(m, case.case_id, "torch")
    (hm,) = fig.data
    assert hm.type == "heatmap"
    z = np.asarray(hm.z)
    assert z.shape == (case.num_heads, case.num_tokens)                 # head x query token
    np.testing.assert_array_equal(z, m.per_token_head.T)
    assert z.max() == m.max_abs
    title = fig.layout.title.text
    assert "seed-shape" in title and "torch" in title and "oracle" in title
    v = judge("torch", m, o)
    fig2 = plots.error_heatmap(v, case.case_id, "torch")
    assert f"limit {v.limit:.2e}" in fig2.layout.title.text


def test_error_heatmap_marks_nonfinite(case):
    o, _ = oracle.run(case)
    bad = o.copy()
    bad[3, 2, 7] = np.nan
    fig = plots.error_heatmap(metrics(bad, o), case.case_id, "broken")
    assert [t.type for t in fig.data] == ["heatmap", "scatter"]
    assert list(fig.data[1].x) == [3] and list(fig.data[1].y) == [2]


def test_kv_profile(case):
    t, h = 5, 3
    fig = plots.kv_profile(case, t, h, backend="cuda")
    bar, strip = fig.data
    assert bar.type == "bar" and strip.type == "heatmap"
    p = np.asarray(bar.y)
    assert p.shape == (21 + 9,)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    mask = np.asarray(strip.z)[0] > 0.5
    assert mask[:21].all()                                           # the prefix is all visible
    assert np.all(p[~mask] == 0) and np.all(p[mask] > 0)
    np.testing.assert_array_equal(mask[21:], oracle.draft_visibility(case, 0)[t])
    # the mask is one categorical cell per KV column, centred on the bars (not a 0/1 line on a
    # continuous axis half a column off), on its own axis with no numeric ticks
    np.testing.assert_array_equal(np.asarray(strip.x), np.asarray(bar.x))
    assert list(strip.y) == ["mask"] and strip.showscale is False
    assert any(s.type == "line" and s.x0 == 20.5 for s in fig.layout.shapes)   # prefix | draft
    title = fig.layout.title.text
    assert "seed-shape" in title and "cuda" in title and "token 5" in title and "head 3" in title
    with pytest.raises(IndexError, match="token 99"):
        plots.kv_profile(case, 99, 0)


def test_kv_profile_ragged_maps_global_token_to_request():
    case = synth.make_case(bs=2, prefix=[4, 6], q_len=[3, 5], heads=2, tree="chain")
    fig = plots.kv_profile(case, 4, 1)                               # request 1, row 1
    assert "request 1 row 1" in fig.layout.title.text
    assert len(fig.data[0].y) == 6 + 5


def test_visibility_heatmap(case):
    fig = plots.visibility_heatmap(case, 0)
    pre, draft = fig.data
    assert pre.type == draft.type == "heatmap"
    assert np.asarray(pre.z).shape == (9, 21) and np.all(np.asarray(pre.z) == 1)
    np.testing.assert_array_equal(np.asarray(draft.z), oracle.draft_visibility(case, 0).astype(float))
    assert "seed-shape" in fig.layout.title.text
    # a long prefix is binned, the draft block stays exact
    long = synth.make_case(prefix=1000, q_len=5, heads=1, tree="diagonal")
    fig = plots.visibility_heatmap(long, 0)
    assert np.asarray(fig.data[0].z).shape == (5, plots.PREFIX_BINS)
    np.testing.assert_array_equal(np.asarray(fig.data[1].z), trees.tree_block(trees.diagonal(5)))


def test_metrics_bar(case):
    rep = replay(case, ["oracle", "torch", "triton_sglang"])
    fig = plots.metrics_bar(rep)
    assert [t.name for t in fig.data] == ["max_abs", "mean_abs", "limit"]
    judged = [r.backend for r in rep.rows if r.verdict is not None]
    assert list(fig.data[0].x) == judged
    assert fig.data[2].y[judged.index("torch")] == pytest.approx(rep.row("torch").verdict.limit)
    assert fig.layout.yaxis.type == "log"
    assert "seed-shape" in fig.layout.title.text
    # the oracle against itself is exactly 0: no bar at a made-up 1e-12, the word "exact" instead
    oi = judged.index("oracle")
    assert fig.data[0].y[oi] is None and fig.data[1].y[oi] is None
    assert [a.text for a in fig.layout.annotations if a.x == "oracle"] == ["exact<br>(0 error)"]
    assert all(y is None or y > 1e-9 for y in fig.data[0].y)
    if rep.row("triton_sglang").status == "skipped":
        assert "triton_sglang (skipped)" in fig.layout.title.text


def _figures_of_a_ragged_replay():
    case = synth.make_case(bs=3, prefix=[0, 40, 7], q_len=[5, 1, 12], heads=3, tree="ddtree", seed=3)
    rep = replay(case, ["oracle", "torch"])
    return case, rep, plots.replay_figures(case, rep)


def test_titles_fit_a_notebook_output_area():
    """Titles are anchored left and cut into a short head line and a smaller detail line: a
    centred one-line title ran past the right edge of JupyterLab's output area."""
    case, rep, figs = _figures_of_a_ragged_replay()
    results = bench_results.load(FIXTURE)
    figs.update(gbps=plots.nsplit_heatmap(results), lines=plots.nsplit_lines(results),
                backends=plots.backends_vs_prefix(results), graph=plots.graph_replay(results))
    for name, fig in figs.items():
        t = fig.layout.title
        assert t.x == 0 and t.xanchor == "left", name
        head, _, detail = t.text.partition("<br>")
        assert len(head.replace(case.case_id, "")) <= 45, (name, head)      # a case id is as long as it is
        assert len(re.sub("<[^>]+>", "", detail)) <= 120, (name, detail)


def test_request_boundaries_on_token_axes():
    case, rep, figs = _figures_of_a_ragged_replay()
    heat = figs["error torch"]
    assert sorted(s.x0 for s in heat.layout.shapes) == [4.5, 5.5]          # qo_indptr 0, 5, 6, 18
    assert [a.text for a in heat.layout.annotations] == ["r0", "r1", "r2"]
    single = plots.error_heatmap(rep.row("torch").verdict, "x", "torch", qo_indptr=[0, 9])
    assert not single.layout.shapes and not single.layout.annotations


def test_kv_error_finds_a_missed_column():
    """A backend that drops draft column 2 of a row: implied_dp puts -p there and ~0 elsewhere."""
    case = synth.make_case(prefix=20, q_len=6, heads=2, tree="chain", seed=1)
    out, _, probs = oracle.run(case, with_probs=True)
    t, h = 4, 1
    P = probs[0].probs[t, h].copy()
    vis = probs[0].visible[t]
    V = request_kv_v(case)
    bad = P.copy()
    bad[20 + 2] = 0
    bad /= bad.sum()
    wrong = out.copy()
    wrong[t, h] = bad @ V
    dp, b, resid = plots.implied_dp(case, wrong, out, t, h)
    np.testing.assert_allclose(dp, bad - P, atol=1e-9)
    assert b == 0 and resid < 1e-9 and np.argmin(dp) == 22

    rep = replay(case, ["oracle", "torch"])
    rep.outputs["torch"] = torch.from_numpy(wrong)
    rep.row("torch").status = "fail"                                       # what judging `wrong` says
    fig = plots.kv_error(case, rep, "torch", t, h)
    y = np.asarray(fig.data[0].y, dtype=float)
    np.testing.assert_allclose(y[vis], (bad - P)[vis], atol=1e-9)
    assert np.isnan(y[~vis]).all() and (~vis).sum() == 1                    # draft column 5: after token 4 in a chain
    title = fig.layout.title.text
    assert "token 4 head 1" in title and "least squares, 25 visible" in title
    assert fig.data[1].type == "heatmap"                                   # the row's mask under it
    assert "largest -" in title and "at kv 22" in title and "unexplained 0%" in title


def test_kv_error_of_a_passing_backend_leaves_masked_columns_out():
    """ragged-bs4 through torch passes; its rounding noise used to be spread over every KV column,
    masked ones included (columns 6-15 coloured, "unexplained 78%": it read like a mask leak)."""
    case = load(DATA / "ragged-bs4.pt")
    rep = replay(case, ["oracle", "torch"])
    assert rep.row("torch").status == "pass"
    fig = plots.kv_error(case, rep, "torch")
    y = np.asarray(fig.data[0].y, dtype=float)
    vis = np.asarray(fig.data[1].z)[0] > 0.5
    assert (~vis).any() and np.isnan(y[~vis]).all()                        # no bar on a masked column
    assert np.isfinite(y[vis]).all() and (y[vis] != 0).any()
    assert all(c == plots.MASKED_COLOR for c in np.asarray(fig.data[0].marker.color)[~vis])
    title = fig.layout.title.text
    assert "within tolerance (rounding noise)" in title and "unexplained" not in title


def test_implied_dp_over_the_visible_columns_shows_a_leak_as_unexplained():
    """A backend that also weighs a masked column: the visible columns cannot explain its error."""
    case = synth.make_case(prefix=20, q_len=6, heads=2, tree="chain", seed=1)
    out, _, probs = oracle.run(case, with_probs=True)
    t, h = 1, 0
    P, vis = probs[0].probs[t, h].copy(), probs[0].visible[t]
    leak = P.copy()
    leak[20 + 4] = P.max()                                                 # draft column 4: masked for row 1
    leak /= leak.sum()
    wrong = out.copy()
    wrong[t, h] = leak @ request_kv_v(case)
    dp, _, resid = plots.implied_dp(case, wrong, out, t, h, visible=vis)
    assert not vis[24] and np.isnan(dp[24]) and np.isfinite(dp[vis]).all()
    assert resid > 0.5
    with pytest.raises(ValueError, match="visible has shape"):
        plots.implied_dp(case, wrong, out, t, h, visible=vis[:-1])


def request_kv_v(case):
    from kdkit.layout import request_kv
    return request_kv(case, 0)[1].double().numpy()


def test_tree_mask_draws_the_tree_the_mask_encodes():
    case = synth.make_case(prefix=3, q_len=17, heads=1, tree="ddtree", seed=2)
    fig = plots.tree_mask(case, 0)
    edges, nodes, mask = fig.data
    blk = oracle.draft_visibility(case, 0)
    parents = trees.parents_from_block(blk)
    np.testing.assert_array_equal(trees.tree_block(parents), blk)
    np.testing.assert_array_equal(np.asarray(mask.z), blk.astype(float))
    assert list(nodes.y) == list(range(17)) and list(nodes.x) == list(blk.sum(axis=1) - 1)   # row i = node i, at its depth
    assert len([x for x in edges.x if x is None]) == 16                     # one edge per non-root node
    diag = synth.make_case(prefix=3, q_len=4, heads=1, tree="diagonal")
    assert trees.parents_from_block(oracle.draft_visibility(diag, 0)) == [-1, -1, -1, -1]   # a forest of roots
    assert trees.parents_from_block(np.array([[1, 1], [1, 1]], bool)) is None               # a cycle


def test_bench_figures_from_the_fixture():
    results = bench_results.load(FIXTURE)
    heat = plots.nsplit_heatmap(results, "gbps")
    z = np.asarray(heat.data[0].z, dtype=float)
    assert z.shape == (6 + 1, 5) and np.isfinite(z).all()                  # (NSPLIT + auto) x prefix
    want = {str(r["prefix"]): f"<br>n={r['nsplit']}" for r in bench_results.select(results, backend="cuda", nsplit_auto=True, graph=False)}
    assert dict(zip(heat.data[0].x, heat.data[0].text[-1])) == want         # the auto row names its pick
    assert results["gpu"] in heat.layout.title.text and results["date"] in heat.layout.title.text
    back = plots.backends_vs_prefix(results)
    assert {t.name for t in back.data} >= {"kdkit CUDA kernel", "SGLang Triton extend", "roofline floor"}
    g = plots.graph_replay(results)
    assert [t.name for t in g.data] == ["eager launch", "graph replay"]
    with pytest.raises(ValueError, match="no shape bs=64"):
        plots.nsplit_heatmap(results, bs=64)


def _cells_hit(shape) -> set:
    """The (column, row) cells whose centre, where the heatmap writes the number, a shape covers."""
    xs = np.arange(np.floor(shape.x0), np.ceil(shape.x1) + 1)
    ys = np.arange(np.floor(shape.y0), np.ceil(shape.y1) + 1)
    return {(int(x), int(y)) for x in xs for y in ys if shape.x0 <= x <= shape.x1 and shape.y0 <= y <= shape.y1}


def test_nsplit_heatmap_keeps_the_sweep_and_the_automatic_pick_apart():
    """The automatic NSPLITs that are not powers of two (11, 65, 66 on the H200) sit in one 'auto'
    row above the swept ones instead of between them, and each red outline stays inside the one
    cell of the swept NSPLIT the kernel picked: no outline crosses another cell's number."""
    results = json.loads(FIXTURE.read_text())
    picks = {21: 11, 1024: 2, 32768: 66}                                    # two picks the sweep lacks
    for r in results["rows"]:
        if r["backend"] == "cuda" and r["nsplit_auto"] and r["bs"] == 1 and r["q_len"] == 9 and r["prefix"] in picks:
            r["nsplit"] = picks[r["prefix"]]
    heat = plots.nsplit_heatmap(results, "gbps")
    hm = heat.data[0]
    assert [t.type for t in heat.data] == ["heatmap"]
    assert list(hm.y) == ["1", "2", "4", "8", "16", "32", "auto"]           # the sweep ascending, auto on top
    assert list(heat.layout.yaxis.categoryarray) == list(hm.y)
    text = dict(zip(hm.x, hm.text[-1]))
    assert text["21"] == "<br>n=11" and text["32768"] == "<br>n=66" and text["1024"] == "<br>n=2"
    assert all(t == "" for row in hm.text[:-1] for t in row)               # swept cells: the number alone
    assert "%{text}" in hm.texttemplate and "auto" in heat.layout.title.text
    boxes = [s for s in heat.layout.shapes if s.type == "rect"]
    auto = {r["prefix"]: r["nsplit"] for r in bench_results.select(results, backend="cuda", nsplit_auto=True,
                                                                    bs=1, q_len=9, heads=8, graph=False)}
    want = {(list(hm.x).index(str(p)), list(hm.y).index(str(n))) for p, n in auto.items() if str(n) in hm.y}
    assert len(want) == len(auto) - 2                                       # 11 and 66 get no outline
    hit = [_cells_hit(s) for s in boxes]
    assert all(len(h) == 1 for h in hit)                                    # each covers its own cell's number only
    assert set().union(*hit) == want
    for s in boxes:                                                         # and stays inside that cell
        (x, y), = _cells_hit(s)
        assert x - 0.5 < s.x0 < s.x1 < x + 0.5 and y - 0.5 < s.y0 < s.y1 < y + 0.5
    (rule,) = [s for s in heat.layout.shapes if s.type == "line"]           # between the sweep and auto
    assert rule.y0 == rule.y1 == len(hm.y) - 1.5


def test_bench_figures_read_at_small_fractions():
    """The roofline heatmap's cells keep one decimal (most of a small-batch sweep is below 0.5%,
    which '.0%' wrote as 0%), its colour bar says what it is; the GB/s lines are on a log axis, so
    the device copy line (often 10x the kernel's GB/s) does not squeeze them to the bottom."""
    results = bench_results.load(FIXTURE)
    roof = plots.nsplit_heatmap(results, "roofline_frac")
    assert roof.data[0].texttemplate == "%{z:.1%}%{text}" and roof.data[0].colorbar.title.text == "fraction of roofline"
    assert plots.nsplit_heatmap(results, "gbps").data[0].colorbar.title.text == "GB/s"
    lines = plots.nsplit_lines(results)
    assert lines.layout.yaxis.type == "log"
    assert [s.y0 for s in lines.layout.shapes] == [results["copy_gbps"]]
    lo, hi = lines.layout.yaxis.range                                       # the roof and its label in view
    assert lo < np.log10(results["copy_gbps"]) < hi - 0.1
    assert any(f"copy {results['copy_gbps']:.0f} GB/s" in a.text for a in lines.layout.annotations)
    summary = bench_results.summary(results, bs=1, q_len=9, heads=8)
    ratios = [r["auto_over_best"] for r in summary if r["auto_over_best"] is not None]
    assert ratios and all(x == round(x, 3) for x in ratios)


def test_sweep_shape_takes_the_parameters_given():
    results = bench_results.load(FIXTURE)
    rows = [{**r, "bs": 4, "q_len": 257} for r in results["rows"] if r["prefix"] == 8192]
    two = {**results, "rows": results["rows"] + rows}
    default = bench_results.nsplit_sweep("nsplit")
    assert bench_results.sweep_shape(two, default) == {"bs": 1, "q_len": 9, "heads": 8}
    q257 = bench_results.nsplit_sweep("nsplit", q_len=257, prefixes=[8192])
    assert q257["q_len"] == 257 and q257["bs"] == default["bs"] and q257["prefixes"] == [8192]
    assert bench_results.sweep_shape(two, q257, q_len=257) == {"bs": 4, "q_len": 257, "heads": 8}
    with pytest.raises(ValueError, match="no shape bs=None q_len=64"):
        bench_results.sweep_shape(two, bench_results.nsplit_sweep(q_len=64), q_len=64)
    with pytest.raises(TypeError, match="no parameter batch"):
        bench_results.nsplit_sweep(batch=8)


def test_bench_results_errors_name_the_field(tmp_path):
    data = json.loads(FIXTURE.read_text())
    data["rows"][3]["gbps"] = "fast"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(bench_results.ResultsError, match=r"rows\[3\]\.gbps"):
        bench_results.load(bad)
    assert bench_results.latest(tmp_path / "none") is None


def test_request_marks_of_a_large_batch_are_one_layout_update():
    """512 requests drew in 2 minutes (a plotly call per line and label): now well under a second
    of plotly work, every boundary a line, at most MAX_REQUEST_LABELS numbers."""
    import time
    bs = 512
    qo = torch.arange(bs + 1)
    m = np.zeros((bs, 1))
    t0 = time.perf_counter()
    fig = plots.mark_requests(plots.go.Figure(plots.go.Heatmap(z=m.T)), qo, "x")
    assert time.perf_counter() - t0 < 5
    assert len(fig.layout.shapes) == bs - 1
    labels = [a.text for a in fig.layout.annotations]
    assert len(labels) <= plots.MAX_REQUEST_LABELS and labels[0] == "r0"


def test_report_figures_of_a_case_without_query_rows():
    c = synth.make_case(q_len=0, prefix=5, tree="causal")
    rep = replay(c, ["torch"])
    figs = plots.replay_figures(c, rep)
    assert "metrics" in figs and "tree" not in figs


@pytest.mark.parametrize("name, panel", [("mask-indptr-sliced", "mask block start (mask_indptr)"),
                                         ("prefix-only-kv-indices", "KV length (kv_indptr)")])
def test_a_case_the_lint_refuses_draws_its_index_arrays_not_an_empty_chart(name, panel):
    """Issue 33: the report of a mis-marshaled case had one empty chart (no backend judged). Now
    its index arrays against the layout, the values that differ in red, the lint's code named."""
    from conftest import bundled_path
    from kdkit.case import load
    case = load(bundled_path(name))
    rep = replay(case, ["oracle", "torch"])
    figs = plots.replay_figures(case, rep)
    assert list(figs) == ["layout"]
    fig = figs["layout"]
    assert f"lint: {name} [" in fig.layout.title.text
    ax = next(a for a in fig.layout.annotations if a.text == panel)   # the subplot with the bug
    col = 1 + [a.text for a in fig.layout.annotations if a.text.endswith(")")].index(panel)
    said = [t for t in fig.data if t.name == "the case says"][col - 1]
    assert plots.FAIL_COLOR in list(said.marker.color), (ax.text, said.marker.color)
