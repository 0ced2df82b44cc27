"""kdkit_starter: the CUDA kernel in kernel.cu as a kdkit backend.

Edit kernel.cu and run again: kdkit rebuilds it (its cache key covers the file and its headers).
    kdkit replay data/captured_tensors/seed-shape.pt --backends kdkit_starter
    backend.resources("sm_120").table()        # registers, shared memory, spills; no GPU needed
"""
from pathlib import Path

from kdkit.byok.cuda import CudaKernel, Launch, Option, Workspace

DL = 512  # the latent, and the width of V and of the output
ROWS = ["num_heads", "num_tokens", "nsplit"]

backend = CudaKernel(
    name="kdkit_starter",
    source=Path(__file__).with_name("kernel.cu"),
    options={"nsplit": Option(16, range(1, 257), "KV splits per request")},
    # each split's normalised output and LSE, per (token, head) row; the merge kernel reads them
    workspace=[Workspace("o_part", lambda p: (p.nsplit, p.num_tokens * p.num_heads, DL)),
               Workspace("lse_part", lambda p: (p.nsplit, p.num_tokens * p.num_heads))],
    launches=[
        Launch("kdkit_starter_partial",
               args=["q", "k", "v", "kv_buffer", "qo_indptr", "kv_indptr", "kv_indices", "custom_mask",
                     "mask_indptr", "o_part", "lse_part", "q.stride(0)", "q.stride(1)", "k.stride(0)",
                     "v.stride(0)", "kv_buffer.stride(0)", *ROWS, "sm_scale", "logit_cap", "causal"],
               grid=lambda p: (p.max_q_len * p.num_heads, p.nsplit, p.bs), block=128),
        Launch("kdkit_starter_merge",
               args=["o_part", "lse_part", "out", "lse", "out.stride(0)", "out.stride(1)", *ROWS],
               grid=lambda p: (p.num_tokens * p.num_heads,), block=128),
    ],
)

# the module is a backend too (`--backends path/to/backend.py`)
NAME, LABEL, LINT_CLEAN = backend.NAME, backend.LABEL, backend.LINT_CLEAN
unavailable, run, prepare = backend.unavailable, backend.run, backend.prepare
# the live pair (KDKIT_MODE=validate/replace, CUDA graphs): plan(batch) once per batch, launch per layer
plan, launch, unsupported = backend.plan, backend.launch, backend.unsupported
