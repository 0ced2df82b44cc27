"""The `kdkit` command line as a user meets it: exit codes, errors before work, help, progress,
start-up. Run in-process through main(argv), and as a real process where start-up is the point.

Exit codes (kdkit/cli/__init__.py): 0 all requested work passed; 1 a verdict failed or something requested
did not run (a skipped backend, unless --allow-skip); 2 bad input or arguments, in one line, before
any work or any file written.
"""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import BUNDLED, DATA, ROOT, bundled_path
from kdkit import backends
from kdkit.case import load
from kdkit.cli import COMMANDS, build_parser, main, summary
from kdkit.synth import make_case

SEED_LINE = re.compile(r"^\[kdkit\] \S+ (\S+ )?max_abs_diff=\S+ mean=\S+ rel=\S+$", re.M)
SEED = DATA / "seed-shape.pt"


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def files_under(path) -> list:
    return sorted(p.relative_to(path) for p in path.rglob("*") if p.is_file())


def proc(*argv, **kw) -> subprocess.CompletedProcess:
    """`python -m kdkit.cli ARGV` as a separate process, this checkout first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=300, **kw)


def test_python_m_kdkit_is_the_command():
    """GPU hosts without the package installed run `python3 -m kdkit bench ...` (README)."""
    r = proc("-m", "kdkit", "--help")
    assert r.returncode == 0, r.stderr
    assert "bench" in r.stdout and "replay" in r.stdout


def test_subcommands_are_a_table():
    names = [c[0] for c in COMMANDS]
    assert {"inspect", "replay", "report", "synth", "compile"} <= set(names)
    assert len(names) == len(set(names))


# ---- what a new user saw (issue 12): the command, its exit code, the first line of its output ----
# (argv, exit code, regex the first line of stderr matches). Each runs in an empty directory and
# must leave it empty: a refused command writes nothing.
REFUSED = {
    "synth-q-len-0": (["synth", "--out", "c.pt", "--q-len", "0"], 2, r"^kdkit synth: argument --q-len: 0: want >= 1"),
    "synth-q-len-list-0": (["synth", "--out", "c.pt", "--q-len", "9,0"], 2, r"^kdkit synth: argument --q-len: 0: want >= 1"),
    "synth-heads-0": (["synth", "--out", "c.pt", "--heads", "0"], 2, r"^kdkit synth: argument --heads: 0: want >= 1"),
    "synth-heads-1025": (["synth", "--out", "c.pt", "--heads", "1025"], 2, r"^kdkit: synth: .*num_heads.*1025"),
    "synth-logit-cap-neg": (["synth", "--out", "c.pt", "--logit-cap", "-3"], 2, r"^kdkit synth: argument --logit-cap: -3: want >= 0"),
    "synth-logit-cap-nan": (["synth", "--out", "c.pt", "--logit-cap", "nan"], 2, r"^kdkit synth: argument --logit-cap: 'nan': want a finite number"),
    "synth-sm-scale-0": (["synth", "--out", "c.pt", "--sm-scale", "0"], 2, r"^kdkit synth: argument --sm-scale: 0: want > 0"),
    "synth-magnitude-0": (["synth", "--out", "c.pt", "--magnitude", "0"], 2, r"^kdkit synth: argument --magnitude: 0: want > 0"),
    "synth-seed-neg": (["synth", "--out", "c.pt", "--seed", "-1"], 2, r"^kdkit synth: argument --seed: -1: want >= 0"),
    "synth-bs-0": (["synth", "--out", "c.pt", "--bs", "0"], 2, r"^kdkit synth: argument --bs: 0: want >= 1"),
    # a batch too large to list for the memory estimate, a seed past 64 bits, a q that overflows bf16
    "synth-bs-huge": (["synth", "--out", "c.pt", "--bs", "1" + "0" * 21], 2, r"^kdkit synth: argument --bs: 10+: want <= 1048576"),
    "synth-seed-65-bits": (["synth", "--out", "c.pt", "--seed", str(2**64)], 2, r"^kdkit synth: argument --seed: \d+: want <= 18446744073709551615"),
    "synth-magnitude-huge": (["synth", "--out", "c.pt", "--magnitude", "1e38"], 2, r"^kdkit synth: argument --magnitude: 1e38: want <= 1000000"),
    "synth-prefix-neg": (["synth", "--out", "c.pt", "--prefix", "-5"], 2, r"^kdkit synth: argument --prefix: -5: want >= 0"),
    "synth-tree-bogus": (["synth", "--out", "c.pt", "--tree", "bogus"], 2, r"^kdkit synth: argument --tree: invalid choice"),
    "synth-lengths": (["synth", "--out", "c.pt", "--prefix", "1,2", "--q-len", "1,2,3"], 2, r"^kdkit: --prefix has 2 values and --q-len 3"),
    "synth-not-pt": (["synth", "--out", "c.txt"], 2, r"^kdkit: c\.txt: the suffix must be one of \.pt"),
    "synth-no-out": (["synth"], 2, r"^kdkit synth: the following arguments are required: --out"),
    "report-missing": (["report", "nonexistent.pt"], 2, r"^kdkit: nonexistent\.pt: no such file or directory"),
    "report-text-file": (["report", ROOT / "README.md"], 2, r"^kdkit: cannot load case: .*README\.md.*cannot be read as a torch file"),
    "report-empty-dir": (["report", ROOT / "notebooks"], 2, r"^kdkit: .*notebooks: a directory with no case files"),
    "report-bad-suffix": (["report", SEED, "--out", "r.txt"], 2, r"^kdkit: r\.txt: the suffix must be one of"),
    "report-unwritable": (["report", SEED, "--out", "/proc/kdkit/r.html"], 2, r"^kdkit: /proc/kdkit/r\.html: cannot write under /proc"),
    "replay-missing": (["replay", "nonexistent.pt", "--report", "r.html"], 2, r"^kdkit: nonexistent\.pt: no such file"),
    "replay-bad-backend": (["replay", SEED, "--backends", "oracle,nosuch"], 2, r"^kdkit replay: argument --backends: unknown backend\(s\) nosuch"),
    "replay-bad-against": (["replay", SEED, "--against", "nosuch"], 2, r"^kdkit replay: argument --against: invalid choice: 'nosuch'"),
    "inspect-missing": (["inspect", "nope.pt"], 2, r"^kdkit: nope\.pt: no such file or directory"),
    "compile-arch-999": (["compile", "--arch", "sm_999"], 2, r"^kdkit: --arch sm_999: this NVRTC builds the kernel for sm_80, .*sm_120"),
    "compile-arch-75": (["compile", "--arch", "sm_75"], 2, r"^kdkit: --arch sm_75: the kernel needs sm_80 or newer"),
    "compile-arch-word": (["compile", "--arch", "sm_120,volta"], 2, r"^kdkit: --arch 'volta': expected sm_XX"),
    "compile-rows-7": (["compile", "--rows", "7"], 2, r"^kdkit compile: argument --rows: invalid choice: 7 \(choose from 8, 16, 24, 32, 40, 64\)"),
    "compile-rows-0": (["compile", "--rows", "0"], 2, r"^kdkit compile: argument --rows: invalid choice: 0 \(choose from 8, 16,"),
    "compile-mutant": (["compile", "--mutant", "nosuch"], 2, r"^kdkit compile: argument --mutant: invalid choice: 'nosuch'"),
    "no-command": ([], 2, r"^kdkit: the following arguments are required: COMMAND"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_in_one_line_writing_nothing(capsys, tmp_path, monkeypatch, name):
    argv, want_rc, pattern = REFUSED[name]
    if argv[:1] == ["compile"] and "arch" in name:
        pytest.importorskip("cuda.bindings", reason="the arch list is NVRTC's: kdkit's 'compile' extra")
    monkeypatch.chdir(tmp_path)
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own exit, as the console script would see it
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == want_rc, out + err
    assert re.search(pattern, first_line(err)), err
    assert "Traceback" not in out + err and len(err.strip().splitlines()) == 1, err
    assert files_under(tmp_path) == [], "a refused command wrote a file"


def test_synth_existing_file_exits_1_and_keeps_it(capsys, tmp_path):
    out = tmp_path / "c.pt"
    rc, _, _ = run(capsys, "synth", "--out", out, "--seed", "7")
    assert rc == 0
    before = out.read_bytes()
    rc, _, err = run(capsys, "synth", "--out", out, "--seed", "8")
    assert rc == 1 and first_line(err) == f"kdkit: {out} exists; pass --force to replace it"
    assert out.read_bytes() == before


def test_the_smallest_valid_synth_values_replay(capsys, tmp_path):
    """The edges the argument checks let through (q_len 1, prefix 0, one head) make cases that replay."""
    out = tmp_path / "edge.pt"
    rc, _, err = run(capsys, "synth", "--out", out, "--q-len", "1", "--prefix", "0", "--heads", "1")
    assert rc == 0, err
    rc, text, err = run(capsys, "replay", out, "--backends", "oracle,torch")
    assert rc == 0, text + err


# ---- exit codes of replay: a skipped backend is not a pass ----------------------------------------
def test_a_skipped_backend_is_not_a_pass(capsys):
    """`captured` cannot run on a synthetic case (it holds no live output) on any machine."""
    rc, out, err = run(capsys, "replay", SEED, "--backends", "torch,captured")
    assert rc == 1, out + err
    assert re.search(r"^torch\s+pass\b", out, re.M) and re.search(r"^captured\s+skipped\b", out, re.M)
    assert first_line(err) == f"kdkit: {SEED}: captured skipped, so not tested (--allow-skip accepts that)"
    rc, out, err = run(capsys, "replay", SEED, "--backends", "torch,captured", "--allow-skip")
    assert rc == 0 and err == "", err


def test_nothing_requested_ran_exits_1_even_with_allow_skip(capsys):
    rc, out, err = run(capsys, "replay", SEED, "--backends", "captured", "--allow-skip")
    assert rc == 1
    assert first_line(err) == f"kdkit: {SEED}: nothing judged (captured skipped)"


def test_cuda_without_a_gpu_exits_1(capsys):
    """Issue 12 item 1: `--backends cuda` where the kernel cannot run used to exit 0."""
    why = backends.unavailable("cuda")
    if why is None:
        pytest.skip("the CUDA kernel can run here")
    rc, out, err = run(capsys, "replay", SEED, "--backends", "cuda")
    assert rc == 1 and re.search(r"^cuda\s+skipped\b", out, re.M) and why in out
    assert first_line(err) == f"kdkit: {SEED}: nothing judged (cuda skipped)"


def test_against_a_backend_that_cannot_run_exits_1_before_work(capsys):
    why = backends.unavailable("cuda")
    if why is None:
        pytest.skip("the CUDA kernel can run here")
    rc, out, err = run(capsys, "replay", SEED, "--against", "cuda")
    assert rc == 1 and out == "" and first_line(err).startswith("kdkit: --against cuda cannot run here: ")


def test_skip_reasons_name_only_commands_that_exist():
    """Issue 12 item 3: a reason that says `kdkit X` must name a subcommand kdkit has."""
    names = {c[0] for c in COMMANDS}
    case = make_case()
    for b in backends.BACKENDS:
        for why in (backends.unavailable(b), backends.unavailable(b, case)):
            for cmd in re.findall(r"`kdkit (\w+)", why or ""):
                assert cmd in names, f"{b}: {why}"


def test_cuda_skip_reason_is_true_without_a_gpu():
    """Issue 12 item 2: on a machine with no CUDA GPU the reason says so, not 'install CuPy'."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("there is a GPU here")
    why = backends.unavailable("cuda")
    assert "no CUDA GPU" in why and "CuPy" not in why, why


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


def test_inspect_takes_directories_and_several_files(capsys):
    """Issue 12 item 6: `kdkit inspect DIR` said 'no such case file' for a directory that exists."""
    rc, out, err = run(capsys, "inspect", DATA)
    every = sorted(DATA.rglob("*.pt"))
    assert len(every) >= 6
    assert first_line(out) == f"case {load(every[0]).case_id}  ({every[0]})"
    for p in every:
        assert f"({p})" in out
    assert rc == 1  # failures/ holds the known-bad cases
    rc, out, _ = run(capsys, "inspect", bundled_path("seed-shape"), bundled_path("ragged-bs4"))
    assert rc == 0 and out.count("lint: clean") == 2


def test_inspect_shows_what_it_can_and_exits_2_for_the_rest(capsys, tmp_path, seed_case_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file\n")
    rc, out, err = run(capsys, "inspect", seed_case_path, bad)
    assert rc == 2 and "lint: clean" in out
    assert re.match(rf"kdkit: cannot load case: {re.escape(str(bad))}", first_line(err)), err


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


# ---- replay / report -------------------------------------------------------------------------------
def test_replay_oracle_torch(capsys, seed_case_path):
    rc, out, err = run(capsys, "replay", seed_case_path, "--backends", "oracle,torch")
    assert rc == 0, out + err
    assert first_line(out).startswith("seed-shape: synthetic bs=1 H=8 q_len=9 prefix=21")
    lines = SEED_LINE.findall(out)
    assert len(lines) == 2, out  # one seed-style line per judged backend
    assert re.search(r"^torch\s+pass\b", out, re.M), out
    assert "lint: clean" in out


def test_replay_all_skips_with_reasons(capsys, seed_case_path):
    rc, out, err = run(capsys, "replay", seed_case_path, "--backends", "all", "--allow-skip")
    assert rc == 0, out + err
    for name in backends.BACKENDS:
        assert re.search(rf"^{name}\s+(pass|skipped|reference)\b", out, re.M), f"{name} missing:\n{out}"
        why = backends.unavailable(name, load(seed_case_path))
        if why:
            assert why in out


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
    assert first_line(err) == f"kdkit: {path}: lint errors (scratch-slot-referenced)"


def test_a_bad_file_among_good_ones_stops_before_any_work(capsys, tmp_path, seed_case_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file\n")
    target = tmp_path / "r.html"
    rc, out, err = run(capsys, "report", seed_case_path, bad, "--out", target)
    assert rc == 2 and out == "", out  # nothing replayed, nothing printed
    assert re.match(r"kdkit: cannot load case: .*bad\.pt", first_line(err)) and "nothing was run" in err
    assert not target.exists()


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
    rc, out, _ = run(capsys, "report", seed_case_path, "--backends", "oracle,torch", "--out", target)
    assert rc == 0 and target.read_bytes() == before
    others = [p for p in tmp_path.iterdir() if p != target]
    assert len(others) == 1 and others[0].name.startswith("r-") and others[0].suffix == ".html"
    assert str(others[0]) in out
    rc, _, _ = run(capsys, "report", seed_case_path, "--backends", "torch", "--out", target, "--force")
    assert rc == 0 and target.read_bytes() != before


def test_report_over_a_directory(capsys, tmp_path, monkeypatch):
    """One report for every case under a directory, named after the first, under ./reports."""
    cases = tmp_path / "cases"
    cases.mkdir()
    for name in ("seed-shape", "ragged-bs4"):
        shutil.copy(bundled_path(name), cases)
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "report", cases, "--backends", "oracle,torch")
    assert rc == 0, out + err
    assert out.strip().splitlines()[-2:] == ["report: reports/ragged-bs4.html", "all 2 cases passed"]
    html = (tmp_path / "reports" / "ragged-bs4.html").read_text()
    assert "ragged-bs4" in html and "seed-shape" in html


def test_replay_markdown_report(capsys, seed_case_path, tmp_path):
    target = tmp_path / "r.md"
    rc, out, err = run(capsys, "replay", seed_case_path, "--backends", "oracle,torch", "--report", target)
    assert rc == 0, out + err
    md = target.read_text()
    assert md.startswith("# kdkit replay report") and "## Machine" in md and "Result: pass" in md
    assert len(SEED_LINE.findall(md)) == 2
    # the CPU line: the torch and oracle backends' last bits depend on the CPU's kernels and threads
    cpu = re.search(r"^- cpu: (.+)$", md, re.M)
    assert cpu and re.search(r"; torch CPU kernels \w+, \d+ threads$", cpu.group(1)), md


def test_demo_report_is_one_file_it_overwrites(capsys, tmp_path, seed_case_path):
    """Issue 12 item 12: `make demo` writes reports/demo.html with --force, never a new file each run."""
    make = (ROOT / "Makefile").read_text()
    demo = re.search(r"^demo:.*\n((?:\t.*\n)+)", make, re.M).group(1)
    assert "--report reports/demo.html" in demo and "--force" in demo and "--allow-skip" in demo
    target = tmp_path / "demo.md"
    for _ in range(2):
        rc, _, err = run(capsys, "replay", seed_case_path, "--backends", "torch", "--report", target, "--force")
        assert rc == 0, err
    figures = tmp_path / "demo-figures"                     # the Markdown's PNGs (where kaleido is), replaced too
    assert [p for p in files_under(tmp_path) if figures not in (tmp_path / p).parents] == [target.relative_to(tmp_path)]


# ---- progress on slow work -----------------------------------------------------------------------
class _Terminal(io.StringIO):
    """A stderr that says it is a terminal: tqdm shows its bar only there."""

    def isatty(self):
        return True


def test_progress_bar_names_each_backend_on_a_terminal(capsys, monkeypatch, seed_case_path):
    """Issue 12 item 9: a replay that takes tens of seconds printed nothing while it ran."""
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    rc = main(["replay", str(seed_case_path), "--backends", "oracle,torch"])
    out = capsys.readouterr().out
    assert rc == 0, out
    bar = term.getvalue()
    assert "seed-shape: oracle" in bar and "seed-shape: torch" in bar, bar
    assert re.search(r"2/2 \[", bar), bar
    assert "seed-shape: oracle" not in out  # the bar stays on stderr; stdout is the results
    term.seek(0), term.truncate()
    rc = main(["replay", str(seed_case_path), str(bundled_path("ragged-bs4")), "--backends", "torch"])
    bar = term.getvalue()
    assert rc == 0 and "seed-shape (1/2): torch" in bar and "ragged-bs4 (2/2): oracle" in bar, bar
    assert re.search(r"4/4 \[", bar) and not re.search(r"[5-9]/4 \[", bar), bar


def test_no_progress_bar_when_stderr_is_not_a_terminal(capsys, seed_case_path):
    rc, out, err = run(capsys, "replay", seed_case_path, "--backends", "oracle,torch")
    assert rc == 0 and err == ""


# ---- help ------------------------------------------------------------------------------------------
def _options(parser):
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                yield name, action, p


def test_every_option_has_help_and_its_default():
    """Issue 12 item 7: `synth --help` showed no defaults and `--seed` had no help."""
    parser = build_parser("*")
    missing = []
    for name, action, p in _options(parser):
        text = p.formatter_class(p.prog)._get_help_string(action) or ""
        if not action.help or not (action.required or "default" in text):
            missing.append(f"{name} {action.option_strings[0]}: {text!r}")
    assert not missing, missing


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        main(["synth", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    flat = " ".join(out.split())
    for want in ("(default: 21)", "(default: 9)", "(default: 8)", "(default: ddtree)", "(default: 0)",
                 "random seed", "(default: Kimi K2.6's, 0.144680)"):
        assert want in flat, want


def test_top_level_help_lists_each_command_uncut(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    flat = " ".join(capsys.readouterr().out.split())
    assert "Exit codes: 0 all the requested work ran and passed; 1 " in flat
    for name, _, handler in COMMANDS:
        line = summary(handler)
        assert line.endswith(".") and f"{name} {line}" in flat, (name, line)


# ---- start-up ----------------------------------------------------------------------------------------
PROBE = ("import sys\nfrom kdkit.cli import main\ntry:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n"
         "    rc = e.code\nprint('IMPORTED', *sorted(m for m in ('torch', 'plotly', 'triton') if m in sys.modules))\n"
         "sys.exit(rc)\n")


@pytest.mark.parametrize("argv,rc,unwanted", [
    (["--help"], 0, ("torch", "plotly")),
    (["nosuch"], 2, ("torch", "plotly")),
    (["replay", "--help"], 0, ("plotly", "triton")),
    (["inspect", str(SEED)], 0, ("plotly", "triton")),
    (["replay", str(SEED), "--backends", "oracle"], 1, ("plotly", "triton")),   # (imports, not numerics: nothing judged, rc 1)
], ids=["help", "bad-arg", "replay-help", "inspect", "replay"])
def test_start_up_imports_only_what_the_command_needs(tmp_path, argv, rc, unwanted):
    """Issue 12 item 13: the command line imports torch and plotting only when the command needs them."""
    p = proc("-c", PROBE, *argv, cwd=tmp_path)
    assert p.returncode == rc, p.stdout + p.stderr
    imported = p.stdout.strip().splitlines()[-1].split()[1:]
    assert not set(imported) & set(unwanted), imported


def test_cli_as_subprocess(seed_case_path):
    p = proc("-m", "kdkit.cli", "inspect", str(seed_case_path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "lint: clean" in p.stdout


# ---- make demo / make test -------------------------------------------------------------------------
def _make_n(target: str, venv) -> str:
    if shutil.which("make") is None:
        pytest.skip("no make here")
    p = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_make_demo_fetches_only_what_the_demo_needs(tmp_path):
    """Issue 12 item 9: a cold `make demo` printed only pip lines and fetched wheels only tests read."""
    demo = _make_n("demo", tmp_path / "venv")
    assert "pip download" not in demo and "[dev" not in demo
    assert re.search(r"echo .*kdkit: ", demo), "no line before each set-up step"
    test = _make_n("test", tmp_path / "venv")
    assert "pip download" in test and "'.[dev]'" in test and "pytest" in test


def test_make_test_on_the_host_python_sets_nothing_up():
    """`make test VENV=` is the GPU host without internet: no venv, no pip, no download."""
    for target in ("test", "demo"):
        cmds = _make_n(target, "")
        for setup in ("pip", "venv", "apt-get", "download"):
            assert setup not in cmds, cmds


def test_make_refuses_set_up_without_the_disk_it_needs(tmp_path):
    """CI went red with pip's ENOSPC halfway through the set-up: now the set-up refuses first,
    says how much it needs and what to free, and creates nothing."""
    if shutil.which("make") is None:
        pytest.skip("no make here")
    venv = tmp_path / "venv"
    p = subprocess.run(["make", "demo", f"VENV={venv}", "VENV_GB=100000000"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert re.search(r"creating \S+venv needs about 100000000 GB free here; df shows \d+ MB", p.stderr), p.stderr
    assert "NEED_DISK=" in p.stderr and not venv.exists()


def test_replay_names_the_sglang_release(capsys, seed_case_path):
    """Issue 4's CPU check: replay through SGLang's kernel passes and says which release ran."""
    why = backends.unavailable("triton_sglang")
    if why:
        pytest.skip(why)
    rc = main(["replay", str(seed_case_path), "--backends", "triton_sglang,torch,oracle"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert re.search(r"^ran triton_sglang: SGLang \d+\.\d+\.\d+\S* \(", out, re.M), out


# ---- test markers match the README: every test that needs a GPU is marked `gpu` --------------------
def test_no_test_skips_on_the_gpu_by_hand():
    """A test that needs a GPU says so with @pytest.mark.gpu (conftest skips it, with the reason,
    where torch.cuda is unavailable); a hand-written skipif would hide it from `-m gpu`."""
    hand = re.compile(r"skipif\(\s*not\s+torch\.cuda\.is_available\(\)")
    offenders = [f"{p.name}:{text[:m.start()].count(chr(10)) + 1}"
                 for p in sorted((ROOT / "tests").glob("test_*.py"))
                 for text in [p.read_text()] for m in hand.finditer(text)]
    assert not offenders, f"mark these @pytest.mark.gpu instead: {offenders}"


def _collected(marker: str) -> set:
    p = proc("-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marker, str(ROOT / "tests"),
             cwd=ROOT)
    assert p.returncode in (0, 5), p.stdout + p.stderr
    return {line.split("[")[0] for line in p.stdout.splitlines() if "::" in line}


def test_gpu_marker_selects_every_gpu_test():
    """Issue 12 item 11: `pytest -m gpu` collected 1 test of 538; `-m "not gpu"` collected the
    CUDA-kernel tests."""
    gpu, cpu = _collected("gpu"), _collected("not gpu")
    known = {"tests/test_torch_ref.py::test_gpu_matches_cpu", "tests/test_triton_sglang.py::test_gpu_kimi_shapes"}
    assert known <= gpu, gpu
    assert any(t.startswith("tests/test_cuda_kernel.py::") for t in gpu), gpu
    assert not {t for t in cpu if t in known or t.startswith("tests/test_cuda_kernel.py::")}, cpu & gpu
    assert not gpu & cpu


def test_compile_without_nvrtc_exits_1_with_the_fix(capsys, monkeypatch):
    """Nothing requested can run without NVRTC: exit 1 and the install line (arguments still exit 2)."""
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # `from cuda.bindings import nvrtc` fails
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", None)
    rc, out, err = run(capsys, "compile", "--arch", "sm_90")
    assert rc == 1 and out == ""
    assert first_line(err).startswith("kdkit: NVRTC is not installed: `pip install cuda-bindings")
    rc, _, err = run(capsys, "compile", "--arch", "sm_75")
    assert rc == 2 and "needs sm_80 or newer" in err


# ---- found by an audit (2026-12-02): each was a traceback, a wrong exit code or a file left behind ---
def test_a_path_the_system_refuses_is_one_line_and_exit_2(capsys, tmp_path):
    rc, out, err = run(capsys, "inspect", tmp_path / ("a" * 300 + ".pt"))
    assert rc == 2 and "File name too long" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("arch", ["sm_80a", "sm_86f", "sm_90f", "sm_090"])
def test_compile_refuses_arch_variants_that_do_not_exist(capsys, arch):
    rc, out, err = run(capsys, "compile", "--arch", arch, "--rows", "8")
    assert rc == 2 and "--arch" in err and len(err.strip().splitlines()) == 1, err


def test_sitecustomize_into_a_file_says_it_is_not_a_directory(capsys, tmp_path):
    f = tmp_path / "afile"
    f.write_text("")
    rc, out, err = run(capsys, "capture", "sitecustomize", f, "--force")
    assert rc == 2 and "is a file, not a directory" in err and f.read_text() == ""


def test_report_dir_is_not_made_when_nothing_can_be_judged(capsys, tmp_path):
    if not backends.unavailable("cuda"):
        pytest.skip("a GPU is here: --against cuda runs")
    rc, out, err = run(capsys, "report", SEED, "--against", "cuda", "-o", tmp_path / "pages")
    assert rc == 1 and "cannot run here" in err and not (tmp_path / "pages").exists()


def test_report_names_its_page_from_the_case_id_never_a_path(capsys, tmp_path, monkeypatch):
    """A shared case's id is data: `../../outside` must not put the report outside reports/."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    case = make_case(case_id="../../outside")
    path = case.save(tmp_path / "work" / "c.pt")
    rc, out, err = run(capsys, "report", path, "--backends", "torch")
    assert rc == 0, err
    assert (tmp_path / "work" / "reports" / "outside.html").is_file()
    assert not (tmp_path / "outside.html").exists()
    long_id = make_case(case_id="x" * 300).save(tmp_path / "work" / "long.pt")
    rc, out, err = run(capsys, "report", long_id, "--backends", "torch")
    assert rc == 0, err
    assert (tmp_path / "work" / "reports" / ("x" * 120 + ".html")).is_file()


def test_synth_refuses_a_case_larger_than_the_machine_before_building_it(capsys, tmp_path):
    rc, out, err = run(capsys, "synth", "--out", tmp_path / "big.pt", "--prefix", "100000000")
    assert rc == 2 and "GiB" in err and "--prefix 100000000" in err and not (tmp_path / "big.pt").exists()


def test_bench_leaves_no_folder_behind_when_it_cannot_run(capsys, tmp_path):
    from kdkit.kernel import unavailable
    if not unavailable():
        pytest.skip("a GPU is here: bench runs")
    rc, out, err = run(capsys, "bench", "--out", tmp_path / "new" / "sub")
    assert rc == 1 and not (tmp_path / "new").exists()


# ---- found by a review (2026-12-02) --------------------------------------------------------------
def test_a_replay_the_reference_cannot_run_stops_with_a_line_not_a_traceback(capsys):
    """_replay_all named `backends` without importing it: any exception from a replay became a
    NameError traceback, and neither of its two messages could be said."""
    rc, _, err = run(capsys, "replay", str(SEED), "--backends", "torch", "--against", "captured")
    assert rc == 1 and "NameError" not in err and "Traceback" not in err
    assert err.startswith(f"kdkit: {SEED}: ") and "captured" in err


def test_a_markdown_report_keeps_a_hostile_case_id_inside_its_text(capsys, tmp_path):
    """A case id with a fence and a newline closed the report's code blocks early and split its
    heading, so raw HTML from it reached the Markdown."""
    from kdkit.case import load
    case = load(SEED)
    case.meta["case_id"] = "x\n```\n<img src=x onerror=alert(1)>\n```"
    src = tmp_path / "hostile.pt"
    case.save(src)
    target = tmp_path / "r.md"
    run(capsys, "replay", str(src), "--backends", "torch", "--report", str(target))
    text = target.read_text()
    fence, outside = None, []  # CommonMark: a fence closes only with at least as many backticks
    for ln in text.splitlines():
        run_ = len(ln) - len(ln.lstrip("`"))
        if fence is None and run_ >= 3:
            fence = run_
        elif fence is not None and run_ >= fence and not ln.strip("`"):
            fence = None
        elif fence is None:
            outside.append(ln)
    assert fence is None and "&lt;img" in text
    assert not any("<img" in ln for ln in outside), [ln for ln in outside if "<img" in ln]
    heads = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert any("x ``` &lt;img" in h for h in heads), heads


def test_report_beside_a_dangling_link_takes_a_timestamped_name(capsys, tmp_path):
    """A link to nowhere is a name taken: the report goes beside it (as beside a file), not lost."""
    link = tmp_path / "r.html"
    link.symlink_to(tmp_path / "nowhere.html")
    rc, out, err = run(capsys, "report", SEED, "--backends", "torch", "-o", link)
    assert rc == 0, err
    written = [p for p in tmp_path.glob("r-*.html")]
    assert len(written) == 1 and link.is_symlink() and not (tmp_path / "nowhere.html").exists()


def test_report_dir_run_twice_keeps_the_first_and_says_so(capsys, tmp_path):
    pages = tmp_path / "pages"
    assert run(capsys, "report", SEED, "--backends", "torch", "-o", pages)[0] == 0
    first = (pages / "index.html").read_text()
    rc, out, err = run(capsys, "report", SEED, "--backends", "torch", "-o", pages)
    assert rc == 0, err
    assert "index.html and the pages already there are kept" in out
    assert (pages / "index.html").read_text() == first and len(list(pages.glob("index-*.html"))) == 1


def test_ctrl_c_is_one_line_and_status_130(capsys, monkeypatch, tmp_path):
    import kdkit.cli as cli

    def interrupted(args):
        """Ctrl-C in the middle of a command"""
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "COMMANDS", [(n, a, interrupted if n == "synth" else h) for n, a, h in cli.COMMANDS])
    rc, out, err = run(capsys, "synth", "--out", tmp_path / "c.pt")
    assert rc == 130 and err.strip() == "kdkit: interrupted" and not (tmp_path / "c.pt").exists()


def test_inspect_allow_nonfinite_shows_a_nan_capture_and_its_lint(capsys, tmp_path):
    """A capture with NaN in q is refused by default (no answer is defined), and the refusal names
    the flag that shows it: nothing captured is out of reach."""
    case = make_case()
    q = case.q.clone()
    q[0, 0, 0] = float("nan")
    path = case.clone(q=q).save(tmp_path / "nan.pt")
    rc, out, err = run(capsys, "inspect", path)
    assert rc == 2 and "--allow-nonfinite" in err
    rc, out, err = run(capsys, "inspect", "--allow-nonfinite", path)
    assert rc == 1 and "nonfinite-input [q]" in out


def test_inspect_dir_names_a_dangling_case_link(capsys, tmp_path):
    d = tmp_path / "caps"
    d.mkdir()
    make_case().save(d / "a.pt")
    (d / "gone.pt").symlink_to(tmp_path / "nowhere.pt")
    rc, out, err = run(capsys, "inspect", d)
    assert rc == 2 and "gone.pt" in err


def test_synthetic_cases_that_differ_in_layout_magnitude_or_cap_get_their_own_ids(capsys, tmp_path):
    """Issue 33: two cases apart only in layout, magnitude or logit cap had one id (one report page,
    one JUnit name for both). The defaults add nothing: the ids written so far stay."""
    variants = {"default": [], "unified": ["--layout", "unified"], "mag8": ["--magnitude", "8"],
                "cap30": ["--logit-cap", "30"], "scale": ["--sm-scale", "0.1"],
                "all": ["--layout", "unified", "--magnitude", "8", "--logit-cap", "30"]}
    ids = {}
    for name, extra in variants.items():
        rc, out, err = run(capsys, "synth", "--out", tmp_path / f"{name}.pt", "--prefix", "5", "--q-len", "3", *extra)
        assert rc == 0, err
        ids[name] = load(tmp_path / f"{name}.pt").case_id
    assert ids["default"] == "synth-ddtree-bs1-p5-q3-h8-s0"
    assert len(set(ids.values())) == len(ids), ids
    assert ids["all"] == "synth-ddtree-bs1-p5-q3-h8-s0-unified-cap30-mag8"


def test_a_missing_output_folder_is_made_and_said(capsys, tmp_path, monkeypatch):
    """Issue 33: a mistyped output path grew folders unseen (as root, at /). Each one a command
    makes is named on stderr, once; a folder already there is not."""
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "synth", "--out", "new/cases/c.pt")
    assert rc == 0 and err.splitlines() == ["kdkit: created new/cases"] and (tmp_path / "new/cases/c.pt").is_file()
    case = "new/cases/c.pt"
    rc, out, err = run(capsys, "replay", case, "--backends", "torch", "--report", "new/r/x.html",
                       "--junit", "new/j/j.xml", "--json", "new/cases/r.json")
    assert rc == 0, err
    assert [ln for ln in err.splitlines() if "created" in ln] == ["kdkit: created new/r", "kdkit: created new/j"]
    assert (tmp_path / "new/r/x.html").is_file() and (tmp_path / "new/j/j.xml").is_file()
    rc, out, err = run(capsys, "report", case, "--backends", "torch", "-o", "new/pages/deeper")
    assert rc == 0 and "kdkit: created new/pages/deeper" in err.splitlines()
    assert (tmp_path / "new/pages/deeper/index.html").is_file()
    rc, out, err = run(capsys, "report", case, "--backends", "torch", "-o", "new/pages/deeper")
    assert rc == 0 and "created" not in err
