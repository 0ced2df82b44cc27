"""kdkit inside a live SGLang server: an SGLang plugin that captures, validates or replaces the
MLA attention of TritonAttnBackend.forward_extend on every TP rank, without ever hurting the server.

  settings.py       KDKIT_* environment settings (a bad value stops start-up with one line)
  sglang_api.py     every SGLang name the plugin relies on (checked against the releases' source)
  record.py         kernel-call arguments -> snapshot (async device-to-host) -> Case
  store.py          file names, the folder's budget, the writer thread
  kernels.py        what validate/replace run: kdkit's CUDA kernel (plan per batch, run per layer)
  hook.py           the AROUND hook: selection, the per-call kernel tap, the three modes
  plugin.py         the entry point SGLang's load_plugins() calls; the sitecustomize installation
  installer.py      writes sitecustomize.py for SGLang without the plugin system
`kdkit capture env | sitecustomize DIR` is kdkit/cli/capture.py. Importing this package imports
neither torch nor SGLang.
"""
