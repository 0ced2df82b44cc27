"""From one kernel call inside forward_extend to a case file.

`KernelCall` names the arguments forward_extend passed to `extend_attention_fwd` (the kernel sees
exactly these: q [T, H, 576], k [T, 1, 576], v [T, 1, 512], the output o [T, H, 512], the layer's
pool with this step's K already written at out_cache_loc, and the batch's index arrays).

`snapshot` runs on the server's thread right after the real kernel: on the device it gathers the
pool rows the call references (row 0, the prefix through kv_indices, the draft at out_cache_loc)
and queues copies of them and of the small tensors into pinned host memory, then records an event.
No host sync: the server's stream carries one device-to-host copy per tensor, nothing waits for
it. The sizes come from the host (seq_lens_sum, T, bs); only a batch without seq_lens_sum makes it
read kv_indptr[bs] back (one small sync, said once).

`build_case` runs on the writer thread: it waits for the event, keeps each referenced slot once,
row 0 first and the rest in ascending slot order (what kdkit.layout.compact does with the whole
pool), and returns a Case in the `sglang` layout with the real output as ref_out.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .. import case as case_mod
from ..constants import FLOAT_DTYPES, KV_LORA_RANK, QK_DIM, V_HEAD_DIM
from . import sglang_api

MLA_QK, MLA_V = QK_DIM, V_HEAD_DIM
# extend_attention_fwd's keyword arguments that change what it computes, at their neutral values
# (SGLang 0.5.23's defaults): another value is refused by KernelCall.unsupported. (page_size only
# changes how a slot is addressed in a paged pool, not which rows are read; aux_tensors only
# matter with score_mod, refused above.)
NEUTRAL_ARGS = {"skip_prefix_custom_mask": True, "skip_prefix": False, "skip_extend": False}


class Unsupported(Exception):
    """A call kdkit does not record or serve (the message says what and why); said once."""


@dataclass
class KernelCall:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: torch.Tensor | None
    causal: bool
    mask_indptr: torch.Tensor | None
    max_len_extend: int
    k_scale: float
    v_scale: float
    sm_scale: float
    logit_cap: float
    extra: dict = field(default_factory=dict)

    @staticmethod
    def bind(args: tuple, kwargs: dict) -> "KernelCall":
        names = sglang_api.KERNEL_ARGS
        vals = dict(zip(names, args))
        for n in names[len(args):]:
            if n not in kwargs:
                raise TypeError(f"extend_attention_fwd called without {n}: SGLang changed its call")
            vals[n] = kwargs[n]
        rest = {k: v for k, v in kwargs.items() if k not in names}
        return KernelCall(
            q=vals["q_extend"], k=vals["k_extend"], v=vals["v_extend"], o=vals["o_extend"],
            k_buffer=vals["k_buffer"], v_buffer=vals["v_buffer"], qo_indptr=vals["qo_indptr"],
            kv_indptr=vals["kv_indptr"], kv_indices=vals["kv_indices"], custom_mask=vals["custom_mask"],
            causal=bool(vals["is_causal"]), mask_indptr=vals["mask_indptr"],
            max_len_extend=int(vals["max_len_extend"]), k_scale=float(vals["k_scale"]),
            v_scale=float(vals["v_scale"]), sm_scale=float(vals["sm_scale"]),
            logit_cap=float(rest.pop("logit_cap", 0.0) or 0.0), extra=rest)

    @property
    def bs(self) -> int:
        return int(self.qo_indptr.numel()) - 1

    @property
    def num_heads(self) -> int:
        return int(self.q.shape[1])

    def unsupported(self) -> str | None:
        """Why kdkit cannot record or serve this call (None: it can). Shapes and scalars only."""
        if self.q.dim() != 3 or self.q.shape[-1] != MLA_QK or self.v.shape[-1] != MLA_V or self.k.shape[1] != 1:
            return (f"not an MLA layer (q {tuple(self.q.shape)}, k {tuple(self.k.shape)}, v {tuple(self.v.shape)}; "
                    f"kdkit handles q [T, H, {MLA_QK}], k [T, 1, {MLA_QK}], v [T, 1, {MLA_V}])")
        if self.k_buffer.dim() != 3 or tuple(self.k_buffer.shape[1:]) != (1, MLA_QK):
            return f"pool of shape {tuple(self.k_buffer.shape)}, kdkit handles [N, 1, {MLA_QK}] (MLATokenToKVPool)"
        dts = {t.dtype for t in (self.q, self.k, self.v, self.k_buffer)}
        if not dts <= set(FLOAT_DTYPES):
            return f"dtypes {sorted(map(str, dts))}: kdkit records bf16/fp16/fp32 (fp8 KV is not handled)"
        if self.k_scale != 1.0 or self.v_scale != 1.0:
            return f"k_scale={self.k_scale}, v_scale={self.v_scale}: scaled (fp8) KV is not handled"
        sw = self.extra.get("sliding_window_size")
        if sw not in (None, -1) or self.extra.get("sinks") is not None or \
                self.extra.get("window_kv_offsets") is not None or \
                self.extra.get("xai_temperature_len", -1) not in (None, -1) or \
                self.extra.get("score_mod") is not None:
            return "sliding window, sinks, score_mod or xai temperature in use: the case format has no field for them"
        # arguments that change what the call computes (0.5.2x): DCP computes the prefix and the
        # draft apart (skip_prefix / skip_extend), which is a part of attention, not a case
        changed = [f"{k}={self.extra[k]!r}" for k, neutral in NEUTRAL_ARGS.items()
                   if k in self.extra and self.extra[k] != neutral]
        if changed:
            return (f"{', '.join(changed)}: this call computes a part of attention (DCP's prefix or draft "
                    "half) or masks the prefix; the case format holds whole verify attention")
        if self.bs < 1:
            return "an empty batch"
        return None


WAIT_POLL_S = 0.0005  # the writer thread's poll of a snapshot's copies (a D2H copy takes ~10 us-ms)


def _host_copy(t: torch.Tensor | None, cuda: bool):
    if t is None:
        return None
    if not cuda:
        return t.detach().clone()
    h = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
    h.copy_(t.detach(), non_blocking=True)
    return h


@dataclass
class Snapshot:
    tensors: dict
    n_idx: int                   # how many kv_indices were gathered (>= kv_indptr[bs])
    meta: dict
    params: dict
    event: object = None         # torch.cuda.Event, or None on a CPU

    def wait(self) -> None:
        """Until the queued copies have landed. Polls the event rather than synchronizing on it:
        a server run under torch's sync debug mode then sees no sync from the writer thread, which
        would otherwise be reported against whatever call the server's thread is in."""
        if self.event is not None:
            while not self.event.query():
                time.sleep(WAIT_POLL_S)


def _bounds(call: KernelCall, forward_batch, say) -> tuple[int, int | None]:
    """(kv_indices to gather, mask entries to copy) from host-side sizes, no device read when the
    batch carries seq_lens_sum; graph buffers are over-sized, so numel() is no bound."""
    bs, T = call.bs, int(call.q.shape[0])
    total = getattr(forward_batch, "seq_lens_sum", None)
    if not isinstance(total, int) or total < 0 or total > call.kv_indices.numel():
        say("no-seq-lens-sum", "[kdkit] this batch has no usable seq_lens_sum: kdkit reads kv_indptr[bs] "
            "back to size the capture (one small device sync per captured call)")
        total = int(call.kv_indptr[bs])
    n_mask = None
    if call.custom_mask is not None:
        if T % bs == 0:  # TARGET_VERIFY: q_len tokens per request, mask q_len x (prefix + q_len) each
            q_len = T // bs
            n_mask = min(q_len * total + bs * q_len * q_len, call.custom_mask.numel())
        else:
            n_mask = int(call.mask_indptr[bs])
    return total, n_mask


def snapshot(call: KernelCall, forward_batch, meta: dict, say) -> Snapshot:
    """Queue host copies of everything the case needs (see the module doc). No host sync."""
    bs = call.bs
    n_idx, n_mask = _bounds(call, forward_batch, say)
    pool = call.k_buffer
    dev = pool.device
    loc = forward_batch.out_cache_loc.reshape(-1)
    idx = call.kv_indices.reshape(-1)[:n_idx]
    # row 0 (the scratch slot), the prefix, the draft slots; clamped so that stale entries past
    # kv_indptr[bs] in an over-sized buffer cannot index outside the pool (they are dropped later)
    slots = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), idx.long(), loc.long().to(dev)])
    slots = slots.clamp_(0, pool.shape[0] - 1)
    rows = pool.index_select(0, slots)
    seq_lens = getattr(forward_batch, "seq_lens", None)
    dev_tensors = {
        "q": call.q, "k": call.k, "v": call.v, "o": call.o, "rows": rows, "slots": slots,
        "qo_indptr": call.qo_indptr[: bs + 1], "kv_indptr": call.kv_indptr[: bs + 1],
        "out_cache_loc": loc,
        "custom_mask": call.custom_mask.reshape(-1)[:n_mask] if call.custom_mask is not None else None,
        "mask_indptr": call.mask_indptr[: bs + 1] if call.mask_indptr is not None else None,
        "prefix_lens": seq_lens.reshape(-1)[:bs] if isinstance(seq_lens, torch.Tensor) and seq_lens.numel() >= bs else None,
    }
    cuda = dev.type == "cuda"
    host = {k: (_host_copy(t, cuda) if isinstance(t, torch.Tensor) else t) for k, t in dev_tensors.items()}
    event = None
    if cuda:
        event = torch.cuda.Event()
        event.record()
    params = {"kv_indices_dtype": call.kv_indices.dtype, "num_heads": call.num_heads,
              "sm_scale": call.sm_scale, "logit_cap": call.logit_cap,
              "causal": call.causal, "max_len_extend": call.max_len_extend}
    return Snapshot(host, n_idx, meta, params, event)


def build_case(snap: Snapshot) -> case_mod.Case:
    """The case of a snapshot (waits for its copies; runs off the server's thread)."""
    snap.wait()
    t = snap.tensors
    bs = t["qo_indptr"].numel() - 1
    kvp = t["kv_indptr"].long()
    n_used = int(kvp[bs])
    if n_used > snap.n_idx:
        raise ValueError(f"kv_indptr[bs]={n_used} but only {snap.n_idx} indices were copied "
                         "(seq_lens_sum disagrees with kv_indptr): this capture is dropped")
    T = t["q"].shape[0]
    # positions in `slots` that the call really reads: row 0, the used prefix, the draft
    pos = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(1, 1 + n_used),
                     torch.arange(1 + snap.n_idx, 1 + snap.n_idx + T)])
    slot_vals = t["slots"][pos]
    uniq, inv = torch.unique(slot_vals, sorted=True, return_inverse=True)  # slot 0 comes first
    first = torch.full((uniq.numel(),), pos.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inv, torch.arange(pos.numel()), reduce="amin")
    kv_buffer = t["rows"][pos[first]].clone()
    idt = snap.params["kv_indices_dtype"]
    loc_dt = t["out_cache_loc"].dtype
    # TARGET_VERIFY's seq_lens are the committed prefixes: kept as SGLang had them, so that a
    # disagreement with kv_indptr shows in the lint; other modes count their new tokens in seq_lens
    prefix = t["prefix_lens"]
    if prefix is None or snap.meta.get("forward_mode") != "target_verify":
        prefix = torch.diff(kvp)
    meta = dict(snap.meta)
    meta["max_len_extend"] = snap.params["max_len_extend"]
    H = snap.params["num_heads"]
    mask = t["custom_mask"]
    return case_mod.Case(
        meta=meta, num_heads=H, sm_scale=float(snap.params["sm_scale"]),
        logit_cap=float(snap.params["logit_cap"]), causal=bool(snap.params["causal"]), layout="sglang",
        q=t["q"].clone(), k=t["k"].clone(), v=t["v"].clone(), kv_buffer=kv_buffer,
        kv_indptr=t["kv_indptr"].clone(), kv_indices=inv[1:1 + n_used].to(idt),
        qo_indptr=t["qo_indptr"].clone(), out_cache_loc=inv[1 + n_used:].to(loc_dt),
        prefix_lens=prefix.clone(), slot_ids=uniq.clone(),
        custom_mask=mask.clone() if mask is not None else None,
        mask_indptr=t["mask_indptr"].clone() if t["mask_indptr"] is not None else None,
        ref_out=t["o"].reshape(T, H, -1).clone(), ref_lse=None,
        kv_lora_rank=KV_LORA_RANK, qk_rope_head_dim=int(t["q"].shape[-1]) - KV_LORA_RANK, v_head_dim=int(t["v"].shape[-1]),
    )
