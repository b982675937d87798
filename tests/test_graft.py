"""The reverse graft: a Mamba-2 head replaced by softmax attention, against a per-position oracle."""

from __future__ import annotations

import math

import pytest
import torch

from gather_aggregate.core import errors
from gather_aggregate.core.protocol import count_hooks, param_checksum
from gather_aggregate.studies.hybrids.graft import AttentionGraft, train_graft


@pytest.fixture(scope="module")
def mamba2():
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

    return from_hf_model(tiny_hf_ssm("mamba2", seed=3, stress=True))  # 8 heads in 2 groups of B/C


def _randomise(graft: AttentionGraft, seed: int) -> AttentionGraft:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (graft.W_q, graft.W_k, graft.W_v):
            p.add_(0.3 * torch.randn(p.shape, generator=g))
        graft.log_tau.add_(0.5)
    return graft


def _oracle(graft: AttentionGraft, x, B, C):
    """Softmax attention position by position: ``y_t = Σ_{s≤t} a_ts W_v x_s + D x_t``."""
    tau = math.exp(float(graft.log_tau.detach()))
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        q = graft.W_q @ C[t]
        scores = torch.stack([tau * (q @ (graft.W_k @ B[s])) for s in range(t + 1)])
        a = scores.softmax(0)
        out[t] = sum(a[s] * (graft.W_v @ x[s]) for s in range(t + 1)) + graft.D * x[t]
    return out


@pytest.mark.parametrize("layer,head", [(0, 1), (1, 6)])
def test_the_grafted_head_is_softmax_attention_over_its_own_inputs(mamba2, layer, head):
    model = mamba2
    graft = _randomise(AttentionGraft(model, layer, head), seed=layer)
    tokens = torch.randint(0, model.d_vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    pre = f"blocks.{layer}.ssm."
    names = [pre + n for n in ("hook_x", "hook_B", "hook_C", "hook_y")]
    with torch.no_grad():
        _, clean = model.run_with_cache(tokens, names_filter=lambda n: n in names)
        with model.hooks(fwd_hooks=graft.hooks()):
            _, grafted = model.run_with_cache(tokens, names_filter=lambda n: n == pre + "hook_y")
    P, g = graft.d_head, head // (model.cfg.n_heads // model.cfg.n_groups)
    y0, y1 = clean[pre + "hook_y"], grafted[pre + "hook_y"]
    others = torch.ones(y0.shape[-1], dtype=torch.bool)
    others[head * P:(head + 1) * P] = False
    assert torch.equal(y1[..., others], y0[..., others])  # every other head untouched
    for b in range(tokens.shape[0]):
        x = clean[pre + "hook_x"][b, :, head * P:(head + 1) * P]
        want = _oracle(graft, x, clean[pre + "hook_B"][b, :, g], clean[pre + "hook_C"][b, :, g])
        torch.testing.assert_close(y1[b, :, head * P:(head + 1) * P], want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(y1[..., ~others], y0[..., ~others])
    assert count_hooks(model) == 0


def _batches(model, n_pos: int = 12):
    def batch(step: int):
        g = torch.Generator().manual_seed(step % 3)
        x = torch.randint(0, model.d_vocab, (4, n_pos), generator=g)
        y = torch.full_like(x, -100)
        y[:, -1] = x[:, 2]  # copy a token from early in the prompt: something attention can learn
        return x, y

    return batch


def test_training_moves_only_the_graft_and_resumes_bit_for_bit(mamba2, tmp_path):
    model = mamba2
    before = param_checksum(model)
    flags = [p.requires_grad for p in model.parameters()]
    straight = AttentionGraft(model, 1, 2)
    log = train_graft(model, straight, _batches(model), 10, lr=1e-2, progress=False)
    assert log[-1]["loss"] < log[0]["loss"]
    assert param_checksum(model) == before and count_hooks(model) == 0
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(p.grad is None for p in model.parameters())
    # a run stopped after 5 steps (its checkpoint) and rerun to 10 ends where the uninterrupted run ended
    train_graft(model, AttentionGraft(model, 1, 2), _batches(model), 5, lr=1e-2, out_dir=tmp_path,
                checkpoint_every=5, progress=False)
    assert torch.load(tmp_path / "graft_state.pt", weights_only=False)["step"] == 5
    resumed = AttentionGraft(model, 1, 2)
    log2 = train_graft(model, resumed, _batches(model), 10, lr=1e-2, out_dir=tmp_path, progress=False)
    assert [r["loss"] for r in log2] == pytest.approx([r["loss"] for r in log], rel=1e-6)
    for a, b in zip(resumed.parameters(), straight.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_bad_inputs_are_one_line_errors(mamba2, tmp_path):
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_llama

    llama = from_hf_model(*tiny_llama(num_hidden_layers=1))
    with pytest.raises(errors.InputError, match="not a Mamba-2 layer"):
        AttentionGraft(llama, 0, 0)
    with pytest.raises(errors.InputError, match="head must be an int in 0..7"):
        AttentionGraft(mamba2, 0, 8)
    train_graft(mamba2, AttentionGraft(mamba2, 0, 1), _batches(mamba2), 2, out_dir=tmp_path, progress=False)
    with pytest.raises(errors.InputError, match="holds a graft of L0H1, not L1H3"):
        train_graft(mamba2, AttentionGraft(mamba2, 1, 3), _batches(mamba2), 2, out_dir=tmp_path, progress=False)


def test_random_control_heads_are_distinct_and_never_the_top_head(mamba2):
    from gather_aggregate.studies.hybrids.graft_experiment import random_heads

    picks = random_heads(mamba2, (0, 0), range(15))
    assert len(picks) == 15 and len(set(picks)) == 15 and (0, 0) not in picks
    assert random_heads(mamba2, (0, 0), [0, 1]) == picks[:2]  # a seed's draw does not depend on later seeds
    assert len(random_heads(mamba2, (0, 0), range(20))) == 15  # no more heads than there are


def test_the_experiment_refuses_a_model_that_is_not_mamba2(tiny_llama_dir, tmp_path):
    from gather_aggregate.studies.hybrids.graft_experiment import run_graft_experiment

    with pytest.raises(errors.InputError, match="not a Mamba-2 model"):
        run_graft_experiment(tiny_llama_dir, tmp_path, steps=1)
    assert not (tmp_path / "results.json").exists()
