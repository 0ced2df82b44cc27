"""kdkit.perf.probes.fa2_rate: FlashAttention-2's forward rate as a share of the mma.sync rate
(the anchor beside issue 9's unmet targets in the README)."""
from __future__ import annotations


import pytest

from kdkit.perf.probes import fa2_rate as fa2

def test_flops_count_both_products():
    """QK^T and PV, each seq x seq x dim multiply-adds per (batch, head), 2 FLOPs each."""
    assert fa2.flops(1, 1, 1, 1) == 4
    assert fa2.flops(2, 3, 5, 7) == 2 * (2 * 3 * 5 * 5 * 7) * 2


@pytest.mark.gpu
def test_a_small_run():
    """The flash backend takes the shape (an error, not a fallback, otherwise), and its rate is a
    share of the mma.sync rate: above 0 and not past it (10% for the two timings' noise)."""
    res = fa2.measure(seq=2048, batch=1, heads=8, dims=[64, 128])
    assert [r["dim"] for r in res["rows"]] == [64, 128]
    for r in res["rows"]:
        assert 0 < r["share_of_mma_sync"] <= 1.1, r
