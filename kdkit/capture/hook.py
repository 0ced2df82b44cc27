"""The AROUND hook on TritonAttnBackend.forward_extend: capture, validate, replace.

For a selected call (forward mode, layer, one step in KDKIT_EVERY) the hook lends the backend a
tap in place of its `extend_attention_fwd` for the duration of that one call. forward_extend then
does everything it always does (writes this step's K into the pool, allocates the output, picks
the metadata) and calls the tap with the kernel's exact arguments:

  capture   the real kernel runs, then its inputs and output are snapshotted for a case file;
  validate  the real kernel runs, then KDKIT_KERNEL's (kdkit.capture.live) on the same arguments;
            the seed's line is logged and the case written when rel exceeds KDKIT_REL_THRESHOLD,
            or when that kernel raises or returns what cannot stand beside the real output;
  replace   KDKIT_KERNEL's live pair writes the output instead (the real kernel runs only if it
            refuses or raises).

The server is never hurt: during CUDA-graph capture (and its warm-up passes) capture and validate
pass straight through and say once why; anything kdkit raises is logged once per kind and the
real output is returned; a full disk, a read-only folder or a reached budget stops capturing
with one line; nothing is ever overwritten.
"""
from __future__ import annotations

import logging
import sys
import threading
import weakref

import torch

from .. import backends as backends_mod
from .. import case as case_mod
from ..judge import compare
from . import live as live_mod
from . import record, sglang_api
from .settings import Settings
from .store import Store, Writer

log = logging.getLogger("kdkit.capture")


def _setup_logging() -> None:
    """Lines go to stderr as written ('[kdkit] ...'), whatever SGLang did to the root logger."""
    if not any(getattr(h, "_kdkit", False) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(message)s"))
        h._kdkit = True
        log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False


class Once:
    """Say a thing once per key (per process)."""

    def __init__(self):
        self.seen: set = set()

    def __call__(self, key, msg: str) -> None:
        if key not in self.seen:
            self.seen.add(key)
            log.warning(msg)


class _Call:
    """What the hook decided about one forward_extend call."""
    __slots__ = ("mode", "layer", "step", "batch", "forward_mode", "capturing", "fired")

    def __init__(self, mode, layer, step, batch, forward_mode, capturing):
        self.mode, self.layer, self.step, self.batch = mode, layer, step, batch
        self.forward_mode, self.capturing, self.fired = forward_mode, capturing, False


def _arg(args, kwargs, name):
    i = sglang_api.FORWARD_EXTEND_ARGS.index(name) - 1  # args come without self
    return args[i] if len(args) > i else kwargs.get(name)


class Hook:
    def __init__(self, settings: Settings, live: live_mod.Live | None = None):
        _setup_logging()
        self.s = settings
        self.say = Once()
        self.store = Store(settings.dir, settings.max_cases, settings.max_bytes, self.say,
                           min_free=settings.min_free) if settings.writes else None
        self.writer = Writer(self.store, self._build, self._fault) if self.store else None
        # what validate and replace run (resolved and checked at plugin start: plugin.kernel_or_stop)
        self.live = live if live is not None or settings.mode not in ("validate", "replace") else \
            live_mod.load(settings.kernel, settings.mode)
        self.step = -1
        self._batch = None          # weakref of the last forward batch counted as a step
        self._last_layer = -1       # the layer of the last selected call
        self._rank = None
        self._model = None
        self.faults: dict = {}      # kind -> count
        self._lend_locks: dict = {}  # id(backend) -> the lock held while a tap is lent to it
        self._locks_lock = threading.Lock()

    # ---- names -----------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        if self._rank is None:
            rank, src = sglang_api.tp_rank()
            if src != "sglang":
                self.say("rank", f"[kdkit] TP rank from {src}: {rank} (SGLang's TP group is not built in this process)")
            self._rank = rank
        return self._rank

    @property
    def model(self) -> str:
        if self._model is None:
            self._model = self.s.model or sglang_api.model_name() or "model"
        return self._model

    def _fault(self, kind: str, e: BaseException) -> None:
        key = (kind, type(e).__name__)
        self.faults[key] = self.faults.get(key, 0) + 1
        first = (str(e).splitlines() or [""])[0][:300]
        self.say(("fault",) + key, f"[kdkit] r{self._rank if self._rank is not None else '?'}: {kind} failed: "
                 f"{type(e).__name__}: {first}; the real output was returned (said once per kind)")

    # ---- selection -------------------------------------------------------------------------
    def _new_step(self, batch, layer_id: int) -> bool:
        """A new forward pass: another batch object, or (a graph replay reuses one static batch)
        the same one back at a layer it has passed already (layers run in order in a pass)."""
        last = self._batch() if self._batch is not None else None
        seen, self._last_layer = self._last_layer, layer_id
        if last is batch and layer_id > seen:
            return False
        try:
            self._batch = weakref.ref(batch)
        except TypeError:  # not weak-referenceable: fall back to identity of the live object
            self._batch = (lambda b=batch: b)
        self.step += 1
        return True

    def _select(self, args, kwargs) -> _Call | None:
        s = self.s
        layer, batch = _arg(args, kwargs, "layer"), _arg(args, kwargs, "forward_batch")
        fmode = getattr(getattr(batch, "forward_mode", None), "name", "").lower()
        if fmode not in s.forward_modes:
            return None
        layer_id = int(layer.layer_id)
        if layer_id not in s.layers:
            return None
        capturing = sglang_api.in_graph_capture()
        if capturing and s.mode != "replace" and sglang_api.in_breakable_graph():
            return None  # a breakable graph's capture pass (dummy data): its replays call this again
        if capturing and s.mode != "replace":
            self.say("graph", f"[kdkit] {fmode} runs from CUDA graphs in this server: SGLang calls "
                     f"forward_extend only while it captures them (warm-up passes on dummy data, then "
                     f"the capture), never at replay, so {s.mode} passes these calls through. Launch with "
                     f"{sglang_api.no_graph_flag(sglang_api.release())} to {s.mode} real traffic.")
            return None
        if not capturing:
            self._new_step(batch, layer_id)
        if s.mode != "replace":
            if self.step % s.every:
                return None
            if s.mode == "capture" and self.store.stopped:
                return None
        return _Call(s.mode, layer_id, self.step, batch, fmode, capturing)

    # ---- the hook --------------------------------------------------------------------------
    def __call__(self, original, backend, *args, **kwargs):
        try:
            call = self._select(args, kwargs)
        except Exception as e:
            self._fault("select", e)
            call = None
        if call is None:
            return original(backend, *args, **kwargs)
        attr = sglang_api.KERNEL_ATTR
        # The tap is lent on the backend object, which every thread shares: one lent tap per
        # backend at a time (a second selected call waits, so neither restores the other's tap as
        # the real kernel), and a call from another thread that meets the tap gets the real kernel
        # (its arguments are not this call's). SGLang runs one forward thread per backend, so
        # neither happens there. (The step count in _select still assumes one forward thread.)
        owner = threading.get_ident()
        with self._lend_lock(backend):
            try:
                own = attr in vars(backend)
                real = getattr(backend, attr)
            except Exception as e:  # a backend without the kernel attribute: SGLang's own path
                self._fault("lending the kernel", e)
                return original(backend, *args, **kwargs)

            def tap(*a, **kw):
                if threading.get_ident() != owner:
                    return real(*a, **kw)
                return self._on_kernel(call, backend, real, a, kw)

            setattr(backend, attr, tap)
            try:
                return original(backend, *args, **kwargs)
            finally:
                if own:
                    setattr(backend, attr, real)
                else:
                    delattr(backend, attr)
                if not call.fired:
                    self.say(("path", call.layer), f"[kdkit] forward_extend of layer {call.layer} did not "
                             f"call {attr} (deterministic inference, DCP, fp8 prefill or a vendor verify "
                             "kernel?): kdkit saw nothing of it")

    def _lend_lock(self, backend) -> threading.RLock:
        with self._locks_lock:  # (a backend lives as long as its server: a handful per process)
            return self._lend_locks.setdefault(id(backend), threading.RLock())

    def _on_kernel(self, c: _Call, backend, real, a, kw):
        c.fired = True
        try:
            kc = record.KernelCall.bind(a, kw)
            why = kc.unsupported()
        except Exception as e:
            self._fault("reading the kernel arguments", e)
            return real(*a, **kw)
        if why:
            self.say(("unsupported", why[:48]), f"[kdkit] layer {c.layer}: {why}; passed through")
            return real(*a, **kw)
        if c.mode == "replace":
            try:
                self.live.pair.run(kc, self._max_kv_len(backend, c, kc), c.capturing, out=kc.o)
                return None
            except record.Unsupported as e:
                self.say(("unsupported", str(e)[:48]), f"[kdkit] layer {c.layer}: {e}; Triton serves it")
            except Exception as e:
                self._fault("replace", e)
            return real(*a, **kw)
        result = real(*a, **kw)
        try:
            if c.mode == "capture":
                self._capture(c, kc)
            else:
                self._validate(c, kc, backend)
        except record.Unsupported as e:
            self.say(("unsupported", str(e)[:48]), f"[kdkit] layer {c.layer}: {e}; passed through")
        except Exception as e:
            self._fault(c.mode, e)
        return result

    # ---- the modes -------------------------------------------------------------------------
    @staticmethod
    def _max_kv_len(backend, c: _Call, kc: record.KernelCall) -> int:
        """A bound on prefix + q_len from the host: the batch's seq_lens_cpu when it is real, else
        the model's context length (what CUDA-graph buffers are sized for). Only the split count
        depends on it, never the result."""
        cpu = getattr(c.batch, "seq_lens_cpu", None)
        if not c.capturing and isinstance(cpu, torch.Tensor) and cpu.numel():
            return int(cpu.max()) + kc.max_len_extend
        return int(getattr(backend, "max_context_len", 0) or 131072) + kc.max_len_extend

    def _meta(self, c: _Call, note: str) -> dict:
        dev = c.batch.out_cache_loc.device
        gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        return case_mod.new_meta("captured", model=self.model, layer_id=c.layer, tp_rank=self.rank,
                                 step=c.step, forward_mode=c.forward_mode,
                                 sglang_version=sglang_api.release(), gpu=gpu, note=note)

    def _snapshot(self, c: _Call, kc: record.KernelCall, note: str) -> record.Snapshot:
        return record.snapshot(kc, c.batch, self._meta(c, note), self.say)

    def _submit(self, snap: record.Snapshot) -> None:
        if not self.writer.submit(snap):
            self._behind()

    def _behind(self) -> None:
        self.say("queue-full", f"[kdkit] the case writer is behind ({self.writer.dropped} captures "
                 "dropped so far; the server never waits for it): capture fewer calls (KDKIT_EVERY, KDKIT_LAYERS)")

    def _room(self) -> bool:
        """Whether a snapshot would be kept: asked before taking one, since a snapshot gathers the
        request's pool rows on the GPU and pins host memory for them (gigabytes at long context),
        all of it thrown away when the writer's queue is full."""
        if self.writer.has_room():
            return True
        self.writer.dropped += 1
        self._behind()
        return False

    def _capture(self, c: _Call, kc: record.KernelCall) -> None:
        if self.store.stopped:  # said once when it stopped; the writer checks the budget per file
            return
        if self._room():
            self._submit(self._snapshot(c, kc, "kdkit capture: the live Triton call's inputs and output"))

    def _validate(self, c: _Call, kc: record.KernelCall, backend) -> None:
        T, H = kc.q.shape[0], kc.num_heads
        ref = kc.o.reshape(T, H, -1)
        snap = case = None
        if self.live.pair is None:  # run(case) on the call's case (kdkit's part: its faults are kdkit's)
            snap = self._snapshot(c, kc, "")
            case = record.build_case(snap)
        try:
            if case is not None:
                out = backends_mod.run(self.live.name, case).out
            else:  # into NaN: a kernel that leaves part of its output unwritten shows
                out = torch.full(ref.shape, float("nan"), dtype=ref.dtype, device=ref.device)
                out = self.live.pair.run(kc, self._max_kv_len(backend, c, kc), capturing=False, out=out)
            fault = live_mod.fault_in(out, ref)
        except record.Unsupported:
            raise
        except backends_mod.BackendUnavailable as e:  # the backend says it cannot run this case
            raise record.Unsupported(str(e)) from None
        except Exception as e:  # the kernel's own fault: the server has Triton's output regardless
            fault = type(e).__name__, f"raised {type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
        if fault is not None:
            self._kernel_fault(c, kc, snap, *fault)
            return
        # float64 on the host, the same numbers `kdkit replay` prints (one sync: validate is a
        # debugging mode, it reads three numbers per selected call)
        m = compare.metrics(out, ref)
        label = f"L{c.layer} r{self.rank} s{c.step}"
        log.info(compare.seed_line(label, m))
        if not (m.rel <= self.s.rel_threshold):  # NaN/inf fail too
            self._write_failure(c, kc, snap, f"kdkit validate: KDKIT_KERNEL={self.s.kernel} against the live "
                                f"Triton output: max_abs_diff={m.max_abs:.4e} mean={m.mean_abs:.4e} "
                                f"rel={m.rel:.4e} (threshold {self.s.rel_threshold:g})")

    def _kernel_fault(self, c: _Call, kc: record.KernelCall, snap, kind: str, what: str) -> None:
        """KDKIT_KERNEL raised or returned what cannot be compared: counted, said once per kind,
        and the case written (it replays offline: `kdkit replay CASE --backends SPEC`)."""
        key = ("validate", kind)
        self.faults[key] = self.faults.get(key, 0) + 1
        self.say(("fault",) + key, f"[kdkit] r{self.rank}: validate failed: KDKIT_KERNEL={self.s.kernel} {what} "
                 f"(L{c.layer} s{c.step}); the real output was returned and the case written (said once per kind)")
        self._write_failure(c, kc, snap, f"kdkit validate: KDKIT_KERNEL={self.s.kernel} {what}")

    def _write_failure(self, c: _Call, kc: record.KernelCall, snap, note: str) -> None:
        if self.store is None or self.store.stopped or (snap is None and not self._room()):
            return
        if snap is None:
            snap = self._snapshot(c, kc, note)
        else:
            snap.meta["note"] = note
        self._submit(snap)

    def _build(self, snap: record.Snapshot):
        case = record.build_case(snap)
        m = snap.meta
        return case, m["model"], m["layer_id"], m["tp_rank"], m["step"]

    def close(self) -> None:
        """Write what is queued (bounded wait)."""
        if self.writer is not None:
            self.writer.drain()
