"""Bring your own Triton kernel: a launcher and its @triton.jit kernels become a kdkit backend.

    # backend.py, beside kernel.py (the @triton.jit kernels, `launch`, and optionally `workspace`)
    from pathlib import Path
    from kdkit.byok.triton import TritonKernel

    backend = TritonKernel("mine", Path(__file__).with_name("kernel.py"))

or, in a notebook cell: `TritonKernel("mine", launch=launch, workspace=workspace)`.

The launcher is a plain function; kdkit passes it, by parameter name:
  tensors  q [T,H,576], k [T,1,576], v [T,1,512], kv_buffer [N,1,576], qo_indptr, kv_indptr,
           kv_indices (the prefix only: the "sglang" layout), custom_mask (uint8, or None),
           mask_indptr, out [T,H,512] and lse [T,H] fp32 (contiguous, written by the launcher)
  scalars  bs, num_heads, num_tokens, max_q_len, max_kv_len (ints, read once per batch),
           sm_scale, logit_cap (floats), causal (bool)
  options  its other parameters with a default (int, float or bool): the backend's declared
           tuning options, e.g. `nsplit=4`; `run(case, nsplit=8)`, `--opt nsplit=8`, sweeps
  workspace  its parameters without a default that are none of the above: the buffers that
           `workspace(...)` returns as a dict, allocated once per batch (it takes, by name, any
           scalar, option and `device`), so that a launch allocates nothing.
The backend meets kdkit's contract (NAME, LABEL, LINT_CLEAN, unavailable, run(case, *, options)
-> Result, prepare -> Prepared) and has the live pair (kdkit.capture.live) that CUDA graphs and
the server's validate/replace modes call: `p = backend.plan(batch)` once per batch (a
kdkit.backends.LiveBatch; host only, the options' defaults), `backend.launch(p, q, k, v, kv_buffer,
out)` per layer. run and prepare plan a case through the same plan.

Without a CUDA device the kernels run on the CPU under Triton's interpreter: TRITON_INTERPRET=1
is set (kdkit.sglang_source.prepare_triton) before kernel.py is loaded, which is why a source file
is loaded only when the backend first runs, and its options are read from its text (ast) before.
The interpreter cannot tl.dot bfloat16 (triton-lang/triton#11584), so there bf16 inputs are
widened to fp32 (exact) and the output is rounded back to bf16. A source file whose text changed
is loaded again at the next run (edit kernel.py, re-run the cell).
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import math
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .. import sglang_source
from ..constants import QK_DIM as DQK, V_HEAD_DIM as DV
from ..backends import BackendUnavailable, Prepared, Result
from ..kernel.checks import InputError, require
from .batch import as_uint8, case_batch, sglang_case

TENSORS = ("q", "k", "v", "kv_buffer", "qo_indptr", "kv_indptr", "kv_indices", "custom_mask",
           "mask_indptr", "out", "lse")
SCALARS = ("bs", "num_heads", "num_tokens", "max_q_len", "max_kv_len", "sm_scale", "logit_cap", "causal")
INDEX = ("qo_indptr", "kv_indptr", "kv_indices", "mask_indptr")
OPTION_TYPES = (bool, int, float)


class SignatureError(ValueError):
    """A launcher or workspace function kdkit cannot call; the message names the parameter."""


@dataclass
class Signature:
    """What a launcher takes: case tensors and scalars by name, options with defaults, workspace names."""
    tensors: tuple
    scalars: tuple
    options: dict
    workspace: tuple


def _params_of(fn_or_node) -> list[tuple[str, object, bool]]:
    """(name, default, has_default) of a function or of its ast FunctionDef (read, never run)."""
    if isinstance(fn_or_node, ast.FunctionDef):
        a = fn_or_node.args
        pos = a.posonlyargs + a.args
        defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
        items = list(zip(pos, defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
        out = []
        for arg, d in items:
            try:
                val = ast.literal_eval(d) if d is not None else None
            except ValueError:
                raise SignatureError(f"parameter '{arg.arg}': its default is not a literal number "
                                     "(kdkit reads options from the file's text)") from None
            out.append((arg.arg, val, d is not None))
        if a.vararg or a.kwarg:
            raise SignatureError("*args/**kwargs: name each parameter (kdkit passes them by name)")
        return out
    out = []
    for p in inspect.signature(fn_or_node).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise SignatureError("*args/**kwargs: name each parameter (kdkit passes them by name)")
        out.append((p.name, p.default, p.default is not p.empty))
    return out


def read_signature(launch, workspace=None) -> Signature:
    """Classify the launcher's parameters (see the module doc); SignatureError names a bad one."""
    tensors, scalars, options, ws = [], [], {}, []
    for name, default, has_default in _params_of(launch):
        if name in TENSORS:
            tensors.append(name)
        elif name in SCALARS:
            scalars.append(name)
        elif has_default:
            if type(default) not in OPTION_TYPES:
                raise SignatureError(f"launch parameter '{name}': default {default!r}; an option's default "
                                     "is an int, float or bool")
            options[name] = default
        else:
            ws.append(name)
    if "out" not in tensors:
        raise SignatureError("launch takes no `out`: name the output parameter out ([T, H, 512], written by the launcher)")
    if ws and workspace is None:
        raise SignatureError(f"launch parameter '{ws[0]}' is no case tensor ({', '.join(TENSORS)}) or scalar "
                             f"({', '.join(SCALARS)}) and has no default; rename it, give it a default (an "
                             "option), or define workspace() returning it")
    if workspace is not None:
        for name, _, has_default in _params_of(workspace):
            if name not in SCALARS and name not in options and name != "device" and not has_default:
                raise SignatureError(f"workspace parameter '{name}': workspace() takes scalars "
                                     f"({', '.join(SCALARS)}), the launcher's options, or device")
    return Signature(tuple(tensors), tuple(scalars), options, tuple(ws))


def _ast_functions(source: Path) -> dict:
    tree = ast.parse(source.read_text(), filename=str(source))
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _check_option(name: str, value, default):
    """The option's value, of its default's type; InputError otherwise."""
    if type(default) is float and type(value) is int:
        value = float(value)
    require(type(value) is type(default), name, f"{value!r} ({type(value).__name__}); this option is "
            f"{type(default).__name__} (default {default!r})")
    return value


@dataclass
class TritonPlan:
    """One batch: its sizes, the workspace, the launcher's fixed arguments. run() per layer."""
    backend: "TritonKernel"
    launch_fn: Callable
    sig: Signature
    device: torch.device
    num_tokens: int
    num_heads: int
    max_slot: int                 # largest kv_indices value the batch reads (-1: none, or not read)
    fixed: dict                   # metadata tensors, workspace, scalars and options by name
    out: torch.Tensor             # the plan's own output buffers
    lse: torch.Tensor
    options: dict

    def bind(self, q, k, v, kv_buffer, out=None, lse=None, check: bool = True) -> dict:
        """The launcher's keyword arguments for one layer's tensors (checked: no device read)."""
        out = self.out if out is None else out
        lse = self.lse if lse is None else lse
        if check:
            self.check_tensors(q, k, v, kv_buffer, out, lse)
        layer = {"q": q, "k": k, "v": v, "kv_buffer": kv_buffer, "out": out, "lse": lse}
        args = {n: layer[n] if n in layer else self.fixed[n] for n in self.sig.tensors}
        args.update({n: self.fixed[n] for n in self.sig.scalars + self.sig.workspace})
        args.update(self.options)
        return args

    def check_tensors(self, q, k, v, kv_buffer, out, lse) -> None:
        T, H = self.num_tokens, self.num_heads
        for name, t, shape in (("q", q, (T, H, DQK)), ("k", k, (T, 1, DQK)), ("v", v, (T, 1, DV)),
                               ("out", out, (T, H, DV)), ("lse", lse, (T, H))):
            require(isinstance(t, torch.Tensor), name, f"{type(t).__name__}; a tensor")
            require(tuple(t.shape) == shape, name, f"shape {tuple(t.shape)}, want {shape}")
            require(t.device == self.device, name, f"on {t.device}, the batch's metadata on {self.device}")
        require(kv_buffer.dim() == 3 and kv_buffer.shape[1:] == (1, DQK), "kv_buffer",
                f"shape {tuple(kv_buffer.shape)}, want [N, 1, {DQK}] (latent first, then rope)")
        require(kv_buffer.device == self.device, "kv_buffer", f"on {kv_buffer.device}, want {self.device}")
        require(self.max_slot < kv_buffer.shape[0], "kv_indices",
                f"slot {self.max_slot} for a pool of {kv_buffer.shape[0]} rows: the kernel would read outside it")
        dt = q.dtype
        for name, t in (("q", q), ("k", k), ("v", v), ("kv_buffer", kv_buffer)):
            require(t.dtype.is_floating_point and t.dtype == dt, name, f"dtype {t.dtype}; q, k, v and the pool "
                    f"share one float dtype (q is {dt})")
            require(t.stride(-1) == 1, name, "its last dim must be contiguous (stride 1)")
        require(out.is_contiguous() and out.dtype.is_floating_point, "out", "a contiguous float tensor")
        require(lse.is_contiguous() and lse.dtype == torch.float32, "lse", "a contiguous float32 tensor")

    def run(self, q, k, v, kv_buffer, out=None, lse=None, check: bool = True):
        """Launch on one layer's tensors (graph-capturable on a GPU). Returns (out, lse): the given
        buffers, or the plan's own (overwritten by the next run)."""
        args = self.bind(q, k, v, kv_buffer, out, lse, check)
        if self.num_tokens:
            _call(self.launch_fn, args)
        return args["out"], args.get("lse")


def _call(launch_fn, args: dict) -> None:
    if sglang_source.interpreting():
        with warnings.catch_warnings():   # NumPy warns on a block's padding rows (log(0), 0/0);
            warnings.simplefilter("ignore", RuntimeWarning)   # a GPU computes them silently too
            launch_fn(**args)
    else:
        launch_fn(**args)


class TritonKernel:
    """A user's Triton launcher as a kdkit backend (see the module doc)."""

    LINT_CLEAN = True  # never launched on a case the lint finds mis-marshaled (it could read out of bounds)

    def __init__(self, name: str, source=None, *, launch: Callable | None = None,
                 workspace: Callable | None = None, label: str | None = None):
        if not re.fullmatch(r"[A-Za-z_]\w*", str(name)):
            raise ValueError(f"field 'name': {name!r}; a backend name is a Python identifier")
        if (source is None) == (launch is None):
            raise ValueError("field 'source': give the kernel file (source=...) or the function (launch=...), "
                             "one of the two")
        self.NAME = str(name)
        self.source = Path(source).resolve() if source is not None else None
        self._launch, self._workspace, self._loaded = launch, workspace, None
        where = self.source.name if self.source else getattr(launch, "__name__", "launch")
        self.LABEL = label or f"{name} ({where}, Triton)"
        if self.source is not None:
            if not self.source.is_file():
                raise ValueError(f"field 'source': {self.source} does not exist (the Triton kernel file)")
            fns = _ast_functions(self.source)
            if "launch" not in fns:
                raise ValueError(f"field 'source': {self.source.name} defines no function `launch`")
            self.sig = read_signature(fns["launch"], fns.get("workspace"))
        else:
            self.sig = read_signature(launch, workspace)
        self.run = self._declared(self._run_case)
        self.prepare = self._declared(self._prepare_case)

    def __repr__(self):
        return f"<TritonKernel {self.NAME}: {self.source or self._launch}>"

    def _declared(self, impl):
        """impl as a function whose signature declares the options (kdkit reads them off it)."""
        def call(case, **opts):
            return impl(case, **opts)
        params = [inspect.Parameter("case", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, d in self.sig.options.items()]
        call.__signature__ = inspect.Signature(params)
        call.__name__, call.__doc__ = impl.__name__.strip("_").removesuffix("_case"), impl.__doc__
        return call

    # ---- the contract ------------------------------------------------------------------------
    def unavailable(self, case=None) -> str | None:
        """Looks only: imports no triton, loads no kernel file, sets no environment variable."""
        if importlib.util.find_spec("triton") is None:
            return f"{self.NAME}: triton is not installed; `pip install 'triton>=3.7'` (the CPU interpreter needs it too)"
        why = sglang_source.triton_problem()
        if why:
            return f"{self.NAME}: {why}"
        if self.source is not None and not self.source.is_file():
            return f"{self.NAME}: {self.source} does not exist (the Triton kernel file)"
        return None

    def _functions(self):
        """(launch, workspace), the source file (re)loaded when its text changed. Switches Triton to
        its interpreter first where there is no CUDA device."""
        why = sglang_source.prepare_triton()  # before kernel.py imports triton
        if why:
            raise BackendUnavailable(f"{self.NAME}: {why}")
        if self.source is None:
            return self._launch, self._workspace
        text = self.source.read_bytes()
        key = hashlib.sha256(text).hexdigest()[:16]
        if self._loaded is None or self._loaded[0] != key:
            mod_name = f"_kdkit_byok_{self.NAME}_{key}"
            spec = importlib.util.spec_from_file_location(mod_name, self.source)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = mod  # (Triton reads a kernel's module globals through it)
            spec.loader.exec_module(mod)
            launch, workspace = getattr(mod, "launch", None), getattr(mod, "workspace", None)
            if not callable(launch):
                raise ValueError(f"field 'source': {self.source.name} defines no function `launch`")
            self.sig = read_signature(launch, workspace)
            for fn in (self.run, self.prepare):  # an edited file may declare other options
                fn.__signature__ = self._declared(self._run_case).__signature__
            self._loaded = (key, launch, workspace)
        return self._loaded[1], self._loaded[2]

    def _options(self, opts: dict) -> dict:
        bad = sorted(set(opts) - set(self.sig.options))
        if bad:
            raise TypeError(f"{self.NAME}: unknown option(s) {', '.join(bad)}; this backend takes "
                            f"{', '.join(self.sig.options) or 'no options'}")
        return {n: _check_option(n, opts.get(n, d), d) for n, d in self.sig.options.items()}

    # ---- the live pair: plan(batch) once per batch, launch(...) per layer ----------------------
    def plan(self, batch) -> TritonPlan:
        """The live pair's plan (kdkit.capture.live) for one batch, a kdkit.backends.LiveBatch, with
        the declared options' defaults: checks of what the host knows, the workspace, the launcher's
        fixed arguments. Reads nothing from the device and syncs nothing (it runs inside CUDA-graph
        capture too): the sizes are the batch's host ints, the metadata tensors are bound as they are
        (their contents are read by the kernel at launch)."""
        return self._plan(batch, self._options({}))

    def launch(self, plan: TritonPlan, q, k, v, kv_buffer, out) -> None:
        """One layer's launch into `out` [T, H, 512] (the LSE into the plan's own buffer): the
        tensors checked against the plan (shapes, dtypes, devices: no device read), then the launcher."""
        plan.run(q, k, v, kv_buffer, out=out)

    def unsupported(self, batch) -> str | None:
        """Why this kernel cannot serve `batch` here (host only), None if it can."""
        if batch.dtype == torch.bfloat16 and batch.device.type == "cpu":
            return ("bf16 on the CPU: Triton's interpreter cannot tl.dot bfloat16 (triton-lang/triton#11584); "
                    "run it on a GPU, or the model in fp32")
        return None

    def _plan(self, batch, opts: dict, max_slot: int = -1) -> TritonPlan:
        """plan(batch) with `opts`; `max_slot`, the largest kv_indices value the batch reads where
        the caller read it (a case), bounds the pool at every launch (-1: not known, a live batch)."""
        launch, workspace = self._functions()
        meta = {"qo_indptr": batch.qo_indptr, "kv_indptr": batch.kv_indptr, "kv_indices": batch.kv_indices,
                "custom_mask": as_uint8(batch.custom_mask), "mask_indptr": batch.mask_indptr}
        _check_meta(meta, batch)
        dev, T, H = batch.device, int(batch.num_tokens), int(batch.num_heads)
        scalars = {"bs": int(batch.batch_size), "num_heads": H, "num_tokens": T, "max_q_len": int(batch.max_q_len),
                   "max_kv_len": int(batch.max_kv_len), "sm_scale": float(batch.sm_scale),
                   "logit_cap": float(batch.logit_cap), "causal": bool(batch.causal)}
        ws = {}
        if workspace is not None:
            names = [n for n, _, _ in _params_of(workspace)]
            given = {**scalars, **opts, "device": dev}
            ws = workspace(**{n: given[n] for n in names if n in given})
            require(isinstance(ws, dict) and set(self.sig.workspace) <= set(ws), "workspace",
                    f"workspace() must return a dict holding {', '.join(self.sig.workspace) or 'its buffers'}")
        # the plan's own out (run/prepare read it; the server passes its own) and LSE (the server
        # takes none: the launcher writes it here)
        out = torch.empty((T, H, DV), dtype=batch.dtype, device=dev)
        lse = torch.empty((T, H), dtype=torch.float32, device=dev)
        return TritonPlan(self, launch, self.sig, dev, T, H, max_slot, {**meta, **ws, **scalars}, out, lse, opts)

    # ---- run / prepare: a case through the same plan ----------------------------------------
    def _plan_case(self, case, opts: dict):
        """The case in the sglang layout on the run device (bf16 widened under the interpreter), planned."""
        case = sglang_case(case)
        self._functions()  # the interpreter switch comes first
        interpret = sglang_source.interpreting()
        device = torch.device("cuda" if torch.cuda.is_available() and not interpret else "cpu")
        widen = interpret and case.q.dtype == torch.bfloat16
        # the contents of the index arrays, read here on the host copy (a live plan reads none)
        host = {n: getattr(case, n) for n in (*INDEX, "custom_mask")}
        max_slot = _check_contents({**host, "custom_mask": as_uint8(host["custom_mask"])})

        def dev(t):  # a copy: the kernel never touches the case
            if t is None:
                return None
            return t.to(device=device, dtype=torch.float32 if widen and t.is_floating_point() else t.dtype, copy=True)

        x = {n: dev(getattr(case, n)) for n in ("q", "k", "v", "kv_buffer", *INDEX, "custom_mask")}
        p = self._plan(case_batch(case, x), opts, max_slot)
        args = p.bind(x["q"], x["k"], x["v"], x["kv_buffer"])
        back = (lambda t: t.to(case.q.dtype)) if widen else (lambda t: t.clone())
        info = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "interpreter": interpret, "source": str(self.source or self._launch), **p.options}
        import triton  # already imported by the kernel file: only its version is read here
        opts_txt = "".join(f", {k} {v}" for k, v in p.options.items())
        info["ran"] = (f"{self.NAME} ({self.source.name if self.source else 'launch'}, Triton {triton.__version__})"
                       f" on {info['device']}{opts_txt}" + (" under TRITON_INTERPRET=1" if interpret else ""))
        if widen:
            info["note"] = "bf16 inputs widened to fp32 (the interpreter cannot tl.dot bf16); the output is rounded to bf16"
        return p, args, back, info

    def _run_case(self, case, **opts) -> Result:
        p, args, back, info = self._plan_case(case, self._options(opts))
        if p.num_tokens:
            _call(p.launch_fn, args)
        if p.device.type == "cuda":
            torch.cuda.synchronize(p.device)
        return Result(back(p.out), p.lse.clone() if "lse" in p.sig.tensors else None, info)

    def _prepare_case(self, case, **opts) -> Prepared:
        p, args, back, info = self._plan_case(case, self._options(opts))
        fn = p.launch_fn

        def launch():
            if p.num_tokens:
                _call(fn, args)
        lse = "lse" in p.sig.tensors  # a launcher without lse gives none
        return Prepared(launch=launch, result=lambda: Result(back(p.out), p.lse.clone() if lse else None, info),
                        graph_safe=p.device.type == "cuda", info=info)


def _check_meta(m: dict, batch) -> None:
    """What the host knows of a batch (no device read: a live plan runs inside graph capture);
    InputError naming the field."""
    require(batch.num_heads >= 1, "num_heads", f"{batch.num_heads}; at least 1")
    require(math.isfinite(batch.sm_scale) and batch.sm_scale > 0, "sm_scale",
            f"{batch.sm_scale}; finite and > 0 (the layer's scaling)")
    require(math.isfinite(batch.logit_cap) and batch.logit_cap >= 0, "logit_cap",
            f"{batch.logit_cap}; finite and >= 0 (0 = no cap)")
    for name in INDEX:
        t = m[name]
        if name == "mask_indptr" and t is None and m["custom_mask"] is None:
            continue
        require(isinstance(t, torch.Tensor), name, "missing" if t is None else f"{type(t).__name__}; a tensor")
        require(t.dtype in (torch.int32, torch.int64) and t.dim() == 1, name, f"dtype {t.dtype}, {t.dim()}-D; "
                "a 1-D int32 or int64 tensor")
        require(t.device == batch.device, name, f"on {t.device}, the batch on {batch.device}")
    bs = m["qo_indptr"].numel() - 1
    require(bs >= 1 and bs == batch.batch_size, "qo_indptr", f"{bs + 1} entries for batch_size={batch.batch_size}; "
            "want batch_size+1 (>= 2)")
    require(m["kv_indptr"].numel() == bs + 1, "kv_indptr", f"{m['kv_indptr'].numel()} entries for bs={bs}; want bs+1")
    mask = m["custom_mask"]
    if mask is not None:
        require(mask.dtype == torch.uint8 and mask.dim() == 1 and mask.is_contiguous(), "custom_mask",
                f"dtype {mask.dtype}, {mask.dim()}-D; a flat contiguous bool or uint8 tensor")
        require(m["mask_indptr"].numel() == bs + 1, "mask_indptr", f"{m['mask_indptr'].numel()} entries for "
                f"bs={bs}; want bs+1 start offsets as SGLang passes them (run `kdkit inspect`)")
    require(batch.num_tokens >= 0 and batch.max_q_len >= 0 and batch.max_kv_len >= batch.max_q_len, "max_kv_len",
            f"num_tokens {batch.num_tokens}, max_q_len {batch.max_q_len}, max_kv_len {batch.max_kv_len}: "
            "sizes >= 0, max_kv_len >= max_q_len")


def _check_contents(m: dict) -> int:
    """The index arrays' contents (read on the host: a case's path), InputError naming the field.
    Returns the largest pool slot the batch reads (-1: none)."""
    qo, kvp = m["qo_indptr"].tolist(), m["kv_indptr"].tolist()
    require(len(qo) >= 2 and len(kvp) == len(qo), "kv_indptr", f"{len(kvp)} entries, qo_indptr {len(qo)}: "
            "bs+1 each, bs >= 1")
    q_lens = [b - a for a, b in zip(qo, qo[1:])]
    pre = [b - a for a, b in zip(kvp, kvp[1:])]
    require(qo[0] == 0 and min(q_lens) >= 0, "qo_indptr", f"{qo[:6]}...: starts at 0 and never decreases")
    require(kvp[0] == 0 and min(pre) >= 0, "kv_indptr", f"{kvp[:6]}...: starts at 0 and never decreases")
    n_idx = m["kv_indices"].numel()
    require(kvp[-1] <= n_idx, "kv_indptr", f"ends at {kvp[-1]}, past kv_indices ({n_idx} entries)")
    used = m["kv_indices"][:kvp[-1]]
    require(not used.numel() or int(used.min()) >= 0, "kv_indices", "a negative slot")
    mask = m["custom_mask"]
    if mask is not None:
        mip = m["mask_indptr"].tolist()
        for b in range(len(q_lens)):
            need = mip[b] + q_lens[b] * (pre[b] + q_lens[b])
            require(mip[b] >= 0 and need <= mask.numel(), "custom_mask",
                    f"request {b} reads mask[{mip[b]}:{need}] ({q_lens[b]} x ({pre[b]}+{q_lens[b]})) but the "
                    f"mask has {mask.numel()} entries; run `kdkit inspect`: mask, mask_indptr or kv_indptr is "
                    "marshaled wrongly")
    return int(used.max()) if used.numel() else -1


__all__ = ["TritonKernel", "TritonPlan", "Signature", "SignatureError", "read_signature", "InputError"]
