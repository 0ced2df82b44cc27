"""`kdkit capture env` and `kdkit capture sitecustomize DIR`: the SGLang hook's settings and launch
flags, and its installation where SGLang has no plugin system (kdkit.capture). Imports neither
torch nor SGLang."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from ..capture import sglang_api
from ..capture.settings import MODES, SettingsError, from_env
from .common import EXIT_BAD_INPUT, EXIT_OK, EXIT_PROBLEM


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="capture_command", metavar="ACTION", required=True)
    env = sub.add_parser("env", help="the KDKIT_* settings in force and the launch flags the mode needs",
                         description=cmd_env.__doc__)
    env.add_argument("--mode", choices=MODES, default=None,
                     help="show the flags for this mode (default: KDKIT_MODE from the environment)")
    env.set_defaults(_capture=cmd_env)
    sc = sub.add_parser("sitecustomize", help="write DIR/sitecustomize.py (SGLang without the plugin system)",
                        description=cmd_sitecustomize.__doc__)
    sc.add_argument("dir", metavar="DIR", help="folder to write sitecustomize.py into (created if missing)")
    sc.add_argument("--force", action="store_true", help="replace an existing DIR/sitecustomize.py")
    sc.set_defaults(_capture=cmd_sitecustomize)


def run(args) -> int:
    """Hook a live SGLang server: `env` shows the settings and launch flags, `sitecustomize DIR`
    installs the hook where SGLang has no plugin system."""
    return args._capture(args)


def _err(msg: str) -> None:
    print(f"kdkit: {msg}", file=sys.stderr)


def launch_lines(mode: str | None, release: str | None, settings: list[tuple[str, str]] = ()) -> list[str]:
    """The launch command for `mode`, with the flags it needs and why; `settings`: the other
    KDKIT_* (name, value) pairs it must carry (Settings.assignments()), shell-quoted here."""
    if mode is None:
        return ["# KDKIT_MODE is unset: the plugin is installed but passes every call through.",
                "# Set KDKIT_MODE=capture|validate|replace (or pass --mode) to see the launch flags."]
    rel = release or f"not installed here; flags of {sglang_api.NEWEST}"
    flags = ["--attention-backend", "triton"]
    lines = [f"# SGLang: {rel}"]
    if mode in ("capture", "validate"):
        flag = sglang_api.no_graph_flag(release)
        flags.append(flag)
        lines.append(f"# {flag}: with CUDA graphs on, SGLang calls forward_extend only while it "
                     "captures them (on dummy data) and replays them without Python: "
                     f"{mode} would see no real call")
    else:
        lines.append("# replace keeps CUDA graphs on: kdkit's kernel is captured into them")
    lines.append("# --attention-backend triton: kdkit hooks TritonAttnBackend.forward_extend")
    if not sglang_api.has_plugin_system(release):
        lines.append(f"# SGLang {release} has no plugin system (it came in {sglang_api.OLDEST}): "
                     "run `kdkit capture sitecustomize DIR` and put DIR on PYTHONPATH")
    env = "".join(f" {name}={shlex.quote(value)}" for name, value in settings)
    lines.append(f"SGLANG_PLUGINS=kdkit KDKIT_MODE={mode}{env} python -m sglang.launch_server "
                 f"--model-path MODEL <your flags> {' '.join(flags)}")
    return lines


def cmd_env(args) -> int:
    """Print the KDKIT_* settings in force (read from this environment exactly as the plugin will
    read them in every SGLang process) and the sglang.launch_server flags the mode needs. Exit 2
    with one line if a setting is bad."""
    env = dict(os.environ)
    if args.mode:  # the settings as the server will read them: with the mode the line sets
        env["KDKIT_MODE"] = args.mode
    try:
        s = from_env(env)
    except SettingsError as e:
        _err(f"{e} (the server would stop at start-up with this line)")
        return EXIT_BAD_INPUT
    print("# settings in force")
    for line in s.describe():
        print(line)
    print()
    print("# launch")
    mode = args.mode or s.mode
    for line in launch_lines(mode, sglang_api.release(), s.assignments()):
        print(line)
    if mode in ("capture", "validate"):
        why = unwritable(s.dir)
        if why:
            print(f"# warning: KDKIT_DIR={s.dir.resolve()} {why}: no case would be written")
    if mode in ("validate", "replace"):
        from ..capture import live  # imports torch: only when the mode runs a kernel
        try:
            k = live.load(s.kernel, mode)
            print(f"# KDKIT_KERNEL={s.kernel} is ready here ({k.name}, "
                  f"{'its live pair' if k.pair is not None else 'run(case)'})")
        except live.LiveError as e:
            print(f"# cannot run here: {e} (SGLang would stop at start-up with this line)")
    return EXIT_OK


def unwritable(folder: Path) -> str | None:
    """Why the plugin could not write case files into `folder` (it makes a missing one), or None."""
    p = folder.resolve()
    while not p.exists():
        p = p.parent
    if not p.is_dir():
        return f"cannot be created ({p} is a file)"
    if not os.access(p, os.W_OK | os.X_OK):
        return "is not writable" if p == folder.resolve() else f"cannot be created ({p} is not writable)"
    return None


def cmd_sitecustomize(args) -> int:
    """Write DIR/sitecustomize.py, which hooks SGLang in every process started with DIR on
    PYTHONPATH (for SGLang releases without the plugin system, <= 0.5.10), and print the
    PYTHONPATH line. Refuses to replace an existing file without --force."""
    from ..capture import installer
    blocker = next((q for q in [Path(args.dir), *Path(args.dir).parents] if q.exists()), None)
    if blocker is not None and not blocker.is_dir():  # (publish's mkdir would say "exists")
        _err(f"{args.dir}: {blocker} is a file, not a directory; give the directory to write "
             f"{installer.FILE} in")
        return EXIT_BAD_INPUT
    try:
        path = installer.write(args.dir, force=args.force)
    except FileExistsError:
        _err(f"{args.dir}/{installer.FILE} exists; pass --force to replace it")
        return EXIT_PROBLEM
    except OSError as e:
        _err(f"cannot write {args.dir}/{installer.FILE}: {e.strerror or e}")
        return EXIT_BAD_INPUT
    print(f"wrote {path}")
    print(installer.pythonpath_line(args.dir))
    return EXIT_OK
