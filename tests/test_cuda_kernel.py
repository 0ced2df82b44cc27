"""kdkit's CUDA kernel on a GPU: bundled cases, a seeded sweep, negative controls, CUDA graphs,
split counts, layouts and bad input. Skipped (with the reason) where no GPU + CuPy exist."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from kdkit import backends, compare, oracle, synth
from kdkit.case import load
from kdkit.layout import to_layout

WHY = backends.unavailable("cuda")
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")
cuda = backends.get("cuda")
DATA = Path(__file__).resolve().parents[1] / "data" / "captured_tensors"
SWEEP = int(os.environ.get("KDKIT_SWEEP", "200"))


def _judge(case, res, production=None):
    """The tolerance rule of compare.judge against the float64 oracle (no production path: the
    bf16 floor 2^-6 max|ref|; with SGLang's Triton: 2x its error + that floor)."""
    ref, ref_lse = oracle.run(case)
    m = compare.metrics(res.out, ref, res.lse, ref_lse)
    return compare.judge("cuda", m, ref, production=production)


@pytest.mark.parametrize("name", ["seed-shape.pt", "ragged-bs4.pt", "ddtree-b64.pt", "long-prefix-8k.pt"])
def test_bundled_case(name):
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"{path} not built (python -m kdkit.bundled)")
    case = load(path)
    v = _judge(case, cuda.run(case))
    assert v.passed, v.reasons


@pytest.mark.parametrize("seed", range(SWEEP))
def test_sweep(seed):
    case = synth.random_case(seed)
    v = _judge(case, cuda.run(case))
    assert v.passed, f"{case.summary()}: {v.reasons}"


@pytest.mark.parametrize("prefix,heads", [(131072, 8), (131072, 1)])
def test_long_prefix(prefix, heads):
    case = synth.make_case(bs=1, prefix=prefix, q_len=9, heads=heads, tree="ddtree", seed=5)
    v = _judge(case, cuda.run(case))
    assert v.passed, v.reasons


@pytest.mark.parametrize("layout", ["sglang", "unified"])
@pytest.mark.parametrize("variant", ["no-scale", "mask-row-off-by-one", "prefix-only-kv"])
def test_negative_controls_fail(variant, layout):
    """Deliberately wrong builds must fail the very check the correct build passes."""
    case = to_layout(synth.make_case(bs=2, prefix=[21, 300], q_len=9, tree="eagle", seed=1), layout)
    assert _judge(case, cuda.run(case)).passed
    v = _judge(case, cuda.run(case, variant=variant))
    assert not v.passed, f"{variant} passed the check: the checker is broken"


@pytest.mark.parametrize("nsplit", [1, 2, 3, 7, 64, 256])
def test_split_counts_agree(nsplit):
    case = synth.make_case(bs=3, prefix=[0, 700, 5000], q_len=[9, 1, 33], heads=8, tree="ddtree", seed=2)
    v = _judge(case, cuda.run(case, nsplit=nsplit))
    assert v.passed, v.reasons


def test_layouts_agree():
    case = synth.make_case(bs=2, prefix=[50, 2000], q_len=[17, 65], heads=16, tree="ddtree", seed=4)
    a = cuda.run(to_layout(case, "sglang")).out.float()
    b = cuda.run(to_layout(case, "unified")).out.float()
    # same rows, same order of reduction: the two layouts read identical bytes
    assert torch.equal(a, b)


def test_cuda_graph_replay():
    """Capture launch() once; copy new inputs of the same shape into the bound tensors; replay."""
    c1 = synth.make_case(bs=2, prefix=[300, 1200], q_len=9, tree="ddtree", seed=11)
    c2 = synth.make_case(bs=2, prefix=[300, 1200], q_len=9, tree="ddtree", seed=12)
    x = cuda.Inputs.from_case(c1)
    p = cuda.plan(x)
    assert p.nsplit > 1  # the reduce kernel is part of the graph too
    cuda.launch(p)  # warm-up outside capture (module load)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cuda.launch(p)
    for case in (c2, c1, c2):
        y = cuda.Inputs.from_case(case)
        for name in ("q", "k", "v", "kv_buffer", "kv_indices", "custom_mask"):
            getattr(x, name).copy_(getattr(y, name))
        g.replay()
        torch.cuda.synchronize()
        res = backends.Result(p.out.clone(), p.lse.clone())
        v = _judge(case, res)
        assert v.passed, v.reasons


def test_matches_triton_rule():
    """Against SGLang's Triton kernel where it can run: kdkit's error <= 2x Triton's + floor."""
    why = backends.unavailable("triton_sglang")
    if why:
        pytest.skip(why)
    for seed, kw in enumerate([dict(bs=1, prefix=21, q_len=9), dict(bs=4, prefix=[0, 5, 800, 4000], q_len=9),
                               dict(bs=1, prefix=8192, q_len=33, tree="chain"),
                               dict(bs=2, prefix=1000, q_len=65, heads=16, magnitude=8.0)]):
        kw.setdefault("tree", "ddtree")
        case = synth.make_case(seed=seed, **kw)
        ref, ref_lse = oracle.run(case)
        tri = backends.run("triton_sglang", case)
        prod = compare.metrics(tri.out, ref, tri.lse, ref_lse if tri.lse is not None else None)
        v = _judge(case, cuda.run(case), production=prod)
        assert v.passed, v.reasons


# ---- bad input: a clear Python error before any launch -----------------------------------
def _bad(case, exc=cuda.InputError, match=None, **kw):
    with pytest.raises(exc, match=match):
        cuda.run(case, **kw)


def test_rejects_wrong_dtype():
    case = synth.seed_shape()
    x = cuda.Inputs.from_case(case)
    x.q = x.q.half()
    with pytest.raises(cuda.InputError, match="field 'q'"):
        cuda.plan(x)


def test_rejects_index_outside_pool_without_lint():
    case = synth.seed_shape()
    x = cuda.Inputs.from_case(case)
    x.kv_indices[3] = case.kv_buffer.shape[0] + 5
    with pytest.raises(cuda.InputError, match="kv_indices"):
        cuda.plan(x)


def test_rejects_mask_of_wrong_length():
    case = synth.seed_shape()
    case.custom_mask = case.custom_mask[:-9]
    case.mask_indptr = case.mask_indptr.clone()
    case.mask_indptr[-1] -= 9
    _bad(case, match="mask")
    x = cuda.Inputs.from_case(case)
    with pytest.raises(cuda.InputError, match="mask"):
        cuda.plan(x)


def test_rejects_seed_bugs():
    for name in ("mask-indptr-sliced.pt", "prefix-only-kv-indices.pt"):
        path = DATA / "failures" / name
        if not path.is_file():
            pytest.skip(f"{path} not built")
        case = load(path)
        _bad(case)
        with pytest.raises(cuda.InputError):
            cuda.plan(cuda.Inputs.from_case(case))


def test_rejects_bad_nsplit():
    _bad(synth.seed_shape(), nsplit=0, match="nsplit")
    _bad(synth.seed_shape(), nsplit=257, match="nsplit")
