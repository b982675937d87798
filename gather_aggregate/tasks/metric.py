"""A task's examples as a scalar metric for head scans: the answer's log-prob (or logit difference) at the query."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.model_state import outside_inference_mode
from gather_aggregate.core.protocol import pad_id_of
from gather_aggregate.tasks.base import Example, check_examples, collate
from gather_aggregate.tasks.fit import check_fits

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

    from gather_aggregate.core.protocol import HookedModel
    from gather_aggregate.core.readout import ReadoutMetric


def task_metric(model: HookedModel, examples: Sequence[Example],
                kind: str = "logprob") -> tuple[Tensor, ReadoutMetric]:
    """Tokens and a scalar metric over them for head scans: mean log-prob (or logit difference) of the answer.

    Multi-token candidates are scored on their first token here (the scan
    needs one forward per ablation); :func:`gather_aggregate.tasks.evaluate`
    scores full continuations.  The metric is a
    :class:`~gather_aggregate.core.readout.ReadoutMetric` at each prompt's query
    position, so scans finish their forwards there only, and it keeps the
    value per prompt, so exact scans report each head's standard error.
    """
    import torch

    from gather_aggregate.core.arguments import check_model
    from gather_aggregate.core.readout import ReadoutMetric
    from gather_aggregate.tasks.evaluate import correct_logprob, logit_diff

    check_model(model)
    examples = check_examples(examples)
    check_fits(model, examples)

    if kind not in ("logprob", "logit_diff"):
        raise InputError(f"metric kind must be 'logprob' or 'logit_diff', got {kind!r}")
    fn = correct_logprob if kind == "logprob" else logit_diff
    with outside_inference_mode():  # tensors the metric closes over must serve a later gradient estimate
        batch = collate(list(examples), pad_id_of(model.tokenizer), device=model.device)
        at_query = dataclasses.replace(batch, query_pos=torch.zeros_like(batch.query_pos))  # logits taken there
        positions = batch.query_pos[:, None]

    def per_prompt(logits_at: Any) -> Any:
        return fn(logits_at, at_query)

    per_prompt.__qualname__ = f"task_metric.{kind}"
    return batch.tokens, ReadoutMetric.mean_of(per_prompt, positions)
