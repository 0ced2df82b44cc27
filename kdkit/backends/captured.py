"""The output a captured case carries (case.ref_out / ref_lse: what the live Triton call wrote),
served as a backend so that replay can compare against the production run without a GPU."""
from __future__ import annotations

from . import Result

NAME = "captured"
BENCH = False  # a reference, not a kernel: kdkit bench does not time it


def unavailable(case=None):
    if case is not None and getattr(case, "ref_out", None) is None:
        return ("captured: this case holds no reference output (case.ref_out: the live Triton call's "
                "output, which a case captured from a running SGLang server carries; `kdkit capture env` "
                "shows how to capture)")
    return None


def run(case) -> Result:
    why = unavailable(case)
    if why:
        raise RuntimeError(why)
    lse = case.ref_lse.clone() if case.ref_lse is not None else None
    info = {"device": str(case.ref_out.device), "dtype": str(case.ref_out.dtype).replace("torch.", ""),
            "source": case.meta.get("source"), "gpu": case.meta.get("gpu"),
            "sglang_version": case.meta.get("sglang_version")}
    info["ran"] = (f"the output the live call stored in the case ({info['source'] or 'source unknown'}, "
                   f"SGLang {info['sglang_version'] or '?'}, {info['gpu'] or 'GPU unknown'}, {info['dtype']})")
    return Result(case.ref_out.clone(), lse, info)
