"""`kdkit capture sitecustomize DIR`: a sitecustomize.py that hooks SGLang in every Python process
started with DIR on PYTHONPATH (the server and each spawned TP worker inherit the environment).

For SGLang releases without the plugin system (<= 0.5.10), or when kdkit is importable but its
entry point is not installed. Where the plugin system will load kdkit anyway, the file does
nothing (no double hook). Without KDKIT_MODE it does nothing either. The file then runs the
sitecustomize it shadows (Ubuntu's apport one, a distribution's) as Python would have.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

FILE = "sitecustomize.py"

TEMPLATE = '''\
# Written by `kdkit capture sitecustomize` ({version}). Python imports this at start-up in every
# process that has this folder on PYTHONPATH: SGLang's server and each of its TP workers. With
# KDKIT_MODE set it hooks SGLang's TritonAttnBackend.forward_extend when SGLang imports it (the
# KDKIT_* settings are checked then: see `kdkit capture env`); without it, it does nothing.
# Python runs only the first sitecustomize on sys.path, so this one then runs the one it shadows
# (e.g. the system's). Delete this file (or drop the folder from PYTHONPATH) to stop.
import os as _os
import sys as _sys


def _kdkit_hook():
    try:
        from kdkit.capture.plugin import install_from_sitecustomize
    except ImportError as e:  # this Python has no kdkit: say so (when asked to hook), start normally
        if _os.environ.get("KDKIT_MODE", "").strip():
            print(f"[kdkit] sitecustomize: kdkit is not importable here ({{e}}); SGLang is not hooked",
                  file=_sys.stderr)
    else:
        install_from_sitecustomize()


def _run_shadowed_sitecustomize():
    # the first sitecustomize on sys.path after this folder, run as Python would have run it
    # (after, not anywhere else: two of these files on the path must not run each other forever)
    import importlib.machinery
    import importlib.util
    here = _os.path.dirname(_os.path.realpath(__file__))
    real = [_os.path.realpath(p or _os.curdir) for p in _sys.path]
    after = real.index(here) + 1 if here in real else 0
    paths = [p for p, r in zip(_sys.path[after:], real[after:]) if r != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    globals()["shadowed"] = module


_kdkit_hook()
_run_shadowed_sitecustomize()
'''


def render() -> str:
    from .. import __version__
    return TEMPLATE.format(version=f"kdkit {__version__}")


def write(folder: str | os.PathLike, force: bool = False) -> Path:
    """Write DIR/sitecustomize.py; FileExistsError unless force (then it is replaced atomically)."""
    from ..files import publish
    return publish(Path(folder) / FILE, render(), overwrite=force)


def pythonpath_line(folder: str | os.PathLike) -> str:
    d = shlex.quote(str(Path(folder).resolve()))
    return f'export PYTHONPATH={d}"${{PYTHONPATH:+:$PYTHONPATH}}"'
