"""Device and dtype handling of code paths that have not run on a GPU, checked on the CPU.

A function of pure tensor code run on ``meta`` inputs must give ``meta`` outputs: a tensor it creates on the
CPU and combines with them raises, as a CPU tensor combined with CUDA ones does.  Where a model is needed, a
stub stands in whose device is ``meta``.  (The GPU tier, tests/test_gpu.py, runs the real thing on CUDA.)
"""

from __future__ import annotations

import math

import pytest
import torch

META = torch.device("meta")


# ---- sharpness metrics ------------------------------------------------------------------------------------
def test_sharpness_index_moves_a_cpu_n_keys_to_the_pattern_device():
    from gather_aggregate.core.sharpness import sharpness_index

    pattern = torch.rand(2, 3, 5, 7).to(META)
    n_keys = torch.arange(1, 6)  # [query] on the CPU, as a user builds it: was combined with the pattern as is
    assert sharpness_index(pattern, n_keys).device == META
    assert sharpness_index(pattern, 7).device == META and sharpness_index(pattern).device == META


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sharpness_metrics_of_half_precision_rows_are_measured_in_float32(dtype):
    from gather_aggregate.core.sharpness import row_entropy, sharpness_index, top1_mass

    g = torch.Generator().manual_seed(0)
    p = torch.rand(4, 300, generator=g).pow(4)
    p[:, 150:] = 0.0  # keys a causal row cannot see
    half = p.to(dtype)
    ref = half.double()  # the same (rounded) rows, measured in float64
    for fn in (row_entropy, top1_mass, sharpness_index):
        got = fn(half)
        assert got.dtype == torch.float32 and bool(torch.isfinite(got).all()), fn.__name__
        torch.testing.assert_close(got.double(), fn(ref), rtol=1e-5, atol=1e-5)
    assert row_entropy(p.double()).dtype == torch.float64  # float64 stays float64


# ---- implied attention on the device of its inputs ----------------------------------------------------------
def _delta_inputs(device: torch.device, b: int = 2, L: int = 6, H: int = 3, dk: int = 4):
    g = torch.Generator().manual_seed(1)
    q = torch.nn.functional.normalize(torch.randn(b, L, H, dk, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(b, L, H, dk, generator=g), dim=-1)
    gate = -torch.rand(b, L, H, generator=g)
    beta = torch.rand(b, L, H, generator=g)
    return [t.to(device) for t in (q, k, gate, beta)]


def test_delta_rule_oracles_stay_on_the_device_of_their_inputs():
    from gather_aggregate.adapters.delta_rule import delta_implied_attention, delta_implied_reference
    from gather_aggregate.adapters.gated_deltanet import masked_delta_rule_ref

    q, k, g, beta = _delta_inputs(META)
    assert delta_implied_reference(q, k, g, beta).device == META  # its output was made on the CPU
    v = torch.empty(2, 6, 3, 5, device=META)
    assert masked_delta_rule_ref(q, k, v, g, beta, torch.empty(2, 3, 6, 6, device=META)).device == META
    assert delta_implied_attention(q, k, g, beta, heads=[0, 2]).device == META


def test_delta_rule_rows_walk_matches_the_oracle_at_rows_starting_anywhere():
    """The row walk no longer asks per step whether a row starts there (a GPU sync per position): rows that
    start late, early, twice and at 0 still match the oracle."""
    from gather_aggregate.adapters.delta_rule import delta_implied_attention, delta_implied_reference

    q, k, g, beta = _delta_inputs(torch.device("cpu"))
    full = delta_implied_reference(q, k, g, beta)
    rows = torch.tensor([[5, 0, 3, 3], [1, 4, 2, 0]])
    got = delta_implied_attention(q, k, g, beta, rows=rows)
    want = full.gather(2, rows[:, None, :, None].expand(-1, full.shape[1], -1, full.shape[-1]))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_mamba2_implied_attention_and_masked_output_stay_on_the_device_of_their_inputs():
    from gather_aggregate.adapters.implied_mamba2 import mamba2_implied_attention, mamba2_masked_output

    b, L, H, G, N, P = 2, 6, 4, 2, 3, 2
    dt, A = torch.empty(b, L, H, device=META), torch.empty(H, device=META)
    B, C = torch.empty(b, L, G, N, device=META), torch.empty(b, L, G, N, device=META)
    assert mamba2_implied_attention(dt, A, B, C, heads=[1, 3]).device == META
    y, x = torch.empty(b, L, H * P, device=META), torch.empty(b, L, H * P, device=META)
    out = mamba2_masked_output(y, x, dt, B, C, A, P, [0, 2], torch.empty(b, 2, L, L, device=META), 2**30)
    assert out.device == META and out.shape == y.shape


# ---- hybridise: tokens and labels follow the model to its device ---------------------------------------------
class _MetaLM(torch.nn.Module):
    """A stand-in language model on the meta device: it takes its tokens to its device, as ours do."""

    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(vocab, device=META))
        self.blocks: list = []  # no SSM layers (the end-to-end stage reads none)

    @property
    def device(self) -> torch.device:
        return self.w.device

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.to(self.device)
        return torch.empty(*tokens.shape, self.w.shape[0], device=self.device) + self.w


def test_end_to_end_distillation_loss_takes_cpu_tokens_to_the_models_device():
    from gather_aggregate.studies.hybrids.distill import stage_loss

    tokens = torch.randint(0, 11, (3, 8))  # the zoo's batches come on the CPU
    loss = stage_loss(_MetaLM(), _MetaLM(), tokens, "end_to_end")  # type: ignore[arg-type]
    assert loss.device == META and loss.dim() == 0


def test_perplexity_takes_cpu_labels_to_the_logits_device(monkeypatch):
    import gather_aggregate.studies.hybrids.experiment as experiment

    seen = []

    def cross_entropy(logits, y, **kw):  # meta values cannot be read back: check the devices, count nothing
        assert y.device == logits.device, (y.device, logits.device)
        seen.append(y.device)
        return torch.tensor(0.0)

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", cross_entropy)
    batches = lambda i: (torch.randint(0, 11, (2, 5)), torch.full((2, 5), 3))  # noqa: E731
    assert experiment.perplexity(_MetaLM(), batches, n_batches=2) == 1.0  # type: ignore[arg-type]
    assert seen == [META, META]


def test_attention_graft_lives_on_the_models_device(monkeypatch):
    from gather_aggregate import from_hf_model
    from gather_aggregate.studies.hybrids.graft import AttentionGraft
    from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

    model = from_hf_model(tiny_hf_ssm("mamba2", seed=3))
    assert {p.device for p in AttentionGraft(model, 0, 1).parameters()} == {torch.device("cpu")}
    monkeypatch.setattr(type(model), "device", property(lambda self: META))  # as if the model sat on a GPU
    graft = AttentionGraft(model, 0, 1)
    assert {p.device for p in graft.parameters()} == {META}  # were made on the CPU whatever the model's device
    x, B, C = (torch.empty(2, 5, n, device=META) for n in (graft.d_head, graft.n_state, graft.n_state))
    assert graft.attend(x, B, C).device == META


def test_graft_answer_loss_takes_cpu_labels_to_the_logits_device(monkeypatch):
    import gather_aggregate.studies.hybrids.graft as graft_mod

    class _Graft:
        def hooks(self) -> list:
            return []

    class _Model(_MetaLM):
        def hooks(self, fwd_hooks=()):
            import contextlib

            return contextlib.nullcontext()

    loss = graft_mod._answer_loss(_Model(), _Graft(), torch.randint(0, 11, (2, 5)),  # type: ignore[arg-type]
                                  torch.full((2, 5), -100).index_fill_(1, torch.tensor([4]), 2))
    assert loss.device == META and math.prod(loss.shape) == 1


# ---- bf16 models: implied attention in the scan's float32 ------------------------------------------------------
@pytest.mark.parametrize("model_type", ["mamba", "mamba2"])
def test_implied_attention_of_a_bf16_model_reconstructs_its_float32_scan_output(model_type):
    """A bf16 model's scan runs in float32 on its bf16 ``x, B, C`` (upcast exactly) and ``dt`` (float32), so the
    implied attention computed from the same hooks reconstructs ``hook_y`` (float32) to float32 precision.
    Mamba-2's ``C·B`` was an einsum of the bf16 hooks, rounded to bf16 before the float32 decay: off by ~1e-3."""
    from gather_aggregate.adapters import load_ssm
    from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

    m = load_ssm(tiny_hf_ssm(model_type, seed=5, stress=True)).to(torch.bfloat16)
    b, L = 2, 24
    t = torch.randint(0, 97, (b, L), generator=torch.Generator().manual_seed(5))
    for layer in range(m.cfg.n_layers):
        _, cache = m.run_with_cache(t, names_filter=lambda n, pre=f"blocks.{layer}.ssm.": n.startswith(pre))
        x, y = cache[f"blocks.{layer}.ssm.hook_x"], cache[f"blocks.{layer}.ssm.hook_y"]
        assert x.dtype == torch.bfloat16 and y.dtype == torch.float32
        p = m.ssm_layer_params(layer)
        alpha, xf, D = m.pattern(t, layer), x.float(), p.D.float()
        assert alpha.dtype == torch.float32
        if p.family == "mamba1":
            got = torch.einsum("bdts,bsd->btd", alpha, xf) + xf * D
        else:
            xh = xf.view(b, L, p.n_heads, p.d_head)
            got = (torch.einsum("bhts,bshp->bthp", alpha, xh) + xh * D[:, None]).reshape(b, L, -1)
        err = float((got - y).abs().max() / y.abs().max())
        assert err <= 1e-5, (layer, err)


# ---- patterns of a half-precision transformer ----------------------------------------------------------------
def test_a_bf16_transformers_pattern_is_float32_like_the_adapters(tmp_path):
    """TransformerBridge caches a bf16 model's pattern in bf16; ``pattern`` returns float32 on every model kind
    (the SSM adapters' implied attention and hybrid patterns already were), the same rows upcast exactly."""
    from gather_aggregate import load_model
    from gather_aggregate.testing.tiny_models import save_model_dir, tiny_llama

    hf, tok = tiny_llama()
    model = load_model(save_model_dir(hf, tok, tmp_path), dtype="bf16")
    tokens = model.to_tokens("a b c d e")
    _, cache = model.run_with_cache(tokens)
    cached = cache["blocks.0.attn.hook_pattern"]
    assert cached.dtype == torch.bfloat16
    got = model.pattern(tokens, 0)
    assert got.dtype == torch.float32
    assert torch.equal(got, cached.float())
    assert model.pattern(cache, 0, rows=-1).dtype == torch.float32
