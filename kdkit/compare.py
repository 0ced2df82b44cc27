"""Metrics between two attention outputs, the tolerance rule, and the seed's one-line diff log.

Everything is computed in float64 on the CPU, whatever the inputs' dtype or device.

The rule (FlashAttention's, see `judge`): a backend's error against the float64 oracle may be at
most 2x the production path's error (SGLang's Triton kernel against the same oracle) plus a bf16
rounding floor; without the production path, the floor alone.
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

# LSE floor = 2^-12 x max(1, max|ref lse|), natural-log units. A kernel's fp32 logits from bf16
# inputs carry ~2^-22 relative error (576-term fp32 dot products, exp2/log2 with log2(e) folded in);
# measured torch LSE error peaks at 2^-22 |lse|. 2^-12 leaves ~1000x margin and is still far below
# what a real bug moves: a missing visible column of probability p shifts the LSE by ~p.
LSE_FLOOR_REL = 2.0 ** -12

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
    ref_lse_max_abs: float | None = None               # max|b_lse| over finite entries
    ref_nonfinite: int = 0                             # entries of b that are not finite (excluded)
    empty_rows: int = 0                                # (token, head) rows whose reference sees nothing

    def as_dict(self) -> dict:
        return {"max_abs": self.max_abs, "mean_abs": self.mean_abs, "rel": self.rel,
                "cos_dist": self.cos_dist, "nonfinite": self.nonfinite,
                "lse_max_abs": self.lse_max_abs, "worst": list(self.worst)}


def _rel(num_sq: np.ndarray, den_sq: np.ndarray) -> np.ndarray:
    """sqrt(num/den) with 0/0 = 0 and x/0 = inf (a nonzero output where the reference is 0)."""
    num, den = np.sqrt(num_sq), np.sqrt(den_sq)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))


def metrics(out, ref, lse=None, ref_lse=None) -> Metrics:
    """Compare `out` (a backend) with `ref` ([T, H, D] each; tensors or arrays) in float64.

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
    use = np.isfinite(b)
    ref_nonfinite = int((~use).sum())
    empty = np.zeros((T, H), bool)
    if lb is not None:
        if lb.shape != (T, H):
            raise ValueError(f"ref_lse has shape {lb.shape}, expected {(T, H)}")
        empty = np.isneginf(lb)
        use &= ~empty[..., None]
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

    lse_err, ref_lse_max = None, None
    if la is not None and lb is not None:
        if la.shape != lb.shape:
            raise ValueError(f"lse has shape {la.shape}, ref_lse has {lb.shape}")
        fin = np.isfinite(lb)
        ref_lse_max = float(np.abs(lb[fin]).max()) if fin.any() else 0.0
        dl = np.abs(la - lb)[fin]
        dl = np.where(np.isfinite(dl), dl, np.inf)
        lse_err = float(dl.max()) if dl.size else 0.0
    return Metrics(max_abs=max_abs, mean_abs=mean_abs, rel=rel, cos_dist=cos, nonfinite=nonfinite,
                   lse_max_abs=lse_err, per_head=per_head, per_token=per_token, worst=worst,
                   per_token_head=per_token_head,
                   ref_max_abs=float(np.abs(bz).max()) if bz.size else 0.0,
                   ref_lse_max_abs=ref_lse_max, ref_nonfinite=ref_nonfinite,
                   empty_rows=int(empty.sum()))


@dataclass
class Verdict:
    backend: str
    against: str
    metrics: Metrics
    passed: bool
    limit: float
    rule: str
    reasons: list[str]
    lse_limit: float | None = None


def out_floor(ref_max_abs: float, with_production: bool = False) -> float:
    """The bf16 rounding floor for outputs whose largest magnitude is ref_max_abs (see OUT_FLOOR_U)."""
    return (PROD_FLOOR_U if with_production else OUT_FLOOR_U) * BF16_U * ref_max_abs


def lse_floor(ref_lse_max_abs: float) -> float:
    return LSE_FLOOR_REL * max(1.0, ref_lse_max_abs)


def judge(backend: str, m: Metrics, ref_out=None, production: Metrics | None = None,
          against: str = "oracle") -> Verdict:
    """Pass/fail of `backend` whose metrics against `against` are `m`.

    The tolerance (FlashAttention's rule, design.md "Numerics"):
        max_abs <= 2 x production.max_abs + 2^-7 max|ref|    against the oracle, production known
        max_abs <= 2^-6 max|ref|                             against the oracle, no production path
    where production is SGLang's Triton kernel against the same oracle (what "correct" already
    means in the server) and the max|ref| terms are bf16 rounding floors (OUT_FLOOR_U and
    PROD_FLOOR_U say why these sizes). Against a bf16 reference instead of the oracle: 3x
    production + 2x floor (the reference's own error adds; see the note at LSE_FLOOR_REL).
    Also: any non-finite output where the reference is finite fails; a reference with non-finite
    entries fails (nothing can be judged against it); the LSE is held to the same rule with its own
    floor when both sides have it.
    `ref_out` gives max|ref| for the floor; if None, m.ref_max_abs (the same number) is used.
    """
    if ref_out is not None:
        r = _np(ref_out)
        ref_max = float(np.abs(r[np.isfinite(r)]).max(initial=0.0))
    else:
        ref_max = m.ref_max_abs
    oracle_ref = against == "oracle"
    k_prod, k_floor = (2.0, 1.0) if oracle_ref else (3.0, 2.0)
    prod_err = production.max_abs if production is not None else None
    has_prod = prod_err is not None and bool(np.isfinite(prod_err))
    floor = k_floor * out_floor(ref_max, has_prod)
    floor_txt = (f"bf16 floor {floor:.2e} (= {k_floor:g} x 2^{-7 if has_prod else -6} "
                 f"x max|ref| {ref_max:.3g})")
    if has_prod:
        limit = k_prod * prod_err + floor
        how = f"{k_prod:g} x production {prod_err:.2e} + {floor_txt}"
    else:
        limit = floor
        how = f"{floor_txt}, no production path"
    rule = f"max_abs <= {how}"

    reasons: list[str] = []
    t, h, dd = m.worst
    where = f"worst at token {t} head {h} dim {dd}"
    if m.ref_nonfinite:
        reasons.append(f"the reference ({against}) has {m.ref_nonfinite} non-finite entries: the case "
                       "reads a NaN/inf KV row or is broken (run the lint); nothing can be judged against it")
    if m.nonfinite:
        reasons.append(f"{m.nonfinite} non-finite output entries where {against} is finite; {where}")
    elif not m.max_abs <= limit:
        reasons.append(f"max_abs {m.max_abs:.2e} > limit {limit:.2e} = {how}; {where} "
                       f"(mean_abs {m.mean_abs:.2e}, rel {m.rel:.2e})")

    lse_limit = None
    if m.lse_max_abs is not None:
        lfloor = k_floor * lse_floor(m.ref_lse_max_abs or 0.0)
        p_lse = production.lse_max_abs if production is not None else None
        lse_limit = lfloor + (k_prod * p_lse if p_lse is not None and np.isfinite(p_lse) else 0.0)
        rule += f"; lse_err <= {lse_limit:.2e}"
        if not m.lse_max_abs <= lse_limit:
            reasons.append(f"LSE max_abs {m.lse_max_abs:.2e} > limit {lse_limit:.2e} "
                           f"(floor 2^-12 x max|lse| {m.ref_lse_max_abs or 0.0:.3g}"
                           + (f", {k_prod:g} x production {p_lse:.2e}" if p_lse is not None else "")
                           + "): a scale, mask or KV-coverage error, or a different LSE convention (log2?)")
    passed = not reasons
    if passed:
        reasons.append(f"max_abs {m.max_abs:.2e} <= limit {limit:.2e}"
                       + (f", LSE {m.lse_max_abs:.2e} <= {lse_limit:.2e}" if lse_limit is not None else "")
                       + (f" ({m.empty_rows} rows that see nothing not compared)" if m.empty_rows else ""))
    return Verdict(backend=backend, against=against, metrics=m, passed=passed, limit=limit,
                   rule=rule, reasons=reasons, lse_limit=lse_limit)


def seed_line(label: str, m: Metrics) -> str:
    """The seed's diff log line: `[kdkit] L56 max_abs_diff=1.6934e+00 mean=1.1948e-01 rel=1.0837e+00`."""
    return f"[kdkit] {label} max_abs_diff={m.max_abs:.4e} mean={m.mean_abs:.4e} rel={m.rel:.4e}"
