"""The `kdkit` command line, run in-process through main(argv) and once as a real subprocess."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import BUNDLED, ROOT, bundled_path
from kdkit.case import load
from kdkit.cli import COMMANDS, main
from kdkit.synth import make_case

SEED_LINE = re.compile(r"^\[kdkit\] \S+ (\S+ )?max_abs_diff=\S+ mean=\S+ rel=\S+$", re.M)


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_subcommands_are_a_table():
    names = [c[0] for c in COMMANDS]
    assert {"inspect", "replay", "report", "synth"} <= set(names)
    assert len(names) == len(set(names))


# ---- inspect ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", BUNDLED)
def test_inspect_bundled_cases_are_clean(capsys, name):
    path = bundled_path(name)
    rc, out, err = run(capsys, "inspect", path)
    assert rc == 0, out + err
    assert "lint: clean" in out
    case = load(path)
    assert case.case_id in out and "kv_buffer" in out and "on disk" in out
    assert f"x{case.num_heads}x576" in out  # q's shape, T x H x 576


def test_inspect_failure_cases_name_their_bug(capsys, failure_case):
    path, field = failure_case
    rc, out, err = run(capsys, "inspect", path)
    assert rc == 1, out + err
    bug = path.stem  # the bundled failures are named after the lint code of their bug
    assert re.search(rf"ERROR {re.escape(bug)} \[{field}\]", out), out


def test_inspect_hostile_file_exits_2(capsys, hostile_case):
    path, marker = hostile_case
    rc, out, err = run(capsys, "inspect", path)
    assert rc == 2
    assert "refused by the safe loader" in err and str(path) in err
    assert "Traceback" not in out + err
    assert not marker.exists(), "inspect ran code from the file"


@pytest.mark.parametrize("content", [b"", b"not a torch file\n"], ids=["empty", "text"])
def test_inspect_unreadable_file_exits_2(capsys, tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    rc, out, err = run(capsys, "inspect", path)
    assert rc == 2 and "cannot be read as a torch file" in err and "Traceback" not in err


def test_inspect_missing_file_exits_2(capsys, tmp_path):
    rc, _, err = run(capsys, "inspect", tmp_path / "nope.pt")
    assert rc == 2 and "no such case file" in err


# ---- replay / report -------------------------------------------------------------------------------
def test_replay_oracle_torch(capsys, seed_case_path):
    rc, out, err = run(capsys, "replay", seed_case_path, "--backends", "oracle,torch")
    assert rc == 0, out + err
    lines = SEED_LINE.findall(out)
    assert len(lines) == 2, out  # one seed-style line per judged backend
    assert re.search(r"^torch\s+pass\b", out, re.M), out
    assert "lint: clean" in out


def test_replay_all_skips_with_reasons(capsys, seed_case_path):
    from kdkit import backends
    rc, out, err = run(capsys, "replay", seed_case_path, "--backends", "all")
    assert rc == 0, out + err
    for name in backends.BACKENDS:
        assert re.search(rf"^{name}\s+(pass|skipped)\b", out, re.M), f"{name} missing:\n{out}"
        why = backends.unavailable(name, load(seed_case_path))
        if why:
            assert why in out


def test_replay_unknown_backend_exits_2(capsys, seed_case_path):
    rc, _, err = run(capsys, "replay", seed_case_path, "--backends", "oracle,nosuch")
    assert rc == 2 and "nosuch" in err


def test_replay_failure_case_exits_1_and_names_bug(capsys):
    path = bundled_path("mask-indptr-sliced")
    rc, out, err = run(capsys, "replay", path, "--backends", "oracle,torch")
    assert rc == 1
    assert "mask-indptr-sliced" in out + err


def test_replay_exits_1_on_lint_errors_even_when_numbers_agree(capsys, tmp_path):
    # a prefix row read from the scratch slot 0 (zeros here): every backend computes the same
    # wrong thing and agrees, the lint is what catches it
    case = make_case(tree="eagle", poison_unused=False)
    case.kv_indices[3] = 0
    path = case.save(tmp_path / "scratch.pt")
    rc, out, err = run(capsys, "replay", path, "--backends", "oracle,torch")
    assert re.search(r"^torch\s+pass\b", out, re.M), out
    assert rc == 1 and "scratch-slot-referenced" in out


def test_report_writes_and_never_overwrites(capsys, seed_case_path, tmp_path):
    target = tmp_path / "r.html"
    rc, out, _ = run(capsys, "report", seed_case_path, "--backends", "oracle,torch", "--out", target)
    assert rc == 0 and target.is_file()
    html = target.read_text()
    assert "CPU only" in html or "NVIDIA" in html or "GPU" in html
    assert "seed-shape" in html and "max_abs_diff=" in html
    pytest.importorskip("plotly")
    # viewable offline: plotly.js inlined exactly once, no external script, the figures drawn
    assert html.count("window.PlotlyConfig") == 1 and "<script src=" not in html
    assert html.count("Plotly.newPlot") >= 2
    before = target.read_bytes()
    rc, out, _ = run(capsys, "report", seed_case_path, "--backends", "oracle", "--out", target)
    assert rc == 0 and target.read_bytes() == before
    others = [p for p in tmp_path.iterdir() if p != target]
    assert len(others) == 1 and others[0].name.startswith("r-") and others[0].suffix == ".html"
    assert str(others[0]) in out
    rc, _, _ = run(capsys, "report", seed_case_path, "--backends", "oracle", "--out", target, "--force")
    assert rc == 0 and target.read_bytes() != before


def test_replay_markdown_report(capsys, seed_case_path, tmp_path):
    target = tmp_path / "r.md"
    rc, out, err = run(capsys, "replay", seed_case_path, "--backends", "oracle,torch", "--report", target)
    assert rc == 0, out + err
    md = target.read_text()
    assert md.startswith("# kdkit replay report") and "## Machine" in md and "Result: pass" in md
    assert len(SEED_LINE.findall(md)) == 2


# ---- synth --------------------------------------------------------------------------------------------
def test_synth_writes_and_refuses_overwrite(capsys, tmp_path):
    out = tmp_path / "c.pt"
    rc, text, err = run(capsys, "synth", "--out", out, "--prefix", "0,5,40", "--q-len", "1,4,9",
                        "--heads", "3", "--tree", "chain", "--seed", "7")
    assert rc == 0, err
    case = load(out)
    assert case.batch_size == 3 and case.num_heads == 3 and case.q_lens == [1, 4, 9]
    assert case.prefix_lens.tolist() == [0, 5, 40]
    before = out.read_bytes()
    rc, _, err = run(capsys, "synth", "--out", out, "--seed", "8")
    assert rc == 1 and "--force" in err and out.read_bytes() == before
    rc, _, _ = run(capsys, "synth", "--out", out, "--seed", "8", "--force", "--layout", "unified")
    assert rc == 0 and load(out).layout == "unified"


def test_synth_bad_lengths_exit_2(capsys, tmp_path):
    rc, _, err = run(capsys, "synth", "--out", tmp_path / "c.pt", "--prefix", "1,2", "--q-len", "1,2,3")
    assert rc == 2 and "--prefix" in err and not (tmp_path / "c.pt").exists()


# ---- as a real process ----------------------------------------------------------------------------------
def test_cli_as_subprocess(seed_case_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    p = subprocess.run([sys.executable, "-m", "kdkit.cli", "inspect", str(seed_case_path)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "lint: clean" in p.stdout


def test_replay_names_the_sglang_release(capsys, seed_case_path):
    """Issue 4's CPU check: replay through SGLang's kernel passes and says which release ran."""
    from kdkit import backends
    why = backends.unavailable("triton_sglang")
    if why:
        pytest.skip(why)
    rc = main(["replay", str(seed_case_path), "--backends", "triton_sglang,torch,oracle"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert re.search(r"^ran triton_sglang: SGLang \d+\.\d+\.\d+\S* \(", out, re.M), out
