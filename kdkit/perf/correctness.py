"""Correctness before timing: what `kdkit bench` judges a backend's output against at a shape, and
the verdict line a result row carries.

The reference: the float64 oracle (kdkit.oracle, through kdkit.trials.Reference, as the trials
judge) where it is affordable on the host's CPU, else the torch backend (fp32 math, bf16 output,
fp32 LSE) on the bench's device, judged as a bf16 reference (compare.judge's against="torch" rule:
that reference's own rounding error is allowed for). The torch backend is the one the bench trusts
there: it is judged against the oracle over chains, trees, ragged batches, q_len 1..1025 and
H 1..128 (tests/test_torch_ref.py), and it times every grid shape already.

Where the torch backend is the reference, its own rows are judged against that same reference
(at its automatic split count that is itself: the verdict names what it was judged against).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import backends
from ..judge import compare, trials

# The oracle's cost: float64 NumPy on the CPU, ~0.7 million scores a second on a 2-core CI machine
# and a few times that on a GPU host (1 x 32K, q_len 9, H 8 = 2.4M scores: 3.6 s here). Above
# 2^24 scores (~5 s on the GPU host) the torch backend on the GPU is the reference. The bench's
# --quick set is judged against the oracle on every shape but 1 x 32K q64 and 4 x 8K q257.
ORACLE_MAX_SCORES = 1 << 24


def scores(case) -> int:
    """Query rows x heads x KV rows, summed over the requests: the oracle's work."""
    q, kv = case.qo_indptr.long(), case.kv_indptr.long()
    n = q[1:] - q[:-1]
    kv_len = kv[1:] - kv[:-1]
    if case.layout != "unified":  # the sglang layout's kv_indptr counts the prefix only
        kv_len = kv_len + n
    return int((n * kv_len).sum()) * case.num_heads


@dataclass
class Verdict:
    passed: bool
    line: str       # one line: PASS or FAIL, against what, and the judge's first reason


class Reference:
    """What one case's outputs are judged against, computed once, when first needed."""

    def __init__(self, case, device="cuda", oracle_max_scores: int = ORACLE_MAX_SCORES):
        self.case, self.device = case, device
        self.use_oracle = scores(case) <= oracle_max_scores
        self.against = "oracle" if self.use_oracle else "torch"
        self._ref = None

    def get(self):
        if self._ref is None:
            if self.use_oracle:
                self._ref = trials.Reference(self.case)
            else:
                self._ref = backends.run("torch", self.case, device=self.device)
        return self._ref

    def judge(self, name: str, res: backends.Result) -> Verdict:
        """`res` of backend `name` against this reference, with its LSE where it gives one and on
        the output alone (both must pass, as the trials judge)."""
        ref = self.get()
        if self.use_oracle:
            t = trials.check_result(name, res, ref)
            vs = [v for v in (t.with_lse, t.output_only) if v is not None]
        else:
            vs = [compare.judge(name, compare.metrics(res.out, ref.out, res.lse, ref.lse), ref.out, against="torch",
                                lse_abs_bound=res.info.get("lse_abs_bound"))]
            if res.lse is not None:
                vs.append(compare.judge(name, compare.metrics(res.out, ref.out), ref.out, against="torch"))
        bad = next((v for v in vs if not v.passed), None)
        shown = bad or vs[0]
        what = "the float64 oracle" if self.use_oracle else "the torch backend (fp32) on " + str(self.device)
        word = "FAIL" if bad else "PASS"
        return Verdict(bad is None, f"{word} against {what}: {shown.reasons[0]}")
