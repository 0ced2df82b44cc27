"""`kdkit synth`: a synthetic case with the shapes of Kimi K2.6 tree verify."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from .common import EXIT_OK, EXIT_PROBLEM, BadInput, check_out, err, int_list, number


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..constants import LAYOUTS
    from ..synth import KIMI_HEADS_PER_RANK, KIMI_SM_SCALE, TREES
    p.add_argument("--out", required=True, metavar="PATH", type=Path, help="case file to write (.pt)")
    # bounded before the memory estimate, which lists every request (no batch comes near 2^20)
    p.add_argument("--bs", type=number(int, 1, 1 << 20), default=None,
                   help="requests in the batch (default: the length of a --prefix/--q-len list, else 1)")
    p.add_argument("--prefix", type=int_list(0), default="21",
                   help="committed prefix length, one for all requests or a comma list, one per request")
    p.add_argument("--q-len", type=int_list(1), default="9",
                   help="draft tokens per request (1 + tree budget), one or a comma list")
    p.add_argument("--heads", type=number(int, 1), default=KIMI_HEADS_PER_RANK,
                   help="query heads on this rank (Kimi K2.6: 64 heads / TP8)")
    p.add_argument("--tree", choices=TREES, default="ddtree", help="draft tree shape (causal: no custom mask)")
    # torch's generators take a 64-bit seed
    p.add_argument("--seed", type=number(int, 0, 2**64 - 1), default=0, help="random seed of the tree and the tensors")
    p.add_argument("--layout", choices=LAYOUTS, default="sglang",
                   help="sglang: indices cover the prefix, draft from k/v; unified: prefix + draft slots in the pool")
    # a generous bound (8..30 is the stress range): far past it q overflows bf16 and the case is refused when loaded
    p.add_argument("--magnitude", type=number(float, 0, 1e6, lo_open=True), default=1.0,
                   help="scale of q; 8..30 stresses the online softmax")
    p.add_argument("--logit-cap", type=number(float, 0), default=0.0, help="soft cap of the logits, 0 for none")
    p.add_argument("--sm-scale", type=number(float, 0, lo_open=True), default=KIMI_SM_SCALE,
                   help=f"softmax scale (default: Kimi K2.6's, {KIMI_SM_SCALE:.6f})")
    p.add_argument("--case-id", default=None, help="case id (default: built from the parameters)")
    p.add_argument("--force", action="store_true", help="replace an existing file")


def per_request(vals: list[int], bs: int, flag: str):
    if len(vals) == 1:
        return vals[0]
    if len(vals) != bs:
        raise BadInput(f"{flag} has {len(vals)} values for --bs {bs}: give one value or one per request")
    return vals


def run(args) -> int:
    """Write a synthetic case with the shapes of Kimi K2.6 tree verify.

    Exit 1 if the file exists (--force replaces it)."""
    from ..case import CaseError
    from ..synth import make_case, memory_limit_bytes, peak_bytes
    out = args.out
    lists = [len(v) for v in (args.prefix, args.q_len) if len(v) > 1]
    if args.bs is None and len(set(lists)) > 1:
        raise BadInput(f"--prefix has {len(args.prefix)} values and --q-len {len(args.q_len)}: "
                       "give one value or one per request")
    bs = args.bs if args.bs is not None else (lists[0] if lists else 1)
    prefix, q_len = per_request(args.prefix, bs, "--prefix"), per_request(args.q_len, bs, "--q-len")
    need = peak_bytes([prefix] * bs if isinstance(prefix, int) else prefix,
                      [q_len] * bs if isinstance(q_len, int) else q_len, args.heads)
    if need > memory_limit_bytes():
        raise BadInput(f"--bs {bs} --prefix {','.join(map(str, args.prefix))} --q-len {','.join(map(str, args.q_len))} "
                       f"--heads {args.heads}: building it takes about {need / 2**30:.0f} GiB, more than the "
                       f"{memory_limit_bytes() / 2**30:.0f} GiB this machine can give it; "
                       "choose a smaller prefix, q_len or batch")
    check_out(out, {".pt": "case"})  # after the checks above: a refused synth makes no folder
    if out.exists() and not args.force:
        err(f"{out} exists; pass --force to replace it")
        return EXIT_PROBLEM
    try:
        case = make_case(bs=bs, prefix=prefix, q_len=q_len, heads=args.heads, tree=args.tree,
                         seed=args.seed, layout=args.layout, sm_scale=args.sm_scale,
                         logit_cap=args.logit_cap, magnitude=args.magnitude, case_id=args.case_id)
        written = case.save(out, overwrite=args.force)
    except FileExistsError as e:
        err(str(e))
        return EXIT_PROBLEM
    except (ValueError, CaseError) as e:  # what the case file itself refuses (e.g. > 1024 heads)
        raise BadInput(f"synth: {e}")
    print(case.summary())
    print(f"wrote {written} ({os.path.getsize(written)} bytes)")
    return EXIT_OK
