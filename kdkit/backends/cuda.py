"""kdkit's CUDA MLA tree-verify kernel as a backend, through CuPy.

plan (host work, once per shape): checks, the split count, the grid, fixed output and workspace
buffers, the compiled module, the kernel arguments bound to the input tensors.
launch (the hot path): kernel launches on torch's current stream and nothing else: no host sync,
no allocation, no data-dependent Python, so it can be captured in a CUDA graph and replayed after
new inputs of the same shape are copied into the bound tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .. import verify_kernel as vk
from . import Result

NAME = "cuda"
MAX_SPLITS = 256
WORKSPACE_LIMIT = 512 << 20  # fp32 partials beyond this are not worth the reduce: fewer splits


def unavailable(case=None):
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "cuda: CuPy is not installed (`pip install cupy-cuda13x`, kdkit's 'gpu' extra)"
    if not torch.cuda.is_available():
        return "cuda: no CUDA GPU visible (`kdkit compile --arch sm_120` checks the build without one)"
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError:
        return "cuda: NVRTC bindings missing (`pip install cuda-bindings nvidia-cuda-nvrtc`)"
    if case is not None and case.q.dtype != torch.bfloat16:
        return f"cuda: the kernel takes bf16 q/k/v/pool, this case is {case.q.dtype}"
    return None


class InputError(ValueError):
    """Input the kernel must not be launched on; the message names the field and the fix."""


@dataclass
class Inputs:
    """Device tensors of one call, exactly as SGLang hands them to forward_extend."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv_buffer: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    prefix_lens: torch.Tensor
    custom_mask: torch.Tensor | None
    mask_indptr: torch.Tensor | None
    sm_scale: float
    logit_cap: float
    causal: bool
    unified: bool

    @staticmethod
    def from_case(case, device="cuda") -> "Inputs":
        dev = torch.device(device)
        to = lambda t: None if t is None else t.to(dev, non_blocking=True)  # noqa: E731
        mask = case.custom_mask
        if mask is not None and mask.dtype == torch.bool:
            mask = mask.view(torch.uint8)  # same bytes; the kernel reads != 0
        return Inputs(to(case.q), to(case.k), to(case.v), to(case.kv_buffer), to(case.qo_indptr),
                      to(case.kv_indptr), to(case.kv_indices), to(case.prefix_lens), to(mask),
                      to(case.mask_indptr), float(case.sm_scale), float(case.logit_cap),
                      bool(case.causal), case.layout == "unified")


def _require(cond, field_name, msg):
    if not cond:
        raise InputError(f"field '{field_name}': {msg}")


def check_layout(x: Inputs) -> None:
    """Shape/dtype/stride/alignment checks (no host sync): the kernel's 128-bit loads need them."""
    T = x.q.shape[0] if x.q.dim() == 3 else -1
    _require(x.q.dim() == 3 and x.q.shape[2] == 576, "q", f"shape {tuple(x.q.shape)}, want [T, H, 576]")
    H = x.q.shape[1]
    _require(1 <= H, "q", "no heads")
    for name, t, shape in (("k", x.k, (T, 1, 576)), ("v", x.v, (T, 1, 512))):
        _require(tuple(t.shape) == shape, name, f"shape {tuple(t.shape)}, want {shape}")
    _require(x.kv_buffer.dim() == 3 and tuple(x.kv_buffer.shape[1:]) == (1, 576), "kv_buffer",
             f"shape {tuple(x.kv_buffer.shape)}, want [N, 1, 576]")
    for name in ("q", "k", "v", "kv_buffer"):
        t = getattr(x, name)
        _require(t.dtype == torch.bfloat16, name, f"dtype {t.dtype}; the kernel is bf16 (cast before the call)")
        _require(t.is_cuda, name, "not on a CUDA device")
        _require(t.stride(-1) == 1 and all(s % 8 == 0 for s in t.stride()[:-1]) and t.data_ptr() % 16 == 0,
                 name, f"strides {t.stride()}: rows must be contiguous and 16-byte aligned (.contiguous())")
    for name in ("qo_indptr", "kv_indptr", "kv_indices", "prefix_lens", "mask_indptr"):
        t = getattr(x, name)
        if t is None:
            continue
        _require(t.dtype in (torch.int32, torch.int64), name, f"dtype {t.dtype}; int32 or int64")
        _require(t.dim() == 1 and t.is_contiguous() and t.is_cuda, name, "must be a contiguous 1-D CUDA tensor")
    bs = x.qo_indptr.numel() - 1
    _require(bs >= 1, "qo_indptr", "needs bs+1 >= 2 entries")
    _require(x.kv_indptr.numel() == bs + 1, "kv_indptr", f"{x.kv_indptr.numel()} entries, want bs+1 = {bs + 1}")
    _require(x.prefix_lens.numel() == bs, "prefix_lens", f"{x.prefix_lens.numel()} entries, want bs = {bs}")
    _require((x.custom_mask is None) == (x.mask_indptr is None), "mask_indptr", "custom_mask and mask_indptr come together")
    if x.custom_mask is not None:
        _require(x.custom_mask.dtype in (torch.uint8, torch.bool) and x.custom_mask.is_contiguous(),
                 "custom_mask", "bool or uint8, contiguous")
        _require(x.mask_indptr.numel() == bs + 1, "mask_indptr",
                 f"{x.mask_indptr.numel()} entries, want bs+1 = {bs + 1} start offsets as SGLang passes them "
                 "(a kernel-side [:bs] slice is the seed's mask_indptr bug; run `kdkit inspect`)")
    _require(x.sm_scale > 0, "sm_scale", f"{x.sm_scale} must be > 0")
    _require(x.logit_cap >= 0, "logit_cap", f"{x.logit_cap} must be >= 0 (0 = no cap)")


def check_values(x: Inputs) -> dict:
    """Data checks that need the index arrays on the host (one sync; plan time only).

    Returns the per-request sizes the plan needs."""
    qo = x.qo_indptr.long().cpu()
    kvp = x.kv_indptr.long().cpu()
    pfx = x.prefix_lens.long().cpu()
    T, N = x.q.shape[0], x.kv_buffer.shape[0]
    _require(int(qo[0]) == 0 and int(qo[-1]) == T and bool((qo.diff() >= 0).all()), "qo_indptr",
             f"must rise from 0 to T={T}")
    _require(int(kvp[0]) == 0 and bool((kvp.diff() >= 0).all()) and int(kvp[-1]) <= x.kv_indices.numel(),
             "kv_indptr", f"must rise from 0 to at most len(kv_indices)={x.kv_indices.numel()}")
    q_lens, pool_lens = qo.diff(), kvp.diff()
    used = x.kv_indices[: int(kvp[-1])]
    if used.numel():
        lo, hi = int(used.min()), int(used.max())
        _require(lo >= 0 and hi < N, "kv_indices", f"values span [{lo}, {hi}], outside the pool's {N} rows")
    if x.unified:
        _require(bool((pool_lens == pfx + q_lens).all()), "kv_indices",
                 "unified layout: each request needs prefix + q_len indices (prefix + out_cache_loc); "
                 "kv_indices covering only the prefix is the seed's bug (run `kdkit inspect`)")
    else:
        _require(bool((pool_lens == pfx).all()), "kv_indptr", "sglang layout: kv_indptr must span each prefix")
    prefix = pfx if x.unified else pool_lens
    if x.custom_mask is not None:
        mip = x.mask_indptr.long().cpu()
        need = q_lens * (prefix + q_lens)
        _require(bool((mip.diff() == need).all()) and int(mip[0]) == 0, "mask_indptr",
                 f"offsets {mip.tolist()[:6]}... do not match the blocks q_len*(prefix+q_len) = {need.tolist()[:6]}...")
        # <=: SGLang's CUDA-graph mask is a preallocated buffer, longer than the live blocks
        _require(int(mip[-1]) <= x.custom_mask.numel(), "custom_mask",
                 f"{x.custom_mask.numel()} entries, the mask_indptr says {int(mip[-1])}")
    kv_lens = prefix + q_lens
    return {"max_q_len": int(q_lens.max()), "max_kv_len": int(kv_lens.max()), "bs": int(q_lens.numel())}


def choose_nsplit(bs: int, max_rows: int, max_kv_len: int, sm_count: int, config: vk.KernelConfig,
                  total_rows: int) -> int:
    """Enough blocks for ~2 waves over the SMs, no split shorter than one chunk, bounded workspace."""
    tiles = bs * -(-max_rows // config.rows)
    want = -(-2 * sm_count // max(tiles, 1))
    by_len = max(1, -(-max_kv_len // config.block_n))
    by_ws = max(1, WORKSPACE_LIMIT // max(1, total_rows * 512 * 4))
    return int(max(1, min(want, by_len, by_ws, MAX_SPLITS)))


@dataclass
class Plan:
    inputs: Inputs
    config: vk.KernelConfig
    nsplit: int
    grid: tuple
    out: torch.Tensor
    lse: torch.Tensor
    key: str
    smem: int
    _partial: object = None
    _reduce: object = None
    _args: tuple = ()
    _reduce_args: tuple = ()
    _keep: list = field(default_factory=list)  # workspace tensors the pointers refer to

    @property
    def info(self) -> dict:
        return {"nsplit": self.nsplit, "grid": self.grid, "module": self.key, "smem": self.smem,
                "variant": self.config.variant}


def _dev(t):
    """A zero-copy CuPy view (DLPack) of a torch tensor, or a null pointer for None.

    bf16 and bool travel as same-width integers: the kernel reinterprets them, and CuPy has no
    bfloat16 dtype."""
    if t is None:
        return np.uint64(0)
    import cupy
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    elif t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return cupy.from_dlpack(t.detach())


def plan(x: Inputs, nsplit: int | None = None, variant: str = "correct", check: bool = True,
         rows: int = 16, max_q_len: int | None = None) -> Plan:
    """Host work for one shape. The grid covers `max_q_len` tokens per request; None covers all T
    tokens of the call, so a CUDA-graph replay stays right however the same T tokens are split
    among the requests (SGLang's verify graphs keep q_len fixed: pass it to trim the grid).
    Prefix lengths may change freely between replays: each block finds its KV range on the GPU."""
    check_layout(x)
    dev = x.q.device
    if dev.index is not None and dev.index != torch.cuda.current_device():
        # the module, the stream and CuPy's context all follow the current device
        raise InputError(f"field 'q': on {dev} but the current device is cuda:{torch.cuda.current_device()}; "
                         f"plan and launch under `with torch.cuda.device({dev.index}):`")
    if check:
        sizes = check_values(x)
    else:
        # the caller vouches for the data; the sizes still need one look at the index arrays
        qo = x.qo_indptr.long().cpu()
        kvp = x.kv_indptr.long().cpu()
        q_lens = qo.diff()
        kvl = (kvp.diff() + (0 if x.unified else q_lens))
        sizes = {"max_q_len": int(q_lens.max()), "max_kv_len": int(kvl.max()), "bs": int(q_lens.numel())}
    T, H = x.q.shape[0], x.q.shape[1]
    if max_q_len is None:
        max_q_len = T
    if not sizes["max_q_len"] <= int(max_q_len) <= T:
        raise InputError(f"field 'max_q_len': {max_q_len} must lie in [{sizes['max_q_len']} (the longest "
                         f"request now), T={T}]")
    if nsplit is not None and not 1 <= int(nsplit) <= MAX_SPLITS:
        raise InputError(f"field 'nsplit': {nsplit} outside 1..{MAX_SPLITS}")
    from .. import jit
    cfg = vk.KernelConfig(rows=rows, variant=variant, qo_t=x.qo_indptr.dtype, kvp_t=x.kv_indptr.dtype,
                          kvi_t=x.kv_indices.dtype, pfx_t=x.prefix_lens.dtype,
                          mip_t=x.mask_indptr.dtype if x.mask_indptr is not None else torch.int64)
    total_rows = T * H
    sm_count = torch.cuda.get_device_properties(dev).multi_processor_count
    ns = int(nsplit) if nsplit is not None else choose_nsplit(
        sizes["bs"], sizes["max_q_len"] * H, sizes["max_kv_len"], sm_count, cfg, total_rows)
    if ns > 1 and ns * total_rows * 512 * 4 > WORKSPACE_LIMIT:
        raise InputError(f"field 'nsplit': {ns} splits x {total_rows} rows x 512 fp32 needs "
                         f"{ns * total_rows * 2048 >> 20} MiB of workspace (limit {WORKSPACE_LIMIT >> 20} MiB); "
                         "use fewer splits (nsplit=None chooses)")
    mod = vk.build(cfg, jit.device_arch())
    raw = jit.load(mod)
    partial, reduce_ = raw.get_function("kd_mla_verify_partial"), raw.get_function("kd_mla_verify_reduce")
    smem = cfg.smem_bytes()
    partial.max_dynamic_shared_size_bytes = smem
    out = torch.empty(T, H, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(T, H, dtype=torch.float32, device=dev)
    o_part = lse_part = None
    if ns > 1:
        o_part = torch.empty(ns, total_rows, 512, dtype=torch.float32, device=dev)
        lse_part = torch.empty(ns, total_rows, dtype=torch.float32, device=dev)
    i32, f32 = np.int32, np.float32
    args = (_dev(x.q), i32(x.q.stride(0)), i32(x.q.stride(1)), _dev(x.k), i32(x.k.stride(0)),
            _dev(x.v), i32(x.v.stride(0)), _dev(x.kv_buffer), i32(x.kv_buffer.stride(0)),
            _dev(x.qo_indptr), _dev(x.kv_indptr), _dev(x.kv_indices), _dev(x.prefix_lens),
            _dev(x.custom_mask), _dev(x.mask_indptr), i32(H), i32(ns), i32(int(x.unified)),
            i32(int(x.causal)), f32(x.sm_scale), f32(x.logit_cap), i32(total_rows),
            _dev(o_part), _dev(lse_part), _dev(out), i32(out.stride(0)), i32(out.stride(1)), _dev(lse))
    reduce_args = (_dev(o_part), _dev(lse_part), i32(ns), i32(total_rows), i32(H), _dev(out),
                   i32(out.stride(0)), i32(out.stride(1)), _dev(lse))
    grid = (-(-int(max_q_len) * H // cfg.rows), ns, sizes["bs"])
    return Plan(x, cfg, ns, grid, out, lse, mod.key, smem, partial, reduce_, args, reduce_args,
                [o_part, lse_part])


def _torch_stream():
    """CuPy's view of torch's current stream (launches must join torch's stream order)."""
    import cupy
    ts = torch.cuda.current_stream()
    try:
        return cupy.cuda.Stream.from_external(ts)  # CuPy >= 14: the CUDA stream protocol
    except (AttributeError, TypeError):
        return cupy.cuda.ExternalStream(ts.cuda_stream)


def launch(p: Plan):
    """Launches only (graph-capturable). Returns the plan's (out, lse) buffers."""
    with _torch_stream():
        p._partial(p.grid, (vk.THREADS,), p._args, shared_mem=p.smem)
        if p.nsplit > 1:
            p._reduce((p.out.shape[0] * p.out.shape[1],), (vk.THREADS,), p._reduce_args)
    return p.out, p.lse


def run(case, nsplit: int | None = None, variant: str = "correct", check: bool = True,
        device: str = "cuda", **_) -> Result:
    """Replay a case through the kernel. Lint errors stop it before any launch when check=True."""
    if check:
        from .. import lint
        errs = lint.errors(case)
        if errs:
            raise InputError("; ".join(f"field '{e.field}': {e.message} (fix: {e.fix})" for e in errs[:3]))
    x = Inputs.from_case(case, device)
    # a one-off run knows its requests: size the grid for the longest, not for all T tokens
    p = plan(x, nsplit=nsplit, variant=variant, check=check, max_q_len=max(case.q_lens))
    out, lse = launch(p)
    torch.cuda.synchronize()
    return Result(out.clone(), lse.clone(), {"device": torch.cuda.get_device_name(), **p.info})
