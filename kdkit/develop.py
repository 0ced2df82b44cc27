"""What the development notebook (notebooks/develop.ipynb) calls: one kernel, named by a backend
spec, built, judged on a folder of cases, set beside kdkit's planted bugs on the same cases, and on
a GPU timed next to kdkit's kernel and SGLang's Triton with its integer options swept.

    name = load_kernel(spec)                 the kernel, registered (kdkit.backends.resolve)
    resource_report(name)                    its build against sm_120's limits, where it can say
    runs = replay_cases(name, case_paths(d)) every case against the float64 oracle (kdkit.replay)
    verdict_text(runs) / outcome(runs, name) the verdict tables, their legend once, a summary line
    margin_figure(runs, name)                each case's worst check as value / limit
    failure_figures(runs, name)              the error heatmap and KV error of each failed case
    planted_bugs(runs)                       kdkit's mutants on the same cases: caught or not
    time_kernel(name, shapes) / sweep(...)   on a GPU: kdkit.perf.bench's judged-then-timed path
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go

from . import backends, lint, plots, report
from . import notebook as nb
from .backends.registry import FILE_RE
from .case import Case, load
from .judge import gallery
from .judge.wrong_kernels import MUTANTS
from .replay import ReplayReport, replay

DEFAULT_KERNEL = "kdkit/byok/starters/triton/backend.py"
ARCH = "sm_120"                    # the GPU the kit builds for (design.md): resources are held to its limits
RIVALS = ("cuda", "triton_sglang")  # what the kernel is timed beside: kdkit's kernel, SGLang's Triton


# ---- the kernel ---------------------------------------------------------------------------------
def load_kernel(spec: str) -> str:
    """The registered name of the kernel `spec` names (a backend name, package.module:attr or
    path/to/file.py[:attr]; a relative file from the working directory or the repository, as the
    notebooks' paths). A file is loaded again when it changed: edit, re-run the cell."""
    if not isinstance(spec, str) or not spec.strip() or "," in spec:
        raise ValueError(f"kernel = {spec!r}: one backend spec (a name, package.module:attr or path/to/file.py[:attr])")
    spec = spec.strip()
    m = FILE_RE.fullmatch(spec)
    if m:
        spec = str(nb.resolve(m["path"])) + (f":{m['attr']}" if m["attr"] else "")
    (name,) = backends.resolve([spec])
    if name == "oracle":
        raise ValueError("kernel = 'oracle': the oracle is the reference every kernel is judged against; "
                         "name a kernel")
    return name


def resource_report(name: str, arch: str = ARCH) -> str:
    """The kernel's registers, shared memory and spills against `arch`'s limits where its backend
    reports them (kdkit.byok.cuda's CudaKernel.resources, built without a GPU); otherwise what is
    known about its build, and nothing more."""
    from .byok.triton import TritonKernel
    from .kernel import jit
    obj = backends.get(name)
    if callable(getattr(obj, "resources", None)):
        try:
            rep = obj.resources(arch=arch)
        except jit.BuildError as e:  # the compiler's own lines, at the user's file and line
            return f"{name} does not build for {arch}:\n{str(e).strip()}"
        return f"{name}, {arch}:\n{rep.table()}"
    opts = ", ".join(f"{k}={v!r}" for k, v in backends.options(name).items()) or "none"
    if isinstance(obj, TritonKernel):
        where = obj.source or getattr(obj._launch, "__name__", "launch")
        how = (f"compiled by Triton for {dev} when first launched" if (dev := gpu()) else
               "run under Triton's CPU interpreter here (TRITON_INTERPRET=1): no machine code is built")
        return (f"{name}: Triton kernel {where}; {how}. Triton compiles for the GPU it runs on, so its "
                f"registers, shared memory and spills for {arch} are known only on an {arch} GPU "
                f"(no report is made up here). Declared options: {opts}.")
    if name == "cuda":
        return (f"cuda: kdkit's own kernel; `kdkit compile --arch {arch}` reports every build's "
                f"resources against {arch}'s limits. Declared options: {opts}.")
    return (f"{name}: no resource report (its backend has no resources(arch); a CUDA kernel through "
            f"kdkit.byok.cuda.CudaKernel has one). Declared options: {opts}.")


def gpu() -> str | None:
    """The CUDA GPU's name, or None: the timing cell runs only on a GPU."""
    from .perf.bench import gpu_here
    return gpu_here()


# ---- the cases, replayed --------------------------------------------------------------------------
def case_paths(cases) -> list[Path]:
    """The case files of `cases`: a folder's own *.pt files (not its subfolders: data/captured_tensors
    holds the bundled cases, its probes/ and failures/ are case sets of their own), a file, or a
    list of them; paths resolved as the notebooks' (kdkit.notebook.resolve)."""
    items = [cases] if isinstance(cases, (str, os.PathLike)) else list(cases or [])
    out = []
    for item in items:
        p = nb.resolve(item)
        out += sorted(f for f in p.glob("*.pt")) if p.is_dir() else [p]
    if not out:
        raise ValueError(f"cases = {cases!r}: no case files (*.pt) there; give a folder of cases, a case file "
                         "or a list of them")
    return list(dict.fromkeys(out))


@dataclass
class Run:
    """One case file replayed through the oracle and the kernel (report None: it did not load)."""
    path: Path
    case: Case | None
    rep: ReplayReport | None
    error: str = ""

    @property
    def case_id(self) -> str:
        return self.case.case_id if self.case is not None else self.path.stem


def replay_cases(name: str, paths, progress: bool = True) -> list[Run]:
    """Every case against the float64 oracle, the kernel beside it (kdkit.replay: the lint once,
    a LINT_CLEAN kernel not launched on a mis-marshaled case). A file that cannot be loaded is a
    Run that says why."""
    runs = []
    for p in nb.progress_bar(paths, progress, desc=f"replaying {name}", unit="case"):
        try:
            case = load(p)
        except Exception as e:
            runs.append(Run(Path(p), None, None, f"cannot load: {type(e).__name__}: {e}"))
            continue
        runs.append(Run(Path(p), case, replay(case, ["oracle", name])))
    return runs


def status(run: Run, name: str) -> str:
    """pass / fail / error / skipped for the kernel on this case; 'cannot load' for a bad file."""
    return run.rep.row(name).status if run.rep is not None else "cannot load"


def verdict_text(runs: list[Run]) -> str:
    """Each case's verdict table (ReplayReport.table), then what the columns mean, once."""
    parts = [(r.rep.table() if r.rep is not None else f"{r.path.name}: {r.error}") for r in runs]
    judged = [r.rep for r in runs if r.rep is not None]
    legend = [report.table_legend(judged[-1])] if judged else []
    return "\n\n".join(parts + legend)


def outcome(runs: list[Run], name: str) -> tuple[bool, str]:
    """(every case passed, the summary line)."""
    by: dict[str, list[str]] = {}
    for r in runs:
        by.setdefault(status(r, name), []).append(r.case_id)
    passed = len(by.get("pass", []))
    bad = [f"{s}: {', '.join(ids)}" for s, ids in by.items() if s != "pass"]
    ok = passed == len(runs)
    return ok, (f"{name}: {passed} of {len(runs)} case(s) pass against the oracle"
                + ("" if ok else "; " + "; ".join(bad)))


def margin_figure(runs: list[Run], name: str) -> go.Figure:
    """Per case, the kernel's check nearest its limit as value / limit (above 1 fails): how much
    room each case leaves, the cases it did not judge named under the axis."""
    judged = [r for r in runs if r.rep is not None and r.rep.row(name).verdict is not None]
    ratio = [r.rep.row(name).verdict.worst_ratio for r in judged]
    # (a check with value > 0 against a limit of 0 is inf: drawn at the top, marked in the hover)
    shown = [x if math.isfinite(x) else 1e6 for x in ratio]
    fig = go.Figure(go.Bar(
        x=[r.case_id for r in judged], y=[max(x, 1e-6) for x in shown],
        marker_color=[plots.PASS_COLOR if x <= 1 else plots.FAIL_COLOR for x in ratio],
        customdata=[r.rep.row(name).verdict.caught_by[0] if x > 1 else _nearest(r, name)
                    for r, x in zip(judged, ratio)],
        hovertemplate="%{x}: %{customdata} at %{y:.3g} of its limit<extra></extra>"))
    fig.add_hline(y=1, line_dash="dash", line_color=plots.FAIL_COLOR, annotation_text="limit")
    missing = [f"{r.case_id} ({status(r, name)})" for r in runs if r not in judged]
    detail = "value / limit of the check nearest its limit (log scale; above 1 fails)"
    if missing:
        detail += "; not judged: " + ", ".join(missing)
    fig.update_yaxes(type="log", title_text="value / limit")
    return plots.finish(fig, f"{name}: how close each case is to its limit", detail, xaxis_title="case")


def _nearest(run: Run, name: str) -> str:
    checks = run.rep.row(name).verdict.checks
    def ratio(vl):
        return vl[0] / vl[1] if vl[1] > 0 else (math.inf if vl[0] > 0 else 0.0)
    return max(checks, key=lambda k: ratio(checks[k])) if checks else "-"


def failure_figures(runs: list[Run], name: str) -> dict:
    """name -> figure for every case the kernel failed: its error per head x query token
    (kdkit.plots.error_heatmap) and its worst row's error along KV (kdkit.plots.kv_error). {} when
    none failed (an error row, where it did not run, has no error to draw: the table says why)."""
    figs = {}
    for r in runs:
        row = r.rep.row(name) if r.rep is not None else None
        if row is None or row.status != "fail" or row.verdict is None:
            continue
        figs[f"error {r.case_id}"] = plots.error_heatmap(row.verdict, r.case_id, name, qo_indptr=r.case.qo_indptr)
        if r.case.num_tokens:
            figs[f"kv error {r.case_id}"] = plots.kv_error(r.case, r.rep, name)
    return figs


def failures_line(runs: list[Run], name: str) -> str:
    failed = [r.case_id for r in runs if status(r, name) == "fail"]
    errored = [r.case_id for r in runs if status(r, name) in ("error", "cannot load")]
    if not failed and not errored:
        return f"{name} failed on none of the {len(runs)} case(s): no error heatmap to draw"
    out = f"{name} failed on {len(failed)} case(s): {', '.join(failed)}" if failed else f"{name} failed on none"
    if errored:
        out += f"; did not run on {', '.join(errored)} (its table above says why)"
    return out


# ---- the judge is awake: kdkit's planted bugs on the same cases ---------------------------------
@dataclass
class Bugs:
    """mutant x case -> "caught" | "inert here" (it computes what the correct build does on that
    case) | "NOT caught"; ratio: the mutant's worst check as value / limit (the catch's margin).
    notes: the cases left out, and why."""
    cases: list[str]
    status: dict          # mutant -> case_id -> str
    ratio: dict           # mutant -> case_id -> float
    notes: list[str]

    @property
    def awake(self) -> bool:
        """Every mutant caught on at least one case, and none passed where it changed the output."""
        return bool(self.cases) and all("caught" in row.values() and "NOT caught" not in row.values()
                                        for row in self.status.values())

    def rows(self) -> list[dict]:
        return [{"mutant": m, **row, "what": MUTANTS[m]} for m, row in self.status.items()]

    def figure(self) -> go.Figure:
        """A heatmap mutant x case of log10(value / limit): each catch's margin over the limit."""
        ms = list(self.status)
        z = [[_log10(self.ratio[m].get(c)) for c in self.cases] for m in ms]
        text = [[self.status[m].get(c, "-") for c in self.cases] for m in ms]
        fig = go.Figure(go.Heatmap(z=z, x=self.cases, y=ms, text=text, texttemplate="%{text}",
                                   colorscale="Reds", colorbar={"title": "log10 ratio"}, zmin=0,
                                   hovertemplate="%{y} on %{x}: %{text}, 10^%{z:.1f} x its limit<extra></extra>"))
        caught = sum(s == "caught" for row in self.status.values() for s in row.values())
        total = sum(len(row) for row in self.status.values())
        fig.update_yaxes(autorange="reversed")
        return plots.finish(fig, "the judge on these cases: kdkit's planted bugs (torch backend)",
                             f"{caught} of {total} caught; colour: log10(worst check / its limit)",
                             xaxis_title="case", height=max(320, 28 * len(ms) + 140))


def _log10(x) -> float | None:
    if x is None:
        return None
    return math.log10(x) if 0 < x < math.inf else (6.0 if x == math.inf else None)


def planted_bugs(runs: list[Run], mutants=None, nsplit: int = 2) -> Bugs:
    """Each of kdkit's mutants (kdkit.judge.wrong_kernels, planted in the torch backend) replayed on
    each case the oracle could judge, against the oracle (kdkit.judge.gallery.mutant). nsplit: the
    torch backend's KV splits (the merge mutants act only with more than one)."""
    names = list(mutants) if mutants is not None else list(MUTANTS)
    for m in names:
        if m not in MUTANTS:
            raise ValueError(f"mutants: {m!r} is not one of kdkit's ({', '.join(MUTANTS)})")
    cases, notes = [], []
    stat = {m: {} for m in names}
    ratio = {m: {} for m in names}
    for r in runs:
        if r.rep is None or r.rep.row("oracle").status != "pass":
            notes.append(f"{r.case_id}: left out (the oracle could not read it: {r.error or 'see its table'})")
            continue
        findings = lint.check(r.case)
        after = replay(r.case, ["oracle", "torch"], findings=findings, torch={"nsplit": nsplit})
        if not report.outcome(after)[0]:
            notes.append(f"{r.case_id}: left out (the correct torch build does not pass on it: "
                         f"{report.outcome(after)[1]})")
            continue
        cases.append(r.case_id)
        for m in names:
            e = gallery.mutant(m, r.case, MUTANTS[m], after=after, findings=findings, nsplit=nsplit)
            v = e.before.row("torch").verdict
            stat[m][r.case_id] = "caught" if e.caught else "inert here" if e.inert else "NOT caught"
            ratio[m][r.case_id] = v.worst_ratio if v is not None else None
    return Bugs(cases, stat, ratio, notes)


# ---- on a GPU: timed beside kdkit's kernel and SGLang's Triton, its integer options swept -------
def int_options(name: str) -> dict:
    """The integer options `name`'s run() declares (option -> default): what a sweep can vary."""
    return {k: v for k, v in backends.options(name).items() if type(v) is int}


def shapes(spec, heads: int = 8) -> list:
    """[[bs, prefix, q_len], ...] -> kdkit.perf.bench.Shape (a DDTree-like draft tree, seed 0)."""
    from .perf.bench import Shape
    out = []
    for s in spec:
        if not (isinstance(s, (list, tuple)) and len(s) == 3 and all(isinstance(x, int) and x > 0 for x in s)):
            raise ValueError(f"shapes: {s!r}; each shape is [bs, prefix, q_len], positive whole numbers")
        out.append(Shape(*s, heads=heads))
    return out


def time_kernel(name: str, shape_list, rivals=RIVALS, graph: bool = True) -> dict:
    """The kernel and `rivals` on each shape through kdkit.perf.bench.run_grid (each configuration
    judged before it is timed; a wrong one is a FAIL row with no time): a results dict."""
    from .perf import bench
    return bench.run_grid(shape_list, [name, *[r for r in rivals if r != name]], nsplits=(), graph=graph)


def sweep(name: str, shape_list, values=(1, 2, 4, 8, 16, 32, 64), options=None) -> list[dict]:
    """Each integer option of the kernel's run() (or those named) at each of `values` on each shape,
    the others at their defaults, through the bench's judged-then-timed step (kdkit.perf.bench.Grid):
    rows with the option, its value, us (None: judged wrong, its verdict kept) or why it did not run."""
    from .perf import bench
    from .perf.correctness import Reference
    opts = int_options(name) if options is None else {k: int_options(name)[k] for k in options}
    if not opts:
        return []
    g = bench.Grid.measured("cuda", None, graph=False, nsplits=())
    rows = []
    for shape in shape_list:
        case = bench.make_case(shape)
        ref = Reference(case, device="cuda")
        for opt, default in opts.items():
            for v in dict.fromkeys([*values, default]):
                base = {"option": opt, "value": v, "default": v == default, "shape": shape.label}
                try:
                    (row, *_) = g.one(name, shape, case, ref, {opt: v}, first=False)
                    rows.append({**base, "us": row.get("us"), "gbps": row.get("gbps"), "verdict": row.get("verdict")})
                except Exception as e:  # a value the kernel refuses: said, the sweep goes on
                    rows.append({**base, "us": None, "verdict": f"did not run: {bench.short_reason(e)}"})
    return rows


def no_gpu_line(name: str) -> str:
    opts = ", ".join(int_options(name)) or "none declared"
    return (f"no CUDA GPU here: timing skipped (on a GPU: {name} beside {', '.join(RIVALS)}, judged then timed, "
            f"and its integer options swept: {opts})")


def timing_rows(results: dict) -> list[dict]:
    """The bench rows for a table: backend, shape, us, GB/s, roofline fraction, vs Triton, verdict."""
    return [{"backend": r["backend"] + (" (graph)" if r["graph"] else ""),
             "shape": f"{r['bs']}x{r['prefix']} q{r['q_len']} H{r['heads']}",
             "nsplit": r.get("nsplit"), "us": r.get("us"), "GB/s": r.get("gbps"),
             "roofline": r.get("roofline_frac"), "vs triton": r.get("speedup_vs_triton"),
             "verdict": "pass" if r.get("us") is not None else r.get("verdict")} for r in results["rows"]]


def timing_figure(results: dict, name: str) -> go.Figure:
    """us per shape, one bar per backend (eager; CUDA-graph replay as its own bar)."""
    fig = go.Figure()
    by: dict = {}
    for r in timing_rows(results):
        by.setdefault(r["backend"], []).append(r)
    for b, rows in by.items():
        fig.add_trace(go.Bar(name=b, x=[r["shape"] for r in rows], y=[r["us"] for r in rows]))
    fig.update_yaxes(type="log", title_text="us (median)")
    return plots.finish(fig, f"{name} beside {', '.join(RIVALS)} on {results['gpu']}",
                         f"each configuration judged before it was timed ({results['date']})",
                         xaxis_title="shape (bs x prefix, q_len, heads)", barmode="group")


def sweep_figure(rows: list[dict], name: str) -> go.Figure:
    """us against each swept option's value, one line per (option, shape); the default ringed."""
    fig = go.Figure()
    for key in dict.fromkeys((r["option"], r["shape"]) for r in rows):
        pts = sorted((r for r in rows if (r["option"], r["shape"]) == key and r["us"] is not None),
                     key=lambda r: r["value"])
        fig.add_trace(go.Scatter(x=[r["value"] for r in pts], y=[r["us"] for r in pts], mode="lines+markers",
                                 name=f"{key[0]}, {key[1]}",
                                 marker={"size": [13 if r["default"] else 7 for r in pts]}))
    opts = ", ".join(dict.fromkeys(r["option"] for r in rows))
    fig.update_xaxes(type="log", title_text="value")
    fig.update_yaxes(title_text="us (median)")
    return plots.finish(fig, f"{name}: its integer options swept ({opts})",
                         "each value judged before it was timed; the large marker: the default")


def titles(figs: dict) -> dict:
    return {k: f.layout.title.text for k, f in figs.items()}
