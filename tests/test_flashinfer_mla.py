"""FlashInfer's fa2 MLA kernel as the flashinfer_mla backend: its paged copy of the KV and its mask
check on the CPU; on a GPU (marked `gpu`), agreement with kdkit's float64 oracle on causal cases
under compare.judge's rule, a CUDA-graph replay, and its refusal of tree masks."""
from __future__ import annotations

import pytest
import torch

from kdkit import backends, compare, oracle, synth
from kdkit.backends import flashinfer_mla as fi
from kdkit.layout import request_kv

WHY = backends.unavailable(fi.NAME)


def on_gpu(test):
    """Marked gpu; skipped, with the reason, where the backend cannot run."""
    return pytest.mark.gpu(pytest.mark.skipif(WHY is not None, reason=WHY or "")(test))


def test_unavailable_is_one_line_naming_the_backend():
    why = backends.unavailable(fi.NAME, synth.seed_shape())
    assert why is None or (why.startswith(f"{fi.NAME}: ") and "\n" not in why)
    if not torch.cuda.is_available():
        assert why == f"{fi.NAME}: no CUDA GPU: FlashInfer's MLA kernel runs on sm_80+ only"


@pytest.mark.parametrize("tree, bad", [("causal", None), ("chain", None), ("ddtree", 1), ("eagle", 1)])
def test_only_a_causal_draft_mask_is_taken(tree, bad):
    """Read off the mask, not the name: a chain's custom mask is the causal one. Request 0 has
    q_len 1 (any tree of one node is causal), so the first tree is request 1's."""
    case = synth.make_case(bs=2, prefix=[7, 30], q_len=[1, 9], heads=2, tree=tree)
    assert fi.non_causal_request(case) == bad


@pytest.mark.parametrize("layout", ["sglang", "unified"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_pages_hold_each_requests_rows_in_order(layout, page_size):
    case = synth.make_case(bs=3, prefix=[0, 17, 130], q_len=[4, 9, 1], heads=2, tree="causal", layout=layout)
    x = fi.paged(case, page_size, device="cpu")
    assert x.kv.shape[1:] == (page_size, 576)
    for b in range(case.batch_size):
        want = request_kv(case, b)[0]
        pages = x.kv_indices[x.kv_indptr[b]: x.kv_indptr[b + 1]].long()
        got = x.kv[pages].reshape(-1, 576)
        assert int(x.kv_lens[b]) == want.shape[0] and got.shape[0] == -(-want.shape[0] // page_size) * page_size
        assert torch.equal(got[: want.shape[0]], want)


def test_a_page_size_below_one_is_refused():
    with pytest.raises(ValueError, match="^page_size: 0; give a positive"):
        fi.paged(synth.seed_shape(tree="causal"), 0, device="cpu")


def _verdict(case, res):
    """compare.judge's rule against the float64 oracle, no production path: every statistic under the
    bf16 floor alone (max_abs <= 2^-6 max|ref|, the ulp floors, the LSE within 12 fp32 units of its
    error scale; kdkit/compare.py says where each comes from). The LSE is compared: a log2 LSE
    (off by a factor ln 2) fails it."""
    ref, ref_lse = oracle.run(case)
    m = compare.metrics(res.out, ref, res.lse, ref_lse, lse_cond=oracle.lse_condition(case))
    return compare.judge(fi.NAME, m, ref)


CAUSAL = {  # name -> make_case arguments; H 8 and 16 as the bench, a ragged batch, a long prefix
    "seed-shape": dict(bs=1, prefix=21, q_len=9, heads=8),
    "ragged-bs3": dict(bs=3, prefix=[5, 300, 1000], q_len=[9, 4, 16], heads=16),
    "bs4-q64": dict(bs=4, prefix=[700, 64, 1500, 3], q_len=64, heads=8),
    "long-prefix-32k": dict(bs=1, prefix=32768, q_len=9, heads=16),
    "magnitude-16": dict(bs=2, prefix=[2000, 400], q_len=9, heads=8, magnitude=16.0),
}


@pytest.mark.parametrize("name", list(CAUSAL))
@pytest.mark.parametrize("tree", ["causal", "chain"])
@on_gpu
def test_agrees_with_the_oracle(name, tree):
    case = synth.make_case(tree=tree, **CAUSAL[name])
    res = backends.run(fi.NAME, case)
    v = _verdict(case, res)
    assert v.passed, f"{case.summary()}: {v.reasons}"
    assert "FlashInfer" in res.ran and "no tree mask" in res.ran


@pytest.mark.parametrize("page_size", [1, 16])
@on_gpu
def test_other_page_sizes_agree(page_size):
    case = synth.make_case(tree="causal", layout="unified", **CAUSAL["ragged-bs3"])
    v = _verdict(case, backends.run(fi.NAME, case, page_size=page_size))
    assert v.passed, v.reasons


@on_gpu
def test_graph_replay_gives_the_launchs_result():
    """prepare's launch captured once and replayed: the bench times it so (graph_safe)."""
    case = synth.make_case(tree="causal", **CAUSAL["bs4-q64"])
    p = fi.prepare(case)
    assert p.graph_safe
    p.launch()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        p.launch()
    p.result().out.zero_()  # a copy: the buffers keep the eager launch's output until the replay
    g.replay()
    torch.cuda.synchronize()
    v = _verdict(case, p.result())
    assert v.passed, v.reasons


@on_gpu
def test_tree_masks_and_soft_caps_are_refused_with_the_reason():
    tree = synth.make_case(bs=2, prefix=100, q_len=9, heads=8, tree="ddtree")
    why = backends.unavailable(fi.NAME, tree)
    assert why == (f"{fi.NAME}: FlashInfer takes no tree mask, only causal over the draft rows; request 0's "
                   "draft mask is a tree, not a chain (time it on a causal case: synth tree 'causal')")
    with pytest.raises(backends.BackendUnavailable, match="no tree mask"):
        backends.run(fi.NAME, tree)
    capped = synth.make_case(bs=1, prefix=100, q_len=9, heads=8, tree="causal", logit_cap=30.0)
    assert backends.unavailable(fi.NAME, capped) == f"{fi.NAME}: FlashInfer's MLA has no logit soft cap, this case caps at 30"
