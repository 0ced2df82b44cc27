"""`kdkit bench`: kdkit's kernel beside SGLang's Triton kernels and eager PyTorch, against the
roofline measured on the same GPU in the same run.

Timing: CUDA events around the launch(es) (the kernel's partial and merge together), a 256 MiB
read before each timed call so that no KV is left in L2 (a read, not a write: a memset would leave
L2 full of dirty lines whose write-back the next kernel pays), then a short GPU sleep so that the
launch is queued before the start event is reached (the events time the GPU's work, not Python's
launch latency, which is reported apart as host_us), one warm-up, the median of the repetitions.
The CUDA kernel is also timed under CUDA-graph replay.

Roofline time of a shape = max(bytes / copy bandwidth, FLOPs / mma.sync rate): bytes = every KV
row once (prefix + draft) x 576 x 2 + q + out; FLOPs = 2 x rows x KV length x (576 + 512) summed
over the requests; the copy bandwidth (device-to-device copy, read + write bytes) and the rate of
mma.sync.m16n8k16 bf16 (kdkit's own microbenchmark, cuda/mma_peak.cu) are measured first.

Output: one JSON file per run, benchmarks/results/<gpu>-<date>.json:
{"gpu", "sms", "copy_gbps", "mma_tflops", "driver", "versions", "date", "rows": [{backend, bs,
prefix, q_len, heads, nsplit, nsplit_auto, graph, us, gbps, floor_us, roofline_frac,
speedup_vs_triton, host_us, and for cuda the build that ran: module, e.g.
"mla_tc-nt5-...-skip1-sm_90-<hash>" (block size, warps, step skip); sm_mhz and power_w, the
medians of the GPU's SM clock and power sampled while the row was timed (kdkit/clocks.py;
absent where nvidia-smi is not)}], "skipped", "complete"};
the file is rewritten after every shape, so a run cut short keeps what it measured ("complete": false, and "stopped": why). The grid and the
--quick subset are the "bench" and "bench-quick" sets of kdkit/shapes.json.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import clocks as _clocks
from . import shapes as _shapes
from .bench_results import verdict_lines
from .constants import QK_DIM as D, V_HEAD_DIM as DV

BACKENDS = ("cuda", "triton_sglang", "triton_decode", "torch")
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
FLUSH_BYTES = 256 << 20
NSPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the fixed split counts swept by default (--nsplit)
SLEEP_CYCLES = 500_000  # ~250 us at 2 GHz: longer than run()'s host work, so the launch is queued


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


# ---- the machine's ceilings --------------------------------------------------------------------
class Timer:
    def __init__(self, device):
        self.flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device=device).uniform_()
        self.sink = torch.empty((), dtype=torch.float32, device=device)

    def _flush(self):
        torch.sum(self.flush, dim=0, out=self.sink)  # reads 256 MiB: L2 holds none of the KV, and nothing dirty

    def us(self, fn, reps: int | None = None, budget_s: float = 1.0) -> float:
        fn()
        torch.cuda.synchronize()
        if reps is None:  # as many as fit the budget, 5..50
            t0 = self._once(fn)
            reps = int(max(5, min(50, budget_s / max(t0 * 1e-6, 1e-9))))
        return sorted(self._once(fn) for _ in range(reps))[reps // 2]

    def host_us(self, fn, reps: int = 20) -> float:
        """What one launch costs the CPU (Python, checks, the launch calls), the GPU kept busy."""
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES * 4)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        t = (time.perf_counter() - t0) / reps * 1e6
        torch.cuda.synchronize()
        return t

    def _once(self, fn) -> float:
        self._flush()
        torch.cuda._sleep(SLEEP_CYCLES)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1e3


def copy_gbps(timer: Timer, device) -> float:
    """Device-to-device copy of 1 GiB: (read + write) bytes / median time."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    us = timer.us(lambda: dst.copy_(src), reps=10)
    del src, dst
    return 2 * (1 << 30) / us / 1e3


def mma_tflops(timer: Timer, device) -> float:
    """kdkit's mma.sync microbenchmark (kernel/cuda/mma_peak.cu): one block per SM, independent
    accumulator chains in every warp; threads and FLOPs per warp-iteration read from the build."""
    import cupy

    from .kernel import jit
    mod = jit.build("mma_peak.cu", {}, jit.device_arch(), tags={})
    fn = jit.load(mod).get_function("kd_mma_peak")
    meta = mod.meta()
    threads = meta["threads"]
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    out = torch.empty(sms * threads, dtype=torch.float32, device=device)
    iters = 20000
    from .kernel.launch import cupy_stream

    def launch():
        with cupy_stream():
            fn((sms,), (threads,), (cupy.from_dlpack(out), cupy.int32(iters)))
    us = timer.us(launch, reps=10)
    return sms * (threads // 32) * iters * meta["flops_per_iter_warp"] / us / 1e6


# ---- the backends, each a launch-only closure over device tensors ------------------------------
def make_case(shape: Shape):
    """The shape's synthetic case, its tree and seed included; no spare or poisoned pool rows."""
    return _shapes.make_case({"bs": shape.bs, "prefix": shape.prefix, "q_len": shape.q_len,
                              "heads": shape.heads, "tree": shape.tree, "seed": shape.seed},
                             spare_rows=0, poison_unused=False)


def cuda_launcher(case, x, nsplit=None):
    from . import kernel
    from .backends import cuda
    p = cuda.plan_case(case, x, kernel.PlanOptions(nsplit=nsplit))
    return (lambda: kernel.run(p, x["q"], x["k"], x["v"], x["kv_buffer"])), p


def graph_of(fn):
    """fn captured in a CUDA graph; returns the replay."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def triton_extend_launcher(case):
    from .backends import triton_sglang
    launch, _, _, _ = triton_sglang.prepare(case, with_lse=False)
    return launch


def decode_per_node_indices(case):
    """(kv_indptr [T+1], kv_indices) int64 on the CPU, one entry per tree node (query token) in
    token order: node i of request b attends to the request's prefix rows and to the draft slots
    it may see (its ancestors and itself, layout.draft_visibility), as the issue's "Triton decode
    kernel fed one query per tree node" does."""
    from . import layout
    u = case if case.layout == "unified" else layout.to_unified(case)  # no copy of a big pool
    kvp = u.kv_indptr.long()
    idx, indptr = [], [0]
    for b in range(u.batch_size):
        qs, qe = (int(v) for v in u.qo_indptr[b:b + 2])
        n = qe - qs
        seg = u.kv_indices[int(kvp[b]):int(kvp[b + 1])].long()
        prefix, draft = seg[: len(seg) - n], seg[len(seg) - n:]
        vis = layout.draft_visibility(u, b)
        for i in range(n):
            idx.append(torch.cat([prefix, draft[vis[i]]]))
            indptr.append(indptr[-1] + len(idx[-1]))
    return torch.tensor(indptr, dtype=torch.int64), torch.cat(idx).to(torch.int64)


def triton_decode_prepare(case):
    """(launch, out): SGLang's Triton decode kernel over decode_per_node_indices(case); each
    launch writes the [T, H, 512] output into `out` (on the GPU)."""
    from . import layout, sglang_source
    mod = sglang_source.load_module("decode_attention")
    fwd = mod.decode_attention_fwd
    names = sglang_source.kernel_params(fwd)
    u = layout.to_unified(case)
    dev = torch.device("cuda")
    kv_indptr, kv_indices = (t.to(dev) for t in decode_per_node_indices(u))
    T, H = u.num_tokens, u.num_heads
    splits = 8  # SGLang's default triton_attention_num_kv_splits
    q = u.q.to(dev)
    kv_buffer = u.kv_buffer.to(dev)
    o = torch.empty(T, H, DV, dtype=q.dtype, device=dev)
    logits = torch.empty(T, H, splits, DV, dtype=torch.float32, device=dev)
    lse = torch.empty(T, H, splits, dtype=torch.float32, device=dev)
    nks = torch.full((T,), splits, dtype=torch.int32, device=dev)
    kw = {"logit_cap": float(u.logit_cap)}
    if "has_mla" in names:
        kw["has_mla"] = True
    args = (q, kv_buffer, kv_buffer[..., :DV], o, kv_indptr, kv_indices, logits, lse, nks, splits,
            float(u.sm_scale), 1.0, 1.0)
    return (lambda: fwd(*args, **kw)), o


def triton_decode_launcher(case):
    """SGLang's Triton decode kernel with one query per tree node (triton_decode_prepare)."""
    return triton_decode_prepare(case)[0]


def torch_launcher(case):
    from .backends import torch_ref
    gpu = case.clone(**{n: getattr(case, n).cuda() for n in ("q", "k", "v", "kv_buffer")})
    return lambda: torch_ref.run(gpu, device="cuda")


# ---- the run -------------------------------------------------------------------------------------
def swept_nsplits(shape: Shape, nsplits, auto: int | None = None) -> list[int]:
    """The fixed split counts the sweep times for `shape`: those of `nsplits` other than the
    automatic one, at most one per KV step (more would leave splits empty), and whose fp32
    workspace (splits x rows x DL x 4 bytes) stays within the planner's bound (kernel.plan refuses
    the rest with an InputError, which is no measurement)."""
    from .kernel import schedule, spec
    steps = schedule.cdiv(shape.prefix + shape.q_len, schedule.BLOCK_N)
    rows = shape.bs * shape.q_len * shape.heads
    return [ns for ns in nsplits if ns != auto and ns <= steps
            and (ns == 1 or ns * rows * spec.DL * 4 <= schedule.WORKSPACE_LIMIT)]


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def _row(backend, shape, us, ceil, nsplit=None, auto=False, graph=False, host_us=None, module=None, clock=None):
    """clock: the SM clock and power while `us` was measured ({"sm_mhz", "power_w"}, or none)."""
    floor = max(shape.nbytes() / ceil["copy_gbps"] / 1e3, shape.flops() / ceil["mma_tflops"] / 1e6)
    return {"backend": backend, "bs": shape.bs, "prefix": shape.prefix, "q_len": shape.q_len,
            "heads": shape.heads, "nsplit": nsplit, "nsplit_auto": auto, "graph": graph,
            "us": round(us, 2), "gbps": round(shape.nbytes() / us / 1e3, 1), "floor_us": round(floor, 3),
            "roofline_frac": round(floor / us, 4), "speedup_vs_triton": None,
            "host_us": None if host_us is None else round(host_us, 1), **({"module": module} if module else {}),
            **(clock or {})}


def run_grid(shapes, backends=BACKENDS, nsplits=(), graph=True, progress=True, device="cuda",
             on_shape=None, clocks=True) -> dict:
    """Measure every (shape, backend); returns the results dict (see the module's docstring).
    on_shape(results so far, "complete": false) is called after each shape, so that a caller can
    keep what was measured when a later shape ends the process (a timeout, or a CUDA fault that
    leaves the context unusable). clocks: sample the SM clock and power (kdkit/clocks.py)."""
    sampler = _clocks.ClockSampler(_clocks.gpu_id(device)).start() if clocks else None
    try:
        return _run_grid(shapes, backends, nsplits, graph, progress, device, on_shape, sampler)
    finally:
        if sampler is not None:
            sampler.stop()


def _run_grid(shapes, backends, nsplits, graph, progress, device, on_shape, sampler) -> dict:
    from tqdm.auto import tqdm

    from . import backends as _backends
    dev = torch.device(device)
    timer = Timer(dev)

    def row(b, shape, fn, *args, budget_s: float = 1.0, **kw):  # timed, with the clock meanwhile
        t0 = time.monotonic()
        us = timer.us(fn, budget_s=budget_s)
        clock = sampler.window(t0, time.monotonic()) if sampler is not None else {}
        return _row(b, shape, us, ceil, *args, clock=clock, **kw)

    ceil = {"copy_gbps": copy_gbps(timer, dev), "mma_tflops": mma_tflops(timer, dev)}
    rows, skipped = [], {}
    header = {"gpu": torch.cuda.get_device_name(dev), "sms": torch.cuda.get_device_properties(dev).multi_processor_count,
              **{k: round(v, 1) for k, v in ceil.items()}, "driver": _driver(), "versions": _versions(),
              "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}  # the run's start
    why = {"cuda": _backends.unavailable("cuda"), "triton_sglang": _backends.unavailable("triton_sglang"),
           "torch": None}
    why["triton_decode"] = why["triton_sglang"]
    bar = tqdm(shapes, disable=not progress, unit="shape")
    for shape in bar:
        bar.set_postfix_str(shape.label)
        case = make_case(shape)
        shape_rows = []
        for b in backends:
            if why.get(b):
                skipped[b] = why[b]
                continue
            try:
                if b == "cuda":
                    from .backends import cuda
                    x = cuda.to_device(case)
                    fn, p = cuda_launcher(case, x)
                    first = row(b, shape, fn, p.nsplit, auto=True, module=p.key)
                    first["host_us"] = round(timer.host_us(fn), 1)  # (after the GPU timing, as before)
                    shape_rows.append(first)
                    if graph:
                        shape_rows.append(row(b, shape, graph_of(fn), p.nsplit, True, True, module=p.key))
                    for ns in swept_nsplits(shape, nsplits, auto=p.nsplit):
                        try:  # one split count failing keeps the shape's other rows
                            fn2, p2 = cuda_launcher(case, x, nsplit=ns)
                            shape_rows.append(row(b, shape, fn2, p2.nsplit, module=p2.key))
                        except Exception as e:
                            skipped[f"cuda {shape.label} nsplit {ns}"] = _why(e)
                    del x
                elif b == "triton_sglang":
                    shape_rows.append(row(b, shape, triton_extend_launcher(case)))
                elif b == "triton_decode":
                    shape_rows.append(row(b, shape, triton_decode_launcher(case)))
                elif b == "torch":
                    if shape.bs * shape.q_len * shape.heads * (shape.prefix + shape.q_len) > 4e9:
                        skipped["torch"] = "eager scores above 4e9 elements are left out (minutes per call)"
                        continue
                    shape_rows.append(row(b, shape, torch_launcher(case), budget_s=2.0))
            except Exception as e:  # one backend failing on one shape must not lose the run
                skipped[f"{b} {shape.label}"] = _why(e)
            torch.cuda.empty_cache()
        tri = next((r["us"] for r in shape_rows if r["backend"] == "triton_sglang"), None)
        for r in shape_rows:
            r["speedup_vs_triton"] = round(tri / r["us"], 2) if tri else None
        rows += shape_rows
        if on_shape is not None:
            on_shape({**header, "rows": list(rows), "skipped": dict(skipped), "complete": False})
    return {**header, "rows": rows, "skipped": skipped, "complete": True}


def _driver() -> str:
    try:
        import subprocess
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception:
        return "unknown"


def _versions() -> dict:
    from importlib import metadata

    from . import __version__
    out = {"kdkit": __version__, "torch": torch.__version__, "cuda": torch.version.cuda}
    for dist in ("triton", "cupy-cuda13x", "cuda-bindings", "nvidia-cuda-nvrtc"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:
        from . import sglang_source
        out["sglang"] = sglang_source.locate().release
    except Exception:
        pass
    return out


def summary(res: dict) -> str:
    """The table the README quotes: per shape, kdkit (auto, graph), best fixed NSPLIT, the others."""
    from tabulate import tabulate
    by = {}
    for r in res["rows"]:
        by.setdefault((r["bs"], r["prefix"], r["q_len"], r.get("heads")), []).append(r)

    def us(rows):
        return f"{rows[0]['us']:.1f}" if rows else "-"
    table = []
    for (bs, pf, ql, h), rs in by.items():
        cuda = [r for r in rs if r["backend"] == "cuda"]
        auto = [r for r in cuda if r["nsplit_auto"] and not r["graph"]]
        fixed = sorted((r for r in cuda if not r["graph"]), key=lambda r: r["us"])
        table.append([f"{bs} x {pf}, {ql}, {h}", f"{rs[0]['floor_us']:.2f}",
                      f"{auto[0]['us']:.1f} ({100 * auto[0]['roofline_frac']:.1f}%)" if auto else "-",
                      us([r for r in cuda if r["graph"]]),
                      f"{fixed[0]['us']:.1f} ({fixed[0]['nsplit']})" if fixed else "-",
                      *(us([r for r in rs if r["backend"] == b]) for b in ("triton_sglang", "triton_decode", "torch"))])
    head = f"{res['gpu']} ({res['sms']} SMs), copy {res['copy_gbps']} GB/s, mma.sync {res['mma_tflops']} TFLOP/s"
    if len(res.get("slices", [])) > 1:  # combined slices: each row's floor is its own slice's
        head += "".join(f"\n  slice {s['file']} ({s['date']}, {s['rows']} rows): copy {s['copy_gbps']} GB/s, "
                        f"mma.sync {s['mma_tflops']} TFLOP/s" for s in res["slices"])
    body = tabulate(table, ["bs x prefix, q_len, H", "floor us", "cuda auto", "graph", "best fixed (nsplit)",
                            "triton ext", "triton dec", "torch"], tablefmt="simple", disable_numparse=True,
                    stralign="right")
    skipped = [f"skipped {k}: {v}" for k, v in res.get("skipped", {}).items()]
    return "\n".join([head, body, *skipped, *verdict_lines(res)])


_PREFIX_TEXT = {21: "21", 1024: "1K", 4096: "4K", 8192: "8K", 32768: "32K", 131072: "128K"}
README_HEAD = ("| bs x prefix, q_len | roofline | kdkit, graph replay | kdkit, eager | best fixed NSPLIT (eager) "
               "| Triton extend | Triton decode per node | torch eager |\n|---|---|---|---|---|---|---|---|")


def _fig(x: float) -> str:
    """The README's figures: three significant digits, whole numbers from 100 up, one rounding."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def readme_table(res: dict) -> str:
    """The README's Performance table (markdown) for a `--quick` run, a row per shape in the run's
    order: the roofline, kdkit under graph replay (with its roofline fraction) and eager at the
    automatic NSPLIT, the best fixed NSPLIT ("(auto N)" where the automatic choice beat every fixed
    one, else "(N; auto M)"), and the three other backends; the first row's times carry "us"."""
    by: dict = {}
    for r in res["rows"]:
        by.setdefault((r["bs"], r["prefix"], r["q_len"], r.get("heads")), []).append(r)
    lines = [README_HEAD]
    for i, ((bs, prefix, q_len, _), rs) in enumerate(by.items()):
        u = " us" if i == 0 else ""
        cuda = [r for r in rs if r["backend"] == "cuda"]
        auto = next(r for r in cuda if r["nsplit_auto"] and not r["graph"])
        graph = next(r for r in cuda if r["graph"])
        fixed = min((r for r in cuda if not r["nsplit_auto"] and not r["graph"]), key=lambda r: r["us"], default=None)
        best = (f"{_fig(fixed['us'])} ({fixed['nsplit']}; auto {auto['nsplit']})" if fixed and fixed["us"] < auto["us"]
                else f"{_fig(auto['us'])} (auto {auto['nsplit']})")
        other = {r["backend"]: _fig(r["us"]) + u for r in rs if r["backend"] != "cuda"}
        cells = [f"{bs} x {_PREFIX_TEXT.get(prefix, prefix)}, {q_len}", _fig(rs[0]["floor_us"]) + u,
                 f"{_fig(graph['us'])}{u} ({100 * graph['roofline_frac']:.1f}%)", _fig(auto["us"]) + u, best,
                 other["triton_sglang"], other["triton_decode"], other["torch"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def results_name(res: dict) -> str:
    gpu = re.sub(r"[^\w.-]+", "-", res["gpu"]).strip("-").lower()
    return f"{gpu}-{res['date'][:19].replace(':', '').replace('-', '')}.json"


def save(res: dict, out_dir: Path = RESULTS, overwrite: bool = False) -> Path:
    """Write a run's results as out_dir/<gpu>-<start date>.json; an existing file of that name is
    refused unless overwrite (this run's own file, rewritten as its shapes are measured)."""
    from .files import publish
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
    names = [b.strip() for b in text.split(",") if b.strip()]
    bad = [b for b in names if b not in BACKENDS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {', '.join(bad) or '(none given)'}; "
                                         f"choose from {', '.join(BACKENDS)}")
    return names


def _splits(text: str) -> list[int]:
    try:
        vals = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want a comma list of split counts like 1,2,4")
    from .kernel.spec import MAX_SPLITS
    if any(v < 1 or v > MAX_SPLITS for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: split counts lie in 1..{MAX_SPLITS} (the kernel's "
                                         "MAX_SPLITS: the merge kernel's weight table)")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="the nine shapes of the README table (24 s on an H200 with the builds compiled)")
    p.add_argument("--backends", type=_names, default=",".join(BACKENDS), help=f"comma list of {', '.join(BACKENDS)}")
    p.add_argument("--nsplit", type=_splits, default=",".join(map(str, NSPLITS)),
                   help="fixed split counts to sweep for the cuda backend beside the automatic one ('' for none)")
    p.add_argument("--shapes", default="", help="only shapes whose label contains this text, e.g. '1x32768' (default: all)")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph replay timing")
    p.add_argument("--no-clocks", action="store_true",
                   help="do not sample the SM clock and power (nvidia-smi) while timing")
    p.add_argument("--out", default=str(RESULTS), help="directory for the JSON result file")


def main(args) -> int:
    """Benchmark kdkit's kernel beside SGLang's Triton kernels and torch on this GPU; write a JSON.
    Arguments are checked (exit 2) before the GPU is (exit 1 without one)."""
    from .kernel import unavailable
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
    run = RunFile(Path(args.out))
    try:
        res = run_grid(shapes, args.backends, args.nsplit, graph=not args.no_graph, on_shape=run.partial,
                       clocks=not args.no_clocks)
    except Exception as e:  # e.g. a CUDA fault: the context is lost, the shapes before it are not
        if run.last is None:
            print(f"kdkit bench: stopped before the first shape was measured ({_why(e)})", file=sys.stderr)
            return 1
        res = {**run.last, "stopped": _why(e)}
        print(f"kdkit bench: stopped after {len(run.last['rows'])} rows ({_why(e)})", file=sys.stderr)
    print(summary(res))  # before the save: a failing save must not hide the measurements
    try:
        path = run.write(res)
    except OSError as e:  # the GPU run is not lost: written where it can be
        import tempfile
        path = save(res, Path(tempfile.mkdtemp(prefix="kdkit-bench-")))
        print(f"kdkit bench: could not write to {args.out} ({e}); wrote {path} instead", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0 if res.get("complete", True) else 1


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
