"""No false alarm: correct torch runs of 500 random cases (hypothesis-driven, seeded, replayable)
all pass the judge, with their LSE and on the output alone; the worst error-to-limit ratio is
reported. A failure prints its seed and spec, saves the case with the options it ran with, and
prints the call that reproduces its numbers (trials.repro_call). The same generator and runner serve the GPU run:
`python -m kdkit.judge.trials correct --backend cuda --seeds 0:1000`."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdkit.judge import trials
from kdkit.case import load

EXAMPLES = int(os.environ.get("KDKIT_PROPERTY_EXAMPLES", "500"))
WORST: dict = {"ratio": 0.0, "seed": None, "examples": 0}


@pytest.fixture(scope="module")
def alarms_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("false-alarms")


# every 50th seed a long request (8K..32K prefix, q_len 9, H 8): few, since each costs seconds
LONG_EVERY = 50


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2 ** 31 - 1), p_bf16=st.booleans(), nsplit=st.one_of(st.none(), st.integers(1, 64)))
def test_correct_torch_never_fails_the_judge(alarms_dir, seed, p_bf16, nsplit):
    spec = trials.spec_for_seed(seed, long_every=LONG_EVERY)
    if spec["prefix"][0] > 32768:            # CI: the 128K corner is the GPU run's (and test_mutants')
        spec["prefix"] = [32771]
    case = trials.make(spec)
    t = trials.check(case, "torch", p_bf16=p_bf16, nsplit=nsplit)
    WORST["examples"] += 1
    if t.ratio > WORST["ratio"]:
        WORST.update(ratio=t.ratio, seed=seed, p_bf16=p_bf16, nsplit=nsplit)
    if not t.passed:
        path = trials.record_failure(case, seed, t, alarms_dir)
        why = [r for v in (t.with_lse, t.output_only) if v is not None and not v.passed for r in v.reasons]
        pytest.fail(f"false alarm: seed {seed} (p_bf16={p_bf16}, nsplit={nsplit}) spec {spec}; case saved "
                    f"as {path}; reproduce: {trials.repro_call(path, t)}; {'; '.join(why)}")


def test_worst_ratio_is_reported(request):
    """Runs after the property test (file order): the worst value/limit it saw, on the terminal."""
    if not WORST["examples"]:
        pytest.skip("the property test did not run in this session")
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    line = (f"no-false-alarm property: {WORST['examples']} correct torch runs, worst error-to-limit ratio "
            f"{WORST['ratio']:.3f} (seed {WORST['seed']}, p_bf16={WORST.get('p_bf16')}, nsplit={WORST.get('nsplit')})")
    if tr is not None:
        tr.write_line(line)
    assert WORST["examples"] >= EXAMPLES and WORST["ratio"] < 1.0, line


def test_a_failure_is_saved_and_replayable(tmp_path):
    """What the property test does on a false alarm, done on purpose: the saved file loads back to
    the same case, and replay judges it the same way."""
    from kdkit.replay import replay
    case = trials.make(trials.spec_for_seed(3))
    t = trials.check(case, "torch")
    path = trials.record_failure(case, 3, t, tmp_path)
    back = load(path)
    assert back.case_id == case.case_id and back.summary() == case.summary()
    rep = replay(back, ["oracle", "torch"])
    assert rep.row("torch").status == "pass"


def test_specs_are_seeded_and_cover_the_space():
    assert trials.spec_for_seed(11) == trials.spec_for_seed(11)
    specs = [trials.spec_for_seed(s) for s in range(300)]
    assert {s["tree"] for s in specs} == set(trials.TREES)
    assert {s["layout"] for s in specs} == {"sglang", "unified"}
    assert {s["heads"] for s in specs} >= {1, 8, 16, 64, 128}   # heads also halve to fit the rows limit
    assert max(max(s["prefix"]) for s in specs) >= 8190 and min(min(s["prefix"]) for s in specs) == 0
    assert max(max(s["q_len"]) for s in specs) >= 65 and {s["logit_cap"] for s in specs} == {0.0, 30.0}


def test_runner_for_the_gpu_run(tmp_path):
    """trials.run_correct is what the 1000-case GPU run calls with backend "cuda": here with torch.
    A broken backend (a mutant) shows the failure path: the seed printed, the case saved, and the
    saved case fails the same way when judged again."""
    lines = []
    s = trials.run_correct("torch", range(4), tmp_path / "ok", log=lines.append)
    assert s.examples == 4 and not s.failures and 0 < s.worst_ratio < 1
    assert lines[-1].startswith("torch: 4 correct random cases, 0 false alarm(s)")
    lines = []
    s = trials.run_correct("torch", [5, 6], tmp_path / "bad", log=lines.append, mutant="no-scale")
    assert [f[0] for f in s.failures] == [5, 6]
    assert lines[0].startswith("FALSE ALARM seed 5:") and "reproduce: trials.check(load(" in lines[0]
    back = load(s.failures[0][1])
    assert not trials.check(back, "torch", mutant="no-scale").passed and trials.check(back, "torch").passed
    assert back.meta["trial"] == {"backend": "torch", "seed": 5, "opts": {"mutant": "no-scale"}}


def test_a_saved_false_alarm_reproduces_its_numbers(tmp_path):
    """The trial's p_bf16 / nsplit (which `kdkit replay` cannot set) are saved in the case's meta,
    and the printed call, run as printed, gives the trial's numbers exactly."""
    case = trials.make(trials.spec_for_seed(3))
    opts = {"p_bf16": True, "nsplit": 3}
    t = trials.check(case, "torch", **opts)
    path = trials.record_failure(case, 3, t, tmp_path)
    assert load(path).meta["trial"] == {"backend": "torch", "seed": 3, "opts": opts}
    call = trials.repro_call(path, t)
    assert call == f"trials.check(load({str(path)!r}), 'torch', nsplit=3, p_bf16=True)"
    again = eval(call, {"trials": trials, "load": load})
    numbers = (lambda tr: [(n, v) for n, (v, _) in sorted(tr.output_only.checks.items())]
               + [(n, v) for n, (v, _) in sorted(tr.with_lse.checks.items())])
    assert numbers(again) == numbers(t)
    # the options matter: with the backend's defaults (what `kdkit replay` runs) the numbers move
    assert numbers(trials.check(load(path), "torch")) != numbers(t)
