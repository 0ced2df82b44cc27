"""FlashInfer Trace: kdkit's export read back by flashinfer_bench's own classes and run through its
own reference path; a FlashInfer Trace solution as a kdkit backend, judged on the bundled cases.

Needs `flashinfer_bench.data` (the trace extra: `pip install --no-deps flashinfer-bench==0.1.2`
beside pydantic, safetensors and docstring-parser; its wheel lists FlashInfer itself, which the
data classes and the python builder never import).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("flashinfer_bench.data", reason="flashinfer_bench is not installed (kdkit's trace extra)")

from flashinfer_bench.bench.utils import gen_inputs, load_safetensors  # noqa: E402
from flashinfer_bench.compile.registry import BuilderRegistry  # noqa: E402
from flashinfer_bench.data import Definition, Solution, TraceSet  # noqa: E402
from safetensors import safe_open  # noqa: E402

from kdkit import case as kcase  # noqa: E402
from kdkit.judge import compare  # noqa: E402
from kdkit.backends import oracle as oracle_backend  # noqa: E402
from kdkit.byok import flashinfer_trace as fit  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data" / "captured_tensors"
# the bundled cases and the probes: both layouts (probe-ragged is unified), a call without a mask
# (probe-causal), ragged batches, a prefix-0 request, q_len 1, an 8K prefix
CASES = sorted(DATA.glob("*.pt")) + sorted((DATA / "probes").glob("*.pt"))


@pytest.fixture(scope="module", autouse=True)
def fib_cache(tmp_path_factory):
    """FlashInfer-Bench's builders write the reference's sources under FIB_CACHE_PATH: a temp folder."""
    mp = pytest.MonkeyPatch()
    mp.setenv("FIB_CACHE_PATH", str(tmp_path_factory.mktemp("fib-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def cases():
    return {p: kcase.load(p) for p in CASES}


@pytest.fixture(scope="module")
def exported(tmp_path_factory, cases):
    root = tmp_path_factory.mktemp("fit")
    fit.export(root, CASES)
    return root


@pytest.fixture(scope="module")
def oracle_of(cases):
    memo = {}

    def get(case):
        if case.case_id not in memo:
            memo[case.case_id] = oracle_backend.run(case)
        return memo[case.case_id]
    return get


def judged(case, out, lse, oracle_of) -> compare.Verdict:
    """kdkit's judge against the float64 oracle, as replay calls it, with no production path: the
    floor rule (max_abs <= 2^-6 max|ref|, the ulp limits, LSE <= 12 fp32 error units)."""
    ref = oracle_of(case)
    m = compare.metrics(out, ref.out, lse, ref.lse, lse_cond=ref.info["lse_cond"], out_scale=ref.info["out_scale"])
    return compare.judge("solution", m, ref.out)


def test_export_loads_with_flashinfer_bench_schema(exported, cases):
    ts = TraceSet.from_path(str(exported))
    assert sorted(ts.definitions) == ["mla_tree_verify_h8_ckv512_kpe64", "mla_tree_verify_unified_h8_ckv512_kpe64"]
    assert sum(len(w) for w in ts.workloads.values()) == len(CASES)
    by_id = {c.case_id: c for c in cases.values()}
    for name, d in ts.definitions.items():
        assert d.const_axes["num_qo_heads"] == 8 and d.const_axes["head_dim_qk"] == 576
        assert list(d.inputs) == list(fit.INPUTS) and list(d.outputs) == list(fit.OUTPUTS)
        for t in ts.workloads[name]:
            w = t.workload
            tensors = load_safetensors(d, w, exported)  # flashinfer_bench checks every shape and dtype
            # the axes the tensors' shapes give are the ones the workload states
            assert d.get_axes_values_from_inputs(gen_inputs(d, w, "cpu", tensors)) == w.axes
            path = exported / w.inputs["q"].path
            with safe_open(str(path), "pt") as f:
                meta = f.metadata()
            case = by_id[meta["kdkit_case_id"]]
            assert ("unified" in name) == (case.layout == "unified") == (meta["kdkit_layout"] == "unified")
            for n in ("q", "k", "v", "kv_buffer"):  # bit for bit (the pool's scratch row 0 holds NaN)
                assert torch.equal(tensors[n].view(torch.int16), getattr(case, n).view(torch.int16)), n
            assert w.inputs["sm_scale"].value == pytest.approx(case.sm_scale)


def test_reference_agrees_with_the_oracle_on_every_bundled_case(exported, cases, oracle_of):
    """The definition's reference, built and fed as FlashInfer-Bench does (its python builder, its
    safetensors loader, inputs in definition order), against kdkit's float64 oracle. Tolerance: the
    judge's floor rule with no production path (kdkit.compare.judge: max_abs <= 2^-6 max|ref|, each
    ulp statistic under its floor, LSE <= 12 fp32 error units). Why that one: the reference does what
    kdkit's torch backend does (fp32 scores and P, bf16 output), which the floor was calibrated on
    (0.91u max|ref| against a floor of 4u)."""
    ts = TraceSet.from_path(str(exported))
    by_id = {c.case_id: c for c in cases.values()}
    seen = set()
    for name, d in ts.definitions.items():
        ref = BuilderRegistry.get_instance().build_reference(d)
        for t in ts.workloads[name]:
            w = t.workload
            with safe_open(str(exported / w.inputs["q"].path), "pt") as f:
                case = by_id[f.metadata()["kdkit_case_id"]]
            out, lse = ref(*gen_inputs(d, w, "cpu", load_safetensors(d, w, exported)))
            v = judged(case, out, lse, oracle_of)
            assert v.passed, f"{case.case_id}: " + "; ".join(v.reasons)
            seen.add(case.case_id)
    assert seen == set(by_id)


def _write(tmp_path: Path, sol: dict, name="sol.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(sol))
    Solution.model_validate(sol)  # what kdkit writes for its tests is a solution by the schema too
    return p


def _dps(defn: dict) -> dict:
    """The reference in destination-passing style (the schema's default): outputs are the last two
    arguments, written in place; helpers in a second file (relative import)."""
    sol = fit.reference_solution(defn, name="ref_dps")
    sol["spec"] = {k: v for k, v in sol["spec"].items() if k != "destination_passing_style"}
    sol["sources"] = [{"path": "impl/ref.py", "content": defn["reference"]},
                      {"path": "main.py", "content": "from .impl import ref\n\n\ndef run(*args):\n"
                       "    *inputs, out, lse = args\n    o, l = ref.run(*inputs)\n"
                       "    out.copy_(o)\n    lse.copy_(l)\n"}]
    return sol


@pytest.mark.parametrize("style", ["value", "dps"])
def test_solution_is_a_backend_that_passes_the_judge(tmp_path, monkeypatch, cases, oracle_of, style):
    monkeypatch.setenv("KDKIT_TRACE_CACHE", str(tmp_path / "cache"))
    defn = fit.definition(8, "sglang")
    sol = fit.reference_solution(defn) if style == "value" else _dps(defn)
    be = fit.solution_backend(_write(tmp_path, sol))
    assert be.NAME and be.LABEL and be.LINT_CLEAN and "device" in __import__("inspect").signature(be.run).parameters
    for p, case in cases.items():
        assert be.unavailable(case) is None  # the unified probe too: kdkit converts it to the sglang layout
        res = be.run(case)
        assert isinstance(res.info["ran"], str) and "\n" not in res.info["ran"] and res.ran
        v = judged(case, res.out, res.lse, oracle_of)
        assert v.passed, f"{p.name}: " + "; ".join(v.reasons)
    prep = be.prepare(cases[DATA / "seed-shape.pt"])
    prep.launch()
    assert judged(cases[DATA / "seed-shape.pt"], prep.result().out, prep.result().lse, oracle_of).passed


def test_a_solution_that_ignores_the_tree_mask_fails_the_judge(tmp_path, monkeypatch, cases, oracle_of):
    """The negative control: the same reference with every draft column visible."""
    monkeypatch.setenv("KDKIT_TRACE_CACHE", str(tmp_path / "cache"))
    defn = fit.definition(8, "sglang")
    wrong = defn["reference"].replace("visible[:, :prefix] = True", "visible[:] = True")
    assert wrong != defn["reference"]
    sol = fit.reference_solution({**defn, "reference": wrong}, name="no_mask")
    be = fit.solution_backend(_write(tmp_path, sol))
    case = cases[DATA / "seed-shape.pt"]
    res = be.run(case)
    assert not judged(case, res.out, res.lse, oracle_of).passed


def test_a_solution_of_another_definition_is_unavailable_for_the_case(tmp_path, cases):
    be = fit.solution_backend(_write(tmp_path, fit.reference_solution(fit.definition(16, "sglang"))))
    why = be.unavailable(cases[DATA / "seed-shape.pt"])
    assert why and "\n" not in why and "mla_tree_verify_h16_ckv512_kpe64" in why


def _good():
    return fit.reference_solution(fit.definition(8, "sglang"))


@pytest.mark.parametrize("edit, field", [
    (lambda s: "{not json", "not JSON"),
    (lambda s: {k: v for k, v in s.items() if k != "spec"}, "'spec'"),
    (lambda s: {**s, "spec": {**s["spec"], "language": "cuda"}}, "'spec.language'"),
    (lambda s: {**s, "spec": {**s["spec"], "entry_point": "main.py:run"}}, "'spec.entry_point'"),
    (lambda s: {**s, "spec": {**s["spec"], "entry_point": "other.py::run"}}, "'spec.entry_point'"),
    (lambda s: {**s, "sources": [{"path": "../main.py", "content": "x"}]}, "'sources[0].path'"),
    (lambda s: {**s, "definition": "gqa_paged_decode_h32_kv8_d128_ps1"}, "'definition'"),
])
def test_a_bad_solution_file_is_one_line(tmp_path, edit, field):
    sol = edit(_good())
    p = tmp_path / "bad.json"
    p.write_text(sol if isinstance(sol, str) else json.dumps(sol))
    with pytest.raises(fit.TraceError) as e:
        fit.solution_backend(p)
    assert "\n" not in str(e.value) and field in str(e.value) and str(p) in str(e.value)


def test_a_solution_that_does_not_import_is_one_line(tmp_path, monkeypatch, cases):
    monkeypatch.setenv("KDKIT_TRACE_CACHE", str(tmp_path / "cache"))
    sol = _good()
    sol["sources"] = [{"path": "main.py", "content": "import no_such_module_kdkit\n\ndef run(*a):\n    pass\n"}]
    be = fit.solution_backend(_write(tmp_path, sol))
    with pytest.raises(fit.TraceError) as e:
        be.run(cases[DATA / "seed-shape.pt"])
    assert "\n" not in str(e.value) and "no_such_module_kdkit" in str(e.value)


def test_export_refuses_a_mis_marshaled_case(tmp_path):
    for p in sorted((DATA / "failures").glob("*.pt")):
        with pytest.raises(fit.TraceError) as e:
            fit.export(tmp_path / "out", [p])
        assert "\n" not in str(e.value) and "field '" in str(e.value)
    assert not (tmp_path / "out" / "workloads").exists()


def test_export_again_adds_nothing_and_keeps_a_different_definition(tmp_path):
    seed = DATA / "seed-shape.pt"
    first = fit.export(tmp_path, [seed])
    assert fit.export(tmp_path, [seed]) == [p for p in first if p.suffix == ".safetensors"]  # nothing new
    wl = tmp_path / "workloads" / fit.OP_TYPE / "mla_tree_verify_h8_ckv512_kpe64.jsonl"
    assert len(wl.read_text().splitlines()) == 1
    d = tmp_path / "definitions" / fit.OP_TYPE / "mla_tree_verify_h8_ckv512_kpe64.json"
    d.write_text(d.read_text().replace("MLA tree verify", "edited"))
    with pytest.raises(fit.TraceError, match="nothing was overwritten"):
        fit.export(tmp_path, [DATA / "ragged-bs4.pt"])
    assert "edited" in d.read_text()
    fit.export(tmp_path, [DATA / "ragged-bs4.pt"], overwrite=True)
    assert Definition.model_validate_json(d.read_text()).name == "mla_tree_verify_h8_ckv512_kpe64"
    assert len(wl.read_text().splitlines()) == 2  # the first case's workload is kept


def test_the_command_line_pieces(tmp_path):
    """What `kdkit export` is wired from: the arguments, and export_files saying what it wrote."""
    import argparse
    p = argparse.ArgumentParser()
    fit.add_arguments(p)
    args = p.parse_args(["--flashinfer-trace", str(tmp_path), str(DATA / "seed-shape.pt")])
    said = []
    written = fit.export_files(args.flashinfer_trace, [Path(c) for c in args.cases], args.force, out=said.append)
    assert [Path(s) for s in said[:-1]] == written and len(written) == 3 and "1 case(s)" in said[-1]
    assert {p.relative_to(tmp_path).parts[0] for p in written} == {"definitions", "workloads", "blob"}


def test_a_triton_solution_needs_a_gpu_or_the_interpreter(tmp_path, monkeypatch, cases, oracle_of):
    """The loader's triton path (the same import as python); the sources here are the reference
    relabeled, so what is tested is the availability rule and the load, not a Triton kernel."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU a Triton solution is always available")
    monkeypatch.setenv("KDKIT_TRACE_CACHE", str(tmp_path / "cache"))
    sol = fit.reference_solution(fit.definition(8, "sglang"), name="as_triton")
    sol["spec"]["language"] = "triton"
    be = fit.solution_backend(_write(tmp_path, sol))
    case = cases[DATA / "seed-shape.pt"]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "TRITON_INTERPRET=1" in be.unavailable(case)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert be.unavailable(case) is None
    res = be.run(case)
    assert judged(case, res.out, res.lse, oracle_of).passed and "triton" in res.ran
