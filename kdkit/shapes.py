"""Named sets of call shapes, kept as data in kdkit/shapes.json: the bundled cases, the GPU tests'
named shapes, the benchmark grid (and its quick subset), the notebooks' defaults.

    from kdkit import shapes
    shapes.names()                      # ['bundled', 'probes', 'gpu-tests', 'gpu-graph-replay',
                                        #  'gpu-selfcheck', 'bench', 'bench-quick', 'nsplit']
    for s in shapes.get("bench-quick"): # dicts: name, bs, prefix, q_len, heads, tree, seed (+ extras)
        case = shapes.make_case(s)      # kdkit.synth.make_case with those values
    shapes.find("gpu-tests", "mutants") # one shape by name
    shapes.seed_shape()                 # the seed's failing call (the bundled "seed-shape")

prefix and q_len are an int (every request) or a list (one per request). A set in the file lists
shapes, or gives a grid (every combination of bs, prefix, q_len, heads, less those over the set's
limits: kv_rows = the batch's prefix rows, scores = q rows x heads x KV length) plus optional
extra shapes; a set's "defaults" fill the keys its shapes leave out (over the file's "defaults").
The file is checked when read: a wrong key or value raises ShapeError naming the set and the shape.
"""
from __future__ import annotations

import copy
import functools
import itertools
import json
from pathlib import Path

from . import synth
from .constants import LAYOUTS

PATH = Path(__file__).with_name("shapes.json")
REQUIRED = ("bs", "prefix", "q_len", "heads", "tree")
OPTIONAL = ("name", "seed", "layout", "magnitude", "logit_cap")
GRID_KEYS = ("bs", "prefix", "q_len", "heads")  # a grid's axes, expanded in this order
LIMITS = ("kv_rows", "scores")                  # what a grid's "limits" may bound
SET_KEYS = ("doc", "defaults", "grid", "limits", "shapes")  # what a set may hold


class ShapeError(ValueError):
    """A shapes file or set that cannot be used; the message names the set, the shape and the key."""


def _check(where: str, s: dict) -> dict:
    unknown = sorted(set(s) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise ShapeError(f"{where}: unknown key(s) {unknown}; a shape has {list(REQUIRED + OPTIONAL)}")
    missing = [k for k in REQUIRED if k not in s]
    if missing:
        raise ShapeError(f"{where}: missing {missing}")
    bs = s["bs"]
    if not isinstance(bs, int) or bs < 1:
        raise ShapeError(f"{where}: bs {bs!r} must be an int >= 1")
    for key, lo in (("prefix", 0), ("q_len", 1)):
        v = s[key]
        vals = v if isinstance(v, list) else [v]
        if (isinstance(v, list) and len(v) != bs) or not all(isinstance(x, int) and x >= lo for x in vals):
            raise ShapeError(f"{where}: {key} {v!r} must be an int >= {lo} or a list of {bs} of them (one per request)")
    if not isinstance(s["heads"], int) or s["heads"] < 1:
        raise ShapeError(f"{where}: heads {s['heads']!r} must be an int >= 1")
    if s["tree"] not in synth.TREES:
        raise ShapeError(f"{where}: tree {s['tree']!r}; choose from {synth.TREES}")
    if "layout" in s and s["layout"] not in LAYOUTS:
        raise ShapeError(f"{where}: layout {s['layout']!r}; choose from {LAYOUTS}")
    return s


def _expand(set_name: str, spec: dict, defaults: dict) -> list[dict]:
    bad_keys = sorted(set(spec) - set(SET_KEYS))
    if bad_keys:
        raise ShapeError(f"set {set_name!r}: unknown key(s) {bad_keys}; a set has {list(SET_KEYS)}")
    rows = []
    grid = spec.get("grid")
    if grid is not None:
        bad = sorted(set(grid) - set(GRID_KEYS))
        if bad or not all(isinstance(grid.get(k), list) and grid[k] for k in GRID_KEYS):
            raise ShapeError(f"set {set_name!r}: a grid gives a non-empty list for each of {list(GRID_KEYS)}"
                             + (f"; unknown axes {bad}" if bad else ""))
        limits = spec.get("limits", {})
        if sorted(set(limits) - set(LIMITS)):
            raise ShapeError(f"set {set_name!r}: unknown limits {sorted(set(limits) - set(LIMITS))}; "
                             f"a grid may bound {list(LIMITS)}")
        rows += [s for s in (dict(zip(GRID_KEYS, combo))
                             for combo in itertools.product(*(grid[k] for k in GRID_KEYS)))
                 if all(size(s)[k] <= v for k, v in limits.items())]
    rows += list(spec.get("shapes", []))
    if not rows:
        raise ShapeError(f"set {set_name!r}: neither a grid nor shapes")
    out = []
    for i, row in enumerate(rows):
        s = {**defaults, **spec.get("defaults", {}), **row}
        name = s.get("name") or label(s)
        out.append(_check(f"set {set_name!r} shape {i} ({name})", {**s, "name": name}))
    names = [s["name"] for s in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ShapeError(f"set {set_name!r}: shape names {dup} appear more than once")
    return out


@functools.lru_cache(maxsize=None)
def _load(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as e:
        raise ShapeError(f"{path}: cannot read the shapes file: {e}") from None
    if doc.get("format") != "kdkit-shapes" or doc.get("version") != 1:
        raise ShapeError(f"{path}: not a kdkit-shapes v1 file (format {doc.get('format')!r}, "
                         f"version {doc.get('version')!r})")
    defaults = doc.get("defaults", {})
    return {name: _expand(name, spec, defaults) for name, spec in doc.get("sets", {}).items()}


def names(path: str | Path = PATH) -> list[str]:
    return list(_load(str(path)))


def get(name: str, path: str | Path = PATH) -> list[dict]:
    """The shapes of set `name`, as fresh dicts (changing them changes nothing here)."""
    sets = _load(str(path))
    if name not in sets:
        raise KeyError(f"no shape set {name!r} in {path}; choose from {', '.join(sets)}")
    return copy.deepcopy(sets[name])


def find(set_name: str, shape_name: str, path: str | Path = PATH) -> dict:
    for s in get(set_name, path):
        if s["name"] == shape_name:
            return s
    raise KeyError(f"no shape {shape_name!r} in set {set_name!r}; "
                   f"choose from {', '.join(s['name'] for s in get(set_name, path))}")


def per_request(shape: dict, key: str) -> list[int]:
    """A shape's prefix or q_len as one value per request (an int stands for every request)."""
    v = shape[key]
    return list(v) if isinstance(v, list) else [v] * shape["bs"]


def size(shape: dict) -> dict:
    """kv_rows: the batch's prefix rows; scores: q rows x heads x KV length, over the batch."""
    prefix, q_len = per_request(shape, "prefix"), per_request(shape, "q_len")
    return {"kv_rows": sum(prefix),
            "scores": sum(q * shape.get("heads", 1) * (p + q) for p, q in zip(prefix, q_len))}


def _short(n) -> str:
    if isinstance(n, list):
        return "[" + ",".join(_short(x) for x in n) + "]"
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def label(shape: dict) -> str:
    """A short stable id: bs1-p32K-q9-h8 (lists as [..])."""
    return (f"bs{shape['bs']}-p{_short(shape['prefix'])}-q{_short(shape['q_len'])}"
            f"-h{shape.get('heads', '?')}")


def make_case(shape: dict, **overrides):
    """The synthetic case of a shape (kdkit.synth.make_case); overrides go to make_case. A shape
    must name bs, prefix and q_len; what else it leaves out takes make_case's defaults."""
    missing = [k for k in ("bs", "prefix", "q_len") if k not in shape]
    if missing:
        raise ShapeError(f"shape {shape}: no {', '.join(missing)} (a shape names bs, prefix and q_len; "
                         "heads, tree, seed, layout, magnitude and logit_cap are optional)")
    kw = {k: shape[k] for k in ("bs", "prefix", "q_len", "heads", "tree", "seed", "layout", "magnitude",
                                "logit_cap") if k in shape}
    kw["case_id"] = shape.get("name") or label(shape)
    kw.update(overrides)
    return synth.make_case(**kw)


def seed_shape(**kw):
    """The seed's failing call: bs 1, prefix 21, q_len 9, H 8, a tree (mask 9 x 30 = 270); the shape
    is "seed-shape" of kdkit/shapes.json's "bundled" set."""
    return make_case(find("bundled", "seed-shape"), **kw)


__all__ = ["PATH", "ShapeError", "names", "get", "find", "label", "per_request", "size", "make_case", "seed_shape"]
