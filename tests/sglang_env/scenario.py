"""One SGLang worker process with the plugin loaded the way the server loads it, run by the tests
as a fresh process (python scenario.py SPEC_JSON), like SGLang's spawned TP workers.

SPEC: {"rank": 0, "world": 1, "steps": [{"layout": "eager"|"graph", "layers": [0, 1],
        "forward_mode": "TARGET_VERIFY", "graph_capture": false, "breakable": false, "repeat": 1,
        "inject": null|"raise"|"perturb"|"efbig", "user_fault": null|"raise"|..., "seed": 0}, ...]}
"user_fault" plants one of tests/sglang_env/user_kernels.py's FAULTS in the KDKIT_KERNEL backend
(one of that file's) for the step; "inject" faults kdkit's own validate path.
"breakable" runs the step inside SGLang's breakable-CUDA-graph flag (>= 0.5.15: its replays call
attention eagerly on the real batch; with "graph_capture" too, its capture pass); "repeat" runs the
step's forward passes N times on the one batch object, as a graph's replays reuse a static batch.
The KDKIT_* settings and SGLANG_PLUGINS come from the environment. Prints one line
`RESULT {json}` with, per call, whether the output equals the unhooked forward_extend's bitwise
and its rel against it.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import standins  # noqa: E402

standins.install()  # before SGLang is imported
import harness  # noqa: E402


def _inject(kind):
    """A fault in kdkit's validate path (torch reference or CUDA kernel), or a file-size limit
    the OS enforces on every file this process writes from then on ("efbig": RLIMIT_FSIZE, so
    writing a case file fails in the OS write with EFBIG, as a full disk fails with ENOSPC);
    None puts the real functions back (the size limit stays: the writer thread writes later)."""
    from kdkit.backends import torch_ref
    from kdkit.capture import kernels
    real_ref = getattr(torch_ref, "_real_run", torch_ref.run)
    torch_ref._real_run = real_ref
    real_run = getattr(kernels.CudaKernel, "_real_run", kernels.CudaKernel.run)
    kernels.CudaKernel._real_run = real_run
    torch_ref.run = real_ref
    kernels.CudaKernel.run = real_run
    if kind == "cuda-raise":
        def broken_run(self, *a, **k):
            raise RuntimeError("injected fault in kdkit's kernel")
        kernels.CudaKernel.run = broken_run
    elif kind == "cuda-perturb":
        def wrong_run(self, *a, **k):
            return real_run(self, *a, **k) * 1.5
        kernels.CudaKernel.run = wrong_run
    if kind == "raise":
        def broken(case):
            raise RuntimeError("injected fault in kdkit's kernel")
        torch_ref.run = broken
    elif kind == "perturb":
        def wrong(case):
            res = real_ref(case)
            res.out = res.out * 1.5  # a kernel with a wrong scale: rel 0.5
            return res
        torch_ref.run = wrong
    elif kind == "efbig":
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG, not the process
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # a case file is larger


@contextlib.contextmanager
def count_syncs():
    """The host syncs inside the block, as torch's sync debug mode reports them (one warning
    each; nothing on a CPU). A list that fills when the block ends."""
    found: list = []
    if not torch.cuda.is_available():
        yield found
        return
    prev = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode(prev)
    found.extend(str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message))


def replace_in_graph(spec: dict) -> dict:
    """KDKIT_MODE=replace inside SGLang's capture mode and a real torch.cuda.graph capture (two
    warm-up passes, then the capture, as SGLang's graph runner does), replayed on the batch it was
    captured with and on refilled batches (new q/k, shorter prefixes, same buffers). Each replay is
    compared with the unhooked forward_extend (Triton) on the same batch, and with kdkit's kernel
    run eagerly through the plugin (the same plan: the graph must give the same bits)."""
    from kdkit.judge import compare
    from sglang.srt.model_executor.runner_utils.capture_mode import model_capture_mode
    plain = harness.unhooked_forward_extend()
    st = harness.Step("graph", seed=spec.get("seed", 0))
    lids = [0, 1]
    graphs = {}
    with model_capture_mode():
        for lid in lids:
            for _ in range(2):
                st.reset_pool()
                st.forward(lid)
        torch.cuda.synchronize()
        for lid in lids:
            st.reset_pool()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = st.forward(lid)
            graphs[lid] = (g, out)
    rows = []
    for i, refill in enumerate([None] + [tuple(r) for r in spec.get("refills", [])]):
        if refill is not None:
            st.refill(refill[0], seed=refill[1])
        for lid in lids:
            g, out = graphs[lid]
            st.reset_pool()
            g.replay()
            torch.cuda.synchronize()
            got = out.clone()
            st.reset_pool()
            eager_kdkit = st.forward(lid).clone()  # the plugin, outside any graph
            st.reset_pool()
            q, k, v = st.qkv[lid]
            ref = plain(st.backend, q, k, v, st.layers[lid], st.batch).clone()
            T, H = q.shape[0], st.heads
            m = compare.metrics(got.view(T, H, -1), ref.view(T, H, -1))
            rows.append({"batch": i, "layer": lid, "rel": m.rel, "max_abs": m.max_abs,
                         "ref_max_abs": m.ref_max_abs, "graph_equals_eager": bool(torch.equal(got, eager_kdkit)),
                         "differs_from_triton": not bool(torch.equal(got, ref))})
    from kdkit.capture import plugin
    return {"rows": rows, "faults": {f"{k[0]}:{k[1]}": n for k, n in plugin._HOOK.faults.items()},
            "plans_kept": len(plugin._HOOK.live.pair._captured)}


def main(spec: dict) -> dict:
    harness.state_rank(spec.get("rank", 0), spec.get("world", 1))
    from sglang.srt.plugins import load_plugins
    load_plugins()  # SGLang's own: entry points of sglang.srt.plugins, SGLANG_PLUGINS allow-list
    if spec.get("graph_replay"):
        return replace_in_graph(spec)
    hooked = hasattr(harness.sglang()["tb"].TritonAttnBackend.forward_extend, "__wrapped__")
    plain = harness.unhooked_forward_extend()
    calls = []
    from kdkit.judge import compare
    from kdkit.capture import plugin
    for i, s in enumerate(spec["steps"]):
        _inject(s.get("inject"))
        if "user_fault" in s:
            plugin._HOOK.live.backend.fault = s.get("user_fault")
        st = harness.Step(s.get("layout", "eager"), seed=s.get("seed", i), mode=s.get("forward_mode", "TARGET_VERIFY"))
        for lid in [lid for _ in range(s.get("repeat", 1)) for lid in s.get("layers", [0, 1])]:
            # the unhooked call first: the first Triton launch of a specialisation compiles and
            # loads it (host syncs of its own), which must not be counted against the hook
            st.reset_pool()
            q, k, v = st.qkv[lid]
            with count_syncs() as plain_syncs:
                ref = plain(st.backend, q, k, v, st.layers[lid], st.batch)
            ref = ref.clone()
            st.reset_pool()
            with count_syncs() as hooked_syncs, contextlib.ExitStack() as scope:
                if s.get("breakable"):
                    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import \
                        enable_breakable_cuda_graph
                    scope.enter_context(enable_breakable_cuda_graph())
                if s.get("graph_capture"):
                    from sglang.srt.model_executor.runner_utils.capture_mode import model_capture_mode
                    scope.enter_context(model_capture_mode())
                out = st.forward(lid)
            T = q.shape[0]
            calls.append({"step": i, "layer": lid, "equal": bool(torch.equal(out.clone(), ref)),
                          "rel": compare.metrics(out.view(T, st.heads, -1), ref.view(T, st.heads, -1)).rel,
                          "syncs": [len(hooked_syncs), len(plain_syncs)],
                          "sync_what": hooked_syncs[:3]})
    if plugin._HOOK is not None:
        plugin._HOOK.close()
    h = plugin._HOOK
    return {"hooked": hooked, "calls": calls,
            "written": [str(p) for p in (h.store.written if h and h.store else [])],
            "stopped": h.store.stopped if h and h.store else None,
            "faults": {f"{k[0]}:{k[1]}": n for k, n in (h.faults.items() if h else [])},
            "plans_kept": len(h.live.pair._captured) if h and h.live and h.live.pair is not None else None}


def spawn_entry(spec: dict, env: dict, out_path: str) -> None:
    """multiprocessing 'spawn' target (a fresh interpreter, as SGLang starts its TP workers)."""
    os.environ.update(env)
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    res = main(spec)
    with open(out_path, "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    result = main(json.loads(sys.argv[1]))
    sys.stdout.flush()
    print("RESULT " + json.dumps(result))
