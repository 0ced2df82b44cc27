"""The plugin's entry point: `register()`, called by SGLang's load_plugins() in the server, the
engine and at the start of every scheduler (TP worker) process.

pyproject.toml declares it:   [project.entry-points."sglang.srt.plugins"] kdkit = "kdkit.capture.plugin:register"
SGLANG_PLUGINS=kdkit (a comma-separated allow-list) and KDKIT_MODE turn it on.

load_plugins() logs and swallows an Exception raised by a plugin (the server would then run
without kdkit, silently), so a bad setting is raised as SystemExit: the process stops at
start-up with one line instead.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys

from . import sglang_api
from .settings import Settings, SettingsError, from_env

_HOOK = None  # the process's Hook, once registered
_LIVE = None  # the process's KDKIT_KERNEL, resolved and checked once (kdkit.capture.live.Live)


class StartupError(SystemExit):
    """Stops the SGLang process at start-up; the message is the one line printed."""

    def __init__(self, why: str):
        super().__init__(f"[kdkit] stopping SGLang at start-up: {why}")


def settings_or_stop(env=None) -> Settings:
    try:
        s = from_env(env)
    except SettingsError as e:
        raise StartupError(str(e)) from None
    except Exception as e:  # a setting no check foresaw: still a stop, never a server without kdkit
        raise StartupError(f"reading the KDKIT_* settings failed: {type(e).__name__}: {e}") from None
    kernel_or_stop(s)
    return s


def kernel_or_stop(s: Settings):
    """KDKIT_KERNEL resolved in this process and checked (the contract, the pair replace needs,
    that it can run here) before anything launches: a kdkit.capture.live.Live, None for capture."""
    global _LIVE
    if s.mode not in ("validate", "replace"):
        return None
    if _LIVE is None or (_LIVE.spec, _LIVE.mode) != (s.kernel, s.mode):
        from . import live
        try:
            _LIVE = live.load(s.kernel, s.mode)
        except live.LiveError as e:
            raise StartupError(str(e)) from None
        except Exception as e:  # whatever the user's module does on import: a stop, in one line
            raise StartupError(f"KDKIT_KERNEL={s.kernel!r}: {type(e).__name__}: {e}".splitlines()[0]) from None
    return _LIVE


def make_hook(settings: Settings):
    """The process's hook (made once; its folder prepared)."""
    global _HOOK
    if _HOOK is None:
        from .hook import Hook
        _HOOK = Hook(settings, kernel_or_stop(settings))
        if _HOOK.store is not None:
            _HOOK.store.prepare()
        from .hook import log
        kernel = f" with KDKIT_KERNEL={settings.kernel}" if _HOOK.live is not None else ""
        log.info(f"[kdkit] {settings.mode}{kernel} on {sglang_api.TARGET} (layers {settings.layers.text}, "
                 f"forward modes {','.join(settings.forward_modes)}, dir {settings.dir})")
    return _HOOK


def register() -> None:
    """Entry point of the group `sglang.srt.plugins`: load_plugins() calls it with no arguments."""
    s = settings_or_stop()
    if not s.active:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    HookRegistry.register(sglang_api.TARGET, make_hook(s), HookType.AROUND)


# ---- without the plugin system (SGLang <= 0.5.10): installed from sitecustomize.py ---------------
def wrap(cls, hook) -> bool:
    """Wrap cls.forward_extend as HookType.AROUND would; False if it is already wrapped."""
    original = cls.__dict__["forward_extend"]
    if getattr(original, "__kdkit_hook__", None) is not None:
        return False

    @functools.wraps(original)
    def forward_extend(*args, **kwargs):
        return hook(original, *args, **kwargs)

    forward_extend.__kdkit_hook__ = hook
    cls.forward_extend = forward_extend
    return True


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` right after `name` is first imported (a post-import hook)."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        then = self.then

        def exec_then(module):
            exec_module(module)
            then(module)
        spec.loader.exec_module = exec_then
        return spec


def _plugin_system_will_load_kdkit() -> bool:
    """True when SGLang's load_plugins() will call register() itself (no double hook)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return False
    if not any(os.path.isfile(os.path.join(p, "srt", "plugins", "__init__.py"))
               for p in spec.submodule_search_locations):
        return False
    from importlib.metadata import entry_points
    if not any(ep.name == "kdkit" for ep in entry_points(group=sglang_api.PLUGIN_GROUP)):
        return False
    allowed = os.environ.get("SGLANG_PLUGINS", "").strip()
    return not allowed or "kdkit" in {x.strip() for x in allowed.split(",")}


def install_from_sitecustomize() -> str:
    """What sitecustomize.py calls, at the start of EVERY Python process with its folder on
    PYTHONPATH (pip, `kdkit capture env`, the server). It only registers a post-import hook: the
    settings are read and checked (and torch imported, for validate/replace's CUDA check) when
    SGLang's Triton backend module is imported, so a bad KDKIT_* value stops SGLang there with one
    line and leaves every other process alone. Returns what it did."""
    if not os.environ.get("KDKIT_MODE", "").strip():
        return "KDKIT_MODE unset: nothing hooked"

    def then(module):
        if _plugin_system_will_load_kdkit():
            return  # register() hooks it (and checks the settings) when load_plugins() runs
        wrap(getattr(module, sglang_api.BACKEND_CLASS), make_hook(settings_or_stop()))

    mod = sys.modules.get(sglang_api.BACKEND_MODULE)
    if mod is not None:
        then(mod)
        return "hooked (the backend module was already imported)"
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(sglang_api.BACKEND_MODULE, then))
    return f"will hook {sglang_api.TARGET} when it is imported"
