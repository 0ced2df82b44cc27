"""Metric formulas, the seed's log line, the tolerance rule at its boundary, negative controls."""
import math

import numpy as np
import pytest
import torch

from kdkit import oracle, synth
from kdkit.backends import torch_ref
from kdkit.compare import Metrics, judge, metrics, seed_line


# ---- formulas on hand-made arrays ------------------------------------------------------------
def test_formulas_on_a_hand_made_pair():
    b = np.zeros((2, 3, 4))
    b[0, 0, 0], b[1, 2, 3] = 3.0, 4.0            # ||b|| = 5
    a = b.copy()
    a[1, 2, 3] = 4.5                             # one diff of 0.5
    a[0, 1, 2] = -1.0                            # one diff of 1.0 where b is 0
    m = metrics(a, b)
    assert m.max_abs == 1.0
    assert m.mean_abs == pytest.approx(1.5 / 24)
    assert m.rel == pytest.approx(math.sqrt(0.25 + 1.0) / 5.0)
    sab, sa2b2 = 9 + 4 * 4.5, (9 + 4.5 ** 2 + 1) + (9 + 16)
    assert m.cos_dist == pytest.approx(1 - 2 * sab / sa2b2)
    assert m.worst == (0, 1, 2)
    assert m.nonfinite == 0 and m.lse_max_abs is None
    np.testing.assert_allclose(m.per_head["max_abs"], [0.0, 1.0, 0.5])
    np.testing.assert_allclose(m.per_head["rel"], [0.0, np.inf, 0.5 / 4.0])  # head 1: b is all 0
    np.testing.assert_allclose(m.per_token["max_abs"], [1.0, 0.5])
    np.testing.assert_allclose(m.per_token["rel"], [1.0 / 3.0, 0.5 / 4.0])
    assert m.per_token_head.shape == (2, 3) and m.per_token_head[1, 2] == 0.5
    assert m.ref_max_abs == 4.0


def test_identical_is_all_zero_and_torch_inputs_work():
    b = torch.randn(3, 2, 8, dtype=torch.float32)
    m = metrics(b.bfloat16(), b.bfloat16().double().numpy())
    assert m.max_abs == m.mean_abs == m.rel == 0.0 and abs(m.cos_dist) < 1e-15


def test_nonfinite_output_counts_and_poisons_the_summary():
    b = np.ones((2, 2, 3))
    a = b.copy()
    a[0, 1, 2] = np.nan
    a[1, 0, 0] = np.inf
    m = metrics(a, b)
    assert m.nonfinite == 2
    assert m.max_abs == m.mean_abs == m.rel == m.cos_dist == math.inf
    assert m.worst in {(0, 1, 2), (1, 0, 0)}
    v = judge("k", m, b)
    assert not v.passed and "2 non-finite output entries" in v.reasons[0]


def test_nonfinite_reference_is_excluded_and_fails_the_verdict():
    b = np.ones((1, 1, 4))
    b[0, 0, 1] = np.nan
    a = np.ones((1, 1, 4))
    m = metrics(a, b)
    assert m.ref_nonfinite == 1 and m.nonfinite == 0 and m.max_abs == 0.0
    v = judge("k", m, b)
    assert not v.passed and "non-finite entries" in v.reasons[0]


def test_lse_error_and_rows_that_see_nothing():
    b = np.ones((2, 2, 3))
    a = b.copy()
    a[1, 1] = 7.0                             # garbage where the reference row sees nothing ...
    ref_lse = np.array([[1.0, 2.0], [3.0, -np.inf]])
    lse = np.array([[1.0, 2.5], [3.0, 5.0]])
    m = metrics(a, b, lse, ref_lse)
    assert m.empty_rows == 1 and m.max_abs == 0.0   # ... is not compared (softmax is 0/0 there)
    assert m.lse_max_abs == 0.5 and m.ref_lse_max_abs == 3.0
    assert metrics(a, b, lse, None).lse_max_abs is None
    m2 = metrics(b, b, np.array([[1.0, -np.inf], [3.0, 0.0]]), ref_lse)
    assert m2.lse_max_abs == math.inf               # -inf where the reference is finite


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="shape"):
        metrics(np.zeros((2, 3, 4)), np.zeros((2, 3, 5)))
    with pytest.raises(ValueError, match=r"\[T, H, D\]"):
        metrics(np.zeros((2, 3)), np.zeros((2, 3)))


# ---- the seed's log line ---------------------------------------------------------------------
def test_seed_line_exact():
    m = Metrics(max_abs=1.6934, mean_abs=0.11948, rel=1.0837, cos_dist=0.5, nonfinite=0, lse_max_abs=None)
    assert seed_line("L56", m) == "[kdkit] L56 max_abs_diff=1.6934e+00 mean=1.1948e-01 rel=1.0837e+00"


# ---- the rule at its boundary ----------------------------------------------------------------
def _pair(err: float):
    """ref with max|ref| = 4 (floor = 2^-6 x 4 = 0.0625 exactly) and one entry off by err."""
    b = np.zeros((2, 2, 4))
    b[0, 0, 0] = 4.0
    a = b.copy()
    a[1, 1, 3] = err
    return a, b


def test_floor_alone_boundary():
    a, b = _pair(0.0625)
    v = judge("k", metrics(a, b), b)
    assert v.passed and v.limit == 0.0625
    a, b = _pair(0.0626)
    v = judge("k", metrics(a, b), b)
    assert not v.passed
    assert v.reasons[0].startswith("max_abs 6.26e-02 > limit 6.25e-02 = bf16 floor 6.25e-02 "
                                   "(= 1 x 2^-6 x max|ref| 4), no production path")
    assert "worst at token 1 head 1 dim 3" in v.reasons[0]


def test_production_boundary():
    prod = Metrics(max_abs=0.02, mean_abs=1e-3, rel=1e-3, cos_dist=1e-6, nonfinite=0, lse_max_abs=None)
    a, b = _pair(0.07)
    assert not judge("k", metrics(a, b), b).passed                       # floor alone: 0.0625
    v = judge("k", metrics(a, b), b, production=prod)                    # 2 x 0.02 + 2^-7 x 4
    assert v.passed and v.limit == pytest.approx(0.07125)
    a, b = _pair(0.0714)
    v = judge("k", metrics(a, b), b, production=prod)
    assert not v.passed
    assert v.reasons[0].startswith("max_abs 7.14e-02 > limit 7.13e-02 = 2 x production 2.00e-02 + "
                                   "bf16 floor 3.12e-02 (= 1 x 2^-7 x max|ref| 4)")
    # a production path that is itself far off does not excuse much more than 2x its error
    worse = Metrics(max_abs=1.0, mean_abs=0.1, rel=0.1, cos_dist=1e-2, nonfinite=0, lse_max_abs=None)
    a, b = _pair(2.03)                                                   # limit 2 + 0.03125
    assert judge("k", metrics(a, b), b, production=worse).passed
    a, b = _pair(2.04)
    assert not judge("k", metrics(a, b), b, production=worse).passed
    # against a bf16 reference (not the oracle) its own error adds: 3 x production + 2 x floor
    a, b = _pair(0.0714)
    v = judge("k", metrics(a, b), b, production=prod, against="captured")
    assert v.passed and v.limit == pytest.approx(0.06 + 0.0625)


def test_lse_rule():
    a, b = _pair(0.0)
    ref_lse = np.full((2, 2), 8.0)                   # LSE floor = 2^-12 x 8 = 2^-9
    ok = metrics(a, b, ref_lse + 2 ** -9, ref_lse)
    assert judge("k", ok, b).passed
    bad = metrics(a, b, ref_lse + 2 ** -8, ref_lse)
    v = judge("k", bad, b)
    assert not v.passed and v.reasons[0].startswith("LSE max_abs 3.91e-03 > limit 1.95e-03")


# ---- negative controls: deliberately wrong kernels must fail --------------------------------
NEG_CASES = [
    dict(bs=1, prefix=21, q_len=9, heads=8, tree="eagle"),                   # the seed's shape
    dict(bs=2, prefix=[200, 40], q_len=[9, 17], heads=8, tree="ddtree", seed=1),
    dict(bs=1, prefix=500, q_len=65, heads=8, tree="ddtree", magnitude=8.0, seed=2),
]


def _row_shifted(case):
    """Each request's mask block read one row early: the off-by-one a wrong mask_indptr gives."""
    mask, ptr = case.custom_mask.clone(), case.mask_indptr.long().tolist()
    for b in range(case.batch_size):
        n, p = case.q_lens[b], int(case.prefix_lens[b])
        blk = case.custom_mask[ptr[b]: ptr[b] + n * (p + n)].reshape(n, p + n)
        mask[ptr[b]: ptr[b] + n * (p + n)] = torch.cat([blk[:1], blk[:-1]]).reshape(-1)
    return case.clone(custom_mask=mask)


def _prefix_only(case):
    """The kernel saw only the prefix (kv_indices without the draft: the seed's second bug)."""
    mask, ptr = case.custom_mask.clone(), case.mask_indptr.long().tolist()
    for b in range(case.batch_size):
        n, p = case.q_lens[b], int(case.prefix_lens[b])
        blk = mask[ptr[b]: ptr[b] + n * (p + n)].reshape(n, p + n)
        blk[:, p:] = False
    return case.clone(custom_mask=mask)


WRONG = {
    "no-scale": lambda c: c.clone(sm_scale=1.0),
    "mask-row-off-by-one": _row_shifted,
    "prefix-only-kv": _prefix_only,
}


@pytest.mark.parametrize("kw", NEG_CASES, ids=["seed", "ragged-p200", "p500-q65"])
def test_negative_controls_fail_and_the_right_kernel_passes(kw):
    case = synth.make_case(**kw)
    o, lse = oracle.run(case)
    good = torch_ref.run(case, p_bf16=True)
    prod = metrics(good.out, o)      # a correct bf16 kernel as the production path (no LSE, as Triton)
    right = torch_ref.run(case)
    assert judge("torch", metrics(right.out, o, right.lse, lse), o, production=prod).passed
    for name, wrong in WRONG.items():
        bad = torch_ref.run(wrong(case))
        for m in (metrics(bad.out, o, bad.lse, lse), metrics(bad.out, o)):   # with and without LSE
            for production in (None, prod):
                v = judge(name, m, o, production=production)
                assert not v.passed, (name, production is not None, m.max_abs, v.limit)
                assert v.reasons and ("limit" in v.reasons[0])


def test_long_prefix_bug_is_caught_by_the_lse():
    """With a long prefix a prefix-only kernel moves the output little (9 of 2009 columns), within
    the bf16 floor; the LSE check still sees the missing mass. Why kernels should return their LSE."""
    case = synth.make_case(bs=1, prefix=2000, q_len=9, heads=8, tree="eagle")
    o, lse = oracle.run(case)
    bad = torch_ref.run(_prefix_only(case))
    m = metrics(bad.out, o, bad.lse, lse)
    v = judge("prefix-only-kv", m, o)
    assert not v.passed and v.reasons[0].startswith("LSE max_abs")
    assert m.max_abs < v.limit        # the output alone would have let it through
