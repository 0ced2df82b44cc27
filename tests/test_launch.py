"""kdkit.kernel.launch on a GPU: the launches go through libcuda's own cuLaunchKernel (the cheap
path run() is timed on), and a launch the driver refuses is a LaunchError that names the entry
point and the driver's error, with the context left usable."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kdkit import kernel
from kdkit.backends.cuda import plan_case, to_device
from kdkit.case import load
from kdkit.kernel import launch, spec
from kdkit.kernel.options import PlanOptions

SEED = Path(__file__).resolve().parents[1] / "data" / "captured_tensors" / "seed-shape.pt"


@pytest.mark.gpu
def test_launches_go_through_libcuda():
    assert launch._driver() is not None, "libcuda did not load through ctypes: run() fell back to cuda-bindings"


@pytest.mark.gpu
def test_a_refused_launch_names_the_entry_point_and_the_error():
    case = load(SEED)
    x = to_device(case)
    p = plan_case(case, x, PlanOptions(nsplit=4))
    out, _ = kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])
    torch.cuda.synchronize()
    good = out.clone()
    name, _, grid, block, smem = p.launcher.calls[0]
    assert name == spec.PARTIAL
    fn = launch.function_handle(p._keep[3].get_function(spec.PARTIAL))
    bad = launch.Launcher([(name, fn, grid, (2048, 1, 1), smem)], p.args.address)  # > 1024 threads a block
    with pytest.raises(launch.LaunchError, match=rf"{spec.PARTIAL}.*CUDA_ERROR_INVALID_VALUE"):
        bad(launch.current_raw_stream(p.device_index))
    # a refused launch is not a fault: the same plan still runs, and gives the same bits
    out, _ = kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])
    torch.cuda.synchronize()
    assert torch.equal(out, good)
