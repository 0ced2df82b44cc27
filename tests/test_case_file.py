"""The case file: bad input is refused with a CaseError naming the file and the field (and never
runs code from the file); save is atomic and never clobbers; round trips are bit-exact;
compaction and the two layouts keep every number the kernel sees."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from conftest import bundled_path, write_hostile
from kdkit import layout
from kdkit.judge import oracle
from kdkit.case import SCHEMA_VERSION, TENSOR_FIELDS, Case, CaseError, load
from kdkit.shapes import seed_shape
from kdkit.synth import make_case


@pytest.fixture
def saved(tmp_path) -> tuple[Case, os.PathLike]:
    case = seed_shape()
    return case, case.save(tmp_path / "good.pt")


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor: NaN-poisoned rows compare equal to themselves this way."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _assert_same_tensors(a: Case, b: Case, names=TENSOR_FIELDS):
    for name in names:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is None:
            continue
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(_bits(x), _bits(y)), f"{name} differs bitwise"


def _save_record(rec: dict, path) -> os.PathLike:
    torch.save(rec, path)
    return path


def _expect(path, field: str, *words: str) -> CaseError:
    with pytest.raises(CaseError) as ei:
        load(path)
    err = ei.value
    assert err.field == field, f"named field {err.field!r}, expected {field!r}: {err}"
    assert str(path) in str(err), f"the message does not name the file: {err}"
    for w in words:
        assert w in str(err), f"{w!r} not in {err}"
    return err


# ---- files that are not (good) cases -------------------------------------------------------------
def test_truncated_file(saved, tmp_path):
    _, good = saved
    data = open(good, "rb").read()
    bad = tmp_path / "truncated.pt"
    bad.write_bytes(data[: len(data) // 2])
    _expect(bad, "<file>", "truncated")


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("as_torch", [True, False], ids=["torch-zip", "plain-pickle"])
def test_pickle_that_would_run_code_is_refused(tmp_path, as_torch):
    marker = tmp_path / "PAYLOAD_RAN"
    path = write_hostile(tmp_path / "hostile.pt", marker, as_torch=as_torch)
    with pytest.raises(CaseError) as ei:
        load(path)
    assert str(path) in str(ei.value)
    assert not marker.exists(), "loading a case file ran code from it"


def test_hostile_payload_is_live(tmp_path):
    """The control for the test above: an unsafe load of the same file does run the payload, so
    `marker does not exist` above is a real observation."""
    marker = tmp_path / "PAYLOAD_RAN"
    path = write_hostile(tmp_path / "hostile.pt", marker)
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_plain_non_torch_file(tmp_path):
    bad = tmp_path / "notes.pt"
    bad.write_text("q_len=9 prefix=21\n")
    _expect(bad, "<file>")


def test_foreign_torch_file(tmp_path):
    path = _save_record(torch.nn.Linear(4, 2).state_dict(), tmp_path / "state_dict.pt")
    _expect(path, "format", "not a kdkit case file")


def test_wrong_schema_version(saved, tmp_path):
    case, _ = saved
    rec = case.to_record()
    rec["schema_version"] = SCHEMA_VERSION + 1
    _expect(_save_record(rec, tmp_path / "v2.pt"), "schema_version", str(SCHEMA_VERSION + 1))


@pytest.mark.parametrize("part,name", [("tensors", "kv_indices"), ("tensors", "q"), ("params", "sm_scale")])
def test_missing_field(saved, tmp_path, part, name):
    case, _ = saved
    rec = case.to_record()
    del rec[part][name]
    _expect(_save_record(rec, tmp_path / "missing.pt"), name, "missing")


def test_wrong_dtype(saved, tmp_path):
    case, _ = saved
    rec = case.to_record()
    rec["tensors"]["q"] = rec["tensors"]["q"].double()
    _expect(_save_record(rec, tmp_path / "f64.pt"), "q", "float64")
    rec = case.to_record()
    rec["tensors"]["kv_indices"] = rec["tensors"]["kv_indices"].float()
    _expect(_save_record(rec, tmp_path / "fidx.pt"), "kv_indices", "float32")


def test_wrong_shape(saved, tmp_path):
    case, _ = saved
    rec = case.to_record()
    rec["tensors"]["k"] = rec["tensors"]["k"][..., :512].contiguous()  # rope part dropped
    _expect(_save_record(rec, tmp_path / "k512.pt"), "k", "576")


@pytest.mark.parametrize("name", ["kv_indices", "out_cache_loc"])
def test_indices_out_of_range(saved, tmp_path, name):
    case, _ = saved
    rec = case.to_record()
    n = rec["tensors"]["kv_buffer"].shape[0]
    rec["tensors"][name] = rec["tensors"][name].clone()
    rec["tensors"][name][0] = n + 5
    _expect(_save_record(rec, tmp_path / "oob.pt"), name, str(n + 5))


# ---- saving ---------------------------------------------------------------------------------------
def test_save_refuses_overwrite(saved):
    case, path = saved
    before = open(path, "rb").read()
    other = make_case(seed=1)
    with pytest.raises(FileExistsError):
        other.save(path)
    assert open(path, "rb").read() == before
    other.save(path, overwrite=True)
    _assert_same_tensors(load(path), other)


def test_save_is_atomic(saved, monkeypatch):
    """A write that dies half way leaves the old file whole and no temp file behind."""
    case, path = saved
    before = open(path, "rb").read()

    def dies_half_way(obj, fh, *a, **k):
        fh.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(OSError, match="simulated"):
        make_case(seed=1).save(path, overwrite=True)
    assert open(path, "rb").read() == before
    assert sorted(os.listdir(os.path.dirname(path))) == [os.path.basename(path)]


def test_round_trip_is_bit_exact(tmp_path):
    # uint8 mask, int64 indices, NaN-poisoned kept pool, a captured reference: every kind of field
    case = make_case(bs=2, prefix=[0, 37], q_len=[1, 6], mask_dtype=torch.uint8,
                     index_dtype=torch.int64, keep_pool=True)
    case.ref_out = torch.randn(case.num_tokens, case.num_heads, 512).bfloat16()
    case.ref_lse = torch.randn(case.num_tokens, case.num_heads)
    back = load(case.save(tmp_path / "rt.pt"))
    assert bool(torch.isnan(case.kv_buffer.float()).any()), "the test should carry NaN rows"
    _assert_same_tensors(back, case)
    for name in ("num_heads", "sm_scale", "logit_cap", "causal", "layout"):
        assert getattr(back, name) == getattr(case, name), name
    assert {k: v for k, v in back.meta.items() if v is not None} == \
        {k: v for k, v in case.meta.items() if v is not None}


# ---- compaction and layouts -------------------------------------------------------------------------
def test_compaction_keeps_only_referenced_rows():
    full = make_case(bs=3, prefix=[5, 0, 40], q_len=[9, 3, 1], keep_pool=True, spare_rows=50)
    rows, idx, loc, slot_ids = layout.compact(full.kv_buffer, full.kv_indices, full.out_cache_loc)
    referenced = set(full.kv_indices.tolist()) | set(full.out_cache_loc.tolist())
    assert rows.shape[0] == 1 + len(referenced - {0}) < full.kv_buffer.shape[0]
    assert slot_ids[0] == 0 and set(slot_ids[1:].tolist()) == referenced - {0}
    # slot_ids map every compact row back to its pool slot, with the same bits
    assert torch.equal(slot_ids[idx.long()], full.kv_indices.long())
    assert torch.equal(slot_ids[loc.long()], full.out_cache_loc.long())
    assert torch.equal(_bits(rows), _bits(full.kv_buffer[slot_ids]))
    # the NaN-poisoned unused slots are gone: everything kept but the scratch row is finite
    assert bool(torch.isfinite(rows[1:].float()).all())
    compact_case = full.clone(kv_buffer=rows, kv_indices=idx, out_cache_loc=loc, slot_ids=slot_ids)
    a, b = oracle.run(full)[0], oracle.run(compact_case)[0]
    # the same bf16 inputs in the same order: the float64 results must be identical, not close
    assert np.array_equal(a, b)


@pytest.mark.parametrize("kw", [dict(), dict(bs=3, prefix=[0, 7, 64], q_len=[1, 5, 9], tree="chain")],
                         ids=["seed-shape", "ragged"])
def test_layouts_convert_both_ways(kw):
    sg = make_case(**kw) if kw else seed_shape()
    un = layout.to_unified(sg)
    assert un.layout == "unified"
    assert int(un.kv_indptr[-1]) == int(sg.kv_indptr[-1]) + sg.num_tokens  # prefix + draft slots
    back = layout.to_sglang(un)
    _assert_same_tensors(back, sg)
    o_sg, lse_sg = oracle.run(sg)
    o_un, lse_un = oracle.run(un)
    # identical inputs gathered in the same order -> bit-identical float64 output and LSE
    assert np.array_equal(o_sg, o_un) and np.array_equal(lse_sg, lse_un)


def test_seed_shaped_case_is_small(tmp_path):
    path = seed_shape().save(tmp_path / "seed.pt")
    assert os.path.getsize(path) < 1_000_000
    assert os.path.getsize(bundled_path("seed-shape")) < 1_000_000


def test_forged_tensor_layouts_are_refused(saved, tmp_path):
    """A stride-0 view claiming 1e11 elements (a few bytes on disk) or a sparse tensor is refused at
    load with a CaseError, before any check allocates or reads through it."""
    case, _ = saved
    rec = case.to_record()
    rec["tensors"]["kv_indices"] = torch.zeros(1, dtype=torch.int32).expand(10**11)
    _expect(_save_record(rec, tmp_path / "stride0.pt"), "kv_indices", "dense contiguous")
    rec = case.to_record()
    rec["tensors"]["q"] = rec["tensors"]["q"].to_sparse()
    _expect(_save_record(rec, tmp_path / "sparse.pt"), "q", "dense contiguous")


@pytest.mark.parametrize("cap", [float("inf"), float("nan"), -1.0])
def test_non_finite_or_negative_logit_cap_is_refused(saved, tmp_path, cap):
    case, _ = saved
    rec = case.to_record()
    rec["params"]["logit_cap"] = cap
    _expect(_save_record(rec, tmp_path / "cap.pt"), "logit_cap", "finite")


def test_save_without_hard_links_still_never_clobbers(tmp_path, monkeypatch):
    """Filesystems without link() (exFAT, some mounts) fall back to an O_EXCL reservation."""
    def no_links(src, dst):
        raise PermissionError("operation not permitted")
    monkeypatch.setattr(os, "link", no_links)
    case = seed_shape()
    path = case.save(tmp_path / "x.pt")
    assert load(path).case_id == case.case_id and not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(FileExistsError):
        case.save(path)


# ---- forged records: each refused in one line naming the field, never a crash inside torch -------
def test_a_container_that_holds_itself_or_nests_deeply_is_refused(tmp_path):
    cyclic = []
    cyclic.append(cyclic)
    _expect(_save_record(cyclic, tmp_path / "cyclic.pt"), "<pickle>", "nests deeper")
    deep: list = []
    for _ in range(200):  # (torch.save's pickler recurses: a few hundred levels is what it writes)
        deep = [deep]
    _expect(_save_record(deep, tmp_path / "deep.pt"), "<pickle>", "nests deeper")


@pytest.mark.parametrize("key", ["note", "case_id", "layer_id"])
def test_a_tensor_in_meta_is_refused(saved, tmp_path, key):
    case, _ = saved
    rec = case.to_record()
    rec["meta"][key] = torch.zeros(2)
    _expect(_save_record(rec, tmp_path / "meta.pt"), f"meta.{key}", "plain data")


def test_a_tensor_schema_version_is_refused(saved, tmp_path):
    case, _ = saved
    rec = case.to_record()
    rec["schema_version"] = torch.tensor([1, 1])
    _expect(_save_record(rec, tmp_path / "ver.pt"), "schema_version", "this kdkit reads version")


def test_a_non_string_tensor_key_is_refused(saved, tmp_path):
    case, _ = saved
    rec = case.to_record()
    rec["tensors"][1] = torch.zeros(3)
    rec["tensors"]["zz"] = torch.zeros(3)
    _expect(_save_record(rec, tmp_path / "keys.pt"), "1", "unknown tensor")


@pytest.mark.parametrize("name", ["sm_scale", "logit_cap"])
def test_an_integer_past_a_floats_range_is_refused(saved, tmp_path, name):
    case, _ = saved
    rec = case.to_record()
    rec["params"][name] = 10 ** 400
    _expect(_save_record(rec, tmp_path / "huge.pt"), name, "out of a float's range")


def test_a_view_of_a_larger_tensor_saves_only_its_own_bytes(saved, tmp_path):
    """A case cut from a live pool (a slice) must not carry the whole pool into the shared file."""
    case, path = saved
    n = case.kv_buffer.shape[0]
    pool = torch.zeros(50_000, 1, case.kv_buffer.shape[-1], dtype=case.kv_buffer.dtype)
    pool[1000:1000 + n] = case.kv_buffer
    sliced = case.clone(kv_buffer=pool[1000:1000 + n]).save(tmp_path / "sliced.pt")
    assert os.path.getsize(sliced) <= os.path.getsize(path) + 4096
    _assert_same_tensors(load(sliced), case)


def test_a_request_without_draft_tokens_is_computed_and_flagged():
    """q_len 0 in a batch: the oracle gives the other requests (it crashed inside NumPy), and the
    lint says the batch is unusual."""
    from kdkit import lint
    case = make_case(bs=2, prefix=21, q_len=[9, 0], heads=8)
    out, lse = oracle.run(case)
    assert out.shape[0] == 9 and np.isfinite(out).all() and np.isfinite(lse).all()
    assert "qo-empty-request" in [f.code for f in lint.check(case)]


@pytest.mark.parametrize("part", ["params", "record"])
def test_an_unknown_part_or_parameter_is_refused_not_dropped(saved, tmp_path, part):
    """What this kdkit does not know would be lost by the next save: refused, as unknown tensors are."""
    case, _ = saved
    rec = case.to_record()
    (rec["params"] if part == "params" else rec)["k_scale"] = 0.5
    field = "params.k_scale" if part == "params" else "k_scale"
    _expect(_save_record(rec, tmp_path / "extra.pt"), field, "would be lost on the next save")


def test_a_directory_is_not_a_missing_file(tmp_path):
    with pytest.raises(IsADirectoryError, match="a directory; give one case file"):
        load(tmp_path)


def test_a_pickle_protocol_torch_never_writes_is_refused_by_kdkit_not_warned_by_torch(tmp_path, recwarn):
    """A damaged protocol byte is said as the file's fault in one CaseError, before torch reads it
    (torch would print a multi-line warning and go on)."""
    import zipfile

    from kdkit.case import CaseError, load
    from kdkit.synth import make_case
    good = make_case().save(tmp_path / "good.pt")
    bad = tmp_path / "bad.pt"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("data.pkl"):
                assert data[0] == 0x80
                data = data[:1] + bytes([107]) + data[2:]
            zout.writestr(info, data)
    with pytest.raises(CaseError, match="protocol 107"):
        load(bad)
    assert not [w for w in recwarn if "pickle protocol" in str(w.message)]
