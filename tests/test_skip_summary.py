"""conftest.py's pytest_terminal_summary: the skips that are not for want of a GPU are listed in one
block at the end of a plain `pytest -q` (make test), where a missing browser or SGLang environment
used to drown among the GPU skips. Checked on a tiny test file run in a pytest of its own."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import NO_GPU, ROOT, _no_gpu_reason

TINY = f'''
import pytest

def test_runs():
    pass

@pytest.mark.gpu
def test_on_a_gpu():
    pass

def test_skipped_for_want_of_a_gpu():
    pytest.skip("{NO_GPU}: torch sees no device")

def test_the_kernel_unavailable():   # what kdkit.kernel.unavailable() says on a CPU machine
    pytest.skip("cuda: no CUDA GPU: this torch (2.13.0+cpu) is a CPU-only build")

@pytest.mark.parametrize("n", [1, 2])
def test_in_a_browser(n):
    pytest.skip("no browser: chromium is not installed (apt-get install chromium)")

def test_on_sglang():
    pytest.skip("no SGLang env: KDKIT_SGLANG_ENV is not set")
'''


def run_pytest(tmp_path, source: str) -> str:
    (tmp_path / "test_tiny.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), str(ROOT),
                                                                      os.environ.get("PYTHONPATH")]))}
    # -p conftest: this suite's conftest.py as a plugin (the tiny file lies outside tests/)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                        "test_tiny.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_other_skips_are_listed_with_their_reasons(tmp_path):
    out = run_pytest(tmp_path, TINY)
    head, sep, block = out.partition("kdkit: 3 skipped for another reason than no GPU")
    assert sep, out
    lines = [ln.strip() for ln in block.splitlines()[1:3]]
    assert lines == ["2 x no browser: chromium is not installed (apt-get install chromium)",
                     "1 x no SGLang env: KDKIT_SGLANG_ENV is not set"], out
    assert "CUDA GPU" not in block.split("passed")[0]                       # the GPU skips stay out of it


def test_gpu_skips_alone_print_one_line_and_no_block(tmp_path):
    out = run_pytest(tmp_path, TINY.split("@pytest.mark.parametrize")[0])
    kdkit = [ln for ln in out.splitlines() if ln.startswith("kdkit:")]
    # (on a GPU machine test_on_a_gpu runs: two skips are for want of one, both made by hand here)
    n = 3 if _no_gpu_reason() else 2
    assert kdkit == [f"kdkit: {n} skipped for want of a CUDA GPU (they run on a GPU machine)"], out
