"""kdkit: capture, replay and validate the MLA tree-verify attention kernel SGLang needs."""
__version__ = "0.1.0"
