"""The `kdkit` command line.

Every subcommand is a module here with add_arguments(parser), which declares its options, and
run(args) -> exit code, which does the work; the first paragraph of run's docstring is its
one-line help. COMMANDS lists them in the order `kdkit --help` shows. To add a subcommand, write
its module and add it to COMMANDS.

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
import sys

from . import bench, capture, export, inspect, new_kernel, replay, report, synth
from . import compile as compile_
from .common import EXIT_BAD_INPUT, EXIT_OK, BadInput, err

# ---- the table of subcommands --------------------------------------------------------------------
# (name, add_arguments, handler); the first paragraph of the handler's docstring is its help
COMMANDS: list[tuple] = [(name, mod.add_arguments, mod.run) for name, mod in (
    ("inspect", inspect), ("replay", replay), ("report", report), ("synth", synth), ("compile", compile_),
    ("bench", bench), ("capture", capture), ("new-kernel", new_kernel), ("export", export))]


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
    from .. import __version__
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
        err(str(e))
        return EXIT_BAD_INPUT
    except ValueError as e:  # a backend spec that does not resolve, met after the arguments were read
        from ..backends import BackendSpecError
        if not isinstance(e, BackendSpecError):
            raise
        err(str(e))
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `kdkit inspect x.pt | head`
        return EXIT_OK
    except OSError as e:  # a path the system refuses to look at (a name too long, no permission)
        where = f"{e.filename}: " if e.filename else ""
        err(f"{where}{e.strerror or e}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's usual status (a report half-written is a temp file)
        err("interrupted")
        return 130

