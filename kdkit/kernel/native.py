"""The native launch path: kdkit/kernel/host/kd_launch.c built with the host's C compiler and
loaded with ctypes, so that run() queues a plan's kernels with one foreign call instead of one
cuda-bindings call per kernel (launch.py uses it where it builds; cuda-bindings where it does not).

The shared object is cached beside the JIT cache (KDKIT_CACHE's parent, or ~/.cache/kdkit/host),
keyed by a hash of the source, the compiler's path and the flags; it is written to a temporary
name and renamed, so a concurrent build never loads a half-written file. KDKIT_LAUNCH=bindings
turns the native path off (the A/B of the two; the reason shows in a plan's info).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .jit import cache_dir

SOURCE = Path(__file__).parent / "host" / "kd_launch.c"
FLAGS = ("-O2", "-shared", "-fPIC", "-std=c99")
ENV_SWITCH = "KDKIT_LAUNCH"  # "bindings": every launch through cuda-bindings


class KdCall(ctypes.Structure):
    """One kernel of a plan, as kd_launch.c's kd_call reads it."""
    _fields_ = [("fn", ctypes.c_void_p), ("params", ctypes.c_void_p), ("grid", ctypes.c_uint32 * 3),
                ("block", ctypes.c_uint32 * 3), ("smem", ctypes.c_uint32), ("coop", ctypes.c_uint32)]


def compiler() -> str | None:
    """The host C compiler: $CC, else cc, gcc or clang on PATH (None: none found)."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        return shutil.which(cc) or (cc if Path(cc).is_file() else None)
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    return None


def host_dir() -> Path:
    d = cache_dir().parent / "host"
    d.mkdir(parents=True, exist_ok=True)
    return d


def build(cc: str) -> Path:
    """The shared object for this source and compiler, built if it is not cached; raises
    RuntimeError with the compiler's message where it fails."""
    text = SOURCE.read_bytes()
    key = hashlib.sha256(text + cc.encode() + " ".join(FLAGS).encode()).hexdigest()[:16]
    so = host_dir() / f"kd_launch-{key}.so"
    if so.is_file():
        return so
    fd, tmp = tempfile.mkstemp(prefix=".kd_launch-", suffix=".so", dir=so.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"{cc} {' '.join(FLAGS)} {SOURCE.name}: exit {r.returncode}: "
                               f"{' '.join((r.stderr or r.stdout).split())[:400]}")  # one line
        os.replace(tmp, so)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return so


def load(so: Path):
    """kd_launch from the shared object, its argument types set and the struct layout checked."""
    lib = ctypes.CDLL(str(so))
    for name, want in (("kd_call_size", ctypes.sizeof(KdCall)), ("kd_call_offset_grid", KdCall.grid.offset),
                       ("kd_call_offset_smem", KdCall.smem.offset), ("kd_call_offset_coop", KdCall.coop.offset)):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int32
        if fn() != want:
            raise RuntimeError(f"{so.name}: {name}() = {fn()}, the ctypes mirror has {want}; the C struct and "
                               "KdCall in kdkit/kernel/native.py disagree")
    fn = lib.kd_launch
    fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p)
    fn.restype = ctypes.c_int64
    fn._kd_lib = lib  # (the library stays loaded while the function is referenced)
    return fn


@functools.lru_cache(maxsize=None)
def _entry() -> tuple:
    """(kd_launch, None) where the native path runs here, else (None, the reason in one line)."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() == "bindings":
        return None, f"{ENV_SWITCH}=bindings"
    cc = compiler()
    if cc is None:
        return None, "no C compiler (cc, gcc or clang on PATH, or $CC) to build kdkit/kernel/host/kd_launch.c"
    try:
        return load(build(cc)), None
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return None, f"the native launcher did not build or load: {e}"


def kd_launch():
    """The loaded kd_launch(launch_fn, launch_coop_fn, calls, n, stream) -> 0 or (index + 1) << 32 |
    CUresult, or None."""
    return _entry()[0]


def unavailable() -> str | None:
    """None where run() launches natively, else why it goes through cuda-bindings."""
    return _entry()[1]


def driver_address(symbol: str) -> int:
    """The address of a driver entry point (cuLaunchKernel, cuLaunchCooperativeKernel) as the
    driver hands it out for its own CUDA version (cuGetProcAddress, default flags: the legacy
    default stream, as torch and cuda-bindings use it); needs a driver, not a GPU context."""
    from cuda.bindings import driver
    ok = driver.CUresult.CUDA_SUCCESS
    err, version = driver.cuDriverGetVersion()
    if err != ok:
        raise RuntimeError(f"cuDriverGetVersion: {err.name}")
    err, addr, _ = driver.cuGetProcAddress(symbol.encode(), version,
                                           driver.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT)
    if err != ok or not addr:
        raise RuntimeError(f"cuGetProcAddress({symbol}, {version}): {getattr(err, 'name', err)}, address {addr}")
    return int(addr)
