"""The `kdkit` command line.

Every subcommand is one entry (name, add_arguments, handler) in COMMANDS: add_arguments(parser)
declares its options, handler(args) -> exit code does the work; the first paragraph of the
handler's docstring is its one-line help. To add a subcommand, write the two functions and append
the entry.

Exit codes, the same for every subcommand:
  0  all the requested work ran and passed
  1  a verdict failed (a backend failed or errored, lint errors, a build that breaches sm_120's
     limits), or something requested did not run here: a skipped backend (unless --allow-skip),
     a reference that cannot run, an output left alone because it exists
  2  bad input: a bad argument, a path that is not there, a file that is not a case (corrupt,
     hostile). Said in one line, before any work is done or any file written.

Start-up: only the subcommand that runs is given its options, and each imports what it needs when
it runs: `kdkit --help` imports neither torch nor plotly, and only a report imports plotly.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .capture import cli as _capture_cli

EXIT_OK, EXIT_PROBLEM, EXIT_BAD_INPUT = 0, 1, 2


class BadInput(Exception):
    """An argument or input file that cannot be used: main() prints it as one line, exit 2."""


def _err(msg: str) -> None:
    print(f"kdkit: {msg}", file=sys.stderr)


# ---- argument types: each refuses a bad value at parse time, naming it -------------------------
def _number(kind, lo=None, hi=None, lo_open=False):
    """An argparse type: `kind` (int or float), finite, within [lo, hi] ((lo, hi] if lo_open)."""
    def parse(text: str):
        try:
            val = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}")
        if isinstance(val, float) and not math.isfinite(val):
            raise argparse.ArgumentTypeError(f"{text!r}: want a finite number")
        if lo is not None and (val <= lo if lo_open else val < lo):
            raise argparse.ArgumentTypeError(f"{text}: want {'>' if lo_open else '>='} {lo}")
        if hi is not None and val > hi:
            raise argparse.ArgumentTypeError(f"{text}: want <= {hi}")
        return val
    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _int_list(lo: int):
    """An argparse type: one integer >= lo, or a comma list of them (one per request)."""
    one = _number(int, lo)

    def parse(text: str) -> list[int]:
        vals = [one(x.strip()) for x in str(text).split(",") if x.strip()]
        if not vals:
            raise argparse.ArgumentTypeError(f"{text!r}: want an integer or a comma list like 21,300,8192")
        return vals
    parse.__name__ = "integer list"
    return parse


def _backend_names(spec: str) -> list[str]:
    """'all' -> every registered backend (the unavailable ones are skipped, with their reason)."""
    from .backends import resolve
    try:
        return resolve(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# ---- input files --------------------------------------------------------------------------------
def case_files(paths) -> list[Path]:
    """The case files named by `paths`: files as given, directories as the .pt files under them
    (sorted). BadInput for a path that is not there or a directory that holds no case file."""
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            if not os.access(p, os.R_OK | os.X_OK):  # rglob would skip it silently
                raise BadInput(f"{p}: a directory this user cannot read")
            # a link to nowhere is listed too: it is said (cannot load), not skipped in silence
            found = sorted(f for f in p.rglob("*.pt") if f.is_file() or (f.is_symlink() and not f.exists()))
            if not found:
                raise BadInput(f"{p}: a directory with no case files (*.pt) in it")
            files += found
        elif p.exists():
            files.append(p)
        else:
            raise BadInput(f"{p}: no such file or directory")
    return list(dict.fromkeys(files))


def _read(path, allow_nonfinite: bool = False):
    """(case, None), or (None, why) in one line for a file that cannot be used as a case."""
    from .case import CaseError, load
    try:
        return load(path, allow_nonfinite=allow_nonfinite), None
    except (CaseError, OSError) as e:
        return None, f"cannot load case: {e}"


def _load(path, allow_nonfinite: bool = False):
    """The case at `path`, or None after saying (one line, no traceback) why it cannot be used."""
    case, why = _read(path, allow_nonfinite)
    if why:
        _err(why)
    return case


def _check_out(path: Path, kinds: dict) -> None:
    """An output path is usable: a known suffix, and a directory that exists or can be made."""
    if path.suffix.lower() not in kinds:
        raise BadInput(f"{path}: the suffix must be one of {', '.join(sorted(kinds))}")
    if path.is_dir():
        raise BadInput(f"{path}: is a directory; give a file name")
    parent = next(p for p in [path.parent, *path.parent.parents] if p.exists())
    try:  # the one sure test: make a file there (permissions, read-only mounts, /proc)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise BadInput(f"{path}: cannot write under {parent} ({e.strerror})")


# ---- progress --------------------------------------------------------------------------------------
class _Progress:
    """A tqdm bar on stderr over the steps of a long command (one per backend per case), shown only
    on a terminal. A thread redraws it every second so that the elapsed time moves while one slow
    step (SGLang's Triton under the CPU interpreter: tens of seconds) runs."""

    def __init__(self, total: int, what: str):
        import threading
        from tqdm import tqdm
        # no rate or ETA: the steps differ by orders of magnitude (torch 20 ms, Triton 30 s)
        self.bar = tqdm(total=total, desc=what, file=sys.stderr, leave=False, disable=None,
                        dynamic_ncols=True, bar_format="{desc} |{bar}| {n_fmt}/{total_fmt} [{elapsed}]")
        self._stop = threading.Event()
        self._running = False
        if not self.bar.disable:
            threading.Thread(target=self._tick, daemon=True).start()

    def _tick(self):
        while not self._stop.wait(1.0):
            self.bar.refresh()

    def step(self, what: str) -> None:
        """Step `what` starts; the one before it, if any, is done."""
        if self._running:
            self.bar.update(1)
        self._running = True
        self.bar.set_description_str(what)

    def done_up_to(self, n: int) -> None:
        """n steps are done (a case may end early: an oracle that cannot read it skips the rest)."""
        self.bar.update(n - self.bar.n)
        self._running = False

    def print(self, text: str) -> None:
        """Print to stdout without tearing the bar."""
        with self.bar.external_write_mode():
            print(text, flush=True)

    def close(self):
        self._stop.set()
        self.bar.close()


# ---- inspect -----------------------------------------------------------------------------------
def add_inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("cases", nargs="+", metavar="CASE", help="case files (.pt) and directories of them")
    p.add_argument("--allow-nonfinite", action="store_true",
                   help="load a capture that holds NaN/inf where the kernel reads, to see it and its lint "
                        "(replay refuses such a case: no answer is defined)")


def cmd_inspect(args) -> int:
    """Show what case files hold and lint them.

    Exit 1 if the lint finds errors, 2 if a file cannot be loaded as a case."""
    from . import lint, report
    rc = EXIT_OK
    for i, path in enumerate(case_files(args.cases)):
        if i:
            print()
        case = _load(path, args.allow_nonfinite)
        if case is None:
            rc = EXIT_BAD_INPUT
            continue
        print(report.describe_case(case, path))
        findings = lint.check(case)
        print()
        print(lint.format_findings(findings))
        if any(f.severity == "error" for f in findings):
            rc = max(rc, EXIT_PROBLEM)
    return rc


# ---- replay / report ---------------------------------------------------------------------------
def _add_replay_common(p: argparse.ArgumentParser) -> None:
    from .backends import BACKENDS
    p.add_argument("cases", nargs="+", metavar="CASE", help="case files (.pt) and directories of them")
    p.add_argument("--backends", type=_backend_names, default="oracle,torch",
                   help=f"comma list of {', '.join(BACKENDS)}, installed backends (entry points "
                        "kdkit.backends) and specs package.module:attr or path/to/file.py[:attr]; or 'all'")
    p.add_argument("--against", default="oracle", choices=list(BACKENDS),
                   help="the backend every backend is compared with")
    p.add_argument("--allow-skip", action="store_true",
                   help="exit 0 when a requested backend cannot run here and is skipped (by default a "
                        "skip exits 1: it was not tested)")
    p.add_argument("--force", action="store_true",
                   help="overwrite an existing report instead of writing NAME-YYYYmmdd-HHMMSS.html beside it")


def add_replay(p: argparse.ArgumentParser) -> None:
    _add_replay_common(p)
    p.add_argument("--report", metavar="PATH", type=Path,
                   help="also write a report, .html or .md (default: none)")


def print_replay(rep, out=print) -> None:
    """What a replay prints: the table (it opens with the case summary), the lint one-liner, the
    seed-style lines, and each skipped or failed backend with its one-line reason."""
    from . import report
    table = rep.table()
    lines = [table]
    findings = list(rep.lint or [])
    lint_err = getattr(rep, "lint_error", None)
    # the table may carry a lint line of its own; errors are named here in any case
    if "lint:" not in table or any(f.severity == "error" for f in findings):
        lines.append(f"lint: {lint_err}" if lint_err else report.lint_line(findings))
    lines += [f"ran {line}" for line in report.ran(rep)]
    lines += rep.seed_lines()
    lines += [f"{row.status} {row.backend}: {row.reason}" for row in report.rows_of(rep)
              if row.status in ("skipped", "error") and row.reason and row.reason not in table]
    out("\n".join(lines))


def _verdict(rep, allow_skip: bool) -> tuple[int, str]:
    """(exit code, why) for one replayed case: 1 if a backend failed or errored, the lint found
    errors, nothing was judged (nothing ran beside the reference: the report says FAIL too), or a
    backend was skipped and skips are not allowed."""
    from . import report
    rows = report.rows_of(rep)
    against = getattr(rep, "against", "oracle")
    ran = [r for r in rows if r.status in ("pass", "fail", "error") and r.backend != against]
    skipped = [r.backend for r in rows if r.status == "skipped"]
    bad = [r.backend for r in report.failed(rep)]
    lint_errors = sorted({f.code for f in (rep.lint or []) if f.severity == "error"})
    why = []
    if bad:
        why.append(f"{', '.join(bad)} failed")
    if lint_errors:
        why.append(f"lint errors ({', '.join(lint_errors)})")
    if not ran:
        why.append(f"nothing judged ({', '.join(skipped)} skipped)" if skipped
                   else f"nothing judged: no backend beside {against} was asked for")
    elif skipped and not allow_skip:
        why.append(f"{', '.join(skipped)} skipped, so not tested (--allow-skip accepts that)")
    return (EXIT_PROBLEM if why else EXIT_OK), "; ".join(why)


@dataclass
class _Replayed:
    """What replaying a list of case files gave: one entry per replayed case, and the rest."""
    reports: list = field(default_factory=list)
    sources: list = field(default_factory=list)
    cases: list = field(default_factory=list)
    stopped: list = field(default_factory=list)  # (file, why) for cases that could not be replayed
    rc: int = EXIT_OK


def _usable_cases(paths) -> list[Path]:
    """The case files named by `paths`, each loaded once: BadInput before any work if one is not a case."""
    files = case_files(paths)
    bad = [why for why in (_read(f)[1] for f in files) if why]
    if len(bad) == 1:
        raise BadInput(bad[0] + ("; nothing was run" if len(files) > 1 else ""))
    if bad:
        for why in bad:
            _err(why)
        raise BadInput(f"{len(bad)} of {len(files)} files cannot be used as cases; nothing was run")
    return files


def _against_runs(args) -> bool:
    """Can --against run here? If not, says why: nothing can be judged, so nothing is run."""
    from . import backends
    why = backends.unavailable(args.against) if args.against != "oracle" else None
    if why:
        _err(f"--against {args.against} cannot run here: {why}")
    return not why


def _replay_all(args, files: list[Path]) -> _Replayed:
    """Replay case after case (the inputs are checked already), printing each as it is done."""
    from . import backends, lint, replay, report
    if not _against_runs(args):
        return _Replayed(rc=EXIT_PROBLEM)
    names = args.backends
    steps = len(dict.fromkeys(["oracle", *names, args.against]))  # replay runs the oracle once
    done = _Replayed()
    bar = _Progress(len(files) * steps, "replay")
    try:
        for i, path in enumerate(files):
            if i:
                bar.print("")
            case = _load(path)
            label = f"{case.label} ({i + 1}/{len(files)})" if len(files) > 1 else case.label
            try:
                rep = replay.replay(case, names, against=args.against,
                                    progress=lambda name: bar.step(f"{label}: {name}"))
            except backends.BackendUnavailable as e:  # --against cannot run this case
                _err(f"{path}: {e}")
                done.stopped.append((str(path), str(e)))
                done.rc = max(done.rc, EXIT_PROBLEM)
                continue
            except Exception as e:  # the reference itself cannot run this case: say why, name the bug
                why = f"replay stopped: {type(e).__name__}: {e}"
                lint_errors = report.lint_line(lint.errors(case))
                bar.print(f"== {case.summary()}\n{lint_errors}")
                _err(f"{path}: {why}")
                done.stopped.append((str(path), f"{why} ({lint_errors})"))
                done.rc = max(done.rc, EXIT_PROBLEM)
                continue
            finally:
                bar.done_up_to(steps * (i + 1))
            print_replay(rep, bar.print)
            rc, why = _verdict(rep, args.allow_skip)
            if rc:
                _err(f"{path}: {why}")
            done.rc = max(done.rc, rc)
            done.reports.append(rep)
            done.sources.append(str(path))
            done.cases.append(case)
    finally:
        bar.close()
    return done


def _write(done: _Replayed, out: Path, force: bool) -> int:
    from . import report
    if not done.reports and not done.stopped:
        _err("nothing was replayed: no report written")
        return EXIT_PROBLEM
    try:
        written = report.write_report(done.reports, out, force=force, sources=done.sources,
                                      cases=done.cases, stopped=done.stopped)
    except OSError as e:
        raise BadInput(f"report not written: {e}")
    note = "" if Path(written) == Path(out) else f" ({out} exists; --force replaces it)"
    print(f"report: {written}{note}")
    return EXIT_OK


def cmd_replay(args) -> int:
    """Replay case files through backends and compare each with --against.

    Exit 1 if a backend fails or errors, the lint finds errors, or a requested backend was skipped
    (unless --allow-skip)."""
    from .report import FORMATS
    if args.report:
        _check_out(args.report, FORMATS)
    done = _replay_all(args, _usable_cases(args.cases))
    if args.report:
        return max(done.rc, _write(done, args.report, args.force))
    return done.rc


def add_report(p: argparse.ArgumentParser) -> None:
    _add_replay_common(p)
    p.add_argument("-o", "--out", metavar="PATH", type=Path,
                   help="a directory: one self-contained HTML page per case and index.html (pass/fail "
                        "per case); or one report file, .html or .md (default: reports/<first case's "
                        "id>.html)")


def cmd_report(args) -> int:
    """Replay case files and write self-contained reports (HTML pages and an index, or one file).

    -o DIR writes one HTML page per case and index.html; -o NAME.html or NAME.md one file.
    Exit codes as replay; nothing is written when an input cannot be used."""
    from .report import FORMATS, is_report_dir, page_stem, write_report_dir
    files = _usable_cases(args.cases)
    out = args.out or Path("reports") / f"{page_stem(_load(files[0]).case_id)}.html"
    if not is_report_dir(out):
        _check_out(out, FORMATS)
        done = _replay_all(args, files)
        return max(done.rc, _write(done, out, args.force))
    if not _against_runs(args):  # before the directory is made: nothing will go in it
        return EXIT_PROBLEM
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):  # writable: found before the replay, not after it
            pass
    except OSError as e:
        raise BadInput(f"{out}: cannot write the report directory ({e.strerror})")
    done = _replay_all(args, files)
    if not done.reports and not done.stopped:
        _err("nothing was replayed: no reports written")
        return EXIT_PROBLEM
    try:
        index = write_report_dir(done.reports, out, sources=done.sources, cases=done.cases, stopped=done.stopped,
                                 force=args.force, backends=",".join(args.backends), against=args.against)
    except OSError as e:
        raise BadInput(f"{out}: reports not written ({e})")
    print(f"reports: {index} ({len(done.reports)} case pages, {len(done.stopped)} not replayed)")
    if index.name != "index.html":
        print(f"note: {index.parent / 'index.html'} and the pages already there are kept; this run's files have "
              "timestamped names (--force replaces them)")
    return done.rc


# ---- synth -------------------------------------------------------------------------------------
def add_synth(p: argparse.ArgumentParser) -> None:
    from .constants import LAYOUTS
    from .synth import KIMI_HEADS_PER_RANK, KIMI_SM_SCALE, TREES
    p.add_argument("--out", required=True, metavar="PATH", type=Path, help="case file to write (.pt)")
    # bounded before the memory estimate, which lists every request (no batch comes near 2^20)
    p.add_argument("--bs", type=_number(int, 1, 1 << 20), default=None,
                   help="requests in the batch (default: the length of a --prefix/--q-len list, else 1)")
    p.add_argument("--prefix", type=_int_list(0), default="21",
                   help="committed prefix length, one for all requests or a comma list, one per request")
    p.add_argument("--q-len", type=_int_list(1), default="9",
                   help="draft tokens per request (1 + tree budget), one or a comma list")
    p.add_argument("--heads", type=_number(int, 1), default=KIMI_HEADS_PER_RANK,
                   help="query heads on this rank (Kimi K2.6: 64 heads / TP8)")
    p.add_argument("--tree", choices=TREES, default="ddtree", help="draft tree shape (causal: no custom mask)")
    # torch's generators take a 64-bit seed
    p.add_argument("--seed", type=_number(int, 0, 2**64 - 1), default=0, help="random seed of the tree and the tensors")
    p.add_argument("--layout", choices=LAYOUTS, default="sglang",
                   help="sglang: indices cover the prefix, draft from k/v; unified: prefix + draft slots in the pool")
    # a generous bound (8..30 is the stress range): far past it q overflows bf16 and the case is refused when loaded
    p.add_argument("--magnitude", type=_number(float, 0, 1e6, lo_open=True), default=1.0,
                   help="scale of q; 8..30 stresses the online softmax")
    p.add_argument("--logit-cap", type=_number(float, 0), default=0.0, help="soft cap of the logits, 0 for none")
    p.add_argument("--sm-scale", type=_number(float, 0, lo_open=True), default=KIMI_SM_SCALE,
                   help=f"softmax scale (default: Kimi K2.6's, {KIMI_SM_SCALE:.6f})")
    p.add_argument("--case-id", default=None, help="case id (default: built from the parameters)")
    p.add_argument("--force", action="store_true", help="replace an existing file")


def _per_request(vals: list[int], bs: int, flag: str):
    if len(vals) == 1:
        return vals[0]
    if len(vals) != bs:
        raise BadInput(f"{flag} has {len(vals)} values for --bs {bs}: give one value or one per request")
    return vals


def cmd_synth(args) -> int:
    """Write a synthetic case with the shapes of Kimi K2.6 tree verify.

    Exit 1 if the file exists (--force replaces it)."""
    from .case import CaseError
    from .synth import make_case, memory_limit_bytes, peak_bytes
    out = args.out
    _check_out(out, {".pt": "case"})
    lists = [len(v) for v in (args.prefix, args.q_len) if len(v) > 1]
    if args.bs is None and len(set(lists)) > 1:
        raise BadInput(f"--prefix has {len(args.prefix)} values and --q-len {len(args.q_len)}: "
                       "give one value or one per request")
    bs = args.bs if args.bs is not None else (lists[0] if lists else 1)
    prefix, q_len = _per_request(args.prefix, bs, "--prefix"), _per_request(args.q_len, bs, "--q-len")
    need = peak_bytes([prefix] * bs if isinstance(prefix, int) else prefix,
                      [q_len] * bs if isinstance(q_len, int) else q_len, args.heads)
    if need > memory_limit_bytes():
        raise BadInput(f"--bs {bs} --prefix {','.join(map(str, args.prefix))} --q-len {','.join(map(str, args.q_len))} "
                       f"--heads {args.heads}: building it takes about {need / 2**30:.0f} GiB, more than the "
                       f"{memory_limit_bytes() / 2**30:.0f} GiB this machine can give it; "
                       "choose a smaller prefix, q_len or batch")
    if out.exists() and not args.force:
        _err(f"{out} exists; pass --force to replace it")
        return EXIT_PROBLEM
    try:
        case = make_case(bs=bs, prefix=prefix, q_len=q_len, heads=args.heads, tree=args.tree,
                         seed=args.seed, layout=args.layout, sm_scale=args.sm_scale,
                         logit_cap=args.logit_cap, magnitude=args.magnitude, case_id=args.case_id)
        written = case.save(out, overwrite=args.force)
    except FileExistsError as e:
        _err(str(e))
        return EXIT_PROBLEM
    except (ValueError, CaseError) as e:  # what the case file itself refuses (e.g. > 1024 heads)
        raise BadInput(f"synth: {e}")
    print(case.summary())
    print(f"wrote {written} ({os.path.getsize(written)} bytes)")
    return EXIT_OK


# ---- compile -----------------------------------------------------------------------------------
def kernel_archs() -> dict:
    """The archs kdkit's kernel builds for: from the oldest its spec lists (mma.sync, ldmatrix and
    cp.async need sm_80), and among those this NVRTC targets ("nvrtc": None when it is not installed)."""
    from .kernel.spec import MIN_ARCH
    try:
        from cuda.bindings import nvrtc
        known = list(nvrtc.nvrtcGetSupportedArchs()[1])
    except ImportError:
        known = None
    return {"min": MIN_ARCH, "nvrtc": known}


def _check_arch(arch: str, archs: dict) -> None:
    m = re.fullmatch(r"sm_([1-9]\d*)([af]?)", arch)
    if not m:
        raise BadInput(f"--arch {arch!r}: expected sm_XX, e.g. sm_120 or sm_90a")
    n, suffix, known = int(m.group(1)), m.group(2), archs["nvrtc"]
    if n < archs["min"]:
        raise BadInput(f"--arch {arch}: the kernel needs sm_{archs['min']} or newer")
    # architecture-specific targets exist from Hopper on (sm_90a), family targets from Blackwell
    # (sm_100f); NVRTC refuses the others with a multi-line error
    if (suffix == "a" and n < 90) or (suffix == "f" and n < 100):
        raise BadInput(f"--arch {arch}: there is no '{suffix}' variant of sm_{n} ('a' from sm_90a, 'f' "
                       f"from sm_100f); use sm_{n}")
    if known is not None and n not in known:
        ok = [f"sm_{a}" for a in known if a >= archs["min"]]
        raise BadInput(f"--arch {arch}: this NVRTC builds the kernel for {', '.join(ok)}")


def add_compile(p: argparse.ArgumentParser) -> None:
    from .kernel.mutants import MUTANTS
    from .kernel.spec import NT_CHOICES
    p.add_argument("--arch", default="sm_120",
                   help="comma list of targets, e.g. sm_120,sm_90: any sm_XX from sm_80 that NVRTC builds")
    p.add_argument("--rows", type=_number(int), default=None, choices=[8 * n for n in NT_CHOICES],
                   help="query (token, head) rows per block (8 x KD_NT); default: every block size the "
                        f"planner may choose ({', '.join(str(8 * n) for n in NT_CHOICES)})")
    p.add_argument("--mutant", default=None, choices=sorted(MUTANTS),
                   help="a deliberately wrong build (negative control) instead of the kernel (default: none)")
    p.add_argument("--sass", default=None, metavar="DIR",
                   help="also write each build's SASS to DIR/<build key>.sass (nvdisasm: the compile extra's "
                        "nvidia-cuda-nvdisasm) and print its instruction counts per kernel (default: none)")


def cmd_compile(args) -> int:
    """Compile kdkit's kernel for GPU archs without a GPU and print its resource use per kernel.

    Registers, shared memory, stack, spills, local memory; exit 1 if a build breaches sm_120's
    limits (99 KB of shared memory, no spills, no wgmma/TMA) or fails. With --sass, each build's
    SASS too (a build's key names its source and options, so a file of that name holds the same
    code and is left as it is)."""
    from .kernel import jit
    from .kernel.spec import GATHER_MAX_NT, NT_CHOICES, KernelConfig, compile_report
    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    if not archs:
        raise BadInput("--arch: give at least one sm_XX")
    limits = kernel_archs()
    for arch in archs:
        _check_arch(arch, limits)
    if limits["nvrtc"] is None:
        _err("NVRTC is not installed: `pip install cuda-bindings nvidia-cuda-nvrtc` (kdkit's 'compile' extra)")
        return EXIT_PROBLEM
    if args.sass is not None:
        from .kernel import sass
        try:
            sass.nvdisasm_path()  # before any build: a missing disassembler is one line, not one per build
        except jit.BuildError as e:
            _err(f"--sass: {e}")
            return EXIT_PROBLEM
        if Path(args.sass).exists() and not Path(args.sass).is_dir():
            raise BadInput(f"--sass {args.sass}: not a folder; give a folder for the .sass files")
        try:  # made here, before any build, so a folder that cannot be written is one line up front
            Path(args.sass).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BadInput(f"--sass {args.sass}: cannot make the folder ({e.strerror}); give a folder you can write")
        if not os.access(args.sass, os.W_OK | os.X_OK):
            raise BadInput(f"--sass {args.sass}: the folder is not writable; give a folder you can write")
    # every block size the planner may choose (schedule.choose picks by shape: q_len 9 x H 8 =
    # 72 rows takes 40 rows per block at long KV, the build nearest sm_120's shared-memory limit,
    # and 8 at short KV), or the one --rows names; each without and with the step skip
    # (schedule.choose_skip: deep trees at a short prefix), which adds its table
    nts = [args.rows // 8] if args.rows else list(NT_CHOICES)
    worst = EXIT_OK
    for arch in archs:
        for nt in nts:
            for skip in (False, True, "gather") if nt <= GATHER_MAX_NT else (False, True):
                try:
                    rep = compile_report(arch, KernelConfig(nt=nt, mutant=args.mutant, skip=skip))
                except jit.BuildError as e:
                    _err(str(e))
                    worst = EXIT_PROBLEM
                    continue
                what = {False: "", True: ", step skip (KD_SKIP=1)", "gather": ", column gather (KD_SKIP=2)"}[skip]
                print(f"{arch}, {8 * nt} rows per block (KD_NT={nt}){what}:")
                print(rep.table())
                if rep.breaches():
                    worst = EXIT_PROBLEM
                if args.sass is not None:
                    worst = max(worst, _write_sass(Path(args.sass), arch, KernelConfig(nt=nt, mutant=args.mutant, skip=skip)))
    return worst


def _write_sass(folder: Path, arch: str, config) -> int:
    from .files import publish
    from .kernel import jit, sass
    from .kernel.spec import build
    try:
        mod = build(config, arch)  # (built just now: from the cache)
        text = sass.disassemble(mod)
    except jit.BuildError as e:
        _err(str(e))
        return EXIT_PROBLEM
    path = publish(folder / f"{mod.key}.sass", text, exist_ok=True)
    for name, counts in sass.opcode_counts(text).items():
        print(f"  SASS {name}: {sass.summary(counts)}")
    print(f"  SASS in {path}")
    return EXIT_OK


def add_bench(p: argparse.ArgumentParser) -> None:
    from .bench import add_arguments
    add_arguments(p)


def cmd_bench(args) -> int:
    """Benchmark kdkit's kernel beside SGLang's Triton kernels and torch on this GPU, against the
    measured roofline; write benchmarks/results/<gpu>-<date>.json and print the summary table."""
    from .bench import main as bench_main
    return bench_main(args)


# ---- the table of subcommands --------------------------------------------------------------------
# (name, add_arguments, handler); the first paragraph of the handler's docstring is its help
COMMANDS: list[tuple] = [
    ("inspect", add_inspect, cmd_inspect),
    ("replay", add_replay, cmd_replay),
    ("report", add_report, cmd_report),
    ("synth", add_synth, cmd_synth),
    ("compile", add_compile, cmd_compile),
    ("bench", add_bench, cmd_bench),
    ("capture", _capture_cli.add_arguments, _capture_cli.run),
]


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument said in one line (no usage block), exit 2."""

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (`{self.prog} --help` lists the options)\n")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless it is required or its help says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.required or "default" in text or action.default in (None, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


def summary(handler) -> str:
    """A handler's one-line help: the first paragraph of its docstring, on one line."""
    return " ".join((handler.__doc__ or "").strip().split("\n\n")[0].split())


def build_parser(only: str | None = "*") -> argparse.ArgumentParser:
    """The parser; `only` names the one subcommand whose options are declared ("*": all of them,
    None: none): declaring them imports what their defaults come from (torch, for synth)."""
    from . import __version__
    parser = _Parser(prog="kdkit", formatter_class=_Help,
                     description="Capture, replay and validate the MLA tree-verify attention kernel: case "
                                 "files, backends, the float64 oracle, the lint, reports, kernel builds.",
                     epilog="Exit codes: 0 all the requested work ran and passed; 1 a verdict failed or "
                            "something requested did not run here (a skipped backend, unless --allow-skip); "
                            "2 bad input, said in one line before any work is done.")
    parser.add_argument("--version", action="version", version=f"kdkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, add_arguments, handler in COMMANDS:
        doc = (handler.__doc__ or "").strip()
        p = sub.add_parser(name, help=summary(handler), description=doc, formatter_class=_Help)
        if only in ("*", name):
            add_arguments(p)
        p.set_defaults(_handler=handler)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    try:
        return int(args._handler(args) or 0)
    except BadInput as e:
        _err(str(e))
        return EXIT_BAD_INPUT
    except ValueError as e:  # a backend spec that does not resolve, met after the arguments were read
        from .backends import BackendSpecError
        if not isinstance(e, BackendSpecError):
            raise
        _err(str(e))
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `kdkit inspect x.pt | head`
        return EXIT_OK
    except OSError as e:  # a path the system refuses to look at (a name too long, no permission)
        where = f"{e.filename}: " if e.filename else ""
        _err(f"{where}{e.strerror or e}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's usual status (a report half-written is a temp file)
        _err("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
