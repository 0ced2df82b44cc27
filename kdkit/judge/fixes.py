"""Repairs for the marshaling bugs the lint names: lint code -> a function returning a fixed copy
of the case. Each does what the lint finding's `fix` text tells a person to do; the case given is
never changed (a captured case is evidence). failures.ipynb replays each case before and after.
"""
from __future__ import annotations

import torch

from ..case import Case
from ..layout import _segments


def mask_indptr_sliced(case: Case) -> Case:
    """mask_indptr captured as bs offsets instead of bs+1: the END offsets (mask_indptr[1:]) get
    the leading 0 back, the START offsets (mask_indptr[:-1]) get the mask's length appended."""
    mi = case.mask_indptr
    if mi.numel() != case.batch_size:
        raise ValueError(f"mask_indptr has {mi.numel()} entries for bs {case.batch_size}: not the sliced bug")
    if int(mi[0]) != 0:
        fixed = torch.cat([mi.new_zeros(1), mi])
    else:
        fixed = torch.cat([mi, mi.new_tensor([case.custom_mask.numel()])])
    return case.clone(mask_indptr=fixed)


def prefix_only_kv_indices(case: Case) -> Case:
    """Unified layout whose kv_indices cover only the prefix: append each request's draft slots
    (out_cache_loc), which forward_extend wrote into the pool before the kernel ran."""
    if case.layout != "unified":
        raise ValueError(f"layout is {case.layout!r}: the prefix-only bug is a unified-layout one")
    pieces, indptr = [], [0]
    for (ks, ke), (qs, qe) in zip(_segments(case.kv_indptr), _segments(case.qo_indptr)):
        pieces += [case.kv_indices[ks:ke].long(), case.out_cache_loc[qs:qe].long()]
        indptr.append(indptr[-1] + (ke - ks) + (qe - qs))
    return case.clone(kv_indices=torch.cat(pieces).to(case.kv_indices.dtype),
                      kv_indptr=torch.tensor(indptr, dtype=case.kv_indptr.dtype))


FIXES = {"mask-indptr-sliced": mask_indptr_sliced, "prefix-only-kv-indices": prefix_only_kv_indices}


def fix(case: Case, code: str) -> Case:
    """The case with the bug `code` (a lint code) repaired; KeyError names the codes known."""
    if code not in FIXES:
        raise KeyError(f"no automatic fix for {code!r}; known: {', '.join(FIXES)} (the lint's fix text says what to do)")
    return FIXES[code](case)
