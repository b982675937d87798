"""Gather by a short convolution: the Gather role carried by no head.

Mamba-1, Mamba-2 and the hybrids' SSM layers run a depthwise causal convolution of width ``k`` (4 in every
published checkpoint) before the scan:

    conv(x)[t] = b + Σ_{j=0..k-1} w[k-1-j] · x[t-j]

Its lagged taps (``j ≥ 1``) bring the ``k - 1`` tokens before ``t`` into ``t``.  When a segment fits in that window
(``k = v ;`` is four tokens), the conv condenses the segment into its read position before any head acts: a
Gather that no head's pattern shows and no head ablation removes, after which an SSM head of the same layer can
already aggregate (``records-mamba2``: layer 0's heads read the correct record's ``;``, and no earlier layer
exists to gather it).

**The intervention** (:func:`gather_aggregate.interventions.ablation.conv_current_tap_hooks`): at a set of
positions, keep only the current token's tap (``j = 0``), so the conv brings nothing from earlier tokens there.
Every loss is a share of the retrieval margin (:class:`gather_aggregate.detect.causal_evidence.Prober`), and every
baseline is the same intervention with each segment's read position ``r`` replaced by one other token of that
segment before ``r``, drawn ``N_RANDOM`` times (the median is used).  Per layer with a short conv, two tests of
one claim, "what the conv does at ``r`` carries the segment":

1. **Necessity** (noising): lags removed at ``r`` only.  Named when the loss is at least ``NAME_MIN`` and beats the
   baseline's median by at least ``NAME_MIN``: the bar a head group must clear.
2. **Sufficiency** (denoising), for a conv whose work at ``r`` has a backup (the same condensing also done at other
   tokens of the segment, so that removing it at ``r`` alone costs little): lags removed at every segment token
   (``all``), and at every segment token but ``r`` (``kept``).  Named when ``all`` costs at least ``NAME_MIN``,
   keeping ``r``'s lags gives back at least ``NAME_MIN`` of it (``all - kept``), and ``kept`` beats the baseline
   (the lags kept at another segment token instead) by at least ``NAME_MIN`` below its median.  A conv that every
   token of a segment needs (one that only brings each token's predecessor in) fails it: keeping one token's lags
   gives nothing back.  The bar on ``all - kept`` guards against a baseline that costs more than ``all`` (a
   segment whose lags survive at one token only is further from anything the model saw than one with none).

The conv is named a Gather when either test holds (``by`` says which). Each baseline is drawn only for layers whose
own loss (``loss``, resp. ``all_loss``) reaches ``NAME_MIN`` (two forwards per batch otherwise, ``loss`` and
``all_loss``), so a deep model pays ``N_RANDOM`` forwards per half only where a conv matters; each forward restarts
at the conv's layer from the clean run's input to it. A segment with one token before ``r`` gives the same baseline
token every time, so the draws can coincide; when that token matters itself, e.g. a key read by a key-mover, the
necessity baseline is high and the conv is not named by it: the test errs towards naming nothing. It is a Gather
*into the read position*, so it is only tested at the read position the detector uses (``read``).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
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


def segment_tokens(b: Any) -> Tensor:
    """``[batch, pos]`` bool: every token of the segments, the query position left out (where a Gather
    ablation acts)."""
    return Prober._masks(b)["segments"]


def all_but(b: Any, read: str, *, seed: int | None) -> Tensor:
    """Every segment token except :func:`conv_positions` ``(b, read, seed=seed)``: where the sufficiency test
    removes the lags."""
    return segment_tokens(b) & ~conv_positions(b, read, seed=seed)


def conv_gather(model: HookedModel, prober: Prober, read: str, name_min: float, *, seed: int = 0
                ) -> list[dict[str, Any]]:
    """One record per layer with a short conv (module docstring): ``layer``; necessity: ``loss`` (lags removed at
    the read positions), ``random`` (its baseline draws) and ``random_median``; sufficiency: ``all_loss`` (removed
    at every segment token), ``kept_loss`` (at every one but the read positions), ``kept_random`` and
    ``kept_random_median``; ``named``, ``by`` (the tests that hold: ``"necessity"``, ``"sufficiency"``) and
    ``why``."""
    out = []
    for layer in short_conv_layers(model):
        def loss_at(where: Callable[[Any], Tensor], layer: int = layer) -> float:
            return prober.loss_with(lambda b: conv_current_tap_hooks(model, layer, where(b)), start=layer)

        def draws(make: Callable[..., Tensor]) -> list[float]:
            def drawn(k: int) -> Callable[[Any], Tensor]:
                return lambda b: make(b, read, seed=seed * 1000 + k)

            return [loss_at(drawn(k)) for k in range(N_RANDOM)]

        rec: dict[str, Any] = {"layer": layer, "loss": loss_at(lambda b: conv_positions(b, read, seed=None)),
                               "random": [], "random_median": float("nan"), "all_loss": loss_at(segment_tokens),
                               "kept_loss": float("nan"), "kept_random": [], "kept_random_median": float("nan")}
        by, why = [], []
        if rec["loss"] >= name_min:  # 1. necessity
            rec["random"] = draws(conv_positions)
            rec["random_median"] = med = statistics.median(rec["random"])
            ok = rec["loss"] - med >= name_min
            by += ["necessity"] if ok else []
            why.append(f"lags removed at the read positions: loss {rec['loss']:.2f} vs {med:.2f} at other segment "
                       f"tokens ({'>=' if ok else '<'} {name_min} above)")
        else:
            why.append(f"lags removed at the read positions: loss {rec['loss']:.2f} < {name_min}")
        if rec["all_loss"] >= name_min:  # 2. sufficiency
            rec["kept_loss"] = kept = loss_at(lambda b: all_but(b, read, seed=None))
            rec["kept_random"] = draws(all_but)
            rec["kept_random_median"] = med = statistics.median(rec["kept_random"])
            ok = rec["all_loss"] - kept >= name_min and med - kept >= name_min
            by += ["sufficiency"] if ok else []
            why.append(f"lags removed at every segment token: loss {rec['all_loss']:.2f}; {kept:.2f} with the read "
                       f"positions' kept, {med:.2f} with another segment token's kept ({kept:.2f} is "
                       f"{'' if ok else 'not '}>= {name_min} below both)")
        else:
            why.append(f"lags removed at every segment token: loss {rec['all_loss']:.2f} < {name_min}")
        rec.update(named=bool(by), by=by, why="; ".join(why))
        out.append(rec)
    return out


def conv_evidence(rec: dict[str, Any]) -> str:
    """A conv record's deciding numbers in a few words (shares of the margin): the necessity test's loss against
    its baseline's median, or, for a conv named by sufficiency alone, the loss with its lags kept only at the read
    positions against the median with them kept only at other tokens.  A record saved before the sufficiency test
    existed reads as necessity; a number not measured (None, NaN) as ``-``."""
    def f(x: Any) -> str:
        return "-" if x is None or x != x else f"{x:.2f}"

    if rec.get("by") == ["sufficiency"]:
        return f"kept only at the read positions {f(rec.get('kept_loss'))} vs {f(rec.get('kept_random_median'))}"
    return f"{f(rec.get('loss'))} vs {f(rec.get('random_median'))}"
