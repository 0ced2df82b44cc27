"""The eager PyTorch backend against the float64 oracle, under kdkit.judge.compare's tolerance rule.

This sweep is also the calibration of the rule's bf16 floor (compare.OUT_FLOOR_U): correct bf16
kernels (fp32 P, and P rounded to bf16 as Triton does) must pass it with margin."""
import numpy as np
import pytest
import torch

from kdkit import backends, shapes, synth
from kdkit.judge import oracle
from kdkit.backends import torch_ref
from kdkit.judge.compare import BF16_U, OUT_FLOOR_U, judge, metrics

SWEEP = [
    # (kwargs, ids) chains, trees, ragged, prefix 0, q_len 1..1025, magnitude up to 30, H 1/8/16/128
    dict(bs=1, prefix=21, q_len=9, heads=8, tree="eagle"),
    dict(bs=1, prefix=40, q_len=17, heads=8, tree="chain", magnitude=8.0),
    dict(bs=3, prefix=[0, 37, 5], q_len=[1, 17, 9], heads=16, tree="ddtree", magnitude=30.0),
    dict(bs=2, prefix=[64, 0], q_len=[33, 40], heads=8, tree="causal", seed=3),
    dict(bs=2, prefix=[3, 9], q_len=[5, 7], heads=1, tree="diagonal", seed=4),
    dict(bs=1, prefix=64, q_len=16, heads=128, tree="eagle", magnitude=30.0, seed=5),
    dict(bs=1, prefix=33, q_len=9, heads=8, tree="eagle", magnitude=30.0, logit_cap=30.0, seed=6),
    dict(bs=1, prefix=16, q_len=1025, heads=1, tree="ddtree", magnitude=30.0, seed=7),
    dict(bs=1, prefix=1500, q_len=9, heads=8, tree="ddtree", magnitude=8.0, seed=8),
]
IDS = [f"{k['tree']}-bs{k['bs']}-q{max(np.atleast_1d(k['q_len']))}-h{k['heads']}-m{k.get('magnitude', 1.0):g}"
       for k in SWEEP]

@pytest.mark.parametrize("kw", SWEEP, ids=IDS)
@pytest.mark.parametrize("layout", ["sglang", "unified"])
def test_within_rule_against_oracle(kw, layout):
    case = synth.make_case(layout=layout, **kw)
    o, lse = oracle.run(case)
    ms = {}
    for p_bf16 in (False, True):
        res = torch_ref.run(case, p_bf16=p_bf16)
        assert res.out.dtype == torch.bfloat16 and res.lse.dtype == torch.float32
        assert tuple(res.out.shape) == (case.num_tokens, case.num_heads, 512)
        m = metrics(res.out, o, res.lse, lse)
        v = judge("torch", m, o)  # no production path here: the bf16 floor alone
        assert v.passed, (kw, p_bf16, v.reasons)
        # the calibration compare.OUT_FLOOR_U quotes: correct kernels stay >= 2x under the floor
        ratio = m.max_abs / (BF16_U * m.ref_max_abs)
        assert ratio <= OUT_FLOOR_U / 2, (kw, p_bf16, ratio)
        assert m.cos_dist < 1e-4  # bf16 output rounding gives ~1e-6
        ms[p_bf16] = m
    # each flavour passes with the other as the production path (2x its error + 2^-7 max|ref|):
    # a bf16-P kernel next to an fp32-P production path is the tight direction
    for p_bf16 in (False, True):
        assert judge("torch", ms[p_bf16], o, production=ms[not p_bf16]).passed, (kw, p_bf16)


def test_floor_is_not_vacuous():
    """bf16 output rounding alone reaches a good part of u * max|ref|: the floor is the right size,
    not orders of magnitude above what correct kernels do."""
    case = shapes.seed_shape()
    o, _ = oracle.run(case)
    m = metrics(torch_ref.run(case).out, o)
    assert 0.25 <= m.max_abs / (BF16_U * m.ref_max_abs) <= 1.0


def test_layouts_agree_bit_for_bit():
    kw = dict(bs=2, prefix=[7, 0], q_len=[9, 4], heads=8, tree="eagle", seed=11)
    a = torch_ref.run(synth.make_case(layout="sglang", **kw))
    b = torch_ref.run(synth.make_case(layout="unified", **kw))
    assert torch.equal(a.out, b.out) and torch.equal(a.lse, b.lse)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        torch.nan_to_num(a.float(), nan=1234.5), torch.nan_to_num(b.float(), nan=1234.5)) and \
        torch.equal(torch.isnan(a.float()), torch.isnan(b.float()))


def test_does_not_mutate_the_case_and_ignores_poisoned_rows():
    case = synth.make_case(bs=2, prefix=[5, 3], q_len=[4, 6], heads=8, tree="ddtree", keep_pool=True)
    assert torch.isnan(case.kv_buffer.float()).any()  # unreferenced pool rows are NaN
    before = case.clone()
    res = torch_ref.run(case)
    assert torch.isfinite(res.out.float()).all() and torch.isfinite(res.lse).all()
    for name in ("q", "k", "v", "kv_buffer", "kv_indptr", "kv_indices", "qo_indptr",
                 "out_cache_loc", "prefix_lens", "custom_mask", "mask_indptr"):
        assert _same(getattr(case, name), getattr(before, name)), name
    compact = torch_ref.run(synth.make_case(bs=2, prefix=[5, 3], q_len=[4, 6], heads=8, tree="ddtree"))
    assert torch.equal(res.out, compact.out)


def test_row_that_sees_nothing_matches_oracle_convention():
    case = synth.make_case(bs=1, prefix=0, q_len=3, heads=2, tree="chain")
    mask = case.custom_mask.clone()
    mask[3:6] = False
    case = case.clone(custom_mask=mask)
    res = torch_ref.run(case)
    assert torch.all(res.out[1] == 0) and torch.all(torch.isneginf(res.lse[1]))
    assert torch.isfinite(res.out.float()).all()


def test_registry_and_result_info():
    case = shapes.seed_shape()
    assert backends.unavailable("torch", case) is None
    res = backends.run("torch", case)
    assert res.info["device"] == "cpu" and res.info["dtype"] == "bf16 out, fp32 math"
    assert res.ran.startswith("eager PyTorch") and "on cpu" in res.ran
    with pytest.raises(TypeError, match="torch: unknown option.s. splits; this backend takes device"):
        backends.run("torch", case, splits=4)
    with pytest.raises(ValueError, match="not registered"):
        torch_ref.run(case, mutant="no-such-bug")


@pytest.mark.parametrize("nsplit", [1, 2, 3, 7, 64])
def test_splits_give_the_same_answer(nsplit):
    """The split-KV path (the kernel's 32-row tiles and splits, merged by LSE) is the same
    softmax: any split count agrees with one split to fp32 rounding, then bf16."""
    case = synth.make_case(bs=2, prefix=[300, 70], q_len=[9, 5], heads=8, tree="ddtree", seed=3)
    a, b = torch_ref.run(case, nsplit=1), torch_ref.run(case, nsplit=nsplit)
    assert b.info["nsplit"] == nsplit and f"{nsplit} KV split(s)" in b.ran
    ulp = 2.0 ** (np.floor(np.log2(float(a.out.float().abs().max()))) - 7)
    torch.testing.assert_close(a.out.float(), b.out.float(), rtol=0, atol=ulp)
    torch.testing.assert_close(a.lse, b.lse, rtol=1e-6, atol=1e-6)


def test_split_bounds_are_the_kernels():
    assert torch_ref.split_bounds(0, 4) == []
    assert torch_ref.split_bounds(30, 4) == [(0, 30)]                       # never less than a tile
    assert torch_ref.split_bounds(8201, 53) == [(s, min(8201, s + 160)) for s in range(0, 8201, 160)]
    assert torch_ref.split_bounds(100, 2) == [(0, 64), (64, 100)]


def test_small_chunks_give_the_same_answer():
    case = synth.make_case(bs=1, prefix=30, q_len=17, heads=8, tree="eagle", seed=2)
    a = torch_ref.run(case)
    b = torch_ref.run(case, chunk_elems=1)  # one query row per block
    # fp32 sums blocked differently can flip a bf16 rounding: at most one ulp of the largest output
    ulp = 2.0 ** (np.floor(np.log2(float(a.out.float().abs().max()))) - 7)
    torch.testing.assert_close(a.out.float(), b.out.float(), rtol=0, atol=ulp)
    torch.testing.assert_close(a.lse, b.lse, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_gpu_matches_cpu():
    case = shapes.seed_shape()
    a = torch_ref.run(case)
    b = torch_ref.run(case, device="cuda")
    assert b.out.is_cuda and b.info["device"].startswith("cuda")
    # TF32 is off by default for fp32 matmul in torch; both fp32: a few fp32 ulps, then bf16 rounding
    assert (a.out.float() - b.out.cpu().float()).abs().max() <= 2 ** -7 * a.out.float().abs().max()


def test_prefix_only_unified_case_is_a_clear_error():
    u = synth.make_case(bs=1, prefix=21, q_len=9, heads=8, tree="eagle", layout="unified")
    bad = u.clone(kv_indices=u.kv_indices[:21].clone(), kv_indptr=torch.tensor([0, 21], dtype=u.kv_indptr.dtype))
    with pytest.raises(ValueError, match=r"request 0: 21 KV rows but prefix 21 \+ q_len 9 = 30"):
        torch_ref.run(bad)
