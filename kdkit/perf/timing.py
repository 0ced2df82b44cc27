"""How kdkit times GPU work: the L2 flush, the event timer, CUDA-graph capture, and the machine's
two ceilings (device copy bandwidth, mma.sync rate) the roofline is made of.

Every tool of kdkit.perf times through these (`kdkit bench`, the A/B, the sweeps, the probes), so
that their numbers compare: a 256 MiB read before each timed call so that no KV is left in L2 (a
read, not a write: a memset would leave L2 full of dirty lines whose write-back the next kernel
pays), then a short GPU sleep so that the launch is queued before the start event is reached (the
events time the GPU's work, not Python's launch latency, which `Timer.host_us` reports apart), one
warm-up, the median of the repetitions.
"""
from __future__ import annotations

import time

import torch

from ..kernel.launch import cupy_stream

FLUSH_BYTES = 256 << 20
SLEEP_CYCLES = 500_000  # ~250 us at 2 GHz: longer than a launch's host work, so the launch is queued


class L2Flush:
    """A 256 MiB buffer whose sum evicts the KV of the previous call from L2 (and leaves nothing
    dirty there); calling the object does one flush."""

    def __init__(self, device, nbytes: int = FLUSH_BYTES):
        self.buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
        self.sink = torch.empty((), dtype=torch.float32, device=device)

    def __call__(self) -> None:
        torch.sum(self.buf, dim=0, out=self.sink)


class Timer:
    def __init__(self, device):
        self.flush = L2Flush(device)

    def us(self, fn, reps: int | None = None, budget_s: float = 1.0) -> float:
        """Median GPU time of fn() in microseconds, L2 flushed before each call."""
        fn()
        torch.cuda.synchronize()
        if reps is None:  # as many as fit the budget, 5..50
            t0 = self._once(fn)
            reps = int(max(5, min(50, budget_s / max(t0 * 1e-6, 1e-9))))
        return sorted(self._once(fn) for _ in range(reps))[reps // 2]

    def host_us(self, fn, reps: int = 20, batches: int = 5) -> float:
        """What one launch costs the CPU (Python, checks, the launch calls), the GPU kept busy: the
        mean over `reps` calls queued behind a GPU sleep, the median of `batches` such means (one
        batch's mean alone takes in whatever else holds the GIL meanwhile, the bench's clock
        sampler thread reading nvidia-smi among it)."""
        means = []
        for _ in range(batches):
            torch.cuda.synchronize()
            torch.cuda._sleep(SLEEP_CYCLES * 4)
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            means.append((time.perf_counter() - t0) / reps * 1e6)
        torch.cuda.synchronize()
        return sorted(means)[batches // 2]

    def plan_us(self, plan, reps: int = 10) -> float:
        """Median host time of plan() (after one that builds or loads what it needs), each ending
        with a device sync so that its allocations and reads of device data are counted whole."""
        plan()
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            plan()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e6)
        return sorted(times)[reps // 2]

    def eager_us(self, fn, reps: int = 30) -> float:
        """Median time of one eager call with its host work in view: L2 flushed, then the events
        around the call with no GPU sleep before it, so a slow launch shows as GPU idle time (what
        a layer pays wherever no CUDA graph covers the batch)."""
        times = []
        for _ in range(reps):
            self.flush()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        return sorted(times)[reps // 2]

    def _once(self, fn) -> float:
        self.flush()
        torch.cuda._sleep(SLEEP_CYCLES)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1e3


_EMPTY = 'extern "C" __global__ void kd_empty() {}'


def empty_launch(timer: Timer) -> dict:
    """An empty kernel (one block of one warp) launched as kdkit's run() launches (one cuda-bindings
    cuLaunchKernel on torch's current stream): its host time (Timer.host_us), its eager time
    (Timer.eager_us: the floor of any eager call from Python on this host, the events' own host
    work included) and its GPU time (Timer.us)."""
    import cupy

    from ..kernel import launch
    fn = launch.function_handle(cupy.RawKernel(_EMPTY, "kd_empty"))
    one = launch.Launcher([("kd_empty", fn, (1, 1, 1), (32, 1, 1), 0, 0, False)])
    stream = launch.current_raw_stream(torch.cuda.current_device())
    return {"shape": "empty kernel", "kernels": 1, "launcher_us": timer.host_us(lambda: one(stream)),
            "eager_us": timer.eager_us(lambda: one(stream)), "gpu_us": timer.us(lambda: one(stream))}


def graph_of(fn):
    """fn captured in a CUDA graph; returns the replay."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def copy_gbps(timer: Timer, device) -> float:
    """Device-to-device copy of 1 GiB: (read + write) bytes / median time."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    us = timer.us(lambda: dst.copy_(src), reps=10)
    del src, dst
    return 2 * (1 << 30) / us / 1e3


def mma_tflops(timer: Timer, device) -> float:
    """kdkit's mma.sync microbenchmark (kernel/cuda/mma_peak.cu): one block per SM, independent
    accumulator chains in every warp; threads and FLOPs per warp-iteration read from the build."""
    import cupy

    from ..kernel import jit
    mod = jit.build("mma_peak.cu", {}, jit.device_arch(), tags={})
    fn = jit.load(mod).get_function("kd_mma_peak")
    meta = mod.meta()
    threads = meta["threads"]
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    out = torch.empty(sms * threads, dtype=torch.float32, device=device)
    iters = 20000

    def launch():
        with cupy_stream():
            fn((sms,), (threads,), (cupy.from_dlpack(out), cupy.int32(iters)))
    us = timer.us(launch, reps=10)
    return sms * (threads // 32) * iters * meta["flops_per_iter_warp"] / us / 1e6
