"""Eager PyTorch reference, CPU or GPU: what a correct bf16 kernel should produce.

From the case's bf16 inputs: scores in fp32, (q . k) * sm_scale, SGLang's tanh soft cap when
logit_cap > 0, SGLang's mask semantics (every prefix column visible, draft columns from the
custom mask, or causal / all when there is no mask), fp32 softmax, P @ V in fp32, output cast to
bf16 (what a production kernel writes) and LSE in fp32 [T, H].

The KV of each request is cut into splits of whole 32-row tiles exactly as kdkit's kernel cuts
it (`split_bounds`; the split count is the kernel's choice for the shape on an H200's 132 SMs,
kdkit.kernel.schedule, unless `nsplit` is given); each split gets its own max, sum and partial
output, merged by log-sum-exp.
Same numbers up to fp32 rounding as one softmax over the row, and it is where the split-related
mutants (kdkit.judge.wrong_kernels) have something to get wrong.

Only the KV rows a request references are gathered, so NaN-poisoned unreferenced pool rows are
never touched. The case is never mutated.

Options:
  device      where the math runs (default: the device of case.q)
  p_bf16      round P to bf16 before P @ V, as Triton/FlashAttention-style kernels do (default
              False); used to check that the tolerance floor admits real kernels
  nsplit      KV splits per request (default: the kernel's choice for the shape on 132 SMs)
  mutant      plant one of kdkit.judge.wrong_kernels.MUTANTS (a deliberately wrong build; negative control)
  chunk_elems bound on one score block (rows x heads x kv), to keep q_len 1025 x 128 heads small
"""
from __future__ import annotations

import torch

from .. import layout
from ..judge import wrong_kernels
from ..kernel import schedule
from ..layout import request_kv
from . import Prepared, Result

NAME = "torch"
LABEL = "PyTorch eager"


def unavailable(case=None):
    return None


def draft_visibility(case, b: int, device) -> torch.Tensor:
    """[q_len, q_len] bool on `device` (kdkit.layout.draft_visibility, moved)."""
    return layout.draft_visibility(case, b).to(device)


def _visibility(case, b: int, n: int, p: int, mutant, device) -> torch.Tensor:
    """[n, p + n] bool: which KV columns each draft row of request b sees (mutated if asked)."""
    vd = draft_visibility(case, b, device)
    has_mask = case.custom_mask is not None
    if mutant == "mask-row-offset" and has_mask:
        vd = vd[(torch.arange(n) + 1).clamp(max=n - 1)]
    elif mutant == "mask-col-offset" and has_mask:
        vd = vd[:, (torch.arange(n) + 1).clamp(max=n - 1)]
    return torch.cat([torch.ones(n, p, dtype=torch.bool, device=device), vd], dim=1)


def _queries(case, qs: int, qe: int, mutant, device) -> torch.Tensor:
    q = case.q[qs:qe].to(device=device, dtype=torch.float32)    # [n, H, 576]
    if mutant == "wrong-head-stride":
        q = q.roll(-1, dims=1)                                  # head h reads head (h + 1) % H
    return q


def split_bounds(kv_len: int, nsplit: int) -> list[tuple[int, int]]:
    """[(begin, end)) of each non-empty split of a request's KV, as the kernel cuts it: every split
    but the last holds schedule.split_span(kv_len, nsplit) rows."""
    if kv_len <= 0:
        return []
    span = schedule.split_span(kv_len, nsplit)
    return [(s, min(kv_len, s + span)) for s in range(0, kv_len, span)]


def _swizzled(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """bad-swizzle: tile row r = pos % 32 reads its 16-byte group g (8 dims) from
    g ^ (r & 7) ^ ((r + 1) & 7): written with one XOR swizzle, read with another."""
    rows, d = x.shape
    g = torch.arange(d // 8, device=x.device)
    key = ((pos & 7) ^ ((pos + 1) & 7)).to(x.device)
    src = g[None, :] ^ key[:, None]                             # stays inside each aligned 8-group
    idx = (src[..., None] * 8 + torch.arange(8, device=x.device)).reshape(rows, d)
    return torch.gather(x, 1, idx)


def _split_kv(K, V, b0: int, e0: int, mutant, device):
    """K, V rows [b0, e0) of a split as the (possibly mutated) kernel would hold them, fp32."""
    pos = torch.arange(b0, e0)
    Ks, Vs = K[b0:e0], V[b0:e0]                                 # views: no copy on the correct path
    if mutant == "skip-pipeline-wait" and e0 - b0 > schedule.BLOCK_N:
        last = b0 + (e0 - b0 - 1) // schedule.BLOCK_N * schedule.BLOCK_N   # the split's last tile
        src = torch.where(pos >= last, pos - schedule.BLOCK_N, pos)
        Ks, Vs = K[src], V[src]
    if mutant == "v-wrong-dims":
        Vs = Ks[:, K.shape[1] - V.shape[1]:]
    if mutant == "bad-swizzle":
        Ks, Vs = _swizzled(Ks, pos), _swizzled(Vs, pos)
    Ks = Ks.to(device=device, dtype=torch.float32)
    if mutant == "skip-rope":
        Ks = Ks.clone()
        Ks[:, V.shape[1]:] = 0.0
    return Ks, Vs.to(device=device, dtype=torch.float32)


def _request(case, b, device, p_bf16, chunk_elems, nsplit, mutant):
    qs, qe = (int(x) for x in case.qo_indptr[b: b + 2])
    n, H = qe - qs, case.num_heads
    K, V, p = request_kv(case, b)                       # referenced rows only (bf16); checks the layout rule
    kv = K.shape[0]
    vis = _visibility(case, b, n, p, mutant, device)    # [n, kv]
    kv_len = kv                                         # what the kernel believes
    if mutant == "kv-len-off-by-one":
        kv_len = max(0, kv - 1)
    elif mutant == "drop-last-block":
        kv_len = kv // schedule.BLOCK_N * schedule.BLOCK_N
    elif mutant == "prefix-only-kv":
        kv_len = p
    q = _queries(case, qs, qe, mutant, device)
    scale = 1.0 if mutant == "no-scale" else case.sm_scale
    Dv = V.shape[1]
    out = torch.zeros(n, H, Dv, dtype=torch.float32, device=device)
    lse = torch.full((n, H), float("-inf"), dtype=torch.float32, device=device)
    bounds = split_bounds(kv_len, nsplit)
    if not bounds or n == 0:
        return qs, qe, out, lse
    # every split laid out as one [S, span] grid (the last split padded with masked columns), so
    # the per-split max, sum and partial output are one batched op each, not a loop over splits
    S, span = len(bounds), bounds[0][1] - bounds[0][0]
    pieces = [_split_kv(K, V, b0, e0, mutant, device) for b0, e0 in bounds]
    Kg = torch.cat([k for k, _ in pieces])                 # [kv_len, 576] as the splits hold them
    pad = S * span - Kg.shape[0]
    Vg = torch.nn.functional.pad(torch.cat([v for _, v in pieces]), (0, 0, 0, pad)).reshape(S, span, Dv)
    visg = torch.nn.functional.pad(vis[:, :kv_len], (0, pad)).reshape(n, S, span)
    # masked columns are exactly 0 in P, but 0 * NaN would still be NaN: zero the V rows no row
    # can see (all referenced rows are finite in a sane case anyway)
    Vg = torch.where(visg.any(dim=0)[..., None], Vg, 0.0)
    rows = max(1, chunk_elems // max(1, H * S * span))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        qr = q[r0:r1].reshape(-1, q.shape[-1])
        s_ = torch.nn.functional.pad(qr @ Kg.T, (0, pad)).reshape(r1 - r0, H, S, span) * scale
        if case.logit_cap > 0:
            s_ = case.logit_cap * torch.tanh(s_ / case.logit_cap)
        s_ = s_.masked_fill(~visg[r0:r1, None], float("-inf"))
        m = s_.amax(dim=-1)                                  # [rows, H, S]; -inf: sees nothing there
        P = torch.exp(s_ - torch.where(torch.isfinite(m), m, 0.0)[..., None])
        l = P.sum(dim=-1)
        if p_bf16:
            P = P.bfloat16().float()
        o = torch.einsum("rhsj,sjd->rhsd", P, Vg)            # unnormalised: sum_j exp(s_j - m_s) v_j
        m, l, o = m.permute(2, 0, 1), l.permute(2, 0, 1), o.permute(2, 0, 1, 3)   # split axis first
        top = m.amax(dim=0)
        top0 = torch.where(torch.isfinite(top), top, 0.0)
        if mutant == "merge-no-rescale" and S > 1:
            # the bug: each split's normalised partial weighs 1, whatever its share of the mass
            # (one split: the kernel writes its output directly, there is no merge to get wrong)
            seen = torch.isfinite(m) & (l > 0)
            w = torch.where(seen, 1.0 / torch.where(l > 0, l, 1.0), 0.0)
            lse_s = torch.where(seen, m + torch.log(torch.where(l > 0, l, 1.0)), float("-inf"))
            top0 = lse_s.amax(dim=0)                    # and the LSE = max lse_s + log(splits)
            top0 = torch.where(torch.isfinite(top0), top0, 0.0)
        else:
            w = torch.where(torch.isfinite(m), torch.exp(m - top0), 0.0)
        den = (w * l).sum(dim=0)
        num = (w[..., None] * o).sum(dim=0)
        ok = den > 0
        out[r0:r1] = torch.where(ok[..., None], num / torch.where(ok, den, 1.0)[..., None], 0.0)
        lse[r0:r1] = torch.where(ok, top0 + torch.log(torch.where(ok, den, 1.0)), float("-inf"))
    return qs, qe, out, lse


def default_nsplit(case, sm_count: int = schedule.H200_SM_COUNT) -> int:
    """The kernel's split count for this case's shape on `sm_count` SMs (kdkit.kernel.schedule: the
    plan's own choice, the skip build's block size included)."""
    rows = max(case.q_lens, default=0) * case.num_heads
    kv_lens = [int(pf) + n for pf, n in zip(case.prefix_lens.tolist(), case.q_lens)]
    if not rows:
        return 1
    return schedule.choose_launch(case.batch_size, rows, max(case.q_lens), max(kv_lens, default=0), sm_count,
                                  case.num_tokens * case.num_heads, case.custom_mask is not None)[1]


def run(case, *, device=None, p_bf16: bool = False, nsplit: int | None = None, mutant: str | None = None,
        chunk_elems: int = 1 << 24) -> Result:
    wrong_kernels.check(mutant)
    ns = default_nsplit(case) if nsplit is None else int(nsplit)
    if ns < 1:
        raise ValueError(f"torch backend: nsplit={nsplit} must be >= 1")
    device = torch.device(device) if device is not None else case.q.device
    T, H, Dv = case.num_tokens, case.num_heads, case.v_head_dim
    out = torch.zeros(T, H, Dv, dtype=torch.float32, device=device)
    lse = torch.full((T, H), float("-inf"), dtype=torch.float32, device=device)
    with torch.no_grad():
        for b in range(case.batch_size):
            qs, qe, o, l = _request(case, b, device, p_bf16, chunk_elems, ns, mutant)
            out[qs:qe], lse[qs:qe] = o, l
    info = {"device": str(device), "dtype": "bf16 out, fp32 math" + (", bf16 P" if p_bf16 else ""),
            "nsplit": ns, "mutant": mutant,
            "ran": f"eager PyTorch {torch.__version__} on {device}: fp32 math"
                   + (", P rounded to bf16" if p_bf16 else "") + f", bf16 output, {ns} KV split(s)"
                   + (f", MUTANT {mutant}" if mutant else "")}
    return Result(out.bfloat16(), lse, info)


def prepare(case, *, device=None, p_bf16: bool = False, nsplit: int | None = None, mutant: str | None = None,
            chunk_elems: int = 1 << 24) -> Prepared:
    """run() made ready for timing on `device` (default: the GPU where there is one, else the
    case's device): q, k, v and the pool copied there once; each launch is the eager computation
    (torch's caching allocator and the per-request host loop included: not graph-safe)."""
    wrong_kernels.check(mutant)
    dev = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else case.q.device)
    on_dev = case.clone(**{n: getattr(case, n).to(dev) for n in ("q", "k", "v", "kv_buffer")})
    last: list[Result] = []

    def launch():
        last[:] = [run(on_dev, device=dev, p_bf16=p_bf16, nsplit=nsplit, mutant=mutant, chunk_elems=chunk_elems)]

    def result() -> Result:
        if not last:
            launch()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return last[0]
    return Prepared(launch, result, graph_safe=False, info={"device": str(dev)})
