"""The capture plugin's parts that need no SGLang: settings, names and budget, snapshot -> case,
and the `kdkit capture` command. (The plugin on SGLang's real forward_extend: tests/sglang_env/;
its contract with SGLang's source: test_capture_contract.py.)"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kdkit import case as case_mod
from kdkit import layout, lint, synth
from kdkit.capture import record, settings, store
from kdkit.capture.cli import launch_lines

ROOT = Path(__file__).resolve().parents[1]


# ---- settings -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [
    ("56", {56}), ("0-12:4", {0, 4, 8, 12}), ("1,5,9-11", {1, 5, 9, 10, 11}), ("3-3", {3}),
])
def test_layers(text, want):
    assert set(settings.parse_layers(text).ids) == want
    assert 99 not in settings.parse_layers(text)
    assert 99 in settings.parse_layers("all") and 0 in settings.parse_layers("")


@pytest.mark.parametrize("env, var", [
    ({"KDKIT_LAYERS": "56-"}, "KDKIT_LAYERS"), ({"KDKIT_LAYERS": "8-2"}, "KDKIT_LAYERS"),
    ({"KDKIT_LAYERS": "0-8:0"}, "KDKIT_LAYERS"), ({"KDKIT_MODE": "record"}, "KDKIT_MODE"),
    ({"KDKIT_FORWARD_MODES": "verify"}, "KDKIT_FORWARD_MODES"), ({"KDKIT_EVERY": "0"}, "KDKIT_EVERY"),
    ({"KDKIT_EVERY": "two"}, "KDKIT_EVERY"), ({"KDKIT_MAX_CASES": "-1"}, "KDKIT_MAX_CASES"),
    ({"KDKIT_MAX_BYTES": "5 parsecs"}, "KDKIT_MAX_BYTES"), ({"KDKIT_REL_THRESHOLD": "nan"}, "KDKIT_REL_THRESHOLD"),
    ({"KDKIT_REL_THRESHOLD": "-1"}, "KDKIT_REL_THRESHOLD"), ({"KDKIT_KERNEL": "triton"}, "KDKIT_KERNEL"),
    ({"KDKIT_MODE": "replace", "KDKIT_KERNEL": "torch"}, "KDKIT_KERNEL"), ({"KDKIT_MODEL": "a b"}, "KDKIT_MODEL"),
])
def test_a_bad_value_is_one_line_naming_the_variable(env, var):
    with pytest.raises(settings.SettingsError) as e:
        settings.from_env(env)
    assert str(e.value).startswith(f"{var}=") and "\n" not in str(e.value)


def test_defaults_and_values():
    s = settings.from_env({})
    assert not s.active and s.forward_modes == ("target_verify",) and s.every == 1
    assert s.max_cases is None and s.max_bytes is None and s.rel_threshold == settings.DEFAULT_REL_THRESHOLD
    s = settings.from_env({"KDKIT_MODE": "Validate", "KDKIT_MAX_BYTES": "2GiB", "KDKIT_MAX_CASES": "10",
                           "KDKIT_FORWARD_MODES": "target_verify, extend", "KDKIT_EVERY": "4",
                           "KDKIT_DIR": "~/cases", "KDKIT_KERNEL": "torch"})
    assert s.mode == "validate" and s.max_bytes == 2 << 30 and s.max_cases == 10 and s.every == 4
    assert s.forward_modes == ("target_verify", "extend") and s.dir == Path("~/cases").expanduser()
    assert settings.parse_bytes("X", "500M") == 500_000_000
    assert [ln.split("=")[0] for ln in s.describe()] == list(settings.VARS)


# ---- names, budget, no overwrite ---------------------------------------------------------------
def test_names_and_usage(tmp_path):
    assert store.case_name("moonshotai/Kimi-K2.6", 56, 3, 12) == "Kimi-K2.6-L56-r3-s12.pt"
    assert store.case_name("a b/c:d", 0, 0, 0, n=2) == "c_d-L0-r0-s0-2.pt"
    (tmp_path / "m-L1-r0-s0.pt").write_bytes(b"x" * 10)
    (tmp_path / "notes.txt").write_bytes(b"y" * 99)
    assert store.usage(tmp_path) == (1, 10)


def _case():
    return synth.make_case(bs=1, prefix=5, q_len=3, heads=2, tree="chain", seed=1)


def test_store_never_overwrites_and_stops_at_the_budget(tmp_path):
    said = []
    st = store.Store(tmp_path, max_cases=3, max_bytes=None, say=lambda k, m: said.append(m))
    st.prepare()
    keep = tmp_path / "m-L1-r0-s0.pt"
    keep.write_bytes(b"someone's file")
    a = st.write(_case(), "m", 1, 0, 0, 0)
    b = st.write(_case(), "m", 1, 0, 0, 0)
    assert (a.name, b.name) == ("m-L1-r0-s0-2.pt", "m-L1-r0-s0-3.pt") and keep.read_bytes() == b"someone's file"
    assert st.write(_case(), "m", 1, 0, 1, 0) is None and st.stopped
    assert said == [f"[kdkit] capturing stopped: KDKIT_MAX_CASES=3 reached (3 case files in {tmp_path})"]
    assert case_mod.load(a).meta["case_id"] == "m-L1-r0-s0-2"


def test_store_byte_budget_and_unusable_folder(tmp_path):
    st = store.Store(tmp_path / "b", max_cases=None, max_bytes=1000, say=lambda k, m: None)
    st.prepare()
    assert st.write(_case(), "m", 0, 0, 0, size_hint=5000) is None and "KDKIT_MAX_BYTES=1000" in st.stopped
    (tmp_path / "file").write_text("x")
    st = store.Store(tmp_path / "file" / "sub", None, None, say=lambda k, m: None)
    st.prepare()
    assert st.stopped.startswith("cannot create")


# ---- snapshot -> case ---------------------------------------------------------------------------
def _call_from(src, graph: bool):
    """The arguments forward_extend passes to the kernel, for the synthetic batch `src` (its pool
    whole, as SGLang's pool is): eager metadata, or CUDA-graph buffers with stale tails."""
    T, H = src.num_tokens, src.num_heads
    n = int(src.kv_indptr[-1])
    kvi, mask = src.kv_indices.long(), src.custom_mask
    if graph:
        kvi = torch.cat([kvi, torch.randint(1, src.kv_buffer.shape[0], (500,))])
        mask = torch.cat([mask.to(torch.uint8), torch.ones(300, dtype=torch.uint8)])
    o = torch.randn(T, H * 512).bfloat16()
    args = (src.q, src.k, src.v, o.view(T, H, 512), src.kv_buffer, src.kv_buffer[..., :512], src.qo_indptr,
            src.kv_indptr, kvi, mask, True, src.mask_indptr, 9, 1.0, 1.0, src.sm_scale)
    call = record.KernelCall.bind(args, {"logit_cap": 0.0, "sliding_window_size": -1, "sinks": None,
                                         "window_kv_offsets": None, "xai_temperature_len": -1})
    batch = SimpleNamespace(out_cache_loc=src.out_cache_loc.long(), seq_lens=src.prefix_lens.clone(),
                            seq_lens_sum=n)
    return call, batch, o


@pytest.mark.parametrize("graph", [False, True])
def test_snapshot_builds_the_compacted_case(graph):
    src = synth.make_case(bs=3, prefix=[7, 0, 12], q_len=9, heads=2, tree="ddtree", seed=4, keep_pool=True)
    call, batch, o = _call_from(src, graph)
    assert call.unsupported() is None
    snap = record.snapshot(call, batch, case_mod.new_meta("captured", layer_id=3, tp_rank=0, step=0), print)
    o.zero_()  # the server reuses its buffers: the snapshot holds copies
    c = record.build_case(snap)
    pool, idx, loc, slots = layout.compact(src.kv_buffer, src.kv_indices, src.out_cache_loc)
    assert torch.equal(c.slot_ids, slots) and torch.equal(c.kv_indices.long(), idx.long())
    assert torch.equal(c.out_cache_loc.long(), loc.long())
    assert torch.allclose(c.kv_buffer, pool, rtol=0, atol=0, equal_nan=True)
    assert c.custom_mask.dtype == (torch.uint8 if graph else torch.bool)
    assert torch.equal(c.custom_mask.bool(), src.custom_mask) and c.ref_out.abs().sum() > 0
    assert not lint.errors(c)
    case_mod.validate(c)


def test_unsupported_calls_are_named():
    src = synth.make_case(bs=1, prefix=4, q_len=3, heads=2, tree="chain", seed=0, keep_pool=True)
    call, _, _ = _call_from(src, False)
    call.k_scale = 0.5
    assert "fp8" in call.unsupported()
    call.k_scale, call.extra["sliding_window_size"] = 1.0, 128
    assert "sliding window" in call.unsupported()
    with pytest.raises(TypeError, match="without sm_scale"):
        record.KernelCall.bind(tuple(range(15)), {})


# ---- the command ---------------------------------------------------------------------------------
def _kdkit(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kdkit.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=env)


def test_capture_env_and_launch_flags(monkeypatch):
    assert launch_lines("capture", "0.5.11")[-1].endswith("--attention-backend triton --disable-cuda-graph")
    assert launch_lines("validate", "0.5.23")[-1].endswith("--attention-backend triton --disable-decode-cuda-graph")
    assert launch_lines("replace", "0.5.23")[-1].endswith("--attention-backend triton")
    assert any("sitecustomize" in ln for ln in launch_lines("capture", "0.5.10"))
    import os
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDKIT_")}
    r = _kdkit("capture", "env", "--mode", "capture", env={**env, "KDKIT_LAYERS": "0-60:4"})
    assert r.returncode == 0 and "KDKIT_LAYERS=0-60:4" in r.stdout
    assert "SGLANG_PLUGINS=kdkit KDKIT_MODE=capture python -m sglang.launch_server" in r.stdout
    r = _kdkit("capture", "env", "--mode", "replace", env=env)
    assert r.returncode == 0
    if not torch.cuda.is_available():
        assert "# kdkit's CUDA kernel cannot run here: no CUDA GPU" in r.stdout
    r = _kdkit("capture", "env", env={**env, "KDKIT_EVERY": "0"})
    assert r.returncode == 2 and r.stderr.strip() == ("kdkit: KDKIT_EVERY='0': want an integer >= 1 (the server "
                                                      "would stop at start-up with this line)")


def test_capture_sitecustomize(tmp_path):
    r = _kdkit("capture", "sitecustomize", tmp_path / "sc")
    assert r.returncode == 0 and "export PYTHONPATH=" in r.stdout
    text = (tmp_path / "sc" / "sitecustomize.py").read_text()
    compile(text, "sitecustomize.py", "exec")
    assert "install_from_sitecustomize" in text
    assert _kdkit("capture", "sitecustomize", tmp_path / "sc").returncode == 1
    assert _kdkit("capture", "sitecustomize", tmp_path / "sc", "--force").returncode == 0
    # started with it on PYTHONPATH, a Python without KDKIT_MODE stays untouched
    r = subprocess.run([sys.executable, "-c", "import sys; print(any('kdkit' in m for m in sys.modules))"],
                       capture_output=True, text=True, env={"PYTHONPATH": f"{tmp_path / 'sc'}:{ROOT}", "PATH": ""})
    assert r.returncode == 0 and r.stdout.strip() == "True" and r.stderr == ""
