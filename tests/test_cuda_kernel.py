"""kdkit's CUDA kernel on a GPU: bundled cases, a seeded sweep, negative controls, CUDA graphs,
split counts, layouts and bad input. Skipped (with the reason) where no GPU + CuPy exist."""
from __future__ import annotations

import os
from pathlib import Path

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
        ref, ref_lse = oracle.run(case)
        tri = backends.run("triton_sglang", case)
        prod = compare.metrics(tri.out, ref, tri.lse, ref_lse if tri.lse is not None else None)
        v = compare.judge("cuda", compare.metrics(res.out, ref, res.lse, ref_lse), ref, production=prod)
        assert v.passed, f"{case.summary()} against Triton's error: {v.reasons}"


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


def _bind_padded(case, mask_room):
    """Inputs whose mask is a preallocated buffer of `mask_room` entries, as SGLang's graph has."""
    x = cuda.Inputs.from_case(case)
    buf = torch.zeros(mask_room, dtype=torch.uint8, device=x.q.device)
    buf[: x.custom_mask.numel()].copy_(x.custom_mask)
    x.custom_mask = buf
    return x


def _copy_into(x, case):
    """What a server does before replay: new data into the bound tensors, same shapes."""
    y = cuda.Inputs.from_case(case)
    for name in ("q", "k", "v", "qo_indptr", "kv_indptr", "kv_indices", "prefix_lens", "mask_indptr"):
        getattr(x, name).copy_(getattr(y, name))
    x.custom_mask[: y.custom_mask.numel()].copy_(y.custom_mask)
    x.kv_buffer[: y.kv_buffer.shape[0]].copy_(y.kv_buffer)


@pytest.mark.parametrize("max_q_len", [None, 9])
def test_cuda_graph_replay(max_q_len):
    """Capture launch() once; copy new inputs of the same shape into the bound tensors; replay.
    The replays change the data, the prefix lengths and (max_q_len=None only) how the T tokens
    are split among the requests; bs, T, the total prefix and the pool size stay fixed."""
    shapes = [([300, 1200], [9, 9], 11), ([1200, 300], [9, 9], 12), ([750, 750], [9, 9], 13)]
    if max_q_len is None:
        shapes += [([800, 700], [1, 17], 14), ([0, 1500], [17, 1], 15)]
    cases = [synth.make_case(bs=2, prefix=p, q_len=q, tree="ddtree", seed=s, spare_rows=0,
                             index_dtype=torch.int64) for p, q, s in shapes]
    assert len({c.kv_buffer.shape[0] for c in cases}) == 1
    x = _bind_padded(cases[0], max(c.custom_mask.numel() for c in cases))
    p = cuda.plan(x, max_q_len=max_q_len)
    assert p.nsplit > 1  # the reduce kernel is part of the graph too
    cuda.launch(p)  # warm-up outside capture (module load)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cuda.launch(p)
    for case in cases[1:] + cases[:1]:
        _copy_into(x, case)
        g.replay()
        torch.cuda.synchronize()
        v = _judge(case, backends.Result(p.out.clone(), p.lse.clone()))
        assert v.passed, f"{case.summary()}: {v.reasons}"


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
