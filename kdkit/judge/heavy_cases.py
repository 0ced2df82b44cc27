"""Probe cases: synthetic cases whose data makes every part of the computation matter.

Random data spreads each row's attention over the whole KV: at a 32K prefix the 9 draft tokens hold
~0.03% of it, and a kernel that drops them moves the output by less than bf16 rounding (issue 8).
A probe gives chosen rows one heavy key each, a KV position that holds about half of the row's
probability (logit ln(kv_len) above the rest), so that every way of losing, moving or mis-reading
that position moves the row by a large amount. The heavy positions of each request:
  - every draft token, seen by its own row (the diagonal of the tree mask; the last one is the last
    KV row), and the root (the mask's first draft column) seen by every row;
  - the prefix's first and last rows; the tile and split boundaries of the KV (positions p with
    p % 32 in {0, 31}: b - 1 and b for split boundaries b of the split counts the kernel may choose,
    kdkit.kernel.schedule's for this shape and 2, 3, 4, 8, ... 256); and several fractions of the
    KV length (1/4, 1/3, 1/2, 2/3, 3/4), rounded to tile boundaries.
Each heavy key points along its own random direction with most of its weight in the 64 rope dims
(so dropping them matters), its V (the key's latent part) distinct from every other.

Shapes: kdkit/shapes.json, set "probes". The short ones and 8K are bundled under
data/captured_tensors/probes/ (kdkit.bundled); the 32K and 128K probes (~38 MB and ~150 MB of KV)
are too large to commit and are generated here, deterministically from their seed, when a test or
`python -m kdkit.judge.heavy_cases --out DIR NAME` asks.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

from .. import shapes
from ..case import Case
from ..constants import KV_LORA_RANK, QK_DIM
from ..kernel import schedule
from ..layout import to_unified

SET = "probes"
BUNDLED = ("probe-seed", "probe-ragged", "probe-causal", "probe-8k")   # committed; the others generated
SPLITS = (2, 3, 4, 8, 16, 32, 64, 128, 256)  # split counts whose boundaries get heavy keys too
FRACTIONS = (1 / 4, 1 / 3, 1 / 2, 2 / 3, 3 / 4)
# a heavy key's logit exceeds the rest by ~ln(kv_len): it holds about half of the row's mass
Q_NORM = 1.0    # x 1/sm_scale: a heavy row's q; its logits against random keys stay ~N(0, 0.6^2)


def _direction(gen: torch.Generator) -> torch.Tensor:
    """A random unit vector of QK_DIM (576) dims, 2/3 of a dot product with itself in the 64 rope
    dims (the latent's 512 scaled by 0.5, the rope's 64 by 2)."""
    u = torch.randn(QK_DIM, generator=gen, dtype=torch.float64)
    u[:KV_LORA_RANK] *= 0.5
    u[KV_LORA_RANK:] *= 2.0
    return u / u.norm()


def split_boundaries(kv_len: int, nsplits) -> list[int]:
    """The first KV position of every split but the first, over the given split counts."""
    out = set()
    for ns in nsplits:
        span = schedule.split_span(kv_len, ns)
        out.update(range(span, kv_len, span))
    return sorted(out)


def heavy_prefix_positions(prefix: int, kv_len: int, default_ns: int) -> list[int]:
    """Prefix positions that get a heavy key, most telling first."""
    first = [0, prefix - 1]
    bounds = split_boundaries(kv_len, [default_ns])
    pick = [b + d for b in (bounds[:1] + bounds[len(bounds) // 2: len(bounds) // 2 + 1] + bounds[-1:])
            for d in (-1, 0)]
    fr = [x + d for f in FRACTIONS for x in [int(f * kv_len) // schedule.BLOCK_N * schedule.BLOCK_N]
          for d in (-1, 0)]
    other = split_boundaries(kv_len, SPLITS)
    more = [b + d for i, b in enumerate(other) if i % max(1, len(other) // 24) == 0 for d in (-1, 0)]
    seen, out = set(), []
    for x in first + pick + fr + more:
        if 0 <= x < prefix and x not in seen:
            seen.add(x)
            out.append(x)
    return out


def _set_kv(case: Case, b: int, t: int, vec: torch.Tensor) -> None:
    """KV position t of request b (sglang layout) := vec: the pool row, or k, v and the pool copy."""
    p = int(case.prefix_lens[b])
    if t < p:
        case.kv_buffer[int(case.kv_indices[int(case.kv_indptr[b]) + t]), 0] = vec.to(case.kv_buffer.dtype)
        return
    tok = int(case.qo_indptr[b]) + t - p
    case.k[tok, 0] = vec.to(case.k.dtype)
    case.v[tok, 0] = case.k[tok, 0, :case.v_head_dim]
    case.kv_buffer[int(case.out_cache_loc[tok]), 0] = case.k[tok, 0].to(case.kv_buffer.dtype)


def plant(case: Case, seed: int, default_ns: int) -> list[dict]:
    """Give rows of each request heavy keys (in place, sglang layout). Returns what was planted:
    one dict per request: {position: [(token, head), ...]}."""
    gen = torch.Generator().manual_seed(10_007 + seed)
    H = case.num_heads
    planted = []
    for b in range(case.batch_size):
        qs, qe = (int(x) for x in case.qo_indptr[b: b + 2])
        n, p = qe - qs, int(case.prefix_lens[b])
        kv_len = p + n
        if n == 0:
            planted.append({})
            continue
        # who targets what: head 0 its own draft token, head 1 the root, the rest the prefix list
        targets: dict[int, list] = {}
        for i in range(n):
            targets.setdefault(p + i, []).append((i, 0))
            if H > 1 and i > 0:
                targets.setdefault(p, []).append((i, 1))
        rows = [(i, h) for h in range(2, H) for i in range(n)]
        for t, row in zip(heavy_prefix_positions(p, kv_len, default_ns), rows):
            targets.setdefault(t, []).append(row)
        beta = math.log(max(kv_len, 2)) + 0.2       # q . k_t * sm_scale = beta: p(t) ~ 1/2
        alpha = Q_NORM / case.sm_scale
        for t in sorted(targets):
            u = _direction(gen)
            _set_kv(case, b, t, beta * u)
            for i, h in targets[t]:
                case.q[qs + i, h] = (alpha * u).to(case.q.dtype)
        planted.append({t: list(r) for t, r in sorted(targets.items())})
    return planted


def make(name: str) -> Case:
    """The probe case `name` of kdkit/shapes.json's "probes" set (deterministic)."""
    from ..backends.torch_ref import default_nsplit
    shape = shapes.find(SET, name)
    layout = shape.pop("layout", "sglang")
    case = shapes.make_case({**shape, "layout": "sglang"})
    planted = plant(case, int(shape.get("seed", 0)), default_nsplit(case, schedule.H200_SM_COUNT))
    heavy = sum(len(r) for r in planted)
    # the note keeps this module's first name: the bundled probes carry it (their sha256 is in
    # data/captured_tensors/manifest.json), so a rebuild stays byte-identical
    case.meta.update(case_id=name, note=(
        f"SYNTHETIC PROBE (kdkit.probes, seed {shape.get('seed', 0)}; not captured from a server): {heavy} heavy KV positions (each draft token for "
        "its own row, the root for every row, the prefix's ends, tile/split boundaries, fractions of the "
        "KV length), each holding about half of its rows' probability."))
    return to_unified(case) if layout == "unified" else case


def names() -> list[str]:
    return [s["name"] for s in shapes.get(SET)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kdkit.judge.heavy_cases", description="Write probe cases.")
    ap.add_argument("names", nargs="*", help=f"probes to write (default: all); from {', '.join(names())}")
    ap.add_argument("--out", required=True, help="folder to write NAME.pt into")
    ap.add_argument("--force", action="store_true", help="overwrite existing files")
    args = ap.parse_args(argv)
    from pathlib import Path
    for name in args.names or names():
        path = make(name).save(Path(args.out) / f"{name}.pt", overwrite=args.force)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
