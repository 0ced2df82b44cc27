"""Trials of the judge: correct backends on random cases (no false alarm) and mutants (every bug caught).

    from kdkit import trials
    spec = trials.spec_for_seed(7)                 # a random call shape, as a dict; seeded
    case = trials.make(spec)                       # its synthetic case
    t = trials.check(case, "torch")                # run, judge with and without the LSE
    s = trials.run_correct("cuda", range(1000), out_dir="reports/property")   # the GPU run
    rows = trials.mutant_rows("torch", {"probe-8k": heavy_cases.make("probe-8k")})

    python -m kdkit.judge.trials correct --backend cuda --seeds 0:1000 --big --out reports/property
    python -m kdkit.judge.trials mutants --backend cuda [--cases bundled,probes]

A correct run that fails prints its seed and spec and saves the case under out_dir, with the options
the trial ran with (p_bf16, nsplit, ...: `kdkit replay` cannot set them) in its meta["trial"], and
prints the call that reproduces its numbers: `trials.check(load(FILE), "torch", p_bf16=..., nsplit=...)`. Each check is judged twice: with the backend's LSE,
and on the output alone (kdkit.judge.compare's stricter no-LSE rule), both against the float64 oracle.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .. import backends, synth
from . import oracle
from .compare import Verdict, judge, metrics
from .wrong_kernels import MUTANTS

TREES = ("ddtree", "chain", "eagle", "causal")
HEADS = (1, 2, 8, 16, 64, 128)


def spec_for_seed(seed: int, work: float = 5e4, rows: int = 256, kv: int = 3000, long_every: int = 25) -> dict:
    """A random call shape (kdkit.synth.make_case arguments) drawn from `seed`: bs 1..8, q_len
    1..257, prefix 0..128K, H 1..128, chains/trees/causal, both layouts, int32/int64 indices,
    bool/uint8 masks, magnitude 1..30, logit cap 0/30. The shape is shrunk until q rows x heads
    x KV length <= work, query rows x heads <= rows and the batch's KV rows <= kv (a CPU check in
    ~0.1 s; the GPU run can raise all three), except every `long_every`-th seed, which keeps one
    request of prefix 8K..128K with q_len 9 and H 8 (the regime where small bugs hide)."""
    rng = np.random.default_rng(1_000_003 + seed)
    bs = int(rng.choice([1, 1, 1, 2, 3, 4, 8]))
    heads = int(rng.choice(HEADS))
    q_lens = [int(rng.choice([1, 2, 5, 9, 17, 33, 65, 129, 257])) for _ in range(bs)]
    prefixes = [int(rng.choice([0, 1, 7, 21, 31, 32, 33, 100, 1000, 4095, 8192, 32768, 131072])) for _ in range(bs)]
    tree = str(rng.choice(TREES))
    if long_every and seed % long_every == long_every - 1:
        bs, heads, q_lens, tree = 1, 8, [9], "ddtree"
        prefixes = [int(rng.choice([8190, 8192, 32768, 32771, 131072]))]
        work = rows = kv = float("inf")

    def cost():
        return sum(q * heads * (p + q) for q, p in zip(q_lens, prefixes))

    while cost() > work or sum(q_lens) * heads > rows or sum(prefixes) > kv:
        b = int(np.argmax([q * heads * (p + q) for q, p in zip(q_lens, prefixes)]))
        if sum(q_lens) * heads > rows and heads > 1:
            heads = max(1, heads // 2)
        elif sum(prefixes) > kv or prefixes[b] > 4 * q_lens[b] or q_lens[b] == 1:
            b = int(np.argmax(prefixes)) if sum(prefixes) > kv else b
            prefixes[b] //= 2
        elif q_lens[b] > 1:
            q_lens[b] = max(1, q_lens[b] // 2)
        else:
            heads = max(1, heads // 2)
    if max(q_lens) < 2 and tree == "ddtree":
        tree = "chain"
    return {"bs": bs, "prefix": prefixes, "q_len": q_lens, "heads": heads, "tree": tree, "seed": int(seed),
            "layout": str(rng.choice(["sglang", "unified"])),
            "magnitude": float(rng.choice([1.0, 1.0, 1.0, 8.0, 30.0])),
            "logit_cap": float(rng.choice([0.0, 0.0, 0.0, 30.0])),
            "index_dtype": str(rng.choice(["int32", "int64"])), "mask_dtype": str(rng.choice(["bool", "uint8"])),
            "spare_rows": int(rng.integers(0, 40))}


def make(spec: dict):
    """The synthetic case of a spec (spec_for_seed's dict, or one a hypothesis strategy drew)."""
    kw = dict(spec)
    kw["index_dtype"] = getattr(torch, kw.get("index_dtype", "int32"))
    kw["mask_dtype"] = getattr(torch, kw.get("mask_dtype", "bool"))
    kw.setdefault("case_id", f"trial-seed{spec.get('seed', 0)}")
    kw.setdefault("note", "random trial case (kdkit.judge.trials): " + json.dumps(spec, sort_keys=True))
    return synth.make_case(**kw)


@dataclass
class Trial:
    backend: str
    case_id: str
    with_lse: Verdict | None       # None when the backend returned no LSE
    output_only: Verdict
    info: dict = field(default_factory=dict)
    opts: dict = field(default_factory=dict)    # the backend options it ran with (p_bf16, nsplit, ...)

    @property
    def passed(self) -> bool:
        return self.output_only.passed and (self.with_lse is None or self.with_lse.passed)

    @property
    def ratio(self) -> float:
        """The worst check's value / limit over both judgements (< 1 passes)."""
        return max(v.worst_ratio for v in (self.with_lse, self.output_only) if v is not None)


class Reference:
    """The float64 oracle's output, LSE, LSE condition and row sizes of one case, computed once."""

    def __init__(self, case):
        self.out, self.lse, self.cond, self.scale = oracle.run(case, with_cond=True, with_scale=True)


def check(case, backend: str, ref: Reference | None = None, **opts) -> Trial:
    """Run `backend` on a clone of `case` and judge it against the oracle, with and without its LSE."""
    trial = check_result(backend, backends.run(backend, case.clone(), **opts), ref or Reference(case))
    trial.case_id = case.case_id
    trial.opts = dict(opts)
    return trial


def check_result(backend: str, res, ref: Reference) -> Trial:
    """Judge one backend Result against the oracle, with its LSE (if any) and on the output alone."""
    with_lse = None
    if res.lse is not None:
        with_lse = judge(backend, metrics(res.out, ref.out, res.lse, ref.lse, lse_cond=ref.cond,
                                          out_scale=ref.scale), ref.out,
                         lse_abs_bound=res.info.get("lse_abs_bound"))
    return Trial(backend, "", with_lse, judge(backend, metrics(res.out, ref.out, out_scale=ref.scale), ref.out),
                 dict(res.info))


@dataclass
class Summary:
    backend: str
    examples: int = 0
    failures: list = field(default_factory=list)    # (seed, saved path, reasons)
    worst_ratio: float = 0.0
    worst_seed: int | None = None
    seconds: float = 0.0

    def line(self) -> str:
        return (f"{self.backend}: {self.examples} correct random cases, {len(self.failures)} false alarm(s), "
                f"worst error-to-limit ratio {self.worst_ratio:.3f} (seed {self.worst_seed}), {self.seconds:.0f} s")


def record_failure(case, seed, trial: Trial, out_dir) -> Path:
    """Save a case that raised a false alarm, with the trial's backend, seed and options in
    meta["trial"] (plain values): `repro_call(path, trial)` is the call that reproduces its numbers
    (`kdkit replay FILE` judges it too, but with the backend's default p_bf16 / nsplit)."""
    path = Path(out_dir) / f"false-alarm-{trial.backend}-seed{seed}.pt"
    meta = {**case.meta, "trial": {"backend": trial.backend, "seed": int(seed), "opts": dict(trial.opts)}}
    case.clone(meta=meta).save(path, overwrite=True)
    return path


def repro_call(path, trial: Trial) -> str:
    """The exact call that reruns a saved trial: `trials.check(load("PATH"), "torch", p_bf16=True, nsplit=3)`
    (kdkit.judge.trials and kdkit.case.load imported)."""
    args = "".join(f", {k}={v!r}" for k, v in sorted(trial.opts.items()))
    return f"trials.check(load({str(path)!r}), {trial.backend!r}{args})"


# larger shapes for a GPU host (its CPU runs the float64 oracle: ~1 s a case at these sizes)
BIG = {"work": 4e6, "rows": 4096, "kv": 200_000}


def run_correct(backend: str, seeds, out_dir="reports/property", log=print, spec_kw: dict | None = None,
                max_seconds: float | None = None, **opts) -> Summary:
    """Correct-backend trials over `seeds` (spec_for_seed(seed, **spec_kw)); every failure printed
    with its seed and saved under out_dir. The GPU run: run_correct("cuda", range(1000), spec_kw=BIG)."""
    s = Summary(backend)
    t0 = time.perf_counter()
    for seed in seeds:
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            log(f"stopped after {max_seconds:g} s (--max-seconds) before seed {seed}")
            break
        case = make(spec_for_seed(seed, **(spec_kw or {})))
        t = check(case, backend, **opts)
        s.examples += 1
        if t.ratio > s.worst_ratio:
            s.worst_ratio, s.worst_seed = t.ratio, seed
        if not t.passed:
            path = record_failure(case, seed, t, out_dir)
            why = [r for v in (t.with_lse, t.output_only) if v is not None and not v.passed for r in v.reasons]
            s.failures.append((seed, str(path), why))
            log(f"FALSE ALARM seed {seed}: {case.summary()}; saved {path}; reproduce: "
                f"{repro_call(path, t)}; {'; '.join(why)[:400]}")
    s.seconds = time.perf_counter() - t0
    log(s.line())
    return s


@dataclass
class MutantRow:
    mutant: str
    case_id: str
    status: str                   # "caught" | "MISSED" | "cannot act" | "error: ..."
    caught_by: str = ""           # the check with the largest value/limit, with the LSE
    ratio: float = 0.0            # its value / limit
    output_only: str = ""         # the same on the output alone ("-" when missed there)
    output_ratio: float = 0.0


def mutant_rows(backend: str, cases: dict, names=None, **opts) -> list[MutantRow]:
    """Every mutant of `names` (default: all) on every case: caught, missed, or unable to act
    (its output and LSE are bit-identical to the correct build's on that case)."""
    rows = []
    for cid, case in cases.items():
        ref = Reference(case)
        good = backends.run(backend, case.clone(), **opts)
        for name in names or MUTANTS:
            try:
                bad = backends.run(backend, case.clone(), mutant=name, **opts)
            except Exception as e:  # a mutant that does not build or run: a row that says so
                rows.append(MutantRow(name, cid, f"error: {type(e).__name__}: {e}".splitlines()[0][:200]))
                continue
            same_lse = (bad.lse is None and good.lse is None) or (
                bad.lse is not None and good.lse is not None and torch.equal(bad.lse, good.lse))
            if torch.equal(bad.out, good.out) and same_lse:
                rows.append(MutantRow(name, cid, "cannot act"))
                continue
            t = check_result(backend, bad, ref)
            v = t.with_lse or t.output_only
            rows.append(MutantRow(name, cid, "MISSED" if v.passed else "caught",
                                  (v.caught_by or ["-"])[0], v.worst_ratio,
                                  (t.output_only.caught_by or ["-"])[0], t.output_only.worst_ratio))
    return rows


def table(rows: list[MutantRow]) -> str:
    """A Markdown table, one line per mutant: where it was caught, by which check, by how much."""
    out = ["| mutant | caught on | check (value / limit, worst case) | output alone | cannot act on |",
           "|---|---|---|---|---|"]
    for name in dict.fromkeys(r.mutant for r in rows):
        mine = [r for r in rows if r.mutant == name]
        caught = [r for r in mine if r.status == "caught"]
        missed = [r for r in mine if r.status == "MISSED"]
        inert = [r.case_id for r in mine if r.status == "cannot act"]
        errors = [r for r in mine if r.status.startswith("error")]
        if errors:
            out.append(f"| {name} | {errors[0].status} ({len(errors)} cases) | - | - | - |")
            continue
        low = min(caught, key=lambda r: r.ratio, default=None)
        lo_out = min(caught, key=lambda r: r.output_ratio, default=None)
        out.append(f"| {name} | {len(caught)}/{len(mine) - len(inert)} cases"
                   + (f" (MISSED on {', '.join(r.case_id for r in missed)})" if missed else "")
                   + f" | {low.caught_by} x{low.ratio:.3g} ({low.case_id})" if low else f"| {name} | 0 | -")
        if lo_out is None:
            out[-1] += " | -"
        elif lo_out.output_ratio > 1:
            out[-1] += f" | {lo_out.output_only} x{lo_out.output_ratio:.3g} ({lo_out.case_id})"
        else:
            out[-1] += f" | missed on {lo_out.case_id} (x{lo_out.output_ratio:.2g})"
        out[-1] += f" | {', '.join(inert) or '-'} |"
    return "\n".join(out)


def _seeds(text: str) -> range:
    lo, _, hi = text.partition(":")
    return range(int(lo), int(hi)) if hi else range(int(lo))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kdkit.judge.trials", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("correct", help="correct random cases: no false alarm")
    c.add_argument("--backend", default="torch")
    c.add_argument("--seeds", default="0:500", help="A:B (or N for 0:N)")
    c.add_argument("--out", default="reports/property", help="where failing cases are saved")
    c.add_argument("--big", action="store_true", help=f"larger shapes ({BIG}), for a GPU host")
    c.add_argument("--max-seconds", type=float, default=None,
                   help="stop drawing new cases after this long (a GPU host's per-command limit); "
                        "the summary counts the cases that ran")
    m = sub.add_parser("mutants", help="every mutant on the bundled cases and the probes")
    m.add_argument("--backend", default="torch")
    m.add_argument("--long", action="store_true", help="also the generated probe-32k and probe-128k")
    args = ap.parse_args(argv)
    if args.cmd == "correct":
        return 1 if run_correct(args.backend, _seeds(args.seeds), args.out, spec_kw=BIG if args.big else None,
                                max_seconds=args.max_seconds).failures else 0
    from .. import bundled
    from . import heavy_cases
    from ..case import load
    cases = {Path(e["path"]).stem: load(bundled.DEFAULT_DIR / e["path"])
             for e in bundled.load_manifest()["cases"] if e["expected_replay"] == "pass"}
    if args.long:
        cases.update({n: heavy_cases.make(n) for n in heavy_cases.names() if n not in heavy_cases.BUNDLED})
    rows = mutant_rows(args.backend, cases)
    print(table(rows))
    return 1 if any(r.status != "caught" and r.status != "cannot act" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
