"""Build kdkit's CUDA sources with NVRTC (cuda-bindings), for the device or for any sm_XX.

- Compile-time parameters become `#define` lines ahead of the source (function-like hooks too,
  see kd_mutants.cuh) and are part of a readable module key
  (`mla_tc-nt4-qoi32-kvpi32-kvii32-mipi64-pfxi64-sm_90-<hash>`); a generated prelude (the
  kernel's Params struct) follows the defines.
- `#include "x.cuh"` of kdkit's own headers is expanded here with `#line` directives, so compiler
  errors name the real file and line, and the cache key (a hash of the expanded text, the options
  and NVRTC's version) covers every included header: an edited .cuh is never served stale.
- ptxas' -v report gives registers, shared memory, spills and stack per kernel without a GPU.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

CUDA_DIR = Path(__file__).parent / "cuda"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*(?://.*|/\*.*\*/\s*)?$')
_ANY_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"')
# instructions sm_120 does not have (Hopper/Blackwell datacenter only)
FORBIDDEN_PTX = ("wgmma", "cp.async.bulk", "tcgen05", "setmaxnreg")
SM120_SMEM_LIMIT = 99 * 1024


class BuildError(RuntimeError):
    pass


def expand(path: Path, seen: tuple = (), once: set | None = None, files: list | None = None) -> str:
    """Inline kdkit's own quoted includes, each wrapped in #line markers (system headers stay).
    A header with `#pragma once` is inlined at its first include only, as the preprocessor would.
    files: where given, every file read is appended to it."""
    path = Path(path).resolve()
    once = set() if once is None else once
    if files is not None:
        files.append(path)
    if path in seen:
        raise BuildError(f"{path}: include cycle through {' -> '.join(p.name for p in seen)}")
    lines = path.read_text().splitlines()
    if any(line.strip() == "#pragma once" for line in lines):
        if path in once:
            return ""
        once.add(path)
    out = [f'#line 1 "{path}"']
    for n, line in enumerate(lines, start=1):
        m = _INCLUDE.match(line)
        if m and (path.parent / m.group(1)).is_file():
            out.append(expand(path.parent / m.group(1), seen + (path,), once, files))
            out.append(f'#line {n + 1} "{path}"')
        elif _ANY_QUOTED_INCLUDE.match(line):
            # a quoted include we did not inline would be found by NVRTC on its own, outside the
            # cache key: refuse it rather than risk serving a stale build
            raise BuildError(f'{path}:{n}: cannot inline {line.strip()!r} (kdkit headers sit next '
                             'to the source; use <...> for system headers)')
        elif line.strip() == "#pragma once":
            out.append("")  # handled above: NVRTC sees one translation unit
        else:
            out.append(line)
    return "\n".join(out)


def cuda_include_dir() -> str:
    """Where cuda_bf16.h lives: the nvidia-cuda-runtime wheel, else $CUDA_HOME, else /usr/local/cuda."""
    try:
        from cuda import pathfinder
        found = pathfinder.find_nvidia_header_directory("cudart")
        if found:
            return str(found)
    except Exception:  # older cuda-bindings without pathfinder: fall through to the toolkit
        pass
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and (Path(base) / "include" / "cuda_bf16.h").is_file():
            return str(Path(base) / "include")
    raise BuildError("CUDA headers not found: `pip install nvidia-cuda-runtime` (or set CUDA_HOME)")


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise BuildError("NVRTC not available: `pip install cuda-bindings nvidia-cuda-nvrtc` "
                         f"(the 'compile' extra of kdkit) [{e}]") from None
    return nvrtc


def nvrtc_version() -> str:
    err, major, minor = _nvrtc().nvrtcVersion()
    return f"{major}.{minor}"


@functools.lru_cache(maxsize=None)  # (a process keeps the NVRTC it loaded)
def toolkit_fingerprint(include_dir: str) -> str:
    """What else decides the build: NVRTC's full package version and the CUDA headers we include
    (patch releases change both without changing nvrtcVersion's major.minor)."""
    from importlib import metadata
    parts = [nvrtc_version()]
    for dist in ("nvidia-cuda-nvrtc", "nvidia-cuda-runtime"):
        try:
            parts.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    h = hashlib.sha256()
    for name in ("cuda_bf16.h", "cuda_bf16.hpp"):
        p = Path(include_dir) / name
        if p.is_file():
            h.update(p.read_bytes())
    return ";".join(parts + [h.hexdigest()[:16]])


def _check(nvrtc, res, what):
    err = res[0] if isinstance(res, tuple) else res
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise BuildError(f"NVRTC {what} failed: {err}")
    return res[1:] if isinstance(res, tuple) and len(res) > 1 else None


@dataclass
class KernelResources:
    name: str
    registers: int = 0
    smem_static: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    local: int = 0  # local memory (bytes of lmem reported by ptxas)


def sm120_breaches(k: KernelResources, dynamic_smem: int, threads: int) -> list[str]:
    """What makes one kernel unfit for sm_120 at a launch of `threads` with `dynamic_smem` bytes:
    shared memory past 99 KB a block, spills, local memory, registers x threads past 64K an SM.
    kdkit's kernel (spec.CompileReport) and a user's (byok.cuda.Resources) are held to the same."""
    out = []
    smem = k.smem_static + dynamic_smem
    if smem > SM120_SMEM_LIMIT:
        out.append(f"{k.name}: {smem} B shared memory per block > sm_120's {SM120_SMEM_LIMIT} B")
    if k.spill_stores or k.spill_loads:
        out.append(f"{k.name}: spills ({k.spill_stores} B stores, {k.spill_loads} B loads)")
    if k.local:
        out.append(f"{k.name}: {k.local} B local memory")
    if k.registers * threads > 65536:
        out.append(f"{k.name}: {k.registers} registers x {threads} threads > 64K per SM")
    return out


@dataclass
class Module:
    key: str
    arch: str
    cubin: bytes
    ptx: str
    log: str
    defines: dict
    kernels: dict = field(default_factory=dict)  # name -> KernelResources
    _meta: dict | None = field(default=None, repr=False, compare=False)

    def forbidden_instructions(self) -> list[str]:
        return [ins for ins in FORBIDDEN_PTX if re.search(rf"\b{re.escape(ins)}\b", self.ptx)]

    def meta(self) -> dict:
        """The numbers the device code exports as `kd_meta_<name>` globals (shared memory, threads,
        rows per block): read from the PTX, so Python never restates a formula of the .cu. (Read
        once: a scan of the PTX takes milliseconds, and plan() asks each time.)"""
        if self._meta is None:
            self._meta = {m.group(1): int(m.group(2))
                          for m in re.finditer(r"\bkd_meta_(\w+)\s*=\s*(-?\d+)\s*;", self.ptx)}
        return dict(self._meta)


def parse_ptxas(log: str) -> dict:
    """Per-kernel resource lines of `ptxas -v` (as NVRTC returns them in the program log)."""
    kernels, cur = {}, None
    for line in log.splitlines():
        m = re.search(r"(?:Compiling entry function|Function properties for) '?([\w$]+)'?", line)
        if m:
            cur = kernels.setdefault(m.group(1), KernelResources(m.group(1)))
            continue
        if cur is None:
            continue
        if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            cur.stack, cur.spill_stores, cur.spill_loads = map(int, m.groups())
        if m := re.search(r"Used (\d+) registers", line):
            cur.registers = int(m.group(1))
        if m := re.search(r"(\d+) bytes smem", line):
            cur.smem_static = int(m.group(1))
        if m := re.search(r"(\d+) bytes lmem", line):
            cur.local = int(m.group(1))
    return kernels


def cache_dir() -> Path:
    d = Path(os.environ.get("KDKIT_CACHE") or Path.home() / ".cache" / "kdkit" / "jit")
    d.mkdir(parents=True, exist_ok=True)
    return d


# Every edit of a .cu is a new key, so a kernel engineer's cache only grows (a working week of
# A/B builds and mutants reached 1.5 GB, 8,000 modules, on a disk CI shares). After each build
# the least recently used modules go until the cache is under KDKIT_CACHE_MB (default 512 MB,
# about 2,500 modules: several times what one full test run builds).
CACHE_MB_DEFAULT = 512
_CACHE_EXTS = (".cubin", ".ptx", ".log")


def cache_limit_bytes() -> int:
    raw = os.environ.get("KDKIT_CACHE_MB", "")
    if not raw.strip():
        return CACHE_MB_DEFAULT << 20
    try:
        mb = int(raw)
    except ValueError:
        raise BuildError(f"KDKIT_CACHE_MB={raw!r}: give the JIT cache's size bound as whole megabytes "
                         f"(e.g. KDKIT_CACHE_MB={CACHE_MB_DEFAULT}), or unset it") from None
    if mb <= 0:
        raise BuildError(f"KDKIT_CACHE_MB={mb}: the bound must be at least 1 MB; unset it for the default")
    return mb << 20


def prune_cache(cdir: Path, limit: int, keep: str = "") -> list[str]:
    """Remove whole modules (their .cubin, .ptx and .log together), least recently used first,
    until the cache holds at most `limit` bytes; `keep` (the module just built) always stays.
    Returns the keys removed. Files that vanish meanwhile (another process pruning) are skipped."""
    modules: dict[str, list] = {}
    for f in cdir.iterdir():
        if f.suffix not in _CACHE_EXTS:
            continue  # temporary files of a write in flight, anything a user put there
        try:
            st = f.stat()
        except FileNotFoundError:
            continue
        m = modules.setdefault(f.stem, [0.0, 0])
        m[0], m[1] = max(m[0], st.st_mtime), m[1] + st.st_size
    total = sum(size for _, size in modules.values())
    removed = []
    for key, (_, size) in sorted(modules.items(), key=lambda kv: kv[1][0]):
        if total <= limit:
            break
        if key == keep:
            continue
        for ext in _CACHE_EXTS:
            (cdir / f"{key}{ext}").unlink(missing_ok=True)
        total -= size
        removed.append(key)
    return removed


def _touch(paths) -> None:
    """Mark a cache hit as recently used (the pruning order); a read-only cache stays usable."""
    for p in paths:
        try:
            os.utime(p)
        except OSError:
            pass


def module_key(stem: str, tags: dict, arch: str, digest: str) -> str:
    parts = [stem] + [f"{k.lower()}{v}" for k, v in tags.items()] + [arch, digest[:12]]
    return re.sub(r"[^\w.-]", "", "-".join(str(p) for p in parts))


# In-process memo of build(): (source, defines, arch, tags, prelude, cache dir) -> (the files the
# source was made of, a digest of their bytes, the Module). plan() builds on every call, and a hit
# in the disk cache still expands the source line by line, hashes the toolkit's headers and asks
# the package metadata (milliseconds); here a hit reads the source's own files and hashes their
# bytes (tens of us), so an edited .cu or header still rebuilds, however soon after the last
# build it was saved (a file's mtime may not move within a few ms).
_BUILT: dict = {}


def _digest(files) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for f in files:
        with open(f, "rb") as fh:
            h.update(fh.read())
        h.update(b"\0")
    return h.digest()


def build(source: str | Path, defines: dict, arch: str, tags: dict | None = None,
          prelude: str = "") -> Module:
    """Compile `source` (a file in kdkit/kernel/cuda) for `arch` ("sm_90", "sm_120", ...); cached
    on disk by the text compiled, and in the process by the bytes of the files it reads.

    `defines` maps macro (or `HOOK(args)`) -> replacement, written as #define lines ahead of the
    source; `tags` gives the short readable names used in the key; `prelude` is host-generated C
    (the kernel's Params struct) placed after the defines and ahead of the source.
    """
    src_path = CUDA_DIR / source if not Path(source).is_absolute() else Path(source)
    memo = (str(src_path), tuple(defines.items()), arch, tuple((tags or defines).items()), prelude, str(cache_dir()))
    hit = _BUILT.get(memo)
    if hit is not None:
        try:
            if _digest(hit[0]) == hit[1]:
                return hit[2]
        except OSError:  # a file went: build as new, which names it
            pass
    files: list = []
    mod = _build(src_path, defines, arch, tags, prelude, files)
    _BUILT[memo] = (tuple(files), _digest(files), mod)
    return mod


def _build(src_path: Path, defines: dict, arch: str, tags: dict | None, prelude: str, files: list) -> Module:
    head = "".join(f"#define {k} {v}\n" for k, v in defines.items())
    if prelude:
        head += '#line 1 "<generated by kdkit>"\n' + prelude
    text = head + expand(src_path, files=files)
    include = cuda_include_dir()
    # no --use_fast_math: tanhf (logit cap) and the exp2/log2 of the softmax stay accurate
    opts = [f"--gpu-architecture={arch}", "-std=c++17", "-Xptxas=-v", f"-I{include}", "-default-device"]
    ver = toolkit_fingerprint(include)
    digest = hashlib.sha256("\n".join([text, *opts, ver]).encode()).hexdigest()
    key = module_key(src_path.stem, tags or defines, arch, digest)
    cdir = cache_dir()
    cubin_p, ptx_p, log_p = (cdir / f"{key}{ext}" for ext in (".cubin", ".ptx", ".log"))
    if cubin_p.is_file() and ptx_p.is_file() and log_p.is_file():
        _touch((cubin_p, ptx_p, log_p))
        log = log_p.read_text()
        return Module(key, arch, cubin_p.read_bytes(), ptx_p.read_text(), log, dict(defines), parse_ptxas(log))

    nvrtc = _nvrtc()
    (prog,) = _check(nvrtc, nvrtc.nvrtcCreateProgram(text.encode(), str(src_path).encode(), 0, [], []), "create")
    try:
        res = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        (size,) = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.decode(errors="replace").rstrip("\x00 \n")
        if res[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise BuildError(f"compiling {src_path.name} for {arch} failed:\n{log}")
        (csize,) = _check(nvrtc, nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
        cubin = b" " * csize
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin), "cubin")
        (psize,) = _check(nvrtc, nvrtc.nvrtcGetPTXSize(prog), "ptx size")
        ptx = b" " * psize
        _check(nvrtc, nvrtc.nvrtcGetPTX(prog, ptx), "ptx")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    ptx_s = ptx.decode(errors="replace").rstrip("\x00")
    for p, data in ((cubin_p, cubin), (ptx_p, ptx_s.encode()), (log_p, log.encode())):
        _write_atomic(p, data)
    prune_cache(cdir, cache_limit_bytes(), keep=key)
    return Module(key, arch, cubin, ptx_s, log, dict(defines), parse_ptxas(log))


def _write_atomic(p: Path, data: bytes) -> None:
    """Published whole (kdkit.files); a concurrent build of the same key wrote the same bytes, so
    whichever landed first is kept."""
    from ..files import publish
    publish(p, data, exist_ok=True)


def device_arch() -> str:
    import torch
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


_loaded: dict = {}


def load(module: Module):
    """The cupy.RawModule for a built module on the current GPU; one per (key, device) per
    process: a module lives in one device's context."""
    import cupy
    slot = (module.key, cupy.cuda.runtime.getDevice())
    if slot not in _loaded:
        path = cache_dir() / f"{module.key}.cubin"
        if not path.is_file():
            _write_atomic(path, module.cubin)
        _loaded[slot] = cupy.RawModule(path=str(path))
    return _loaded[slot]
