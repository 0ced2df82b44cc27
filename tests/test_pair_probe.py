"""kdkit.perf.probes.pair_step, the warp-pair probe (query rows on the MMA's M dimension, the head
dims split over a pair of warps): its sm_120 build fits (no GPU needed), and on a GPU its split
partials match the float64 reference."""
from __future__ import annotations

import importlib.util

import pytest

from kdkit.perf.probes import pair_step as ps
from kdkit.perf.probes import ws_step as ws

needs_nvrtc = pytest.mark.skipif(
    importlib.util.find_spec("cuda.bindings") is None,
    reason="needs NVRTC: pip install cuda-bindings nvidia-cuda-nvrtc nvidia-cuda-runtime (kdkit[compile])")


@needs_nvrtc
def test_probe_fits_sm120():
    """The probe is measured on sm_90 as a design for sm_120: <= 99 KB of shared memory, no
    spills, no instruction sm_120 lacks."""
    mod = ps.build("sm_120")
    res = mod.kernels["pair_partial"]
    assert mod.meta()["smem_bytes"] <= 99 * 1024
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.registers <= 255
    assert mod.forbidden_instructions() == []
    assert mod.meta()["rows"] == ps.ROWS  # the harness sizes its grid by the build's rows


@pytest.mark.gpu
def test_probe_partials_match_the_reference():
    import torch
    results = ws.check(ps.Probe(torch.device("cuda")), torch.device("cuda"))
    assert results and all(r["ok"] for r in results), results
