"""The float64 NumPy oracle as a backend (CPU, any case)."""
from __future__ import annotations

import torch

from ..judge import oracle
from . import Result

NAME = "oracle"
BENCH = False  # a reference, not a kernel: kdkit bench does not time it


def unavailable(case=None):
    return None


def run(case) -> Result:
    out, lse, cond, scale = oracle.run(case, with_cond=True, with_scale=True)
    # lse_cond: each row's logit size, which kdkit.judge.compare scales the LSE tolerance by; out_scale:
    # each row's size before its V rows cancel, which it measures the output's error against where
    # that is larger than the row (both from the same pass)
    info = {"device": "cpu", "dtype": "float64", "lse_cond": cond, "out_scale": scale,
            "ran": "NumPy float64 reference from the case's inputs, on the CPU"}
    return Result(torch.from_numpy(out), torch.from_numpy(lse), info)
