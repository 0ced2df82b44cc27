"""`kdkit replay`: case files through backends, each compared with --against; and the replay
loop `kdkit report` shares (the progress bar, the verdict, the inputs checked before any work)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .common import (EXIT_OK, EXIT_PROBLEM, BadInput, backend_names, case_files, check_out, err, load_case,
                     read_case)


class Progress:
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


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    from ..backends import BACKENDS
    p.add_argument("cases", nargs="+", metavar="CASE", help="case files (.pt) and directories of them")
    p.add_argument("--backends", type=backend_names, default="oracle,torch",
                   help=f"comma list of {', '.join(BACKENDS)}, installed backends (entry points "
                        "kdkit.backends) and specs package.module:attr or path/to/file.py[:attr]; or 'all'")
    p.add_argument("--against", default="oracle", choices=list(BACKENDS),
                   help="the backend every backend is compared with")
    p.add_argument("--allow-skip", action="store_true",
                   help="exit 0 when a requested backend cannot run here and is skipped (by default a "
                        "skip exits 1: it was not tested)")
    p.add_argument("--force", action="store_true",
                   help="overwrite an existing report instead of writing NAME-YYYYmmdd-HHMMSS.html beside it")
    # CI dashboards' formats; each run's, so replaced on every run
    p.add_argument("--junit", metavar="PATH", type=Path,
                   help="also write a JUnit XML file: one test case per (case, backend), the verdict line as "
                        "a failure's text (replaced on each run; default: none)")
    p.add_argument("--json", metavar="PATH", type=Path,
                   help="also write the verdicts as JSON: the summary, per case, per (case, backend) "
                        "(replaced on each run; default: none)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("--report", metavar="PATH", type=Path,
                   help="also write a report, .html or .md (default: none)")


def print_replay(rep, out=print) -> None:
    """What a replay prints: the table (it opens with the case summary), the lint one-liner, the
    seed-style lines, and each skipped or failed backend with its one-line reason."""
    from .. import report
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


def verdict(rep, allow_skip: bool) -> tuple[int, str]:
    """(exit code, why) for one replayed case: 1 if a backend failed or errored, the lint found
    errors, nothing was judged (nothing ran beside the reference: the report says FAIL too), or a
    backend was skipped and skips are not allowed."""
    from .. import report
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
class Replayed:
    """What replaying a list of case files gave: one entry per replayed case, and the rest."""
    reports: list = field(default_factory=list)
    sources: list = field(default_factory=list)
    cases: list = field(default_factory=list)
    stopped: list = field(default_factory=list)  # (file, why) for cases that could not be replayed
    rc: int = EXIT_OK


def usable_cases(paths) -> list[Path]:
    """The case files named by `paths`, each loaded once: BadInput before any work if one is not a case."""
    files = case_files(paths)
    bad = [why for why in (read_case(f)[1] for f in files) if why]
    if len(bad) == 1:
        raise BadInput(bad[0] + ("; nothing was run" if len(files) > 1 else ""))
    if bad:
        for why in bad:
            err(why)
        raise BadInput(f"{len(bad)} of {len(files)} files cannot be used as cases; nothing was run")
    return files


def against_runs(args) -> bool:
    """Can --against run here? If not, says why: nothing can be judged, so nothing is run."""
    from .. import backends
    why = backends.unavailable(args.against) if args.against != "oracle" else None
    if why:
        err(f"--against {args.against} cannot run here: {why}")
    return not why


def replay_all(args, files: list[Path]) -> Replayed:
    """Replay case after case (the inputs are checked already), printing each as it is done."""
    from .. import backends, lint, replay, report
    if not against_runs(args):
        return Replayed(rc=EXIT_PROBLEM)
    names = args.backends
    steps = len(dict.fromkeys(["oracle", *names, args.against]))  # replay runs the oracle once
    done = Replayed()
    bar = Progress(len(files) * steps, "replay")
    try:
        for i, path in enumerate(files):
            if i:
                bar.print("")
            case = load_case(path)
            label = f"{case.label} ({i + 1}/{len(files)})" if len(files) > 1 else case.label
            try:
                rep = replay.replay(case, names, against=args.against,
                                    progress=lambda name: bar.step(f"{label}: {name}"))
            except backends.BackendUnavailable as e:  # --against cannot run this case
                err(f"{path}: {e}")
                done.stopped.append((str(path), str(e)))
                done.rc = max(done.rc, EXIT_PROBLEM)
                continue
            except Exception as e:  # the reference itself cannot run this case: say why, name the bug
                why = f"replay stopped: {type(e).__name__}: {e}"
                lint_errors = report.lint_line(lint.errors(case))
                bar.print(f"== {case.summary()}\n{lint_errors}")
                err(f"{path}: {why}")
                done.stopped.append((str(path), f"{why} ({lint_errors})"))
                done.rc = max(done.rc, EXIT_PROBLEM)
                continue
            finally:
                bar.done_up_to(steps * (i + 1))
            print_replay(rep, bar.print)
            rc, why = verdict(rep, args.allow_skip)
            if rc:
                err(f"{path}: {why}")
            done.rc = max(done.rc, rc)
            done.reports.append(rep)
            done.sources.append(str(path))
            done.cases.append(case)
    finally:
        bar.close()
    if done.reports:  # what the table's columns mean, once after every case's table
        print("\n" + report.table_legend(done.reports[-1]))
    return done


def check_result_files(args) -> None:
    """--junit / --json name files, not folders: BadInput before any work."""
    for flag, path in (("--junit", args.junit), ("--json", args.json)):
        if path is not None and path.is_dir():
            raise BadInput(f"{flag} {path}: a directory; give a file name (e.g. {path / ('kdkit.' + flag[2:])})")
        if path is not None:
            check_out(path)


def finish(done: Replayed, args) -> None:
    """After every case: the result files CI reads, then the summary as the output's last line."""
    from .. import verdicts
    if not done.reports and not done.stopped:  # nothing was replayed (--against cannot run): said already
        return
    for flag, path, write in (("junit", args.junit, verdicts.write_junit), ("json", args.json, verdicts.write_json)):
        if path is not None:
            try:
                print(f"{flag}: {write(path, done.reports, done.sources, done.stopped)}")
            except OSError as e:
                raise BadInput(f"{path}: not written ({e})")
    print(verdicts.summary_line(done.reports, done.stopped))


def write_one(done: Replayed, out: Path, force: bool) -> int:
    from .. import report
    if not done.reports and not done.stopped:
        err("nothing was replayed: no report written")
        return EXIT_PROBLEM
    try:
        written = report.write_report(done.reports, out, force=force, sources=done.sources,
                                      cases=done.cases, stopped=done.stopped)
    except OSError as e:
        raise BadInput(f"report not written: {e}")
    note = "" if Path(written) == Path(out) else f" ({out} exists; --force replaces it)"
    print(f"report: {written}{note}")
    return EXIT_OK


def run(args) -> int:
    """Replay case files through backends and compare each with --against.

    Exit 1 if a backend fails or errors, the lint finds errors, or a requested backend was skipped
    (unless --allow-skip)."""
    from ..report import FORMATS
    files = usable_cases(args.cases)  # first: a refused input leaves no output folder made
    if args.report:
        check_out(args.report, FORMATS)
    check_result_files(args)
    done = replay_all(args, files)
    rc = done.rc
    if args.report:
        rc = max(rc, write_one(done, args.report, args.force))
    finish(done, args)
    return rc
