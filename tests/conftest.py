"""Shared fixtures: the bundled cases, a hostile case file, and the `gpu` marker."""
from __future__ import annotations

import os

# One thread for OpenBLAS (the float64 oracle's matmuls) and one for torch: on CI's 2 cores the two
# thread pools spin against each other and small ops (most of the suite) run 5-20x slower.
# Set before numpy is imported; KDKIT_TEST_THREADS overrides torch's count.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import pickle
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# KDKIT_TEST_DATA points the tests at another build of the bundle (python -m kdkit.bundled --out DIR)
DATA = Path(os.environ.get("KDKIT_TEST_DATA") or ROOT / "data" / "captured_tensors")
BUNDLED = ("seed-shape", "ragged-bs4", "ddtree-b64", "long-prefix-8k")
# known-failure cases: name -> the field its marshaling bug is in
FAILURES = {"mask-indptr-sliced": "mask_indptr", "prefix-only-kv-indices": "kv_indices"}


def pytest_configure(config):
    torch.set_num_threads(int(os.environ.get("KDKIT_TEST_THREADS", "1")))
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA GPU (skipped, with the reason, where torch.cuda is unavailable)")


NO_GPU = "needs a CUDA GPU"   # how the gpu marker's skips begin (_no_gpu_reason)
# what a skip for want of a GPU says: the gpu marker's, and kdkit.kernel.unavailable()'s
# ("cuda: no CUDA GPU: ...", the 250 CUDA kernel tests); any other reason is worth seeing
GPU_ABSENT = (NO_GPU, "no CUDA GPU")


def _no_gpu_reason() -> str | None:
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return f"{NO_GPU}: this torch ({torch.__version__}) is a CPU-only build"
    return f"{NO_GPU}: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no device"


def _skip_reason(report) -> str:
    lr = report.longrepr
    text = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
    return text.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One short block of the skips that are not for want of a GPU: `make test` runs pytest -q
    without -rs, and a missing browser or SGLang environment drowned among the GPU skips."""
    other: dict[str, int] = {}
    no_gpu = 0
    for rep in terminalreporter.stats.get("skipped", []):
        reason = _skip_reason(rep)
        if any(m in reason for m in GPU_ABSENT):
            no_gpu += 1
        else:
            other[reason] = other.get(reason, 0) + 1
    if no_gpu:  # one line: the count pytest prints says "skipped" without the reason
        terminalreporter.write_line(f"kdkit: {no_gpu} skipped for want of a CUDA GPU (they run on a GPU machine)")
    if not other:
        return
    terminalreporter.write_sep("-", f"kdkit: {sum(other.values())} skipped for another reason than no GPU")
    for reason, n in sorted(other.items(), key=lambda kv: (-kv[1], kv[0])):
        terminalreporter.write_line(f"{n:4d} x {reason}")


def pytest_collection_modifyitems(config, items):
    why = _no_gpu_reason()
    if why is None:
        return
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def bundled_path(name: str) -> Path:
    """A bundled case file; fails (not skips) when it is missing: the repo ships them."""
    path = DATA / f"{name}.pt" if name not in FAILURES else DATA / "failures" / f"{name}.pt"
    if not path.is_file():
        pytest.fail(f"{path} is missing: `make bundled` (python -m kdkit.bundled) writes it")
    return path


@pytest.fixture
def seed_case_path() -> Path:
    return bundled_path("seed-shape")


@pytest.fixture(params=BUNDLED)
def bundled_case_path(request) -> Path:
    return bundled_path(request.param)


@pytest.fixture(params=sorted(FAILURES))
def failure_case(request) -> tuple[Path, str]:
    """(path, the field its bug is in)."""
    return bundled_path(request.param), FAILURES[request.param]


class _WritesMarker:
    """Unpickling this calls open(marker, "w"): it creates a file, proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def write_hostile(path: Path, marker: Path, as_torch: bool = True) -> Path:
    """A file that looks like a case but runs code when loaded with a plain (unsafe) unpickler."""
    rec = {"format": "kdkit-case", "schema_version": 1, "meta": {"source": "captured"},
           "params": {}, "tensors": {"q": torch.zeros(1)}, "payload": _WritesMarker(marker)}
    if as_torch:
        torch.save(rec, path)
    else:
        with open(path, "wb") as fh:
            pickle.dump(rec, fh)
    return path


@pytest.fixture
def hostile_case(tmp_path) -> tuple[Path, Path]:
    """(hostile file, marker path that exists only if the payload ran)."""
    marker = tmp_path / "PAYLOAD_RAN"
    return write_hostile(tmp_path / "hostile.pt", marker), marker


@pytest.fixture(autouse=True)
def _registry_per_test():
    """Backends a test registers (a spec it named, register(), an installed entry point it found)
    are forgotten after it: the registry is per process, and a later test that loops over every
    backend (test_backends) must not meet another test's kernel (one left broken on purpose)."""
    from kdkit.backends import registry
    before = set(registry.BACKENDS)
    yield
    for name in set(registry.BACKENDS) - before:
        registry.unregister(name)
