"""Mutants: deliberately wrong builds of the kernel that the judge must catch (negative controls).

Each entry redefines one hook of cuda/kd_mutants.cuh; the production build defines none, and the
kernel calls every hook on its production path, so a mutant differs by exactly one thing. Adding a
mutant is one line here and its description in kdkit/mutants.py, the one registry of names that
the torch backend plants too, so the CPU and the GPU plant the same bugs.
"""
from __future__ import annotations

from ..mutants import MUTANTS as _WHAT

# name -> the hook definitions (`MACRO(args)`: replacement) that plant it
HOOKS: dict[str, dict] = {
    'no-scale': {"KD_MUT_SCALE(s)": "1.0f"},
    'mask-row-offset': {"KD_MUT_MASK_ROW(i, n)": "((i) + 1 < (n) ? (i) + 1 : (i))"},
    'mask-col-offset': {"KD_MUT_MASK_COL(j, n)": "((j) + 1 < (n) ? (j) + 1 : (j))"},
    'prefix-only-kv': {"KD_MUT_KV_LEN(len, prefix)": "(prefix)"},
    'merge-no-rescale': {"KD_MUT_MERGE_W(w)": "1.0f"},
    'drop-last-block': {"KD_MUT_KV_LEN(len, prefix)": "((len) - (len) % 32)"},
    'kv-len-off-by-one': {"KD_MUT_KV_LEN(len, prefix)": "((len) - 1)"},
    'skip-rope': {"KD_MUT_QK_DIMS(d)": "512"},
    'v-wrong-dims': {"KD_MUT_V_DIM0": "64"},
    'wrong-head-stride': {"KD_MUT_HEAD(h, H)": "(((h) + 1) % (H))"},
    'bad-swizzle': {"KD_MUT_SWZ_READ(r)": "(((r) + 1) & 7)"},
    'skip-pipeline-wait': {"KD_MUT_READ_STAGE(stage, last)": "((last) ? (stage) ^ 1 : (stage))"},
}
assert set(HOOKS) == set(_WHAT), "kdkit/mutants.py and the kernel's hooks must list the same mutants"
# name -> (hooks, what goes wrong)
MUTANTS: dict[str, tuple[dict, str]] = {name: (HOOKS[name], _WHAT[name]) for name in HOOKS}


def defines(mutant: str | None) -> dict:
    if mutant is None or mutant == "none":
        return {}
    if mutant not in MUTANTS:
        raise KeyError(f"unknown mutant {mutant!r}; choose from {', '.join(MUTANTS)}")
    return dict(MUTANTS[mutant][0])
