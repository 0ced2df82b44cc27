"""The float64 NumPy oracle as a backend (CPU, any case)."""
from __future__ import annotations

import torch

from .. import oracle
from . import Result

NAME = "oracle"


def unavailable(case=None):
    return None


def run(case) -> Result:
    out, lse, cond = oracle.run(case, with_cond=True)
    # lse_cond: each row's logit size, which kdkit.compare scales the LSE tolerance by (same pass)
    info = {"device": "cpu", "dtype": "float64", "lse_cond": cond,
            "ran": "NumPy float64 reference from the case's inputs, on the CPU"}
    return Result(torch.from_numpy(out), torch.from_numpy(lse), info)
