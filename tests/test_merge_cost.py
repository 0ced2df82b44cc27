"""kdkit.perf.merge_cost: its shape argument on the CPU, one small run on a GPU."""
from __future__ import annotations


import pytest

from kdkit.perf import merge_cost as mc

def test_shapes_parse():
    s = mc._shape(" 8x8192q9")
    assert (s.bs, s.prefix, s.q_len) == (8, 8192, 9)


@pytest.mark.parametrize("text", ["8x8192", "8x8192q", "bs8x8192q9", "1x1Kq9"])
def test_a_bad_shape_exits_2_with_the_form(text, capsys):
    with pytest.raises(SystemExit) as e:
        mc.main(["--shapes", text])
    assert e.value.code == 2 and "BSxPREFIXqQ_LEN" in capsys.readouterr().err


@pytest.mark.gpu
def test_a_small_run(capsys):
    """1 x 21 runs one split (no merge to time); 1 x 4K splits, and its merge costs time."""
    assert mc.main(["--shapes", "1x21q9,1x4096q9"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "1x21 q9: one split, no merge"
    cols = [c.strip() for c in out[2].split("|")]
    assert cols[0] == "1x4096 q9" and int(cols[1]) > 1 and len(cols) == 13
    p, pm = float(cols[3]), float(cols[5])
    assert 0 < p < pm  # the partial kernel, then partial + merge: the merge is not free
