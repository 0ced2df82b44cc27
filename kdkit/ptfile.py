"""Look inside a torch.save file before torch.load touches it: nothing runs, nothing large is read.

A case file is a zip archive (torch.save's format): `<name>/data.pkl` (a pickle of plain data that
refers to tensors) and one member `<name>/data/<key>` of raw bytes per storage. A hostile or broken
file can lie in both places: a member that declares a huge size or is compressed (a zip bomb), a
pickle that calls something other than torch's tensor rebuild, a tensor that declares more elements
than its storage holds. `scan(path)` checks the zip directory and walks the pickle's opcodes with a
tiny interpreter that only builds plain containers and records each declared tensor (dtype, shape,
strides, storage), so every such lie is refused with a CaseError naming the file and the field
(the tensor's key) before any tensor memory exists. CaseError is defined here, the lowest module
that raises it; kdkit.case (which calls scan) exports it with the rest of the case API.
"""
from __future__ import annotations

import io
import os
import pickle
import pickletools
import zipfile
from dataclasses import dataclass
from pathlib import Path


class CaseError(ValueError):
    """A case (or case file) that cannot be used; the message names the file and the field."""

    def __init__(self, field_name: str, message: str, path: str | os.PathLike | None = None):
        self.field = field_name
        self.path = str(path) if path is not None else None
        where = f"{self.path}: " if self.path else ""
        super().__init__(f"{where}field '{field_name}': {message}")


# torch.save writes members stored (uncompressed), so a sane file's members add up to its size.
# A case of bs 1 x 128K prefix is ~150 MB; a whole captured batch a few GB.
MAX_FILE_BYTES = 32 << 30       # refuse larger files outright: more than any single call's inputs
MAX_PICKLE_BYTES = 16 << 20     # data.pkl holds meta, params and tensor headers: kilobytes
MAX_ELEMENTS = 1 << 34          # per tensor; kdkit.case uses the same bound
MAX_DIMS = 8

ITEMSIZE = {"FloatStorage": 4, "DoubleStorage": 8, "HalfStorage": 2, "BFloat16Storage": 2,
            "IntStorage": 4, "LongStorage": 8, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1,
            "BoolStorage": 1}
REBUILD = ("torch._utils", "_rebuild_tensor_v2")
ALLOWED_CALLS = {REBUILD, ("collections", "OrderedDict")}


@dataclass
class Storage:
    key: str
    type_name: str
    numel: int


@dataclass
class TensorDecl:
    storage: Storage
    offset: int
    size: tuple
    stride: tuple


class _Global:
    def __init__(self, module: str, name: str):
        self.module, self.name = module, name


class _Mark:
    pass


@dataclass
class _Refused:
    """A tensor rebuilt by something other than the dense rebuild (sparse, quantized, ...)."""
    how: str


def _fail(path, field: str, msg: str):
    raise CaseError(field, msg, path)


def _pickle_objects(data: bytes, path):
    """Run the opcodes of a protocol-2..5 pickle that torch.save writes; plain data only."""
    stack: list = []
    memo: dict = {}
    try:
        ops = list(pickletools.genops(data))
    except Exception as e:  # a truncated or garbled pickle
        _fail(path, "<pickle>", f"data.pkl is not a readable pickle ({type(e).__name__}: {str(e)[:120]})")

    def pop_mark():
        for i in range(len(stack) - 1, -1, -1):
            if isinstance(stack[i], _Mark):
                items = stack[i + 1:]
                del stack[i:]
                return items
        _fail(path, "<pickle>", "data.pkl: an opcode needs a MARK that is not there")

    def pop():
        if not stack:
            _fail(path, "<pickle>", "data.pkl: stack underflow")
        return stack.pop()

    for op, arg, _pos in ops:
        name = op.name
        if name == "PROTO" and not 2 <= arg <= pickle.HIGHEST_PROTOCOL:  # torch.save writes 2..5
            _fail(path, "<pickle>", f"data.pkl declares pickle protocol {arg}; torch.save writes 2 to "
                  f"{pickle.HIGHEST_PROTOCOL}: the file is damaged or was not written by torch")
        if name in ("PROTO", "FRAME"):
            continue
        if name in ("EMPTY_DICT",):
            stack.append({})
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name == "MARK":
            stack.append(_Mark())
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            if not stack:
                _fail(path, "<pickle>", "data.pkl: PUT on an empty stack")
            memo[arg] = stack[-1]
        elif name == "MEMOIZE":
            if not stack:
                _fail(path, "<pickle>", "data.pkl: MEMOIZE on an empty stack")
            memo[len(memo)] = stack[-1]
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            if arg not in memo:
                _fail(path, "<pickle>", f"data.pkl: memo entry {arg} read before it is written")
            stack.append(memo[arg])
        elif name in ("BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE",
                      "BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG",
                      "BINFLOAT", "FLOAT", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8"):
            stack.append(arg)
        elif name == "NEWTRUE":
            stack.append(True)
        elif name == "NEWFALSE":
            stack.append(False)
        elif name == "NONE":
            stack.append(None)
        elif name == "TUPLE":
            stack.append(tuple(pop_mark()))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            k = int(name[-1])
            if len(stack) < k:
                _fail(path, "<pickle>", "data.pkl: stack underflow")
            items = stack[-k:]
            del stack[-k:]
            stack.append(tuple(items))
        elif name == "GLOBAL":
            module, _, attr = str(arg).partition(" ")
            stack.append(_Global(module, attr))
        elif name == "STACK_GLOBAL":
            attr, module = pop(), pop()
            stack.append(_Global(str(module), str(attr)))
        elif name == "BINPERSID":
            pid = pop()
            stack.append(_storage(pid, path))
        elif name == "REDUCE":
            args, fn = pop(), pop()
            stack.append(_call(fn, args, path))
        elif name == "SETITEM":
            v, k = pop(), pop()
            d = stack[-1] if stack else None
            if not isinstance(d, dict):
                _fail(path, "<pickle>", "data.pkl: SETITEM on something that is not a dict")
            _set(d, _key(k, path), v, path)
        elif name == "SETITEMS":
            items = pop_mark()
            d = stack[-1] if stack else None
            if not isinstance(d, dict) or len(items) % 2:
                _fail(path, "<pickle>", "data.pkl: SETITEMS on something that is not a dict")
            for k, v in zip(items[::2], items[1::2]):
                _set(d, _key(k, path), v, path)
        elif name == "APPEND":
            v = pop()
            if not stack or not isinstance(stack[-1], list):
                _fail(path, "<pickle>", "data.pkl: APPEND on something that is not a list")
            stack[-1].append(v)
        elif name == "APPENDS":
            items = pop_mark()
            if not stack or not isinstance(stack[-1], list):
                _fail(path, "<pickle>", "data.pkl: APPENDS on something that is not a list")
            stack[-1].extend(items)
        elif name == "BUILD":
            # torch.save of an OrderedDict (a state_dict) sets its _metadata this way: plain data
            state = pop()
            if not stack or not isinstance(stack[-1], dict) or not isinstance(state, (dict, tuple, type(None))):
                _fail(path, "<pickle>", "data.pkl: BUILD on something that is not a dict")
        elif name == "STOP":
            if len(stack) != 1:
                _fail(path, "<pickle>", "data.pkl: STOP with a malformed stack")
            return stack[0]
        else:
            # BUILD, NEWOBJ, INST, OBJ, ... : ways to construct arbitrary objects; a case has none
            _fail(path, "<pickle>", f"data.pkl uses the pickle opcode {name}, which builds objects a "
                  "case file never holds; refused without running it")
    _fail(path, "<pickle>", "data.pkl ends without STOP (truncated)")


def _key(k, path):
    if isinstance(k, int) and not isinstance(k, bool) and abs(k) >= 1 << 63:
        _fail(path, "<pickle>", "data.pkl: a dict key that is an integer of more than 64 bits")
    if isinstance(k, (str, int, float, bool)) or k is None:
        return k
    _fail(path, "<pickle>", f"data.pkl: a dict key of type {type(k).__name__}")


def _set(d: dict, k, v, path) -> None:
    # a key set twice would leave its first value unwalked here while torch keeps the last
    if k in d:
        _fail(path, "<pickle>", f"data.pkl sets the dict key {k!r:.40} twice; the file is forged: not loaded")
    d[k] = v


def _storage(pid, path) -> Storage:
    ok = (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Global)
          and isinstance(pid[2], str) and isinstance(pid[4], int) and not isinstance(pid[4], bool))
    if not ok:
        _fail(path, "<pickle>", "data.pkl: a persistent id that is not a torch storage reference")
    g = pid[1]
    if g.module != "torch" or g.name not in ITEMSIZE:
        _fail(path, "<pickle>", f"data.pkl: storage type {g.module}.{g.name} is not one a case uses")
    if pid[4] < 0:
        _fail(path, "<pickle>", f"data.pkl: storage {pid[2]} declares {pid[4]} elements")
    return Storage(pid[2], g.name, pid[4])


def _call(fn, args, path):
    # other torch rebuilds (sparse, quantized, nested tensors, layouts): named at the field they fill
    if (isinstance(fn, _Global) and (fn.module == "torch" or fn.module.startswith("torch."))
            and (fn.module, fn.name) != REBUILD):
        return _Refused(f"{fn.module}.{fn.name}")
    if not isinstance(fn, _Global) or (fn.module, fn.name) not in ALLOWED_CALLS:
        what = f"{fn.module}.{fn.name}" if isinstance(fn, _Global) else type(fn).__name__
        _fail(path, "<pickle>", f"the file calls {what} when loaded (only tensors and plain data are "
              "allowed); refused by the safe loader, nothing from it ran")
    if (fn.module, fn.name) == ("collections", "OrderedDict"):
        # torch.save writes an OrderedDict empty and fills it by SETITEMS (which this scan sees);
        # one built from arguments would hold what the scan never walked
        if args != ():
            _fail(path, "<pickle>", "data.pkl builds an OrderedDict from arguments (torch.save never "
                  "does); the file is forged: not loaded")
        return {}
    if not isinstance(args, tuple) or len(args) < 4 or not isinstance(args[0], Storage):
        _fail(path, "<pickle>", "data.pkl: a tensor rebuild with malformed arguments")
    # (storage, offset, size, stride, requires_grad, backward_hooks[, metadata]): a case's tensors
    # carry no grad, no hooks and no metadata; metadata could set the neg or conj bit, so that the
    # values torch reports differ from the bytes the checks and a kernel read
    if len(args) not in (6, 7) or args[4] is not False or args[5] != {} or (len(args) == 7 and args[6] not in ({}, None)):
        _fail(path, "<pickle>", "data.pkl: a tensor rebuilt with gradients, hooks or metadata (a neg or "
              "conj bit); kdkit saves plain tensors: re-save the case with Case.save")
    st, offset, size, stride = args[:4]
    return TensorDecl(st, offset, size, stride)


def _ints(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in x)


# A case's record nests 3 levels (record -> tensors -> tensor) and holds a few hundred items; a
# forged pickle can nest without bound, hold itself (memo), or share one list at every level
# (2^depth paths). The walk is iterative and bounded by both.
MAX_DEPTH = 32
MAX_ITEMS = 1_000_000


def _walk(obj, path, out: list) -> None:
    """(where, tensor) for every tensor declaration in the unpickled record, in order."""
    todo, seen = [(obj, "", 0)], 0
    while todo:
        obj, where, depth = todo.pop()
        seen += 1
        if depth > MAX_DEPTH or seen > MAX_ITEMS:
            _fail(path, "<pickle>", f"data.pkl nests deeper than {MAX_DEPTH} levels or holds more than "
                  f"{MAX_ITEMS} items (or a container holds itself); a case's record is 3 levels deep: "
                  "the file is corrupt or forged")
        if isinstance(obj, (TensorDecl, _Refused)):
            out.append((where, obj))
        elif isinstance(obj, dict):
            todo.extend((v, f"{where}.{k}" if where else str(k), depth + 1) for k, v in reversed(obj.items()))
        elif isinstance(obj, (list, tuple)):
            todo.extend((v, f"{where}[{i}]", depth + 1) for i, v in reversed(list(enumerate(obj))))


def _field(where: str) -> str:
    """'tensors.q' -> 'q' (kdkit.case names tensor fields by their name); anything else as is."""
    return where[len("tensors."):] if where.startswith("tensors.") else where


def check_tensor(path, field: str, t: TensorDecl, records: dict) -> None:
    st = t.storage
    if not (_ints(t.size) and _ints(t.stride) and isinstance(t.offset, int)) or len(t.size) != len(t.stride):
        _fail(path, field, "the tensor header is malformed (size, stride or offset not integers)")
    if len(t.size) > MAX_DIMS or any(v < 0 for v in t.size) or any(v < 0 for v in t.stride) or t.offset < 0:
        _fail(path, field, f"declares shape {t.size}, strides {t.stride}, offset {t.offset}: not a tensor "
              "a case holds; the file is corrupt or forged")
    numel = 1
    for v in t.size:
        numel *= v
    want, acc = [], 1
    for v in reversed(t.size):
        want.append(acc)
        acc *= v
    dense = all(s == w for s, w, n in zip(t.stride, reversed(want), t.size) if n > 1)
    if numel > MAX_ELEMENTS or not dense:
        _fail(path, field, f"not a dense contiguous tensor of sane size: declares shape {t.size}, strides "
              f"{t.stride} ({numel} elements, limit {MAX_ELEMENTS}); the file is corrupt or forged")
    rec = records.get(st.key)
    if rec is None:
        _fail(path, field, f"its storage record data/{st.key} is missing from the archive (truncated?)")
    want = st.numel * ITEMSIZE[st.type_name]
    if rec != want:
        _fail(path, field, f"its storage declares {st.numel} elements ({want} bytes) but the archive "
              f"holds {rec} bytes for it; the file is corrupt or forged")
    if numel and t.offset + sum((s - 1) * d for s, d in zip(t.size, t.stride)) >= st.numel:
        _fail(path, field, f"shape {t.size} with strides {t.stride} reaches past its storage of "
              f"{st.numel} elements; the file is corrupt or forged")


def scan(path, data: bytes | None = None) -> None:
    """Refuse (CaseError) a torch.save zip whose directory or pickle is hostile or broken.
    Reads the zip's central directory and data.pkl only (at most MAX_PICKLE_BYTES). `data`: the
    file's bytes, scanned in memory (`path` then only names it in errors)."""
    path = Path(path)
    size = path.stat().st_size if data is None else len(data)
    if size > MAX_FILE_BYTES:
        _fail(path, "<file>", f"{size} bytes is more than a case can be (limit {MAX_FILE_BYTES}); "
              "not loaded")
    try:
        zf = zipfile.ZipFile(path if data is None else io.BytesIO(data))
    except Exception as e:  # BadZipFile, NotImplementedError (zip features), struct.error, ...
        _fail(path, "<file>", f"cannot be read as a torch file (truncated or not a .pt?): {type(e).__name__}: "
              f"{str(e)[:120]}")
    with zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        # torch's zip reader finds members by name case-insensitively (data.pkl and DATA.PKL are
        # one to it, the first listed wins): the scan must read the member torch will
        if len({n.lower() for n in names}) != len(names):
            _fail(path, "<zip>", "the archive names a member twice (letter case aside); the file is corrupt "
                  "or forged")
        total = 0
        for i in infos:
            if i.compress_type != zipfile.ZIP_STORED or i.file_size != i.compress_size:
                _fail(path, "<zip>", f"member {i.filename!r} is compressed ({i.compress_size} bytes that "
                      f"declare {i.file_size}); torch.save stores members uncompressed, and a compressed "
                      "one can expand without bound (a zip bomb): not loaded")
            if i.header_offset + i.compress_size > size:
                _fail(path, "<zip>", f"member {i.filename!r} declares {i.file_size} bytes past the end of "
                      f"the {size}-byte file (truncated or forged)")
            total += i.file_size
        if total > size:
            _fail(path, "<zip>", f"members declare {total} bytes in a {size}-byte file; forged: not loaded")
        pkls = [n for n in names if n.lower().endswith("/data.pkl") or n.lower() == "data.pkl"]
        if len(pkls) != 1 or not (pkls[0].endswith("/data.pkl") or pkls[0] == "data.pkl"):
            _fail(path, "<zip>", f"expected one data.pkl in the archive, found {len(pkls)} (not a torch.save file?)")
        prefix = pkls[0][: -len("data.pkl")]
        info = zf.getinfo(pkls[0])
        if info.file_size > MAX_PICKLE_BYTES:
            _fail(path, "<pickle>", f"data.pkl is {info.file_size} bytes (limit {MAX_PICKLE_BYTES}): a case's "
                  "header is kilobytes; not loaded")
        try:
            data = zf.read(pkls[0])
        except Exception as e:
            _fail(path, "<file>", f"cannot be read as a torch file (truncated or not a .pt?): "
                  f"{type(e).__name__}: {str(e)[:120]}")
        records = {n[len(prefix) + len("data/"):]: i.file_size for n, i in zip(names, infos)
                   if n.startswith(prefix + "data/")}
    obj = _pickle_objects(data, path)
    found: list = []
    _walk(obj, path, found)
    for where, t in found:
        if isinstance(t, _Refused):
            _fail(path, _field(where), f"not a dense contiguous tensor (rebuilt by {t.how}); kdkit saves "
                  "dense CPU tensors: re-save the case with Case.save")
        check_tensor(path, _field(where), t, records)
