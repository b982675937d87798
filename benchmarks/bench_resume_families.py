"""Exact head scan with and without resuming inside the edited layer, on parallel (GPT-NeoX/Pythia) and post-norm
(Gemma 2) transformer blocks, side by side in one run.

*restart* is the path these blocks took before ``BridgeModel.mixer_resume`` knew their forms (forced here by
making ``mixer_resume`` answer ``None``): each stacked copy re-runs the edited layer from its input.  *inside*
edits the cached attention output through ``W_O`` and continues after the attention.  Random-weight models of
the given size (``gather_aggregate.testing.tiny_models.tiny_transformer`` with wider configs), KV-free random prompts, the
log-prob of the last token as the metric (a plain function: full logits; and a ``ReadoutMetric`` at the last
position).  Runs interleaved, best of ``--repeats``; the scores of both paths are compared too.

    OMP_NUM_THREADS=1 python benchmarks/bench_resume_families.py            # 6 layers x 8 heads, d_model 256
    OMP_NUM_THREADS=1 python benchmarks/bench_resume_families.py --layers 12 --n 16 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build(family: str, layers: int, heads: int, width: int, tok):
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_transformer

    sizes = dict(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * width,
                 max_position_embeddings=512)
    if family == "gemma2":
        sizes.update(num_key_value_heads=heads // 2, head_dim=width // heads, query_pre_attn_scalar=width // heads,
                     sliding_window=32)
    hf, _ = tiny_transformer(family, tokenizer=tok, **sizes)
    model = from_hf_model(hf, tok)
    model.name = f"{family} random {layers}L×{heads}H d{width}"
    return model


def main() -> None:
    import torch

    from gather_aggregate.core.readout import ReadoutMetric
    from gather_aggregate.scan.exact import exact_scan
    from gather_aggregate.testing.tiny_models import bpe_tokenizer

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", nargs="+", default=["pythia", "gemma2"])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--n", type=int, default=32, help="prompts")
    p.add_argument("--pos", type=int, default=64, help="tokens per prompt")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    tok = bpe_tokenizer()
    print("| model | metric | restart from layer input (s) | resume inside the layer (s) | speed-up | max |Δscore| |")
    print("|---|---|---|---|---|---|")
    for family in args.families:
        model = build(family, args.layers, args.heads, args.width, tok)
        toks = torch.randint(1, model.d_vocab, (args.n, args.pos), generator=torch.Generator().manual_seed(0))
        target = toks[:, -1]

        def plain(logits, target=target):
            return logits[:, -1].log_softmax(-1).gather(-1, target[:, None]).mean()

        readout = ReadoutMetric(lambda at, target=target: at[:, 0].log_softmax(-1).gather(-1, target[:, None]).mean(),
                                args.pos - 1)
        for name, metric in (("full logits", plain), ("readout", readout)):
            best = {"restart": float("inf"), "inside": float("inf")}
            scores = {}
            for _ in range(args.repeats):
                for mode in ("restart", "inside"):  # interleaved: machine noise hits both alike
                    if mode == "restart":
                        model.mixer_resume = lambda layer: None  # instance attribute, removed below
                    try:
                        t = time.perf_counter()
                        res = exact_scan(model, toks, metric, progress=False)
                        best[mode] = min(best[mode], time.perf_counter() - t)
                    finally:
                        model.__dict__.pop("mixer_resume", None)
                    scores[mode] = res
            diff = max(abs(scores["restart"].score(*hd) - scores["inside"].score(*hd)) for hd in model.all_heads())
            print(f"| {model.name} | {name} | {best['restart']:.2f} | {best['inside']:.2f} | "
                  f"{best['restart'] / best['inside']:.2f}x | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
