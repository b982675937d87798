"""``GatherAggregateLM``: an lm-evaluation-harness model backed by any hooked model, under an intervention.

Registered as ``gather_aggregate`` in lm-eval's model registry (see
:mod:`gather_aggregate.lm_eval`), so::

    python -m gather_aggregate.lm_eval --model gather_aggregate \\
        --model_args pretrained=DIR,ablate=L16H22;L17H24,method=mean --tasks mmlu

runs lm-eval's own tasks on a Transformer (TransformerBridge), an SSM or a
hybrid with those heads ablated (see :mod:`.intervention` for ``ablate``,
``keep``, ``prune``, ``method``, ``reference``).

Scoring follows lm-eval's HF model (``--model hf``) token for token: the same
context/continuation split (``TemplateLM._encode_pair``), the same special
tokens, the same left truncation to ``max_length``; a request
``(context c, continuation y)`` gets

    loglik = sum_t log p(y_t | c, y_<t),   is_greedy = all_t argmax p(. | c, y_<t) == y_t.

**Requests that share a context take one forward.**  A request needs the
logits of the row ``(c + y)[:-1]``; every request whose row is a prefix of a
longer request's row is read from that row.  So all single-token
continuations of one context (MMLU's `` A``..`` D``, a KV task's values) are
read from one row (the context), and the rows of one context (multi-token
continuations) always go into the same model call: ``n_forwards`` counts
model calls, ``n_rows`` the sequences run.

Greedy ``generate_until`` re-runs the growing prefix (hooked models keep no
KV cache), right-padded in batches; ``loglikelihood_rolling`` uses lm-eval's
rolling windows.  Chat: the tokenizer's chat template, or with
``chat_template=default`` the built-in :data:`DEFAULT_CHAT_TEMPLATE` for
tokenizers that have none (the toy zoo's); asking for a chat format without
either is a clear error.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import lm_eval.models  # noqa: F401  (registers lm-eval's own models before ours)
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.model_state import eval_mode
from gather_aggregate.lm_eval.intervention import Intervention
from gather_aggregate.lm_eval.spec import whole_number
from gather_aggregate.zoo import resolve_model_path

if TYPE_CHECKING:  # pragma: no cover
    from gather_aggregate.core.protocol import HookedModel

#: ``chat_template=default``: each message as ``Role: content`` followed by a blank line, then ``Assistant:``
DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
DEFAULT_MAX_LENGTH = 2048  # lm-eval's HF default when neither config nor tokenizer gives one


@register_model("gather_aggregate", "gather-aggregate")
class GatherAggregateLM(TemplateLM):
    """lm-eval ``LM`` over a protocol model (``pretrained=DIR`` or ``model=<hooked model>``) with an intervention.

    ``batch_size``: rows per forward (``"auto"`` means 16); ``max_length``:
    context in tokens (default: the model's ``n_ctx``, else the tokenizer's,
    else 2048, as lm-eval's HF model); ``chat_template``: ``None`` (the
    tokenizer's own), ``"default"`` (:data:`DEFAULT_CHAT_TEMPLATE`) or a Jinja
    template string.
    """

    def __init__(self, pretrained: str | None = None, *, model: HookedModel | None = None, ablate: Any = None, keep: Any = None,
                 prune: Any = None, method: str = "zero", reference: Any = "kv", n_reference: int = 32,
                 seed: int = 0, batch_size: int | str | None = 16, device: str | None = None,
                 dtype: str | None = None, max_length: int | None = None, max_gen_toks: int = 256,
                 chat_template: str | None = None, intervention: Intervention | None = None,
                 head_size: int | None = None, **kwargs: Any) -> None:
        super().__init__()
        kwargs.pop("max_batch_size", None)
        kwargs.pop("trust_remote_code", None)
        if kwargs:
            raise InputError(f"unknown gather_aggregate model_args {sorted(kwargs)}; use pretrained, ablate, keep, "
                             "prune, method, reference, n_reference, seed, batch_size, device, dtype, max_length, "
                             "max_gen_toks, chat_template, head_size (SSMs)")
        if (pretrained is None) == (model is None):
            raise InputError("pass pretrained=DIR (a model directory or zoo name) or model=<hooked model>"
                             + (", not both" if model is not None else ""))  # neither was "..., not both" too
        if model is not None and not (hasattr(model, "all_heads") and hasattr(model, "hooks")):  # was AttributeError
            raise InputError(f"model= takes a hooked model (load_model(dir), or from_hf_model(hf_model, tokenizer) for "
                             f"an HF model in memory), got {type(model).__name__}"
                             + ("; for a directory or zoo name pass pretrained=" if isinstance(model, str) else ""))
        if pretrained is not None and not str(pretrained).strip():  # was "'.' has no config.json"
            raise InputError("pretrained= is empty; pass pretrained=DIR (a model directory or zoo name)")
        # every number is checked before the model loads (each was int()'s ValueError, or a float truncated)
        batch = 16 if batch_size in (None, "auto") or str(batch_size).startswith("auto") \
            else whole_number(batch_size, "batch_size", 1)
        max_length = None if max_length in (None, 0, "0", "") else whole_number(max_length, "max_length", 1)
        max_gen_toks = whole_number(max_gen_toks, "max_gen_toks", 1)
        if chat_template is not None and not isinstance(chat_template, str):
            raise InputError(f"chat_template={chat_template!r}: pass 'default' or a Jinja template string")
        intervention = intervention or Intervention.from_args(ablate, keep, prune, method, reference, n_reference,
                                                              seed)
        if model is None:
            from gather_aggregate.models.loading import load_model

            pretrained = resolve_model_path(str(pretrained))
            extra = {} if head_size is None else {"head_size": whole_number(head_size, "head_size", 1)}
            model = load_model(pretrained, device=_device(device), dtype=dtype, **extra)
        self.model = model
        self.model_dir = str(pretrained) if pretrained is not None else getattr(model, "name_or_path", None)
        self.tokenizer = model.tokenizer
        if self.tokenizer is None:
            raise InputError("the model has no tokenizer; load it with load_model(dir) or set model.tokenizer")
        self.intervention = intervention
        self._hooks = self.intervention.hooks(model, self.model_dir)
        self.batch_size = batch
        self._max_length = max_length
        self.max_gen_toks = max_gen_toks
        self._chat_template = chat_template
        self._device = model.device
        self.n_forwards = 0
        self.n_rows = 0
        self.forward_seconds = 0.0

    def with_intervention(self, intervention: Intervention) -> GatherAggregateLM:
        """A new LM on the same loaded model with another intervention (the model is not reloaded)."""
        new = object.__new__(GatherAggregateLM)
        new.__dict__.update(self.__dict__)
        new.intervention = intervention
        new._hooks = intervention.hooks(self.model, self.model_dir)
        new.n_forwards = new.n_rows = 0
        new.forward_seconds = 0.0
        return new

    # ---- lm-eval's model interface -------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        return int(eos) if eos is not None else int(self.model.pad_token_id)

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return int(bos) if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        if self._max_length:
            return self._max_length
        n_ctx = getattr(self.model, "n_ctx", None)
        if n_ctx:
            return int(n_ctx)
        tok_max = getattr(self.tokenizer, "model_max_length", None)
        if tok_max and tok_max < 10**9:
            return int(tok_max)
        return DEFAULT_MAX_LENGTH

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "") or self.model_dir or "model").replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """Token ids as lm-eval's HF model makes them (native special tokens unless told; none before a BOS text)."""
        kw: dict[str, Any] = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        bos = self.tokenizer.bos_token
        if add_special_tokens is None and bos and string.startswith(bos):
            kw["add_special_tokens"] = False
        return list(self.tokenizer.encode(string, **kw))

    def tok_decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    # ---- forwards -----------------------------------------------------------------
    def _logits(self, rows: list[list[int]]) -> torch.Tensor:
        """One model call on right-padded ``rows`` under the intervention's hooks: logits ``[n_rows, pos, vocab]``."""
        width = max(len(r) for r in rows)
        tokens = torch.full((len(rows), width), int(self.model.pad_token_id), dtype=torch.long)
        for i, r in enumerate(rows):
            tokens[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        t0 = time.perf_counter()
        with torch.no_grad(), eval_mode(self.model), self.model.hooks(fwd_hooks=list(self._hooks)):
            out = self.model(tokens.to(self.model.device))
        out = getattr(out, "logits", out)
        self.forward_seconds += time.perf_counter() - t0
        self.n_forwards += 1
        self.n_rows += len(rows)
        return out

    def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        """Score ``(key, context_ids, continuation_ids)`` requests; one forward per shared context (see the module)."""
        fulls = []
        for _, ctx, cont in requests:
            if not cont:
                raise InputError("an lm-eval request has an empty continuation; check the task's doc_to_choice")
            fulls.append((list(ctx) + list(cont))[-(self.max_length + 1):])
        # rows: the longest needed sequence of each context group; requests whose row is a prefix share it
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, (full, (_, _, cont)) in enumerate(zip(fulls, requests, strict=True)):
            groups[tuple(full[: len(full) - len(cont)])].append(i)
        plan: list[list[tuple[list[int], list[int]]]] = []  # per group: [(row tokens, request indices)]
        for members in groups.values():
            rows: list[tuple[list[int], list[int]]] = []
            for i in sorted(members, key=lambda j: -len(fulls[j])):
                need = fulls[i][:-1]
                for row, idx in rows:
                    if row[: len(need)] == need:
                        idx.append(i)
                        break
                else:
                    rows.append((need, [i]))
            plan.append(rows)
        plan.sort(key=lambda rows: -max(len(r) for r, _ in rows))
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        batches: list[list[tuple[list[int], list[int]]]] = []
        for rows in plan:  # whole groups per forward, at most batch_size rows unless one group is larger
            if batches and len(batches[-1]) + len(rows) <= self.batch_size:
                batches[-1].extend(rows)
            else:
                batches.append(list(rows))
        for batch in tqdm(batches, disable=disable_tqdm or len(batches) < 20, desc="gather_aggregate loglikelihood"):
            logits = self._logits([r for r, _ in batch])
            for b, (_, idx) in enumerate(batch):
                for i in idx:
                    n_cont = len(requests[i][2])
                    end = len(fulls[i]) - 1
                    lp = logits[b, end - n_cont: end].float().log_softmax(-1)
                    target = torch.tensor(fulls[i][-n_cont:], device=lp.device)
                    score = float(lp.gather(1, target[:, None]).sum())
                    greedy = bool((lp.argmax(-1) == target).all())
                    results[i] = (score, greedy)
                    if requests[i][0] is not None:
                        self.cache_hook.add_partial("loglikelihood", requests[i][0], results[i])
        return [r for r in results if r is not None]

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        _warn_unknown(requests, self)
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole texts over lm-eval's rolling windows (each token predicted once)."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        _warn_unknown(requests, self)
        out = []
        for req in requests:
            (string,) = req.args
            windows = [(None, *make_disjoint_window(w)) for w in get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            total = sum(s for s, _ in self._loglikelihood_tokens(windows, disable_tqdm=True))
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
            out.append(total)
        return out

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy generation until a stop string, the end-of-text token or ``max_gen_toks`` tokens.

        Requests with the same generation arguments run together, ``batch_size``
        at a time: each step is one right-padded forward over the unfinished
        rows, read at each row's last token.
        """
        _warn_unknown(requests, self)
        out: list[str | None] = [None] * len(requests)
        by_kwargs: dict[str, list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            by_kwargs[repr(sorted((req.args[1] or {}).items()))].append(i)
        chunks = [idx[k: k + self.batch_size] for idx in by_kwargs.values() for k in range(0, len(idx), self.batch_size)]
        for chunk in tqdm(chunks, disable=disable_tqdm or len(chunks) < 20, desc="gather_aggregate generate"):
            until, max_new = self._gen_kwargs(requests[chunk[0]].args[1])
            prompts = [self.tok_encode(requests[i].args[0])[-(self.max_length - max_new):] for i in chunk]
            new: list[list[int]] = [[] for _ in chunk]
            live = list(range(len(chunk)))
            for _ in range(max_new):
                if not live:
                    break
                logits = self._logits([prompts[r] + new[r] for r in live])
                still = []
                for b, r in enumerate(live):
                    nxt = int(logits[b, len(prompts[r]) + len(new[r]) - 1].argmax())
                    if nxt == self.eot_token_id:
                        continue
                    new[r].append(nxt)
                    if not any(u in self.tok_decode(new[r]) for u in until):
                        still.append(r)
                live = still
            for r, i in enumerate(chunk):
                text = self.tok_decode(new[r])
                for u in until:
                    text = text.split(u)[0]
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
                out[i] = text
        return [t if t is not None else "" for t in out]

    def _gen_kwargs(self, gen_kwargs: dict[str, Any]) -> tuple[list[str], int]:
        kw = dict(gen_kwargs or {})
        if kw.get("do_sample") or float(kw.get("temperature", 0.0) or 0.0) > 0:
            raise InputError("gather_aggregate generates greedily; drop do_sample / set temperature=0")
        until = kw.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        eos = self.tokenizer.decode([self.eot_token_id], skip_special_tokens=False)
        if eos and eos not in until:
            until.append(eos)
        return until, int(kw.get("max_gen_toks", self.max_gen_toks))

    # ---- chat -----------------------------------------------------------------------
    def _template(self) -> str:
        own = getattr(self.tokenizer, "chat_template", None)
        if self._chat_template in (None, "", True):
            if own:
                return own if isinstance(own, str) else own.get("default", next(iter(own.values())))
            raise InputError(
                f"{self.tokenizer_name} has no chat template; pass chat_template=default for the built-in "
                "'Role: content' template, or chat_template=<a Jinja template>, or run without --apply_chat_template")
        return DEFAULT_CHAT_TEMPLATE if self._chat_template == "default" else str(self._chat_template)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        if chat_template is False or chat_template is None:
            return None
        return self._template()

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return str(self.tokenizer.apply_chat_template(
            chat_history, chat_template=self._template(), tokenize=False,
            add_generation_prompt=add_generation_prompt, continue_final_message=not add_generation_prompt))


def _device(device: str | None) -> str:
    """``device``, or (as lm-eval's HF model does) CUDA when available else CPU for none / an unavailable CUDA."""
    if device and not (str(device).startswith("cuda") and not torch.cuda.is_available()):
        return str(device)
    return "cuda" if torch.cuda.is_available() else "cpu"


def _warn_unknown(requests: list[Any], lm: GatherAggregateLM) -> None:
    """Warn per task when its prompts tokenise to > 5% unknown tokens."""
    from gather_aggregate.tasks.unknown import warn_if_unknown

    by_task: dict[str, list[list[int]]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for req in requests:
        task = str(getattr(req, "task_name", None) or "requests")
        text = req.args[0] if isinstance(req.args[0], str) else ""
        if (task, text) in seen:
            continue
        seen.add((task, text))
        by_task[task].append(lm.tok_encode(text))
    for task, ids in by_task.items():
        warn_if_unknown(task, ids, lm.tokenizer)
