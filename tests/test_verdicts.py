"""kdkit.verdicts: the summary line, JUnit XML and JSON of many replayed cases (issue 33: a run
over a directory ended without a summary and gave CI nothing to read)."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from conftest import DATA
from kdkit import verdicts
from kdkit.case import load
from kdkit.replay import replay


@pytest.fixture(scope="module")
def replayed():
    """seed-shape passes, mask-indptr-sliced fails (the lint refuses it), cuda is skipped here
    (no GPU) or passes; a truncated file could not be replayed at all."""
    names = [DATA / "seed-shape.pt", DATA / "failures" / "mask-indptr-sliced.pt"]
    reports = [replay(load(p), ["oracle", "torch", "cuda"]) for p in names]
    return reports, names, [("broken/truncated.pt", "UnpicklingError: not a case file")]


def test_summary_line(replayed):
    reports, _, stopped = replayed
    assert verdicts.summary_line(reports[:1]) == "1 of 1 case passed"
    assert verdicts.summary_line(reports, stopped) == (
        "1 of 3 cases passed; failing: failure-mask-indptr-sliced, truncated")
    assert verdicts.summary_line([]) == "no cases"
    many = verdicts.summary_line([reports[1]] * 12)
    assert many.startswith("0 of 12 cases passed; failing: ") and many.endswith("and 2 more")


def test_junit_one_testcase_per_case_and_backend(replayed, tmp_path):
    reports, names, stopped = replayed
    path = verdicts.write_junit(tmp_path / "j.xml", reports, names, stopped)
    suite = ET.parse(path).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("seed-shape", "oracle"), ("seed-shape", "torch"), ("seed-shape", "cuda"),
        ("failure-mask-indptr-sliced", "oracle"), ("failure-mask-indptr-sliced", "torch"),
        ("failure-mask-indptr-sliced", "cuda"), ("truncated", "replay")]
    by = {(c.get("classname"), c.get("name")): c for c in cases}
    seed_torch = by["seed-shape", "torch"]
    assert not list(seed_torch) and seed_torch.get("file") == str(names[0])     # passed: no child
    assert "reference" in by["seed-shape", "oracle"].find("system-out").text     # not "passed" vs itself
    cuda = by["seed-shape", "cuda"]
    if reports[0].row("cuda").status == "skipped":
        assert cuda.find("skipped").get("message").startswith("seed-shape cuda: skipped")
    bad = by["failure-mask-indptr-sliced", "oracle"].find("error")
    assert "custom_mask" in bad.get("message") and bad.get("message") == bad.text
    assert by["truncated", "replay"].find("error").get("message") == (
        "truncated: not replayed: UnpicklingError: not a case file")
    errors = sum(c.find("error") is not None for c in cases)
    assert int(suite.get("tests")) == 7 and int(suite.get("errors")) == errors >= 3
    assert int(suite.get("skipped")) == sum(c.find("skipped") is not None for c in cases)


def test_json_rows_and_cases(replayed, tmp_path):
    reports, names, stopped = replayed
    data = json.loads(verdicts.write_json(tmp_path / "r.json", reports, names, stopped).read_text())
    assert data["summary"] == verdicts.summary_line(reports, stopped)
    assert (data["passed"], data["total"]) == (1, 3)
    assert [c["ok"] for c in data["cases"]] == [True, False, False]
    torch_row = next(r for r in data["rows"] if r["case"] == "seed-shape" and r["backend"] == "torch")
    assert torch_row["status"] == "pass" and 0 < torch_row["max_abs"] < torch_row["limit"]
    assert next(r for r in data["rows"] if r["backend"] == "oracle")["status"] == "reference"


def test_a_non_finite_error_is_valid_json(replayed, tmp_path):
    reports, names, _ = replayed
    rep = reports[0]
    v = rep.row("torch").verdict
    old = v.metrics.max_abs
    try:
        v.metrics.max_abs = float("inf")
        data = json.loads(verdicts.write_json(tmp_path / "r.json", [rep], names[:1]).read_text())
    finally:
        v.metrics.max_abs = old
    assert next(r for r in data["rows"] if r["backend"] == "torch")["max_abs"] == "inf"


def test_replay_writes_junit_and_json_and_ends_with_the_summary(tmp_path, capsys):
    """Issue 33's check: `kdkit replay CASES --backends oracle,torch --allow-skip --junit j.xml
    --json r.json`: one test case per (case, backend), failures where the command says FAIL, and the
    summary as the output's last line."""
    import json
    import xml.etree.ElementTree as ET

    from conftest import DATA
    from kdkit.cli import main
    cases = [DATA / "seed-shape.pt", DATA / "ragged-bs4.pt", DATA / "failures" / "mask-indptr-sliced.pt"]
    rc = main(["replay", *map(str, cases), "--backends", "oracle,torch", "--allow-skip",
               "--junit", str(tmp_path / "j.xml"), "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert rc == 1
    last = out.strip().splitlines()[-1]
    assert last == "2 of 3 cases passed; failing: failure-mask-indptr-sliced", last
    tcs = list(ET.parse(tmp_path / "j.xml").getroot().iter("testcase"))
    assert sorted((t.get("classname"), t.get("name")) for t in tcs) == sorted(
        (c, b) for c in ("seed-shape", "ragged-bs4", "failure-mask-indptr-sliced") for b in ("oracle", "torch"))
    bad = {t.get("classname") for t in tcs if t.find("failure") is not None or t.find("error") is not None}
    assert bad == {"failure-mask-indptr-sliced"}
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["summary"] == last and data["passed"] == 2 and data["total"] == 3


def test_a_result_file_that_is_a_folder_is_refused_before_work(tmp_path, capsys):
    from conftest import DATA
    from kdkit.cli import main
    rc = main(["replay", str(DATA / "seed-shape.pt"), "--junit", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--junit" in err
