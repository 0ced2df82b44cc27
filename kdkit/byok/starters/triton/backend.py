"""kdkit_starter: the Triton kernel in kernel.py as a kdkit backend.

Edit kernel.py and run again: kdkit loads it again when its text changes. Without a GPU it runs on
the CPU under Triton's interpreter (slowly: keep the cases small).
    kdkit replay data/captured_tensors/seed-shape.pt --backends kdkit_starter
"""
from pathlib import Path

from kdkit.byok.triton import TritonKernel

# its options (nsplit) are read off launch()'s signature in kernel.py
backend = TritonKernel("kdkit_starter", Path(__file__).with_name("kernel.py"))

# the module is a backend too (`--backends path/to/backend.py`)
NAME, LABEL, LINT_CLEAN = backend.NAME, backend.LABEL, backend.LINT_CLEAN
unavailable, run, prepare = backend.unavailable, backend.run, backend.prepare
# the live pair (KDKIT_MODE=validate/replace, CUDA graphs): plan(batch) once per batch, launch per layer
plan, launch, unsupported = backend.plan, backend.launch, backend.unsupported
