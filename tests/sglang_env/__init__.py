"""Tests of the capture plugin on SGLang's real code path (run in .venv-sglang; see conftest.py)."""
