"""Gather by a short convolution: the Gather role carried by no head.

Mamba-1, Mamba-2 and the hybrids' SSM layers run a depthwise causal convolution of width ``k`` (4 in every
published checkpoint) before the scan:

    conv(x)[t] = b + Σ_{j=0..k-1} w[k-1-j] · x[t-j]

Its lagged taps (``j ≥ 1``) bring the ``k - 1`` tokens before ``t`` into ``t``.  When a segment fits in that window
(``k = v ;`` is four tokens), the conv condenses the segment into its read position before any head acts: a
Gather that no head's pattern shows and no head ablation removes, after which an SSM head of the same layer can
already aggregate (``records-mamba2``: layer 0's heads read the correct record's ``;``, and no earlier layer
exists to gather it).

**The test**, per layer with a short conv: keep only the current token's tap (``j = 0``) at every segment's read
position (:func:`gather_aggregate.interventions.ablation.conv_current_tap_hooks`) and measure the loss as a share of the
retrieval margin (:class:`gather_aggregate.detect.causal_evidence.Prober`).  The baseline is the same intervention at as
many *other* tokens of the segments (one drawn per segment among its tokens before the read position), repeated
with ``N_RANDOM`` seeds (a segment with one token before its read position gives the same token every time, so
the draws can coincide; when that token matters itself, e.g. a key read by a key-mover, the baseline is high and
the conv is not named: the test errs towards naming nothing).  The layer's conv is named a Gather when its loss is at least ``NAME_MIN`` of the margin
and beats the baseline's median by at least ``NAME_MIN``: the bar a head group must clear.  The baseline is drawn
only for layers whose own loss reaches ``NAME_MIN`` (one forward per batch for each other layer), so a deep model
pays ``N_RANDOM`` forwards only where a conv matters; each restarts at the conv's layer from the clean run's input
to it.  It is a Gather *into the read position*, so it
is only tested at the read position the detector uses (``read``).
"""

from __future__ import annotations

import random
import statistics
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.core.protocol import HookedModel
from gather_aggregate.detect.causal_evidence import N_RANDOM, Prober
from gather_aggregate.detect.pattern_evidence import read_positions
from gather_aggregate.interventions.ablation import conv_current_tap_hooks, short_conv_layers


def conv_positions(b: Any, read: str, *, seed: int | None) -> Tensor:
    """``[batch, pos]`` bool: each readable segment's read position (``seed=None``), or one other token of each
    such segment before it, drawn with ``seed``."""
    r, ok = read_positions(b, read)
    mask = torch.zeros(b.tokens.shape, dtype=torch.bool, device=b.tokens.device)
    rng = random.Random(seed)
    read_at, starts = r.tolist(), b.seg_start.tolist()  # once, not a GPU sync per segment
    for i, j in ok.nonzero().tolist():
        pos = int(read_at[i][j])
        if seed is not None:
            pos = rng.randrange(int(starts[i][j]), pos)
        mask[i, pos] = True
    return mask


def conv_gather(model: HookedModel, prober: Prober, read: str, name_min: float, *, seed: int = 0
                ) -> list[dict[str, Any]]:
    """One record per layer with a short conv: ``layer``, ``loss`` (current tap only at the read positions),
    ``random`` (the baseline draws), ``random_median``, ``named`` and ``why``."""
    out = []
    for layer in short_conv_layers(model):
        loss = prober.loss_with(lambda b, layer=layer: conv_current_tap_hooks(model, layer, conv_positions(b, read,
                                                                                                     seed=None)),
                                start=layer)
        if loss < name_min:
            out.append({"layer": layer, "loss": loss, "random": [], "random_median": float("nan"), "named": False,
                        "why": f"conv lags removed at the read positions: loss {loss:.2f} < {name_min}"})
            continue
        rand = [prober.loss_with(lambda b, layer=layer, k=k: conv_current_tap_hooks(
            model, layer, conv_positions(b, read, seed=seed * 1000 + k)), start=layer) for k in range(N_RANDOM)]
        med = statistics.median(rand)
        named = loss - med >= name_min
        out.append({"layer": layer, "loss": loss, "random": rand, "random_median": med, "named": named,
                    "why": (f"conv lags removed at the read positions: loss {loss:.2f} vs {med:.2f} at other segment "
                            f"tokens ({'>=' if named else '<'} {name_min} above)")})
    return out
