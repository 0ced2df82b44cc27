"""Issue 7's "nothing written twice" for the numbers that tie the CPU side to the kernel: the split
span has one Python formula (which the .cu's own copy must match), the model's dims and the SM
count the CPU side models are integer literals only where they are defined."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kdkit.judge import heavy_cases
from kdkit.backends import torch_ref
from kdkit.kernel import jit, schedule

KDKIT = Path(__file__).resolve().parents[1] / "kdkit"


@pytest.mark.parametrize("kv_len, nsplit, span", [(100, 3, 64), (309, 3, 128), (30, 1, 32), (32, 2, 32),
                                                  (5000, 7, 736), (1, 256, 32)])
def test_split_span_is_one_formula(kv_len, nsplit, span):
    """kv_len cut into nsplit spans, each rounded up to whole 32-row tiles; the torch reference's
    splits and the probes' boundaries are cut by it."""
    assert schedule.split_span(kv_len, nsplit) == span
    bounds = torch_ref.split_bounds(kv_len, nsplit)
    assert [b for b, _ in bounds] == list(range(0, kv_len, span)) and bounds[-1][1] == kv_len
    assert heavy_cases.split_boundaries(kv_len, [nsplit]) == list(range(span, kv_len, span))


def test_the_kernels_copy_of_the_split_span_is_the_same():
    """The .cu keeps its own C++ copy (schedule.split_span's docstring says so): it must read the same."""
    src = (jit.CUDA_DIR / "mla_tc.cu").read_text()
    assert re.search(r"span\s*=\s*kd::cdiv\(\s*kd::cdiv\(\s*kv_len\s*,\s*p\.nsplit\s*\)\s*,\s*KD_BN\s*\)"
                     r"\s*\*\s*KD_BN\s*;", src), "mla_tc.cu's split span no longer reads as schedule.split_span"
    assert re.search(r"#define\s+KD_BN\s+32\b", src) and schedule.BLOCK_N == 32


# the only places these integers may be written in kdkit's Python: where they are defined
DEFINED_AT = {
    512: {("constants.py", "KV_LORA_RANK ="),            # the latent dims
          ("kernel/schedule.py", "WORKSPACE_LIMIT ="),   # 512 MiB, a byte count
          ("kernel/jit.py", "CACHE_MB_DEFAULT =")},      # the JIT cache's bound, in MB
    576: set(),                                           # constants.QK_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM
    132: {("kernel/schedule.py", "H200_SM_COUNT =")},     # the SM count the probes and torch_ref model
}


def test_dims_and_sm_count_are_written_once():
    stray = []
    for path in sorted(KDKIT.rglob("*.py")):
        rel = path.relative_to(KDKIT).as_posix()
        if rel.startswith("byok/starters/"):
            continue  # templates `kdkit new-kernel` copies into a user's package: their own code, self-contained
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value in DEFINED_AT:
                line = lines[node.lineno - 1].strip()
                if not any(rel == f and line.startswith(start) for f, start in DEFINED_AT[node.value]):
                    stray.append(f"kdkit/{rel}:{node.lineno}: {line}")
    assert not stray, "import these from kdkit.constants / kdkit.kernel.schedule instead:\n" + "\n".join(stray)
    assert torch_ref.default_nsplit.__defaults__ == (schedule.H200_SM_COUNT,)
