"""The bring-your-own-kernel commands as a user meets them: `kdkit new-kernel` and `kdkit export`
(exit codes, one-line refusals, nothing of the user's overwritten)."""
from __future__ import annotations

import json
import re

import pytest

from conftest import BUNDLED, DATA
from kdkit.byok import starter
from kdkit.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_new_kernel_writes_a_package_and_never_overwrites(tmp_path, capsys):
    dest = tmp_path / "mine"
    rc, out, _ = run(capsys, "new-kernel", dest, "--lang", "triton", "--name", "kd_mine_cli")
    assert rc == 0 and "pip install -e" in out
    kernel = dest / "kd_mine_cli" / "kernel.py"
    assert kernel.is_file() and (dest / "pyproject.toml").is_file()
    assert '"kdkit.backends"' in (dest / "pyproject.toml").read_text()
    kernel.write_text("# my edits\n")
    rc, _, err = run(capsys, "new-kernel", dest, "--lang", "triton", "--name", "kd_mine_cli")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "not empty" in err
    assert kernel.read_text() == "# my edits\n"


def test_new_kernel_refuses_a_bad_name_in_one_line(tmp_path, capsys):
    rc, _, err = run(capsys, "new-kernel", tmp_path / "x", "--lang", "cuda", "--name", "2bad")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--name" in err
    assert not (tmp_path / "x").exists()


def test_export_writes_a_trace_folder_and_refuses_a_mis_marshaled_case(tmp_path, capsys):
    out = tmp_path / "trace"
    rc, text, _ = run(capsys, "export", "--flashinfer-trace", out, DATA / "seed-shape.pt")
    assert rc == 0 and "1 case(s)" in text
    (defn,) = (out / "definitions").rglob("*.json")
    assert json.loads(defn.read_text())["name"] == defn.stem
    rc, _, err = run(capsys, "export", "--flashinfer-trace", tmp_path / "t2", DATA / "failures")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "mis-marshaled" in err
    assert not (tmp_path / "t2").exists()


def _nvrtc_or_skip():
    from kdkit.kernel import builds
    if builds.supported_archs()["nvrtc"] is None:
        pytest.skip("NVRTC is not installed (kdkit's 'compile' extra)")


def test_compile_reports_a_users_cuda_kernel_and_its_compiler_errors(tmp_path, capsys):
    """`kdkit compile --backend SPEC`: the CUDA starter built for sm_120 without a GPU, its
    resources within the limits (exit 0); a syntax error is the compiler's own line pointing at the
    user's file and line (exit 2)."""
    _nvrtc_or_skip()
    assert run(capsys, "new-kernel", tmp_path / "k", "--lang", "cuda", "--name", "kd_cli_cu")[0] == 0
    spec = tmp_path / "k" / "kd_cli_cu" / "backend.py"
    rc, out, err = run(capsys, "compile", "--backend", spec, "--arch", "sm_120")
    assert rc == 0, err
    assert "kd_cli_cu, sm_120:" in out and "kd_cli_cu_partial" in out and "kd_cli_cu_merge" in out
    cu = tmp_path / "k" / "kd_cli_cu" / "kernel.cu"
    lines = cu.read_text().splitlines()
    lines.insert(3, "this is not CUDA;")
    cu.write_text("\n".join(lines) + "\n")
    rc, out, err = run(capsys, "compile", "--backend", spec, "--arch", "sm_120")
    assert rc == 2 and f"{cu}(4): error" in err.splitlines()[0], err


# ---- the Triton starter through `kdkit replay`, named by file spec --------------------------------
# (by its entry-point name after `pip install -e`: tests/test_byok_triton.py; on a CPU the starter
# runs under Triton's interpreter, ~1-4 s a case)
MASK_LINE = "        seen = seen & visible\n"   # the starter's one line that applies the tree (or causal) mask


def _rows(table: str, backend: str, status: str) -> int:
    """How many rows of replay's tables give `backend` this status."""
    return len(re.findall(rf"^{backend}\s+{status}\s", table, re.M))


@pytest.fixture
def forget():
    """Specs registered by a test are forgotten after it (the registry is per process)."""
    names: list = []
    yield names
    from kdkit.backends import registry
    for n in names:
        registry.unregister(n)


def test_replay_passes_the_triton_starter_by_file_spec_on_every_bundled_case(capsys, forget):
    spec = starter.TEMPLATES / "triton" / "backend.py"
    forget.append("kdkit_starter")
    rc, out, err = run(capsys, "replay", *(DATA / f"{n}.pt" for n in BUNDLED), "--backends", spec)
    assert rc == 0, out[-3000:] + err[-2000:]
    assert _rows(out, "kdkit_starter", "pass") == len(BUNDLED), out[-3000:]


def test_replay_fails_the_triton_starter_without_its_mask(tmp_path, capsys, forget):
    """The same starter with its mask line removed (written by new-kernel, then edited) exits 1
    on the bundled cases, every one of which has a tree."""
    pkg = starter.write(tmp_path / "kd_maskless", "triton", "kd_maskless")
    kernel = pkg / "kernel.py"
    text = kernel.read_text()
    assert text.count(MASK_LINE) == 1, "the starter's mask line moved: update MASK_LINE"
    kernel.write_text(text.replace(MASK_LINE, ""))
    forget.append("kd_maskless")
    rc, out, err = run(capsys, "replay", *(DATA / f"{n}.pt" for n in BUNDLED), "--backends", pkg / "backend.py")
    assert rc == 1, out[-3000:] + err[-2000:]
    assert _rows(out, "kd_maskless", "fail") == len(BUNDLED), out[-3000:]
