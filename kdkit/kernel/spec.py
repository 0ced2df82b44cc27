"""The kernels' build spec: per kernel its source, entry points and the resource report that
`kdkit compile` prints (no GPU needed); the MLA kernel's compile-time configuration.

Python states only what it chooses (query n-tiles per block, index types, a mutant); the numbers
the device code derives from them (shared memory per block, threads, rows per block, KV rows per
step) are exported by the .cu as `kd_meta_*` globals and read back from the build, so no formula
is written twice. The model's dims come from kdkit's constants and reach the .cu as defines.
"""
from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, replace

import torch

from ..constants import KV_LORA_RANK, QK_ROPE_HEAD_DIM
from . import jit, knockouts, mutants, params

PARTIAL, MERGE = "kd_mla_tc_partial", "kd_mla_tc_merge"  # the MLA kernel's entry points (api launches them)
MERGE_THREADS = 128           # threads of one merge group, 4 output dims each (a define; the .cu asserts 4 x it = DL)
MERGE_GROUPS = 8              # a merge block has up to this many groups, each summing every G-th split
ARCHS = ("sm_120", "sm_90", "sm_89", "sm_100", "sm_80")
MIN_ARCH = 80                 # mma.sync bf16 m16n8k16, ldmatrix and cp.async all need sm_80
MAX_SPLITS = 256             # KV splits per request at most: the merge kernel's weight table
TC_NT_CHOICES = (1, 2, 3, 4, 5)  # mla_tc.cu's partial: query n-tiles of 8 rows per block; 5 is the most that fits 99 KB
# the 64-row build (kd_pair.cuh's partial: query rows on the MMA's M dimension, a warp pair per 16
# rows), chosen for requests of many rows; the same module, entry points and argument
PAIR_NT = 8
NT_CHOICES = TC_NT_CHOICES + (PAIR_NT,)
DEFAULT_NT = 4
SKIP_CHOICES = (False, True, "gather")  # the step skip: none, whole steps, visible columns
GATHER_MAX_NT = 4             # the gather's column list (4.3 KB, 16-bit entries) fits beside the 32-row block, not the 40-row
# Causal without a mask the gather's list is only its end mark, a 16-bit offset past the block's last
# streamed step; the causal rule can end that step up to q_len - 1 columns before the split's end,
# so the mark lies past the split's end only for q_len below 2^16 (a review of the 16-bit list)
GATHER_NOMASK_MAX_Q = 0xFFFF
NH_CHOICES = (1, 2)           # query halves: 1 -> 8 warps per block, 2 -> 16 warps (nt >= 2, <= 128 registers;
                              # slower on the H200, see schedule.py: a choice to measure on other GPUs)
DL, DR = KV_LORA_RANK, QK_ROPE_HEAD_DIM  # latent (= value) dims and rope dims of an MLA KV row
_CTYPES = {torch.int32: "kd_i32", torch.int64: "kd_i64"}
_SHORT = {torch.int32: "i32", torch.int64: "i64"}


# An experiment's compile-time switch: a name in the kernel's own macro space, read by the source
# behind an #ifndef default (e.g. `#ifndef KP_SKEW` / `#define KP_SKEW 0`), set to a whole number
EXTRA_DEFINE_NAME = re.compile(r"^K[DP]_[A-Z][A-Z0-9_]*$")


class ConfigError(ValueError):
    """A build option out of range; `field` names the option (plan's InputError names it too)."""

    def __init__(self, field: str, msg: str):
        super().__init__(msg)
        self.field = field


@dataclass(frozen=True)
class KernelConfig:
    nt: int = DEFAULT_NT      # query rows per block = 8 * nt
    mutant: str | None = None
    nh: int = 1               # 16 warps per block when 2 (each QK/softmax/PV warp takes half the work)
    skip: bool | str = False  # stream only the draft steps some row of a block sees (schedule.choose_skip);
                              # "gather": only their visible columns, packed into tiles (nt <= GATHER_MAX_NT)
    qo_t: torch.dtype = torch.int32
    kvp_t: torch.dtype = torch.int32
    kvi_t: torch.dtype = torch.int32
    mip_t: torch.dtype = torch.int64
    pfx_t: torch.dtype = torch.int64
    knockout: str | None = None  # a timing-only build, wrong by design (kdkit/kernel/knockouts.py)
    fused: bool = False       # the split blocks merge in place (a cooperative launch, no merge kernel)
    # an experiment's defines, ((NAME, int), ...) sorted (a dict is taken too): what an A/B of a
    # change kept behind an #ifndef default times against the kernel, in the build's key
    extra_defines: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "extra_defines", extra_defines(self.extra_defines))
        if self.nt not in NT_CHOICES:
            raise ConfigError("nt", f"nt={self.nt}: choose one of {NT_CHOICES} (query rows per block = 8 * nt)")
        if self.nh not in NH_CHOICES or self.nt < self.nh:
            raise ConfigError("nh", f"nh={self.nh}: choose one of {NH_CHOICES}, at most nt={self.nt} (each query "
                             "half holds an n-tile)")
        if self.skip not in SKIP_CHOICES:
            raise ConfigError("skip", f"skip={self.skip!r}: choose one of {SKIP_CHOICES}")
        if self.skip == "gather" and self.nt > GATHER_MAX_NT:
            raise ConfigError("skip", f"skip='gather' with nt={self.nt}: the column list fits in shared memory up to "
                             f"nt={GATHER_MAX_NT} (use skip=True, the step skip, at {self.nt} n-tiles)")
        if self.nt == PAIR_NT:  # kd_pair.cuh has 8 warps and no step skip
            for name, value, ok in (("nh", self.nh, 1), ("skip", self.skip, False)):
                if value != ok:
                    raise ConfigError(name, f"{name}={value!r} with nt={PAIR_NT}: the 64-row build runs with "
                                      f"{name}={ok!r} only (choose nt in {TC_NT_CHOICES} for it)")
        mutants.defines(self.mutant)  # raises on an unknown name
        try:
            knockouts.defines(self.knockout)
        except ValueError as e:
            raise ConfigError("knockout", str(e)) from None
        if self.knockout in knockouts.PAIR_ONLY and self.nt != PAIR_NT:
            raise ConfigError("knockout", f"knockout {self.knockout!r} with nt={self.nt}: it switches off a part of "
                              f"the 64-row build's step only (nt={PAIR_NT}; plan() takes it at deep trees over a "
                              "long prefix, or pass nt=8)")

    @property
    def rows(self) -> int:
        return 8 * self.nt

    def defines(self) -> dict:
        d = {"KD_DL": DL, "KD_DR": DR, "KD_NT": self.nt, "KD_NH": self.nh, "KD_SKIP": 2 if self.skip == "gather" else int(bool(self.skip)), "KD_MAX_SPLITS": MAX_SPLITS,
             "KD_MERGE_GROUPS": MERGE_GROUPS, "KD_MERGE_THREADS": MERGE_THREADS,
             "KD_SMEM_LIMIT": jit.SM120_SMEM_LIMIT, "KD_FUSED": int(self.fused), "KD_PAIR": int(self.nt == PAIR_NT),
             "KD_QO_T": _CTYPES[self.qo_t], "KD_KVP_T": _CTYPES[self.kvp_t],
             "KD_KVI_T": _CTYPES[self.kvi_t], "KD_MIP_T": _CTYPES[self.mip_t],
             "KD_PFX_T": _CTYPES[self.pfx_t]}
        d.update(mutants.defines(self.mutant))
        d.update(knockouts.defines(self.knockout))
        d.update(self.extra_defines)
        return d

    def tags(self) -> dict:
        t = {"nt": self.nt, "qo": _SHORT[self.qo_t], "kvp": _SHORT[self.kvp_t],
             "kvi": _SHORT[self.kvi_t], "mip": _SHORT[self.mip_t], "pfx": _SHORT[self.pfx_t]}
        if self.nh != 1:
            t["nh"] = self.nh
        if self.skip:
            t["skip"] = "gather" if self.skip == "gather" else 1
        if self.fused:
            t["fused"] = 1
        if self.mutant:
            t["mut-"] = self.mutant
        if self.knockout:
            t["ko-"] = self.knockout
        if self.extra_defines:  # ("KP_A.10": the value apart from the name, which may end in a digit)
            t["x-"] = "-".join(f"{k}.{v}" for k, v in self.extra_defines)
        return t


def extra_defines(value) -> tuple:
    """An experiment's defines as ((NAME, int), ...) sorted by name, from a dict or pairs; a
    ConfigError naming `extra_defines` for a name outside K[DP]_..., one the build sets itself (from
    the problem or an option), a mutant's or a knockout's, or a value that is not a whole number
    within 32 bits. Whether the build reads it is KernelSpec.build's check."""
    if not value:
        return ()
    pairs = value.items() if isinstance(value, dict) else value
    try:
        pairs = [(k, v) for k, v in pairs]
    except (TypeError, ValueError):
        raise ConfigError("extra_defines", f"{value!r}: give a dict or (NAME, value) pairs, "
                          "e.g. {'KP_SKEW': 1}") from None
    out = {}
    for k, v in pairs:
        if not isinstance(k, str) or not EXTRA_DEFINE_NAME.match(k):
            raise ConfigError("extra_defines", f"{k!r}: an experiment's define is named KD_... or KP_... in "
                              "capitals, digits and '_' (the source reads it behind an #ifndef default)")
        if k in _OWN_DEFINES or k.startswith(("KD_MUT_", "KD_KO")):
            raise ConfigError("extra_defines", f"{k}: the build sets it itself, from the problem or an option "
                              "(nt, nh, skip, fused, mutant, knockout); it is not an experiment's switch")
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not -2**31 <= v < 2**31:
            raise ConfigError("extra_defines", f"{k}={v!r}: a whole number within 32 bits")
        if k in out:
            raise ConfigError("extra_defines", f"{k} given twice")
        out[k] = int(v)
    return tuple(sorted(out.items()))


_OWN_DEFINES = frozenset(KernelConfig().defines())  # the names the build sets itself, from the problem and options


@dataclass(frozen=True)
class Entry:
    """One entry point of a kernel: its symbol, its block size (a `kd_meta_*` name the build
    exports, or a fixed count), and whether it runs with the build's dynamic shared memory
    (kd_meta_smem_bytes)."""
    symbol: str
    threads: str | int
    dynamic_smem: bool = False


@dataclass(frozen=True)
class KernelSpec:
    """A kernel of kdkit/kernel/cuda: what `kdkit compile` builds and reports on, and what the host
    loads. `config`: it is configured by a KernelConfig and takes KdParams (params.py), the MLA
    kernel; else it builds as it is."""
    name: str
    source: str
    entries: tuple[Entry, ...]
    meta: tuple[str, ...]          # the kd_meta_* values the host reads from every build
    config: bool = False
    doc: str = ""

    def build(self, arch: str, config: KernelConfig | None = None) -> jit.Module:
        if not self.config:
            if config is not None:
                raise ValueError(f"{self.name}: takes no KernelConfig (it builds as it is)")
            return jit.build(self.source, {}, arch, tags={})
        config = config or KernelConfig()
        mod = jit.build(self.source, config.defines(), arch, tags=config.tags(), prelude=params.struct_text())
        if config.extra_defines:  # defines that change nothing would time the kernel under another name
            base = self.build(arch, replace(config, extra_defines=()))
            if mod.cubin == base.cubin:
                names = ", ".join(f"{k}={v}" for k, v in config.extra_defines)
                raise ConfigError("extra_defines", f"{names}: the nt={config.nt} build comes out the same without "
                                  f"{'it' if len(config.extra_defines) == 1 else 'them'} (no #ifndef default in "
                                  f"{self.source} or its headers, or one this build does not reach)")
        return mod

    def threads(self, entry: Entry, meta: dict) -> int:
        return entry.threads if isinstance(entry.threads, int) else meta.get(entry.threads, 0)

    def report(self, arch: str, config: KernelConfig | None = None) -> CompileReport:
        mod = self.build(arch, config)
        return CompileReport(arch, mod.key, mod.kernels, mod.meta(), mod.forbidden_instructions(), self)


MLA_TC = KernelSpec(
    "mla_tc", "mla_tc.cu",
    (Entry(PARTIAL, "threads", dynamic_smem=True), Entry(MERGE, MERGE_THREADS * MERGE_GROUPS)),
    meta=("smem_bytes", "threads", "rows", "block_n"), config=True,
    doc="MLA tree-verify attention: split partials, then their merge where a request is split")
MMA_PEAK = KernelSpec(
    "mma_peak", "mma_peak.cu", (Entry("kd_mma_peak", "threads"),), meta=("threads", "flops_per_iter_warp"),
    doc="the mma.sync bf16 rate with operands in registers: the bench's tensor-core ceiling")
# name -> spec; the first is the kernel kdkit ships (plan/run), the rest have their own callers
KERNELS = {k.name: k for k in (MLA_TC, MMA_PEAK)}


def build(config: KernelConfig, arch: str) -> jit.Module:
    """A build of the MLA kernel (the one plan() launches)."""
    return MLA_TC.build(arch, config)


@dataclass
class CompileReport:
    """One build of one kernel: ptxas' resources per entry point, the exported meta, and the PTX
    instructions sm_120 lacks."""
    arch: str
    key: str
    kernels: dict
    meta: dict
    forbidden: list
    spec: KernelSpec = MLA_TC

    @property
    def dynamic_smem(self) -> int:
        return self.meta.get("smem_bytes", 0)

    def _entry_smem(self, e: Entry) -> int:
        return self.dynamic_smem if e.dynamic_smem else 0

    def breaches(self) -> list[str]:
        """What makes this build unfit for sm_120 (empty when it fits)."""
        out = []
        entries = {e.symbol: e for e in self.spec.entries}
        for k in self.kernels.values():
            e = entries.get(k.name, Entry(k.name, 0))
            out += jit.sm120_breaches(k, self._entry_smem(e), self.spec.threads(e, self.meta))
        out += [f"uses {ins}, which sm_120 does not have" for ins in self.forbidden]
        out += [f"{e.symbol}: not in ptxas' report" for e in self.spec.entries if e.symbol not in self.kernels]
        out += [f"kd_meta_{m}: not exported by the build" for m in self.spec.meta if m not in self.meta]
        return out

    def table(self) -> str:
        from tabulate import tabulate
        entries = {e.symbol: e for e in self.spec.entries}
        rows = []
        for k in self.kernels.values():
            e = entries.get(k.name, Entry(k.name, 0))
            rows.append([k.name, self.spec.threads(e, self.meta), k.registers, k.smem_static, self._entry_smem(e),
                         k.stack, f"{k.spill_stores}/{k.spill_loads}", k.local])
        body = tabulate(rows, ["kernel", "threads", "regs", "smem static", "smem dyn", "stack",
                               "spill st/ld", "lmem"], tablefmt="simple")
        br = self.breaches()
        # (the key starts with the kernel's source stem: mla_tc-nt4-..., mma_peak-...)
        return "\n".join([f"{self.arch}  {self.key}", *("  " + line for line in body.splitlines()),
                          "  fits sm_120 limits: yes" if not br else "  BREACH: " + "; ".join(br)])


def compile_report(arch: str, config: KernelConfig | None = None, kernel: str = MLA_TC.name) -> CompileReport:
    """The resource report of one build of one kernel of KERNELS (a config for those that take one)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel {kernel!r}: choose one of {', '.join(KERNELS)}")
    return KERNELS[kernel].report(arch, config)


def compile_reports(arch: str, config: KernelConfig | None = None) -> dict[str, CompileReport]:
    """Every kernel's report on `arch` (the MLA kernel at `config`): what `kdkit compile` prints,
    one table per kernel."""
    return {name: k.report(arch, config if k.config else None) for name, k in KERNELS.items()}
