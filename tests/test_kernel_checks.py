"""The kernel's host-side reading of the batch metadata (kdkit.kernel.checks.read_sizes, plan
time, CPU tensors are enough): the layout rule is kdkit.constants', in both layouts."""
from __future__ import annotations

import re

import pytest

from kdkit import shapes, synth
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


def test_a_layers_slots_are_written_in_place_and_the_plans_fields_kept():
    """run() rewrites only the first bytes of the plan's packed KdParams (params.LAYER, one struct
    write in PER_LAYER's order) at the address the launch passes the driver; the fields plan()
    packed stay. (Which tensor lands in which slot needs a GPU: tests/test_cuda_kernel.py.)"""
    import numpy as np

    from kdkit.kernel import params
    buf = params.ArgBuffer(params.pack(num_heads=3, nsplit=4, sm_scale=0.5, qo_indptr=77))
    address = buf.address
    values = [(1 << 40) + 16 * i for i in range(6)] + [-5, 7, 11, 13, 17, 19, 23]  # pointers, then strides
    buf.bind(*values)
    assert [int(buf.arr[name][0]) for name in params.PER_LAYER] == values
    assert buf.address == address == buf.arr.ctypes.data
    assert int(buf.arr["num_heads"][0]) == 3 and int(buf.arr["nsplit"][0]) == 4 and float(buf.arr["sm_scale"][0]) == 0.5
    assert int(buf.arr["qo_indptr"][0]) == 77
    assert params.LAYER.size == 8 * len(params.PER_LAYER) == params.dtype().fields["qo_indptr"][1]
    assert np.count_nonzero(buf.arr.view(np.uint8)[params.LAYER.size:]) > 0


# ---- found by an audit (2026-12-02) --------------------------------------------------------------
def test_infinite_scale_or_cap_and_oversized_batches_are_refused():
    """An infinite sm_scale or logit_cap made every score inf (or inf x 0 = NaN): a silent NaN output."""
    from kdkit.kernel.checks import check_scalars
    case = shapes.seed_shape()
    for change, field in ((dict(sm_scale=float("inf")), "sm_scale"), (dict(logit_cap=float("inf")), "logit_cap"),
                          (dict(sm_scale=float("nan")), "sm_scale"), (dict(num_heads=0), "num_heads")):
        with pytest.raises(InputError, match=f"field '{field}'"):
            check_scalars(_metadata(case, **change), bs=1)
    check_scalars(_metadata(case), bs=65535)
    with pytest.raises(InputError, match="field 'qo_indptr': 65536 requests"):
        check_scalars(_metadata(case), bs=65536)


def test_a_negative_prefix_length_is_refused():
    import torch
    case = to_layout(synth.make_case(prefix=21, q_len=9), "unified")
    with pytest.raises(InputError, match="field 'prefix_lens': negative prefix length -3"):
        read_sizes(_metadata(case, prefix_lens=torch.tensor([-3])))


def test_the_planner_takes_a_batch_without_query_tokens_and_16_warp_gathers():
    from kdkit.kernel import schedule
    assert schedule.rows_per_block(0, 5) == 40 and schedule.blocks_per_request(0, 5) == 1
    nt, ns, skip = schedule.choose_launch(2, 0, 0, 7, 132, 0, False)
    assert ns >= 1
    # 16 warps hold an n-tile per half: the gather's block-size search starts at 2 n-tiles
    nt, ns, skip = schedule.choose_launch(1, 16, 2, 64, 132, 16, True, nt=2, nh=2, skip="gather", nt_fixed=False)
    assert nt >= 2 and skip == "gather"


def test_the_fused_merge_is_taken_where_the_splits_are_few_and_the_grid_fits():
    """schedule.merge_mode: one split has nothing to merge; by default up to FUSED_MAX_SPLITS splits
    (more: the measured loss) where the grid fits the GPU at once (the split blocks wait for each
    other: a cooperative launch), else the merge kernel; asked for (True) at any count, the last
    block merging where the grid does not fit; a way asked for ("wait", "last") is taken as given;
    never when asked not to (False)."""
    from kdkit.kernel import schedule
    mode = schedule.merge_mode
    cap, few, many = schedule.FUSED_MAX_SPLITS, 8, schedule.FUSED_MAX_SPLITS + 1
    assert few <= cap
    assert not mode(1, 2, 132, None) and not mode(1, 2, 132, True) and not mode(1, 2, 132, "last")
    assert mode(few, 2 * few, 132, None) == "wait" and mode(cap, 2 * cap, 132, None) == "wait"
    assert not mode(many, 2 * many, 132, None) and mode(many, 2 * many, 132, True) == "wait"
    # a grid larger than the GPU holds: the merge kernel by default (the last block's merge measured
    # slower); asked for, the last block of each row block merges (no block waits)
    assert not mode(few, 133, 132, None) and mode(many, 2000, 132, True) == "last"
    assert mode(few, 2 * few, 132, "last") == "last" and mode(few, 2 * few, 132, "wait") == "wait"
    assert not mode(few, 2 * few, 132, False)
    # the grid's long-KV single requests at q_len 9 split 33-65 ways: the merge kernel stays theirs,
    # and their plans never load the fused build to ask (wants_fused, before the build)
    assert not mode(65, 130, 132, None) and not mode(33, 66, 132, None)
    assert not schedule.wants_fused(65, None) and schedule.wants_fused(65, True) and schedule.wants_fused(few, None)
    assert schedule.wants_fused(65, "last") and not schedule.wants_fused(few, False)
    # the 64-row build: the merge kernel unless asked (its waiting split blocks measured slower)
    assert not schedule.wants_fused(few, None, pair=True) and not mode(few, 2 * few, 132, None, pair=True)
    assert mode(few, 2 * few, 132, True, pair=True) == "wait" and mode(few, 2 * few, 132, "last", pair=True) == "last"


def test_fused_takes_only_its_choices():
    from kdkit.kernel import PlanOptions
    for ok in (None, True, False, "wait", "last"):
        assert PlanOptions(fused=ok).fused == ok
    for bad in (0, 1, "yes", "Wait"):
        with pytest.raises(InputError, match=r"field 'fused'.*'wait', 'last'"):
            PlanOptions(fused=bad)


# ---- found by a review (2026-12-02) --------------------------------------------------------------
def test_a_max_kv_len_below_the_batch_is_refused_and_one_above_is_used():
    """plan(max_kv_len=...) chooses the split count for the longest KV the plan will run (a graph
    captured for it), with check=True too (it was read only with check=False); below the batch's
    own longest it is refused by name."""
    from kdkit.kernel.checks import bound_kv_len
    sizes = read_sizes(_metadata(synth.make_case(bs=2, prefix=[100, 700], q_len=9, seed=2)))
    assert sizes["max_kv_len"] == 709
    assert bound_kv_len(sizes, None) == sizes and bound_kv_len(sizes, 709) == sizes
    assert bound_kv_len(sizes, 131072) == {**sizes, "max_kv_len": 131072}
    with pytest.raises(InputError, match=r"field 'max_kv_len': 708 is below the longest request now \(709 KV rows"):
        bound_kv_len(sizes, 708)


def test_a_misaligned_view_is_refused_with_a_fix_that_works():
    """A contiguous view at an odd element offset has the right strides; .contiguous() returns it
    unchanged, so the message names the address and says .clone() (CPU tensors: the device is
    checked last)."""
    import torch

    from kdkit.kernel.checks import _rows16
    t = torch.empty(10 * 576 + 1, dtype=torch.bfloat16)[1:].view(10, 576)
    assert t.is_contiguous() and t.contiguous().data_ptr() == t.data_ptr() and t.data_ptr() % 16 == 2
    with pytest.raises(InputError, match=r"field 'q': starts at address 0x[0-9a-f]+, not 16-byte aligned .*\.clone\(\)"):
        _rows16(t, "q")
    with pytest.raises(InputError, match=r"field 'q': strides \(1152, 2\)"):
        _rows16(torch.empty(10, 1152, dtype=torch.bfloat16)[:, ::2], "q")
    with pytest.raises(InputError, match="field 'q': not on a CUDA device"):
        _rows16(torch.empty(10, 576, dtype=torch.bfloat16), "q")


def test_a_gpu_older_than_sm_80_is_named_before_any_build(monkeypatch):
    """On a T4 (sm_75) unavailable() said the kernel could run, and every plan() then failed with a
    page of ptxas errors (cp.async needs sm_80): it now says so in one line."""
    import torch

    from kdkit.kernel import unavailable
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    why = unavailable()
    assert why is not None and why.startswith("Tesla T4 is sm_75; the kernel needs sm_80 or newer"), why
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (12, 0))
    assert unavailable() is None or "sm_" not in unavailable()  # sm_120 passes the arch test
