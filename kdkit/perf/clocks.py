"""The GPU's SM clock and power, sampled while `kdkit bench` times: each row of a run gets the
median of the samples taken during its timing.

Why: a kernel's time depends on the clock it ran at, and the clock on the load. On the H200 a KV
step of the kernel took 1.06 us with at most 16 blocks running and 1.64 us with 128 (README,
"What a step measures"); whether the clock falls as the GPU fills is read off these numbers.

One `nvidia-smi --query-gpu=clocks.sm,power.draw -lms N` process for the whole run (not one per
row: each start costs tens of milliseconds), its lines timestamped on arrival by a reader thread.
Where nvidia-smi is missing or fails, nothing is sampled and rows carry no clock.
"""
from __future__ import annotations

import statistics
import subprocess
import threading
import time

INTERVAL_MS = 20  # a row's timing lasts 0.3-2 s: 15 samples or more


def parse(line: str) -> tuple[float, float | None] | None:
    """'1980, 312.45' -> (1980.0, 312.45); power may read '[N/A]' (None); anything else is None."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 2:
        return None
    try:
        mhz = float(parts[0])
    except ValueError:
        return None
    try:
        watts = float(parts[1])
    except ValueError:
        watts = None
    return mhz, watts


class ClockSampler:
    """Samples from `start()` to `stop()`; `window(t0, t1)` summarises those taken between two
    `time.monotonic()` readings. A context manager."""

    def __init__(self, gpu: str = "0", interval_ms: int = INTERVAL_MS):
        self.gpu, self.interval_ms = gpu, interval_ms
        self.samples: list[tuple[float, float, float | None]] = []  # (monotonic s, MHz, W)
        self._proc = None
        self._thread = None
        self._lock = threading.Lock()

    def add(self, t: float, line: str) -> None:
        """One line of nvidia-smi's output, received at monotonic time t."""
        s = parse(line)
        if s is not None:
            with self._lock:
                self.samples.append((t, *s))

    def start(self) -> "ClockSampler":
        cmd = ["nvidia-smi", "-i", self.gpu, "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
               "-lms", str(self.interval_ms)]
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:  # no nvidia-smi: rows carry no clock
            self._proc = None
            return self

        def read(out):
            for line in out:
                self.add(time.monotonic(), line)

        self._thread = threading.Thread(target=read, args=(self._proc.stdout,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._proc = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def window(self, t0: float, t1: float) -> dict:
        """{"sm_mhz", "power_w"}: the medians of the samples taken in [t0, t1] (power left out
        where the GPU reports none); {} where no sample fell in it."""
        with self._lock:
            got = [s for s in self.samples if t0 <= s[0] <= t1]
        if not got:
            return {}
        res = {"sm_mhz": round(statistics.median(s[1] for s in got))}
        watts = [s[2] for s in got if s[2] is not None]
        if watts:
            res["power_w"] = round(statistics.median(watts), 1)
        return res

    def __enter__(self) -> "ClockSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def gpu_id(device) -> str:
    """nvidia-smi's name for a torch device: its UUID where torch knows it (CUDA_VISIBLE_DEVICES
    renumbers indices, not UUIDs), else its index."""
    import torch
    try:
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    except Exception:  # (the sampler is a by-product: it never stops a run)
        uuid = None
    if uuid is not None:
        text = str(uuid)
        return text if text.startswith("GPU-") else f"GPU-{text}"
    return str(torch.device(device).index or 0)
