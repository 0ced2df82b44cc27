"""How a batch is cut into blocks: query rows per block and KV splits per request, from the shape
and the SM count alone (no timing at plan time, so graph replay makes the same choice)."""
from __future__ import annotations

from .spec import DL, MAX_SPLITS, MERGE_GROUPS, MERGE_THREADS, NT_CHOICES

BLOCK_N = 32            # KV rows per pipeline step (kd_meta_block_n; checked against the build)
WORKSPACE_LIMIT = 512 << 20  # fp32 partials beyond this are not worth the merge: fewer splits
# The SM count of the GPU that the CPU side models: an H200's 132 SMs, the GPU the probes' split
# boundaries (kdkit.probes) and the torch reference's default split count (the split count the
# kernel chooses there) are built for. A live plan asks the device instead.
H200_SM_COUNT = 132


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_span(kv_len: int, nsplit: int) -> int:
    """KV rows in each split of a request but the last: its kv_len cut into nsplit spans, each
    rounded up to whole BLOCK_N-row tiles (so fewer than nsplit splits may be non-empty). The
    torch reference and the probes use this; the kernel's .cu (kd_mla_tc_partial) keeps its own
    copy of the formula in C++, which a test compares with this one."""
    return cdiv(cdiv(kv_len, nsplit), BLOCK_N) * BLOCK_N


def choose_nt(rows: int) -> int:
    """Fewest blocks per request first (each reads the whole KV, the siblings from L2), then the
    fewest idle query columns."""
    return min(NT_CHOICES, key=lambda nt: (cdiv(rows, 8 * nt), cdiv(rows, 8 * nt) * 8 * nt))


def rows_per_block(rows: int, nt: int) -> int:
    """Spread a request's rows evenly over its blocks, in whole n-tiles of 8."""
    blocks = cdiv(rows, 8 * nt)
    return min(8 * nt, 8 * cdiv(cdiv(rows, blocks), 8))


# Fixed cost of one block in units of one KV step (32 rows): gathering Q, the epilogue's writes,
# and for a split its share of the merge (2 KB of fp32 partial per query row, written and read).
BLOCK_OVERHEAD_STEPS = 4
MERGE_OVERHEAD_STEPS = 2


def choose_nsplit(bs: int, blocks_per_request: int, max_kv_len: int, sm_count: int, total_rows: int) -> int:
    """The split count with the least modelled time: blocks run one per SM (~95 KB of shared
    memory, ~250 registers x 256 threads), so a launch takes ceil(blocks / SMs) waves of the
    longest block, which streams ceil(steps / nsplit) steps plus a fixed overhead. Ties go to
    fewer splits (less workspace); the workspace stays bounded."""
    steps = max(1, cdiv(max_kv_len, BLOCK_N))
    per_split = max(1, bs * blocks_per_request)
    by_ws = max(1, WORKSPACE_LIMIT // max(1, total_rows * DL * 4))  # fp32 partial rows of DL dims
    best, best_cost = 1, None
    for ns in range(1, min(MAX_SPLITS, steps, by_ws) + 1):
        waves = cdiv(per_split * ns, sm_count)
        cost = waves * (cdiv(steps, ns) + BLOCK_OVERHEAD_STEPS) + (MERGE_OVERHEAD_STEPS if ns > 1 else 0)
        if best_cost is None or cost < best_cost:
            best, best_cost = ns, cost
    return best


THREADS_PER_SM = 2048  # resident threads per SM on sm_80..sm_120


def merge_groups(total_rows: int, nsplit: int, sm_count: int) -> int:
    """Thread groups per row of the merge kernel: as many as keep one wave of the GPU's threads
    busy (few rows: each row's splits are read by up to MERGE_GROUPS groups at once), one when the
    rows alone fill the GPU (more groups would only add waves), never more than the splits."""
    fill = sm_count * THREADS_PER_SM // max(1, total_rows * MERGE_THREADS)
    return max(1, min(MERGE_GROUPS, nsplit, fill))
