"""The kernel's host-side reading of the batch metadata (kdkit.kernel.checks.read_sizes, plan
time, CPU tensors are enough): the layout rule is kdkit.constants', in both layouts."""
from __future__ import annotations

import re

import pytest

from kdkit import synth
from kdkit.constants import KV_INDICES_COVER
from kdkit.kernel import InputError
from kdkit.kernel.api import Metadata
from kdkit.kernel.checks import read_sizes
from kdkit.layout import to_layout


def _metadata(case, **change):
    fields = dict(qo_indptr=case.qo_indptr, kv_indptr=case.kv_indptr, kv_indices=case.kv_indices,
                  prefix_lens=case.prefix_lens, custom_mask=case.custom_mask, mask_indptr=case.mask_indptr,
                  num_heads=case.num_heads, sm_scale=case.sm_scale, logit_cap=case.logit_cap,
                  causal=case.causal, layout=case.layout)
    return Metadata(**{**fields, **change})


@pytest.mark.parametrize("layout", ["sglang", "unified"])
def test_sizes_follow_the_layout_rule(layout):
    case = to_layout(synth.make_case(bs=3, prefix=[0, 37, 300], q_len=[9, 1, 33], seed=3), layout)
    sizes = read_sizes(_metadata(case))
    assert sizes["max_kv_len"] == 300 + 33 and sizes["max_q_len"] == 33 and sizes["bs"] == 3
    assert read_sizes(_metadata(case, prefix_lens=None if layout == "sglang" else case.prefix_lens)) == sizes
    # prefix_lens that disagree with what kv_indices cover: named, with the rule in constants' words
    wrong = case.prefix_lens.clone()
    wrong[1] += 1
    field = "kv_indices" if layout == "unified" else "kv_indptr"
    with pytest.raises(InputError, match=re.escape(f"field '{field}': {layout} layout: each request's "
                                                   f"kv_indices cover {KV_INDICES_COVER[layout]} (")):
        read_sizes(_metadata(case, prefix_lens=wrong, custom_mask=None, mask_indptr=None))
