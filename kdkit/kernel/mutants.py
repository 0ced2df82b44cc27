"""Mutants: deliberately wrong builds of the kernel that the judge must catch (negative controls).

The registry is kdkit/judge/wrong_kernels.py (name -> what goes wrong and the hooks of cuda/kd_mutants.cuh
that plant it), the one list the torch backend plants too, so the CPU and the GPU plant the same
bugs. This module only turns a name into the build's defines. The production build defines no
hook, and the kernel calls every hook on its production path, so a mutant differs by exactly one
thing.
"""
from __future__ import annotations

from ..judge.wrong_kernels import MUTANTS, REGISTRY, check

__all__ = ["MUTANTS", "defines"]


def defines(mutant: str | None) -> dict:
    """The hook definitions (`MACRO(args)` -> replacement) that plant `mutant`; {} for None.
    An unknown name is the ValueError of kdkit.judge.wrong_kernels.check, as in the torch backend."""
    if check(mutant) is None:
        return {}
    return dict(REGISTRY[mutant].hooks)
