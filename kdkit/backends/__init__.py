"""Backends: every one is a module with `NAME`, `unavailable(case=None) -> str | None` and
`run(case, **opts) -> Result`. `run` never mutates the case it is given."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import torch

# name -> module; the order is the order `replay` prints them in
BACKENDS = {
    "oracle": "kdkit.backends.oracle",
    "torch": "kdkit.backends.torch_ref",
    "triton_sglang": "kdkit.backends.triton_sglang",
    "cuda": "kdkit.backends.cuda",
    "captured": "kdkit.backends.captured",
}


@dataclass
class Result:
    out: torch.Tensor                 # [T, H, 512], any float dtype, any device
    lse: torch.Tensor | None = None   # [T, H] natural-log LSE of the scaled (capped) logits
    info: dict = field(default_factory=dict)  # what ran: device, release, splits, ...


class BackendUnavailable(RuntimeError):
    """This backend cannot run here; the message says why and how to make it available."""


def get(name: str):
    if name not in BACKENDS:
        raise KeyError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    return importlib.import_module(BACKENDS[name])


def unavailable(name: str, case=None) -> str | None:
    """None if `name` can run on this machine, else one line saying why and how to fix it."""
    try:
        mod = get(name)
    except ImportError as e:
        return f"{name}: cannot import ({e})"
    return mod.unavailable(case)


def run(name: str, case, **opts) -> Result:
    why = unavailable(name, case)
    if why:
        raise BackendUnavailable(why)
    return get(name).run(case, **opts)
