"""The failures gallery's verdicts (failures.ipynb): a catch is the judge failing a mutant, never a
crash; a mutant that computes what the correct build computes is inert there, not "NOT caught"."""
from __future__ import annotations

import pytest

from kdkit import shapes, synth
from kdkit.judge import gallery


def test_a_mutant_the_judge_fails_is_caught():
    e = gallery.mutant("no-scale", shapes.seed_shape(), nsplit=2)
    assert e.caught and e.fixed and e.row()["verdict"] == "pass"


def test_a_mutant_with_nothing_to_act_on_is_inert_not_missed():
    # the merge's rescale matters only with more than one split; a head bug needs two heads
    for name, case, opts in (("merge-no-rescale", shapes.seed_shape(), dict(nsplit=1)),
                             ("wrong-head-stride", synth.make_case(heads=1), dict(nsplit=2))):
        e = gallery.mutant(name, case, **opts)
        assert not e.caught and e.inert and e.row()["verdict"].startswith("inert here"), e.row()


def test_a_correct_build_that_does_not_pass_stops_the_gallery():
    """nsplit=0 made the torch backend error on every mutant, and each read as 'caught'."""
    with pytest.raises(ValueError, match=r"mutant_case .*correct build does not pass on it with nsplit=0"):
        gallery.gallery([], shapes.seed_shape(), nsplit=0)
