"""The figures build, name the case and backend, and hold the numbers compare/oracle computed."""
import numpy as np
import pytest

from kdkit import oracle, plots, synth, trees
from kdkit.backends import torch_ref
from kdkit.compare import judge, metrics
from kdkit.replay import replay


@pytest.fixture(scope="module")
def case():
    return synth.seed_shape()


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
    bar, vis = fig.data
    assert bar.type == "bar" and vis.type == "scatter"
    p = np.asarray(bar.y)
    assert p.shape == (21 + 9,)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    mask = np.asarray(vis.y) > 0.5
    assert mask[:21].all()                                           # the prefix is all visible
    assert np.all(p[~mask] == 0) and np.all(p[mask] > 0)
    np.testing.assert_array_equal(mask[21:], oracle.draft_visibility(case, 0)[t])
    assert any(s.type == "line" for s in fig.layout.shapes)         # the prefix | draft boundary
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
    if rep.row("triton_sglang").status == "skipped":
        assert "triton_sglang (skipped)" in fig.layout.title.text
