"""kdkit's CUDA kernel on a GPU: bundled cases, a seeded sweep, every mutant caught, CUDA graphs,
split counts, block sizes, layouts and bad input. Marked `gpu`; skipped, with the reason, where
the kernel cannot run."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from kdkit import backends, kernel, shapes, synth, trees
from kdkit.judge import compare, oracle
from kdkit.backends import torch_ref
from kdkit.case import load
from kdkit.kernel import spec
from kdkit.layout import to_layout
from kdkit.perf import bench

WHY = backends.unavailable("cuda")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY is not None, reason=WHY or "")]
cuda = backends.get("cuda")
DATA = Path(__file__).resolve().parents[1] / "data" / "captured_tensors"
SWEEP = int(os.environ.get("KDKIT_SWEEP", "200"))


def _metrics(case, res):
    """Metrics against the float64 oracle, as replay computes them."""
    ref, ref_lse = oracle.run(case)
    return compare.metrics(res.out, ref, res.lse, ref_lse if res.lse is not None else None,
                           lse_cond=oracle.lse_condition(case)), ref


def _judge(case, res, production=None):
    """The tolerance rule of compare.judge against the float64 oracle (no production path: the
    floors alone; with SGLang's Triton: held to its error on the same inputs)."""
    m, ref = _metrics(case, res)
    return compare.judge("cuda", m, ref, production=production)


def _named(name, **kw):
    """A named shape of the GPU suite (kdkit/shapes.json, set "gpu-tests")."""
    return shapes.make_case(shapes.find("gpu-tests", name), **kw)


@pytest.mark.parametrize("name", ["seed-shape.pt", "ragged-bs4.pt", "ddtree-b64.pt", "long-prefix-8k.pt"])
def test_bundled_case(name):
    case = load(DATA / name)
    v = _judge(case, cuda.run(case))
    assert v.passed, v.reasons


TRITON_WHY = backends.unavailable("triton_sglang")


@pytest.mark.parametrize("seed", range(SWEEP))
def test_sweep(seed):
    """Against the oracle (bf16 floor alone), and, where SGLang's Triton kernel runs, also held to
    2x Triton's own error against the oracle + the bf16 floor (the rule in compare.judge)."""
    case = synth.random_case(seed)
    res = cuda.run(case)
    v = _judge(case, res)
    assert v.passed, f"{case.summary()}: {v.reasons}"
    if TRITON_WHY is None and os.environ.get("KDKIT_SWEEP_TRITON", "1") == "1":
        prod, _ = _metrics(case, backends.run("triton_sglang", case))
        v = _judge(case, res, production=prod)
        assert v.passed, f"{case.summary()} against Triton's error: {v.reasons}"


@pytest.mark.parametrize("name", ["long-prefix-128k", "long-prefix-128k-h1"])
def test_long_prefix(name):
    case = _named(name)
    v = _judge(case, cuda.run(case))
    assert v.passed, v.reasons


# "mutants" is a case every mutant can act on: two requests whose KV lengths (30, 309) are not
# multiples of 32, a tree mask with siblings, 8 heads; three splits so that the merge runs


@pytest.mark.parametrize("layout", ["sglang", "unified"])
@pytest.mark.parametrize("mutant", sorted(kernel.MUTANTS))
def test_mutants_fail(mutant, layout):
    """Every deliberately wrong build must fail the very check the production build passes."""
    case = to_layout(_named("mutants"), layout)
    assert _judge(case, cuda.run(case, nsplit=3)).passed
    v = _judge(case, cuda.run(case, nsplit=3, mutant=mutant))
    assert not v.passed, f"mutant {mutant} passed the check: the checker is broken"


@pytest.mark.parametrize("knockout", ["loop", "loads", "qk", "softmax", "pv", "mma-only", "no-mma"])
def test_knockouts_fail_the_check(knockout):
    """A knockout (kdkit/kernel/knockouts.py: a timing-only build with one part of the KV step
    switched off) fails the check the kernel passes, so its build is never taken for the kernel's;
    its run says what it is."""
    case = load(DATA / "long-prefix-8k.pt")
    assert _judge(case, cuda.run(case, nsplit=2)).passed
    res = cuda.run(case, nsplit=2, knockout=knockout)
    assert f"KNOCKOUT {knockout}" in res.info["ran"] and res.info["knockout"] == knockout
    assert not _judge(case, res).passed, f"knockout {knockout} passed the check"


# (left out, here and above: "entry", an empty launch whose output is whatever the buffer held,
# and "copy-wait" and "barrier", races that need not show in the output)
@pytest.mark.parametrize("knockout", ["loop", "loads", "qk", "softmax", "pv", "mma-only", "no-mma", "exchange", "ldsm"])
def test_pair_knockouts_fail_the_check(knockout):
    """The knockouts in the 64-row build (two of its own three too: the pair's exchange and the
    ldmatrix) fail the check its production build passes, on a deep tree where the plan takes it."""
    case = synth.make_case(bs=2, prefix=4096, q_len=64, heads=8, tree="ddtree", seed=7)
    base = cuda.run(case, nsplit=2)
    assert "-nt8-" in base.ran and _judge(case, base).passed, base.ran
    res = cuda.run(case, nsplit=2, knockout=knockout)
    assert "-nt8-" in res.ran and f"KNOCKOUT {knockout}" in res.info["ran"], res.ran
    assert not _judge(case, res).passed, f"knockout {knockout} passed the check in the 64-row build"


@pytest.mark.parametrize("nt", [5, spec.PAIR_NT])
def test_an_experiments_defines_reach_the_build(nt):
    """PlanOptions.extra_defines, an experiment's switch behind an #ifndef default: the max slack 0
    (the running max moves on every larger score, the textbook online softmax) builds under its
    own key, in the 40-row and the 64-row builds, and is right."""
    case = synth.make_case(bs=2, prefix=4096, q_len=64, heads=8, tree="ddtree", seed=7)
    x = cuda.to_device(case)
    p = cuda.plan_case(case, x, kernel.PlanOptions(nt=nt, nsplit=2, extra_defines={"KD_MAX_SLACK": 0, "KP_MAX_SLACK": 0}))
    assert f"-nt{nt}-" in p.key and "-x-KD_MAX_SLACK.0-KP_MAX_SLACK.0-" in p.key, p.key
    assert p.info["extra_defines"] == {"KD_MAX_SLACK": 0, "KP_MAX_SLACK": 0}
    kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])
    torch.cuda.synchronize()
    v = _judge(case, backends.Result(p.out.cpu(), p.lse.cpu(), {}))
    assert v.passed, v.reasons


@pytest.mark.parametrize("nsplit", [1, 2, 3, 7, 64, 256])
def test_split_counts_agree(nsplit):
    case = _named("split-counts")
    v = _judge(case, cuda.run(case, nsplit=nsplit))
    assert v.passed, v.reasons


@pytest.mark.parametrize("nt", spec.NT_CHOICES)
def test_block_sizes_agree(nt):
    """Every rows-per-block build, on a shape whose rows (9 x 16 = 144, 33 x 16) leave partial
    n-tiles and idle columns in the last block."""
    case = _named("block-sizes")
    v = _judge(case, cuda.run(case, nt=nt))
    assert v.passed, v.reasons


@pytest.mark.parametrize("nt", [2, 3, 4, 5])
def test_sixteen_warps_agree(nt):
    """nh=2 (16 warps, each taking half of a phase's work) on the partial-n-tile shape, every bundled
    case and a graph replay: the same rule as the 8-warp build."""
    case = _named("block-sizes")
    v = _judge(case, cuda.run(case, nt=nt, nh=2))
    assert v.passed, v.reasons
    for name in ["seed-shape.pt", "ragged-bs4.pt", "ddtree-b64.pt", "long-prefix-8k.pt"]:
        case = load(DATA / name)
        v = _judge(case, cuda.run(case, nt=nt, nh=2))
        assert v.passed, (name, v.reasons)


@pytest.mark.parametrize("seed", range(40))
def test_sixteen_warps_sweep(seed):
    case = synth.random_case(seed)
    v = _judge(case, cuda.run(case, nh=2))
    assert v.passed, f"{case.summary()}: {v.reasons}"


@pytest.mark.parametrize("mutant", sorted(kernel.MUTANTS))
def test_sixteen_warp_mutants_fail(mutant):
    case = _named("mutants")
    assert _judge(case, cuda.run(case, nsplit=3, nh=2)).passed
    assert not _judge(case, cuda.run(case, nsplit=3, nh=2, mutant=mutant)).passed, mutant


def test_layouts_agree():
    case = _named("layouts")
    a = cuda.run(to_layout(case, "sglang")).out.float()
    b = cuda.run(to_layout(case, "unified")).out.float()
    # same rows, same order of reduction: the two layouts read identical bytes
    assert torch.equal(a, b)


def test_run_is_deterministic():
    case = _named("deterministic")
    a, b = cuda.run(case), cuda.run(case)
    assert torch.equal(a.out, b.out) and torch.equal(a.lse, b.lse)


def _padded_metadata(case, mask_room):
    """The case's tensors on the GPU, its mask in a preallocated buffer of `mask_room` entries, as
    SGLang's graph buffers are."""
    x = cuda.to_device(case)
    buf = torch.zeros(mask_room, dtype=torch.uint8, device="cuda")
    buf[: x["custom_mask"].numel()].copy_(x["custom_mask"].view(torch.uint8))
    x["custom_mask"] = buf
    return x


def _copy_into(x, case):
    """What a server does before replay: new data into the bound tensors, same shapes."""
    y = cuda.to_device(case)
    for name in ("q", "k", "v", "qo_indptr", "kv_indptr", "kv_indices", "prefix_lens", "mask_indptr"):
        x[name].copy_(y[name])
    x["custom_mask"][: y["custom_mask"].numel()].copy_(y["custom_mask"].view(torch.uint8))
    x["kv_buffer"][: y["kv_buffer"].shape[0]].copy_(y["kv_buffer"])


@pytest.mark.parametrize("max_q_len", [None, 9])
def test_cuda_graph_replay(max_q_len):
    """Capture run() once; copy new inputs of the same shape into the bound tensors; replay.
    The replays change the data, the prefix lengths and (max_q_len=None only) how the T tokens
    are split among the requests; bs, T, the total prefix and the pool size stay fixed."""
    replays = [s for s in shapes.get("gpu-graph-replay")
               if max_q_len is None or max(shapes.per_request(s, "q_len")) <= max_q_len]
    cases = [shapes.make_case(s, spare_rows=0, index_dtype=torch.int64) for s in replays]
    assert len({c.kv_buffer.shape[0] for c in cases}) == 1
    x = _padded_metadata(cases[0], max(c.custom_mask.numel() for c in cases))
    c0 = cases[0]
    p = kernel.plan(qo_indptr=x["qo_indptr"], kv_indptr=x["kv_indptr"], kv_indices=x["kv_indices"],
                    custom_mask=x["custom_mask"], mask_indptr=x["mask_indptr"], num_heads=c0.num_heads,
                    sm_scale=c0.sm_scale, options=kernel.PlanOptions(max_q_len=max_q_len, max_kv_len=1509))
    assert p.nsplit > 1  # the merge (in place, one cooperative launch, where the grid fits) is in the graph too
    kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])  # warm-up outside capture (module load)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])
    for case in cases[1:] + cases[:1]:
        _copy_into(x, case)
        g.replay()
        torch.cuda.synchronize()
        v = _judge(case, backends.Result(p.out.clone(), p.lse.clone()))
        assert v.passed, f"{case.summary()}: {v.reasons}"


def _another_layer(case, seed):
    """The same batch (indices, mask) with another layer's data: new q, k (= v's source), pool."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda t: torch.randn(t.shape, generator=g).to(t.dtype)  # noqa: E731
    k = rnd(case.k)
    return case.clone(q=rnd(case.q), k=k, v=k[..., :512].clone(), kv_buffer=rnd(case.kv_buffer))


def test_one_plan_many_layers():
    """SGLang plans once per step and runs every layer: each layer's own q/k/v/pool and output."""
    base = _named("many-layers", poison_unused=False)
    cases = [base] + [_another_layer(base, 21 + i) for i in range(2)]
    xs = [cuda.to_device(c) for c in cases]
    p = cuda.plan_case(cases[0], xs[0])
    outs = []
    for x in xs:
        out = torch.empty_like(p.out)
        lse = torch.empty_like(p.lse)
        kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"], out=out, lse=lse)
        outs.append((out, lse))
    torch.cuda.synchronize()
    for case, (out, lse) in zip(cases, outs):
        v = _judge(case, backends.Result(out, lse))
        assert v.passed, v.reasons


def test_matches_triton_rule():
    """Against SGLang's Triton kernel where it can run: kdkit's error <= 2x Triton's + floor."""
    why = backends.unavailable("triton_sglang")
    if why:
        pytest.skip(why)
    for name in ("triton-rule-seed", "triton-rule-ragged", "triton-rule-chain", "triton-rule-hot"):
        case = _named(name)
        prod, _ = _metrics(case, backends.run("triton_sglang", case))
        v = _judge(case, cuda.run(case), production=prod)
        assert v.passed, v.reasons


# ---- the mask decides under causal=True ----------------------------------------------------
def _reversed_chain_case(q_len, layout):
    """causal=True (as SGLang passes it) with a chain numbered children first: root 0, then depth
    q_len - 1 at index 1 ... depth 1 at q_len - 1; row i >= 1 sees draft columns 0 and i..q_len-1,
    all after itself. Legal input (lint: tree-order), which a split ended at the block's last token
    by the causal rule would get wrong."""
    parents = [-1] + list(range(2, q_len)) + [0]
    case = synth.make_case(prefix=40, q_len=q_len, heads=8, tree="chain", layout="sglang", seed=35)
    n, p = q_len, 40
    full = case.custom_mask[: n * (p + n)].view(n, p + n)
    full[:, p:] = torch.from_numpy(trees.tree_block(parents)).to(full.dtype)
    assert case.causal
    return to_layout(case, layout)


@pytest.mark.parametrize("layout", ["sglang", "unified"])
@pytest.mark.parametrize("q_len", [9, 20, 65])
def test_mask_decides_under_causal(q_len, layout):
    case = _reversed_chain_case(q_len, layout)
    runs = [(f"skip {skip}, nt {nt}, nsplit {ns}", cuda.run(case, skip=skip, nt=nt, nsplit=ns))
            for skip, nt in ((False, 1), (False, 5), (True, 1), (True, 5), ("gather", 1), ("gather", 3), ("gather", 4))
            for ns in (None, 1)]
    _judge_each(case, runs)


# ---- deep trees at a short prefix: the KV steps no row of a block sees are skipped ----------
def _judge_each(case, runs):
    """Judge every (label, Result) of one case against one float64 oracle run (the oracle of a
    q_len 1025 case takes seconds: computed once, not once per split count)."""
    ref, ref_lse = oracle.run(case)
    cond = oracle.lse_condition(case)
    for label, res in runs:
        m = compare.metrics(res.out, ref, res.lse, ref_lse, lse_cond=cond)
        v = compare.judge("cuda", m, ref)
        assert v.passed, f"{case.summary()} {label} ({res.ran}): {v.reasons}"


def _deep_case(prefix, q_len, heads, tree, layout, seed):
    """A one-request case; tree "noncausal" is "causal" (no mask) with causal=False: every row
    sees every draft column, so nothing may be skipped."""
    case = synth.make_case(prefix=prefix, q_len=q_len, heads=heads, layout=layout, seed=seed,
                           tree="causal" if tree == "noncausal" else tree)
    return case.clone(causal=False) if tree == "noncausal" else case


def _deep_runs(case, nsplits, nh2=True):
    """The skip build at each split count (and with 16 warps), the gather build at 8, 24 (a block
    that ends inside a token at H 16) and 32 rows per block, the 64-row build at each split count,
    and the plan's own choice."""
    runs = [(f"skip, nsplit {ns}", cuda.run(case, nsplit=ns, skip=True)) for ns in nsplits]
    runs += [(f"gather, nt {nt}, nsplit {ns}", cuda.run(case, nsplit=ns, nt=nt, skip="gather"))
             for nt in (1, 3, 4) for ns in nsplits]
    runs += [(f"64-row pair, nsplit {ns}", cuda.run(case, nsplit=ns, nt=spec.PAIR_NT)) for ns in nsplits]
    runs.append(("the plan's choice", cuda.run(case)))
    if nh2:
        runs.append(("skip, 16 warps", cuda.run(case, nh=2, skip=True)))
    return runs


@pytest.mark.parametrize("layout", ["sglang", "unified"])
@pytest.mark.parametrize("heads", [1, 8, 16])
@pytest.mark.parametrize("tree", ["ddtree", "chain", "causal", "noncausal"])
@pytest.mark.parametrize("prefix", [21, 70, 1000])  # 70: the split's second step holds prefix columns
def test_deep_tree_q257(prefix, tree, heads, layout):
    """q_len 257: most of a block's draft steps hold no column its tokens see (a tree mask: only
    their ancestors; "causal" has no mask: columns up to the last token; "noncausal": all). The
    skipped steps must change nothing: the automatic split count, one split, several (pure-draft
    splits, splits the causal rule empties), 16 warps."""
    case = _deep_case(prefix, 257, heads, tree, layout, seed=31)
    runs = _deep_runs(case, (None, 1, 3, 8))
    if prefix == 21 and tree in ("ddtree", "chain"):  # 9 draft steps of 9: the plan takes a skip build
        assert "-skip" in runs[-2][1].ran  # (the last run is the 16-warp one)
    _judge_each(case, runs)


@pytest.mark.parametrize("tree", ["ddtree", "chain"])
@pytest.mark.parametrize("heads", [1, 8])
@pytest.mark.parametrize("prefix", [21, 1000])
def test_deep_tree_q1025(prefix, heads, tree):
    """q_len 1025 (33 draft steps, the skip table's candidates up to 32 per split at H 1's 40-token
    blocks), one layout each way."""
    layout = "unified" if heads == 1 else "sglang"
    case = synth.make_case(prefix=prefix, q_len=1025, heads=heads, tree=tree, layout=layout, seed=32)
    _judge_each(case, _deep_runs(case, (None, 1, 4), nh2=heads > 1))


@pytest.mark.parametrize("q_len", [2100, 2050])
def test_deep_chain_past_the_skip_table(q_len):
    """H 1, one split: q_len 2100 holds 67 draft steps, more than the skip table's 64 candidates,
    so it streams every step (no skipping); 2050 fills the table to its last entry. Two splits
    (about 33 steps each) use the table."""
    case = synth.make_case(prefix=21, q_len=q_len, heads=1, tree="chain", seed=33)
    _judge_each(case, _deep_runs(case, (1, 2), nh2=False))


def _poison_draft(case, first_col):
    """The case with request 0's draft K and V rows from column `first_col` on set to NaN, where
    the kernel reads them (sglang: k and v; unified: the pool rows kv_indices name)."""
    nan = float("nan")
    if case.layout == "sglang":
        k, v = case.k.clone(), case.v.clone()
        k[first_col: case.q_lens[0]] = nan
        v[first_col: case.q_lens[0]] = nan
        return case.clone(k=k, v=v)
    pool = case.kv_buffer.clone()
    p0, n0 = int(case.prefix_lens[0]), case.q_lens[0]
    pool[case.kv_indices[p0 + first_col: p0 + n0].long()] = nan
    return case.clone(kv_buffer=pool)


@pytest.mark.parametrize("layout", ["sglang", "unified"])
@pytest.mark.parametrize("tree", ["ddtree", "chain", "causal"])
@pytest.mark.parametrize("prefix", [21, 1000])
def test_skipped_steps_are_not_read(prefix, tree, layout):
    """The skip really skips. Tokens 0..4 of a tree (parents come first) see draft columns 0..4
    only; the draft's K and V past the first draft step's columns are NaN. A block that still
    streamed one of those steps would add p = 0 x NaN = NaN to its rows; the blocks of tokens
    0..4 (40 rows at nt 5, H 8; one token per block at nt 1) must instead give bit for bit the
    output of the clean case, which the oracle judges. Causal without a mask also at 3 splits
    (the rule empties the later splits); a mask's split always streams its first step (its index
    chain starts before the visibility pass), so with a mask only one split keeps NaN out."""
    clean = synth.make_case(prefix=prefix, q_len=257, heads=8, tree=tree, layout=layout, seed=34)
    first_col = (prefix // 32 + 1) * 32 - prefix  # the first draft column of the second draft step
    assert first_col > 4
    poisoned = _poison_draft(clean, first_col)
    runs = []
    for skip, nt in ((True, 1), (True, 5), ("gather", 1), ("gather", 3), ("gather", 4)):
        for nsplit in (1, 3) if tree == "causal" else (1,):
            a = cuda.run(clean, nt=nt, nsplit=nsplit, skip=skip)
            b = cuda.run(poisoned, nt=nt, nsplit=nsplit, skip=skip)
            assert torch.isnan(b.out.float()).any(), "the poison reaches the tokens that see it"
            assert torch.equal(a.out[:5], b.out[:5]) and torch.equal(a.lse[:5], b.lse[:5]), \
                f"skip {skip}, nt {nt}, nsplit {nsplit}: tokens 0..4 read a skipped step ({b.ran})"
            runs.append((f"skip {skip}, nt {nt} nsplit {nsplit}", a))
    _judge_each(clean, runs)


@pytest.mark.parametrize("skip", [True, "gather"])
@pytest.mark.parametrize("layout", ["sglang", "unified"])
@pytest.mark.parametrize("mutant", sorted(kernel.MUTANTS))
def test_mutants_fail_on_a_deep_tree(mutant, layout, skip):
    """Where the skip table or the column list is in use (q_len 129 and 65 at prefix 21 and 300),
    every mutant still fails. The mask mutants misread the mask in the visibility pass as in the
    scores: their build agrees with the torch model of the same mutant, which streams every step (a
    pass that read the true mask could leave out a column only the misread mask shows, and differ)."""
    case = to_layout(synth.make_case(bs=2, prefix=[21, 300], q_len=[129, 65], heads=8, tree="ddtree",
                                     seed=8), layout)
    nt = spec.GATHER_MAX_NT if skip == "gather" else None
    assert _judge(case, cuda.run(case, nsplit=3, skip=skip, nt=nt)).passed
    res = cuda.run(case, nsplit=3, mutant=mutant, skip=skip, nt=nt)
    v = _judge(case, res)
    assert not v.passed, f"mutant {mutant} passed the check: the checker is broken"
    if mutant in ("mask-row-offset", "mask-col-offset"):
        model = torch_ref.run(case, mutant=mutant, nsplit=3)
        m = compare.metrics(res.out, model.out.double(), res.lse, model.lse.double(),
                            lse_cond=oracle.lse_condition(case))
        v = compare.judge("cuda", m, model.out.double())
        assert v.passed, f"{mutant}: the skip build differs from the torch model of it: {v.reasons}"


@pytest.mark.parametrize("nt", spec.TC_NT_CHOICES)
def test_skip_builds_agree(nt):
    """The skip build (which the plan takes only for deep trees at a short prefix) on the
    partial-n-tile shape and every bundled case: causal, ragged, no mask, long prefix."""
    for skip in (True, "gather") if nt <= spec.GATHER_MAX_NT else (True,):
        case = _named("block-sizes")
        v = _judge(case, cuda.run(case, nt=nt, skip=skip))
        assert v.passed, (skip, v.reasons)
        for name in ["seed-shape.pt", "ragged-bs4.pt", "ddtree-b64.pt", "long-prefix-8k.pt"]:
            case = load(DATA / name)
            v = _judge(case, cuda.run(case, nt=nt, skip=skip))
            assert v.passed, (skip, name, v.reasons)


@pytest.mark.parametrize("seed", range(40))
def test_skip_sweep(seed):
    case = synth.random_case(seed)
    v = _judge(case, cuda.run(case, skip=True))
    assert v.passed, f"{case.summary()}: {v.reasons}"
    v = _judge(case, cuda.run(case, skip="gather", nt=1 + seed % spec.GATHER_MAX_NT))
    assert v.passed, f"{case.summary()} (gather): {v.reasons}"


# ---- the 64-row build (kd_pair.cuh: query rows on the MMA's M dimension, a warp pair per 16 rows)

@pytest.mark.parametrize("seed", range(40))
def test_pair_sweep(seed):
    """The 64-row build on the sweep's random cases (ragged batches, trees, caps, both layouts,
    index types), at the plan's split count for it and at 3."""
    case = synth.random_case(seed)
    for nsplit in (None, 3):
        res = cuda.run(case, nt=spec.PAIR_NT, nsplit=nsplit)
        assert "-nt8-" in res.ran
        v = _judge(case, res)
        assert v.passed, f"{case.summary()} (nsplit {nsplit}): {v.reasons}"


@pytest.mark.parametrize("layout", ["sglang", "unified"])
@pytest.mark.parametrize("mutant", sorted(kernel.MUTANTS))
def test_pair_mutants_fail(mutant, layout):
    """Every mutant hook acts in the 64-row build too: each wrong build fails the check its
    production build passes (the mutants' case, 3 splits so that the merge runs)."""
    case = to_layout(_named("mutants"), layout)
    assert _judge(case, cuda.run(case, nsplit=3, nt=spec.PAIR_NT)).passed
    v = _judge(case, cuda.run(case, nsplit=3, nt=spec.PAIR_NT, mutant=mutant))
    assert not v.passed, f"mutant {mutant} passed the check in the 64-row build: the checker is broken"


def test_plan_takes_the_pair_build_for_many_rows_over_a_long_prefix():
    """The plan's own choice at the grid's deep-tree shapes is the 64-row build, and it is right,
    with the merge kernel (its default) or fused when asked; a knockout asked for times the same
    build."""
    case = synth.make_case(bs=2, prefix=4096, q_len=64, heads=8, tree="ddtree", seed=5)
    res = cuda.run(case)
    assert "-nt8-" in res.ran and "merge fused" not in res.ran, res.ran
    v = _judge(case, res)
    assert v.passed, v.reasons
    fused = cuda.run(case, fused=True)
    assert "-nt8-" in fused.ran and "merge fused" in fused.ran, fused.ran
    v = _judge(case, fused)
    assert v.passed, v.reasons
    assert "-nt8-" in cuda.run(case, knockout="softmax").ran


# ---- sm_scale, kdkit bench's shapes and its Triton decode baseline --------------------------
@pytest.mark.parametrize("sm_scale", [0.05, 576 ** -0.5, 1.0], ids=["0.05", "576^-0.5", "1.0"])
def test_sm_scale(sm_scale):
    """Every other case runs at synth.KIMI_SM_SCALE: the scale must reach the scores (a scale
    ignored or applied twice moves every probability), one split and three (the merge's LSE)."""
    case = _named("mutants").clone(sm_scale=sm_scale)
    for nsplit in (1, 3):
        v = _judge(case, cuda.run(case, nsplit=nsplit))
        assert v.passed, f"sm_scale {sm_scale}, nsplit {nsplit}: {v.reasons}"


QUICK = bench.grid(quick=True)


@pytest.mark.parametrize("which", ["auto", "largest-swept"])
@pytest.mark.parametrize("shape", QUICK, ids=[s.label.replace(" ", "-") for s in QUICK])
def test_bench_quick_shapes(shape, which):
    """What kdkit bench times is right: each --quick shape (the case bench makes) at the automatic
    split count and at the largest one its NSPLIT sweep runs (bench.swept_nsplits), against the
    float64 oracle (~20 s of CPU for the largest shape's oracle here)."""
    case = bench.make_case(shape)
    nsplit = None if which == "auto" else max(bench.swept_nsplits(shape, bench.NSPLITS))
    res = cuda.run(case, nsplit=nsplit)
    v = _judge(case, res)
    assert v.passed, f"{shape.label} ({res.ran}): {v.reasons}"


def test_triton_decode_baseline_is_per_node_attention():
    """kdkit bench's "Triton decode kernel fed one query per tree node" computes what it claims:
    each node's query over its request's prefix and its visible draft slots is the oracle's row
    (no LSE: the decode kernel keeps only per-split ones). 1 x 1K, q_len 9: eight KV splits."""
    why = backends.unavailable("triton_sglang")
    if why:
        pytest.skip(why)
    shape = next(s for s in QUICK if (s.bs, s.prefix, s.q_len) == (1, 1024, 9))
    case = bench.make_case(shape)
    v = _judge(case, backends.run("triton_decode", case))
    assert v.passed, v.reasons


# ---- bad input: a clear Python error before any launch -----------------------------------
def _plan(case, x=None, **kw):
    x = x or cuda.to_device(case)
    return cuda.plan_case(case, x, kernel.PlanOptions(**kw)), x


def test_rejects_wrong_dtype():
    case = shapes.seed_shape()
    p, x = _plan(case)
    with pytest.raises(kernel.InputError, match="field 'q'"):
        kernel.run(p, x["q"].half(), x["k"], x["v"], x["kv_buffer"])


def test_rejects_pool_too_small():
    case = shapes.seed_shape()
    p, x = _plan(case)
    with pytest.raises(kernel.InputError, match="kv_buffer"):
        kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"][:2])


def test_rejects_mask_of_wrong_length():
    case = shapes.seed_shape()
    case.custom_mask = case.custom_mask[:-9]
    case.mask_indptr = case.mask_indptr.clone()
    case.mask_indptr[-1] -= 9
    with pytest.raises(kernel.InputError, match="mask"):
        _plan(case)


def test_rejects_seed_bugs():
    for name in ("mask-indptr-sliced.pt", "prefix-only-kv-indices.pt"):
        case = load(DATA / "failures" / name)
        with pytest.raises(kernel.InputError):
            _plan(case)


def test_rejects_the_gather_where_its_end_mark_cannot_reach():
    """Causal without a mask the gather's list is only its 16-bit end mark, which the causal rule can leave
    q_len - 1 columns short of the split's end: q_len above 2^16 - 1 is refused, by name."""
    dev = torch.device("cuda")
    ind = dict(qo_indptr=torch.tensor([0, 70000], dtype=torch.int32, device=dev),
               kv_indptr=torch.tensor([0, 0], dtype=torch.int32, device=dev),
               kv_indices=torch.zeros(0, dtype=torch.int32, device=dev), num_heads=1, sm_scale=1.0, causal=True)
    with pytest.raises(kernel.InputError, match="field 'skip'.*16-bit end mark"):
        kernel.plan(**ind, options=kernel.PlanOptions(skip="gather"))
    assert kernel.plan(**ind, options=kernel.PlanOptions(skip=False)).nsplit >= 1


def test_rejects_bad_nsplit_and_mutant():
    with pytest.raises(kernel.InputError, match="nsplit"):
        cuda.run(shapes.seed_shape(), nsplit=0)
    with pytest.raises(kernel.InputError, match="nsplit"):
        cuda.run(shapes.seed_shape(), nsplit=257)
    with pytest.raises(kernel.InputError, match="mutant"):
        cuda.run(shapes.seed_shape(), mutant="no-such-bug")


def test_rejects_outputs_elsewhere_or_aliased():
    """An audit's: lse on the host or another device, and an .expand()ed out (rows overwriting
    each other) reached the kernel."""
    case = shapes.seed_shape()
    p, x = _plan(case)
    T, H = case.num_tokens, case.num_heads
    with pytest.raises(kernel.InputError, match="field 'lse': on cpu"):
        kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"], lse=torch.empty(T, H))
    aliased = torch.empty(T, 1, 512, dtype=torch.bfloat16, device="cuda").expand(T, H, 512)
    with pytest.raises(kernel.InputError, match="field 'out'.*share memory"):
        kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"], out=aliased)


def test_plans_a_batch_without_query_tokens_and_16_warp_gathers():
    case = synth.make_case(bs=2, prefix=[4, 7], q_len=0, tree="causal")
    p, x = _plan(case)
    out, _ = kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])
    assert out.shape[0] == 0
    p, _ = _plan(shapes.seed_shape(), nh=2, skip="gather")
    assert p.config.nt >= 2 and p.config.skip == "gather"


def test_run_binds_each_layers_tensors_to_their_own_fields_and_rechecks_what_changed():
    """run() writes one layer's pointers and strides into the plan's packed argument by position
    (params.LAYER, in PER_LAYER's order): distinct strides everywhere, so a swapped pair cannot
    pass. Its full check runs again whenever shapes, strides, dtypes or devices change, and the
    alignment on every call: a bad layer after good ones is still refused by name."""
    from kdkit.kernel import params
    case = shapes.seed_shape()
    p, x = _plan(case)
    T, H = case.num_tokens, case.num_heads
    bf = dict(dtype=torch.bfloat16, device="cuda")
    q = torch.randn(T, H + 1, 576, **bf)[:, :H]           # head stride 576, token stride (H + 1) * 576
    k = torch.randn(T, 1, 600, **bf)[..., :576]
    v = torch.randn(T, 1, 520, **bf)[..., :512]
    kv = torch.randn(x["kv_buffer"].shape[0], 1, 584, **bf)[..., :576]
    out = torch.empty(T, H + 2, 512, **bf)[:, :H]
    lse = torch.empty(T, H, dtype=torch.float32, device="cuda")
    for _ in range(2):  # the second call takes the fast path
        kernel.run(p, q, k, v, kv, out=out, lse=lse)
    want = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "kv_buf": kv.data_ptr(),
            "out": out.data_ptr(), "lse": lse.data_ptr(), "q_stride_tok": (H + 1) * 576, "q_stride_head": 576,
            "k_stride_tok": 600, "v_stride_tok": 520, "kv_stride_row": 584, "out_stride_tok": (H + 2) * 512,
            "out_stride_head": 512}
    assert set(want) == set(params.PER_LAYER)
    for name, value in want.items():
        assert int(p.args.arr[name][0]) == value, name
    assert int(p.args.arr["num_heads"][0]) == H and int(p.args.arr["nsplit"][0]) == p.nsplit
    torch.cuda.synchronize()
    # after good calls: a misaligned view of the same shape and strides, a wrong dtype, a short pool
    odd = torch.empty(T * H * 576 + 8, **bf)[1:1 + T * H * 576].view(T, H, 576)
    with pytest.raises(kernel.InputError, match="field 'q': starts at address"):
        kernel.run(p, odd, x["k"], x["v"], x["kv_buffer"])
    with pytest.raises(kernel.InputError, match="field 'q'"):
        kernel.run(p, x["q"].half(), x["k"], x["v"], x["kv_buffer"])
    kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])
    with pytest.raises(kernel.InputError, match="kv_buffer"):
        kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"][:2])
