"""The plugin on SGLang's real code path on a GPU: SGLang's Triton kernel compiled, bf16, kdkit's
CUDA kernel for validate and replace, replace inside a real torch.cuda.graph capture and replay.

Run on the GPU host (no internet; scripts/gpu_wheels.sh brings SGLang and its pure-Python
dependencies along), from the repository root:
    KDKIT_SGLANG_ENV=1 python3 -m pytest tests/sglang_env -m gpu -q
"""
from __future__ import annotations

import re

import pytest
import torch

from .test_plugin_cpu import NEWEST, ROOT, _all_equal, _seed_rels, run

pytestmark = pytest.mark.gpu

# kdkit's kernel against SGLang's Triton kernel, both bf16 on the same inputs: each rounds P and the
# output to bf16, so they differ by a few bf16 roundings (rel ~0.3-0.5% measured on the bundled
# cases); 2% is the plugin's own default threshold (KDKIT_REL_THRESHOLD) and far below a real bug.
REL = 0.02


def test_gpu_capture_replays_bitwise_on_the_same_device(tmp_path):
    from kdkit import case as case_mod
    from kdkit.backends import triton_sglang
    res, lines, _ = run({"steps": [{"layout": "eager"}, {"layout": "graph"}]}, KDKIT_MODE="capture",
                        KDKIT_DIR=tmp_path)
    _all_equal(res)
    # the snapshot adds no host sync: only device work and copies into pinned memory (torch's sync
    # debug mode counts the syncs of the hooked call and of the unhooked one)
    for c in res["calls"]:
        # (the unhooked call runs first and may pay the first Triton launch's own syncs: the hooked
        # call may have fewer, never more)
        assert c["syncs"][0] <= c["syncs"][1], (c["step"], c["layer"], c["syncs"], c.get("sync_what"))
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["model-L0-r0-s0.pt", "model-L0-r0-s1.pt", "model-L1-r0-s0.pt",
                                       "model-L1-r0-s1.pt"]
    for f in files:
        c = case_mod.load(f)
        assert c.q.dtype == torch.bfloat16 and c.meta["gpu"] == torch.cuda.get_device_name()
        out = triton_sglang.run(c)
        assert out.info["sglang_release"] == NEWEST
        assert torch.equal(out.out.cpu(), c.ref_out), f"{f.name}: Triton on the same GPU is not bitwise"


def test_gpu_validate_with_kdkits_kernel(tmp_path):
    steps = [{"layout": "eager"}, {"layout": "graph"}, {"layout": "eager", "inject": "cuda-raise"},
             {"layout": "graph", "inject": "cuda-perturb"}]
    res, lines, _ = run({"steps": steps}, KDKIT_MODE="validate", KDKIT_DIR=tmp_path)
    _all_equal(res)
    seed = [ln for ln in lines if re.fullmatch(r"\[kdkit\] L[01] r0 s\d max_abs_diff=\S+ mean=\S+ rel=\S+", ln)]
    rels = {tuple(ln.split()[1:4]): float(ln.rsplit("rel=", 1)[1]) for ln in seed}
    assert all(rels[(f"L{l}", "r0", f"s{s}")] < REL for l in (0, 1) for s in (0, 1)), rels
    assert all(rels[(f"L{l}", "r0", "s3")] > 0.4 for l in (0, 1)), rels
    assert res["faults"] == {"validate:RuntimeError": 2}
    assert sum("injected fault" in ln for ln in lines) == 1
    # the kernel's fault (s2) and its wrong output (s3) are written, to be replayed offline
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-L0-r0-s2.pt", "model-L0-r0-s3.pt",
                                                          "model-L1-r0-s2.pt", "model-L1-r0-s3.pt"]


def test_gpu_replace_inside_a_cuda_graph_matches_the_run_without_the_plugin():
    res, lines, _ = run({"graph_replay": True, "refills": [[[6, 2], 5], [[13, 0], 6]]}, KDKIT_MODE="replace")
    assert res["faults"] == {}, (res["faults"], lines)
    assert len(res["rows"]) == 6 and res["plans_kept"] >= 1
    for r in res["rows"]:
        assert r["rel"] < REL, r                       # kdkit's kernel within tolerance of Triton
        assert r["graph_equals_eager"], r              # the replayed graph = kdkit's kernel run eagerly
        assert r["differs_from_triton"], r             # it really was kdkit's kernel that served


# the CUDA starter `kdkit new-kernel --lang cuda` writes, named by file spec: its live pair is the
# adapter's plan(batch) / launch(...) (kdkit.byok.cuda). Its error against SGLang's Triton is of
# the same kind as kdkit's kernel's (fp32 math on bf16 inputs, a bf16 output; Triton rounds P to
# bf16 too): REL.
CUDA_STARTER = ROOT / "kdkit" / "byok" / "starters" / "cuda" / "backend.py"


def test_gpu_validate_with_the_cuda_starter_writes_nothing(tmp_path):
    res, lines, _ = run({"steps": [{"layout": "eager"}, {"layout": "graph"}]}, KDKIT_MODE="validate",
                        KDKIT_KERNEL=CUDA_STARTER, KDKIT_DIR=tmp_path)
    _all_equal(res)
    assert res["faults"] == {}, (res["faults"], lines)
    rels = _seed_rels(lines)
    assert len(rels) == 4 and max(rels) < REL, lines
    assert list(tmp_path.iterdir()) == []


def test_gpu_replace_with_the_cuda_starter_inside_a_cuda_graph():
    """The starter's live pair captured in SGLang's capture mode inside a real torch.cuda.graph,
    replayed on the captured batch and on refilled ones (new q/k, shorter prefixes, same buffers):
    each replay within REL of Triton, bitwise the starter run eagerly through the plugin."""
    res, lines, _ = run({"graph_replay": True, "refills": [[[6, 2], 5], [[13, 0], 6]]}, KDKIT_MODE="replace",
                        KDKIT_KERNEL=CUDA_STARTER)
    assert res["faults"] == {}, (res["faults"], lines)
    assert len(res["rows"]) == 6 and res["plans_kept"] >= 1
    for r in res["rows"]:
        assert r["rel"] < REL, r
        assert r["graph_equals_eager"], r
        assert r["differs_from_triton"], r
