"""A real TARGET_VERIFY step of SGLang's MLA attention, without a server.

Everything the plugin touches is SGLang's own: MLATokenToKVPool, RadixAttention (576/512, one KV
head), ForwardBatch in ForwardMode.TARGET_VERIFY with an EagleVerifyInput carrying the tree mask,
ForwardMetadata, and TritonAttnBackend.forward_extend (which writes K into the pool and runs the
Triton kernel: compiled on a GPU, under TRITON_INTERPRET=1 on a CPU).

TritonAttnBackend.__init__ wants a ModelRunner (a loaded model, a server config); the harness
makes the object with __new__ and sets the attributes forward_extend reads in 0.5.11..0.5.23,
with the values a CUDA device without fp8/DCP/deterministic/dLLM options gives them.

The metadata comes in SGLang's two layouts (read off init_forward_metadata and
init_cuda_graph_state / _build_cuda_graph_forward_metadata in 0.5.23):
  eager  qo_indptr int32 arange, kv_indptr int32, kv_indices int64 sized seq_lens_sum,
         custom_mask = spec_info.custom_mask (bool), mask_indptr int64 [bs+1]
  graph  the persistent buffers: qo_indptr int64 [:bs+1], kv_indptr int32 [:bs+1], kv_indices the
         whole over-sized int64 buffer (stale entries past kv_indptr[bs]), custom_mask the uint8
         buffer (stale past the live blocks), mask_indptr int64 [:bs+1]
"""
from __future__ import annotations

import os

import types
import warnings

import torch

warnings.filterwarnings("ignore", message=".*support.*currently.*")  # SGLang's CPU import notes

from kdkit import synth  # noqa: E402

LAYERS = 2  # layer 0 and layer 1; tests hook one of them
MAX_BS, MAX_CONTEXT = 4, 96  # the CUDA-graph buffers' capacities


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def dtype() -> torch.dtype:
    # Triton's interpreter cannot tl.dot bf16 (it multiplies the bit patterns): fp32 on a CPU
    return torch.bfloat16 if torch.cuda.is_available() else torch.float32


def sglang():
    """SGLang's modules, imported once (slow: ~8 s on a CPU)."""
    from sglang.srt.layers.attention import triton_backend as tb
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput
    return dict(tb=tb, RadixAttention=RadixAttention, MLATokenToKVPool=MLATokenToKVPool,
                ForwardBatch=ForwardBatch, ForwardMode=ForwardMode, EagleVerifyInput=EagleVerifyInput,
                CaptureHiddenMode=CaptureHiddenMode)


def state_rank(rank: int = 0, world: int = 1) -> None:
    """Tell SGLang's runtime context this process's TP rank (what the scheduler process publishes
    when it builds its groups) and that decode context parallelism is off (MLATokenToKVPool asks).
    0.5.23's API; older releases keep these in module globals the plugin does not need."""
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        return
    group = types.SimpleNamespace(rank_in_group=rank, world_size=world)
    get_parallel().override_permanently(dcp_enabled=False, tp_group=group)


class Step:
    """One verify step: pool, layers, backend, batch, and the per-layer q/k/v."""

    def __init__(self, layout: str = "eager", bs: int = 2, prefix=(13, 5), q_len: int = 9, heads: int = 4,
                 seed: int = 0, sm_scale: float = 0.1352, mode: str = "TARGET_VERIFY"):
        S = self.S = sglang()
        dev, dt = device(), dtype()
        self.layout, self.bs, self.q_len, self.heads = layout, bs, q_len, heads
        src = synth.make_case(bs=bs, prefix=list(prefix), q_len=q_len, heads=heads, tree="ddtree", seed=seed,
                              keep_pool=True, sm_scale=sm_scale)
        self.src = src
        n_rows = src.kv_buffer.shape[0]
        self.pool = S["MLATokenToKVPool"](size=n_rows - 1, page_size=1, dtype=dt, kv_lora_rank=512,
                                          qk_rope_head_dim=64, layer_num=LAYERS, device=str(dev),
                                          enable_memory_saver=False)
        loc = src.out_cache_loc.long()
        gen = torch.Generator().manual_seed(seed + 1)
        self.qkv = {}
        for lid in range(LAYERS):
            buf = self.pool.get_key_buffer(lid)
            rows = src.kv_buffer.float().clone()
            rows[loc] = 0.0  # the draft slots hold nothing yet: forward_extend writes this step's K there
            buf.copy_(rows.to(dt))
            # each layer its own q/k (v = latent of k, as MLA's absorbed attention passes it)
            q = (src.q.float() + 0.1 * lid * torch.randn(src.q.shape, generator=gen)).to(dt)
            k = (src.k.float() + 0.1 * lid * torch.randn(src.k.shape, generator=gen)).to(dt)
            self.qkv[lid] = (q.reshape(q.shape[0], -1).to(dev), k.to(dev), k[..., :512].clone().to(dev))
        self.layers = [S["RadixAttention"](num_heads=heads, head_dim=576, scaling=sm_scale, num_kv_heads=1,
                                           layer_id=lid, v_head_dim=512) for lid in range(LAYERS)]
        self.backend = self._backend(dev)
        self.batch = self._batch(dev, mode)
        self.backend.forward_metadata = self._metadata(dev)

    # ---- SGLang objects ----------------------------------------------------------------------
    def _backend(self, dev):
        tb = self.S["tb"]
        from sglang.srt.utils import get_device_core_count  # noqa: F401  (the module is importable)
        b = tb.TritonAttnBackend.__new__(tb.TritonAttnBackend)
        ext = None
        for modname in ("sglang.kernels.ops.attention.extend_attention",
                        "sglang.srt.layers.attention.triton_ops.extend_attention"):
            try:
                ext = __import__(modname, fromlist=["extend_attention_fwd"]).extend_attention_fwd
                break
            except ImportError:
                continue
        attrs = dict(
            token_to_kv_pool=self.pool, extend_attention_fwd=torch.compiler.disable(ext), page_size=1,
            use_mla=True, dcp_size=1, dcp_rank=0, enable_deterministic=False, use_verify_splitkv=False,
            use_verify_shared_kv=False, use_dense_fp8_chunked_prefill=False, dllm_attention=None,
            allow_bidirectional_attention_in_extend=False, max_context_len=MAX_CONTEXT, device=dev,
            num_draft_tokens=self.q_len, skip_prefill=False, sliding_window_size=None)
        for k, v in attrs.items():
            setattr(b, k, v)
        return b

    def _batch(self, dev, mode):
        S, src = self.S, self.src
        T, bs = src.num_tokens, self.bs
        prefix = src.prefix_lens.to(dev)
        mask = src.custom_mask.to(dev)
        spec = S["EagleVerifyInput"](
            draft_token=torch.zeros(T, dtype=torch.long, device=dev), custom_mask=mask,
            positions=(prefix.repeat_interleave(self.q_len) + torch.arange(self.q_len, device=dev).repeat(bs)),
            retrieve_index=torch.arange(T, device=dev).view(bs, self.q_len),
            retrieve_next_token=torch.full((bs, self.q_len), -1, device=dev),
            retrieve_next_sibling=torch.full((bs, self.q_len), -1, device=dev),
            retrieve_cum_len=None, spec_steps=3, topk=4, draft_token_num=self.q_len,
            capture_hidden_mode=S["CaptureHiddenMode"].FULL, seq_lens_sum=int(prefix.sum()),
            seq_lens_cpu=src.prefix_lens.clone())
        return S["ForwardBatch"](
            forward_mode=getattr(S["ForwardMode"], mode), batch_size=bs,
            input_ids=torch.zeros(T, dtype=torch.long, device=dev),
            req_pool_indices=torch.arange(bs, device=dev), seq_lens=prefix.clone(),
            out_cache_loc=src.out_cache_loc.long().to(dev), seq_lens_sum=int(prefix.sum()),
            seq_lens_cpu=src.prefix_lens.clone(), spec_info=spec)

    def _metadata(self, dev):
        tb, src, bs, q_len = self.S["tb"], self.src, self.bs, self.q_len
        prefix = src.prefix_lens.long()
        kv_idx = src.kv_indices.long()
        n = int(prefix.sum())
        mask = src.custom_mask
        mip = torch.zeros(bs + 1, dtype=torch.int64)
        mip[1:] = torch.cumsum(q_len * (prefix + q_len), 0)
        if self.layout == "eager":
            qo = torch.arange(0, (bs + 1) * q_len, q_len, dtype=torch.int32)
            kvp = torch.zeros(bs + 1, dtype=torch.int32)
            kvp[1:] = torch.cumsum(prefix, 0)
            kvi, cm, mi = kv_idx.clone(), mask.clone(), mip
        else:
            # persistent buffers sized for MAX_BS requests of MAX_CONTEXT tokens, holding stale
            # (in-range) entries of an earlier, bigger batch past what this batch uses
            stale = torch.Generator().manual_seed(7)
            n_pool = self.pool.get_key_buffer(0).shape[0]
            self.kv_indices_buf = torch.randint(1, n_pool, (MAX_BS * q_len * MAX_CONTEXT,), generator=stale)
            self.kv_indices_buf[:n] = kv_idx
            self.mask_buf = torch.randint(0, 2, (MAX_BS * q_len * (MAX_CONTEXT + q_len),), generator=stale,
                                          dtype=torch.uint8)
            self.mask_buf[: mask.numel()] = mask.to(torch.uint8)
            qo_buf = torch.zeros(MAX_BS + 1, dtype=torch.int64)
            qo_buf[: bs + 1] = torch.arange(0, (bs + 1) * q_len, q_len)
            kvp_buf = torch.zeros(MAX_BS + 1, dtype=torch.int32)
            kvp_buf[1: bs + 1] = torch.cumsum(prefix, 0)
            mip_buf = torch.zeros(MAX_BS + 1, dtype=torch.int64)
            mip_buf[: bs + 1] = mip
            qo, kvp, kvi, cm, mi = qo_buf[: bs + 1], kvp_buf[: bs + 1], self.kv_indices_buf, self.mask_buf, mip_buf[: bs + 1]
        to = lambda t: t.to(dev)  # noqa: E731
        return tb.ForwardMetadata(None, None, q_len, None, to(kvp), to(kvi), to(qo), to(cm), to(mi),
                                  None, None, None, None)

    # ---- running it --------------------------------------------------------------------------
    def forward(self, layer_id: int):
        """The real forward_extend of one layer (through whatever hook is installed)."""
        q, k, v = self.qkv[layer_id]
        return self.backend.forward_extend(q, k, v, self.layers[layer_id], self.batch)

    def refill(self, prefix, seed: int):
        """The next batch of a CUDA-graph replay: new q/k values and shorter prefixes (each request
        keeps the first prefix[b] of its slots), written in place into the same tensors and
        metadata buffers, as SGLang's replay does before it launches the graph (graph layout only)."""
        from kdkit import trees
        assert self.layout == "graph", "refill writes the persistent CUDA-graph buffers"
        m, bs, q_len = self.backend.forward_metadata, self.bs, self.q_len
        old = self.src.prefix_lens.long().tolist()
        prefix = [int(p) for p in prefix]
        assert all(0 <= p <= o for p, o in zip(prefix, old)), f"prefix {prefix} must shrink {old}"
        kvp_old = self.src.kv_indptr.long().tolist()
        kvi = torch.cat([self.src.kv_indices.long()[kvp_old[b]: kvp_old[b] + prefix[b]] for b in range(bs)])
        blocks, mstart = [], 0
        full = self.src.custom_mask
        for b in range(bs):  # the tree part of each request's block stays, its prefix columns shrink
            blk = full[mstart: mstart + q_len * (old[b] + q_len)].reshape(q_len, old[b] + q_len)[:, old[b]:]
            blocks.append(blk.numpy())
            mstart += q_len * (old[b] + q_len)
        mask, mip = trees.build_mask(prefix, blocks, torch.uint8)
        dev = m.kv_indices.device
        m.kv_indices[: kvi.numel()].copy_(kvi.to(dev))
        m.kv_indptr[1:].copy_(torch.tensor(prefix).cumsum(0).to(m.kv_indptr.dtype).to(dev))
        m.custom_mask[: mask.numel()].copy_(mask.to(dev))
        m.mask_indptr.copy_(mip.to(dev))
        pl = torch.tensor(prefix, dtype=self.batch.seq_lens.dtype)
        self.batch.seq_lens.copy_(pl.to(dev))
        self.batch.seq_lens_sum = int(pl.sum())
        gen = torch.Generator().manual_seed(seed)
        for lid, (q, k, v) in self.qkv.items():
            q.copy_((0.5 * torch.randn(q.shape, generator=gen)).to(q.dtype))
            k.copy_((0.6 * torch.randn(k.shape, generator=gen)).to(k.dtype))
            v.copy_(k[..., :512])
        self.reset_pool()

    def reset_pool(self):
        """Zero the draft slots again (a rerun must see forward_extend write them)."""
        loc = self.batch.out_cache_loc
        for lid in range(LAYERS):
            self.pool.get_key_buffer(lid)[loc] = 0


def unhooked_forward_extend():
    """TritonAttnBackend.forward_extend as SGLang defines it, beneath any hook."""
    fn = sglang()["tb"].TritonAttnBackend.forward_extend
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn
