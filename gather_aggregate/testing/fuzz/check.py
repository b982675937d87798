"""How a drawn configuration (:mod:`.config_fuzz`) is checked against its reference, and how far fp32 can get.

:func:`check_case` measures one case (see :data:`LIMITS`); :func:`expected_refusals` names the drawn fields the
adapters refuse by design; :func:`float64_logits` evaluates an HF model's own modeling code in float64, the yardstick
that tells a formula difference from fp32 rounding when a case misses 1e-4 (:func:`fp32_distances`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from gather_aggregate.testing.fuzz.draws import FuzzCase

TOL = 1e-4
#: what each measured quantity may reach: logits and hooks max abs diff (hooks as ``assert_close`` with atol = rtol =
#: 1e-4, so a residual of size 100 may differ by 1e-2), implied attention relative to the largest magnitude of its
#: terms (``Σ_n |C_t[n] B_s[n]|`` times the decay and Δ: where the terms cancel, fp32 ``C·B`` is exact only to that)
LIMITS: dict[str, float] = {"logits": TOL, "resid": TOL, "head_out": TOL, "pattern": TOL, "hook_z": TOL,
                            "resume": TOL, "implied": 1e-5, "rows": 1e-5}


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b| / (1 + |b|)``: at most ``TOL`` when ``assert_close(a, b, atol=TOL, rtol=TOL)`` holds."""
    return float(((a.double() - b.double()).abs() / (1.0 + b.double().abs())).max())


def _oracle(mixer: Any, cache: Any, prefix: str, magnitude: bool = False) -> torch.Tensor:
    """The reference (sequential / formula) implied attention of every head of ``mixer`` from its hooks.

    ``magnitude=True`` gives the same sum with ``|B|`` and ``|C|`` (Mamba families; gated DeltaNet: the matrix
    itself): the size of the terms whose sum is α, the scale fp32 rounding of ``C·B`` is relative to (where the
    terms cancel, α itself is far smaller)."""
    from gather_aggregate.adapters.delta_rule import delta_implied_reference, prepare_qk
    from gather_aggregate.adapters.discrete_mamba2 import DiscreteMamba2Mixer
    from gather_aggregate.adapters.gated_deltanet import GatedDeltaNetMixer
    from gather_aggregate.adapters.implied import mamba1_implied_reference, mamba2_implied_reference
    from gather_aggregate.adapters.mixers import Mamba1Mixer

    def hook(name: str) -> torch.Tensor:
        t: torch.Tensor = cache[f"{prefix}.hook_{name}"]
        return t.abs() if magnitude and name in ("B", "C") else t

    if isinstance(mixer, GatedDeltaNetMixer):
        q, k = prepare_qk(hook("q"), hook("k"), mixer.n_v)
        return delta_implied_reference(q, k, hook("g"), hook("beta"))
    if isinstance(mixer, DiscreteMamba2Mixer):
        return mamba2_implied_reference(hook("dt"), mixer.A(), hook("B"), hook("C"), dt_scaling=False)
    if isinstance(mixer, Mamba1Mixer):  # per channel, averaged over a head's channels
        alpha = mamba1_implied_reference(hook("dt"), mixer.A(), hook("B"), hook("C"))
        return alpha.unflatten(1, (-1, mixer.cfg.d_head)).mean(2)
    return mamba2_implied_reference(hook("dt"), mixer.A(), hook("B"), hook("C"))


def _implied(model: Any, cache: Any) -> dict[str, float]:
    """Every SSM layer's implied attention (the fast path ``model.pattern``) against its oracle, and the final query
    row asked alone (``rows=-1``) against the full matrix's; both relative to the largest term magnitude
    (:func:`_oracle` with ``magnitude=True``)."""
    names = {id(m): n for n, m in model.named_modules()}
    worst = {"implied": 0.0, "rows": 0.0}
    for info in model.layers:
        heads = info.heads_of("ssm")
        if not heads:
            continue
        mixer = model.ssm_mixer(info.index)
        ref = _oracle(mixer, cache, names[id(mixer)]).double()
        scale = float(_oracle(mixer, cache, names[id(mixer)], magnitude=True).abs().max()) or 1.0
        fast = model.pattern(cache, info.index, heads=heads)
        last = model.pattern(cache, info.index, heads=heads, rows=-1)[:, :, 0]
        worst["implied"] = max(worst["implied"], float((fast.double() - ref).abs().max()) / scale)
        worst["rows"] = max(worst["rows"], float((last - fast[:, :, -1]).abs().max()) / scale)
    return worst if any(i.heads_of("ssm") for i in model.layers) else {}


def _hf_forward(hf: Any, tokens: torch.Tensor, **kwargs: Any) -> tuple[Any, list[torch.Tensor]]:
    """HF's forward and the input of each SSM mixer's ``out_proj`` in it (what our ``ssm.hook_head_out`` holds)."""
    heads: list[torch.Tensor] = []
    out_projs = [m for n, m in hf.named_modules() if n.endswith("out_proj") and ".layers." in n
                 and any(k in n for k in ("mixer.", "mamba.", "linear_attn."))]
    handles = [m.register_forward_pre_hook(lambda _m, a: heads.append(a[0].detach())) for m in out_projs]
    try:
        with torch.no_grad():
            out = hf(tokens, use_cache=False, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return out, heads


def check_case(case: FuzzCase) -> dict[str, float]:
    """Measure one drawn case (see :data:`LIMITS`): logits against HF (Llamba: against its sequential oracle), the
    residual stream at each layer's input against HF's hidden states (where layers map one to one), each SSM
    mixer's ``hook_head_out`` against the input of HF's ``out_proj`` there, attention patterns and ``hook_z`` against
    HF and a forward resumed at each layer against the full one (transformers; ``hook_z`` split into the layer's
    heads), implied attention against its oracle (SSM layers); HF's
    weights must come back untouched.  Raises the loader's error where the config is refused."""
    from gather_aggregate.core.protocol import param_checksum
    from gather_aggregate.models.loading import from_hf_model

    toks, out = case.tokens, {}
    hidden: Any = None
    hf_heads: list[torch.Tensor] = []
    if case.family == "llamba":
        import tempfile

        from gather_aggregate.adapters.llamba import load_llamba
        from gather_aggregate.testing.llamba_checkpoints import (
            llamba_reference_logits,
            save_llamba_checkpoint,
        )

        assert case.raw is not None and case.state_dict is not None
        with tempfile.TemporaryDirectory() as d:
            model = load_llamba(save_llamba_checkpoint(d, case.raw, case.state_dict))
        ref = llamba_reference_logits(case.raw, case.state_dict, toks)
    else:
        before = param_checksum(case.hf)
        model = from_hf_model(case.hf, **case.load_kwargs)
        o, hf_heads = _hf_forward(case.hf, toks, output_hidden_states=True,
                                  output_attentions=hasattr(model, "module"))
        ref, hidden = o.logits, o.hidden_states
        if param_checksum(case.hf) != before:
            raise AssertionError("loading changed the HF model's weights")
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks)
    if float(ref.abs().max()) < 0.1:
        raise AssertionError("degenerate reference logits")
    out["logits"] = float((logits - ref[..., :logits.shape[-1]]).abs().max())
    blocks = getattr(model, "blocks", None)
    if hidden is not None and blocks is not None and len(blocks) == len(hidden) - 1:
        # HF's first hidden state is the embedding (most families) or the first layer's output (Mamba, Mamba-2)
        shift = 0 if _close(cache["blocks.0.hook_resid_pre"], hidden[0]) <= TOL else 1
        errs = [_close(cache[f"blocks.{i}.hook_resid_pre"], hidden[i - shift]) for i in range(1, len(blocks))]
        if errs:
            out["resid"] = max(errs)
    if hasattr(model, "module"):  # a transformer through the bridge: patterns and the o_proj input
        from gather_aggregate.testing.tiny_models import hf_head_inputs

        out["pattern"] = max(float((model.pattern(cache, i) - a).abs().max()) for i, a in enumerate(o.attentions))
        out["hook_z"] = max(_close(cache[model.head_hook(i)[0]].flatten(2), hf_head_inputs(case.hf, toks, i))
                            for i in range(len(o.attentions)))
        if any(cache[info.head_hook].shape[-2:] != (info.n_heads, info.d_head) for info in model.layers):
            out["hook_z"] = float("inf")  # the right numbers split into the wrong heads
        with torch.no_grad():  # a forward resumed at each layer, as the exact scans run it (twice: the first learns)
            out["resume"] = max(float((model(cache[model.resid_hook(i)], start_at_layer=i) - logits).abs().max())
                                for _ in range(2) for i in range(1, model.n_layers)) if model.n_layers > 1 else 0.0
            out["resume"] = max(out["resume"], float((model(toks) - logits).abs().max()))  # nothing left behind
    if hasattr(model, "ssm_mixer"):
        out.update(_implied(model, cache))
        ours = [v for k, v in cache.items() if k.endswith("ssm.hook_head_out")]
        if ours and len(ours) == len(hf_heads):
            out["head_out"] = max(_close(a.flatten(2), b) for a, b in zip(ours, hf_heads))
    return out


def expected_refusals(case: FuzzCase) -> list[str]:
    """What the loader's :class:`~gather_aggregate.core.errors.UnsupportedModelError` on ``case`` may name: the drawn
    fields the adapters refuse by design (empty: the case must load and pass)."""
    f, why = case.fields, []
    if f.get("hidden_act") == "gelu" and case.family in ("bamba", "jamba", "falcon_h1", "granitemoehybrid",
                                                         "qwen3_next"):
        why.append("hidden_act")  # these families' SSM mixers apply hidden_act too (the conv / the gate)
    rope = f.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" and case.family in (
            "bamba", "falcon_h1", "granitemoehybrid", "qwen3_next", "zamba2"):
        why.append("rope_type")  # the hooked hybrids implement the default RoPE only
    if case.family == "gpt2" and not f["scale_attn_weights"]:
        why.append("scale_attn_weights")  # TransformerLens' bridge always scales (gather_aggregate.models.bridge)
    if case.family == "pythia" and not f["attention_bias"]:
        why.append("attention_bias")  # TransformerLens' GPT-NeoX adapter needs the qkv bias
    if case.family == "phi" and f["qk_layernorm"]:
        why.append("qk_layernorm")  # TL's Phi adapter has no q/k norms
    if case.family == "gemma3" and f["attn_logit_softcapping"] is not None:
        why.append("attn_logit_softcapping")  # TL's Gemma 3 attention does not soft-cap
    if case.family == "gpt_bigcode":
        why += [k for k in ("multi_query", "scale_attn_weights") if not f[k]]  # TL: multi-query, scaled scores
    if case.family == "olmoe" and f["clip_qkv"] is not None:
        why.append("clip_qkv")  # TL's OLMoE attention cannot clip before its q/k norms
    if case.family == "gemma4_text" and f["hidden_size_per_layer_input"]:
        why.append("hidden_size_per_layer_input")  # per-layer embeddings need the token ids: no resumed forward
    if case.family == "laguna" and set(f["num_attention_heads_per_layer"]) != {f["num_attention_heads"]}:
        why.append("num_attention_heads_per_layer")  # TL's bridge gives every layer num_attention_heads heads
    if case.family == "opt":
        why += [k for k, v in (("do_layer_norm_before", False), ("_remove_final_layer_norm", True)) if f[k] == v]
    if case.family == "falcon" and f["new_decoder_architecture"] and (
            not f["parallel_attn"] or f.get("num_ln_in_parallel_attn") == 1 or f["num_kv_heads"] != 1):
        why.append("new_decoder_architecture")  # TL's Falcon adapter: one KV head, ln_attn and ln_mlp there
    if case.family == "nemotron_h":
        types = f["layers_block_type"]
        if types[0] in ("mlp", "moe"):
            why.append("must be Mamba or attention")
        n_exp, n_group = f["n_routed_experts"], f["n_group"]
        if "moe" in types and (n_exp % n_group or n_exp // n_group < 2 or f["topk_group"] > n_group):
            why.append("n_group")
    return why


def over_limits(measured: dict[str, float]) -> dict[str, float]:
    """The measured quantities above their :data:`LIMITS` (empty when the case passes)."""
    return {k: v for k, v in measured.items() if not v <= LIMITS[k]}


def float64_logits(hf: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of ``hf``'s architecture evaluated in float64 throughout: HF's modeling module re-executed with every
    ``torch.float32`` / ``.float()`` cast made float64 (HF upcasts its internals only to fp32, so HF's model cast to
    float64 is not a float64 evaluation), the same weights."""
    import copy
    import types

    mod = sys.modules[type(hf).__module__]
    name = mod.__name__ + "_float64"
    if name not in sys.modules:
        path = str(mod.__file__)
        src = Path(path).read_text().replace("torch.float32", "torch.float64").replace(".float()", ".double()")
        m64 = types.ModuleType(name)
        m64.__dict__.update({"__package__": mod.__package__, "__file__": path})
        sys.modules[name] = m64
        exec(compile(src, path, "exec"), m64.__dict__)
    cfg = copy.deepcopy(hf.config)
    cfg._experts_implementation = "eager"  # the grouped-matmul experts take no float64
    model = getattr(sys.modules[name], type(hf).__name__)(cfg).eval()
    model.load_state_dict(hf.state_dict())
    model = model.double()
    for m in model.modules():
        if hasattr(m, "config"):
            m.config._experts_implementation = "eager"
    with torch.no_grad():
        out: torch.Tensor = model(tokens, use_cache=False).logits
    return out


def fp32_distances(case: FuzzCase) -> dict[str, float]:
    """How far fp32 gets on ``case``: max abs distance from :func:`float64_logits` of HF's fp32 logits (``"hf"``)
    and ours (``"ours"``), and how far HF's own fp32 logits move when every weight is multiplied by ``1 + 1e-7 ε``
    (``"hf_jitter"``, ε standard normal: about one rounding of each weight); ``"hf_jitter_heads"`` and
    ``"hf_jitter_resid"``: how far the SSM mixers' ``out_proj`` inputs and HF's hidden states move then (measured
    as ``LIMITS["head_out"]`` and ``LIMITS["resid"]`` are)."""
    import copy

    from gather_aggregate.models.loading import from_hf_model

    truth = float64_logits(case.hf, case.tokens)
    jittered = copy.deepcopy(case.hf)
    g = torch.Generator().manual_seed(case.seed)
    with torch.no_grad():
        for p in jittered.parameters():
            p.mul_(1 + 1e-7 * torch.randn(p.shape, generator=g))
        out, heads = _hf_forward(case.hf, case.tokens, output_hidden_states=True)
        got = {"hf": out.logits, "ours": from_hf_model(case.hf, **case.load_kwargs)(case.tokens)}
    j_out, j_heads = _hf_forward(jittered, case.tokens, output_hidden_states=True)
    hidden = zip(j_out.hidden_states or (), out.hidden_states or ())
    return {**{k: float((v.double() - truth).abs().max()) for k, v in got.items()},
            "hf_jitter": float((j_out.logits - out.logits).abs().max()),
            "hf_jitter_heads": max((_close(a, b) for a, b in zip(j_heads, heads)), default=0.0),
            "hf_jitter_resid": max((_close(a, b) for a, b in hidden), default=0.0)}


def fp32_bound(case: FuzzCase, over: dict[str, float]) -> str | None:
    """Why ``case``'s misses ``over`` are fp32 rounding, not a formula (``None`` where that is not shown).

    Only logits and the residual and head hooks (which carry the same rounding) qualify.  Logits qualify where ours
    are within ``max(TOL, 2 · HF's distance, 2 · HF's jitter)`` of HF's modeling code evaluated in float64, as close
    to the formula as fp32 gets on this configuration; head hooks and the residual stream where they are within
    twice how far HF's own move under the jitter (:func:`fp32_distances`); the residual stream only beside the
    logits."""
    if not over or not set(over) <= {"logits", "resid", "head_out"} or case.hf is None:
        return None
    d = fp32_distances(case)
    if "logits" in over and d["ours"] > max(TOL, 2 * d["hf"], 2 * d["hf_jitter"]):
        return None
    # the head hooks are held to HF's jitter also where the logits are over: a misplaced hook is not rounding
    if over.get("head_out", 0.0) > 2 * d["hf_jitter_heads"] or over.get("resid", 0.0) > 2 * d["hf_jitter_resid"]:
        return None
    if "logits" not in over and "resid" in over:
        return None
    return (f"fp32 rounding: {', '.join(f'{k} {v:.1e}' for k, v in over.items())} from HF's fp32; from float64 "
            f"ours {d['ours']:.1e}, HF's fp32 {d['hf']:.1e}; HF's logits move {d['hf_jitter']:.1e}, its head inputs "
            f"{d['hf_jitter_heads']:.1e}, its hidden states {d['hf_jitter_resid']:.1e}, when its weights are jittered "
            "by 1e-7")


__all__ = ["LIMITS", "TOL", "check_case", "expected_refusals", "float64_logits", "fp32_bound", "fp32_distances",
           "over_limits"]
