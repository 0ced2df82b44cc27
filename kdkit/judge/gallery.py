"""The gallery of known failures (failures.ipynb): each one replayed, diagnosed by the lint or the
judge, fixed, and replayed after the fix.

    marshaling(path)        a case file with one of the seed's marshaling bugs (data/.../failures/)
    mutant(name, case)      one of kdkit.judge.wrong_kernels' deliberately wrong builds, planted in the torch backend
    gallery(...)            all of them
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import lint, replay, report
from . import fixes
from .wrong_kernels import MUTANTS
from ..case import Case, load

BACKENDS = ["oracle", "torch"]


@dataclass
class Entry:
    name: str
    kind: str                 # "marshaling" (a bad case file) | "mutant" (a bad kernel)
    what: str                 # the bug, in a line
    case: Case                # the case as replayed before the fix
    before: object            # ReplayReport of the failure
    diagnosis: list           # what named it: lint findings ("code [field]: message") or judge reasons
    fix: str                  # what was done about it
    after: object             # ReplayReport after the fix

    @property
    def caught(self) -> bool:
        """The lint named the bad file, or the judge failed the bad build: a torch row that
        *errored* (a crash, a refused option) is not a catch."""
        if self.kind == "mutant":
            return self.before.row("torch").status == "fail"
        return not report.outcome(self.before)[0]

    @property
    def inert(self) -> bool:
        """The mutant computed exactly what the correct build did on this case (a merge bug with
        one split, a head bug with one head, no query rows): nothing there to catch."""
        if self.kind != "mutant" or self.caught:
            return False
        a, b = (getattr(r, "outputs", {}).get("torch") for r in (self.before, self.after))
        return a is not None and b is not None and a.shape == b.shape and bool(torch.equal(a, b))

    @property
    def fixed(self) -> bool:
        return report.outcome(self.after)[0]

    def row(self) -> dict:
        verdict = ("pass" if self.caught and self.fixed else "inert here (same output as the correct build)"
                   if self.inert else "NOT caught" if not self.caught else "fix failed")
        return {"failure": self.name, "kind": self.kind, "caught": self.caught,
                "by": "lint" if self.kind == "marshaling" else "judge",
                "before": report.outcome(self.before)[1], "after": report.outcome(self.after)[1],
                "verdict": verdict}

    def text(self) -> str:
        return "\n".join([f"== {self.name} ({self.kind}): {self.what}", "", "-- replayed:",
                          self.before.table(), "", "-- diagnosis:", *[f"  {d}" for d in self.diagnosis], "",
                          f"-- fix: {self.fix}", "", "-- replayed after the fix:", self.after.table()])


def marshaling(path) -> Entry:
    """A case with a marshaling bug: the lint names it, kdkit.judge.fixes repairs it."""
    case = load(path)
    before = replay.replay(case, BACKENDS)
    errors = lint.errors(case)
    codes = [f.code for f in errors if f.code in fixes.FIXES]
    if not codes:
        raise ValueError(f"{path}: the lint names no bug kdkit.judge.fixes can repair "
                         f"(found: {', '.join(f.code for f in errors) or 'none'})")
    fixed = case
    for code in codes:
        fixed = fixes.fix(fixed, code)
    return Entry(name=codes[0], kind="marshaling", what=str(case.meta.get("note") or case.case_id),
                 case=case, before=before,
                 diagnosis=[f"{f.code} [{f.field}]: {f.message}" for f in errors] + [f"fix: {f.fix}" for f in errors],
                 fix=f"kdkit.judge.fixes.fix(case, {codes[0]!r}): " + " ".join(fixes.FIXES[codes[0]].__doc__.split()),
                 after=replay.replay(fixed, BACKENDS))


def mutant(name: str, case: Case, description: str = "", after=None, findings=None, **torch_opts) -> Entry:
    """A deliberately wrong build planted in the torch backend: the judge must fail it against the
    oracle; the fix is the correct build (no mutant). after: the correct build's replay of the same
    case, when the caller has it (the same for every mutant); findings: the case's lint."""
    before = replay.replay(case, BACKENDS, findings=findings, torch={**torch_opts, "mutant": name})
    row = before.row("torch")
    diagnosis = [f"torch {row.status}: {row.reason}"] if row.reason else [f"torch {row.status}"]
    if after is None:
        after = replay.replay(case, BACKENDS, findings=findings, torch=dict(torch_opts))
    return Entry(name=name, kind="mutant", what=description or name, case=case, before=before,
                 diagnosis=diagnosis, fix="the correct build (no mutant)", after=after)


def gallery(failure_paths, mutant_case: Case | None = None, **torch_opts) -> tuple[list[Entry], list[str]]:
    """(entries, notes): every marshaling failure, then every mutant on mutant_case."""
    entries = [marshaling(p) for p in failure_paths]
    notes = []
    if mutant_case is not None:
        findings = lint.check(mutant_case)
        after = replay.replay(mutant_case, BACKENDS, findings=findings, torch=dict(torch_opts))
        ok, line = report.outcome(after)
        if not ok:  # every mutant would read as "caught" against a build that fails by itself
            opts = f" with {', '.join(f'{k}={v!r}' for k, v in torch_opts.items())}" if torch_opts else ""
            raise ValueError(f"mutant_case {mutant_case.case_id}: the correct build does not pass on it{opts} "
                             f"({line}); give a case (and options, e.g. a split count >= 1) the torch backend passes")
        entries += [mutant(n, mutant_case, d, after=after, findings=findings, **torch_opts) for n, d in MUTANTS.items()]
    return entries, notes
