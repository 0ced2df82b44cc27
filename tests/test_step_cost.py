"""kdkit.perf.step_cost: its arithmetic on the CPU, one small run on a GPU."""
from __future__ import annotations


import pytest

from kdkit.perf import step_cost as sc

def test_steps_and_the_line():
    """1 x 128K at q_len 9: 4097 steps of 32, 63 per split at the automatic 66 (the README's
    figure); the line through (steps, us) gives the step's cost and the fixed work."""
    assert sc.steps_per_split(131072 + 9, 66) == 63 and sc.steps_per_split(131072 + 9, 1) == 4097
    a, b = sc.fit([(65, 1.64 * 65 + 17.2), (257, 1.64 * 257 + 17.2), (17, 1.64 * 17 + 17.2)])
    assert a == pytest.approx(1.64) and b == pytest.approx(17.2)


@pytest.mark.parametrize("argv, says", [(["--prefixes", "4096"], "two or more"),
                                        (["--nsplits", "0,2"], "integers >= 1"),
                                        (["--nsplits", "a"], "comma-separated")])
def test_bad_arguments_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        sc.main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.gpu
def test_a_small_run(capsys):
    assert sc.main(["--prefixes", "2048,4096", "--nsplits", "1,4", "--budget-s", "0.02"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out[2:]]
    assert [r[0] for r in rows] == ["shuffled", "shuffled", "in", "in"]
    assert all(float(r[-4]) > 0 for r in rows)  # us per step (counted from the end: "in order" is two words)
