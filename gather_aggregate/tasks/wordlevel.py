"""A word-level tokenizer for the task formats (tests, toy models).

``tokenizers`` ``WordLevel`` model wrapped in ``PreTrainedTokenizerFast``
(so ``return_offsets_mapping`` works): spaces are dropped, and ``\\n`` and the
punctuation of the formats (``: . ? ' ,``) are tokens of their own::

    "apple:12\\n" -> ["apple", ":", "12", "\\n"]
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

SPLIT_RE = re.compile(r"\n|[:.?',]|[^\s:.?',]+")
PAD, EOS, UNK, BOS = "<pad>", "<eos>", "<unk>", "<bos>"


def split_words(text: str) -> list[str]:
    """The tokenizer's pre-tokenisation in pure Python."""
    return SPLIT_RE.findall(text)


def word_level_tokenizer(texts: Iterable[str], *, add_bos: bool = False) -> Any:
    """A word-level ``PreTrainedTokenizerFast`` whose vocabulary is every word of ``texts``.

    ``add_bos=True`` prepends ``<bos>`` to every encoding (like Llama
    tokenizers), which shifts every position by one.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for w in [PAD, EOS, UNK, BOS]:
        vocab[w] = len(vocab)
    for text in texts:
        for w in split_words(text):
            vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[ \t]+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"\n|[:.?',]"), behavior="isolated"),
    ])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    extra = {}
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
        extra["bos_token"] = BOS
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                   clean_up_tokenization_spaces=False, **extra)
