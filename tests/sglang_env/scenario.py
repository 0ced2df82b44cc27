"""One SGLang worker process with the plugin loaded the way the server loads it, run by the tests
as a fresh process (python scenario.py SPEC_JSON), like SGLang's spawned TP workers.

SPEC: {"rank": 0, "world": 1, "steps": [{"layout": "eager"|"graph", "layers": [0, 1],
        "forward_mode": "TARGET_VERIFY", "graph_capture": false, "inject": null|"raise"|"perturb"|"enospc",
        "seed": 0}, ...]}
The KDKIT_* settings and SGLANG_PLUGINS come from the environment. Prints one line
`RESULT {json}` with, per call, whether the output equals the unhooked forward_extend's bitwise.
"""
from __future__ import annotations

import errno
import json
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def _inject(kind):
    """A fault in kdkit's validate path, or a full disk under the writer."""
    from kdkit import case as case_mod
    from kdkit.capture import kernels
    real_ref = getattr(kernels, "_real_torch_reference", kernels.torch_reference)
    kernels._real_torch_reference = real_ref
    real_save = getattr(case_mod.Case, "_real_save", case_mod.Case.save)
    case_mod.Case._real_save = real_save
    kernels.torch_reference = real_ref
    case_mod.Case.save = real_save
    if kind == "raise":
        def broken(case):
            raise RuntimeError("injected fault in kdkit's kernel")
        kernels.torch_reference = broken
    elif kind == "perturb":
        def wrong(case):
            out = real_ref(case)
            return out * 1.5  # a kernel with a wrong scale: rel 0.5
        kernels.torch_reference = wrong
    elif kind == "enospc":
        def full(self, path, overwrite=False):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        case_mod.Case.save = full


def main(spec: dict) -> dict:
    harness.state_rank(spec.get("rank", 0), spec.get("world", 1))
    from sglang.srt.plugins import load_plugins
    load_plugins()  # SGLang's own: entry points of sglang.srt.plugins, SGLANG_PLUGINS allow-list
    hooked = hasattr(harness.sglang()["tb"].TritonAttnBackend.forward_extend, "__wrapped__")
    plain = harness.unhooked_forward_extend()
    calls = []
    for i, s in enumerate(spec["steps"]):
        _inject(s.get("inject"))
        st = harness.Step(s.get("layout", "eager"), seed=s.get("seed", i), mode=s.get("forward_mode", "TARGET_VERIFY"))
        for lid in s.get("layers", [0, 1]):
            st.reset_pool()
            if s.get("graph_capture"):
                from sglang.srt.model_executor.runner_utils.capture_mode import model_capture_mode
                with model_capture_mode():
                    out = st.forward(lid).clone()
            else:
                out = st.forward(lid).clone()
            st.reset_pool()
            q, k, v = st.qkv[lid]
            ref = plain(st.backend, q, k, v, st.layers[lid], st.batch).clone()
            calls.append({"step": i, "layer": lid, "equal": bool(torch.equal(out, ref))})
    from kdkit.capture import plugin
    if plugin._HOOK is not None:
        plugin._HOOK.close()
    h = plugin._HOOK
    return {"hooked": hooked, "calls": calls,
            "written": [str(p) for p in (h.store.written if h and h.store else [])],
            "stopped": h.store.stopped if h and h.store else None,
            "faults": {f"{k[0]}:{k[1]}": n for k, n in (h.faults.items() if h else [])}}


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
