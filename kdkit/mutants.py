"""The mutants: deliberately wrong builds that the judge must catch (negative controls).

One registry, name -> what the mutant does wrong. The torch backend plants each one
(`kdkit.backends.torch_ref.run(case, mutant=NAME)`); the CUDA kernel's registry
(kdkit/kernel/mutants.py: one hook definition per name) uses the same names, so a mutant caught
on the CPU and on the GPU is the same bug.

Terms: a request's KV is its prefix (p rows) then its draft (n rows), kv_len = p + n, cut into
splits of whole 32-row tiles (kdkit.kernel.schedule); draft row i sees draft column j where its
mask block (n x (p + n), prefix columns skipped) says so.
"""
from __future__ import annotations

MUTANTS: dict[str, str] = {
    "no-scale": "q.k is not multiplied by sm_scale",
    "mask-row-offset": "draft token i reads the mask row of token i + 1 (the last keeps its own)",
    "mask-col-offset": "draft column j reads mask column j + 1 (the last keeps its own)",
    "prefix-only-kv": "the draft tokens' K/V never enter the softmax (the seed's bug): kv_len = prefix",
    "merge-no-rescale": "the split merge averages the partial outputs with weight 1 instead of "
                        "exp(lse_s - max) (the LSE becomes max + log(splits)); acts when a request has > 1 split",
    "drop-last-block": "the last partial tile of 32 KV rows is dropped: kv_len rounded down to a "
                       "multiple of 32 (acts when kv_len % 32 != 0)",
    "kv-len-off-by-one": "the last KV row of every request is dropped: kv_len - 1",
    "skip-rope": "the 64 rope dims never enter q.k (scores from the 512 latent dims)",
    "v-wrong-dims": "V is read from dims 64..575 of the KV row instead of 0..511",
    "wrong-head-stride": "row (token, h) reads the q of head (h + 1) % H (acts when H > 1)",
    "bad-swizzle": "the KV tile is read with the XOR swizzle (r + 1) & 7 but written with r & 7: "
                   "16-byte group g (8 dims) of tile row r is read from group g ^ (r & 7) ^ ((r + 1) & 7)",
    "skip-pipeline-wait": "the last KV tile of a split is computed without waiting for its copy: it "
                          "holds the tile before it (acts on splits of >= 2 tiles)",
}


def check(name: str | None) -> str | None:
    """`name` if it is a registered mutant (or None); a ValueError listing them otherwise."""
    if name is not None and name not in MUTANTS:
        raise ValueError(f"mutant {name!r} is not registered; choose from {', '.join(MUTANTS)}")
    return name
