"""The bundled cases in data/captured_tensors: how they are built, and their manifest.

    python -m kdkit.bundled [--out data/captured_tensors] [--force]   # (re)build them
    python -m kdkit.bundled --verify                                 # files == manifest, expectations hold

Every case is synthetic (kdkit.synth, fixed seeds), so anyone can rebuild them bit for bit. The
`failures/` cases are correct synthetic cases with one of the seed's marshaling bugs applied, the
way the buggy marshaling would have captured them; the lint must name the bug.
manifest.json records, per file: path, description, source, shape, the lint error codes expected,
the replay outcome expected ("pass" or "lint-error"), sha256 and bytes.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from . import lint, shapes
from .judge import heavy_cases
from .case import Case, load
from .files import publish
from .layout import to_unified

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "data" / "captured_tensors"
MANIFEST = "manifest.json"
MAX_TOTAL_BYTES = 50 * 1024 * 1024  # the bundle is committed to git: keep it small
# fixed so that a rebuild with the same torch writes byte-identical files
CREATED = "2026-01-01T00:00:00+00:00"


@dataclass(frozen=True)
class Bundled:
    path: str                   # relative to the bundle folder
    description: str
    make: Callable[[], Case]
    expected_lint: tuple = ()   # lint error codes; () = clean
    expected_replay: str = "pass"


def _finish(case: Case, case_id: str, note: str) -> Case:
    case.meta.update(case_id=case_id, created=CREATED,
                     note=f"SYNTHETIC (kdkit.synth, fixed seed; not captured from a server). {note}")
    return case


def _shape(name: str) -> Case:
    """The synthetic case of a bundled shape (kdkit/shapes.json, set "bundled")."""
    return shapes.make_case(shapes.find("bundled", name))


def _seed_shape() -> Case:
    return _finish(_shape("seed-shape"), "seed-shape",
                   "The seed's failing call, correctly marshaled: bs 1, prefix 21, q_len 9, H 8, an EAGLE-like "
                   "tree (mask 9 x 30 = 270), sglang layout.")


def _ragged() -> Case:
    return _finish(_shape("ragged-bs4"), "ragged-bs4",
                   "A ragged batch of 4 DDTree-like requests: prefixes 0, 37, 300, 5 and q_lens 9, 1, 33, 16 "
                   "(a prefix-0 request, a q_len-1 request, one spanning two 32-row Triton blocks).")


def _ddtree64() -> Case:
    return _finish(_shape("ddtree-b64"), "ddtree-b64",
                   "DDTree best-first tree with budget 64 (q_len 65 = root + 64), prefix 256, H 8; numbered "
                   "parents-first so SGLang's 32-row Triton blocks see every ancestor.")


def _long_prefix() -> Case:
    return _finish(_shape("long-prefix-8k"), "long-prefix-8k",
                   "A long committed prefix: bs 1, prefix 8192, q_len 9 DDTree-like tree, H 8 (the shape where "
                   "SGLang's Triton extend kernel reaches ~7 GB/s).")


def _mask_indptr_sliced() -> Case:
    c = _shape("mask-indptr-sliced")
    # the bug: mask_indptr[1:] (bs END offsets) where the whole bs+1 start offsets belong
    c.mask_indptr = c.mask_indptr[1:].clone()
    return _finish(c, "failure-mask-indptr-sliced",
                   "KNOWN FAILURE (seed bug 1): a correct bs 2 seed-like batch (prefix 21, q_len 9 each) whose "
                   "mask_indptr was captured as mask_indptr[1:] = [270, 540], the END offsets, instead of "
                   "[0, 270, 540]. Lint: mask-indptr-sliced.")


def _prefix_only_kv_indices() -> Case:
    c = to_unified(_shape("prefix-only-kv-indices"))
    # the bug: a unified-layout replay whose kv_indices keep only the prefix (TARGET_VERIFY's
    # kv_indices), so the 9 draft tokens written at out_cache_loc are never read
    p = int(c.prefix_lens[0])
    c.kv_indices = c.kv_indices[:p].clone()
    c.kv_indptr = torch.tensor([0, p], dtype=c.kv_indptr.dtype)
    return _finish(c, "failure-prefix-only-kv-indices",
                   "KNOWN FAILURE (seed bug 2): the seed shape in the unified layout, but kv_indices/kv_indptr "
                   "keep only the 21-token prefix: KV length 21 against a mask of 9 x 30 = 270. "
                   "Lint: prefix-only-kv-indices.")


def _probe(name: str) -> Callable[[], Case]:
    def make() -> Case:
        case = heavy_cases.make(name)
        case.meta.update(created=CREATED)
        return case
    return make


SPECS: tuple[Bundled, ...] = (
    Bundled("seed-shape.pt", "The seed's call shape (bs 1, prefix 21, q_len 9, H 8, tree), correctly marshaled.",
            _seed_shape),
    Bundled("ragged-bs4.pt", "bs 4, prefixes 0/37/300/5, q_lens 9/1/33/16 (prefix 0, q_len 1, two Triton blocks).",
            _ragged),
    Bundled("ddtree-b64.pt", "DDTree budget 64 (q_len 65), prefix 256, H 8.", _ddtree64),
    Bundled("long-prefix-8k.pt", "Prefix 8192, q_len 9, H 8.", _long_prefix),
    Bundled("failures/mask-indptr-sliced.pt",
            "Seed bug 1: mask_indptr[1:] (bs end offsets) captured instead of the bs+1 start offsets.",
            _mask_indptr_sliced, ("mask-indptr-sliced",), "lint-error"),
    Bundled("failures/prefix-only-kv-indices.pt",
            "Seed bug 2: unified layout with kv_indices covering only the prefix (KV 21 vs mask 9 x 30).",
            _prefix_only_kv_indices, ("prefix-only-kv-indices",), "lint-error"),
    # probes (kdkit.judge.heavy_cases): heavy keys where a bug would move them; the 32K/128K probes are
    # generated at test time (too large to commit)
    *(Bundled(f"probes/{name}.pt", f"Probe {name}: heavy keys at the draft tokens, the root, the last KV "
              "row, tile/split boundaries and fractions of the KV length (kdkit.judge.heavy_cases).", _probe(name))
      for name in heavy_cases.BUNDLED),
)


def spec(name: str) -> Bundled:
    """A spec by path ('failures/mask-indptr-sliced.pt') or stem ('mask-indptr-sliced')."""
    for s in SPECS:
        if name in (s.path, Path(s.path).name, Path(s.path).stem):
            return s
    raise KeyError(f"no bundled case {name!r}; choose from {', '.join(s.path for s in SPECS)}")


def build_case(name: str) -> Case:
    """Build one bundled case in memory (deterministic)."""
    return spec(name).make()


def error_codes(case: Case) -> list[str]:
    return sorted({f.code for f in lint.errors(case)})


def shape_of(case: Case) -> dict:
    return {
        "bs": case.batch_size, "num_heads": case.num_heads, "tokens": case.num_tokens,
        "q_lens": case.q_lens, "prefix_lens": case.prefix_lens.tolist(), "layout": case.layout,
        "pool_rows": int(case.kv_buffer.shape[0]), "kv_indices": int(case.kv_indices.numel()),
        "mask_entries": None if case.custom_mask is None else int(case.custom_mask.numel()),
        "mask_indptr": None if case.mask_indptr is None else case.mask_indptr.tolist(),
        "dtype": str(case.q.dtype).replace("torch.", ""),
    }


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _entry(s: Bundled, case: Case, file: Path) -> dict:
    return {
        "path": s.path, "case_id": case.case_id, "description": s.description,
        "source": case.meta["source"], "note": case.meta["note"], "summary": case.summary(),
        "shape": shape_of(case), "expected_lint": list(s.expected_lint),
        "expected_replay": s.expected_replay, "sha256": sha256(file), "bytes": file.stat().st_size,
    }


def _write_json(path: Path, data: dict, overwrite: bool) -> None:
    publish(path, json.dumps(data, indent=2) + "\n", overwrite=overwrite)


def build(out: str | os.PathLike = DEFAULT_DIR, force: bool = False, log=print) -> dict:
    """Build every bundled case into `out` and write manifest.json; returns the manifest.

    Refuses (FileExistsError, nothing written) if any target exists, unless force=True.
    Each case's lint must match its declared expectation before anything is saved.
    """
    out = Path(out)
    targets = [out / s.path for s in SPECS] + [out / MANIFEST]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not force:
        raise FileExistsError(f"{len(existing)} bundled file(s) exist ({', '.join(existing[:3])}"
                              f"{', ...' if len(existing) > 3 else ''}); pass --force (force=True) to rebuild them")
    cases = []
    for s in SPECS:
        case = s.make()
        got = error_codes(case)
        if got != sorted(s.expected_lint):
            raise RuntimeError(f"{s.path}: lint errors {got}, expected {sorted(s.expected_lint)}:\n"
                               + lint.format_findings(lint.check(case)))
        cases.append((s, case))
    entries = []
    for s, case in cases:
        path = case.save(out / s.path, overwrite=force)
        entries.append(_entry(s, case, path))
        log(f"wrote {path} ({entries[-1]['bytes'] / 1e6:.2f} MB): {case.summary()}")
    manifest = {
        "format": "kdkit-bundled-cases", "version": 1,
        "generator": "python -m kdkit.bundled --force (kdkit/bundled.py)",
        "torch_version": str(torch.__version__),
        "total_bytes": sum(e["bytes"] for e in entries),
        "cases": entries,
    }
    _write_json(out / MANIFEST, manifest, overwrite=force)
    log(f"wrote {out / MANIFEST}: {len(entries)} cases, {manifest['total_bytes'] / 1e6:.2f} MB in all")
    return manifest


def load_manifest(out: str | os.PathLike = DEFAULT_DIR) -> dict:
    with open(Path(out) / MANIFEST) as fh:
        return json.load(fh)


def verify(out: str | os.PathLike = DEFAULT_DIR, oracle: bool = True) -> list[str]:
    """Problems with the bundle in `out` ([] when fine): every file matches its manifest entry
    (sha256, bytes), loads, lints as expected, good cases give a finite oracle output, and the total
    stays under MAX_TOTAL_BYTES."""
    from .judge import oracle as _oracle

    out = Path(out)
    try:
        manifest = load_manifest(out)
    except (OSError, ValueError) as e:
        return [f"{out / MANIFEST}: cannot read ({e})"]
    problems, total = [], 0
    for e in manifest.get("cases", []):
        f = out / e["path"]
        if not f.is_file():
            problems.append(f"{e['path']}: listed in the manifest but missing")
            continue
        size = f.stat().st_size
        total += size
        if size != e["bytes"] or sha256(f) != e["sha256"]:
            problems.append(f"{e['path']}: bytes/sha256 differ from the manifest (rebuild with --force, or restore it)")
        try:
            case = load(f)
        except Exception as exc:
            problems.append(f"{e['path']}: does not load: {exc}")
            continue
        got = error_codes(case)
        if got != sorted(e["expected_lint"]):
            problems.append(f"{e['path']}: lint errors {got}, manifest expects {e['expected_lint']}")
        if oracle and e["expected_replay"] == "pass":
            o, lse = _oracle.run(case)
            if not (math.isfinite(float(abs(o).max())) and bool((lse > -float("inf")).all())):
                problems.append(f"{e['path']}: oracle output is not finite")
    listed = {e["path"] for e in manifest.get("cases", [])}
    for f in sorted(out.rglob("*.pt")):
        rel = f.relative_to(out).as_posix()
        if rel not in listed:
            problems.append(f"{rel}: a .pt file the manifest does not list")
    if total >= MAX_TOTAL_BYTES:
        problems.append(f"bundle is {total / 1e6:.1f} MB; keep it under {MAX_TOTAL_BYTES / 1e6:.0f} MB")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kdkit.bundled", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(DEFAULT_DIR), help="bundle folder (default: %(default)s)")
    ap.add_argument("--force", action="store_true", help="overwrite existing files")
    ap.add_argument("--verify", action="store_true", help="check the files against manifest.json, build nothing")
    args = ap.parse_args(argv)
    if args.verify:
        problems = verify(args.out)
        print("\n".join(problems) if problems else f"{args.out}: bundle OK")
        return 1 if problems else 0
    try:
        build(args.out, force=args.force)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
