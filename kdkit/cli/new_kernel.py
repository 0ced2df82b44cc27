"""`kdkit new-kernel`: a starter kernel package (CUDA or Triton) to develop from."""
from __future__ import annotations

import argparse
from pathlib import Path

from .common import EXIT_OK, BadInput


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, metavar="DIR", help="a new or empty folder to write the package into")
    p.add_argument("--lang", choices=("cuda", "triton"), required=True,
                   help="cuda: a .cu file compiled with NVRTC; triton: a @triton.jit kernel (runs on a CPU "
                        "under Triton's interpreter)")
    p.add_argument("--name", default=None, help="the backend's and package's name (default: DIR's name)")


def run(args) -> int:
    """Write a small, correct starter kernel (split-KV, the tree mask, an LSE merge), its backend
    module, a pyproject.toml that registers it with kdkit, and a test over the bundled cases."""
    from ..byok import starter
    try:
        pkg = starter.write(args.dir, args.lang, args.name)
    except starter.StarterError as e:
        raise BadInput(str(e)) from None
    name = pkg.name
    print(f"kdkit: wrote {args.dir}/ ({args.lang}): {name}/{starter.KERNEL_FILE[args.lang]} is the kernel, "
          f"{name}/backend.py its backend")
    print(f"next:  pip install -e {args.dir}  (then it is in --backends all)")
    print(f"       kdkit replay data/captured_tensors/*.pt --backends oracle,{name}")
    print(f"       pytest {args.dir}/tests")
    return EXIT_OK
