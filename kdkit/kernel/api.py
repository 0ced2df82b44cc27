"""plan / run: the kernel's host API, in the shape FlashInfer's and FlashMLA's users know.

    p = plan(qo_indptr=..., kv_indptr=..., kv_indices=..., custom_mask=..., mask_indptr=...,
             num_heads=H, sm_scale=..., layout="sglang")          # once per batch
    out, lse = run(p, q, k, v, kv_buffer)                          # once per layer

plan does the host work: checks, the block and split counts, the workspace, the compiled module,
the fixed part of the kernel's argument. run only fills in one layer's tensors and launches on
torch's current stream: no host sync, no allocation, no read of device data, so it can be captured
in a CUDA graph and replayed after the server writes new values into the same metadata buffers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from . import jit, params, schedule, spec
from .checks import InputError, bound_kv_len, check_metadata, check_tensors, read_sizes, require


def unavailable() -> str | None:
    """None if the kernel can run here, else one line saying why and what would make it run."""
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return (f"no CUDA GPU: this torch ({torch.__version__}) is a CPU-only build; the kernel needs a "
                    "CUDA GPU (`kdkit compile --arch sm_120` checks the build without one)")
        return ("no CUDA GPU visible to torch (check CUDA_VISIBLE_DEVICES and the driver); "
                "`kdkit compile --arch sm_120` checks the build without one")
    from importlib.util import find_spec  # look, do not import
    major, minor = torch.cuda.get_device_capability()
    if major * 10 + minor < spec.MIN_ARCH:
        return (f"{torch.cuda.get_device_name()} is sm_{major}{minor}; the kernel needs sm_{spec.MIN_ARCH} or newer "
                "(cp.async, ldmatrix, bf16 mma.sync); `kdkit compile --arch sm_120` checks the build without one")
    if find_spec("cupy") is None:
        return "CuPy is not installed: `pip install cupy-cuda13x` (kdkit's 'gpu' extra)"
    if find_spec("cuda") is None or find_spec("cuda.bindings") is None:
        return "NVRTC bindings missing: `pip install cuda-bindings nvidia-cuda-nvrtc` (kdkit's 'gpu' extra)"
    return None


@dataclass
class Metadata:
    """The batch's index arrays and scalars, exactly as SGLang's forward_metadata holds them."""
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    prefix_lens: torch.Tensor | None
    custom_mask: torch.Tensor | None
    mask_indptr: torch.Tensor | None
    num_heads: int
    sm_scale: float
    logit_cap: float
    causal: bool
    layout: str


@dataclass
class Plan:
    meta: Metadata
    config: spec.KernelConfig
    device: torch.device
    num_tokens: int
    num_heads: int
    nsplit: int
    rows_per_cta: int
    grid: tuple
    smem: int
    threads: int
    pool_rows_needed: int
    key: str
    out: torch.Tensor              # the plan's own output buffers (fixed addresses for graphs)
    lse: torch.Tensor
    _partial: object = None
    _merge: object = None
    _args: np.ndarray | None = None
    _keep: list = field(default_factory=list)  # workspace the argument points into
    merge_groups: int = 1          # the merge kernel's blockDim.y (schedule.merge_groups)

    @property
    def info(self) -> dict:
        return {"nsplit": self.nsplit, "rows_per_cta": self.rows_per_cta, "grid": self.grid, "warps": self.threads // 32,
                "merge_groups": self.merge_groups,
                "module": self.key, "smem": self.smem, "mutant": self.config.mutant, "knockout": self.config.knockout}


def _ptr(t) -> int:
    return 0 if t is None else int(t.data_ptr())


def plan(*, qo_indptr, kv_indptr, kv_indices, num_heads: int, sm_scale: float, prefix_lens=None,
         custom_mask=None, mask_indptr=None, logit_cap: float = 0.0, causal: bool = False,
         layout: str = "sglang", max_q_len: int | None = None, nsplit: int | None = None,
         mutant: str | None = None, check: bool = True, nt: int | None = None, nh: int | None = None,
         skip: bool | str | None = None, num_tokens: int | None = None, max_kv_len: int | None = None,
         knockout: str | None = None) -> Plan:
    """Host work for one batch. The grid covers `max_q_len` tokens per request (None: all T tokens
    of the call, so a graph replay stays right however the same T tokens are split among the
    requests; SGLang's verify graphs keep q_len fixed: pass it). Prefix lengths may change freely
    between replays: each block finds its KV range on the GPU; nsplit is fixed here (from
    `max_kv_len`, default: the longest request now).

    skip (None: schedule.choose_skip) builds the kernel that streams only the draft steps some
    row of a block sees (a mask's tree ancestry); "gather": only their visible columns.

    check=True reads the index arrays once and refuses bad contents; check=False with num_tokens,
    max_q_len and max_kv_len given reads nothing from the device (planning inside graph capture).

    knockout (kdkit/kernel/knockouts.py) builds a timing-only kernel with one part switched off:
    its results are wrong by design."""
    if custom_mask is not None and custom_mask.dtype == torch.bool:
        custom_mask = custom_mask.view(torch.uint8)  # same bytes; the kernel reads != 0
    m = Metadata(qo_indptr, kv_indptr, kv_indices, prefix_lens, custom_mask, mask_indptr, int(num_heads),
                 float(sm_scale), float(logit_cap), bool(causal), layout)
    check_metadata(m)
    dev = qo_indptr.device
    require(dev.index is None or dev.index == torch.cuda.current_device(), "qo_indptr",
            f"on {dev} but the current device is cuda:{torch.cuda.current_device()}; plan and run under "
            f"`with torch.cuda.device({dev.index}):`")
    if check or None in (num_tokens, max_q_len, max_kv_len):
        sizes = read_sizes(m, values=check)
    else:
        sizes = {"bs": qo_indptr.numel() - 1, "num_tokens": int(num_tokens), "max_q_len": int(max_q_len),
                 "max_kv_len": int(max_kv_len), "pool_rows_needed": 0}
    sizes = bound_kv_len(sizes, max_kv_len)
    T, H = sizes["num_tokens"], m.num_heads
    if num_tokens is not None:
        require(int(num_tokens) == T, "num_tokens", f"{num_tokens}, but qo_indptr ends at {T}")
    if max_q_len is None:
        max_q_len = T
    require(sizes["max_q_len"] <= int(max_q_len) <= max(T, 1), "max_q_len",
            f"{max_q_len} must lie in [{sizes['max_q_len']} (the longest request now), T={T}]")
    if nsplit is not None:
        require(1 <= int(nsplit) <= schedule.MAX_SPLITS, "nsplit", f"{nsplit} outside 1..{schedule.MAX_SPLITS}")
    rows = int(max_q_len) * H
    require(nt is None or nt in spec.NT_CHOICES, "nt", f"{nt}: choose one of {spec.NT_CHOICES}")
    require(nh is None or nh in spec.NH_CHOICES, "nh", f"{nh}: choose one of {spec.NH_CHOICES} (2: 16 warps per block)")
    nh = 1 if nh is None else int(nh)
    nt_asked = nt
    if nh == 2 and nt is None:  # 16 warps: the fewest blocks per request, at least one n-tile per half
        nt = max(2, schedule.choose_nt(rows))
    require(nt is None or nt >= nh, "nt", f"{nt} with nh={nh}: each query half needs an n-tile")
    total_rows = T * H
    props = torch.cuda.get_device_properties(dev)
    sm_count = props.multi_processor_count
    threads_per_sm = getattr(props, "max_threads_per_multi_processor", schedule.THREADS_PER_SM)  # (older torch: none)
    require(skip is None or skip in spec.SKIP_CHOICES, "skip",
            f"{skip!r}: choose one of {spec.SKIP_CHOICES} (None: the plan's)")
    # (choose_skip weighs the longest request's draft, not the grid's max_q_len, which defaults to
    # all T tokens)
    nt, ns, skip = schedule.choose_launch(sizes["bs"], rows, sizes["max_q_len"], sizes["max_kv_len"], sm_count,
                                          total_rows, custom_mask is not None, nt=nt, nh=nh, skip=skip,
                                          nsplit=None if nsplit is None else int(nsplit), nt_fixed=nt_asked is not None)
    idx = dict(qo_t=qo_indptr.dtype, kvp_t=kv_indptr.dtype, kvi_t=kv_indices.dtype,
               pfx_t=prefix_lens.dtype if prefix_lens is not None else torch.int64,
               mip_t=mask_indptr.dtype if mask_indptr is not None else torch.int64)
    require(skip != "gather" or nt <= spec.GATHER_MAX_NT, "skip",
            f"'gather' with nt={nt}: the column list fits up to nt={spec.GATHER_MAX_NT} (skip=True at {nt})")
    require(skip != "gather" or custom_mask is not None or not causal or int(max_q_len) <= spec.GATHER_NOMASK_MAX_Q,
            "skip", f"'gather', causal without a mask, at max_q_len {max_q_len}: its list's 16-bit end mark covers "
            f"q_len up to {spec.GATHER_NOMASK_MAX_Q} (without a mask there is nothing to gather: skip=False)")
    try:
        cfg = spec.KernelConfig(nt=nt, mutant=mutant, nh=nh, skip=skip, knockout=knockout, **idx)
    except spec.ConfigError as e:
        raise InputError(f"field '{e.field}': {e}") from None
    except (KeyError, ValueError) as e:  # kdkit.mutants refuses an unknown name
        raise InputError(f"field 'mutant': {e}") from None
    rpc = schedule.rows_per_block(rows, nt)
    blocks = schedule.blocks_per_request(rows, nt)
    if ns > 1 and ns * total_rows * spec.DL * 4 > schedule.WORKSPACE_LIMIT:
        raise InputError(f"field 'nsplit': {ns} splits x {total_rows} rows x {spec.DL} fp32 needs "
                         f"{ns * total_rows * spec.DL * 4 >> 20} MiB of workspace (limit "
                         f"{schedule.WORKSPACE_LIMIT >> 20} MiB); use fewer splits (nsplit=None chooses)")
    mod = spec.build(cfg, jit.device_arch())
    meta = mod.meta()
    if meta.get("block_n") != schedule.BLOCK_N or meta.get("rows") != cfg.rows:
        raise jit.BuildError(f"{mod.key}: the build exports {meta}, the host assumes block_n="
                             f"{schedule.BLOCK_N}, rows={cfg.rows}")
    raw = jit.load(mod)
    partial, merge = raw.get_function(spec.PARTIAL), raw.get_function(spec.MERGE)
    partial.max_dynamic_shared_size_bytes = meta["smem_bytes"]
    out = torch.empty(T, H, spec.DL, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(T, H, dtype=torch.float32, device=dev)
    o_part = lse_part = None
    if ns > 1:
        o_part = torch.empty(ns, total_rows, spec.DL, dtype=torch.float32, device=dev)
        lse_part = torch.empty(ns, total_rows, dtype=torch.float32, device=dev)
    args = params.pack(
        qo_indptr=_ptr(qo_indptr), kv_indptr=_ptr(kv_indptr), kv_indices=_ptr(kv_indices),
        prefix_lens=_ptr(prefix_lens), mask=_ptr(custom_mask), mask_indptr=_ptr(mask_indptr),
        o_part=_ptr(o_part), lse_part=_ptr(lse_part), num_heads=H, nsplit=ns, rows_per_cta=rpc,
        total_rows=total_rows, unified=int(layout == "unified"), causal=int(m.causal),
        sm_scale=m.sm_scale, logit_cap=m.logit_cap)
    grid = (blocks, ns, sizes["bs"])
    return Plan(m, cfg, dev, T, H, ns, rpc, grid, meta["smem_bytes"], meta["threads"],
                sizes["pool_rows_needed"], mod.key, out, lse, partial, merge, args,
                [o_part, lse_part, m], schedule.merge_groups(total_rows, ns, sm_count, threads_per_sm))


_STREAMS: dict = {}


def _torch_stream():
    """CuPy's view of torch's current stream (launches must join torch's stream order); cached,
    since run() is on the per-layer hot path."""
    ts = torch.cuda.current_stream()
    key = (ts.device_index, ts.cuda_stream)
    cs = _STREAMS.get(key)
    if cs is None:
        import cupy
        try:
            cs = cupy.cuda.Stream.from_external(ts)  # CuPy >= 14: the CUDA stream protocol
        except (AttributeError, TypeError):
            cs = cupy.cuda.ExternalStream(ts.cuda_stream)
        _STREAMS[key] = cs
    return cs


def layer_args(args: np.ndarray, q, k, v, kv_buffer, out, lse) -> np.ndarray:
    """A copy of a plan's packed KdParams with one layer's tensors bound (pointers and strides)."""
    a = args.copy()
    layer = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "kv_buf": kv_buffer.data_ptr(),
             "out": out.data_ptr(), "lse": lse.data_ptr(), "q_stride_tok": q.stride(0),
             "q_stride_head": q.stride(1), "k_stride_tok": k.stride(0), "v_stride_tok": v.stride(0),
             "kv_stride_row": kv_buffer.stride(0), "out_stride_tok": out.stride(0),
             "out_stride_head": out.stride(1)}
    # params.PER_LAYER are the struct's first slots, 8 bytes each: one assignment, in the struct's
    # own order (a field renamed or moved there is a KeyError here, never a swapped pointer)
    a.view(np.int64)[:len(params.PER_LAYER)] = tuple(layer[name] for name in params.PER_LAYER)
    return a


def run(p: Plan, q, k, v, kv_buffer, out=None, lse=None):
    """Launch on one layer's tensors (graph-capturable). Returns (out, lse): the given buffers,
    or the plan's own (overwritten by the next run)."""
    check_tensors(p, q, k, v, kv_buffer, out, lse)
    require(p.device.index is None or p.device.index == torch.cuda.current_device(), "q",
            f"the plan is for {p.device} but the current device is cuda:{torch.cuda.current_device()} (the launch "
            f"goes to its stream); run under `with torch.cuda.device({p.device.index}):`")
    out = p.out if out is None else out
    lse = p.lse if lse is None else lse
    a = layer_args(p._args, q, k, v, kv_buffer, out, lse)
    if p.num_tokens == 0:
        return out, lse
    with _torch_stream():
        p._partial(p.grid, (p.threads,), (a,), shared_mem=p.smem)
        if p.nsplit > 1:
            p._merge((p.num_tokens * p.num_heads,), (spec.MERGE_THREADS, p.merge_groups), (a,))
    return out, lse
