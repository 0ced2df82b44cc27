"""Find SGLang's Triton extend-attention kernel and load it without importing SGLang.

Importing the `sglang` package runs sglang/__init__.py, which pulls in the whole server (and
its dependencies, which a --no-deps install does not have). kdkit needs only the kernel files,
which themselves need torch, triton and a handful of helpers. So:

  * the kernel folder is found on disk: $KDKIT_SGLANG_SRC (an unpacked tree holding sglang/...),
    else an installed sglang located with importlib.util.find_spec("sglang"), which for a
    top-level name only searches sys.path and returns the folder without executing __init__.py;
  * each kernel file is compiled from its real path (so Triton's inspect.getsource and
    tracebacks point at the real file) and executed as a module of a private package
    (`_kdkit_sglang_<hash>`, registered in sys.modules), whose builtins carry an `__import__`
    that answers the files' `sglang...` imports: sibling kernel files are loaded the same way,
    `sglang.srt.utils` and `sglang.srt.environ` get the small stand-ins below, and anything
    else raises an ImportError that names the file and the missing module. Nothing named
    `sglang` ever enters sys.modules.

Release layouts (read in the wheels of 0.5.10, 0.5.12, 0.5.15.post1, 0.5.16, 0.5.19, 0.5.23):
  <= 0.5.15  sglang/srt/layers/attention/triton_ops/extend_attention.py
  >= 0.5.16  sglang/kernels/ops/attention/extend_attention.py
What the kernel files import from SGLang, per release:
  0.5.10-0.5.12  sglang.srt.utils: is_cuda, is_hip; sibling prefill_attention
  0.5.15.post1   + is_gfx95_supported; sibling decode_attention (_extract_kv_strides)
  0.5.16         + sibling score_mod (unpack_aux_tensors)
  0.5.19-0.5.23  + is_gfx1250_supported, get_device_core_count (decode_attention);
                 sglang.srt.environ.envs (.get() of SGLANG_* switches); decode_attention also
                 imports sglang.srt.runtime_context lazily, inside a decode-only function
"""
from __future__ import annotations

import builtins
import hashlib
import importlib.util
import inspect
import os
import re
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "KDKIT_SGLANG_SRC"
PIN = "0.5.15.post1"  # the release kdkit is tested against (the GPU host's wheelhouse tree)

# (folder under the tree root, dotted module prefix the kernel files use for their siblings)
LAYOUTS = (
    ("sglang/kernels/ops/attention", "sglang.kernels.ops.attention"),                     # >= 0.5.16
    ("sglang/srt/layers/attention/triton_ops", "sglang.srt.layers.attention.triton_ops"),  # <= 0.5.15
)
KERNEL_FILE = "extend_attention.py"
HOW_TO_INSTALL = (f"`pip install --no-deps sglang=={PIN}` or set {ENV_VAR} to an unpacked tree "
                  "(scripts/wheelhouse.sh makes one)")
_VERSION_RE = r"\d+\.\d+\.\d+(?:\.?post\d+|rc\d+|\.dev\d+)?"


class SourceNotFound(RuntimeError):
    """No SGLang kernel source here; the message says where kdkit looked and how to get one."""


@dataclass(frozen=True)
class Source:
    root: Path         # folder that holds sglang/ (site-packages, or the unpacked tree)
    kernel_dir: Path   # folder that holds extend_attention.py
    prefix: str        # dotted name the kernel files import their siblings by
    release: str       # "0.5.15.post1", or "unknown (KDKIT_SGLANG_SRC=...)"
    origin: str        # "KDKIT_SGLANG_SRC" or "installed"

    @property
    def module_path(self) -> Path:
        return self.kernel_dir / KERNEL_FILE

    @property
    def layout(self) -> str:
        return "<=0.5.15 (srt/layers/attention/triton_ops)" if "srt" in self.prefix else \
            ">=0.5.16 (kernels/ops/attention)"


# ---- finding the source ------------------------------------------------------------------
def kernel_dir_in(root: str | os.PathLike) -> tuple[Path, str] | None:
    """(kernel folder, dotted prefix) of the first release layout present under `root`."""
    root = Path(root)
    for rel, prefix in LAYOUTS:
        d = root / rel
        if (d / KERNEL_FILE).is_file():
            return d, prefix
    return None


def installed_roots() -> list[Path]:
    """Folders holding an installed `sglang` package, found WITHOUT importing it.

    find_spec of a top-level name runs the path finders only (or returns the __spec__ of an
    already-imported sglang, e.g. inside a live server): sglang/__init__.py is not executed.
    A namespace package (a tree of loose files on sys.path) may span several folders.
    """
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):  # ValueError: sys.modules['sglang'] without a __spec__
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p).parent for p in spec.submodule_search_locations]


def release_in_tree(root: Path, kernel_dir: Path | None = None) -> str | None:
    """The release of an unpacked tree or a site-packages folder, read from files, never imported:
    dist-info METADATA beside sglang/, sglang/_version.py (written by the release build), the
    sha256 of a known release's extend_attention.py, or last a version in the folder's path
    (e.g. .../sglang-0.5.15.post1/ or .../0.5.23/)."""
    for meta in sorted(root.glob("sglang-*.dist-info/METADATA")):
        m = re.search(r"^Version:\s*(\S+)", meta.read_text(errors="replace"), re.M)
        if m:
            return m.group(1)
    vf = root / "sglang" / "_version.py"
    if vf.is_file():
        m = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", vf.read_text(errors="replace"))
        if m:
            return m.group(1)
    if kernel_dir is not None and (by_hash := release_by_hash(kernel_dir)):
        return by_hash
    for part in reversed(root.resolve().parts):
        m = re.fullmatch(rf"(?:sglang[-_])?({_VERSION_RE})(?:[-_.].*)?", part)
        if m:
            return m.group(1)
    return None


# sha256 of extend_attention.py in the release wheels kdkit was checked against: names the release
# of a tree that carries no version file (scripts/wheelhouse.sh unpacks only kernels)
KNOWN_KERNEL_SHA256 = {
    "be6a492113ee2e9dad04156c7a4a2c362ef2f2fd4baefd9ec44df30e789ea7a6": "0.5.10",
    "564212736ec4eb02e1566effff571d9c35402772598c4d190d07af09903c6d28": "0.5.12",
    "2f4a934625b38d2e797a92c5966270c4d36ebfce9dc0093fb83bf18b140e9f28": "0.5.15.post1",
    "e031025a89da8be071ea494d3a2c3c36427e369328b88d8f5ff6f66700005dc9": "0.5.16",
    "e2fccdf260dfc15185c0418ed7b58beb97ca4ea724968a12a44f53b385ce8f83": "0.5.19",
    "be3baffc80ef9fe484d0b896842522b02bf671785088e05a66ca4dcdb2e8a9b3": "0.5.23",
}


def release_by_hash(kernel_dir: Path) -> str | None:
    digest = hashlib.sha256((kernel_dir / KERNEL_FILE).read_bytes()).hexdigest()
    rel = KNOWN_KERNEL_SHA256.get(digest)
    return f"{rel} (by the sha256 of {KERNEL_FILE})" if rel else None


def _source_from_env(value: str) -> Source:
    given = Path(value).expanduser()
    # accept the tree root (holding sglang/), or the sglang/ folder itself
    for root in (given, given.parent if given.name == "sglang" else None):
        if root is not None and (found := kernel_dir_in(root)):
            rel = release_in_tree(root, found[0]) or f"unknown ({ENV_VAR}={value})"
            return Source(root.resolve(), found[0].resolve(), found[1], rel, ENV_VAR)
    wanted = " or ".join(f"{rel}/{KERNEL_FILE}" for rel, _ in LAYOUTS)
    raise SourceNotFound(f"{ENV_VAR}={value}: no {wanted} under it; point it at the folder that "
                         "holds sglang/ (scripts/wheelhouse.sh unpacks one into .whl/sglang-src)")


def locate() -> Source:
    """Where the kernel comes from: $KDKIT_SGLANG_SRC first (an error if it is set but wrong,
    never a silent fallback), then an installed sglang. Raises SourceNotFound."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return _source_from_env(env)
    roots = installed_roots()
    for root in roots:
        if found := kernel_dir_in(root):
            rel = release_in_tree(root, found[0]) or "unknown (installed, no dist-info)"
            return Source(root.resolve(), found[0].resolve(), found[1], rel, "installed")
    if roots:
        raise SourceNotFound(f"sglang is installed at {roots[0]} but has no {KERNEL_FILE} in a known "
                             f"layout (a release older than 0.5.10?); {HOW_TO_INSTALL}")
    raise SourceNotFound(f"SGLang's Triton kernels not found; {HOW_TO_INSTALL}")


# ---- stand-ins for the two SGLang modules the kernel files import ------------------------
def _gcn_arch() -> str:
    import torch
    if getattr(torch.version, "hip", None) is None or not torch.cuda.is_available():
        return ""
    return str(getattr(torch.cuda.get_device_properties(0), "gcnArchName", ""))


def _make_utils(name: str) -> types.ModuleType:
    """What the kernel files take from sglang.srt.utils, answered from torch alone."""
    import torch

    mod = types.ModuleType(name, "kdkit stand-in for sglang.srt.utils (device queries only)")

    def is_cuda() -> bool:  # a CUDA build of torch with a visible device
        return bool(torch.version.cuda) and torch.cuda.is_available()

    def is_hip() -> bool:
        return getattr(torch.version, "hip", None) is not None

    def is_gfx95_supported() -> bool:  # MI350-class AMD GPUs
        return _gcn_arch().startswith("gfx95")

    def is_gfx1250_supported() -> bool:
        return _gcn_arch().startswith("gfx1250")

    def get_device_core_count(device_id: int = 0) -> int:  # SMs / CUs, 0 without a GPU
        if not torch.cuda.is_available():
            return 0
        return int(torch.cuda.get_device_properties(device_id).multi_processor_count)

    for fn in (is_cuda, is_hip, is_gfx95_supported, is_gfx1250_supported, get_device_core_count):
        setattr(mod, fn.__name__, fn)
    return mod


# Defaults of the SGLANG_* switches the kernel files read (sglang/srt/environ.py, 0.5.19..0.5.23).
# All but the decode-only ones sit behind `_is_hip and ...`, so on CUDA they are never read.
ENV_DEFAULTS = {
    "SGLANG_TRITON_FP8_PREFILL_ATTN": True,
    "SGLANG_TRITON_COMPACT_EXTEND_ATTENTION": True,
    "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": False,
    "SGLANG_MLA_DECODE_TUNE": False,
    "SGLANG_FORCE_LEAN_GRID_CU_MULT": 1.0,
}


class _EnvVar:
    """One switch: .get() reads os.environ, typed like its default, else returns the default."""

    def __init__(self, name: str, default):
        self.name, self.default = name, default

    def is_set(self) -> bool:
        return self.name in os.environ

    def get(self):
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        if isinstance(self.default, bool) or self.default is None:
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off", ""):
                return False
            return raw
        return type(self.default)(raw)


class _Envs:
    def __init__(self):
        self.unknown: set[str] = set()  # switches this stand-in has no default for (reported)

    def __getattr__(self, name: str) -> _EnvVar:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in ENV_DEFAULTS:
            self.unknown.add(name)
        return _EnvVar(name, ENV_DEFAULTS.get(name))


def _make_environ(name: str) -> types.ModuleType:
    mod = types.ModuleType(name, "kdkit stand-in for sglang.srt.environ (envs.X.get() only)")
    mod.envs = _Envs()
    return mod


# ---- how Triton runs here: compiled on a GPU, else its interpreter -----------------------
def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip() not in ("", "0")


def _triton_loaded_compiled() -> bool:
    """True if triton was imported while TRITON_INTERPRET was off: triton.language's own
    @triton.jit helpers are then compiled-mode functions, which the interpreter cannot call
    ("Cannot call @triton.jit'd outside of the scope of a kernel")."""
    std = sys.modules.get("triton.language.standard")
    if std is None:
        return False
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    return any(isinstance(v, JITFunction) for v in vars(std).values())


def triton_problem() -> str | None:
    """Why Triton cannot run kernels in this process (one line), or None. Only looks: changes
    nothing (prepare_triton does the switching).

    With a CUDA device: compiled. Without one: Triton's interpreter, which must be switched on
    (TRITON_INTERPRET=1) BEFORE `import triton`, since @triton.jit picks interpreted or compiled
    functions when it decorates them, triton.language's own helpers included."""
    import torch
    if torch.cuda.is_available():
        return None
    val = os.environ.get("TRITON_INTERPRET")
    if val is not None and not interpreting():
        return (f"no CUDA device and TRITON_INTERPRET={val!r}; unset it (kdkit then sets 1) to run "
                "SGLang's kernel on the CPU under Triton's interpreter")
    if val is None and _triton_loaded_compiled():
        return ("no CUDA device, and triton was imported before TRITON_INTERPRET=1 was set, so "
                "its interpreter cannot run; set TRITON_INTERPRET=1 before importing triton "
                "(or use kdkit.backends.triton_sglang before anything else imports triton)")
    return None


def prepare_triton() -> str | None:
    """Decide how Triton runs kernels in this process; call it right before the first import of
    triton. Without a CUDA device it sets TRITON_INTERPRET=1 when it is unset. Returns None if
    kernels can run, else one line why not (triton_problem)."""
    why = triton_problem()
    if why is None and os.environ.get("TRITON_INTERPRET") is None:
        import torch
        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    return why


# ---- loading the kernel files under a private package ------------------------------------
class _PrivatePackage:
    """The kernel folder of one Source, loaded as `_kdkit_sglang_<hash>.<file stem>`."""

    STAND_INS = {"sglang.srt.utils": ("_srt_utils", _make_utils),
                 "sglang.srt.environ": ("_srt_environ", _make_environ)}

    def __init__(self, source: Source, tag: str):
        self.source = source
        key = f"{source.kernel_dir}|{tag}".encode()
        self.name = "_kdkit_sglang_" + hashlib.sha1(key).hexdigest()[:12]
        pkg = types.ModuleType(self.name, f"SGLang kernel files from {source.kernel_dir} (loaded by kdkit)")
        pkg.__path__ = []  # no file search: every submodule is loaded through _load below
        pkg.__package__ = self.name
        self.pkg = pkg
        sys.modules[self.name] = pkg
        self.builtins = dict(builtins.__dict__, __import__=self._import)

    def _stand_in(self, dotted: str) -> types.ModuleType:
        attr, make = self.STAND_INS[dotted]
        full = f"{self.name}.{attr}"
        if full not in sys.modules:
            sys.modules[full] = make(full)
            setattr(self.pkg, attr, sys.modules[full])
        return sys.modules[full]

    def _load(self, tail: str, importer: str) -> types.ModuleType:
        """Kernel-folder module `tail` ("decode_attention", "dsa.x"), loaded once."""
        full = f"{self.name}.{tail}"
        if full in sys.modules:
            return sys.modules[full]
        parent = self.pkg if "." not in tail else self._load(tail.rpartition(".")[0], importer)
        base = self.source.kernel_dir.joinpath(*tail.split("."))
        path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if not path.is_file():
            raise ImportError(f"{importer}: imports {self.source.prefix}.{tail}, which is not in "
                              f"{self.source.kernel_dir}", name=f"{self.source.prefix}.{tail}")
        mod = types.ModuleType(full)
        mod.__file__ = str(path)
        is_pkg = path.name == "__init__.py"
        mod.__package__ = full if is_pkg else full.rpartition(".")[0]
        if is_pkg:
            mod.__path__ = []  # its submodules also come through _load
        mod.__dict__["__builtins__"] = self.builtins  # exec keeps it: imports go through _import
        sys.modules[full] = mod  # before exec: dataclasses/typing look their module up here
        try:
            code = compile(path.read_text(), str(path), "exec")  # no .pyc written into the tree
            exec(code, mod.__dict__)
        except BaseException:
            sys.modules.pop(full, None)
            raise
        setattr(parent, tail.rpartition(".")[2], mod)
        return mod

    def _resolve(self, name: str, importer: str) -> types.ModuleType:
        if name in self.STAND_INS:
            return self._stand_in(name)
        for _, prefix in LAYOUTS:
            if name == prefix:
                return self.pkg
            if name.startswith(prefix + "."):
                return self._load(name[len(prefix) + 1:], importer)
        raise ImportError(f"{importer}: imports {name}, which kdkit does not stand in for (only the "
                          f"kernel folder, sglang.srt.utils and sglang.srt.environ); kdkit never imports "
                          f"the sglang package. Extend kdkit/sglang_source.py for this release.", name=name)

    def _import(self, name, globals=None, locals=None, fromlist=(), level=0):
        importer = (globals or {}).get("__file__", "?")
        pkg_of_importer = (globals or {}).get("__package__") or ""
        if level > 0 and pkg_of_importer.startswith(self.name):
            # relative import between kernel files: resolve against the private package
            base = pkg_of_importer.split(".")
            base = base[: len(base) - (level - 1)]
            tail = ".".join(base[1:] + ([name] if name else []))
            mod = self._load(tail, importer) if tail else self.pkg
        elif level == 0 and (name == "sglang" or name.startswith("sglang.")):
            mod = self._resolve(name, importer)
        else:
            return builtins.__import__(name, globals, locals, fromlist, level)
        if fromlist:
            for item in fromlist:
                if item == "*" or hasattr(mod, item):
                    continue
                if mod is self.pkg:  # `from <kernel folder> import sibling`
                    try:
                        self._load(item, importer)
                        continue
                    except ImportError:
                        pass
                raise ImportError(f"{importer}: imports {item} from {name}, which kdkit's stand-in "
                                  f"({mod.__name__}) lacks; add it to kdkit/sglang_source.py", name=name)
            return mod
        # `import sglang.a.b`: the code then reads sglang.a.b.attr, so hand back a stub chain
        top = types.ModuleType(name.split(".")[0])
        node = top
        for part in name.split(".")[1:-1]:
            setattr(node, part, types.ModuleType(part))
            node = getattr(node, part)
        setattr(node, name.split(".")[-1], mod)
        return top


_LOCK = threading.Lock()
_LOADED: dict[tuple[str, str, str], types.ModuleType] = {}


def load_extend(source: Source | None = None) -> types.ModuleType:
    """The release's extend_attention module (cached per source and per TRITON_INTERPRET mode,
    since @triton.jit picks the interpreter when a module is executed)."""
    return load_module(KERNEL_FILE[:-3], source)


def load_module(name: str, source: Source | None = None) -> types.ModuleType:
    """A module of the release's kernel directory by file stem (extend_attention,
    decode_attention, ...), loaded like load_extend."""
    source = source or locate()
    why = prepare_triton()
    if why:
        raise RuntimeError(why)
    tag = "interpret" if interpreting() else "compiled"
    key = (str(source.kernel_dir), tag, name)
    with _LOCK:
        if key not in _LOADED:
            pkg = _PrivatePackage(source, tag)
            _LOADED[key] = pkg._load(name, "kdkit")
        return _LOADED[key]


def kernel_params(fn) -> dict:
    """Parameter name -> default (inspect.Parameter.empty if none) of a kernel entry point."""
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()}


def unknown_env_switches(module: types.ModuleType) -> list[str]:
    env = getattr(sys.modules.get(module.__name__.rpartition(".")[0] + "._srt_environ"), "envs", None)
    return sorted(env.unknown) if env is not None else []


def sglang_modules_loaded() -> list[str]:
    """Names in sys.modules that belong to the real sglang package (should stay empty)."""
    return sorted(n for n in sys.modules if n == "sglang" or n.startswith("sglang."))


__all__ = ["ENV_VAR", "PIN", "LAYOUTS", "Source", "SourceNotFound", "locate", "kernel_dir_in",
           "installed_roots", "release_in_tree", "load_extend",
           "kernel_params", "sglang_modules_loaded", "triton_problem", "prepare_triton", "interpreting",
           "HOW_TO_INSTALL"]
