"""What every command shares: the exit codes, BadInput (exit 2, one line), the argument types
that refuse a bad value at parse time, and reading the case files a command is given."""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

EXIT_OK, EXIT_PROBLEM, EXIT_BAD_INPUT = 0, 1, 2


class BadInput(Exception):
    """An argument or input file that cannot be used: main() prints it as one line, exit 2."""


def err(msg: str) -> None:
    print(f"kdkit: {msg}", file=sys.stderr)


# ---- argument types: each refuses a bad value at parse time, naming it -------------------------
def number(kind, lo=None, hi=None, lo_open=False):
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


def int_list(lo: int):
    """An argparse type: one integer >= lo, or a comma list of them (one per request)."""
    one = number(int, lo)

    def parse(text: str) -> list[int]:
        vals = [one(x.strip()) for x in str(text).split(",") if x.strip()]
        if not vals:
            raise argparse.ArgumentTypeError(f"{text!r}: want an integer or a comma list like 21,300,8192")
        return vals
    parse.__name__ = "integer list"
    return parse


def backend_names(spec: str) -> list[str]:
    """'all' -> every registered backend (the unavailable ones are skipped, with their reason)."""
    from ..backends import resolve
    try:
        return resolve(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# ---- input files --------------------------------------------------------------------------------
def case_files(paths) -> list[Path]:
    """The case files named by `paths` (kdkit.case.case_files): BadInput for a path that is not
    there, a directory this user cannot read or one that holds no case file."""
    from ..case import NoCaseFiles
    from ..case import case_files as find
    try:
        return find(paths)
    except NoCaseFiles as e:
        raise BadInput(str(e)) from None


def read_case(path, allow_nonfinite: bool = False):
    """(case, None), or (None, why) in one line for a file that cannot be used as a case."""
    from ..case import CaseError, load
    try:
        return load(path, allow_nonfinite=allow_nonfinite), None
    except (CaseError, OSError) as e:
        return None, f"cannot load case: {e}"


def load_case(path, allow_nonfinite: bool = False):
    """The case at `path`, or None after saying (one line, no traceback) why it cannot be used."""
    case, why = read_case(path, allow_nonfinite)
    if why:
        err(why)
    return case


def make_folder(folder: Path) -> None:
    """A missing output folder is made, and said so on stderr: a mistyped path would otherwise grow
    a tree of folders unseen (as root, at /). Every command's output path comes through here."""
    if folder.is_dir():
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"{folder}: cannot create the folder ({e.strerror})")
    err(f"created {folder}")


def check_out(path: Path, kinds: dict | None = None) -> None:
    """An output path is usable: a known suffix (any when kinds is None), not a directory, and a
    folder that takes a new file (made now, said so, when missing)."""
    if kinds is not None and path.suffix.lower() not in kinds:
        raise BadInput(f"{path}: the suffix must be one of {', '.join(sorted(kinds))}")
    if path.is_dir():
        raise BadInput(f"{path}: is a directory; give a file name")
    parent = next(p for p in [path.parent, *path.parent.parents] if p.exists())
    try:  # the one sure test: make a file there (permissions, read-only mounts, /proc)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise BadInput(f"{path}: cannot write under {parent} ({e.strerror})")
    make_folder(path.parent)
