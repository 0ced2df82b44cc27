"""`kdkit compile`: the kernel built for GPU archs without a GPU, its resources per kernel
(the archs and the builds are kdkit.kernel.builds')."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from .common import EXIT_OK, EXIT_PROBLEM, BadInput, err, number


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..kernel.builds import row_choices
    from ..kernel.mutants import MUTANTS
    p.add_argument("--arch", default="sm_120",
                   help="comma list of targets, e.g. sm_120,sm_90: any sm_XX from sm_80 that NVRTC builds")
    p.add_argument("--rows", type=number(int), default=None, choices=row_choices(),
                   help="query (token, head) rows per block (8 x KD_NT); default: every block size the "
                        f"planner may choose ({', '.join(map(str, row_choices()))})")
    p.add_argument("--mutant", default=None, choices=sorted(MUTANTS),
                   help="a deliberately wrong build (negative control) instead of the kernel (default: none)")
    p.add_argument("--backend", default=None, metavar="SPEC",
                   help="a backend's kernel instead of kdkit's: a name, package.module:attr or path/to/file.py[:attr] "
                        "whose backend reports resources(arch) (kdkit.byok.cuda's CudaKernel does) (default: none)")
    p.add_argument("--sass", default=None, metavar="DIR",
                   help="also write each build's SASS to DIR/<build key>.sass (nvdisasm: the compile extra's "
                        "nvidia-cuda-nvdisasm) and print its instruction counts per kernel (default: none)")


def run(args) -> int:
    """Compile kdkit's kernel for GPU archs without a GPU and print its resource use per kernel.

    Registers, shared memory, stack, spills, local memory; exit 1 if a build breaches sm_120's
    limits (99 KB of shared memory, no spills, no wgmma/TMA) or fails. With --sass, each build's
    SASS too (a build's key names its source and options, so a file of that name holds the same
    code and is left as it is)."""
    from ..kernel import builds, jit
    from ..kernel.spec import KernelConfig, compile_report
    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    if not archs:
        raise BadInput("--arch: give at least one sm_XX")
    limits = builds.supported_archs()
    for arch in archs:
        try:
            builds.check_arch(arch, limits)
        except builds.ArchError as e:
            raise BadInput(f"--arch {e}") from None
    if limits["nvrtc"] is None:
        err("NVRTC is not installed: `pip install cuda-bindings nvidia-cuda-nvrtc` (kdkit's 'compile' extra)")
        return EXIT_PROBLEM
    if args.backend is not None:
        return backend_resources(args.backend, archs)
    if args.sass is not None:
        from ..kernel import sass
        try:
            sass.nvdisasm_path()  # before any build: a missing disassembler is one line, not one per build
        except jit.BuildError as e:
            err(f"--sass: {e}")
            return EXIT_PROBLEM
        if Path(args.sass).exists() and not Path(args.sass).is_dir():
            raise BadInput(f"--sass {args.sass}: not a folder; give a folder for the .sass files")
        try:  # made here, before any build, so a folder that cannot be written is one line up front
            Path(args.sass).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BadInput(f"--sass {args.sass}: cannot make the folder ({e.strerror}); give a folder you can write")
        if not os.access(args.sass, os.W_OK | os.X_OK):
            raise BadInput(f"--sass {args.sass}: the folder is not writable; give a folder you can write")
    worst = EXIT_OK
    for arch in archs:
        for nt, skip, fused in builds.build_matrix(args.rows):  # every build the planner may choose, or --rows'
            cfg = KernelConfig(nt=nt, mutant=args.mutant, skip=skip, fused=fused)
            try:
                rep = compile_report(arch, cfg)
            except jit.BuildError as e:
                err(str(e))
                worst = EXIT_PROBLEM
                continue
            print(f"{arch}, {builds.ROWS_PER_NT * nt} rows per block (KD_NT={nt}){builds.SKIP_LABELS[skip]}"
                  f"{builds.FUSED_LABEL if fused else ''}:")
            print(rep.table())
            if rep.breaches():
                worst = EXIT_PROBLEM
            if args.sass is not None:
                worst = max(worst, write_sass(Path(args.sass), arch, cfg))
    return worst


def write_sass(folder: Path, arch: str, config) -> int:
    from ..files import publish
    from ..kernel import jit, sass
    from ..kernel.spec import build
    try:
        mod = build(config, arch)  # (built just now: from the cache)
        text = sass.disassemble(mod)
    except jit.BuildError as e:
        err(str(e))
        return EXIT_PROBLEM
    path = publish(folder / f"{mod.key}.sass", text, exist_ok=True)
    for name, counts in sass.opcode_counts(text).items():
        print(f"  SASS {name}: {sass.summary(counts)}")
    print(f"  SASS in {path}")
    return EXIT_OK


def backend_resources(spec: str, archs: list[str]) -> int:
    """A user's kernel built for each arch without a GPU, its resources against the arch's limits:
    exit 1 on a breach; a kernel that does not compile prints the compiler's own lines (they point
    at the user's file and line) and exits 2."""
    from .. import backends
    from ..kernel import jit
    try:
        (name,) = backends.resolve(spec)
        b = backends.get(name)
    except ValueError as e:
        raise BadInput(f"--backend {e}") from None
    if not callable(getattr(b, "resources", None)):
        raise BadInput(f"--backend {spec}: {name} reports no resources(arch) (a CUDA kernel through "
                       "kdkit.byok.cuda.CudaKernel does; a Triton kernel is compiled by Triton when it runs)")
    worst = EXIT_OK
    for arch in archs:
        try:
            rep = b.resources(arch)
        except jit.BuildError as e:  # the compiler's own lines, pointing at the user's source
            raise BadInput(str(e).strip()) from None
        print(f"{name}, {arch}:")
        print(rep.table())
        if rep.breaches():
            for line in rep.breaches():
                err(f"{name} {arch}: {line}")
            worst = EXIT_PROBLEM
    return worst
