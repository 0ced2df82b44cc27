"""Design probes: measurements of a kernel design or of a reference kernel on this GPU, not
backends (nothing in kdkit calls them); `python -m kdkit.perf.probes.<name>`. benchmarks/LOG.md
has what they measured. ws_step.cu is package data (pyproject.toml)."""
