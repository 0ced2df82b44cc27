"""The README points only at files that exist, and its layout section lists the package's modules."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TOP = ("kdkit", "scripts", "tests", "notebooks", "data", "benchmarks", ".ci")


def test_every_path_the_readme_names_exists():
    paths = set(re.findall(rf"(?<![\w/.$])((?:{'|'.join(map(re.escape, TOP))})/[\w./-]*[\w/])", README))
    assert paths, "no repository paths found in README.md: the pattern is broken"
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"README.md names paths that do not exist: {missing}"


def test_layout_section_lists_every_module():
    layout = README[README.index("## Project layout"):]
    names = [p.name for p in (ROOT / "kdkit").iterdir()
             if not p.name.startswith(("_", ".")) and (p.suffix in (".py", ".json") or p.is_dir())
             and p.name != "__pycache__"]
    missing = sorted(n for n in names if not re.search(rf"(?<![\w.]){re.escape(n)}", layout))
    assert not missing, (f"kdkit/ holds {missing}, which the README's 'Project layout' section does not "
                         "list: add a line saying what each is")
