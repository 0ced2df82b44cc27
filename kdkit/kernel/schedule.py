"""How a batch is cut into blocks: query rows per block and KV splits per request, from the shape
and the SM count alone (no timing at plan time, so graph replay makes the same choice)."""
from __future__ import annotations

from .spec import DL, GATHER_MAX_NT, MAX_SPLITS, MERGE_GROUPS, MERGE_THREADS, PAIR_NT, TC_NT_CHOICES

BLOCK_N = 32            # KV rows per pipeline step (kd_meta_block_n; checked against the build)
WORKSPACE_LIMIT = 512 << 20  # fp32 partials beyond this are not worth the merge: fewer splits
PARTIAL_ROW_BYTES = DL * 4   # one split's fp32 partial output of one (token, head) row
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
    return min(TC_NT_CHOICES, key=lambda nt: (cdiv(rows, 8 * nt), cdiv(rows, 8 * nt) * 8 * nt))


def rows_per_block(rows: int, nt: int) -> int:
    """Spread a request's rows evenly over its blocks, in whole n-tiles of 8."""
    if rows <= 0:  # a batch without query tokens: one (idle) block of the full size
        return 8 * nt
    blocks = cdiv(rows, 8 * nt)
    return min(8 * nt, 8 * cdiv(cdiv(rows, blocks), 8))


def blocks_per_request(rows: int, nt: int) -> int:
    return cdiv(rows, rows_per_block(rows, nt)) if rows else 1


# The launch-time model, in microseconds, fitted to the H200 (graph replay, L2 flushed, 2026-12-01:
# every query-row count 8..40 x 4 split counts on 14 shapes, median error 8%). The measurements of
# today's kernel are benchmarks/schedule/nvidia-h200-20261201.jsonl (scripts/schedule_sweep.py
# takes them again): refitted there the constants come out 0.63 / 0.22 / 1.78 / 7.1 (median error
# 5%) and choose the same configuration on every shape, so these stay (the probes' and the torch
# reference's split counts follow from them). The model is of 8-warp blocks: 16-warp builds (nh 2)
# measured 1.00-1.26x the 8-warp time on every shape of that sweep, so choose never picks them.
# A KV step (32 rows) costs a block ~0.70 us plus ~0.27 us per n-tile of 8 query rows (the loop is
# latency-bound: 5x the rows cost 1.9x the time); a block's fixed work (gathering Q, the epilogue,
# the wait for its first tile) ~1.96 us per n-tile; the merge of the splits' partials ~5 us. Only
# the ratios matter to the choice; they are the H200's (another GPU's would need its own sweep).
# Measured apart (scripts/step_cost.py, benchmarks/ab/nvidia-h200-20261201-step-cost.txt) a step
# costs 1.05 us at 8 rows and 1.60-1.63 at 40 (5x the rows, 1.55x the time): the fit puts more of
# the rows' cost in the step and less in the fixed work; its choices stay within 1.029x of the
# best fixed split count on the whole grid (README), so the constants stay.
STEP_US = 0.70
STEP_US_PER_NTILE = 0.27
BLOCK_US_PER_NTILE = 1.96
MERGE_US = 5.0
# The last, partial wave of a launch of more than one wave costs PARTIAL_WAVE + (1 - PARTIAL_WAVE)
# x its fill of a full wave's time, not all of it. From the H200 grid (benchmarks/results/
# nvidia-h200-20261201T1814*.json and 181818, eager, each shape's fixed split counts): 416 blocks
# (3.15 waves) ran in 300 us where 832 (6.3 waves, half the steps each) took 330 at 8 x 1K, q_len
# 257, and 255 against 283 us at 32 x 1K, q_len 64; with whole waves the model had ranked the
# second first, 1.10x and 1.11x off. With 0.9 its choice is within 1.021x of the fastest split
# count measured on every grid shape (an unmeasured choice read off its measured neighbours) and
# within 1.058x on the sweep, as before; smaller values mis-rank long-KV shapes by up to 1.24x.
PARTIAL_WAVE = 0.9
# The 64-row build (spec.PAIR_NT, kd_pair.cuh) in the same model: its 32-row step measured 1.27x the
# 40-row build's (2.0 against 1.58 us on the H200, 4 x 8K, q_len 257, H 8: 0.79x the time per query
# row; benchmarks/LOG.md, "The 64-row build") and its fixed work taken as the 40-row build's. With
# these the model picks the split counts that measured fastest for it at the grid's deep-tree
# shapes (1 x 32K q_len 64: 16 splits at H 8, 8 at H 16; 4 x 8K q_len 257: 1).
PAIR_STEP_US = 1.27 * (STEP_US + STEP_US_PER_NTILE * 5)
PAIR_BLOCK_US = BLOCK_US_PER_NTILE * 5
# The plan takes it for requests of at least PAIR_MIN_ROWS (token, head) rows (fewer leave a 64-row
# block's rows idle; 512 is the fewest measured, 1 x 32K q_len 64 H 8) and KV of at least
# PAIR_MIN_KV rows (measured at 8K and 32K; at short KV a block's fixed work is the time, which
# the model does not split out for it), where no step-skip build is chosen (it streams every step:
# a deep tree over a short prefix is the skip builds')
PAIR_MIN_ROWS = 64 * 8  # q_len 64 x H 8
PAIR_MIN_KV = 4096


def modelled_us(bs: int, blocks: int, max_kv_len: int, nt: int, nsplit: int, sm_count: int) -> float:
    """The modelled time of a launch of the 8-warp builds: blocks run one per SM (~80-100 KB of
    shared memory and up to 255 registers x 256 threads on sm_120), so a launch takes
    ceil(blocks / SMs) waves (a partial last one of several at PARTIAL_WAVE + the rest x its
    fill) of its longest block, which streams ceil(steps / nsplit) KV steps and does its fixed
    work. That is an upper bound where a block skips steps (the skip build skips the draft steps
    none of a block's tokens sees: most of a deep tree's at a short prefix); the mask is device
    data, unknown here, and the longest block (a chain's last tokens) still streams all."""
    steps = cdiv(max(1, cdiv(max_kv_len, BLOCK_N)), nsplit)
    full, rest = divmod(bs * blocks * nsplit, sm_count)
    waves = max(1, full) if rest == 0 or full == 0 else full + PARTIAL_WAVE + (1 - PARTIAL_WAVE) * rest / sm_count
    if nt == PAIR_NT:
        block = steps * PAIR_STEP_US + PAIR_BLOCK_US
    else:
        block = steps * (STEP_US + STEP_US_PER_NTILE * nt) + BLOCK_US_PER_NTILE * nt
    return waves * block + (MERGE_US if nsplit > 1 else 0.0)


# The fused merge (no merge kernel: run() is one driver call) is the plan's default up to this many
# splits. Measured on the H200 against the merge kernel, graph replay (benchmarks/LOG.md,
# 2026-12-03, fourth session): within 1-2% or faster at 2-11 splits (8 x 8K, 32 x 4K, 1 x 1K,
# q_len 64), but 7-20% slower at 33-65 (1 x 8K-128K, q_len 9): there a block's share of the KV is
# short, and waiting for its slowest sibling and then one row's chain over every split outweigh the
# second launch.
FUSED_MAX_SPLITS = 16
# The 64-row build has the fused merge too (kd_fused.cuh), but not by default: its split blocks
# waiting for each other measured 1.04-1.05x the merge kernel's time at q_len 64 (1 x 32K H 8 and
# 16, 8 x 8K H 8; graph replay, benchmarks/LOG.md, 2026-12-04), where a call's 150-300 us dwarf the
# second launch's host cost. Asked for (True, "wait", "last"), it is taken.
# PlanOptions.fused: None (the plan's), False (the merge kernel), True (fused, the plan's way),
# "wait" / "last" (fused, that way: merge_mode)
FUSED_CHOICES = (None, False, True, "wait", "last")


def wants_fused(nsplit: int, choice, pair: bool = False) -> bool:
    """Whether a plan of `nsplit` splits tries the fused merge at all (before its build is loaded to
    ask how many of its blocks the GPU holds): never for one split or where `choice` is False; by
    default (None) up to FUSED_MAX_SPLITS splits, but never in the 64-row build (`pair`); asked for
    (True, "wait", "last") at any count."""
    return nsplit > 1 and choice is not False and (choice is not None or (not pair and nsplit <= FUSED_MAX_SPLITS))


def merge_mode(nsplit: int, blocks: int, resident: int, choice, pair: bool = False):
    """How a launch of `blocks` blocks over `nsplit` splits merges them: False (the merge kernel, a
    second launch) or fused in one launch, "wait" (every split block waits for its siblings and
    merges its share: a cooperative launch, so the grid must fit the GPU at once, `resident` being
    the SMs times the blocks one SM holds) or "last" (the last split block of a row block to finish
    merges it alone; no block waits, so any grid). By default (None) "wait" where it wants to fuse
    and the grid fits, else the merge kernel: "last" measured 2-3% slower at q_len 257 and up to 26%
    at 8 x 8K (benchmarks/LOG.md, 2026-12-04), one block's chain over every row of its row block, so
    it is taken only when asked for (True where the grid does not fit, or "last"); "wait" asked for
    is taken as given (plan() refuses it where the grid does not fit). pair: the 64-row build, the
    merge kernel by default (wants_fused)."""
    if not wants_fused(nsplit, choice, pair):
        return False
    if choice in ("wait", "last"):
        return choice
    if blocks <= resident:
        return "wait"
    return "last" if choice is True else False


def workspace_bytes(nsplit: int, total_rows: int) -> int:
    """The fp32 split partials a launch of `nsplit` splits over `total_rows` (token, head) rows
    writes (none for one split: it writes the output itself)."""
    return nsplit * total_rows * PARTIAL_ROW_BYTES if nsplit > 1 else 0


def workspace_splits(total_rows: int) -> int:
    """The most splits whose partials stay within WORKSPACE_LIMIT (at least 1: one split needs none)."""
    return max(1, WORKSPACE_LIMIT // max(1, total_rows * PARTIAL_ROW_BYTES))


def workspace_fits(nsplit: int, total_rows: int) -> bool:
    """The workspace rule, written once: plan refuses a split count outside it, the planner and
    the bench's sweep never choose one."""
    return nsplit <= workspace_splits(total_rows)


def max_splits(max_kv_len: int, total_rows: int) -> int:
    """No more splits than KV steps, than the merge's weight table holds, or than keep the fp32
    partials within WORKSPACE_LIMIT (workspace_splits)."""
    return max(1, min(MAX_SPLITS, cdiv(max_kv_len, BLOCK_N), workspace_splits(total_rows)))


def choose(bs: int, rows: int, max_kv_len: int, sm_count: int, total_rows: int,
           nt: int | None = None, nsplit: int | None = None) -> tuple[int, int]:
    """(query n-tiles per block, KV splits per request) with the least modelled time, from the
    shape and the SM count alone; either may be fixed by the caller. The block sizes weighed are
    the fewest blocks per request (choose_nt: long KV, where every block streams many steps) and
    8 rows (short KV, where a block's fixed work is the time); sizes between were slower than one
    of these two on every shape of the sweep. Ties go to more rows per block (fewer blocks read
    each KV row), then to fewer splits (less workspace)."""
    nts = (nt,) if nt is not None else tuple(sorted({choose_nt(rows), 1}))
    best, best_key = None, None
    for t in nts:
        blocks = blocks_per_request(rows, t)
        splits = (nsplit,) if nsplit is not None else range(1, max_splits(max_kv_len, total_rows) + 1)
        for ns in splits:
            key = (modelled_us(bs, blocks, max_kv_len, t, ns, sm_count), -t, ns)
            if best_key is None or key < best_key:
                best, best_key = (t, ns), key
    return best


# The skip builds (spec.KernelConfig.skip) stream less than every step of a split's draft.
# - The step skip (True) streams only the draft steps some row of a block sees. It pays a pass over
#   the block's mask rows before its first tile and a step table in its loop: with the skip in
#   every build every q_len 9 shape was 2-7% slower (benchmarks/ab/nvidia-h200-20261201-skip-ilp.jsonl).
# - The column gather ("gather", up to GATHER_MAX_NT n-tiles at 8 warps) streams only the columns
#   some row of a block sees, packed 32 to a tile; its smaller blocks read the prefix more often.
# Measured on the H200 (graph replay, ddtree, one plan per build, benchmarks/ab/
# nvidia-h200-20261201-builds.txt; us plain / step skip / gather):
#   prefix 21 (draft steps D >= half the steps S): 1 x q257 H8 37.3 / 25.5 / 18.9,
#     8 x q257 H16 249 / 135 / 123, 1 x q64 H16 13.0 / 12.8 / 12.0, 1 x q64 H8 11.8 / 12.0 / 11.7
#   prefix 1K, q257 (D 9 of S 41): bs 1 68.2 / 59.2 / 54.9, bs 8 362 / 303 / 345,
#     bs 32 1160 / 983 / 1201, bs 1 H16 92.2 / 88.3 / 105
#   prefix 8K, q257 (D 9 of 265): bs 4 830 / 844 / 1102; q64 at 1K and up (D 2):
#     the plain build fastest everywhere (1 x 32K 183 / 201 / 274).
# So: the gather where the draft is at least half the steps, the step skip where it is at least
# a tenth (and at least SKIP_MIN_DRAFT_STEPS), else the plain build.
SKIP_MIN_DRAFT_STEPS = 3
SKIP_MIN_DRAFT_FRAC = 0.1


def choose_skip(max_q_len: int, max_kv_len: int, masked: bool, nt: int = 1, nh: int = 1,
                nt_free: bool = False) -> bool | str:
    """False (the plain build), True (the step skip) or "gather": at 8 warps, at the plain plan's
    block size nt where that is at most GATHER_MAX_NT n-tiles, or at a smaller one (nt_free:
    choose_launch re-chooses it) where the draft is at least SKIP_MIN_DRAFT_STEPS steps (with
    fewer, the gather's smaller blocks were measured only at 1 x 21, q_len 64, where the plain
    plan's blocks are 8 rows already)."""
    if not masked:
        return False
    draft, steps = cdiv(max_q_len, BLOCK_N), cdiv(max_kv_len, BLOCK_N)
    step_skip = draft >= SKIP_MIN_DRAFT_STEPS and draft >= SKIP_MIN_DRAFT_FRAC * steps
    if steps >= 2 and 2 * draft >= steps and nh == 1:
        if nt <= GATHER_MAX_NT or (nt_free and draft >= SKIP_MIN_DRAFT_STEPS):
            return "gather"
    return step_skip


def wants_pair(rows: int, max_kv_len: int, nh: int, skip) -> bool:
    """Whether a plan whose block size is free takes the 64-row build: at 8 warps, without a
    step-skip build, for requests of at least PAIR_MIN_ROWS rows over at least PAIR_MIN_KV KV rows."""
    return nh == 1 and skip is False and rows >= PAIR_MIN_ROWS and max_kv_len >= PAIR_MIN_KV


def choose_launch(bs: int, rows: int, max_q_len: int, max_kv_len: int, sm_count: int, total_rows: int,
                  masked: bool, nt: int | None = None, nh: int = 1, skip=None, nsplit: int | None = None,
                  nt_fixed: bool | None = None, request_rows: int | None = None) -> tuple[int, int, bool | str]:
    """(n-tiles per block, splits, skip build) for a batch: the one choice the plan makes and the
    torch reference's split count follows (kdkit.probes places its planted keys by it). skip None:
    choose_skip's. Where the build is the gather and the caller left the block size free, the
    block size up to GATHER_MAX_NT that the launch model ranks first (choose weighs only 8 rows
    and the fewest blocks). At 1 x 21, q_len 257, H 8 that is 16 rows, 129 blocks in one wave,
    modelled 15.1 us against 21.3 at 8 rows in two waves (NOT yet measured: 8 rows took 18.9 us).
    nt_fixed: the caller fixed nt (default: nt is not None); where it did not, the 64-row build
    is chosen where wants_pair says so.
    rows: the grid's rows per request (max_q_len x H, the grid's max_q_len, which may be all T
    tokens of a call); request_rows: the longest request's (default rows), which wants_pair weighs:
    many short requests under a grid sized for T do not make a request of many rows."""
    nt_fixed = nt is not None if nt_fixed is None else nt_fixed
    if nt == PAIR_NT:  # asked for: its own split count
        return nt, choose(bs, rows, max_kv_len, sm_count, total_rows, nt=nt, nsplit=nsplit)[1], False if skip is None else skip
    nt, ns = choose(bs, rows, max_kv_len, sm_count, total_rows, nt=nt, nsplit=nsplit)
    if skip is None:
        skip = choose_skip(max_q_len, max_kv_len, masked, nt, nh, nt_free=not nt_fixed)
    if not nt_fixed and wants_pair(rows if request_rows is None else request_rows, max_kv_len, nh, skip):
        return PAIR_NT, choose(bs, rows, max_kv_len, sm_count, total_rows, nt=PAIR_NT, nsplit=nsplit)[1], skip
    if skip == "gather" and not nt_fixed:
        options = [choose(bs, rows, max_kv_len, sm_count, total_rows, nt=t, nsplit=nsplit)
                   for t in range(max(1, nh), GATHER_MAX_NT + 1)]  # (16 warps: an n-tile per half)
        nt, ns = min(options, key=lambda o: (modelled_us(bs, blocks_per_request(rows, o[0]), max_kv_len, o[0], o[1],
                                                         sm_count), -o[0]))
    return nt, ns, skip


THREADS_PER_SM = 2048  # resident threads per SM on sm_80, sm_90 (the H200) and sm_100; sm_86, sm_89 and
                       # sm_120 hold 1536: the plan asks the device (api.plan), this is the fallback


def merge_groups(total_rows: int, nsplit: int, sm_count: int, threads_per_sm: int = THREADS_PER_SM) -> int:
    """Thread groups per row of the merge kernel: as many as keep one wave of the GPU's threads
    busy (few rows: each row's splits are read by up to MERGE_GROUPS groups at once), one when the
    rows alone fill the GPU (more groups would only add waves), never more than the splits."""
    fill = sm_count * threads_per_sm // max(1, total_rows * MERGE_THREADS)
    return max(1, min(MERGE_GROUPS, nsplit, fill))
