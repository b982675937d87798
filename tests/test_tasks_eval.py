"""evaluate(): one forward for single-token candidates, batched continuations otherwise, hooks, metrics."""

from __future__ import annotations

import contextlib
import math
import re

import pytest
import torch

from gather_aggregate.core.errors import ContextLengthError, InputError, TaskError
from gather_aggregate.tasks import (
    FactsTask,
    FactWorld,
    KVRetrieval,
    MMLUTask,
    candidate_logprobs,
    collate,
    correct_logprob,
    evaluate,
    logit_diff,
    score_per_candidate,
    word_level_tokenizer,
)
from gather_aggregate.tasks.facts import shipped_words

WORLD = FactWorld.random(10, 6, seed=0)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models on a shared 2-core box: one thread is ~50x faster than two contending ones."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _word_tok():
    texts = ["Memorize the following dictionary:\n\nThe value of the key ' is",
             " ".join(shipped_words("keys")), " ".join(map(str, range(100))),
             "Question: What is the of ?\nAnswer: A. B. C. D.", " ".join(WORLD.entities + WORLD.attributes)]
    return word_level_tokenizer(texts)


@pytest.fixture(scope="module")
def word_model():
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_llama

    tok = _word_tok()
    hf, _ = tiny_llama(seed=1, tokenizer=tok, vocab_size=len(tok))
    return from_hf_model(hf, tok)


@pytest.fixture(scope="module")
def bpe_model():
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_llama

    hf, tok = tiny_llama(seed=2)
    return from_hf_model(hf, tok)


def _close(a, b, tol=1e-4):
    return all(math.isclose(x, y, abs_tol=tol) for x, y in zip(a, b, strict=True)) and len(a) == len(b)


# ----------------------------------------------------------------- scoring paths agree
def test_single_token_kv_is_one_forward_and_matches_per_candidate(word_model):
    exs = KVRetrieval(n_pairs=6).examples(word_model.tokenizer, 6, seed=0)
    assert all(e.single_token for e in exs)
    fast = evaluate(word_model, exs, batch_size=3)
    assert fast.n_forwards == 2 and fast.n_rows == 6  # one forward per batch of prompts
    slow = evaluate(word_model, exs, batch_size=3, fast_single_token=False)
    assert slow.n_forwards == 12 and slow.n_rows == 36  # batched continuations: one row per candidate
    for e, rf, rs in zip(exs, fast.results, slow.results, strict=True):
        ref = score_per_candidate(word_model, e)  # the paper's way: one forward per candidate
        assert _close(rf.logprobs, ref) and _close(rs.logprobs, ref)
        assert rf.pred == rs.pred
    assert fast.accuracy == slow.accuracy == sum(r.pred == r.answer for r in fast.results) / 6


@pytest.mark.parametrize("task", [KVRetrieval(n_pairs=4), MMLUTask("content", source="sample"),
                                  FactsTask(WORLD, "content")], ids=["kv", "mmlu_content", "facts_content"])
def test_multi_token_continuations_match_per_candidate(bpe_model, task):
    exs = task.examples(bpe_model.tokenizer, 3, seed=5)
    assert not all(e.single_token for e in exs)
    res = evaluate(bpe_model, exs, batch_size=5)
    assert res.n_rows == sum(len(e.candidates) for e in exs)
    assert res.n_forwards == math.ceil(res.n_rows / 5)
    for e, r in zip(exs, res.results, strict=True):
        assert _close(r.logprobs, score_per_candidate(bpe_model, e))
        assert r.pred == max(range(len(r.logprobs)), key=lambda k: r.logprobs[k])


def test_padding_and_batch_size_do_not_change_scores(word_model):
    exs = KVRetrieval(n_pairs=3).examples(word_model.tokenizer, 2) + KVRetrieval(n_pairs=9).examples(
        word_model.tokenizer, 2) + FactsTask(WORLD, "knowledge").examples(word_model.tokenizer, 2)
    one = evaluate(word_model, exs, batch_size=1)
    many = evaluate(word_model, exs, batch_size=6)
    assert one.n_forwards == 6 and many.n_forwards == 1
    for a, b in zip(one.results, many.results, strict=True):
        assert _close(a.logprobs, b.logprobs)


def test_evaluate_accepts_a_task(word_model):
    res = evaluate(word_model, FactsTask(WORLD, "letter"), n=5, seed=3)
    exs = FactsTask(WORLD, "letter").examples(word_model.tokenizer, 5, seed=3)
    assert res.n == 5
    assert [r.logprobs for r in res.results] == [r.logprobs for r in evaluate(word_model, exs, seed=3).results]


# ----------------------------------------------------------------- protocol generality: an oracle model
class OracleKV:
    """Follows the protocol (``__call__``, ``hooks``, ``tokenizer``) and answers KV by lookup."""

    def __init__(self, tokenizer, shift: int = 0):
        self.tokenizer = tokenizer
        self.shift = shift
        self.ids = {w: tokenizer.convert_tokens_to_ids(w) for w in ("is", "'", ":", "\n")}
        self.hook_calls = 0

    @contextlib.contextmanager
    def hooks(self, fwd_hooks=()):
        self.hook_calls += 1
        yield self

    def __call__(self, tokens):
        b, p = tokens.shape
        logits = torch.zeros(b, p, len(self.tokenizer))
        for i in range(b):
            row = tokens[i].tolist()
            for t in range(p):
                if row[t] == self.ids["is"] and t >= 2 and row[t - 1] == self.ids["'"]:
                    key = row[t - 2]
                    lines = [j for j in range(t - 3) if row[j] == key and row[j + 1] == self.ids[":"]]
                    values = [row[j + 1] for j in range(t) if row[j] == self.ids[":"] and row[j + 2] == self.ids["\n"]]
                    v = row[lines[0] + 2]
                    v = values[(values.index(v) + self.shift) % len(values)]
                    logits[i, t, v] = 10.0
        return logits


def test_accuracy_of_an_oracle_and_of_a_wrong_oracle():
    tok = _word_tok()
    exs = KVRetrieval(n_pairs=5).examples(tok, 12, seed=1)
    perfect = evaluate(OracleKV(tok), exs, batch_size=5)
    assert perfect.accuracy == 1.0 and perfect.n_forwards == 3
    assert all(r.margin > 9 for r in perfect.results)
    wrong = evaluate(OracleKV(tok, shift=1), exs, batch_size=5)
    assert wrong.accuracy == 0.0
    assert [r.pred for r in wrong.results] == [(r.answer + 1) % 5 for r in wrong.results]
    oracle = OracleKV(tok)
    evaluate(oracle, exs, batch_size=4, fwd_hooks=[("x", lambda t, hook: t)])
    assert oracle.hook_calls == 3  # hooks entered once per forward


# ----------------------------------------------------------------- hooks
def test_hooks_change_results_and_are_removed(word_model):
    from gather_aggregate.core.protocol import count_hooks

    exs = KVRetrieval(n_pairs=5).examples(word_model.tokenizer, 4)
    name, axis = word_model.head_hook(0)
    assert axis == 2

    def zero_head0(z, hook):
        z = z.clone()
        z[:, :, 0] = 0.0
        return z

    clean = evaluate(word_model, exs)
    ablated = evaluate(word_model, exs, fwd_hooks=[(name, zero_head0)])
    assert count_hooks(word_model) == 0
    assert not _close(clean.results[0].logprobs, ablated.results[0].logprobs, tol=1e-6)
    again = evaluate(word_model, exs)
    assert [r.logprobs for r in again.results] == [r.logprobs for r in clean.results]

    def boom(z, hook):
        raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        evaluate(word_model, exs, fwd_hooks=[(name, boom)])
    assert count_hooks(word_model) == 0


def test_hook_factory_sees_each_batch(word_model):
    exs = KVRetrieval(n_pairs=5).examples(word_model.tokenizer, 5)
    seen = []
    name, _ = word_model.head_hook(1)

    def factory(batch):
        seen.append(batch)

        def keep_only_correct_summary(z, hook):  # a batch-dependent mask: zero every position but one
            keep = torch.zeros(z.shape[:2], dtype=z.dtype)
            keep[torch.arange(len(batch)), batch.correct_summary] = 1.0
            return z * keep[:, :, None, None]

        return [(name, keep_only_correct_summary)]

    res = evaluate(word_model, exs, fwd_hooks=factory, batch_size=2)
    assert [len(b) for b in seen] == [2, 2, 1]
    assert [e for b in seen for e in b.examples] == exs
    assert res.results[0].logprobs != evaluate(word_model, exs).results[0].logprobs


# ----------------------------------------------------------------- metrics for scans
def test_metrics_from_logits(word_model):
    exs = FactsTask(WORLD, "letter").examples(word_model.tokenizer, 6)
    batch = collate(exs, 0)
    logits = word_model(batch.tokens).detach().requires_grad_(True)
    lp = candidate_logprobs(logits, batch)
    res = evaluate(word_model, exs)
    assert torch.allclose(lp, torch.tensor([r.logprobs for r in res.results]), atol=1e-5)
    right = correct_logprob(logits, batch)
    assert torch.allclose(right, torch.tensor(res.answer_logprobs()), atol=1e-5)
    diff = logit_diff(logits, batch)
    assert torch.equal(diff > 0, torch.tensor(res.correct))
    # the margin of log-probs equals the logit difference (same softmax normaliser)
    assert torch.allclose(diff, torch.tensor([r.margin for r in res.results]), atol=1e-4)
    diff.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    assert (logits.grad[:, :-1].abs().sum((1, 2)) >= 0).all()
    # gradient only at the query positions
    nz = logits.grad.abs().sum(-1).nonzero().tolist()
    assert sorted({tuple(x) for x in nz}) == [(i, e.query_pos) for i, e in enumerate(exs)]


def test_padded_candidates_are_minus_inf(word_model):
    # 3 and 4 options (this word-level vocabulary knows the letters A-D; the task refuses an unknown 'E')
    exs = FactsTask(WORLD, "letter", n_options=3).examples(word_model.tokenizer, 1) + FactsTask(
        WORLD, "letter", n_options=4).examples(word_model.tokenizer, 1)
    batch = collate(exs, 0)
    lp = candidate_logprobs(word_model(batch.tokens), batch)
    assert lp.shape == (2, 4) and torch.isinf(lp[0, 3:]).all() and torch.isfinite(lp[1]).all()


# ----------------------------------------------------------------- determinism, progress
def test_deterministic_under_seed_and_global_rng_untouched(word_model):
    exs = KVRetrieval(n_pairs=4).examples(word_model.tokenizer, 4)
    name, _ = word_model.head_hook(0)

    def noise(z, hook):
        return z + torch.randn_like(z)

    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = evaluate(word_model, exs, fwd_hooks=[(name, noise)], seed=7)
    after = torch.rand(1)
    assert torch.equal(before, after)
    b = evaluate(word_model, exs, fwd_hooks=[(name, noise)], seed=7)
    c = evaluate(word_model, exs, fwd_hooks=[(name, noise)], seed=8)
    assert [r.logprobs for r in a.results] == [r.logprobs for r in b.results]
    assert [r.logprobs for r in a.results] != [r.logprobs for r in c.results]


def test_progress_bar(word_model, capsys):
    exs = KVRetrieval(n_pairs=3).examples(word_model.tokenizer, 4)
    evaluate(word_model, exs, batch_size=1, progress=True)
    assert "evaluate" in capsys.readouterr().err
    evaluate(word_model, exs, batch_size=1)  # short run: no bar by default
    assert "evaluate" not in capsys.readouterr().err


# ----------------------------------------------------------------- bad input
def test_prompt_longer_than_context_names_the_size(bpe_model):
    n_ctx = bpe_model.n_ctx
    exs = KVRetrieval(n_pairs=60).examples(bpe_model.tokenizer, 3)
    assert max(len(e) for e in exs) > n_ctx
    with pytest.raises(ContextLengthError, match=r"lower n_pairs \(now 60\) to at most about \d+") as err:
        evaluate(bpe_model, exs)
    suggested = int(re.search(r"about (\d+)", str(err.value)).group(1))
    assert 5 < suggested < 60
    smaller = KVRetrieval(n_pairs=suggested).examples(bpe_model.tokenizer, 3)
    assert sum(len(e) for e in smaller) / 3 <= n_ctx
    mmlu = MMLUTask("letter", k_shot=12, source="sample").examples(bpe_model.tokenizer, 1)
    with pytest.raises(ContextLengthError, match=r"lower k_shot \(now 12\)"):
        evaluate(bpe_model, mmlu)


def test_empty_and_wrong_inputs(word_model):
    with pytest.raises(TaskError, match="empty dataset"):
        evaluate(word_model, [])
    with pytest.raises(InputError, match="batch_size=0"):
        evaluate(word_model, KVRetrieval(3).examples(word_model.tokenizer, 1), batch_size=0)
    with pytest.raises(InputError, match="list of tasks.Example"):
        evaluate(word_model, ["a prompt"])
    with pytest.raises(TaskError, match="empty list of examples"):
        collate([])
