"""The backend contract (kdkit/backends/__init__.py), checked on every registered backend."""
from __future__ import annotations

import inspect
import os
import sys

import pytest

from kdkit import backends, replay, synth


@pytest.mark.parametrize("name", list(backends.BACKENDS))
def test_unknown_options_are_refused_the_same_way(name):
    """Before anything runs, whether or not the backend can run on this machine."""
    with pytest.raises(TypeError, match=rf"^{name}: unknown option\(s\) bogus; this backend takes "):
        backends.run(name, synth.seed_shape(), bogus=1)


@pytest.mark.parametrize("name", list(backends.BACKENDS))
def test_options_are_declared_keywords(name):
    """Options are named keyword parameters with defaults, so options() lists them all."""
    params = inspect.signature(backends.get(name).run).parameters.values()
    assert not any(p.kind == p.VAR_KEYWORD for p in params), f"{name}.run takes **kwargs"
    assert all(p.default is not p.empty for p in params if p.name != "case")


@pytest.mark.parametrize("name", list(backends.BACKENDS))
def test_unavailable_only_looks(name):
    """No environment variable set, no module imported by asking."""
    case = synth.seed_shape()
    backends.unavailable(name, case)  # the backend module itself may import on first use
    env, mods = dict(os.environ), set(sys.modules)
    why = backends.unavailable(name, case)
    assert dict(os.environ) == env and set(sys.modules) == mods
    assert why is None or (why.startswith(f"{name}:") and "\n" not in why)


def test_every_backend_that_runs_says_what_ran_in_one_line():
    case = synth.seed_shape()
    case = case.clone(ref_out=backends.run("torch", case).out)  # so that "captured" has something
    ran = 0
    for name in backends.BACKENDS:
        if backends.unavailable(name, case):
            continue
        res = backends.run(name, case)
        assert isinstance(res.info["ran"], str) and res.info["ran"] and "\n" not in res.ran, name
        ran += 1
    assert ran >= 3  # oracle, torch, captured run everywhere


def test_a_backend_that_does_not_say_what_ran_is_refused(monkeypatch):
    import types
    mod = types.ModuleType("kdkit_test_silent")
    mod.NAME, mod.unavailable = "silent", (lambda case=None: None)
    mod.run = lambda case: backends.Result(case.q[..., :512].clone(), None, {"device": "cpu"})
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(backends.BACKENDS, "silent", mod.__name__)
    with pytest.raises(TypeError, match=r"silent: Result.info\['ran'\] must be one line"):
        backends.run("silent", synth.seed_shape())


def test_resolve_is_the_one_place_for_all():
    assert backends.resolve("all") == list(backends.BACKENDS)
    assert backends.resolve(" oracle, torch ,oracle") == ["oracle", "torch"]
    assert backends.resolve(["torch"]) == ["torch"]
    for bad in ("", "oracle,nope", [" "]):
        with pytest.raises(ValueError, match="choose from"):
            backends.resolve(bad)
    rep = replay.replay(synth.seed_shape(), "oracle,torch")  # replay takes the same spelling
    assert [r.backend for r in rep.rows] == ["oracle", "torch"]


def test_replay_lints_once_and_keeps_lint_clean_backends_off_bad_cases(monkeypatch):
    """A backend marked LINT_CLEAN is not run on a case with lint errors; replay lints once and
    takes findings the caller already has."""
    import types
    from kdkit import lint
    calls = []
    real_check = lint.check
    monkeypatch.setattr(lint, "check", lambda case: calls.append(1) or real_check(case))
    mod = types.ModuleType("kdkit_test_kernel")
    mod.NAME, mod.LINT_CLEAN, mod.unavailable = "kernel", True, (lambda case=None: None)

    def run(case):
        raise AssertionError("launched on a mis-marshaled case")
    mod.run = run
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(backends.BACKENDS, "kernel", mod.__name__)
    bad = synth.make_case(bs=1, prefix=0, q_len=4, tree="chain", seed=0)
    bad.custom_mask[4:8] = False  # row 1 sees nothing: a lint error the oracle can still run
    rep = replay.replay(bad, ["kernel", "torch"])
    assert calls == [1] and rep.row("torch").status == "pass"
    row = rep.row("kernel")
    assert row.status == "error" and "lint errors" in row.reason and "custom_mask" in row.reason
    findings = real_check(bad)
    calls.clear()
    rep = replay.replay(bad, ["kernel"], findings=findings)
    assert calls == [] and rep.lint == findings and rep.row("kernel").status == "error"


def test_report_runs_the_oracle_once(monkeypatch, tmp_path, capsys):
    """`kdkit report`: replay runs the float64 oracle once; the figure of the worst row computes
    that one row (oracle.row_probs), not the whole oracle again."""
    pytest.importorskip("plotly")
    from kdkit import cli, oracle
    calls = []
    real = oracle.run
    monkeypatch.setattr(oracle, "run", lambda case, **kw: calls.append(kw) or real(case, **kw))
    case = synth.seed_shape()
    path = case.save(tmp_path / "seed.pt")
    out = tmp_path / "r.html"
    assert cli.main(["report", str(path), "--backends", "oracle,torch", "--out", str(out)]) == 0
    assert out.is_file() and "oracle probabilities" in out.read_text()
    assert calls == [{"with_cond": True, "with_scale": True}], f"oracle.run called {len(calls)} times: {calls}"
