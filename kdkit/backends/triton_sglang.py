"""SGLang's own Triton extend-attention kernel (the production path), called as forward_extend does.

The kernel is loaded by kdkit.sglang_source from $KDKIT_SGLANG_SRC or an installed sglang,
without importing the sglang package. On a machine with CUDA it runs compiled on the GPU; without
one it runs on the CPU under Triton's interpreter (TRITON_INTERPRET=1), which is slow: keep such
cases small (a few hundred KV rows, q_len <= ~65, H <= 8).

The call mirrors `TritonAttnBackend.forward_extend` (sglang/srt/layers/attention/triton_backend.py)
for an MLA layer in TARGET_VERIFY, as read in the 0.5.15.post1 and 0.5.23 wheels (0.5.10, 0.5.16
and 0.5.19 agree on everything used here):
  * q.view(-1, H, 576), k.contiguous(), v.contiguous(), o = [T, H*512].view(-1, H, 512)
  * k_buffer = get_key_buffer(layer) (the whole [N, 1, 576] pool), v_buffer = get_value_buffer,
    which MLATokenToKVPool returns as the strided latent view kv_buffer[..., :512]
  * qo_indptr, kv_indptr, kv_indices (prefix only), custom_mask, mask_indptr from forward_metadata
  * causal: `causal = True` unless the layer is cross-attention, encoder-only or bidirectional,
    so MLA decoder layers pass True in both releases (the case records it in `case.causal`)
  * max_len_extend = forward_metadata.max_extend_len = num_draft_tokens (q_len) in TARGET_VERIFY;
    kdkit passes max(q_lens), the same for uniform batches and what the grid needs for ragged ones
  * k_scale = v_scale = 1.0 (layer.k_scale is None for bf16 KV), sm_scale = layer.scaling,
    logit_cap = logits_soft_cap, sliding_window_size = -1, sinks = None, window_kv_offsets = None,
    xai_temperature_len = layer.xai_temperature_len (RadixAttention's default -1; only Grok sets it),
    page_size = self.page_size where the release takes it (>= 0.5.15): kdkit passes 1, since the
    case's compacted pool is a 3-D [N, 1, 576] buffer indexed by token slot (with a 3-D buffer
    the kernel's page math reduces to slot addressing whatever the page size; 0.5.15 _extract_kv_strides),
    and on 0.5.19+ extend_seq_lens_cpu (read only by the HIP compact-grid path; kdkit passes q_lens)
  * skip_prefix_custom_mask is not passed: the release's default (True) applies
  * lse_extend is NOT passed by forward_extend; kdkit adds it where the release has it (>= 0.5.15)
    to read the LSE back. It only adds a store at the end of the kernel; the output is unchanged.
"""
from __future__ import annotations

import importlib.util
import warnings

import torch

from .. import sglang_source  # imports no triton: the interpreter switch must come first
from ..case import CaseError
from ..constants import prefix_of
from ..layout import to_sglang
from . import BackendUnavailable, Prepared, Result

NAME = "triton_sglang"
LABEL = "SGLang Triton extend"


def unavailable(case=None) -> str | None:
    """Looks only: imports no triton, loads no kernel file, sets no environment variable (run does
    that). A kernel file that imports something kdkit cannot stand in for fails in run, by name."""
    why = sglang_source.triton_problem()
    if why:
        return f"{NAME}: {why}"
    try:
        sglang_source.locate()
    except sglang_source.SourceNotFound as e:
        return f"{NAME}: {e}"
    if importlib.util.find_spec("triton") is None:
        return (f"{NAME}: triton is not installed; `pip install 'triton>=3.7'` (the CPU interpreter "
                "needs it too; triton <= 3.6 runs it only with numpy < 2.4)")
    return None


INT32_MAX = 2**31 - 1


def kv_indices_dtype(dtype: torch.dtype, pool_elems: int) -> torch.dtype:
    """The dtype to hand Triton the pool's row indices in. The kernel computes a row's offset as
    index x row stride in the index's own dtype, so with int32 indices a pool of more than 2^31
    elements (3.7M rows of 576, e.g. 32 requests of 128K) wraps to a negative offset and faults
    (seen on the H200: an illegal address at 32 x 131072). Widening them keeps every value."""
    return torch.int64 if dtype == torch.int32 and pool_elems > INT32_MAX else dtype


def _check_launchable(case) -> None:
    """Guards against out-of-bounds reads: Triton does not check indices, and a case whose mask
    is too short would make the GPU read past the buffer (garbage, or a fault). The seed's
    marshaling bugs that stay in bounds are replayed as production would run them; kdkit.lint
    explains those."""
    bs = case.batch_size
    if case.kv_indptr.numel() != bs + 1:
        raise CaseError("kv_indptr", f"{case.kv_indptr.numel()} entries for bs={bs}; the kernel reads "
                        "bs+1 (start and end of each request's prefix)")
    # (a case built in memory has not been through case.load's checks: the pool indices are
    # Triton's addresses, out of range they read outside the pool or fault)
    kvp_end = int(case.kv_indptr[-1])  # (bs + 1 entries: checked above)
    if kvp_end > case.kv_indices.numel():
        raise CaseError("kv_indptr", f"ends at {kvp_end}, past kv_indices ({case.kv_indices.numel()} entries)")
    used = case.kv_indices[:kvp_end]
    rows = case.kv_buffer.shape[0]
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= rows):
        raise CaseError("kv_indices", f"slots {int(used.min())}..{int(used.max())} for a pool of {rows} rows; "
                        "the kernel would read outside the pool")
    if case.custom_mask is None:
        return
    if case.mask_indptr.numel() < bs:
        raise CaseError("mask_indptr", f"{case.mask_indptr.numel()} entries for bs={bs}; the kernel reads "
                        "one start offset per request (SGLang keeps bs+1: mask_indptr[:bs+1])")
    kvp, qo, mip = (t.long().tolist() for t in (case.kv_indptr, case.qo_indptr, case.mask_indptr))
    n_mask = case.custom_mask.numel()
    for b in range(bs):
        q_len = qo[b + 1] - qo[b]
        prefix = prefix_of("sglang", kvp[b + 1] - kvp[b], q_len)  # the case is in the sglang layout here
        need = mip[b] + q_len * (prefix + q_len)
        if need > n_mask:
            raise CaseError("custom_mask", f"request {b} reads mask[{mip[b]}:{need}] "
                            f"({q_len} x ({prefix}+{q_len})) but the mask has {n_mask} entries; the "
                            "kernel would read out of bounds. Run `kdkit inspect` on the case: the "
                            "mask, mask_indptr or kv_indptr was marshaled wrongly")


def run(case, *, with_lse: bool = True) -> Result:
    """Run SGLang's extend_attention_fwd on `case` (never mutated).

    Options: with_lse (default True): also read the LSE where the release supports lse_extend.
    Returns Result(out [T, H, 512] bf16 on the device it ran on, lse [T, H] fp32 or None, info).
    """
    p = prepare(case, with_lse=with_lse)
    p.launch()
    return p.result()


class RunDevice:
    """Where SGLang's Triton kernels run here, and device copies of a case's tensors for them: the
    GPU, else the CPU under Triton's interpreter. Triton's interpreter cannot tl.dot bfloat16: it
    keeps bf16 as uint16 and multiplies the bit patterns (triton-lang/triton#11584, closed as "not
    supported yet"; seen in 3.9.0). So under the interpreter bf16 inputs are widened to fp32
    (exact); the kernel then computes in fp32 and does not round P to bf16 before P @ V as it does
    on a GPU. `output(o)` rounds the output back to the case's dtype."""

    def __init__(self, case):
        self.interpret = sglang_source.interpreting()
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = case.q.dtype
        self.widen = self.interpret and any(t.dtype == torch.bfloat16 for t in (case.q, case.k, case.v, case.kv_buffer))

    def __call__(self, t):  # a copy on the run device: the kernel never touches the case
        if t is None:
            return None
        if self.widen and t.dtype == torch.bfloat16:
            return t.to(device=self.device, dtype=torch.float32)
        return t.to(self.device, copy=True)

    def output(self, o):
        return o.to(self.dtype) if self.widen else o

    def sync(self) -> None:
        if self.device.type == "cuda" and not self.interpret:
            torch.cuda.synchronize()

    @property
    def name(self) -> str:
        return torch.cuda.get_device_name() if self.device.type == "cuda" else "cpu"

    def note(self) -> str:
        return ("no CUDA device: ran on the CPU under Triton's interpreter (TRITON_INTERPRET=1, "
                "set by kdkit before the kernel module was loaded); numerics follow NumPy, "
                "not the GPU's tensor cores"
                + ("; bf16 inputs widened to fp32 (the interpreter cannot tl.dot bf16), so P "
                   "is not rounded to bf16 and only the output is" if self.widen else ""))


def prepare(case, *, with_lse: bool = True) -> Prepared:
    """The call, ready to launch: the kernel's inputs and outputs are device copies made here
    (the benchmark times launch() alone); result() is the last launch's output (rounded back to
    bf16 where it was widened for the interpreter), waited for."""
    with_lse = bool(with_lse)
    why = sglang_source.prepare_triton()  # must come before the first import of triton below
    if why:
        raise BackendUnavailable(f"{NAME}: {why}")
    import triton

    src = sglang_source.locate()
    mod = sglang_source.load_extend(src)
    fwd = mod.extend_attention_fwd
    params = sglang_source.kernel_params(fwd)

    # Triton reads the draft K/V from k/v and only the prefix through kv_indices: the sglang layout
    case = to_sglang(case) if case.layout == "unified" else case
    _check_launchable(case)
    dev = RunDevice(case)
    interpret, device = dev.interpret, dev.device
    H, Dv = case.num_heads, case.v_head_dim
    T = case.num_tokens

    q = dev(case.q).view(-1, H, case.qk_dim)
    k, v = dev(case.k).contiguous(), dev(case.v).contiguous()
    kv_buffer = dev(case.kv_buffer)                 # get_key_buffer: [N, 1, 576]
    v_buffer = kv_buffer[..., :Dv]                  # get_value_buffer: strided latent view
    o = q.new_empty((T, H * Dv)).view(-1, H, Dv)
    max_len_extend = max(case.q_lens) if T else 0

    kwargs = dict(logit_cap=float(case.logit_cap), sliding_window_size=-1, sinks=None,
                  window_kv_offsets=None, xai_temperature_len=-1)
    if "page_size" in params:
        kwargs["page_size"] = 1
    if "extend_seq_lens_cpu" in params:
        kwargs["extend_seq_lens_cpu"] = case.q_lens
    lse = None
    if with_lse and "lse_extend" in params:
        lse = torch.empty((T, H), dtype=torch.float32, device=device)
        kwargs["lse_extend"] = lse

    kv_indices = dev(case.kv_indices).to(kv_indices_dtype(case.kv_indices.dtype, case.kv_buffer.numel()))
    meta = (dev(case.qo_indptr), dev(case.kv_indptr), kv_indices, dev(case.custom_mask),
            bool(case.causal), dev(case.mask_indptr), max_len_extend)

    def launch():
        if not T:
            return
        with warnings.catch_warnings():
            if interpret:  # NumPy warns about the padding rows of a block (log(0), 0/0); the GPU
                warnings.simplefilter("ignore", RuntimeWarning)  # computes them silently too
            fwd(q, k, v, o, kv_buffer, v_buffer, *meta, 1.0, 1.0, float(case.sm_scale), **kwargs)

    info = {
        "sglang_release": src.release,
        "device": dev.name,
        "interpreter": interpret,
        "module": str(src.module_path),
        "source": src.origin,
        "layout": src.layout,
        "triton": triton.__version__,
        "causal": bool(case.causal),
        "max_len_extend": max_len_extend,
        "skip_prefix_custom_mask": params.get("skip_prefix_custom_mask"),
        "lse": "lse_extend" if lse is not None else
               ("not requested" if not with_lse else f"release {src.release} has no lse_extend"),
    }
    info["ran"] = (f"SGLang {src.release} ({src.origin}), triton {triton.__version__} "
                   f"on {info['device']}" + (" under TRITON_INTERPRET=1" if interpret else ""))
    if interpret:
        info["note"] = dev.note()
    info["compute_dtype"] = "float32 (widened from bfloat16)" if dev.widen else str(q.dtype).replace("torch.", "")
    unknown = sglang_source.unknown_env_switches(mod)
    if unknown:
        info["unknown_env_switches"] = unknown

    def result() -> Result:
        dev.sync()
        return Result(out=dev.output(o), lse=lse, info=info)
    # graph-safe: the launch reads no device value on the host (SGLang captures this call in its
    # target-verify CUDA graphs); the first launch, outside a capture, compiles the kernel
    return Prepared(launch, result, graph_safe=not interpret, info=info)
