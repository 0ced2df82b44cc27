"""Stand-ins for SGLang's GPU-only binary dependencies, for the plugin tests' environment.

torchvision's wheel is built against a CUDA torch (it cannot sit beside the CPU torch of the test
environment) and sgl_kernel (sglang-kernel) is a CUDA binary; SGLang imports both at module level
(multimodal utilities; `if _is_cuda:` branches of the attention backend and layernorm), but nothing
the tests run calls them. `install()` puts a finder at the end of sys.meta_path: only when the real
package is not installed, each of these names (and any submodule) imports as a placeholder module
whose attributes are placeholders; calling one raises ImportError saying why.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

ROOTS = ("torchvision", "sgl_kernel")
WHY = ("is stood in for in kdkit's SGLang test environment (a GPU-only binary that is not installed "
       "here); nothing under test should call it")


class _Missing:
    """Any attribute is another placeholder; calling one raises."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Missing(f"{self._name}.{item}")

    def __call__(self, *a, **k):
        raise ImportError(f"{self._name} {WHY}")

    def __repr__(self):
        return f"<kdkit stand-in {self._name}>"


class _Module(types.ModuleType):
    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Missing(f"{self.__name__}.{item}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = tuple(roots)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        mod = _Module(spec.name, f"{spec.name} {WHY}")
        mod.__path__ = []
        mod.__version__ = "0.0.0+kdkit.standin"
        return mod

    def exec_module(self, module):
        pass


def install() -> list[str]:
    """Stand in for the roots that are not installed; returns their names."""
    import importlib.util
    missing = [r for r in ROOTS if r not in sys.modules and importlib.util.find_spec(r) is None]
    if missing and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder(missing))
    return missing
