"""Bring your own Triton kernel (kdkit.byok.triton) and the starter generator (kdkit.byok.starter).

On a CPU everything runs under Triton's interpreter (TRITON_INTERPRET=1, set by the adapter before
the kernel file imports triton): about 1-4 s a bundled case on 2 cores.

Tolerance: kdkit.compare.judge against the float64 oracle with no production term, as `kdkit
replay` judges a backend when SGLang's kernel did not run: max_abs <= 2^-6 max|oracle| (two bf16
roundings with 2x margin), the error in bf16 spacings (compare.ULP_*), each row's LSE within
compare.LSE_ULPS fp32 units.
"""
from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kdkit.byok import starter
from kdkit.byok.triton import InputError, SignatureError, TritonKernel
from kdkit.case import load

from conftest import BUNDLED, DATA

ROOT = Path(__file__).resolve().parents[1]
GPU = torch.cuda.is_available()  # a GPU runs the kernels compiled; without one, the interpreter does
KERNEL = starter.TEMPLATES / "triton" / "kernel.py"
MASK_LINE = "        seen = seen & visible\n"   # the one line that applies the tree (or causal) mask


def _case(name):
    return load(DATA / f"{name}.pt")


@pytest.fixture(scope="module")
def starter_backend():
    b = TritonKernel("kdkit_starter", KERNEL)
    if b.unavailable():
        pytest.skip(b.unavailable())
    return b


@pytest.mark.parametrize("name", BUNDLED)
def test_starter_passes_the_judge_on_every_bundled_case(starter_backend, name):
    v = starter.judge(starter_backend, DATA / f"{name}.pt")
    assert v.passed, "; ".join(v.reasons)


@pytest.fixture(scope="module")
def maskless(tmp_path_factory):
    """The negative control: the starter with its mask line removed (the tree ignored)."""
    text = KERNEL.read_text()
    assert text.count(MASK_LINE) == 1, "the starter's mask line moved: update MASK_LINE"
    path = tmp_path_factory.mktemp("maskless") / "kernel.py"
    path.write_text(text.replace(MASK_LINE, ""))
    return TritonKernel("maskless", path)


@pytest.mark.parametrize("name", BUNDLED)
def test_starter_without_its_mask_fails_the_judge_on_tree_cases(starter_backend, maskless, name):
    case = _case(name)
    assert case.custom_mask is not None, f"{name} has no tree: the negative control says nothing there"
    v = starter.judge(maskless, case)
    # (on long-prefix-8k the 8192 prefix columns outweigh the draft: the LSE and ulp checks catch it)
    assert not v.passed and v.caught_by, v.reasons


def test_contract_options_prepare_and_plan(starter_backend):
    b = starter_backend
    assert b.NAME == "kdkit_starter" and b.LINT_CLEAN and "Triton" in b.LABEL
    # the declared option, read off launch()'s signature in the file's text
    params = inspect.signature(b.run).parameters
    assert list(params) == ["case", "nsplit"] and params["nsplit"].default == 4
    assert params["nsplit"].kind is inspect.Parameter.KEYWORD_ONLY
    assert inspect.signature(b.prepare).parameters.keys() == params.keys()
    case = _case("seed-shape")
    r1 = b.run(case, nsplit=1)
    assert r1.out.shape == (9, 8, 512) and r1.out.dtype == torch.bfloat16 and r1.lse.shape == (9, 8)
    assert "\n" not in r1.ran and "nsplit 1" in r1.ran and ("TRITON_INTERPRET=1" in r1.ran) != GPU
    # another split count merges to the same answer (fp32 partials: a few fp32 ulps apart, far
    # under bf16's spacing, so the bf16 outputs agree to one bf16 ulp of |out| <= ~0.1)
    p = b.prepare(case, nsplit=3)
    p.launch()
    r3 = p.result()
    assert p.graph_safe == GPU and p.info["ran"] == r3.ran  # (the interpreter's launch is no CUDA launch)
    assert (r3.out.float() - r1.out.float()).abs().max() <= 2 ** -9
    assert (r3.lse - r1.lse).abs().max() <= 1e-5
    with pytest.raises(TypeError, match="unknown option.*nsplit"):
        b.run(case, splits=2)
    with pytest.raises(ValueError, match="field 'nsplit'"):   # the starter's workspace() says so
        b.run(case, nsplit=0)
    with pytest.raises(InputError, match="field 'nsplit'.*int"):
        b.run(case, nsplit="2")


def _live(case, **change):
    """The case's tensors on the run device (on a GPU bf16, as the server has them; on the CPU
    fp32, the interpreter's dtype) and its LiveBatch, as the server's plugin (kdkit.capture.live)
    gives plan(): the metadata tensors and host ints."""
    from kdkit.byok.batch import case_batch
    dev = "cuda" if GPU else "cpu"
    x = {n: None if getattr(case, n) is None else getattr(case, n).to(dev, copy=True) for n in
         ("q", "k", "v", "kv_buffer", "qo_indptr", "kv_indptr", "kv_indices", "custom_mask", "mask_indptr")}
    if not GPU:
        x.update({n: x[n].float() for n in ("q", "k", "v", "kv_buffer")})
    return x, dataclasses.replace(case_batch(case, x), **change)


def test_live_pair_reads_no_metadata_at_plan_time_and_launches_into_out(starter_backend):
    """The pair as the server calls it: plan(batch) reads nothing of the metadata's contents (here
    they are garbage at plan time, as a CUDA graph's buffers before SGLang refills them), and
    launch writes `out` from what they hold at launch: the answer the judge passes."""
    from kdkit.backends import Result, registry
    b = starter_backend
    registry.check(b, "starter")  # the contract, the live pair included
    assert registry.has_live_pair(b)
    case = _case("ragged-bs4")
    x, batch = _live(case)
    real = {n: x[n].clone() for n in ("kv_indptr", "kv_indices", "custom_mask", "mask_indptr")}
    for n in real:  # garbage of the right dtype, the size kept (the buffers' addresses stay)
        x[n].fill_(255 if n == "custom_mask" else 10 ** 6)
    p = b.plan(batch)
    for n, t in real.items():
        x[n].copy_(t)
    out = torch.full((case.num_tokens, case.num_heads, 512), float("nan"), dtype=x["q"].dtype, device=x["q"].device)
    assert b.launch(p, x["q"], x["k"], x["v"], x["kv_buffer"], out) is None
    v = starter.judge_result(b.NAME, case, Result(out.cpu(), p.lse.cpu()))
    assert v.passed, v.reasons
    # the next layer: other q through the same plan, into the same out
    x["q"].mul_(-1)
    b.launch(p, x["q"], x["k"], x["v"], x["kv_buffer"], out)
    assert starter.judge_result(b.NAME, case.clone(q=-case.q), Result(out.cpu(), p.lse.cpu())).passed
    # the tensors are checked against the plan before anything launches (host only)
    with pytest.raises(InputError, match="field 'q'.*shape"):
        b.launch(p, x["q"][:3], x["k"], x["v"], x["kv_buffer"], out)
    with pytest.raises(InputError, match="field 'out'.*contiguous"):
        b.launch(p, x["q"], x["k"], x["v"], x["kv_buffer"], out.transpose(0, 1).contiguous().transpose(0, 1))
    assert b.unsupported(batch) is None
    if not GPU:
        assert "interpreter cannot tl.dot" in b.unsupported(dataclasses.replace(batch, dtype=torch.bfloat16))


def test_bad_input_is_refused_naming_the_field(starter_backend):
    """What the host knows is checked at plan(batch); the index arrays' contents where a case is
    run (a case's path may read them, a live plan may not)."""
    c = _case("seed-shape")
    x, batch = _live(c)
    bad = {"mask_indptr": dict(mask_indptr=x["mask_indptr"][:1]), "sm_scale": dict(sm_scale=float("inf")),
           "qo_indptr": dict(batch_size=3), "kv_indptr": dict(kv_indptr=x["kv_indptr"].float())}
    for field, change in bad.items():
        with pytest.raises(InputError, match=f"field '{field}'"):
            starter_backend.plan(dataclasses.replace(batch, **change))
    contents = {"custom_mask": dict(custom_mask=c.custom_mask[:200]),
                "kv_indptr": dict(kv_indptr=c.kv_indptr + torch.tensor([0, 50], dtype=c.kv_indptr.dtype))}
    for field, change in contents.items():
        with pytest.raises(InputError, match=f"field '{field}'"):
            starter_backend.run(c.clone(**change))
    with pytest.raises(InputError, match="field 'kv_indices'.*outside"):
        starter_backend.run(c.clone(kv_buffer=c.kv_buffer[:5]))


def test_launcher_signature_errors_name_the_parameter(tmp_path):
    def launch(q, out, nsplit=4, stride="x"):
        pass
    with pytest.raises(SignatureError, match="'stride'"):
        TritonKernel("x", launch=launch)

    def launch2(q, out, o_part):
        pass
    with pytest.raises(SignatureError, match="'o_part'.*workspace"):
        TritonKernel("x", launch=launch2)
    with pytest.raises(ValueError, match="field 'name'"):
        TritonKernel("not a name", KERNEL)
    with pytest.raises(ValueError, match="field 'source'.*does not exist"):
        TritonKernel("x", tmp_path / "nope.py")


def test_unavailable_has_no_side_effects(starter_backend, monkeypatch):
    before = dict(os.environ)
    assert starter_backend.unavailable() is None
    assert dict(os.environ) == before


def test_generator_refuses_nonempty_dirs_and_bad_names(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("my work")
    with pytest.raises(starter.StarterError, match="not empty"):
        starter.write(tmp_path / "full", "triton", "mine")
    assert (tmp_path / "full" / "mine.txt").read_text() == "my work"
    for name in ("my-kernel", "1st", "class", "torch", "triton_sglang"):
        with pytest.raises(starter.StarterError, match="--name"):
            starter.write(tmp_path / "new", "triton", name)
    with pytest.raises(starter.StarterError, match="--lang"):
        starter.write(tmp_path / "new", "rust", "mine")
    assert not (tmp_path / "new").exists()


def test_generator_writes_the_cuda_layout_too(tmp_path):
    pkg = starter.write(tmp_path / "cu", "cuda", "mine_cu")
    assert sorted(p.name for p in pkg.iterdir()) == ["__init__.py", "backend.py", "kernel.cu"]
    for path in (tmp_path / "cu").rglob("*.*"):
        assert "kdkit_starter" not in path.read_text(), path
    assert '"kernel.cu"' in (tmp_path / "cu" / "pyproject.toml").read_text()


def test_generated_package_installs_and_its_entry_point_is_a_backend(tmp_path):
    """pip accepts the package (an editable install into a folder, offline), the entry point
    resolves through importlib.metadata to a backend meeting the contract, and the generated
    test passes (on seed-shape here: the same kernel passes every bundled case above)."""
    pkg = starter.write(tmp_path / "mine", "triton", "mine")
    for path in (tmp_path / "mine").rglob("*.*"):
        assert "kdkit_starter" not in path.read_text(), path
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                          "--no-index", "-q", "-e", str(pkg.parent), "--target", str(target)],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    boot = f"import site; site.addsitedir({str(target)!r}); "
    probe = boot + (
        "from importlib.metadata import entry_points; from kdkit.backends import Result; import inspect; "
        "ep, = [e for e in entry_points(group='kdkit.backends') if e.name == 'mine']; b = ep.load(); "
        "assert b.NAME == 'mine' and b.unavailable() is None and callable(b.prepare); "
        "print(ep.value, list(inspect.signature(b.run).parameters))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["mine.backend:backend", "['case',", "'nsplit']"]
    test = boot + ("import pytest; raise SystemExit(pytest.main(['-q', '-p', 'no:cacheprovider', '-k', 'seed-shape', "
                   f"{str(tmp_path / 'mine' / 'tests')!r}]))")
    r = subprocess.run([sys.executable, "-c", test], capture_output=True, text=True, env=env, timeout=600,
                       cwd=tmp_path / "mine")
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    # `kdkit replay --backends mine`: the installed backend by its entry-point name
    def replay(*cases):
        cli = boot + f"from kdkit.cli import main; raise SystemExit(main({['replay', *cases, '--backends', 'mine']!r}))"
        return subprocess.run([sys.executable, "-c", cli], capture_output=True, text=True, env=env, timeout=600,
                              cwd=ROOT)
    r = replay("data/captured_tensors/seed-shape.pt")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "ran mine: mine (kernel.py, Triton" in r.stdout, r.stdout[-2000:]
    # the editable install runs the package's own file: without its mask line it fails the judge
    kernel = pkg / "kernel.py"
    assert kernel.read_text().count(MASK_LINE) == 1
    kernel.write_text(kernel.read_text().replace(MASK_LINE, ""))
    r = replay("data/captured_tensors/seed-shape.pt", "data/captured_tensors/ragged-bs4.pt")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert len(re.findall(r"^mine\s+fail\s", r.stdout, re.M)) == 2, r.stdout[-2000:]

