"""PlanOptions: everything plan() takes besides the problem, in one frozen object.

The problem (the batch's index arrays, heads, scale, cap, layout, dtype) says WHAT to compute;
these say HOW, and are the same for every batch of a run, so a caller builds them once:

- tuning: `nsplit, nt, nh, skip` (None: the planner's choice, kdkit/kernel/schedule.py; nt 1-5:
  8-40 query rows a block of mla_tc.cu's partial kernel, nt 8: the 64-row build of kd_pair.cuh,
  which has 8 warps and no step skip) and
  `fused` (the split blocks merge in place, one launch and no merge kernel: "wait", each split
  block waits for its siblings and merges its share, a cooperative launch whose grid must fit the
  GPU at once; "last", the last split block of a row block to finish merges it, any grid; True:
  the plan picks the way; None: "wait" where the plan splits few enough and the grid fits, else
  the merge kernel, schedule.merge_mode; the 64-row build takes the merge kernel unless asked);
- negative controls: `mutant` (a wrong build the judge must catch, kdkit/mutants.py) and `knockout`
  (a timing-only build with one part off, kdkit/kernel/knockouts.py): both wrong by design;
- an experiment: `extra_defines` ({NAME: int}; a change to the kernel kept behind an #ifndef default
  in its source, built and judged like any build, named in its key, refused where the build comes
  out the same without it: what `kdkit.perf.kernel_ab` times against the kernel as it is);
- graph hints: `check` (False: read nothing from the device, for planning inside CUDA-graph
  capture, with `num_tokens`, `max_q_len` and `max_kv_len` given), and the bounds a plan that is
  captured once and replayed must cover: `num_tokens` (T), `max_q_len` (the grid's query tokens
  per request; None: all T), `max_kv_len` (the split count's KV length; None: the batch's own).

Values are checked here, where they are made (InputError naming the field); what depends on the
problem (nt against nh, the gather's limits, the workspace) is checked by plan().
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

from . import knockouts, mutants, schedule, spec
from .checks import InputError, require


@dataclass(frozen=True)
class PlanOptions:
    # tuning
    nsplit: int | None = None
    nt: int | None = None
    nh: int | None = None
    skip: bool | str | None = None
    fused: bool | str | None = None
    # negative controls (wrong by design)
    mutant: str | None = None
    knockout: str | None = None
    # an experiment (spec.extra_defines: stored as sorted (NAME, int) pairs)
    extra_defines: tuple = ()
    # graph hints
    check: bool = True
    num_tokens: int | None = None
    max_q_len: int | None = None
    max_kv_len: int | None = None

    def __post_init__(self):
        require(self.nsplit is None or 1 <= self.nsplit <= schedule.MAX_SPLITS, "nsplit",
                f"{self.nsplit} outside 1..{schedule.MAX_SPLITS} (None: the planner's)")
        require(self.nt is None or self.nt in spec.NT_CHOICES, "nt", f"{self.nt}: choose one of {spec.NT_CHOICES}")
        require(self.nh is None or self.nh in spec.NH_CHOICES, "nh",
                f"{self.nh}: choose one of {spec.NH_CHOICES} (2: 16 warps per block)")
        require(self.skip is None or self.skip in spec.SKIP_CHOICES, "skip",
                f"{self.skip!r}: choose one of {spec.SKIP_CHOICES} (None: the plan's)")
        require(self.fused is None or isinstance(self.fused, bool) or
                (isinstance(self.fused, str) and self.fused in schedule.FUSED_CHOICES), "fused",
                f"{self.fused!r}: one of {', '.join(map(repr, schedule.FUSED_CHOICES))} (None: the plan's)")
        for name in ("num_tokens", "max_q_len", "max_kv_len"):
            value = getattr(self, name)
            require(value is None or (isinstance(value, numbers.Integral) and value >= 0), name,
                    f"{value!r}: a whole number >= 0, or None")
        try:
            mutants.defines(self.mutant)
        except (KeyError, ValueError) as e:  # kdkit.mutants refuses an unknown name
            raise InputError(f"field 'mutant': {e}") from None
        try:
            knockouts.defines(self.knockout)
        except ValueError as e:
            raise InputError(f"field 'knockout': {e}") from None
        try:
            object.__setattr__(self, "extra_defines", spec.extra_defines(self.extra_defines))
        except spec.ConfigError as e:
            raise InputError(f"field 'extra_defines': {e}") from None

    @property
    def wrong_by_design(self) -> str | None:
        """'MUTANT x' / 'KNOCKOUT y' when this build's output is wrong on purpose, else None."""
        parts = [f"MUTANT {self.mutant}"] * bool(self.mutant) + [f"KNOCKOUT {self.knockout}"] * bool(self.knockout)
        return ", ".join(parts) or None
