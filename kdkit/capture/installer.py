"""`kdkit capture sitecustomize DIR`: a sitecustomize.py that hooks SGLang in every Python process
started with DIR on PYTHONPATH (the server and each spawned TP worker inherit the environment).

For SGLang releases without the plugin system (<= 0.5.10), or when kdkit is importable but its
entry point is not installed. Where the plugin system will load kdkit anyway, the file does
nothing (no double hook). Without KDKIT_MODE it does nothing either.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

FILE = "sitecustomize.py"

TEMPLATE = '''\
# Written by `kdkit capture sitecustomize` ({version}). Python imports this at start-up in every
# process that has this folder on PYTHONPATH: SGLang's server and each of its TP workers. With
# KDKIT_MODE set it hooks SGLang's TritonAttnBackend.forward_extend (see `kdkit capture env`);
# without it, it does nothing. Delete this file (or drop the folder from PYTHONPATH) to stop.
import sys as _sys

try:
    from kdkit.capture.plugin import install_from_sitecustomize as _install
except ImportError as _e:  # this Python has no kdkit: say so once, start normally
    print(f"[kdkit] sitecustomize: kdkit is not importable here ({{_e}}); SGLang is not hooked",
          file=_sys.stderr)
else:
    _install()
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
