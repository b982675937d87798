"""Implied attention of the newer families, per family, ours against TransformerLens 4.3 on the same weights.

One random-weight layer at the width of a published checkpoint:

* ``llamba``: a Llamba-1B layer (d_model 2048, 32 value heads = 32 B/C heads, d_state 64, expand 1), built in
  Cartesia's on-disk format and loaded with ``load_llamba``.  TransformerLens 4.3 has no Llamba (nor any
  discrete Mamba-2), so its column is empty;
* ``granitemoehybrid``: a Granite-4.0-H-Tiny Mamba-2 layer (hidden 1536, 48 heads of 64, d_state 128, one
  group), in HF's ``GraniteMoeHybridForCausalLM``; TL's bridge (``eager_scan``, ``use_cache=False``) computes its
  ``compute_ssm_effective_attention(include_dt_scaling=True)``, compared with ours entry by entry;
* ``qwen3_next``: a Qwen3-Next-80B gated-DeltaNet layer (hidden 2048, 16 key heads and 32 value heads of 128),
  in HF's ``Qwen3NextForCausalLM``, loaded by us (``load_ssm``) and by TL's bridge (``use_cache=False``), whose
  ``compute_effective_attention`` is timed on the bridge's own cache;
* ``falcon_h1``: a Falcon-H1-7B layer (hidden 3072; attention 12 heads of 128, 2 KV heads, beside Mamba-2 with 24
  heads of 128, d_state 256, one group; the small test config's μP multipliers), in HF's ``FalconH1ForCausalLM``;
  ours is the implied attention of its 24 Mamba-2 heads.  TL's bridge is built, run (``eager_scan``,
  ``use_cache=False``) and its ``compute_ssm_effective_attention(include_dt_scaling=True)`` is called; in TL 4.3
  it raises (it looks up ``blocks.L.mixer.*``, the bridge names Falcon-H1's branch ``mamba``), and the row
  records the error it raised.

Every row reports the time and peak memory of the implied-attention call only (the forward that filled the cache
is not timed) and how well the matrix rebuilds the layer's output (``‖α @ v - o‖ / ‖o‖``; Llamba:
``α @ x + D x`` against ``hook_y``).  ``forward`` rows time one full forward (ours, TL's bridge, HF).  Each
measurement runs in a fresh single-threaded child process capped at ``--max-gib``.

Run: ``python benchmarks/bench_family_implied.py`` (a few minutes on 2 busy cores), or ``--lengths 128 --no-rows``
for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import measure, run_child, single_thread  # noqa: E402

if TYPE_CHECKING:  # pragma: no cover
    from gather_aggregate.adapters.model import HookedSSM

HERE = Path(__file__).resolve()
VOCAB = 256


def build(family: str, width: str = "real") -> tuple[Any, Any]:
    """(our hooked model, the HF model or None) for one layer of ``family``."""
    if family == "llamba":
        from gather_aggregate.adapters.llamba import load_llamba
        from gather_aggregate.testing.llamba_checkpoints import (
            llamba_raw_config,
            random_llamba_state_dict,
            save_llamba_checkpoint,
        )

        big = width == "real"
        raw = llamba_raw_config(vocab_size=VOCAB, d_model=2048 if big else 64, n_layer=1,
                                ssm_cfg={"d_state": 64 if big else 8, "n_v_heads": 32 if big else 4,
                                         "n_qk_heads": 32 if big else 4, "expand": 1},
                                mlp_cfg={"intermediate_size": 256})
        d = save_llamba_checkpoint(tempfile.mkdtemp(), raw, random_llamba_state_dict(raw, 0))
        return load_llamba(d), None
    from gather_aggregate.adapters import load_ssm

    if family == "granitemoehybrid":
        from gather_aggregate.testing.tiny_families import granite_config, tiny_hf_granite

        big = width == "real"
        cfg = granite_config(vocab_size=VOCAB, hidden_size=1536 if big else 64, layer_types=["mamba"],
                             mamba_n_heads=48 if big else 4, mamba_d_head=64 if big else 32,
                             mamba_d_state=128 if big else 16, mamba_n_groups=1, num_local_experts=0,
                             shared_intermediate_size=256)
        hf = tiny_hf_granite(0, config=cfg)
        return load_ssm(hf), hf
    if family == "falcon_h1":
        from gather_aggregate.testing.tiny_families import falcon_h1_config, tiny_hf_falcon_h1

        big = width == "real"
        cfg = falcon_h1_config(vocab_size=VOCAB, hidden_size=3072 if big else 64, intermediate_size=256,
                               num_hidden_layers=1, num_attention_heads=12 if big else 4, num_key_value_heads=2,
                               head_dim=128 if big else 16, mamba_n_heads=24 if big else 4,
                               mamba_d_head=128 if big else 16, mamba_d_ssm=3072 if big else 64,
                               mamba_d_state=256 if big else 16, mamba_n_groups=1)
        hf = tiny_hf_falcon_h1(0, config=cfg)
        return load_ssm(hf), hf
    from gather_aggregate.testing.tiny_families import qwen3_next_config, tiny_hf_qwen3_next

    big = width == "real"
    cfg = qwen3_next_config(vocab_size=VOCAB, hidden_size=2048 if big else 64, intermediate_size=256,
                            layer_types=["linear_attention"], linear_num_key_heads=16 if big else 2,
                            linear_num_value_heads=32 if big else 4, linear_key_head_dim=128 if big else 16,
                            linear_value_head_dim=128 if big else 16, num_experts=0)
    hf = tiny_hf_qwen3_next(0, config=cfg)
    return load_ssm(hf), hf


def tokens_for(L: int) -> Any:
    import torch

    return torch.randint(0, VOCAB, (1, L), generator=torch.Generator().manual_seed(0))


def child(spec: dict[str, Any]) -> None:
    import torch

    single_thread()
    family, impl, L = spec["family"], spec["impl"], spec["L"]
    model, hf = build(family, spec.get("width", "real"))
    tokens = tokens_for(L)
    out: dict[str, Any] = {}
    with torch.no_grad():
        if spec.get("what") == "forward":
            if impl == "ours":
                fn = lambda: model(tokens)  # noqa: E731
            elif impl == "hf":
                fn = lambda: hf(tokens, use_cache=False)  # noqa: E731
            else:
                bridge = _bridge(hf)
                fn = lambda: bridge(tokens, use_cache=False)  # noqa: E731
            fn()
            stats, _ = measure(fn, repeats=spec.get("repeats", 3))
            print(json.dumps(stats))
            return
        if impl == "tl" and family == "falcon_h1":
            from transformer_lens.model_bridge.generalized_components.ssm_protocol import find_ssm_mixer

            bridge = _bridge(hf)
            mixer = find_ssm_mixer(bridge.blocks[0])
            if hasattr(mixer, "eager_scan"):
                mixer.eager_scan = True
            _, cache = bridge.run_with_cache(tokens, use_cache=False)
            try:
                stats, alpha = measure(lambda: cache.compute_ssm_effective_attention(layer=0,
                                                                                    include_dt_scaling=True))
            except Exception as e:  # TL 4.3: it raises here (blocks.L.mixer.* vs the bridge's blocks.L.mamba.*)
                reason = (str(e).strip().splitlines() or [""])[0]
                print(json.dumps({"error": f"raises {type(e).__name__}: {reason}"[:200]}))
                return
            out["rebuild"] = _rebuild_error(model, None, alpha.float(), family, None, source=tokens)
        elif impl == "tl" and family == "granitemoehybrid":
            from transformer_lens.model_bridge.generalized_components.ssm_protocol import find_ssm_mixer

            bridge = _bridge(hf)
            mixer = find_ssm_mixer(bridge.blocks[0])
            if hasattr(mixer, "eager_scan"):
                mixer.eager_scan = True  # TL 4.3: without it (and use_cache=False) the SSM hooks never fire
            _, cache = bridge.run_with_cache(tokens, use_cache=False)
            stats, alpha = measure(lambda: cache.compute_ssm_effective_attention(layer=0, include_dt_scaling=True))
            cache = None
            _, ours = model.run_with_cache(tokens, names_filter=lambda n: n.startswith("blocks.0.ssm."))
            mine = model.pattern(ours, 0)
            out["rebuild"] = _rebuild_error(model, ours, alpha.float(), family, None)
            out["max_abs_diff_vs_ours"] = float((alpha.float() - mine).abs().max() / mine.abs().max())
        elif impl == "tl":
            bridge = _bridge(hf)
            _, cache = bridge.run_with_cache(tokens, use_cache=False)
            stats, alpha = measure(lambda: bridge.blocks[0].linear_attn.compute_effective_attention(cache, 0))
            v, o = cache["blocks.0.linear_attn.hook_v"].float(), cache["blocks.0.linear_attn.hook_recurrence_out"]
            rebuilt = torch.einsum("bhts,bshv->bthv", alpha, v)
            out["rebuild"] = float((rebuilt - o.float()).norm() / o.float().norm())
        else:
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.startswith("blocks.0.ssm."))
            rows = spec.get("rows")
            heads = model.layers[0].heads_of("ssm") if family == "falcon_h1" else None  # its Mamba-2 heads
            stats, alpha = measure(lambda: model.pattern(cache, 0, heads=heads, rows=rows, max_bytes=8 * 1024**3),
                                   repeats=spec.get("repeats", 1))
            out["rebuild"] = _rebuild_error(model, cache, alpha, family, rows)
        out.update(stats, shape=list(alpha.shape))
    print(json.dumps(out))


def _bridge(hf: Any) -> Any:
    from gather_aggregate.models.bridge import _build_bridge

    return _build_bridge(hf, type(hf).__name__, hf.config, None)


def _rebuild_error(model: HookedSSM, cache: Any, alpha: Any, family: str, rows: Any, source: Any = None) -> float:
    import torch

    H, P = model.cfg.n_heads, model.cfg.d_head
    if cache is None:  # our own cache of the same prompt (a matrix computed elsewhere, checked against our hooks)
        _, cache = model.run_with_cache(source, names_filter=lambda n: n.startswith("blocks.0.ssm."))
    if family in ("llamba", "granitemoehybrid", "falcon_h1"):
        x = cache["blocks.0.ssm.hook_x"].float().unflatten(-1, (H, P))
        y = cache["blocks.0.ssm.hook_y"].float().unflatten(-1, (H, P))
        D = model.ssm_layer_params(0).D[:, None]
    else:
        x, y, D = cache["blocks.0.ssm.hook_v"].float(), cache["blocks.0.ssm.hook_y"].float(), 0.0
    if rows is not None:  # the one requested row
        t = rows % x.shape[1]
        got = torch.einsum("bhs,bshp->bhp", alpha[:, :, 0], x) + D * x[:, t]
        return float((got - y[:, t]).norm() / y[:, t].norm())
    got = torch.einsum("bhts,bshp->bthp", alpha, x) + D * x
    return float((got - y).norm() / y.norm())


def fmt(r: dict[str, Any]) -> tuple[str, str]:
    if not r:
        return "-", "-"
    if "error" in r:
        return r["error"], "-"
    m = r["dpeak_mib"]
    return f"{r['wall_s']:.3f} s (CPU {r['cpu_s']:.3f} s)", (f"{m / 1024:.2f} GiB" if m >= 1024 else f"{m:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--families", nargs="*", default=["llamba", "qwen3_next", "granitemoehybrid", "falcon_h1"])
    ap.add_argument("--lengths", type=int, nargs="*", default=[256, 1024])
    ap.add_argument("--row-length", type=int, default=4096)
    ap.add_argument("--no-rows", action="store_true")
    ap.add_argument("--forward-length", type=int, default=512)
    ap.add_argument("--width", default="real", choices=["real", "tiny"])
    ap.add_argument("--max-gib", type=float, default=12.0)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return

    def run(**spec: Any) -> dict[str, Any]:
        spec["width"] = args.width
        print(f"  running {spec} ...", file=sys.stderr, flush=True)
        r = run_child(HERE, spec, max_gib=args.max_gib)
        print(f"    -> {r}", file=sys.stderr, flush=True)
        return r

    rows = []
    for fam in args.families:
        for L in args.lengths:
            tl = run(family=fam, impl="tl", L=L) if fam != "llamba" else {}
            rows.append((fam, f"full, L={L}", tl, run(family=fam, impl="ours", L=L)))
        if not args.no_rows:
            rows.append((fam, f"last row, L={args.row_length}", {},
                         run(family=fam, impl="ours", L=args.row_length, rows=-1)))
    fwd = []
    for fam in args.families:
        L = args.forward_length
        fwd.append((fam, run(family=fam, impl="ours", L=L, what="forward"),
                    run(family=fam, impl="tl", L=L, what="forward") if fam != "llamba" else {},
                    run(family=fam, impl="hf", L=L, what="forward") if fam != "llamba" else {}))

    from _common import machine

    single_thread()
    print(f"\nImplied attention per family, one {args.width}-width random layer, batch 1; {machine()}")
    print("TL = TransformerLens 4.3 (Qwen3-Next: GatedDeltaNet compute_effective_attention on the bridge's cache; "
          "Granite, Falcon-H1: compute_ssm_effective_attention with Δ scaling; a cell naming an error is the "
          "exception TL raised); "
          "ours = model.pattern; rebuild = ||alpha @ v - o|| / ||o|| (Llamba: + D x vs hook_y)\n")
    print("| family | request | TL time | TL peak | TL rebuild | ours time | ours peak | ours rebuild | TL/ours time |")
    # (Granite: TL's matrix against ours, max |diff| / max |ours|, is in the raw JSON as max_abs_diff_vs_ours)
    print("|---|---|---|---|---|---|---|---|---|")
    for fam, label, tl, ours in rows:
        tt, tm = fmt(tl)
        ot, om = fmt(ours)
        ratio = (f"{tl['wall_s'] / ours['wall_s']:.2f}x (CPU {tl['cpu_s'] / ours['cpu_s']:.2f}x)"
                 if tl and "error" not in tl and "error" not in ours else "-")
        trb = f"{tl['rebuild']:.1e}" if tl and "rebuild" in tl else "-"
        orb = f"{ours['rebuild']:.1e}" if "rebuild" in ours else "-"
        print(f"| {fam} | {label} | {tt} | {tm} | {trb} | {ot} | {om} | {orb} | {ratio} |")
    print(f"\nForward, L={args.forward_length} (min of 3):\n")
    print("| family | ours | TL bridge | HF |")
    print("|---|---|---|---|")
    for fam, o, t, h in fwd:
        print(f"| {fam} | {fmt(o)[0]} | {fmt(t)[0]} | {fmt(h)[0]} |")
    print("\nraw: " + json.dumps({"implied": rows, "forward": fwd}))


if __name__ == "__main__":
    main()
