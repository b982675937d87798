"""The exactness table of the transformer families (``gather_aggregate.testing.tiny_models.TINY_FAMILIES``) against HF.

For each family, a tiny random fp32 model built with HF's default attention is hooked with ``from_hf_model`` and
compared with the same weights in an eager HF model: max abs differences of (a) logits, (b) per-head patterns, (c)
zero / mean ablation of every head (HF side: a pre-hook on the attention's output projection), (d) exact-scan
scores (plain and read-out metric) and path-patching metrics against those HF ablations, (e) start_at_layer runs
against the full run; and which layers the scan resumes after the mixer / answers at the readout rows alone.
``tests/test_transformer_families.py`` asserts the same quantities <= 1e-4.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/transformer_families.py
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    import torch

    from gather_aggregate import from_hf_model
    from gather_aggregate.core.readout import ReadoutMetric
    from gather_aggregate.interventions import layer_resume
    from gather_aggregate.interventions.ablation import run_ablated
    from gather_aggregate.scan.exact import exact_scan
    from gather_aggregate.scan.patching import patch_heads
    from gather_aggregate.testing.tiny_models import (
        TINY_FAMILIES,
        bpe_tokenizer,
        hf_head_inputs,
        hf_logits,
        tiny_transformer,
    )

    torch.set_num_threads(1)
    tok = bpe_tokenizer()
    n_pos = 12

    def tokens(vocab: int, n: int, seed: int) -> torch.Tensor:
        return torch.randint(1, vocab, (n, n_pos), generator=torch.Generator().manual_seed(seed))

    print("| architecture | (a) logits | (b) patterns | (c) zero | (c) mean | (d) scan | (d) scan, read-out | patching "
          "| (e) start_at_layer | resumed after mixer | read-out rows alone |")
    print("|---" * 11 + "|")
    for family in TINY_FAMILIES:
        hf, _ = tiny_transformer(family, tokenizer=tok)
        ref, _ = tiny_transformer(family, tokenizer=tok, attn_implementation="eager")
        ref.load_state_dict(hf.state_dict())
        model = from_hf_model(hf, tok)
        toks, reference, corrupted = tokens(model.d_vocab, 2, 0), tokens(model.d_vocab, 3, 2), tokens(model.d_vocab, 2, 6)
        layers, d = range(model.n_layers), model.layers[0].d_head
        heads = [(la, h) for la in layers for h in range(model.layers[la].n_heads)]
        with torch.no_grad():
            out = ref(toks, output_attentions=True)
            a = (model(toks) - out.logits).abs().max().item()
        b = max((model.pattern(toks, la) - out.attentions[la]).abs().max().item() for la in layers)
        zero = max((run_ablated(model, toks, [(la, h)]) - hf_logits(ref, toks, la, h, d)).abs().max().item()
                   for la, h in heads)
        mean = max((run_ablated(model, toks, [(la, h)], "mean", reference) - hf_logits(
            ref, toks, la, h, d, hf_head_inputs(ref, reference, la)[..., h * d:(h + 1) * d].mean(0))).abs().max().item()
            for la, h in heads)
        target = toks[:, -1]

        def metric(logits: torch.Tensor, target: torch.Tensor = target) -> torch.Tensor:
            return logits[:, -1].log_softmax(-1).gather(-1, target[:, None]).mean()

        readout = ReadoutMetric(lambda at, target=target: at[:, 0].log_softmax(-1).gather(-1, target[:, None]).mean(),
                                n_pos - 1)
        clean = metric(hf_logits(ref, toks)).item()
        want = {hd: clean - metric(hf_logits(ref, toks, hd[0], hd[1], d)).item() for hd in heads}
        scans = []
        for m in (metric, readout):
            got = exact_scan(model, toks, m, progress=False, max_rows=6).scores()
            scans.append(max(abs(got[hd] - want[hd]) for hd in heads))
        patched = patch_heads(model, toks, corrupted, metric, progress=False)
        patch = max(abs(r["metric_patched"] - metric(hf_logits(
            ref, corrupted, r["layer"], r["head"], d,
            hf_head_inputs(ref, toks, r["layer"])[..., r["head"] * d:(r["head"] + 1) * d])).item()) for r in patched.rows)
        with torch.no_grad():
            full, cache = model.run_with_cache(toks)
            e = max((model(cache[model.resid_hook(la)], start_at_layer=la) - full).abs().max().item()
                    for _ in range(2) for la in layers)
            kept = layer_resume.verify(model, cache, layer_resume.plan(model, layers, readout=True), full)
        after = [la for la, s in kept.items() if s is not None]
        at_rows = [la for la, s in kept.items() if s is not None and s.at_rows]
        cells = " | ".join(f"{v:.1e}" for v in (a, b, zero, mean, *scans, patch, e))
        print(f"| {type(hf).__name__} | {cells} | {after} | {at_rows} |", flush=True)


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description="the exactness table of the transformer families against HF (prints it; "
                                        "no options)").parse_args()  # `--help` ran the whole table
    main()
