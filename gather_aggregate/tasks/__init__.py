"""Retrieval and knowledge tasks that carry their own segment structure.

Every task yields annotated :class:`Example` s (prompt, token ids, segment
spans with summary positions, the correct segment, the query position and the
answer candidates); see :mod:`gather_aggregate.tasks.base` for the conventions.
"""

from __future__ import annotations

from gather_aggregate.core.protocol import pad_id_of
from gather_aggregate.tasks.base import (
    Batch,
    Example,
    IndexedTask,
    PromptSpec,
    Segment,
    Task,
    annotate,
    check_context,
    collate,
)
from gather_aggregate.tasks.evaluate import (
    EvalResult,
    ExampleResult,
    candidate_logprobs,
    correct_logprob,
    evaluate,
    logit_diff,
    score_per_candidate,
)
from gather_aggregate.tasks.facts import FactsTask, FactWorld, knowledge_prompt, mc_prompt
from gather_aggregate.tasks.kv import KVRetrieval, kv_prompt
from gather_aggregate.tasks.metric import task_metric
from gather_aggregate.tasks.mmlu import MMLUItem, MMLUTask, load_mmlu
from gather_aggregate.tasks.mqar import MQAR
from gather_aggregate.tasks.registry import TASK_NAMES, for_model_dir, get_task
from gather_aggregate.tasks.wordlevel import word_level_tokenizer

__all__ = [
    "MQAR",
    "TASK_NAMES",
    "Batch",
    "EvalResult",
    "Example",
    "ExampleResult",
    "IndexedTask",
    "FactWorld",
    "FactsTask",
    "KVRetrieval",
    "MMLUItem",
    "MMLUTask",
    "PromptSpec",
    "Segment",
    "Task",
    "annotate",
    "candidate_logprobs",
    "check_context",
    "collate",
    "correct_logprob",
    "evaluate",
    "for_model_dir",
    "get_task",
    "knowledge_prompt",
    "kv_prompt",
    "load_mmlu",
    "logit_diff",
    "mc_prompt",
    "pad_id_of",
    "score_per_candidate",
    "task_metric",
    "word_level_tokenizer",
]
