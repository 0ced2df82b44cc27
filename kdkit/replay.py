"""Replay one case through several backends and judge each against a reference.

    report = replay(case, ["oracle", "torch", "triton_sglang", "cuda", "captured"])
    print(report.table())

Each backend gets a fresh `case.clone()` (a backend that writes into its inputs cannot spoil the
next one) through kdkit.backends.run (options checked the same way for all). The float64 oracle
runs once, and the lint once, here: backends do not lint again; a backend marked LINT_CLEAN (a
kernel a mis-marshaled case could make read out of bounds) is not run on a case with lint errors.
If SGLang's Triton kernel ran, its error against the oracle is the production error that the
tolerance rule scales with (kdkit.judge.compare.judge); if it did not but the case carries the live
Triton output ("captured"), that serves instead. A backend that cannot run here is a "skipped"
row with its one-line reason; one that raises is an "error" row; replay always goes on to the next.
"""
from __future__ import annotations

import importlib
import time
from typing import Iterable
from dataclasses import dataclass, field

import torch

from . import backends as _backends
from .judge.compare import Metrics, Verdict, judge, metrics, seed_line

# backends whose output *is* the production path (SGLang's Triton kernel), best first
PRODUCTION = ("triton_sglang", "captured")


@dataclass
class Row:
    backend: str
    status: str                 # "pass" | "fail" | "skipped" | "error"
    verdict: Verdict | None
    seconds: float
    info: dict = field(default_factory=dict)
    reason: str = ""


@dataclass
class ReplayReport:
    case_id: str
    summary: str
    against: str
    rows: list[Row]
    lint: list = field(default_factory=list)   # kdkit.lint Findings
    label: str = ""                            # the case's short label for log lines (L56, case id)
    production: str | None = None              # which backend gave the production error, if any
    lint_error: str | None = None              # why lint findings are missing, if they are
    # each backend that ran (the oracle included) -> its output [T, H, 512]: what kdkit.plots.kv_error
    # attributes to KV positions; kept out of repr (a few MB for large cases)
    outputs: dict = field(default_factory=dict, repr=False)

    @property
    def passed(self) -> bool:
        return all(r.status in ("pass", "skipped") for r in self.rows)

    def row(self, backend: str) -> Row:
        for r in self.rows:
            if r.backend == backend:
                return r
        raise KeyError(f"no row for backend {backend!r}; rows: {[r.backend for r in self.rows]}")

    def table(self) -> str:
        from tabulate import tabulate
        # "nearest": the check (kdkit.judge.compare.judge) closest to its limit, value / limit (> 1 fails)
        head = ["backend", "status", "max_abs", "mean_abs", "rel", "cos_dist", "lse_err", "limit", "nearest", "time"]
        e = (lambda x: "-" if x is None else f"{x:.2e}")
        rows = []
        for r in self.rows:
            m = r.verdict.metrics if r.verdict else None
            # the reference is not judged against itself: its row says what it is, not "pass"
            status = "reference" if r.backend == self.against and r.status == "pass" else r.status
            rows.append([r.backend, status,
                         e(m and m.max_abs), e(m and m.mean_abs), e(m and m.rel), e(m and m.cos_dist),
                         e(m.lse_max_abs if m else None), e(r.verdict.limit if r.verdict else None),
                         _nearest(r.verdict), _fmt_time(r.seconds) if r.status in ("pass", "fail") else "-"])
        out = [f"{self.summary}  (against {self.against}"
               + (f", production = {self.production})" if self.production else ", no production path)"),
               tabulate(rows, head, tablefmt="plain", disable_numparse=True,
                        colalign=("left", "left") + ("right",) * (len(head) - 2))]
        for r in self.rows:
            if r.status == "pass" and r.verdict is not None and r.verdict.lse_limit is None:
                # the oracle always has an LSE; another reference (a captured output) may not, and
                # then every row is judged by compare.judge's tighter output-only rule
                who = "the backend" if self.against == "oracle" else "the backend or the reference"
                out.append(f"  {r.backend}: no LSE from {who}: judged on the output alone (tighter limits)")
            if r.status != "pass" and r.reason:
                # unavailable() lines already start with the backend's name
                lead = "" if r.reason.startswith(f"{r.backend}:") else f"{r.backend}: "
                out.append(f"  {lead}{r.reason}")
        if self.lint_error:
            out.append(f"  lint: {self.lint_error}")
        elif self.lint:
            out.append(f"  lint: {len(self.lint)} finding(s): "
                       + "; ".join(str(getattr(f, "code", f)) for f in self.lint))
        return "\n".join(out)

    def seed_lines(self) -> list[str]:
        """One seed-style log line per judged backend: `[kdkit] L56 cuda max_abs_diff=...`."""
        return [seed_line(f"{self.label} {r.backend}", r.verdict.metrics)
                for r in self.rows if r.verdict is not None]

    def __str__(self) -> str:
        return self.table()


def _nearest(v) -> str:
    """`ulp_row 0.31`: the check of a verdict nearest its limit, as value / limit."""
    if v is None or not v.checks:
        return "-"
    def ratio(val, lim):  # as Verdict.worst_ratio: 0 against a limit of 0 is 0, not inf
        return val / lim if lim > 0 else (float("inf") if val > 0 else 0.0)
    name, (val, lim) = max(v.checks.items(), key=lambda kv: ratio(*kv[1]))
    return f"{name} {ratio(val, lim):.2g}"


def _fmt_time(s: float) -> str:
    return f"{s * 1e3:.1f}ms" if s < 1 else f"{s:.2f}s"


def _timed(name: str, case, opts: dict):
    """Run a backend on a clone of the case; seconds include waiting for the device to finish."""
    c = case.clone()
    t0 = time.perf_counter()
    res = _backends.run(name, c, **opts)  # BackendUnavailable: a skipped row
    if isinstance(res.out, torch.Tensor) and res.out.is_cuda:
        torch.cuda.synchronize(res.out.device)
    return res, time.perf_counter() - t0


def _check_shape(name: str, res, case):
    want = (case.num_tokens, case.num_heads, case.v_head_dim)
    if not isinstance(res.out, torch.Tensor) or tuple(res.out.shape) != want:
        got = tuple(res.out.shape) if hasattr(res.out, "shape") else type(res.out).__name__
        raise ValueError(f"{name} returned out of shape {got}, expected {want} [T, H, v_head_dim]")
    if res.lse is not None and tuple(res.lse.shape) != want[:2]:
        raise ValueError(f"{name} returned lse of shape {tuple(res.lse.shape)}, expected {want[:2]} [T, H]")


def _lint(case):
    try:
        _lint_mod = importlib.import_module(f"{__package__}.lint")  # imported lazily
    except ModuleNotFoundError as e:
        if e.name == f"{__package__}.lint":
            return [], "kdkit.lint is not installed in this kdkit; no lint findings"
        raise
    try:
        return list(_lint_mod.check(case)), None
    except Exception as e:  # a lint bug must not hide the numbers
        return [], f"lint crashed: {type(e).__name__}: {e}"


def _not_clean(errors) -> str:
    return ("not run on a case with lint errors (a mis-marshaled case could make the kernel read out "
            "of bounds): " + "; ".join(f"field '{e.field}': {e.message} (fix: {e.fix})" for e in errors[:3]))


def replay(case, backends: str | Iterable[str], against: str = "oracle", run_lint: bool = True,
           findings: list | None = None, progress=None, **opts) -> ReplayReport:
    """Run `backends` on clones of `case`, judge each against `against` ("oracle" or a backend).

    backends: a list of names, or a --backends string ("all", "oracle,torch": backends.resolve).
    findings: the case's kdkit.lint findings if the caller has them already (not linted again).
    opts are per-backend option dicts keyed by backend name, e.g. torch={"device": "cuda"}.
    progress(name), if given, is called as each backend starts (the oracle first, once): a
    progress bar's hook, since one backend can take tens of seconds (Triton's CPU interpreter).
    """
    progress = progress or (lambda name: None)
    if isinstance(backends, str):
        backends = _backends.resolve(backends)
    names = list(dict.fromkeys(backends))          # de-duplicated, order kept
    unknown = [n for n in names if n != "oracle" and n not in _backends.BACKENDS]
    if unknown:
        raise KeyError(f"unknown backend(s) {unknown}; choose from {', '.join(_backends.BACKENDS)}")
    if against != "oracle" and against not in _backends.BACKENDS:
        raise KeyError(f"against={against!r} is not a backend; judge against oracle (the default) or one of "
                       f"{', '.join(_backends.BACKENDS)}")
    stray = [k for k in opts if k not in _backends.BACKENDS]
    if stray:
        raise TypeError(f"replay options {stray} are not backend names; pass per-backend options "
                        f"as name={{...}}, e.g. torch={{'device': 'cuda'}}")
    for k, v in opts.items():
        if not isinstance(v, dict):
            raise TypeError(f"replay option {k}= must be a dict of that backend's options, got {type(v).__name__}")

    if findings is not None:
        lint, lint_error = list(findings), None
    else:
        lint, lint_error = _lint(case) if run_lint else ([], "lint not run (run_lint=False)")
    lint_errors = [f for f in lint if getattr(f, "severity", None) == "error"]

    def report(rows, prod_name=None):
        return ReplayReport(case_id=case.case_id, summary=case.summary(), against=against, rows=rows,
                            lint=lint, label=case.label, production=prod_name, lint_error=lint_error,
                            outputs={n: r[0].out for n, r in results.items()})

    # the oracle once: every judgement and the production error hang off it
    results: dict[str, tuple] = {}
    skipped: dict[str, str] = {}
    errors: dict[str, str] = {}
    progress("oracle")
    try:
        results["oracle"] = _timed("oracle", case, opts.get("oracle", {}))
    except Exception as e:
        # a case the reference cannot even read (a marshaling bug): no number can be judged;
        # every row says so and the lint findings say why
        errors["oracle"] = f"{type(e).__name__}: {e}".splitlines()[0][:500]
        if lint_errors:  # the raw error is the symptom; the lint names the field and the fix
            fields = ", ".join(dict.fromkeys(f"'{f.field}'" for f in lint_errors))
            errors["oracle"] += f" (the lint's errors name field {fields}: their fixes are below)"
        if against == "oracle":
            why = "not judged: the oracle could not run this case (its row says why; see the lint)"
            return report([Row(n, "error", None, 0.0, {}, errors["oracle"] if n == "oracle" else why)
                           for n in names])

    todo = names + ([against] if against not in names else [])
    for name in todo:
        if name in results or name in errors:
            continue
        progress(name)
        if lint_errors and _backends.needs_clean_case(name):
            errors[name] = _not_clean(lint_errors)
            continue
        try:
            res, secs = _timed(name, case, opts.get(name, {}))
            _check_shape(name, res, case)
            results[name] = (res, secs)
        except _backends.BackendUnavailable as e:
            skipped[name] = str(e)
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}".splitlines()[0][:500]

    if against not in results:
        why = skipped.get(against) or errors.get(against)
        raise _backends.BackendUnavailable(f"reference {against!r} did not run: {why}")
    ref = results[against][0]

    # each row's LSE error scale (kdkit.judge.compare.lse_unit) needs the logits' size: from the oracle
    cond = results["oracle"][0].info.get("lse_cond") if "oracle" in results else None
    # each row's size before its V rows cancel (kdkit.judge.compare.spacing): a property of the case, so
    # it holds against any reference
    scale = results["oracle"][0].info.get("out_scale") if "oracle" in results else None
    production: Metrics | None = None
    prod_name = next((p for p in PRODUCTION if p in results), None)  # ran: listed or reference
    if prod_name and "oracle" in results:
        oracle_res = results["oracle"][0]
        pres = results[prod_name][0]
        production = metrics(pres.out, oracle_res.out, pres.lse, oracle_res.lse, lse_cond=cond, out_scale=scale)

    rows: list[Row] = []
    for name in names:
        if name in skipped:
            rows.append(Row(name, "skipped", None, 0.0, {}, skipped[name]))
            continue
        if name in errors:
            rows.append(Row(name, "error", None, 0.0, {}, errors[name]))
            continue
        res, secs = results[name]
        m = metrics(res.out, ref.out, res.lse, ref.lse, lse_cond=cond if against == "oracle" else None,
                    out_scale=scale)
        # the production path is not judged against its own error: its row uses the floor alone
        v = judge(name, m, ref.out, None if name == prod_name else production, against=against,
                  lse_abs_bound=res.info.get("lse_abs_bound"))
        rows.append(Row(name, "pass" if v.passed else "fail", v, secs, dict(res.info),
                        "" if v.passed else "; ".join(v.reasons)))
    return report(rows, prod_name if production is not None else None)
