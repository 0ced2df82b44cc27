"""kdkit.perf.probes.ws_step, the warp-specialized step probe: its sm_120 build fits (no GPU
needed), and on a GPU its split partials match the float64 reference."""
from __future__ import annotations

import importlib.util

import pytest

from kdkit.perf.probes import ws_step as ws

needs_nvrtc = pytest.mark.skipif(
    importlib.util.find_spec("cuda.bindings") is None,
    reason="needs NVRTC: pip install cuda-bindings nvidia-cuda-nvrtc nvidia-cuda-runtime (kdkit[compile])")


@needs_nvrtc
@pytest.mark.parametrize("defines", [{}, {"WS_OCOPY": 1}, {"WS_PF": 4}])
def test_probe_fits_sm120(defines):
    """The probe is measured on sm_90 as a design for sm_120: <= 99 KB of shared memory, no
    spills, no instruction sm_120 lacks."""
    mod = ws.build("sm_120", defines)
    res = mod.kernels["ws_partial"]
    assert mod.meta()["smem_bytes"] <= 99 * 1024
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.registers <= 255
    assert mod.forbidden_instructions() == []


@needs_nvrtc
def test_the_six_slot_ring_is_past_sm120s_limit():
    """The 6-slot ring builds for sm_90 only as an experiment (more bytes in flight): its shared
    memory is past sm_120's 99 KB, which the probe's static_assert allows only past 4 slots."""
    mod = ws.build("sm_90", {"WS_STAGES": 6})
    assert mod.meta()["smem_bytes"] > 99 * 1024


@pytest.mark.gpu
def test_probe_partials_match_the_reference():
    import torch
    results = ws.check(ws.Probe(torch.device("cuda")), torch.device("cuda"))
    assert results and all(r["ok"] for r in results), results
