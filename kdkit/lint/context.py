"""What every check reads and returns: `Finding`, the `Context` (the case plus what the checks so
far learned) and the small formatting helpers of the messages."""
from __future__ import annotations

from dataclasses import dataclass

import torch


SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    code: str        # stable kebab-case id, e.g. "mask-indptr-sliced"
    severity: str    # "error" | "warning" | "info"
    field: str       # the case field concerned, e.g. "mask_indptr"
    message: str     # what is wrong, with the numbers
    fix: str         # what to do, spelled out


def _ints(t: torch.Tensor) -> list[int]:
    return t.detach().reshape(-1).cpu().long().tolist()


def _show(xs, k: int = 8) -> str:
    xs = list(xs)
    if len(xs) <= k:
        return "[" + ", ".join(str(x) for x in xs) + "]"
    return "[" + ", ".join(str(x) for x in xs[:k]) + f", ... (+{len(xs) - k} more)]"


def _n(k: int, one: str, many: str) -> str:
    return f"{k} {one if k == 1 else many}"


def _dt(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _cumsum0(xs: list[int]) -> list[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


class Context:
    """The case plus what the checks so far learned: which fields are unusable (`bad`), and
    derived values (bs, T, q_lens, ...) that later checks may rely on once earlier ones passed."""

    def __init__(self, case):
        self.case = case
        self.bad: set[str] = set()
        self.named: set[str] = set()        # named-bug codes found so far
        self.mask_starts: list[int] | None = None  # per-request mask offsets, once trusted
        self._blocks = None

    def get(self, name):
        return getattr(self.case, name, None)

    def need(self, *names) -> bool:
        return all(n not in self.bad and isinstance(self.get(n), torch.Tensor) for n in names)

    def scalar(self, name, typ, default=None):
        v = getattr(self.case, name, default)
        if typ is int and isinstance(v, bool):
            return default
        return v if isinstance(v, typ) else default

    # derived values: only valid once the checks that guard them have run
    @property
    def layout(self):
        return getattr(self.case, "layout", None)

    @property
    def T(self) -> int | None:
        return int(self.get("q").shape[0]) if self.need("q") else None

    @property
    def bs(self) -> int | None:
        return self.get("qo_indptr").numel() - 1 if self.need("qo_indptr") else None

    @property
    def qo(self) -> list[int]:
        return _ints(self.get("qo_indptr"))

    @property
    def q_lens(self) -> list[int]:
        qo = self.qo
        return [b - a for a, b in zip(qo[:-1], qo[1:])]

    @property
    def prefix(self) -> list[int]:
        return _ints(self.get("prefix_lens"))

    @property
    def kvp(self) -> list[int]:
        return _ints(self.get("kv_indptr"))

    @property
    def block_sizes(self) -> list[int]:
        """Mask entries per request: q_len x (prefix + q_len)."""
        return [q * (p + q) for q, p in zip(self.q_lens, self.prefix)]

    def blocks(self):
        """Per request: None, or (q_len, prefix, prefix_all_true, first_false_prefix_row_col,
        draft [q_len, q_len] numpy bool). Needs trusted mask offsets."""
        if self._blocks is not None:
            return self._blocks
        if self.mask_starts is None or not self.need("custom_mask", "qo_indptr", "prefix_lens"):
            return None
        mask = self.get("custom_mask").reshape(-1)
        out = []
        for b, (n, p) in enumerate(zip(self.q_lens, self.prefix)):
            s, size = self.mask_starts[b], n * (p + n)
            if n == 0 or s < 0 or s + size > mask.numel():
                out.append(None)
                continue
            blk = mask[s: s + size].reshape(n, p + n) != 0
            pre = blk[:, :p]
            first_false = None
            if p and not bool(pre.all()):
                r, c = (int(x) for x in (~pre).nonzero()[0])
                first_false = (r, c, int((~pre).sum()))
            out.append((n, p, first_false, blk[:, p:].cpu().numpy()))
        self._blocks = out
        return out
