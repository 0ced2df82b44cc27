"""`kdkit export`: cases in the ecosystem's exchange format (FlashInfer Trace)."""
from __future__ import annotations

import argparse

from .common import EXIT_OK, BadInput, case_files


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..byok import flashinfer_trace
    flashinfer_trace.add_arguments(p)


def run(args) -> int:
    """Write cases as a FlashInfer Trace definition (MLA tree verify, its reference in plain
    PyTorch) and its workloads (the captured inputs, in safetensors), for FlashInfer-Bench."""
    from ..byok import flashinfer_trace
    try:
        flashinfer_trace.export_files(args.flashinfer_trace, case_files(args.cases), force=args.force)
    except (flashinfer_trace.TraceError, OSError) as e:
        raise BadInput(str(e)) from None
    return EXIT_OK
