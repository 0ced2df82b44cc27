"""The plugin's settings, read from the environment (every TP worker process reads the same).

A bad value raises SettingsError with one line naming the variable, the value and the fix; the
plugin turns it into a stop at server start-up, never a crash in the middle of serving.
"""
from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

MODES = ("capture", "validate", "replace")
# The built-in backends KDKIT_KERNEL may name: kdkit's kernel (cuda, the production candidate) or
# the eager PyTorch reference (torch: runs on any device; lets validate check SGLang's Triton output
# on a machine without kdkit's kernel). Beside them: an installed backend (an entry point of this
# group: kdkit.backends.registry.GROUP, not imported here because it imports torch) or a spec
# (package.module:attr, path/to/file.py[:attr]), resolved and checked at plugin start (kdkit.capture.live).
KERNELS = ("cuda", "torch")
BACKEND_GROUP = "kdkit.backends"
# ForwardMode names of SGLang 0.5.11..0.5.23 (DRAFT_EXTEND was dropped after 0.5.11)
FORWARD_MODES = ("extend", "decode", "mixed", "idle", "target_verify", "draft_extend",
                 "draft_extend_v2", "prebuilt", "split_prefill", "dllm_extend")

# forward modes the attention backend's forward() never hands to forward_extend
NEVER_EXTEND = ("decode", "idle")

DEFAULT_DIR = "kdkit-captures"
DEFAULT_FORWARD_MODES = ("target_verify",)
# rel = ||kdkit - triton|| / ||triton||. Two correct bf16 kernels differ by a few bf16 roundings
# (u = 2^-8 per rounding, rel ~ 0.3-0.5% on the bundled cases); 2% is several times that and far
# below what a marshaling bug gives (the seed's bug: rel 1.08).
DEFAULT_REL_THRESHOLD = 0.02

# A server writes up to (layers x ranks) files per step (61 x 8 for Kimi/DeepSeek at TP 8, each a
# few MB to hundreds of MB): without a cap, capture runs until the disk is full. 20 GiB holds
# hundreds of typical cases and leaves a server's disk usable; KDKIT_MAX_BYTES=none lifts it.
DEFAULT_MAX_BYTES = 20 << 30
# Capturing also stops when the folder's file system has less than this free: the server itself
# (logs, Triton/torch caches, checkpoints) and its neighbours need the disk more than kdkit does,
# whatever the byte budget says. KDKIT_MIN_FREE=0 turns the floor off.
DEFAULT_MIN_FREE = 2 << 30
# Layer ids above this are refused: real models have < 200 layers, and the set of selected ids is
# built in memory (0-100000000 would take a minute and GBs on every rank).
MAX_LAYER_ID = 100_000

VARS = ("KDKIT_MODE", "KDKIT_DIR", "KDKIT_LAYERS", "KDKIT_FORWARD_MODES", "KDKIT_EVERY",
        "KDKIT_MAX_CASES", "KDKIT_MAX_BYTES", "KDKIT_MIN_FREE", "KDKIT_REL_THRESHOLD", "KDKIT_KERNEL",
        "KDKIT_MODEL")
# KDKIT_* names the rest of the project reads (tests, tools): never taken for a misspelled setting
OTHER_VARS = ("KDKIT_CACHE", "KDKIT_CACHE_MB", "KDKIT_SGLANG_ENV", "KDKIT_SGLANG_SRC", "KDKIT_SWEEP", "KDKIT_SWEEP_TRITON",
              "KDKIT_TEST_DATA", "KDKIT_TEST_THREADS", "KDKIT_CHROMIUM", "KDKIT_PROPERTY_EXAMPLES",
              "KDKIT_FUZZ_FILES", "KDKIT_BROWSER_RUN_S")
# A KDKIT_* name this close to a setting's (difflib ratio of the parts after KDKIT_) is a typo: it
# would be ignored silently (KDKIT_LAYER=56 captures every layer). The other project names above
# score below 0.6 against every setting; the typos tried (LAYER, EVRY, MAXBYTES, DIRS) 0.85-0.95.
TYPO_CUTOFF = 0.8


class SettingsError(ValueError):
    """One line: the variable, its value, what is wrong and what to write instead."""

    def __init__(self, var: str, value: str, why: str):
        self.var = var
        super().__init__(f"{var}={value!r}: {why}")


@dataclass(frozen=True)
class Layers:
    """Which layer ids are selected: None = all; else a set (from '56', '0-60:4', '1,5,9-12')."""
    ids: frozenset | None
    text: str

    def __contains__(self, layer_id: int) -> bool:
        return self.ids is None or layer_id in self.ids


def parse_layers(text: str) -> Layers:
    t = text.strip().lower()
    if t in ("", "all", "*"):
        return Layers(None, "all")
    ids: set[int] = set()
    for part in t.split(","):
        part = part.strip()
        # ASCII digits only ([0-9], not \d: int() would take other scripts' digits), at most 12 of
        # them (int() of thousands of digits raises its own ValueError)
        m = re.fullmatch(r"([0-9]{1,12})(?:-([0-9]{1,12})(?::([0-9]{1,12}))?)?", part)
        if not m:
            raise SettingsError("KDKIT_LAYERS", text, f"{part!r} is not a layer spec; write a layer id "
                                "(56), a range with an optional step (0-60:4, end included), a comma "
                                "list of those (1,5,9-12), or all")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if max(lo, hi) > MAX_LAYER_ID:
            raise SettingsError("KDKIT_LAYERS", text, f"{part!r}: layer ids run to {MAX_LAYER_ID} at most "
                                "(a model's layers are numbered from 0); write all for every layer")
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo or step < 1:
            raise SettingsError("KDKIT_LAYERS", text, f"{part!r}: a range runs low-high with a step >= 1 "
                                "(0-60:4)")
        ids.update(range(lo, hi + 1, step))
    return Layers(frozenset(ids), text.strip())


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(var: str, text: str, default: int | None = None) -> int | None:
    t = text.strip().lower().replace(" ", "")
    if t == "":
        return default
    if t in ("none", "unlimited"):
        return None
    m = re.fullmatch(r"([0-9]{1,30}(?:\.[0-9]{1,30})?)([a-z]*)", t)
    if not m or m.group(2) not in _UNITS:
        raise SettingsError(var, text, "want a size like 500M, 2GiB or 1048576 (bytes), or none")
    if "." in m.group(1) and _UNITS[m.group(2)] == 1:  # 1.5 read as 1 byte stopped capture at once
        raise SettingsError(var, text, "a fraction of a byte; bytes are whole (did you mean 1.5G?)")
    val = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(val) or val > 1 << 62:
        raise SettingsError(var, text, "more bytes than any disk holds; write none for no limit")
    if 0 < val < 1:  # 0.1 would read as 0 bytes and stop every capture
        raise SettingsError(var, text, "less than one byte; give a size like 500M (0 stops capture at once)")
    return int(val)


def _int(var: str, text: str, lo: int, default: int | None) -> int | None:
    t = text.strip().lower()
    if t == "":
        return default
    if t in ("none", "unlimited") and default is None:
        return None
    if not re.fullmatch(r"[0-9]{1,15}", t):  # (int() also takes 1_000 and other scripts' digits)
        raise SettingsError(var, text, f"want an integer >= {lo}")
    val = int(t)
    if val < lo:
        raise SettingsError(var, text, f"want an integer >= {lo}")
    return val


def _min_free(text: str) -> int:
    n = parse_bytes("KDKIT_MIN_FREE", text, DEFAULT_MIN_FREE)
    return 0 if n is None else n


@dataclass(frozen=True)
class Settings:
    mode: str | None                 # None: KDKIT_MODE unset, the plugin does nothing
    dir: Path = Path(DEFAULT_DIR)
    layers: Layers = field(default_factory=lambda: Layers(None, "all"))
    forward_modes: tuple = DEFAULT_FORWARD_MODES
    every: int = 1                   # one step in N (a step = one forward batch of a selected mode)
    max_cases: int | None = None     # case files in KDKIT_DIR (all ranks together)
    max_bytes: int | None = DEFAULT_MAX_BYTES  # bytes of case files in KDKIT_DIR (all ranks together)
    min_free: int = DEFAULT_MIN_FREE  # stop writing when the folder's disk has less free than this
    rel_threshold: float = DEFAULT_REL_THRESHOLD
    kernel: str = "cuda"
    model: str | None = None         # overrides the name read from the server args

    @property
    def active(self) -> bool:
        return self.mode is not None

    @property
    def writes(self) -> bool:
        """Modes that write case files (validate writes only the calls that fail the threshold)."""
        return self.mode in ("capture", "validate")

    def describe(self) -> list[str]:
        """`NAME=value  # meaning` lines of the settings in force."""
        def size(n):
            return "none" if n is None else f"{n}"
        return [
            f"KDKIT_MODE={self.mode or ''}  # {'off: the plugin passes every call through' if not self.mode else self.mode}",
            f"KDKIT_DIR={self.dir}  # case files go here (all ranks, one folder)",
            f"KDKIT_LAYERS={self.layers.text}  # layer ids hooked",
            f"KDKIT_FORWARD_MODES={','.join(self.forward_modes)}  # SGLang forward modes hooked",
            f"KDKIT_EVERY={self.every}  # one step in {self.every}",
            f"KDKIT_MAX_CASES={size(self.max_cases)}  # stop writing after this many case files in the folder",
            f"KDKIT_MAX_BYTES={size(self.max_bytes)}  # stop writing before the folder's case files pass this",
            f"KDKIT_MIN_FREE={self.min_free}  # stop writing when the folder's disk has less free than this",
            f"KDKIT_REL_THRESHOLD={self.rel_threshold:g}  # validate writes the case when rel exceeds it",
            f"KDKIT_KERNEL={self.kernel}  # what validate/replace run: cuda (kdkit's kernel), torch (reference), "
            "an installed backend, package.module:attr or path/to/file.py[:attr]",
            f"KDKIT_MODEL={self.model or ''}  # model name in file names (default: from the server args)",
        ]


    def assignments(self) -> list[tuple[str, str]]:
        """(NAME, value) of every setting that differs from its default (KDKIT_DIR always, as an
        absolute path: the server's working directory may not be this one), as from_env reads
        them back: what a launch line must carry. KDKIT_MODE is the caller's."""
        d = Settings(mode=self.mode)
        out = [("KDKIT_DIR", str(self.dir.resolve()))]
        if self.layers.text != d.layers.text:
            out.append(("KDKIT_LAYERS", self.layers.text))
        if self.forward_modes != d.forward_modes:
            out.append(("KDKIT_FORWARD_MODES", ",".join(self.forward_modes)))
        for var, name in (("KDKIT_EVERY", "every"), ("KDKIT_MAX_CASES", "max_cases"),
                          ("KDKIT_MAX_BYTES", "max_bytes"), ("KDKIT_MIN_FREE", "min_free"),
                          ("KDKIT_REL_THRESHOLD", "rel_threshold"), ("KDKIT_KERNEL", "kernel"),
                          ("KDKIT_MODEL", "model")):
            v = getattr(self, name)
            if v != getattr(d, name):
                out.append((var, "none" if v is None else repr(v) if isinstance(v, float) else str(v)))
        return [(var, _absolute_file_spec(v) if var == "KDKIT_KERNEL" else v) for var, v in out]


def check_names(env) -> None:
    """SettingsError for a KDKIT_* name that is a near miss of a setting's (KDKIT_LAYER=56)."""
    for name in env:
        if not name.upper().startswith("KDKIT_") or name in VARS or name in OTHER_VARS:
            continue
        tail = name.upper()[len("KDKIT_"):]
        near = difflib.get_close_matches(tail, [v[len("KDKIT_"):] for v in VARS], n=1, cutoff=TYPO_CUTOFF)
        if near:
            raise SettingsError(name, env[name], f"not a kdkit setting: did you mean KDKIT_{near[0]}? "
                                "(`kdkit capture env` lists the settings)")


def _kernel(text: str) -> str:
    """KDKIT_KERNEL: a built-in name (any case), an installed backend's name, or a spec (kept as
    written: a path's case matters). Whether a spec resolves is the plugin's check at start-up."""
    t = text.strip()
    if t.lower() in KERNELS or not t:
        return t.lower() or "cuda"
    if re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", t):  # a name, not a spec: an installed backend's
        from importlib.metadata import entry_points
        installed = sorted({ep.name for ep in entry_points(group=BACKEND_GROUP)})
        if t not in installed:
            raise SettingsError("KDKIT_KERNEL", text, f"not a backend here: choose {', '.join(KERNELS + tuple(installed))}, "
                                "or give a spec: package.module:attr or path/to/file.py[:attr]")
    return t


def _absolute_file_spec(spec: str) -> str:
    """A file spec with its path made absolute (a server's workers may start elsewhere)."""
    m = re.fullmatch(r"(.+\.py)(:[A-Za-z_][\w.]*)?", spec)
    return f"{Path(m[1]).expanduser().resolve()}{m[2] or ''}" if m else spec


def from_env(env=None) -> Settings:
    """Read the KDKIT_* variables; raises SettingsError on the first bad one."""
    env = os.environ if env is None else env
    check_names(env)
    mode = env.get("KDKIT_MODE", "").strip().lower() or None
    if mode is not None and mode not in MODES:
        raise SettingsError("KDKIT_MODE", env["KDKIT_MODE"], f"choose one of {', '.join(MODES)} (or unset it)")
    fm_text = env.get("KDKIT_FORWARD_MODES", "")
    fms = tuple(s.strip().lower() for s in fm_text.split(",") if s.strip()) or DEFAULT_FORWARD_MODES
    if fm_text.strip() and not any(s.strip() for s in fm_text.split(",")):
        raise SettingsError("KDKIT_FORWARD_MODES", fm_text, "no forward mode named; give one (target_verify) or unset it")
    bad = [f for f in fms if f not in FORWARD_MODES]
    if bad:
        raise SettingsError("KDKIT_FORWARD_MODES", fm_text, f"{bad[0]!r} is not an SGLang forward mode; "
                            f"choose from {', '.join(f for f in FORWARD_MODES if f not in NEVER_EXTEND)}")
    never = [f for f in fms if f in NEVER_EXTEND]
    if never:
        raise SettingsError("KDKIT_FORWARD_MODES", fm_text, f"{never[0]!r} never reaches forward_extend, the "
                            "method kdkit hooks (SGLang sends decode to forward_decode and returns early for "
                            "idle): nothing would be seen")
    rel_text = env.get("KDKIT_REL_THRESHOLD", "").strip()
    try:
        rel = float(rel_text) if rel_text else DEFAULT_REL_THRESHOLD
    except ValueError:
        rel = -1.0
    if not (math.isfinite(rel) and rel >= 0):
        raise SettingsError("KDKIT_REL_THRESHOLD", rel_text, "want a number >= 0, e.g. 0.02")
    kernel = _kernel(env.get("KDKIT_KERNEL", ""))
    if mode == "replace" and kernel == "torch":
        raise SettingsError("KDKIT_KERNEL", kernel, "replace needs a kernel with the live pair plan(batch) and "
                            "launch(...) that CUDA graphs replay (kdkit's cuda, or yours); the torch reference "
                            "has run(case) only and syncs with the host")
    dir_text = env.get("KDKIT_DIR", "").strip()
    model = env.get("KDKIT_MODEL", "").strip() or None
    if model is not None and not re.fullmatch(r"[A-Za-z0-9._+/-]+", model):
        raise SettingsError("KDKIT_MODEL", model, "letters, digits and . _ + - / only (its last part goes into "
                            "file names, as with --served-model-name org/name)")
    try:
        folder = Path(dir_text).expanduser() if dir_text else Path(DEFAULT_DIR)
    except RuntimeError as e:  # ~nosuchuser/...
        raise SettingsError("KDKIT_DIR", dir_text, f"{e}; write the folder's full path") from None
    return Settings(
        mode=mode,
        dir=folder,
        layers=parse_layers(env.get("KDKIT_LAYERS", "")),
        forward_modes=fms,
        every=_int("KDKIT_EVERY", env.get("KDKIT_EVERY", ""), 1, 1),
        max_cases=_int("KDKIT_MAX_CASES", env.get("KDKIT_MAX_CASES", ""), 0, None),
        max_bytes=parse_bytes("KDKIT_MAX_BYTES", env.get("KDKIT_MAX_BYTES", ""), DEFAULT_MAX_BYTES),
        min_free=_min_free(env.get("KDKIT_MIN_FREE", "")),
        rel_threshold=rel,
        kernel=kernel,
        model=model,
    )
