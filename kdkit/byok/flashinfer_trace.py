"""FlashInfer Trace, FlashInfer-Bench's exchange format: kdkit cases out, solutions in.

    export(dir, cases)               cases -> a Definition for MLA tree verify (its reference in
                                     plain PyTorch) and its Workloads (the captured inputs)
    solution_backend("sol.json")     a FlashInfer Trace Solution -> a kdkit backend

The folder export writes is the one flashinfer_bench.data.TraceSet.from_path reads:

    definitions/mla_tree_verify/<definition>.json
    workloads/mla_tree_verify/<definition>.jsonl        one workload trace per line
    blob/workloads/mla_tree_verify/<definition>/<definition>_<uuid>.safetensors

One definition per (KV layout, head count, float dtype): the schema fixes an input's dtype and a
const axis's value per definition, and the layout changes what kv_indices mean. What the schema
cannot state (the mask's layout, the two KV layouts, the equalities between lengths) is said in
the definition's description and carried in its tags and constraints; docs/bring-your-own-kernel.md
("FlashInfer Trace") lists it. Nothing here needs flashinfer_bench: the JSON and the safetensors
files are written directly, and the tests read them back with flashinfer_bench's own classes.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import struct
import sys
import uuid
from pathlib import Path, PurePosixPath

import torch

from ..backends import Prepared, Result
from ..case import Case
from ..constants import KV_LORA_RANK, QK_DIM, QK_ROPE_HEAD_DIM, prefix_of
from ..files import publish

OP_TYPE = "mla_tree_verify"
# the argument order of SGLang's extend_attention_fwd, less what the layout implies (causal,
# max_len_extend, k_scale/v_scale), as positional inputs in this order
INPUTS = ("q", "k", "v", "kv_buffer", "qo_indptr", "kv_indptr", "kv_indices", "custom_mask", "mask_indptr",
          "sm_scale", "logit_cap")
OUTPUTS = ("out", "lse")
_DTYPE = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
_DTYPE_BACK = {v: k for k, v in _DTYPE.items()}
# safetensors' dtype codes for what a workload holds
_ST_DTYPE = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int32: "I32",
             torch.bool: "BOOL"}


class TraceError(ValueError):
    """A case that cannot be exported, or a solution file that cannot be used: one line naming the
    file, the field and the fix."""


# ---- the definition ------------------------------------------------------------------------------
def definition_name(num_heads: int, layout: str, dtype: torch.dtype = torch.bfloat16) -> str:
    """mla_tree_verify_h8_ckv512_kpe64 (sglang layout, bf16); _unified and _float16 / _float32
    are added for the other layout and dtypes."""
    name = f"{OP_TYPE}{'_unified' if layout == 'unified' else ''}_h{num_heads}_ckv{KV_LORA_RANK}_kpe{QK_ROPE_HEAD_DIM}"
    return name if dtype == torch.bfloat16 else f"{name}_{_DTYPE[dtype]}"


# The reference FlashInfer-Bench runs (value-returning: `run(*inputs) -> (out, lse)`). Plain
# PyTorch, no kdkit: it must run wherever the definition goes. fp32 arithmetic, out in the input's
# dtype, as FlashInfer's own references do; kdkit's tests judge it against the float64 oracle.
REFERENCE = '''\
import torch

LAYOUT = "{layout}"  # "sglang": kv_indices cover the prefix, the draft K/V come from k and v;
                     # "unified": kv_indices cover prefix + draft, all read from kv_buffer


@torch.no_grad()
def run(q, k, v, kv_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, mask_indptr, sm_scale, logit_cap):
    num_tokens, num_heads, _ = q.shape
    dv = v.shape[-1]  # 512: V is the latent part of each K row (MLA)
    out = torch.zeros(num_tokens, num_heads, dv, dtype=q.dtype, device=q.device)
    lse = torch.full((num_tokens, num_heads), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(qo_indptr.shape[0] - 1):
        qs, qe = int(qo_indptr[b]), int(qo_indptr[b + 1])
        ks, ke = int(kv_indptr[b]), int(kv_indptr[b + 1])
        n = qe - qs
        if n == 0:
            continue
        rows = kv_buffer[kv_indices[ks:ke].long(), 0].float()
        if LAYOUT == "sglang":
            prefix = ke - ks
            keys = torch.cat([rows, k[qs:qe, 0].float()])
            values = torch.cat([rows[:, :dv], v[qs:qe, 0].float()])
        else:
            prefix = ke - ks - n
            keys, values = rows, rows[:, :dv]
        # this request's mask: row-major n x (prefix + n) from mask_indptr[b]; the prefix columns
        # are not read (every row sees the whole prefix), the last n are the tree
        start = int(mask_indptr[b])
        visible = custom_mask[start:start + n * (prefix + n)].reshape(n, prefix + n).bool().clone()
        visible[:, :prefix] = True
        s = torch.einsum("thd,kd->thk", q[qs:qe].float(), keys) * sm_scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        s = s.masked_fill(~visible[:, None, :], float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(m == float("-inf"), torch.zeros_like(m), m)  # a row that sees nothing
        e = torch.exp(s - m)
        den = e.sum(dim=-1, keepdim=True)
        p = torch.where(den > 0, e / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(e))
        out[qs:qe] = torch.einsum("thk,kd->thd", p, values).to(q.dtype)
        lse[qs:qe] = (torch.log(den) + m)[..., 0]  # natural log; -inf where the row sees nothing
    return out, lse
'''


def reference_source(layout: str) -> str:
    return REFERENCE.format(layout=layout)


_LAYOUT_TEXT = {
    "sglang": ("kv_indptr/kv_indices cover only each request's committed prefix (SGLang's TARGET_VERIFY "
               "metadata: prefix = kv_indptr[b+1] - kv_indptr[b]); the draft tokens' K and V are read from "
               "k and v, not from kv_buffer (forward_extend has already written them there too)."),
    "unified": ("kv_indptr/kv_indices cover each request's prefix followed by its q_len draft slots, all read "
                "from kv_buffer (prefix = kv_indptr[b+1] - kv_indptr[b] - q_len); k and v are passed, as "
                "SGLang passes them, but not read."),
}


def definition(num_heads: int, layout: str, dtype: torch.dtype = torch.bfloat16) -> dict:
    """The Definition (a JSON-ready dict, flashinfer_bench.data.Definition's fields)."""
    fdt = _DTYPE[dtype]
    t = lambda shape, dt, what: {"shape": shape, "dtype": dt, "description": what}  # noqa: E731
    return {
        "name": definition_name(num_heads, layout, dtype),
        "op_type": OP_TYPE,
        "description": (
            "MLA tree verify (speculative decoding's target-verify pass, DeepSeek/Kimi MLA with absorbed "
            "weights, one TP rank), as SGLang's Triton backend calls extend_attention_fwd. "
            f"KV layout '{layout}': {_LAYOUT_TEXT[layout]} "
            "Mask: per request b a row-major q_len x (prefix + q_len) block of custom_mask starting at "
            "mask_indptr[b] (mask_indptr has bs+1 entries); its prefix columns are not read (every row sees "
            "the whole prefix, SGLang's skip_prefix_custom_mask), its last q_len columns are the draft tree: "
            "row i sees draft column j where the block is true (itself and its ancestors). A call made "
            "without a mask (causal) is exported with the mask it implies. "
            "Scores: (q . k) * sm_scale over the 576 dims (512 latent, then 64 rope), soft-capped "
            "logit_cap * tanh(s / logit_cap) when logit_cap > 0. lse is the natural-log LSE of those "
            "scores; a row that sees no column has out 0 and lse -inf. kv_buffer is a paged pool of page "
            "size 1 (kdkit's workloads hold the rows the call reads, compacted; row 0 is the scratch slot). "
            "Lengths the axes cannot tie: qo_indptr rises from 0 to num_tokens; kv_indptr ends at "
            "num_kv_indices; mask_indptr[b+1] - mask_indptr[b] = q_len_b * (prefix_b + q_len_b)."),
        "axes": {
            "num_tokens": {"type": "var", "description": "query (draft) tokens of the batch: the sum of q_len"},
            "num_qo_heads": {"type": "const", "value": int(num_heads), "description": "query heads of one TP rank"},
            "num_kv_heads": {"type": "const", "value": 1, "description": "MLA: one latent KV head"},
            "head_dim_qk": {"type": "const", "value": QK_DIM, "description": "512 latent + 64 rope"},
            "head_dim_ckv": {"type": "const", "value": KV_LORA_RANK, "description": "the latent: V, and K's first dims"},
            "head_dim_kpe": {"type": "const", "value": QK_ROPE_HEAD_DIM, "description": "the rope part, K's last dims"},
            "num_kv_rows": {"type": "var", "description": "rows (pages of one token) of the KV pool"},
            "len_indptr": {"type": "var", "description": "batch size + 1"},
            "num_kv_indices": {"type": "var", "description": "entries of kv_indices: kv_indptr[-1]"},
            "mask_len": {"type": "var", "description": "entries of custom_mask"},
        },
        "inputs": {
            "q": t(["num_tokens", "num_qo_heads", "head_dim_qk"], fdt, "queries, latent first then rope"),
            "k": t(["num_tokens", "num_kv_heads", "head_dim_qk"], fdt, "the draft tokens' K rows"),
            "v": t(["num_tokens", "num_kv_heads", "head_dim_ckv"], fdt, "the draft tokens' V rows (K's latent)"),
            "kv_buffer": t(["num_kv_rows", "num_kv_heads", "head_dim_qk"], fdt,
                           "the KV pool: K rows; V is each row's first head_dim_ckv dims"),
            "qo_indptr": t(["len_indptr"], "int32", "request b's tokens are q[qo_indptr[b]:qo_indptr[b+1]]"),
            "kv_indptr": t(["len_indptr"], "int32", "request b's kv_indices are kv_indptr[b]:kv_indptr[b+1]"),
            "kv_indices": t(["num_kv_indices"], "int32", f"pool rows, per request ({layout} layout)"),
            "custom_mask": t(["mask_len"], "bool", "per request a row-major q_len x (prefix + q_len) block"),
            "mask_indptr": t(["len_indptr"], "int32", "start of request b's mask block"),
            "sm_scale": t(None, "float32", "softmax scale (Kimi K2.6: 0.144680)"),
            "logit_cap": t(None, "float32", "tanh soft cap of the scores; 0 for none"),
        },
        "outputs": {
            "out": t(["num_tokens", "num_qo_heads", "head_dim_ckv"], fdt, "attention output"),
            "lse": t(["num_tokens", "num_qo_heads"], "float32", "natural-log LSE of the scaled, capped scores"),
        },
        "reference": reference_source(layout),
        "tags": ["kdkit", "stage:verify", "mask:tree", f"kv_layout:{layout}", "lse:natural_log", "page_size:1"],
        "constraints": ["len_indptr >= 2", "head_dim_qk == head_dim_ckv + head_dim_kpe",
                        "mask_len >= num_tokens"]
                       + (["num_kv_indices >= num_tokens"] if layout == "unified" else []),
    }


# ---- a case as a workload ------------------------------------------------------------------------
def _index(t: torch.Tensor, name: str) -> torch.Tensor:
    """int32, as the definition says: SGLang's int64 indices of a kdkit case fit (the pool is compacted)."""
    if t.numel() and int(t.long().abs().max()) >= 2 ** 31:
        raise TraceError(f"field '{name}': a value >= 2^31 does not fit the definition's int32")
    return t.to(torch.int32).contiguous()


def implied_mask(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """(custom_mask, mask_indptr) of a case without a mask: each request's block with the prefix
    columns true and the draft causal (lower triangle) or, with causal False, all true."""
    qo, kvp = case.qo_indptr.long().tolist(), case.kv_indptr.long().tolist()
    blocks, starts = [], [0]
    for b in range(case.batch_size):
        n = qo[b + 1] - qo[b]
        p = prefix_of(case.layout, kvp[b + 1] - kvp[b], n)
        draft = torch.ones(n, n, dtype=torch.bool)
        blk = torch.cat([torch.ones(n, p, dtype=torch.bool), torch.tril(draft) if case.causal else draft], dim=1)
        blocks.append(blk.reshape(-1))
        starts.append(starts[-1] + blk.numel())
    return torch.cat(blocks) if blocks else torch.zeros(0, dtype=torch.bool), torch.tensor(starts, dtype=torch.int32)


def workload_inputs(case: Case) -> tuple[dict, dict]:
    """(tensors, scalars) of a case, named and typed as the definition's inputs."""
    if case.custom_mask is None:
        mask, mask_indptr = implied_mask(case)
    else:
        mask, mask_indptr = case.custom_mask.bool(), case.mask_indptr
    tensors = {"q": case.q, "k": case.k, "v": case.v, "kv_buffer": case.kv_buffer,
               "qo_indptr": _index(case.qo_indptr, "qo_indptr"), "kv_indptr": _index(case.kv_indptr, "kv_indptr"),
               "kv_indices": _index(case.kv_indices, "kv_indices"), "custom_mask": mask.contiguous(),
               "mask_indptr": _index(mask_indptr, "mask_indptr")}
    return {k: t.contiguous() for k, t in tensors.items()}, {"sm_scale": float(case.sm_scale),
                                                              "logit_cap": float(case.logit_cap)}


def safetensors_bytes(tensors: dict, metadata: dict | None = None) -> bytes:
    """The safetensors file of `tensors` (CPU, contiguous; dtypes in _ST_DTYPE): an 8-byte
    little-endian header length, the JSON header (names, dtypes, shapes, byte ranges; padded with
    spaces to 8 bytes), then the raw little-endian data, in the header's order."""
    header, blobs, at = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _ST_DTYPE[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def _lint_errors(case: Case) -> str:
    from .. import lint  # the marshaling checks: a mis-marshaled case has no defined answer to exchange
    bad = [f for f in lint.check(case) if f.severity == "error"]
    return "; ".join(f"field '{f.field}': {f.message} (fix: {f.fix})" for f in bad[:2])


def _json(obj) -> str:
    return json.dumps(obj, indent=2) + "\n"


def export(directory, cases, *, overwrite: bool = False) -> list[Path]:
    """Write `cases` (Case objects or case-file paths) into the FlashInfer Trace folder `directory`
    and return the files written (a workload's blob also when it was there already: the same bytes
    under the same content-addressed name). A definition already there is kept if it is the same
    and refused (TraceError) if it differs, unless overwrite; a workload already there (same uuid:
    the same inputs) is not added twice; workloads of other cases in the jsonl are kept. Every case
    is checked (loads, lints clean) before anything is written."""
    from ..case import CaseError, load
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise TraceError(f"{root}: not a directory; give the FlashInfer Trace folder to write into")
    try:
        items = [(load(c), str(c)) if not isinstance(c, Case) else (c, c.case_id) for c in cases]
    except CaseError as e:
        raise TraceError(str(e)) from None
    # every case is checked before anything is written: a refusal leaves the folder as it was
    plan = []
    for case, where in items:
        why = _lint_errors(case)
        if why:
            raise TraceError(f"{where}: not exported, the lint finds it mis-marshaled: {why}")
        if case.q.dtype not in _DTYPE:
            raise TraceError(f"{where}: field 'q': dtype {case.q.dtype} has no FlashInfer Trace definition here")
        d = definition(case.num_heads, case.layout, case.q.dtype)
        dpath = root / "definitions" / OP_TYPE / f"{d['name']}.json"
        if dpath.exists() and dpath.read_text() != _json(d) and not overwrite:
            raise TraceError(f"{dpath}: a different definition of {d['name']} is there; nothing was overwritten "
                             "(overwrite=True, or --force, replaces it)")
        plan.append((case, d, dpath))
    written: list[Path] = []
    lines: dict[str, list[str]] = {}
    for case, d, dpath in plan:
        name, text = d["name"], _json(d)
        if not dpath.exists() or dpath.read_text() != text:
            written.append(publish(dpath, text, overwrite=True))
        tensors, scalars = workload_inputs(case)
        meta = {"kdkit_case_id": case.case_id, "kdkit_layout": case.layout, "kdkit_source": case.meta.get("source")}
        blob = safetensors_bytes(tensors, meta)
        wid = str(uuid.UUID(bytes=hashlib.sha256(blob).digest()[:16]))  # the same inputs, the same uuid
        rel = PurePosixPath("blob", "workloads", OP_TYPE, name, f"{name}_{wid}.safetensors")
        written.append(publish(root / rel, blob, exist_ok=True))  # content-addressed: same name, same bytes
        inputs = {k: {"type": "safetensors", "path": str(rel), "tensor_key": k} for k in tensors}
        inputs.update({k: {"type": "scalar", "value": v} for k, v in scalars.items()})
        axes = {"num_tokens": case.num_tokens, "num_kv_rows": int(case.kv_buffer.shape[0]),
                "len_indptr": case.batch_size + 1, "num_kv_indices": int(tensors["kv_indices"].numel()),
                "mask_len": int(tensors["custom_mask"].numel())}
        trace = {"definition": name, "workload": {"axes": axes, "inputs": {k: inputs[k] for k in INPUTS},
                                                   "uuid": wid}}
        lines.setdefault(name, []).append(json.dumps(trace, separators=(",", ":")))
    for name, new in lines.items():
        wpath = root / "workloads" / OP_TYPE / f"{name}.jsonl"
        old = [ln for ln in wpath.read_text().splitlines() if ln.strip()] if wpath.exists() else []
        try:
            have = {json.loads(ln)["workload"]["uuid"] for ln in old}
        except (ValueError, KeyError, TypeError):
            raise TraceError(f"{wpath}: a line is not a workload trace (JSON with workload.uuid); fix or move "
                             "the file, nothing was written to it") from None
        add = []
        for ln in new:
            wid = json.loads(ln)["workload"]["uuid"]
            if wid not in have:
                have.add(wid)
                add.append(ln)
        if add:
            written.append(publish(wpath, "\n".join(old + add) + "\n", overwrite=True))  # old lines kept
    return list(dict.fromkeys(written))


# ---- a solution as a backend ---------------------------------------------------------------------
LANGUAGES = ("python", "triton")
_NOT_LOADED = {
    "cuda": "its entry point is a host function bound through tvm-ffi or a torch extension, built by "
            "FlashInfer-Bench's builders; kdkit's CUDA adapter launches __global__ kernels it is told the "
            "arguments of: declare the kernel with kdkit.byok.cuda.CudaKernel instead",
    "cpp": "a C++ host function needs FlashInfer-Bench's tvm-ffi or torch-extension build",
    "tilelang": "kdkit has no TileLang build",
}


def _field(src, obj, key, typ, what):
    val = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(val, typ) or (isinstance(val, str) and not val.strip()):
        raise TraceError(f"{src}: field '{what}': missing or not a {typ.__name__}; "
                         "a FlashInfer Trace solution has name, definition, author, spec "
                         "(language, target_hardware, entry_point 'file.py::function') and sources [{path, content}]")
    return val


def read_solution(path) -> dict:
    """The solution JSON at `path`, checked for what kdkit uses (TraceError in one line)."""
    src = Path(path)
    try:
        sol = json.loads(src.read_text(encoding="utf-8"))
    except OSError as e:
        raise TraceError(f"{src}: cannot read the solution file: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise TraceError(f"{src}: not JSON ({str(e).splitlines()[0]}); a solution is one JSON object") from None
    for key in ("name", "definition", "author"):
        _field(src, sol, key, str, key)
    spec = _field(src, sol, "spec", dict, "spec")
    lang = _field(src, spec, "language", str, "spec.language")
    entry = _field(src, spec, "entry_point", str, "spec.entry_point")
    if lang not in LANGUAGES:
        why = _NOT_LOADED.get(lang, "not a FlashInfer Trace language")
        raise TraceError(f"{src}: field 'spec.language': {lang!r} is not loaded by kdkit ({why}); "
                         f"kdkit loads {', '.join(LANGUAGES)} solutions")
    if entry.count("::") != 1 or not entry.split("::")[1].isidentifier() or not entry.split("::")[0].endswith(".py"):
        raise TraceError(f"{src}: field 'spec.entry_point': {entry!r}; write it 'file.py::function'")
    dps = spec.get("destination_passing_style", True)  # the schema's default
    if not isinstance(dps, bool):
        raise TraceError(f"{src}: field 'spec.destination_passing_style': {dps!r}; true or false")
    sources = _field(src, sol, "sources", list, "sources")
    seen = set()
    for i, s in enumerate(sources):
        p = _field(src, s, "path", str, f"sources[{i}].path")
        _field(src, s, "content", str, f"sources[{i}].content")
        pp = PurePosixPath(p)
        if pp.is_absolute() or ".." in pp.parts or "\\" in p:
            raise TraceError(f"{src}: field 'sources[{i}].path': {p!r}; a relative path inside the solution "
                             "(no '..', no absolute path)")
        if p in seen:
            raise TraceError(f"{src}: field 'sources[{i}].path': {p!r} twice")
        seen.add(p)
    if entry.split("::")[0] not in seen:
        raise TraceError(f"{src}: field 'spec.entry_point': {entry.split('::')[0]!r} is not among the sources "
                         f"({', '.join(sorted(seen)) or 'none'})")
    if not re.fullmatch(rf"{OP_TYPE}(_unified)?_h\d+_ckv{KV_LORA_RANK}_kpe{QK_ROPE_HEAD_DIM}(_float16|_float32)?",
                        sol["definition"]):
        raise TraceError(f"{src}: field 'definition': {sol['definition']!r} is not an MLA tree-verify definition "
                         f"kdkit exports (e.g. {definition_name(8, 'sglang')}); kdkit runs solutions of those only")
    return sol


def cache_dir() -> Path:
    return Path(os.environ.get("KDKIT_TRACE_CACHE") or Path.home() / ".cache" / "kdkit" / "flashinfer-trace")


class SolutionBackend:
    """A FlashInfer Trace solution (python or triton) as a kdkit backend. Its sources are written to
    a folder named by their hash and imported as one package the first time it runs (a solution is
    code its user chose to run; nothing from a case file is run)."""

    LINT_CLEAN = True  # a user's kernel could read out of bounds on a mis-marshaled case

    def __init__(self, path):
        self.path = Path(path)
        self.solution = read_solution(self.path)
        self.NAME = re.sub(r"\W", "_", self.solution["name"])
        self.language = self.solution["spec"]["language"]
        self.LABEL = f"{self.solution['name']} (FlashInfer Trace, {self.language})"
        self.dps = self.solution["spec"].get("destination_passing_style", True)
        self._fn = None

    def __repr__(self):
        return f"<SolutionBackend {self.NAME}: {self.path}>"

    # what the solution's definition fixes
    def layout_for(self, case: Case) -> str | None:
        """The layout the solution's definition takes this case in, or None if it takes it in none
        (another head count or dtype). Both layouts describe the same call: kdkit converts."""
        for layout in ("sglang", "unified"):
            if definition_name(case.num_heads, layout, case.q.dtype) == self.solution["definition"]:
                return layout
        return None

    def unavailable(self, case=None) -> str | None:
        from importlib.util import find_spec  # look, do not import
        if self.language == "triton":
            if find_spec("triton") is None:
                return f"{self.NAME}: Triton is not installed: `pip install triton` (kdkit's 'triton' extra)"
            if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
                return (f"{self.NAME}: a Triton solution needs a CUDA GPU, or TRITON_INTERPRET=1 set before "
                        "Triton is imported to run it on the CPU")
        if case is not None and self.layout_for(case) is None:
            return (f"{self.NAME}: solves {self.solution['definition']}; this case is "
                    f"{definition_name(case.num_heads, case.layout, case.q.dtype)}")
        return None

    def load(self):
        """Import the solution's entry point (once); TraceError in one line if it does not import."""
        if self._fn is not None:
            return self._fn
        sol = self.solution
        digest = hashlib.sha256(json.dumps([sol["name"], sol["spec"]["entry_point"],
                                            [(s["path"], s["content"]) for s in sol["sources"]]]).encode()).hexdigest()
        pkg = f"kdkit_fit_{digest[:16]}"
        folder = cache_dir() / digest[:32] / pkg
        files = {s["path"]: s["content"] for s in sol["sources"]}
        files.setdefault("__init__.py", "")
        for rel, text in files.items():
            for parent in PurePosixPath(rel).parents:  # every folder of the solution is a package
                if str(parent) != "." and f"{parent}/__init__.py" not in files:
                    publish(folder / parent / "__init__.py", "", exist_ok=True)
            publish(folder / rel, text, exist_ok=True)
        file, func = sol["spec"]["entry_point"].split("::")
        module = ".".join((pkg, *PurePosixPath(file).with_suffix("").parts))
        try:
            if pkg not in sys.modules:
                spec = importlib.util.spec_from_file_location(pkg, folder / "__init__.py",
                                                              submodule_search_locations=[str(folder)])
                mod = importlib.util.module_from_spec(spec)
                sys.modules[pkg] = mod
                spec.loader.exec_module(mod)
            fn = getattr(importlib.import_module(module), func, None)
        except Exception as e:
            sys.modules.pop(pkg, None)
            raise TraceError(f"{self.path}: the solution does not import: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
        if not callable(fn):
            raise TraceError(f"{self.path}: field 'spec.entry_point': {file} defines no function {func!r}")
        self._fn = fn
        return fn

    def _device(self, device: str) -> torch.device:
        if device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(device)

    def _args(self, case: Case, device: str) -> list:
        from ..layout import to_layout
        layout = self.layout_for(case)
        if layout is None:
            raise TraceError(self.unavailable(case))
        tensors, scalars = workload_inputs(to_layout(case, layout) if layout != case.layout else case)
        dev = self._device(device)
        return [tensors[k].to(dev) if k in tensors else scalars[k] for k in INPUTS]

    def _result(self, ret, outs, case: Case, dev) -> Result:
        if self.dps:
            out, lse = outs
        elif isinstance(ret, dict):
            out, lse = ret.get("out"), ret.get("lse")
        elif isinstance(ret, (tuple, list)) and len(ret) == 2:
            out, lse = ret
        else:
            raise TraceError(f"{self.NAME}: returned {type(ret).__name__}; a value-returning solution of this "
                             "definition returns (out, lse)")
        ran = f"{self.NAME} ({self.path.name}, FlashInfer Trace {self.language} solution of " \
              f"{self.solution['definition']}), {dev}"
        return Result(out, lse, {"device": str(dev), "solution": self.solution["name"], "ran": ran})

    def _outputs(self, case: Case, dev):
        return (torch.empty(case.num_tokens, case.num_heads, case.v_head_dim, dtype=case.q.dtype, device=dev),
                torch.empty(case.num_tokens, case.num_heads, dtype=torch.float32, device=dev))

    def run(self, case: Case, *, device: str = "auto") -> Result:
        """Run the solution on the case, converted to its definition's inputs (and layout)."""
        fn = self.load()
        args = self._args(case, device)
        dev = self._device(device)
        outs = self._outputs(case, dev) if self.dps else ()
        with torch.no_grad():
            ret = fn(*args, *outs)
        return self._result(ret, outs, case, dev)

    def prepare(self, case: Case, *, device: str = "auto") -> Prepared:
        """Inputs (and, in destination-passing style, outputs) on the device once; launch calls the
        entry point. A value-returning solution allocates its outputs in every launch."""
        fn = self.load()
        args = self._args(case, device)
        dev = self._device(device)
        outs = self._outputs(case, dev) if self.dps else ()
        last: list = [None]

        def launch():
            last[0] = fn(*args, *outs)

        def result():
            return self._result(last[0], outs, case, dev)
        info = {"ran": f"{self.NAME} (FlashInfer Trace {self.language} solution), {dev}"}
        return Prepared(launch=launch, result=result, graph_safe=False, info=info)


def solution_backend(path) -> SolutionBackend:
    """A FlashInfer Trace solution file (python or triton) as a kdkit backend; TraceError in one line
    for a file that is not one."""
    return SolutionBackend(path)


def reference_solution(defn: dict, name: str | None = None) -> dict:
    """The definition's own reference as a Solution (value-returning python), as FlashInfer-Bench
    builds its baseline: the simplest solution there is, and a check that the loader works."""
    return {"name": name or f"{defn['name']}_reference", "definition": defn["name"], "author": "kdkit",
            "spec": {"language": "python", "target_hardware": ["cpu", "cuda"], "entry_point": "main.py::run",
                     "destination_passing_style": False},
            "sources": [{"path": "main.py", "content": defn["reference"]}],
            "description": "the definition's reference"}


# ---- the command line's part (kdkit export --flashinfer-trace DIR CASES...) -----------------------
def add_arguments(p) -> None:
    p.add_argument("--flashinfer-trace", metavar="DIR", required=True,
                   help="the FlashInfer Trace folder to write (definitions/, workloads/, blob/)")
    p.add_argument("cases", nargs="+", metavar="CASE", help="case files (.pt) and directories of them")
    p.add_argument("--force", action="store_true", help="replace a different definition of the same name")


def export_files(directory, files, force: bool = False, out=print) -> list[Path]:
    """export() of case files, saying what it wrote (one line a file). TraceError (or OSError) in
    one line for what cannot be exported: the CLI prints it and exits 2."""
    written = export(directory, files, overwrite=force)
    for p in written:
        out(str(p))
    out(f"{len(files)} case(s) -> {directory} ({len(written)} file(s) written)")
    return written


__all__ = ["OP_TYPE", "INPUTS", "OUTPUTS", "TraceError", "definition_name", "definition", "reference_source",
           "implied_mask", "workload_inputs", "safetensors_bytes", "export", "read_solution", "SolutionBackend",
           "solution_backend", "reference_solution", "add_arguments", "export_files"]
