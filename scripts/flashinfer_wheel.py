"""Repack FlashInfer's wheel down to what `import flashinfer` and its fa2 MLA JIT module need.

    python3 scripts/flashinfer_wheel.py SRC.whl OUT_DIR        # writes OUT_DIR/<name>-<ver>-1kdkit-py3-none-any.whl

The release wheel (flashinfer-python 0.7.2.post1, ~59 MB) is nearly all sources of other kernels
(CUTLASS, spdlog, MoE/GEMM/Blackwell kernel trees); the GPU hosts take at most 64 MiB with the
repository. What stays:
  * the Python modules of every package `import flashinfer` loads (read off an import trace of
    0.7.2.post1: sys.modules and the files opened), each package's modules whole, so that a lazy
    import of a sibling still resolves; the JIT and MLA packages whole, subpackages included;
  * what the fa2 MLA module's build reads: its three sources and config template from csrc, the
    csrc headers, FlashInfer's own headers, and the vendored libcudacxx (its -I dirs precede the
    toolkit's; its headers are reached from flashinfer/math.cuh through <cuda/std/...>). Neither
    CUTLASS nor spdlog is included by it (an #include walk from the three sources, every branch).
METADATA keeps one dependency, apache-tvm-ffi: the host image has torch, numpy, ninja, jinja2,
requests, packaging, nvidia-ml-py and cuda-bindings, and the others FlashInfer lists (cuDNN
frontend, CUTLASS DSL, cuda-tile, NCCL) are imported lazily or under try/except, never by the fa2
MLA path. The build tag `1kdkit` marks the repack; `flashinfer-python==<ver>` still selects it.
"""
from __future__ import annotations

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import PurePosixPath

# the packages (relative to flashinfer/) whose modules `import flashinfer` loads, 0.7.2.post1
IMPORTED = {
    ".", "attention", "attn_scores", "autotuner", "cudnn", "cute_dsl", "cutile", "experimental",
    "experimental/cake_nvfp4_per_token", "fused_moe", "fused_moe/backends",
    "fused_moe/backends/cudnn_frost", "fused_moe/backends/cudnn_frost/bf16",
    "fused_moe/backends/cudnn_frost/mxfp8", "fused_moe/backends/cudnn_frost/mxfp8_mxfp4",
    "fused_moe/backends/cudnn_frost/nvfp4", "fused_moe/backends/trtllm", "fused_moe/cute_dsl",
    "fused_moe/shared", "gdn_kernels", "gdn_kernels/blackwell", "gdn_kernels/delta_rule_dsl",
    "gdn_kernels/experimental", "gemm", "gemm/kernels", "gemm/kernels/native_bf16_fp4", "grouped_mm",
    "grouped_mm/cudnn", "grouped_mm/cute_sm120_fp8_groupwise", "grouped_mm/cute_sm120_mxfp8_groupwise",
    "kda_kernels", "kda_kernels/sm120_prefill", "mamba", "msa_ops", "norm", "norm/kernels", "prims_ts",
    "prims_ts/gemm", "quantization", "topk_varlen", "trace", "trace/templates",
}
WHOLE = ("flashinfer/jit/", "flashinfer/mla/")
MODULE_FILES = (".py", ".json", "py.typed")   # a package's own files; its .cu/.cuh trees are other kernels
DATA = "flashinfer/data/"
DATA_TREES = ("flashinfer/data/include/", "flashinfer/data/cccl/libcudacxx/include/")
CSRC = re.compile(r"flashinfer/data/csrc/(batch_mla_(plan|run|binding)\.cu|batch_mla_config\.jinja|[^/]+\.h)$")
REQUIRES = ("apache-tvm-ffi",)
BUILD_TAG = "1kdkit"


def in_package(name: str) -> bool:
    parent = str(PurePosixPath(name).parent)
    if parent != "flashinfer" and not parent.startswith("flashinfer/"):
        return False
    return (parent.removeprefix("flashinfer").lstrip("/") or ".") in IMPORTED


def kept(name: str) -> bool:
    """The rule above, written once: dist-info, the build's data, and the imported packages' modules."""
    if ".dist-info/" in name:
        return True
    if name.startswith(DATA):
        return name.startswith(DATA_TREES) or bool(CSRC.match(name))
    return name.endswith(MODULE_FILES) and (name.startswith(WHOLE) or in_package(name))


def metadata(text: str) -> str:
    """Requires-Dist cut to REQUIRES (extras' lines go too)."""
    out = []
    for line in text.split("\n"):
        if line.startswith("Requires-Dist:"):
            req = re.split(r"[ <>=!~;\[]", line.split(":", 1)[1].strip(), maxsplit=1)[0]
            if req not in REQUIRES or ";" in line:
                continue
        out.append(line)
    return "\n".join(out)


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def repack(src: str, out_dir: str) -> str:
    stem = PurePosixPath(src).name.split("-")
    dst = f"{out_dir}/{stem[0]}-{stem[1]}-{BUILD_TAG}-{'-'.join(stem[2:])}"
    files, record = [], None
    with zipfile.ZipFile(src) as zin:
        for info in zin.infolist():
            if not kept(info.filename):
                continue
            if info.filename.endswith(".dist-info/RECORD"):
                record = info.filename
                continue
            data = zin.read(info.filename)
            if info.filename.endswith(".dist-info/METADATA"):
                data = metadata(data.decode()).encode()
            files.append((info, data))
    # RECORD lists every file with its hash: rewritten, since files went and METADATA changed
    lines = [record_line(i.filename, d) for i, d in files] + [f"{record},,"]
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info, data in files:
            zout.writestr(info, data)
        zout.writestr(record, "\n".join(lines) + "\n")
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: flashinfer_wheel.py SRC.whl OUT_DIR")
    print(repack(sys.argv[1], sys.argv[2]))
