"""`kdkit bench` results files: load one (checked field by field), find the latest committed one,
select rows, the grid's verdicts. The figures are in kdkit.plots; the measuring is
kdkit.perf.bench's (which also measures live sweeps: bench.obtain).

A results file is one GPU run (benchmarks/results/<gpu>-<date>.json):
    {"gpu", "sms", "copy_gbps", "mma_tflops", "driver", "versions", "date", "rows": [row, ...]}
    row = {backend, bs, prefix, q_len, heads, nsplit, nsplit_auto, graph, us, gbps, floor_us,
           roofline_frac, speedup_vs_triton} and, where measured, host_us, module, sm_mhz, power_w,
           verdict (the correctness check before timing: "PASS against ...: ..." or "FAIL ...";
           a FAIL row has no us, gbps or roofline_frac: nothing wrong is timed), timed (how a
           backend without a prepare() was timed)
The full grid is measured in slices (one `kdkit bench --shapes ...` per GPU command); combine()
makes the slices one dict (with "slices": each slice's date, copy_gbps, mma_tflops).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

HEADER = {"gpu": str, "date": str, "rows": list}
ROW_INT = ("bs", "prefix", "q_len", "heads")
ROW_NUM = ("us", "gbps", "floor_us", "roofline_frac")
RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


class ResultsError(ValueError):
    """A results file that cannot be used; the message names the file and the field."""


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check(data, where: str = "results") -> dict:
    """`data` as a results dict, or ResultsError naming the field that is wrong and how."""
    if not isinstance(data, dict):
        raise ResultsError(f"{where}: expected a JSON object with {sorted(HEADER)}, got {type(data).__name__}")
    for k, typ in HEADER.items():
        if not isinstance(data.get(k), typ):
            raise ResultsError(f"{where}: field {k!r} must be a {typ.__name__} (kdkit bench writes it); "
                               f"got {type(data.get(k)).__name__}")
    if not data["rows"]:
        raise ResultsError(f"{where}: the file has no rows (a bench run that measured nothing?); "
                           "give a run's JSON with its rows")
    for i, r in enumerate(data["rows"]):
        at = f"{where}: rows[{i}]"
        if not isinstance(r, dict):
            raise ResultsError(f"{at}: expected an object")
        if not isinstance(r.get("backend"), str) or not r["backend"]:
            raise ResultsError(f"{at}.backend = {r.get('backend')!r}: a backend's name")
        for k in ROW_INT:
            if not isinstance(r.get(k), int) or isinstance(r.get(k), bool) or r[k] < 0:
                raise ResultsError(f"{at}.{k} = {r.get(k)!r}: a non-negative integer")
        if "verdict" in r and not isinstance(r["verdict"], str):
            raise ResultsError(f"{at}.verdict = {r['verdict']!r}: the correctness check's line")
        if failed(r):  # judged wrong before timing: no time
            if "us" in r:
                raise ResultsError(f"{at}: a FAIL row carries a time (us = {r['us']!r}); nothing wrong is timed")
        else:
            for k in ROW_NUM:
                if not _num(r.get(k)):
                    raise ResultsError(f"{at}.{k} = {r.get(k)!r}: a finite number")
        for k in ("nsplit_auto", "graph"):
            if not isinstance(r.get(k), bool):
                raise ResultsError(f"{at}.{k} = {r.get(k)!r}: true or false")
        ns = r.get("nsplit")
        if (ns is not None or r["nsplit_auto"]) and (not isinstance(ns, int) or isinstance(ns, bool) or ns < 1):
            raise ResultsError(f"{at}.nsplit = {ns!r}: the backend's split count, >= 1 (null where it has none)")
    return data


def failed(row: dict) -> bool:
    """The row's backend output was judged wrong before timing (so the row has no time)."""
    return str(row.get("verdict", "")).startswith("FAIL")


def timed(results: dict) -> list[dict]:
    """The rows with a time (every row but the FAIL ones)."""
    return [r for r in results["rows"] if not failed(r)]


def load(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: not JSON ({e})") from None
    return check(data, str(path))


ROW_KEY = ("backend", "bs", "prefix", "q_len", "heads", "nsplit", "graph")  # one measurement of a run


def _measured(r: dict) -> tuple:
    """(backend, shape label as `kdkit bench` writes it) of a row."""
    return r["backend"], f"{r['bs']}x{r['prefix']} q{r['q_len']} H{r['heads']}"


def combine(paths) -> dict:
    """Results files of one GPU measured in slices (`kdkit bench --shapes ...`, one GPU command
    each: a command may run at most 10 minutes, the full grid does not fit one) as one results dict.

    Refused (ResultsError) when the files name different GPUs. Rows are concatenated in slice
    order (oldest "date" first). A shape that a later slice measured again for a backend keeps only
    the later slice's rows of that backend: every one of the earlier slice's goes, not only those
    with the same split count (the automatic choice may have moved between the two, and two
    automatic rows of one shape would leave the verdicts reading the older); the earlier slices'
    skip notes of that backend and shape go with them. The set is complete only when every slice
    is, and "stopped" lists the slices cut short. Every row keeps its floor_us and roofline_frac as
    measured in its own slice (against that slice's copy bandwidth and mma rate); the header's
    "slices" lists each slice's file, date, copy_gbps, mma_tflops and row count, and the header's
    own date, copy_gbps, mma_tflops, driver and versions are the newest slice's."""
    loaded = sorted(((load(p), Path(p)) for p in paths), key=lambda dp: dp[0]["date"])
    if not loaded:
        raise ResultsError("combine: no results files given")
    gpus = sorted({d["gpu"] for d, _ in loaded})
    if len(gpus) > 1:
        raise ResultsError(f"combine: the files measure different GPUs ({', '.join(gpus)}): "
                           + ", ".join(f"{p.name}: {d['gpu']}" for d, p in loaded))
    rows: list[dict] = []
    skipped: dict = {}
    for d, _ in loaded:
        again = {_measured(r) for r in d["rows"]}  # (backend, shape label) this slice measured
        rows = [r for r in rows if _measured(r) not in again] + list(d["rows"])
        skipped = {k: v for k, v in skipped.items() if not any(k.startswith(f"{b} {lab}") for b, lab in again)}
        skipped.update(d.get("skipped", {}))
    out = {k: v for k, v in loaded[-1][0].items() if k not in ("rows", "skipped", "complete", "stopped")}
    out["complete"] = all(d.get("complete", True) for d, _ in loaded)
    stopped = [f"{p.name}: {d['stopped']}" for d, p in loaded if d.get("stopped")]
    if stopped:
        out["stopped"] = "; ".join(stopped)
    out["slices"] = [{"file": p.name, "date": d["date"], "copy_gbps": d.get("copy_gbps"),
                      "mma_tflops": d.get("mma_tflops"), "rows": len(d["rows"])} for d, p in loaded]
    out["rows"] = rows
    out["skipped"] = skipped
    return check(out, "combine(" + ", ".join(p.name for _, p in loaded) + ")")


def latest(directory: str | os.PathLike = RESULTS_DIR) -> list[Path] | None:
    """The files of the newest run set in `directory`, oldest first (None when there is none).
    A run set = the file with the newest "date" and every file of the same "gpu" and "driver"
    whose "date" falls on the same UTC day: the slices of a full grid measured in one session,
    which combine() makes one results dict of."""
    found = []
    for p in sorted(Path(directory).glob("*.json")):
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
            found.append((str(d.get("date", "")), str(d.get("gpu")), str(d.get("driver")), p))
        except (OSError, ValueError, AttributeError):
            continue
    if not found:
        return None
    date, gpu, driver, _ = max(found, key=lambda f: f[0])
    return [p for d, g, dr, p in sorted(found, key=lambda f: f[0])
            if (g, dr) == (gpu, driver) and d[:10] == date[:10]]


def select(results: dict, **want) -> list[dict]:
    """Timed rows whose fields equal every given value; a value of None matches anything."""
    return [r for r in timed(results) if all(v is None or r.get(k) == v for k, v in want.items())]


def shapes(results: dict) -> list[tuple]:
    """(bs, q_len, heads) of every shape the run measured."""
    return sorted({(r["bs"], r["q_len"], r["heads"]) for r in results["rows"]})


def pick_shape(results: dict, bs: int | None = None, q_len: int | None = None, heads: int | None = None) -> dict:
    """One (bs, q_len, heads) of the run: the given values, the first measured shape filling in
    those left None (a sweep figure mixing two q_lens would draw nonsense)."""
    for b, q, h in shapes(results):
        if (bs is None or b == bs) and (q_len is None or q == q_len) and (heads is None or h == heads):
            return {"bs": b, "q_len": q, "heads": h}
    raise ValueError(f"no shape bs={bs} q_len={q_len} heads={heads} in the run of {results.get('gpu')} "
                     f"({results.get('date')}); measured (bs, q_len, heads): {shapes(results)}")


def sweep_shape(results: dict, sweep: dict, bs: int | None = None, q_len: int | None = None,
                heads: int | None = None) -> dict:
    """The one (bs, q_len, heads) nsplit.ipynb draws: the sweep's (nsplit_sweep, the given values
    already in it) when the run measured it; else the first measured shape matching the values
    given (q_len 257 alone finds bs 4 in a run that measured bs 4, q_len 257)."""
    mine = {k: sweep[k] for k in ("bs", "q_len", "heads")}
    if tuple(mine.values()) in shapes(results):
        return mine
    return pick_shape(results, bs, q_len, heads)


def shape_text(row: dict) -> str:
    return f"bs {row['bs']}, q_len {row['q_len']}, H {row['heads']}"


def best_nsplit(results: dict, **want) -> dict[int, tuple[int, float]]:
    """prefix -> (the fastest explicit NSPLIT, its time in us) among the CUDA rows matching `want`."""
    out: dict[int, tuple[int, float]] = {}
    for r in select(results, backend="cuda", nsplit_auto=False, **want):
        if r["prefix"] not in out or r["us"] < out[r["prefix"]][1]:
            out[r["prefix"]] = (r["nsplit"], r["us"])
    return out


def summary(results: dict, **want) -> list[dict]:
    """Per prefix of the matching shape: the automatic NSPLIT and its time, the best explicit one,
    how far auto is from the best (its time over the best's, to 3 decimals: timings are not more
    precise than that), and the speed-up over SGLang's Triton kernel."""
    best = best_nsplit(results, **want)
    out = []
    for r in sorted(select(results, backend="cuda", nsplit_auto=True, graph=False, **want),
                    key=lambda r: r["prefix"]):
        b = best.get(r["prefix"])
        out.append({"prefix": r["prefix"], "auto_nsplit": r["nsplit"], "auto_us": r["us"],
                    "best_nsplit": b[0] if b else None, "best_us": b[1] if b else None,
                    "auto_over_best": round(r["us"] / b[1], 3) if b else None, "gbps": r["gbps"],
                    "roofline_frac": r["roofline_frac"], "speedup_vs_triton": r.get("speedup_vs_triton")})
    return out


# the line for the automatic split count: within this factor of the best fixed one
AUTO_WITHIN = 1.10


def verdicts(results: dict) -> dict:
    """The grid's verdicts from eager times, each backend against kdkit's automatic choice:
    "shapes" (measured with an automatic cuda row); "slower" (shapes where some other backend was
    faster: (shape, backend, its us, kdkit's us)); per other backend its least speed-up of kdkit
    ("least": backend -> (ratio, shape)); "fixed" (shapes with fixed split counts), "auto_beat_all"
    (of those, where auto was at least as fast as every fixed count), "auto_worst" ((auto over
    best, shape, auto's split count, the best's)) and "auto_within" (shapes within AUTO_WITHIN);
    "roofline_max" ((fraction, shape)). A shape is (bs, prefix, q_len, heads)."""
    by: dict[tuple, list[dict]] = {}
    for r in timed(results):
        if not r["graph"]:
            by.setdefault((r["bs"], r["prefix"], r["q_len"], r["heads"]), []).append(r)
    out = {"shapes": 0, "slower": [], "least": {}, "fixed": 0, "auto_beat_all": 0, "auto_within": 0,
           "auto_worst": None, "roofline_max": None}
    for shape, rs in sorted(by.items()):
        auto = [r for r in rs if r["backend"] == "cuda" and r["nsplit_auto"]]
        if not auto:
            continue
        a = auto[0]
        out["shapes"] += 1
        if out["roofline_max"] is None or a["roofline_frac"] > out["roofline_max"][0]:
            out["roofline_max"] = (a["roofline_frac"], shape)
        for r in rs:
            if r["backend"] == "cuda":
                continue
            if r["us"] < a["us"]:
                out["slower"].append((shape, r["backend"], r["us"], a["us"]))
            ratio = r["us"] / a["us"]
            if r["backend"] not in out["least"] or ratio < out["least"][r["backend"]][0]:
                out["least"][r["backend"]] = (ratio, shape)
        fixed = [r for r in rs if r["backend"] == "cuda" and not r["nsplit_auto"]]
        if fixed:
            best = min(fixed, key=lambda r: r["us"])
            over = a["us"] / best["us"]
            out["fixed"] += 1
            out["auto_beat_all"] += over <= 1.0
            out["auto_within"] += over <= AUTO_WITHIN
            if out["auto_worst"] is None or over > out["auto_worst"][0]:
                out["auto_worst"] = (over, shape, a["nsplit"], best["nsplit"])
    return out


def verdict_lines(results: dict) -> list[str]:
    """verdicts() in words, for a run's summary."""
    from ..backends import label  # (torch comes with it: only when there are lines to write)
    v = verdicts(results)
    if not v["shapes"]:
        return []

    def sh(s):
        return f"{s[0]} x {s[1]}, q_len {s[2]}, H {s[3]}"
    lines = [f"kdkit fastest on {v['shapes'] - len({s for s, *_ in v['slower']})} of {v['shapes']} shapes (eager)"]
    lines += [f"  slower than {b} at {sh(s)}: {kd:.2f} us against {us:.2f}" for s, b, us, kd in v["slower"]]
    lines += [f"  least speed-up over {label(b)}: {ratio:.2f}x ({sh(s)})" for b, (ratio, s) in sorted(v["least"].items())]
    if v["fixed"]:
        over, s, auto_n, best_n = v["auto_worst"]
        lines.append(f"automatic split count within {AUTO_WITHIN:.2f}x of the best fixed on {v['auto_within']} of "
                     f"{v['fixed']} shapes; at least as fast as every fixed one on {v['auto_beat_all']}; worst "
                     f"{over:.3f}x ({sh(s)}: auto {auto_n}, best {best_n})")
    frac, s = v["roofline_max"]
    lines.append(f"roofline fraction at most {100 * frac:.1f}% ({sh(s)})")
    return lines


def nsplit_sweep(shape_set: str = "nsplit", **override) -> dict:
    """The sweep's defaults from kdkit/shapes.json: {"prefixes", "bs", "q_len", "heads"}; an
    override (prefixes, bs, q_len, heads) that is not None replaces its default (nsplit.ipynb's
    parameters: another shape of the committed run, a quick live run)."""
    from .. import shapes
    unknown = set(override) - {"prefixes", "bs", "q_len", "heads"}
    if unknown:
        raise TypeError(f"nsplit_sweep: no parameter {', '.join(sorted(unknown))} (prefixes, bs, q_len, heads)")
    rows = shapes.get(shape_set)
    one = {k: sorted({r[k] for r in rows}) for k in ("bs", "q_len", "heads")}
    if any(len(v) != 1 for v in one.values()):
        raise ValueError(f"shape set {shape_set!r} mixes {one}: an NSPLIT x prefix sweep is of one (bs, q_len, heads)")
    sweep = {"prefixes": sorted({r["prefix"] for r in rows}), **{k: v[0] for k, v in one.items()}}
    for k, v in override.items():
        if v is None:
            continue
        if k == "prefixes":
            if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__") or not all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
                raise ValueError(f"prefixes = {v!r}: a list of prefix lengths, e.g. [21, 4096] (or None for "
                                 f"the shape set's)")
            v = list(v)
        elif not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{k} = {v!r}: a positive integer (or None for the shape set's)")
        sweep[k] = v
    return sweep


def read(results_path: str | os.PathLike | list | None = None) -> tuple[dict, str]:
    """(results, where they came from) from files: results_path is one file, a list of files
    combined (combine()), a directory (its newest run set, latest()), or None (the newest run set
    committed under benchmarks/results/)."""
    if isinstance(results_path, (list, tuple)):
        paths = [Path(p) for p in results_path]
    elif results_path and Path(results_path).is_dir():  # a directory: its newest run set
        paths = latest(results_path)
        if not paths:
            raise FileNotFoundError(f"results_path = {str(results_path)!r}: a directory with no kdkit bench "
                                    "results (*.json) in it; name a results file or a directory that holds some")
    else:
        paths = [Path(results_path)] if results_path else latest()
    if not paths:
        raise FileNotFoundError(f"no results under {RESULTS_DIR} and no live run (no GPU here, or live=False): "
                                "run `kdkit bench` on a GPU and commit its JSON, or pass results_path")
    res = load(paths[0]) if len(paths) == 1 else combine(paths)
    return res, (f"committed results of the last GPU run: {res['gpu']}, {res['date']} "
                 f"({', '.join(p.name for p in paths)})")
