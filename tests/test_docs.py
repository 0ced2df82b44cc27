"""The README and the pages under docs/ point only at files that exist, the README's layout lists
the package's modules and its command table the CLI's commands, and the site builds with
`mkdocs build --strict` (a broken link, a missing anchor or a page left out of the nav fails)."""
from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = sorted((ROOT / "docs").glob("*.md"))
MKDOCS = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
TOP = ("kdkit", "scripts", "tests", "notebooks", "data", "benchmarks", "docs", ".ci")
PATH = re.compile(rf"(?<![\w/.$])((?:{'|'.join(map(re.escape, TOP))})/[\w./-]*[\w/])")
# the README's longest: the five-minute page of issue 31 (its history lives in benchmarks/LOG.md)
README_MAX_LINES = 250


def _texts() -> dict[str, str]:
    """Every text a reader follows paths in: the README and each page, by name."""
    return {"README.md": README, **{f"docs/{p.name}": p.read_text(encoding="utf-8") for p in PAGES}}


def test_every_path_the_docs_name_exists():
    missing, seen = [], 0
    for name, text in _texts().items():
        paths = set(PATH.findall(text))
        seen += len(paths)
        missing += [f"{name}: {p}" for p in sorted(paths) if not (ROOT / p).exists()]
    assert seen, "no repository paths found in README.md or docs/: the pattern is broken"
    assert not missing, f"these name paths that do not exist: {missing}"


MODULE = re.compile(r"`(?:python3? -m )?(kdkit(?:\.[A-Za-z_]\w*)+)")


def _defines(source: Path, name: str) -> bool:
    """`name` is bound at the top level of `source` (a def, a class, an assignment or an import),
    read without importing it: the docs' names are checked without torch or a GPU."""
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(x, ast.Name) and x.id == name for x in targets):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False


def _resolves(dotted: str) -> bool:
    """A module (kdkit/a/b.py or kdkit/a/b/), or a name one of them binds (kdkit.a.b.fn)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        src = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if src.is_file():
            rest = parts[i:]
            return not rest or (len(rest) == 1 and _defines(src, rest[0]))
    return False


def test_every_module_the_docs_name_exists():
    """`kdkit.judge.compare`, `python -m kdkit.perf.step_cost`, `kdkit.layout.to_unified`: each
    dotted name the README and the pages write is a module of the package or a name it defines."""
    missing = sorted({f"{name}: {m}" for name, text in _texts().items() for m in MODULE.findall(text)
                      if not _resolves(m)})
    assert not missing, f"these name modules or functions that kdkit does not hold: {missing}"


def test_readme_links_into_docs_resolve():
    """The README's links are relative to the repository root (GitHub renders them there)."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [l for l in links if "://" not in l]
    assert local, "the README links to no page under docs/"
    missing = sorted(l for l in local if not (ROOT / l).exists())
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_readme_is_a_five_minute_page_that_links_every_page():
    n = len(README.splitlines())
    assert n <= README_MAX_LINES, (f"README.md has {n} lines (at most {README_MAX_LINES}): move the "
                                   "detail to a page under docs/ and link it")
    unlinked = sorted(p.name for p in PAGES if f"](docs/{p.name}" not in README)
    assert not unlinked, f"README.md's Documentation list does not link {unlinked}"
    assert re.search(r"!\[[^\]]+\]\(docs/img/[\w.-]+\.png\)", README), "the README's picture is gone"


def test_layout_section_lists_every_module():
    layout = README[README.index("## Project layout"):]
    names = [p.name for p in (ROOT / "kdkit").iterdir()
             if not p.name.startswith(("_", ".")) and (p.suffix in (".py", ".json") or p.is_dir())
             and p.name != "__pycache__"]
    missing = sorted(n for n in names if not re.search(rf"(?<![\w.]){re.escape(n)}", layout))
    assert not missing, (f"kdkit/ holds {missing}, which the README's 'Project layout' section does not "
                         "list: add a line saying what each is")


def test_layout_section_names_only_what_is_there():
    """The other way round: each module or folder the layout lists under kdkit/ exists."""
    block = README[README.index("## Project layout"):].split("```")[1]
    listed = set()
    for line in block.splitlines():
        if line.startswith("  ") and not line.startswith("   "):  # a child of kdkit/, not a description
            listed |= set(re.findall(r"(?<![\w./])([a-z_]+(?:\.py|\.json|/))(?=\s|$)", line.split("   ")[0]))
    assert listed, "no modules found in the README's layout block: the pattern is broken"
    absent = sorted(n for n in listed if not (ROOT / "kdkit" / n.rstrip("/")).exists())
    assert not absent, f"the README's layout lists {absent}, which kdkit/ does not hold"


def _commands() -> list[str]:
    """The subcommands `kdkit --help` lists (the CLI's own table, whatever module holds it)."""
    r = subprocess.run([sys.executable, "-m", "kdkit", "--help"], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 0, r.stderr
    section = r.stdout.split("positional arguments:", 1)[1].split("\n\n", 1)[0]
    names = re.findall(r"^ {4}([a-z][\w-]*)(?:\s|$)", section, re.M)
    assert names, r.stdout
    return names


def test_every_command_is_in_the_readme_table_and_on_the_command_line_page():
    table = README[README.index("## Command line"):].split("\n\n## ", 1)[0]
    page = (ROOT / "docs" / "command-line.md").read_text(encoding="utf-8")
    names = _commands()
    not_in_table = [n for n in names if f"| `kdkit {n} " not in table]
    not_on_page = [n for n in names if f"### `kdkit {n} " not in page and f"### `kdkit {n}`" not in page]
    assert not not_in_table, f"the README's command table lacks {not_in_table}"
    assert not not_on_page, f"docs/command-line.md has no section for {not_on_page}"


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    """Checked without MkDocs too, so the nav cannot drift where MkDocs is not installed."""
    nav = re.findall(r":\s*([\w./-]+\.md)\s*$", MKDOCS, re.M)
    pages = {p.name for p in PAGES}
    assert sorted(set(nav)) == sorted(nav), f"a page is twice in mkdocs.yml's nav: {nav}"
    assert set(nav) == pages, (f"not in the nav: {sorted(pages - set(nav))}; "
                               f"in the nav but not in docs/: {sorted(set(nav) - pages)}")


def test_mkdocs_build_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs and mkdocs-material are not installed (the dev extra: pip install -e '.[dev]')")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300)
    warnings = [l for l in (r.stdout + r.stderr).splitlines() if "WARNING" in l or "ERROR" in l]
    assert r.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(warnings or [r.stderr[-2000:]])
    assert (tmp_path / "site" / "index.html").exists()
    assert all((tmp_path / "site" / p.stem / "index.html").exists() for p in PAGES if p.stem != "index")
