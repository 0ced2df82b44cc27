"""How a batch is cut into blocks: query rows per block and KV splits per request, from the shape
and the SM count alone (no timing at plan time, so graph replay makes the same choice)."""
from __future__ import annotations

from .spec import NT_CHOICES

BLOCK_N = 32            # KV rows per pipeline step (kd_meta_block_n; checked against the build)
MAX_SPLITS = 256
WORKSPACE_LIMIT = 512 << 20  # fp32 partials beyond this are not worth the merge: fewer splits
# A split shorter than this many steps of 32 KV rows spends more on its prologue (gathering Q)
# and its share of the merge (2 KB of fp32 partial per query row, written and read back) than on
# streaming KV.
MIN_STEPS_PER_SPLIT = 8


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def choose_nt(rows: int) -> int:
    """Fewest blocks per request first (each reads the whole KV, the siblings from L2), then the
    fewest idle query columns."""
    return min(NT_CHOICES, key=lambda nt: (cdiv(rows, 8 * nt), cdiv(rows, 8 * nt) * 8 * nt))


def rows_per_block(rows: int, nt: int) -> int:
    """Spread a request's rows evenly over its blocks, in whole n-tiles of 8."""
    blocks = cdiv(rows, 8 * nt)
    return min(8 * nt, 8 * cdiv(cdiv(rows, blocks), 8))


def choose_nsplit(bs: int, blocks_per_request: int, max_kv_len: int, sm_count: int, total_rows: int) -> int:
    """One wave of blocks over the SMs (one block per SM: ~95 KB of shared memory), no split
    shorter than MIN_STEPS_PER_SPLIT steps, a bounded workspace."""
    want = cdiv(sm_count, max(1, bs * blocks_per_request))
    by_len = max(1, cdiv(max_kv_len, BLOCK_N) // MIN_STEPS_PER_SPLIT)
    by_ws = max(1, WORKSPACE_LIMIT // max(1, total_rows * 512 * 4))
    return int(max(1, min(want, by_len, by_ws, MAX_SPLITS)))
