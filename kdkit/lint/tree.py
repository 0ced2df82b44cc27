"""Family 5: the draft tree the mask describes: every row sees something, the tree's shape, and an
order SGLang's Triton kernel reads correctly."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from .context import Finding, Context, _show


# SGLang's extend_attention_fwd tiles the draft rows in blocks of BLOCK_M: 32 for 576-dim MLA on
# sm_90 (Hopper) and sm_120 (RTX PRO 6000 / 5090), 16 on sm_100. With causal=True and a custom mask
# a row only scans draft columns < min(q_len, (row // BLOCK_M + 1) * BLOCK_M).
TRITON_BLOCK_M = 32
SMALLEST_BLOCK_M = 16  # sm_100


def _drafts(ctx: Context):
    blocks = ctx.blocks()
    return [] if not blocks else [(b, blk) for b, blk in enumerate(blocks) if blk is not None]


def check_rows_see_something(ctx: Context) -> Iterator[Finding]:
    for b, (n, p, _, d) in _drafts(ctx):
        if p:
            continue
        blind = np.flatnonzero(~d.any(axis=1))
        if blind.size:
            yield Finding("row-sees-nothing", "error", "custom_mask",
                          f"request {b} has prefix 0 and draft row(s) {_show(blind.tolist())} see no draft column: "
                          "the softmax has nothing to normalize (kernels return 0, NaN or garbage there)",
                          "Every row must see at least itself (the diagonal) and the root (column 0).")


def _tree_problem(d: np.ndarray):
    """The first way the visible sets fail to be ancestor chains of one tree, or None."""
    m = d | np.eye(d.shape[0], dtype=bool)  # a missing diagonal is reported on its own
    mf = m.astype(np.float32)
    # transitive: i sees j and j sees k  =>  i sees k
    reach = (mf @ mf) > 0
    miss = reach & ~m
    if miss.any():
        i, k = (int(x) for x in np.argwhere(miss)[0])
        j = int(np.flatnonzero(m[i] & m[:, k])[0])
        return i, f"row {i} sees column {j} but not {k}, which row {j} sees (an ancestor of {j} must be an ancestor of {i})"
    # antisymmetric: no two rows see each other
    both = m & m.T & ~np.eye(m.shape[0], dtype=bool)
    if both.any():
        i, j = (int(x) for x in np.argwhere(both)[0])
        return i, f"rows {i} and {j} see each other (a cycle: each would be the other's ancestor)"
    # a chain: any two columns a row sees are comparable (one sees the other)
    incomparable = ~(m | m.T)
    cnt = (mf @ incomparable.astype(np.float32)) * mf  # [i, k]: columns j seen by i not comparable with k
    if cnt.any():
        i, k = (int(x) for x in np.argwhere(cnt > 0)[0])
        j = int(np.flatnonzero(m[i] & incomparable[:, k])[0])
        return i, f"row {i} sees columns {j} and {k}, which are on different branches (neither sees the other)"
    return None


def check_tree_shape(ctx: Context) -> Iterator[Finding]:
    self_bad, root_bad, non_tree = [], [], []
    for b, (n, p, _, d) in _drafts(ctx):
        rows = np.flatnonzero(~np.diag(d))
        if rows.size:
            self_bad.append((b, rows.tolist()))
        rows = np.flatnonzero(~d[:, 0])
        if rows.size:
            root_bad.append((b, rows.tolist()))
        prob = _tree_problem(d)
        if prob:
            non_tree.append((b, prob[1]))
    if self_bad:
        b, rows = self_bad[0]
        yield Finding("tree-self-not-visible", "warning", "custom_mask",
                      f"request {b}: draft row(s) {_show(rows)} do not see themselves (diagonal False); "
                      f"{len(self_bad)} request(s) affected",
                      "In a tree-verify mask row i sees itself and its ancestors: set the diagonal True.")
    if root_bad:
        b, rows = root_bad[0]
        yield Finding("tree-root-not-visible", "warning", "custom_mask",
                      f"request {b}: draft row(s) {_show(rows)} do not see the root (draft column 0, the bonus token); "
                      f"{len(root_bad)} request(s) affected",
                      "Every node descends from the root: column 0 of the draft block is True in every row "
                      "(a deliberately non-tree mask, e.g. the 'diagonal' hard case, may ignore this).")
    if non_tree:
        b, why = non_tree[0]
        yield Finding("tree-sees-non-ancestor", "warning", "custom_mask",
                      f"request {b}: {why}; the visible set of a row must be the ancestor chain of one tree "
                      f"({len(non_tree)} request(s) affected)",
                      "Build the mask from a parent array (kdkit.trees.tree_block): row i sees itself and the "
                      "chain parent[i], parent[parent[i]], ... up to the root.")


def check_tree_order(ctx: Context) -> Iterator[Finding]:
    if getattr(ctx.case, "causal", None) is not True:
        return  # causal=False: the Triton kernel scans every draft column, any numbering works
    errs, late = [], []
    for b, (n, p, _, d) in _drafts(ctx):
        upper = np.triu(d, 1)  # row i sees a later-numbered column j > i
        if not upper.any():
            continue
        rows = np.arange(n)[:, None]
        limit = np.minimum(n, (rows // TRITON_BLOCK_M + 1) * TRITON_BLOCK_M)
        cols = np.arange(n)[None, :]
        dropped = d & (cols >= limit)
        if dropped.any():
            i, j = (int(x) for x in np.argwhere(dropped)[0])
            errs.append((b, n, i, j, int(dropped.sum()), int(limit[i, 0])))
        else:
            i, j = (int(x) for x in np.argwhere(upper)[0])
            late.append((b, n, i, j))
    if errs:
        b, n, i, j, cnt, lim = errs[0]
        lo = i // TRITON_BLOCK_M * TRITON_BLOCK_M
        yield Finding("tree-order", "error", "custom_mask",
                      f"request {b} (q_len {n}): row {i} sees draft column {j}, but SGLang's Triton kernel (causal=True "
                      f"+ custom mask, BLOCK_M={TRITON_BLOCK_M} for 576-dim MLA on sm_90/sm_120) scans only columns "
                      f"< {lim} for rows {lo}..{lo + TRITON_BLOCK_M - 1}: production silently drops that column "
                      f"({cnt} visible (row, column) pairs dropped in this request, {len(errs)} request(s))",
                      "Number the tree so parents come before children (every visible column j <= row i: "
                      "breadth-first or best-first order, as kdkit.trees builds them), or, where you control the call, pass "
                      "causal=False so the kernel scans every draft column.")
    elif late:
        b, n, i, j = late[0]
        sev = "warning" if n > SMALLEST_BLOCK_M else "info"
        yield Finding("tree-order-non-topological", sev, "custom_mask",
                      f"request {b} (q_len {n}): row {i} sees later-numbered column {j} (a child numbered before its "
                      f"parent); it works while q_len <= BLOCK_M ({TRITON_BLOCK_M} on sm_90/sm_120), but BLOCK_M is "
                      f"{SMALLEST_BLOCK_M} on sm_100, and any q_len > BLOCK_M silently drops such columns",
                      "Number the tree so parents come before children (parent index < child index).")
