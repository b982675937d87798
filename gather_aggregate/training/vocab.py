"""The zoo's word-level world: vocabulary, synthetic facts and the tokenizer.

Every zoo model shares one small world so that comparisons are fair:

* **function words** of the evaluation formats (``Memorize the following
  dictionary : \\n The value of the key ' is Question What ? . Answer``);
* **letters** ``A``..``E`` for multiple-choice options;
* **entities** (made-up names) and **attributes** (colours) with one fixed fact
  ``entity -> attribute`` per entity (the knowledge the models memorise);
* **modifiers** (``light``, ``dark``, ...) that lengthen options, and **filler**
  words for variable-length prefixes;
* **keys** (made-up words) and **values** (numbers) for KV-retrieval.

The tokenizer is a ``tokenizers`` ``WordLevel`` model: spaces are dropped and
``\\n : . ? '`` are split off as tokens of their own, so

``"Memorize the following dictionary:\\nbado:117\\n"`` ->
``Memorize the following dictionary : \\n bado : 117 \\n``.

:func:`split_words` is the same split in pure Python; the training data is
encoded with it (fast), and a test checks it against the real tokenizer.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gather_aggregate.tasks.facts import distinct_draws

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL = [PAD, EOS, UNK]

FUNCTION_WORDS = [
    "\n", ":", ".", "?", "'",
    "Memorize", "the", "following", "dictionary", "The", "value", "of", "key", "is",
    "Question", "What", "Answer", "color",
]
LETTERS = ["A", "B", "C", "D", "E"]
ATTRIBUTES = [
    "red", "blue", "green", "yellow", "orange", "purple", "pink", "brown",
    "black", "white", "gray", "gold", "silver", "teal", "cyan", "maroon",
]
MODIFIERS = ["light", "dark", "pale", "deep", "bright", "soft"]
FILLER = ["now", "then", "ok", "so", "well", "please", "here", "next"]
RELATION = "color"

# One regex is the whole pre-tokenizer: a newline, one punctuation mark, or a run of other non-space characters.
WORD_RE = re.compile(r"\n|[:.?']|[^\s:.?']+")


def split_words(text: str) -> list[str]:
    """Split ``text`` exactly like the zoo tokenizer's pre-tokenizer (spaces dropped)."""
    return WORD_RE.findall(text)


def _made_up_words(rng: random.Random, n: int, pattern: str, exclude: set[str]) -> list[str]:
    """``n`` distinct pronounceable words following ``pattern`` (``c`` consonant, ``v`` vowel)."""
    cons, vows = "bdfgklmnprstvz", "aeiou"
    return distinct_draws(lambda: "".join(rng.choice(cons if ch == "c" else vows) for ch in pattern), n, exclude)


@dataclass
class World:
    """The shared vocabulary and the memorised facts of one zoo."""

    entities: list[str]
    attributes: list[str]
    facts: dict[str, str]
    kv_keys: list[str]
    kv_values: list[str]
    relation: str = RELATION
    letters: list[str] = field(default_factory=lambda: list(LETTERS))
    modifiers: list[str] = field(default_factory=lambda: list(MODIFIERS))
    filler: list[str] = field(default_factory=lambda: list(FILLER))

    @property
    def words(self) -> list[str]:
        """Every token of the vocabulary, specials first, in a fixed order."""
        seq = (SPECIAL + FUNCTION_WORDS + self.letters + self.attributes + self.modifiers + self.filler
               + self.entities + self.kv_keys + self.kv_values)
        seen: set[str] = set()
        out = []
        for w in seq:
            if w not in seen:
                seen.add(w)
                out.append(w)
        return out

    def vocab(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words)}

    def facts_json(self) -> dict[str, Any]:
        return {"relation": self.relation, "entities": self.entities, "attributes": self.attributes,
                "facts": self.facts}


def make_world(seed: int = 0, n_entities: int = 64, n_keys: int = 128, n_values: int = 128) -> World:
    """Build the world deterministically from ``seed``.

    Each attribute is held by ``n_entities / len(ATTRIBUTES)`` entities (balanced),
    so a model cannot win knowledge queries by always guessing one colour.
    """
    rng = random.Random(seed)
    reserved = set(FUNCTION_WORDS + LETTERS + ATTRIBUTES + MODIFIERS + FILLER)
    entities = _made_up_words(rng, n_entities, "cvcvc", reserved)
    keys = _made_up_words(rng, n_keys, "cvcv", reserved | set(entities))
    values = [str(100 + i) for i in range(n_values)]
    attrs = [ATTRIBUTES[i % len(ATTRIBUTES)] for i in range(n_entities)]
    rng.shuffle(attrs)
    facts = dict(zip(entities, attrs))
    return World(entities=entities, attributes=list(ATTRIBUTES), facts=facts, kv_keys=keys, kv_values=values)


def build_tokenizer(world: World) -> Any:
    """A ``PreTrainedTokenizerFast`` over the world's words (WordLevel, no BOS, spaces dropped)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=world.vocab(), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[ \t]+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"\n|[:.?']"), behavior="isolated"),
    ])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                   clean_up_tokenization_spaces=False)


def save_world(world: World, tokenizer: Any, directory: str | Path, kv_sizes: list[int]) -> None:
    """Write the tokenizer, ``facts.json`` and ``zoo_tasks.json`` into a model directory."""
    import json

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(d)
    (d / "facts.json").write_text(json.dumps(world.facts_json(), indent=1))
    tasks = {"kv_keys": world.kv_keys, "kv_values": world.kv_values, "kv_dict_sizes_trained": kv_sizes,
             "letters": world.letters, "modifiers": world.modifiers, "filler": world.filler}
    (d / "zoo_tasks.json").write_text(json.dumps(tasks, indent=1))
