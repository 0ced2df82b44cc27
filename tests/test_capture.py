"""The capture plugin's parts that need no SGLang: settings, names and budget, snapshot -> case,
and the `kdkit capture` command. (The plugin on SGLang's real forward_extend: tests/sglang_env/;
its contract with SGLang's source: test_capture_contract.py.)"""
from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kdkit import case as case_mod
from kdkit import layout, lint, synth
from kdkit.capture import record, settings, store
from kdkit.cli.capture import launch_lines

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
    ({"KDKIT_MIN_FREE": "lots"}, "KDKIT_MIN_FREE"),
    ({"KDKIT_LAYERS": "0-100000000"}, "KDKIT_LAYERS"), ({"KDKIT_LAYERS": "100001"}, "KDKIT_LAYERS"),
    ({"KDKIT_LAYER": "56"}, "KDKIT_LAYER"), ({"KDKIT_MAXBYTES": "1G"}, "KDKIT_MAXBYTES"),
    ({"kdkit_layers": "56"}, "kdkit_layers"),
    # (an audit's: each escaped as another exception, which SGLang logs and serves on without kdkit)
    ({"KDKIT_DIR": "~nosuchuser-kdkit/cases"}, "KDKIT_DIR"), ({"KDKIT_MAX_BYTES": "9" * 400}, "KDKIT_MAX_BYTES"),
    ({"KDKIT_MIN_FREE": "9" * 400}, "KDKIT_MIN_FREE"), ({"KDKIT_LAYERS": "1" * 5000}, "KDKIT_LAYERS"),
    ({"KDKIT_MAX_BYTES": "0.1"}, "KDKIT_MAX_BYTES"), ({"KDKIT_MAX_CASES": "1_000"}, "KDKIT_MAX_CASES"),
    ({"KDKIT_LAYERS": "\u0663"}, "KDKIT_LAYERS"),
    # (a review's: accepted, and then nothing was ever seen, or capture stopped at once)
    ({"KDKIT_FORWARD_MODES": "decode"}, "KDKIT_FORWARD_MODES"),
    ({"KDKIT_FORWARD_MODES": "target_verify,idle"}, "KDKIT_FORWARD_MODES"),
    ({"KDKIT_FORWARD_MODES": ",,"}, "KDKIT_FORWARD_MODES"), ({"KDKIT_MAX_BYTES": "1.5"}, "KDKIT_MAX_BYTES"),
])
def test_a_bad_value_is_one_line_naming_the_variable(env, var):
    with pytest.raises(settings.SettingsError) as e:
        settings.from_env(env)
    assert str(e.value).startswith(f"{var}=") and "\n" not in str(e.value)


def test_defaults_and_values():
    s = settings.from_env({})
    assert not s.active and s.forward_modes == ("target_verify",) and s.every == 1
    assert s.max_cases is None and s.rel_threshold == settings.DEFAULT_REL_THRESHOLD
    # a server left with the defaults stops at 20 GiB of cases or 2 GiB free, not at a full disk
    assert s.max_bytes == settings.DEFAULT_MAX_BYTES == 20 << 30 and s.min_free == 2 << 30
    s = settings.from_env({"KDKIT_MODE": "Validate", "KDKIT_MAX_BYTES": "2GiB", "KDKIT_MAX_CASES": "10",
                           "KDKIT_FORWARD_MODES": "target_verify, extend", "KDKIT_EVERY": "4",
                           "KDKIT_DIR": "~/cases", "KDKIT_KERNEL": "torch", "KDKIT_MIN_FREE": "0"})
    assert s.mode == "validate" and s.max_bytes == 2 << 30 and s.max_cases == 10 and s.every == 4
    assert s.forward_modes == ("target_verify", "extend") and s.dir == Path("~/cases").expanduser()
    assert s.min_free == 0 and settings.from_env({"KDKIT_MAX_BYTES": "none"}).max_bytes is None
    assert settings.parse_bytes("X", "500M") == 500_000_000
    assert [ln.split("=")[0] for ln in s.describe()] == list(settings.VARS)
    assert 100000 in settings.parse_layers("0-100000:50000")  # the bound itself is a layer id


def test_a_misspelled_setting_is_refused_with_the_right_name():
    with pytest.raises(settings.SettingsError) as e:
        settings.from_env({"KDKIT_MODE": "capture", "KDKIT_LAYER": "56"})
    assert str(e.value) == ("KDKIT_LAYER='56': not a kdkit setting: did you mean KDKIT_LAYERS? "
                            "(`kdkit capture env` lists the settings)")


def test_the_projects_other_kdkit_names_are_not_taken_for_typos():
    """Every KDKIT_* name the repository reads elsewhere (tests, tools, the Makefile) can be set
    beside the plugin's settings: a CI job or a test run must not stop a server."""
    import re
    names = set()
    for folder in ("kdkit", "tests", "scripts", "benchmarks", "notebooks", ".ci"):
        for f in (ROOT / folder).rglob("*"):
            if f.is_file() and f.suffix in (".py", ".sh", ".ipynb", ".md", ".toml", "") and ".venv" not in f.parts:
                names |= set(re.findall(r"\bKDKIT_[A-Z0-9_]*[A-Z0-9]", f.read_text(errors="replace")))
    names |= set(re.findall(r"\bKDKIT_[A-Z0-9_]*[A-Z0-9]", (ROOT / "Makefile").read_text()))
    names -= {"KDKIT_LAYER", "KDKIT_MAXBYTES"}  # the typos these tests spell on purpose
    assert {"KDKIT_CACHE", "KDKIT_SGLANG_ENV", "KDKIT_SGLANG_SRC", "KDKIT_SWEEP"} <= names
    for name in sorted(names):
        settings.check_names({name: "1"})  # raises SettingsError on a near miss


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
    a = st.write(_case(), "m", 1, 0, 0)
    b = st.write(_case(), "m", 1, 0, 0)
    assert (a.name, b.name) == ("m-L1-r0-s0-2.pt", "m-L1-r0-s0-3.pt") and keep.read_bytes() == b"someone's file"
    assert st.write(_case(), "m", 1, 0, 1) is None and st.stopped
    assert said == [f"[kdkit] capturing stopped: KDKIT_MAX_CASES=3 reached (3 case files in {tmp_path})"]
    assert case_mod.load(a).meta["case_id"] == "m-L1-r0-s0-2"


def test_store_byte_budget_is_the_files_real_size(tmp_path):
    c = _case()
    c.meta["case_id"] = "m-L0-r0-s0"
    n = len(c.to_bytes())
    st = store.Store(tmp_path / "tight", max_cases=None, max_bytes=n - 1, say=lambda k, m: None)
    assert st.write(_case(), "m", 0, 0, 0) is None
    assert st.stopped == (f"KDKIT_MAX_BYTES={n - 1} reached (0 bytes of case files in {tmp_path / 'tight'}, "
                          f"the next would add {n})")
    st = store.Store(tmp_path / "exact", max_cases=None, max_bytes=n, say=lambda k, m: None)
    path = st.write(_case(), "m", 0, 0, 0)
    assert path.stat().st_size == n and store.usage(tmp_path / "exact") == (1, n) and not st.stopped
    assert st.write(_case(), "m", 0, 0, 1) is None and "KDKIT_MAX_BYTES" in st.stopped


def test_store_stops_below_the_free_space_floor(tmp_path):
    import shutil
    free = shutil.disk_usage(tmp_path).free
    st = store.Store(tmp_path, None, None, say=lambda k, m: None, min_free=free + (1 << 40))
    assert st.write(_case(), "m", 0, 0, 0) is None and list(tmp_path.iterdir()) == []
    assert st.stopped.startswith(f"KDKIT_MIN_FREE={free + (1 << 40)}: ")


class _DiskThatFills(io.FileIO):
    """The file descriptor's writes as on a disk with `room` bytes left: a short write that fills
    it, then OSError ENOSPC (what write(2) does). Under a BufferedWriter, torch.save's zip writer
    turns this into a RuntimeError without an errno; kdkit's own write must see the OSError."""

    room = 1000

    def write(self, b):
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(len(b), self.room)
        self.room -= n
        return super().write(bytes(b)[:n])


def test_store_stops_on_a_full_disk_met_in_the_file_write(tmp_path, monkeypatch):
    """The disk fills while the case file is written (not a patched Case.save): capturing stops
    with one line naming ENOSPC, no temporary file is left, later cases are not even tried."""
    from kdkit import files
    tries = []

    def fdopen(fd, mode="r", *a, **k):
        assert mode == "wb"
        tries.append(fd)
        return io.BufferedWriter(_DiskThatFills(fd, "wb"))
    monkeypatch.setattr(files.os, "fdopen", fdopen)
    said = []
    st = store.Store(tmp_path, None, None, say=lambda k, m: said.append(m))
    assert st.write(_case(), "m", 0, 0, 0) is None
    assert said == [f"[kdkit] capturing stopped: cannot write {tmp_path / 'm-L0-r0-s0.pt'}: "
                    "No space left on device (errno ENOSPC)"]
    assert list(tmp_path.iterdir()) == [] and len(tries) == 1
    assert st.write(_case(), "m", 0, 0, 1) is None and len(tries) == 1


def test_case_save_writes_exactly_its_bytes(tmp_path):
    c = _case()
    path = c.save(tmp_path / "c.pt")
    assert path.read_bytes() == c.to_bytes() and path.read_bytes()[:2] == b"PK"  # torch.save's zip
    assert torch.equal(case_mod.load(path).q, c.q)
    with pytest.raises(FileExistsError, match="c.pt exists"):
        c.save(tmp_path / "c.pt")


def test_store_byte_budget_and_unusable_folder(tmp_path):
    st = store.Store(tmp_path / "b", max_cases=None, max_bytes=1000, say=lambda k, m: None)
    st.prepare()
    assert st.write(_case(), "m", 0, 0, 0) is None and "KDKIT_MAX_BYTES=1000" in st.stopped
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
    call.extra["sliding_window_size"] = -1
    assert call.unsupported() is None
    for arg, val in (("skip_prefix", True), ("skip_extend", True), ("skip_prefix_custom_mask", False)):
        call.extra[arg] = val  # DCP's halves of attention, a masked prefix: not a whole verify call
        assert f"{arg}={val!r}" in call.unsupported()
        del call.extra[arg]
    call.extra.update(page_size=16, identity_kv_indices=True, lse_extend=None)  # addressing only
    assert call.unsupported() is None


def test_settings_that_fail_unforeseen_still_stop_start_up(monkeypatch):
    from kdkit.capture import plugin

    def broken(env=None):
        raise RuntimeError("no home")
    monkeypatch.setattr(plugin, "from_env", broken)
    with pytest.raises(plugin.StartupError, match="RuntimeError: no home"):
        plugin.settings_or_stop({})


def test_exit_drain_says_what_it_could_not_write(tmp_path, capsys):
    import threading
    gate = threading.Event()
    w = store.Writer(store.Store(tmp_path, None, None, lambda *a: None, min_free=0),
                     lambda snap: gate.wait() and None, lambda kind, e: None)
    for i in range(3):
        assert w.submit(i)
    assert w.drain(timeout=0.2) == 3
    assert "3 captured case(s) not yet written" in capsys.readouterr().err
    gate.set()
    assert w.drain(timeout=5) == 0


# ---- the command ---------------------------------------------------------------------------------
def _kdkit(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kdkit.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=env)


def _clean_env(**kw) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDKIT_")}
    env.update({k: str(v) for k, v in kw.items()})
    return env


def _launch_line(stdout: str) -> str:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("SGLANG_PLUGINS=kdkit ")]
    assert len(lines) == 1, stdout
    return lines[0]


def test_capture_env_and_launch_flags(monkeypatch):
    assert launch_lines("capture", "0.5.11")[-1].endswith("--attention-backend triton --disable-cuda-graph")
    assert launch_lines("validate", "0.5.23")[-1].endswith("--attention-backend triton --disable-decode-cuda-graph")
    assert launch_lines("replace", "0.5.23")[-1].endswith("--attention-backend triton")
    assert any("sitecustomize" in ln for ln in launch_lines("capture", "0.5.10"))
    r = _kdkit("capture", "env", "--mode", "capture", env=_clean_env(KDKIT_LAYERS="0-60:4"))
    assert r.returncode == 0 and "KDKIT_LAYERS=0-60:4" in r.stdout
    assert _launch_line(r.stdout).startswith(f"SGLANG_PLUGINS=kdkit KDKIT_MODE=capture KDKIT_DIR={ROOT}/kdkit-captures "
                                             "KDKIT_LAYERS=0-60:4 python -m sglang.launch_server")
    r = _kdkit("capture", "env", "--mode", "replace", env=_clean_env())
    assert r.returncode == 0
    if not torch.cuda.is_available():
        assert "# cannot run here: KDKIT_MODE=replace needs kdkit's CUDA kernel: no CUDA GPU" in r.stdout
    r = _kdkit("capture", "env", env=_clean_env(KDKIT_EVERY="0"))
    assert r.returncode == 2 and r.stderr.strip() == ("kdkit: KDKIT_EVERY='0': want an integer >= 1 (the server "
                                                      "would stop at start-up with this line)")


def test_capture_env_launch_line_carries_every_setting_in_force(tmp_path):
    """Pasted as printed, from another folder, the line gives the server the same settings."""
    import shlex
    env = dict(KDKIT_MODE="validate", KDKIT_DIR="my cases", KDKIT_LAYERS="1, 5-9:2", KDKIT_EVERY="4",
               KDKIT_MAX_BYTES="none", KDKIT_MAX_CASES="7", KDKIT_MIN_FREE="1G", KDKIT_REL_THRESHOLD="0.05",
               KDKIT_KERNEL="torch", KDKIT_MODEL="org/My-Model", KDKIT_FORWARD_MODES="target_verify,extend")
    r = _kdkit("capture", "env", env=_clean_env(**env))
    assert r.returncode == 0, r.stderr
    words = shlex.split(_launch_line(r.stdout))
    assigned = dict(w.split("=", 1) for w in words[:words.index("python")] if "=" in w)
    assert assigned.pop("SGLANG_PLUGINS") == "kdkit" and assigned["KDKIT_DIR"] == str(ROOT / "my cases")
    assert settings.from_env(assigned) == settings.from_env({**env, "KDKIT_DIR": str(ROOT / "my cases")})
    # the defaults are left out; the folder is always there, absolute
    r = _kdkit("capture", "env", "--mode", "capture", env=_clean_env())
    words = shlex.split(_launch_line(r.stdout))
    assert [w for w in words if w.startswith("KDKIT_")] == ["KDKIT_MODE=capture", f"KDKIT_DIR={ROOT}/kdkit-captures"]


def test_capture_env_warns_when_the_folder_cannot_be_written(tmp_path):
    (tmp_path / "a-file").write_text("x")
    r = _kdkit("capture", "env", "--mode", "capture", env=_clean_env(KDKIT_DIR=tmp_path / "a-file" / "cases"))
    assert r.returncode == 0
    assert (f"# warning: KDKIT_DIR={tmp_path}/a-file/cases cannot be created ({tmp_path}/a-file is a file): "
            "no case would be written") in r.stdout.splitlines()
    r = _kdkit("capture", "env", "--mode", "capture", env=_clean_env(KDKIT_DIR=tmp_path / "new" / "cases"))
    assert r.returncode == 0 and "warning" not in r.stdout


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


PROBE = ("import sys; print('torch' in sys.modules, "
         "any(type(f).__name__ == '_AfterImport' for f in sys.meta_path))")


@pytest.mark.parametrize("env", [{"KDKIT_MODE": "bogus"}, {"KDKIT_MODE": "replace"}, {"KDKIT_MODE": "validate"},
                                 {"KDKIT_MODE": "capture", "KDKIT_LAYER": "5"}, {"KDKIT_MODE": "capture"}])
def test_sitecustomize_leaves_every_python_but_sglang_alone(tmp_path, env):
    """The settings are checked when SGLang imports its Triton backend, not at interpreter start:
    a bad or (here, without a GPU) unrunnable one stops SGLang only; pip, `kdkit capture env` and
    any other Python start normally, and none imports torch because of kdkit."""
    sc = tmp_path / "sc"
    assert _kdkit("capture", "sitecustomize", sc).returncode == 0
    penv = _clean_env(PYTHONPATH=f"{sc}:{ROOT}", **env)
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=penv)
    assert (r.returncode, r.stdout, r.stderr) == (0, "False True\n", "")
    r = subprocess.run([sys.executable, "-m", "kdkit.cli", "capture", "env"], capture_output=True, text=True,
                       env=penv, cwd=tmp_path)
    bad = env["KDKIT_MODE"] == "bogus" or "KDKIT_LAYER" in env
    if bad:  # `kdkit capture env` itself names the bad setting, in one line
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("kdkit: KDKIT_"), r.stderr
    else:
        assert r.returncode == 0 and r.stderr == "" and "# launch" in r.stdout


def test_sitecustomize_without_kdkit_speaks_only_when_asked_to_hook(tmp_path):
    sc, blocker = tmp_path / "sc", tmp_path / "blocker" / "kdkit"
    assert _kdkit("capture", "sitecustomize", sc).returncode == 0
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('no kdkit in this Python')\n")
    penv = _clean_env(PYTHONPATH=f"{sc}:{blocker.parent}")
    r = subprocess.run([sys.executable, "-c", "pass"], capture_output=True, text=True, env=penv)
    assert (r.returncode, r.stderr) == (0, "")
    r = subprocess.run([sys.executable, "-c", "pass"], capture_output=True, text=True, env={**penv, "KDKIT_MODE": "capture"})
    assert r.returncode == 0 and r.stderr == ("[kdkit] sitecustomize: kdkit is not importable here (no kdkit in this "
                                              "Python); SGLang is not hooked\n")


def test_sitecustomize_runs_the_one_it_shadows(tmp_path):
    """Python imports only the first sitecustomize on sys.path: kdkit's runs the next one (the
    system's, e.g. Ubuntu's apport hook) after its own work; two kdkit ones do not loop."""
    a, b, other = tmp_path / "a", tmp_path / "b", tmp_path / "other"
    for d in (a, b):
        assert _kdkit("capture", "sitecustomize", d).returncode == 0
    other.mkdir()
    (other / "sitecustomize.py").write_text("import sys\nprint('the shadowed sitecustomize ran', file=sys.stderr)\n")
    penv = _clean_env(PYTHONPATH=f"{a}:{b}:{other}:{ROOT}", KDKIT_MODE="capture")
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=penv)
    assert (r.returncode, r.stdout, r.stderr) == (0, "False True\n", "the shadowed sitecustomize ran\n")


class _OneBackend:
    """The part of TritonAttnBackend the hook touches: forward_extend launches the kernel through
    the instance attribute `extend_attention_fwd`. `pause` holds a call inside forward_extend."""

    def __init__(self):
        self.extend_attention_fwd = self._kernel
        self.kernel_calls = []
        self.pause = {}

    def _kernel(self, *a, **kw):
        self.kernel_calls.append(a[0])

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None):
        hold = self.pause.get(q)
        if hold is not None:
            hold.wait(timeout=1.0)
        self.extend_attention_fwd(q)  # (a tag, not a tensor: bind fails, the tap gives the real kernel)


def test_a_lent_tap_serves_only_its_own_thread_and_is_always_given_back(tmp_path, monkeypatch):
    """Two threads on one backend object: a call the hook does not select, made while another
    thread's selected call has the tap lent, reaches the real kernel without passing the tap (its
    arguments are not the capture's); two selected calls at once take turns, so the backend keeps
    its real kernel after both (without the lock the second restored the first's tap)."""
    import threading
    from kdkit.capture import hook as hook_mod
    # no SGLang here: its graph-capture state reads "not capturing", as in an eager server
    monkeypatch.setattr(hook_mod.sglang_api, "in_graph_capture", lambda: False)
    hk = hook_mod.Hook(settings.from_env({"KDKIT_MODE": "capture", "KDKIT_DIR": str(tmp_path)}))
    be, orig = _OneBackend(), hook_mod.Hook.__call__
    layer = SimpleNamespace(layer_id=0)
    batch = lambda mode: SimpleNamespace(forward_mode=SimpleNamespace(name=mode.upper()))  # noqa: E731

    def call(tag, mode):
        orig(hk, type(be).forward_extend, be, tag, None, None, layer, batch(mode))

    inside = threading.Event()
    be.pause["A"] = inside
    a = threading.Thread(target=call, args=("A", "target_verify"))
    a.start()
    lent = lambda: vars(be)["extend_attention_fwd"] != be._kernel  # noqa: E731
    for _ in range(1000):  # until A's tap is lent
        if lent():
            break
        threading.Event().wait(0.005)
    assert lent(), hk.faults
    call("B", "decode")  # not selected: straight to forward_extend, which meets A's tap
    inside.set()
    a.join()
    assert be.kernel_calls == ["B", "A"]
    # only A's call reached the tap (its tag is not kernel arguments: one fault, the real kernel ran)
    assert sum(hk.faults.values()) == 1, hk.faults
    assert vars(be)["extend_attention_fwd"] == be._kernel

    be.kernel_calls.clear()
    gate = threading.Event()
    be.pause["C"] = gate
    threads = [threading.Thread(target=call, args=(t, "target_verify")) for t in ("C", "D")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(be.kernel_calls) == ["C", "D"] and sum(hk.faults.values()) == 3
    assert vars(be)["extend_attention_fwd"] == be._kernel


def test_a_plan_a_graph_captures_is_kept_for_the_graph():
    """A batch planned eagerly (SGLang's warm-up) and then captured into a CUDA graph: the graph
    points into that plan's workspace, so the plan moves to the captured ones and outlives any
    number of later eager batches (it used to stay among the eager plans and be dropped after
    EAGER_PLANS more, leaving the graph writing into freed memory). Only the cache's policy runs
    here: the kernel's own plan needs a GPU (tests/sglang_env/test_plugin_gpu.py runs it)."""
    from kdkit.capture import kernels

    ck = kernels.CudaKernel()
    made = []
    ck.kernel = SimpleNamespace(plan=lambda **kw: made.append(object()) or made[-1])

    def call(n):  # a batch of n tokens: its own metadata tensors, so its own key
        idx = torch.zeros(n + 1, dtype=torch.int32)
        return SimpleNamespace(qo_indptr=idx, kv_indptr=idx.clone(), kv_indices=idx.clone(), custom_mask=None,
                               mask_indptr=None, q=torch.zeros(n, 8, 576), num_heads=8, sm_scale=0.1,
                               logit_cap=0.0, causal=True, max_len_extend=n)
    warm = call(9)
    eager = ck.plan(warm, 100, capturing=False)
    assert ck.plan(warm, 100, capturing=True) is eager        # the capture reuses the warm-up's plan
    others = [call(n) for n in range(10, 10 + 3 * kernels.EAGER_PLANS)]
    for c in others:
        ck.plan(c, 100, capturing=False)
    assert ck.plan(warm, 100, capturing=False) is eager       # still there: no second plan
    assert len(made) == 1 + len(others) and len(ck._eager) <= kernels.EAGER_PLANS


# ---- found by a review (2026-12-02) --------------------------------------------------------------
def test_no_snapshot_is_taken_when_the_writer_cannot_keep_it(tmp_path, monkeypatch):
    """A snapshot gathers the request's pool rows on the GPU and pins host memory for them: with the
    writer's queue full it was taken and then thrown away, on every selected call."""
    from kdkit.capture import hook as hook_mod
    hk = hook_mod.Hook(settings.from_env({"KDKIT_MODE": "capture", "KDKIT_DIR": str(tmp_path)}))
    taken = []
    monkeypatch.setattr(hk, "_snapshot", lambda c, kc, note: taken.append(c) or object())
    monkeypatch.setattr(hk.writer, "has_room", lambda: False)
    for _ in range(5):
        hk._capture(SimpleNamespace(layer=0), None)
    assert taken == [] and hk.writer.dropped == 5


def test_a_backend_without_the_kernel_attribute_is_served_by_sglang(tmp_path, monkeypatch):
    """getattr of the kernel attribute was outside any try: an AttributeError escaped into
    SGLang's forward_extend and took the server down."""
    from kdkit.capture import hook as hook_mod
    monkeypatch.setattr(hook_mod.sglang_api, "in_graph_capture", lambda: False)
    hk = hook_mod.Hook(settings.from_env({"KDKIT_MODE": "capture", "KDKIT_DIR": str(tmp_path)}))

    class Bare:
        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None):
            return "sglang's own output"

    batch = SimpleNamespace(forward_mode=SimpleNamespace(name="TARGET_VERIFY"))
    out = hook_mod.Hook.__call__(hk, Bare.forward_extend, Bare(), "q", None, None, SimpleNamespace(layer_id=0), batch)
    assert out == "sglang's own output" and any(k[0] == "lending the kernel" for k in hk.faults)


def test_capture_env_checks_the_settings_with_the_mode_it_prints():
    """`capture env --mode replace` with KDKIT_KERNEL=torch printed a line the server refuses."""
    r = _kdkit("capture", "env", "--mode", "replace", env=_clean_env(KDKIT_KERNEL="torch"))
    assert r.returncode == 2 and r.stderr.startswith("kdkit: KDKIT_KERNEL='torch': replace needs a kernel with the live pair")
