"""Replay verdicts of many cases in the forms people and CI read: the summary line a run over a
directory ends with ("8 of 10 cases passed; failing: a, b"), a JUnit XML file (one test case per
case x backend: what CI dashboards draw) and a JSON file (the same rows, machine-readable).

    records(reports, sources, stopped)   one dict per (case, backend), and one per case not replayed
    summary_line(reports, stopped)       the last line of inspect / replay / report over many cases
    junit_xml(...) / write_junit(path, ...)   <testsuite> of <testcase classname=case name=backend>
    to_json(...) / write_json(path, ...)      {"summary", "passed", "total", "cases": [...]}

A case passes as kdkit.report.outcome says (every backend judged passes, one at least was judged,
no lint error); a backend row fails with its status (fail, error), is skipped with its reason, and
the reference's own row says "reference" (it is not judged against itself).
"""
from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET
from pathlib import Path

from .files import publish
from .report import outcome, rows_of

# the failing cases the summary line names before it says "and N more": a line, not a list
NAMES_SHOWN = 10


def _case_id(rep) -> str:
    return str(getattr(rep, "case_id", "case"))


def _line(rep, row) -> str:
    """The verdict line of one (case, backend), as the CLI prints it."""
    against = getattr(rep, "against", "oracle")
    if row.backend == against and row.status == "pass":
        return f"{_case_id(rep)} {row.backend}: reference (the others are judged against it)"
    text = f"{_case_id(rep)} {row.backend}: {row.status}"
    v = row.verdict
    if v is not None:
        text += f" max_abs {v.metrics.max_abs:.3e} (limit {v.limit:.3e})"
    why = " ".join(str(row.reason or "").split())
    return text + (f": {why}" if why and row.status != "pass" else "")


def records(reports, sources: list | None = None, stopped: list | None = None) -> list[dict]:
    """One dict per (case, backend): case, source, backend, status ("pass", "fail", "error",
    "skipped", or "reference" for the reference's own row), the verdict line, max_abs, limit,
    seconds; and one per case that could not be replayed (backend None, status "error")."""
    out = []
    for i, rep in enumerate(reports):
        src = str(sources[i]) if sources and i < len(sources) and sources[i] is not None else None
        against = getattr(rep, "against", "oracle")
        for r in rows_of(rep):
            v = r.verdict
            status = "reference" if r.backend == against and r.status == "pass" else r.status
            out.append({"case": _case_id(rep), "source": src, "backend": r.backend, "status": status,
                        "line": _line(rep, r), "max_abs": v.metrics.max_abs if v else None,
                        "limit": v.limit if v else None, "seconds": r.seconds})
    for src, why in stopped or []:
        out.append({"case": Path(str(src)).stem, "source": str(src), "backend": None, "status": "error",
                    "line": f"{Path(str(src)).stem}: not replayed: {why}", "max_abs": None, "limit": None,
                    "seconds": 0.0})
    return out


def cases(reports, stopped: list | None = None) -> list[dict]:
    """One dict per case: case, ok, outcome (kdkit.report.outcome's line, or why not replayed)."""
    out = [dict(zip(("ok", "outcome"), outcome(rep)), case=_case_id(rep)) for rep in reports]
    out += [{"case": Path(str(src)).stem, "ok": False, "outcome": f"not replayed: {why}"}
            for src, why in stopped or []]
    return out


def summary_line(reports, stopped: list | None = None) -> str:
    """'8 of 10 cases passed; failing: a, b' ('all 3 cases passed', 'no cases')."""
    got = cases(reports, stopped)
    bad = [c["case"] for c in got if not c["ok"]]
    n = len(got)
    if not n:
        return "no cases"
    if not bad:
        return f"all {n} case{'s' * (n != 1)} passed" if n > 1 else "1 of 1 case passed"
    names = ", ".join(bad[:NAMES_SHOWN]) + (f" and {len(bad) - NAMES_SHOWN} more" if len(bad) > NAMES_SHOWN else "")
    return f"{n - len(bad)} of {n} case{'s' * (n != 1)} passed; failing: {names}"


def junit_xml(reports, sources: list | None = None, stopped: list | None = None,
              suite: str = "kdkit replay") -> str:
    """A JUnit XML document: one <testcase classname=CASE name=BACKEND> per (case, backend),
    <failure> for a fail, <error> for an error or a case not replayed, <skipped> for a backend
    that could not run here; the message is the verdict line."""
    recs = records(reports, sources, stopped)
    count = (lambda *st: sum(r["status"] in st for r in recs))
    root = ET.Element("testsuites")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(recs)), failures=str(count("fail")),
                       errors=str(count("error")), skipped=str(count("skipped")),
                       time=f"{sum(r['seconds'] for r in recs):.3f}")
    for r in recs:
        tc = ET.SubElement(ts, "testcase", classname=r["case"], name=r["backend"] or "replay",
                           time=f"{r['seconds']:.3f}")
        if r["source"]:
            tc.set("file", r["source"])
        kind = {"fail": "failure", "error": "error", "skipped": "skipped"}.get(r["status"])
        if kind:
            ET.SubElement(tc, kind, message=r["line"], type=r["status"]).text = r["line"]
        elif r["status"] == "reference":
            ET.SubElement(tc, "system-out").text = r["line"]
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def to_json(reports, sources: list | None = None, stopped: list | None = None) -> dict:
    got = cases(reports, stopped)
    return {"summary": summary_line(reports, stopped), "passed": sum(c["ok"] for c in got), "total": len(got),
            "cases": got, "rows": records(reports, sources, stopped)}


def write_junit(path: str | os.PathLike, reports, sources: list | None = None,
                stopped: list | None = None) -> Path:
    """Write junit_xml to path (replaced: a CI result file is the run's, rewritten each run)."""
    return publish(path, junit_xml(reports, sources, stopped), overwrite=True)


def write_json(path: str | os.PathLike, reports, sources: list | None = None,
               stopped: list | None = None) -> Path:
    """Write to_json to path (replaced each run, as write_junit)."""
    data = to_json(reports, sources, stopped)
    for r in data["rows"]:  # JSON has no inf/NaN: a non-finite error is written as text ("inf")
        for k in ("max_abs", "limit"):
            if isinstance(r[k], float) and not math.isfinite(r[k]):
                r[k] = str(r[k])
    return publish(path, json.dumps(data, indent=1, allow_nan=False) + "\n", overwrite=True)


__all__ = ["records", "cases", "summary_line", "junit_xml", "to_json", "write_junit", "write_json"]
