"""The `kdkit` command line.

Every subcommand is one entry (name, add_arguments, handler) in COMMANDS: add_arguments(parser)
declares its options, handler(args) -> exit code does the work; the handler's docstring is its
help. To add a subcommand, write the two functions and append the entry.

Exit codes: 0 all good; 1 the check found a problem (lint errors, a backend that failed or
errored, a case the reference could not replay, an existing output left alone); 2 an input that
cannot be used (a file that is not a case, is corrupt or hostile; a bad argument).
"""
from __future__ import annotations

import argparse
import re
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .case import CaseError

EXIT_OK, EXIT_PROBLEM, EXIT_BAD_INPUT = 0, 1, 2


def _err(msg: str) -> None:
    print(f"kdkit: {msg}", file=sys.stderr)


def _load(path):
    """The case at `path`, or None after saying (one line, no traceback) why it cannot be used."""
    from .case import load
    try:
        return load(path)
    except (CaseError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        _err(f"cannot load case: {e}")
    return None


def _backend_names(spec: str) -> list[str]:
    """'all' -> every registered backend (the unavailable ones are skipped, with their reason)."""
    from .backends import resolve
    try:
        return resolve(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want an integer or a comma list like 21,300,8192")
    if not vals or min(vals) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want non-negative integers")
    return vals


# ---- inspect -----------------------------------------------------------------------------------
def add_inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("case", help="a case file (.pt)")


def cmd_inspect(args) -> int:
    """Show what a case file holds, then lint it (exit 1 on lint errors, 2 if it cannot be loaded)."""
    from . import lint, report
    case = _load(args.case)
    if case is None:
        return EXIT_BAD_INPUT
    print(report.describe_case(case, args.case))
    findings = lint.check(case)
    print()
    print(lint.format_findings(findings))
    return EXIT_PROBLEM if any(f.severity == "error" for f in findings) else EXIT_OK


# ---- replay / report ---------------------------------------------------------------------------
def _add_replay_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("cases", nargs="+", metavar="CASE", help="case files (.pt)")
    p.add_argument("--backends", default="oracle,torch",
                   help="comma list of backends, or 'all' (unavailable ones are skipped with the reason); "
                        "default: oracle,torch")
    p.add_argument("--against", default="oracle", help="the reference every backend is compared with (default: oracle)")
    p.add_argument("--force", action="store_true",
                   help="overwrite an existing report (default: write NAME-YYYYmmdd-HHMMSS.html beside it)")


def add_replay(p: argparse.ArgumentParser) -> None:
    _add_replay_common(p)
    p.add_argument("--report", metavar="PATH", help="also write a report (.html or .md)")


def print_replay(rep) -> None:
    """What a replay prints: the table (it opens with the case summary), the lint one-liner, the
    seed-style lines, and each skipped or failed backend with its one-line reason."""
    from . import report
    table = rep.table()
    print(table)
    findings = list(rep.lint or [])
    lint_err = getattr(rep, "lint_error", None)
    # the table may carry a lint line of its own; errors are named here in any case
    if "lint:" not in table or any(f.severity == "error" for f in findings):
        print(f"lint: {lint_err}" if lint_err else report.lint_line(findings))
    for line in report.ran(rep):
        print(f"ran {line}")
    for line in rep.seed_lines():
        print(line)
    for row in report.rows_of(rep):
        if row.status in ("skipped", "error") and row.reason and row.reason not in table:
            print(f"{row.status} {row.backend}: {row.reason}")


@dataclass
class _Replayed:
    """What replaying a list of case files gave: one entry per replayed case, and the rest."""
    reports: list = field(default_factory=list)
    sources: list = field(default_factory=list)
    cases: list = field(default_factory=list)
    stopped: list = field(default_factory=list)  # (file, why) for cases that could not be replayed
    rc: int = EXIT_OK


def _replay_all(args) -> _Replayed:
    from . import lint, replay, report
    from .backends import BackendUnavailable
    done = _Replayed()
    try:
        names = _backend_names(args.backends)
    except argparse.ArgumentTypeError as e:
        _err(f"--backends: {e}")
        done.rc = EXIT_BAD_INPUT
        return done
    for i, path in enumerate(args.cases):
        if i:
            print()
        case = _load(path)
        if case is None:
            done.stopped.append((str(path), "cannot be loaded (see `kdkit inspect`)"))
            done.rc = EXIT_BAD_INPUT
            continue
        try:
            rep = replay.replay(case, names, against=args.against)
        except (KeyError, BackendUnavailable) as e:  # e.g. --against a backend that cannot run here
            _err(f"{path}: {str(e).strip(chr(39))}")
            done.stopped.append((str(path), str(e)))
            done.rc = EXIT_BAD_INPUT
            continue
        except Exception as e:  # the reference itself cannot run this case: say why, name the bug
            why = f"replay stopped: {type(e).__name__}: {e}"
            print(f"== {case.summary()}")
            lint_errors = report.lint_line(lint.errors(case))
            print(lint_errors)
            _err(f"{path}: {why}")
            done.stopped.append((str(path), f"{why} ({lint_errors})"))
            done.rc = max(done.rc, EXIT_PROBLEM)
            continue
        print_replay(rep)
        done.reports.append(rep)
        done.sources.append(str(path))
        done.cases.append(case)
        # a failing backend, or lint errors (the numbers of a mis-marshaled case mean nothing)
        if report.failed(rep) or any(f.severity == "error" for f in (rep.lint or [])):
            done.rc = max(done.rc, EXIT_PROBLEM)
    return done


def _write(done: _Replayed, out, force) -> int:
    from . import report
    if not done.reports and not done.stopped:
        _err("nothing was replayed: no report written")
        return EXIT_BAD_INPUT
    try:
        written = report.write_report(done.reports, out, force=force, sources=done.sources,
                                      cases=done.cases, stopped=done.stopped)
    except (ValueError, OSError) as e:
        _err(f"report not written: {e}")
        return EXIT_BAD_INPUT
    note = "" if Path(written) == Path(out) else f" ({out} exists; --force replaces it)"
    print(f"report: {written}{note}")
    return EXIT_OK


def cmd_replay(args) -> int:
    """Replay case files through backends and compare each with --against (exit 1 if one fails
    or the lint finds errors)."""
    done = _replay_all(args)
    if args.report:
        return max(done.rc, _write(done, args.report, args.force))
    return done.rc


def add_report(p: argparse.ArgumentParser) -> None:
    _add_replay_common(p)
    p.add_argument("--out", metavar="PATH",
                   help="report file, .html or .md (default: reports/<first case id>.html)")


def cmd_report(args) -> int:
    """Replay case files and write a self-contained report (HTML with figures, or Markdown)."""
    done = _replay_all(args)
    name = done.reports[0].case_id if done.reports else Path(args.cases[0]).stem
    return max(done.rc, _write(done, args.out or Path("reports") / f"{name}.html", args.force))


# ---- synth -------------------------------------------------------------------------------------
def add_synth(p: argparse.ArgumentParser) -> None:
    from .constants import LAYOUTS
    from .synth import KIMI_HEADS_PER_RANK, KIMI_SM_SCALE, TREES
    p.add_argument("--out", required=True, metavar="PATH", help="case file to write (.pt)")
    p.add_argument("--bs", type=int, default=None,
                   help="requests in the batch (default: the length of a --prefix/--q-len list, else 1)")
    p.add_argument("--prefix", type=_int_list, default=[21], help="committed prefix length: 21, or per request 21,300,8192")
    p.add_argument("--q-len", type=_int_list, default=[9], help="draft tokens per request (1 + tree budget): 9, or a comma list")
    p.add_argument("--heads", type=int, default=KIMI_HEADS_PER_RANK, help=f"query heads on this rank (default {KIMI_HEADS_PER_RANK}: Kimi 64 heads / TP8)")
    p.add_argument("--tree", choices=TREES, default="ddtree", help="draft tree shape (causal: no custom mask)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", choices=LAYOUTS, default="sglang",
                   help="sglang: indices cover the prefix, draft from k/v; unified: prefix + draft slots in the pool")
    p.add_argument("--magnitude", type=float, default=1.0, help="scale of q; 8..30 stresses the online softmax")
    p.add_argument("--logit-cap", type=float, default=0.0, help="soft cap of the logits, 0 for none")
    p.add_argument("--sm-scale", type=float, default=KIMI_SM_SCALE, help=f"softmax scale (default Kimi K2.6: {KIMI_SM_SCALE:.6f})")
    p.add_argument("--case-id", default=None, help="case id (default: built from the parameters)")
    p.add_argument("--force", action="store_true", help="replace an existing file")


def _per_request(vals: list[int], bs: int, flag: str):
    if len(vals) == 1:
        return vals[0]
    if len(vals) != bs:
        raise ValueError(f"{flag} has {len(vals)} values for --bs {bs}: give one value or one per request")
    return vals


def cmd_synth(args) -> int:
    """Write a synthetic case with the shapes of Kimi K2.6 tree verify (refuses to overwrite without --force)."""
    from .synth import make_case
    out = Path(args.out)
    if out.exists() and not args.force:
        _err(f"{out} exists; pass --force to replace it")
        return EXIT_PROBLEM
    lists = [len(v) for v in (args.prefix, args.q_len) if len(v) > 1]
    bs = args.bs if args.bs is not None else (lists[0] if lists else 1)
    try:
        if args.bs is None and len(set(lists)) > 1:
            raise ValueError(f"--prefix has {len(args.prefix)} values and --q-len {len(args.q_len)}: "
                             "give one value or one per request")
        if bs < 1:
            raise ValueError(f"--bs {bs}: a batch has at least one request")
        case = make_case(bs=bs, prefix=_per_request(args.prefix, bs, "--prefix"),
                         q_len=_per_request(args.q_len, bs, "--q-len"), heads=args.heads, tree=args.tree,
                         seed=args.seed, layout=args.layout, sm_scale=args.sm_scale,
                         logit_cap=args.logit_cap, magnitude=args.magnitude, case_id=args.case_id)
    except (ValueError, CaseError) as e:
        _err(f"synth: {e}")
        return EXIT_BAD_INPUT
    try:
        written = case.save(out, overwrite=args.force)
    except FileExistsError as e:
        _err(str(e))
        return EXIT_PROBLEM
    print(case.summary())
    print(f"wrote {written} ({os.path.getsize(written)} bytes)")
    return EXIT_OK


def add_compile(p: argparse.ArgumentParser) -> None:
    from .kernel.mutants import MUTANTS
    from .kernel.spec import ARCHS, DEFAULT_NT, NT_CHOICES
    p.add_argument("--arch", default="sm_120",
                   help=f"comma list of targets, e.g. sm_120,sm_90 (known: {', '.join(ARCHS)}; any sm_XX NVRTC takes)")
    p.add_argument("--rows", type=int, default=8 * DEFAULT_NT, choices=[8 * n for n in NT_CHOICES],
                   help="query (token, head) rows per block (8 x KD_NT)")
    p.add_argument("--mutant", default=None, choices=sorted(MUTANTS),
                   help="a deliberately wrong build (negative control) instead of the kernel")


def cmd_compile(args) -> int:
    """Compile kdkit's kernel for an arch without a GPU; print registers, shared memory, spills,
    local memory; exit 1 if the build breaches sm_120's limits (99 KB smem, no spills, no wgmma/TMA)."""
    from .kernel import jit
    from .kernel.spec import KernelConfig, compile_report
    worst = EXIT_OK
    for arch in [a.strip() for a in args.arch.split(",") if a.strip()]:
        if not re.fullmatch(r"sm_\d+[a-z]?", arch):
            _err(f"--arch {arch!r}: expected sm_XX (e.g. sm_120)")
            return EXIT_BAD_INPUT
        try:
            rep = compile_report(arch, KernelConfig(nt=args.rows // 8, mutant=args.mutant))
        except jit.BuildError as e:
            _err(str(e))
            worst = EXIT_PROBLEM
            continue
        print(rep.table())
        if rep.breaches():
            worst = EXIT_PROBLEM
    return worst


def add_bench(p: argparse.ArgumentParser) -> None:
    from .bench import add_arguments
    add_arguments(p)


def cmd_bench(args) -> int:
    """Benchmark kdkit's kernel beside SGLang's Triton kernels and torch on this GPU, against the
    measured roofline; write benchmarks/results/<gpu>-<date>.json and print the summary table."""
    from .bench import main as bench_main
    return bench_main(args)


# ---- the table of subcommands --------------------------------------------------------------------
# (name, add_arguments, handler); the handler's docstring is the help text
COMMANDS: list[tuple] = [
    ("inspect", add_inspect, cmd_inspect),
    ("replay", add_replay, cmd_replay),
    ("report", add_report, cmd_report),
    ("synth", add_synth, cmd_synth),
    ("compile", add_compile, cmd_compile),
    ("bench", add_bench, cmd_bench),
]


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    parser = argparse.ArgumentParser(
        prog="kdkit", description="Capture, replay and validate the MLA tree-verify attention kernel.")
    parser.add_argument("--version", action="version", version=f"kdkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, add_arguments, handler in COMMANDS:
        doc = (handler.__doc__ or "").strip()
        p = sub.add_parser(name, help=doc.splitlines()[0] if doc else None, description=doc or None)
        add_arguments(p)
        p.set_defaults(_handler=handler)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._handler(args) or 0)
    except BrokenPipeError:  # `kdkit inspect x.pt | head`
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
