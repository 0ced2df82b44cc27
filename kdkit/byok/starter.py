"""`kdkit new-kernel DIR --lang cuda|triton [--name NAME]`: a starter kernel as an installable package.

    write("/tmp/mine", "triton", "mine")   # then: pip install -e /tmp/mine; kdkit replay ... --backends mine

writes
    DIR/pyproject.toml          the package, with the entry point `NAME = "NAME.backend:backend"` in
                                the group kdkit.backends (kdkit finds the backend once it is installed)
    DIR/NAME/__init__.py
    DIR/NAME/kernel.cu|.py      the template's kernel (kdkit/byok/starters/<lang>/)
    DIR/NAME/backend.py         the few lines that make it a backend (kdkit.byok.cuda / .triton)
    DIR/tests/test_NAME.py      replays kdkit's bundled cases through it and judges each (judge())
    DIR/README.md
The template's token `kdkit_starter` becomes NAME everywhere. DIR must be empty or absent: a
user's work is never overwritten.
"""
from __future__ import annotations

import importlib.util
import keyword
from pathlib import Path

TOKEN = "kdkit_starter"
TEMPLATES = Path(__file__).resolve().parent / "starters"
KERNEL_FILE = {"cuda": "kernel.cu", "triton": "kernel.py"}
LANGS = tuple(KERNEL_FILE)


class StarterError(ValueError):
    """Why the starter cannot be written (one line naming the argument and the fix)."""


def check_name(name: str) -> str:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise StarterError(f"--name {name!r}: a backend name is a Python identifier (letters, digits, _; "
                           "no leading digit), e.g. my_kernel")
    from ..backends import BACKENDS
    if name in BACKENDS or name == "kdkit":
        raise StarterError(f"--name {name!r}: kdkit already has that name; pick another")
    if importlib.util.find_spec(name) is not None:
        raise StarterError(f"--name {name!r}: a module of that name is already importable here; pick another "
                           "(the package would shadow it)")
    return name


def _pyproject(name: str, lang: str) -> str:
    data = f'\n[tool.setuptools.package-data]\n{name} = ["kernel.cu"]\n' if lang == "cuda" else ""
    return f'''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "{name}: an MLA tree-verify attention kernel ({lang}) for kdkit"
requires-python = ">=3.10"
# kdkit itself is installed from its repository (pip install -e path/to/kdkit), with
# {"cupy and cuda-bindings (kdkit's gpu extra)" if lang == "cuda" else "triton"}; nothing is fetched for this package
dependencies = []

# kdkit finds the backend here once the package is installed: --backends {name}, KDKIT_KERNEL={name}
[project.entry-points."kdkit.backends"]
{name} = "{name}.backend:backend"

[tool.setuptools]
packages = ["{name}"]
{data}'''


def _test(name: str, lang: str) -> str:
    return f'''"""{name} on kdkit's bundled cases, judged against the float64 oracle by kdkit's judge.

    pytest tests/   ({"needs a CUDA GPU" if lang == "cuda" else "runs on a CPU under Triton's interpreter"})
"""
import pytest

from kdkit.byok.starter import bundled_cases, judge
from {name}.backend import backend

why = backend.unavailable()


@pytest.mark.skipif(why is not None, reason=str(why))
@pytest.mark.parametrize("path", bundled_cases(), ids=lambda p: p.stem)
def test_{name}_passes_the_judge(path):
    verdict = judge(backend, path)
    assert verdict.passed, "; ".join(verdict.reasons)
'''


def _readme(name: str, lang: str) -> str:
    kernel = KERNEL_FILE[lang]
    return f"""# {name}

An MLA tree-verify attention kernel ({lang}) for kdkit, written by `kdkit new-kernel`: split-KV with
SGLang's tree mask and an LSE merge, plainly written, to start from. `{name}/{kernel}` is the kernel,
`{name}/backend.py` the few lines that make it a kdkit backend.

    pip install -e .                                     # registers the backend `{name}`
    kdkit replay data/captured_tensors/seed-shape.pt --backends {name}
    pytest tests/                                        # every bundled case through kdkit's judge

In a live SGLang server (kdkit's plugin): `KDKIT_MODE=validate KDKIT_KERNEL={name}` runs it beside
SGLang's Triton kernel and writes the cases where they disagree; `KDKIT_MODE=replace` serves its
output, inside SGLang's CUDA graphs too (its live pair: `backend.plan(batch)`, `backend.launch(...)`).
"""


def write(dir, lang: str, name: str | None = None) -> Path:
    """Write the starter package for `lang` into `dir` (created; refused if it holds anything).
    `name` defaults to dir's last part. Returns the package's folder. StarterError: one line."""
    if lang not in KERNEL_FILE:
        raise StarterError(f"--lang {lang!r}: choose {' or '.join(LANGS)}")
    dest = Path(dir).expanduser()
    name = check_name(name if name is not None else dest.resolve().name)
    if dest.exists() and not dest.is_dir():
        raise StarterError(f"{dest}: exists and is not a folder; give a new or empty folder")
    if dest.is_dir() and any(dest.iterdir()):
        raise StarterError(f"{dest}: not empty; give a new or empty folder (kdkit never overwrites your files)")
    src = TEMPLATES / lang
    files = {f"{name}/{KERNEL_FILE[lang]}": (src / KERNEL_FILE[lang]).read_text(),
             f"{name}/backend.py": (src / "backend.py").read_text(),
             f"{name}/__init__.py": f'"""{name}: a kdkit backend (the kernel in {KERNEL_FILE[lang]}, the backend in backend.py)."""\n',
             "pyproject.toml": _pyproject(name, lang),
             f"tests/test_{name}.py": _test(name, lang),
             "README.md": _readme(name, lang)}
    for rel, text in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x") as f:  # "x": never replaces a file
            f.write(text.replace(TOKEN, name))
    return dest / name


# ---- what the generated test calls: a stable entry into kdkit's judge ---------------------------
def bundled_cases() -> list[Path]:
    """kdkit's bundled cases (data/captured_tensors/*.pt of the kdkit checkout), [] if absent."""
    from ..bundled import DEFAULT_DIR
    return sorted(DEFAULT_DIR.glob("*.pt"))


def judge(backend, case, **opts):
    """`backend` (an object or module meeting kdkit's contract) run on `case` (a Case or a path),
    judged against the float64 oracle as `kdkit replay` judges a backend with no production path
    (kdkit.compare.judge's floors). Returns the Verdict."""
    from ..case import load
    case = load(case) if not hasattr(case, "q") else case
    return judge_result(backend.NAME, case, backend.run(case.clone(), **opts))


def judge_result(name: str, case, res):
    """The Verdict on `res`, a Result for `case` however it was made (run, or the live pair's
    plan/launch), against the float64 oracle with judge()'s limits."""
    from ..backends import oracle as oracle_backend
    from ..judge.compare import judge as judge_metrics, metrics
    ref = oracle_backend.run(case)
    want = (case.num_tokens, case.num_heads, case.v_head_dim)
    if tuple(res.out.shape) != want:
        raise ValueError(f"{name} returned out of shape {tuple(res.out.shape)}, expected {want}")
    m = metrics(res.out, ref.out, res.lse, ref.lse, lse_cond=ref.info["lse_cond"], out_scale=ref.info["out_scale"])
    return judge_metrics(name, m, ref.out)


__all__ = ["write", "check_name", "StarterError", "bundled_cases", "judge", "judge_result", "LANGS", "TOKEN"]
