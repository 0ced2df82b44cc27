"""The open backend registry (kdkit/backends/registry.py): every way of naming a backend, installed
backends found through a real dist-info on sys.path, each bad spec one line (exit 2 on the command
line), and a user's backend judged by `kdkit replay` like kdkit's own."""
from __future__ import annotations

import sys
import textwrap
import types
from pathlib import Path

import pytest

from kdkit import backends, cli, replay, shapes
from kdkit.backends import registry

ROOT = Path(__file__).resolve().parents[1]
USER = ROOT / "tests" / "sglang_env" / "user_kernels.py"
SEED = ROOT / "data" / "captured_tensors" / "seed-shape.pt"

# a backend as a user writes it in a file: kdkit's torch reference under another name
TEMPLATE = '''
from kdkit.backends import Result, torch_ref
NAME = "{name}"
def unavailable(case=None):
    return None
def run(case{opts}):
    res = torch_ref.run(case)
    return Result(res.out, res.lse, {{"ran": "{name}: kdkit's torch reference"}})
'''


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    """Each test starts from the built-ins; what it registers is forgotten after it."""
    monkeypatch.setattr(registry, "BACKENDS", dict(registry.BUILTIN))
    monkeypatch.setattr(backends, "BACKENDS", registry.BACKENDS)
    for name in ("_objects", "_sources", "_files"):
        monkeypatch.setattr(registry, name, {})
    monkeypatch.setattr(registry, "_listed", set())


def _file(tmp_path, name="mine", body=None, opts="", fname=None) -> Path:
    p = tmp_path / (fname or f"{name}.py")
    p.write_text(textwrap.dedent(body) if body is not None else TEMPLATE.format(name=name, opts=opts))
    return p


def _dist(where: Path, dist: str, eps: dict, module: str | None = None, body: str | None = None) -> Path:
    """A real installed distribution: NAME-1.0.dist-info with METADATA and entry_points.txt under
    `where` (a sys.path entry), and its module beside it."""
    info = where / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[kdkit.backends]\n" + "".join(f"{n} = {v}\n" for n, v in eps.items()))
    if module:
        (where / f"{module}.py").write_text(body)
    return where


# ---- each way of naming a backend -------------------------------------------------------------------
def test_a_built_in_name_and_its_module_are_one_backend():
    assert backends.resolve("torch") == ["torch"]
    assert backends.resolve("kdkit.backends.torch_ref") == ["torch"]  # the module itself: no second name
    assert backends.get("torch") is sys.modules["kdkit.backends.torch_ref"]


def test_a_file_spec_with_and_without_attr(tmp_path, monkeypatch):
    mod_level = _file(tmp_path, "modlevel")
    assert backends.resolve(str(mod_level)) == ["modlevel"]  # no `backend` in it: the module itself
    assert backends.resolve(f"{USER}:right,{USER}:wrong") == ["right", "wrong"]
    obj = backends.get("right")
    assert type(obj).__name__ == "Backend" and obj.NAME == "right"
    # `backend` is the default attribute
    with_default = _file(tmp_path, body=f"import importlib.util, sys\nsys.path.insert(0, {str(USER.parent)!r})\n"
                                        "from user_kernels import Backend\nbackend = Backend('dflt')\n",
                         fname="dflt.py")
    assert backends.resolve(str(with_default)) == ["dflt"]
    monkeypatch.chdir(tmp_path)  # a relative path is from the working directory: the same file, the same name
    assert backends.resolve("modlevel.py") == ["modlevel"]
    # listed beside the built-ins once resolved, and run like them
    res = backends.run("right", shapes.seed_shape())
    assert res.ran == "user kernel right: kdkit's torch reference"
    assert {"modlevel", "right", "wrong", "dflt"} <= set(backends.BACKENDS)


def test_a_file_is_loaded_again_when_it_changes(tmp_path):
    p = _file(tmp_path, "mine")
    backends.resolve(str(p))
    first = backends.get("mine")
    assert backends.resolve(str(p)) == ["mine"] and backends.get("mine") is first  # unchanged: not re-run
    p.write_text(p.read_text().replace("kdkit's torch reference", "edited") + "\n")
    backends.resolve(str(p))
    assert backends.get("mine") is not first
    assert backends.run("mine", shapes.seed_shape()).ran == "mine: edited"


def test_a_module_spec_and_its_helpers_beside_a_file(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "userpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kern.py").write_text(TEMPLATE.format(name="pkgkern", opts="") + "\nholder = type('H', (), {'b': None})\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert backends.resolve("userpkg.kern") == ["pkgkern"]
    # a file imports its own helper module beside it, as under `python file.py`
    (tmp_path / "helper_kdkit_test.py").write_text("FACTOR = 1\n")
    p = _file(tmp_path, body="import helper_kdkit_test\n" + TEMPLATE.format(name="helped", opts=""), fname="helped.py")
    assert backends.resolve(str(p)) == ["helped"]


def test_register_is_the_notebooks_way():
    nb = types.SimpleNamespace(NAME="nb", unavailable=lambda case=None: None,
                               run=lambda case, *, scale=1.0: backends.Result(
                                   backends.get("torch").run(case).out * scale, None, {"ran": "notebook kernel"}))
    assert backends.register("nb", nb) == "nb"
    assert backends.options("nb") == {"scale": 1.0}
    rep = replay.replay(shapes.seed_shape(), ["nb"])
    assert rep.row("nb").status == "pass"
    rep = replay.replay(shapes.seed_shape(), "oracle,nb", nb={"scale": 1.5})  # options, as for any backend
    assert rep.row("nb").status == "fail"
    again = types.SimpleNamespace(**{**vars(nb)})
    assert backends.register("nb", again) == "nb" and backends.get("nb") is again  # re-run the cell: replaced
    with pytest.raises(backends.BackendSpecError, match=r"^register\('torch', \.\.\.\): 'torch' is kdkit's built-in"):
        backends.register("torch", nb)
    with pytest.raises(backends.BackendSpecError, match=r"its NAME is 'nb', not 'other'"):
        backends.register("other", nb)
    backends.unregister("nb")
    assert "nb" not in backends.BACKENDS


# ---- installed backends: entry points of the group kdkit.backends -----------------------------------
def test_an_installed_backend_is_found_by_name_and_in_all(tmp_path, monkeypatch, capsys):
    site = _dist(tmp_path / "site", "kdkit_demo", {"demo": "kdkit_demo_mod:backend"}, "kdkit_demo_mod",
                 f"import sys\nsys.path.insert(0, {str(USER.parent)!r})\nfrom user_kernels import Backend\n"
                 "sys.path.pop(0)\nbackend = Backend('demo')\n")
    monkeypatch.syspath_prepend(str(site))
    assert "demo" in registry.entry_points()
    names = backends.resolve("all")
    assert names[:len(registry.BUILTIN)] == list(registry.BUILTIN) and "demo" in names
    assert backends.resolve("demo") == ["demo"] and backends.get("demo").NAME == "demo"
    # on the command line: listed by --backends all, judged like the others
    rc = cli.main(["replay", str(SEED), "--backends", "all", "--allow-skip"])
    out = capsys.readouterr().out
    assert rc == 0 and any(line.split()[:2] == ["demo", "pass"] for line in out.splitlines()), out


def test_an_installed_backend_that_does_not_import_is_a_row_saying_so(tmp_path, monkeypatch, capsys):
    site = _dist(tmp_path / "site", "kdkit_broken", {"broken": "kdkit_no_such_module:backend"})
    monkeypatch.syspath_prepend(str(site))
    rep = replay.replay(shapes.seed_shape(), "all")
    row = rep.row("broken")  # an error, not a skip: an installed kernel that is broken is not "not here"
    assert row.status == "error" and "cannot import (ModuleNotFoundError: No module named 'kdkit_no_such_module')" \
        in row.reason, row.reason
    # named on its own, it is bad input: one line, exit 2
    _bad(["--backends", "broken"], "entry point broken = kdkit_no_such_module:backend: cannot import "
                                   "(ModuleNotFoundError: No module named 'kdkit_no_such_module')", capsys)


def test_a_name_registered_twice_is_refused(tmp_path, monkeypatch, capsys):
    site = _dist(tmp_path / "a", "kdkit_clash", {"torch": "somewhere:backend"})
    monkeypatch.syspath_prepend(str(site))
    _bad(["--backends", "all"], "entry point torch = somewhere:backend (kdkit.backends, from kdkit_clash 1.0): "
                                "'torch' is kdkit's built-in backend's name; the package must register another", capsys)
    sys.path.remove(str(site))  # (monkeypatch puts sys.path back after the test)
    one = _dist(tmp_path / "b", "kdkit_one", {"twin": "mod_one:backend"})
    two = _dist(tmp_path / "c", "kdkit_two", {"twin": "mod_two:backend"})
    monkeypatch.syspath_prepend(str(one))
    monkeypatch.syspath_prepend(str(two))
    _bad(["--backends", "twin"], "entry point 'twin' (kdkit.backends) is registered twice: mod_two:backend "
                                 "(kdkit_two 1.0) and mod_one:backend (kdkit_one 1.0); uninstall one", capsys)
    # a file whose NAME is a built-in's, or one another spec took
    _bad(["--backends", str(_file(tmp_path, "torch", fname="copy.py"))],
         f"{tmp_path}/copy.py: NAME 'torch' is kdkit's built-in backend's; give yours a NAME of its own", capsys)
    first, second = _file(tmp_path, "same", fname="first.py"), _file(tmp_path, "same", fname="second.py")
    _bad(["--backends", f"{first},{second}"], f"{second}: NAME 'same' is taken by {first}:backend; give one of "
                                              "them another NAME (or unregister('same') first)", capsys)


# ---- bad specs: one line, exit 2, never a traceback ------------------------------------------------
def _bad(args, line, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["replay", str(SEED), *args])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"kdkit replay: argument --backends: {line}") and err.endswith(" (`kdkit replay --help` "
                                                                           "lists the options)\n"), err


@pytest.mark.parametrize("body, opts, tail", [
    ("NAME = 'x'\ndef unavailable(case=None): return None\n", None, "no run(case, ...) (returning a kdkit.backends.Result)"),
    ("def unavailable(case=None): return None\ndef run(case): pass\n", None, "no NAME (a str: the backend's name"),
    ("NAME = 'a b'\n", None, "NAME 'a b' is not a name"),
    ("NAME = 'x'\ndef run(case): pass\n", None, "no unavailable(case=None)"),
    (None, ", **kw", "run takes **kw: declare each option as a keyword with a default"),
    (None, ", *, nsplit", "run's option 'nsplit' has no default"),
    (None, "=None, *, x=1", None),  # fine: the case may have a default too
    ("NAME = 'x'\ndef unavailable(case=None): return None\ndef run(case): pass\ndef plan(batch): pass\n", None,
     "has plan but no launch(plan, q, k, v, kv_buffer, out): the live pair is both or neither"),
    ("NAME = 'x'\ndef unavailable(case=None): return None\ndef run(case, *, a=1): pass\n"
     "def prepare(case, *, b=1): pass\n", None, "prepare declares (b), run (a): declare the same options"),
    ("NAME = 'x'\ndef unavailable(case=None): return None\ndef run(case): pass\n"
     "def plan(batch): pass\ndef launch(plan, q): pass\n", None, "launch must take 6 argument(s)"),
    ("import nosuchmodule_kdkit\n", None, "cannot load (ModuleNotFoundError: No module named 'nosuchmodule_kdkit')"),
    ("def broken(:\n", None, "cannot load (SyntaxError: "),
    ("raise SystemExit('bye')\n", None, "cannot load (SystemExit: bye)"),
])
def test_a_file_that_does_not_meet_the_contract_is_one_line(tmp_path, capsys, body, opts, tail):
    p = _file(tmp_path, "x", body=body, opts=opts or "") if body is not None else _file(tmp_path, "x", opts=opts)
    if tail is None:
        assert backends.resolve(str(p)) == ["x"]
        return
    _bad(["--backends", f"oracle,{p}"], f"{p}: {tail}", capsys)


@pytest.mark.parametrize("spec, line", [
    ("nope", "unknown backend(s) nope; choose from oracle, torch, triton_sglang, triton_decode, cuda, captured, "
             "flashinfer_mla or 'all', or give "
             "a spec (package.module:attr, path/to/file.py[:attr])"),
    ("kdkit_no_such_pkg.mod:backend", "kdkit_no_such_pkg.mod:backend: cannot import (ModuleNotFoundError: No module "
                                      "named 'kdkit_no_such_pkg')"),
    ("kdkit.backends.torch_ref:nothing", "kdkit.backends.torch_ref:nothing: no attribute 'nothing'"),
    ("missing/file.py", "missing/file.py: No such file or directory"),
    ("some/dir", "some/dir: a file spec names a .py file: path/to/file.py[:attr]"),
    ("a b", "'a b' is not a backend; give a name, package.module[:attr] or path/to/file.py[:attr]"),
    (",", "no backend given; choose from"),
])
def test_a_spec_that_does_not_resolve_is_one_line(spec, line, capsys):
    _bad(["--backends", spec], line, capsys)


def test_user_attr_missing_names_the_backends_in_the_file(capsys):
    _bad(["--backends", f"{USER}:rigth"], f"{USER}:rigth: no attribute 'rigth' (backends in it: right, wrong, paired)",
         capsys)


# ---- a user's backend, judged by kdkit replay -----------------------------------------------------
@pytest.mark.parametrize("attr, rc", [("right", 0), ("wrong", 1)])
def test_replay_judges_a_backend_given_by_file_spec(attr, rc, capsys):
    assert cli.main(["replay", str(SEED), "--backends", f"{USER}:{attr}"]) == rc
    out = capsys.readouterr()
    row = next(line.split() for line in out.out.splitlines() if line.startswith(f"{attr} "))
    assert row[1] == ("pass" if rc == 0 else "fail"), out.out
    if rc:
        assert f"{attr} failed" in out.err
