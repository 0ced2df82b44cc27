"""Compile-only checks (no GPU): the kernel fits sm_120 and builds for the other archs; the JIT
cache sees edited headers; compiler errors name the real file and line."""
from __future__ import annotations

import shutil

import pytest

from kdkit import jit, verify_kernel as vk

pytestmark = pytest.mark.skipif(
    __import__("importlib").util.find_spec("cuda.bindings") is None,
    reason="needs NVRTC: pip install cuda-bindings nvidia-cuda-nvrtc nvidia-cuda-runtime (kdkit[compile])")


@pytest.mark.parametrize("arch", ["sm_120", "sm_90"])
def test_fits_sm120_limits(arch):
    rep = vk.compile_report(arch)
    assert set(vk.KERNELS) <= set(rep.kernels)
    assert rep.breaches() == [], rep.table()
    partial = rep.kernels["kd_mla_verify_partial"]
    assert partial.smem_static + rep.dynamic_smem <= 99 * 1024
    assert partial.registers > 0  # ptxas' report was parsed, not defaulted


@pytest.mark.parametrize("arch", ["sm_89", "sm_100"])
def test_builds_for_other_archs(arch):
    assert vk.compile_report(arch).breaches() == []


@pytest.mark.parametrize("variant", sorted(set(vk.VARIANTS) - {"correct"}))
def test_negative_control_builds(variant):
    mod = vk.build(vk.KernelConfig(variant=variant), "sm_120")
    assert f"-v{vk.VARIANTS[variant]}-" in mod.key


def test_breach_is_reported():
    """A config over sm_120's shared memory must fail to build (static_assert) and be named."""
    with pytest.raises(jit.BuildError, match="99 KB"):
        vk.build(vk.KernelConfig(rows=64), "sm_120")


def test_module_key_is_readable():
    key = vk.build(vk.KernelConfig(), "sm_120").key
    assert key.startswith("mla_verify-rows16-bn32-v0-qoi32-kvpi32-kvii32-mipi64-pfxi64-sm_120-")


def test_edited_header_is_never_served_stale(tmp_path, monkeypatch):
    monkeypatch.setenv("KDKIT_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "cuda"
    shutil.copytree(jit.CUDA_DIR, src)
    a = jit.build(src / vk.SOURCE, vk.KernelConfig().defines(), "sm_90")
    b = jit.build(src / vk.SOURCE, vk.KernelConfig().defines(), "sm_90")
    assert a.key == b.key  # cached
    hdr = src / "mla_verify_common.cuh"
    hdr.write_text(hdr.read_text() + "\n// an edit\n")
    c = jit.build(src / vk.SOURCE, vk.KernelConfig().defines(), "sm_90")
    assert c.key != a.key


def test_errors_name_the_real_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setenv("KDKIT_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "cuda"
    shutil.copytree(jit.CUDA_DIR, src)
    hdr = src / "mla_verify_common.cuh"
    lines = hdr.read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("namespace kd {")) + 1
    lines.insert(at, "this_is_not_cuda;")
    hdr.write_text("\n".join(lines) + "\n")
    with pytest.raises(jit.BuildError) as e:
        jit.build(src / vk.SOURCE, vk.KernelConfig().defines(), "sm_90")
    assert f"{hdr}({at + 1})" in str(e.value)


def test_ptxas_parser():
    log = """ptxas info    : Compiling entry function 'kfn' for 'sm_120'
ptxas info    : Function properties for kfn
ptxas         .     24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem, 16 bytes lmem"""
    k = jit.parse_ptxas(log)["kfn"]
    assert (k.registers, k.smem_static, k.stack, k.spill_stores, k.spill_loads, k.local) == (255, 4096, 24, 8, 12, 16)


def test_cli_compile(capsys):
    from kdkit.cli import main
    assert main(["compile", "--arch", "sm_120,sm_90"]) == 0
    out = capsys.readouterr().out
    assert "kd_mla_verify_partial" in out and "fits sm_120 limits: yes" in out and "sm_90" in out
    assert main(["compile", "--arch", "sm_120", "--rows", "64"]) == 1  # 99 KB breach: static_assert
    assert "99 KB" in capsys.readouterr().err
    assert main(["compile", "--arch", "gfx90a"]) == 2


def test_include_with_trailing_comment_is_inlined(tmp_path, monkeypatch):
    """`#include "x.cuh" // why` must still be inlined (and so hashed into the key)."""
    monkeypatch.setenv("KDKIT_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "cuda"
    shutil.copytree(jit.CUDA_DIR, src)
    cu = src / vk.SOURCE
    cu.write_text(cu.read_text().replace('#include "mla_verify_common.cuh"',
                                         '#include "mla_verify_common.cuh"  // config + helpers'))
    a = jit.build(cu, vk.KernelConfig().defines(), "sm_90")
    hdr = src / "mla_verify_common.cuh"
    hdr.write_text(hdr.read_text().replace("#define KD_PAD 8", "#define KD_PAD 16"))
    assert jit.build(cu, vk.KernelConfig().defines(), "sm_90").key != a.key


def test_unresolvable_quoted_include_is_refused(tmp_path):
    cu = tmp_path / "x.cu"
    cu.write_text('#include "elsewhere/not_here.cuh"\n__global__ void k() {}\n')
    with pytest.raises(jit.BuildError, match="cannot inline"):
        jit.expand(cu)
