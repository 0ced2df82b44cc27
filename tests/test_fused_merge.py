"""The fused merge (kdkit/kernel/cuda/mla_tc.cu, p.fused): where a plan splits the KV a little, the
split blocks merge in place instead of in a second kernel, so run() is one driver call. Two ways:
"wait" (every split block waits for its siblings and merges its share; a cooperative launch, the
grid resident) and "last" (the last split block of a row block to finish merges it; any grid). Held
here, for both: chosen as the grid allows, "wait" refused by name where the grid cannot be resident;
right against the float64 oracle and agreeing with the merge kernel; the merge mutant fails through
it as through the merge kernel; its counters, never reset, stay right across many runs and
CUDA-graph replays. Each in the 8- to 40-row builds and in the 64-row build (kd_pair.cuh), which
end in the same merge (kd_fused.cuh)."""
from __future__ import annotations

import pytest
import torch

from kdkit import backends, kernel, shapes
from kdkit.judge import compare, oracle
from kdkit.kernel import spec
from kdkit.kernel.checks import InputError

WHY = backends.unavailable("cuda")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY is not None, reason=WHY or "")]
cuda = backends.get("cuda")
# the partial kernel the merge ends: the plan's (an 8- to 40-row build here) or the 64-row build
BUILDS = pytest.mark.parametrize("nt", [None, spec.PAIR_NT], ids=["plan-build", "64-row"])


def _judge(case, res):
    ref, ref_lse = oracle.run(case)
    m = compare.metrics(res.out, ref, res.lse, ref_lse, lse_cond=oracle.lse_condition(case))
    return compare.judge("cuda", m, ref)


def _named(name, **kw):
    return shapes.make_case(shapes.find("gpu-tests", name), **kw)


def _fused_and_apart_agree(case, nsplit, way, nt=None):
    """Both merges right against the oracle, and near each other: the same partials summed in
    another order (warps over splits here, the plan's thread groups there): fp32 sums of <= 256
    terms, then bf16, so a bf16 rounding or two apart at most (2^-7 of the row's largest value)."""
    fused = cuda.run(case, nsplit=nsplit, fused=way, nt=nt)
    apart = cuda.run(case, nsplit=nsplit, fused=False, nt=nt)
    assert fused.info["fused"] == way and not apart.info["fused"] and "merge fused" in fused.info["ran"]
    for res in (fused, apart):
        v = _judge(case, res)
        assert v.passed, v.reasons
    scale = apart.out.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
    assert ((fused.out.float() - apart.out.float()).abs() / scale).max().item() <= 2.0 ** -7
    assert torch.allclose(fused.lse, apart.lse, rtol=1e-5, atol=1e-5)  # fp32 LSEs of the same weights


@BUILDS
@pytest.mark.parametrize("way", ["wait", "last"])
@pytest.mark.parametrize("nsplit", [2, 3, 6])  # (at 6: 126 blocks, one an SM of the H200)
def test_fused_and_merge_kernel_agree(nsplit, way, nt):
    case = _named("split-counts")
    _fused_and_apart_agree(case, nsplit, way, nt)


@BUILDS
@pytest.mark.parametrize("way", ["wait", "last"])
@pytest.mark.parametrize("nsplit", [8, 16, 33])
def test_warps_sharing_a_row_agree(nsplit, way, nt):
    """One request of q_len 9 at an 8K prefix: each block merges 1-5 of its rows, so 2 or 4 warps
    share a row (each its part of the 512 dims) instead of a warp a row."""
    from pathlib import Path

    from kdkit.case import load
    case = load(Path(__file__).resolve().parents[1] / "data" / "captured_tensors" / "long-prefix-8k.pt")
    _fused_and_apart_agree(case, nsplit, way, nt)


def test_the_plan_fuses_where_the_grid_fits_and_launches_once():
    case = _named("split-counts")
    x = cuda.to_device(case)
    p = cuda.plan_case(case, x, kernel.PlanOptions(nsplit=4))
    assert p.fused == "wait" and len(p.launcher.calls) == 1 and p.launcher.calls[0][-1]  # one cooperative launch
    p1 = cuda.plan_case(case, x, kernel.PlanOptions(nsplit=1))
    assert not p1.fused and len(p1.launcher.calls) == 1  # one split: nothing to merge
    p2 = cuda.plan_case(case, x, kernel.PlanOptions(nsplit=4, fused=False))
    assert not p2.fused and len(p2.launcher.calls) == 2


def test_a_grid_that_cannot_be_resident_merges_in_its_last_block():
    """256 splits x the row blocks x 3 requests: thousands of blocks, more than any GPU holds at
    once. By default (past FUSED_MAX_SPLITS) the plan takes the merge kernel; fused=True merges in
    the last split block of each row block, one plain launch, right against the oracle; "wait"
    (every block resident) is refused by name."""
    from kdkit.kernel import launch
    case = _named("split-counts")
    x = cuda.to_device(case)
    auto = cuda.plan_case(case, x, kernel.PlanOptions(nsplit=256))
    fn = auto.launcher.calls[0][1]
    capacity = launch.resident_blocks(int(fn), auto.threads, auto.smem) * torch.cuda.get_device_properties(0).multi_processor_count
    assert auto.grid[0] * auto.grid[1] * auto.grid[2] > capacity, (auto.grid, capacity)
    assert not auto.fused and len(auto.launcher.calls) == 2
    last = cuda.plan_case(case, x, kernel.PlanOptions(nsplit=256, fused=True))
    assert last.fused == "last" and len(last.launcher.calls) == 1 and not last.launcher.calls[0][-1]
    kernel.run(last, x["q"], x["k"], x["v"], x["kv_buffer"])
    torch.cuda.synchronize()
    v = _judge(case, backends.Result(last.out.clone(), last.lse.clone()))
    assert v.passed, v.reasons
    with pytest.raises(InputError, match=r"field 'fused'.*exceed"):
        cuda.plan_case(case, x, kernel.PlanOptions(nsplit=256, fused="wait"))


@BUILDS
@pytest.mark.parametrize("fused", ["wait", "last", False])
def test_the_merge_mutant_fails_either_way(fused, nt):
    case = _named("mutants")
    assert _judge(case, cuda.run(case, nsplit=3, fused=fused, nt=nt)).passed
    v = _judge(case, cuda.run(case, nsplit=3, fused=fused, nt=nt, mutant="merge-no-rescale"))
    assert not v.passed, f"merge-no-rescale passed with fused={fused}, nt={nt}"


@BUILDS
@pytest.mark.parametrize("way", ["wait", "last"])
def test_counters_only_grow_and_replays_stay_right(way, nt):
    """Eager runs and graph replays on one plan: each run adds nsplit to every live row block's
    counter; nothing resets them, and every output stays right."""
    case = _named("split-counts")
    x = cuda.to_device(case)
    p = cuda.plan_case(case, x, kernel.PlanOptions(nsplit=5, fused=way, nt=nt))
    assert p.fused == way
    counters = p._keep[2]  # (the plan's workspace: o_part, lse_part, counters, ...)
    assert counters.dtype == torch.int64
    run = lambda: kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])  # noqa: E731
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    live = counters[counters > 0]
    assert live.numel() > 0 and bool((live == 3 * 5).all())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    for _ in range(4):
        p.out.zero_()
        g.replay()
        torch.cuda.synchronize()
        v = _judge(case, backends.Result(p.out.clone(), p.lse.clone()))
        assert v.passed, v.reasons
    assert bool((counters[counters > 0] == 7 * 5).all())
