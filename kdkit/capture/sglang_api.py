"""Every name the plugin takes from SGLang, in one place (tests/test_capture_contract.py checks each
against the source of the oldest and the newest supported release).

Read in SGLang 0.5.11 (the first release with the plugin system; 0.5.10 has none), 0.5.15.post1
and 0.5.23. Nothing here imports sglang at module import: the functions look things up when the
server calls them, inside a process that already runs SGLang.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import re
import sys

OLDEST, NEWEST = "0.5.11", "0.5.23"

# plugin system (sglang/srt/plugins): load_plugins() calls each entry point of this group with no
# arguments; HookRegistry.register(target, fn, HookType.AROUND) makes the target call
# fn(original, self, *args, **kwargs)
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGINS_MODULE = "sglang.srt.plugins"
HOOKS_MODULE = "sglang.srt.plugins.hook_registry"
BACKEND_MODULE = "sglang.srt.layers.attention.triton_backend"
BACKEND_CLASS = "TritonAttnBackend"
TARGET = f"{BACKEND_MODULE}.{BACKEND_CLASS}.forward_extend"
FORWARD_EXTEND_ARGS = ("self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache", "sinks")
# forward_extend launches the kernel through this instance attribute (set in __init__ to
# torch.compiler.disable(extend_attention_fwd)); 0.5.23 goes through _forward_extend_kernel,
# which calls it with the same arguments unless a dLLM backend is configured
KERNEL_ATTR = "extend_attention_fwd"
# its positional parameters, in the order forward_extend passes them (same in every release)
KERNEL_ARGS = ("q_extend", "k_extend", "v_extend", "o_extend", "k_buffer", "v_buffer", "qo_indptr",
               "kv_indptr", "kv_indices", "custom_mask", "is_causal", "mask_indptr", "max_len_extend",
               "k_scale", "v_scale", "sm_scale")
# keywords forward_extend passes that change the math; kdkit handles only their neutral values
KERNEL_KWARGS = ("logit_cap", "sliding_window_size", "sinks", "window_kv_offsets", "xai_temperature_len")
# backend attributes read by the plugin
BACKEND_ATTRS = ("forward_metadata", "max_context_len")
METADATA_FIELDS = ("qo_indptr", "kv_indptr", "kv_indices", "custom_mask", "mask_indptr", "max_extend_len")
FORWARD_BATCH_FIELDS = ("forward_mode", "out_cache_loc", "seq_lens", "seq_lens_sum")
LAYER_ATTRS = ("layer_id",)
# CUDA-graph capture flag (True during the warm-up passes and the torch.cuda.graph pass): the
# module variable, not get_is_capture_mode(), which from 0.5.15 is also True inside a breakable
# CUDA graph's *replay*, where attention runs eagerly on the real batch
CAPTURE_MODE = (("sglang.srt.model_executor.runner_utils.capture_mode", "is_capture_mode"),  # >= 0.5.14
                ("sglang.srt.model_executor.cuda_graph_runner", "is_capture_mode"))          # <= 0.5.13
# inside a breakable CUDA graph (its capture or its replay): >= 0.5.15
BREAKABLE = ("sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context",
             "is_in_breakable_cuda_graph")
# TP rank; 0.5.23's sglang.srt.distributed no longer re-exports it, parallel_state has it in all
RANK = ("sglang.srt.distributed.parallel_state", "get_tensor_model_parallel_rank")
SERVER_ARGS = (("sglang.srt.runtime_context", "get_server_args"),   # >= 0.5.2x (0.5.23)
               ("sglang.srt.server_args", "get_global_server_args"))  # 0.5.11 .. 0.5.15 (retired in 0.5.23: raises)
# the launch flag that keeps verify out of CUDA graphs, by release
NO_GRAPH_FLAG_OLD, NO_GRAPH_FLAG = "--disable-cuda-graph", "--disable-decode-cuda-graph"  # <= 0.5.13 has only the first


def _lookup(module: str, name: str):
    mod = sys.modules.get(module) or importlib.import_module(module)
    return getattr(mod, name)


def in_graph_capture() -> bool:
    """True while SGLang captures a CUDA graph (its warm-up passes included) or while the current
    stream is capturing; False at a breakable graph's replay (real data, eager attention)."""
    for module, name in CAPTURE_MODE:
        try:
            if _lookup(module, name):
                return True
            break
        except (ImportError, AttributeError):
            continue
    import torch
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def in_breakable_graph() -> bool:
    """Inside a breakable CUDA graph (SGLang >= 0.5.15's default prefill graphs), whose replay
    calls attention eagerly: its capture passes can be skipped, the replays seen."""
    try:
        return bool(_lookup(*BREAKABLE)())
    except (ImportError, AttributeError):
        return False


def tp_rank() -> tuple[int, str]:
    """(rank, where it came from): SGLang's TP group, else torch.distributed, else 0."""
    try:
        return int(_lookup(*RANK)()), "sglang"
    except Exception:  # groups not built in this process (a test, an offline engine)
        pass
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), "torch.distributed"
    return 0, "default (no TP group in this process)"


def model_name() -> str | None:
    """served_model_name, else the last part of model_path, from the server args in force."""
    for module, name in SERVER_ARGS:
        try:
            args = _lookup(module, name)()
        except Exception:
            continue
        for attr in ("served_model_name", "model_path"):
            val = getattr(args, attr, None)
            if isinstance(val, str) and val.strip():
                return val.rstrip("/").split("/")[-1]
    return None


def release() -> str | None:
    """The installed SGLang release, from its metadata (never imports sglang)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _version_tuple(rel: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", rel)[:3])


def no_graph_flag(rel: str | None) -> str:
    """The flag that turns decode/verify CUDA graphs off in `rel` (None: the newest's)."""
    if rel and _version_tuple(rel) < (0, 5, 14):
        return NO_GRAPH_FLAG_OLD
    return NO_GRAPH_FLAG


def has_plugin_system(rel: str | None) -> bool:
    return rel is None or _version_tuple(rel) >= _version_tuple(OLDEST)
