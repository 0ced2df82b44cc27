"""Hostile and broken case files: each gets one CaseError naming the file and the field, nothing in
the file runs, memory stays bounded; and 10,000 mutated files (byte flips, truncations, edited zip
members and pickles) raise nothing but CaseError. (tests/test_case_file.py has the first hostile
files: a pickle that runs code, truncation, wrong schema version, indices outside the pool.)"""
from __future__ import annotations

import io
import os
import pickletools
import random
import re
import subprocess
import sys
import zipfile

import pytest
import torch

from kdkit import ptfile
from kdkit.case import CaseError, load
from kdkit.synth import make_case


# The peak memory a load adds, measured in a fresh process: ru_maxrss is the process's peak, so in
# the test process it shows nothing once an earlier test has peaked higher; and a child's ru_maxrss
# starts at its parent's RSS at the fork (Linux carries the old mm's high-water mark over exec).
# The child's VmHWM (/proc/self/status) belongs to its own address space, fresh at exec. The child
# imports kdkit first (torch: its baseline), then loads; ~2 s per call.
_PEAK = """
import re, sys
from kdkit.case import CaseError, load
def peak():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\\s*(\\d+) kB", f.read()).group(1)) / 1024
before = peak()
try:
    exec(sys.argv[2]) if sys.argv[2] else load(sys.argv[1])
    what = "loaded"
except CaseError as e:
    what = "CaseError " + e.field
print(what, peak() - before)
"""
LOAD_MB = 64   # a refused load may allocate this much at most (the files here are a few KB on disk)


def _load_peak_mb(path, extra: str = "") -> tuple[str, float]:
    """(what happened, MB the load added to a fresh process's peak); `extra`: code run instead."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("the peak-memory measure reads /proc/self/status (Linux)")
    run = subprocess.run([sys.executable, "-c", _PEAK, str(path), extra], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    what, _, mb = run.stdout.strip().rpartition(" ")
    return what, float(mb)


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s*(\d+) kB", f.read()).group(1)) / 1024


def _reset_peak() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0: clear_refs 5); False if not."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _status_mb("VmHWM") <= _status_mb("VmRSS") + 1


def test_the_memory_measure_sees_an_allocation(tmp_path):
    """The measure bites: 2 x LOAD_MB of touched bytes in the child show up as such."""
    what, mb = _load_peak_mb(tmp_path / "none.pt", f"x = b'\\1' * ({2 * LOAD_MB} << 20)")
    assert what == "loaded" and mb > 1.5 * LOAD_MB, mb


def _members(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return [(i.filename, zf.read(i.filename)) for i in zf.infolist()]


def _zip(members, compress: dict | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, payload in members:
            zf.writestr(name, payload, compress_type=(compress or {}).get(name, zipfile.ZIP_STORED))
    return buf.getvalue()


def _expect(path, field, *words) -> CaseError:
    with pytest.raises(CaseError) as ei:
        load(path)
    err = ei.value
    assert err.field == field, f"named field {err.field!r}, expected {field!r}: {err}"
    assert str(path) in str(err) and "\n" not in str(err), str(err)
    for w in words:
        assert w in str(err), f"{w!r} not in {err}"
    return err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> bytes:
    """A small valid case file (bs 1, prefix 2, q_len 2, H 1): a few KB, loads in a millisecond."""
    path = make_case(bs=1, prefix=2, q_len=2, heads=1, tree="chain", seed=3).save(
        tmp_path_factory.mktemp("tiny") / "tiny.pt")
    return path.read_bytes()


def _pkl_name(members) -> str:
    return next(n for n, _ in members if n.endswith("data.pkl"))


def _edit_pickle(members, fn):
    name = _pkl_name(members)
    return [(n, fn(p) if n == name else p) for n, p in members]


# ---- hostile files ------------------------------------------------------------------------------
def test_zip_bomb_is_refused_before_it_expands(tiny, tmp_path):
    """A member deflated from 256 MB of zeros (~250 KB on disk): refused from the zip directory."""
    members = _members(tiny)
    data_member = next(n for n, _ in members if "/data/" in n)
    bomb = [(n, b"\0" * (256 << 20) if n == data_member else p) for n, p in members]
    path = tmp_path / "bomb.pt"
    path.write_bytes(_zip(bomb, {data_member: zipfile.ZIP_DEFLATED}))
    del bomb
    assert path.stat().st_size < 2 << 20
    _expect(path, "<zip>", "zip bomb", data_member)
    what, mb = _load_peak_mb(path)
    assert what == "CaseError <zip>" and mb < LOAD_MB, f"loading the bomb grew memory by {mb:.0f} MB"


def test_member_declaring_more_bytes_than_the_file(tiny, tmp_path):
    """A central-directory entry whose sizes were edited to 4 GB."""
    data = bytearray(tiny)
    with zipfile.ZipFile(io.BytesIO(tiny)) as zf:
        info = zf.infolist()[-1]
    cd = data.rfind(b"PK\x01\x02" + data[data.rfind(b"PK\x01\x02") + 4: data.rfind(b"PK\x01\x02") + 6])
    assert cd > 0
    data[cd + 20: cd + 28] = (0xFFFF0000).to_bytes(4, "little") * 2   # compressed and uncompressed size
    path = tmp_path / "huge-member.pt"
    path.write_bytes(bytes(data))
    err = _expect(path, "<zip>")
    assert info.filename in str(err) or "declares" in str(err)


def _retag(pkl: bytes, old: bytes, new: bytes) -> bytes:
    assert old in pkl, (old, pkl[:200])
    return pkl.replace(old, new, 1)


def test_huge_declared_shape_names_the_field(tiny, tmp_path):
    """q's header claims 1,000,000 tokens over its few-KB storage: refused as q, nothing allocated."""
    members = _members(tiny)
    T, H, D = 2, 1, 576
    pkl = dict(members)[_pkl_name(members)]
    # q's size tuple (T, H, D) = (2, 1, 576) is pickled as BININT1 2, BININT1 1, BININT2 576, TUPLE3
    old = b"K\x02K\x01M\x40\x02\x87"
    new = b"J\x40\x42\x0f\x00K\x01M\x40\x02\x87"                     # BININT 1,000,000
    path = tmp_path / "huge-shape.pt"
    path.write_bytes(_zip(_edit_pickle(members, lambda p: _retag(p, old, new))))
    _expect(path, "q", "reaches past its storage")
    what, mb = _load_peak_mb(path)
    assert what == "CaseError q" and mb < LOAD_MB, f"loading the huge shape grew memory by {mb:.0f} MB"


def test_forged_storage_size_names_the_field(tiny, tmp_path):
    """A storage that declares 2**31 elements while its record holds a few KB."""
    members = _members(tiny)
    pkl = dict(members)[_pkl_name(members)]
    ops = list(pickletools.genops(pkl))
    # the first persistent id: ('storage', type, key, 'cpu', numel) -> numel is the op before TUPLE
    i = next(k for k, (op, arg, _) in enumerate(ops) if op.name == "BINUNICODE" and arg == "cpu")
    j = next(k for k in range(i + 1, len(ops)) if ops[k][0].name.startswith("BININT"))
    pos, op = ops[j][2], ops[j][0]
    width = {"BININT1": 2, "BININT2": 3, "BININT": 5}[op.name]
    forged = pkl[:pos] + b"J" + (2 ** 31 - 1).to_bytes(4, "little") + pkl[pos + width:]
    path = tmp_path / "forged-storage.pt"
    path.write_bytes(_zip(_edit_pickle(members, lambda p: forged)))
    _expect(path, "q", "storage declares 2147483647 elements")


def test_pickle_calling_a_global_is_refused_by_the_scan(tmp_path):
    """Inside a torch zip, a REDUCE of os.system: the scan refuses it before torch.load runs."""
    marker = tmp_path / "RAN"
    torch.save({"format": "kdkit-case", "x": 1}, tmp_path / "base.pt")
    members = _members((tmp_path / "base.pt").read_bytes())
    evil = b"\x80\x02cos\nsystem\nq\x00X" + len(f"touch {marker}").to_bytes(4, "little") + \
        f"touch {marker}".encode() + b"\x85R."
    path = tmp_path / "evil.pt"
    path.write_bytes(_zip(_edit_pickle(members, lambda p: evil)))
    _expect(path, "<pickle>", "os.system", "nothing from it ran")
    assert not marker.exists()


@pytest.mark.parametrize("name,index", [("q", (1, 0, 7)), ("k", (0, 0, 3)), ("v", (1, 0, 500))])
def test_nan_or_inf_in_what_the_kernel_reads(tmp_path, name, index):
    case = make_case(bs=1, prefix=4, q_len=2, heads=1, tree="chain", seed=1)
    getattr(case, name)[index] = float("nan") if name != "k" else float("inf")
    path = case.save(tmp_path / f"{name}.pt")            # saving never refuses a capture
    _expect(path, name, "NaN/inf at token", f"dim {index[-1]}", "allow_nonfinite=True")
    assert load(path, allow_nonfinite=True).case_id == case.case_id


def test_nan_in_a_pool_row_only_when_read(tmp_path):
    case = make_case(bs=1, prefix=4, q_len=2, heads=1, tree="chain", seed=1, keep_pool=True)
    assert torch.isnan(case.kv_buffer.float()).any()      # unused, poisoned rows: fine
    load(case.save(tmp_path / "ok.pt"))
    row = int(case.kv_indices[2])
    case.kv_buffer[row, 0, 9] = float("nan")
    _expect(case.save(tmp_path / "bad.pt"), "kv_buffer", f"pool row {row}", "dim 9")


def test_mixed_dtypes(tmp_path):
    case = make_case(bs=1, prefix=4, q_len=2, heads=1, tree="chain", seed=1)
    path = case.clone(k=case.k.float()).save(tmp_path / "mixed.pt")
    _expect(path, "k", "mixed dtypes", "k float32", "q bfloat16")
    with pytest.raises(CaseError, match="mixed dtypes"):
        load(path, allow_nonfinite=True)


def test_legacy_torch_format_is_refused_unread(tmp_path):
    """torch.save's pre-1.6 format declares storage sizes torch allocates before reading: not read."""
    rec = make_case(bs=1, prefix=4, q_len=2, heads=1, tree="chain", seed=1).to_record()
    path = tmp_path / "legacy.pt"
    torch.save(rec, path, _use_new_zipfile_serialization=False)
    _expect(path, "<file>", "before torch 1.6", "re-save")


def test_oversized_file_is_refused_unread(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(ptfile, "MAX_FILE_BYTES", 1000)
    path = tmp_path / "big.pt"
    path.write_bytes(tiny)
    _expect(path, "<file>", "more than a case can be")


# ---- fuzzing --------------------------------------------------------------------------------------
FUZZ_FILES = int(os.environ.get("KDKIT_FUZZ_FILES", "10000"))


def _mutants(tiny: bytes, rng: random.Random):
    """Endless (kind, bytes): byte flips, truncations, garbage appended, and edits of the zip's
    members (the pickle's bytes, a storage's bytes or length, a member dropped or duplicated)."""
    members = _members(tiny)
    pkl = _pkl_name(members)
    while True:
        kind = rng.randrange(8)
        if kind == 0:                                        # flip 1..4 bytes anywhere
            b = bytearray(tiny)
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            yield "flip", bytes(b)
        elif kind == 1:                                      # truncate
            yield "truncate", tiny[: rng.randrange(len(tiny))]
        elif kind == 2:                                      # garbage appended / inserted
            at = rng.randrange(len(tiny))
            yield "insert", tiny[:at] + rng.randbytes(rng.randint(1, 64)) + tiny[at:]
        elif kind == 3:                                      # the pickle's bytes flipped
            p = bytearray(dict(members)[pkl])
            for _ in range(rng.randint(1, 3)):
                p[rng.randrange(len(p))] = rng.randrange(256)
            yield "pickle-flip", _zip([(n, bytes(p) if n == pkl else d) for n, d in members])
        elif kind == 4:                                      # the pickle cut short
            p = dict(members)[pkl]
            yield "pickle-cut", _zip([(n, p[: rng.randrange(len(p))] if n == pkl else d) for n, d in members])
        elif kind == 5:                                      # a storage's bytes random, or resized
            data = [n for n, _ in members if "/data/" in n]
            victim = rng.choice(data)
            d0 = dict(members)[victim]
            new = rng.choice([rng.randbytes(len(d0)), d0[: rng.randrange(len(d0) + 1)], d0 + rng.randbytes(8)])
            yield "storage", _zip([(n, new if n == victim else d) for n, d in members])
        elif kind == 6:                                      # a member dropped or duplicated
            i = rng.randrange(len(members))
            ms = members[:i] + members[i + 1:] if rng.random() < 0.5 else members + [members[i]]
            try:
                yield "member", _zip(ms)
            except Exception:                                # zipfile refuses some duplicates itself
                continue
        else:                                                # a central-directory field scribbled
            b = bytearray(tiny)
            cd = b.rfind(b"PK\x01\x02")
            off = cd + rng.randrange(10, 46)
            b[off] = rng.randrange(256)
            yield "directory", bytes(b)


@pytest.mark.filterwarnings("ignore::UserWarning")  # zipfile warns of the duplicated members it writes
def test_fuzz_only_case_errors(tiny, tmp_path):
    """10,000 mutated files: load() raises CaseError or returns a case; never anything else, and
    memory stays bounded. A surprise saves the file and names it."""
    rng = random.Random(8)
    path = tmp_path / "fuzz.pt"
    if not os.path.exists("/proc/self/status"):
        pytest.skip("the memory measure reads /proc/self/status (Linux)")
    # the peak over the fuzz (VmHWM reset first, else an earlier test's peak hides it), or, where
    # the kernel cannot reset it, the RSS left at the end (a leak)
    peak = _reset_peak()
    before = _status_mb("VmRSS")
    kinds: dict = {}
    loaded = 0
    for n, (kind, data) in enumerate(_mutants(tiny, rng)):
        if n >= FUZZ_FILES:
            break
        path.write_bytes(data)
        try:
            load(path)
            loaded += 1
        except CaseError as e:
            assert str(path) in str(e) and "\n" not in str(e), f"{kind}: {e}"
        except Exception as e:  # noqa: BLE001 - the point: nothing but CaseError may escape
            keep = tmp_path / f"surprise-{n}-{kind}.pt"
            keep.write_bytes(data)
            pytest.fail(f"mutant {n} ({kind}) raised {type(e).__name__}: {e}; saved as {keep}")
        kinds[kind] = kinds.get(kind, 0) + 1
    assert sum(kinds.values()) == FUZZ_FILES and len(kinds) == 8, kinds
    assert loaded < FUZZ_FILES // 2, "most mutants should be refused: is the fuzzer mutating anything?"
    grew = _status_mb("VmHWM" if peak else "VmRSS") - before
    assert grew < 256, f"memory grew by {grew:.0f} MB ({'peak' if peak else 'left'}) over {FUZZ_FILES} files"


# ---- found by a review (2026-12-02) --------------------------------------------------------------
def _nested_note():
    """40 x 40 x ... 7 levels deep, one list shared at every level: a few hundred bytes pickled,
    40^7 paths to walk."""
    shared = [0] * 40
    for _ in range(6):
        shared = [shared] * 40
    return shared


class _OrderedDictOf:
    """Pickles as collections.OrderedDict(items): what torch.save never writes (it fills an empty
    one by SETITEMS) and the scan did not look inside."""

    def __init__(self, items):
        self.items = items

    def __reduce__(self):
        import collections
        return collections.OrderedDict, (self.items,)


def test_an_ordered_dict_built_from_arguments_is_refused(tmp_path):
    rec = make_case(prefix=21, q_len=9).to_record()
    rec["meta"] = _OrderedDictOf(list({**rec["meta"], "note": _nested_note()}.items()))
    p = tmp_path / "od.pt"
    torch.save(rec, p)
    with pytest.raises(CaseError, match="field '<pickle>': data.pkl builds an OrderedDict from arguments"):
        load(p)


def test_a_pickle_torch_reads_under_another_letter_case_is_refused(tmp_path):
    """torch finds archive/DATA.PKL as data.pkl (its zip reader ignores letter case, the first
    listed wins): the scan read the harmless archive/data.pkl listed after it."""
    case = make_case(prefix=21, q_len=9)
    good_buf, bad_buf = io.BytesIO(), io.BytesIO()
    torch.save(case.to_record(), good_buf)
    bad = case.to_record()
    bad["meta"]["note"] = _nested_note()
    torch.save(bad, bad_buf)
    good, hostile = zipfile.ZipFile(good_buf), zipfile.ZipFile(bad_buf)
    prefix = next(n for n in good.namelist() if n.endswith("/data.pkl"))[: -len("data.pkl")]
    p = tmp_path / "case.pt"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as z:
        z.writestr(prefix + "DATA.PKL", hostile.read(prefix + "data.pkl"))
        for name in good.namelist():
            z.writestr(name, good.read(name))
    with pytest.raises(CaseError, match=r"field '<zip>': the archive names a member twice \(letter case aside\)"):
        load(p)


def test_a_meta_walk_is_bounded_however_the_pickle_shares_its_lists(tmp_path):
    """The meta check walked a shared list once per path (40^7 visits): it stops at META_ITEMS."""
    from kdkit.case import META_ITEMS, _check_plain
    with pytest.raises(CaseError, match=f"meta holds more than {META_ITEMS} items"):
        _check_plain(_nested_note(), "meta.note", tmp_path / "x.pt")


def test_a_huge_integer_key_is_a_case_error(tmp_path):
    rec = make_case(prefix=21, q_len=9).to_record()
    rec[10 ** 5000] = 1
    p = tmp_path / "key.pt"
    torch.save(rec, p)
    with pytest.raises(CaseError, match="a dict key that is an integer of more than 64 bits"):
        load(p)


def test_a_tensor_with_a_neg_bit_or_gradients_is_refused(tmp_path):
    """With the neg bit set, torch reports -x for the stored x: the range checks saw one thing and
    the bytes a kernel reads held another."""
    rec = make_case(prefix=21, q_len=9).to_record()
    raw = (-rec["tensors"]["kv_indices"]).contiguous()
    torch._C._set_tensor_metadata(raw, {"neg": True})
    rec["tensors"]["kv_indices"] = raw
    p = tmp_path / "neg.pt"
    torch.save(rec, p)
    with pytest.raises(CaseError, match="a tensor rebuilt with gradients, hooks or metadata"):
        load(p)
    rec = make_case(prefix=21, q_len=9).to_record()
    rec["tensors"]["q"] = rec["tensors"]["q"].clone().requires_grad_(True)
    torch.save(rec, p2 := tmp_path / "grad.pt")
    with pytest.raises(CaseError, match="a tensor rebuilt with gradients, hooks or metadata"):
        load(p2)


def test_what_save_writes_load_reads(tmp_path):
    """A meta integer of thousands of digits was saved to a file that load() then refused; two
    nested keys that become one string were merged silently; a non-string top-level key crashed
    with a TypeError."""
    case = make_case(prefix=21, q_len=9)
    case.meta["note"] = 1 << 2100
    case.save(tmp_path / "big.pt")
    assert load(tmp_path / "big.pt").meta["note"] == str(1 << 2100)
    case = make_case(prefix=21, q_len=9)
    case.meta["extra"] = {1: "a", "1": "b"}
    with pytest.raises(CaseError, match=r"field 'meta.extra': keys 1 and '1' both become '1'"):
        case.save(tmp_path / "keys.pt")
    case = make_case(prefix=21, q_len=9)
    case.meta[7] = "x"
    with pytest.raises(CaseError, match="field 'meta': key 7 \\(int\\): meta keys are strings"):
        case.save(tmp_path / "top.pt")
    assert not any(tmp_path.glob("keys.pt")) and not any(tmp_path.glob("top.pt"))
