"""`kdkit bench`: the benchmark's own entry (kdkit.perf.bench), behind the command line."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..perf import bench  # the benchmark's module (imports torch: only when bench runs)
    bench.add_arguments(p)


def run(args) -> int:
    """Benchmark backends on this GPU (kdkit's kernel, SGLang's Triton kernels, torch, FlashInfer,
    any backend spec), each judged before it is timed, against the measured roofline; write
    benchmarks/results/<gpu>-<date>.json and print the summary table."""
    from ..perf import bench
    return bench.run(args)
