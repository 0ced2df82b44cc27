"""The judge and what validates it.

The judge: `oracle` (the float64 reference), `compare` (the tolerance rule and the verdict),
`wrong_kernels` (the deliberately wrong builds every backend can plant: negative controls).
What shows the judge works: `heavy_cases` (cases whose data makes every part of the computation
matter), `trials` (correct backends on random cases, every wrong kernel caught), `gallery` and
`fixes` (the known marshaling bugs, named, repaired and replayed). Nothing is imported here: the
validation modules sit above the backends and the replay in kdkit's layers (pyproject.toml's
import-linter contract), the judge itself below the kernel.
"""
