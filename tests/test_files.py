"""kdkit.files.publish: an existing file is never replaced, a half-written file is never visible,
and both hold on file systems without hard links (os.link made to fail)."""
from __future__ import annotations

import os
import stat

import pytest

from kdkit.files import publish


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture(params=["links", "no-links"])
def fs(request, monkeypatch):
    """Run each test with hard links, and with os.link failing as on exFAT or some mounts."""
    if request.param == "no-links":
        def no_links(src, dst, *a, **k):
            raise PermissionError(1, "Operation not permitted", str(src))
        monkeypatch.setattr(os, "link", no_links)
    return request.param


def test_writes_bytes_text_and_streams(tmp_path, fs):
    assert publish(tmp_path / "a.bin", b"\x00\x01") == tmp_path / "a.bin"
    publish(tmp_path / "b.txt", "héllo\n")
    publish(tmp_path / "c.bin", lambda fh: fh.write(b"streamed"))
    publish(tmp_path / "sub" / "dir" / "d.txt", "made the folders")
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "b.txt").read_text(encoding="utf-8") == "héllo\n"
    assert (tmp_path / "c.bin").read_bytes() == b"streamed"
    assert (tmp_path / "sub" / "dir" / "d.txt").read_text() == "made the folders"
    assert _leftovers(tmp_path) == []


def test_mode_follows_the_umask_like_open(tmp_path, fs):
    """Not mkstemp's private 0600: cases and reports are meant to be shared."""
    old = os.umask(0o027)
    try:
        p = publish(tmp_path / "x", b"1")
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o640


def test_existing_file_is_never_replaced(tmp_path, fs):
    p = tmp_path / "case.pt"
    p.write_bytes(b"what the user captured")
    with pytest.raises(FileExistsError, match=str(p)) as e:
        publish(p, b"new")
    assert e.value.filename == str(p) and "overwrite=True" in str(e.value)
    assert p.read_bytes() == b"what the user captured" and _leftovers(tmp_path) == []


def test_a_file_that_appears_while_writing_is_kept(tmp_path, fs):
    """Another rank publishes the same name while this one is still writing: theirs stays."""
    p = tmp_path / "rank0.pt"

    def racing(fh):
        fh.write(b"mine")
        p.write_bytes(b"theirs")  # the concurrent writer wins the name first
    with pytest.raises(FileExistsError, match=str(p)):
        publish(p, racing)
    assert p.read_bytes() == b"theirs" and _leftovers(tmp_path) == []


def test_exist_ok_keeps_the_first_writer(tmp_path, fs):
    """What a cache wants: the same entry written twice is fine, the first one stays."""
    p = tmp_path / "mod.cubin"
    p.write_bytes(b"first")
    assert publish(p, b"second", exist_ok=True) == p
    q = tmp_path / "mod2.cubin"

    def racing(fh):
        fh.write(b"second")
        q.write_bytes(b"first")
    assert publish(q, racing, exist_ok=True) == q
    assert p.read_bytes() == b"first" and q.read_bytes() == b"first" and _leftovers(tmp_path) == []


def test_overwrite_replaces(tmp_path, fs):
    p = tmp_path / "r.html"
    p.write_text("old")
    publish(p, "new", overwrite=True)
    assert p.read_text() == "new" and _leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="contradict"):
        publish(p, "x", overwrite=True, exist_ok=True)


def test_no_partial_file_is_ever_visible(tmp_path, fs):
    """While the data is written the final name does not exist; a writer that dies leaves
    nothing under the final name and no temporary file."""
    p = tmp_path / "big.pt"
    seen = []

    def writer(fh):
        for _ in range(3):
            fh.write(b"x" * 4096)
            seen.append(p.exists())
    publish(p, writer)
    assert seen == [False, False, False] and p.stat().st_size == 3 * 4096

    q = tmp_path / "dies.pt"

    def dies(fh):
        fh.write(b"half")
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        publish(q, dies)
    assert not q.exists() and _leftovers(tmp_path) == []


def test_no_links_fallback_gives_the_name_back_if_the_rename_fails(tmp_path, monkeypatch):
    """Without hard links the name is reserved first; a failed rename must not leave that empty
    reservation behind as if it were the file."""
    monkeypatch.setattr(os, "link", lambda *a, **k: (_ for _ in ()).throw(OSError(95, "not supported")))

    def broken_replace(src, dst):
        raise OSError(5, "I/O error")
    monkeypatch.setattr(os, "replace", broken_replace)
    p = tmp_path / "x.pt"
    with pytest.raises(OSError, match="I/O error"):
        publish(p, b"data")
    assert not p.exists() and _leftovers(tmp_path) == []


def test_a_name_near_the_file_systems_limit_is_written(tmp_path, fs):
    """The temp name added ~15 characters to the final one: a 250-byte name, which the file system
    takes, failed with ENAMETOOLONG (found by a review, 2026-12-02)."""
    name = "c" * 246 + ".pt"
    assert publish(tmp_path / name, b"x") == tmp_path / name
    assert (tmp_path / name).read_bytes() == b"x" and _leftovers(tmp_path) == []
