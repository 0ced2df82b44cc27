"""profile_one's arguments (no GPU): the shape and options ncu's command line names."""
import pytest

from kdkit.perf import profile_one


def test_heads_and_the_plans_choices():
    shape, opts = profile_one.parse(["4", "8192", "257", "0", "8", "0", "16"])
    assert (shape.bs, shape.prefix, shape.q_len, shape.heads) == (4, 8192, 257, 16)
    assert (opts.nsplit, opts.nt, opts.nh) == (None, 8, None)  # 0: the plan's choice
    shape, opts = profile_one.parse(["1", "32768", "9"])
    assert shape.heads == 8 and opts.nsplit is None and opts.nt is None and opts.knockout is None


def test_a_knockout_anywhere_in_the_arguments():
    for argv in (["4", "8192", "257", "--knockout", "qk", "0", "8"], ["--knockout=qk", "4", "8192", "257", "0", "8"]):
        shape, opts = profile_one.parse(argv)
        assert (shape.bs, shape.q_len, opts.nt, opts.knockout) == (4, 257, 8, "qk")


@pytest.mark.parametrize("argv, names", [(["1", "2"], "3 to 7"), (["1", "x", "9"], "PREFIX 'x'"),
                                         (["1", "2", "3", "4", "5", "6", "h16"], "HEADS 'h16'"),
                                         (["1", "2", "3", "--knockout", "nope"], "--knockout 'nope': choose one of"),
                                         (["1", "2", "3", "--knockout"], "--knockout '': choose one of")])
def test_bad_arguments_are_named(argv, names, capsys):
    assert profile_one.main(argv) == 2
    err = capsys.readouterr().err
    assert names in err and "usage:" in err
