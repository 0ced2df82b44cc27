"""Knockouts: timing-only builds of the kernel with one part switched off, to measure what the part
costs. Their results are WRONG by design: no check runs on them and nothing uses their output.

    python3 scripts/kernel_ab.py export DIR main ko=main:knockout=softmax   # then `time DIR` on the GPU

A knockout is `KD_KO` set to one of cuda/kd_knockouts.cuh's numbers; the production build defines
nothing, every test of it folds away at compile time, and its code is the code without the hooks.
(Mutants, by contrast, are wrong builds that the judge must catch: kdkit/judge/wrong_kernels.py.)
"""
from __future__ import annotations

# name -> (KD_KO, what is switched off). Numbers as in cuda/kd_knockouts.cuh.
KNOCKOUTS = {
    "entry": (1, "the partial kernel returns at entry (its launch; the merge still runs where the plan splits)"),
    "loop": (2, "no KV step: the prologue (its loads and first tiles' copies) and the epilogue only"),
    "loads": (3, "no loads in the KV loop: no copy or index load (each step reads the prologue's tiles; in the "
                 "64-row build the prologue fills one slot and every other step reads the other, unwritten)"),
    "copy-wait": (4, "the loop's copies issued but never waited for"),
    "qk": (5, "no QK: no ldmatrix or MMA (zero scores stored)"),
    "softmax": (6, "no softmax work: P a constant, no max or sum moves (64-row build: P the raw scores, so that "
                   "QK and the exchange stay in the code)"),
    "pv": (7, "no PV: no ldmatrix or MMA"),
    # the two below together split a step into its MMA chain and the rest: the larger of the two
    # bounds what any overlap of the parts (inside this design) can reach
    "mma-only": (8, "no loads and no softmax work: the step's MMAs, their ldmatrix, score stores and barriers"),
    "no-mma": (9, "no QK and no PV: the step's loads, softmax and barriers"),
    # the 64-row build's own (kd_pair.cuh): the parts its step has and the other builds' do not
    "exchange": (10, "no pair exchange: each warp of a pair keeps its half's partial scores (64-row build)"),
    "barrier": (11, "no ring barrier at the KV step's start; the copies are still waited for, and the draft V "
                   "copy's two block barriers stay (64-row build)"),
    "ldsm": (12, "no ldmatrix in QK or PV: the MMAs take their B operands from registers (64-row build)"),
}
PAIR_ONLY = frozenset({"exchange", "barrier", "ldsm"})  # spec.KernelConfig refuses them below nt=PAIR_NT


def defines(name: str | None) -> dict:
    """The build's define for knockout `name`; {} for None. An unknown name is a ValueError that
    lists the known ones."""
    if name is None:
        return {}
    if name not in KNOCKOUTS:
        raise ValueError(f"knockout {name!r}: choose one of {sorted(KNOCKOUTS)} (timing-only builds; None: the kernel)")
    return {"KD_KO": KNOCKOUTS[name][0]}
