"""kdkit/kernel/host/kd_launch.c, the native launch path, without a GPU: the real shared object,
built by the host's C compiler, driven through a recording stand-in for the driver's cuLaunchKernel
(a ctypes callback with its signature). What it must do: pass every field of every call through
unchanged, in order, with extra = NULL; stop at the first refusal and say which call and what error;
and where it cannot build, say why in one line (launch.py then takes cuda-bindings)."""
from __future__ import annotations

import ctypes
import os

import pytest

from kdkit.kernel import native

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on this host (cc, gcc, clang)")

LAUNCH_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7), ctypes.c_void_p,
                            ctypes.c_void_p, ctypes.c_void_p)
COOP_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7), ctypes.c_void_p, ctypes.c_void_p)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A private cache and no memo of the last load, so each test builds as a new process would."""
    monkeypatch.setenv("KDKIT_CACHE", str(tmp_path / "jit"))
    monkeypatch.delenv(native.ENV_SWITCH, raising=False)
    native._entry.cache_clear()
    yield tmp_path
    native._entry.cache_clear()


def recorder(refuse_at: int | None = None, err: int = 1):
    """Stand-ins for cuLaunchKernel and cuLaunchCooperativeKernel that record their arguments
    (which entry point, then the driver's arguments); call `refuse_at` (0-based) returns err.
    Returns (keep-alive, launch address, cooperative launch address, the record)."""
    seen = []

    def record(kind, args):
        seen.append((kind, *args))
        return err if refuse_at is not None and len(seen) - 1 == refuse_at else 0

    def launch(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        return record("plain", (fn, (gx, gy, gz), (bx, by, bz), smem, stream, params, extra))

    def coop(fn, gx, gy, gz, bx, by, bz, smem, stream, params):
        return record("coop", (fn, (gx, gy, gz), (bx, by, bz), smem, stream, params))
    keep = (LAUNCH_T(launch), COOP_T(coop))
    return keep, *(ctypes.cast(k, ctypes.c_void_p).value for k in keep), seen


def table(calls):
    t = (native.KdCall * len(calls))()
    for c, (fn, params, grid, block, smem, *coop) in zip(t, calls):
        c.fn, c.params, c.grid[:], c.block[:], c.smem, c.coop = fn, params, grid, block, smem, bool(coop and coop[0])
    return t


CALLS = [(0x7F0000001000, 0x7F0000002000, (13, 10, 1), (256, 1, 1), 99 * 1024),
         (0x7F0000003000, 0x7F0000002000, (512, 1, 1), (128, 4, 1), 0),
         (0x7F0000004000, 0x7F0000005008, (1, 2, 3), (32, 2, 2), 48, True)]  # a cooperative launch


def expected(calls, stream):
    return [("coop", f, g, b, s, stream, p) if coop and coop[0] else ("plain", f, g, b, s, stream, p, None)
            for f, p, g, b, s, *coop in calls]


def test_every_field_of_every_call_reaches_the_driver_in_order(fresh):
    fn = native.kd_launch()
    assert fn is not None and native.unavailable() is None
    keep, addr, coop, seen = recorder()
    t = table(CALLS)
    stream = 0x5A5A0000
    assert fn(addr, coop, ctypes.addressof(t), len(CALLS), stream) == 0
    assert seen == expected(CALLS, stream)
    # the legacy default stream (torch's stream 0) is passed as the null handle
    seen.clear()
    assert fn(addr, coop, ctypes.addressof(t), 1, 0) == 0
    assert seen == expected(CALLS[:1], None)


def test_a_refusal_names_the_call_and_stops_the_rest(fresh):
    fn = native.kd_launch()
    keep, addr, coop, seen = recorder(refuse_at=1, err=700)
    t = table(CALLS)
    r = fn(addr, coop, ctypes.addressof(t), len(CALLS), 7)
    assert (r >> 32, r & 0xFFFFFFFF) == (2, 700)
    assert len(seen) == 2  # the third reads what the refused one writes: not queued


def test_the_launcher_queues_a_plans_calls_through_the_shared_object(fresh, monkeypatch):
    """kdkit.kernel.launch.Launcher, the table it builds and its error, on the stand-in driver."""
    pytest.importorskip("cuda.bindings")
    from kdkit.kernel import launch
    keep, addr, coop, seen = recorder()
    entries = {"cuLaunchKernel": addr, "cuLaunchCooperativeKernel": coop}
    monkeypatch.setattr(native, "driver_address", entries.__getitem__)
    calls = [("kd_partial", f, g, b, s, p, *c) for f, p, g, b, s, *c in CALLS]
    lau = launch.Launcher(calls)
    assert lau.path == "native" and lau.why_bindings is None
    lau(0x1234)
    assert seen == expected(CALLS, 0x1234)
    keep2, addr2, coop2, seen2 = recorder(refuse_at=2, err=720)  # CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
    entries.update(cuLaunchKernel=addr2, cuLaunchCooperativeKernel=coop2)
    lau2 = launch.Launcher([(f"kd_{i}", *c[1:]) for i, c in enumerate(calls)])
    with pytest.raises(launch.LaunchError, match=r"cuLaunchCooperativeKernel\(kd_2, grid \(1, 2, 3\), block \(32, 2, 2\).*"
                                                 r"CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"):
        lau2(0)
    assert len(seen2) == 3


def test_the_shared_object_is_built_once_and_reused(fresh):
    cc = native.compiler()
    so = native.build(cc)
    mtime = so.stat().st_mtime_ns
    assert native.build(cc) == so and so.stat().st_mtime_ns == mtime
    assert not [p for p in so.parent.iterdir() if p.name.startswith(".kd_launch-")]  # no temporary left


def test_without_a_compiler_the_reason_is_one_line(fresh, monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert native.kd_launch() is None
    assert "no C compiler" in native.unavailable()
    native._entry.cache_clear()
    failing = tmp_path / "cc-fails"
    failing.write_text("#!/bin/sh\necho 'cc: cannot run here' >&2\nexit 3\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    why = native.unavailable()
    assert native.kd_launch() is None and "exit 3" in why and "cannot run here" in why and "\n" not in why


def test_the_switch_turns_the_native_path_off(fresh, monkeypatch):
    monkeypatch.setenv(native.ENV_SWITCH, "bindings")
    assert native.kd_launch() is None and native.unavailable() == f"{native.ENV_SWITCH}=bindings"


def test_the_c_struct_and_its_mirror_agree(fresh):
    lib = ctypes.CDLL(str(native.build(native.compiler())))
    lib.kd_call_size.restype = ctypes.c_int32
    assert lib.kd_call_size() == ctypes.sizeof(native.KdCall) == 48
    assert os.path.getsize(native.build(native.compiler())) > 0
