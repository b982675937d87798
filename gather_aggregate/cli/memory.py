"""``gather-aggregate memory``: the inference-memory table (imports nothing heavy: configs are read as JSON)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import InputError

#: Llama-3.2-1B's published geometry (its config.json), for the paper-scale rows of the table.
LLAMA_32_1B: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192, "vocab_size": 128256,
    "dtype": "bfloat16", "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
}


def add_memory_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lengths", default="128,2048,4096", help="prompt lengths, comma separated")
    p.add_argument("--batch", type=int, default=1, help="sequences in the batch")
    p.add_argument("--bytes-per-element", type=int, default=None,
                   help="override the config's dtype (2 for bf16, 4 for fp32)")
    p.add_argument("--keep", default="", help="also list the model's head-level hybrids keeping these numbers of "
                                              "attention heads (e.g. 0,2,10), for Llama models")
    p.add_argument("--d-states", default="", help="SSM state sizes of those hybrids (default: the head dimension)")
    p.add_argument("--reference", action="store_true",
                   help="add Llama-3.2-1B (bf16) and its hybrids keeping 10 heads (the follow-up's setting)")


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {text!r}") from None


def hybrid_variants(name: str, raw: dict[str, Any], keeps: list[int], d_states: list[int]) -> dict[str, Any]:
    """Configs of ``raw``'s head-level hybrids keeping ``k`` heads (the first k kv groups' heads, which for
    GQA models is the fewest kv heads k kept heads can read) with each state size."""
    from gather_aggregate.models.head_hybrid.config import HeadHybridConfig

    n_layers, n_heads = int(raw["num_hidden_layers"]), int(raw["num_attention_heads"])
    order = [(L, h) for h in range(n_heads) for L in range(n_layers)]  # spread over layers, kv-group-major
    out: dict[str, Any] = {}
    if any(k < 0 for k in keeps):
        raise InputError(f"--keep takes numbers of heads >= 0, got {keeps}")
    for k in sorted({min(k, n_layers * n_heads) for k in keeps}):  # more than the model has: all of them
        for N in d_states or [0]:
            cfg = HeadHybridConfig.from_llama(raw, order[:k], d_state=N or None)
            out[f"{name} hybrid, {k} attn heads, N={cfg.d_state}"] = cfg.to_dict() | {"dtype": raw.get("dtype")}
    return out


def memory_configs(args: argparse.Namespace) -> dict[str, Any]:
    import json

    from gather_aggregate.zoo import list_zoo

    zoo = list_zoo()
    # the comma list the help promises (it was read as one name: "'a,b' has no config.json")
    names = [n.strip() for n in args.model.split(",") if n.strip()] if args.model else list(zoo)
    configs: dict[str, Any] = {}
    keeps, d_states = _ints(args.keep), _ints(args.d_states)
    if any(n < 1 for n in d_states):  # 0 was read as "the head dimension"
        raise InputError(f"--d-states takes SSM state sizes >= 1, got {args.d_states!r}")
    if d_states and not keeps:
        raise InputError("--d-states sizes the hybrids that --keep lists; pass --keep too (e.g. --keep 0,2,10)")
    for name in names:
        path = Path(zoo.get(name, name)).expanduser()
        if not (path / "config.json").is_file():
            raise InputError(f"{str(path)!r} has no config.json; pass a zoo name or a model directory")
        raw = json.loads((path / "config.json").read_text())
        configs[name] = raw
        if keeps and raw.get("model_type") == "llama":
            configs |= hybrid_variants(name, raw, keeps, d_states)
    if keeps and not any(c.get("model_type") == "llama" for c in configs.values()):  # was ignored silently
        raise InputError(f"--keep lists head-level hybrids of Llama models, and none of {', '.join(names)} is one; "
                         "pass a Llama (e.g. --model llama-kvmc) or leave --keep out")
    if args.reference:
        configs["Llama-3.2-1B (bf16)"] = LLAMA_32_1B
        configs |= hybrid_variants("Llama-3.2-1B", LLAMA_32_1B, [10], [64, 8])
    return configs


def cmd_memory(args: argparse.Namespace) -> int:
    from gather_aggregate.models.memory import format_table, memory_table

    lengths = _ints(args.lengths)
    if not lengths:  # was an empty table
        raise InputError("no --lengths given; pass prompt lengths, e.g. --lengths 128,2048,4096")
    rows = memory_table(memory_configs(args), lengths, batch=args.batch,
                        bytes_per_element=args.bytes_per_element)
    print(format_table(rows))
    if args.out:
        from gather_aggregate.core.results_io import write_table

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_table(rows, out / "memory.json")
        print(f"-> {out}/memory.json, memory.csv")
    return 0
