"""Metrics between two attention outputs, the tolerance rule, and the seed's one-line diff log.

Everything is computed in float64 on the CPU, whatever the inputs' dtype or device.

The rule (see `judge`): against the float64 oracle, every statistic of a backend's error may be at
most 2x the production path's (SGLang's Triton kernel against the same oracle) plus a rounding
floor; without the production path, the floor alone. The statistics: max |error| (FlashAttention's
rule), the error in bf16 spacings of each element (worst element, row, token, head, mean), and
each row's LSE error in units of its fp32 error scale. Every constant says where it came from.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# bf16 keeps 8 significant bits: unit roundoff u = 2^-8 (round-to-nearest moves x by <= u|x|),
# one ulp is at most 2^-7 |x|.
BF16_U = 2.0 ** -8

# The bf16 floor on the output, in units of u x max|ref|.
#
# Alone (no production path to scale with): 4u max|ref| = 2^-6 max|ref| (at least 2 bf16 ulps of the
# largest output). Derivation: a correct bf16 kernel makes two roundings that reach the output: the
# output is written in bf16 (<= u|o|) and P is rounded to bf16 before P @ V (<= u Σ p|v|, which
# tracks max|o| when V rows have similar magnitudes); that is 2u, doubled for margin. Calibration
# (tests/test_torch_ref.py: chains, trees, ragged, prefix 0, q_len 1..1025, H 1..128, magnitude
# 1..30, logit cap, both layouts): the torch backend (fp32 P) peaks at 0.91u max|ref|, its bf16-P
# variant at 1.31u. SGLang's Triton kernel (0.5.15.post1) compiled on an H200, 22 cases incl.
# q_len 1025, H 128, prefix 8192, magnitude 30, logit cap: 0.70u (torch on that GPU 0.70u, bf16-P
# 1.08u). So correct kernels stay >= 3x under the floor.
OUT_FLOOR_U = 4.0
# Beside 2x the production error: 2u max|ref| = 2^-7 max|ref|, about one bf16 ulp of the largest
# output, which is the size of FlashAttention's own atol term (2x the rounding error of ref + 0.3);
# the production term already carries the kernel-to-kernel spread. On the H200 sweep above the
# resulting limits were 2.8u..3.4u max|ref| against a worst correct kernel (bf16 P) of 1.08u.
PROD_FLOOR_U = 2.0

# Against a reference that is itself a bf16 kernel (captured Triton output, another backend) rather
# than the oracle, the triangle inequality adds that reference's own error: |a-r| <= |a-o| + |r-o|.
# So the production term counts 3x (2x allowed for the backend + 1x for the reference) and the
# floor counts twice.


def _np(x) -> np.ndarray | None:
    if x is None:
        return None
    if hasattr(x, "detach"):
        return x.detach().to("cpu").double().numpy()
    return np.asarray(x, dtype=np.float64)


@dataclass
class Metrics:
    max_abs: float
    mean_abs: float
    rel: float                  # ||a-b|| / ||b||
    cos_dist: float             # 1 - 2 Σab / Σ(a² + b²)
    nonfinite: int              # entries of a that are not finite where b is finite
    lse_max_abs: float | None   # None if either LSE is missing
    per_head: dict = field(default_factory=dict)        # {"max_abs": [H], "rel": [H]}
    per_token: dict = field(default_factory=dict)       # {"max_abs": [T], "rel": [T]}
    worst: tuple = (0, 0, 0)                           # (token, head, dim) of the largest |a-b|
    per_token_head: np.ndarray | None = None           # [T, H] max_abs, for the heatmap
    ref_max_abs: float = 0.0                           # max|b| over the compared entries
    ref_scale_max: float = 0.0                         # max over compared rows of out_scale's peak (0: not given)
    ref_lse_max_abs: float | None = None               # max|b_lse| over finite entries
    ref_nonfinite: int = 0                             # entries of b that are not finite (excluded)
    empty_rows: int = 0                                # (token, head) rows whose reference sees nothing
    # error in units of each element's bf16 spacing (see `spacing`): scale-free, so one limit
    # holds for outputs of any size, long prefixes (small outputs) included
    ulp_max: float = 0.0                               # max over elements
    ulp_mean: float = 0.0                              # mean over compared elements
    ulp_row_max: float = 0.0                           # max over (token, head) rows of the row's mean
    ulp_row_worst: tuple = (0, 0)                      # (token, head) of that row
    ulp_token_max: float = 0.0                         # max over tokens of the token's mean (all heads)
    ulp_head_max: float = 0.0                          # max over heads of the head's mean (all tokens)
    lse_ulp_max: float | None = None                   # max over rows of |dlse| / lse_unit (see `lse_unit`)
    lse_worst: tuple = (0, 0)                          # (token, head) of that row
    lse_missing: str = ""                              # "", or who gave no LSE: "the backend", "the reference", "both"

    def as_dict(self) -> dict:
        return {"max_abs": self.max_abs, "mean_abs": self.mean_abs, "rel": self.rel,
                "cos_dist": self.cos_dist, "nonfinite": self.nonfinite,
                "lse_max_abs": self.lse_max_abs, "worst": list(self.worst)}


def _rel(num_sq: np.ndarray, den_sq: np.ndarray) -> np.ndarray:
    """sqrt(num/den) with 0/0 = 0 and x/0 = inf (a nonzero output where the reference is 0)."""
    num, den = np.sqrt(num_sq), np.sqrt(den_sq)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))


def spacing(ref: np.ndarray, use: np.ndarray | None = None, row_scale: np.ndarray | None = None) -> np.ndarray:
    """The bf16 spacing (one ulp, 2^(floor(log2 x) - 7)) of x = max(|ref|, RMS of ref's row,
    row_scale of the row).

    An element much smaller than its row's RMS (a near-zero output from cancellation) is not
    measured in its own tiny spacing: the arithmetic that made it (fp32 sums of p*v, P rounded
    to bf16) errs in proportion to the row's size, not the element's. row_scale ([T, H],
    kdkit.judge.oracle.out_scale's [..., 0]) is the row's size before its V rows cancel: a whole row that cancels
    (its RMS tiny too) errs in proportion to that. [T, H, D] -> [T, H, D]."""
    r = np.where(use, ref, 0.0) if use is not None else ref
    n = use.sum(axis=-1, keepdims=True) if use is not None else np.full(r.shape[:-1] + (1,), r.shape[-1])
    rms = np.sqrt((r ** 2).sum(axis=-1, keepdims=True) / np.maximum(n, 1))
    if row_scale is not None:
        rms = np.maximum(rms, row_scale[..., None])
    x = np.maximum(np.abs(r), rms)
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(x > 0, x, 1.0)))
    # never finer than bf16's smallest spacing, 2^-133 (its subnormals': below 2^-126 the spacing
    # stops shrinking), which is also an all-zero row's, so any error there is huge in these units
    return np.where(x > 0, np.ldexp(1.0, np.maximum(e - 7, -133).astype(int)), 2.0 ** -133)


def _ulp_stats(z: np.ndarray, use: np.ndarray) -> dict:
    """Summaries of the error in bf16 spacings: max, mean, and the worst row/token/head mean."""
    zu = np.where(use, z, 0.0)
    n_used = int(use.sum())
    if not n_used:
        return {}
    with np.errstate(invalid="ignore"):
        row = zu.sum(axis=2) / np.maximum(use.sum(axis=2), 1)
        tok = zu.sum(axis=(1, 2)) / np.maximum(use.sum(axis=(1, 2)), 1)
        head = zu.sum(axis=(0, 2)) / np.maximum(use.sum(axis=(0, 2)), 1)
    return {"ulp_max": float(zu.max()), "ulp_mean": float(zu.sum() / n_used),
            "ulp_row_max": float(row.max()),
            "ulp_row_worst": tuple(int(i) for i in np.unravel_index(int(np.argmax(row)), row.shape)),
            "ulp_token_max": float(tok.max()), "ulp_head_max": float(head.max())}


def lse_unit(ref_lse: np.ndarray, cond: np.ndarray | None, ref_lse_max: float) -> np.ndarray:
    """[T, H] the fp32 error scale of each row's LSE: 2^-24 x (|lse| + cond).

    cond (kdkit.judge.oracle.lse_condition) is sm_scale x the probability-weighted sum_d |q_d k_jd|: an fp32
    logit computed from 576 products errs in proportion to that, not to the logit itself (large
    q and k that cancel), and the LSE is the weighted mean of its logits' errors plus its own
    rounding (|lse|). Without cond, max|ref lse| over the whole output stands in for it (it is at
    least the largest logit; looser where logits cancel)."""
    c = cond if cond is not None else ref_lse_max
    # floor 1.0: log(sum of exps) near lse ~ 0 (tiny logits, one column) errs ~2^-24 absolute, not relative
    return 2.0 ** -24 * np.maximum(np.abs(ref_lse) + c, 1.0)


def metrics(out, ref, lse=None, ref_lse=None, lse_cond=None, out_scale=None) -> Metrics:
    """Compare `out` (a backend) with `ref` ([T, H, D] each; tensors or arrays) in float64.

    lse_cond ([T, H], kdkit.judge.oracle.lse_condition) sizes the LSE error scale per row (`lse_unit`).
    out_scale ([T, H, 2], kdkit.judge.oracle.out_scale) is each row's size before its V rows cancel, over
    its dims and at its largest dim: the output's error is measured against the first where it
    exceeds the row's own size (`spacing`), and `judge`'s max|ref| floor against the largest of the
    second, so a correct kernel that rounds P to bf16 passes a row that cancels.
    Entries where ref is not finite are left out (counted in ref_nonfinite; `judge` fails them).
    When ref_lse is given, rows whose reference LSE is -inf (the row sees no column: softmax is
    0/0 there and the oracle's 0 is a convention) are left out too, counted in empty_rows.
    A non-finite entry of `out` where ref is finite makes max_abs, mean_abs, rel, cos_dist inf.
    """
    a, b = _np(out), _np(ref)
    if a.shape != b.shape:
        raise ValueError(f"out has shape {a.shape}, ref has {b.shape}: compare outputs of the same case")
    if a.ndim != 3:
        raise ValueError(f"out must be [T, H, D], got shape {a.shape}")
    T, H, D = a.shape
    la, lb = _np(lse), _np(ref_lse)
    lse_cond = _np(lse_cond)
    scale = _np(out_scale)
    if scale is not None and scale.shape != (T, H, 2):
        raise ValueError(f"out_scale has shape {scale.shape}, expected {(T, H, 2)} (kdkit.judge.oracle.out_scale)")
    use = np.isfinite(b)
    ref_nonfinite = int((~use).sum())
    empty = np.zeros((T, H), bool)
    if lb is not None:
        if lb.shape != (T, H):
            raise ValueError(f"ref_lse has shape {lb.shape}, expected {(T, H)}")
        empty = np.isneginf(lb)
        use &= ~empty[..., None]
        # a NaN or +inf reference LSE is no row that sees nothing: the reference is broken there
        # (a bf16 backend as the reference), so it is counted, and judged, like a non-finite output
        ref_nonfinite += int((~np.isfinite(lb) & ~empty).sum())
    bad = use & ~np.isfinite(a)
    nonfinite = int(bad.sum())
    d = np.where(use, np.abs(np.where(np.isfinite(a), a, 0.0) - np.where(use, b, 0.0)), 0.0)
    d[bad] = np.inf
    bz = np.where(use, b, 0.0)
    az = np.where(use & np.isfinite(a), a, 0.0)
    n_used = int(use.sum())

    max_abs = float(d.max()) if d.size else 0.0
    mean_abs = float(d.sum() / n_used) if n_used else 0.0
    d2 = np.where(bad, 0.0, d) ** 2
    if nonfinite:
        rel = cos = float("inf")
    else:
        rel = float(_rel(d2.sum(), (bz ** 2).sum()))
        den = float((az ** 2 + bz ** 2).sum())
        cos = float(1.0 - 2.0 * float((az * bz).sum()) / den) if den > 0 else 0.0
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(d)), d.shape)) if d.size else (0, 0, 0)

    b2 = bz ** 2
    dd = np.where(bad, np.inf, d2)   # a non-finite entry makes its head's / token's rel inf
    per_head = {"max_abs": d.max(axis=(0, 2)) if T and D else np.zeros(H),
                "rel": _rel(dd.sum(axis=(0, 2)), b2.sum(axis=(0, 2)))}
    per_token = {"max_abs": d.max(axis=(1, 2)) if H and D else np.zeros(T),
                 "rel": _rel(dd.sum(axis=(1, 2)), b2.sum(axis=(1, 2)))}
    per_token_head = d.max(axis=2) if D else np.zeros((T, H))

    if scale is not None:
        scale = np.where(use.any(axis=-1)[..., None] & np.isfinite(scale), scale, 0.0)
    z = d / spacing(bz, use, scale[..., 0] if scale is not None else None)
    ulp = _ulp_stats(z, use)

    lse_err, ref_lse_max, lse_ulp, lse_worst = None, None, None, (0, 0)
    if la is not None and lb is not None:
        if la.shape != lb.shape:
            raise ValueError(f"lse has shape {la.shape}, ref_lse has {lb.shape}")
        fin = np.isfinite(lb)
        ref_lse_max = float(np.abs(lb[fin]).max()) if fin.any() else 0.0
        with np.errstate(invalid="ignore"):
            dl = np.where(fin, np.abs(la - lb), 0.0)
        dl = np.where(np.isfinite(dl), dl, np.inf)
        lse_err = float(dl.max()) if dl.size else 0.0
        r = dl / lse_unit(np.where(fin, lb, 0.0), lse_cond, ref_lse_max)
        lse_ulp = float(r.max()) if r.size else 0.0
        lse_worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(r)), r.shape)) if r.size else (0, 0)
    return Metrics(max_abs=max_abs, mean_abs=mean_abs, rel=rel, cos_dist=cos, nonfinite=nonfinite,
                   lse_max_abs=lse_err, per_head=per_head, per_token=per_token, worst=worst,
                   per_token_head=per_token_head,
                   ref_max_abs=float(np.abs(bz).max()) if bz.size else 0.0,
                   ref_scale_max=float(scale[..., 1].max()) if scale is not None and scale.size else 0.0,
                   ref_lse_max_abs=ref_lse_max, ref_nonfinite=ref_nonfinite,
                   empty_rows=int(empty.sum()), lse_ulp_max=lse_ulp, lse_worst=lse_worst,
                   lse_missing={(True, True): "", (False, True): "the backend", (True, False): "the reference",
                                (False, False): "both"}[(la is not None, lb is not None)], **ulp)


# ---- the statistics a bug moves, in bf16 spacings (Metrics.ulp_*) -----------------------------
# Error divided by each element's bf16 spacing (`spacing`): a long prefix gives small outputs, and
# one absolute limit for the whole output (max_abs vs max|ref|) let bugs that move every element
# by a few ulps of its own size through (issue 8: mask off by one at 8K passed at max_abs 9e-3
# against a limit of 3.8e-2). Calibration, measured (CPU, torch backend vs the float64 oracle,
# 60 cases of kdkit.synth.random_case: bs 1..64, prefix 0..128K, q_len 1..1025, H 1..128,
# magnitude 1..30, logit cap, both layouts; fp32 P and P rounded to bf16 as Triton does, one
# split and the kernel's splits), worst over all, in spacings:
#   fp32 P:  max 0.51, worst row mean 0.21, worst token mean 0.20, worst head mean 0.17, mean 0.16
#   bf16 P:  max 7.64, worst row mean 0.40, worst token mean 0.36, worst head mean 0.25, mean 0.22
# (a single element can sit 7 spacings off when P is rounded and the row's output cancels; the
# row means stay small). The limits below keep >= 2x over the worst bf16-P kernel; what they
# catch is in the README's mutant table.
ULP_MAX = 16.0    # any one element: 2x the worst bf16-P element
ULP_ROW = 1.0     # a (token, head) row's mean: 2.5x the worst; a mask or KV bug moves whole rows
ULP_GROUP = 0.75  # a token's (all heads) or a head's (all tokens) mean: 2x the worst
ULP_MEAN = 0.5    # the whole output's mean: 2.3x the worst
# With no LSE from the backend the output is all there is to judge (three of issue 8's bugs were
# caught by the LSE alone), so the output limits tighten to ~1.7x over the worst correct kernel.
NO_LSE = {"ulp_row": 0.7, "ulp_token": 0.6, "ulp_head": 0.6, "ulp_mean": 0.4}

# LSE: per row, in units of its fp32 error scale 2^-24 (|lse| + cond) (`lse_unit`). Measured: 120
# correct torch runs of the sweep above peak at 3.1 units (median 0.8; magnitude-8 logits with
# cancelling dot products); at prefix 8K..128K with Kimi-like data a unit is ~1.7e-6 and a correct
# row errs ~7e-7. Bugs, on tests/test_mutants.py's random case, seeds 0-9, prefix 8K..128K: a
# dropped draft or a shifted mask moves the LSE 28..5000 units; one KV row dropped at 128K moves it
# 5..28, under the limit on 3 draws (a physical limit: the probes' heavy last row is for that).
# On the H200, SGLang's Triton kernel (0.5.15.post1, compiled) erred 8.23 units on one row of a
# uint8-mask case (tests/test_triton_sglang.py::test_agrees_with_oracle), over the CPU calibration:
# production kernels use exp2/log2 approximations. 12 units: 1.5x over that worst correct
# production row, under every bug measured but that one row of 128K on some draws. It replaces the
# old 2^-12 max|lse| (~2.5e-3).
LSE_ULPS = 12.0

# With a production path each limit is k_prod x its statistic + PROD_SHARE x the floor (as
# FlashAttention's rule: 2x the production error plus a rounding term).
# 0.5 = PROD_FLOOR_U / OUT_FLOOR_U, max_abs's split: 2x production already holds a kernel's rounding.
PROD_SHARE = 0.5


@dataclass
class Verdict:
    backend: str
    against: str
    metrics: Metrics
    passed: bool
    limit: float                       # the max_abs limit (FlashAttention's rule)
    rule: str
    reasons: list[str]
    lse_limit: float | None = None     # the LSE limit, in lse_unit's (None: no LSE compared)
    checks: dict = field(default_factory=dict)   # name -> (value, limit); failed when value > limit

    @property
    def caught_by(self) -> list[str]:
        """The checks that failed, worst (value/limit) first."""
        bad = [(v / lim if lim > 0 else np.inf, n) for n, (v, lim) in self.checks.items() if not v <= lim]
        return [n for _, n in sorted(bad, reverse=True)]

    @property
    def worst_ratio(self) -> float:
        """max over checks of value / limit: < 1 passes; the margin of a catch is this number."""
        r = [v / lim if lim > 0 else (np.inf if v > 0 else 0.0) for v, lim in self.checks.values()]
        return float(max(r)) if r else 0.0


def out_floor(ref_max_abs: float, with_production: bool = False) -> float:
    """The bf16 rounding floor for outputs whose largest magnitude is ref_max_abs (see OUT_FLOOR_U)."""
    # (at least bf16's smallest spacing, 2^-133: outputs in its subnormal range round that coarsely)
    return max((PROD_FLOOR_U if with_production else OUT_FLOOR_U) * BF16_U * ref_max_abs, 2.0 ** -133)


def _finite(x) -> bool:
    return x is not None and bool(np.isfinite(x))


def _lse_who(m: Metrics) -> str:
    """Who gave no LSE, in the verdict's words."""
    return {"the reference": "the reference", "both": "the backend or the reference"}.get(m.lse_missing, "the backend")


def judge(backend: str, m: Metrics, ref_out=None, production: Metrics | None = None,
          against: str = "oracle", lse_abs_bound: float | None = None) -> Verdict:
    """Pass/fail of `backend` whose metrics against `against` are `m`; every check must hold.

    max_abs (FlashAttention's rule, design.md "Numerics"):
        max_abs <= 2 x production.max_abs + 2^-7 max|ref|    against the oracle, production known
        max_abs <= 2^-6 max|ref|                             against the oracle, no production path
      where production is SGLang's Triton kernel against the same oracle and the max|ref| terms
      are bf16 rounding floors (OUT_FLOOR_U and PROD_FLOOR_U say why these sizes).
    ulp_max, ulp_row, ulp_token, ulp_head, ulp_mean: the error in bf16 spacings, its worst element,
      (token, head) row, token, head and the whole mean, each under its floor (ULP_* say why), or
      2 x the production path's same statistic + half the floor. Without an LSE from the backend
      the floors tighten (NO_LSE) and the verdict says so.
    lse: each row's LSE error in units of its fp32 error scale (lse_unit) <= LSE_ULPS, or 2 x the
      production path's + half that.
    lse_abs_bound: a backend that states its LSE is only this precise (Result.info["lse_abs_bound"],
      in nats, with its reason in the backend: FlashInfer sums bf16-rounded probabilities) is held
      to max |dlse| <= that bound, and its output to the output-only rule (tighter limits), as if it
      gave no LSE: its LSE cannot catch the bugs that move little probability.
    Against a bf16 reference instead of the oracle: 3x production + 2x floors (the reference's own
    error adds: |a-r| <= |a-o| + |r-o|). Any non-finite output where the reference is finite
    fails; a reference with non-finite entries fails (nothing can be judged against it).
    `ref_out` gives max|ref| for the floor; if None, m.ref_max_abs (the same number) is used.
    Where the largest row size before cancellation at a row's largest dim (m.ref_scale_max, from
    metrics' out_scale) is larger, it stands in for max|ref|: P's rounding errs in proportion to it
    (OUT_FLOOR_U).
    """
    if ref_out is not None:
        r = _np(ref_out)
        ref_max = float(np.abs(r[np.isfinite(r)]).max(initial=0.0))
    else:
        ref_max = m.ref_max_abs
    size_txt = "max|ref|"
    if m.ref_scale_max > ref_max:
        ref_max, size_txt = m.ref_scale_max, "the largest row size before cancellation"
    oracle_ref = against == "oracle"
    k_prod, k_floor = (2.0, 1.0) if oracle_ref else (3.0, 2.0)
    # FlashAttention's rule trusts the production path; one that is itself wrong on this case (a
    # stale pool, a capture of another layer, Triton's column drop on a tree out of order) would
    # widen every limit by its own error and let a backend's bug through. Its metrics are against
    # the oracle: held to the floor rule there first, it widens the limits only if it passes.
    prod_note = ""
    if production is not None:
        pv = judge("production", production, ref_out if oracle_ref else None)
        if not pv.passed:
            prod_note = ("the production path fails the floor rule against the oracle on this case ("
                         + "; ".join(pv.reasons) + "): its error does not widen the limits")
            production = None
    prod_err = production.max_abs if production is not None else None
    has_prod = _finite(prod_err)
    floor = k_floor * out_floor(ref_max, has_prod)
    floor_txt = (f"bf16 floor {floor:.2e} (= {k_floor:g} x 2^{-7 if has_prod else -6} "
                 f"x {size_txt} {ref_max:.3g})")
    if has_prod:
        limit = k_prod * prod_err + floor
        how = f"{k_prod:g} x production {prod_err:.2e} + {floor_txt}"
    else:
        limit = floor
        how = f"{floor_txt}, no production path"
    rule = f"max_abs <= {how}"
    no_lse = m.lse_max_abs is None or lse_abs_bound is not None

    reasons: list[str] = []
    checks: dict[str, tuple[float, float]] = {}
    t, h, dd = m.worst
    where = f"worst at token {t} head {h} dim {dd}"
    if m.ref_nonfinite:
        reasons.append(f"the reference ({against}) has {m.ref_nonfinite} non-finite entries: the case "
                       "reads a NaN/inf KV row or is broken (run the lint); nothing can be judged against it")
        checks["reference"] = (float(m.ref_nonfinite), 0.0)
    if m.nonfinite:
        reasons.append(f"nonfinite: {m.nonfinite} non-finite output entries where {against} is finite; {where}")
        checks["nonfinite"] = (float(m.nonfinite), 0.0)
    else:
        checks["max_abs"] = (m.max_abs, limit)
        if not m.max_abs <= limit:
            reasons.append(f"max_abs {m.max_abs:.2e} > limit {limit:.2e} = {how}; {where} "
                           f"(mean_abs {m.mean_abs:.2e}, rel {m.rel:.2e})")

    def scaled(floor_: float, prod_val) -> tuple[float, str]:
        if production is not None and _finite(prod_val):
            return (k_prod * prod_val + k_floor * PROD_SHARE * floor_,
                    f"{k_prod:g} x production {prod_val:.3g} + {k_floor * PROD_SHARE * floor_:.3g}")
        return k_floor * floor_, f"floor {k_floor * floor_:.3g}"

    tr, hr = m.ulp_row_worst
    ulp_checks = (
        ("ulp_max", "ulp_max", ULP_MAX, "the worst element", where),
        ("ulp_row", "ulp_row_max", ULP_ROW, "the worst (token, head) row's mean", f"row token {tr} head {hr}"),
        ("ulp_token", "ulp_token_max", ULP_GROUP, "the worst token's mean over all heads", None),
        ("ulp_head", "ulp_head_max", ULP_GROUP, "the worst head's mean over all tokens", None),
        ("ulp_mean", "ulp_mean", ULP_MEAN, "the mean over the output", None),
    )
    if not m.nonfinite:
        for name, attr, fl, what, at in ulp_checks:
            fl = NO_LSE.get(name, fl) if no_lse else fl
            val = getattr(m, attr)
            lim, txt = scaled(fl, getattr(production, attr) if production is not None else None)
            checks[name] = (val, lim)
            if not val <= lim:
                reasons.append(f"{name}: error in bf16 spacings, {what}, {val:.3g} > limit {lim:.3g} ({txt}"
                               + (", tightened: no LSE" if no_lse and name in NO_LSE else "") + ")"
                               + (f"; {at}" if at else ""))
    rule += f"; ulp_max/row/token/head/mean <= {', '.join(f'{checks[n][1]:.3g}' for n, *_ in ulp_checks if n in checks)}"

    lse_limit = None
    if lse_abs_bound is not None and m.lse_max_abs is not None:
        checks["lse_abs"] = (m.lse_max_abs, lse_abs_bound)
        rule += f"; max |dlse| <= {lse_abs_bound:.2e} (the backend's stated LSE precision), output-only rule"
        if not m.lse_max_abs <= lse_abs_bound:
            lt, lh = m.lse_worst
            reasons.append(f"lse: max |dlse| {m.lse_max_abs:.2e} > {lse_abs_bound:.2e}, the backend's stated LSE "
                           f"precision; worst at token {lt} head {lh}")
    elif not no_lse:
        lse_limit, txt = scaled(LSE_ULPS, production.lse_ulp_max if production is not None else None)
        checks["lse"] = (m.lse_ulp_max, lse_limit)
        rule += f"; lse <= {lse_limit:.3g} fp32 units"
        if not m.lse_ulp_max <= lse_limit:
            lt, lh = m.lse_worst
            reasons.append(f"lse: error {m.lse_ulp_max:.3g} fp32 units (2^-24 (|lse| + cond)) > limit {lse_limit:.3g} "
                           f"({txt}); max |dlse| {m.lse_max_abs:.2e}, worst at token {lt} head {lh}: a scale, "
                           "mask or KV-coverage error, or a different LSE convention (log2?)")
    else:
        rule += f"; no LSE from {_lse_who(m)}: output-only rule, tighter row/token/head/mean limits"
    if prod_note:
        rule += "; " + prod_note
    passed = not reasons
    if passed:
        reasons.append(f"max_abs {m.max_abs:.2e} <= limit {limit:.2e}; worst check at "
                       f"{max(v / l if l > 0 else 0.0 for v, l in checks.values()):.2f} of its limit"
                       + (f"; LSE {m.lse_ulp_max:.3g} <= {lse_limit:.3g} fp32 units" if lse_limit is not None
                          else f"; LSE within its stated {lse_abs_bound:.2e}, output judged on its own "
                          "(tighter limits)" if "lse_abs" in checks
                          else f"; no LSE from {_lse_who(m)}: judged on the output alone "
                          "(tighter limits)")
                       + (f" ({m.empty_rows} rows that see nothing not compared)" if m.empty_rows else ""))
    elif no_lse and "lse_abs" not in checks:
        if m.lse_missing == "the reference":
            reasons.append(f"the reference ({against}) carries no LSE: judged on the output alone (tighter "
                           "limits); judge against the oracle to check the LSE")
        else:
            reasons.append(f"no LSE from {_lse_who(m)}: judged on the output alone (tighter "
                           "limits); return the LSE to catch bugs that move little probability")
    if prod_note:
        reasons.append(prod_note)
    return Verdict(backend=backend, against=against, metrics=m, passed=passed, limit=limit,
                   rule=rule, reasons=reasons, lse_limit=lse_limit, checks=checks)


def seed_line(label: str, m: Metrics) -> str:
    """The seed's diff log line: `[kdkit] L56 max_abs_diff=1.6934e+00 mean=1.1948e-01 rel=1.0837e+00`."""
    return f"[kdkit] {label} max_abs_diff={m.max_abs:.4e} mean={m.mean_abs:.4e} rel={m.rel:.4e}"
