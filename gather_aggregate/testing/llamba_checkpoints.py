"""Random Llamba checkpoints in Cartesia's on-disk format, and a sequential oracle of the reference forward.

``cartesia-pytorch`` imports mamba-ssm's Triton kernels at module level, so it cannot run on a CPU;
:func:`llamba_reference_logits` writes the reference's math (``LlambaLMHeadModel`` with
``DiscreteMamba2``) straight from the checkpoint tensors, one time step at a time, with no code
shared with :mod:`gather_aggregate.adapters.llamba`.  Tests, docs and benchmarks use these.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def llamba_raw_config(**overrides: Any) -> dict[str, Any]:
    """A tiny Llamba ``config.json`` dict; ``ssm_cfg=`` / ``mlp_cfg=`` entries update the defaults."""
    ssm = {"d_state": 8, "n_v_heads": 8, "n_qk_heads": 2, "expand": 2, "d_conv": 4, "conv_bias": True,
           "chunk_size": 16, "activation": "identity", "bias": False}
    mlp = {"intermediate_size": 48, "bias": False, "act_fn": "silu"}
    ssm.update(overrides.pop("ssm_cfg", {}))
    mlp.update(overrides.pop("mlp_cfg", {}))
    raw = {"model_type": "llamba", "vocab_size": 97, "d_model": 32, "n_layer": 2, "tie_embeddings": False,
           "pad_vocab_size_multiple": 8, "lm_head_bias": False, "norm_epsilon": 1e-5, "resid_dropout": 0.0,
           "ssm_cfg": ssm, "mlp_cfg": mlp}
    raw.update(overrides)
    return raw


def _padded_vocab(raw: dict[str, Any]) -> int:
    v, m = int(raw["vocab_size"]), int(raw.get("pad_vocab_size_multiple", 8))
    return v + (m - v % m) % m


def random_llamba_state_dict(raw: dict[str, Any], seed: int = 0) -> dict[str, Tensor]:
    """Random tensors with the reference's names and shapes (scaled so activations stay O(1))."""
    g = torch.Generator().manual_seed(seed)
    ssm, mlp = raw["ssm_cfg"], raw["mlp_cfg"]
    d = int(raw["d_model"])
    di = int(ssm.get("expand", 1)) * d
    H, G, N, k = int(ssm["n_v_heads"]), int(ssm["n_qk_heads"]), int(ssm["d_state"]), int(ssm.get("d_conv", 4))
    conv_dim = di + 2 * G * N
    dm = int(mlp["intermediate_size"])

    def rnd(*shape: int, scale: float = 1.0) -> Tensor:
        return torch.randn(*shape, generator=g) * scale

    sd: dict[str, Tensor] = {"backbone.embedding.weight": rnd(_padded_vocab(raw), d),
                             "backbone.final_layernorm.weight": 1 + rnd(d, scale=0.1)}
    for i in range(int(raw["n_layer"])):
        p = f"backbone.layers.{i}."
        sd[p + "input_layernorm.weight"] = 1 + rnd(d, scale=0.1)
        sd[p + "post_attention_layernorm.weight"] = 1 + rnd(d, scale=0.1)
        sd[p + "mixer.in_proj.weight"] = rnd(2 * di + 2 * G * N + H, d, scale=d ** -0.5)
        sd[p + "mixer.conv1d.weight"] = rnd(conv_dim, 1, k, scale=0.5)
        if ssm.get("conv_bias", True):
            sd[p + "mixer.conv1d.bias"] = rnd(conv_dim, scale=0.1)
        sd[p + "mixer.D"] = rnd(H)
        sd[p + "mixer.out_proj.weight"] = rnd(d, di, scale=di ** -0.5)
        if ssm.get("bias", False):
            sd[p + "mixer.in_proj.bias"] = rnd(2 * di + 2 * G * N + H, scale=0.1)
            sd[p + "mixer.out_proj.bias"] = rnd(d, scale=0.1)
        else:
            sd[p + "mixer.z_bias"] = rnd(di, scale=0.1)
        for name, shape in (("gate_proj", (dm, d)), ("up_proj", (dm, d)), ("down_proj", (d, dm))):
            sd[p + f"mlp.{name}.weight"] = rnd(*shape, scale=shape[1] ** -0.5)
            if mlp.get("bias", False):
                sd[p + f"mlp.{name}.bias"] = rnd(shape[0], scale=0.1)
    if not raw.get("tie_embeddings", False):
        sd["lm_head.weight"] = rnd(_padded_vocab(raw), d, scale=d ** -0.5)
    return sd


def save_llamba_checkpoint(directory: str | Path, raw: dict[str, Any], state_dict: dict[str, Tensor], *,
                           fmt: str = "safetensors") -> Path:
    """Write ``config.json`` and ``model.safetensors`` (hub layout) or ``pytorch_model.bin`` (reference's own)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(raw))
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(d / "model.safetensors"))
    else:
        torch.save(state_dict, d / "pytorch_model.bin")
    return d


def tiny_llamba_dir(directory: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """A tiny random Llamba checkpoint directory (no tokenizer)."""
    raw = llamba_raw_config(**overrides)
    return save_llamba_checkpoint(directory, raw, random_llamba_state_dict(raw, seed))


# ------------------------------------------------------------------------------ the oracle
def _rms(x: Tensor, w: Tensor, eps: float) -> Tensor:
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def llamba_reference_mixer(sd: dict[str, Tensor], prefix: str, raw: dict[str, Any], u: Tensor,
                           out: dict[str, Tensor] | None = None) -> Tensor:
    """One ``DiscreteMamba2`` forward from the checkpoint tensors, sequential in time (fp32).
    ``out`` (optional) receives ``x``, ``dt``, ``B``, ``C``, ``y`` for checks."""
    ssm = raw["ssm_cfg"]
    b, L, d = u.shape
    di = int(ssm.get("expand", 1)) * d
    H, G, N = int(ssm["n_v_heads"]), int(ssm["n_qk_heads"]), int(ssm["d_state"])
    P = di // H
    proj = F.linear(u, sd[prefix + "in_proj.weight"], sd.get(prefix + "in_proj.bias"))
    xBC, z, a_log = proj.split([di + 2 * G * N, di, H], dim=-1)
    w = sd[prefix + "conv1d.weight"]
    xBC = F.conv1d(xBC.transpose(1, 2), w, sd.get(prefix + "conv1d.bias"), padding=w.shape[-1] - 1,
                   groups=w.shape[0])[..., :L].transpose(1, 2)
    if ssm.get("activation", "identity") in ("silu", "swish"):
        xBC = F.silu(xBC)
    x, B, C = xBC.split([di, G * N, G * N], dim=-1)
    x, B, C = x.reshape(b, L, H, P), B.reshape(b, L, G, N), C.reshape(b, L, G, N)
    dt = F.softplus(a_log)
    x_in = x / dt[..., None]  # the reference feeds x / Δ to the SSD kernel with A = -1 and dt = Δ
    h = torch.zeros(b, H, P, N)
    ys = []
    for t in range(L):
        for head in range(H):
            grp = head // (H // G)
            h[:, head] = torch.exp(-dt[:, t, head])[:, None, None] * h[:, head] + \
                (dt[:, t, head, None] * x_in[:, t, head])[:, :, None] * B[:, t, grp][:, None, :]
        ys.append(torch.stack([h[:, hh] @ C[:, t, hh // (H // G)][:, :, None] for hh in range(H)], 1)[..., 0])
    y = torch.stack(ys, 1) + sd[prefix + "D"][:, None] * x
    if out is not None:
        out.update(x=x.reshape(b, L, di), dt=dt, B=B, C=C, y=y.reshape(b, L, di))
    z_bias = sd.get(prefix + "z_bias", 0)
    return F.linear(y.reshape(b, L, di) * F.silu(z + z_bias), sd[prefix + "out_proj.weight"],
                    sd.get(prefix + "out_proj.bias"))


def llamba_reference_logits(raw: dict[str, Any], sd: dict[str, Tensor], tokens: Tensor) -> Tensor:
    """Logits of the reference ``LlambaLMHeadModel`` (fp32), computed sequentially from the raw checkpoint."""
    mlp = raw["mlp_cfg"]
    act = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}[mlp.get("act_fn", "silu")]
    h = F.embedding(tokens, sd["backbone.embedding.weight"])
    for i in range(int(raw["n_layer"])):
        p = f"backbone.layers.{i}."
        h = h + llamba_reference_mixer(sd, p + "mixer.", raw, _rms(h, sd[p + "input_layernorm.weight"], 1e-5))
        n = _rms(h, sd[p + "post_attention_layernorm.weight"], 1e-5)

        def lin(name: str, v: Tensor, p: str = p) -> Tensor:
            return F.linear(v, sd[p + f"mlp.{name}.weight"], sd.get(p + f"mlp.{name}.bias"))

        h = h + lin("down_proj", act(lin("gate_proj", n)) * lin("up_proj", n))
    h = _rms(h, sd["backbone.final_layernorm.weight"], float(raw.get("norm_epsilon", 1e-5)))
    W = sd["backbone.embedding.weight"] if raw.get("tie_embeddings", False) else sd["lm_head.weight"]
    return (h @ W.t()).float()


__all__ = ["llamba_raw_config", "random_llamba_state_dict", "save_llamba_checkpoint", "tiny_llamba_dir",
           "llamba_reference_logits", "llamba_reference_mixer"]
