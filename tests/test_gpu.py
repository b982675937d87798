"""The GPU tier: real-width random checkpoints through the whole pipeline on CUDA.

Run on an H200 in session 15 and, whole, on an H100 in session 18 (figures in docs/gpu.md). Run it with

    HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -m gpu tests/test_gpu.py

It needs a CUDA device (about 10 GiB free); the mamba-ssm comparisons also need the ``[cuda]`` extra.
"""

from __future__ import annotations

import pytest
import torch
from model_checks import check_exact_scan_matches_naive, check_last_row_patterns

from gather_aggregate import load_model
from gather_aggregate.scan.exact import atp_scan
from gather_aggregate.testing.realwidth import PUBLISHED, hf_reference, param_bytes, write_checkpoint

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

FAMILIES = ["falcon-mamba-7b", "mamba2-2.7b", "zamba2-7b", "jamba-v0.1", "bamba-9b"]
DEVICE_BAR = 1.1  # peak device memory of a load / the loaded parameters' bytes


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("realwidth")
    return {name: write_checkpoint(name, root / name, n_layers=2) for name in FAMILIES}


def _tokens(name, batch=2, seq=128):
    return torch.randint(0, PUBLISHED[name]["vocab_size"], (batch, seq),
                         generator=torch.Generator().manual_seed(0)).cuda()


@pytest.mark.parametrize("name", FAMILIES)
def test_load_on_cuda_keeps_dtype_within_device_memory_bar(checkpoints, name):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = load_model(checkpoints[name], tokenizer=False, device="cuda")
    assert model.dtype == getattr(torch, PUBLISHED[name]["dtype"])
    assert {p.device.type for p in model.parameters()} == {"cuda"}
    peak = torch.cuda.max_memory_allocated() - base
    assert peak <= DEVICE_BAR * param_bytes(model), (peak, param_bytes(model))


@pytest.mark.parametrize("name", FAMILIES)
def test_fp32_logits_equal_hf_on_cuda(checkpoints, name):
    tokens = _tokens(name)
    hf = hf_reference(name, checkpoints[name]).cuda()
    with torch.no_grad():
        ref = hf(tokens).logits.float()
    del hf
    model = load_model(checkpoints[name], tokenizer=False, device="cuda", dtype="float32")
    model.scan_impl = "chunked"
    with torch.no_grad():
        assert (model(tokens) - ref).abs().max().item() <= 1e-4 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("name", FAMILIES)
def test_bf16_pipeline_on_cuda(checkpoints, name):
    """bf16 load, run_with_cache, last-row patterns, exact scan == naive scan, AtP over every head."""
    model = load_model(checkpoints[name], tokenizer=False, device="cuda")
    tokens = _tokens(name)
    logits, cache = model.run_with_cache(tokens)
    assert torch.isfinite(logits).all() and len(cache) > 10
    check_last_row_patterns(model, tokens, atol=1e-3, rtol=1e-2)
    # bf16: the resumed forward rounds differently from the full one
    check_exact_scan_matches_naive(model, tokens, rel_tol=2e-2)
    target = tokens[:, -1]

    def metric(lg):
        return lg[:, -1].float().log_softmax(-1).gather(-1, target[:, None]).mean()

    atp = atp_scan(model, tokens, metric)
    assert len(atp.rows) == sum(i.n_heads for i in model.layers)
    assert all(torch.isfinite(torch.tensor(r["score"])) for r in atp.rows)


@pytest.mark.parametrize("name", ["falcon-mamba-7b", "mamba2-2.7b", "bamba-9b"])
def test_mamba_ssm_fused_path_matches_chunked_scan(checkpoints, name):
    pytest.importorskip("mamba_ssm")
    model = load_model(checkpoints[name], tokenizer=False, device="cuda", dtype="float32")
    tokens = _tokens(name)
    with torch.no_grad():
        model.scan_impl = "chunked"
        ours = model(tokens)
        model.scan_impl = "kernel"
        fused = model(tokens)
    assert (fused - ours).abs().max().item() <= 1e-3 * max(1.0, ours.abs().max().item())


def test_device_map_across_cpu_and_cuda(checkpoints):
    """accelerate's hooks move activations between devices; logits equal the one-device model's."""
    pytest.importorskip("accelerate")
    d = checkpoints["mamba2-2.7b"]
    one = load_model(d, tokenizer=False, device="cuda", dtype="float32")
    tokens = _tokens("mamba2-2.7b")
    with torch.no_grad():
        ref = one(tokens).cpu()
    ref_rows = [one.pattern(tokens[:1], layer, rows=-1).cpu() for layer in (0, 1)]
    del one
    split = load_model(d, tokenizer=False, dtype="float32",
                       device_map={"embed": 0, "blocks.0": 0, "blocks.1": "cpu", "ln_final": "cpu"})
    # a module mapped to "cpu" keeps its weights there (accelerate alone would offload them to "meta")
    assert {p.device.type for p in split.blocks[1].parameters()} == {"cpu"}
    assert {p.device.type for p in split.blocks[0].parameters()} == {"cuda"}
    with torch.no_grad():
        assert (split(tokens).cpu() - ref).abs().max().item() <= 1e-4 * max(1.0, ref.abs().max().item())
    for layer, want in zip((0, 1), ref_rows):  # weights read directly (implied attention) on each device
        got = split.pattern(tokens[:1], layer, rows=-1).cpu()
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)


# ---- the device audit's fixes (session 15 helper); first passed on a GPU (H100) in session 18 ------------------
def check_audited_paths_on(device: str) -> None:
    """Paths the CPU tests cover on ``meta`` (tests/test_device_handling.py), here on a real device: CPU tokens
    and labels with a model on ``device`` (distillation, perplexity, the attention graft), a CPU ``n_keys``, the
    delta-rule oracle, and a bf16 Mamba-2's implied attention against its float32 scan."""
    from gather_aggregate.adapters import load_ssm
    from gather_aggregate.adapters.delta_rule import delta_implied_attention, delta_implied_reference
    from gather_aggregate.core.sharpness import sharpness_index
    from gather_aggregate.hybridise import hybridise
    from gather_aggregate.studies.hybrids.distill import stage_loss
    from gather_aggregate.studies.hybrids.experiment import perplexity
    from gather_aggregate.studies.hybrids.graft import AttentionGraft, train_graft
    from gather_aggregate.testing.tiny_models import tiny_llama
    from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

    dev = torch.device(device)
    pattern = torch.rand(2, 3, 5, 7, device=dev).softmax(-1)
    assert sharpness_index(pattern, torch.arange(1, 6)).device.type == dev.type

    g = torch.Generator().manual_seed(1)
    q, k = (torch.nn.functional.normalize(torch.randn(2, 9, 3, 4, generator=g), dim=-1).to(dev) for _ in range(2))
    gate, beta = -torch.rand(2, 9, 3, generator=g).to(dev), torch.rand(2, 9, 3, generator=g).to(dev)
    ref = delta_implied_reference(q, k, gate, beta)
    assert ref.device.type == dev.type
    torch.testing.assert_close(delta_implied_attention(q, k, gate, beta), ref, rtol=1e-5, atol=1e-6)

    m = load_ssm(tiny_hf_ssm("mamba2", seed=5, stress=True)).to(device=dev, dtype=torch.bfloat16)
    t = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(5))  # CPU tokens: the model moves them
    _, cache = m.run_with_cache(t, names_filter=lambda n: n.startswith("blocks.0.ssm."))
    x, y = cache["blocks.0.ssm.hook_x"].float(), cache["blocks.0.ssm.hook_y"]
    p = m.ssm_layer_params(0)
    xh = x.view(2, 24, p.n_heads, p.d_head)
    got = (torch.einsum("bhts,bshp->bthp", m.pattern(t, 0), xh) + xh * p.D.float()[:, None]).reshape(2, 24, -1)
    assert float((got - y).abs().max() / y.abs().max()) <= 1e-5

    m32 = m.float()
    graft = AttentionGraft(m32, 1, 2)
    assert {q.device.type for q in graft.parameters()} == {dev.type}

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:  # on the CPU, as the zoo's batches are
        x = torch.randint(0, m32.d_vocab, (4, 12), generator=torch.Generator().manual_seed(step))
        return x, torch.full_like(x, -100).index_fill_(1, torch.tensor([11]), 3)

    assert len(train_graft(m32, graft, batch, 2, progress=False)) == 2
    assert perplexity(m32, batch, n_batches=2) > 0

    hf, _ = tiny_llama(seed=3)
    teacher, student = hybridise(hf, "all").to(dev), hybridise(hf, [(1, 0)], d_state=8).to(dev)
    tokens = torch.randint(1, hf.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    for stage in ("orientation", "alignment", "end_to_end"):
        assert stage_loss(student, teacher, tokens, stage).device.type == dev.type


def test_audited_paths_on_cuda():
    check_audited_paths_on("cuda")


# ---- the newer families at real width (session 15); first passed on a GPU (H100) in session 18 ----------------
#: the CPU real-width tier's sizes (tests/test_realwidth.py, SLOW), two layers where the family has them
NEWER = {"llama-3.1-8b": dict(n_layers=1, vocab=32000), "llamba-8b": dict(n_layers=2, vocab=32000),
         "nemotron-h-8b": dict(n_layers=3, vocab=32000), "granite-4.0-h-tiny": dict(n_layers=2, n_experts=None),
         "qwen3-next-80b-a3b": dict(n_layers=2, vocab=32000, n_experts=64),
         "falcon-h1-7b": dict(n_layers=2, vocab=32000)}


def check_newer_family_on(device: str, name: str, kw: dict, root) -> None:
    """A real-width checkpoint of ``name`` on ``device``: the shipped dtype kept (and on CUDA the device-memory
    bar), fp32 logits equal the oracle's (HF's own model, Llamba's sequential oracle; on the CPU), and in the
    shipped dtype the last-row patterns, exact scan = naive scan and AtP over every head."""
    from gather_aggregate.testing.realwidth import reference_logits

    d = write_checkpoint(name, root / name, **kw)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    model = load_model(d, tokenizer=False, device=device)
    assert model.dtype == getattr(torch, PUBLISHED[name]["dtype"])
    if cuda:
        assert torch.cuda.max_memory_allocated() - base <= DEVICE_BAR * param_bytes(model)
    vocab = kw.get("vocab") or PUBLISHED[name]["vocab_size"]
    tokens = torch.randint(0, vocab, (2, 64), generator=torch.Generator().manual_seed(0))
    if not hasattr(model, "module"):  # the bridge's (Llama's) patterns and scans are tested elsewhere
        tok = tokens.to(device)
        check_last_row_patterns(model, tok, atol=1e-3, rtol=1e-2)
        check_exact_scan_matches_naive(model, tok, rel_tol=2e-2)
        target = tok[:, -1]
        atp = atp_scan(model, tok, lambda lg: lg[:, -1].float().log_softmax(-1).gather(-1, target[:, None]).mean())
        assert len(atp.rows) == sum(i.n_heads for i in model.layers)
        assert all(torch.isfinite(torch.tensor(r["score"])) for r in atp.rows)
    model = None
    short = tokens[:, :24]  # the oracle runs on the CPU (Llamba's is sequential): the CPU tier's length
    ref = reference_logits(name, d, short, **{k: v for k, v in kw.items() if k in ("n_layers", "vocab", "n_experts")})
    fp32 = load_model(d, tokenizer=False, device=device, dtype="float32")
    with torch.no_grad():
        got = fp32(short.to(device)).float().cpu()
    assert (got - ref).abs().max().item() <= 1e-4 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("name", list(NEWER))
def test_newer_families_on_cuda(tmp_path, name):
    check_newer_family_on("cuda", name, NEWER[name], tmp_path)
