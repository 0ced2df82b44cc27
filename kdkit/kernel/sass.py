"""The SASS of a build, without a GPU: NVIDIA's disassembler (`nvdisasm`, from the
nvidia-cuda-nvdisasm wheel of the compile extra, or a CUDA toolkit's) over the cubin NVRTC made.

What the kernel's performance work reads it for: which registers an instruction reuses (a write
right after a queued LDGSTS waits for the copy to read its operands), where a sanitizer's PC
points, and how many of each instruction a loop holds.
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .jit import BuildError, Module

_FUNC = re.compile(r"^\s*\.text\.(\S+):\s*$")
# "/*0bd0*/   @!P1 LDGSTS.E.BYPASS.128 [R7], ..." -> LDGSTS; predicates and modifiers dropped
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def nvdisasm_path() -> str:
    """The nvdisasm binary: the wheel's (cuda-pathfinder), else $CUDA_HOME's or PATH's."""
    try:
        from cuda import pathfinder
        found = pathfinder.find_nvidia_binary_utility("nvdisasm")
        if found:
            return str(found)
    except Exception:  # an older cuda-bindings without pathfinder, or no wheel: the toolkit's
        pass
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if base and (Path(base) / "bin" / "nvdisasm").is_file():
            return str(Path(base) / "bin" / "nvdisasm")
    found = shutil.which("nvdisasm")
    if found:
        return found
    raise BuildError("nvdisasm not found: `pip install nvidia-cuda-nvdisasm` (kdkit's compile extra), or a "
                     "CUDA toolkit on PATH / in $CUDA_HOME")


def disassemble(module: Module) -> str:
    """The module's SASS as nvdisasm prints it (`-c`: code only, each instruction at its offset,
    the offsets a sanitizer or ncu reports as kernel+0x...)."""
    tool = nvdisasm_path()
    with tempfile.TemporaryDirectory(prefix="kdkit-sass-") as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(module.cubin)
        res = subprocess.run([tool, "-c", str(cubin)], capture_output=True, text=True)
    if res.returncode != 0:
        raise BuildError(f"nvdisasm failed on {module.key} ({module.arch}): {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout


def opcode_counts(sass: str) -> dict[str, collections.Counter]:
    """Per kernel, how many instructions of each opcode its SASS holds (static counts: a loop's
    body is counted once)."""
    kernels: dict[str, collections.Counter] = {}
    cur = None
    for line in sass.splitlines():
        m = _FUNC.match(line)
        if m:
            cur = kernels.setdefault(m.group(1), collections.Counter())
            continue
        m = _INSTR.match(line)
        if m and cur is not None:
            cur[m.group(2)] += 1
    return kernels


# the opcodes a line of `kdkit compile --sass` names, in this order: the step's tensor work, its
# shared-memory operand loads, its copies, its barriers
SUMMARY_OPS = ("HMMA", "LDSM", "LDGSTS", "BAR", "LDS", "STS")


def summary(counts: collections.Counter) -> str:
    total = sum(counts.values())
    return f"{total} instructions: " + ", ".join(f"{op} {counts.get(op, 0)}" for op in SUMMARY_OPS)
