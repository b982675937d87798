"""Random checkpoints at the published widths of real models, written as the real ones ship.

:data:`PUBLISHED` holds the widths of each model's published ``config.json``
(hidden sizes, heads, state sizes, vocabulary, dtype, file layout). Only the
layer count is cut (``n_layers``, default 2) and, optionally, the vocabulary.
:func:`write_checkpoint` writes random weights in the real model's layout:

* HF families: sharded ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``
  (Jamba's MoE experts in their per-expert on-disk names), in the shipped dtype;
* ``mamba2-2.7b``: the original mamba-ssm layout (``config.json`` with ``d_model``/``n_layer``/
  ``ssm_cfg`` and one fp32 ``pytorch_model.bin``);
* ``llamba-8b``: Cartesia's layout (``config.json`` with ``d_model``/``n_layer``/``ssm_cfg``/``mlp_cfg``,
  ``backbone.*`` tensor names), sharded bf16 safetensors; its oracle is
  :func:`~gather_aggregate.testing.llamba_checkpoints.llamba_reference_logits` (HF has no Llamba).

Tensor names and shapes come from the HF class built on the meta device, renamed to the
on-disk names the way ``save_pretrained`` does (HF's ``revert_weight_conversion``: per-expert
tensors, Nemotron-H's ``backbone.`` prefix, Granite's ``input_linear``), so the writer never holds
more than one shard in memory. Values are random with the
scales a trained model has (norms near 1, ``A_log``/``D``/``dt_bias`` in their
usual ranges), so logits are informative and exactness checks are meaningful.
Used by ``tests/test_realwidth.py``, ``benchmarks/bench_load.py`` and ``benchmarks/bench_gpu.py``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch

#: published config values (the layer count is set by ``write_checkpoint``)
PUBLISHED: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, rms_norm_eps=1e-5, max_position_embeddings=131072,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=False, dtype="bfloat16", _shards=4),
    "falcon-mamba-7b": dict(
        model_type="falcon_mamba", hidden_size=4096, intermediate_size=8192, state_size=16, conv_kernel=4,
        expand=16, time_step_rank=256, vocab_size=65024, use_bias=False, use_conv_bias=True,
        layer_norm_epsilon=1e-5, mixer_rms_eps=1e-6, tie_word_embeddings=False, dtype="bfloat16", _shards=7),
    "mamba2-2.7b": dict(  # state-spaces/mamba2-2.7b: mamba-ssm format, fp32 pytorch_model.bin
        model_type="mamba2", hidden_size=2560, state_size=128, conv_kernel=4, expand=2, head_dim=64,
        num_heads=80, n_groups=1, vocab_size=50288, chunk_size=256, use_bias=False, use_conv_bias=True,
        layer_norm_epsilon=1e-5, tie_word_embeddings=True, dtype="float32", _format="mamba_ssm"),
    "zamba2-7b": dict(
        model_type="zamba2", hidden_size=3584, mamba_d_state=64, mamba_d_conv=4, mamba_expand=2,
        mamba_headdim=64, n_mamba_heads=112, mamba_ngroups=2, num_attention_heads=32, num_key_value_heads=32,
        attention_head_dim=224, intermediate_size=14336, num_mem_blocks=2, adapter_rank=128,
        use_shared_attention_adapter=False, use_mem_rope=True, vocab_size=32000, tie_word_embeddings=True,
        dtype="bfloat16", _shards=4, _layers=("hybrid", "mamba")),
    "jamba-v0.1": dict(
        model_type="jamba", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
        num_key_value_heads=8, num_experts=16, num_experts_per_tok=2, expert_layer_period=2,
        expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=0, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_dt_rank=256, vocab_size=65536, tie_word_embeddings=False, dtype="bfloat16",
        _shards=4),
    "bamba-9b": dict(
        model_type="bamba", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
        num_key_value_heads=8, mamba_n_heads=128, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1,
        mamba_expand=2, mamba_d_conv=4, mamba_chunk_size=256, vocab_size=128256, rms_norm_eps=1e-5,
        tie_word_embeddings=False, dtype="bfloat16", _shards=4, _attn_layers=(1,)),
    "llamba-8b": dict(  # cartesia-ai/Llamba-8B (LlambaConfig's defaults are its widths); Cartesia's format
        model_type="llamba", hidden_size=4096, intermediate_size=14336, d_state=64, n_v_heads=32, n_qk_heads=32,
        expand=1, d_conv=4, chunk_size=128, vocab_size=128256, tie_word_embeddings=False, dtype="bfloat16",
        _shards=4, _format="cartesia"),
    "nemotron-h-8b": dict(  # nvidia/Nemotron-H-8B-Base-8K: Mamba-2 (M), attention (*) and relu² MLP (-) blocks
        model_type="nemotron_h", hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        intermediate_size=21504, mlp_hidden_act="relu2", mamba_num_heads=128, mamba_head_dim=64, ssm_state_size=128,
        n_groups=8, conv_kernel=4, expand=2, chunk_size=128, vocab_size=131072, layer_norm_epsilon=1e-5,
        tie_word_embeddings=False, dtype="bfloat16", _shards=4,
        _layers=("linear_attention", "full_attention", "mlp")),
    "granite-4.0-h-tiny": dict(  # ibm-granite/granite-4.0-h-tiny: Mamba-2 + NoPE attention, 64 experts top-6
        model_type="granitemoehybrid", hidden_size=1536, num_attention_heads=12, num_key_value_heads=4,
        intermediate_size=512, shared_intermediate_size=1024, num_local_experts=64, num_experts_per_tok=6,
        mamba_n_heads=48, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, mamba_expand=2, mamba_d_conv=4,
        mamba_chunk_size=256, position_embedding_type="nope", embedding_multiplier=12.0, logits_scaling=6.0,
        residual_multiplier=0.22, attention_multiplier=0.0078125, rms_norm_eps=1e-5, vocab_size=100352,
        tie_word_embeddings=True, dtype="bfloat16", _shards=3, _layers=("mamba", "attention"),
        _experts="num_local_experts"),
    "falcon-h1-7b": dict(  # tiiuae/Falcon-H1-7B: attention and Mamba-2 side by side in every layer (HF's FalconH1
        # docs table: 44 layers, hidden 3072, 12/2 attention heads of 128, 24 Mamba heads of 128, d_state 256).
        # Assumptions (not in that table): intermediate_size 12288, mamba_n_groups 1, the μP multipliers and
        # RoPE at FalconH1Config's defaults, vocab 130048, 4 shards
        model_type="falcon_h1", hidden_size=3072, num_attention_heads=12, num_key_value_heads=2, head_dim=128,
        intermediate_size=12288, mamba_n_heads=24, mamba_d_head=128, mamba_d_ssm=3072, mamba_d_state=256,
        mamba_n_groups=1, mamba_d_conv=4, mamba_chunk_size=256, mamba_rms_norm=False, rms_norm_eps=1e-5,
        vocab_size=130048, tie_word_embeddings=False, dtype="bfloat16", _shards=4),
    "qwen3-next-80b-a3b": dict(  # Qwen/Qwen3-Next-80B-A3B: gated DeltaNet + gated attention, 512 experts top-10
        model_type="qwen3_next", hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, intermediate_size=5120, rms_norm_eps=1e-6, vocab_size=151936,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        tie_word_embeddings=False, dtype="bfloat16", _shards=4, _layers=("linear_attention", "full_attention"),
        _experts="num_experts", _mtp=True),
    "deepseek-v2-lite": dict(  # deepseek-ai/DeepSeek-V2-Lite: multi-head latent attention (no query LoRA), 64
        # routed experts top-6 + 2 shared, layer 0 dense. Widths as the model card/paper give them; yarn
        # rope_scaling (factor 40, mscale 0.707 = mscale_all_dim: the softmax scale is multiplied by mscale^2),
        # max_position_embeddings 163840, n_group/topk_group 1 and 4 shards are as third-party copies of its
        # config.json give them (not verified here: no hub access). Left out: bos/eos 100000/100001 (outside a
        # cut vocabulary), and scoring_func "softmax", moe_layer_freq 1, aux_loss_alpha, seq_aux (read only by
        # its remote code; HF's class has softmax routing built in)
        model_type="deepseek_v2", hidden_size=2048, intermediate_size=10944, num_attention_heads=16,
        num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, first_k_dense_replace=1, moe_intermediate_size=1408, n_routed_experts=64,
        n_shared_experts=2, num_experts_per_tok=6, n_group=1, topk_group=1, topk_method="greedy",
        norm_topk_prob=False, routed_scaling_factor=1.0, vocab_size=102400, rms_norm_eps=1e-6,
        max_position_embeddings=163840,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707,
                         "original_max_position_embeddings": 4096},
        tie_word_embeddings=False, dtype="bfloat16", _shards=4, _experts="n_routed_experts",
        _release_json={"auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV2Config",
                                    "AutoModel": "modeling_deepseek.DeepseekV2Model",
                                    "AutoModelForCausalLM": "modeling_deepseek.DeepseekV2ForCausalLM"},
                       "aux_loss_alpha": 0.001, "moe_layer_freq": 1, "scoring_func": "softmax", "seq_aux": True}),
}
# ``_release_json``: config.json is rewritten in the released file's transformers-4 spelling (``rope_theta`` and
# ``rope_scaling`` with ``type``, ``torch_dtype``, no derived ``head_dim``/``qk_head_dim``) with these keys of its
# remote code added (HF's class loads it without ``trust_remote_code`` and ignores them).
# Departures from the shipped files, forced by 1-2 layers: Jamba's attention period/offset are 8/4 and
# Bamba's attention layers 9/18/27 (here layer 0 resp. 1 is attention so both kinds appear); Jamba keeps
# ``n_experts`` experts (default 4 of 16) so a 2-layer model stays under the memory budget here. Nemotron-H's
# blocks hold one mixer each (Mamba-2, attention or MLP), so its tier uses 3 blocks (one of each kind) where the
# others use 2 layers; Qwen3-Next keeps ``n_experts`` of its 512 experts (top-k clipped to it) and ships
# ``mtp.*`` (multi-token prediction) tensors that loaders drop, written here too. Llamba-8B's config.json carries
# no dtype: its shards' bf16 decides (HF's rule).


def hf_config(name: str, *, n_layers: int = 2, vocab: int | None = None, n_experts: int | None = 4) -> Any:
    """The HF config of ``name`` at published widths with ``n_layers`` layers (and an optional vocab cut)."""
    from transformers import AutoConfig

    published = PUBLISHED[name]
    if published.get("_format") == "cartesia":
        raise ValueError(f"{name} has no HF config (Cartesia's format): use llamba_raw(name)")
    spec = {k: v for k, v in published.items() if not k.startswith("_")}
    model_type = spec.pop("model_type")
    spec["num_hidden_layers"] = n_layers
    if vocab is not None:
        spec["vocab_size"] = vocab
    if model_type in ("granitemoehybrid", "qwen3_next"):
        kinds = published["_layers"]
        spec["layer_types"] = [kinds[i % len(kinds)] for i in range(n_layers)]
    if model_type == "nemotron_h":
        kinds = published["_layers"]
        spec["layers_block_type"] = [kinds[i % len(kinds)] for i in range(n_layers)]
        del spec["num_hidden_layers"]
    if "_experts" in published and n_experts is not None:
        spec[published["_experts"]] = n_experts
        spec["num_experts_per_tok"] = min(spec["num_experts_per_tok"], n_experts)
    if model_type == "zamba2":
        kinds = PUBLISHED[name]["_layers"]
        spec["layers_block_type"] = [kinds[i % len(kinds)] for i in range(n_layers)]
        spec["hybrid_layer_ids"] = [i for i, k in enumerate(spec["layers_block_type"]) if k == "hybrid"]
    if model_type == "jamba" and n_experts is not None:
        spec["num_experts"] = n_experts
    if model_type == "bamba":
        spec["attn_layer_indices"] = [i for i in PUBLISHED[name]["_attn_layers"] if i < n_layers]
    if model_type == "mamba2":
        spec["num_heads"] = spec["expand"] * spec["hidden_size"] // spec["head_dim"]
    return AutoConfig.for_model(model_type, **spec)


def llamba_raw(name: str = "llamba-8b", *, n_layers: int = 2, vocab: int | None = None) -> dict[str, Any]:
    """Cartesia's ``config.json`` dict of ``name`` at published widths with ``n_layers`` layers."""
    p = PUBLISHED[name]
    return {"d_model": p["hidden_size"], "n_layer": n_layers, "vocab_size": vocab or p["vocab_size"],
            "tie_embeddings": p["tie_word_embeddings"], "pad_vocab_size_multiple": 8, "lm_head_bias": False,
            "norm_epsilon": 1e-5, "resid_dropout": 0.0,
            "mlp_cfg": {"intermediate_size": p["intermediate_size"], "bias": False, "act_fn": "silu"},
            "ssm_cfg": {"d_state": p["d_state"], "n_v_heads": p["n_v_heads"], "n_qk_heads": p["n_qk_heads"],
                        "expand": p["expand"], "d_conv": p["d_conv"], "chunk_size": p["chunk_size"],
                        "activation": "identity", "bias": False}}


def _llamba_shapes(raw: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Checkpoint key -> shape of a Cartesia Llamba checkpoint (``conv_bias`` on, ``bias`` off: the defaults)."""
    ssm, d = raw["ssm_cfg"], int(raw["d_model"])
    di, H, G, N = int(ssm["expand"]) * d, int(ssm["n_v_heads"]), int(ssm["n_qk_heads"]), int(ssm["d_state"])
    m = int(raw["pad_vocab_size_multiple"])
    vocab = -(-int(raw["vocab_size"]) // m) * m
    dm, conv = int(raw["mlp_cfg"]["intermediate_size"]), di + 2 * G * N
    out: dict[str, tuple[int, ...]] = {"backbone.embedding.weight": (vocab, d)}
    for i in range(int(raw["n_layer"])):
        p = f"backbone.layers.{i}."
        out.update({p + "input_layernorm.weight": (d,), p + "mixer.in_proj.weight": (2 * di + 2 * G * N + H, d),
                    p + "mixer.conv1d.weight": (conv, 1, int(ssm["d_conv"])), p + "mixer.conv1d.bias": (conv,),
                    p + "mixer.z_bias": (di,), p + "mixer.D": (H,), p + "mixer.out_proj.weight": (d, di),
                    p + "post_attention_layernorm.weight": (d,), p + "mlp.gate_proj.weight": (dm, d),
                    p + "mlp.up_proj.weight": (dm, d), p + "mlp.down_proj.weight": (d, dm)})
    out["backbone.final_layernorm.weight"] = (d,)
    if not raw["tie_embeddings"]:
        out["lm_head.weight"] = (vocab, d)
    return out


def _values(key: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Random values with a trained model's scales for the tensor named ``key``."""
    if re.search(r"(norm|layernorm)[^.]*\.weight$|norm_f\.weight$", key):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if key.endswith("A_log"):
        return torch.log(torch.empty(shape).uniform_(1.0, 16.0, generator=gen))
    if key.endswith(".D"):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if key.endswith("dt_bias") or key.endswith("dt_proj.bias"):
        dt = torch.exp(torch.empty(shape).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
        return dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    if key.endswith("bias"):
        return 0.02 * torch.randn(shape, generator=gen)
    if "embed" in key or key == "lm_head.weight":  # HF's initializer_range: logits of order 1
        return 0.02 * torch.randn(shape, generator=gen)
    fan_in = shape[-1] if len(shape) > 1 else 1
    if "conv1d" in key:
        fan_in = shape[-1]
    return torch.randn(shape, generator=gen) / math.sqrt(fan_in)


def _meta_state(config: Any) -> dict[str, tuple[int, ...]]:
    """Checkpoint key -> shape, as ``save_pretrained`` writes it: tied copies once, HF's load-time renames and
    fusions reverted (per-expert tensors, Nemotron-H's ``backbone.`` prefix, Granite's ``input_linear``)."""
    from transformers import AutoModelForCausalLM
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    state = remove_tied_weights_from_state_dict(model.state_dict(), model)
    return {k: tuple(v.shape) for k, v in revert_weight_conversion(model, state).items()}


def _write_shards(d: Path, shapes: dict[str, tuple[int, ...]], n_shards: int, torch_dtype: torch.dtype,
                  gen: torch.Generator) -> None:
    """Random tensors for ``shapes`` in ``n_shards`` safetensors files (+ index), one shard in memory at a time."""
    from safetensors.torch import save_file

    total = sum(math.prod(s) for s in shapes.values()) * torch_dtype.itemsize
    budget = max(1, math.ceil(total / n_shards))
    groups: list[list[str]] = [[]]
    size = 0
    for key, s in shapes.items():
        nbytes = math.prod(s) * torch_dtype.itemsize
        if groups[-1] and size + nbytes > budget and len(groups) < n_shards:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += nbytes
    weight_map = {}
    for i, keys in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" if len(groups) > 1 else "model.safetensors"
        save_file({k: _values(k, shapes[k], gen).to(torch_dtype) for k in keys}, str(d / fname),
                  metadata={"format": "pt"})
        weight_map.update({k: fname for k in keys})
    if len(groups) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_checkpoint(name: str, directory: str | Path, *, n_layers: int = 2, vocab: int | None = None,
                     n_experts: int | None = 4, dtype: str | None = None, shards: int | None = None,
                     seed: int = 0) -> Path:
    """Write a random ``name`` checkpoint at published widths; returns the directory."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    spec = PUBLISHED[name]
    torch_dtype = getattr(torch, dtype or spec["dtype"])
    gen = torch.Generator().manual_seed(seed)
    if spec.get("_format") == "cartesia":
        raw = llamba_raw(name, n_layers=n_layers, vocab=vocab)
        (d / "config.json").write_text(json.dumps(raw, indent=2))
        _write_shards(d, _llamba_shapes(raw), shards if shards is not None else spec["_shards"], torch_dtype, gen)
        return d
    config = hf_config(name, n_layers=n_layers, vocab=vocab, n_experts=n_experts)
    shapes = _meta_state(config)
    if spec.get("_format") == "mamba_ssm":
        sd = {k.replace("backbone.embeddings.", "backbone.embedding."): _values(k, s, gen).to(torch_dtype)
              for k, s in shapes.items()}
        sd["lm_head.weight"] = sd["backbone.embedding.weight"]  # mamba-ssm saves the tied copy
        torch.save(sd, d / "pytorch_model.bin")
        raw = {"d_model": config.hidden_size, "d_intermediate": 0, "n_layer": n_layers,
               "vocab_size": config.vocab_size, "ssm_cfg": {"layer": "Mamba2"}, "attn_layer_idx": [], "attn_cfg": {},
               "rms_norm": True, "residual_in_fp32": True, "fused_add_norm": True, "pad_vocab_size_multiple": 16,
               "tie_embeddings": True}
        (d / "config.json").write_text(json.dumps(raw, indent=2))
        return d
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    config.dtype = torch_dtype
    config.save_pretrained(d)
    if "_release_json" in spec:
        _release_spelling(d / "config.json", spec["_release_json"])
    if spec.get("_mtp"):  # Qwen3-Next's multi-token-prediction head: shipped, dropped by HF and by us
        h = config.hidden_size
        shapes.update({"mtp.fc.weight": (h, 2 * h), "mtp.norm.weight": (h,), "mtp.pre_fc_norm_hidden.weight": (h,)})
    _write_shards(d, shapes, shards if shards is not None else spec.get("_shards", 1), torch_dtype, gen)
    return d


def _release_spelling(path: Path, extra: dict[str, Any]) -> None:
    """Rewrite a ``save_pretrained`` config.json the way a transformers-4 release spells it (see ``_release_json``)."""
    raw = json.loads(path.read_text())
    rope = dict(raw.pop("rope_parameters"))
    theta, kind = rope.pop("rope_theta"), rope.pop("rope_type")
    for derived in ("head_dim", "qk_head_dim"):
        raw.pop(derived, None)
    raw.update(rope_theta=theta, rope_scaling=None if kind == "default" else {"type": kind, **rope},
               torch_dtype=raw.pop("dtype"), **extra)
    path.write_text(json.dumps(raw, indent=2))


def hf_reference(name: str, directory: str | Path, *, dtype: torch.dtype = torch.float32, n_layers: int = 2,
                 vocab: int | None = None, n_experts: int | None = 4) -> Any:
    """HF's own model of a :func:`write_checkpoint` directory (``from_pretrained``; for the mamba-ssm layout the
    state dict is renamed to HF's names and assigned), the oracle of the real-width tests."""
    from transformers import AutoModelForCausalLM

    d = Path(directory)
    if PUBLISHED[name].get("_format") != "mamba_ssm":
        return AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval()
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(hf_config(name, n_layers=n_layers, vocab=vocab, n_experts=n_experts))
    sd = torch.load(d / "pytorch_model.bin", weights_only=True, mmap=True)
    sd = {k.replace("backbone.embedding.", "backbone.embeddings."): v.to(dtype) for k, v in sd.items()}
    hf.load_state_dict(sd, assign=True, strict=False)
    hf.tie_weights()
    return hf.eval()


def reference_logits(name: str, directory: str | Path, tokens: torch.Tensor, *, n_layers: int = 2,
                     vocab: int | None = None, n_experts: int | None = 4) -> torch.Tensor:
    """fp32 logits of the oracle of a :func:`write_checkpoint` directory: HF's own model, or for Llamba
    (no HF class; Cartesia's code needs CUDA) the sequential oracle of its reference forward."""
    if PUBLISHED[name].get("_format") == "cartesia":
        from gather_aggregate.adapters.streaming import Checkpoint
        from gather_aggregate.testing.llamba_checkpoints import llamba_reference_logits

        raw = json.loads((Path(directory) / "config.json").read_text())
        sd = {k: v.load(torch.float32) for k, v in Checkpoint(directory).items()}
        with torch.no_grad():
            return llamba_reference_logits(raw, sd, tokens)
    hf = hf_reference(name, directory, n_layers=n_layers, vocab=vocab, n_experts=n_experts)
    with torch.no_grad():
        return hf(tokens).logits.float()


def param_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters (shared parameters once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


__all__ = ["PUBLISHED", "hf_config", "llamba_raw", "write_checkpoint", "hf_reference", "reference_logits",
           "param_bytes"]
