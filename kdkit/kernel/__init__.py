"""kdkit's MLA tree-verify kernel: CUDA sources (cuda/), their build spec (spec.py, params.py,
jit.py), the mutants (mutants.py), and the host API (api.py: plan once per batch with the problem
and one PlanOptions, run per layer; launch.py: the driver launch run() ends in)."""
from .api import Metadata, Plan, bind, plan, run, unavailable
from .checks import InputError
from .mutants import MUTANTS
from .options import PlanOptions

__all__ = ["Metadata", "Plan", "PlanOptions", "bind", "plan", "run", "unavailable", "InputError",
           "MUTANTS"]
