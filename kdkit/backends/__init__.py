"""Backends: one contract for all of them.

A backend is a module with
  NAME                                the registry name
  unavailable(case=None) -> str|None  why it cannot run here (one line with the fix), or None.
                                      No side effects: it sets no environment variable and loads
                                      no kernel; it only looks (find_spec, files on disk, devices).
  run(case, *, opt=default, ...)      -> Result. Options are keyword-only parameters with
                                      defaults, never **kwargs: they are the backend's declared
                                      options, read off the signature (`options(name)`).
                                      run never mutates the case and does not lint it (replay
                                      lints once).
  LINT_CLEAN = True (optional)        replay runs it only on cases without lint errors (a kernel
                                      that a mis-marshaled case could make read out of bounds).
  LABEL (optional)                    a short human label for tables and figures ("SGLang Triton
                                      extend"); `label(name)` falls back to NAME.
  BENCH = False (optional)            a reference, not a kernel (the oracle, a stored output):
                                      `kdkit bench` leaves it out of its default set.
  prepare(case, *, opt=default, ...)  (optional) -> Prepared: the call made ready for timing, with
                                      the same declared options as run. Prepared.launch() only
                                      launches: inputs and outputs are already on the device, no
                                      host sync, no allocation, no device read; Prepared.result()
                                      is the Result of the last launch; graph_safe says whether a
                                      launch may be captured in a CUDA graph and replayed.
and its Result.info["ran"] is one line saying what ran (release, device, build, splits), which
replay and the report print as they are.

Time backends through `prepare(name, case, **opts)`: options and availability are checked as for
`run`, and a backend without its own prepare is wrapped so that each launch is a whole run()
(host work and copies included; its info["timed"] says so).

Call backends through `run(name, case, **opts)`: unknown options are refused here, the same way
for every backend, before anything runs; an unavailable backend raises BackendUnavailable.
`resolve("all" | "a,b" | [names])` turns a --backends value into names, for the CLI and notebooks;
names and specs (an installed entry point, package.module:attr, path/to/file.py[:attr]) and
`register(name, obj)` are kdkit.backends.registry's.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from . import registry
from .registry import BACKENDS, BackendSpecError, register, unregister


@dataclass
class Result:
    out: torch.Tensor                 # [T, H, 512], any float dtype, any device
    lse: torch.Tensor | None = None   # [T, H] natural-log LSE of the scaled (capped) logits
    info: dict = field(default_factory=dict)  # details; info["ran"]: one line saying what ran

    @property
    def ran(self) -> str:
        return str(self.info.get("ran", ""))


@dataclass
class Prepared:
    """A backend's call made ready for timing (see the module's docstring)."""
    launch: Callable[[], None]      # launch only: no host sync, no allocation, no device read
    result: Callable[[], Result]    # the output of the last launch (the bench judges it first)
    graph_safe: bool = False        # launch may be captured in a CUDA graph and replayed
    info: dict = field(default_factory=dict)   # info["ran"]; the cuda backend adds nsplit, module
    # the host planning step on its own (what a server redoes once per batch, not per layer), where
    # the backend has one: the bench reports its host time as plan_us
    plan: Callable[[], object] | None = None


@dataclass(frozen=True)
class LiveBatch:
    """What a live pair's plan(batch) gets (kdkit.capture.live has the pair's contract; the byok
    adapters plan their run/prepare from one too): the batch's metadata in SGLang's layout. Request b's prefix rows are
    kv_buffer[kv_indices[kv_indptr[b]:kv_indptr[b+1]]], its draft rows k[qo_indptr[b]:qo_indptr[b+1]]
    (rows of the pool too, written by this step); custom_mask[mask_indptr[b]:] holds its
    [q_len, prefix + q_len] visibility row-major (None: causal or full, as `causal` says). The
    tensors are on the server's device; the ints are host-side bounds."""
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: torch.Tensor | None
    mask_indptr: torch.Tensor | None
    batch_size: int
    num_tokens: int
    num_heads: int
    max_q_len: int
    max_kv_len: int          # a bound on prefix + q_len of every request (not the exact maximum)
    sm_scale: float
    logit_cap: float
    causal: bool
    dtype: torch.dtype       # q's, k's and the pool's
    device: torch.device
    capturing: bool          # inside CUDA-graph capture: a graph keeps pointing into the plan


class BackendUnavailable(RuntimeError):
    """This backend cannot run here; the message says why and how to make it available."""


def get(name: str):
    """The backend registered as `name` (or the one a spec names): BackendSpecError if none."""
    return registry.get(name)


def resolve(spec: str | Iterable[str]) -> list[str]:
    """Backend names from a --backends value: "all" (every registered and installed backend; those
    that cannot run here become skipped rows with their reason), "oracle,torch,mine.py:backend", or
    a list of names and specs. Duplicates are dropped, order kept; BackendSpecError (a ValueError)
    in one line for an unknown name, a spec that does not resolve, or an empty selection."""
    return registry.resolve(spec)


def options(name: str) -> dict:
    """The options `name` takes: keyword -> default, read off its run() signature."""
    params = inspect.signature(get(name).run).parameters.values()
    return {p.name: p.default for p in params
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "case"}


def check_options(name: str, opts: dict) -> None:
    """TypeError naming the backend, the unknown options and the ones it takes."""
    known = options(name)
    bad = sorted(set(opts) - set(known))
    if bad:
        takes = ", ".join(known) if known else "no options"
        raise TypeError(f"{name}: unknown option(s) {', '.join(bad)}; this backend takes {takes}")


def unavailable(name: str, case=None) -> str | None:
    """None if `name` can run on this machine, else one line saying why and how to fix it."""
    try:
        mod = get(name)
    except ImportError as e:
        return f"{name}: cannot import ({e})"
    except registry.BackendSpecError as e:  # an installed backend listed by 'all' that does not load
        return f"{name}: {e}"
    return mod.unavailable(case)


def label(name: str) -> str:
    """`name`'s LABEL for tables and figures; its NAME where it has none, or where it is not a
    backend of this kdkit (a results file from another checkout)."""
    try:
        mod = get(name)
    except (KeyError, ImportError, registry.BackendSpecError):
        return name
    return str(getattr(mod, "LABEL", mod.NAME))


def benched() -> list[str]:
    """The backends `kdkit bench` times by default: every registered one but the references
    (BENCH = False)."""
    return [n for n in BACKENDS if getattr(get(n), "BENCH", True)]


def needs_clean_case(name: str) -> bool:
    try:
        return bool(getattr(get(name), "LINT_CLEAN", False))
    except registry.BackendSpecError:  # an installed backend that does not load: its run says so
        return False


def run(name: str, case, **opts) -> Result:
    """Run one backend: options checked, availability checked, then the backend's run."""
    check_options(name, opts)
    why = unavailable(name, case)
    if why:
        raise BackendUnavailable(why)
    return _said_what_ran(name, get(name).run(case, **opts))


def _said_what_ran(name: str, res: Result) -> Result:
    ran = res.info.get("ran") if isinstance(res.info, dict) else None
    if not isinstance(ran, str) or not ran.strip() or "\n" in ran:
        # the contract, not a guess: a backend that does not say what it ran is a kdkit bug
        raise TypeError(f"{name}: Result.info['ran'] must be one line saying what ran, got {ran!r}")
    return res


def prepare(name: str, case, **opts) -> Prepared:
    """One backend made ready for timing: options and availability checked as in `run`, then its
    own prepare; a backend without one is wrapped so that each launch is a whole run() (host work
    and copies included, never graph-safe; info["timed"] says so). result() checks info["ran"]."""
    check_options(name, opts)
    why = unavailable(name, case)
    if why:
        raise BackendUnavailable(why)
    mod = get(name)
    if hasattr(mod, "prepare"):
        p = mod.prepare(case, **opts)
    else:
        last: list[Result] = []

        def launch():
            last[:] = [mod.run(case, **opts)]

        def result():
            if not last:
                raise RuntimeError(f"{name}: result() before the first launch")
            return last[0]
        p = Prepared(launch, result, graph_safe=False, info={"timed": "run() whole, host work included"})
    result = p.result
    return Prepared(p.launch, lambda: _said_what_ran(name, result()), p.graph_safe, p.info, p.plan)


__all__ = ["BACKENDS", "Result", "Prepared", "BackendUnavailable", "BackendSpecError", "get", "resolve",
           "register", "unregister", "options", "check_options", "unavailable", "label", "benched",
           "needs_clean_case", "run", "prepare"]
