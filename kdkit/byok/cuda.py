"""Bring your own CUDA kernel: a .cu file and a few lines of declaration become a kdkit backend.

    backend = CudaKernel(
        name="mine", source=Path(__file__).with_name("kernel.cu"),
        options={"nsplit": Option(16, range(1, 257), "KV splits per request")},
        workspace=[Workspace("o_part", lambda p: (p.nsplit, p.num_tokens * p.num_heads, 512)),
                   Workspace("lse_part", lambda p: (p.nsplit, p.num_tokens * p.num_heads))],
        launches=[Launch("mine_partial", args=["q", "k", ..., "o_part", "nsplit", "sm_scale"],
                         grid=lambda p: (p.max_q_len * p.num_heads, p.nsplit, p.bs), block=128),
                  Launch("mine_merge", args=[...], grid=lambda p: (p.num_tokens * p.num_heads,), block=128)])

`backend` meets kdkit's backend contract (NAME, unavailable, run(case, *, options) -> Result,
prepare -> Prepared, LINT_CLEAN), and has the live pair (kdkit.capture.live) that CUDA graphs and
the server's validate/replace modes call: `p = backend.plan(batch)` once per batch (a
kdkit.backends.LiveBatch, in SGLang's layout; host only, the options' defaults),
`backend.launch(p, q, k, v, kv_buffer, out)` per layer. run and prepare plan a case through the same
plan (a unified case converted to SGLang's layout first).

Arguments are named (ARGS says what each name is and its C type); the entry points must be
`extern "C"` and their parameters are checked against the names' types in the PTX at build time.
The source is compiled by kdkit's own JIT (kdkit.kernel.jit: NVRTC, #line directives, a cache key
over the text of every included header), for the GPU it runs on or for any sm_XX without one
(`resources()`). The typedefs qo_indptr_t, kv_indptr_t, kv_indices_t and mask_indptr_t (int or
long long: the dtypes of the batch's index arrays) are written ahead of it.

Per call a plan writes one layer's pointers and strides into argument buffers packed at plan time
and queues its kernels on torch's current stream through kdkit's launcher (kdkit.kernel.launch): no
allocation, no device read.
"""
from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..backends import Prepared, Result
from ..constants import V_HEAD_DIM
from ..kernel import jit
from ..kernel.api import Metadata, tensor_signature
from ..kernel.launch import Launcher, current_raw_stream
from ..kernel.checks import InputError, check_metadata, check_tensors, read_sizes, require
from .batch import as_uint8, case_batch, sglang_case

# The names an argument list may use, and their C types (the PTX type class they must meet).
# Tensors of one layer (rebound by every Plan.run), then the batch's metadata (bound by plan()).
LAYER_TENSORS = ("q", "k", "v", "kv_buffer", "out", "lse")
# (the sglang layout only, as a live batch is: no prefix_lens, no unified flag; a unified case is
# converted to it before it is planned, kdkit.byok.batch)
META_TENSORS = ("qo_indptr", "kv_indptr", "kv_indices", "custom_mask", "mask_indptr")
INT_SCALARS = ("num_heads", "bs", "num_tokens", "max_q_len", "max_kv_len", "causal")
FLOAT_SCALARS = ("sm_scale", "logit_cap")
STRIDE = re.compile(r"^(q|k|v|kv_buffer|out)\.stride\(([0-2])\)$")  # "q.stride(0)": int64 elements
_PTX_CLASS = {"ptr": ("u64", "b64", "s64"), "i64": ("u64", "b64", "s64"), "i32": ("u32", "s32", "b32"),
              "f32": ("f32",)}
_C_TYPE = {"ptr": "a pointer", "i64": "long long", "i32": "int", "f32": "float"}
_INDEX_C = {torch.int32: "int", torch.int64: "long long"}
_INDEX_TAG = {torch.int32: "i32", torch.int64: "i64"}
TYPEDEFS = {"qo_indptr": "qo", "kv_indptr": "kvp", "kv_indices": "kvi", "mask_indptr": "mip"}  # -> its tag in the key
MAX_GRID = (2 ** 31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
WORKSPACE_LIMIT = 8 << 30  # bytes of workspace one plan may ask for (a wrong shape function, not a real need)
# the shape resources() and `kdkit compile` evaluate launches at: the seed's call (bs 1, prefix 21,
# q_len 9, H 8); pass another Problem for kernels whose threads or shared memory follow the shape
SEED_SHAPE = dict(bs=1, num_tokens=9, num_heads=8, max_q_len=9, max_kv_len=30)


class CompileError(jit.BuildError):
    """The user's kernel does not build, or does not build into what its backend declares.
    The message is the compiler's own lines (file:line from #line directives), or one line naming
    the entry point and parameter that disagree."""


@dataclass(frozen=True)
class Option:
    """A declared option of run()/prepare()/plan(): its default, the values allowed (None: any of
    the default's type), a few words for the docs."""
    default: int | float | bool
    choices: range | tuple | None = None
    doc: str = ""


@dataclass(frozen=True)
class Workspace:
    """A buffer the kernel needs beside out/lse (split partials): allocated once per plan, so its
    address stays fixed for CUDA graphs. shape(problem) -> tuple of ints."""
    name: str
    shape: Callable
    dtype: torch.dtype = torch.float32


@dataclass(frozen=True)
class Launch:
    """One kernel launch, in order: its entry point, its arguments by name (ARGS in the module doc),
    and grid / block / dynamic shared memory as ints or tuples, or functions of the Problem."""
    entry: str
    args: tuple
    grid: Callable | tuple | int
    block: Callable | tuple | int
    smem: Callable | int = 0

    def __post_init__(self):
        object.__setattr__(self, "args", tuple(self.args))  # a list is fine to write


@dataclass(frozen=True)
class Problem:
    """What the launch functions see: the batch's sizes and the declared options (p.nsplit)."""
    bs: int
    num_tokens: int
    num_heads: int
    max_q_len: int
    max_kv_len: int
    causal: bool = False
    has_mask: bool = True
    options: dict = field(default_factory=dict)

    def __getattr__(self, name):
        opts = self.__dict__.get("options", {})
        if name in opts:
            return opts[name]
        raise AttributeError(f"Problem has no {name!r}: sizes are {', '.join(SEED_SHAPE)}, causal, has_mask; "
                             f"options {', '.join(opts) or '(none declared)'}")


def _dims(value, p: Problem, what: str) -> tuple:
    v = value(p) if callable(value) else value
    v = (v,) if isinstance(v, (int, np.integer)) else tuple(v)
    if not 1 <= len(v) <= 3 or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v):
        raise InputError(f"field '{what}': {v!r}; want 1 to 3 whole numbers")
    return tuple(int(x) for x in v) + (1,) * (3 - len(v))


def ptx_params(ptx: str, entry: str) -> list[str] | None:
    """The PTX types of `entry`'s parameters ('u64', 'u32', 'f32', ...; 'b8[24]' for a struct), or
    None when the module has no such entry (a C++ name without extern "C" is mangled)."""
    m = re.search(rf"\.entry\s+{re.escape(entry)}\s*\((.*?)\)", ptx, re.S)
    if m is None:
        return None
    out = []
    for decl in filter(str.strip, m.group(1).split(",")):
        words = decl.split()  # .param [.align N] .type [.ptr .global .align N] name[len]
        typ = next(w[1:] for w in words if re.fullmatch(r"\.[bsuf]\d+", w))
        arr = re.search(r"\[\d+\]$", words[-1])
        out.append(typ + (arr.group(0) if arr else ""))
    return out


@dataclass
class Resources:
    """Registers, shared memory and spills of each entry point for `arch` (ptxas' report), with the
    threads and dynamic shared memory its launch asks for at `problem`; breaches() against sm_120."""
    arch: str
    key: str
    source: str
    kernels: dict        # entry -> jit.KernelResources
    threads: dict        # entry -> threads per block at problem
    dynamic_smem: dict   # entry -> dynamic shared memory at problem
    forbidden: list

    def breaches(self) -> list[str]:
        out = [b for name, k in self.kernels.items()
               for b in jit.sm120_breaches(k, self.dynamic_smem[name], self.threads[name])]
        return out + [f"uses {ins}, which sm_120 does not have" for ins in self.forbidden]

    def table(self) -> str:
        from tabulate import tabulate
        rows = [[n, self.threads[n], k.registers, k.smem_static, self.dynamic_smem[n], k.stack,
                 f"{k.spill_stores}/{k.spill_loads}", k.local] for n, k in self.kernels.items()]
        body = tabulate(rows, ["kernel", "threads", "regs", "smem static", "smem dyn", "stack", "spill st/ld",
                               "lmem"], tablefmt="simple")
        br = self.breaches()
        return "\n".join([f"{self.arch}  {self.source}  {self.key}", *("  " + ln for ln in body.splitlines()),
                          "  fits sm_120 limits: yes" if not br else "  BREACH: " + "; ".join(br)])


class _Bound:
    """One launch's packed arguments: 8 bytes per parameter in `vals`, `ptrs` the void** array
    cuLaunchKernel reads (both kept alive by this object; CUDA copies them at each launch)."""
    __slots__ = ("entry", "fn", "grid", "block", "smem", "vals", "mv", "ptrs", "addr", "per_layer")

    def __init__(self, entry, fn, grid, block, smem, n):
        self.entry, self.fn, self.grid, self.block, self.smem = entry, fn, grid, block, smem
        self.vals = np.zeros(max(n, 1), dtype=np.int64)
        self.mv = memoryview(self.vals)  # (per-layer writes: an item write here costs less than numpy's)
        self.ptrs = self.vals.ctypes.data + 8 * np.arange(max(n, 1), dtype=np.uint64)
        self.addr = int(self.ptrs.ctypes.data)
        self.per_layer = ()  # (parameter slot, index of its value in Plan.layer_keys) per layer argument

    def set(self, i: int, kind: str, value) -> None:
        if kind == "i32":
            self.vals[i:i + 1].view(np.int32)[0] = int(value)
        elif kind == "f32":
            self.vals[i:i + 1].view(np.float32)[0] = float(value)
        else:
            self.vals[i] = int(value)


@dataclass
class Plan:
    """One batch of a CudaKernel: the module, the workspace, the packed arguments. run() per layer."""
    name: str
    key: str
    problem: Problem
    device: torch.device
    num_tokens: int
    num_heads: int
    pool_rows_needed: int
    out: torch.Tensor            # the plan's own output buffers (fixed addresses for graphs)
    lse: torch.Tensor
    launches: list
    layer_keys: tuple            # (tensor position in LAYER_TENSORS, stride dim or -1 for the pointer)
    workspace: dict
    launcher: Launcher | None = None  # the launches, made once (kdkit.kernel.launch)
    _keep: list = field(default_factory=list)
    _seen: tuple | None = None   # the tensors' signature that last passed check_tensors

    def __post_init__(self):
        # the tensors bind() reads a stride() tuple of, and layer_keys with a stride's tensor
        # position replaced by its place in that list
        self._strided = tuple(sorted({i for i, d in self.layer_keys if d >= 0}))
        self._reads = tuple((i if d < 0 else self._strided.index(i), d) for i, d in self.layer_keys)

    @property
    def info(self) -> dict:
        return {"module": self.key, **self.problem.options,
                "launches": {b.entry: {"grid": b.grid, "block": b.block, "smem": b.smem} for b in self.launches}}

    def bind(self, q, k, v, kv_buffer, out=None, lse=None, check: bool = True):
        """Write one layer's pointers and strides into the packed arguments; check=True checks the
        tensors against the plan first (shapes, dtypes, strides, devices: no device read)."""
        out = self.out if out is None else out
        lse = self.lse if lse is None else lse
        ts = (q, k, v, kv_buffer, out, lse)
        # (this runs once a layer: each torch call here is a share of run()'s host time, so each
        # pointer and stride tuple is read once; a stride(d) costs more than a stride())
        ptrs = [t.data_ptr() for t in ts]
        if check:
            # the full check (it names the field and the fix) where shapes, strides, dtypes or
            # devices differ from the last call that passed it, as kdkit's own plan does; the
            # addresses are new each layer, so their 16-byte alignment is checked every call
            sig = tensor_signature(q, k, v, kv_buffer, out, lse)
            if sig != self._seen or (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5]) & 15:
                check_tensors(self, q, k, v, kv_buffer, out, lse)
                self._seen = sig
        strides = [ts[i].stride() for i in self._strided]
        cur = [ptrs[i] if d < 0 else strides[i][d] for i, d in self._reads]
        for b in self.launches:
            mv = b.mv
            for slot, j in b.per_layer:
                mv[slot] = cur[j]
        return out, lse

    def launch(self) -> None:
        """Launch every kernel on torch's current stream with the last bound tensors (graph-safe),
        through kdkit's launcher (kdkit.kernel.launch: one driver call each, made ready at plan
        time). A refusal is a LaunchError naming the entry point and the driver's error."""
        self.launcher(current_raw_stream(self.device.index))

    def run(self, q, k, v, kv_buffer, out=None, lse=None, check: bool = True):
        """Launch on one layer's tensors (graph-capturable). Returns (out, lse): the given buffers,
        or the plan's own (overwritten by the next run)."""
        out, lse = self.bind(q, k, v, kv_buffer, out, lse, check)
        if self.num_tokens:
            self.launch()
        return out, lse


def _arg_kind(name: str, workspace: dict, options: dict) -> str:
    if name in LAYER_TENSORS or name in META_TENSORS or name in workspace:
        return "ptr"
    if STRIDE.match(name):
        return "i64"
    if name in INT_SCALARS:
        return "i32"
    if name in FLOAT_SCALARS:
        return "f32"
    if name in options:
        return "f32" if isinstance(options[name].default, float) else "i32"
    raise ValueError(f"field 'args': unknown argument {name!r}; use a tensor ({', '.join(LAYER_TENSORS + META_TENSORS)}), "
                     f"a workspace ({', '.join(workspace) or 'none declared'}), a scalar "
                     f"({', '.join(INT_SCALARS + FLOAT_SCALARS)}), an option ({', '.join(options) or 'none declared'}) "
                     "or a stride like 'q.stride(0)'")


class CudaKernel:
    """A user's CUDA kernel as a kdkit backend (see the module doc)."""

    LINT_CLEAN = True  # never launched on a case the lint finds mis-marshaled (it could read out of bounds)

    def __init__(self, name: str, source, launches, options: dict | None = None, workspace=(),
                 label: str | None = None):
        if not re.fullmatch(r"[A-Za-z_]\w*", str(name)):
            raise ValueError(f"field 'name': {name!r}; a backend name is a Python identifier")
        self.NAME, self.source = str(name), Path(source).resolve()
        self.LABEL = label or f"{name} ({self.source.name}, CUDA)"
        self.options = {k: o if isinstance(o, Option) else Option(o) for k, o in (options or {}).items()}
        self.workspace = {w.name: w for w in workspace}
        self.launches = tuple(launches)
        if not self.launches:
            raise ValueError("field 'launches': give at least one Launch")
        clash = set(self.options) & (set(self.workspace) | set(LAYER_TENSORS + META_TENSORS + INT_SCALARS + FLOAT_SCALARS))
        if clash:
            raise ValueError(f"field 'options': {', '.join(sorted(clash))} is already an argument name; rename the option")
        for o_name, o in self.options.items():
            if not isinstance(o.default, (int, float)):
                raise ValueError(f"field 'options': {o_name}'s default {o.default!r} is not a number")
        self.kinds = {lc.entry: [_arg_kind(a, self.workspace, self.options) for a in lc.args] for lc in self.launches}
        self.run = self._declared(self._run_case)
        self.prepare = self._declared(self._prepare_case)

    def _declared(self, impl):
        """impl as a function whose signature declares the options (kdkit reads them off it)."""
        def call(case, **opts):
            return impl(case, **opts)
        params = [inspect.Parameter("case", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=o.default)
                   for n, o in self.options.items()]
        call.__signature__ = inspect.Signature(params)
        call.__name__, call.__doc__ = impl.__name__.strip("_").removesuffix("_case"), impl.__doc__
        return call

    def __repr__(self):
        return f"<CudaKernel {self.NAME}: {self.source}>"

    # ---- the contract ------------------------------------------------------------------------
    def unavailable(self, case=None) -> str | None:
        from importlib.util import find_spec  # look, do not import
        if not self.source.is_file():
            return f"{self.NAME}: {self.source} does not exist (the kernel's source)"
        if not torch.cuda.is_available():
            return f"{self.NAME}: no CUDA GPU visible to torch; `resources(arch='sm_120')` checks the build without one"
        if find_spec("cupy") is None:
            return f"{self.NAME}: CuPy is not installed: `pip install cupy-cuda13x` (kdkit's 'gpu' extra)"
        if find_spec("cuda") is None or find_spec("cuda.bindings") is None:
            return f"{self.NAME}: NVRTC bindings missing: `pip install cuda-bindings nvidia-cuda-nvrtc` (kdkit's 'gpu' extra)"
        if case is not None and (case.q.dtype != torch.bfloat16 or case.kv_buffer.dtype != torch.bfloat16):
            return f"{self.NAME}: takes bf16 q/k/v/pool, this case is {case.q.dtype}"
        return None

    def _options(self, opts: dict) -> dict:
        bad = sorted(set(opts) - set(self.options))
        if bad:
            raise TypeError(f"{self.NAME}: unknown option(s) {', '.join(bad)}; this backend takes "
                            f"{', '.join(self.options) or 'no options'}")
        out = {}
        for n, o in self.options.items():
            val = opts.get(n, o.default)
            if isinstance(o.default, bool):
                require(isinstance(val, (bool, int, np.integer)) and val in (0, 1), n, f"{val!r}: True or False")
                val = bool(val)
            elif isinstance(o.default, int):
                require(isinstance(val, (int, np.integer)) and not isinstance(val, bool), n, f"{val!r}: a whole number")
                val = int(val)
            else:
                require(isinstance(val, (int, float)) and not isinstance(val, bool) and math.isfinite(val), n,
                        f"{val!r}: a finite number")
                val = float(val)
            require(o.choices is None or val in o.choices, n, f"{val}: choose from {_show(o.choices)}")
            out[n] = val
        return out

    def _run_case(self, case, **opts) -> Result:
        p, x = self._plan_case(case, opts)
        out, lse = p.run(x["q"], x["k"], x["v"], x["kv_buffer"])
        torch.cuda.synchronize()
        return Result(out, lse, self._info(p))

    def _prepare_case(self, case, **opts) -> Prepared:
        p, x = self._plan_case(case, opts)
        p.bind(x["q"], x["k"], x["v"], x["kv_buffer"])
        # the bound pointers point into x (the case's device copies, the metadata the plan reads):
        # the plan keeps them alive as long as it can be launched (freed, a launch read freed memory:
        # an illegal address on the H200 once the allocator gave the blocks back)
        p._keep.append(x)
        info = self._info(p)
        return Prepared(launch=p.launch, result=lambda: Result(p.out.clone(), p.lse.clone(), info),
                        graph_safe=True, info=info)

    def _info(self, p: Plan) -> dict:
        dev = torch.cuda.get_device_name(p.device)
        opts = ", ".join(f"{k} {v}" for k, v in p.problem.options.items())
        return {"device": dev, **p.info,
                "ran": f"{self.NAME} ({self.source.name}), {dev}{', ' + opts if opts else ''}, {p.key}"}

    def _plan_case(self, case, opts: dict):
        """The case (a unified one in the sglang layout) on the GPU, its index arrays' contents
        checked (one host read: a case's path may read, a live plan may not), planned."""
        from ..backends.cuda import to_device
        opts = self._options(opts)  # before anything touches the case
        case = sglang_case(case)
        x = to_device(case)
        batch = case_batch(case, x)
        m = _metadata(batch)
        check_metadata(m)
        sizes = read_sizes(m, values=True)
        return self._plan(batch, opts, sizes["pool_rows_needed"]), x

    # ---- build -------------------------------------------------------------------------------
    def build(self, arch: str | None = None, index_types: dict | None = None) -> jit.Module:
        """Compile for `arch` (None: this GPU's), cached by the text of the source and every header it
        includes; an edited file is a new key, so the next call builds it. Raises CompileError."""
        arch = arch or jit.device_arch()
        types = {n: (index_types or {}).get(n, torch.int32) for n in TYPEDEFS}
        prelude = "".join(f"typedef {_INDEX_C[t]} {n}_t;\n" for n, t in types.items())
        tags = {TYPEDEFS[n]: _INDEX_TAG[t] for n, t in types.items()}
        try:
            mod = jit.build(self.source, {}, arch, tags=tags, prelude=prelude)
        except jit.BuildError as e:
            raise CompileError(_compiler_lines(str(e))) from None
        for lc in self.launches:
            self._check_entry(mod, lc)
        return mod

    def _check_entry(self, mod: jit.Module, lc: Launch) -> None:
        got = ptx_params(mod.ptx, lc.entry)
        where = f"{self.source.name}: entry point {lc.entry!r}"
        if got is None:
            raise CompileError(f"{where} is not in the build; define it `extern \"C\" __global__` (C++ names are "
                               f"mangled) or fix the name (entries built: {', '.join(mod.kernels) or 'none'})")
        kinds = self.kinds[lc.entry]
        if len(got) != len(kinds):
            raise CompileError(f"{where} takes {len(got)} parameters, its Launch maps {len(kinds)} "
                               f"({', '.join(lc.args)})")
        for i, (arg, kind, ptx) in enumerate(zip(lc.args, kinds, got)):
            if ptx not in _PTX_CLASS[kind]:
                raise CompileError(f"{where}: parameter {i} is .{ptx} in the kernel, but its Launch passes {arg!r}, "
                                   f"{_C_TYPE[kind]}")

    def resources(self, arch: str = "sm_120", problem: Problem | None = None) -> Resources:
        """ptxas' registers / shared memory / spills per entry for `arch` (no GPU needed), with the
        threads and dynamic shared memory each launch asks for at `problem` (the seed's shape and the
        options' defaults when None)."""
        mod = self.build(arch)
        p = problem or Problem(**SEED_SHAPE, options={n: o.default for n, o in self.options.items()})
        threads, dyn = {}, {}
        for lc in self.launches:
            blk = _dims(lc.block, p, f"{lc.entry}.block")
            threads[lc.entry] = blk[0] * blk[1] * blk[2]
            dyn[lc.entry] = int(lc.smem(p) if callable(lc.smem) else lc.smem)
        kernels = {lc.entry: mod.kernels.get(lc.entry, jit.KernelResources(lc.entry)) for lc in self.launches}
        return Resources(arch, mod.key, str(self.source), kernels, threads, dyn, mod.forbidden_instructions())

    # ---- the live pair: plan(batch) once per batch, launch(...) per layer ----------------------
    def plan(self, batch) -> Plan:
        """The live pair's plan (kdkit.capture.live) for one batch, a kdkit.backends.LiveBatch, with
        the declared options' defaults: checks of what the host knows, the build, the workspace, the
        packed arguments. Reads nothing from the device and syncs nothing (it runs inside CUDA-graph
        capture too): the sizes are the batch's host ints, and the grid covers batch.max_q_len tokens
        per request."""
        return self._plan(batch, self._options({}))

    def launch(self, plan: Plan, q, k, v, kv_buffer, out) -> None:
        """One layer's launches into `out` [T, H, 512] (the LSE into the plan's own buffer): the
        tensors checked against the plan (shapes, dtypes, strides, devices: no device read), their
        pointers written into the packed arguments, then cuLaunchKernel on torch's current stream."""
        plan.run(q, k, v, kv_buffer, out=out)

    def unsupported(self, batch) -> str | None:
        """Why this kernel cannot serve `batch` (host only), None if it can."""
        if batch.dtype != torch.bfloat16:
            return f"takes bf16 q/k/v/pool, this model runs {batch.dtype}"
        return None

    def _plan(self, batch, opts: dict, pool_rows_needed: int = 0) -> Plan:
        """plan(batch) with `opts`; `pool_rows_needed`, the pool rows kv_indices reach where the
        caller read them (a case), bounds the pool at every launch (0: not known, a live batch)."""
        m = _metadata(batch)
        check_metadata(m)
        custom_mask = m.custom_mask
        dev, T, H = batch.device, int(batch.num_tokens), m.num_heads
        require(batch.batch_size == batch.qo_indptr.numel() - 1, "qo_indptr",
                f"{batch.qo_indptr.numel()} entries for batch_size={batch.batch_size}; want batch_size+1")
        max_q_len = int(batch.max_q_len)
        require(0 <= max_q_len <= max(T, 1) and batch.max_kv_len >= max_q_len, "max_q_len",
                f"{max_q_len} must lie in [0, T={T}] and at most max_kv_len={batch.max_kv_len}")
        prob = Problem(int(batch.batch_size), T, H, max_q_len, int(batch.max_kv_len), m.causal,
                       custom_mask is not None, opts)
        types = {n: t.dtype for n, t in (("qo_indptr", batch.qo_indptr), ("kv_indptr", batch.kv_indptr),
                                         ("kv_indices", batch.kv_indices), ("mask_indptr", batch.mask_indptr))
                 if t is not None}
        with torch.cuda.device(dev):
            mod = self.build(jit.device_arch(), types)
            raw = jit.load(mod)
        ws = {}
        for w in self.workspace.values():
            shape = tuple(int(s) for s in w.shape(prob))
            nbytes = int(np.prod(shape)) * torch.empty(0, dtype=w.dtype).element_size()
            require(all(s >= 0 for s in shape) and nbytes <= WORKSPACE_LIMIT, w.name,
                    f"shape {shape} ({nbytes >> 20} MiB) at {_show_problem(prob)}; at most {WORKSPACE_LIMIT >> 30} GiB")
            ws[w.name] = torch.empty(shape, dtype=w.dtype, device=dev)
        out = torch.empty(T, H, V_HEAD_DIM, dtype=torch.bfloat16, device=dev)
        lse = torch.empty(T, H, dtype=torch.float32, device=dev)
        fixed = {"qo_indptr": batch.qo_indptr, "kv_indptr": batch.kv_indptr, "kv_indices": batch.kv_indices,
                 "custom_mask": custom_mask, "mask_indptr": batch.mask_indptr, **ws}
        scalars = {"num_heads": H, "bs": prob.bs, "num_tokens": T, "max_q_len": max_q_len,
                   "max_kv_len": prob.max_kv_len, "causal": int(m.causal),
                   "sm_scale": m.sm_scale, "logit_cap": m.logit_cap, **opts}
        layer_keys: list = []
        bound = []
        for lc in self.launches:
            b = self._bind_launch(lc, prob, raw, dev)
            per_layer = []
            for i, (arg, kind) in enumerate(zip(lc.args, self.kinds[lc.entry])):
                st = STRIDE.match(arg)
                if arg in LAYER_TENSORS or st:
                    lk = (LAYER_TENSORS.index(st.group(1) if st else arg), int(st.group(2)) if st else -1)
                    if lk not in layer_keys:
                        layer_keys.append(lk)
                    per_layer.append((i, layer_keys.index(lk)))
                elif kind == "ptr":
                    t = fixed[arg]
                    b.set(i, kind, 0 if t is None else t.data_ptr())
                else:
                    b.set(i, kind, scalars[arg])
            b.per_layer = tuple(per_layer)
            bound.append(b)
        launcher = Launcher([(b.entry, int(b.fn), b.grid, b.block, b.smem, b.addr, False) for b in bound],
                            keep=tuple(bound))
        return Plan(self.NAME, mod.key, prob, dev, T, H, int(pool_rows_needed), out, lse, bound,
                    tuple(layer_keys), ws, launcher, [m])

    def _bind_launch(self, lc: Launch, prob: Problem, raw, dev) -> _Bound:
        from cuda.bindings import driver
        grid = _dims(lc.grid, prob, f"{lc.entry}.grid")
        block = _dims(lc.block, prob, f"{lc.entry}.block")
        smem = int(lc.smem(prob) if callable(lc.smem) else lc.smem)
        for what, dims, lim in (("grid", grid, MAX_GRID), ("block", block, MAX_BLOCK)):
            require(all(1 <= d <= mx for d, mx in zip(dims, lim)), f"{lc.entry}.{what}",
                    f"{dims} at {_show_problem(prob)}; each dim in 1..{lim}")
        require(block[0] * block[1] * block[2] <= 1024, f"{lc.entry}.block", f"{block}: more than 1024 threads")
        fn = raw.get_function(lc.entry)
        cap = getattr(torch.cuda.get_device_properties(dev), "shared_memory_per_block_optin", 48 * 1024)
        require(0 <= smem <= cap, f"{lc.entry}.smem", f"{smem} B at {_show_problem(prob)}; this GPU allows {cap} B")
        if smem > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = smem
        # RawKernel.kernel is the loaded cupy Function; its ptr is the driver's CUfunction handle
        return _Bound(lc.entry, driver.CUfunction(fn.kernel.ptr), grid, block, smem, len(lc.args))


def _metadata(batch) -> Metadata:
    """A LiveBatch as kdkit's kernel checks take it (kdkit.kernel.checks). No prefix_lens: that is
    the unified layout's, and a live batch is SGLang's, where request b's prefix is kv_indptr[b+1] -
    kv_indptr[b]; deriving it would be a device op at plan time, stale once the plan is reused for
    the next batch in the same buffers."""
    return Metadata(batch.qo_indptr, batch.kv_indptr, batch.kv_indices, None, as_uint8(batch.custom_mask),
                    batch.mask_indptr, int(batch.num_heads), float(batch.sm_scale), float(batch.logit_cap),
                    bool(batch.causal), "sglang")


def _show(choices) -> str:
    if isinstance(choices, range) and choices.step == 1:
        return f"{choices.start}..{choices.stop - 1}"
    return ", ".join(map(str, choices))


def _show_problem(p: Problem) -> str:
    opts = "".join(f", {k}={v}" for k, v in p.options.items())
    return f"bs={p.bs}, T={p.num_tokens}, H={p.num_heads}, max_q_len={p.max_q_len}, max_kv_len={p.max_kv_len}{opts}"


def _compiler_lines(msg: str) -> str:
    """The compiler's own lines of a kdkit.kernel.jit build error (its first line, 'compiling X for
    sm_Y failed:', names what ran; what follows is NVRTC's log, file(line): error: ...)."""
    head, _, rest = msg.partition("\n")
    return rest if re.match(r"compiling .* failed:$", head) and rest.strip() else msg


__all__ = ["CudaKernel", "Launch", "Option", "Workspace", "Problem", "Plan", "Resources", "CompileError",
           "ptx_params", "LAYER_TENSORS", "META_TENSORS", "INT_SCALARS", "FLOAT_SCALARS"]
