"""Stand-in for torchvision in kdkit's CPU SGLang test environment (.venv-sglang).

torchvision's wheel is built against a CUDA torch, so it cannot be installed beside the CPU torch
that kdkit's tests use. SGLang imports it at module level in its multimodal code, which the
attention backend's import chain reaches, but nothing kdkit's tests run ever calls it. So every
name resolves to a placeholder, and calling one raises an ImportError that says why.
"""
from __future__ import annotations

import sys
import types

WHY = ("torchvision is stood in for in kdkit's CPU SGLang test environment (its wheel needs a CUDA "
       "torch); nothing under test should call it")


class _Missing:
    """Any attribute is another placeholder; calling one raises."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Missing(f"{self._name}.{item}")

    def __call__(self, *a, **k):
        raise ImportError(f"{self._name}: {WHY}")

    def __repr__(self):
        return f"<kdkit stand-in {self._name}>"


def _module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name, WHY)
    mod.__getattr__ = lambda item, _n=name: _Missing(f"{_n}.{item}") if not item.startswith("__") \
        else (_ for _ in ()).throw(AttributeError(item))
    mod.__path__ = []  # a package: its submodules come from the table below
    sys.modules[name] = mod
    return mod


__version__ = "0.0.0+kdkit.standin"
for _sub in ("transforms", "transforms.functional", "transforms.v2", "transforms.v2.functional",
             "io", "ops", "models", "utils", "datasets"):
    _full = f"{__name__}.{_sub}"
    _m = _module(_full)
    _parent, _, _leaf = _full.rpartition(".")
    setattr(sys.modules[_parent], _leaf, _m)


def __getattr__(item):
    if item.startswith("__"):
        raise AttributeError(item)
    return _Missing(f"torchvision.{item}")
