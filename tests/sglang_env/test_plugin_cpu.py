"""The plugin on SGLang's real code path, on a CPU (Triton under TRITON_INTERPRET=1).

Each scenario is a fresh process (tests/sglang_env/scenario.py) that loads the plugin through
SGLang's own load_plugins() and entry point, with the KDKIT_* settings in its environment, then
calls the real TritonAttnBackend.forward_extend on real TARGET_VERIFY batches (harness.py) in
both metadata layouts, and compares every output with the unhooked forward_extend's, bitwise.
"""
from __future__ import annotations

import importlib.metadata
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU half (the GPU half: test_plugin_gpu.py)")

NEWEST = "0.5.23"


def _env(**kw) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDKIT_") and k != "SGLANG_PLUGINS"}
    if torch.cuda.is_available():  # the GPU half (test_plugin_gpu.py): SGLang's Triton kernel compiled
        env.pop("TRITON_INTERPRET", None)
    else:
        env["TRITON_INTERPRET"] = "1"
    env["SGLANG_PLUGINS"] = "kdkit"
    # the 2 GiB free-space floor (KDKIT_MIN_FREE's default) is the machine's, not the scenario's:
    # off here, so a nearly full CI disk does not stop these captures (tests/test_capture.py
    # tests the floor itself); a test that wants it passes KDKIT_MIN_FREE
    env["KDKIT_MIN_FREE"] = "0"
    env.update({k: str(v) for k, v in kw.items()})
    return env


def _start(spec: dict, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE / "scenario.py"), json.dumps(spec)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def _finish(p: subprocess.Popen, rc=0):
    out, err = p.communicate(timeout=600)
    assert (p.returncode == 0) == (rc == 0), f"rc {p.returncode}\n{err[-3000:]}\n{out[-2000:]}"
    lines = [ln for ln in err.splitlines() if ln.startswith("[kdkit]")]
    res = None
    for ln in out.splitlines():
        if ln.startswith("RESULT "):
            res = json.loads(ln[len("RESULT "):])
    return res, lines, err


def run(spec: dict, rc=0, **env):
    return _finish(_start(spec, _env(**env)), rc)


def _all_equal(res) -> None:
    assert res["hooked"], "load_plugins() did not hook forward_extend"
    bad = [c for c in res["calls"] if not c["equal"]]
    assert not bad, f"the hook changed the server's output: {bad}"


def _kdkit(*args):
    return subprocess.run([sys.executable, "-m", "kdkit.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=_env())


# ---- the plugin as SGLang sees it ---------------------------------------------------------------
def test_entry_point_is_what_load_plugins_calls():
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins")}
    assert eps["kdkit"].value == "kdkit.capture.plugin:register"
    from kdkit.capture import plugin
    assert eps["kdkit"].load() is plugin.register


# ---- capture ------------------------------------------------------------------------------------
CAPTURE_STEPS = [
    {"layout": "eager", "seed": 0},                      # step 0
    {"layout": "graph", "seed": 0},                      # step 1: same data, CUDA-graph buffers
    {"layout": "eager", "seed": 2, "forward_mode": "DRAFT_EXTEND_V2"},  # the draft model: not hooked
    {"layout": "graph", "seed": 3, "graph_capture": True},  # inside SGLang's capture mode
]


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    d = tmp_path_factory.mktemp("capture")
    res, lines, _ = run({"steps": CAPTURE_STEPS}, KDKIT_MODE="capture", KDKIT_LAYERS="1", KDKIT_DIR=d)
    return d, res, lines


def test_capture_writes_one_case_per_selected_call(captured):
    d, res, lines = captured
    _all_equal(res)
    assert sorted(p.name for p in d.iterdir()) == ["model-L1-r0-s0.pt", "model-L1-r0-s1.pt"]
    graph = [ln for ln in lines if "runs from CUDA graphs" in ln]
    assert len(graph) == 1 and "--disable-decode-cuda-graph" in graph[0], lines
    assert not res["faults"] and res["stopped"] is None


def test_captured_cases_are_lint_clean_and_replay_bitwise(captured):
    from kdkit import case as case_mod
    from kdkit.backends import triton_sglang
    d, _, _ = captured
    for f in sorted(d.iterdir()):
        r = _kdkit("inspect", f)
        assert r.returncode == 0 and "lint: clean" in r.stdout, r.stdout[-2000:] + r.stderr
        c = case_mod.load(f)
        assert c.meta["source"] == "captured" and c.meta["layer_id"] == 1 and c.meta["tp_rank"] == 0
        assert c.meta["forward_mode"] == "target_verify" and c.meta["sglang_version"] == NEWEST
        assert c.meta["case_id"] == f.stem and c.meta["model"] == "model"
        res = triton_sglang.run(c)
        assert res.info["sglang_release"] == NEWEST
        assert torch.equal(res.out, c.ref_out), f"{f.name}: replay does not reproduce the captured output"
    r = _kdkit("replay", d / "model-L1-r0-s1.pt", "--backends", "triton_sglang,oracle", "--against", "captured")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert re.search(r"triton_sglang\s+pass\s+0\.00e\+00", r.stdout), r.stdout


def test_graph_layout_case_equals_the_eager_one(captured):
    """Same batch, CUDA-graph buffers (over-sized kv_indices and uint8 mask with stale entries):
    the case keeps only what the call reads, so it equals the eager capture."""
    from kdkit import case as case_mod, layout, synth
    d, _, _ = captured
    eager, graph = (case_mod.load(d / f"model-L1-r0-s{s}.pt") for s in (0, 1))
    for name in ("q", "k", "v", "kv_buffer", "kv_indices", "out_cache_loc", "slot_ids", "prefix_lens",
                 "ref_out", "mask_indptr"):
        a, b = getattr(eager, name), getattr(graph, name)
        if a.is_floating_point():  # row 0, the scratch slot, is NaN in this pool: equal_nan
            assert torch.allclose(a, b, rtol=0, atol=0, equal_nan=True), name
        else:
            assert torch.equal(a.long(), b.long()), name
    assert eager.custom_mask.dtype == torch.bool and graph.custom_mask.dtype == torch.uint8
    assert torch.equal(eager.custom_mask, graph.custom_mask.bool())
    # the compaction is kdkit.layout.compact's: row 0, then the referenced slots in order
    src = synth.make_case(bs=2, prefix=[13, 5], q_len=9, heads=4, tree="ddtree", seed=0, keep_pool=True,
                          sm_scale=0.1352)
    _, idx, loc, slots = layout.compact(src.kv_buffer, src.kv_indices, src.out_cache_loc)
    assert torch.equal(eager.slot_ids, slots) and torch.equal(eager.kv_indices.long(), idx.long())
    assert torch.equal(eager.out_cache_loc.long(), loc.long())
    # the pool rows the call read, draft rows as forward_extend wrote them (= k)
    assert torch.equal(eager.kv_buffer[eager.out_cache_loc.long()], eager.k)


# ---- validate -----------------------------------------------------------------------------------
def test_breakable_graph_replays_are_captured_and_counted_as_steps(tmp_path):
    """SGLang >= 0.5.15 runs prefill (and, opted in, verify) in breakable CUDA graphs, whose
    replays call attention eagerly on the real batch while get_is_capture_mode() answers True:
    the capture pass (dummy data) is passed by in silence, each replay of the one static batch is
    a step of its own, and KDKIT_EVERY counts them."""
    steps = [{"layout": "graph", "seed": 0, "breakable": True, "graph_capture": True},  # the capture pass
             {"layout": "graph", "seed": 0, "breakable": True, "repeat": 4}]         # four replays
    res, lines, _ = run({"steps": steps}, KDKIT_MODE="capture", KDKIT_LAYERS="1", KDKIT_EVERY="2", KDKIT_DIR=tmp_path)
    _all_equal(res)
    names = sorted(Path(p).name for p in res["written"])
    assert [re.search(r"-s(\d+)", n).group(1) for n in names] == ["0", "2"], names
    assert not [ln for ln in lines if "runs from CUDA graphs" in ln], lines


def test_validate_logs_each_call_and_writes_the_failures(tmp_path):
    steps = [{"layout": "eager"}, {"layout": "graph"}, {"layout": "eager", "inject": "raise"},
             {"layout": "graph", "inject": "perturb"}]
    res, lines, _ = run({"steps": steps}, KDKIT_MODE="validate", KDKIT_KERNEL="torch", KDKIT_DIR=tmp_path)
    _all_equal(res)
    seed = [ln for ln in lines if re.fullmatch(r"\[kdkit\] L[01] r0 s\d max_abs_diff=\S+ mean=\S+ rel=\S+", ln)]
    assert [ln.split()[1:4] for ln in seed] == [["L0", "r0", "s0"], ["L1", "r0", "s0"], ["L0", "r0", "s1"],
                                               ["L1", "r0", "s1"], ["L0", "r0", "s3"], ["L1", "r0", "s3"]], lines
    rels = [float(ln.rsplit("rel=", 1)[1]) for ln in seed]
    assert max(rels[:4]) < 0.02 and min(rels[4:]) > 0.4, rels  # torch reference vs Triton; then the wrong scale
    faults = [ln for ln in lines if "validate failed: KDKIT_KERNEL=torch raised RuntimeError: injected fault" in ln]
    assert len(faults) == 1, lines  # two layers failed, said once
    assert res["faults"] == {"validate:RuntimeError": 2}
    # the kernel's fault and its wrong output are both written, to be replayed offline
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-L0-r0-s2.pt", "model-L0-r0-s3.pt",
                                                          "model-L1-r0-s2.pt", "model-L1-r0-s3.pt"]
    from kdkit import case as case_mod
    c = case_mod.load(tmp_path / "model-L0-r0-s3.pt")
    assert "rel=5.00" in c.meta["note"] and "KDKIT_KERNEL=torch" in c.meta["note"]


# ---- never hurts the server ---------------------------------------------------------------------
def test_budget_full_disk_unusable_folder_no_overwrite_and_every(tmp_path):
    two = {"steps": [{"layout": "eager"}, {"layout": "graph"}]}
    d_cases, d_bytes, d_full, d_every = tmp_path / "cases", tmp_path / "bytes", tmp_path / "full", tmp_path / "every"
    d_cases.mkdir()
    precious = d_cases / "model-L1-r0-s0.pt"
    precious.write_bytes(b"precious: not a case, must survive")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    procs = [
        _start(two, _env(KDKIT_MODE="capture", KDKIT_LAYERS="1", KDKIT_DIR=d_cases, KDKIT_MAX_CASES=2)),
        _start(two, _env(KDKIT_MODE="capture", KDKIT_DIR=d_bytes, KDKIT_MAX_BYTES="100K")),
        _start({"steps": [{"layout": "eager", "inject": "efbig"}, {"layout": "graph", "inject": "efbig"}]},
               _env(KDKIT_MODE="capture", KDKIT_DIR=d_full)),
        _start(two, _env(KDKIT_MODE="capture", KDKIT_DIR=blocker / "sub")),
        _start({"steps": [{"layout": "eager"}, {"layout": "graph"}, {"layout": "eager", "seed": 4}]},
               _env(KDKIT_MODE="capture", KDKIT_DIR=d_every, KDKIT_EVERY=2, KDKIT_LAYERS="0")),
    ]
    (cases, l_cases, _), (by, l_bytes, _), (full, l_full, _), (unusable, l_unusable, _), (every, _, _) = \
        [_finish(p) for p in procs]
    for res in (cases, by, full, unusable, every):
        _all_equal(res)
        assert not res["faults"], res["faults"]

    # the existing file is kept, the new case goes beside it; then the count budget stops it
    assert precious.read_bytes().startswith(b"precious")
    assert sorted(p.name for p in d_cases.iterdir()) == ["model-L1-r0-s0-2.pt", "model-L1-r0-s0.pt"]
    assert [ln for ln in l_cases if "stopped" in ln] == [
        f"[kdkit] capturing stopped: KDKIT_MAX_CASES=2 reached (2 case files in {d_cases})"]

    assert list(d_bytes.iterdir()) == []
    stop = [ln for ln in l_bytes if "stopped" in ln]
    assert len(stop) == 1 and "KDKIT_MAX_BYTES=100000 reached" in stop[0]

    # the OS refuses the write (a file-size limit: EFBIG, met in the file write as ENOSPC is):
    # one line, no file, no temporary file, no fault, and no later capture is even tried
    assert list(d_full.iterdir()) == []
    stop = [ln for ln in l_full if "stopped" in ln]
    assert len(stop) == 1 and "File too large (errno EFBIG)" in stop[0], l_full
    assert full["stopped"] == stop[0][len("[kdkit] capturing stopped: "):]

    stop = [ln for ln in l_unusable if "stopped" in ln]
    assert len(stop) == 1 and "cannot create" in stop[0] and unusable["written"] == []

    # KDKIT_EVERY=2: steps 0 and 2 of three
    assert sorted(p.name for p in d_every.iterdir()) == ["model-L0-r0-s0.pt", "model-L0-r0-s2.pt"]


def test_ranks_are_separate_spawned_processes_writing_one_folder(tmp_path):
    import scenario
    ctx = mp.get_context("spawn")  # as SGLang starts its TP workers
    env = {k: v for k, v in _env(KDKIT_MODE="capture", KDKIT_LAYERS="0", KDKIT_DIR=tmp_path,
                                 KDKIT_MODEL="moonshotai/Kimi-K2.6").items()}
    procs = []
    for rank in range(2):
        out = tmp_path.parent / f"rank{rank}.json"
        p = ctx.Process(target=scenario.spawn_entry, args=({"rank": rank, "world": 2,
                                                           "steps": [{"layout": "eager"}]}, env, str(out)))
        p.start()
        procs.append((p, out))
    for p, _ in procs:
        p.join(600)
        assert p.exitcode == 0
    for _, out in procs:
        _all_equal(json.loads(out.read_text()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Kimi-K2.6-L0-r0-s0.pt", "Kimi-K2.6-L0-r1-s0.pt"]


@pytest.mark.parametrize("env, line", [
    ({"KDKIT_MODE": "replace"}, "KDKIT_MODE=replace needs kdkit's CUDA kernel: "),
    ({"KDKIT_MODE": "validate"}, "KDKIT_MODE=validate needs kdkit's CUDA kernel: "),
    ({"KDKIT_MODE": "capture", "KDKIT_LAYERS": "60-0"}, "KDKIT_LAYERS='60-0': '60-0': a range runs low-high"),
    ({"KDKIT_MODE": "captur"}, "KDKIT_MODE='captur': choose one of capture, validate, replace"),
    ({"KDKIT_MODE": "capture", "KDKIT_MAX_BYTES": "lots"}, "KDKIT_MAX_BYTES='lots': want a size like"),
])
def test_bad_settings_stop_start_up_with_one_line(env, line):
    """replace needs kdkit's CUDA kernel: on a CPU it refuses at start-up, before serving."""
    res, _, err = run({"steps": [{"layout": "eager"}]}, rc=1, **env)
    assert res is None
    last = err.strip().splitlines()[-1]
    assert last.startswith("[kdkit] stopping SGLang at start-up: " + line), err[-2000:]
    assert "Traceback" not in err


def test_sitecustomize_hooks_where_the_plugin_system_does_not(tmp_path):
    """SGLANG_PLUGINS names another plugin, so load_plugins() skips kdkit (as a release without
    the plugin system would); the sitecustomize.py on PYTHONPATH hooks it instead."""
    site = tmp_path / "site"
    r = _kdkit("capture", "sitecustomize", site)
    assert r.returncode == 0 and (site / "sitecustomize.py").is_file()
    assert r.stdout.splitlines()[-1] == f'export PYTHONPATH={site.resolve()}"${{PYTHONPATH:+:$PYTHONPATH}}"'
    assert _kdkit("capture", "sitecustomize", site).returncode == 1  # never over an existing file
    d = tmp_path / "cases"
    env = _env(KDKIT_MODE="capture", KDKIT_LAYERS="1", KDKIT_DIR=d, SGLANG_PLUGINS="someone-else",
               PYTHONPATH=f"{site}:{os.environ.get('PYTHONPATH', '')}")
    res, lines, _ = _finish(_start({"steps": [{"layout": "eager"}]}, env))
    _all_equal(res)
    assert sorted(p.name for p in d.iterdir()) == ["model-L1-r0-s0.pt"]


def test_sitecustomize_checks_the_settings_when_sglang_imports_its_backend(tmp_path):
    """A bad setting with the sitecustomize installation stops SGLang (here: the worker process
    as it imports the Triton backend) with one line, no traceback; Python itself starts."""
    site = tmp_path / "site"
    assert _kdkit("capture", "sitecustomize", site).returncode == 0
    env = _env(KDKIT_MODE="capture", KDKIT_LAYER="1", SGLANG_PLUGINS="someone-else",
               PYTHONPATH=f"{site}:{os.environ.get('PYTHONPATH', '')}")
    res, _, err = _finish(_start({"steps": [{"layout": "eager"}]}, env), rc=1)
    assert res is None and "Traceback" not in err and "Fatal Python error" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == ("[kdkit] stopping SGLang at start-up: KDKIT_LAYER='1': not a kdkit "
                                            "setting: did you mean KDKIT_LAYERS? (`kdkit capture env` lists the settings)")


def test_capture_env_names_the_installed_release_flags():
    r = subprocess.run([sys.executable, "-m", "kdkit.cli", "capture", "env"], capture_output=True, text=True,
                       env=_env(KDKIT_MODE="validate", KDKIT_LAYERS="0-60:4"), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "KDKIT_LAYERS=0-60:4" in r.stdout and f"# SGLang: {NEWEST}" in r.stdout
    launch = [ln for ln in r.stdout.splitlines() if ln.startswith("SGLANG_PLUGINS=kdkit KDKIT_MODE=validate ")]
    assert len(launch) == 1 and launch[0].endswith("--attention-backend triton --disable-decode-cuda-graph")
    assert "# cannot run here: KDKIT_MODE=validate needs kdkit's CUDA kernel: " in r.stdout  # validate's default KDKIT_KERNEL=cuda, on a CPU


# ---- a user's kernel, named by file spec (KDKIT_KERNEL=path/to/file.py:attr) ---------------------
USER = HERE / "user_kernels.py"
FAULT_KINDS = {"raise": "RuntimeError", "shape": "wrong shape", "nan": "non-finite", "dtype": "wrong dtype",
               "device": "wrong device"}


def _seed_rels(lines) -> list[float]:
    return [float(ln.rsplit("rel=", 1)[1]) for ln in lines
            if re.fullmatch(r"\[kdkit\] L[01] r0 s\d+ max_abs_diff=\S+ mean=\S+ rel=\S+", ln)]


def test_validate_a_users_kernel_writes_only_where_it_disagrees(tmp_path):
    """run(case) only (the user file's `right` and `wrong`: kdkit's torch reference, then scaled):
    the right one writes nothing, the wrong one writes every call; the server's output is Triton's."""
    d_right, d_wrong = tmp_path / "right", tmp_path / "wrong"
    two = {"steps": [{"layout": "eager"}, {"layout": "graph"}]}
    (right, l_right, _), (wrong, l_wrong, _) = [
        _finish(p) for p in (_start(two, _env(KDKIT_MODE="validate", KDKIT_KERNEL=f"{USER}:right", KDKIT_DIR=d_right)),
                             _start(two, _env(KDKIT_MODE="validate", KDKIT_KERNEL=f"{USER}:wrong", KDKIT_DIR=d_wrong)))]
    for res in (right, wrong):
        _all_equal(res)
        assert res["faults"] == {}, res["faults"]
    assert any(f"validate with KDKIT_KERNEL={USER}:right" in ln for ln in l_right), l_right
    assert len(_seed_rels(l_right)) == 4 and max(_seed_rels(l_right)) < 0.02, l_right
    assert not d_right.exists() or list(d_right.iterdir()) == []
    assert min(_seed_rels(l_wrong)) > 0.4, l_wrong
    assert sorted(p.name for p in d_wrong.iterdir()) == ["model-L0-r0-s0.pt", "model-L0-r0-s1.pt",
                                                         "model-L1-r0-s0.pt", "model-L1-r0-s1.pt"]
    # the written case replays offline through the same spec, and fails there too
    r = _kdkit("replay", d_wrong / "model-L0-r0-s0.pt", "--backends", f"{USER}:wrong")
    assert r.returncode == 1 and "wrong failed" in r.stderr, r.stdout[-2000:] + r.stderr


@pytest.mark.parametrize("attr", ["right", "paired"])  # run(case), and the live pair on the server's tensors
def test_a_faulty_users_kernel_never_changes_the_servers_output(tmp_path, attr):
    """Raises, wrong shape, NaN, wrong dtype, wrong device: each call's output is Triton's, bitwise;
    each kind is said once (two layers fault per step), counted, and its cases written."""
    # (the pair writes into kdkit's buffer: a wrong shape raises there, and a part left unwritten is NaN)
    faults = ["raise", "shape", "nan", "dtype", "device"] if attr == "right" else ["raise", "nan", "unwritten"]
    steps = [{"layout": "eager", "user_fault": None}] + [{"layout": "eager", "user_fault": f} for f in faults]
    res, lines, _ = run({"steps": steps}, KDKIT_MODE="validate", KDKIT_KERNEL=f"{USER}:{attr}", KDKIT_DIR=tmp_path)
    _all_equal(res)
    kinds = {**FAULT_KINDS, "unwritten": "non-finite"}
    want = {}
    for f in faults:
        want[f"validate:{kinds[f]}"] = want.get(f"validate:{kinds[f]}", 0) + 2
    assert res["faults"] == want, (res["faults"], lines)
    said = [ln for ln in lines if "validate failed: KDKIT_KERNEL=" in ln]
    assert len(said) == len(set(kinds[f] for f in faults)), said  # once per kind
    assert all("the real output was returned and the case written" in ln for ln in said), said
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"model-L{lid}-r0-s{s}.pt" for s in range(1, len(steps)) for lid in (0, 1))
    assert len(_seed_rels(lines)) == 2 and max(_seed_rels(lines)) < 0.02  # the fault-free step
    from kdkit import case as case_mod
    note = case_mod.load(tmp_path / "model-L0-r0-s3.pt").meta["note"]
    assert note.startswith(f"kdkit validate: KDKIT_KERNEL={USER}:{attr} returned NaN/inf in "), note


def test_replace_with_a_users_live_pair(tmp_path):
    """The pair serves the calls (within tolerance of Triton, not Triton's bits), eagerly and in
    SGLang's graph-capture mode (the plan made there is kept); one that raises leaves Triton to
    serve, bitwise, said once."""
    steps = [{"layout": "eager"}, {"layout": "graph"}, {"layout": "graph", "graph_capture": True},
             {"layout": "eager", "user_fault": "raise"}]
    res, lines, _ = run({"steps": steps}, KDKIT_MODE="replace", KDKIT_KERNEL=f"{USER}:paired")
    served = [c for c in res["calls"] if c["step"] < 3]
    assert all(not c["equal"] and c["rel"] < 0.02 for c in served), served
    assert res["plans_kept"] == 1
    assert all(c["equal"] for c in res["calls"] if c["step"] == 3)
    assert res["faults"] == {"replace:RuntimeError": 2}
    assert sum("replace failed: RuntimeError: injected fault in the user's kernel" in ln for ln in lines) == 1, lines


# the Triton starter `kdkit new-kernel --lang triton` writes, named by file spec: its live pair is
# the adapter's plan(batch) / launch(...) (kdkit.byok.triton), under TRITON_INTERPRET=1 here
TRITON_STARTER = ROOT / "kdkit" / "byok" / "starters" / "triton" / "backend.py"


def test_validate_and_replace_with_the_triton_starter(tmp_path):
    """validate: the starter beside SGLang's Triton on the server's tensors (its live pair, into a
    NaN-filled buffer) agrees on every call in both metadata layouts, so nothing is written and the
    server's output is Triton's, bitwise. replace: the starter serves every call (within tolerance
    of Triton, not its bits), eagerly, on the graph layout's persistent buffers, and in SGLang's
    graph-capture mode (the plan made there is kept for the graph)."""
    d = tmp_path / "validate"
    val = _start({"steps": [{"layout": "eager"}, {"layout": "graph"}]},
                 _env(KDKIT_MODE="validate", KDKIT_KERNEL=TRITON_STARTER, KDKIT_DIR=d))
    rep = _start({"steps": [{"layout": "eager"}, {"layout": "graph"}, {"layout": "graph", "graph_capture": True}]},
                 _env(KDKIT_MODE="replace", KDKIT_KERNEL=TRITON_STARTER))
    (res, lines, _), (served, r_lines, _) = _finish(val), _finish(rep)
    _all_equal(res)
    assert res["faults"] == {}, (res["faults"], lines)
    assert any(f"validate with KDKIT_KERNEL={TRITON_STARTER}" in ln for ln in lines), lines
    # fp32 on both sides here (the harness's CPU dtype): they differ by fp32 rounding and the
    # order of the softmax sums, far under 2% (the plugin's own threshold, KDKIT_REL_THRESHOLD)
    rels = _seed_rels(lines)
    assert len(rels) == 4 and max(rels) < 0.02, lines
    assert not d.exists() or list(d.iterdir()) == []
    assert served["faults"] == {}, (served["faults"], r_lines)
    assert len(served["calls"]) == 6
    assert all(not c["equal"] and c["rel"] < 0.02 for c in served["calls"]), served["calls"]
    assert served["plans_kept"] == 1


@pytest.mark.parametrize("env, line", [
    ({"KDKIT_MODE": "replace", "KDKIT_KERNEL": f"{USER}:right"},
     f"KDKIT_KERNEL='{USER}:right': replace needs a kernel with plan(batch) and launch(plan, q, k, v, kv_buffer, out)"),
    ({"KDKIT_MODE": "validate", "KDKIT_KERNEL": f"{USER}:nothing"},
     f"KDKIT_KERNEL='{USER}:nothing': {USER}:nothing: no attribute 'nothing' (backends in it: right, wrong, paired)"),
    ({"KDKIT_MODE": "validate", "KDKIT_KERNEL": "kdkit_no_such_pkg.mod"},
     "KDKIT_KERNEL='kdkit_no_such_pkg.mod': kdkit_no_such_pkg.mod: cannot import (ModuleNotFoundError: "),
    ({"KDKIT_MODE": "validate", "KDKIT_KERNEL": "mine"}, "KDKIT_KERNEL='mine': not a backend here: choose cuda, torch"),
])
def test_a_users_kernel_that_cannot_serve_stops_start_up_with_one_line(env, line):
    res, _, err = run({"steps": [{"layout": "eager"}]}, rc=1, **env)
    assert res is None and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("[kdkit] stopping SGLang at start-up: " + line), err[-2000:]
