"""kdkit.lint: the bundled cases lint as recorded, each check fires on a minimal broken case built
from synth, the seed's bugs are named with their numbers, and check() never raises."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kdkit import bundled, lint, shapes, synth, trees
from kdkit.case import load
from kdkit.layout import to_unified
from kdkit.lint import Finding

from conftest import DATA  # data/captured_tensors, or KDKIT_TEST_DATA


def codes(case, severity=None):
    return {f.code for f in lint.check(case) if severity is None or f.severity == severity}


def only(case, code):
    found = [f for f in lint.check(case) if f.code == code]
    assert found, f"{code} not found; lint said:\n{lint.format_findings(lint.check(case))}"
    return found[0]


def small(**kw):
    """A small, clean synthetic case (2 heads keeps it fast; every check is head-agnostic)."""
    kw.setdefault("heads", 2)
    return synth.make_case(**kw)


def with_mask_block(case, b, block):
    """Replace request b's q_len x q_len draft block of the custom mask (prefix columns kept True)."""
    c = case.clone()
    n, p = case.q_lens[b], int(case.prefix_lens[b])
    s = int(case.mask_indptr[b])
    full = c.custom_mask[s: s + n * (p + n)].view(n, p + n)
    full[:, p:] = torch.from_numpy(np.asarray(block, dtype=bool)).to(full.dtype)
    return c


# ---- the bundled cases ---------------------------------------------------------------------
GOOD = [e for e in bundled.load_manifest(DATA)["cases"] if e["expected_replay"] == "pass"]
FAIL = [e for e in bundled.load_manifest(DATA)["cases"] if e["expected_replay"] != "pass"]


@pytest.mark.parametrize("entry", GOOD, ids=lambda e: e["path"])
def test_bundled_good_cases_lint_clean(entry):
    case = load(DATA / entry["path"])
    bad = [f for f in lint.check(case) if f.severity in ("error", "warning")]
    assert bad == [], lint.format_findings(bad)


@pytest.mark.parametrize("entry", FAIL, ids=lambda e: e["path"])
def test_bundled_failure_cases_give_only_their_named_error(entry):
    case = load(DATA / entry["path"])
    assert sorted(f.code for f in lint.errors(case)) == entry["expected_lint"]


def test_prefix_only_kv_indices_is_named_with_the_seed_numbers():
    case = load(DATA / "failures/prefix-only-kv-indices.pt")
    found = lint.check(case)
    f = only(case, "prefix-only-kv-indices")
    assert f.severity == "error" and f.field == "kv_indices"
    assert "KV length 21" in f.message and "9 x 30 = 270" in f.message
    assert "cat(kv_indices[kv_indptr[b]:kv_indptr[b+1]], out_cache_loc[qo_indptr[b]:qo_indptr[b+1]])" in f.fix
    assert "sglang layout" in f.fix
    # the generic layout finding it explains is folded in, not listed beside it
    assert "layout-kv-length" not in {x.code for x in found} and "layout-kv-length" in f.message


def test_prefix_only_kv_indices_ragged_batch_lists_each_request():
    u = to_unified(small(bs=3, prefix=[5, 0, 12], q_len=[4, 3, 1]))
    p = u.prefix_lens.tolist()
    keep = torch.cat([u.kv_indices[int(u.kv_indptr[b]): int(u.kv_indptr[b]) + p[b]] for b in range(3)])
    bad = u.clone(kv_indices=keep, kv_indptr=torch.tensor([0, 5, 5, 17], dtype=u.kv_indptr.dtype))
    f = only(bad, "prefix-only-kv-indices")
    assert "request 0: KV length 5 but prefix + draft = 5 + 4 = 9" in f.message
    assert "4 x 9 = 36" in f.message and "request 2: KV length 12" in f.message


def test_mask_indptr_sliced_end_offsets_bs2():
    case = load(DATA / "failures/mask-indptr-sliced.pt")
    f = only(case, "mask-indptr-sliced")
    assert f.severity == "error" and f.field == "mask_indptr"
    assert "END offsets" in f.message and "[270, 540]" in f.message and "mask_indptr[1:]" in f.message
    assert "2 entries for bs=2" in f.message and "past the end of the 540-entry mask" in f.message
    assert "whole (bs+1 entries, starting at 0" in f.fix and "mask_indptr[:bs]" in f.fix
    assert "[0, 270, 540]" in f.fix


def test_mask_indptr_sliced_end_offsets_seed_bs1():
    case = shapes.seed_shape()
    bad = case.clone(mask_indptr=case.mask_indptr[1:].clone())
    f = only(bad, "mask-indptr-sliced")
    assert f.severity == "error" and "[270]" in f.message and "9x30" in f.message


def test_mask_indptr_sliced_start_offsets_is_a_warning():
    case = small(bs=2, prefix=[21, 13], q_len=9)
    f = only(case.clone(mask_indptr=case.mask_indptr[:2].clone()), "mask-indptr-sliced")
    assert f.severity == "warning" and "START offsets [0, 270]" in f.message


def test_mask_indptr_sliced_suppresses_generic_mask_indptr_findings():
    case = small(bs=2, prefix=[21, 13], q_len=9)
    got = codes(case.clone(mask_indptr=case.mask_indptr[1:].clone()))
    assert "mask-indptr-sliced" in got
    assert not got & {"mask-indptr-length", "mask-indptr-start", "mask-indptr-offsets"}


# ---- the clean variants stay clean ---------------------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(layout="unified"),
    dict(mask_dtype=torch.uint8),
    dict(index_dtype=torch.int64),
    dict(keep_pool=True),                 # whole pool with NaN-poisoned spare rows
    dict(bs=3, prefix=[0, 4, 30], q_len=[1, 5, 40], tree="ddtree"),
    dict(tree="chain"),
], ids=["unified", "uint8-mask", "int64", "keep-pool", "ragged", "chain"])
def test_clean_variants(kw):
    case = small(**kw)
    assert [f for f in lint.check(case) if f.severity != "info"] == []


def test_no_mask_is_info_only():
    got = lint.check(small(tree="causal"))
    assert [f.code for f in got] == ["no-custom-mask"] and got[0].severity == "info"


# ---- index arrays -------------------------------------------------------------------------
def test_kv_indptr_not_monotone():
    case = small(bs=3, prefix=[6, 6, 6], q_len=3)
    f = only(case.clone(kv_indptr=torch.tensor([0, 10, 6, 18], dtype=torch.int32)), "kv-indptr-not-monotone")
    assert f.severity == "error" and "10 -> 6" in f.message


def test_kv_indptr_start_and_length():
    case = small(bs=2, prefix=[6, 6], q_len=3)
    assert "kv-indptr-start" in codes(case.clone(kv_indptr=torch.tensor([2, 6, 12], dtype=torch.int32)))
    f = only(case.clone(kv_indptr=torch.tensor([0, 6], dtype=torch.int32)), "kv-indptr-length")
    assert "2 entries" in f.message and "bs+1 = 3" in f.message


def test_kv_indptr_end_against_kv_indices():
    case = small(prefix=10, q_len=3)
    f = only(case.clone(kv_indices=case.kv_indices[:7].clone()), "kv-indptr-end")
    assert f.severity == "error" and "ends at 10" in f.message and "only 7" in f.message
    longer = torch.cat([case.kv_indices, case.kv_indices[:2]])
    f = only(case.clone(kv_indices=longer), "kv-indptr-end")
    assert f.severity == "warning" and "last 2" in f.message


def test_qo_indptr_end():
    case = small(bs=2, prefix=4, q_len=3)
    f = only(case.clone(qo_indptr=torch.tensor([0, 3, 5], dtype=torch.int32)), "qo-indptr-end")
    assert "ends at 5" in f.message and "T=6" in f.message


def test_index_out_of_range_in_memory():
    case = small(prefix=10, q_len=3)
    N = case.kv_buffer.shape[0]
    idx = case.kv_indices.clone()
    idx[3] = N + 5
    f = only(case.clone(kv_indices=idx), "kv-index-out-of-range")
    assert f.severity == "error" and f"kv_indices[3] = {N + 5}" in f.message and f"{N} kv_buffer rows" in f.message
    loc = case.out_cache_loc.clone()
    loc[1] = -1
    assert "out-cache-loc-out-of-range" in codes(case.clone(out_cache_loc=loc))


def test_scratch_slot_referenced():
    case = small(prefix=10, q_len=3)
    idx = case.kv_indices.clone()
    idx[4] = 0  # compacted row 0 is pool slot 0
    f = only(case.clone(kv_indices=idx), "scratch-slot-referenced")
    assert f.severity == "error" and "kv_indices[4] = 0" in f.message
    loc = case.out_cache_loc.clone()
    loc[0] = 0
    f = only(case.clone(out_cache_loc=loc), "scratch-slot-referenced")
    assert f.severity == "warning" and f.field == "out_cache_loc"


def test_prefix_lens_length():
    case = small(bs=2, prefix=4, q_len=3)
    assert "prefix-lens-length" in codes(case.clone(prefix_lens=torch.tensor([4])))


# ---- layout ---------------------------------------------------------------------------------
def test_sglang_layout_with_unified_indices():
    u = to_unified(small(prefix=10, q_len=3))
    f = only(u.clone(layout="sglang"), "layout-kv-length")
    assert "KV length 13 against prefix 10" in f.message and "layout='unified'" in f.fix


def test_unified_draft_tail_must_be_out_cache_loc():
    u = to_unified(small(prefix=10, q_len=3))
    idx = u.kv_indices.clone()
    idx[11] = idx[2]
    f = only(u.clone(kv_indices=idx), "unified-draft-tail")
    assert f.severity == "error" and "out_cache_loc" in f.message


def test_pool_draft_mismatch_and_v_not_latent():
    case = small(prefix=10, q_len=3)
    kb = case.kv_buffer.clone()
    kb[int(case.out_cache_loc[1]), 0, 7] += 1.0
    f = only(case.clone(kv_buffer=kb), "pool-draft-mismatch")
    assert f.severity == "warning" and "1 of 3" in f.message and "draft token 1" in f.message
    v = case.v.clone()
    v[2, 0, 5] += 1.0
    f = only(case.clone(v=v), "v-not-latent-of-k")
    assert f.severity == "warning" and "token 2" in f.message


# ---- the mask -------------------------------------------------------------------------------
def test_mask_length_mismatch():
    case = small(prefix=21, q_len=9)
    f = only(case.clone(custom_mask=case.custom_mask[:200].clone(), mask_indptr=torch.tensor([0, 200])),
             "mask-length")
    assert f.severity == "error" and "200 entries" in f.message and "9x30 = 270" in f.message


def test_mask_indptr_offsets():
    case = small(bs=2, prefix=[21, 13], q_len=9)
    f = only(case.clone(mask_indptr=torch.tensor([0, 250, 468])), "mask-indptr-offsets")
    assert "mask_indptr[1] = 250" in f.message and "270" in f.message


def test_mask_prefix_column_false_is_a_warning():
    case = small(prefix=21, q_len=9)
    m = case.custom_mask.clone()
    m[30 * 2 + 5] = False  # row 2, prefix column 5
    f = only(case.clone(custom_mask=m), "mask-prefix-false")
    assert f.severity == "warning" and "row 2, prefix column 5" in f.message and "skip" in f.message


def test_uint8_mask_accepted_and_odd_values_warned():
    case = small(mask_dtype=torch.uint8)
    assert case.custom_mask.dtype == torch.uint8 and lint.check(case) == []
    m = case.custom_mask.clone()
    m[0] = 2
    assert only(case.clone(custom_mask=m), "mask-uint8-values").severity == "warning"


# ---- rows and trees -------------------------------------------------------------------------
def test_row_sees_nothing_with_prefix_0():
    case = small(bs=2, prefix=[0, 8], q_len=4, tree="chain")
    blk = trees.tree_block(trees.chain(4))
    blk[2, :] = False
    f = only(with_mask_block(case, 0, blk), "row-sees-nothing")
    assert f.severity == "error" and "request 0" in f.message and "[2]" in f.message
    # the same row with a prefix to look at is only a tree problem, not an error
    bad1 = with_mask_block(case, 1, blk)
    assert "row-sees-nothing" not in codes(bad1) and "tree-self-not-visible" in codes(bad1, "warning")


def test_diagonal_is_not_a_tree_but_not_a_non_ancestor_either():
    got = {f.code: f for f in lint.check(small(tree="diagonal", q_len=5))}
    assert got["tree-root-not-visible"].severity == "warning"
    assert "tree-sees-non-ancestor" not in got and "tree-self-not-visible" not in got


def test_row_sees_a_sibling():
    parents = [-1, 0, 0, 1, 2]          # 1 and 2 are siblings
    blk = trees.tree_block(parents)
    blk[3, 2] = True                    # node 3 (child of 1) also sees 2
    f = only(with_mask_block(small(q_len=5), 0, blk), "tree-sees-non-ancestor")
    assert f.severity == "warning" and "different branches" in f.message


def test_row_misses_an_ancestor():
    blk = trees.tree_block(trees.chain(5))
    blk[4, 2] = False                   # 4 sees 3, 3 sees 2, 4 does not
    f = only(with_mask_block(small(q_len=5), 0, blk), "tree-sees-non-ancestor")
    assert "row 4 sees column 3 but not 2" in f.message


def test_rows_that_see_each_other():
    blk = trees.tree_block([-1, 0, 0])
    blk[1, 2] = blk[2, 1] = True
    f = only(with_mask_block(small(q_len=3), 0, blk), "tree-sees-non-ancestor")
    assert "see each other" in f.message


def _reversed_chain(n):
    """A chain whose nodes are numbered children-first: root 0, then depth n-1 at index 1 ... depth 1
    at index n-1 (parent of node i is i+1, the last node's parent is the root)."""
    return [-1] + list(range(2, n)) + [0]


def test_out_of_order_tree_q65_is_an_error():
    parents = _reversed_chain(65)
    case = with_mask_block(small(q_len=65, prefix=4), 0, trees.tree_block(parents))
    f = only(case, "tree-order")
    assert f.severity == "error"
    assert "row 1 sees draft column 32" in f.message and "BLOCK_M=32" in f.message and "< 32" in f.message
    assert "parents come before children" in f.fix
    # the visible sets are still a tree: only the order is wrong
    assert "tree-sees-non-ancestor" not in codes(case)
    # causal=False makes the Triton kernel scan every column: computable
    assert "tree-order" not in codes(case.clone(causal=False))


def test_out_of_order_tree_within_one_block_is_not_an_error():
    case = with_mask_block(small(q_len=9), 0, trees.tree_block(_reversed_chain(9)))
    f = only(case, "tree-order-non-topological")
    assert f.severity == "info" and "tree-order" not in codes(case)
    case = with_mask_block(small(q_len=20), 0, trees.tree_block(_reversed_chain(20)))
    assert only(case, "tree-order-non-topological").severity == "warning"  # breaks with sm_100's BLOCK_M 16


def test_ddtree_q65_numbered_parents_first_is_clean():
    assert lint.errors(small(q_len=65, prefix=4, tree="ddtree")) == []


# ---- values ---------------------------------------------------------------------------------
def test_nan_in_q():
    case = small(prefix=6, q_len=3)
    q = case.q.clone()
    q[1, 1, 100] = float("nan")
    f = only(case.clone(q=q), "nonfinite-input")
    assert f.severity == "error" and f.field == "q" and "token 1, head 1, dim 100" in f.message


def test_inf_in_k_sglang_error_unified_warning():
    case = small(prefix=6, q_len=3)
    k = case.k.clone()
    k[0, 0, 3] = float("inf")
    assert only(case.clone(k=k), "nonfinite-input").severity == "error"
    u = to_unified(case)
    assert only(u.clone(k=k), "nonfinite-input").severity == "warning"


def test_nan_in_referenced_pool_row_but_not_in_unreferenced_one():
    case = small(prefix=10, q_len=3, keep_pool=True)  # whole pool: spare rows are NaN already
    referenced = set(case.kv_indices.tolist()) | set(case.out_cache_loc.tolist())
    spare = [r for r in range(1, case.kv_buffer.shape[0]) if r not in referenced]
    assert spare and bool(torch.isnan(case.kv_buffer[spare]).all())
    assert "nonfinite-pool-row" not in codes(case)
    kb = case.kv_buffer.clone()
    row = int(case.kv_indices[4])
    kb[row, 0, 10] = float("nan")
    f = only(case.clone(kv_buffer=kb), "nonfinite-pool-row")
    assert f.severity == "error" and f"rows [{row}]" in f.message and "1 of the 10" in f.message


# ---- robustness and output ------------------------------------------------------------------
TENSORS = ["q", "k", "v", "kv_buffer", "kv_indptr", "kv_indices", "qo_indptr", "out_cache_loc",
           "prefix_lens", "slot_ids", "custom_mask", "mask_indptr"]


def _garbage_cases():
    base = small(bs=2, prefix=[5, 0], q_len=[3, 2])
    for name in TENSORS:
        yield f"{name}=None", base.clone(**{name: None})
        t = getattr(base, name)
        yield f"{name}-rank", base.clone(**{name: t.reshape(1, -1) if t.dim() == 1 else t.reshape(-1)})
        yield f"{name}-dtype", base.clone(**{name: t.long() if t.is_floating_point() else t.float() * 0.5})
        yield f"{name}-empty", base.clone(**{name: t[:0]})
    yield "layout", base.clone(layout="sideways")
    yield "num_heads-str", base.clone(num_heads="8")
    yield "dims", base.clone(v_head_dim=7)
    yield "meta", base.clone(meta=None)
    yield "qo-garbage", base.clone(qo_indptr=torch.tensor([3, 1, 99], dtype=torch.int32))
    yield "mask-indptr-huge", base.clone(mask_indptr=torch.tensor([0, 10**9, -5]))


@pytest.mark.parametrize("name,case", list(_garbage_cases()), ids=lambda x: x if isinstance(x, str) else "")
def test_check_never_raises_on_garbage(name, case):
    found = lint.check(case)
    assert all(isinstance(f, Finding) for f in found)
    assert not [f for f in found if f.code == "lint-internal"], lint.format_findings(found)
    assert [f for f in found if f.severity in ("error", "warning")], f"{name}: garbage went unnoticed"
    assert lint.format_findings(found).startswith("lint: ")


@pytest.mark.parametrize("thing", [None, 42, "case", {"q": 1}])
def test_check_on_non_cases(thing):
    found = lint.check(thing)
    assert found and all(f.severity in lint.SEVERITIES for f in found)
    assert not [f for f in found if f.code == "lint-internal"]


def test_a_crashing_check_becomes_lint_internal():
    def check_that_crashes(ctx):
        raise ZeroDivisionError("boom")
        yield

    lint.CHECKS.append(check_that_crashes)
    try:
        found = lint.check(shapes.seed_shape())
    finally:
        lint.CHECKS.remove(check_that_crashes)
    assert [f.code for f in found] == ["lint-internal"]
    assert "check_that_crashes" in found[0].message and "ZeroDivisionError: boom" in found[0].message


def test_errors_first_and_errors_filter():
    case = small(prefix=6, q_len=3)
    q = case.q.clone()
    q[0, 0, 0] = float("nan")
    v = case.v.clone()
    v[0, 0, 1] += 1
    found = lint.check(case.clone(q=q, v=v))
    sev = [f.severity for f in found]
    assert sev == sorted(sev, key=lint.SEVERITIES.index) and "error" in sev and "warning" in sev
    assert [f.code for f in lint.errors(case.clone(q=q, v=v))] == ["nonfinite-input"]


def test_format_findings():
    assert lint.format_findings([]) == "lint: clean"
    f = Finding("mask-length", "error", "custom_mask", "custom_mask has 200 entries", "do the thing")
    w = Finding("mask-prefix-false", "warning", "custom_mask", "row 2", "set True")
    text = lint.format_findings([f, w])
    assert text.startswith("lint: 1 error, 1 warning")
    assert "ERROR mask-length [custom_mask]\n  custom_mask has 200 entries\n  fix: do the thing" in text
    assert "WARNING mask-prefix-false" in text


def test_codes_are_kebab_case_and_severities_known():
    bad = small(prefix=6, q_len=3).clone(layout="sideways", kv_indptr=torch.tensor([1, 0]))
    for f in lint.check(bad):
        assert f.severity in lint.SEVERITIES
        assert f.code == f.code.lower() and " " not in f.code and "_" not in f.code


# ---- fuzz: random corruptions of real cases never crash a check ------------------------------
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_FUZZ_BASES = None


def _fuzz_bases():
    global _FUZZ_BASES
    if _FUZZ_BASES is None:
        _FUZZ_BASES = [small(bs=2, prefix=[5, 0], q_len=[3, 2]),
                       to_unified(small(bs=3, prefix=[4, 9, 0], q_len=[1, 4, 35], heads=1)),
                       small(prefix=3, q_len=4, heads=1, tree="causal")]
    return _FUZZ_BASES


def _corrupt(t, op, k):
    if t is None:
        return torch.arange(5)
    return [lambda: t[: k % (t.shape[0] + 1)], lambda: t.flip(0),
            lambda: t * float("nan") if t.is_floating_point() else (t.long() + k - 25).to(t.dtype),
            lambda: t.reshape(-1), lambda: t.unsqueeze(0), lambda: torch.cat([t, t]), lambda: None,
            lambda: t.to([torch.int32, torch.float32, torch.bool, torch.uint8, torch.float64][k % 5])][op]()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.integers(0, 2), edits=st.lists(st.tuples(st.sampled_from(TENSORS), st.integers(0, 7),
                                                         st.integers(0, 50)), min_size=1, max_size=3),
       layout=st.sampled_from(["keep", "sglang", "unified", "bogus"]))
def test_fuzzed_cases_never_crash_a_check(base, edits, layout):
    c = _fuzz_bases()[base].clone()
    for name, op, k in edits:
        setattr(c, name, _corrupt(getattr(c, name), op, k))
    if layout != "keep":
        c.layout = layout
    found = lint.check(c)
    assert not [f for f in found if f.code == "lint-internal"], lint.format_findings(found)
