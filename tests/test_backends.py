"""The backend contract (kdkit/backends/__init__.py), checked on every registered backend."""
from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from kdkit import backends, replay, shapes, synth
from kdkit.case import load

DATA = Path(__file__).resolve().parents[1] / "data" / "captured_tensors"


@pytest.mark.parametrize("name", list(backends.BACKENDS))
def test_unknown_options_are_refused_the_same_way(name):
    """Before anything runs, whether or not the backend can run on this machine."""
    with pytest.raises(TypeError, match=rf"^{name}: unknown option\(s\) bogus; this backend takes "):
        backends.run(name, shapes.seed_shape(), bogus=1)


@pytest.mark.parametrize("name", list(backends.BACKENDS))
def test_options_are_declared_keywords(name):
    """Options are named keyword parameters with defaults, so options() lists them all."""
    params = inspect.signature(backends.get(name).run).parameters.values()
    assert not any(p.kind == p.VAR_KEYWORD for p in params), f"{name}.run takes **kwargs"
    assert all(p.default is not p.empty for p in params if p.name != "case")


@pytest.mark.parametrize("name", list(backends.BACKENDS))
def test_unavailable_only_looks(name):
    """No environment variable set, no module imported by asking."""
    case = shapes.seed_shape()
    backends.unavailable(name, case)  # the backend module itself may import on first use
    env, mods = dict(os.environ), set(sys.modules)
    why = backends.unavailable(name, case)
    assert dict(os.environ) == env and set(sys.modules) == mods
    assert why is None or (why.startswith(f"{name}:") and "\n" not in why)


def test_every_backend_that_runs_says_what_ran_in_one_line():
    case = shapes.seed_shape()
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
        backends.run("silent", shapes.seed_shape())


def test_resolve_is_the_one_place_for_all():
    assert backends.resolve("all") == list(backends.BACKENDS)
    assert backends.resolve(" oracle, torch ,oracle") == ["oracle", "torch"]
    assert backends.resolve(["torch"]) == ["torch"]
    for bad in ("", "oracle,nope", [" "]):
        with pytest.raises(ValueError, match="choose from"):
            backends.resolve(bad)
    rep = replay.replay(shapes.seed_shape(), "oracle,torch")  # replay takes the same spelling
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
    from kdkit import cli
    from kdkit.judge import oracle
    calls = []
    real = oracle.run
    monkeypatch.setattr(oracle, "run", lambda case, **kw: calls.append(kw) or real(case, **kw))
    case = shapes.seed_shape()
    path = case.save(tmp_path / "seed.pt")
    out = tmp_path / "r.html"
    assert cli.main(["report", str(path), "--backends", "oracle,torch", "--out", str(out)]) == 0
    assert out.is_file() and "oracle probabilities" in out.read_text()
    assert calls == [{"with_cond": True, "with_scale": True}], f"oracle.run called {len(calls)} times: {calls}"


# ---- found by a review (2026-12-02) --------------------------------------------------------------
def test_triton_refuses_pool_indices_outside_the_pool():
    """A case built in memory has not been through case.load's checks: a kv_indices entry past the
    pool was Triton's address and crashed the process (a segfault under the interpreter)."""
    from kdkit.backends import triton_sglang
    from kdkit.case import CaseError
    c = synth.make_case(bs=1, prefix=5, q_len=3, heads=1, seed=1)
    c.kv_indices[2] = 100000
    with pytest.raises(CaseError, match=r"field 'kv_indices': slots 0?\S*\.\.100000 for a pool of \d+ rows"):
        triton_sglang._check_launchable(c)


def test_a_unified_case_goes_to_the_sglang_layout_as_the_oracle_reads_it():
    """to_sglang took the draft rows from out_cache_loc and only the prefix from kv_indices, so a
    unified case that breaks its own rule (prefix-only kv_indices: the seed's bug) came out repaired
    and Triton answered a case the oracle refuses; a tail that disagrees with out_cache_loc gave
    Triton other draft rows than the oracle's."""
    from kdkit import layout
    from kdkit.judge import oracle
    case = layout.to_layout(synth.make_case(bs=2, prefix=[7, 30], q_len=[3, 5], heads=2, seed=4), "unified")
    broken = load(DATA / "failures" / "prefix-only-kv-indices.pt")
    with pytest.raises(ValueError, match="covering only the prefix is the seed's prefix-only bug"):
        layout.to_sglang(broken)
    # the tails are what the unified case attends to: swap two draft slots there only
    ks = int(case.kv_indptr[0]) + int(case.prefix_lens[0])
    case.kv_indices[ks], case.kv_indices[ks + 1] = case.kv_indices[ks + 1].clone(), case.kv_indices[ks].clone()
    want, _ = oracle.run(case)
    got, _ = oracle.run(layout.to_sglang(case))
    assert np.array_equal(np.asarray(want), np.asarray(got))


def test_a_request_without_draft_tokens_gets_an_empty_mask_block():
    """chain(0), eagle(0) and ddtree(-1) are one-node trees: a q_len-0 request got a 1 x (p+1)
    block, and the lint an error (mask-indptr-offsets) on a case synth made."""
    from kdkit import lint
    for tree in ("ddtree", "chain", "eagle", "diagonal"):
        c = synth.make_case(bs=3, prefix=[4, 0, 6], q_len=[0, 3, 2], tree=tree, seed=2)
        assert c.mask_indptr.tolist() == [0, 0, 9, 25], tree
        assert not [f.code for f in lint.check(c) if f.severity == "error"], tree


def test_prepare_declares_the_options_of_run():
    """The contract: a backend's prepare takes the same declared options as its run (the bench
    sweeps and passes them to prepare), and every registered backend has a label."""
    import inspect
    for name in backends.BACKENDS:
        mod = backends.get(name)
        assert backends.label(name)
        if hasattr(mod, "prepare"):
            opts = {p.name: p.default for p in inspect.signature(mod.prepare).parameters.values() if p.name != "case"}
            assert opts.keys() == backends.options(name).keys(), name


def test_prepare_keeps_what_the_backend_prepared():
    """kdkit.backends.prepare wraps the backend's Prepared to check its result's info["ran"]; the
    rest (graph_safe, info, the plan step the bench times as plan_us) passes through unchanged."""
    import types

    from kdkit import backends, shapes
    from kdkit.backends import Prepared, Result
    case = shapes.seed_shape()
    planned = []

    def prepare(case):
        res = Result(case.q[..., :512].float(), None, {"ran": "a test backend"})
        return Prepared(lambda: None, lambda: res, graph_safe=True, info={"nsplit": 3},
                        plan=lambda: planned.append(1))

    mod = types.SimpleNamespace(NAME="kd_prep_test", unavailable=lambda case=None: None,
                                run=lambda case: prepare(case).result(), prepare=prepare)
    backends.register("kd_prep_test", mod)
    try:
        p = backends.prepare("kd_prep_test", case)
        assert p.graph_safe and p.info == {"nsplit": 3} and p.plan is not None
        p.plan()
        assert planned == [1] and p.result().ran == "a test backend"
    finally:
        backends.unregister("kd_prep_test")
