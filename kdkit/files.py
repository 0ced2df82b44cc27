"""The one way kdkit writes a file: never half-written, never over someone else's file.

    publish(path, data)                  # refuse (FileExistsError naming the path) if it exists
    publish(path, data, overwrite=True)  # replace it atomically (an explicit --force)
    publish(path, data, exist_ok=True)   # a cache: keep what a concurrent writer published first

The data goes to a temporary file in the same folder (same file system, so the publish step is
atomic), is fsynced, and only then gets its final name:
  * no overwrite: os.link(tmp, path), which fails if the name exists, so a file that appeared
    meanwhile (another TP rank, another process) is never replaced; then the temporary name goes.
  * file systems without hard links (exFAT, some network and FUSE mounts): the name is reserved
    with an exclusive create (O_CREAT | O_EXCL, which fails if it exists) and the full temporary
    file is renamed onto that reservation. A reader may see an empty file for that moment, never a
    partial one; only a writer that deletes the reservation in between could be replaced.
  * overwrite=True: os.replace(tmp, path), atomic: readers see the old file or the new one.
Files are created with mode 0o666 minus the umask, like open(): cases and reports are shared.
"""
from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import Callable, BinaryIO, Union

Data = Union[bytes, bytearray, memoryview, str, Callable[[BinaryIO], object]]


def _exists_error(path: Path) -> FileExistsError:
    return FileExistsError(errno.EEXIST, f"{path} exists; nothing was overwritten (pass overwrite=True, "
                           "or --force on the command line, to replace it)", str(path))


def refuse_if_exists(path: str | os.PathLike) -> None:
    """The FileExistsError publish() would raise, before the caller does the work of the data."""
    if os.path.lexists(path):
        raise _exists_error(Path(path))


def _write_temp(folder: Path, name: str, data: Data, mode: int) -> Path:
    """A fully written, fsynced temporary file beside the final name."""
    while True:
        # (the final name cut short: a name near the file system's 255-byte limit still gets a temp file)
        tmp = folder / f".{name[:120]}.{secrets.token_hex(4)}.tmp"
        try:
            # O_EXCL: never reuse a name; the mode goes through the umask, as open() does
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_BINARY", 0), mode)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(data):
                data(fh)  # e.g. lambda fh: torch.save(record, fh)
            else:
                fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _fsync_dir(folder: Path) -> None:
    """Make the new name durable too (best effort: not every OS or file system allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _publish_exclusive(tmp: Path, path: Path, mode: int) -> None:
    """Give `tmp` the name `path` only if no file has it; FileExistsError otherwise."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # no hard links here (EPERM, ENOTSUP, ENOSYS, ...): reserve, then rename
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)  # FileExistsError if taken
        os.close(fd)
        try:
            os.replace(tmp, path)  # onto our own empty reservation
        except BaseException:
            path.unlink(missing_ok=True)  # give the name back rather than leave an empty file
            raise
        return
    tmp.unlink()


def publish(path: str | os.PathLike, data: Data, *, overwrite: bool = False, exist_ok: bool = False,
            mode: int = 0o666, parents: bool = True) -> Path:
    """Write `data` (bytes, str as UTF-8, or a callable that writes into a binary file object) to
    `path` and return the path.

    overwrite=False, exist_ok=False: FileExistsError naming the path if it exists (checked before
      any work, and again atomically when the file is published).
    exist_ok=True: if the path exists (or another process publishes it first), leave that file
      alone and return the path: for caches whose entries are the same whoever writes them.
    overwrite=True: replace an existing file atomically.
    parents: create missing parent folders.
    """
    if overwrite and exist_ok:
        raise ValueError("publish: overwrite=True and exist_ok=True contradict each other; choose one")
    path = Path(path)
    if not overwrite and os.path.lexists(path):
        if exist_ok:
            return path
        refuse_if_exists(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_temp(path.parent, path.name, data, mode)
    try:
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                _publish_exclusive(tmp, path, mode)
            except FileExistsError:
                if not exist_ok:
                    raise _exists_error(path) from None
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)
    return path


__all__ = ["publish", "refuse_if_exists"]
