"""A/B timing of kdkit's kernel as two or more commits have it, on one GPU, in one command.

Where git is (no GPU needed): each ref's kdkit package, written out under DIR:

    python -m kdkit.perf.kernel_ab export DIR main my-branch [NAME=REF ...] [NAME=REF:skip=gather,nt=3 ...]

On the GPU host (any copy of the tree that holds DIR):

    python -m kdkit.perf.kernel_ab time DIR [--shapes TEXT] [--rounds 2] [--budget-s 0.3]

Each variant runs in its own process, importing its own kdkit (so its own kernel source, plan and
JIT cache key: this file is run by its path, with the variant's folder as PYTHONPATH), in rounds whose order alternates (a, b, b, a, ...): drift between rounds shows as
the spread of a variant's times. Graph replay, a 256 MiB L2 flush before each call, the median
(kdkit.perf.timing.Timer, as `kdkit bench` times), at the plan's own choice of block size and splits.
Rows go to DIR/times.jsonl (appended, each naming its variant's commit); the table at the end
gives each variant's fastest and slowest time per shape and its ratio to the first variant's
(`table DIR` prints it again), from the rows of the commit each variant name has now. The cases
are the grid's (`kdkit bench`'s tree and seed for each shape).

A variant may fix plan options after a colon (`skip`, `nt`, `nh`, `nsplit`, `fused`, `mutant`, `knockout`;
values true, false, none, an integer or a word): `plain=main:skip=false step=main:skip=true` times
two builds of one commit, `ko=main:knockout=softmax` the timing-only build without the softmax's
work (kdkit/kernel/knockouts.py); every shape the option does not fit (or that the variant's kdkit does not know) is
reported and left out of that variant. `extra_defines=NAME=V+NAME=V` builds a commit with an
experiment's defines (a change kept behind an #ifndef default in the kernel's source:
PlanOptions.extra_defines), so one branch can carry a change and its baseline:
`base=my-branch new=my-branch:extra_defines=KP_SKEW=1`.

Before a variant is timed at a shape, in the first round, the output of its graph there is
judged as `kdkit bench` judges (kdkit.perf.correctness: the float64 oracle, or the fp32 torch
backend on the largest shapes); a variant judged wrong is not timed at that shape in any round
and the table says WRONG (a mutant, `m=main:mutant=skip-rope`, shows the judging at work).
Knockouts are wrong by design and not judged; `time --no-judge` skips the judging.

The shapes: `kdkit bench --quick`'s and the deep trees at prefix 21 (q_len 64, 257; DEEP), or with
--shapes the grid's shapes whose label contains TEXT, or any of several texts separated by commas
(labels read "32x131072 q9 H8": `--shapes "1x21 q9 H8,x32768 q9 H8"`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# the prefix-21 trees where the per-node Triton decode kernel was as fast or faster on the grid of
# e4e46b5 (2026-12-01); on the grid of main since (the 32-row gather) kdkit leads on all, by 3-28%
DEEP = [(1, 21, 64, 8), (1, 21, 64, 16), (1, 21, 257, 8), (1, 21, 257, 16), (8, 21, 257, 16)]


OPTS = ("skip", "nt", "nh", "nsplit", "fused", "mutant", "knockout", "extra_defines")  # PlanOptions a variant may fix


def _value(text: str):
    low = text.lower()
    if low in ("true", "false", "none"):
        return {"true": True, "false": False, "none": None}[low]
    return int(text) if text.isdigit() else text


def _variant(spec: str) -> tuple[str, str, dict]:
    """NAME=REF[:OPT=V,...], or REF named after itself (what a directory name cannot hold becomes
    '-'); git forbids ':' in a ref's name, so the first ':' starts the options."""
    head, _, opt_text = spec.partition(":")
    name, ref = head.split("=", 1) if "=" in head else (re.sub(r"[^A-Za-z0-9_.-]", "-", head).lstrip(".-"), head)
    if not NAME.match(name):
        raise SystemExit(f"error: variant name {name!r} (from {spec!r}): use letters, digits, '.', '_', '-'")
    opts = {}
    for item in filter(None, opt_text.split(",")):
        key, eq, val = item.partition("=")
        if key not in OPTS or not eq:
            raise SystemExit(f"error: option {item!r} of {spec!r}: write KEY=VALUE with KEY one of {OPTS}")
        opts[key] = _defines(val, spec) if key == "extra_defines" else _value(val)
    return name, ref, opts


def _defines(text: str, spec: str) -> dict:
    """'KP_A=1+KP_B=-2' -> {'KP_A': 1, 'KP_B': -2}, the names and values checked as the plan checks
    them (kdkit.kernel.spec.extra_defines); whether the build reads them, the plan checks."""
    from kdkit.kernel import spec as kspec
    out = {}
    for item in text.split("+"):
        k, eq, v = item.partition("=")
        if not (k and eq and re.fullmatch(r"-?\d+", v)) or k in out:
            raise SystemExit(f"error: extra_defines {text!r} of {spec!r}: write NAME=INTEGER, several joined by "
                             "'+', each name once")
        out[k] = int(v)
    try:
        kspec.extra_defines(out)
    except kspec.ConfigError as e:
        raise SystemExit(f"error: extra_defines of {spec!r}: {e}") from None
    return out


def export(out: Path, specs: list[str], repo: Path = ROOT) -> dict:
    """Write each ref's kdkit/ to out/NAME/kdkit and out/refs.json; refuse to overwrite a variant."""
    variants = {name: ref for name, ref, _ in map(_variant, specs)}
    options = {name: opts for name, _, opts in map(_variant, specs)}
    if len(variants) != len(specs):
        raise SystemExit("error: two variants share a name; name them NAME=REF")
    commits = {}
    for name, ref in variants.items():  # every check before anything is written
        if (out / name).exists():
            raise SystemExit(f"error: {out / name} exists; remove it or choose another name")
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                                capture_output=True, text=True)
        if commit.returncode:
            raise SystemExit(f"error: {ref!r} is not a commit of {repo}: {commit.stderr.strip()}")
        commits[name] = commit.stdout.strip()
        for define in options[name].get("extra_defines", {}):  # a name the kernel never mentions: refused
            # here, not on the GPU host (whether the build it plans changes, the plan checks there)
            if subprocess.run(["git", "-C", str(repo), "grep", "-q", "-F", "-w", "-e", define, commits[name], "--",
                               "kdkit/kernel/cuda", ":(exclude)kdkit/kernel/cuda/mma_peak.cu"]).returncode:
                raise SystemExit(f"error: {define} (variant {name}): the kernel's source at {ref} never reads it; "
                                 "an experiment's define needs its #ifndef default there")
    out.mkdir(parents=True, exist_ok=True)
    refs_path = out / "refs.json"
    refs = json.loads(refs_path.read_text()) if refs_path.exists() else {}
    for name, ref in variants.items():
        (out / name).mkdir()
        tar = subprocess.run(["git", "-C", str(repo), "archive", commits[name], "kdkit"],
                             capture_output=True, check=True).stdout
        subprocess.run(["tar", "x", "-C", str(out / name)], input=tar, check=True)
        refs[name] = {"ref": ref, "commit": commits[name], "opts": options[name]}
        refs_path.write_text(json.dumps(refs, indent=1) + "\n")
    return refs


def shapes(text: str | None) -> list[tuple[int, int, int, int]]:
    """(bs, prefix, q_len, heads) of the shapes to time."""
    return [s[:4] for s in _grid_shapes(text)]


def _grid_shapes(text: str | None) -> list[tuple]:
    """The shapes to time as `kdkit bench` makes their cases: (bs, prefix, q_len, heads, tree, seed)
    of the grid's entry (the tree and seed decide the mask, and so what the skip builds skip)."""
    from kdkit.perf import bench  # (absolute: the child runs this file by its path)
    grid = bench.grid()
    if text:
        texts = [t.strip() for t in text.split(",") if t.strip()]
        picked = [s for s in grid if any(t in s.label for t in texts)]
        if not picked:
            raise SystemExit(f"error: --shapes {text!r} matches no shape; labels look like {grid[0].label}")
    else:
        picked = bench.grid(quick=True)
        picked += [s for s in grid if (s.bs, s.prefix, s.q_len, s.heads) in DEEP and s not in picked]
    return [(s.bs, s.prefix, s.q_len, s.heads, s.tree, s.seed) for s in picked]


def _judge(case, p, opts: dict):
    """The verdict of the plan's output on `case` (launched already), as kdkit bench judges it; None
    for a knockout (wrong by design) or a variant's kdkit too old to judge (no kdkit.perf.correctness)."""
    if opts.get("knockout"):
        return None
    try:
        from kdkit.backends import Result
        from kdkit.perf.correctness import Reference
    except ImportError:
        return None
    import torch
    torch.cuda.synchronize()
    return Reference(case).judge("cuda", Result(p.out.clone(), p.lse.clone(), {}))


def _judged_wrong(rows) -> set:
    """(variant, commit, shape) of the rows judged wrong (no time: never timed there)."""
    return {(r["variant"], r.get("commit", ""), (r["bs"], r["prefix"], r["q_len"], r["heads"]))
            for r in rows if "us" in r and r["us"] is None}


def child(vdir: str, name: str, shapes_json: str, out: str, budget_s: float, rnd: int, opts: dict,
          commit: str = "", judge: bool = False) -> None:
    """In a fresh process: import the variant's kdkit, time each shape at the variant's plan
    options, append rows; a shape the options do not fit is reported and left out. judge: each
    shape's output judged first (a wrong one gets a row with its verdict and no time)."""
    import torch
    import kdkit
    from kdkit import kernel
    from kdkit.backends import cuda
    try:
        from kdkit.perf.bench import Shape, make_case
        from kdkit.perf.timing import Timer, graph_of
    except ImportError:  # a variant's kdkit from before kdkit.perf (its bench held the timer)
        from kdkit.bench import Shape, Timer, graph_of, make_case
    assert Path(kdkit.__file__).resolve().is_relative_to(Path(vdir).resolve()), kdkit.__file__
    timer = Timer(torch.device("cuda"))
    # the shapes where an earlier round judged this variant wrong: not timed again
    rows = [json.loads(line) for line in Path(out).read_text().splitlines() if line.strip()] if Path(out).exists() else []
    wrong = {shape for v, c, shape in _judged_wrong(rows) if (v, c) == (name, commit)}
    with open(out, "a") as f:
        for bs, prefix, q_len, heads, *how in json.loads(shapes_json):
            if (bs, prefix, q_len, heads) in wrong:
                print(f"{name} {bs}x{prefix} q{q_len} H{heads}: judged WRONG before, not timed", file=sys.stderr, flush=True)
                continue
            try:
                shape = Shape(bs, prefix, q_len, heads, *how)  # the grid's tree and seed
            except TypeError:  # a variant's kdkit from before Shape took them
                shape = Shape(bs, prefix, q_len, heads)
            case = make_case(shape)
            x = cuda.to_device(case)
            try:
                p = (cuda.plan_case(case, x, kernel.PlanOptions(**opts)) if hasattr(kernel, "PlanOptions")
                     else cuda.plan_case(case, x, **opts))  # (a variant's kdkit from before PlanOptions)
            except (ValueError, TypeError) as e:  # kdkit's InputError: e.g. the gather at a block size it
                # cannot hold; TypeError: an option this variant's kdkit does not take
                if "extra_defines" in str(e):  # the experiment itself is wrong: say so by the exit status
                    raise
                print(f"{name} {bs}x{prefix} q{q_len} H{heads}: left out: {e}", file=sys.stderr, flush=True)
                continue
            row = {"variant": name, "commit": commit, "round": rnd, "bs": bs, "prefix": prefix, "q_len": q_len, "heads": heads,
                   "nsplit": p.nsplit, "rows_per_cta": p.rows_per_cta, "module": p.key,
                   "fused": bool(getattr(p, "fused", False))}
            replay = graph_of(lambda: kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"]))
            verdict = None
            if judge and hasattr(p, "out"):  # the output of the graph that is timed, not of the eager call
                p.out.zero_()
                replay()
                try:
                    verdict = _judge(case, p, opts)
                except Exception as e:  # e.g. the reference out of memory: timed, and the row says so
                    row["verdict"] = f"not judged: {type(e).__name__}: {e}"
                    print(f"{name} {bs}x{prefix} q{q_len} H{heads}: {row['verdict']}", file=sys.stderr, flush=True)
            if verdict is not None:
                row["verdict"] = verdict.line
            row["us"] = round(timer.us(replay, budget_s=budget_s), 2) if verdict is None or verdict.passed else None
            if row["us"] is None:
                print(f"{name} {bs}x{prefix} q{q_len} H{heads}: WRONG, not timed: {verdict.line}", file=sys.stderr, flush=True)
            print(json.dumps(row), file=f, flush=True)
            del x, replay, p
            torch.cuda.empty_cache()


def time_all(d: Path, text: str | None, rounds: int, budget_s: float, judge: bool = True) -> int:
    refs = json.loads((d / "refs.json").read_text())
    names = list(refs)
    todo = json.dumps(_grid_shapes(text))
    bad = 0
    for rnd in range(rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            # -P: this file's folder is not put on sys.path; PYTHONPATH: the variant's kdkit first
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(d / name), os.environ.get("PYTHONPATH")]))}
            r = subprocess.run([sys.executable, "-P", __file__, "_child", str(d / name), name, todo,
                                str(d / "times.jsonl"), str(budget_s), str(rnd),
                                json.dumps(refs[name].get("opts", {})), refs[name]["commit"],
                                "judge" if judge and rnd == 0 else "-"], env=env)
            print(f"round {rnd} {name}: exit {r.returncode}", file=sys.stderr, flush=True)
            bad += r.returncode != 0
    print(table(d))
    return 1 if bad else 0


def table(d: Path) -> str:
    refs = json.loads((d / "refs.json").read_text())
    path = d / "times.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    if not rows:
        return f"{path}: no rows (every variant failed before its first shape: see its exit status above)"
    names = list(refs)  # the first exported is the baseline of every ratio, measured or not
    # rows of a variant exported again under the same name from another commit are not this one's
    # (rows from before rows named their commit are kept)
    rows = [r for r in rows if r["variant"] in refs and r.get("commit", "") in ("", refs[r["variant"]]["commit"])]
    by: dict = {}
    for r in rows:
        by.setdefault((r["bs"], r["prefix"], r["q_len"], r["heads"]), {}).setdefault(r["variant"], []).append(r["us"])
    # a variant judged wrong at a shape: its times there (if any round timed it) say nothing
    wrong = {(shape, v) for v, _, shape in _judged_wrong(rows)}
    def title(n):
        opts = ",".join(f"{k}={'+'.join(f'{a}={b}' for a, b in v.items()) if isinstance(v, dict) else v}"
                        for k, v in refs[n].get("opts", {}).items())  # (as the variant was written)
        return f"{n} ({refs[n]['commit'][:7]}{' ' + opts if opts else ''})"
    head = ["shape"] + [title(n) for n in names]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for shape, per in by.items():
        per = {n: ts for n, ts in per.items() if (shape, n) not in wrong}
        base = min(per[names[0]]) if names[0] in per else None
        cells = ["{}x{} q{} H{}".format(*shape)]
        for n in names:
            if (shape, n) in wrong:
                cells.append("WRONG")
                continue
            if n not in per:
                cells.append("-")
                continue
            lo, hi = min(per[n]), max(per[n])
            ratio = f" x{lo / base:.3f}" if base and n != names[0] else ""
            cells.append(f"{lo:.2f}-{hi:.2f} us{ratio}")
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        vdir, name, todo, out, budget, rnd, opts, commit, judge = argv[1:]
        child(vdir, name, todo, out, float(budget), int(rnd), json.loads(opts), commit, judge == "judge")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="write each ref's kdkit/ under DIR (needs git)")
    e.add_argument("dir", type=Path)
    e.add_argument("refs", nargs="+", help="REF, NAME=REF or NAME=REF:OPT=V,...; the first is the baseline")
    t = sub.add_parser("time", help="time every variant under DIR on this GPU")
    t.add_argument("dir", type=Path)
    t.add_argument("--shapes", default=None,
                   help="the grid's shapes whose label contains this text (or any of several, comma-separated)")
    t.add_argument("--rounds", type=int, default=2)
    t.add_argument("--budget-s", type=float, default=0.3, help="timing budget per shape and variant")
    t.add_argument("--no-judge", action="store_true", help="time without judging each variant's output first")
    p = sub.add_parser("table", help="print the table of DIR/times.jsonl")
    p.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "export":
        for name, v in export(args.dir, args.refs).items():
            print(f"{name}: {v['ref']} {v['commit'][:12]}")
        return 0
    if not (args.dir / "refs.json").exists():
        raise SystemExit(f"error: {args.dir}/refs.json not found; run `export` first")
    if args.cmd == "table":
        print(table(args.dir))
        return 0
    return time_all(args.dir, args.shapes, args.rounds, args.budget_s, judge=not args.no_judge)


if __name__ == "__main__":
    sys.exit(main())
