"""Issue 42's fixture recipe (``tests/fixtures/train_mixers.py``, ``tests/fixtures/mixer_formats.py``): the formats
annotate what the detector reads, the Falcon-Mamba training forward is HF's, and a grown model starts as the small
one it was grown from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))


@pytest.fixture(scope="module")
def bag_world():
    import train_mixers

    from gather_aggregate.training.vocab import build_tokenizer

    w = train_mixers.format_world(3, "bag")
    return w, build_tokenizer(w)


def test_bag_values_are_two_tokens_with_distinct_first_tokens(bag_world):
    from mixer_formats import MixerRetrieval

    w, tok = bag_world
    for e in MixerRetrieval(w.kv_keys, w.kv_values, "bag").examples(tok, n=6, seed=1):
        assert all(len(c) == 2 for c in e.candidate_ids)
        assert len({c[0] for c in e.candidate_ids}) == len(e.candidate_ids)  # the query position decides
        assert len(e.segments) == 8
        for s in e.segments:  # ' k has a b /': five tokens, the summary its '/'
            assert s.end - s.start == 5 and tok.convert_ids_to_tokens(e.input_ids[s.summary]) == "/"
        key = e.prompt.split(" what ")[-1].split(" has")[0]
        assert e.prompt.split("/")[e.correct].split(" has ")[0].split()[-1] == key


def test_log_values_sit_past_a_width_4_conv_from_their_keys():
    """A ``log`` entry is six tokens, its ``.`` the summary, and its value four tokens after its key: no token's
    width-4 conv window holds both, so a Gather must move the key before a conv can meet the value."""
    import train_mixers
    from mixer_formats import MixerRetrieval

    from gather_aggregate.training.vocab import build_tokenizer

    w = train_mixers.format_world(4, "log")
    tok = build_tokenizer(w)
    for e in MixerRetrieval(w.kv_keys, w.kv_values, "log").examples(tok, n=4, seed=2):
        assert len(e.segments) == 8 and all(len(c) == 1 for c in e.candidate_ids)
        for s in e.segments:
            words = tok.convert_ids_to_tokens(e.input_ids[s.start:s.end])
            assert s.end - s.start == 6 and words[1:4] == ["was", "set", "to"] and words[-1] == "."
            assert s.summary == s.end - 1 and words[0] == s.label and words[4] in w.kv_values
        assert e.candidates[e.answer] == e.prompt.split(" . ")[e.correct].split()[-1]


def test_training_documents_supervise_every_value_token(bag_world):
    import random

    import train_mixers

    from gather_aggregate.training.data import collate
    from gather_aggregate.training.vocab import PAD

    w, _ = bag_world
    doc = train_mixers.doc(w, random.Random(0), "bag", 5, 3)
    _, y = collate([doc], w.vocab(), w.vocab()[PAD])
    assert int((y >= 0).sum()) == 3 * 2  # three queries, two tokens each


@pytest.mark.slow  # HF's FalconMamba reference path: ~18 s here
def test_falcon_mamba_chunked_forward_is_hfs():
    """The fixture recipe trains Falcon-Mamba through the project's chunked S6 scan; it computes HF's forward."""
    import torch
    import train_mixers
    from transformers import FalconMambaConfig, FalconMambaForCausalLM
    from transformers.models.falcon_mamba.modeling_falcon_mamba import FalconMambaMixer

    torch.manual_seed(1)
    cfg = FalconMambaConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2,
                            conv_kernel=4, use_mambapy=False)
    m = train_mixers.use_falcon_scan(FalconMambaForCausalLM(cfg)).eval()
    x = torch.randint(0, 40, (2, 19))
    with torch.no_grad():
        ours = m(input_ids=x).logits
        for mod in m.modules():
            if isinstance(mod, FalconMambaMixer):
                del mod.forward  # back to the class's (HF's) forward
        theirs = m(input_ids=x, use_cache=False).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def _grown(family, below, above):
    """A fresh 2-layer ``family`` model grown by ``below`` / ``above`` layers: the model, and its logits on the same
    tokens before and after growing."""
    import torch
    import train_mixers

    m = train_mixers.build(family, 2, 40, 0, 1).eval()
    x = torch.randint(2, 40, (2, 11))
    with torch.no_grad():
        before = m(input_ids=x).logits
        train_mixers.grow_around(m, below, above, seed=2)
        after = m(input_ids=x).logits
    return m, before, after


def test_a_grown_llama_starts_as_the_model_it_was_grown_from():
    import torch

    m, before, after = _grown("llama", 2, 2)
    assert len(m.model.layers) == 6 and m.config.num_hidden_layers == 6
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_a_grown_falcon_mamba_starts_as_the_model_it_was_grown_from_and_scans_with_ours():
    """``log-falconmamba4``'s growth: one fresh block below and one above, each mixer's ``out_proj`` at zero, gives
    the 2-layer model's logits; every mixer, the fresh ones too, runs through the project's scan, numbered in order."""
    import torch
    from transformers.models.falcon_mamba.modeling_falcon_mamba import FalconMambaMixer

    m, before, after = _grown("falconmamba", 1, 1)
    assert len(m.backbone.layers) == 4 and m.config.num_hidden_layers == 4
    assert [b.layer_idx for b in m.backbone.layers] == [b.mixer.layer_idx for b in m.backbone.layers] == [0, 1, 2, 3]
    assert all("forward" in vars(mod) for mod in m.modules() if isinstance(mod, FalconMambaMixer))  # our scan
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
