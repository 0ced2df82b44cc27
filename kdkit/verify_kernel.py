"""Host-side description of kdkit's MLA tree-verify kernel: its configuration, its build, and the
resource report that `kdkit compile` prints (no GPU needed)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from . import jit

SOURCE = "mla_verify.cu"
KERNELS = ("kd_mla_verify_partial", "kd_mla_verify_reduce")
VARIANTS = {"correct": 0, "no-scale": 1, "mask-row-off-by-one": 2, "prefix-only-kv": 3}
ARCHS = ("sm_120", "sm_90", "sm_89", "sm_100")
THREADS = 128
_CTYPES = {torch.int32: "kd_i32", torch.int64: "kd_i64"}
_SHORT = {torch.int32: "i32", torch.int64: "i64"}


@dataclass(frozen=True)
class KernelConfig:
    rows: int = 16          # (token, head) rows per block
    block_n: int = 32       # KV rows per shared-memory chunk
    variant: str = "correct"
    qo_t: torch.dtype = torch.int32
    kvp_t: torch.dtype = torch.int32
    kvi_t: torch.dtype = torch.int32
    mip_t: torch.dtype = torch.int64
    pfx_t: torch.dtype = torch.int64

    @staticmethod
    def for_case(case, **kw) -> "KernelConfig":
        """Index element types follow the case's arrays (SGLang mixes int32 and int64)."""
        mip = case.mask_indptr.dtype if case.mask_indptr is not None else torch.int64
        return KernelConfig(qo_t=case.qo_indptr.dtype, kvp_t=case.kv_indptr.dtype,
                            kvi_t=case.kv_indices.dtype, mip_t=mip, pfx_t=case.prefix_lens.dtype, **kw)

    def smem_bytes(self) -> int:
        """Dynamic shared memory of the partial kernel (mirrors KD_SMEM_BYTES in the .cuh)."""
        ld = 576 + 8
        return self.rows * ld * 2 + 2 * self.block_n * ld * 2 + self.rows * self.block_n * 4 + 3 * self.rows * 4

    def defines(self) -> dict:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant {self.variant!r}: choose one of {', '.join(VARIANTS)}")
        return {"KD_ROWS": self.rows, "KD_BLOCK_N": self.block_n, "KD_VARIANT": VARIANTS[self.variant],
                "KD_QO_T": _CTYPES[self.qo_t], "KD_KVP_T": _CTYPES[self.kvp_t],
                "KD_KVI_T": _CTYPES[self.kvi_t], "KD_MIP_T": _CTYPES[self.mip_t],
                "KD_PFX_T": _CTYPES[self.pfx_t]}

    def tags(self) -> dict:
        return {"rows": self.rows, "bn": self.block_n, "v": VARIANTS[self.variant],
                "qo": _SHORT[self.qo_t], "kvp": _SHORT[self.kvp_t], "kvi": _SHORT[self.kvi_t],
                "mip": _SHORT[self.mip_t], "pfx": _SHORT[self.pfx_t]}

    def with_variant(self, variant: str) -> "KernelConfig":
        return replace(self, variant=variant)


def build(config: KernelConfig, arch: str) -> jit.Module:
    return jit.build(SOURCE, config.defines(), arch, tags=config.tags())


@dataclass
class CompileReport:
    arch: str
    key: str
    kernels: dict
    dynamic_smem: int
    forbidden: list

    def breaches(self) -> list[str]:
        """What makes this build unfit for sm_120 (empty when it fits)."""
        out = []
        for k in self.kernels.values():
            smem = k.smem_static + (self.dynamic_smem if k.name.endswith("partial") else 0)
            if smem > jit.SM120_SMEM_LIMIT:
                out.append(f"{k.name}: {smem} B shared memory per block > sm_120's {jit.SM120_SMEM_LIMIT} B")
            if k.spill_stores or k.spill_loads:
                out.append(f"{k.name}: spills ({k.spill_stores} B stores, {k.spill_loads} B loads)")
            if k.local:
                out.append(f"{k.name}: {k.local} B local memory")
            if k.registers * THREADS > 65536:
                out.append(f"{k.name}: {k.registers} registers x {THREADS} threads > 64K per SM")
        out += [f"uses {ins}, which sm_120 does not have" for ins in self.forbidden]
        missing = [n for n in KERNELS if n not in self.kernels]
        out += [f"{n}: not in ptxas' report" for n in missing]
        return out

    def table(self) -> str:
        lines = [f"{self.arch}  {self.key}",
                 f"  {'kernel':26s} {'regs':>5s} {'smem static':>11s} {'smem dyn':>9s} {'stack':>6s} "
                 f"{'spill st/ld':>12s} {'lmem':>5s}"]
        for k in self.kernels.values():
            dyn = self.dynamic_smem if k.name.endswith("partial") else 0
            lines.append(f"  {k.name:26s} {k.registers:5d} {k.smem_static:11d} {dyn:9d} {k.stack:6d} "
                         f"{k.spill_stores:5d}/{k.spill_loads:<6d} {k.local:5d}")
        br = self.breaches()
        lines.append("  fits sm_120 limits: yes" if not br else "  BREACH: " + "; ".join(br))
        return "\n".join(lines)


def compile_report(arch: str, config: KernelConfig | None = None) -> CompileReport:
    config = config or KernelConfig()
    mod = build(config, arch)
    return CompileReport(arch, mod.key, mod.kernels, config.smem_bytes(), mod.forbidden_instructions())
