"""The plugin's contract with SGLang, read in the source of the releases it supports.

Every module, class, method, attribute, argument and metadata field that kdkit/capture relies on
(kdkit.capture.sglang_api lists them) is looked up in the release wheels that `make test`
downloads into .cache/wheels (`pip download --no-deps sglang==X`): the oldest supported release
(the first with the plugin system), the pin, and the newest. Nothing is imported: the wheels' .py
files are parsed with `ast`. When SGLang renames or moves something, the failure says what is
missing where, and where a definition of that name lives now.
"""
from __future__ import annotations

import ast
import re
import zipfile
from functools import lru_cache
from pathlib import Path

import pytest

from kdkit.capture import settings, sglang_api

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".cache" / "wheels"
SUPPORTED = (sglang_api.OLDEST, "0.5.15.post1", sglang_api.NEWEST)
NO_PLUGINS = "0.5.10"  # the release before the plugin system: sitecustomize's case


class Release:
    def __init__(self, rel: str):
        hits = sorted(WHEELS.glob(f"sglang-{rel}-*.whl"))
        if not hits:
            pytest.skip(f"no wheel of sglang {rel} in {WHEELS}: `make test` downloads it "
                        f"(pip download --no-deps sglang=={rel} -d .cache/wheels)")
        self.rel = rel
        self.zip = zipfile.ZipFile(hits[0])
        self.names = set(self.zip.namelist())

    def path(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for p in (base + ".py", base + "/__init__.py"):
            if p in self.names:
                return p
        return None

    def source(self, module: str) -> str:
        p = self.path(module)
        assert p is not None, f"sglang {self.rel}: module {module} is gone{self.moved(module.rsplit('.', 1)[-1])}"
        return self.zip.read(p).decode("utf-8")

    def tree(self, module: str) -> ast.Module:
        return ast.parse(self.source(module))

    def moved(self, name: str) -> str:
        """Where `name` is defined now (a def, a class or a module of that name), for the message."""
        pat = re.compile(rf"^\s*(?:def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*=", re.M)
        where = [n[:-3].replace("/", ".") for n in sorted(self.names)
                 if n.endswith(".py") and (n.rsplit("/", 1)[-1] == f"{name}.py" or pat.search(self.zip.read(n).decode("utf-8", "replace")))]
        return f"; `{name}` is now defined in: {', '.join(where[:6])}" if where else f"; no `{name}` anywhere in the release"


@lru_cache(maxsize=None)
def release(rel: str) -> Release:
    return Release(rel)


def _class(r: Release, module: str, name: str) -> ast.ClassDef:
    for node in ast.walk(r.tree(module)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"sglang {r.rel}: class {name} not in {module}{r.moved(name)}")


def _method(r: Release, cls: ast.ClassDef, name: str, module: str) -> ast.FunctionDef:
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise AssertionError(f"sglang {r.rel}: {module}.{cls.name}.{name} is gone{r.moved(name)}")


def _function(r: Release, module: str, name: str) -> ast.FunctionDef:
    for node in r.tree(module).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"sglang {r.rel}: {module}.{name} is gone{r.moved(name)}")


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]


def _self_attrs_assigned(cls: ast.ClassDef) -> set[str]:
    out = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                out.add(t.attr)
    return out


def _dataclass_fields(cls: ast.ClassDef) -> set[str]:
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _calls(fn, attr: str) -> list[ast.Call]:
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == attr and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"]


# ---- the plugin system ---------------------------------------------------------------------------
@pytest.mark.parametrize("rel", SUPPORTED)
def test_plugin_system(rel):
    r = release(rel)
    src = r.source(sglang_api.PLUGINS_MODULE)
    fn = _function(r, sglang_api.PLUGINS_MODULE, "load_plugins")
    assert _params(fn) == [], f"sglang {rel}: load_plugins takes {_params(fn)} now"
    assert re.search(rf'GENERAL_PLUGINS_GROUP\s*=\s*"{re.escape(sglang_api.PLUGIN_GROUP)}"', src), \
        f"sglang {rel}: the entry-point group is no longer {sglang_api.PLUGIN_GROUP!r}"
    assert "SGLANG_PLUGINS" in src, f"sglang {rel}: the SGLANG_PLUGINS allow-list is gone"
    assert re.search(r"\n\s+func\(\)\n", src), f"sglang {rel}: load_plugins no longer calls each plugin with no arguments"
    hooks = sglang_api.HOOKS_MODULE
    reg = _method(r, _class(r, hooks, "HookRegistry"), "register", hooks)
    assert _params(reg)[:4] == ["cls", "target", "hook", "hook_type"], f"sglang {rel}: register{_params(reg)}"
    members = {t.id for n in _class(r, hooks, "HookType").body if isinstance(n, ast.Assign) for t in n.targets
               if isinstance(t, ast.Name)}
    assert "AROUND" in members, f"sglang {rel}: HookType has {sorted(members)}, no AROUND"
    assert "return hook(original_fn, *args, **kwargs)" in r.source(hooks), \
        f"sglang {rel}: an AROUND hook is no longer called as hook(original, *args, **kwargs)"
    # load_plugins() runs in the server, the engine and every scheduler (TP worker) process
    for module in ("sglang.launch_server", "sglang.srt.entrypoints.engine", "sglang.srt.managers.scheduler"):
        assert "load_plugins()" in r.source(module), f"sglang {rel}: {module} no longer calls load_plugins()"


def test_the_release_before_has_no_plugin_system():
    r = release(NO_PLUGINS)
    assert r.path(sglang_api.PLUGINS_MODULE) is None
    assert not sglang_api.has_plugin_system(NO_PLUGINS) and sglang_api.has_plugin_system(sglang_api.OLDEST)


# ---- the hooked method and the kernel call -------------------------------------------------------
@pytest.mark.parametrize("rel", SUPPORTED + (NO_PLUGINS,))
def test_forward_extend_and_its_kernel_call(rel):
    r = release(rel)
    mod = sglang_api.BACKEND_MODULE
    cls = _class(r, mod, sglang_api.BACKEND_CLASS)
    fe = _method(r, cls, "forward_extend", mod)
    want = list(sglang_api.FORWARD_EXTEND_ARGS)
    assert _params(fe)[:len(want)] == want, f"sglang {rel}: forward_extend{_params(fe)}, kdkit reads {want}"
    assigned = _self_attrs_assigned(cls)
    for attr in (sglang_api.KERNEL_ATTR,) + sglang_api.BACKEND_ATTRS:
        assert attr in assigned, f"sglang {rel}: TritonAttnBackend no longer sets self.{attr}{r.moved(attr)}"
    # the kernel call: in forward_extend, or in _forward_extend_kernel which forwards its arguments
    calls = _calls(fe, sglang_api.KERNEL_ATTR)
    if not calls:
        via = _calls(fe, "_forward_extend_kernel")
        assert via, f"sglang {rel}: forward_extend no longer calls self.{sglang_api.KERNEL_ATTR}"
        inner = _method(r, cls, "_forward_extend_kernel", mod)
        fwd = _calls(inner, sglang_api.KERNEL_ATTR)
        assert fwd and isinstance(fwd[0].args[0], ast.Starred), \
            f"sglang {rel}: _forward_extend_kernel no longer passes its arguments on to {sglang_api.KERNEL_ATTR}"
        calls = [ast.Call(func=c.func, args=c.args[1:], keywords=c.keywords) for c in via]  # minus `layer`
    call = calls[-1]
    assert len(call.args) == len(sglang_api.KERNEL_ARGS), \
        f"sglang {rel}: forward_extend passes {len(call.args)} positional kernel arguments, kdkit binds {len(sglang_api.KERNEL_ARGS)}"
    kws = {k.arg for k in call.keywords}
    missing = set(sglang_api.KERNEL_KWARGS) - kws
    assert not missing, f"sglang {rel}: forward_extend no longer passes {sorted(missing)} to the kernel"
    # what it passes at the positions kdkit names (o is the output, k_buffer the layer's pool)
    text = [ast.unparse(a) for a in call.args]
    assert "o.view" in text[3] and "get_key_buffer" in text[4] and "get_value_buffer" in text[5], text[:6]
    assert text[6].endswith("forward_metadata.qo_indptr") and text[9].endswith("forward_metadata.custom_mask"), text
    assert text[11].endswith("forward_metadata.mask_indptr") and text[12].endswith("forward_metadata.max_extend_len")
    # K is written into the pool before the kernel runs (the case's pool holds this step's draft)
    body = ast.unparse(fe)
    write = min(i for i in (body.find("_set_kv_buffer("), body.find("set_kv_buffer(")) if i >= 0)
    assert 0 <= write < body.rfind(sglang_api.KERNEL_ATTR if _calls(fe, sglang_api.KERNEL_ATTR) else "_forward_extend_kernel")


@pytest.mark.parametrize("rel", SUPPORTED)
def test_kernel_signature(rel):
    r = release(rel)
    for module in ("sglang.kernels.ops.attention.extend_attention",
                   "sglang.srt.layers.attention.triton_ops.extend_attention"):
        if r.path(module):
            fn = _function(r, module, "extend_attention_fwd")
            params = _params(fn)
            assert tuple(params[:16]) == sglang_api.KERNEL_ARGS, f"sglang {rel}: {module}.extend_attention_fwd{params[:16]}"
            assert set(sglang_api.KERNEL_KWARGS) <= set(params), f"sglang {rel}: {sorted(set(sglang_api.KERNEL_KWARGS) - set(params))}"
            return
    pytest.fail(f"sglang {rel}: no extend_attention.py in either layout{r.moved('extend_attention_fwd')}")


# ---- the data it reads ---------------------------------------------------------------------------
@pytest.mark.parametrize("rel", SUPPORTED)
def test_metadata_batch_layer_pool_and_spec_fields(rel):
    r = release(rel)
    meta = _dataclass_fields(_class(r, sglang_api.BACKEND_MODULE, "ForwardMetadata"))
    missing = set(sglang_api.METADATA_FIELDS) - meta
    assert not missing, f"sglang {rel}: ForwardMetadata lost {sorted(missing)}"
    fbi = "sglang.srt.model_executor.forward_batch_info"
    fb = _dataclass_fields(_class(r, fbi, "ForwardBatch"))
    missing = set(sglang_api.FORWARD_BATCH_FIELDS) - fb
    assert not missing, f"sglang {rel}: ForwardBatch lost {sorted(missing)}"
    fm = _class(r, fbi, "ForwardMode")
    names = {t.id.lower() for n in fm.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert "target_verify" in names and _method(r, fm, "is_target_verify", fbi)
    assert names <= set(settings.FORWARD_MODES), f"sglang {rel}: new forward modes {sorted(names - set(settings.FORWARD_MODES))}"
    ra = "sglang.srt.layers.radix_attention"
    assert "layer_id" in _self_attrs_assigned(_class(r, ra, "RadixAttention"))
    pool = "sglang.srt.mem_cache.memory_pool"
    mla = _class(r, pool, "MLATokenToKVPool")
    for m in ("get_key_buffer", "get_value_buffer", "set_kv_buffer"):
        _method(r, mla, m, pool)
    assert "custom_mask" in _dataclass_fields(_class(r, "sglang.srt.speculative.eagle_info", "EagleVerifyInput"))


@pytest.mark.parametrize("rel", SUPPORTED)
def test_capture_flag_rank_server_args_and_launch_flags(rel):
    r = release(rel)
    # the module variable the hook reads (a module-level `is_capture_mode = ...`)
    where = [m for m, name in sglang_api.CAPTURE_MODE if r.path(m) and
             any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
                 for n in r.tree(m).body)]
    assert where, f"sglang {rel}: is_capture_mode is in none of {[m for m, _ in sglang_api.CAPTURE_MODE]}{r.moved('is_capture_mode')}"
    assert "model_capture_mode" in r.source(where[0]), f"sglang {rel}: {where[0]} has no model_capture_mode"
    # where get_is_capture_mode also answers inside a breakable graph (its replay too), the hook
    # tells the two apart through the breakable flag's own getter
    if "is_in_breakable_cuda_graph" in r.source(where[0]):
        _function(r, *sglang_api.BREAKABLE)
    _function(r, *sglang_api.RANK)
    assert any(r.path(m) and any(isinstance(n, ast.FunctionDef) and n.name == f for n in r.tree(m).body)
               for m, f in sglang_api.SERVER_ARGS), f"sglang {rel}: no server-args accessor{r.moved('get_server_args')}"
    args = r.source("sglang.srt.server_args") + "".join(
        r.zip.read(n).decode() for n in r.names if n.startswith("sglang/srt/arg_groups/fields/") and n.endswith(".py"))
    flag = sglang_api.no_graph_flag(rel)
    assert re.search(rf"\b{flag[2:].replace('-', '_')}\b", args), f"sglang {rel}: no {flag} option"
    assert re.search(r"\battention_backend\b", args), f"sglang {rel}: no --attention-backend option"
