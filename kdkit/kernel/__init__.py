"""kdkit's MLA tree-verify kernel: CUDA sources (cuda/), their build spec (spec.py, params.py,
jit.py), the mutants (mutants.py), and the host API (api.py: plan once per batch, run per layer)."""
from .api import Metadata, Plan, plan, run, unavailable
from .checks import InputError
from .mutants import MUTANTS

__all__ = ["Metadata", "Plan", "plan", "run", "unavailable", "InputError", "MUTANTS"]
