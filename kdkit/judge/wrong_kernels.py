"""The mutants: deliberately wrong builds that the judge must catch (negative controls).

One registry (REGISTRY below), name -> what the mutant does wrong and the CUDA kernel's hooks that
plant it. The torch backend plants each one (`kdkit.backends.torch_ref.run(case, mutant=NAME)`);
the CUDA kernel's build reads its hooks from here (kdkit/kernel/mutants.py), so a mutant caught on
the CPU and on the GPU is the same bug, named and described once.

Terms: a request's KV is its prefix (p rows) then its draft (n rows), kv_len = p + n, cut into
splits of whole 32-row tiles (kdkit.kernel.schedule); draft row i sees draft column j where its
mask block (n x (p + n), prefix columns skipped) says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..constants import KV_LORA_RANK, QK_DIM, QK_ROPE_HEAD_DIM, V_HEAD_DIM


@dataclass(frozen=True)
class Mutant:
    what: str                # what the build gets wrong, in words
    hooks: dict[str, str]    # the CUDA kernel's hooks it redefines: `MACRO(args)` -> replacement


# name -> the bug and how the CUDA kernel plants it. A hook (kdkit/kernel/cuda/kd_mutants.cuh)
# becomes -D'MACRO(args)=replacement'; the replacement is written with the kernel's own macros
# (KD_BN, KD_DL, KD_DR: defined where the hook is used), never a copy of their numbers.
# Adding a mutant is one entry here (plus, for a new kind of bug, its branch in the torch backend).
REGISTRY: dict[str, Mutant] = {
    "no-scale": Mutant("q.k is not multiplied by sm_scale", {"KD_MUT_SCALE(s)": "1.0f"}),
    "mask-row-offset": Mutant(
        "draft token i reads the mask row of token i + 1 (the last keeps its own)",
        {"KD_MUT_MASK_ROW(i, n)": "((i) + 1 < (n) ? (i) + 1 : (i))"}),
    "mask-col-offset": Mutant(
        "draft column j reads mask column j + 1 (the last keeps its own)",
        {"KD_MUT_MASK_COL(j, n)": "((j) + 1 < (n) ? (j) + 1 : (j))"}),
    "prefix-only-kv": Mutant(
        "the draft tokens' K/V never enter the softmax (the seed's bug): kv_len = prefix",
        {"KD_MUT_KV_LEN(len, prefix)": "(prefix)"}),
    "merge-no-rescale": Mutant(
        "the split merge averages the partial outputs with weight 1 instead of exp(lse_s - max) "
        "(the LSE becomes max + log(splits)); acts when a request has > 1 split",
        {"KD_MUT_MERGE_W(w)": "1.0f"}),
    "drop-last-block": Mutant(
        "the last partial tile of 32 KV rows is dropped: kv_len rounded down to a multiple of 32 "
        "(acts when kv_len % 32 != 0)",
        {"KD_MUT_KV_LEN(len, prefix)": "((len) - (len) % KD_BN)"}),
    "kv-len-off-by-one": Mutant(
        "the last KV row of every request is dropped: kv_len - 1",
        {"KD_MUT_KV_LEN(len, prefix)": "((len) - 1)"}),
    "skip-rope": Mutant(
        f"the {QK_ROPE_HEAD_DIM} rope dims never enter q.k (scores from the {KV_LORA_RANK} latent dims)",
        {"KD_MUT_QK_DIMS(d)": "KD_DL"}),
    "v-wrong-dims": Mutant(
        f"V is read from dims {QK_ROPE_HEAD_DIM}..{QK_DIM - 1} of the KV row instead of 0..{V_HEAD_DIM - 1}",
        {"KD_MUT_V_DIM0": "KD_DR"}),
    "wrong-head-stride": Mutant(
        "row (token, h) reads the q of head (h + 1) % H (acts when H > 1)",
        {"KD_MUT_HEAD(h, H)": "(((h) + 1) % (H))"}),
    "bad-swizzle": Mutant(
        "the KV tile is read with the XOR swizzle (r + 1) & 7 but written with r & 7: 16-byte group "
        "g (8 dims) of tile row r is read from group g ^ (r & 7) ^ ((r + 1) & 7)",
        {"KD_MUT_SWZ_READ(r)": "(((r) + 1) & 7)"}),
    "skip-pipeline-wait": Mutant(
        "the last KV tile of a split is computed without waiting for its copy: it holds the tile "
        "before it (acts on splits of >= 2 tiles; the kernel's skip build reads the tile it streamed "
        "before, which is the ring's other slot, Q's rows, where it streams one step)",
        {"KD_MUT_READ_STAGE(stage, last)": "((last) ? (stage) ^ 1 : (stage))"}),
}
# name -> what goes wrong: what the torch backend, the trials and the gallery list
MUTANTS: dict[str, str] = {name: m.what for name, m in REGISTRY.items()}


def check(name: str | None) -> str | None:
    """`name` if it is a registered mutant (or None); a ValueError listing them otherwise."""
    if name is not None and name not in MUTANTS:
        raise ValueError(f"mutant {name!r} is not registered; choose from {', '.join(MUTANTS)}")
    return name
