"""kdkit.develop, the functions notebooks/develop.ipynb calls, on the CPU: the kernel named by a
spec, the cases of a folder, the verdicts and their figures, the planted bugs on the same cases.
(The notebook itself runs under papermill in test_notebooks.py; the GPU timing in its gpu test.)"""
from __future__ import annotations

import pytest

from conftest import BUNDLED, DATA, ROOT
from kdkit import backends, develop
from kdkit.backends import torch_ref
from kdkit.byok.starter import TEMPLATES


class _Planted:
    """A wrong kernel for the figures' tests: kdkit's torch backend with one planted bug."""

    def __init__(self, name, mutant):
        self.NAME, self._mutant = name, mutant

    def unavailable(self, case=None):
        return None

    def run(self, case, *, nsplit=2):
        return torch_ref.run(case, nsplit=nsplit, mutant=self._mutant)


@pytest.fixture
def wrong():
    name = backends.register("kd_dev_noscale", _Planted("kd_dev_noscale", "no-scale"))
    yield name
    backends.unregister(name)


def test_case_paths_a_folder_is_its_own_cases_only():
    got = develop.case_paths("data/captured_tensors")      # from the repository, as the notebook's default
    assert [p.stem for p in got] == sorted(BUNDLED)          # not failures/ or probes/: case sets of their own
    assert [p.name for p in develop.case_paths(DATA / "probes")][:1] == ["probe-8k.pt"]
    both = develop.case_paths([DATA / "seed-shape.pt", DATA / "seed-shape.pt", DATA / "ragged-bs4.pt"])
    assert [p.stem for p in both] == ["seed-shape", "ragged-bs4"]


def test_case_paths_refuses_a_folder_without_cases(tmp_path):
    with pytest.raises(ValueError, match="cases = .*no case files"):
        develop.case_paths(tmp_path)
    with pytest.raises(FileNotFoundError, match="nope: not found"):
        develop.case_paths("nope")


def test_load_kernel_takes_one_spec_and_not_the_oracle(monkeypatch, tmp_path):
    assert develop.load_kernel("torch") == "torch"
    with pytest.raises(ValueError, match="kernel = 'torch,cuda': one backend spec"):
        develop.load_kernel("torch,cuda")
    with pytest.raises(ValueError, match="the oracle is the reference"):
        develop.load_kernel("oracle")
    with pytest.raises(ValueError, match="unknown backend"):
        develop.load_kernel("no_such_kernel")
    # a file spec relative to the repository is found from another directory (JupyterLab's notebooks/):
    # loaded (and refused for what it is: a module of kdkit's, run on its own), not missing
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"/kdkit/backends/torch_ref.py: cannot load \(ImportError"):
        develop.load_kernel("kdkit/backends/torch_ref.py")
    with pytest.raises(FileNotFoundError, match="missing.py: not found"):
        develop.load_kernel("missing.py:backend")


def test_a_passing_kernel_its_verdicts_and_no_failure_figures():
    runs = develop.replay_cases("torch", develop.case_paths([DATA / "seed-shape.pt", DATA / "ragged-bs4.pt"]),
                                progress=False)
    ok, line = develop.outcome(runs, "torch")
    assert ok and line == "torch: 2 of 2 case(s) pass against the oracle"
    text = develop.verdict_text(runs)
    assert text.count("(against oracle") == 2 and text.count("tolerances, and why") == 1   # the legend once
    assert develop.failure_figures(runs, "torch") == {}
    assert develop.failures_line(runs, "torch") == "torch failed on none of the 2 case(s): no error heatmap to draw"
    fig = develop.margin_figure(runs, "torch")
    assert list(fig.data[0].x) == ["seed-shape", "ragged-bs4"] and all(0 < y < 1 for y in fig.data[0].y)


def test_a_wrong_kernel_fails_and_its_error_is_drawn(wrong, tmp_path):
    (tmp_path / "broken.pt").write_bytes(b"not a case")
    paths = [DATA / "seed-shape.pt", tmp_path / "broken.pt", DATA / "failures" / "mask-indptr-sliced.pt"]
    runs = develop.replay_cases(wrong, paths, progress=False)
    assert [develop.status(r, wrong) for r in runs] == ["fail", "cannot load", "error"]
    ok, line = develop.outcome(runs, wrong)
    assert not ok and line.startswith(f"{wrong}: 0 of 3 case(s) pass") and "fail: seed-shape" in line
    figs = develop.failure_figures(runs, wrong)
    assert set(figs) == {"error seed-shape", "kv error seed-shape"}
    assert f"seed-shape: {wrong} vs oracle" in figs["error seed-shape"].layout.title.text
    assert "failed on 1 case(s): seed-shape; did not run on broken, failure-mask-indptr-sliced" in \
        develop.failures_line(runs, wrong)
    margin = develop.margin_figure(runs, wrong)
    assert list(margin.data[0].x) == ["seed-shape"] and margin.data[0].y[0] > 1
    assert "not judged: broken (cannot load)" in margin.layout.title.text
    assert "broken.pt: cannot load" in develop.verdict_text(runs)


def test_planted_bugs_are_caught_and_inert_ones_said():
    runs = develop.replay_cases("torch", [DATA / "seed-shape.pt", DATA / "ragged-bs4.pt",
                                          DATA / "failures" / "mask-indptr-sliced.pt"], progress=False)
    bugs = develop.planted_bugs(runs, mutants=["no-scale", "merge-no-rescale"], nsplit=2)
    assert bugs.cases == ["seed-shape", "ragged-bs4"]
    assert bugs.status["no-scale"] == {"seed-shape": "caught", "ragged-bs4": "caught"}
    # the seed's 30 KV rows are one 32-row tile: two splits of it merge exactly (nothing to rescale)
    assert bugs.status["merge-no-rescale"] == {"seed-shape": "inert here", "ragged-bs4": "caught"}
    assert bugs.awake and all(bugs.ratio["no-scale"][c] > 1 for c in bugs.cases)
    assert len(bugs.notes) == 1 and "failure-mask-indptr-sliced: left out" in bugs.notes[0]
    assert [r["mutant"] for r in bugs.rows()] == ["no-scale", "merge-no-rescale"]
    fig = bugs.figure()
    assert "3 of 4 caught" in fig.layout.title.text and list(fig.data[0].y) == ["no-scale", "merge-no-rescale"]
    bugs.status["no-scale"]["ragged-bs4"] = "NOT caught"      # what a broken judge would give
    assert not bugs.awake
    with pytest.raises(ValueError, match="mutants: 'nope'"):
        develop.planted_bugs(runs, mutants=["nope"])


def test_resource_reports(tmp_path):
    assert "no resource report" in develop.resource_report("torch")
    assert "kdkit compile --arch sm_120" in develop.resource_report("cuda")
    from kdkit.kernel import builds
    if builds.supported_archs()["nvrtc"] is None:
        pytest.skip("NVRTC is not installed (kdkit's 'compile' extra): the CUDA starter's report needs it")
    # the CUDA starter, its module as the backend: built for sm_120 without a GPU
    (tmp_path / "kernel.cu").write_text((TEMPLATES / "cuda" / "kernel.cu").read_text().replace("kdkit_starter", "kd_dev_cu"))
    (tmp_path / "backend.py").write_text((TEMPLATES / "cuda" / "backend.py").read_text().replace(
        "kdkit_starter", "kd_dev_cu").split("\n# the module is a backend too")[0] + "\n_kernel = backend\ndel backend\n"
        "NAME, resources, unavailable, run = _kernel.NAME, _kernel.resources, _kernel.unavailable, _kernel.run\n")
    name = develop.load_kernel(str(tmp_path / "backend.py"))
    try:
        text = develop.resource_report(name)
        assert text.startswith("kd_dev_cu, sm_120:") and "kd_dev_cu_partial" in text and "fits sm_120 limits: yes" in text
        cu = tmp_path / "kernel.cu"
        cu.write_text("this is not CUDA;\n" + cu.read_text())
        assert f"{cu}(1): error" in develop.resource_report(name)      # the compiler's own line
    finally:
        backends.unregister(name)


def test_gpu_knobs_checked_and_the_cpu_line():
    assert develop.int_options("torch") == {"chunk_elems": 1 << 24}   # ints only: not nsplit=None, not bools
    shapes = develop.shapes([[1, 4096, 9]], heads=16)
    assert shapes[0].label == "1x4096 q9 H16"
    with pytest.raises(ValueError, match=r"shapes: \[1, 4096\]; each shape is \[bs, prefix, q_len\]"):
        develop.shapes([[1, 4096]])
    if develop.gpu() is None:
        assert develop.no_gpu_line("torch").startswith("no CUDA GPU here: timing skipped")
