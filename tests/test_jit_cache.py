"""The JIT cache's size bound: whole modules go, least recently used first; the new one stays."""
import importlib.util
import os

import pytest

from kdkit.kernel import jit


def _module(d, key, size, age):
    for ext, n in ((".cubin", size // 2), (".ptx", size - size // 2 - 10), (".log", 10)):
        p = d / f"{key}{ext}"
        p.write_bytes(b"x" * n)
        os.utime(p, (age, age))


def test_prune_removes_oldest_whole_modules_until_under_the_bound(tmp_path):
    for i, key in enumerate(["a", "b", "c", "d"]):
        _module(tmp_path, key, 1000, 1_000_000 + i)  # a oldest, d newest
    (tmp_path / ".d.cubin.1234.tmp").write_bytes(b"y" * 5000)  # a write in flight: never counted or removed
    removed = jit.prune_cache(tmp_path, limit=2500)
    assert removed == ["a", "b"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [".d.cubin.1234.tmp", "c.cubin", "c.log", "c.ptx", "d.cubin", "d.log", "d.ptx"]


def test_prune_keeps_the_module_just_built_even_when_it_is_the_oldest(tmp_path):
    _module(tmp_path, "new", 1000, 1_000_000)
    _module(tmp_path, "old", 1000, 2_000_000)
    assert jit.prune_cache(tmp_path, limit=500, keep="new") == ["old"]
    assert sorted(p.stem for p in tmp_path.iterdir()) == ["new"] * 3


def test_prune_under_the_bound_removes_nothing(tmp_path):
    _module(tmp_path, "a", 1000, 1_000_000)
    assert jit.prune_cache(tmp_path, limit=1000) == []
    assert len(list(tmp_path.iterdir())) == 3


def test_a_cache_hit_counts_as_recent_use(tmp_path):
    _module(tmp_path, "hit", 1000, 1_000_000)
    _module(tmp_path, "miss", 1000, 2_000_000)
    jit._touch(tmp_path / f"hit{e}" for e in (".cubin", ".ptx", ".log"))
    assert jit.prune_cache(tmp_path, limit=1500) == ["miss"]


@pytest.mark.parametrize("raw, mb", [("", jit.CACHE_MB_DEFAULT), ("64", 64)])
def test_cache_bound_from_the_environment(monkeypatch, raw, mb):
    monkeypatch.setenv("KDKIT_CACHE_MB", raw)
    assert jit.cache_limit_bytes() == mb << 20


@pytest.mark.parametrize("raw", ["half", "0", "-5", "1.5"])
def test_a_bad_cache_bound_names_the_variable_and_the_fix(monkeypatch, raw):
    monkeypatch.setenv("KDKIT_CACHE_MB", raw)
    with pytest.raises(jit.BuildError, match="KDKIT_CACHE_MB"):
        jit.cache_limit_bytes()


NVRTC = importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.bindings") is not None


@pytest.mark.skipif(not NVRTC, reason="needs NVRTC: pip install cuda-bindings nvidia-cuda-nvrtc nvidia-cuda-runtime")
def test_a_build_is_remembered_in_the_process_until_a_file_it_read_changes(tmp_path, monkeypatch):
    """plan() builds on every call: a repeat is the same Module without reading the source again,
    and an edit of the source or of a header it includes is a new build."""
    monkeypatch.setenv("KDKIT_CACHE", str(tmp_path / "cache"))
    src, head = tmp_path / "k.cu", tmp_path / "k.cuh"
    head.write_text("#define KD_SCALE 2.0f\n")
    src.write_text('#include "k.cuh"\nextern "C" __global__ void k(float* x) { x[threadIdx.x] *= KD_SCALE; }\n')
    first = jit.build(src, {}, "sm_90", tags={})
    assert jit.build(src, {}, "sm_90", tags={}) is first
    mtime = head.stat().st_mtime_ns
    head.write_text("#define KD_SCALE 3.0f\n")  # the same size ...
    os.utime(head, ns=(mtime, mtime))            # ... and the same mtime: only the bytes differ
    edited = jit.build(src, {}, "sm_90", tags={})
    assert edited.key != first.key
    assert "0f40400000" in edited.ptx and "0f40400000" not in first.ptx  # 3.0f, as PTX writes it
    assert jit.build(src, {}, "sm_120", tags={}) is not edited  # another arch is another build
