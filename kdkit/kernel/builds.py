"""The kernel's builds: the GPU archs it compiles for (the arch policy), the builds the planner may
choose (the build matrix) and how each build is named (its KD_SKIP label). `kdkit compile` walks
them; nothing here compiles.

    archs = supported_archs()               # {"min": 80, "nvrtc": [...] or None}
    check_arch("sm_120", archs)             # ArchError naming what this NVRTC can build
    for nt, skip, fused in build_matrix(): ...  # every (n-tiles, skip mode, fused merge) the planner may choose
    SKIP_LABELS[skip]                       # ", step skip (KD_SKIP=1)"; FUSED_LABEL where fused
"""
from __future__ import annotations

import re

from .spec import GATHER_MAX_NT, MIN_ARCH, NT_CHOICES, PAIR_NT

ROWS_PER_NT = 8   # query (token, head) rows per n-tile: a block of KD_NT n-tiles holds 8 x KD_NT rows

# what each skip mode of a build is called in `kdkit compile`'s tables (spec.KernelConfig.skip)
SKIP_LABELS = {False: "", True: ", step skip (KD_SKIP=1)", "gather": ", column gather (KD_SKIP=2)"}
FUSED_LABEL = ", fused merge (KD_FUSED=1)"


class ArchError(ValueError):
    """A GPU arch the kernel cannot be built for; the message starts with the arch and says which
    ones it can."""


def supported_archs() -> dict:
    """The archs kdkit's kernel builds for: from the oldest its spec lists (mma.sync, ldmatrix and
    cp.async need sm_80), and among those this NVRTC targets ("nvrtc": None when it is not installed)."""
    try:
        from cuda.bindings import nvrtc  # the compile extra: optional, looked for when asked
        known = list(nvrtc.nvrtcGetSupportedArchs()[1])
    except ImportError:
        known = None
    return {"min": MIN_ARCH, "nvrtc": known}


def check_arch(arch: str, archs: dict) -> None:
    """ArchError unless `arch` (sm_XX, sm_XXa, sm_XXf) is one the kernel builds for under `archs`
    (supported_archs())."""
    m = re.fullmatch(r"sm_([1-9]\d*)([af]?)", arch)
    if not m:
        raise ArchError(f"{arch!r}: expected sm_XX, e.g. sm_120 or sm_90a")
    n, suffix, known = int(m.group(1)), m.group(2), archs["nvrtc"]
    if n < archs["min"]:
        raise ArchError(f"{arch}: the kernel needs sm_{archs['min']} or newer")
    # architecture-specific targets exist from Hopper on (sm_90a), family targets from Blackwell
    # (sm_100f); NVRTC refuses the others with a multi-line error
    if (suffix == "a" and n < 90) or (suffix == "f" and n < 100):
        raise ArchError(f"{arch}: there is no '{suffix}' variant of sm_{n} ('a' from sm_90a, 'f' "
                        f"from sm_100f); use sm_{n}")
    if known is not None and n not in known:
        ok = [f"sm_{a}" for a in known if a >= archs["min"]]
        raise ArchError(f"{arch}: this NVRTC builds the kernel for {', '.join(ok)}")


def build_matrix(rows: int | None = None) -> list[tuple[int, object, bool]]:
    """(nt, skip, fused) of every build the planner may choose: every block size (schedule.choose
    picks by shape: q_len 9 x H 8 = 72 rows takes 40 rows per block at long KV, the build nearest
    sm_120's shared-memory limit, and 8 at short KV), or the one of `rows` rows; each without and
    with the step skip (schedule.choose_skip: deep trees at a short prefix), and with the column
    gather where its column list fits (nt <= GATHER_MAX_NT); each of those with the merge kernel and
    with the fused merge (plan(): where the plan splits and its grid fits the GPU at once). The
    64-row build (PAIR_NT) has no skip: two builds."""
    nts = [rows // ROWS_PER_NT] if rows else list(NT_CHOICES)
    return [(nt, skip, fused) for nt in nts
            for skip in ((False,) if nt == PAIR_NT else (False, True, "gather") if nt <= GATHER_MAX_NT else (False, True))
            for fused in (False, True)]


def row_choices() -> list[int]:
    """The rows per block a build may have (ROWS_PER_NT x each of spec.NT_CHOICES)."""
    return [ROWS_PER_NT * n for n in NT_CHOICES]


__all__ = ["ArchError", "FUSED_LABEL", "ROWS_PER_NT", "SKIP_LABELS", "build_matrix", "check_arch", "row_choices",
           "supported_archs"]
