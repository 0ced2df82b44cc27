"""`kdkit compile --sass`: each build's SASS from nvdisasm, without a GPU, and its instruction counts."""
from __future__ import annotations

import importlib.util

import pytest

from kdkit import cli
from kdkit.kernel import jit, sass

needs_nvrtc = pytest.mark.skipif(
    importlib.util.find_spec("cuda.bindings") is None,
    reason="needs NVRTC: pip install cuda-bindings nvidia-cuda-nvrtc nvidia-cuda-runtime (kdkit[compile])")


def _have_nvdisasm() -> bool:
    try:
        sass.nvdisasm_path()
        return True
    except jit.BuildError:
        return False


needs_nvdisasm = pytest.mark.skipif(not _have_nvdisasm(), reason="needs nvdisasm: pip install nvidia-cuda-nvdisasm "
                                    "(kdkit[compile])")


def run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_opcode_counts_per_kernel_without_predicates_or_modifiers():
    text = """
	.text.kd_a:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/              @!P1 LDGSTS.E.BYPASS.128 [R9], desc[UR6][R4.64], P4 ;
        /*0020*/               @P0 BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0030*/                   HMMA.16816.F32.BF16 R140, R128.reuse, R40, RZ ;
.L_x_1:
        /*0040*/              @!UP0 HMMA.16816.F32.BF16 R136, R128, R44, RZ ;
	.text.kd_b:
        /*0000*/                   EXIT ;
"""
    counts = sass.opcode_counts(text)
    assert counts["kd_a"] == {"MOV": 1, "LDGSTS": 1, "BAR": 1, "HMMA": 2}
    assert counts["kd_b"] == {"EXIT": 1}
    assert sass.summary(counts["kd_a"]).startswith("5 instructions: HMMA 2, LDSM 0, LDGSTS 1, BAR 1")


@needs_nvrtc
@needs_nvdisasm
def test_compile_writes_the_sass_of_each_build(capsys, tmp_path):
    """The 40-row builds for sm_120 (plain and step skip, each with the merge kernel and with the fused
    merge): one .sass file each, named by the build's
    key, and the partial kernel's MMAs counted from it: QK's 9 k-steps x 5 n-tiles and PV's 2
    k-steps x 4 m-tiles x 5 n-tiles, each once (the step is unrolled whole, no MMA in a loop of
    its own)."""
    rc, out, err = run(capsys, "compile", "--arch", "sm_120", "--rows", "40", "--sass", tmp_path / "sass")
    assert rc == 0, err
    files = sorted((tmp_path / "sass").glob("*.sass"))
    base = "mla_tc-nt5-qoi32-kvpi32-kvii32-mipi64-pfxi64"
    assert {f.name.split("-sm_120-")[0] for f in files} == {
        base, f"{base}-skip1", f"{base}-fused1", f"{base}-skip1-fused1"}
    for f in files:
        counts = sass.opcode_counts(f.read_text())
        assert counts["kd_mla_tc_partial"]["HMMA"] == 9 * 5 + 2 * 4 * 5
        assert counts["kd_mla_tc_merge"]["HMMA"] == 0
        assert f"SASS in {f}" in out
    assert out.count("SASS kd_mla_tc_partial: ") == 4
    # again: the same keys, the same files, left as they are
    before = {f: f.stat().st_mtime_ns for f in files}
    rc, _, err = run(capsys, "compile", "--arch", "sm_120", "--rows", "40", "--sass", tmp_path / "sass")
    assert rc == 0, err
    assert {f: f.stat().st_mtime_ns for f in files} == before


@needs_nvrtc
def test_compile_sass_without_nvdisasm_exits_1_with_the_fix(capsys, tmp_path, monkeypatch):
    def missing():
        raise jit.BuildError("nvdisasm not found: `pip install nvidia-cuda-nvdisasm` (kdkit's compile extra)")
    monkeypatch.setattr(sass, "nvdisasm_path", missing)
    rc, out, err = run(capsys, "compile", "--arch", "sm_120", "--rows", "8", "--sass", tmp_path)
    assert rc == 1 and out == ""
    assert err.strip() == "kdkit: --sass: nvdisasm not found: `pip install nvidia-cuda-nvdisasm` (kdkit's compile extra)"


@needs_nvrtc
@needs_nvdisasm
def test_compile_sass_into_a_file_exits_2(capsys, tmp_path):
    f = tmp_path / "afile"
    f.write_text("mine")
    rc, out, err = run(capsys, "compile", "--arch", "sm_120", "--rows", "8", "--sass", f)
    assert rc == 2 and "not a folder" in err and f.read_text() == "mine"


@needs_nvrtc
@needs_nvdisasm
def test_compile_sass_folder_that_cannot_be_made_exits_2_before_any_build(capsys, tmp_path):
    """A folder under a file cannot be made: one line naming --sass, and no build's table first."""
    f = tmp_path / "afile"
    f.write_text("mine")
    rc, out, err = run(capsys, "compile", "--arch", "sm_120", "--rows", "8", "--sass", f / "sub")
    assert rc == 2 and "--sass" in err and "cannot make the folder" in err
    assert "kd_mla_tc_partial" not in out and f.read_text() == "mine"


def test_nvdisasm_missing_everywhere_names_the_wheel(monkeypatch):
    try:
        from cuda import pathfinder
        monkeypatch.setattr(pathfinder, "find_nvidia_binary_utility", lambda name: None)
    except ImportError:
        pass  # (no cuda-pathfinder: the toolkit and PATH are all nvdisasm_path looks at)
    monkeypatch.setattr(sass.shutil, "which", lambda name: None)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    with pytest.raises(jit.BuildError, match="pip install nvidia-cuda-nvdisasm"):
        sass.nvdisasm_path()
