"""Case file v1: one self-describing record of one `forward_extend` call.

A case holds the inputs SGLang's MLA attention saw (q, k, v, a compacted KV pool and the index
arrays), its scalars, and optionally the output the live Triton call produced. It is saved as a
plain dict of str/int/float/bool/None/list/dict and CPU tensors, so that
`torch.load(weights_only=True)` can read it: loading a shared case never runs code from it.

Structural checks (names, types, dtypes, ranks, dims, indices inside the pool) happen on load and
raise `CaseError` naming the file and the field. Semantic checks (indptr lengths, mask lengths,
tree shape, the seed's marshaling bugs) belong to `kdkit.lint`, which explains instead of raising.
"""
from __future__ import annotations

import datetime as _dt
import io
import math
import os
import pickle
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from .constants import (FLOAT_DTYPES, INDEX_DTYPES, KV_LORA_RANK, LAYOUTS, MASK_DTYPES,
                        QK_DIM, QK_ROPE_HEAD_DIM, V_HEAD_DIM)
from .files import publish, refuse_if_exists
from .ptfile import CaseError, scan  # CaseError is defined in ptfile: its scan raises it too

FORMAT = "kdkit-case"
SCHEMA_VERSION = 1

META_KEYS = (
    "case_id", "source", "model", "layer_id", "tp_rank", "step", "forward_mode",
    "sglang_version", "torch_version", "gpu", "created", "note",
)
SOURCES = ("captured", "synthetic")


@dataclass
class Case:
    """Inputs of one MLA forward_extend call (one TP rank, one layer).

    Layouts:
      sglang  - kv_indptr/kv_indices cover only the committed prefix; the draft tokens' K/V come
                from `k`/`v` (what SGLang's Triton kernel reads).
      unified - kv_indptr/kv_indices cover prefix + draft slots (prefix + out_cache_loc), all read
                from the pool (what the seed's kernel did).
    `kv_buffer` is the compacted pool: row 0 is the scratch slot, `slot_ids[r]` is the original
    pool slot of row r.
    """

    meta: dict
    num_heads: int
    sm_scale: float
    logit_cap: float
    causal: bool
    layout: str
    q: torch.Tensor            # [T, H, 576]
    k: torch.Tensor            # [T, 1, 576]
    v: torch.Tensor            # [T, 1, 512]
    kv_buffer: torch.Tensor    # [N, 1, 576] latent first, then rope
    kv_indptr: torch.Tensor    # [bs+1]
    kv_indices: torch.Tensor   # [kv_indptr[-1]]
    qo_indptr: torch.Tensor    # [bs+1]
    out_cache_loc: torch.Tensor  # [T] rows of kv_buffer that hold the draft tokens
    prefix_lens: torch.Tensor  # [bs] committed prefix length per request (seq_lens in TARGET_VERIFY)
    slot_ids: torch.Tensor     # [N] original pool slot of each kv_buffer row
    custom_mask: torch.Tensor | None = None  # flat bool/uint8, per request q_len x (prefix+q_len)
    mask_indptr: torch.Tensor | None = None  # [bs+1] start offsets into custom_mask
    ref_out: torch.Tensor | None = None  # [T, H, 512] output of the live Triton call
    ref_lse: torch.Tensor | None = None  # [T, H] its natural-log LSE
    kv_lora_rank: int = KV_LORA_RANK
    qk_rope_head_dim: int = QK_ROPE_HEAD_DIM
    v_head_dim: int = V_HEAD_DIM

    # ---- derived views -------------------------------------------------------------------
    @property
    def qk_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def batch_size(self) -> int:
        return int(self.qo_indptr.numel()) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.q.shape[0])

    @property
    def q_lens(self) -> list[int]:
        return torch.diff(self.qo_indptr.long()).tolist()

    @property
    def v_buffer(self) -> torch.Tensor:
        """The pool's value view: the latent part of each row, as MLATokenToKVPool returns it."""
        return self.kv_buffer[..., : self.v_head_dim]

    @property
    def case_id(self) -> str:
        return str(self.meta.get("case_id") or "case")

    @property
    def label(self) -> str:
        layer = self.meta.get("layer_id")
        return f"L{layer}" if layer is not None else self.case_id

    def clone(self, **changes: Any) -> "Case":
        """A deep copy (tensors cloned), with `changes` applied; backends get clones, never originals."""
        out = {}
        for f in fields(self):
            val = getattr(self, f.name)
            if isinstance(val, torch.Tensor):
                val = val.clone()
            elif isinstance(val, dict):
                val = dict(val)
            out[f.name] = val
        out.update(changes)
        return Case(**out)

    def summary(self) -> str:
        q_lens = self.q_lens
        pl = self.prefix_lens.tolist()
        ql = f"{q_lens[0]}" if len(set(q_lens)) == 1 else f"{min(q_lens)}..{max(q_lens)}"
        pf = f"{pl[0]}" if len(set(pl)) == 1 else f"{min(pl)}..{max(pl)}"
        return (f"{self.case_id}: {self.meta.get('source')} bs={self.batch_size} H={self.num_heads} "
                f"q_len={ql} prefix={pf} layout={self.layout} pool_rows={self.kv_buffer.shape[0]}")

    # ---- (de)serialization ---------------------------------------------------------------
    def to_record(self) -> dict:
        tensors = {}
        for name in TENSOR_FIELDS:
            t = getattr(self, name)
            if t is not None:
                t = t.detach().to("cpu").contiguous()
                # torch.save writes a tensor's whole storage: a view of a larger one (a slice of a
                # live pool) would put all of it in the shared file; saved on its own instead
                if t.storage_offset() or t.untyped_storage().nbytes() != t.numel() * t.element_size():
                    t = t.clone()
                tensors[name] = t
        return {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "meta": {k: _plain(self.meta.get(k), f"meta.{k}") for k in sorted(set(META_KEYS) | set(_str_keys(self.meta)))},
            "params": {
                "num_heads": int(self.num_heads),
                "kv_lora_rank": int(self.kv_lora_rank),
                "qk_rope_head_dim": int(self.qk_rope_head_dim),
                "v_head_dim": int(self.v_head_dim),
                "sm_scale": float(self.sm_scale),
                "logit_cap": float(self.logit_cap),
                "causal": bool(self.causal),
                "layout": self.layout,
            },
            "tensors": tensors,
        }

    def to_bytes(self, path: str | os.PathLike = "<case>") -> bytes:
        """The case file's bytes (torch.save of the record), checked exactly as load() will check
        them: the record first, then the bytes themselves, read back as load() reads a file (a
        meta integer of thousands of digits pickles to an opcode the safe loader refuses: such a
        file would be written and then never load). `path` names the file in the error."""
        path = Path(path)
        record = self.to_record()
        from_record(record, path)
        buf = io.BytesIO()
        torch.save(record, buf)
        data = buf.getvalue()
        scan(path, data=data)
        from_record(_safe_load(io.BytesIO(data), path), path)
        return data

    def save(self, path: str | os.PathLike, overwrite: bool = False, data: bytes | None = None) -> Path:
        """Write atomically (kdkit.files.publish: temp file, fsync, then the final name); never
        replace an existing file unless overwrite=True. `data`: this case's to_bytes(), if the
        caller already has them (the capture writer sizes them against its budget first)."""
        path = Path(path)
        if not overwrite:
            refuse_if_exists(path)  # before the work of serialising
        # serialised in memory, written by publish's own file write: a disk error is an OSError
        # with its errno (ENOSPC, EFBIG, ...), which torch's zip writer would turn into a
        # RuntimeError without one
        return publish(path, self.to_bytes(path) if data is None else data, overwrite=overwrite)


def _str_keys(meta: dict) -> dict:
    """meta itself, refused (CaseError) if a key is not a string: the file's meta keys are."""
    bad = [k for k in meta if not isinstance(k, str)]
    if bad:
        raise CaseError("meta", f"key {bad[0]!r} ({type(bad[0]).__name__}): meta keys are strings")
    return meta


def _plain(v, where: str = "meta"):
    """Meta values as plain data only (weights_only loads nothing else). A nested dict's keys
    become strings; two that become the same string are refused, not merged."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 1 << 63:
        return str(v)  # (pickled, an integer this long takes an opcode the safe loader refuses)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x, f"{where}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, dict):
        out, first = {}, {}
        for k, x in v.items():
            if str(k) in out:
                raise CaseError(where, f"keys {first[str(k)]!r} and {k!r} both become {str(k)!r} in the file; "
                                "rename one")
            first[str(k)] = k
            out[str(k)] = _plain(x, f"{where}.{k}")
        return out
    return str(v)


TENSOR_FIELDS = ("q", "k", "v", "kv_buffer", "kv_indptr", "kv_indices", "qo_indptr",
                 "out_cache_loc", "prefix_lens", "slot_ids", "custom_mask", "mask_indptr",
                 "ref_out", "ref_lse")
OPTIONAL_TENSORS = ("custom_mask", "mask_indptr", "ref_out", "ref_lse")
PARAM_TYPES = {"num_heads": int, "kv_lora_rank": int, "qk_rope_head_dim": int, "v_head_dim": int,
               "sm_scale": float, "logit_cap": float, "causal": bool, "layout": str}


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def new_meta(source: str, **kw: Any) -> dict:
    meta = {k: None for k in META_KEYS}
    meta.update(source=source, created=now(), torch_version=str(torch.__version__), note="")
    meta.update(kw)
    return meta


# ---- validation --------------------------------------------------------------------------
MAX_ELEMENTS = 1 << 34  # 16 G elements: far above any real call, below what a forged size allocates


def _check_tensor(path, name, t, dtypes, ndim, fix):
    if not isinstance(t, torch.Tensor):
        raise CaseError(name, f"expected a tensor, got {type(t).__name__}. {fix}", path)
    # a forged file can hold sparse tensors or stride-0 views that claim billions of elements
    if t.layout != torch.strided or not t.is_contiguous() or t.numel() > MAX_ELEMENTS:
        raise CaseError(name, f"not a dense contiguous tensor of sane size (layout {t.layout}, shape "
                        f"{tuple(t.shape)}, strides {t.stride() if t.layout == torch.strided else '-'}); "
                        "kdkit saves dense CPU tensors: re-save the case with Case.save", path)
    if t.dtype not in dtypes:
        want = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise CaseError(name, f"dtype {str(t.dtype).replace('torch.', '')} not allowed (want {want}). {fix}", path)
    if t.dim() != ndim:
        raise CaseError(name, f"expected {ndim}-D, got shape {tuple(t.shape)}. {fix}", path)


def _check_range(path, name, t, lo, hi, what):
    if t.numel() == 0:
        return
    bad = (t.long() < lo) | (t.long() >= hi)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise CaseError(name, f"{name}[{i}] = {int(t[i])} is outside {what} [{lo}, {hi}); "
                              "the file is corrupt or was captured from a different pool", path)


def validate(case: Case, path=None) -> None:
    """Structural checks every consumer relies on; raise CaseError on the first breach."""
    if case.layout not in LAYOUTS:
        raise CaseError("layout", f"{case.layout!r} is not one of {LAYOUTS}", path)
    if not isinstance(case.meta, dict) or case.meta.get("source") not in SOURCES:
        raise CaseError("meta.source", f"must be one of {SOURCES}", path)
    for name, typ in PARAM_TYPES.items():
        val = getattr(case, name)
        if typ is float and isinstance(val, int) and not isinstance(val, bool):
            try:
                val = float(val)
            except OverflowError:
                raise CaseError(name, f"{str(val)[:20]}... ({len(str(val))} digits) is out of a float's range", path) from None
        if not isinstance(val, typ) or (typ is int and isinstance(val, bool)):
            raise CaseError(name, f"expected {typ.__name__}, got {type(val).__name__}", path)
    H, Dl, Dr, Dv = case.num_heads, case.kv_lora_rank, case.qk_rope_head_dim, case.v_head_dim
    if not 1 <= H <= 1024:
        raise CaseError("num_heads", f"{H} is not a head count (1..1024)", path)
    if Dv != Dl:
        raise CaseError("v_head_dim", f"MLA reads values from the latent: v_head_dim {Dv} must equal kv_lora_rank {Dl}", path)
    if not (case.sm_scale > 0 and case.sm_scale < 1e4):  # also refuses NaN
        raise CaseError("sm_scale", f"{case.sm_scale} is not a softmax scale: want 0 < sm_scale < 1e4 (Kimi K2.6: 0.144680)", path)
    if not math.isfinite(case.logit_cap) or case.logit_cap < 0:
        raise CaseError("logit_cap", f"{case.logit_cap} must be finite and >= 0; use 0.0 for no cap", path)
    D = Dl + Dr
    fix_f = "Store it as captured from forward_extend (bf16 on the GPU), moved to the CPU."
    _check_tensor(path, "q", case.q, FLOAT_DTYPES, 3, fix_f)
    _check_tensor(path, "k", case.k, FLOAT_DTYPES, 3, fix_f)
    _check_tensor(path, "v", case.v, FLOAT_DTYPES, 3, fix_f)
    _check_tensor(path, "kv_buffer", case.kv_buffer, FLOAT_DTYPES, 3, fix_f)
    T = case.q.shape[0]
    for name, t, shape in (("q", case.q, (T, H, D)), ("k", case.k, (T, 1, D)), ("v", case.v, (T, 1, Dv))):
        if tuple(t.shape) != shape:
            raise CaseError(name, f"shape {tuple(t.shape)}, expected {shape} (T={T}, H={H}, {D} = {Dl}+{Dr})", path)
    if tuple(case.kv_buffer.shape[1:]) != (1, D) or case.kv_buffer.shape[0] < 1:
        raise CaseError("kv_buffer", f"shape {tuple(case.kv_buffer.shape)}, expected [N>=1, 1, {D}]", path)
    fix_i = "Index arrays are int32 or int64, 1-D."
    for name in ("kv_indptr", "kv_indices", "qo_indptr", "out_cache_loc", "prefix_lens", "slot_ids"):
        _check_tensor(path, name, getattr(case, name), INDEX_DTYPES, 1, fix_i)
    if case.qo_indptr.numel() < 2:
        raise CaseError("qo_indptr", "needs bs+1 >= 2 entries", path)
    qo = case.qo_indptr.long()
    if int(qo[0]) != 0 or int(qo[-1]) != T or bool((torch.diff(qo) < 0).any()):
        raise CaseError("qo_indptr", f"{qo.tolist()[:8]}... must rise from 0 to T={T}", path)
    bs = qo.numel() - 1
    if case.prefix_lens.numel() != bs:
        raise CaseError("prefix_lens", f"{case.prefix_lens.numel()} entries for bs={bs}", path)
    if bool((case.prefix_lens < 0).any()):
        raise CaseError("prefix_lens", "negative prefix length", path)
    if case.out_cache_loc.numel() != T:
        raise CaseError("out_cache_loc", f"{case.out_cache_loc.numel()} entries for T={T} tokens", path)
    N = case.kv_buffer.shape[0]
    if case.slot_ids.numel() != N:
        raise CaseError("slot_ids", f"{case.slot_ids.numel()} entries for {N} kv_buffer rows", path)
    kvp = case.kv_indptr.long()
    if kvp.numel() < 1 or int(kvp[0]) != 0 or bool((torch.diff(kvp) < 0).any()) or int(kvp[-1]) > case.kv_indices.numel():
        raise CaseError("kv_indptr", f"must rise from 0 and end within kv_indices ({case.kv_indices.numel()})", path)
    _check_range(path, "kv_indices", case.kv_indices, 0, N, "kv_buffer rows")
    _check_range(path, "out_cache_loc", case.out_cache_loc, 0, N, "kv_buffer rows")
    if (case.custom_mask is None) != (case.mask_indptr is None):
        raise CaseError("mask_indptr", "custom_mask and mask_indptr come together (both or neither)", path)
    if case.custom_mask is not None:
        _check_tensor(path, "custom_mask", case.custom_mask, MASK_DTYPES, 1,
                      "Store the flat mask as SGLang builds it (bool, or uint8 from the CUDA-graph buffer).")
        _check_tensor(path, "mask_indptr", case.mask_indptr, INDEX_DTYPES, 1, fix_i)
        _check_range(path, "mask_indptr", case.mask_indptr, 0, case.custom_mask.numel() + 1, "custom_mask offsets")
    if case.ref_out is not None:
        _check_tensor(path, "ref_out", case.ref_out, FLOAT_DTYPES, 3, fix_f)
        if tuple(case.ref_out.shape) != (T, H, Dv):
            raise CaseError("ref_out", f"shape {tuple(case.ref_out.shape)}, expected {(T, H, Dv)}", path)
    if case.ref_lse is not None:
        _check_tensor(path, "ref_lse", case.ref_lse, (torch.float32, torch.float64), 2, "LSE is fp32 [T, H].")
        if tuple(case.ref_lse.shape) != (T, H):
            raise CaseError("ref_lse", f"shape {tuple(case.ref_lse.shape)}, expected {(T, H)}", path)


# ---- loading -----------------------------------------------------------------------------
RECORD_KEYS = ("format", "schema_version", "meta", "params", "tensors")


# meta items _check_plain visits at most: a forged file can share one list at every level, which
# is few bytes and fanout^depth visits (40^7 took longer than anyone waits)
META_ITEMS = 100_000


def _check_plain(v, field: str, path, depth: int = 0, seen: list | None = None) -> None:
    """Meta is plain data (as _plain writes it): a tensor or another object there is a forged or
    broken file, refused here before anything tests its truth or formats it."""
    seen = [0] if seen is None else seen
    seen[0] += 1
    if seen[0] > META_ITEMS:
        raise CaseError(field, f"meta holds more than {META_ITEMS} items (a case's meta is a few dozen); "
                        "the file is forged or broken", path)
    if v is None or isinstance(v, (bool, int, float, str)):
        return
    if isinstance(v, (list, tuple, dict)) and depth < 8:
        items = v.items() if isinstance(v, dict) else enumerate(v)
        for k, x in items:
            if isinstance(v, dict) and not isinstance(k, str):
                raise CaseError(field, f"a key of type {type(k).__name__}; meta keys are strings", path)
            _check_plain(x, f"{field}.{k}" if isinstance(v, dict) else f"{field}[{k}]", path, depth + 1, seen)
        return
    raise CaseError(field, f"a {type(v).__name__} where meta holds plain data (str, number, bool, None, "
                    "lists and dicts of them, 8 levels at most); re-save the case with Case.save", path)


def from_record(rec: Any, path=None) -> Case:
    if not isinstance(rec, dict) or not isinstance(rec.get("format"), str) or rec.get("format") != FORMAT:
        raise CaseError("format", "not a kdkit case file (no format='kdkit-case' header)", path)
    ver = rec.get("schema_version")
    if type(ver) is not int or ver != SCHEMA_VERSION:
        raise CaseError("schema_version", f"version {ver!r}; this kdkit reads version {SCHEMA_VERSION}. "
                        "Upgrade kdkit, or re-save the case with the kdkit that wrote it", path)
    for part in ("meta", "params", "tensors"):
        if not isinstance(rec.get(part), dict):
            raise CaseError(part, "missing or not a dict", path)
    params, tensors = rec["params"], rec["tensors"]
    # what a v1 reader does not know would be dropped by the next save: refused instead, as
    # unknown tensors are (a newer kdkit's file carries a newer schema_version)
    for where, have, known in (("", rec, RECORD_KEYS), ("params.", params, PARAM_TYPES)):
        unknown = sorted(map(str, set(have) - set(known)))
        if unknown:
            raise CaseError(where + unknown[0], f"unknown {'parameter' if where else 'part'} in a v1 case "
                            f"(known: {', '.join(known)}); it would be lost on the next save", path)
    _check_plain(rec["meta"], "meta", path)
    kw: dict[str, Any] = {"meta": dict(rec["meta"])}
    for name in PARAM_TYPES:
        if name not in params:
            raise CaseError(name, "missing from params", path)
        kw[name] = params[name]
    for name in TENSOR_FIELDS:
        if name not in tensors:
            if name in OPTIONAL_TENSORS:
                kw[name] = None
                continue
            raise CaseError(name, "missing from tensors", path)
        kw[name] = tensors[name]
    unknown = set(tensors) - set(TENSOR_FIELDS)
    if unknown:
        raise CaseError(sorted(map(str, unknown))[0], "unknown tensor in a v1 case", path)
    case = Case(**kw)
    validate(case, path)
    return case


def _why(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if "Unsupported global" in ln or "Unpickler error" in ln]
    return (lines[0] if lines else str(e).splitlines()[0])[:300]


def _first_nonfinite(t: torch.Tensor):
    """Index (tuple) of the first NaN/inf entry of a float tensor, or None; bounded memory."""
    flat = t.reshape(-1)
    for s in range(0, flat.numel(), 1 << 22):
        bad = ~torch.isfinite(flat[s: s + (1 << 22)].float())
        if bool(bad.any()):
            i = s + int(bad.nonzero()[0, 0])
            return tuple(int(x) for x in torch.unravel_index(torch.tensor(i), tuple(t.shape)))
    return None


def check_values(case: Case, path=None) -> None:
    """What a shared file must also satisfy beyond its structure (checked on load, not on save, so
    that a capture of a broken server is still written): one float dtype for q, k, v and the pool,
    and no NaN/inf in anything the kernel reads (q; k, v in the sglang layout; the pool rows
    kv_indices names)."""
    kinds = {n: getattr(case, n).dtype for n in ("q", "k", "v", "kv_buffer")}
    if len(set(kinds.values())) > 1:
        shown = ", ".join(f"{n} {str(d).replace('torch.', '')}" for n, d in kinds.items())
        common = max(set(kinds.values()), key=list(kinds.values()).count)
        odd = next(n for n, d in kinds.items() if d != common)
        raise CaseError(odd, f"mixed dtypes ({shown}): one forward_extend call has one dtype; the file was "
                        "assembled from different captures or edited", path)
    read = [("q", case.q)] + ([("k", case.k), ("v", case.v)] if case.layout == "sglang" else [])
    rows = torch.unique(case.kv_indices.long()) if case.kv_indices.numel() else None
    if rows is not None:
        read.append(("kv_buffer", case.kv_buffer[rows]))
    for name, t in read:
        at = _first_nonfinite(t)
        if at is not None:
            where = (f"pool row {int(rows[at[0]])} (read through kv_indices), dim {at[-1]}" if name == "kv_buffer"
                     else f"token {at[0]}, {'head ' + str(at[1]) + ', ' if name == 'q' else ''}dim {at[-1]}")
            raise CaseError(name, f"NaN/inf at {where}: the kernel would read it and no answer is defined. "
                            "To look at such a capture anyway: `kdkit inspect --allow-nonfinite PATH`, or "
                            "kdkit.case.load(path, allow_nonfinite=True) (the lint then names every bad row)", path)


def load(path: str | os.PathLike, allow_nonfinite: bool = False) -> Case:
    """Load and validate a case; weights_only=True, CPU, so no code from the file ever runs.
    The zip directory and the pickle are checked first (kdkit.ptfile: no zip bombs, no forged
    sizes), then the structure (validate), then the values (check_values; allow_nonfinite=True
    skips its NaN/inf part, to inspect a broken capture)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: a directory; give one case file (.pt) in it")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such case file")
    with open(path, "rb") as fh:
        head = fh.read(4)
    # torch.save writes a zip (PK..), older torch a pickle (protocol byte 0x80): anything else is
    # some other file, and should not be reported as a pickle the safe loader refused
    if not (head.startswith(b"PK") or head.startswith(b"\x80")):
        raise CaseError("<file>", f"cannot be read as a torch file (truncated or not a .pt?): it starts "
                        f"with {head!r}, not a zip (torch.save) or a pickle", path)
    if head.startswith(b"\x80"):
        # the pre-1.6 torch format (or a bare pickle): its storages' sizes cannot be checked before
        # torch allocates them, so it is not read at all
        raise CaseError("<file>", "a bare pickle (torch.save's format before torch 1.6, or not a torch file): "
                        "kdkit reads only the zip format, whose sizes are checked before anything is read; "
                        "re-save it with Case.save. Not loaded, nothing from it ran", path)
    scan(path)  # the zip directory and the pickle, checked before torch reads them
    case = from_record(_safe_load(path, path), path)
    if allow_nonfinite:
        kinds = {getattr(case, n).dtype for n in ("q", "k", "v", "kv_buffer")}
        if len(kinds) > 1:
            check_values(case, path)  # mixed dtypes are refused either way
        return case
    check_values(case, path)
    return case


def _safe_load(source, path) -> Any:
    """torch.load(weights_only=True) of a scanned file (or its bytes), its failures as CaseError."""
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # weights_only refuses any global it does not know: a pickle that would run code lands here
        raise CaseError("<pickle>", f"refused by the safe loader (weights_only=True); the file holds "
                        f"objects other than plain data and tensors, so it was not loaded: {_why(e)}", path) from None
    except Exception as e:  # garbage bytes fail in many ways (EOFError, BadZipFile, IndexError, ...)
        first = (str(e).splitlines() or [""])[0]
        raise CaseError("<file>", f"cannot be read as a torch file (truncated or not a .pt?): "
                        f"{type(e).__name__}: {first}", path) from None



class NoCaseFiles(ValueError):
    """A path given for case files that names none: not there, unreadable, or a folder without *.pt."""


def case_files(paths: str | os.PathLike | list, empty_ok: bool = False) -> list[Path]:
    """The case files named by `paths` (one path or a list), in order, each once: a file as given, a
    folder as the *.pt files under it (sorted). A link to nowhere is listed too, so that loading it
    says why it cannot be read instead of it being skipped in silence. NoCaseFiles, naming the
    path, for one that is not there, a folder this user cannot read (rglob would skip it silently)
    or, unless empty_ok, a folder that holds no case file. The CLI and the notebooks both list
    case files with this."""
    files = []
    for p in map(Path, [paths] if isinstance(paths, (str, os.PathLike)) else paths):
        if p.is_dir():
            if not os.access(p, os.R_OK | os.X_OK):
                raise NoCaseFiles(f"{p}: a directory this user cannot read")
            found = sorted(f for f in p.rglob("*.pt") if f.is_file() or (f.is_symlink() and not f.exists()))
            if not found and not empty_ok:
                raise NoCaseFiles(f"{p}: a directory with no case files (*.pt) in it")
            files += found
        elif p.exists():
            files.append(p)
        else:
            raise NoCaseFiles(f"{p}: no such file or directory")
    return list(dict.fromkeys(files))


__all__ = ["Case", "CaseError", "NoCaseFiles", "case_files", "load", "validate", "from_record", "new_meta", "replace",
           "SCHEMA_VERSION", "LAYOUTS", "field"]
