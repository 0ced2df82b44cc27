"""plan / run: the kernel's host API, in the shape FlashInfer's and FlashMLA's users know.

    p = plan(qo_indptr=..., kv_indptr=..., kv_indices=..., custom_mask=..., mask_indptr=...,
             num_heads=H, sm_scale=..., layout="sglang",             # the problem
             options=PlanOptions(max_q_len=..., max_kv_len=...))      # how (tuning, controls, graph hints)
    out, lse = run(p, q, k, v, kv_buffer)                             # once per layer

plan does the host work: checks, the block and split counts, the workspace, the compiled module,
the kernel's argument packed once and the launches made ready. run writes one layer's pointers
and strides into that argument and launches each kernel with one driver call on torch's current
stream: no host sync, no allocation, no read of device data, so it can be captured in a CUDA graph
and replayed after the server writes new values into the same metadata buffers. A plan is run by
one thread at a time (run rewrites the plan's argument bytes before each launch).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field, replace

import torch

from . import jit, launch, params, schedule, spec
from .checks import InputError, bound_kv_len, check_metadata, check_tensors, read_sizes, require
from .options import PlanOptions

_BF16 = torch.bfloat16


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
    options: PlanOptions
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
    args: params.ArgBuffer         # the kernels' KdParams, packed once; run() rebinds its first slots
    launcher: launch.Launcher      # the plan's launches (partial, then merge where it splits)
    merge_groups: int = 1          # the merge kernel's blockDim.y (schedule.merge_groups)
    fused: bool | str = False      # the split blocks merge in place, no merge kernel: "wait" (a cooperative
                                   # launch, each merges its share) or "last" (the last to finish merges)
    _keep: list = field(default_factory=list)  # workspace the argument points into
    _seen: tuple | None = None     # the tensors' metadata of the last run() that passed check_tensors

    def __post_init__(self):
        self.device_index = self.device.index  # (read per run: an int, not a torch.device attribute)
        # the plan's own buffers' pointers and strides, read once (run() writes them when the caller
        # gives no out / lse: each torch attribute read is ~0.1-0.2 us of a per-layer call)
        self._own = (self.out.data_ptr(), self.out.stride(), self.lse.data_ptr())

    @property
    def info(self) -> dict:
        return {"nsplit": self.nsplit, "rows_per_cta": self.rows_per_cta, "grid": self.grid, "warps": self.threads // 32,
                "merge_groups": self.merge_groups, "fused": self.fused,
                "module": self.key, "smem": self.smem, "mutant": self.config.mutant, "knockout": self.config.knockout,
                "extra_defines": dict(self.config.extra_defines)}


def _ptr(t) -> int:
    return 0 if t is None else int(t.data_ptr())


def plan(*, qo_indptr, kv_indptr, kv_indices, num_heads: int, sm_scale: float, prefix_lens=None,
         custom_mask=None, mask_indptr=None, logit_cap: float = 0.0, causal: bool = False,
         layout: str = "sglang", dtype: torch.dtype = _BF16, options: PlanOptions = PlanOptions()) -> Plan:
    """Host work for one batch: the problem (the batch metadata as SGLang holds it, heads, scale,
    cap, layout, and the dtype of q/k/v and the pool: bf16) and how to solve it (PlanOptions:
    tuning, negative controls, graph hints; kdkit/kernel/options.py says what each does).

    The grid covers `options.max_q_len` tokens per request (None: all T tokens of the call, so a
    graph replay stays right however the same T tokens are split among the requests; SGLang's
    verify graphs keep q_len fixed: pass it). Prefix lengths may change freely between replays:
    each block finds its KV range on the GPU; nsplit is fixed here (from `options.max_kv_len`,
    default: the longest request now). skip None: schedule.choose_skip's build.

    check=True reads the index arrays once and refuses bad contents; check=False with num_tokens,
    max_q_len and max_kv_len given reads nothing from the device (planning inside graph capture)."""
    require(isinstance(options, PlanOptions), "options", f"{type(options).__name__}: a kdkit.kernel.PlanOptions")
    require(dtype == _BF16, "dtype", f"{dtype}: the kernel reads bf16 q/k/v and pool (cast before the call)")
    o = options
    if custom_mask is not None and custom_mask.dtype == torch.bool:
        custom_mask = custom_mask.view(torch.uint8)  # same bytes; the kernel reads != 0
    m = Metadata(qo_indptr, kv_indptr, kv_indices, prefix_lens, custom_mask, mask_indptr, int(num_heads),
                 float(sm_scale), float(logit_cap), bool(causal), layout)
    check_metadata(m)
    dev = qo_indptr.device
    require(dev.index is None or dev.index == torch.cuda.current_device(), "qo_indptr",
            f"on {dev} but the current device is cuda:{torch.cuda.current_device()}; plan and run under "
            f"`with torch.cuda.device({dev.index}):`")
    if o.check or None in (o.num_tokens, o.max_q_len, o.max_kv_len):
        sizes = read_sizes(m, values=o.check)
    else:
        sizes = {"bs": qo_indptr.numel() - 1, "num_tokens": int(o.num_tokens), "max_q_len": int(o.max_q_len),
                 "max_kv_len": int(o.max_kv_len), "pool_rows_needed": 0}
    sizes = bound_kv_len(sizes, o.max_kv_len)
    T, H = sizes["num_tokens"], m.num_heads
    if o.num_tokens is not None:
        require(int(o.num_tokens) == T, "num_tokens", f"{o.num_tokens}, but qo_indptr ends at {T}")
    max_q_len = T if o.max_q_len is None else int(o.max_q_len)
    require(sizes["max_q_len"] <= max_q_len <= max(T, 1), "max_q_len",
            f"{max_q_len} must lie in [{sizes['max_q_len']} (the longest request now), T={T}]")
    rows = max_q_len * H
    nh = 1 if o.nh is None else o.nh
    nt = o.nt
    if nh == 2 and nt is None:  # 16 warps: the fewest blocks per request, at least one n-tile per half
        nt = max(2, schedule.choose_nt(rows))
    require(nt is None or nt >= nh, "nt", f"{nt} with nh={nh}: each query half needs an n-tile")
    total_rows = T * H
    props = torch.cuda.get_device_properties(dev)
    sm_count = props.multi_processor_count
    threads_per_sm = getattr(props, "max_threads_per_multi_processor", schedule.THREADS_PER_SM)  # (older torch: none)
    # (choose_skip weighs the longest request's draft, not the grid's max_q_len, which defaults to
    # all T tokens)
    nt, ns, skip = schedule.choose_launch(sizes["bs"], rows, sizes["max_q_len"], sizes["max_kv_len"], sm_count,
                                          total_rows, custom_mask is not None, nt=nt, nh=nh, skip=o.skip,
                                          nsplit=o.nsplit, nt_fixed=o.nt is not None,
                                          request_rows=sizes["max_q_len"] * H)
    idx = dict(qo_t=qo_indptr.dtype, kvp_t=kv_indptr.dtype, kvi_t=kv_indices.dtype,
               pfx_t=prefix_lens.dtype if prefix_lens is not None else torch.int64,
               mip_t=mask_indptr.dtype if mask_indptr is not None else torch.int64)
    require(skip != "gather" or nt <= spec.GATHER_MAX_NT, "skip",
            f"'gather' with nt={nt}: the column list fits up to nt={spec.GATHER_MAX_NT} (skip=True at {nt})")
    require(skip != "gather" or custom_mask is not None or not causal or max_q_len <= spec.GATHER_NOMASK_MAX_Q,
            "skip", f"'gather', causal without a mask, at max_q_len {max_q_len}: its list's 16-bit end mark covers "
            f"q_len up to {spec.GATHER_NOMASK_MAX_Q} (without a mask there is nothing to gather: skip=False)")
    try:
        cfg = spec.KernelConfig(nt=nt, mutant=o.mutant, nh=nh, skip=skip, knockout=o.knockout,
                                extra_defines=o.extra_defines, **idx)
    except spec.ConfigError as e:
        raise InputError(f"field '{e.field}': {e}") from None
    rpc = schedule.rows_per_block(rows, nt)
    blocks = schedule.blocks_per_request(rows, nt)
    if not schedule.workspace_fits(ns, total_rows):
        raise InputError(f"field 'nsplit': {ns} splits x {total_rows} rows need "
                         f"{schedule.workspace_bytes(ns, total_rows) >> 20} MiB of fp32 workspace (limit "
                         f"{schedule.WORKSPACE_LIMIT >> 20} MiB, {schedule.workspace_splits(total_rows)} splits at "
                         "these rows); use fewer splits (nsplit=None chooses)")
    grid = (blocks, ns, sizes["bs"])
    fused = False  # or the fused merge's way to meet: "wait" (cooperative) or "last" (schedule.merge_mode)
    pair = cfg.nt == spec.PAIR_NT
    if T > 0 and schedule.wants_fused(ns, o.fused, pair):
        fcfg = replace(cfg, fused=True)
        mod, meta, raw, partial, merge = _load(fcfg)
        need, resident = grid[0] * grid[1] * grid[2], _resident(partial, meta, sm_count)
        require(need <= resident or o.fused != "wait", "fused",
                f"'wait', but the grid's {need} blocks exceed the {resident} this GPU holds at once; use "
                "fewer splits, 'last' (the last split block merges), or None (the plan's choice)")
        fused = schedule.merge_mode(ns, need, resident, o.fused, pair)
        if fused:
            cfg = fcfg
    if not cfg.fused:
        mod, meta, raw, partial, merge = _load(cfg)
    out = torch.empty(T, H, spec.DL, dtype=_BF16, device=dev)
    lse = torch.empty(T, H, dtype=torch.float32, device=dev)
    o_part = lse_part = counters = None
    if ns > 1:
        o_part = torch.empty(ns, total_rows, spec.DL, dtype=torch.float32, device=dev)
        lse_part = torch.empty(ns, total_rows, dtype=torch.float32, device=dev)
    if fused:  # the fused merge's arrival counts: zero once, then they only grow (no reset per replay)
        counters = torch.zeros(blocks * sizes["bs"], dtype=torch.int64, device=dev)
    args = params.ArgBuffer(params.pack(
        qo_indptr=_ptr(qo_indptr), kv_indptr=_ptr(kv_indptr), kv_indices=_ptr(kv_indices),
        prefix_lens=_ptr(prefix_lens), mask=_ptr(custom_mask), mask_indptr=_ptr(mask_indptr),
        o_part=_ptr(o_part), lse_part=_ptr(lse_part), counters=_ptr(counters), num_heads=H, nsplit=ns,
        rows_per_cta=rpc, total_rows=total_rows, unified=int(layout == "unified"), causal=int(m.causal),
        sm_scale=m.sm_scale, logit_cap=m.logit_cap, fused_last=int(fused == "last")))
    groups = schedule.merge_groups(total_rows, ns, sm_count, threads_per_sm)
    kp = launch.kernel_params(args.address)  # both kernels take the one KdParams
    calls = [(spec.PARTIAL, launch.function_handle(partial), grid, (meta["threads"], 1, 1), meta["smem_bytes"],
              ctypes.addressof(kp), fused == "wait")]
    if ns > 1 and not fused:
        calls.append((spec.MERGE, launch.function_handle(merge), (total_rows, 1, 1),
                      (spec.MERGE_THREADS, groups, 1), 0, ctypes.addressof(kp), False))
    return Plan(m, o, cfg, dev, T, H, ns, rpc, grid, meta["smem_bytes"], meta["threads"],
                sizes["pool_rows_needed"], mod.key, out, lse, args,
                launch.Launcher(calls if T else [], keep=(kp, args)), groups, fused,
                [o_part, lse_part, counters, m, raw])


def _load(cfg: spec.KernelConfig):
    """The build of `cfg` for this GPU, loaded: (module, its meta, the CuPy module, the partial
    kernel with its dynamic shared memory allowed, the merge kernel)."""
    try:
        mod = spec.build(cfg, jit.device_arch())
    except spec.ConfigError as e:  # an experiment's define its source never reads
        raise InputError(f"field '{e.field}': {e}") from None
    meta = mod.meta()
    if meta.get("block_n") != schedule.BLOCK_N or meta.get("rows") != cfg.rows:
        raise jit.BuildError(f"{mod.key}: the build exports {meta}, the host assumes block_n="
                             f"{schedule.BLOCK_N}, rows={cfg.rows}")
    raw = jit.load(mod)
    partial, merge = raw.get_function(spec.PARTIAL), raw.get_function(spec.MERGE)
    partial.max_dynamic_shared_size_bytes = meta["smem_bytes"]  # (an attribute of the CUfunction itself)
    return mod, meta, raw, partial, merge


def _resident(partial, meta, sm_count) -> int:
    """How many blocks of a build this GPU holds at once: its SMs times the blocks one SM holds at
    the build's threads, registers and shared memory (a cooperative launch needs every block of its
    grid resident: the fused merge's blocks of a row block wait for each other)."""
    return launch.resident_blocks(launch.function_handle(partial), meta["threads"], meta["smem_bytes"]) * sm_count


def tensor_signature(q, k, v, kv_buffer, out, lse) -> tuple:
    """What check_tensors looked at, in O(1) attribute reads: shapes, strides, dtypes, devices
    (out/lse only where the caller gives them)."""
    sig = (q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype, k.get_device(),
           v.shape, v.stride(), v.dtype, v.get_device(),
           kv_buffer.shape, kv_buffer.stride(), kv_buffer.dtype, kv_buffer.get_device())
    if out is not None:
        sig += (out.shape, out.stride(), out.dtype, out.get_device())
    if lse is not None:
        sig += (lse.shape, lse.stride(), lse.dtype, lse.get_device())
    return sig


def bind(p: Plan, q, k, v, kv_buffer, out=None, lse=None):
    """Check one layer's tensors against the plan and write their pointers and strides into the
    plan's argument; returns (out, lse), the buffers the launch writes. The full check
    (check_tensors, which names the field and the fix) runs when the tensors' shapes, strides,
    dtypes or devices differ from those of the last call that passed it; otherwise only the
    addresses' 16-byte alignment is checked, since the pointers are new each layer."""
    op, os_, lp = p._own
    o, l = p.out, p.lse
    if out is not None:
        o, op, os_ = out, out.data_ptr(), out.stride()
    if lse is not None:
        l, lp = lse, lse.data_ptr()
    qp, kp, vp, bp = q.data_ptr(), k.data_ptr(), v.data_ptr(), kv_buffer.data_ptr()
    sig = tensor_signature(q, k, v, kv_buffer, out, lse)
    if sig != p._seen or (qp | kp | vp | bp | op) & 15:
        check_tensors(p, q, k, v, kv_buffer, out, lse)  # raises InputError, naming the field
        p._seen = sig
    if launch.current_device() != p.device_index:
        require(False, "q", f"the plan is for {p.device} but the current device is cuda:{launch.current_device()} "
                f"(the launch goes to its stream); run under `with torch.cuda.device({p.device.index}):`")
    qs = sig[1]
    p.args.bind(qp, kp, vp, bp, op, lp, qs[0], qs[1], sig[5][0], sig[9][0], sig[13][0], os_[0], os_[1])
    return o, l


def run(p: Plan, q, k, v, kv_buffer, out=None, lse=None):
    """Launch on one layer's tensors (graph-capturable). Returns (out, lse): the given buffers,
    or the plan's own (overwritten by the next run)."""
    o, l = bind(p, q, k, v, kv_buffer, out, lse)
    p.launcher(launch.current_raw_stream(p.device_index))
    return o, l
