"""Checks that the real-width tiers (``test_realwidth`` on CPU in fp32, ``test_gpu`` on CUDA in bf16) run on every
loaded model, each at its own dtype's tolerance."""

from __future__ import annotations

from typing import Any

import torch

from gather_aggregate.scan.exact import exact_scan, naive_scan


def check_last_row_patterns(model: Any, tokens: torch.Tensor, *, atol: float, rtol: float) -> None:
    """For every layer (heads 0 and the last), the pattern asked for the last row only equals the full pattern's
    last row."""
    for info in model.layers:
        heads = [0, info.n_heads - 1]
        full = model.pattern(tokens[:1], info.index, heads=heads)
        last = model.pattern(tokens[:1], info.index, heads=heads, rows=-1)
        assert torch.allclose(last[..., 0, :], full[..., -1, :], atol=atol, rtol=rtol)


def check_exact_scan_matches_naive(model: Any, tokens: torch.Tensor, *, rel_tol: float) -> None:
    """The exact scan's scores equal the naive scan's (relative to ``max(1, |naive|)``) on heads 0 and
    ``n_heads // 2`` of every layer, for the log-prob of each prompt's last token at the last position."""
    target = tokens[:, -1]

    def metric(lg):
        return lg[:, -1].float().log_softmax(-1).gather(-1, target[:, None]).mean()

    heads = [(info.index, h) for info in model.layers for h in (0, info.n_heads // 2)]
    exact = exact_scan(model, tokens, metric, heads=heads, progress=False).scores()
    naive = naive_scan(model, tokens, metric, heads=heads).scores()
    for hd in heads:
        assert abs(exact[hd] - naive[hd]) <= rel_tol * max(1.0, abs(naive[hd])), (hd, exact[hd], naive[hd])
