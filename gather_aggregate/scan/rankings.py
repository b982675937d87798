"""How well one head scan ranks like another: Spearman ρ, top-k overlap, and agreement on the resolved pairs.

Spearman ρ over every head weighs the order of heads whose drops the prompts cannot tell apart as much as the
order of the heads that matter.  When the reference scan carries per-prompt standard errors (an exact scan with
a per-prompt metric, :meth:`gather_aggregate.core.readout.ReadoutMetric.mean_of`), :func:`compare_rankings` also
counts the pairs of heads the reference *resolves*, those whose drops differ by more than ``z`` combined
standard errors,

    |s_i − s_j| > z · sqrt(se_i² + se_j²),

and the share of them the other scan puts in the same order (a tie in the other scan counts one half).  The
combined error treats the two heads' drops as independent; on the same prompts they are correlated, so the
count is approximate in either direction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gather_aggregate.core.arguments import count, number
from gather_aggregate.core.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from gather_aggregate.scan.result import ScanResult


def compare_rankings(a: ScanResult, b: ScanResult, k: int = 5, *, z: float = 2.0) -> dict[str, float]:
    """Spearman ρ between two scans' scores over their common heads, and top-``k`` overlap.

    With standard errors on every row of ``a`` (the reference), also ``resolved_pairs`` (how many pairs ``a``
    orders beyond ``z`` combined standard errors) and ``resolved_agreement`` (the share of them ``b`` orders the
    same way; NaN when there are none).
    """
    for what, res in (("a", a), ("b", b)):
        if not all(hasattr(res, m) for m in ("rows", "scores", "top")):
            raise InputError(f"{what} must be a ScanResult (what exact_scan / attribution_scan return, or "
                             f"ScanResult.load(path)), got {type(res).__name__}")
    from gather_aggregate.scan.result import ScanResult

    for what, res in (("a", a), ("b", b)):  # every score equal: a Spearman ρ of 0 would read as "unrelated"
        ScanResult.check_ordered(res, what)  # type: ignore[arg-type]
    k, z = count(k, "k"), number(z, "z (standard errors)", minimum=0)
    sa, sb = a.scores(), b.scores()
    common = sorted(set(sa) & set(sb))
    if len(common) < 2:
        raise InputError("need at least two heads in common to compare rankings")
    xa = torch.tensor([sa[hd] for hd in common], dtype=torch.float64)
    xb = torch.tensor([sb[hd] for hd in common], dtype=torch.float64)
    rho = float(_pearson(_ranks(xa), _ranks(xb)))
    top_a, top_b = set(a.top(k)), set(b.top(k))
    out = {"spearman": rho, f"top{k}_overlap": float(len(top_a & top_b)), "n_heads": float(len(common))}
    se = {(r["layer"], r["head"]): r.get("stderr") for r in a.rows}
    if all(se[hd] is not None for hd in common):
        pairs, agree = resolved_pairs(xa, torch.tensor([se[hd] for hd in common], dtype=torch.float64), xb, z)
        out["resolved_pairs"] = float(pairs)
        out["resolved_agreement"] = agree / pairs if pairs else float("nan")
    return out


def resolved_pairs(score: Tensor, stderr: Tensor, other: Tensor, z: float) -> tuple[int, float]:
    """``(n, agree)``: the pairs ``i < j`` with ``|score_i − score_j| > z·sqrt(se_i² + se_j²)``, and how many of
    them ``other`` orders the same way (ties one half)."""
    gap = score[:, None] - score[None, :]
    resolved = gap.abs() > z * (stderr[:, None] ** 2 + stderr[None, :] ** 2).sqrt()
    resolved = torch.triu(resolved, diagonal=1)
    same = torch.sign(gap) * torch.sign(other[:, None] - other[None, :])  # 1 same order, -1 reversed, 0 tied
    return int(resolved.sum()), float(((same[resolved] + 1) / 2).sum())


def _ranks(x: Tensor) -> Tensor:
    """Average ranks (ties share the mean rank)."""
    order = torch.argsort(x)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=x.dtype)
    for v in torch.unique(x):
        m = x == v
        if m.sum() > 1:
            ranks[m] = ranks[m].mean()
    return ranks


def _pearson(a: Tensor, b: Tensor) -> Tensor:
    a, b = a - a.mean(), b - b.mean()
    denom = (a.norm() * b.norm()).clamp_min(1e-12)
    return (a * b).sum() / denom
