"""`kdkit report`: replay case files and write self-contained reports."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from .common import EXIT_PROBLEM, BadInput, check_out, err, load_case, make_folder
from .replay import (add_common_arguments, against_runs, check_result_files, finish, replay_all, usable_cases,
                     write_one)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("-o", "--out", metavar="PATH", type=Path,
                   help="a directory: one self-contained HTML page per case and index.html (pass/fail "
                        "per case); or one report file, .html or .md (default: reports/<first case's "
                        "id>.html)")


def run(args) -> int:
    """Replay case files and write self-contained reports (HTML pages and an index, or one file).

    -o DIR writes one HTML page per case and index.html; -o NAME.html or NAME.md one file.
    Exit codes as replay; nothing is written when an input cannot be used."""
    from ..report import FORMATS, is_report_dir, page_stem, write_report_dir
    files = usable_cases(args.cases)
    check_result_files(args)
    out = args.out or Path("reports") / f"{page_stem(load_case(files[0]).case_id)}.html"
    if not is_report_dir(out):
        check_out(out, FORMATS)
        done = replay_all(args, files)
        rc = max(done.rc, write_one(done, out, args.force))
        finish(done, args)
        return rc
    if not against_runs(args):  # before the directory is made: nothing will go in it
        return EXIT_PROBLEM
    try:
        make_folder(out)
        with tempfile.TemporaryFile(dir=out):  # writable: found before the replay, not after it
            pass
    except OSError as e:
        raise BadInput(f"{out}: cannot write the report directory ({e.strerror})")
    done = replay_all(args, files)
    if not done.reports and not done.stopped:
        err("nothing was replayed: no reports written")
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
    finish(done, args)
    return done.rc
