"""Where a backend comes from: a name or a spec, resolved once to an object that meets the contract.

A backend is named (in --backends, KDKIT_KERNEL, notebooks, kdkit bench) by
  torch                      a built-in name (BACKENDS, below), a name given to register(),
                             or an installed entry point of the group `kdkit.backends`
                             (pyproject.toml: [project.entry-points."kdkit.backends"] mine = "mine.backend")
  package.module[:attr]      an importable module; `attr` (dotted) names an object in it
  path/to/file.py[:attr]     a Python file, loaded as a module of its own (again when it changes:
                             edit, re-run the cell); a relative path is from the working directory
A spec without `attr` takes the module's `backend` if it has one, else the module itself. A spec
resolves to the backend's NAME, under which it is registered for the rest of the process; "all"
is every built-in, registered and installed backend. Names are a letter, then letters, digits, _
or -, so a name is never read as a spec. A spec that does not resolve, or an object that does not
meet the contract (kdkit.backends' docstring; the live pair: kdkit.capture.live), raises
BackendSpecError: one line naming the spec and what is missing.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import re
import sys
from pathlib import Path

# kdkit's own backends, name -> module; the order is the order `replay` prints them in. Specs,
# register() and installed entry points are added to BACKENDS as they are loaded.
BACKENDS = {
    "oracle": "kdkit.backends.oracle",
    "torch": "kdkit.backends.torch_ref",
    "triton_sglang": "kdkit.backends.triton_sglang",
    "triton_decode": "kdkit.backends.triton_decode",
    "cuda": "kdkit.backends.cuda",
    "captured": "kdkit.backends.captured",
    "flashinfer_mla": "kdkit.backends.flashinfer_mla",
}

GROUP = "kdkit.backends"                # the entry-point group an installed backend registers in
BUILTIN = dict(BACKENDS)                # name -> module: kdkit's own, never replaced
NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
_ATTR = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
FILE_RE = re.compile(rf"(?P<path>.+\.py)(?::(?P<attr>{_ATTR}))?")
MODULE_RE = re.compile(rf"(?P<mod>{_ATTR})(?::(?P<attr>{_ATTR}))?")
FORMS = "a name, package.module[:attr] or path/to/file.py[:attr]"

_objects: dict = {}   # name -> backend object, for every name not built in (once loaded)
_sources: dict = {}   # name -> where it came from (a spec, register(), an entry point): one of a kind
_files: dict = {}     # absolute path -> ((mtime_ns, size), module): a file is executed again when it changes
_listed: set = set()  # installed backends listed by names() and not loaded yet


class BackendSpecError(ValueError):
    """A backend spec that does not resolve, or an object that does not meet the contract: one line."""


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"


# ---- the contract, checked on what a spec gives ---------------------------------------------------
def _signature(fn, where: str, what: str):
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise BackendSpecError(f"{where}: {what}'s signature cannot be read ({_first_line(e)})") from None


def run_options(fn, where: str, what: str = "run") -> list[str]:
    """The options `fn(case, *, opt=default, ...)` declares; BackendSpecError if it is not of that form."""
    params = list(_signature(fn, where, what).parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        raise BackendSpecError(f"{where}: {what} takes no case: want {what}(case, *, option=default, ...)")
    opts = []
    for p in params[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            star = "*" if p.kind == p.VAR_POSITIONAL else "**"
            raise BackendSpecError(f"{where}: {what} takes {star}{p.name}: declare each option as a keyword "
                                   "with a default (the options are read off the signature)")
        if p.default is p.empty:
            raise BackendSpecError(f"{where}: {what}'s option {p.name!r} has no default")
        opts.append(p.name)
    return opts


def check(obj, where: str) -> None:
    """BackendSpecError naming the first part of the contract `obj` does not meet."""
    name = getattr(obj, "NAME", None)
    if not isinstance(name, str):
        raise BackendSpecError(f"{where}: no NAME (a str: the backend's name in tables and --backends)")
    if not NAME_RE.fullmatch(name) or name == "all":
        raise BackendSpecError(f"{where}: NAME {name!r} is not a name (a letter, then letters, digits, _ or -; "
                               "not 'all')")
    una = getattr(obj, "unavailable", None)
    if not callable(una):
        raise BackendSpecError(f"{where}: no unavailable(case=None) (None when it can run here, else one line "
                               "saying why, with the fix)")
    try:
        _signature(una, where, "unavailable").bind(None)
    except TypeError:
        raise BackendSpecError(f"{where}: unavailable must take one argument, unavailable(case=None)") from None
    run = getattr(obj, "run", None)
    if not callable(run):
        raise BackendSpecError(f"{where}: no run(case, ...) (returning a kdkit.backends.Result)")
    opts = run_options(run, where)
    prepare = getattr(obj, "prepare", None)
    if prepare is not None:
        if not callable(prepare):
            raise BackendSpecError(f"{where}: prepare is not callable")
        popts = run_options(prepare, where, "prepare")
        if popts != opts:
            raise BackendSpecError(f"{where}: prepare declares ({', '.join(popts)}), run ({', '.join(opts)}): "
                                   "declare the same options")
    plan, launch = getattr(obj, "plan", None), getattr(obj, "launch", None)
    if (plan is None) != (launch is None):
        have, lack = ("plan", "launch(plan, q, k, v, kv_buffer, out)") if launch is None else \
            ("launch", "plan(batch)")
        raise BackendSpecError(f"{where}: has {have} but no {lack}: the live pair is both or neither")
    for fn, what, args in ((plan, "plan", 1), (launch, "launch", 6), (getattr(obj, "unsupported", None),
                                                                       "unsupported", 1)):
        if fn is None:
            continue
        if not callable(fn):
            raise BackendSpecError(f"{where}: {what} is not callable")
        try:
            _signature(fn, where, what).bind(*([None] * args))
        except TypeError:
            want = {"plan": "plan(batch)", "launch": "launch(plan, q, k, v, kv_buffer, out)",
                    "unsupported": "unsupported(batch)"}[what]
            raise BackendSpecError(f"{where}: {what} must take {args} argument(s): {want}") from None
    label = getattr(obj, "LABEL", None)
    if label is not None and (not isinstance(label, str) or "\n" in label):
        raise BackendSpecError(f"{where}: LABEL must be one line of text")


def has_live_pair(obj) -> bool:
    """Whether `obj` has the plan/launch pair that replace and CUDA graphs need (kdkit.capture.live)."""
    return callable(getattr(obj, "plan", None)) and callable(getattr(obj, "launch", None))


# ---- loading a spec -----------------------------------------------------------------------------
def _attr(module, attr: str | None, where: str):
    if attr is None:
        return getattr(module, "backend", module)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            found = [n for n, v in vars(module).items() if not n.startswith("_") and not inspect.ismodule(v)
                     and callable(getattr(v, "run", None)) and hasattr(v, "NAME")]
            hint = f" (backends in it: {', '.join(found)})" if found else ""
            raise BackendSpecError(f"{where}: no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    return obj


def _import(mod: str, where: str):
    try:
        return importlib.import_module(mod)
    except (Exception, SystemExit) as e:  # whatever the user's module raises, one line
        raise BackendSpecError(f"{where}: cannot import ({_first_line(e)})") from None


def _exec_file(path: Path, where: str):
    """The module of a .py file: executed again when the file changed (its size or mtime)."""
    try:
        st = path.stat()
    except OSError as e:
        raise BackendSpecError(f"{where}: {e.strerror or e} ({path})") from None
    if not path.is_file():
        raise BackendSpecError(f"{where}: not a file ({path})")
    stamp = (st.st_mtime_ns, st.st_size)
    seen = _files.get(path)
    if seen is not None and seen[0] == stamp:
        return seen[1]
    # one stable module name per file, so that a reload replaces it and tracebacks show the path
    modname = "kdkit_user_backend_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(modname, path)
    module = importlib.util.module_from_spec(spec)
    before = sys.modules.get(modname)
    sys.modules[modname] = module  # (dataclasses and pickling look the module up while it runs)
    sys.path.insert(0, str(path.parent))  # its own helper modules beside it import, as under `python file.py`
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:
        if before is None:
            sys.modules.pop(modname, None)
        else:
            sys.modules[modname] = before
        raise BackendSpecError(f"{where}: cannot load ({_first_line(e)})") from None
    finally:
        sys.path.remove(str(path.parent))
    _files[path] = (stamp, module)
    return module


def _adopt(obj, where: str, source: str, name: str | None = None) -> str:
    """Check `obj` and register it under its NAME (or `name`, which must be its NAME); the name."""
    check(obj, where)
    name = name or obj.NAME
    if obj.NAME != name:
        raise BackendSpecError(f"{where}: its NAME is {obj.NAME!r}, not {name!r}: one backend, one name")
    if name in BUILTIN:
        if obj is _builtin(name):
            return name  # kdkit.backends.torch_ref named as a module: the built-in itself
        raise BackendSpecError(f"{where}: NAME {name!r} is kdkit's built-in backend's; give yours a NAME of its own")
    taken = _sources.get(name)
    if taken is not None and taken != source and _objects.get(name) is not obj:
        raise BackendSpecError(f"{where}: NAME {name!r} is taken by {taken}; give one of them another NAME "
                               f"(or unregister({name!r}) first)")
    _objects[name], _sources[name] = obj, source
    _listed.discard(name)
    BACKENDS[name] = source  # listed with the built-ins: replay and --backends all see it
    return name


def _builtin(name: str):
    return importlib.import_module(BUILTIN[name])


# ---- entry points -------------------------------------------------------------------------------
def entry_points() -> dict:
    """name -> the EntryPoint of every installed backend (group kdkit.backends); BackendSpecError
    when two packages register one name, or a package registers a built-in's."""
    found: dict = {}
    for ep in importlib.metadata.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        who = f"{dist.name} {dist.version}" if dist is not None else "a package"
        if ep.name in BUILTIN:
            raise BackendSpecError(f"entry point {ep.name} = {ep.value} ({GROUP}, from {who}): {ep.name!r} is "
                                   "kdkit's built-in backend's name; the package must register another")
        if ep.name in found and found[ep.name][0].value != ep.value:
            other, owho = found[ep.name]
            raise BackendSpecError(f"entry point {ep.name!r} ({GROUP}) is registered twice: {other.value} "
                                   f"({owho}) and {ep.value} ({who}); uninstall one")
        found[ep.name] = (ep, who)
    return {n: ep for n, (ep, _) in found.items()}


def _load_entry_point(ep) -> str:
    where = f"entry point {ep.name} = {ep.value}"
    source = f"{where} ({GROUP})"
    if _sources.get(ep.name) == source:
        return ep.name
    if ep.name in _sources:
        raise BackendSpecError(f"{where}: {ep.name!r} is taken by {_sources[ep.name]}; unregister({ep.name!r}) "
                               "or give the installed one its own name")
    try:
        obj = ep.load()
    except (Exception, SystemExit) as e:
        raise BackendSpecError(f"{where}: cannot import ({_first_line(e)})") from None
    if inspect.ismodule(obj):
        obj = getattr(obj, "backend", obj)
    return _adopt(obj, where, source, ep.name)


# ---- the API ----------------------------------------------------------------------------------
def load(spec: str) -> str:
    """The registered name of one backend spec (loading and checking it first); BackendSpecError
    in one line if it does not resolve."""
    spec = spec.strip()
    if spec in BACKENDS and spec not in _listed:
        return spec
    if NAME_RE.fullmatch(spec):
        eps = entry_points()
        if spec in eps:
            return _load_entry_point(eps[spec])
        choose = ", ".join([*BACKENDS, *(n for n in eps if n not in BACKENDS)])
        raise BackendSpecError(f"unknown backend(s) {spec}; choose from {choose} or 'all', or give a spec "
                               "(package.module:attr, path/to/file.py[:attr])")
    m = FILE_RE.fullmatch(spec)
    if m:
        path = Path(m["path"]).expanduser().resolve()
        module = _exec_file(path, spec)
        obj = _attr(module, m["attr"], spec)
        return _adopt(obj, spec, f"{path}:{m['attr'] or 'backend'}")
    if "/" in spec or "\\" in spec:
        raise BackendSpecError(f"{spec}: a file spec names a .py file: path/to/file.py[:attr]")
    m = MODULE_RE.fullmatch(spec)
    if m and ("." in spec or ":" in spec):
        module = _import(m["mod"], spec)
        obj = _attr(module, m["attr"], spec)
        return _adopt(obj, spec, f"{m['mod']}:{m['attr'] or 'backend'}")
    raise BackendSpecError(f"{spec!r} is not a backend; give {FORMS}")


def get(name: str):
    """The backend object (a module or any object) registered as `name`, or that `name` resolves to."""
    if name in _objects:
        return _objects[name]
    if name in _listed:  # an installed backend 'all' listed: loaded when first used
        return _objects[_load_entry_point(entry_points()[name])]
    if name in BACKENDS:  # a module path: the built-ins (and a test's stand-in)
        return importlib.import_module(BACKENDS[name])
    return get(load(name))


def names() -> list[str]:
    """Every backend --backends all means: the built-ins, those registered, those installed (an
    installed one is loaded when it runs: one that cannot be imported is a skipped row, saying why)."""
    for n, ep in entry_points().items():
        if n not in BACKENDS:
            BACKENDS[n] = f"entry point {n} = {ep.value} ({GROUP})"
            _listed.add(n)
    return list(BACKENDS)


def resolve(spec) -> list[str]:
    """Backend names from a --backends value: "all", or names and specs, comma-separated in a str or
    as a list. Duplicates are dropped, order kept; BackendSpecError (a ValueError) in one line for
    the first that does not resolve, or for an empty selection."""
    if isinstance(spec, str):
        if spec.strip() == "all":
            return names()
        spec = spec.split(",")
    items = [s.strip() for s in spec if isinstance(s, str) and s.strip()]
    if not items:
        raise BackendSpecError(f"no backend given; choose from {', '.join(BACKENDS)} or 'all', or give a spec "
                               f"({FORMS})")
    return list(dict.fromkeys(load(s) for s in items))


def register(name: str, obj) -> str:
    """Register `obj` (a module or any object meeting the contract) as `name` for this process; a
    notebook's way. Registering the name again replaces it (re-running the cell); a built-in's or
    an installed entry point's name is refused."""
    where = f"register({name!r}, ...)"
    if name in BUILTIN:
        raise BackendSpecError(f"{where}: {name!r} is kdkit's built-in backend; pick another name")
    src = _sources.get(name, "")
    if src.startswith("entry point"):
        raise BackendSpecError(f"{where}: {name!r} is the installed {src}; pick another name")
    if name in _sources and src != "register()":
        unregister(name)  # a spec loaded under this name before: the notebook's object replaces it
    return _adopt(obj, where, "register()", name)


def unregister(name: str) -> None:
    """Forget a backend registered in this process (not a built-in)."""
    if name in BUILTIN:
        raise BackendSpecError(f"unregister({name!r}): a built-in backend stays")
    _objects.pop(name, None)
    _sources.pop(name, None)
    _listed.discard(name)
    BACKENDS.pop(name, None)
