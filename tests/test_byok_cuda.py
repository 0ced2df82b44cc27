"""Bring-your-own CUDA kernel (kdkit.byok.cuda) and the CUDA starter (kdkit/byok/starters/cuda).

CPU (NVRTC only): the starter builds for sm_120 within its limits; a compile error names the
user's file and line; an edited file (or header) is a new build; the backend meets the contract;
declarations that disagree with the kernel are refused at build time. GPU (marker gpu): the
starter passes kdkit's judge against the oracle on every bundled case and every probe, at several
split counts; a copy with the tree mask ignored fails it; the live pair under a CUDA graph; bad input
refused before launch; the adapter's host time per call.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import itertools
import shutil
import time
from pathlib import Path

import pytest
import torch

from kdkit.judge import compare, oracle
from kdkit.judge import heavy_cases
from kdkit.byok import cuda as byok
from kdkit.byok.batch import case_batch
from kdkit.case import load
from kdkit.kernel import jit
from kdkit.kernel.checks import InputError

STARTER = Path(byok.__file__).parent / "starters" / "cuda"
DATA = Path(__file__).resolve().parents[1] / "data" / "captured_tensors"
NVRTC = importlib.util.find_spec("cuda.bindings") is not None
needs_nvrtc = pytest.mark.skipif(not NVRTC, reason="needs NVRTC: pip install cuda-bindings nvidia-cuda-nvrtc "
                                 "nvidia-cuda-runtime (kdkit[compile])")
_count = itertools.count()


def load_backend(folder: Path):
    """The module backend.py of a starter folder (its own copy of the module each time)."""
    spec = importlib.util.spec_from_file_location(f"byok_starter_{next(_count)}", folder / "backend.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def copy(tmp_path) -> Path:
    """A copy of the starter, as `kdkit new-kernel` would write it, to edit."""
    return Path(shutil.copytree(STARTER, tmp_path / "mine"))


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


# ---- CPU: build, errors, rebuilds, the contract -------------------------------------------------
@needs_nvrtc
def test_starter_fits_sm120():
    res = load_backend(STARTER).backend.resources("sm_120")
    assert set(res.kernels) == {"kdkit_starter_partial", "kdkit_starter_merge"}
    assert res.breaches() == [], res.table()
    for k in res.kernels.values():
        assert k.registers > 0, res.table()  # ptxas' report was parsed, not defaulted
        assert k.spill_stores == k.spill_loads == 0
        assert k.smem_static + res.dynamic_smem[k.name] <= jit.SM120_SMEM_LIMIT
        assert k.registers * res.threads[k.name] <= 65536
    assert "fits sm_120 limits: yes" in res.table()


@needs_nvrtc
def test_resources_report_a_breach(copy):
    """The limits bite: a launch asking 100 KB of dynamic shared memory is over sm_120's 99 KB
    (static shared memory stops at 48 KB: ptxas refuses more, a CompileError)."""
    partial, merge = load_backend(copy).backend.launches
    big = byok.Launch(partial.entry, partial.args, partial.grid, partial.block, smem=lambda p: 100 * 1024)
    res = _variant(copy, [big, merge]).resources("sm_120")
    assert res.dynamic_smem[partial.entry] == 100 * 1024
    assert any("shared memory per block > sm_120's" in b for b in res.breaches()), res.table()
    assert "BREACH" in res.table()


@needs_nvrtc
def test_compile_error_names_the_users_file_and_line(copy):
    src = copy / "kernel.cu"
    lines = src.read_text().splitlines()
    n = next(i for i, ln in enumerate(lines, start=1) if "const int tid = threadIdx.x" in ln)
    lines.insert(n, "    int broken = ;")  # becomes line n + 1
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(byok.CompileError) as e:
        load_backend(copy).backend.build("sm_120")
    msg = str(e.value)
    first = msg.splitlines()[0]
    assert first.startswith(f"{src.resolve()}({n + 1}): error"), msg  # the compiler's own line, first
    assert isinstance(e.value, jit.BuildError)  # what `kdkit compile` already prints with exit 2


@needs_nvrtc
def test_edited_file_and_header_rebuild(copy, tmp_path, monkeypatch):
    monkeypatch.setenv("KDKIT_CACHE", str(tmp_path / "cache"))
    (copy / "starter_tile.cuh").write_text("#pragma once\n#define TILE 32\n")
    edit(copy / "kernel.cu", "#define TILE 32 ", '#include "starter_tile.cuh"\n// TILE ')
    backend = load_backend(copy).backend
    k1 = backend.build("sm_120").key
    assert backend.build("sm_120").key == k1  # unchanged: served from the cache
    cubins = lambda: sorted((tmp_path / "cache").glob("*.cubin"))  # noqa: E731
    assert len(cubins()) == 1
    # the same backend object, the file edited: the next build compiles the new text
    edit(copy / "kernel.cu", "#define THREADS 128", "#define THREADS 128  // edited")
    k2 = backend.build("sm_120").key
    assert k2 != k1 and len(cubins()) == 2
    (copy / "starter_tile.cuh").write_text("#pragma once\n#define TILE 16\n")
    k3 = backend.build("sm_120").key
    assert k3 not in (k1, k2) and len(cubins()) == 3  # the header is in the key
    (copy / "starter_tile.cuh").write_text("#pragma once\n#define TILE 16 +\n")
    with pytest.raises(byok.CompileError, match="error"):  # compiled again, not served stale
        backend.build("sm_120")


@needs_nvrtc
def test_index_dtypes_are_typedefs_in_the_key():
    backend = load_backend(STARTER).backend
    wide = backend.build("sm_120", {"kv_indices": torch.int64, "mask_indptr": torch.int64})
    assert "kvii64" in wide.key and "mipi64" in wide.key and "qoi32" in wide.key
    assert wide.key != backend.build("sm_120").key


def test_backend_meets_the_contract():
    mod = load_backend(STARTER)
    b = mod.backend
    for obj in (b, mod):  # the object, and the module itself (`--backends path/backend.py`)
        assert obj.NAME == "kdkit_starter" and obj.LINT_CLEAN is True
        params = inspect.signature(obj.run).parameters
        opts = {n: p.default for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
        assert list(params)[0] == "case" and opts == {"nsplit": 16}
        assert inspect.signature(obj.prepare).parameters.keys() == params.keys()
    why = b.unavailable()
    if not torch.cuda.is_available():
        assert why and "\n" not in why and why.startswith("kdkit_starter: ")
    with pytest.raises(TypeError, match="unknown option.*nsplt.*takes nsplit"):
        b.run(None, nsplt=4)
    for bad in (0, 257, 2.5, "8"):
        with pytest.raises(InputError, match="field 'nsplit'"):
            b.run(None, nsplit=bad)


def test_plan_refuses_cpu_metadata_naming_the_field():
    b = load_backend(STARTER).backend
    case = load(DATA / "seed-shape.pt")
    batch = case_batch(case, _tensors(case, "cpu"))
    with pytest.raises(InputError, match="field 'qo_indptr'.*CUDA"):
        b.plan(batch)
    assert b.unsupported(batch) is None  # (bf16: the dtype it takes; the device is plan's to refuse)
    assert "takes bf16" in b.unsupported(dataclasses.replace(batch, dtype=torch.float16))


def test_the_live_pair_meets_the_registry_contract():
    from kdkit.backends import registry
    for obj in (load_backend(STARTER).backend, load_backend(STARTER)):  # the object and the module
        registry.check(obj, "the CUDA starter")
        assert registry.has_live_pair(obj)


def _tensors(case, device) -> dict:
    """The case's tensors on `device`, named as the live pair takes them."""
    return {n: None if getattr(case, n) is None else getattr(case, n).to(device) for n in
            ("q", "k", "v", "kv_buffer", "qo_indptr", "kv_indptr", "kv_indices", "custom_mask", "mask_indptr")}


def _variant(copy, launches=None, **kw):
    b = load_backend(copy).backend
    return byok.CudaKernel(b.NAME, b.source, launches or b.launches, options=b.options,
                           workspace=b.workspace.values(), **kw)


@needs_nvrtc
def test_declarations_checked_against_the_kernel(copy):
    base = load_backend(copy).backend
    partial, merge = base.launches
    # a float (sm_scale) where the merge kernel takes an int (nsplit): named, with both types
    wrong = byok.Launch(merge.entry, merge.args[:-1] + ("sm_scale",), merge.grid, merge.block)
    with pytest.raises(byok.CompileError, match=r"kdkit_starter_merge.*parameter 8 is \.u32.*'sm_scale', float"):
        _variant(copy, [partial, wrong]).build("sm_120")
    short = byok.Launch(merge.entry, merge.args[:-1], merge.grid, merge.block)
    with pytest.raises(byok.CompileError, match="takes 9 parameters, its Launch maps 8"):
        _variant(copy, [partial, short]).build("sm_120")
    # a C++ (mangled) name is not an entry point
    edit(copy / "kernel.cu", 'extern "C" __global__ void __launch_bounds__(THREADS) kdkit_starter_merge',
         "__global__ void __launch_bounds__(THREADS) kdkit_starter_merge")
    with pytest.raises(byok.CompileError, match="'kdkit_starter_merge' is not in the build.*extern"):
        load_backend(copy).backend.build("sm_120")
    with pytest.raises(ValueError, match="field 'args': unknown argument 'q_ptr'"):
        byok.CudaKernel("x", copy / "kernel.cu", [byok.Launch("e", ("q_ptr",), 1, 1)])


def test_ptx_params_reads_types_and_structs():
    ptx = """.visible .entry f(
	.param .u64 .ptr .global .align 2 f_param_0,
	.param .f32 f_param_1,
	.param .align 8 .b8 f_param_2[24]
)"""
    assert byok.ptx_params(ptx, "f") == ["u64", "f32", "b8[24]"]
    assert byok.ptx_params(ptx, "g") is None


# ---- GPU: the judge on every case, graphs, bad input, host time --------------------------------
GPU_WHY = load_backend(STARTER).backend.unavailable()


def gpu(fn):
    return pytest.mark.gpu(pytest.mark.skipif(bool(GPU_WHY), reason=GPU_WHY or "")(fn))


CASES = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*.pt") if "failures" not in p.parts)
_ORACLE: dict = {}


def _judge(case, res, key=None):
    """kdkit's judge against the float64 oracle (the floors: no production path here); the oracle's
    answer is kept per `key` (a case judged at several split counts)."""
    ref = _ORACLE.get(key) or oracle.run(case, with_cond=True, with_scale=True)
    if key:
        _ORACLE[key] = ref
    out, lse, cond, scale = ref
    m = compare.metrics(res.out, out, res.lse, lse, lse_cond=cond, out_scale=scale)
    return compare.judge("kdkit_starter", m, out)


@gpu
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("nsplit", [16, 1, 7])
def test_starter_passes_bundled_cases(name, nsplit):
    case = load(DATA / name)
    res = load_backend(STARTER).run(case, nsplit=nsplit)
    v = _judge(case, res, name)
    print(f"\n{name} nsplit {nsplit}: {'PASS' if v.passed else 'FAIL'} worst/limit {v.worst_ratio:.3f} "
          f"max_abs {v.metrics.max_abs:.3g} ulp_max {v.metrics.ulp_max:.2f} lse_ulp {v.metrics.lse_ulp_max}")
    assert v.passed, f"{case.summary()} ({res.ran}): {v.reasons}"
    assert "\n" not in res.ran and "kdkit_starter" in res.ran


@gpu
def test_prepared_launch_owns_what_it_points_at():
    """prepare() once bound the case's device copies and let them go: the launch then read freed
    memory, and `kdkit bench` at 1 x 32K hit an illegal address on the H200 once the allocator gave
    the blocks back. The prepared launch must hold what its pointers point into."""
    import gc

    from kdkit import shapes
    case = shapes.make_case({"bs": 1, "prefix": 32768, "q_len": 9, "heads": 8, "seed": 1})
    p = load_backend(STARTER).prepare(case)
    gc.collect()
    torch.cuda.empty_cache()
    junk = torch.full((64 << 20,), float("nan"), device="cuda")  # reuses whatever was given back
    p.launch()
    res = p.result()
    del junk
    v = _judge(case, res)
    assert v.passed, v.reasons


@gpu
@pytest.mark.parametrize("name", [n for n in heavy_cases.names() if n not in heavy_cases.BUNDLED])
def test_starter_passes_generated_probes(name):
    case = heavy_cases.make(name)
    res = load_backend(STARTER).run(case)
    v = _judge(case, res)
    print(f"\n{name}: {'PASS' if v.passed else 'FAIL'} worst/limit {v.worst_ratio:.3f} ({res.ran})")
    assert v.passed, f"{case.summary()}: {v.reasons}"


@gpu
def test_starter_without_the_mask_fails_the_judge(copy):
    """The judge is awake on the starter: the same kernel ignoring the tree mask fails the seed case."""
    case = load(DATA / "seed-shape.pt")
    edit(copy / "kernel.cu", "seen = mask_row ? mask_row[j] != 0 : (!causal || j <= i);", "seen = true;")
    v = _judge(case, load_backend(copy).run(case))
    assert not v.passed


@gpu
def test_run_rebuilds_an_edited_file(copy):
    """Edit the .cu, run again: the next run() runs the new source (here: a wrong one)."""
    case = load(DATA / "seed-shape.pt")
    mod = load_backend(copy)
    assert _judge(case, mod.run(case)).passed
    edit(copy / "kernel.cu", "s = dot * sm_scale;", "s = dot;")
    assert not _judge(case, mod.run(case)).passed


@gpu
def test_live_pair_under_a_cuda_graph():
    """The live pair as the server runs it in a CUDA graph: plan(batch) once, launch captured, new
    q values written into the same tensors, replay: the graph computes the new inputs' answer
    (nothing of the first call's host state is baked in), judged against the oracle."""
    from kdkit.backends import Result
    b = load_backend(STARTER).backend
    first = load(DATA / "ragged-bs4.pt")
    second = first.clone(q=(torch.randn(first.q.shape, generator=torch.Generator().manual_seed(7)) * 0.5)
                         .to(torch.bfloat16))
    x = _tensors(first, "cuda")
    p = b.plan(case_batch(first, x))
    out = torch.empty(first.num_tokens, first.num_heads, 512, dtype=torch.bfloat16, device="cuda")
    b.launch(p, x["q"], x["k"], x["v"], x["kv_buffer"], out)  # warm-up, as SGLang's before capture
    torch.cuda.synchronize()
    assert _judge(first, Result(out.cpu(), p.lse.cpu())).passed
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        b.launch(p, x["q"], x["k"], x["v"], x["kv_buffer"], out)
    x["q"].copy_(second.q.cuda())
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert _judge(second, Result(out.cpu(), p.lse.cpu())).passed
    # per layer: another q through the same plan, eagerly
    x["q"].copy_(first.q.cuda())
    b.launch(p, x["q"], x["k"], x["v"], x["kv_buffer"], out)
    torch.cuda.synchronize()
    assert _judge(first, Result(out.cpu(), p.lse.cpu())).passed


@gpu
def test_live_plan_made_inside_graph_capture():
    """plan(batch) inside torch.cuda.graph capture (the server plans there when a captured batch's
    buffers have no plan yet): it reads nothing back and syncs nothing, so the capture holds, and
    the replay gives the case's answer (the workspace allocated there is the graph's)."""
    from kdkit.backends import Result
    b = load_backend(STARTER).backend
    case = load(DATA / "ragged-bs4.pt")
    x = _tensors(case, "cuda")
    batch = case_batch(case, x)
    b.launch(b.plan(batch), x["q"], x["k"], x["v"], x["kv_buffer"],
             torch.empty(case.num_tokens, case.num_heads, 512, dtype=torch.bfloat16, device="cuda"))  # the build
    torch.cuda.synchronize()
    out = torch.empty(case.num_tokens, case.num_heads, 512, dtype=torch.bfloat16, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        p = b.plan(dataclasses.replace(batch, capturing=True))
        b.launch(p, x["q"], x["k"], x["v"], x["kv_buffer"], out)
    out.zero_()  # (the allocator may have handed back the warm-up's buffer, answer and all)
    g.replay()
    torch.cuda.synchronize()
    assert _judge(case, Result(out.cpu(), p.lse.cpu())).passed


@gpu
def test_prepare_is_graph_safe_and_judged():
    case = load(DATA / "long-prefix-8k.pt")
    prep = load_backend(STARTER).prepare(case, nsplit=32)
    assert prep.graph_safe and "nsplit 32" in prep.info["ran"]
    g = torch.cuda.CUDAGraph()
    prep.launch()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        prep.launch()
    plan = prep.launch.__self__  # (launch is the plan's: clear what the eager launch wrote)
    plan.out.zero_()
    plan.lse.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert _judge(case, prep.result()).passed


@gpu
def test_bad_tensors_refused_before_launch():
    case = load(DATA / "seed-shape.pt")
    b = load_backend(STARTER).backend
    x = _tensors(case, "cuda")
    batch = case_batch(case, x)
    p = b.plan(batch)
    out = torch.empty(case.num_tokens, case.num_heads, 512, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(InputError, match="field 'q'.*shape"):
        b.launch(p, x["q"][:, :4], x["k"], x["v"], x["kv_buffer"], out)
    with pytest.raises(InputError, match="field 'kv_buffer'.*dtype"):
        b.launch(p, x["q"], x["k"], x["v"], x["kv_buffer"].half(), out)
    with pytest.raises(InputError, match="field 'out'"):
        b.launch(p, x["q"], x["k"], x["v"], x["kv_buffer"], out.float())
    with pytest.raises(InputError, match="field 'kv_buffer'.*rows"):  # a case's path reads the slots
        b.run(case.clone(kv_buffer=case.kv_buffer[:3]))
    with pytest.raises(InputError, match="field 'mask_indptr'"):
        b.plan(dataclasses.replace(batch, mask_indptr=x["mask_indptr"][1:]))
    torch.cuda.synchronize()  # nothing faulted


def _per_call_us(fns, n=200, reps=15) -> list[float]:
    """Each fn's least over reps of its host time per call, n calls a rep (synchronized between
    reps, so the launch queue never fills): the call's own cost, since a rep that met another
    thread is only ever slower. The fns take turns within each rep, so a busy spell of the host (a
    whole-suite run shares its cores with 12 workers) meets all of them alike."""
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            ts.append((time.perf_counter() - t0) / n * 1e6)
    torch.cuda.synchronize()
    return [min(ts) for ts in times]


@gpu
def test_host_time_per_call():
    """The adapter's own host time: Plan.run (pointer writes, the stream, two cuLaunchKernel) against
    the bare two cuLaunchKernel calls with the same packed arguments. At most 10 us more."""
    from cuda.bindings import driver
    case = load(DATA / "seed-shape.pt")
    b = load_backend(STARTER).backend
    p, x = b._plan_case(case, {"nsplit": 16})
    q, k, v, kvb = x["q"], x["k"], x["v"], x["kv_buffer"]
    p.run(q, k, v, kvb)
    stream = torch.cuda.current_stream().cuda_stream

    def bare():
        for lb in p.launches:
            driver.cuLaunchKernel(lb.fn, *lb.grid, *lb.block, lb.smem, stream, lb.addr, 0)

    t_bare, t_launch, t_run, t_checked = _per_call_us(
        [bare, p.launch, lambda: p.run(q, k, v, kvb, check=False), lambda: p.run(q, k, v, kvb)])
    print(f"\nhost us per call (2 launches): bare cuLaunchKernel {t_bare:.2f}, Prepared.launch {t_launch:.2f}, "
          f"Plan.run(check=False) {t_run:.2f}, Plan.run (checked) {t_checked:.2f}")
    assert t_run - t_bare <= 10.0, (t_bare, t_run)
    assert t_launch - t_bare <= 10.0, (t_bare, t_launch)
