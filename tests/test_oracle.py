"""The float64 oracle against an independent brute-force loop, and its semantics at the edges."""
import math

import numpy as np
import pytest
import torch

from kdkit import shapes, synth
from kdkit.judge import oracle


def brute_force(case):
    """One (token, head) row at a time in plain Python, read straight off the case's arrays
    (no kdkit.layout, no kdkit.judge.oracle): SGLang's semantics written out longhand."""
    T, H, Dv = case.num_tokens, case.num_heads, case.v_head_dim
    out = np.zeros((T, H, Dv))
    lse = np.full((T, H), -math.inf)
    qo = [int(x) for x in case.qo_indptr]
    kvp = [int(x) for x in case.kv_indptr]
    pool = case.kv_buffer[:, 0].double().numpy()
    for b in range(len(qo) - 1):
        n, p = qo[b + 1] - qo[b], int(case.prefix_lens[b])
        idx = [int(x) for x in case.kv_indices[kvp[b]: kvp[b + 1]]]
        if case.layout == "sglang":
            keys = [pool[r] for r in idx] + [case.k[qo[b] + j, 0].double().numpy() for j in range(n)]
            vals = [pool[r][:Dv] for r in idx] + [case.v[qo[b] + j, 0].double().numpy() for j in range(n)]
        else:
            keys = [pool[r] for r in idx]
            vals = [pool[r][:Dv] for r in idx]
        assert len(keys) == p + n
        for i in range(n):
            t = qo[b] + i
            cols = list(range(p))  # every prefix column is visible
            for j in range(n):
                if case.custom_mask is not None:
                    seen = bool(case.custom_mask[int(case.mask_indptr[b]) + i * (p + n) + p + j])
                else:
                    seen = (j <= i) if case.causal else True
                if seen:
                    cols.append(p + j)
            for h in range(H):
                q = case.q[t, h].double().numpy()
                s = []
                for c in cols:
                    x = float(np.dot(q, keys[c])) * case.sm_scale
                    if case.logit_cap > 0:
                        x = case.logit_cap * math.tanh(x / case.logit_cap)
                    s.append(x)
                if not s:
                    continue
                m = max(s)
                w = [math.exp(x - m) for x in s]
                z = sum(w)
                lse[t, h] = m + math.log(z)
                for c, wc in zip(cols, w):
                    out[t, h] += (wc / z) * vals[c]
    return out, lse


SMALL = dict(heads=2, spare_rows=4)
CASES = [
    dict(bs=1, prefix=5, q_len=4, tree="chain"),
    dict(bs=1, prefix=3, q_len=6, tree="eagle", seed=1),
    dict(bs=1, prefix=4, q_len=6, tree="ddtree", seed=2),
    dict(bs=1, prefix=4, q_len=5, tree="causal"),
    dict(bs=1, prefix=2, q_len=4, tree="diagonal"),
    dict(bs=3, prefix=[0, 3, 6], q_len=[1, 4, 5], tree="eagle", seed=3),      # ragged, prefix 0
    dict(bs=2, prefix=[2, 0], q_len=[3, 1], tree="ddtree", seed=4, index_dtype=torch.int64,
         mask_dtype=torch.uint8),                                              # CUDA-graph dtypes
    dict(bs=1, prefix=4, q_len=4, tree="eagle", magnitude=30.0, logit_cap=30.0),  # cap bites
    dict(bs=1, prefix=4, q_len=3, tree="chain", magnitude=30.0),                  # large logits
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: f"{kw['tree']}-bs{kw['bs']}-q{kw['q_len']}")
@pytest.mark.parametrize("layout", ["sglang", "unified"])
def test_oracle_matches_brute_force(kw, layout):
    case = synth.make_case(layout=layout, **SMALL, **kw)
    out, lse = oracle.run(case)
    bout, blse = brute_force(case)
    # both are float64 sums of the same few terms in different orders: agreement to ~1e-15
    # relative; 1e-12 leaves room and still catches any real semantic difference (~1e-3 and up)
    np.testing.assert_allclose(out, bout, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, blse, rtol=1e-12, atol=1e-12)


def test_no_mask_not_causal_sees_everything():
    case = synth.make_case(prefix=3, q_len=4, tree="causal", **SMALL).clone(causal=False)
    out, lse = oracle.run(case)
    bout, blse = brute_force(case)
    np.testing.assert_allclose(out, bout, rtol=1e-12, atol=1e-12)
    causal_out, _ = oracle.run(case.clone(causal=True))
    # row 0 sees the whole draft without causality: it must differ from the causal answer
    assert np.abs(out[0] - causal_out[0]).max() > 1e-3
    np.testing.assert_allclose(out[-1], causal_out[-1], rtol=1e-12, atol=1e-12)  # last row: same


@pytest.mark.parametrize("kw", CASES[:7], ids=lambda kw: f"{kw['tree']}-bs{kw['bs']}")
def test_layouts_give_identical_output(kw):
    a = synth.make_case(layout="sglang", **SMALL, **kw)
    b = synth.make_case(layout="unified", **SMALL, **kw)
    assert b.kv_indices.numel() == a.kv_indices.numel() + a.num_tokens
    oa, la = oracle.run(a)
    ob, lb = oracle.run(b)
    # same rows, same order of summation: bit-identical
    np.testing.assert_array_equal(oa, ob)
    np.testing.assert_array_equal(la, lb)


def test_prefix0_qlen1_is_its_own_value():
    case = synth.make_case(bs=1, prefix=0, q_len=1, tree="chain", **SMALL)
    out, lse = oracle.run(case)
    # one visible column: probability 1, the output is exactly that token's v
    np.testing.assert_array_equal(out[0], np.broadcast_to(case.v[0, 0].double().numpy(), out[0].shape))
    s = (case.q[0].double() @ case.k[0, 0].double()).numpy() * case.sm_scale
    np.testing.assert_allclose(lse[0], s, rtol=1e-13)


def test_diagonal_rows_see_only_themselves():
    case = synth.make_case(bs=1, prefix=0, q_len=5, tree="diagonal", **SMALL)
    out, _ = oracle.run(case)
    for t in range(5):
        np.testing.assert_array_equal(out[t], np.broadcast_to(case.v[t, 0].double().numpy(), out[t].shape))


def test_row_that_sees_nothing_is_zero_with_lse_minus_inf():
    case = synth.make_case(bs=1, prefix=0, q_len=3, tree="chain", **SMALL)
    mask = case.custom_mask.clone()
    mask[3:6] = False  # row 1 of the 3x3 block sees nothing (a broken mask; lint's job to flag)
    out, lse = oracle.run(case.clone(custom_mask=mask))
    assert np.all(out[1] == 0) and np.all(np.isneginf(lse[1]))
    assert np.all(np.isfinite(lse[[0, 2]]))


def test_logit_cap_bounds_the_logits():
    case = synth.make_case(bs=1, prefix=6, q_len=4, tree="chain", magnitude=30.0, logit_cap=5.0, **SMALL)
    _, lse, probs = oracle.run(case, with_probs=True)
    rp = probs[0]
    fin = rp.logits[np.isfinite(rp.logits)]
    assert np.abs(fin).max() <= 5.0
    uncapped, _ = oracle.run(case.clone(logit_cap=0.0))
    assert np.abs(uncapped - oracle.run(case)[0]).max() > 1e-2  # the cap changed the answer
    # lse <= log(#visible) + cap
    vis = rp.visible.sum(axis=1)
    assert np.all(lse <= np.log(vis)[:, None] + 5.0 + 1e-12)


@pytest.mark.parametrize("tree", ["eagle", "ddtree", "causal", "diagonal"])
def test_probability_rows_sum_to_one_and_vanish_where_masked(tree):
    case = synth.make_case(bs=2, prefix=[3, 0], q_len=[6, 4], tree=tree, **SMALL)
    _, _, probs = oracle.run(case, with_probs=True)
    for rp in probs:
        np.testing.assert_allclose(rp.probs.sum(axis=-1), 1.0, rtol=0, atol=1e-13)
        hidden = ~rp.visible[:, None, :].repeat(case.num_heads, axis=1)
        assert np.all(rp.probs[hidden] == 0.0)
        assert np.all(rp.probs[~hidden] > 0.0)
        assert rp.visible[:, : rp.prefix_len].all()  # the prefix is always visible


def test_nan_poisoned_unreferenced_rows_do_not_leak():
    kw = dict(bs=2, prefix=[4, 2], q_len=[3, 5], tree="eagle", **SMALL)
    full = synth.make_case(keep_pool=True, **kw)       # the whole shuffled pool, NaN where unused
    assert torch.isnan(full.kv_buffer.float()).any()
    compacted = synth.make_case(**kw)
    a, la = oracle.run(full)
    b, lb = oracle.run(compacted)
    assert np.isfinite(a).all() and np.isfinite(la).all()
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)
    # the check can fail: a NaN in a referenced (visible) prefix row does reach the output
    bad = full.clone()
    bad.kv_buffer[int(bad.kv_indices[0])] = float("nan")
    assert np.isnan(oracle.run(bad)[0][:3]).all()


def test_nan_logits_poison_the_row_instead_of_emptying_it():
    """A NaN the row really sees (here in the rope dims of a visible prefix row) must make the
    oracle's row NaN, so judging against it fails; it must not pass as a row that sees nothing."""
    from kdkit.judge import compare
    from kdkit.backends import torch_ref
    case = shapes.seed_shape()
    case.kv_buffer[int(case.kv_indices[3]), 0, 520] = float("nan")
    out, lse = oracle.run(case)
    assert np.isnan(out).all() and np.isnan(lse).all()  # every row sees the whole prefix
    res = torch_ref.run(case)
    v = compare.judge("torch", compare.metrics(res.out, out, res.lse, lse), out)
    assert not v.passed and "non-finite" in v.reasons[0]
    assert v.metrics.empty_rows == 0
