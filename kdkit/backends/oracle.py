"""The float64 NumPy oracle as a backend (CPU, any case)."""
from __future__ import annotations

import torch

from .. import oracle
from . import Result

NAME = "oracle"


def unavailable(case=None):
    return None


def run(case, **opts) -> Result:
    out, lse = oracle.run(case)
    return Result(torch.from_numpy(out), torch.from_numpy(lse), {"device": "cpu", "dtype": "float64"})
