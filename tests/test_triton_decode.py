"""The triton_decode backend (SGLang's Triton decode kernel fed one query per tree node): its index
lists are each node's attention, and it computes the tree-masked output (CPU: Triton's interpreter)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kdkit import backends, layout, shapes
from kdkit.judge import oracle
from kdkit.backends import triton_decode
from kdkit.perf.correctness import Reference


def _ragged_tree():
    return shapes.make_case({"bs": 3, "prefix": [0, 40, 300], "q_len": [9, 1, 17], "heads": 2,
                             "tree": "ddtree", "seed": 3})


def test_per_node_indices_are_each_nodes_attention():
    """Attention of each node over its own index list, in float64, is the oracle's output for that
    node, in both layouts, on a ragged batch with a branching tree (a node seeing a sibling, or
    missing an ancestor, differs)."""
    base = _ragged_tree()
    for case in (base, layout.to_layout(base, "unified")):
        ref, _ = oracle.run(case)
        indptr, idx = triton_decode.per_node_indices(case)
        u = layout.to_unified(case)
        assert indptr.dtype == idx.dtype == torch.int64 and len(indptr) == case.num_tokens + 1
        kv = u.kv_buffer[:, 0].double()
        for t in range(case.num_tokens):
            rows = kv[idx[indptr[t]:indptr[t + 1]]]
            s = u.q[t].double() @ rows.T * case.sm_scale          # [H, n]
            out = torch.softmax(s, dim=-1) @ rows[:, :512]
            np.testing.assert_allclose(out.numpy(), ref[t], rtol=1e-9, atol=1e-12)


def test_runs_the_tree_mask_against_the_oracle():
    """The kernel itself on a tree with a prefix-0 request and a logit cap, in both layouts: passes
    the judge (output only: the decode kernel keeps per-split LSEs alone)."""
    why = backends.unavailable("triton_decode")
    if why:
        pytest.skip(why)
    base = shapes.make_case({"bs": 2, "prefix": [0, 40], "q_len": [9, 5], "heads": 2, "tree": "ddtree",
                             "seed": 3}).clone(logit_cap=30.0)
    for case in (base, layout.to_layout(base, "unified")):
        res = backends.run("triton_decode", case)
        assert res.lse is None and res.out.shape == (case.num_tokens, 2, 512) and "one query per tree node" in res.ran
        v = Reference(case, device="cpu").judge("triton_decode", res)
        assert v.passed and v.line.startswith("PASS against the float64 oracle"), v.line
