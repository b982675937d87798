"""What the lm-eval model changes in the network: heads ablated, keep-only masks, layers pruned.

An :class:`Intervention` is parsed from lm-eval ``--model_args`` strings and
turned into forward hooks for any protocol model (the project's own
:func:`~gather_aggregate.interventions.ablation.ablation_hooks` and
:func:`~gather_aggregate.studies.ablation_tables.skip_layer_hooks`), so a benchmark run and
this project's ``evaluate`` apply exactly the same edit.

* ``ablate=L16H22;L17H24`` (or ``16.22;17.24``): these heads are ablated;
* ``keep=L0H2;L1H0``: every head *except* these is ablated (the paper's
  keep-only experiment);
* ``prune=3;2``: these layers pass their input residual through unchanged;
* ``method=zero|mean|resample`` with ``reference=TASK|FILE`` and
  ``n_reference=32``: what replaces an ablated head's output.

lm-eval's prompts have every length, so mean and resample ablation here are
**position-agnostic**, over the pooled head outputs ``R = {z_h(r, p)}`` of the
reference prompts ``r`` at all their positions ``p``:

* ``mean``:      ``z_h(x, p) <- mean(R)`` (the project's ``per_position=False`` mean);
* ``resample``:  ``z_h(x, p) <- R[perm[p mod |R|]]`` with a permutation seeded
  by ``seed``: the same reference output for position ``p`` in every prompt and
  every batch, so results do not depend on batching.

The reference set is a task of this project (``kv``, ``letter-mc``,
``knowledge``, ``mmlu`` ...; built from the model directory's own vocabulary
when it ships one), or a file: ``.txt`` (prompts separated by blank lines),
``.json`` (a list of strings, or rows with a ``prompt`` / ``text`` field) or
``.jsonl``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gather_aggregate.core.errors import InputError
from gather_aggregate.interventions.ablation import (
    METHODS,
    Replacement,
    ablation_hooks,
    group_by_layer,
    heads_except,
)
from gather_aggregate.lm_eval.spec import Head, format_heads, parse_heads, parse_layers, whole_number

if TYPE_CHECKING:  # pragma: no cover
    from gather_aggregate.core.protocol import HookedModel


def _file_prompts(path: Path) -> list[str]:
    """The prompts of a reference file: ``.txt`` (blank-line separated), ``.json`` (a list) or ``.jsonl`` (one a
    line), each a string or an object with a ``prompt`` or ``text`` string; anything else is one InputError."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read reference file {path} ({exc}); pass a UTF-8 .txt/.json/.jsonl file") from None
    if path.suffix.lower() == ".txt":
        return [p for p in text.split("\n\n") if p.strip()]
    try:
        if path.suffix.lower() == ".jsonl":
            rows: Any = []
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise InputError(f"{path} line {n} is not JSON ({exc.msg}); write one prompt a line, as "
                                         '"text" or {"prompt": "text"}') from None
        else:
            rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not JSON ({exc.msg}, line {exc.lineno}); write a list of prompts, e.g. "
                         '["text", {"prompt": "text"}], or use a .txt file') from None
    if not isinstance(rows, list):
        raise InputError(f"{path} holds a JSON {type(rows).__name__}, not a list of prompts; write "
                         '["text", {"prompt": "text"}]')
    prompts = []
    for i, r in enumerate(rows):
        p = r if isinstance(r, str) else r.get("prompt", r.get("text")) if isinstance(r, dict) else None
        if not isinstance(p, str) or not p.strip():
            raise InputError(f"{path}: reference row {i} is {str(r)[:40]!r}; each row must be a non-empty string or "
                             "have a 'prompt' or 'text' field")
        prompts.append(p)
    return prompts


def reference_prompts(reference: str, model_dir: str | None, n: int, seed: int = 0) -> list[str]:
    """``n`` reference prompts from a task name of this project or a file (see the module docstring)."""
    path = Path(reference)
    if path.suffix.lower() in (".txt", ".json", ".jsonl") or path.is_file():
        if not path.is_file():
            raise InputError(f"no reference file at {path}; pass reference=kv (a task) or an existing file")
        prompts = _file_prompts(path)
        if not prompts:
            raise InputError(f"{path} holds no reference prompts")
        return prompts[:n]
    from gather_aggregate.core.errors import TaskError
    from gather_aggregate.tasks.registry import get_task

    directory = model_dir if model_dir is not None and Path(model_dir).is_dir() else None
    try:
        task = get_task(reference, model_dir=directory)
    except TaskError as err:
        raise InputError(f"reference={reference!r}: {err}; or pass a .txt/.json file of prompts") from None
    return [s.prompt for s in task.specs(n, seed=seed)]


def check_reference_vocab(model: HookedModel, prompts: Sequence[str], reference: str) -> None:
    """Refuse reference prompts the model cannot read: more than half their tokens unknown to its tokenizer (a
    file in another model's vocabulary gave means of the unknown token's outputs)."""
    from gather_aggregate.tasks.unknown import unk_id_of, unknown_fraction

    tok = getattr(model, "tokenizer", None)
    unk = unk_id_of(tok)
    if tok is None or unk is None:
        return
    frac, total = unknown_fraction([model.to_tokens(p)[0].tolist() for p in prompts], unk)
    if total and frac > 0.5:
        raise InputError(f"reference={reference!r}: {frac:.0%} of its {total} tokens are unknown to this model's "
                         "tokenizer, so the ablated heads would get the unknown token's outputs; pass prompts in "
                         "the model's vocabulary (reference=kv, or a file that `gather-aggregate lm-eval export` "
                         "wrote for it)")


class PooledReplacement(Replacement):
    """Position-agnostic mean / resample over pooled reference head outputs ``{layer: [n_pooled, head, d_head]}``."""

    def __init__(self, method: str, pooled: dict[int, Tensor], seed: int = 0) -> None:
        super().__init__(method, None, False, seed)  # type: ignore[arg-type]
        self.pooled = pooled
        n = next(iter(pooled.values())).shape[0]
        self.perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))

    def values(self, layer: int, head: int, like: Tensor) -> Tensor:
        ref = self.pooled[layer][:, head].to(device=like.device, dtype=like.dtype)  # [n_pooled, d_head]
        if self.method == "mean":
            return ref.mean(0).expand_as(like)
        pos = torch.arange(like.shape[-2]) % ref.shape[0]
        return ref[self.perm[pos].to(ref.device)].expand_as(like)


def pooled_head_outputs(model: HookedModel, prompts: Sequence[str], layers: Sequence[int]) -> dict[int, Tensor]:
    """Head outputs of ``layers`` at every position of every prompt, stacked: ``{layer: [n_pos, head, d_head]}``."""
    names = {model.head_hook(layer)[0]: layer for layer in layers}
    parts: dict[int, list[Tensor]] = {layer: [] for layer in layers}
    with torch.no_grad():
        for prompt in prompts:
            tokens = model.to_tokens(prompt)
            _, cache = model.run_with_cache(tokens, names_filter=list(names))
            for name, layer in names.items():
                parts[layer].append(cache[name][0].detach())
    return {layer: torch.cat(p, 0) for layer, p in parts.items()}


@dataclass
class Intervention:
    """Heads ablated (or all heads but ``keep``), layers pruned, and how ablated heads are filled."""

    ablate: list[Head] = field(default_factory=list)
    keep: list[Head] = field(default_factory=list)
    prune: list[int] = field(default_factory=list)
    method: str = "zero"
    reference: str = "kv"
    n_reference: int = 32
    seed: int = 0

    @classmethod
    def from_args(cls, ablate: Any = None, keep: Any = None, prune: Any = None, method: str = "zero",
                  reference: Any = "kv", n_reference: int = 32, seed: int = 0) -> Intervention:
        out = cls(parse_heads(ablate, "ablate"), parse_heads(keep, "keep"), parse_layers(prune), str(method),
                  str(reference), whole_number(n_reference, "n_reference", 1), whole_number(seed, "seed", 0))
        if out.method not in METHODS:
            raise InputError(f"method={out.method!r}: use one of {', '.join(METHODS)}")
        if out.ablate and out.keep:
            raise InputError("pass ablate= (heads to remove) or keep= (heads to keep, the rest removed), not both")
        return out

    @property
    def is_clean(self) -> bool:
        return not (self.ablate or self.keep or self.prune)

    def removed_heads(self, model: HookedModel) -> list[Head]:
        """The heads this intervention ablates on ``model`` (validated)."""
        if self.keep:
            return heads_except(model, self.keep)
        return model.check_head_set(self.ablate) if self.ablate else []

    def hooks(self, model: HookedModel, model_dir: str | None = None) -> list[tuple[str, Callable[..., Any]]]:
        """Forward hooks implementing this intervention on ``model`` (reference outputs computed here, once)."""
        from gather_aggregate.studies.ablation_tables import skip_layer_hooks

        hooks: list[tuple[str, Callable[..., Any]]] = []
        heads = self.removed_heads(model)
        if heads:
            if self.method == "zero":
                rep: Replacement = Replacement("zero")
            else:
                prompts = reference_prompts(self.reference, model_dir, self.n_reference, self.seed)
                check_reference_vocab(model, prompts, self.reference)
                pooled = pooled_head_outputs(model, prompts, list(group_by_layer(heads)))
                rep = PooledReplacement(self.method, pooled, self.seed)
            hooks += ablation_hooks(model, heads, rep)
        if self.prune:
            hooks += skip_layer_hooks(model, self.prune)
        return hooks

    def describe(self) -> str:
        parts = []
        if self.ablate:
            parts.append(f"ablate={format_heads(self.ablate)}")
        if self.keep:
            parts.append(f"keep={format_heads(self.keep)}")
        if self.prune:
            parts.append("prune=" + ";".join(map(str, self.prune)))
        if (self.ablate or self.keep) and self.method != "zero":
            parts.append(f"method={self.method} (reference={self.reference}, n={self.n_reference})")
        return ", ".join(parts) or "clean"
