"""Consistency checks for a case that explain themselves and never raise.

`check(case)` runs every check in `CHECKS` (in order) and returns `Finding`s: what is wrong, with
the numbers, and what to do about it. The case may come straight from a capture, unvalidated:
the first checks look at types, dtypes and shapes and mark broken fields, and every later check
skips what it cannot read instead of crashing. A check that crashes anyway becomes a
`lint-internal` finding; the others still run.

Severities: "error"   - a replay would be wrong or meaningless;
            "warning" - unusual but computable;
            "info"    - worth knowing.

The seed's two marshaling bugs have their own codes (`mask-indptr-sliced`,
`prefix-only-kv-indices`); generic findings they explain are folded into them (see
`CONSEQUENCES`) so they are not drowned.

One module per family of checks, run in this order (a later family relies on what an earlier one
marked broken): fields (params, dtypes, shapes), indices, kv_layout, mask, tree, values.
context holds `Finding` and the `Context` every check reads.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable

from . import fields, indices, kv_layout, mask, tree, values
from .context import SEVERITIES, Context, Finding
from .tree import TRITON_BLOCK_M

Check = Callable[[Context], Iterable[Finding]]
# The registry, in the order the checks run: the fields first (they mark what later checks skip),
# and within a family each named seed bug before the generic checks it explains.
CHECKS: list[Check] = [
    fields.check_params,
    fields.check_tensors,
    indices.check_qo_indptr,
    indices.check_lengths,
    indices.check_kv_indptr,
    indices.check_index_ranges,
    indices.check_scratch_slot,
    kv_layout.check_prefix_only_kv_indices,
    kv_layout.check_layout_lengths,
    kv_layout.check_unified_draft_tail,
    mask.check_mask_indptr_sliced,
    mask.check_mask_offsets,
    mask.check_mask_values,
    mask.check_mask_prefix_true,
    tree.check_rows_see_something,
    tree.check_tree_shape,
    tree.check_tree_order,
    values.check_nonfinite_inputs,
    values.check_nonfinite_pool,
    values.check_pool_matches_draft,
    values.check_v_is_latent_of_k,
    values.check_no_mask,
]

# A named bug -> the generic codes it explains (dropped from the output, listed in its message).
CONSEQUENCES = {
    "prefix-only-kv-indices": ("layout-kv-length", "unified-draft-tail", "mask-length"),
    "mask-indptr-sliced": ("mask-indptr-length", "mask-indptr-start", "mask-indptr-not-monotone",
                           "mask-indptr-offsets"),
}


def _fold_consequences(findings: list[Finding]) -> list[Finding]:
    out = list(findings)
    for named, codes in CONSEQUENCES.items():
        idx = [i for i, f in enumerate(out) if f.code == named]
        if not idx:
            continue
        folded = [f for f in out if f.code in codes]
        if not folded:
            continue
        out = [f for f in out if f.code not in codes]
        i = next(j for j, f in enumerate(out) if f.code == named)
        out[i] = replace(out[i], message=out[i].message + " (this also explains: "
                         + ", ".join(sorted({f.code for f in folded})) + ")")
    return out


def check(case) -> list[Finding]:
    """Every finding for `case`, errors first. Never raises."""
    findings: list[Finding] = []
    try:
        ctx = Context(case)
    except Exception as e:  # pragma: no cover - Context only stores references
        return [Finding("lint-internal", "error", "case", f"could not start the lint: {type(e).__name__}: {e}",
                        "This is a kdkit bug; report it with the case file.")]
    for fn in CHECKS:
        try:
            findings.extend(fn(ctx))
        except Exception as e:
            findings.append(Finding("lint-internal", "error", "case",
                                    f"check {fn.__name__} crashed: {type(e).__name__}: {e}",
                                    "This is a kdkit bug (the other checks ran); report it with the case file."))
    findings = _fold_consequences(findings)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: order.get(f.severity, len(order)))


def errors(case) -> list[Finding]:
    return [f for f in check(case) if f.severity == "error"]


def format_findings(findings) -> str:
    """Human text: a count line, then one block per finding; 'lint: clean' when there are none."""
    findings = list(findings)
    if not findings:
        return "lint: clean"
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    head = "lint: " + ", ".join(f"{n} {s}{'s' if n != 1 and s != 'info' else ''}" for s, n in counts.items() if n)
    blocks = [f"{f.severity.upper()} {f.code} [{f.field}]\n  {f.message}\n  fix: {f.fix}" for f in findings]
    return head + "\n\n" + "\n\n".join(blocks)


__all__ = ["Finding", "check", "errors", "format_findings", "CHECKS", "CONSEQUENCES", "SEVERITIES",
           "TRITON_BLOCK_M"]
