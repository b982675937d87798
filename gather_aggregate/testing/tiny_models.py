"""Tiny offline models and tokenizers, for tests, docs and the quickstart.

Nothing here touches the hub: tokenizers are trained with ``tokenizers`` on a
few sentences and models are HF classes built from configs with random weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

_CORPUS = [
    "Memorize the following dictionary:\napple:12\nriver:7\nstone:3\n\nThe value of the key 'river' is 7",
    "Question: What is the color of the sky?\nA. blue\nB. green\nC. red\nD. yellow\nAnswer: A",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
]


def bpe_tokenizer(corpus: Iterable[str] = _CORPUS, vocab_size: int = 300) -> Any:
    """A GPT-2-style byte-level BPE tokenizer trained offline on ``corpus``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(corpus), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def tiny_llama(*, seed: int = 0, vocab_size: int | None = None, tokenizer: Any = None, **overrides: Any) -> tuple[Any, Any]:
    """A small random ``LlamaForCausalLM`` (GQA: 4 query heads, 2 KV heads) and a BPE tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer or bpe_tokenizer()
    cfg = dict(vocab_size=vocab_size or len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
               tie_word_embeddings=False)
    cfg.update(overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval(), tok


def tiny_gpt2(*, seed: int = 0, tokenizer: Any = None, **overrides: Any) -> tuple[Any, Any]:
    """A small random ``GPT2LMHeadModel`` and a BPE tokenizer."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = tokenizer or bpe_tokenizer()
    cfg = dict(vocab_size=len(tok), n_embd=64, n_layer=2, n_head=4, n_positions=128)
    cfg.update(overrides)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(**cfg)).eval(), tok


#: the shared shape of the grouped-query families below: 2 layers, width 64, 4 query heads over 2 key/value heads
_GQA: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2)

#: Tiny configs of common decoder families (2 layers, width 64, 4 query heads; GQA, sliding windows, soft-capping,
#: q/k norms, biases, partial or interleaved rotary, experts, attention sinks where the family has them): ``family -> (config class, model class, kwargs)``.
TINY_FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, n_positions=128)),
    "pythia": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, rotary_pct=0.25,
        max_position_embeddings=128)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(**_GQA, max_position_embeddings=128)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(**_GQA, head_dim=16, max_position_embeddings=128)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        **_GQA, head_dim=16, sliding_window=4, query_pre_attn_scalar=16, attn_logit_softcapping=1.0,
        final_logit_softcapping=3.0, max_position_embeddings=128)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        **_GQA, head_dim=16, sliding_window=4, query_pre_attn_scalar=16, max_position_embeddings=128,
        layer_types=["sliding_attention", "full_attention"])),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(**_GQA, sliding_window=4, max_position_embeddings=128)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(**_GQA, max_position_embeddings=128, pad_token_id=0)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(**_GQA, max_position_embeddings=128, pad_token_id=0)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(
        hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
        word_embed_proj_dim=64, pad_token_id=0)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=128)),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, partial_rotary_factor=0.5,
        max_position_embeddings=128)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        **_GQA, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=4, max_position_embeddings=128,
        layer_types=["sliding_attention", "full_attention"])),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, multi_query=True, parallel_attn=True,
        new_decoder_architecture=False, bias=False)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(
        **_GQA, partial_rotary_factor=0.25, use_qkv_bias=True, max_position_embeddings=128)),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(
        **_GQA, sliding_window=4, max_position_embeddings=128)),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(
        **_GQA, sliding_window=4, max_position_embeddings=128, layer_types=["sliding_attention", "full_attention"])),
}


def tiny_transformer(family: str, *, seed: int = 0, tokenizer: Any = None, attn_implementation: str | None = None,
                     **overrides: Any) -> tuple[Any, Any]:
    """A small random HF causal LM of ``family`` (a key of :data:`TINY_FAMILIES`) and a BPE tokenizer.  Its 1-d
    parameters (norm weights, biases) are perturbed from their initial ones/zeros so that they matter."""
    import torch
    import transformers

    config_cls, model_cls, kwargs = TINY_FAMILIES[family]
    tok = tokenizer or bpe_tokenizer()
    config = getattr(transformers, config_cls)(**{"vocab_size": len(tok), **kwargs, **overrides})
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return model, tok


def hf_output_projection(hf_model: Any, layer: int) -> Any:
    """HF's attention output projection of ``layer`` (``o_proj``, ``c_proj``, ``dense``, ``out_proj`` or ``Wo``
    (ModernBERT) under the layer's attention, in a stack named ``layers``, ``h`` or ``blocks`` (MPT)), whose input is the heads' outputs side by side: the module an HF-side reference ablation
    hooks."""
    import torch

    n_layers = hf_model.config.num_hidden_layers
    stacks = [m for name, m in hf_model.named_modules()
              if isinstance(m, torch.nn.ModuleList) and len(m) == n_layers and name.split(".")[-1] in ("layers", "h", "blocks")]
    for name, mod in stacks[0][layer].named_modules():
        parts = name.split(".")
        if len(parts) >= 2 and ("attn" in parts[-2] or "attention" in parts[-2]) and \
                parts[-1] in ("o_proj", "c_proj", "dense", "out_proj", "Wo"):
            return mod
    raise LookupError(f"no attention output projection in layer {layer} of {type(hf_model).__name__}")


def hf_logits(hf_model: Any, tokens: Any, layer: int | None = None, head: int = 0, d_head: int = 0,
              value: Any = None) -> Any:
    """HF's logits; with ``layer``: head ``head``'s slice of that layer's output-projection input set to ``value``
    (zeros by default), by a forward pre-hook removed on return.  The reference for head ablation and patching."""
    import torch

    if layer is None:
        with torch.no_grad():
            return hf_model(tokens).logits

    def pre(_m: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0].clone()
        x[..., head * d_head:(head + 1) * d_head] = 0.0 if value is None else value
        return (x, *args[1:])

    handle = hf_output_projection(hf_model, layer).register_forward_pre_hook(pre)
    try:
        with torch.no_grad():
            return hf_model(tokens).logits
    finally:
        handle.remove()


def hf_head_inputs(hf_model: Any, tokens: Any, layer: int) -> Any:
    """The input of ``layer``'s output projection in HF's forward (``[batch, pos, n_heads * d_head]``)."""
    import torch

    got: list[Any] = []
    handle = hf_output_projection(hf_model, layer).register_forward_pre_hook(lambda _m, a: got.append(a[0].detach()))
    try:
        with torch.no_grad():
            hf_model(tokens)
    finally:
        handle.remove()
    return got[0]


def save_model_dir(hf_model: Any, tokenizer: Any, directory: str | Path) -> Path:
    """``save_pretrained`` a model and its tokenizer side by side; returns the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory
