"""tests/sglang_env runs in the second environment that `make test` builds (.venv-sglang: SGLang
itself, installed --no-deps, plus the pure-Python packages its attention backend imports), with
KDKIT_SGLANG_ENV=1. The main suite's environment has no importable SGLang server code, so these
files are not collected there."""
from __future__ import annotations

import os


def pytest_ignore_collect(collection_path, config):
    if os.environ.get("KDKIT_SGLANG_ENV") != "1" and collection_path.name.startswith("test_"):
        return True
    return None
