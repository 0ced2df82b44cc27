"""SGLang's Triton extend kernel as a backend: loading it without importing sglang, and its
numbers against the float64 oracle.

Two groups:
  * loader tests use release wheels downloaded into .cache/wheels (`pip download --no-deps
    sglang==X -d .cache/wheels`); each part is skipped, with the reason, when its wheel is absent;
  * numeric tests run whatever kdkit.sglang_source.locate() finds ($KDKIT_SGLANG_SRC or an
    installed sglang) and are skipped only when neither exists. Without CUDA they run under
    Triton's interpreter on the CPU (about 0.2-0.7 s a case on 2 cores), with CUDA on the GPU.

Tolerance: kdkit.judge.compare.judge against the oracle with no production term, i.e. the floors:
max_abs <= 2^-6 max|oracle| (compare.OUT_FLOOR_U; two bf16 roundings with 2x margin), the error in
bf16 spacings (compare.ULP_*) and each row's LSE within compare.LSE_ULPS fp32 units. This kernel
IS the production path, so the floors alone apply.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from kdkit import backends, layout, shapes, synth
from kdkit.judge import compare, oracle
from kdkit import sglang_source as ss
from kdkit.backends import BackendUnavailable
from kdkit.backends import triton_sglang as tb
from kdkit.case import CaseError

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".cache" / "wheels"
# one release per layout boundary: oldest supported, the pin, first of the new layout, newest read
RELEASES = ("0.5.10", "0.5.15.post1", "0.5.16", "0.5.23")
NEW_LAYOUT = {"0.5.16", "0.5.23"}


def _wheel(release: str) -> Path | None:
    hits = sorted(WHEELS.glob(f"sglang-{release}-*.whl"))
    return hits[0] if hits else None


def _unpack(whl: Path, dest: Path, release: str, with_meta: bool) -> Path:
    """Only what kdkit reads: the kernel folders, plus (with_meta) sglang/__init__.py, _version.py
    and the dist-info, which make the folder look like an installed site-packages."""
    keep = tuple(rel + "/" for rel, _ in ss.LAYOUTS)
    meta = ("sglang/__init__.py", "sglang/_version.py", f"sglang-{release}.dist-info/METADATA")
    with zipfile.ZipFile(whl) as z:
        for n in z.namelist():
            if (n.startswith(keep) and n.endswith(".py")) or (with_meta and n in meta):
                z.extract(n, dest)
    return dest


@pytest.fixture(scope="session")
def trees(tmp_path_factory):
    """release -> (tree with dist-info, bare kernel tree like scripts/wheelhouse.sh's)."""
    out = {}
    for rel in RELEASES:
        whl = _wheel(rel)
        if whl is None:
            continue
        base = tmp_path_factory.mktemp("tree")  # no version in the path: the files must tell it
        out[rel] = (_unpack(whl, base / "site", rel, True), _unpack(whl, base / "bare", rel, False))
    return out


def _need(trees, rel):
    if rel not in trees:
        pytest.skip(f"no wheel for sglang {rel} in {WHEELS}; "
                    f"`pip download --no-deps sglang=={rel} -d .cache/wheels` to test that release")
    return trees[rel]


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(ss.ENV_VAR, raising=False)
    return monkeypatch


def _no_sglang():
    assert ss.sglang_modules_loaded() == [], "the sglang package was imported"


# ---- loader ------------------------------------------------------------------------------
@pytest.mark.parametrize("rel", RELEASES)
def test_loader_reads_each_layout_from_KDKIT_SGLANG_SRC(rel, trees, clean_env):
    site, bare = _need(trees, rel)
    clean_env.setenv(ss.ENV_VAR, str(site))
    src = ss.locate()
    assert src.origin == ss.ENV_VAR and src.release == rel
    want = "kernels/ops/attention" if rel in NEW_LAYOUT else "srt/layers/attention/triton_ops"
    assert src.module_path.is_file() and want in src.module_path.as_posix()
    mod = ss.load_extend(src)
    assert mod.__name__.startswith("_kdkit_sglang_") and mod.__name__ in sys.modules
    assert Path(mod.__file__) == src.module_path
    params = ss.kernel_params(mod.extend_attention_fwd)
    # the positional contract forward_extend relies on, the same in every release
    assert list(params)[:16] == ["q_extend", "k_extend", "v_extend", "o_extend", "k_buffer", "v_buffer",
                                 "qo_indptr", "kv_indptr", "kv_indices", "custom_mask", "is_causal",
                                 "mask_indptr", "max_len_extend", "k_scale", "v_scale", "sm_scale"]
    assert params["skip_prefix_custom_mask"] is True
    assert ("lse_extend" in params) == (rel != "0.5.10")
    _no_sglang()

    # the wheelhouse's bare tree has no version file: the release comes from the kernel's hash
    clean_env.setenv(ss.ENV_VAR, str(bare))
    assert ss.locate().release.startswith(rel + " (by the sha256")


@pytest.mark.parametrize("rel", ("0.5.15.post1", "0.5.23"))
def test_loader_finds_an_installed_sglang_without_importing_it(rel, trees, clean_env):
    site, _ = _need(trees, rel)
    assert (site / "sglang" / "__init__.py").is_file()  # the real one: importing it would fail here
    clean_env.syspath_prepend(str(site))
    src = ss.locate()
    assert src.origin == "installed" and src.root == site.resolve() and src.release == rel
    ss.load_extend(src)
    _no_sglang()


def test_bad_KDKIT_SGLANG_SRC_is_named_and_not_silently_skipped(tmp_path, clean_env):
    clean_env.setenv(ss.ENV_VAR, str(tmp_path))
    with pytest.raises(ss.SourceNotFound, match=ss.ENV_VAR):
        ss.locate()
    why = tb.unavailable()
    assert why.startswith("triton_sglang: ") and ss.ENV_VAR in why and "\n" not in why


def test_unknown_sglang_import_names_the_file_and_module(tmp_path, clean_env):
    kdir = tmp_path / "sglang" / "kernels" / "ops" / "attention"
    kdir.mkdir(parents=True)
    (kdir / "extend_attention.py").write_text("from sglang.srt.server_args import ServerArgs\n")
    clean_env.setenv(ss.ENV_VAR, str(tmp_path))
    with pytest.raises(ImportError, match=r"extend_attention.py: imports sglang.srt.server_args"):
        ss.load_extend()
    (kdir / "extend_attention.py").write_text("from sglang.srt.utils import is_npu\n")
    with pytest.raises(ImportError, match="is_npu"):
        ss.load_extend(ss.Source(tmp_path, kdir, ss.LAYOUTS[0][1], "x", "test"))
    _no_sglang()


@pytest.mark.parametrize("rel", RELEASES)
def test_each_release_runs_the_seed_shape(rel, trees, clean_env):
    """Both layouts, old and new signatures, run (interpreter on a CPU) and agree with the oracle."""
    site, _ = _need(trees, rel)
    clean_env.setenv(ss.ENV_VAR, str(site))
    case = shapes.seed_shape()
    res = tb.run(case)
    assert res.info["sglang_release"] == rel
    assert (res.lse is None) == (rel == "0.5.10")
    _judge(case, res)
    _no_sglang()


# ---- numerics ----------------------------------------------------------------------------
def _source_or_skip():
    try:
        return ss.locate()
    except ss.SourceNotFound as e:
        pytest.skip(f"neither an installed sglang nor {ss.ENV_VAR}: {e}")


@pytest.fixture
def source():
    return _source_or_skip()


def _judge(case, res):
    out, lse = oracle.run(case)
    m = compare.metrics(res.out, out, res.lse, lse if res.lse is not None else None)
    v = compare.judge("triton_sglang", m)
    assert v.passed, f"{case.summary()}: {v.reasons} ({v.rule})"
    assert res.out.dtype == torch.bfloat16 and tuple(res.out.shape) == (case.num_tokens, case.num_heads, 512)
    return m


CASES = {
    "seed_shape": lambda: shapes.seed_shape(),
    # bs 4, prefix 0 among them, shuffled and NaN-poisoned pool
    "ragged_bs4": lambda: synth.make_case(bs=4, prefix=[0, 7, 30, 3], q_len=9, heads=8, tree="eagle", seed=1),
    # ragged q_len too (q_len 1: a row that sees only the prefix and itself)
    "ragged_q_bs3": lambda: synth.make_case(bs=3, prefix=[5, 0, 12], q_len=[9, 4, 1], heads=4,
                                            tree="ddtree", seed=2, index_dtype=torch.int64),
    "chain": lambda: synth.make_case(bs=2, prefix=40, q_len=16, heads=4, tree="chain", seed=3),
    # q_len 33 and 65 cross the kernel's 32-row block (BLOCK_M = 32 for head dim 576)
    "ddtree_q33_65": lambda: synth.make_case(bs=2, prefix=[10, 3], q_len=[33, 65], heads=8,
                                             tree="ddtree", seed=4),
    "causal_no_mask": lambda: synth.make_case(bs=2, prefix=[50, 0], q_len=9, heads=4, tree="causal", seed=6),
    # uint8 mask (SGLang's CUDA-graph buffer) and int64 indices
    "uint8_mask": lambda: synth.make_case(bs=2, prefix=[9, 2], q_len=9, heads=4, tree="eagle", seed=7,
                                          mask_dtype=torch.uint8, index_dtype=torch.int64),
}


@pytest.mark.parametrize("name", list(CASES))
def test_agrees_with_oracle(name, source):
    case = CASES[name]()
    before = case.clone()
    res = tb.run(case)
    _judge(case, res)
    for f in ("q", "k", "v", "kv_buffer", "kv_indices", "custom_mask"):
        a, b = getattr(case, f), getattr(before, f)
        assert a is None or torch.equal(a.nan_to_num(), b.nan_to_num()), f"run() changed case.{f}"
    info = res.info
    assert info["interpreter"] == (not torch.cuda.is_available())
    assert (info["device"] == "cpu") == (not torch.cuda.is_available())
    assert info["module"] == str(source.module_path) and info["sglang_release"] == source.release
    assert info["causal"] is True and info["max_len_extend"] == max(case.q_lens)
    _no_sglang()


def test_logit_cap(source):
    """Large logits under a soft cap of 5: the cap must change the answer by far more than the
    tolerance (else this case would not test it), and the kernel must follow the capped oracle."""
    case = synth.make_case(bs=1, prefix=21, q_len=9, heads=8, tree="eagle", logit_cap=5.0,
                           magnitude=8.0, seed=5)
    res = tb.run(case)
    m = _judge(case, res)
    uncapped, _ = oracle.run(case.clone(logit_cap=0.0))
    off = compare.metrics(res.out, uncapped)
    assert off.max_abs > 10 * compare.out_floor(off.ref_max_abs), "the cap did not matter in this case"
    assert m.max_abs < off.max_abs / 10


def test_unified_layout_is_converted_first(source):
    case = synth.make_case(bs=2, prefix=[12, 0], q_len=9, heads=4, tree="ddtree", seed=8)
    uni = layout.to_unified(case)
    assert uni.layout == "unified"
    a, b = tb.run(case), tb.run(uni)
    assert torch.equal(a.out, b.out)
    _judge(uni, b)


def test_wrong_mask_fails_the_check(source):
    """Negative control: the kernel run on one tree, judged against the oracle of another."""
    case = synth.make_case(bs=1, prefix=21, q_len=9, heads=8, tree="ddtree", seed=9)
    chain = synth.make_case(bs=1, prefix=21, q_len=9, heads=8, tree="chain", seed=9)
    assert torch.equal(case.q, chain.q) and not torch.equal(case.custom_mask, chain.custom_mask)
    res = tb.run(chain)
    out, lse = oracle.run(case)
    v = compare.judge("triton_sglang", compare.metrics(res.out, out, res.lse, lse))
    assert not v.passed


def test_out_of_bounds_mask_is_refused(source):
    case = shapes.seed_shape()
    short = case.clone(custom_mask=case.custom_mask[:-9])  # 9 x 30 = 270 needed, 261 given
    with pytest.raises(CaseError, match="custom_mask"):
        tb.run(short)
    with pytest.raises(TypeError, match="triton_sglang: unknown option.s. nsplit; this backend takes with_lse"):
        backends.run("triton_sglang", case, nsplit=4)


def test_lse_can_be_skipped(source):
    res = tb.run(shapes.seed_shape(), with_lse=False)
    assert res.lse is None and res.info["lse"] == "not requested"


def test_unavailable_is_none_when_a_source_exists(source):
    env, mods = dict(os.environ), set(sys.modules)
    assert tb.unavailable(shapes.seed_shape()) is None
    assert dict(os.environ) == env and set(sys.modules) == mods, "unavailable() changed the process"


def test_unavailable_imports_no_triton_and_sets_nothing(source):
    """In a fresh process: unavailable() only looks; run() is what switches the interpreter on."""
    code = ("import os, sys\n"
            "from kdkit.backends import triton_sglang as tb\n"
            "assert tb.unavailable() is None, tb.unavailable()\n"
            "assert 'triton' not in sys.modules, 'unavailable() imported triton'\n"
            "assert 'TRITON_INTERPRET' not in os.environ, 'unavailable() set TRITON_INTERPRET'\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="only without CUDA is the interpreter needed")
def test_interpreter_switched_off_by_hand_is_reported(source, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    why = tb.unavailable()
    assert why.startswith("triton_sglang: no CUDA device and TRITON_INTERPRET='0'")
    with pytest.raises(BackendUnavailable, match="TRITON_INTERPRET"):
        tb.run(shapes.seed_shape())


@pytest.mark.gpu  # runs compiled, not interpreted
def test_gpu_kimi_shapes(source):
    """Kimi K2.6 on one TP8 rank: H 8, DDTree of 64 nodes, long-ish prefixes, bs 4."""
    case = synth.make_case(bs=4, prefix=[2048, 17, 0, 777], q_len=65, heads=8, tree="ddtree", seed=11)
    res = tb.run(case)
    assert res.out.is_cuda and res.info["interpreter"] is False
    m = _judge(case, res)
    # the GPU rounds P to bf16: its error is real, but stays inside the floor
    assert np.isfinite(m.max_abs)


def test_int32_indices_widen_where_the_pool_outgrows_int32_offsets():
    """Triton multiplies a row index by the row stride in the index's dtype: past 2^31 pool
    elements int32 wraps (an illegal address on the H200 at 32 x 131072), so those are widened."""
    assert tb.kv_indices_dtype(torch.int32, 2**31 - 1) == torch.int32
    assert tb.kv_indices_dtype(torch.int32, 32 * 131081 * 576) == torch.int64
    assert tb.kv_indices_dtype(torch.int64, 2**40) == torch.int64
