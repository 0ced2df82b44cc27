"""replay(): rows per backend, skipped / error rows, production error, the table and log lines."""
import importlib.util
import re
import sys
import types

import pytest
import torch

from kdkit import backends, report, shapes, synth
from kdkit.backends import torch_ref
from kdkit.judge.compare import out_floor
from kdkit.replay import ReplayReport, replay

ALL = ["oracle", "torch", "captured", "triton_sglang"]


def _captured_case(**kw):
    """The seed's shape with a stored reference output. The stand-in for the live Triton output is
    the torch backend with P rounded to bf16 (what Triton does): a real kernel, not a mock."""
    case = shapes.seed_shape(**kw)
    return case.clone(ref_out=torch_ref.run(case, p_bf16=True).out)


def test_seed_shape_all_backends():
    case = shapes.seed_shape()
    rep = replay(case, ALL)
    assert isinstance(rep, ReplayReport) and rep.case_id == "seed-shape"
    assert [r.backend for r in rep.rows] == ALL
    assert rep.row("oracle").status == "pass" and rep.row("oracle").verdict.metrics.max_abs == 0.0
    assert rep.row("torch").status == "pass"
    cap = rep.row("captured")
    assert cap.status == "skipped" and cap.reason.startswith("captured: this case holds no reference output")
    tri = rep.row("triton_sglang")
    why = backends.unavailable("triton_sglang", case)
    if why:
        assert tri.status == "skipped" and tri.reason == why and tri.verdict is None
    else:
        assert tri.status == "pass" and rep.production == "triton_sglang"
    assert rep.passed  # skipped rows do not fail a replay


def test_captured_output_is_judged_and_serves_as_production():
    case = _captured_case()
    rep = replay(case, ["oracle", "torch", "captured"])
    cap = rep.row("captured")
    assert cap.status == "pass" and cap.info["dtype"] == "bfloat16"
    if backends.unavailable("triton_sglang", case):
        assert rep.production == "captured"
        tv = rep.row("torch").verdict
        # limit = 2 x production error + 2^-7 max|ref|; the production row itself: 2^-6 max|ref| alone
        m_ref = tv.metrics.ref_max_abs
        assert cap.verdict.limit == pytest.approx(out_floor(m_ref)) == pytest.approx(2 ** -6 * m_ref)
        assert tv.limit == pytest.approx(2 * cap.verdict.metrics.max_abs + 2 ** -7 * m_ref)
        assert "2 x production" in tv.rule
    assert rep.passed


def test_wrong_captured_output_fails_with_reasons():
    case = shapes.seed_shape()
    wrong = torch_ref.run(case.clone(sm_scale=1.0)).out           # a kernel that forgot sm_scale
    rep = replay(case.clone(ref_out=wrong), ["oracle", "torch", "captured"])
    row = rep.row("captured")
    assert row.status == "fail" and not rep.passed
    assert re.search(r"max_abs \S+ > limit \S+ = bf16 floor", row.reason)
    assert "captured" in rep.table() and "fail" in rep.table()


def test_error_row_and_replay_goes_on():
    rep = replay(shapes.seed_shape(), ["torch", "oracle"], torch={"bogus": 1})
    assert rep.row("torch").status == "error" and "TypeError" in rep.row("torch").reason
    assert rep.row("oracle").status == "pass"
    assert not rep.passed


def test_each_backend_gets_a_clone(monkeypatch):
    """A deliberately bad backend that scribbles over its inputs must not spoil the next one."""
    mod = types.ModuleType("kdkit_test_scribbler")
    mod.NAME = "scribbler"
    mod.unavailable = lambda case=None: None

    def run(case, **opts):
        res = torch_ref.run(case)
        case.q.fill_(float("nan"))
        case.kv_buffer.zero_()
        case.custom_mask.fill_(False)
        return res

    mod.run = run
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(backends.BACKENDS, "scribbler", mod.__name__)
    case = shapes.seed_shape()
    q0, kv0 = case.q.clone(), case.kv_buffer.clone()
    rep = replay(case, ["scribbler", "torch", "oracle"])
    assert [r.status for r in rep.rows] == ["pass", "pass", "pass"]
    assert torch.equal(case.q, q0)
    assert torch.equal(torch.nan_to_num(case.kv_buffer.float()), torch.nan_to_num(kv0.float()))


def test_against_a_backend():
    case = _captured_case()
    rep = replay(case, ["oracle", "torch"], against="captured")
    assert rep.against == "captured" and rep.passed
    # a bf16 reference: 3 x production + 2 x floor (see compare.judge)
    assert "3 x production" in rep.row("torch").verdict.rule
    with pytest.raises(backends.BackendUnavailable, match="captured"):
        replay(shapes.seed_shape(), ["torch"], against="captured")


NO_LSE = "judged on the output alone (tighter limits)"


def test_a_backend_without_lse_is_said_in_the_table_and_the_report():
    """A captured reference output with no captured LSE: its row is judged on the output alone, and
    both the replay table and the Markdown report say so on a line of their own."""
    case = _captured_case()
    assert case.ref_lse is None
    rep = replay(case, ["oracle", "captured"])
    cap = rep.row("captured")
    assert cap.status == "pass" and cap.verdict.lse_limit is None and "lse" not in cap.verdict.checks
    line = f"  captured: no LSE from the backend: {NO_LSE}"
    assert line in rep.table().splitlines()
    assert line in report.render_markdown([rep]).splitlines()
    assert not any(ln.startswith("  oracle:") for ln in rep.table().splitlines())   # the oracle has its LSE


def test_against_a_reference_without_lse_the_tighter_rule_is_said():
    """Against a captured output with no LSE, no row can be judged on its LSE: every judged row says
    the output-only rule applied, naming the reference as a possible cause."""
    rep = replay(_captured_case(), ["oracle", "torch"], against="captured")
    tv = rep.row("torch").verdict
    assert rep.row("torch").status == "pass" and tv.lse_limit is None and "lse" not in tv.checks
    lines = rep.table().splitlines()
    for name in ("oracle", "torch"):
        assert f"  {name}: no LSE from the backend or the reference: {NO_LSE}" in lines


def test_bad_arguments_are_named():
    case = shapes.seed_shape()
    with pytest.raises(KeyError, match="nosuch"):
        replay(case, ["nosuch"])
    with pytest.raises(TypeError, match="not backend names"):
        replay(case, ["torch"], device="cuda")


def test_table_and_seed_lines():
    rep = replay(shapes.seed_shape(), ALL)
    tab = rep.table()
    lines = tab.splitlines()
    assert lines[0].startswith("seed-shape: synthetic bs=1 H=8 q_len=9 prefix=21")
    assert lines[1].split() == ["backend", "status", "max_abs", "mean_abs", "rel", "cos_dist",
                                "lse_err", "limit", "nearest", "time"]
    assert lines[3].split()[:2] == ["torch", "pass"]
    # the columns line up: every table row has the header's length or is a reason line below
    width = len(lines[1])
    assert all(len(ln) <= width for ln in lines[2: 2 + len(ALL)])
    assert "captured: this case holds no reference output" in tab
    sl = rep.seed_lines()
    assert len(sl) == sum(r.verdict is not None for r in rep.rows)   # one per judged backend
    assert re.fullmatch(r"\[kdkit\] seed-shape torch max_abs_diff=\d\.\d{4}e[+-]\d\d "
                        r"mean=\d\.\d{4}e[+-]\d\d rel=\d\.\d{4}e[+-]\d\d", sl[1])


def test_lint_findings_are_attached():
    case = shapes.seed_shape()
    rep = replay(case, ["oracle"])
    if importlib.util.find_spec("kdkit.lint") is None:
        # kdkit.lint is being written alongside; until it lands the report says so
        assert rep.lint == [] and "kdkit.lint" in rep.lint_error
    else:
        from kdkit import lint
        assert rep.lint_error is None
        assert [f.code for f in rep.lint] == [f.code for f in lint.check(case)]
    assert replay(case, ["oracle"], run_lint=False).lint_error.startswith("lint not run")


def _seed_bug_prefix_only(case):
    """Unified layout with kv_indices cut back to the prefix (the seed's second bug)."""
    u = synth.make_case(bs=1, prefix=21, q_len=9, heads=8, tree="eagle", layout="unified")
    p = int(u.prefix_lens[0])
    return u.clone(kv_indices=u.kv_indices[:p].clone(), kv_indptr=torch.tensor([0, p], dtype=u.kv_indptr.dtype))


def test_a_case_the_oracle_cannot_read_gives_error_rows_and_the_lint():
    good = synth.make_case(bs=2, prefix=21, q_len=9, heads=8, tree="eagle")
    sliced = good.clone(mask_indptr=good.mask_indptr[1:].clone())        # the seed's first bug
    for bad in (sliced, _seed_bug_prefix_only(good)):
        rep = replay(bad, ["oracle", "torch"])
        assert [r.status for r in rep.rows] == ["error", "error"] and not rep.passed
        assert rep.row("torch").reason.startswith("not judged: the oracle could not run this case")
        assert rep.row("oracle").reason.startswith("ValueError: ")
        if importlib.util.find_spec("kdkit.lint") is not None:
            assert any(f.severity == "error" for f in rep.lint), rep.lint
            # the raw error is the symptom: the row also names the field the lint finds at fault
            assert "the lint's errors name field '" in rep.row("oracle").reason
        assert "error" in rep.table()


def test_outcome_line_says_why_each_backend_failed():
    """The one-line verdict (capture.ipynb's table, report index pages) tells a failed check from a
    crash: each bad backend with its status and reason, cut to one short line."""
    from types import SimpleNamespace

    from kdkit import report
    from kdkit.replay import Row
    rep = SimpleNamespace(rows=[Row("oracle", "pass", None, 0.0),
                                Row("torch", "fail", None, 0.0, reason="ulp_row 3.1 > 2.0\n(2x production)"),
                                Row("cuda", "error", None, 0.0, reason="RuntimeError: " + "x" * 300)])
    ok, line = report.outcome(rep)
    assert not ok and line.startswith("2 backend(s) failed: torch (fail: ulp_row 3.1 > 2.0 (2x production)), cuda (error: RuntimeError: x")
    assert "\n" not in line and len(line) < 250 and line.endswith(" ...)")
    assert report.outcome(SimpleNamespace(rows=[Row("oracle", "pass", None, 0.0),
                                                Row("torch", "pass", None, 0.0)])) == (True, "pass")
    # nothing judged is no pass (an audit's: a CPU replay of --backends cuda read PASS)
    assert report.outcome(SimpleNamespace(rows=[Row("oracle", "pass", None, 0.0)])) == (
        False, "nothing judged: no backend beside oracle was asked for")
    ok, line = report.outcome(SimpleNamespace(rows=[Row("cuda", "skipped", None, 0.0, reason="cuda: no CUDA GPU")]))
    assert not ok and line == "nothing judged: cuda skipped (no CUDA GPU)"


def test_nearest_check_reads_zero_when_a_passing_row_meets_a_zero_limit():
    from kdkit.replay import _nearest
    v = type("V", (), {"checks": {"max_abs": (0.0, 0.0), "ulp_mean": (0.0, 0.5)}})()
    assert _nearest(v) in ("max_abs 0", "ulp_mean 0")
    v.checks["ulp_mean"] = (0.25, 0.5)
    assert _nearest(v) == "ulp_mean 0.5"


def test_markdown_report_escapes_what_a_case_carries():
    """A shared case's id is data: Markdown viewers render raw HTML, so it is escaped."""
    evil = "</script><script>alert(1)</script>"
    rep = replay(synth.make_case(case_id=evil), ["torch"])
    md = report.render_markdown([rep])
    assert "<script>" not in md.split("```")[0] and "&lt;script&gt;" in md
