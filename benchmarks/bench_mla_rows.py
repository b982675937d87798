"""The exact scan on multi-head latent attention with and without the readout-rows attention of the last layer.

``BridgeModel.mixer_at_rows`` lets the ablated copies run the last layer's attention at the readout rows alone
(queries, scores and outputs there; keys and values everywhere); without it (the path before MLA had one) the last
attention runs in full.  Both runs score the same heads on the same random DeepSeek-V2 (no query LoRA, like V2-Lite)
in one process, alternating, on the CPU; the table gives the median wall time of each and the largest score gap.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_mla_rows.py --layers 2 --seq 256 --batch 4
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    from gather_aggregate import from_hf_model
    from gather_aggregate.core.readout import ReadoutMetric
    from gather_aggregate.scan.exact import exact_scan

    torch.set_num_threads(args.threads)
    cfg = DeepseekV2Config(vocab_size=2048, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                           moe_intermediate_size=args.hidden // 2, num_hidden_layers=args.layers,
                           num_attention_heads=args.heads, num_key_value_heads=args.heads, kv_lora_rank=128,
                           q_lora_rank=None, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
                           n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                           max_position_embeddings=4096)
    torch.manual_seed(0)
    model = from_hf_model(DeepseekV2ForCausalLM(cfg).eval())
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    target = tokens[:, -1]  # a readout metric (as the tasks' are): the log-prob read at the last position
    metric = ReadoutMetric(lambda la: la[:, 0].float().log_softmax(-1).gather(-1, target[:, None]).mean(),
                           torch.full((args.batch,), args.seq - 1))

    real = model.mixer_at_rows
    runs: dict[str, list[float]] = {"full last attention": [], "readout rows": []}
    scores = {}
    for _ in range(args.repeats):
        for name in runs:
            model.mixer_at_rows = real if name == "readout rows" else (lambda *a: None)
            t0 = time.perf_counter()
            scores[name] = exact_scan(model, tokens, metric, progress=False).scores()
            runs[name].append(time.perf_counter() - t0)
    model.mixer_at_rows = real
    gap = max(abs(scores["readout rows"][h] - scores["full last attention"][h]) for h in scores["readout rows"])
    old, new = (statistics.median(runs[n]) for n in runs)
    print(f"DeepSeek-V2 random: {args.layers} layers, hidden {args.hidden}, {args.heads} heads, kv_lora 128, "
          f"batch {args.batch} x {args.seq}, {args.threads} thread(s), median of {args.repeats}")
    print("| exact scan, full last attention | exact scan, readout rows | speed-up | max |score gap| |")
    print("|---|---|---|---|")
    print(f"| {old:.2f} s | {new:.2f} s | {old / new:.2f}x | {gap:.1e} |")


if __name__ == "__main__":
    main()
