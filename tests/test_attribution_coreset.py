"""The prompt coreset (``attribution_scan(..., exact_prompts=k)``): its pieces against known answers, and the
whole against the exact scan it reduces to."""

from __future__ import annotations

import itertools

import pytest
import torch

from gather_aggregate.attribution.coreset import choose_prompts, nnls
from gather_aggregate.attribution.estimators import attribution_scan
from gather_aggregate.core import errors
from gather_aggregate.core.protocol import count_hooks, param_checksum
from gather_aggregate.core.readout import ReadoutMetric
from gather_aggregate.scan.exact import exact_scan


def _brute_nnls(A, b):
    """The best least-squares solution over every support whose solution is non-negative (exact for small n)."""
    best, arg = float((A @ torch.zeros(A.shape[1], dtype=A.dtype) - b).norm()), torch.zeros(A.shape[1],
                                                                                             dtype=A.dtype)
    for size in range(1, A.shape[1] + 1):
        for cols in map(list, itertools.combinations(range(A.shape[1]), size)):
            w = torch.linalg.lstsq(A[:, cols], b[:, None]).solution[:, 0]
            if (w >= 0).all() and (res := float((A[:, cols] @ w - b).norm())) < best - 1e-12:
                best, arg = res, torch.zeros(A.shape[1], dtype=A.dtype).index_put((torch.tensor(cols),), w)
    return arg


@pytest.mark.parametrize("seed", range(8))
def test_nnls_equals_the_best_non_negative_support(seed):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(7, 4, generator=g, dtype=torch.float64)
    b = torch.randn(7, generator=g, dtype=torch.float64)  # random b: some unconstrained weights come out negative
    x = nnls(A, b)
    assert (x >= 0).all()
    assert torch.allclose(x, _brute_nnls(A, b), atol=1e-8)


def test_choosing_every_prompt_weights_each_by_one_over_n():
    S = torch.randn(5, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    chosen, w = choose_prompts(S, 5)
    assert sorted(chosen) == list(range(5))
    assert torch.allclose(w, torch.full((5,), 0.2, dtype=torch.float64), atol=1e-8)
    assert choose_prompts(S, 9)[0] == chosen  # k beyond the batch: every prompt, once
    zero_chosen, zero_w = choose_prompts(torch.zeros(5, 12, dtype=torch.float64), 2)
    assert len(set(zero_chosen)) == 2 and zero_w.tolist() == [0.5, 0.5]  # no information: alike
    for fewer_heads in (S[:, :2], S[:, :1], torch.cat([S[:3], S[:2]])):  # fewer heads than prompts, equal rows:
        chosen, w = choose_prompts(fewer_heads, 5)  # the fit has many solutions; every prompt is still 1/n
        assert sorted(chosen) == list(range(5))
        assert torch.allclose(w, torch.full((5,), 0.2, dtype=torch.float64), atol=1e-12)


@pytest.fixture(scope="module")
def setup():
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_llama

    hf, tok = tiny_llama(num_hidden_layers=3, seed=5)
    model = from_hf_model(hf, tok)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, model.d_vocab, (4, 10), generator=g)
    with torch.no_grad():
        answer = model(tokens)[:, -1].argmax(-1)

    def metric_of(rows):  # the answer's log-prob on the prompts ``rows``, one value each
        def per_prompt(la):
            return la[:, 0].log_softmax(-1).gather(1, answer[rows, None].to(la.device))[:, 0]

        return ReadoutMetric.mean_of(per_prompt, -1)

    return model, tokens, metric_of


@pytest.fixture(scope="module")
def batch(setup):
    model, tokens, metric_of = setup
    return model, tokens, metric_of(slice(None))


@pytest.mark.parametrize("method,estimator", [("zero", "atp-softmax"), ("mean", "atp-softmax"),
                                              ("zero", "atp*-softmax"), ("zero", "atp"), ("mean", "atp")])
def test_every_prompt_exact_is_the_exact_scan(batch, method, estimator):
    model, tokens, metric = batch
    ref = tokens.flip(0) if method == "mean" else None
    exact = exact_scan(model, tokens, metric, method=method, reference=ref, progress=False).scores()
    got = attribution_scan(model, tokens, metric, method=method, reference=ref, estimator=estimator,
                           exact_prompts=4)
    assert sorted(got.meta["exact_prompts"]) == [0, 1, 2, 3]
    for hd, v in got.scores().items():
        assert v == pytest.approx(exact[hd], abs=1e-5)


def test_every_prompt_exact_is_the_exact_scan_for_fewer_heads_than_prompts(batch):
    """Two heads, four prompts: the weights fit the mean row in many ways, and k = n must still be the exact scan
    (it was off by ~20% of a head's drop: the fit put 0 on two prompts)."""
    model, tokens, metric = batch
    heads = [(0, 1), (2, 0)]
    exact = exact_scan(model, tokens, metric, heads, progress=False).scores()
    for estimator in ("atp", "atp-softmax"):
        got = attribution_scan(model, tokens, metric, heads, estimator=estimator, exact_prompts=4)
        assert got.meta["exact_prompt_weights"] == [0.25] * 4
        for hd, v in got.scores().items():
            assert v == pytest.approx(exact[hd], abs=1e-5)


@pytest.mark.parametrize("estimator", ["atp-softmax", "atp"])
def test_two_prompts_are_their_weighted_exact_drops_plus_the_estimators_residual(setup, estimator):
    """c̃(h) = Σ w_p E[p, h] + (S̄ − Σ w_p S[p, h]), each term computed separately: the exact drops by one-prompt
    scans, the per-prompt estimates by one-prompt runs of the estimator (for AtP, the batch gradient's share of
    prompt p times n)."""
    model, tokens, metric_of = setup
    metric = metric_of(slice(None))
    before, hooks = param_checksum(model), count_hooks(model)
    got = attribution_scan(model, tokens, metric, estimator=estimator, exact_prompts=2)
    chosen, w = got.meta["exact_prompts"], torch.tensor(got.meta["exact_prompt_weights"], dtype=torch.float64)
    assert len(chosen) == 2 and (w >= 0).all()

    def one(p, run):
        return run(model, tokens[p:p + 1], metric_of(slice(p, p + 1))).scores()

    E = {p: one(p, lambda *a: exact_scan(*a, progress=False)) for p in range(4)}
    S = {p: one(p, lambda *a: attribution_scan(*a, estimator=estimator)) for p in range(4)}
    for hd, v in got.scores().items():
        want = sum(float(w[i]) * (E[p][hd] - S[p][hd]) for i, p in enumerate(chosen))
        want += sum(S[p][hd] for p in range(4)) / 4
        assert v == pytest.approx(want, abs=1e-4), hd
    assert param_checksum(model) == before and count_hooks(model) == hooks


def test_what_the_coreset_needs_is_checked_before_any_work(batch):
    model, tokens, metric = batch
    plain = ReadoutMetric(metric.fn, -1)  # no per-prompt values
    cases = [(dict(estimator="ig", exact_prompts=2), metric, "atp-softmax"),
             (dict(estimator="atp*", exact_prompts=2), metric, "atp-softmax"),
             (dict(estimator="atp-softmax", exact_prompts=2), plain, "mean_of"),
             (dict(estimator="atp-softmax", exact_prompts=2, method="resample", reference=tokens), metric,
              "zero or mean"),
             (dict(estimator="atp-softmax", exact_prompts=-1), metric, "non-negative int"),
             (dict(estimator="atp-softmax", exact_prompts=True), metric, "non-negative int")]
    for kw, m, needle in cases:
        with pytest.raises(errors.InputError, match=needle):
            attribution_scan(model, tokens, m, **kw)
