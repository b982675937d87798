"""What a layer writes at the query position: the queried key, or what the entry holds (``docs/results_fixtures.md``,
the Falcon-Mamba fixtures' layer-0 groups, which the detector names as Aggregate groups beside layer 1).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/query_interchange.py tests/fixtures/models/notes-falconmamba
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/query_interchange.py mamba1-kv     # a zoo model, its KV task

Interchange at the query.  For each prompt ``P`` (a fixture's own task, or a zoo model's KV task; 64 prompts, seed
0; single-token values)
two donors of the same length are built from its tokens:

* **other values**: every entry's value moved to the next entry (a rotation), the queried key unchanged.  A layer
  whose output at the query carries only the queried key writes the same there as in ``P``; one that carries what
  the key's entry holds writes the donor's value, the one the rotation gave the queried key;
* **other key**: the entries unchanged, the queried key replaced by the next entry's key.  Both kinds of layer write
  what retrieves that entry's value.

Each layer's groups (all of them) get, at the query position only, their outputs from the donor's run; the table
gives the share of prompts answering ``P``'s value, the donor's value, or anything else (first tokens, among the
candidates).  A key carrier keeps ``P``'s value under *other values* and follows the donor under *other key*; an entry
reader follows the donor under both.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def donors(e: Any) -> dict[str, tuple[list[int], int]] | None:
    """``{name: (tokens, answer index)}`` of the two donors of example ``e`` (None where its values are not single
    tokens found once in each entry, or its queried key is not found)."""
    first = [c[0] for c in e.candidate_ids]
    segs = sorted(e.segments, key=lambda s: s.start)
    vals = []
    for s in segs:
        at = [i for i in range(s.start, s.end) if e.input_ids[i] in first]
        if len(at) != 1:
            return None
        vals.append(at[0])
    ids = list(e.input_ids)
    rotated = list(ids)
    for i, pos in enumerate(vals):
        rotated[vals[(i + 1) % len(vals)]] = ids[pos]
    c = next(i for i, s in enumerate(segs) if s is e.correct_segment)
    key_tok = ids[segs[c].start]  # an entry opens with its key
    query_at = [i for i in range(segs[-1].end, e.query_pos + 1) if ids[i] == key_tok]
    if len(query_at) != 1:
        return None
    other = list(ids)
    nxt = (c + 1) % len(segs)
    other[query_at[0]] = ids[segs[nxt].start]
    return {"other values": (rotated, first.index(ids[vals[(c - 1) % len(vals)]])),
            "other key": (other, first.index(ids[vals[nxt]]))}


def donor_outputs(model: Any, donor: list[int], q: int) -> dict[int, Any]:
    """Per layer, its heads' outputs at position ``q`` in ``donor``'s run (one forward for every layer)."""
    import torch

    got: dict[int, Any] = {}

    def grab(layer: int) -> Any:
        def hook(z: Any, hook: Any) -> None:
            got[layer] = z.select(1, q).detach().clone()  # [batch, ...heads, d] at the query position

        return hook

    with torch.no_grad():
        model.run_with_hooks(torch.tensor([donor]), fwd_hooks=[(model.head_hook(la)[0], grab(la))
                                                                for la in range(model.n_layers)])
    return got


def answer_with(model: Any, e: Any, layer: int, z: Any) -> int:
    """The candidate ``P`` answers with (first tokens) when ``layer``'s heads at the query carry ``z``."""
    import torch

    q = e.query_pos

    def put(x: Any, hook: Any) -> Any:
        x = x.clone()
        x[:, q] = z.to(x.dtype)
        return x

    with torch.no_grad():
        logits = model.run_with_hooks(torch.tensor([e.input_ids]), fwd_hooks=[(model.head_hook(layer)[0], put)])[0, q]
    first = torch.tensor([c[0] for c in e.candidate_ids])
    return int(logits[first].argmax())


def main(argv: list[str]) -> int:
    import argparse

    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help="fixture directories or zoo model names (single-token values)")
    p.add_argument("--n", type=int, default=64)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    from fixture_tasks import fixture_task  # tests/fixtures

    from gather_aggregate import load_model
    from gather_aggregate.tasks.registry import get_task
    from gather_aggregate.zoo import zoo_path

    for name in a.models:
        d = Path(name) if Path(name).is_dir() else zoo_path(name)
        model = load_model(d)
        task = fixture_task(d) if (d / "fixture.json").is_file() else get_task("kv", model_dir=d)
        ex = [(e, dn) for e in task.examples(model.tokenizer, n=a.n, seed=0) if (dn := donors(e))]
        print(f"{d.name}: {len(ex)} prompts", flush=True)
        for kind in ("other values", "other key"):
            zs = [donor_outputs(model, dn[kind][0], e.query_pos) for e, dn in ex]
            for layer in range(model.n_layers):
                out = [answer_with(model, e, layer, z[layer]) for (e, _), z in zip(ex, zs)]
                own = sum(o == e.answer for o, (e, _) in zip(out, ex)) / len(ex)
                donor = sum(o == dn[kind][1] for o, (_, dn) in zip(out, ex)) / len(ex)
                print(f"  {kind}: layer {layer} at the query from the donor: P's value {own:.2f}, the donor's "
                      f"{donor:.2f}, other {1 - own - donor:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
