"""Metric formulas, the seed's log line, the tolerance rule at its boundary, negative controls."""
import math

import numpy as np
import pytest
import torch

from kdkit import synth
from kdkit.judge import compare, oracle
from kdkit.backends import torch_ref
from kdkit.judge.compare import Metrics, judge, metrics, seed_line


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


# ---- bf16 spacing and the statistics in spacings ------------------------------------------------
def test_spacing_is_the_elements_bf16_ulp_or_its_rows():
    b = np.array([[[1.0, 1.5, 2.0, 0.75, -3.0, 0.0, 1e-3, 0.0]]])
    rms = math.sqrt(float((b ** 2).mean()))                      # ~1.35 -> ulp 2^-7
    sp = compare.spacing(b)
    assert list(sp[0, 0, :5]) == [2 ** -7, 2 ** -7, 2 ** -6, 2 ** -7, 2 ** -6]
    assert sp[0, 0, 5] == sp[0, 0, 6] == 2.0 ** (math.floor(math.log2(rms)) - 7)  # small: the row's
    assert compare.spacing(np.zeros((1, 1, 4)))[0, 0, 0] == 2.0 ** -133       # an all-zero row


def _ref(T=4, H=3, D=64, seed=0):
    return np.random.default_rng(seed).standard_normal((T, H, D))


def test_ulp_statistics_on_a_hand_made_error():
    b = _ref()
    sp = compare.spacing(b)
    a = b.copy()
    a[2, 1] += 3 * sp[2, 1]                       # one whole row off by 3 spacings
    a[0, 0, 5] += 10 * sp[0, 0, 5]                # one element off by 10
    m = metrics(a, b)
    assert m.ulp_max == pytest.approx(10) and m.ulp_row_max == pytest.approx(3)
    assert m.ulp_row_worst == (2, 1)
    assert m.ulp_token_max == pytest.approx(3 / 3)            # token 2: one of 3 heads
    assert m.ulp_head_max == pytest.approx(max(3 / 4, 10 / 64 / 4))
    assert m.ulp_mean == pytest.approx((3 * 64 + 10) / b.size)
    v = judge("k", m, b)
    assert not v.passed and v.caught_by[0] == "ulp_row"
    assert any(r.startswith("ulp_row: error in bf16 spacings") and "row token 2 head 1" in r for r in v.reasons)


@pytest.mark.parametrize("name,floor", [("ulp_row", compare.ULP_ROW), ("ulp_mean", compare.ULP_MEAN)])
def test_ulp_limits_at_their_boundary(name, floor):
    b = _ref(T=1, H=1)
    sp = compare.spacing(b)
    lse = np.full((1, 1), 3.0)                    # with an LSE: the floors, not the tighter no-LSE ones
    for k, ok in ((0.99 * floor, True), (1.01 * floor, False)):
        m = metrics(b + k * sp, b, lse, lse)
        assert m.ulp_row_max == pytest.approx(k) and m.ulp_mean == pytest.approx(k)
        v = judge("k", m, b)
        assert v.checks[name][1] == floor and (v.checks[name][0] <= floor) == ok


def test_no_lse_is_judged_tighter_and_says_so():
    b = _ref()
    sp = compare.spacing(b)
    a = b.copy()
    a[1, 2] += 0.72 * sp[1, 2]                    # one row 0.72 spacings off: within ULP_ROW = 1
    lse = np.full(b.shape[:2], 3.0)
    assert judge("k", metrics(a, b, lse, lse), b).passed
    v = judge("k", metrics(a, b), b)              # no LSE: ulp_row limit 0.7
    assert not v.passed and "ulp_row" in v.caught_by
    assert v.checks["ulp_row"][1] == compare.NO_LSE["ulp_row"]
    assert "no LSE from the backend" in v.reasons[-1] and "no LSE" in v.rule
    ok = judge("k", metrics(b + 0.1 * sp, b), b)
    assert ok.passed and "no LSE from the backend" in ok.reasons[0]


def test_production_scales_the_ulp_limits():
    b = _ref(T=1, H=1)
    sp = compare.spacing(b)
    lse = np.full((1, 1), 3.0)
    prod = metrics(b + 0.45 * sp, b, lse, lse)    # a production path 0.45 spacings off: within every floor
    m = metrics(b + 1.35 * sp, b, lse, lse)
    v = judge("k", m, b, production=prod)         # limit 2 x 0.45 + 0.5 x 1.0 = 1.4
    assert v.checks["ulp_row"][1] == pytest.approx(1.4) and v.checks["ulp_row"][0] <= 1.4
    m = metrics(b + 1.45 * sp, b, lse, lse)
    assert "ulp_row" in judge("k", m, b, production=prod).caught_by
    # a production path beyond the floors (1.5 spacings: ulp_row's floor is 1) widens nothing: a
    # wrong one would excuse a backend's bug; the verdict says why its error was not used
    off = metrics(b + 1.5 * sp, b, lse, lse)
    v = judge("k", metrics(b + 1.2 * sp, b, lse, lse), b, production=off)
    assert v.checks["ulp_row"][1] == compare.ULP_ROW and "ulp_row" in v.caught_by
    assert "the production path fails the floor rule against the oracle on this case" in v.reasons[-1]
    assert "its error does not widen the limits" in v.rule
    # the ulp checks split floor and production as max_abs does (compare.PROD_SHARE says why)
    assert compare.PROD_SHARE == compare.PROD_FLOOR_U / compare.OUT_FLOOR_U


# ---- the max_abs rule at its boundary ----------------------------------------------------------
def _pair(err: float):
    """ref with max|ref| = 4 (floor = 2^-6 x 4 = 0.0625 exactly) and one entry off by err."""
    b = np.zeros((2, 2, 4))
    b[0, 0, 0] = 4.0
    a = b.copy()
    a[1, 1, 3] = err
    return a, b


def _max_abs(v):
    return next(r for r in v.reasons if r.startswith("max_abs"))


def test_floor_alone_boundary():
    a, b = _pair(0.0625)
    v = judge("k", metrics(a, b), b)
    assert v.limit == 0.0625 and v.checks["max_abs"] == (0.0625, 0.0625)
    a, b = _pair(0.0626)
    v = judge("k", metrics(a, b), b)
    assert not v.passed and "max_abs" in v.caught_by
    assert _max_abs(v).startswith("max_abs 6.26e-02 > limit 6.25e-02 = bf16 floor 6.25e-02 "
                                  "(= 1 x 2^-6 x max|ref| 4), no production path")
    assert "worst at token 1 head 1 dim 3" in _max_abs(v)


def test_production_boundary():
    # (a production path's metrics are against the oracle: ref_max_abs is the oracle's max|ref|)
    prod = Metrics(max_abs=0.02, mean_abs=1e-3, rel=1e-3, cos_dist=1e-6, nonfinite=0, lse_max_abs=None,
                   ref_max_abs=4.0)
    a, b = _pair(0.07)
    assert "max_abs" in judge("k", metrics(a, b), b).caught_by             # floor alone: 0.0625
    v = judge("k", metrics(a, b), b, production=prod)                    # 2 x 0.02 + 2^-7 x 4
    assert "max_abs" not in v.caught_by and v.limit == pytest.approx(0.07125)
    a, b = _pair(0.0714)
    v = judge("k", metrics(a, b), b, production=prod)
    assert "max_abs" in v.caught_by
    assert _max_abs(v).startswith("max_abs 7.14e-02 > limit 7.13e-02 = 2 x production 2.00e-02 + "
                                  "bf16 floor 3.12e-02 (= 1 x 2^-7 x max|ref| 4)")
    # a production path that is itself far off (max_abs 1.0 over a floor of 0.0625) excuses
    # nothing: the floor alone holds (it excused up to 2x its error before)
    worse = Metrics(max_abs=1.0, mean_abs=0.1, rel=0.1, cos_dist=1e-2, nonfinite=0, lse_max_abs=None)
    a, b = _pair(0.07)
    v = judge("k", metrics(a, b), b, production=worse)
    assert "max_abs" in v.caught_by and v.limit == 0.0625
    # against a bf16 reference (not the oracle) its own error adds: 3 x production + 2 x floor
    a, b = _pair(0.0714)
    v = judge("k", metrics(a, b), b, production=prod, against="captured")
    assert "max_abs" not in v.caught_by and v.limit == pytest.approx(0.06 + 0.0625)


def test_lse_rule_in_fp32_units():
    b = _ref(T=2, H=2)
    ref_lse = np.full((2, 2), 8.0)
    cond = np.full((2, 2), 24.0)                   # unit = 2^-24 x (8 + 24) = 2^-19
    unit = 2.0 ** -19
    lim = compare.LSE_ULPS
    ok = metrics(b, b, ref_lse + (lim - 0.1) * unit, ref_lse, lse_cond=cond)
    assert ok.lse_ulp_max == pytest.approx(lim - 0.1) and judge("k", ok, b).passed
    bad = metrics(b, b, ref_lse + (lim + 0.1) * unit, ref_lse, lse_cond=cond)
    v = judge("k", bad, b)
    assert v.caught_by == ["lse"] and v.reasons[0].startswith(f"lse: error {lim + 0.1:.3g} fp32 units")
    assert v.lse_limit == compare.LSE_ULPS
    # without cond, max|ref lse| stands in for it: unit = 2^-24 x (8 + 8)
    assert metrics(b, b, ref_lse + 7.9 * unit, ref_lse).lse_ulp_max == pytest.approx(2 * 7.9)
    # tiny logits (lse ~ 0, cond ~ 0): the unit stays 2^-24, log's absolute rounding near 0
    tiny = np.full((2, 2), 1e-3)
    assert compare.lse_unit(tiny, tiny, 0.0) == pytest.approx(np.full((2, 2), 2.0 ** -24))


def test_caught_by_and_worst_ratio():
    b = _ref()
    lse = np.full(b.shape[:2], 3.0)
    v = judge("k", metrics(b, b, lse, lse), b)
    assert v.passed and v.caught_by == [] and v.worst_ratio == 0.0
    v = judge("k", metrics(b * 1.01, b, lse + 0.1, lse), b)
    assert not v.passed and v.worst_ratio > 1 and set(v.caught_by) >= {"lse", "ulp_row"}
    assert v.caught_by[0] == "lse"                 # 0.1 in the LSE is ~10^5 units: the biggest miss


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
    o, lse, scale = oracle.run(case, with_scale=True)
    good = torch_ref.run(case, p_bf16=True)
    prod = metrics(good.out, o)      # a correct bf16 kernel as the production path (no LSE, as Triton)
    right = torch_ref.run(case)
    assert judge("torch", metrics(right.out, o, right.lse, lse), o, production=prod).passed
    for name, wrong in WRONG.items():
        bad = torch_ref.run(wrong(case))
        for sc in (None, scale):     # the rows' sizes before cancellation loosen nothing a bug moves
            for m in (metrics(bad.out, o, bad.lse, lse, out_scale=sc), metrics(bad.out, o, out_scale=sc)):
                for production in (None, prod):
                    v = judge(name, m, o, production=production)
                    assert not v.passed, (name, production is not None, m.max_abs, v.limit)
                    assert v.reasons and ("limit" in v.reasons[0])


def test_long_prefix_bug_is_caught_where_one_absolute_limit_missed_it():
    """With a long prefix a prefix-only kernel moves the output little (9 of 2009 columns): within
    the old absolute floor (2^-6 max|ref|), but many bf16 spacings of each moved row, and far off
    in the LSE."""
    case = synth.make_case(bs=1, prefix=2000, q_len=9, heads=8, tree="eagle")
    o, lse = oracle.run(case)
    bad = torch_ref.run(_prefix_only(case))
    m = metrics(bad.out, o, bad.lse, lse, lse_cond=oracle.lse_condition(case), out_scale=oracle.out_scale(case))
    v = judge("prefix-only-kv", m, o)
    assert m.max_abs < v.limit                     # the old rule alone would have let it through
    assert {"lse", "ulp_row"} <= set(v.caught_by)
    assert "ulp_row" in judge("prefix-only-kv", metrics(bad.out, o), o).caught_by   # without LSE too


def _cancelling_row_case(channels: float = 1.0, seed: int = 0):
    """One row whose two visible V rows are opposite under nearly equal weights (scores 1 and
    1 + 2^-7, set through a rope dim so V stays free; the draft column's weight ~0): its output is
    ~3e-4 of |v|, and rounding P to bf16 (both weights to 0.5) zeroes it. `channels` scales V's
    first 4 dims (real V has a few large channels; kdkit.synth draws them 6x)."""
    case = synth.make_case(bs=1, prefix=2, q_len=1, heads=1, tree="chain")
    kb, idx = case.kv_buffer.clone(), case.kv_indices.long()
    v0 = torch.randn(512, generator=torch.Generator().manual_seed(seed))
    v0[:4] *= channels
    v0 = v0.to(torch.bfloat16)
    kb[idx] = 0
    kb[idx[0], 0, :512], kb[idx[1], 0, :512] = v0, -v0
    kb[idx[0], 0, 512], kb[idx[1], 0, 512] = 1.0, 1.0078125
    q, k = torch.zeros_like(case.q), torch.zeros_like(case.k)
    q[..., 512], k[..., 512] = 1.0, -30.0
    return case.clone(kv_buffer=kb, q=q, k=k, v=torch.zeros_like(case.v))


def test_a_row_that_cancels_is_measured_in_its_size_before_cancellation():
    """A correct kernel that rounds P to bf16 errs by ~2^-8 of a row's size before its V rows
    cancel, not of its output: on a row that cancels it failed by 16x (256 spacings, max_abs 64x
    its floor) until oracle.out_scale sized it; a real bug on that row still fails."""
    case = _cancelling_row_case()
    o, lse, cond, scale = oracle.run(case, with_cond=True, with_scale=True)
    assert scale[0, 0, 0] > 100 * np.abs(o).max()            # the row cancels
    good = torch_ref.run(case, p_bf16=True)
    assert not judge("torch", metrics(good.out, o, good.lse, lse, lse_cond=cond), o).passed  # without the size
    v = judge("torch", metrics(good.out, o, good.lse, lse, lse_cond=cond, out_scale=scale), o)
    assert v.passed, v.reasons
    bad = torch_ref.run(case.clone(sm_scale=1.0))           # the scale dropped: the weights move
    v = judge("no-scale", metrics(bad.out, o, bad.lse, lse, lse_cond=cond, out_scale=scale), o)
    assert not v.passed and "the largest row size before cancellation" in v.rule, v.rule
    with pytest.raises(ValueError, match="out_scale"):
        metrics(good.out, o, out_scale=scale[..., 0])


@pytest.mark.parametrize("channels", [6.0, 40.0, 100.0])
def test_a_cancelling_row_with_large_channels_passes_a_correct_bf16_kernel(channels):
    """max_abs meets its worst element, which sits in V's largest channel: its floor is sized by
    the row's size at its largest dim (out_scale[..., 1]), not the mean over dims (a review found
    a correct bf16-P kernel at 1.05-1.13x the limit with 6x-100x channels)."""
    for seed in range(4):
        case = _cancelling_row_case(channels, seed)
        o, lse, cond, scale = oracle.run(case, with_cond=True, with_scale=True)
        good = torch_ref.run(case, p_bf16=True)
        for m in (metrics(good.out, o, good.lse, lse, lse_cond=cond, out_scale=scale),
                  metrics(good.out, o, out_scale=scale)):
            v = judge("torch", m, o)
            assert v.passed and v.worst_ratio < 0.75, (seed, v.reasons)


def test_outputs_in_bf16s_subnormal_range_are_measured_in_its_smallest_spacing():
    """Below 2^-126 bf16's spacing stops shrinking at 2^-133: a correct backend on a case scaled
    into that range passes (it failed by 15x at 2^-128, an audit found)."""
    assert compare.spacing(np.array([[[1e-40, 0.0]]])).min() == 2.0 ** -133
    assert compare.out_floor(1e-40) == 2.0 ** -133
    case = synth.make_case(q_len=9, prefix=21, seed=1)
    s = 2.0 ** -128
    case = case.clone(kv_buffer=case.kv_buffer * s, k=case.k * s, v=case.v * s)
    ref, ref_lse = oracle.run(case)
    got = torch_ref.run(case)
    v = judge("torch", metrics(got.out, ref, got.lse, ref_lse), ref)
    assert v.passed, v.caught_by


# ---- found by a review (2026-12-02) --------------------------------------------------------------
def test_a_wrong_production_path_excuses_no_bug():
    """A production output that is itself wrong (here request 1 x1.5: a stale pool, another layer's
    capture) widened every limit by its error, and a backend whose request 0 is x1.3 passed. Held to
    the floor rule against the oracle first, it widens nothing, and the verdict says why."""
    case = synth.make_case(bs=2, prefix=[300, 40], q_len=9, heads=4, seed=3)
    ref, ref_lse = oracle.run(case)
    ref, ref_lse = np.asarray(ref), np.asarray(ref_lse)
    cond, scale = oracle.lse_condition(case), oracle.out_scale(case)
    prod_out = ref.copy()
    prod_out[9:] *= 1.5                                    # request 1's tokens
    production = metrics(prod_out, ref, ref_lse, ref_lse, lse_cond=cond, out_scale=scale)
    assert not judge("production", production, ref).passed
    bad = ref.copy()
    bad[:9] *= 1.3                                         # request 0's tokens, no LSE
    v = judge("k", metrics(bad, ref, out_scale=scale), ref, production=production)
    assert not v.passed and "max_abs" in v.caught_by
    assert "the production path fails the floor rule against the oracle on this case" in v.reasons[-1]
    good = judge("k", metrics(ref, ref, ref_lse, ref_lse, lse_cond=cond, out_scale=scale), ref, production=production)
    assert good.passed


def test_a_reference_lse_of_nan_fails_instead_of_hiding_its_row():
    """Against a bf16 backend as the reference, its NaN LSE left the row out of the LSE check and
    counted nowhere; it is a non-finite reference entry now (-inf stays a row that sees nothing)."""
    b = _ref(T=2, H=2)
    lse = np.full((2, 2), 3.0)
    ref_lse = lse.copy()
    ref_lse[1, 1] = np.nan
    v = judge("k", metrics(b, b, lse + 1e9 * (np.arange(4).reshape(2, 2) == 3), ref_lse), b, against="triton")
    assert not v.passed and "reference" in v.caught_by
    ref_lse[1, 1] = -np.inf                                # a row that sees nothing: left out, counted
    m = metrics(b, b, lse, ref_lse)
    assert m.ref_nonfinite == 0 and m.empty_rows == 1


def test_a_reference_without_lse_is_named_as_the_one_without():
    """Against a capture (no LSE) the verdict blamed the backend's missing LSE."""
    b = _ref(T=2, H=2)
    lse = np.full((2, 2), 3.0)
    a = b.copy()
    a[1, 1] += 1.5 * compare.spacing(b)[1, 1]               # over the no-LSE row limit 2 x 0.7
    v = judge("k", metrics(a, b, lse, None), b, against="captured")
    assert not v.passed and "the reference (captured) carries no LSE" in v.reasons[-1]
    assert "no LSE from the reference" in v.rule
    assert metrics(a, b, None, lse).lse_missing == "the backend" and metrics(a, b, lse, lse).lse_missing == ""


def test_a_stated_lse_precision_is_held_to_its_bound_and_tightens_the_output_rule():
    """A backend whose LSE is only 2^-8 precise (FlashInfer sums bf16-rounded P) states so in
    Result.info["lse_abs_bound"]: an LSE within it passes where the fp32 rule would fail, one past
    it fails with the bound in the reason, and its output is held to the output-only limits."""
    import torch

    from kdkit.judge.compare import judge, metrics
    torch.manual_seed(0)
    ref = torch.randn(9, 8, 512, dtype=torch.float64)
    ref_lse = torch.randn(9, 8, dtype=torch.float64) + 5.0
    out = ref.to(torch.bfloat16).double()
    near = ref_lse + 1e-3                                     # ~1000 fp32 units off: fails the fp32 rule
    far = ref_lse + 2.0 ** -6
    assert not judge("b", metrics(out, ref, near, ref_lse), ref).passed
    v = judge("b", metrics(out, ref, near, ref_lse), ref, lse_abs_bound=2.0 ** -8)
    assert v.passed and "stated" in v.reasons[0] and v.lse_limit is None
    bad = judge("b", metrics(out, ref, far, ref_lse), ref, lse_abs_bound=2.0 ** -8)
    assert not bad.passed and any("stated LSE precision" in r for r in bad.reasons)
    no_lse = judge("b", metrics(out, ref), ref)
    assert v.checks["ulp_row"][1] == no_lse.checks["ulp_row"][1]   # the output-only limits
