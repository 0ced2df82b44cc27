"""Where captured cases go: file names, the folder's budget, and the writer thread.

Names: `<model>-L<layer>-r<rank>-s<step>.pt`; a name that exists (a restarted server counts its
steps from 0 again, another run wrote the same folder) is never overwritten: the case gets
`-2`, `-3`, ... before `.pt`. Every rank of a server writes the same folder.

The budget (KDKIT_MAX_CASES, KDKIT_MAX_BYTES, default 20 GiB: kdkit.capture.settings says why)
counts the case files in the folder, all ranks together, re-read before each write and checked
against the file's real size (the case is serialised in memory first); a write that would pass it
is not made and capturing stops with one line. So does a write that would leave the folder's file
system with less than KDKIT_MIN_FREE (default 2 GiB) free. Ranks check and write independently, so
with R ranks writing at the same moment the folder can pass either budget (count or bytes) by at
most R-1 files.

The writer is a daemon thread fed through a short queue: the server's thread only enqueues host
copies (kdkit.capture.record.Snapshot); waiting for the copies, building the case, compacting
the pool and writing the file all happen here. When the queue is full the capture is dropped
(said once) rather than making the server wait. At exit the queue is drained.
"""
from __future__ import annotations

import atexit
import errno
import logging
import os
import queue
import re
import shutil
import sys
import threading
from pathlib import Path

log = logging.getLogger("kdkit.capture")

NAME_RE = re.compile(r"^(?P<model>.+)-L(?P<layer>\d+)-r(?P<rank>\d+)-s(?P<step>\d+)(?:-(?P<n>\d+))?\.pt$")
# errors that mean "this folder takes no more files": stop capturing, keep serving
STOP_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EFBIG}
QUEUE_DEPTH = 16
DRAIN_SECONDS = 60.0


def safe_model(name: str | None) -> str:
    """A model name fit for a file name: 'moonshotai/Kimi-K2.6' -> 'Kimi-K2.6'."""
    base = (name or "model").rstrip("/").split("/")[-1]
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", base).strip("._") or "model"


def case_name(model: str, layer: int, rank: int, step: int, n: int = 1) -> str:
    tail = f"-{n}" if n > 1 else ""
    return f"{safe_model(model)}-L{layer}-r{rank}-s{step}{tail}.pt"


def usage(folder: Path) -> tuple[int, int]:
    """(case files, their bytes) in `folder` (names as case_name writes them)."""
    count = size = 0
    try:
        with os.scandir(folder) as it:
            for e in it:
                if NAME_RE.match(e.name) and e.is_file(follow_symlinks=False):
                    count += 1
                    try:
                        size += e.stat(follow_symlinks=False).st_size
                    except OSError:
                        pass
    except FileNotFoundError:
        pass
    return count, size


class Stopped(Exception):
    """Capturing has stopped for good in this process (the reason is the message)."""


class Store:
    """The folder, its budget, and the rule that nothing is overwritten."""

    def __init__(self, folder: Path, max_cases: int | None, max_bytes: int | None, say=None, min_free: int = 0):
        self.folder = Path(folder)
        self.max_cases = max_cases
        self.max_bytes = max_bytes
        self.min_free = min_free
        self.stopped: str | None = None   # why writing stopped (None while it goes on)
        self.written: list[Path] = []
        self._say = say or (lambda key, msg: log.warning(msg))
        self._lock = threading.Lock()

    def stop(self, why: str) -> None:
        with self._lock:
            if self.stopped is None:
                self.stopped = why
                self._say("stopped", f"[kdkit] capturing stopped: {why}")

    def prepare(self) -> None:
        """Make the folder (at start-up); a folder that cannot be made stops capturing, not the server."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self.stop(f"cannot create {self.folder}: {e.strerror or e}")
            return
        if not os.access(self.folder, os.W_OK | os.X_OK):
            self.stop(f"{self.folder} is not writable (read-only?); no case will be written")

    def check_budget(self, new_bytes: int) -> None:
        """Raise Stopped if one more file of `new_bytes` would pass the budget or the free-space floor."""
        if self.stopped:
            raise Stopped(self.stopped)
        if self.max_cases is not None or self.max_bytes is not None:
            count, size = usage(self.folder)
            if self.max_cases is not None and count >= self.max_cases:
                self.stop(f"KDKIT_MAX_CASES={self.max_cases} reached ({count} case files in {self.folder})")
            elif self.max_bytes is not None and size + new_bytes > self.max_bytes:
                self.stop(f"KDKIT_MAX_BYTES={self.max_bytes} reached ({size} bytes of case files in "
                          f"{self.folder}, the next would add {new_bytes})")
        if not self.stopped and self.min_free:
            try:
                free = shutil.disk_usage(self.folder).free
            except OSError:
                free = None  # the write itself will say what is wrong with the folder
            if free is not None and free - new_bytes < self.min_free:
                self.stop(f"KDKIT_MIN_FREE={self.min_free}: {free} bytes free on the disk of {self.folder}, "
                          f"the next case ({new_bytes} bytes) would leave less")
        if self.stopped:
            raise Stopped(self.stopped)

    def write(self, case, model: str, layer: int, rank: int, step: int) -> Path | None:
        """Save `case` under the first free name; None (and capturing stopped) on a full disk, a
        read-only folder or a reached budget."""
        if self.stopped:
            return None
        for n in range(1, 1000):
            path = self.folder / case_name(model, layer, rank, step, n)
            if os.path.lexists(path):
                continue
            case.meta["case_id"] = path.stem
            data = case.to_bytes(path)  # the real size, for the budget
            try:
                self.check_budget(len(data))
            except Stopped:
                return None
            try:
                saved = case.save(path, data=data)
            except FileExistsError:  # another process took the name meanwhile: try the next
                continue
            except OSError as e:
                if e.errno in STOP_ERRNOS:
                    self.stop(f"cannot write {path}: {e.strerror or e} (errno {errno.errorcode.get(e.errno, e.errno)})")
                    return None
                raise
            self.written.append(saved)
            return saved
        raise FileExistsError(f"{self.folder}: 999 files named like {case_name(model, layer, rank, step)}")


class Writer:
    """A daemon thread that turns snapshots into case files, off the server's thread."""

    def __init__(self, store: Store, build, on_error):
        self.store = store
        self._build = build          # snapshot -> (case, model, layer, rank, step) or None
        self._on_error = on_error    # (kind, exception) -> None, logs once per kind
        self._q: queue.Queue = queue.Queue(maxsize=QUEUE_DEPTH)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="kdkit-capture-writer", daemon=True)
                self._thread.start()
                atexit.register(self.drain)

    def has_room(self) -> bool:
        """Whether submit() would take a snapshot now (the queue is not full)."""
        return not self._q.full()

    def submit(self, snap) -> bool:
        """Hand a snapshot to the thread; False (dropped) if the queue is full."""
        self._start()
        try:
            self._q.put_nowait(snap)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def _loop(self) -> None:
        while True:
            snap = self._q.get()
            try:
                if snap is None:
                    return
                self.write_now(snap)
            finally:
                self._q.task_done()

    def write_now(self, snap) -> Path | None:
        try:
            built = self._build(snap)
            if built is None:
                return None
            return self.store.write(*built)
        except Exception as e:  # never lets the thread die: later snapshots still get written
            self._on_error("write", e)
            return None

    def drain(self, timeout: float | None = None) -> int:
        """Wait (bounded: DRAIN_SECONDS unless given) until every queued snapshot is written.
        Returns how many were not; a shortfall is said (captured data must never vanish unsaid)."""
        if self._thread is None:
            return 0
        timeout = DRAIN_SECONDS if timeout is None else timeout
        done = threading.Event()

        def wait():
            self._q.join()
            done.set()
        threading.Thread(target=wait, daemon=True).start()
        if done.wait(timeout):
            return 0
        left = self._q.unfinished_tasks  # queued, plus the one being written
        print(f"[kdkit] exiting with {left} captured case(s) not yet written to {self.store.folder} after "
              f"{timeout:.0f} s; they are lost (a slow disk or very large cases: capture fewer, "
              "KDKIT_EVERY or KDKIT_LAYERS)", file=sys.stderr, flush=True)
        return left
