"""Mutants: deliberately wrong builds of the kernel that the judge must catch (negative controls).

Each entry redefines one hook of cuda/kd_mutants.cuh; the production build defines none, and the
kernel calls every hook on its production path, so a mutant differs by exactly one thing. Adding a
mutant is one line here (and a hook in kd_mutants.cuh where none fits yet). The names are shared
with the torch backend's mutants (kdkit/mutants.py), so the CPU and the GPU plant the same bugs.
"""
from __future__ import annotations

# name -> (hook definition as `MACRO(args)`: replacement, what goes wrong)
MUTANTS: dict[str, tuple[dict, str]] = {
    "no-scale": ({"KD_MUT_SCALE(s)": "1.0f"}, "q.k is not multiplied by sm_scale"),
    "mask-row-offset": ({"KD_MUT_MASK_ROW(i, n)": "((i) + 1 < (n) ? (i) + 1 : (i))"},
                        "draft token i reads the mask row of token i + 1"),
    "mask-col-offset": ({"KD_MUT_MASK_COL(j, n)": "((j) + 1 < (n) ? (j) + 1 : (j))"},
                        "draft column j reads mask column j + 1"),
    "prefix-only-kv": ({"KD_MUT_KV_LEN(len, prefix)": "(prefix)"},
                       "the draft tokens' K/V never enter the softmax (the seed's bug)"),
    "merge-no-rescale": ({"KD_MUT_MERGE_W(w)": "1.0f"},
                         "the split merge averages the partials without the log-sum-exp weights"),
    "drop-last-block": ({"KD_MUT_KV_LEN(len, prefix)": "((len) - (len) % 32)"},
                        "the last partial block of 32 KV rows is dropped"),
    "kv-len-off-by-one": ({"KD_MUT_KV_LEN(len, prefix)": "((len) - 1)"},
                          "the last KV row of every request is dropped"),
    "skip-rope": ({"KD_MUT_QK_DIMS(d)": "512"}, "the 64 rope dims never enter q.k"),
    "v-wrong-dims": ({"KD_MUT_V_DIM0": "64"}, "V is read from dims 64..575 instead of 0..511"),
    "wrong-head-stride": ({"KD_MUT_HEAD(h, H)": "(((h) + 1) % (H))"},
                          "row (token, h) reads the q of head h + 1"),
    "bad-swizzle": ({"KD_MUT_SWZ_READ(r)": "(((r) + 1) & 7)"},
                    "the KV tile is read with a swizzle other than the one it was written with"),
    "skip-pipeline-wait": ({"KD_MUT_COPY_STEP(last)": "(!(last))"},
                           "the last KV tile of a split is read without its copy having landed: it "
                           "holds the tile before it (what a skipped cp.async wait reads when the "
                           "copy is late; a real skipped wait is a race that passes or fails by luck)"),
}


def defines(mutant: str | None) -> dict:
    if mutant is None or mutant == "none":
        return {}
    if mutant not in MUTANTS:
        raise KeyError(f"unknown mutant {mutant!r}; choose from {', '.join(MUTANTS)}")
    return dict(MUTANTS[mutant][0])
