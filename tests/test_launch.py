"""kdkit.kernel.launch on a GPU: a launch the driver refuses is a LaunchError that names the entry
point and the driver's error, and the context stays usable (a refusal is not a fault)."""
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
def test_a_refused_launch_names_the_entry_point_and_the_error():
    case = load(SEED)
    x = to_device(case)
    p = plan_case(case, x, PlanOptions(nsplit=4))
    out, _ = kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])
    torch.cuda.synchronize()
    good = out.clone()
    name, fn, gx, gy, gz, bx, by, bz, smem, kp, coop = p.launcher.calls[0]
    assert name == spec.PARTIAL
    bad = launch.Launcher([(name, int(fn), (gx, gy, gz), (2048, 1, 1), smem, kp, coop)],  # > 1024 threads
                          keep=p.launcher._keep)
    with pytest.raises(launch.LaunchError, match=rf"{spec.PARTIAL}.*CUDA_ERROR_INVALID_VALUE"):
        bad(launch.current_raw_stream(p.device_index))
    # the same plan still runs, and gives the same bits
    out, _ = kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])
    torch.cuda.synchronize()
    assert torch.equal(out, good)

