"""Training and quick-evaluation data for the zoo, in the project's prompt formats.

A *document* is a list of ``(text, is_target)`` segments; the loss is taken on
every token of the target segments only.  The first query of every document is
exactly the evaluation prompt's continuation (see ``docs/zoo.md``); after it,
documents may carry more queries of the same kind (dense supervision), which is
what made in-context retrieval learnable on CPU in the trials:

* **KV** ``Memorize the following dictionary:\\n`` + ``k:v\\n`` lines +
  ``\\nThe value of the key 'k' is v`` then more queries in the short form
  ``\\n'k' is v`` (6 tokens instead of 10), keys drawn *with replacement* (no
  elimination shortcut).
* **Letter-MC** ``[filler] Question: What is the color of e?\\n`` + ``L. option\\n``
  lines + ``Answer: L``, then follow-up questions ``\\nQuestion: What is the color
  of e2?\\nAnswer: L2`` about entities whose colour is among the options (with
  replacement).  Shortcuts are removed: 3-5 options, letters in order or a shuffled
  subset of A-E, options of 1-3 words (the colour in a random slot), filler prefix.
* **Content-MC** the same prompt, answered with the option's text.
* **Knowledge** ``The color of e is attr`` (several per document).
* **MQAR** (auxiliary, weight 0 unless asked for) Zoology-style associative recall
  with *adjacent* pairs ``k v k v ...`` followed by queries ``k v`` (keys with
  replacement, loss on every value); the text format of the ``mqar`` task
  (:mod:`gather_aggregate.tasks.mqar`).  A 2-layer transformer forms an induction
  circuit on it within a few hundred steps, which it never did on KV directly.
* **Reverse MQAR** (auxiliary, weight 0 unless asked for) the MQAR documents
  queried with a value and answered with the key before it: the backward
  read-out letter-MC needs (its letter comes *before* the option's content).
* **Letter lookup** (auxiliary, weight 0 unless asked for) letter-MC whose questions
  name the colour itself, ``Question: What is the color of red?`` + options +
  ``Answer: L``: the in-context half of letter-MC without the fact lookup.
* **Letter recall** (auxiliary, weight 0 unless asked for) a letter-MC question and
  its options, then dense queries ``colour`` → ``L`` on lines of their own (the
  colour is the query token itself, as in reverse MQAR): the backward read-out of
  reverse MQAR in the options' own layout.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gather_aggregate.tasks.facts import knowledge_prompt
from gather_aggregate.tasks.facts import mc_prompt as facts_mc_prompt
from gather_aggregate.tasks.kv import kv_prompt
from gather_aggregate.training.vocab import World, split_words

Doc = list[tuple[str, bool]]


@dataclass
class Mixture:
    """Sampling weights of the document kinds and their size ranges."""

    kv: float = 0.4
    letter_mc: float = 0.35
    content_mc: float = 0.1
    knowledge: float = 0.15
    mqar: float = 0.0
    letter_lookup: float = 0.0
    reverse_mqar: float = 0.0
    letter_recall: float = 0.0
    kv_min_pairs: int = 2
    kv_max_pairs: int = 16
    kv_queries: tuple[int, int] = (6, 16)
    mc_options: tuple[int, int] = (3, 5)
    mc_followups: tuple[int, int] = (0, 4)
    mc_in_order: float = 0.5  # share of letter-MC prompts with letters A, B, C, ... in order
    mc_modifier: float = 0.5  # chance that an option gets extra words around the colour
    max_filler: int = 4
    knowledge_per_doc: tuple[int, int] = (3, 8)
    mqar_pairs: tuple[int, int] = (4, 8)
    mqar_queries: tuple[int, int] = (16, 24)
    recall_queries: tuple[int, int] = (8, 16)


# --- prompt pieces (the evaluation formats of gather_aggregate.tasks) ---------------------------------------


def mc_prompt(relation: str, entity: str, options: Sequence[tuple[str, str]]) -> str:
    """The letter-MC prompt of :func:`gather_aggregate.tasks.mc_prompt` for ``[(letter, text)]`` options (letters
    in any order)."""
    return facts_mc_prompt(relation, entity, [o for _, o in options], letters="".join(L for L, _ in options))


def mqar_prompt(pairs: Sequence[tuple[str, str]], key: str) -> str:
    return " ".join(f"{k} {v}" for k, v in pairs) + f" {key}"


# --- training documents ---------------------------------------------------------------------------------------


def _recall_doc(world: World, rng: random.Random, n_pairs: int, n_queries: int,
                render: Callable[[Sequence[tuple[str, str]], str], str], query: Callable[[str], str],
                reverse: bool = False) -> Doc:
    """A random dictionary rendered with its first query (the evaluation prompt), then ``n_queries - 1`` more
    queries ``query(key)``, keys drawn with replacement (no elimination shortcut); every value is a target.
    ``reverse`` queries with a value and answers with its key (the token *before* the match)."""
    keys = rng.sample(world.kv_keys, n_pairs)
    vals = rng.sample(world.kv_values, n_pairs)
    pairs = list(zip(keys, vals))
    table = {v: k for k, v in pairs} if reverse else dict(pairs)
    asked = vals if reverse else keys
    q = rng.choice(asked)
    doc: Doc = [(render(pairs, q), False), (f" {table[q]}", True)]
    for _ in range(n_queries - 1):
        q = rng.choice(asked)
        doc += [(query(q), False), (f" {table[q]}", True)]
    return doc


def kv_doc(world: World, rng: random.Random, n_pairs: int, n_queries: int) -> Doc:
    # later queries in the short form; the key still sits two tokens before the value
    return _recall_doc(world, rng, n_pairs, n_queries, kv_prompt, lambda q: f"\n'{q}' is")


def _entity_with(world: World, rng: random.Random, attr: str) -> str:
    return rng.choice([e for e, a in world.facts.items() if a == attr])


def _option_text(world: World, rng: random.Random, attr: str, p_modifier: float) -> str:
    if rng.random() >= p_modifier:
        return attr
    words = [attr]
    for _ in range(rng.randint(1, 2)):
        words.insert(rng.randint(0, len(words)), rng.choice(world.modifiers))
    return " ".join(words)


def mc_options(world: World, rng: random.Random, entity: str, n_options: int, in_order: bool,
               p_modifier: float) -> tuple[list[tuple[str, str]], int]:
    """Options ``[(letter, text)]`` with the entity's colour at a uniform position; returns (options, index)."""
    attr = world.facts[entity]
    others = rng.sample([a for a in world.attributes if a != attr], n_options - 1)
    correct = rng.randrange(n_options)
    attrs = others[:correct] + [attr] + others[correct:]
    letters = world.letters[:n_options] if in_order else rng.sample(world.letters, n_options)
    return [(L, _option_text(world, rng, a, p_modifier)) for L, a in zip(letters, attrs)], correct


def mc_doc(world: World, rng: random.Random, mix: Mixture, letter: bool, lookup: bool = False) -> Doc:
    """Letter- or content-format MC; with ``lookup`` the questions name the colour itself instead of an entity
    (``What is the color of red?``), so only the in-context step (find the option, read its letter) is left."""
    entity = rng.choice(world.entities)
    n_opt = rng.randint(*mix.mc_options)
    in_order = rng.random() < mix.mc_in_order
    options, correct = mc_options(world, rng, entity, n_opt, in_order, mix.mc_modifier if letter else 0.0)
    prefix = " ".join(rng.choice(world.filler) for _ in range(rng.randint(0, mix.max_filler)))
    subject = world.facts[entity] if lookup else entity
    prompt = (prefix + " " if prefix else "") + mc_prompt(world.relation, subject, options)
    answer = options[correct][0] if letter else options[correct][1]
    doc: Doc = [(prompt, False), (f" {answer}", True)]
    if letter:
        colour_to_letter = _colour_letters(world, options)
        for _ in range(rng.randint(*mix.mc_followups)):
            colour = rng.choice(list(colour_to_letter))
            e2 = colour if lookup else _entity_with(world, rng, colour)
            doc += [(f"\nQuestion: What is the {world.relation} of {e2}?\nAnswer:", False),
                    (f" {colour_to_letter[colour]}", True)]
    return doc


def _colour_letters(world: World, options: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``{colour: letter}`` of an options block (each option's text holds one colour word)."""
    return {next(w for w in text.split() if w in world.attributes): L for L, text in options}


def letter_recall_doc(world: World, rng: random.Random, mix: Mixture) -> Doc:
    """A letter-MC question and options, then ``recall_queries`` lines ``colour`` → `` L`` (colours of the block,
    drawn with replacement; every letter is a target)."""
    entity = rng.choice(world.entities)
    options, _ = mc_options(world, rng, entity, rng.randint(*mix.mc_options), rng.random() < mix.mc_in_order,
                            mix.mc_modifier)
    prompt = f"Question: What is the {world.relation} of {entity}?\n" + "".join(f"{L}. {o}\n" for L, o in options)
    table = _colour_letters(world, options)
    doc: Doc = []
    for i in range(rng.randint(*mix.recall_queries)):
        colour = rng.choice(list(table))
        doc += [((prompt if i == 0 else "\n") + colour, False), (f" {table[colour]}", True)]
    return doc


def knowledge_doc(world: World, rng: random.Random, n: int) -> Doc:
    doc: Doc = []
    for i in range(n):
        e = rng.choice(world.entities)
        doc += [(("\n" if i else "") + knowledge_prompt(world.relation, e), False), (f" {world.facts[e]}", True)]
    return doc


def mqar_doc(world: World, rng: random.Random, n_pairs: int, n_queries: int, reverse: bool = False) -> Doc:
    return _recall_doc(world, rng, n_pairs, n_queries, mqar_prompt, lambda q: f" {q}", reverse)


def sample_doc(world: World, rng: random.Random, mix: Mixture, kv_max_pairs: int | None = None) -> tuple[str, Doc]:
    kinds = ["kv", "letter_mc", "content_mc", "knowledge", "mqar", "letter_lookup", "reverse_mqar", "letter_recall"]
    weights = [mix.kv, mix.letter_mc, mix.content_mc, mix.knowledge, mix.mqar, mix.letter_lookup, mix.reverse_mqar,
               mix.letter_recall]
    kind = rng.choices(kinds, weights=weights)[0]
    if kind == "kv":
        hi = max(mix.kv_min_pairs, kv_max_pairs or mix.kv_max_pairs)
        return kind, kv_doc(world, rng, rng.randint(mix.kv_min_pairs, hi), rng.randint(*mix.kv_queries))
    if kind in ("mqar", "reverse_mqar"):
        return kind, mqar_doc(world, rng, rng.randint(*mix.mqar_pairs), rng.randint(*mix.mqar_queries),
                              reverse=kind == "reverse_mqar")
    if kind == "knowledge":
        return kind, knowledge_doc(world, rng, rng.randint(*mix.knowledge_per_doc))
    if kind == "letter_lookup":
        return kind, mc_doc(world, rng, mix, letter=True, lookup=True)
    if kind == "letter_recall":
        return kind, letter_recall_doc(world, rng, mix)
    return kind, mc_doc(world, rng, mix, letter=(kind == "letter_mc"))


# --- encoding --------------------------------------------------------------------------------------------------


def length_bucketed(docs: list[Doc], n_batches: int) -> list[list[Doc]]:
    """Split ``docs`` into ``n_batches`` batches of similar length (less padding), in random batch order."""
    order = sorted(docs, key=lambda d: sum(len(t) for t, _ in d))
    size = len(docs) // n_batches
    return [order[i * size : (i + 1) * size] for i in range(n_batches)]


def encode_doc(doc: Doc, vocab: dict[str, int]) -> tuple[list[int], list[bool]]:
    ids: list[int] = []
    tgt: list[bool] = []
    for text, is_target in doc:
        w = [vocab[x] for x in split_words(text)]
        ids += w
        tgt += [is_target] * len(w)
    return ids, tgt


def collate(docs: Sequence[Doc], vocab: dict[str, int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids [batch, pos]`` and ``labels [batch, pos]`` (next-token targets, -100 elsewhere).

    ``labels[b, t]`` is the token at ``t + 1`` when that token is a target, so the
    loss is read off the logits at ``t`` with no shifting inside the model.
    """
    enc = [encode_doc(d, vocab) for d in docs]
    T = max(len(ids) for ids, _ in enc)
    x = torch.full((len(docs), T), pad_id, dtype=torch.long)
    y = torch.full((len(docs), T), -100, dtype=torch.long)
    for b, (ids, tgt) in enumerate(enc):
        x[b, : len(ids)] = torch.tensor(ids)
        for t in range(len(ids) - 1):
            if tgt[t + 1]:
                y[b, t] = ids[t + 1]
    return x, y


# --- evaluation prompts (the contract formats, first query only) ------------------------------------------


@dataclass
class EvalItem:
    prompt: str
    answer: str  # the correct candidate, without the leading space
    candidates: list[str]


def recall_items(world: World, rng: random.Random, n_pairs: int, n: int,
                  render: Callable[[Sequence[tuple[str, str]], str], str], reverse: bool = False) -> list[EvalItem]:
    """``n`` dictionaries of ``n_pairs`` random key-value pairs, each rendered with one of its keys as the query
    (``reverse``: one of its values, answered with the key)."""
    out = []
    for _ in range(n):
        keys = rng.sample(world.kv_keys, n_pairs)
        vals = rng.sample(world.kv_values, n_pairs)
        i = rng.randrange(n_pairs)
        pairs = list(zip(keys, vals))
        if reverse:
            out.append(EvalItem(render(pairs, vals[i]), keys[i], keys))
        else:
            out.append(EvalItem(render(pairs, keys[i]), vals[i], list(world.kv_values)))
    return out


def kv_eval_items(world: World, rng: random.Random, n_pairs: int, n: int) -> list[EvalItem]:
    return recall_items(world, rng, n_pairs, n, kv_prompt)


def mqar_eval_items(world: World, rng: random.Random, n_pairs: int, n: int) -> list[EvalItem]:
    """The auxiliary MQAR task's first query: ``k v k v ... k`` -> ``v``."""
    return recall_items(world, rng, n_pairs, n, mqar_prompt)


def reverse_mqar_eval_items(world: World, rng: random.Random, n_pairs: int, n: int) -> list[EvalItem]:
    """Reverse MQAR's first query: ``k v k v ... v`` -> the ``k`` before that ``v`` (among the prompt's keys)."""
    return recall_items(world, rng, n_pairs, n, mqar_prompt, reverse=True)


def mc_eval_items(world: World, rng: random.Random, n: int, letter: bool, n_options: int = 4,
                  lookup: bool = False) -> list[EvalItem]:
    out = []
    for _ in range(n):
        e = rng.choice(world.entities)
        options, c = mc_options(world, rng, e, n_options, in_order=True, p_modifier=0.0)
        prompt = mc_prompt(world.relation, world.facts[e] if lookup else e, options)
        if letter:
            out.append(EvalItem(prompt, options[c][0], [L for L, _ in options]))
        else:
            out.append(EvalItem(prompt, options[c][1], [o for _, o in options]))
    return out


def recall_eval_items(world: World, rng: random.Random, n: int, n_options: int = 4) -> list[EvalItem]:
    """Letter recall's first query: a question, its options in order, then one of their colours -> its letter."""
    out = []
    for _ in range(n):
        options, _ = mc_options(world, rng, rng.choice(world.entities), n_options, in_order=True, p_modifier=0.0)
        colour = rng.choice([o for _, o in options])
        letter = next(L for L, o in options if o == colour)
        prompt = mc_prompt(world.relation, rng.choice(world.entities), options).removesuffix("Answer:") + colour
        out.append(EvalItem(prompt, letter, [L for L, _ in options]))
    return out


def knowledge_eval_items(world: World, rng: random.Random, n: int) -> list[EvalItem]:
    ents = [rng.choice(world.entities) for _ in range(n)]
    return [EvalItem(knowledge_prompt(world.relation, e), world.facts[e], list(world.attributes)) for e in ents]
