"""The launch: a plan's kernels on torch's current stream through the driver's cuLaunchKernel
(cuda-bindings), with the argument buffer the plan packed once.

run() is on the per-layer hot path (61 layers a verify step, eager wherever no CUDA graph covers
the batch), so a launch here is one driver call per kernel: the function handles, grids, block
sizes and the kernelParams array (one pointer, to the plan's KdParams bytes) are made at plan
time; nothing is converted, allocated or looked up per call. The driver copies the argument bytes
when the launch is queued, so the next run() may rewrite them at once (and a CUDA graph captures
the values of its launch, not the buffer).
"""
from __future__ import annotations

import ctypes

import torch


class LaunchError(RuntimeError):
    """The driver refused a launch (the message names the entry point and the driver's error)."""


def _raw_stream_getter():
    """device index -> torch's current stream on it, as the raw cudaStream_t the driver takes.
    torch._C._cuda_getCurrentRawStream is what torch's own compiler (inductor's get_raw_stream)
    calls per launch; torch.cuda.current_stream() builds a Python Stream object each call (several
    us). The public call where a torch build lacks the private one."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw if raw is not None else (lambda index: torch.cuda.current_stream(index).cuda_stream)


# (torch._C._cuda_getDevice is what torch.cuda.current_device returns after its lazy-init check,
# which a plan has passed)
current_raw_stream = _raw_stream_getter()
current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def cupy_stream():
    """CuPy's view of torch's current stream, for CuPy launches that must join torch's stream order
    (the bench's mma_tflops, the design probes); cached per (device, stream)."""
    ts = torch.cuda.current_stream()
    key = (ts.device_index, ts.cuda_stream)
    cs = _CUPY_STREAMS.get(key)
    if cs is None:
        import cupy
        try:
            cs = cupy.cuda.Stream.from_external(ts)  # CuPy >= 14: the CUDA stream protocol
        except (AttributeError, TypeError):
            cs = cupy.cuda.ExternalStream(ts.cuda_stream)
        _CUPY_STREAMS[key] = cs
    return cs


_CUPY_STREAMS: dict = {}


def function_handle(raw_kernel) -> int:
    """The CUfunction of a cupy RawKernel (jit.load's module; CuPy loaded it into the device's
    context): the handle the driver launches."""
    try:
        return int(raw_kernel.kernel.ptr)
    except AttributeError as e:
        raise LaunchError(f"cannot read the CUfunction of {raw_kernel.name!r} from this CuPy ({e}); "
                          "kdkit needs CuPy >= 13 (kdkit's 'gpu' extra)") from None


def resident_blocks(fn: int, threads: int, smem: int) -> int:
    """How many blocks of kernel `fn` one SM holds at once at this block size and dynamic shared
    memory (the driver's occupancy calculator)."""
    from cuda.bindings import driver
    err, n = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(driver.CUfunction(fn), threads, smem)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise LaunchError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor: {err.name}")
    return int(n)


class Launcher:
    """A plan's launches, made once: `launcher(stream)` queues them on `stream`, one cuda-bindings
    driver call per kernel.

    calls: (entry point, function handle, grid (x, y, z), block (x, y, z), dynamic shared bytes,
    kernelParams address, cooperative) per kernel, in launch order (cooperative: every block
    resident at once, cuLaunchCooperativeKernel; the fused merge's blocks wait for each other).
    keep: what the kernelParams addresses point into (held as long as the launcher)."""

    def __init__(self, calls, keep=()):
        from cuda.bindings import driver
        self._driver = driver
        self._keep = keep
        self._launch = driver.cuLaunchKernel
        self._launch_coop = driver.cuLaunchCooperativeKernel
        self._ok = driver.CUresult.CUDA_SUCCESS
        self.calls = tuple((name, driver.CUfunction(fn), *grid, *block, int(smem), int(kp), bool(coop))
                           for name, fn, grid, block, smem, kp, coop in calls)

    def __call__(self, stream: int, only: str | None = None) -> None:
        """Queue the launches on `stream` (only: just the entry point of that name, for the probes
        that time one kernel of a plan)."""
        ok = self._ok
        for name, fn, gx, gy, gz, bx, by, bz, smem, kp, coop in self.calls:
            if only is not None and name != only:
                continue
            if coop:
                err = self._launch_coop(fn, gx, gy, gz, bx, by, bz, smem, stream, kp)[0]
            else:
                err = self._launch(fn, gx, gy, gz, bx, by, bz, smem, stream, kp, 0)[0]
            if err != ok:
                what = "cuLaunchCooperativeKernel" if coop else "cuLaunchKernel"
                raise LaunchError(f"{what}({name}, grid ({gx}, {gy}, {gz}), block ({bx}, {by}, {bz}), "
                                  f"{smem} B shared): {err.name}; launch on the plan's device (with "
                                  "torch.cuda.device(...):) and after the module loaded there")


def kernel_params(address: int):
    """A kernelParams array of one pointer (to a kernel's single struct argument at `address`);
    the caller keeps it alive as long as the launches that read it."""
    return (ctypes.c_void_p * 1)(address)
