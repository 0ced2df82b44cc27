"""`kdkit bench`: the benchmark's own entry (kdkit.bench), behind the command line."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .. import bench  # the benchmark's module (imports torch: only when bench runs)
    bench.add_arguments(p)


def run(args) -> int:
    """Benchmark kdkit's kernel beside SGLang's Triton kernels and torch on this GPU, against the
    measured roofline; write benchmarks/results/<gpu>-<date>.json and print the summary table."""
    from .. import bench
    return bench.main(args)
