"""A layer's (implied) attention pattern on one prompt, saved: :class:`PatternResult`.

``rows`` is the long form (head, query, key, their tokens and the weight, causal entries only) for the CSV and
pandas; ``meta`` holds the prompt, its tokens, the segments, the query position and the full
``[head, query, key]`` matrix, so the report can draw it again without the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gather_aggregate.core.typed_result import TableResult


@dataclass(repr=False)
class PatternResult(TableResult):
    """``pattern[head][query][key]`` of one layer on one prompt, with the prompt's tokens and annotations."""

    KIND: ClassVar[str] = "pattern"
    SHOWN_COLUMNS = ("head", "query", "key", "query_token", "key_token", "weight")

    @classmethod
    def of(cls, pattern: Any, tokens: list[str], layer: int, kind: str, heads: list[int],
           meta: dict[str, Any]) -> PatternResult:
        """From a ``[head, query, key]`` tensor (or nested lists) and the prompt's string tokens."""
        pat = pattern.tolist() if hasattr(pattern, "tolist") else pattern
        rows = [{"head": h, "query": q, "key": k, "query_token": tokens[q], "key_token": tokens[k],
                 "weight": float(pat[i][q][k])}
                for i, h in enumerate(heads) for q in range(len(pat[i])) for k in range(q + 1)]
        return cls(rows, {**meta, "layer": layer, "layer_kind": kind, "heads": list(heads), "tokens": list(tokens),
                          "pattern": pat})

    @property
    def pattern(self) -> Any:
        import torch

        return torch.tensor(self.meta["pattern"])

    def caption(self) -> str:
        m = self.meta
        return (f"layer {m.get('layer')} ({m.get('layer_kind')}), heads {m.get('heads')}, prompt {m.get('prompt_index', 0)}"
                f" ({len(m.get('tokens', []))} tokens)")
