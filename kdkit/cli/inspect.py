"""`kdkit inspect`: what case files hold, and their lint."""
from __future__ import annotations

import argparse

from .common import EXIT_BAD_INPUT, EXIT_OK, EXIT_PROBLEM, case_files, load_case


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("cases", nargs="+", metavar="CASE", help="case files (.pt) and directories of them")
    p.add_argument("--allow-nonfinite", action="store_true",
                   help="load a capture that holds NaN/inf where the kernel reads, to see it and its lint "
                        "(replay refuses such a case: no answer is defined)")


def run(args) -> int:
    """Show what case files hold and lint them.

    Exit 1 if the lint finds errors, 2 if a file cannot be loaded as a case."""
    from .. import lint, report
    rc = EXIT_OK
    files = case_files(args.cases)
    refused, unloadable = [], []
    for i, path in enumerate(files):
        if i:
            print()
        case = load_case(path, args.allow_nonfinite)
        if case is None:
            rc = EXIT_BAD_INPUT
            unloadable.append(path.stem)
            continue
        print(report.describe_case(case, path))
        findings = lint.check(case)
        print()
        print(lint.format_findings(findings))
        if any(f.severity == "error" for f in findings):
            rc = max(rc, EXIT_PROBLEM)
            refused.append(case.case_id)
    if len(files) > 1:  # many cases: the last line says how they fared
        clean = len(files) - len(refused) - len(unloadable)
        print(f"\n{clean} of {len(files)} cases lint clean"
              + (f"; lint errors: {', '.join(refused)}" if refused else "")
              + (f"; not loaded: {', '.join(unloadable)}" if unloadable else ""))
    return rc
