"""Scoring: one evaluation function for every task and every hooked model.

A prediction is the candidate with the highest continuation log-probability

    score(c) = sum_t log p(c_t | prompt, c_<t)       (c = candidate_ids[i])

(ties go to the first candidate).  How many forwards that takes:

* every candidate one token (KV with integer values, letters): **one forward
  per batch of prompts** — all candidates are read from the logits at
  ``query_pos``;
* some candidate longer: **batched continuations** — one row
  ``prompt + c[:-1]`` per (example, candidate), batched, right-padded;
* the paper's own code: one forward per (prompt, candidate)
  (:func:`score_per_candidate`, kept as the reference and benchmark anchor).

Works with any object following :mod:`gather_aggregate.core.protocol`: it calls
``model(tokens)`` for logits and ``model.hooks(fwd_hooks=...)`` for hooks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gather_aggregate.core.errors import InputError, TaskError
from gather_aggregate.core.indices import as_index
from gather_aggregate.core.model_state import analysis
from gather_aggregate.core.protocol import HookedModel, pad_id_of
from gather_aggregate.core.provenance import Provenance
from gather_aggregate.tasks.base import Batch, Example, check_context, check_count, check_examples, collate
from gather_aggregate.tasks.fit import check_fits

if TYPE_CHECKING:  # pragma: no cover
    from jaxtyping import Float
    from torch import Tensor

Hooks = Sequence[tuple[Any, Callable[..., Any]]]
HookFactory = Callable[[Batch], Hooks]


@dataclass(frozen=True)
class ExampleResult:
    """The outcome on one example."""

    index: int
    pred: int  # index of the predicted candidate
    answer: int  # index of the right candidate
    logprobs: list[float]  # continuation log-prob of every candidate
    correct: bool

    @property
    def margin(self) -> float:
        """log-prob of the answer minus the best wrong candidate (> 0 iff correct, barring ties)."""
        wrong = [lp for i, lp in enumerate(self.logprobs) if i != self.answer]
        return self.logprobs[self.answer] - max(wrong) if wrong else float("inf")


@dataclass
class EvalResult:
    """Accuracy plus per-example results; ``n_forwards`` counts model calls."""

    accuracy: float
    results: list[ExampleResult]
    n_forwards: int = 0
    n_rows: int = 0  # sequences run through the model in total
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.results)

    @property
    def correct(self) -> list[bool]:
        return [r.correct for r in self.results]

    def answer_logprobs(self) -> list[float]:
        return [r.logprobs[r.answer] for r in self.results]

    def to_rows(self) -> list[dict[str, Any]]:
        """Plain dicts (for JSON / CSV)."""
        return [dataclasses.asdict(r) for r in self.results]

    def __repr__(self) -> str:
        return f"EvalResult(accuracy={self.accuracy:.4f}, n={self.n}, n_forwards={self.n_forwards})"

    KIND: ClassVar[str] = "eval"

    @property
    def provenance(self) -> Provenance:
        return Provenance.from_meta(self.meta)

    def save(self, path: str | Path) -> Path:
        """``path`` (.json: one row per prompt, accuracy and provenance in meta) and its CSV twin, atomically."""
        from gather_aggregate.core.results_io import write_table

        return write_table(self.to_rows(), path, {**self.meta, "kind": self.KIND, "accuracy": self.accuracy,
                                                  "n_forwards": self.n_forwards, "n_rows": self.n_rows})

    @classmethod
    def load(cls, path: str | Path) -> EvalResult:
        from gather_aggregate.core.typed_result import read_table

        rows, meta = read_table(path, cls.KIND)
        meta = dict(meta)
        numbers = {k: meta.pop(k, 0) for k in ("accuracy", "n_forwards", "n_rows")}
        return cls(float(numbers["accuracy"]), [ExampleResult(**r) for r in rows], int(numbers["n_forwards"]),
                   int(numbers["n_rows"]), meta)

    def to_pandas(self) -> Any:
        import pandas as pd

        frame = pd.DataFrame(self.to_rows())
        frame.attrs["meta"] = {**self.meta, "accuracy": self.accuracy}
        return frame

    def caption(self) -> str:
        p = self.provenance
        on = f" ({p.model_name} on {p.task_name}, seed {p.seed})" if p.model_name else ""
        return f"accuracy {self.accuracy:.3f} on {self.n} prompts{on}"

    def _repr_html_(self) -> str:
        from gather_aggregate.core.typed_result import html_table

        body = [[str(r.index), str(r.pred), str(r.answer), str(r.correct), f"{r.margin:.3f}"] for r in self.results[:12]]
        return html_table("EvalResult", self.caption(),
                          ["prompt", "predicted", "answer", "correct", "margin (nats)"], body, self.n)


# --------------------------------------------------------------------------
# differentiable metrics on logits + batch (for head scans and attribution)
# --------------------------------------------------------------------------
def query_logits(logits: Float[Tensor, "batch pos vocab"], batch: Batch) -> Float[Tensor, "batch vocab"]:
    """Logits at each example's ``query_pos``."""
    idx = batch.query_pos.to(logits.device)
    return logits[torch.arange(logits.shape[0], device=logits.device), idx]


def candidate_logprobs(logits: Float[Tensor, "batch pos vocab"], batch: Batch) -> Float[Tensor, "batch cand"]:
    """log p(first token of each candidate) at ``query_pos``; padded candidates get ``-inf``.

    Exact continuation scores when candidates are single tokens.
    """
    lp = query_logits(logits, batch).float().log_softmax(-1)
    ids = batch.cand_ids.to(lp.device)
    out = lp.gather(1, ids.clamp_min(0))
    return out.masked_fill(~batch.cand_mask.to(lp.device), float("-inf"))


def correct_logprob(logits: Float[Tensor, "batch pos vocab"], batch: Batch) -> Float[Tensor, " batch"]:
    """log-prob of the right candidate's (first) token at ``query_pos`` (differentiable)."""
    lp = candidate_logprobs(logits, batch)
    return lp.gather(1, batch.answer.to(lp.device)[:, None])[:, 0]


def logit_diff(logits: Float[Tensor, "batch pos vocab"], batch: Batch) -> Float[Tensor, " batch"]:
    """Logit of the right candidate minus the largest wrong-candidate logit, at ``query_pos``.

    Uses first tokens of the candidates; differentiable (``max`` passes the
    gradient to the best wrong candidate).
    """
    q = query_logits(logits, batch).float()
    ids = batch.cand_ids.to(q.device)
    cand = q.gather(1, ids.clamp_min(0))
    ans = batch.answer.to(q.device)
    right = cand.gather(1, ans[:, None])[:, 0]
    wrong_mask = batch.cand_mask.to(q.device).clone()
    wrong_mask[torch.arange(len(ans), device=q.device), ans] = False
    wrong = cand.masked_fill(~wrong_mask, float("-inf")).max(1).values
    return right - wrong


# --------------------------------------------------------------------------
# running the model
# --------------------------------------------------------------------------
def _logits(model: HookedModel, tokens: Tensor) -> Tensor:
    out = model(tokens)
    out = getattr(out, "logits", out)
    if not isinstance(out, torch.Tensor) or out.dim() != 3:
        raise InputError("model(tokens) must return logits [batch, pos, vocab]; wrap the model with "
                         "gather_aggregate.load_model / from_hf_model")
    return out


def _forward(model: HookedModel, batch: Batch, fwd_hooks: Hooks | HookFactory) -> Tensor:
    made = fwd_hooks(batch) if callable(fwd_hooks) else fwd_hooks
    if isinstance(made, (str, bytes)) or not hasattr(made, "__iter__"):  # was "'int' object is not iterable"
        raise InputError(f"fwd_hooks: a hook factory must return a list of (hook_name, fn) pairs, got "
                         f"{type(made).__name__}")
    hooks = list(made)  # their names and returns are checked by model.hooks (gather_aggregate.core.hook_names)
    ctx = model.hooks(fwd_hooks=hooks) if hooks else nullcontext()
    with ctx:
        return _logits(model, batch.tokens)


def _model_device(model: HookedModel) -> torch.device:
    dev = getattr(model, "device", None)
    if isinstance(dev, torch.device):
        return dev
    module = getattr(model, "module", model)
    params = getattr(module, "parameters", None)
    if callable(params):
        for p in params():
            return p.device
    return torch.device("cpu")


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _progress(total: int, enabled: bool | None, desc: str) -> Any:
    if enabled is None:
        enabled = total >= 20
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False)


def _resolve_examples(model: HookedModel, task_or_examples: Any, n: int | None, seed: int) -> list[Example]:
    if hasattr(task_or_examples, "examples") and not isinstance(task_or_examples, (list, tuple)):
        tok = getattr(model, "tokenizer", None)
        if tok is None:
            raise InputError("the model has no tokenizer to build the task's prompts; pass examples instead")
        kwargs = {} if n is None else {"n": n}
        return list(task_or_examples.examples(tok, seed=seed, **kwargs))
    if isinstance(task_or_examples, (str, bytes)) or not hasattr(task_or_examples, "__iter__"):
        raise InputError(f"evaluate takes a task or a list of tasks.Example, got {type(task_or_examples).__name__}")
    examples = list(task_or_examples)
    if not examples:
        raise TaskError("no examples to evaluate (empty dataset); build the task with n >= 1")
    if n is not None:  # was ignored for a list: n=2 evaluated every example
        examples = examples[:check_count(n)]
    bad = [type(e).__name__ for e in examples if not isinstance(e, Example)]
    if bad:
        raise InputError(f"evaluate takes a task or a list of tasks.Example, got {bad[0]}")
    return check_examples(examples)


@analysis
def evaluate(
    model: HookedModel,
    examples: Any,
    *,
    fwd_hooks: Hooks | HookFactory = (),
    batch_size: int = 16,
    progress: bool | None = None,
    seed: int = 0,
    n: int | None = None,
    fast_single_token: bool = True,
) -> EvalResult:
    """Accuracy of ``model`` on ``examples`` (a list of :class:`Example` or a task), with optional hooks.

    ``fwd_hooks``: ``[(hook_name, fn), ...]`` applied to every forward (ablations,
    masks), or a callable ``batch -> hooks`` for hooks that depend on the
    batch's annotations (each batch is a :class:`Batch`; for multi-token
    candidates its rows are ``prompt + candidate[:-1]`` continuations that keep
    the example's segment annotations).  Hooks are removed after each forward,
    also on error.  ``batch_size``: sequences per forward.  ``progress``: a
    tqdm bar (``None`` = only for 20+ forwards).  ``seed`` seeds torch inside
    (without touching the global RNG), for hooks that sample (resample
    ablation), and builds the task's prompts when a task is passed (with
    ``n`` prompts; with a list of examples, ``n`` takes its first ``n``).  Deterministic: the same inputs give the same result.
    ``fast_single_token=False`` scores single-token candidates by batched
    continuations too (for checks and benchmarks).  Prompts that tokenise to
    more than 5% unknown tokens raise an ``UnknownTokenWarning``.
    """
    from gather_aggregate.core.arguments import check_model, count

    check_model(model, needs=("__call__", "hooks"))
    batch_size, seed = count(batch_size, "batch_size"), as_index(seed, "seed")
    if not isinstance(fast_single_token, bool):  # "no" was true
        raise InputError(f"fast_single_token must be True or False, got {fast_single_token!r}")
    if not callable(fwd_hooks) and (isinstance(fwd_hooks, (str, bytes)) or not isinstance(fwd_hooks, (list, tuple))):
        raise InputError(f"fwd_hooks must be a list of (hook_name, fn) pairs or a function batch -> hooks, got "
                         f"{type(fwd_hooks).__name__}")
    exs = _resolve_examples(model, examples, n, seed)
    from gather_aggregate.tasks.unknown import warn_if_unknown

    warn_if_unknown(str(exs[0].meta.get("task", "examples")), (e.input_ids for e in exs),
                    getattr(model, "tokenizer", None))
    check_fits(model, exs)
    longest = max(max(len(c) for c in e.candidate_ids) for e in exs)
    check_context(exs, getattr(model, "n_ctx", None), extra=longest - 1)
    pad = pad_id_of(getattr(model, "tokenizer", None))
    device = _model_device(model)

    single = [i for i, e in enumerate(exs) if fast_single_token and e.single_token]
    multi = [i for i, e in enumerate(exs) if not (fast_single_token and e.single_token)]
    rows = [(i, j) for i in multi for j in range(len(exs[i].candidates))]
    # one forward a job, single-token batches first: the same order (and sampled hooks' draws) on every run
    jobs: list[tuple[Callable[..., None], Sequence[Any]]] = (
        [(_score_next_tokens, idx) for idx in _chunks(single, batch_size)]
        + [(_score_continuations, part) for part in _chunks(rows, batch_size)])
    scores: dict[int, list[float]] = {}
    bar = _progress(len(jobs), progress, "evaluate")
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            for score, part in jobs:
                score(model, exs, part, pad, device, fwd_hooks, scores)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    results = _results(exs, scores)
    acc = sum(r.correct for r in results) / len(results)
    return EvalResult(accuracy=acc, results=results, n_forwards=len(jobs),
                      n_rows=len(single) + len(rows), meta={"batch_size": batch_size, "seed": seed})


def _score_next_tokens(model: HookedModel, exs: Sequence[Example], idx: Sequence[int], pad: int, device: torch.device,
                       fwd_hooks: Hooks | HookFactory, scores: dict[int, list[float]]) -> None:
    """One forward over the examples ``idx`` (single-token candidates): ``scores[i]`` = each candidate's
    log-prob at ``query_pos``."""
    batch = collate([exs[i] for i in idx], pad, device=device)
    lp = candidate_logprobs(_forward(model, batch, fwd_hooks), batch).cpu()
    for r, i in enumerate(idx):
        scores[i] = lp[r, : len(exs[i].candidates)].tolist()


def _score_continuations(model: HookedModel, exs: Sequence[Example], part: Sequence[tuple[int, int]], pad: int,
                         device: torch.device, fwd_hooks: Hooks | HookFactory, scores: dict[int, list[float]]) -> None:
    """One forward over the rows ``prompt_i + candidate_ij[:-1]`` of ``part`` (pairs ``(i, j)``):
    ``scores[i][j] = Σ_k log p(c_k | prompt, c_<k)`` over candidate ``j``'s tokens ``c``."""
    cont = []
    for i, j in part:
        e, c = exs[i], exs[i].candidate_ids[j]
        cont.append(dataclasses.replace(e, input_ids=e.input_ids + c[:-1]))
    batch = collate(cont, pad, device=device)
    logits = _forward(model, batch, fwd_hooks)
    for r, (i, j) in enumerate(part):
        c, q = exs[i].candidate_ids[j], exs[i].query_pos
        # only the scored positions q .. q+len(c)-1 are normalised
        lp = logits[r, q : q + len(c)].float().log_softmax(-1)
        total = lp.gather(1, torch.tensor(c, device=lp.device)[:, None]).sum().item()
        scores.setdefault(i, [0.0] * len(exs[i].candidates))[j] = total


def _results(exs: Sequence[Example], scores: dict[int, list[float]]) -> list[ExampleResult]:
    """Each example's prediction: its highest-scoring candidate (the first one on a tie)."""
    results = []
    for i, e in enumerate(exs):
        s = scores[i]
        pred = max(range(len(s)), key=lambda k: (s[k], -k))
        results.append(ExampleResult(index=i, pred=pred, answer=e.answer, logprobs=s, correct=pred == e.answer))
    return results


@analysis
def score_per_candidate(model: HookedModel, example: Example, *, fwd_hooks: Hooks = ()) -> list[float]:
    """Reference scoring as in the paper's code: one forward per candidate over ``prompt + candidate``.

    Returns ``sum_t log p(c_t | ...)`` for each candidate; slow on purpose
    (the oracle and benchmark anchor of :func:`evaluate`).
    """
    device = _model_device(model)
    out = []
    with torch.no_grad():
        for c in example.candidate_ids:
            tokens = torch.tensor([example.input_ids + c], device=device)
            ctx = model.hooks(fwd_hooks=list(fwd_hooks)) if fwd_hooks else nullcontext()
            with ctx:
                lp = _logits(model, tokens)[0].float().log_softmax(-1).cpu()
            q = example.query_pos
            out.append(sum(lp[q + t, tok].item() for t, tok in enumerate(c)))
    return out
