"""AtP with the output softmax exact (``estimator="atp-softmax"``) against a per-head forward-mode oracle."""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.attribution.estimators import attribution_scan
from gather_aggregate.attribution.paths import readout_tokens
from gather_aggregate.core import errors
from gather_aggregate.core.protocol import count_hooks, param_checksum
from gather_aggregate.core.readout import ReadoutMetric
from gather_aggregate.interventions.ablation import make_replacement


def _model(which: str):
    from gather_aggregate import from_hf_model

    if which == "llama":
        from gather_aggregate.testing.tiny_models import tiny_llama

        hf, tok = tiny_llama(num_hidden_layers=3, seed=5)
        return from_hf_model(hf, tok)
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(1)
    hf = Mamba2ForCausalLM(Mamba2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=8,
                                        head_dim=8, num_heads=8, n_groups=2, expand=2, conv_kernel=4)).eval()
    return from_hf_model(hf)


def _inputs(model, temperature: float = 1.0):
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, model.d_vocab, (3, 10), generator=g)
    with torch.no_grad():
        answer = model(tokens)[:, -1].argmax(-1)  # the model's own top token: a confident, saturating answer

    def logprob(la):
        return (la[:, 0] * temperature).log_softmax(-1).gather(1, answer[:, None]).mean()

    return tokens, ReadoutMetric(logprob, -1)


def _tangent(model, tokens, metric, head, toks):
    """``(clean readout logits, the head's first-order change of the readout slots)``: forward-mode
    differentiation of ``α ↦ ℓ(z_h + α Δ_h)`` at ``α = 0`` for this head alone."""
    layer, h = head
    name, axis = model.head_hook(layer)
    rep = make_replacement(model, [head], "zero", None, n_pos=tokens.shape[1])

    def logits_at(alpha):
        def hook(z, hook):
            zh = z.select(axis, h)
            new = zh + alpha * (rep.values(layer, h, zh.detach()) - zh.detach())
            rest = z.shape[axis] - h - 1
            return torch.cat([z.narrow(axis, 0, h), new.unsqueeze(axis), z.narrow(axis, h + 1, rest)], axis)

        with model.hooks(fwd_hooks=[(name, hook)]):
            return metric.select(model(tokens)).gather(-1, toks)

    with torch.no_grad():
        clean_at = metric.select(model(tokens))
    return clean_at, torch.autograd.functional.jvp(logits_at, torch.zeros(()), torch.ones(()))[1].double()


def _oracle(model, tokens, metric, head, toks):
    """The metric on the clean readout logits plus the head's first-order logit change (:func:`_tangent`)."""
    clean_at, tangent = _tangent(model, tokens, metric, head, toks)
    moved = clean_at.double().scatter_add(-1, toks, tangent)
    return float(metric.at_readout(clean_at)) - float(metric.at_readout(moved.float()))


@pytest.mark.parametrize("which", ["llama", "mamba2"])
def test_estimate_is_the_metric_on_first_order_logits_head_by_head(which):
    model = _model(which)
    tokens, metric = _inputs(model, temperature=4.0)
    before = param_checksum(model)
    res = attribution_scan(model, tokens, metric, estimator="atp-softmax", readout_tokens=3)
    with torch.no_grad():
        toks = readout_tokens(metric, metric.select(model(tokens)), 3)
    for head in model.all_heads()[::3]:
        assert res.score(*head) == pytest.approx(_oracle(model, tokens, metric, head, toks), rel=1e-4, abs=1e-6)
    assert res.meta["readout_tokens"] == 3
    assert count_hooks(model) == 0 and param_checksum(model) == before
    assert all(p.grad is None for p in model.parameters())


def _logit_diff(model, tokens):
    """A metric linear in the logits: the mean difference of two random tokens' logits at the last position."""
    g = torch.Generator().manual_seed(4)
    right, wrong = torch.randint(0, model.d_vocab, (2, tokens.shape[0]), generator=g)
    rows = torch.arange(tokens.shape[0])
    return ReadoutMetric(lambda la: (la[rows, 0, right] - la[rows, 0, wrong]).mean(), -1)


def test_a_metric_linear_in_the_logits_gets_plain_atp():
    model = _model("llama")
    tokens, _ = _inputs(model)
    diff = _logit_diff(model, tokens)
    fixed = attribution_scan(model, tokens, diff, estimator="atp-softmax").scores()
    atp = attribution_scan(model, tokens, diff, estimator="atp").scores()
    for hd, v in atp.items():
        assert fixed[hd] == pytest.approx(v, rel=1e-4, abs=1e-6)


def test_the_chosen_tokens_are_the_answer_and_its_rivals():
    logits = torch.tensor([[[0.0, 5.0, 1.0, 4.0, -2.0]]])
    answer = torch.tensor([1])
    metric = ReadoutMetric(lambda la: la[:, 0].log_softmax(-1).gather(1, answer[:, None]).mean(), -1)
    assert readout_tokens(metric, logits, 2)[0, 0].tolist() == [1, 3]
    assert sorted(readout_tokens(metric, logits, 9)[0, 0].tolist()) == [0, 1, 2, 3, 4]


def test_bad_inputs_are_one_line_errors():
    model = _model("llama")
    tokens, metric = _inputs(model)
    with pytest.raises(errors.InputError, match="needs a ReadoutMetric"):
        attribution_scan(model, tokens, lambda lg: lg[:, -1].log_softmax(-1)[:, 0].mean(), estimator="atp-softmax")
    with pytest.raises(errors.InputError, match="readout_tokens must be a positive int"):
        attribution_scan(model, tokens, metric, estimator="atp-softmax", readout_tokens=0)
    assert count_hooks(model) == 0


def _pattern_term_oracle(model, tokens, metric, head, toks, qk_layers=None):
    """Per readout slot: ``Σ_l D_{A_l}ℓ[A_l(r_l + Δr_h) - A_l(r_l) - J_{A_l} Δr_h]``, each directional derivative by
    forward mode: of the readout logits with layer ``l``'s pattern moved along the direction (everything else
    clean), and of the pattern along ``Δr_h``."""
    from gather_aggregate.attribution.atp_star import pattern_from_resid

    layer, h = head
    name, axis = model.head_hook(layer)
    rep = make_replacement(model, [head], "zero", None, n_pos=tokens.shape[1])
    names = {}
    for la in list(range(layer + 1, model.n_layers))[:qk_layers]:
        names[f"blocks.{la}.attn.hook_pattern"] = model.resid_hook(la)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names or n in names.values() or n == name)
        z = cache[name].select(axis, h)
        w = model.mixer_resume(layer)[1]
        dz = rep.values(layer, h, z) - z
        dr = dz @ w[:, h * dz.shape[-1]:(h + 1) * dz.shape[-1]].T
    total = torch.zeros(toks.shape, dtype=torch.float64)
    for pat, res in names.items():
        la = int(pat.split(".")[1])
        r, a0 = cache[res], cache[pat]
        with torch.no_grad():
            d_a = (pattern_from_resid(model, la, r + dr) - a0).nan_to_num(0.0)
        _, tangent = torch.autograd.functional.jvp(lambda b, la=la, r=r: pattern_from_resid(model, la, r + b * dr, grad=True),
                                                   torch.zeros(()), torch.ones(()))
        direction = d_a - tangent.nan_to_num(0.0)

        def logits_at(beta, pat=pat, a0=a0, direction=direction):
            with model.hooks(fwd_hooks=[(pat, lambda a, hook: a0 + beta * direction)]):
                return metric.select(model(tokens)).gather(-1, toks)

        total += torch.autograd.functional.jvp(logits_at, torch.zeros(()), torch.ones(()))[1].double()
    return total


def _star_oracle(model, tokens, metric, head, toks, qk_layers=None):
    """The metric on the clean readout logits moved by the head's forward-mode first-order change plus the
    pattern terms of :func:`_pattern_term_oracle`."""
    clean_at, tangent = _tangent(model, tokens, metric, head, toks)
    pattern = _pattern_term_oracle(model, tokens, metric, head, toks, qk_layers)
    moved = clean_at.double().scatter_add(-1, toks, tangent + pattern)
    return float(metric.at_readout(clean_at)) - float(metric.at_readout(moved.float()))


def test_star_softmax_is_the_metric_on_qk_fixed_first_order_logits_head_by_head():
    model = _model("llama")
    tokens, metric = _inputs(model, temperature=4.0)
    before = param_checksum(model)
    res = attribution_scan(model, tokens, metric, estimator="atp*-softmax", readout_tokens=3)
    assert res.meta["qk_fix_layers"] == [1, 2]
    with torch.no_grad():
        clean_at = metric.select(model(tokens))
        toks = readout_tokens(metric, clean_at, 3)
    for head in [(0, 0), (0, 3), (1, 2), (2, 1)]:
        assert res.score(*head) == pytest.approx(_star_oracle(model, tokens, metric, head, toks), rel=1e-4, abs=1e-6)
    assert count_hooks(model) == 0 and param_checksum(model) == before
    assert all(p.grad is None for p in model.parameters())


def test_star_softmax_reduces_to_atp_star_and_to_atp_softmax():
    """A metric linear in the logits: AtP* without GradDrop.  No attention layer (Mamba-2): AtP-softmax."""
    model = _model("llama")
    tokens, _ = _inputs(model)
    diff = _logit_diff(model, tokens)
    fixed = attribution_scan(model, tokens, diff, estimator="atp*-softmax").scores()
    star = attribution_scan(model, tokens, diff, estimator="atp*", graddrop=False).scores()
    assert fixed.keys() == star.keys()
    for hd, v in star.items():
        assert fixed[hd] == pytest.approx(v, rel=1e-4, abs=1e-6)
    ssm = _model("mamba2")
    tokens, metric = _inputs(ssm, temperature=4.0)
    a = attribution_scan(ssm, tokens, metric, estimator="atp*-softmax")
    b = attribution_scan(ssm, tokens, metric, estimator="atp-softmax").scores()
    assert a.meta["qk_fix_layers"] == [] and a.scores() == b


def test_star_softmax_restricted_to_the_next_attention_layer():
    """``qk_layers=1``: the pattern of the first attention layer above a head only (oracle restricted alike);
    heads with one attention layer above them are unchanged."""
    model = _model("llama")
    tokens, metric = _inputs(model, temperature=4.0)
    full = attribution_scan(model, tokens, metric, estimator="atp*-softmax", readout_tokens=2)
    near = attribution_scan(model, tokens, metric, estimator="atp*-softmax", readout_tokens=2, qk_layers=1)
    base = attribution_scan(model, tokens, metric, estimator="atp-softmax", readout_tokens=2)
    assert near.meta["qk_layers"] == 1
    for h in range(4):
        assert near.score(1, h) == pytest.approx(full.score(1, h), rel=1e-6, abs=1e-9)
    with torch.no_grad():
        toks = readout_tokens(metric, metric.select(model(tokens)), 2)
    for head in [(0, 1), (0, 2)]:
        assert near.score(*head) == pytest.approx(_star_oracle(model, tokens, metric, head, toks, qk_layers=1),
                                                  rel=1e-4, abs=1e-6)
        assert near.score(*head) != pytest.approx(full.score(*head), rel=1e-3)  # the restriction is not void
        assert near.score(*head) != pytest.approx(base.score(*head), rel=1e-6)
    with pytest.raises(errors.InputError, match="qk_layers must be"):
        attribution_scan(model, tokens, metric, estimator="atp*-softmax", qk_layers=0)
