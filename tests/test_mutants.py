"""Every mutant is caught: the torch backend plants each bug of kdkit.judge.wrong_kernels (the kernel's list) and
the judge (kdkit.judge.compare) must fail it on every bundled case and every probe where it can act; the
bugs of issue 8 are caught at prefix 21, 8K, 32K and 128K on one random draw (seed 8; see
test_issue_bugs_caught_at_every_prefix for the draws where one dropped row of 128K hides). A judge
that passes a mutant is broken."""
from __future__ import annotations

import re

import pytest
import torch

from kdkit import bundled, kernel, shapes, synth
from kdkit.judge import heavy_cases, trials, wrong_kernels
from kdkit.backends import torch_ref
from kdkit.case import load
from kdkit.kernel import jit, spec
from kdkit.kernel import mutants as kernel_mutants
from kdkit.layout import draft_visibility, request_kv

from conftest import DATA

GOOD = [e["path"] for e in bundled.load_manifest(DATA)["cases"] if e["expected_replay"] == "pass"]


def test_registry_is_the_kernels():
    """One list of bugs for the CPU and the GPU: the kernel's registry has exactly these names."""
    assert set(wrong_kernels.MUTANTS) == set(kernel.MUTANTS)
    assert len(wrong_kernels.MUTANTS) >= 10 and all(d.strip() for d in wrong_kernels.MUTANTS.values())


def test_one_entry_per_mutant_holds_its_hooks():
    """kdkit/judge/wrong_kernels.py is the one registry: the kernel's build defines are its entry's hooks, and
    each hook is one that cuda/kd_mutants.cuh declares."""
    cuh = (jit.CUDA_DIR / "kd_mutants.cuh").read_text()
    for name, m in wrong_kernels.REGISTRY.items():
        assert m.what == wrong_kernels.MUTANTS[name] and m.hooks, name
        assert kernel_mutants.defines(name) == m.hooks
        for hook in m.hooks:
            assert re.search(rf"#ifndef\s+{re.escape(hook.split('(')[0])}\b", cuh), (name, hook)
    assert kernel_mutants.defines(None) == {}


def test_hooks_are_written_with_the_kernels_macros():
    """A hook restates none of the kernel's numbers (tile rows, latent or rope dims): it names the
    macro, which the .cu or the build's defines provide where the hook expands."""
    src = "".join((jit.CUDA_DIR / f).read_text() for f in ("mla_tc.cu", "kd_common.cuh"))
    defined = set(re.findall(r"#define\s+(KD_\w+)", src)) | set(spec.KernelConfig().defines())
    for name, m in wrong_kernels.REGISTRY.items():
        for hook, text in m.hooks.items():
            assert not re.search(r"\b(16|32|64|512|576)\b", text), f"{name}: {hook} = {text} restates a number"
            for macro in re.findall(r"\bKD_\w+", text):
                assert macro in defined, f"{name}: {macro} is not defined for the build"


def test_unknown_mutant_is_one_error_for_torch_and_cuda():
    """The same ValueError, naming the choices, from the torch backend and the kernel's build."""
    want = f"mutant 'no-such-bug' is not registered; choose from {', '.join(wrong_kernels.MUTANTS)}"
    with pytest.raises(ValueError) as on_torch:
        torch_ref.run(shapes.seed_shape(), mutant="no-such-bug")
    with pytest.raises(ValueError) as on_cuda:
        spec.KernelConfig(mutant="no-such-bug")
    assert str(on_torch.value) == str(on_cuda.value) == want


def test_bundle_holds_the_probes():
    assert {f"probes/{n}.pt" for n in heavy_cases.BUNDLED} <= set(GOOD)


@pytest.fixture(scope="module")
def bundled_rows():
    cases = {p: load(DATA / p) for p in GOOD}
    return trials.mutant_rows("torch", cases)


@pytest.mark.parametrize("name", list(wrong_kernels.MUTANTS))
def test_mutant_caught_on_every_bundled_case_and_probe(bundled_rows, name):
    rows = [r for r in bundled_rows if r.mutant == name]
    assert len(rows) == len(GOOD)
    missed = [(r.case_id, r.ratio) for r in rows if r.status == "MISSED"]
    assert not missed, f"{name} passed the judge on {missed}"
    acted = [r for r in rows if r.status == "caught"]
    assert acted, f"{name} could not act on any bundled case"
    # the probes exist so that no bug needs the LSE to be seen: caught on the output alone too
    for r in acted:
        if r.case_id.startswith("probes/"):
            assert r.output_ratio > 1, (name, r.case_id, r.output_ratio)


def _why_inert(name: str, case) -> str | None:
    """Why a mutant cannot act on a case, from the case's structure and the kernel's splits."""
    kv_lens = [int(p) + n for p, n in zip(case.prefix_lens.tolist(), case.q_lens)]
    splits = [torch_ref.split_bounds(kv, torch_ref.default_nsplit(case)) for kv in kv_lens]
    if name in ("mask-row-offset", "mask-col-offset") and case.custom_mask is None:
        return "no custom mask"
    if name == "merge-no-rescale" and all(len(s) <= 1 for s in splits):
        return "one split per request"
    if name == "skip-pipeline-wait" and all(e - b <= 32 for s in splits for b, e in s):
        return "every split is one tile"
    return None


def test_mutants_that_cannot_act_are_the_expected_ones(bundled_rows):
    """A mutant that cannot act on a case leaves its output bit-identical: mask mutants on a case
    without a mask, the split merge where the kernel keeps one split, the pipeline mutant where
    every split is a single tile. Any other inert pair would be a mutant that is not planted."""
    cases = {p: load(DATA / p) for p in GOOD}
    for r in bundled_rows:
        why = _why_inert(r.mutant, cases[r.case_id])
        assert (r.status == "cannot act") == (why is not None), (r.mutant, r.case_id, r.status, why)
    assert any(r.status == "cannot act" for r in bundled_rows)


def test_table_names_the_check_and_margin(bundled_rows):
    text = trials.table(bundled_rows)
    assert text.count("\n") == len(wrong_kernels.MUTANTS) + 1
    assert f"| no-scale | {len(GOOD)}/{len(GOOD)} cases | lse x" in text and "MISSED" not in text


@pytest.mark.parametrize("name", ["probe-32k", "probe-128k"])
def test_long_probes_catch_every_mutant_without_the_lse(name):
    """The 32K and 128K probes (generated: too large to commit): every mutant caught on the output
    alone, where random data at that length hides several of them."""
    rows = trials.mutant_rows("torch", {name: heavy_cases.make(name)})
    for r in rows:
        assert r.status in ("caught", "cannot act"), (r.mutant, r.status, r.ratio)
        if r.status == "caught":
            assert r.ratio > 1 and r.output_ratio > 1, (r.mutant, r.ratio, r.output_ratio)
    assert sum(r.status == "caught" for r in rows) >= len(wrong_kernels.MUTANTS) - 1


# ---- issue 8's planted bugs, on random data (seed 8), at every prefix length ---------------------
def _softmax_over_heads(case):
    """The softmax taken over the head axis instead of the KV axis (an issue-8 bug the kernel's
    hooks do not plant); the LSE left right, so only the output can show it."""
    good = torch_ref.run(case, nsplit=1)
    out = torch.zeros_like(good.out, dtype=torch.float32)
    for b in range(case.batch_size):
        qs, qe = (int(x) for x in case.qo_indptr[b: b + 2])
        K, V, p = request_kv(case, b)
        s = torch.einsum("nhd,kd->nhk", case.q[qs:qe].float(), K.float()) * case.sm_scale
        vis = torch.cat([torch.ones(qe - qs, p, dtype=torch.bool), draft_visibility(case, b)], dim=1)
        P = torch.softmax(s, dim=1).masked_fill(~vis[:, None, :], 0.0)
        out[qs:qe] = P @ V.float()
    return type(good)(out.bfloat16(), good.lse, good.info)


ISSUE_BUGS = {
    # none of these is about splits: one split keeps the 128K runs short
    "no sm_scale": lambda c: torch_ref.run(c, mutant="no-scale", nsplit=1),
    "mask row shifted": lambda c: torch_ref.run(c, mutant="mask-row-offset", nsplit=1),
    "mask column shifted": lambda c: torch_ref.run(c, mutant="mask-col-offset", nsplit=1),
    "draft K/V dropped": lambda c: torch_ref.run(c, mutant="prefix-only-kv", nsplit=1),
    "softmax over the wrong axis": _softmax_over_heads,
    "V from dims 64:576": lambda c: torch_ref.run(c, mutant="v-wrong-dims", nsplit=1),
    "last KV row dropped": lambda c: torch_ref.run(c, mutant="kv-len-off-by-one", nsplit=1),
    "logit cap ignored": lambda c: torch_ref.run(c.clone(logit_cap=0.0), nsplit=1),
}


@pytest.fixture(scope="module", params=[21, 8192, 32768, 131072], ids=lambda p: f"prefix{p}")
def random_long(request):
    """Random (Kimi-like) data, bs 1, q_len 9, H 8, a DDTree-like tree, logit cap 30; the oracle once."""
    case = synth.make_case(bs=1, prefix=request.param, q_len=9, heads=8, tree="ddtree", seed=8,
                           logit_cap=30.0, case_id=f"random-p{request.param}")
    return case, trials.Reference(case)


@pytest.mark.parametrize("bug", list(ISSUE_BUGS))
def test_issue_bugs_caught_at_every_prefix(random_long, bug):
    """Issue 8: 29 of 32 pairs were caught, and random data at 32K let the draft drop through. This
    shows all eight fail the judge (with the LSE) at prefix 21, 8K, 32K and 128K on one draw of
    random data, seed 8; the LSE carries the small ones (one KV row of 128K moves the output by less
    than a bf16 spacing). One seed, not every draw: at 128K "last KV row dropped" moves the LSE by
    about a correct production kernel's rounding (one of 131K random keys; LSE_ULPS is calibrated on
    SGLang's Triton), caught here by `lse` x2.29 but missed on seeds 4, 5, 9 (x0.43, x0.91, x0.50;
    seed 3 x1.07): a physical limit, not a threshold to move. probe-128k, whose last KV row is built
    to carry weight, catches it every time, on the output alone too
    (test_long_probes_catch_every_mutant_without_the_lse)."""
    case, ref = random_long
    t = trials.check_result("torch", ISSUE_BUGS[bug](case), ref)
    v = t.with_lse
    assert not v.passed, f"{bug} passed at {case.case_id}: {v.reasons}"
    assert v.caught_by and v.reasons[0].split(":")[0].split(" ")[0] in v.checks


def test_correct_kernel_passes_on_the_random_long_cases(random_long):
    case, ref = random_long
    t = trials.check_result("torch", torch_ref.run(case, p_bf16=True), ref)   # P rounded: the tight one
    assert t.passed and t.ratio < 0.75, t.ratio
