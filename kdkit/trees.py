"""Draft trees as parent arrays, and the SGLang tree-verify mask built from them.

A tree of n nodes is `parents[i]` (-1 for the root, node 0: the bonus token). Nodes are numbered
so that a parent comes before its children (SGLang's kernel needs that order once q_len > 32:
with causal=True a row only looks at draft columns up to the end of its 32-row block).
"""
from __future__ import annotations

import heapq

import numpy as np
import torch


def chain(n: int) -> list[int]:
    return [-1] + list(range(n - 1))


def eagle(n: int, topk: int = 4, rng: np.random.Generator | None = None) -> list[int]:
    """EAGLE-like: breadth-first levels, each node of a level spawning up to `topk` children."""
    rng = rng or np.random.default_rng(0)
    parents, frontier = [-1], [0]
    while len(parents) < n:
        nxt = []
        for p in frontier:
            for _ in range(int(rng.integers(1, topk + 1))):
                if len(parents) == n:
                    break
                parents.append(p)
                nxt.append(len(parents) - 1)
        frontier = nxt or [len(parents) - 1]
    return parents


def ddtree(budget: int, rng: np.random.Generator | None = None, branch: int = 8) -> list[int]:
    """DDTree-like best-first tree: 1 root + `budget` nodes, always expanding the most probable
    unexpanded candidate (cumulative draft probability), as in arXiv 2604.12989."""
    rng = rng or np.random.default_rng(0)
    parents = [-1]
    heap: list[tuple[float, int, int]] = []  # (-logprob, tiebreak, parent)
    tick = 0

    def push_children(node: int, logp: float):
        nonlocal tick
        probs = np.sort(rng.dirichlet(np.full(branch, 0.3)))[::-1]
        for p in probs:
            heapq.heappush(heap, (-(logp + float(np.log(max(p, 1e-12)))), tick, node))
            tick += 1

    push_children(0, 0.0)
    while len(parents) < budget + 1:
        neg, _, parent = heapq.heappop(heap)
        parents.append(parent)
        push_children(len(parents) - 1, -neg)
    return parents


def diagonal(n: int) -> list[int | None]:
    """Not a tree: every row sees only itself (a hard case, and a lint warning)."""
    return [None] * n


def tree_block(parents: list) -> np.ndarray:
    """q_len x q_len bool: row i sees itself and its ancestors. `None` parents see only themselves."""
    n = len(parents)
    m = np.zeros((n, n), dtype=bool)
    for i in range(n):
        j = i
        while j is not None and j >= 0:
            m[i, j] = True
            j = parents[j]
    return m


def parents_from_block(block: np.ndarray) -> list[int] | None:
    """The parent array a q_len x q_len tree block encodes, or None when it encodes no tree.

    Row i's ancestors are the columns it sees besides itself; its parent is the deepest of them
    (the one that itself sees the most). A block is a tree when every row sees itself and its
    ancestors are exactly its parent and the parent's ancestors: tree_block(parents) == block.
    """
    blk = np.asarray(block, dtype=bool)
    n = blk.shape[0]
    if blk.ndim != 2 or blk.shape[1] != n or not blk.diagonal().all():
        return None
    depth = blk.sum(axis=1)
    parents = []
    for i in range(n):
        anc = [j for j in np.flatnonzero(blk[i]) if j != i]
        par = max(anc, key=lambda j: depth[j]) if anc else -1
        if par >= 0 and depth[par] >= depth[i]:
            return None  # i and par see each other (or worse): a cycle, not a tree
        parents.append(int(par))
    return parents if np.array_equal(tree_block(parents), blk) else None


def build_mask(prefix_lens: list[int], blocks: list[np.ndarray], dtype=torch.bool):
    """SGLang's flat custom_mask and its mask_indptr (bs+1 start offsets) for a batch.

    Per request: a row-major q_len x (prefix + q_len) block, prefix columns all True, tree after.
    """
    flat, indptr = [], [0]
    for p, blk in zip(prefix_lens, blocks):
        ql = blk.shape[0]
        full = np.concatenate([np.ones((ql, p), dtype=bool), blk], axis=1)
        flat.append(full.reshape(-1))
        indptr.append(indptr[-1] + full.size)
    mask = torch.from_numpy(np.concatenate(flat) if flat else np.zeros(0, bool))
    return mask.to(dtype), torch.tensor(indptr, dtype=torch.int64)
