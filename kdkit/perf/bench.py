"""`kdkit bench`: every backend of the registry on the grid's shapes, through the backend contract,
against the roofline measured on the same GPU in the same run.

One path for every backend (kdkit.backends): `prepare(case)` (or, where a backend has none, its
whole run()) gives the launch the bench times. Before any (backend, shape, split count) is timed,
the output of that very launch is judged (kdkit.perf.correctness: against the float64 oracle where
it is affordable, else against the torch backend on the GPU); a wrong one gets a FAIL row with the
verdict line and no time. A backend that declares an integer option `nsplit` is also timed at the
fixed split counts of --nsplit beside its automatic one (prepare's info["nsplit"]); one whose
Prepared is graph_safe is also timed under CUDA-graph replay.

Timing (kdkit.perf.timing): CUDA events around the launch(es), a 256 MiB read before each timed
call so that no KV is left in L2, a short GPU sleep so that the launch is queued before the start
event, one warm-up, the median of the repetitions; a launch's host cost apart as host_us, the
eager call with that host cost in view (flush, call, events, no sleep) as eager_us, and the
backend's plan step where it has one (Prepared.plan) as plan_us.

Roofline time of a shape = max(bytes / copy bandwidth, FLOPs / mma.sync rate): bytes = every KV
row once (prefix + draft) x 576 x 2 + q + out; FLOPs = 2 x rows x KV length x (576 + 512) summed
over the requests; the copy bandwidth (device-to-device copy, read + write bytes) and the rate of
mma.sync.m16n8k16 bf16 (kdkit's own microbenchmark, cuda/mma_peak.cu) are measured first.

Output: one JSON file per run, benchmarks/results/<gpu>-<date>.json:
{"gpu", "sms", "copy_gbps", "mma_tflops", "driver", "versions", "date", "eager_floor_us" (an empty
kernel's eager_us: the floor of every row's eager_us on that host then), "rows": [{backend, bs,
prefix, q_len, heads, nsplit, nsplit_auto, graph, us, gbps, floor_us, roofline_frac,
speedup_vs_triton, host_us, eager_us, plan_us, verdict, and where the backend says it the build that ran: module, e.g.
"mla_tc-nt5-...-skip1-sm_90-<hash>" (block size, warps, step skip); sm_mhz and power_w, the
medians of the GPU's SM clock and power sampled while the row was timed (kdkit/perf/clocks.py;
absent where nvidia-smi is not)}], "skipped", "complete"} (kdkit.perf.results reads it);
the file is rewritten after every shape, so a run cut short keeps what it measured ("complete":
false, and "stopped": why). The grid and the --quick subset are the "bench" and "bench-quick" sets
of kdkit/shapes.json.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .. import backends as _backends
from .. import shapes as _shapes
from ..constants import QK_DIM as D, V_HEAD_DIM as DV
from . import clocks as _clocks
from . import results as _results
from .correctness import Reference
from .timing import Timer, copy_gbps, empty_launch, graph_of, mma_tflops

RESULTS = _results.RESULTS_DIR
NSPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the fixed split counts swept by default (--nsplit)
SWEPT = "nsplit"  # the declared integer option the bench sweeps, for any backend that has it


@dataclass(frozen=True)
class Shape:
    """One benchmarked shape: every request of the batch has the same prefix and q_len."""
    bs: int
    prefix: int
    q_len: int
    heads: int = 8
    # the synthetic case's draft tree (kdkit.synth.TREES) and data seed: how the case is made,
    # not which shape it is (a result row is named by bs, prefix, q_len, heads)
    tree: str = field(default="ddtree", compare=False)
    seed: int = field(default=0, compare=False)

    @property
    def label(self) -> str:
        return f"{self.bs}x{self.prefix} q{self.q_len} H{self.heads}"

    def nbytes(self) -> int:
        T = self.bs * self.q_len
        return self.bs * (self.prefix + self.q_len) * D * 2 + T * self.heads * (D + DV) * 2

    def flops(self) -> int:
        return 2 * self.bs * self.q_len * self.heads * (self.prefix + self.q_len) * (D + DV)


def grid(quick: bool = False, path=_shapes.PATH) -> list[Shape]:
    """The "bench" set of kdkit/shapes.json (issue 9's grid), or "bench-quick". A ragged shape
    (prefix or q_len given per request) is refused with a ShapeError naming the set and the
    shape: the bytes, FLOPs and result rows of a benchmark describe one prefix and one q_len."""
    name = "bench-quick" if quick else "bench"
    out = []
    for i, s in enumerate(_shapes.get(name, path)):
        ragged = [k for k in ("prefix", "q_len") if isinstance(s[k], list)]
        if ragged:
            raise _shapes.ShapeError(
                f"set {name!r} shape {i} ({s['name']}): {' and '.join(ragged)} given per request; "
                "kdkit bench times batches whose requests share one prefix and one q_len (give an int)")
        out.append(Shape(s["bs"], s["prefix"], s["q_len"], s["heads"], s["tree"], s["seed"]))
    return out


def make_case(shape: Shape):
    """The shape's synthetic case, its tree and seed included; no spare or poisoned pool rows."""
    return _shapes.make_case({"bs": shape.bs, "prefix": shape.prefix, "q_len": shape.q_len,
                              "heads": shape.heads, "tree": shape.tree, "seed": shape.seed},
                             spare_rows=0, poison_unused=False)


# ---- the run -------------------------------------------------------------------------------------
def swept_nsplits(shape: Shape, nsplits, auto: int | None = None) -> list[int]:
    """The fixed split counts the sweep times for `shape`: those of `nsplits` other than the
    automatic one and within the kernel's bound for the shape (kernel.schedule.max_splits: at most
    one per KV step, and an fp32 workspace within its limit; kernel.plan refuses the rest with an
    InputError, which is no measurement)."""
    from ..kernel import schedule
    bound = schedule.max_splits(shape.prefix + shape.q_len, shape.bs * shape.q_len * shape.heads)
    return [ns for ns in nsplits if ns != auto and ns <= bound]


def short_reason(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def _row(backend, shape, us, ceil, nsplit=None, auto=False, graph=False, host_us=None, module=None, clock=None,
         verdict=None):
    """One result row; us None: the output was judged wrong (verdict says how) and nothing timed.
    clock: the SM clock and power while `us` was measured ({"sm_mhz", "power_w"}, or none)."""
    floor = max(shape.nbytes() / ceil["copy_gbps"] / 1e3, shape.flops() / ceil["mma_tflops"] / 1e6)
    row = {"backend": backend, "bs": shape.bs, "prefix": shape.prefix, "q_len": shape.q_len,
           "heads": shape.heads, "nsplit": nsplit, "nsplit_auto": auto, "graph": graph}
    if us is not None:
        row.update(us=round(us, 2), gbps=round(shape.nbytes() / us / 1e3, 1))
    row.update(floor_us=round(floor, 3))
    if us is not None:
        row.update(roofline_frac=round(floor / us, 4))
    row.update(speedup_vs_triton=None, host_us=None if host_us is None else round(host_us, 1),
               **({"module": module} if module else {}), **(clock or {}))
    if verdict is not None:
        row["verdict"] = verdict
    return row


def run_grid(shapes, backends=None, nsplits=(), graph=True, progress=True, device="cuda",
             on_shape=None, clocks=True) -> dict:
    """Measure every (shape, backend); returns the results dict (see the module's docstring).
    backends: names of the registry (default: kdkit.backends.benched()). on_shape(results so far,
    "complete": false) is called after each shape, so that a caller can keep what was measured
    when a later shape ends the process (a timeout, or a CUDA fault that leaves the context
    unusable). clocks: sample the SM clock and power (kdkit/perf/clocks.py)."""
    backends = list(backends) if backends is not None else _backends.benched()
    sampler = _clocks.ClockSampler(_clocks.gpu_id(device)).start() if clocks else None
    try:
        return _run_grid(shapes, backends, nsplits, graph, progress, device, on_shape, sampler)
    finally:
        if sampler is not None:
            sampler.stop()


def judged(name: str, case, ref: Reference, opts: dict) -> tuple[_backends.Prepared, dict, object]:
    """(prepared, info, verdict): backend `name` prepared on `case` with `opts`, launched once, and
    that launch's output judged against `ref` (nothing is timed yet). The GPU is not needed for
    this step where the backend runs elsewhere (the torch backend on the CPU)."""
    p = _backends.prepare(name, case, **opts)
    p.launch()
    res = p.result()
    return p, {**res.info, **p.info}, ref.judge(name, res)


class Grid:
    """One run's state: the device, the timer and the machine's ceilings, the skip notes; `backend()`
    gives one backend's rows at one shape, each configuration judged before it is timed."""

    def __init__(self, device, timer, ceil: dict, sampler=None, graph: bool = True, nsplits=()):
        self.dev, self.timer, self.ceil = torch.device(device), timer, ceil
        self.sampler, self.graph, self.nsplits = sampler, graph, nsplits
        self.rows: list[dict] = []
        self.skipped: dict = {}

    @classmethod
    def measured(cls, device, sampler, graph: bool, nsplits) -> "Grid":
        """On a GPU: the timer, and the copy bandwidth and mma.sync rate measured first."""
        dev = torch.device(device)
        timer = Timer(dev)
        ceil = {"copy_gbps": copy_gbps(timer, dev), "mma_tflops": mma_tflops(timer, dev)}
        return cls(dev, timer, ceil, sampler, graph, nsplits)

    def timed_row(self, name, shape, fn, **kw) -> dict:  # timed, with the clock meanwhile
        t0 = time.monotonic()
        us = self.timer.us(fn)
        clock = self.sampler.window(t0, time.monotonic()) if self.sampler is not None else {}
        return _row(name, shape, us, self.ceil, clock=clock, **kw)

    def one(self, name, shape, case, ref, opts, first: bool) -> list[dict]:
        """The rows of one configuration: FAIL (no time), or eager (and, for the first of a
        backend, its host cost and graph replay where its launch is graph-safe)."""
        p, info, v = judged(name, case, ref, opts)
        sweeps = SWEPT in _backends.options(name)
        nsplit = info.get("nsplit") if sweeps else None
        kw = dict(nsplit=nsplit, auto=sweeps and SWEPT not in opts, module=info.get("module"), verdict=v.line)
        if not v.passed:
            return [_row(name, shape, None, self.ceil, **kw)]
        row = self.timed_row(name, shape, p.launch, **kw)
        if "timed" in info:
            row["timed"] = info["timed"]
        out = [row]
        if first and "timed" not in info:  # (after the GPU timing, as before)
            row["host_us"] = round(self.timer.host_us(p.launch), 1)
            row["eager_us"] = round(self.timer.eager_us(p.launch), 2)
            if p.plan is not None:
                row["plan_us"] = round(self.timer.plan_us(p.plan), 1)
        if first and self.graph and p.graph_safe and self.dev.type == "cuda":
            try:
                out.append(self.timed_row(name, shape, graph_of(p.launch), graph=True, **kw))
            except Exception as e:  # no graph row; the eager one stands
                self.skipped[f"{name} {shape.label} graph"] = short_reason(e)
        return out

    def backend(self, name, shape, case, ref) -> list[dict]:
        opts = {"device": str(self.dev)} if "device" in _backends.options(name) else {}
        rows = self.one(name, shape, case, ref, opts, first=True)
        if SWEPT in _backends.options(name):
            auto = rows[0]["nsplit"]
            for ns in swept_nsplits(shape, self.nsplits, auto=auto):
                try:  # one split count failing keeps the shape's other rows
                    rows += self.one(name, shape, case, ref, {**opts, SWEPT: ns}, first=False)
                except Exception as e:
                    self.skipped[f"{name} {shape.label} {SWEPT} {ns}"] = short_reason(e)
        return rows


def _run_grid(shapes, names, nsplits, graph, progress, device, on_shape, sampler) -> dict:
    from tqdm.auto import tqdm
    g = Grid.measured(device, sampler, graph, nsplits)
    dev = g.dev
    header = {"gpu": torch.cuda.get_device_name(dev), "sms": torch.cuda.get_device_properties(dev).multi_processor_count,
              **{k: round(v, 1) for k, v in g.ceil.items()}, "driver": _driver(), "versions": _versions(),
              "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),  # the run's start
              # an empty kernel's eager call: the floor of every row's eager_us on this host now
              "eager_floor_us": round(empty_launch(g.timer)["eager_us"], 1)}
    bar = tqdm(shapes, disable=not progress, unit="shape")
    for shape in bar:
        bar.set_postfix_str(shape.label)
        case = make_case(shape)
        ref = Reference(case, device=str(dev))
        causal = None  # the shape with a causal draft, made once, for backends that take no tree mask
        shape_rows = []
        for name in names:
            c, r, why = case, ref, _backends.unavailable(name, case)
            if why and shape.tree != "causal":
                # its closest mode: a backend without a tree mask (FlashInfer's MLA) is timed on the
                # same shape with a causal draft (the same bytes and FLOPs), its rows marked so
                if causal is None:
                    cc = make_case(replace(shape, tree="causal"))
                    causal = (cc, Reference(cc, device=str(dev)))
                if _backends.unavailable(name, causal[0]) is None:
                    c, r, why = causal[0], causal[1], None
            if why:
                g.skipped[name] = why
                continue
            try:
                rows = g.backend(name, shape, c, r)
                if c is not case:
                    for row in rows:
                        row["mask"] = "causal (no tree mask)"
                shape_rows += rows
            except Exception as e:  # one backend failing on one shape must not lose the run
                g.skipped[f"{name} {shape.label}"] = short_reason(e)
            torch.cuda.empty_cache()
        del causal
        tri = next((r["us"] for r in shape_rows if r["backend"] == "triton_sglang" and "us" in r and not r["graph"]), None)
        for r in shape_rows:
            r["speedup_vs_triton"] = round(tri / r["us"], 2) if tri and "us" in r else None
        g.rows += shape_rows
        del ref
        if on_shape is not None:
            on_shape({**header, "rows": list(g.rows), "skipped": dict(g.skipped), "complete": False})
    return {**header, "rows": g.rows, "skipped": g.skipped, "complete": True}


def _driver() -> str:
    try:
        import subprocess
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception:
        return "unknown"


def _versions() -> dict:
    from importlib import metadata

    from .. import __version__
    out = {"kdkit": __version__, "torch": torch.__version__, "cuda": torch.version.cuda}
    for dist in ("triton", "cupy-cuda13x", "cuda-bindings", "nvidia-cuda-nvrtc", "flashinfer-python"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:
        from .. import sglang_source
        out["sglang"] = sglang_source.locate().release
    except Exception:
        pass
    return out


def _by_shape(res: dict) -> dict:
    by: dict = {}
    for r in res["rows"]:
        by.setdefault((r["bs"], r["prefix"], r["q_len"], r.get("heads")), []).append(r)
    return by


def _main_row(rows: list[dict], backend: str) -> dict | None:
    """A backend's first eager row of a shape: its automatic configuration (the bench writes it first)."""
    return next((r for r in rows if r["backend"] == backend and not r["graph"]), None)


def summary(res: dict) -> str:
    """The run's table: per shape the floor and, per backend (in the run's order), its eager time at
    its automatic configuration (with the roofline fraction; FAIL where its output was judged
    wrong), its graph replay and its best fixed split count where it has them; then the skip
    notes, the FAIL verdicts and the grid's verdicts."""
    from tabulate import tabulate
    names = list(dict.fromkeys(r["backend"] for r in res["rows"]))
    graphed = [b for b in names if any(r["backend"] == b and r["graph"] for r in res["rows"])]
    swept = [b for b in names if any(r["backend"] == b and r.get("nsplit") and not r["nsplit_auto"] for r in res["rows"])]

    def cell(r):
        if r is None:
            return "-"
        return "FAIL" if _results.failed(r) else f"{r['us']:.1f} ({100 * r['roofline_frac']:.1f}%)"
    table = []
    for (bs, pf, ql, h), rs in _by_shape(res).items():
        line = [f"{bs} x {pf}, {ql}, {h}", f"{rs[0]['floor_us']:.2f}"]
        for b in names:
            line.append(cell(_main_row(rs, b)))
            if b in graphed:
                g = next((r for r in rs if r["backend"] == b and r["graph"]), None)
                line.append(f"{g['us']:.1f}" if g else "-")
            if b in swept:
                fixed = sorted((r for r in rs if r["backend"] == b and not r["graph"] and not _results.failed(r)
                                and r.get("nsplit")), key=lambda r: r["us"])
                line.append(f"{fixed[0]['us']:.1f} ({fixed[0]['nsplit']})" if fixed else "-")
        table.append(line)
    cols = ["bs x prefix, q_len, H", "floor us"]
    for b in names:
        cols += [b] + ([f"{b} graph"] if b in graphed else []) + ([f"{b} best fixed ({SWEPT})"] if b in swept else [])
    head = f"{res['gpu']} ({res['sms']} SMs), copy {res['copy_gbps']} GB/s, mma.sync {res['mma_tflops']} TFLOP/s"
    if res.get("eager_floor_us") is not None:  # (runs before 2026-12-04 have none)
        head += f", an empty kernel's eager_us {res['eager_floor_us']} us"
    if len(res.get("slices", [])) > 1:  # combined slices: each row's floor is its own slice's
        head += "".join(f"\n  slice {s['file']} ({s['date']}, {s['rows']} rows): copy {s['copy_gbps']} GB/s, "
                        f"mma.sync {s['mma_tflops']} TFLOP/s" for s in res["slices"])
    head += "\nbackends: " + "; ".join(f"{b} = {_backends.label(b)}" for b in names)
    body = tabulate(table, cols, tablefmt="simple", disable_numparse=True, stralign="right")
    skipped = [f"skipped {k}: {v}" for k, v in res.get("skipped", {}).items()]
    fails = [f"{r['backend']} {r['bs']}x{r['prefix']} q{r['q_len']} H{r['heads']}"
             + (f" {SWEPT} {r['nsplit']}" if r.get("nsplit") else "") + f": {r['verdict']}"
             for r in res["rows"] if _results.failed(r)]
    return "\n".join([head, body, *skipped, *fails, *_results.verdict_lines(res)])


_PREFIX_TEXT = {21: "21", 1024: "1K", 4096: "4K", 8192: "8K", 32768: "32K", 131072: "128K"}
README_HEAD = ("| bs x prefix, q_len, H | roofline | kdkit, graph replay | kdkit, eager | best fixed NSPLIT (eager) "
               "| FlashInfer fa2 MLA, graph replay (causal draft) | Triton extend | Triton decode per node | torch eager |"
               "\n|---|---|---|---|---|---|---|---|---|")
HOST_HEAD = ("| bs x prefix, q_len, H | kdkit run(), host | kdkit eager call, host in view | kdkit plan(), host "
             "| FlashInfer run(), host |\n|---|---|---|---|---|")


def _fig(x: float) -> str:
    """The README's figures: three significant digits, whole numbers from 100 up, one rounding."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _shape_cell(bs, prefix, q_len, heads) -> str:
    return f"{bs} x {_PREFIX_TEXT.get(prefix, prefix)}, {q_len}, {heads}"


def _frac(r: dict) -> str:
    return f"{_fig(r['us'])} ({100 * r['roofline_frac']:.1f}%)"


def readme_table(res: dict) -> str:
    """The performance page's table (markdown) for a `--quick` run, a row per shape in the run's
    order: the roofline, kdkit under graph replay (with its roofline fraction) and eager at the
    automatic NSPLIT, the best fixed NSPLIT ("(auto N)" where the automatic choice beat every fixed
    one, else "(N; auto M)"; "-" where the run swept none), FlashInfer's fa2 MLA under graph replay
    (its fraction; it takes no tree mask, so it ran the shape with a causal draft), and the three
    other backends; the first row's times carry "us"."""
    lines = [README_HEAD]
    for i, (shape, rs) in enumerate(_by_shape(res).items()):
        u = " us" if i == 0 else ""
        cuda = [r for r in rs if r["backend"] == "cuda" and not _results.failed(r)]
        auto = next(r for r in cuda if r["nsplit_auto"] and not r["graph"])
        graph = next(r for r in cuda if r["graph"])
        fixed = min((r for r in cuda if not r["nsplit_auto"] and not r["graph"]), key=lambda r: r["us"], default=None)
        best = ("-" if fixed is None  # the run swept no fixed count at this shape
                else f"{_fig(fixed['us'])} ({fixed['nsplit']}; auto {auto['nsplit']})" if fixed["us"] < auto["us"]
                else f"{_fig(auto['us'])} (auto {auto['nsplit']})")
        fi = next((r for r in rs if r["backend"] == "flashinfer_mla" and r["graph"]), None) or _main_row(rs, "flashinfer_mla")
        other = [_main_row(rs, b) for b in ("triton_sglang", "triton_decode", "torch")]
        cells = [_shape_cell(*shape[:3], shape[3] or 8), _fig(rs[0]["floor_us"]) + u, f"{_fig(graph['us'])}{u} "
                 f"({100 * graph['roofline_frac']:.1f}%)", _fig(auto["us"]) + u, best,
                 "-" if fi is None else "FAIL" if _results.failed(fi) else _frac(fi),
                 *("-" if r is None else "FAIL" if _results.failed(r) else _fig(r["us"]) + u for r in other)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def host_table(res: dict) -> str:
    """The host cost of one call per shape (microseconds), as the bench measures it: kdkit's
    run() (host_us: launches queued behind a GPU sleep), its eager call with that host work in view
    (eager_us: flush, call, events), its plan() (plan_us), and FlashInfer's run() beside it."""
    def cell(r, k):
        return "-" if r is None or r.get(k) is None else _fig(r[k])
    lines = [HOST_HEAD]
    for shape, rs in _by_shape(res).items():
        k, fi = _main_row(rs, "cuda"), _main_row(rs, "flashinfer_mla")
        lines.append("| " + " | ".join([_shape_cell(*shape[:3], shape[3] or 8), cell(k, "host_us"), cell(k, "eager_us"),
                                        cell(k, "plan_us"), cell(fi, "host_us")]) + " |")
    return "\n".join(lines)


def results_name(res: dict) -> str:
    gpu = re.sub(r"[^\w.-]+", "-", res["gpu"]).strip("-").lower()
    return f"{gpu}-{res['date'][:19].replace(':', '').replace('-', '')}.json"


def save(res: dict, out_dir: Path = RESULTS, overwrite: bool = False) -> Path:
    """Write a run's results as out_dir/<gpu>-<start date>.json; an existing file of that name is
    refused unless overwrite (this run's own file, rewritten as its shapes are measured)."""
    from ..files import publish
    path = Path(out_dir) / results_name(res)
    publish(path, (json.dumps(res, indent=1) + "\n").encode(), overwrite=overwrite)
    return path


class RunFile:
    """This run's results file, rewritten after every shape (complete: false) so that a run cut
    short keeps every shape it measured; the last write is the complete run."""

    def __init__(self, out_dir: Path):
        self.out_dir, self.path, self.last = Path(out_dir), None, None

    def write(self, res: dict) -> Path:
        self.path = save(res, self.out_dir, overwrite=self.path is not None)
        self.last = res
        return self.path

    def partial(self, res: dict) -> None:
        self.last = res  # measured, written or not: a run stopped later keeps it
        try:
            self.write(res)
        except OSError:  # the measuring goes on; the final write says where the run went
            pass


def _names(text: str) -> list[str]:
    try:
        return _backends.resolve(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _splits(text: str) -> list[int]:
    try:
        vals = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want a comma list of split counts like 1,2,4")
    from ..kernel.spec import MAX_SPLITS
    if any(v < 1 or v > MAX_SPLITS for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: split counts lie in 1..{MAX_SPLITS} (the kernel's "
                                         "MAX_SPLITS: the merge kernel's weight table)")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`kdkit bench`'s options (the CLI declares them on its subcommand)."""
    default = ",".join(_backends.benched())
    p.add_argument("--quick", action="store_true", help="the README table's shapes, at H 8 and H 16 (the bench-quick set of kdkit/shapes.json)")
    p.add_argument("--backends", type=_names, default=default,
                   help=f"comma list of the registry's backends ({', '.join(_backends.BACKENDS)}) or 'all'")
    p.add_argument("--nsplit", type=_splits, default=",".join(map(str, NSPLITS)),
                   help=f"fixed split counts to sweep beside the automatic one, for every backend that declares an "
                        f"option {SWEPT!r} ('' for none)")
    p.add_argument("--shapes", default="", help="only shapes whose label contains this text, e.g. '1x32768' (default: all)")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph replay timing")
    p.add_argument("--no-clocks", action="store_true",
                   help="do not sample the SM clock and power (nvidia-smi) while timing")
    p.add_argument("--out", default=str(RESULTS), help="directory for the JSON result file")


def main(argv: list[str] | None = None) -> int:
    """`python -m kdkit.perf.bench [options]`: the same as `kdkit bench [options]`."""
    p = argparse.ArgumentParser(prog="kdkit bench", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args) -> int:
    """Benchmark every backend of the registry on this GPU (its output judged before it is timed);
    write a JSON. Arguments are checked (exit 2) before the GPU is (exit 1 without one)."""
    from ..kernel import unavailable
    shapes = [s for s in grid(args.quick) if args.shapes in s.label]
    if not shapes:
        print(f"kdkit bench: --shapes {args.shapes!r} matches no shape; labels look like "
              f"{grid(args.quick)[0].label}", file=sys.stderr)
        return 2
    bad = unwritable(Path(args.out))
    if bad:
        print(f"kdkit bench: --out {args.out}: {bad}; give a directory you can write to", file=sys.stderr)
        return 2
    why = unavailable()
    if why:
        print(f"kdkit bench: {why}", file=sys.stderr)
        return 1
    Path(args.out).mkdir(parents=True, exist_ok=True)  # (the probe above left no folder behind)
    out = RunFile(Path(args.out))
    try:
        res = run_grid(shapes, args.backends, args.nsplit, graph=not args.no_graph, on_shape=out.partial,
                       clocks=not args.no_clocks)
    except Exception as e:  # e.g. a CUDA fault: the context is lost, the shapes before it are not
        if out.last is None:
            print(f"kdkit bench: stopped before the first shape was measured ({short_reason(e)})", file=sys.stderr)
            return 1
        res = {**out.last, "stopped": short_reason(e)}
        print(f"kdkit bench: stopped after {len(out.last['rows'])} rows ({short_reason(e)})", file=sys.stderr)
    print(summary(res))  # before the save: a failing save must not hide the measurements
    try:
        path = out.write(res)
    except OSError as e:  # the GPU run is not lost: written where it can be
        import tempfile
        path = save(res, Path(tempfile.mkdtemp(prefix="kdkit-bench-")))
        print(f"kdkit bench: could not write to {args.out} ({e}); wrote {path} instead", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    failed = any(_results.failed(r) for r in res["rows"])
    return 0 if res.get("complete", True) and not failed else 1


# ---- a live sweep for the notebooks (nsplit.ipynb) --------------------------------------------------
def measure(prefixes, bs: int = 1, q_len: int = 9, heads: int = 8, nsplits=(1, 2, 4, 8, 16, 32, 64),
            backends=None, graph: bool = True, progress: bool = True) -> dict:
    """A live sweep through run_grid (needs a CUDA GPU), checked like a file."""
    shapes = [Shape(bs, int(p), q_len, heads) for p in prefixes]
    return _results.check(run_grid(shapes, backends, tuple(nsplits), graph, progress), "kdkit.perf.bench.run_grid()")


def gpu_here() -> str | None:
    """The CUDA device's name, or None on a machine without one."""
    try:
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        return None


def obtain(results_path: str | os.PathLike | None = None, live: bool | None = None, **sweep) -> tuple[dict, str]:
    """(results, where they came from). live=None measures when a GPU is here and no results_path
    is given; otherwise reads results_path, or the latest committed run under benchmarks/results/
    (kdkit.perf.results.read). sweep: measure()'s arguments (prefixes, bs, q_len, heads, nsplits,
    backends, graph)."""
    if live is None:
        live = gpu_here() is not None and not results_path
    if live:
        if gpu_here() is None:
            raise ValueError("live = True measures on a CUDA GPU and there is none here: set live = None "
                             "(or False) to read results_path or the latest committed run")
        res = measure(**sweep)
        return res, f"measured live on {res['gpu']} ({res['date']})"
    return _results.read(results_path)


def unwritable(out_dir: Path) -> str | None:
    """Why `out_dir` cannot take a results file (None when it can): made if missing, then a
    probe file is created and removed in it, so a bad --out is found before the GPU work. The
    folders made for the probe go again (the results file makes them when there are results)."""
    import tempfile
    made = [d for d in [out_dir, *out_dir.parents] if not d.exists()]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".kdkit-bench-probe-"):
            pass
    except OSError as e:
        return f"not a writable directory ({e.strerror or e})"
    finally:
        for d in made:  # deepest first
            try:
                d.rmdir()
            except OSError:
                break
    return None


if __name__ == "__main__":
    sys.exit(main())
