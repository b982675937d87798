"""Head-level hybrids (gather_aggregate.hybridise): exactness, MOHAWK init, protocol, saving, distillation, choice."""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.core.errors import InputError, ResumeMismatchError


@pytest.fixture(scope="module")
def teacher():
    from gather_aggregate.testing.tiny_models import tiny_llama

    hf, tok = tiny_llama(seed=3)  # GQA: 4 query heads read 2 kv heads
    return hf, tok


def _tokens(n: int, L: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (n, L), generator=g)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm().clamp_min(1e-30))


def test_all_heads_kept_equals_the_teacher(teacher):
    from gather_aggregate.core.protocol import param_checksum
    from gather_aggregate.hybridise import hybridise

    hf, tok = teacher
    before = param_checksum(hf)
    model = hybridise(hf, "all")
    t = _tokens(2, 37, hf.config.vocab_size)
    with torch.no_grad():
        ref = hf(t).logits
    assert _rel(model(t), ref) <= 1e-5
    assert (model(t) - ref).abs().max() <= 1e-4
    assert param_checksum(hf) == before  # the teacher is copied, never touched
    assert all(k == "attn" for k in (info.kind for info in model.layers))


@pytest.mark.parametrize("d_state", [3, 16, 24])  # below, at and above the head dimension (16)
def test_ssm_heads_implied_attention_reconstructs_their_output(teacher, d_state):
    from gather_aggregate.hybridise import hybridise
    from gather_aggregate.models.head_hybrid.layers import implied_attention

    hf, _ = teacher
    model = hybridise(hf, [(0, 1), (1, 3)], d_state=d_state)
    with torch.no_grad():
        for blk in model.blocks:  # a non-trivial skip, decay and time step
            blk.attn.ssm.D.normal_()
            blk.attn.ssm.A_log.normal_(0, 0.5)
            blk.attn.ssm.dt_proj.weight.normal_(0, 0.3)
    t = _tokens(2, 150, hf.config.vocab_size)  # longer than a scan chunk (64)
    _, cache = model.run_with_cache(t)
    for L, blk in enumerate(model.blocks):
        mix = blk.attn
        x, dt, B, C = (cache[f"blocks.{L}.attn.ssm.hook_{n}"] for n in ("x", "dt", "B", "C"))
        y = cache[f"blocks.{L}.attn.ssm.hook_y"]
        alpha = implied_attention(dt, mix.ssm.A, B, C)
        rebuilt = torch.einsum("bhts,bshp->bthp", alpha, x) + x * mix.ssm.D[:, None]
        assert _rel(rebuilt, y) <= 1e-5
        pat = model.pattern(cache, L)  # protocol: softmax for kept heads, implied for SSM heads
        assert _rel(pat[:, mix.ssm_idx], alpha) <= 1e-5
        z = cache[f"blocks.{L}.attn.hook_z"]
        assert torch.allclose(z[:, :, mix.ssm_idx], y)
        for i, h in enumerate(mix.kept):
            assert torch.allclose(pat[:, h], cache[f"blocks.{L}.attn.hook_pattern"][:, i])
        rows = model.pattern(cache, L, heads=list(reversed(mix.ssm_idx)), rows=[-1])
        assert _rel(rows[:, :, 0], alpha.flip(1)[:, :, -1]) <= 1e-5
    chunked = model(t)
    model.sequential = True
    assert _rel(model(t), chunked) <= 1e-5  # the step-by-step reference scan agrees


def test_mohawk_initialisation(teacher):
    """d_state = d_head: C·B equals the attention logit q·k/√d (before RoPE); below: the best rank-N form."""
    from gather_aggregate.hybridise import hybridise

    hf, _ = teacher
    full = hybridise(hf, "all")
    t = _tokens(1, 20, hf.config.vocab_size)
    _, tc = full.run_with_cache(t)
    for N in (16, 24):
        model = hybridise(hf, "none", d_state=N)
        for L in range(2):  # each SSM head on the teacher's layer input
            x, _, B, C = model.blocks[L].attn.ssm.inputs(tc[f"blocks.{L}.ln1.hook_normalized"])
            q, k = tc[f"blocks.{L}.attn.hook_q"], tc[f"blocks.{L}.attn.hook_k"].repeat_interleave(2, 2)
            logits = torch.einsum("bthd,bshd->bhts", q, k) * 16 ** -0.5
            cb = torch.einsum("bthn,bshn->bhts", C[..., :16], B[..., :16])
            assert _rel(cb, logits) <= 1e-5
            assert torch.allclose(x, tc[f"blocks.{L}.attn.hook_v"].repeat_interleave(2, 2))
    W = hf.model.layers[0].self_attn
    target = (W.q_proj.weight[:16].T.double() @ W.k_proj.weight[:16].double() * 0.25).detach()
    low = hybridise(hf, "none", d_state=4).blocks[0].attn.ssm
    approx = (low.C_proj.weight[:4].T.double() @ low.B_proj.weight[:4].double()).detach()
    S = torch.linalg.svdvals(target)
    assert abs(float((approx - target).norm()) - float(S[4:].norm())) <= 1e-5 * float(S.norm())


def test_hybrid_is_a_protocol_model_and_round_trips_through_load_model(teacher, tmp_path):
    import logging

    from transformers.utils import logging as hf_logging

    from gather_aggregate import load_model
    from gather_aggregate.core.protocol import HookedModel
    from gather_aggregate.hybridise import hybridise
    from gather_aggregate.scan.exact import exact_scan, naive_scan

    hf, tok = teacher
    model = hybridise(hf, [(1, 2)], d_state=8)
    model.tokenizer = tok
    assert isinstance(model, HookedModel)
    assert [i.kind for i in model.layers] == ["ssm", "attn"]
    assert model.head_kinds(1) == ["ssm", "ssm", "attn", "ssm"]
    t = _tokens(3, 25, hf.config.vocab_size)
    name, axis = model.head_hook(0)
    _, cache = model.run_with_cache(t, names_filter=[name])
    assert cache[name].shape == (3, 25, 4, 16) and axis == 2
    metric = lambda logits: logits[:, -1].log_softmax(-1)[:, 5].mean()  # noqa: E731
    fast, slow = exact_scan(model, t, metric, progress=False), naive_scan(model, t, metric, progress=False)
    assert max(abs(fast.score(*h) - slow.score(*h)) for h in model.all_heads()) <= 1e-4
    model.save_pretrained(tmp_path / "hy")
    seen: list[str] = []
    catch = logging.Handler()
    catch.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    hf_logging.get_logger("transformers").addHandler(catch)
    try:
        again = load_model(tmp_path / "hy")
    finally:
        hf_logging.get_logger("transformers").removeHandler(catch)
    assert type(again).__name__ == "HookedHeadHybrid" and again.cfg == model.cfg
    assert torch.equal(again(t), model(t))
    assert again.tokenizer is not None
    assert again.tokenizer("a b").input_ids == tok("a b").input_ids
    # transformers reads an unknown config.json for the tokenizer and warns it may be incompatible: not here
    assert not [m for m in seen if "instantiate a model of type" in m], seen


def test_bad_layouts_raise_clear_errors(teacher):
    from gather_aggregate.hybridise import hybridise

    hf, _ = teacher
    with pytest.raises(InputError, match="out of range"):
        hybridise(hf, [(0, 9)])
    with pytest.raises(InputError, match="pairs"):
        hybridise(hf, [3])
    with pytest.raises(InputError, match="init"):
        hybridise(hf, "all", init="svd")


class _Stop(Exception):
    pass


def test_distillation_runs_every_stage_and_resumes_exactly(teacher, tmp_path):
    from gather_aggregate.hybridise import hybridise
    from gather_aggregate.studies.hybrids.distill import DistillConfig, distill, stage_loss

    hf, _ = teacher
    full = hybridise(hf, "all")
    data = lambda i: _tokens(4, 24, hf.config.vocab_size, seed=100 + i)  # noqa: E731
    cfg = DistillConfig(steps=(6, 3, 3), lr=(1e-2, 1e-3, 1e-3), checkpoint_every=1, log_every=1)

    ref = hybridise(hf, [(1, 0)], d_state=8)
    with torch.no_grad():
        before = float(stage_loss(ref, full, data(0), "orientation"))
    log = distill(ref, full, data, cfg, out_dir=tmp_path / "a", progress=False)
    assert [r["stage"] for r in log] == ["orientation"] * 6 + ["alignment"] * 3 + ["end_to_end"] * 3
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in log)
    with torch.no_grad():
        assert float(stage_loss(ref, full, data(0), "orientation")) < before

    killed = hybridise(hf, [(1, 0)], d_state=8)

    def flaky(i: int) -> torch.Tensor:
        if i == 7:  # in stage 2, after its first step was checkpointed
            raise _Stop
        return data(i)

    with pytest.raises(_Stop):
        distill(killed, full, flaky, cfg, out_dir=tmp_path / "b", progress=False)
    resumed = hybridise(hf, [(1, 0)], d_state=8)
    log2 = distill(resumed, full, data, cfg, out_dir=tmp_path / "b", progress=False)
    assert [r["loss"] for r in log2] == [r["loss"] for r in log]
    for (n, p), q in zip(ref.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(p, q), n
    other = hybridise(hf, [(1, 1)], d_state=8)
    with pytest.raises(ResumeMismatchError):
        distill(other, full, data, cfg, out_dir=tmp_path / "b", progress=False)
    with pytest.raises(InputError, match="every head"):
        distill(other, ref, data, cfg, progress=False)


def test_toy_sweep_smoke(tmp_path):
    """The experiment runner end to end on the zoo transformer with one step per stage; reruns skip what is done."""
    from gather_aggregate.studies.hybrids.experiment import format_results, run_sweep, zoo_batches
    from gather_aggregate.zoo import zoo_path

    b = zoo_batches(zoo_path("llama-kvmc"), batch_size=2, seed=5)
    assert torch.equal(b(3), b(3)) and not torch.equal(b(3), b(4))
    kw = dict(ks=[0], strategies=["scan"], seeds=[0], d_states=[4], steps=(1, 1, 1), out=tmp_path,
              batch_size=2, eval_n=4, progress=False)
    rows = run_sweep(zoo_path("llama-kvmc"), **kw)
    assert [r["name"] for r in rows] == ["teacher", "none-k0-s0-N4"]
    assert rows[0]["kv"] >= 0.75 and 1.0 <= rows[0]["ppl"] < 2.0  # the teacher retrieves and answers
    assert set(rows[1]) >= {"kv", "letter_mc", "content_mc", "knowledge", "ppl", "final_loss"}
    assert (tmp_path / "none-k0-s0-N4" / "model" / "config.json").is_file()
    assert run_sweep(zoo_path("llama-kvmc"), **kw) == rows
    table = format_results(rows).splitlines()
    assert table[2].startswith("| `teacher` | all |") and table[3].startswith("| `none-k0-s0-N4` | none |")


@pytest.mark.slow
def test_full_distillation_run_recovers_the_teacher_better_than_its_initialisation(tmp_path):
    """A full-length run (scan top-2 kept, 60/60/120 steps): the end-to-end KL to the teacher falls."""
    from gather_aggregate.hybridise import hybridise
    from gather_aggregate.studies.hybrids.distill import DistillConfig, distill, stage_loss
    from gather_aggregate.studies.hybrids.experiment import zoo_batches
    from gather_aggregate.zoo import zoo_path

    p = zoo_path("llama-kvmc")
    teacher, student = hybridise(p, "all"), hybridise(p, [(0, 2), (1, 0)])
    held = zoo_batches(p, 8, seed=99)(0)
    with torch.no_grad():
        before = float(stage_loss(student, teacher, held, "end_to_end"))
    distill(student, teacher, zoo_batches(p, 8), DistillConfig(steps=(60, 60, 120)), out_dir=tmp_path)
    with torch.no_grad():
        after = float(stage_loss(student, teacher, held, "end_to_end"))
    assert after < 0.5 * before
