"""scripts/gpu_suite.sh's parts cover every test file once (the kernel's file is split among three
parts by -k), so a GPU host that runs all its parts has run the whole suite; a file renamed out of
a named part still lands in a rest part."""
from __future__ import annotations

import subprocess

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_suite.sh"


def _parts() -> dict:
    out = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, check=True).stdout
    return {name: rest.split() for name, rest in (line.split(":", 1) for line in out.splitlines())}


def test_the_parts_cover_every_test_file_once():
    parts = _parts()
    assert list(parts) == ["deep", "kernel", "byok", "notebooks", "rest-a-l", "rest-m-z", "sweep", "sanitizer"]
    kernel = "tests/test_cuda_kernel.py"
    assert parts["deep"] == parts["kernel"] == parts["sweep"] == [kernel] and parts["sanitizer"] == []
    named = [f for p in ("byok", "notebooks", "rest-a-l", "rest-m-z") for f in parts[p]]
    assert len(named) == len(set(named)), "a file in two parts"
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")}
    assert set(named) | {kernel} == on_disk
    assert all((ROOT / f).is_file() for f in named)


def test_an_unknown_part_is_named_with_the_choices():
    r = subprocess.run(["bash", str(SCRIPT), "kernal"], capture_output=True, text=True)
    assert r.returncode == 2 and "no part 'kernal'" in r.stderr and "rest-a-l" in r.stderr


def test_jobs_must_be_a_count():
    r = subprocess.run(["bash", str(SCRIPT), "deep"], capture_output=True, text=True, env={"JOBS": "many", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "JOBS=many" in r.stderr and "worker processes" in r.stderr
