"""Task prompts and their annotations: spans decode back to their text, seeds reproduce, formats match."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gather_aggregate.core.errors import TaskError
from gather_aggregate.tasks import (
    MQAR,
    FactsTask,
    FactWorld,
    KVRetrieval,
    MMLUTask,
    annotate,
    collate,
    for_model_dir,
    get_task,
    kv_prompt,
    word_level_tokenizer,
)
from gather_aggregate.tasks.wordlevel import split_words

WORLD = FactWorld.random(12, 6, seed=3)


def all_tasks():
    return {
        "kv": KVRetrieval(n_pairs=6),
        "mqar": MQAR(n_pairs=6, n_queries=3),
        "letter": FactsTask(WORLD, "letter"),
        "content": FactsTask(WORLD, "content", n_options=5),
        "knowledge": FactsTask(WORLD, "knowledge"),
        "mmlu": MMLUTask("letter", k_shot=2, source="sample"),
        "mmlu_content": MMLUTask("content", k_shot=1, source="sample"),
    }


@pytest.fixture(scope="module")
def bpe():
    from gather_aggregate.testing.tiny_models import bpe_tokenizer

    return bpe_tokenizer()


@pytest.fixture(scope="module")
def word_tok():
    texts = []
    for task in all_tasks().values():
        n = 8 if isinstance(task, (KVRetrieval, MQAR)) else None  # facts and MMLU: every question
        for s in task.specs(n, seed=0):
            texts += [s.prompt] + [" " + c for c in s.candidates]
    from gather_aggregate.tasks.facts import shipped_words

    texts += [" ".join(map(str, range(100))), " ".join(WORLD.attributes), " ".join(shipped_words("keys"))]
    return word_level_tokenizer(texts), word_level_tokenizer(texts, add_bos=True)


def check_example(ex, tok, exact: bool):
    """Every span decodes back to its text (exactly for BPE, word by word for word-level)."""
    assert ex.input_ids == tok(ex.prompt, add_special_tokens=True)["input_ids"]
    assert ex.query_pos == len(ex.input_ids) - 1
    prev_end = 0
    for seg in ex.segments:
        assert 0 <= seg.start < seg.end <= len(ex.input_ids)
        assert seg.summary == seg.end - 1
        assert seg.start >= prev_end  # segments in order, not overlapping
        prev_end = seg.end
        ids = ex.input_ids[seg.start : seg.end]
        if exact:
            assert tok.decode(ids) == seg.text
        else:
            assert tok.convert_ids_to_tokens(ids) == split_words(seg.text)
        assert seg.text in ex.prompt
    if ex.segments and ex.segments[0].text.endswith("\n"):
        assert all(tok.decode([ex.input_ids[s.summary]]) == "\n" for s in ex.segments)
    for cand, ids in zip(ex.candidates, ex.candidate_ids, strict=True):
        if exact:
            assert tok.decode(ids) == " " + cand
        else:
            assert tok.convert_ids_to_tokens(ids) == split_words(cand)
    assert 0 <= ex.answer < len(ex.candidates)
    if ex.correct >= 0:
        assert ex.candidates[ex.answer] in ex.segments[ex.correct].text


@pytest.mark.parametrize("name", list(all_tasks()))
def test_spans_decode_with_bpe(name, bpe):
    task = all_tasks()[name]
    exs = task.examples(bpe, 6, seed=1)
    for ex in exs:
        check_example(ex, bpe, exact=True)
    if name in ("kv", "content", "mmlu_content"):
        # the point of offset-based spans: keys/values/options of several tokens
        assert any(len(c) > 1 for ex in exs for c in ex.candidate_ids)
        assert any(len(s) > 4 for ex in exs for s in ex.segments)


@pytest.mark.parametrize("name", list(all_tasks()))
@pytest.mark.parametrize("bos", [False, True])
def test_spans_decode_with_word_level(name, bos, word_tok):
    tok = word_tok[int(bos)]
    exs = all_tasks()[name].examples(tok, 6, seed=1)
    for ex in exs:
        check_example(ex, tok, exact=False)
        assert tok.unk_token_id not in ex.input_ids
        if bos:
            assert ex.input_ids[0] == tok.bos_token_id
            if ex.segments:  # positions shift by the BOS token
                plain = all_tasks()[name].examples(word_tok[0], 6, seed=1)[exs.index(ex)]
                assert [s.start - 1 for s in ex.segments] == [s.start for s in plain.segments]
    # single-token candidates with a word-level vocabulary (MMLU options are phrases)
    assert all(ex.single_token for ex in exs) == (name != "mmlu_content")


def test_kv_prompt_format_and_correct_segment(bpe):
    ex = KVRetrieval(n_pairs=4, keys=["alpha", "beta", "gamma", "delta"], values=[10, 20, 30, 40],
                     query_index=2).examples(bpe, 1, seed=0)[0]
    lines = [s.text for s in ex.segments]
    pairs = [tuple(line[:-1].split(":")) for line in lines]
    assert ex.prompt == kv_prompt(pairs, pairs[2][0])
    assert ex.prompt.startswith("Memorize the following dictionary:\n")
    assert ex.prompt.endswith(f"\n\nThe value of the key '{pairs[2][0]}' is")
    assert ex.correct == ex.answer == 2
    assert ex.candidates == [v for _, v in pairs]
    assert ex.segments[ex.correct].label == pairs[2][0]


def test_facts_prompts_exact_strings(bpe):
    w = FactWorld("color", ["Bavo", "Tirek"], ["red", "blue", "green", "gold"], {"Bavo": "green", "Tirek": "red"})
    letter = FactsTask(w, "letter").spec("Bavo", seed=0)
    opts = letter.meta["options"]
    assert letter.prompt == ("Question: What is the color of Bavo?\n"
                             + "".join(f"{L}. {o}\n" for L, o in zip("ABCD", opts, strict=True)) + "Answer:")
    assert opts[letter.answer] == "green" and letter.candidates == list("ABCD")
    know = FactsTask(w, "knowledge").spec("Tirek")
    assert know.prompt == "The color of Tirek is"
    assert know.candidates == w.attributes and know.candidates[know.answer] == "red" and know.correct == -1


def test_facts_letter_and_content_ask_the_same_question(bpe):
    for e in WORLD.entities[:5]:
        a, b = (annotate(FactsTask(WORLD, f, n_options=3, letters="XYZ").spec(e, seed=4), bpe)
                for f in ("letter", "content"))
        assert a.prompt == b.prompt and a.segments == b.segments and a.correct == b.correct == a.answer == b.answer
        assert a.candidates == ["X", "Y", "Z"]
        assert b.candidates == a.meta["options"] and b.candidates[b.answer] == WORLD.facts[e]


def test_mmlu_letter_and_content_from_the_same_item(bpe):
    letter = MMLUTask("letter", source="sample").examples(bpe, 5, seed=2)
    content = MMLUTask("content", source="sample").examples(bpe, 5, seed=2)
    for a, b in zip(letter, content, strict=True):
        assert a.prompt == b.prompt and a.segments == b.segments and a.correct == b.correct
        assert a.candidates == ["A", "B", "C", "D"] and a.answer == b.answer
        assert [s.text for s in b.segments] == [f"{L}. {c}\n" for L, c in zip("ABCD", b.candidates, strict=True)]
    ap = [e for e in content if "Access Point" in e.candidates]
    ex = MMLUTask("content", source="sample", subjects=["computer_security"]).examples(bpe)[0]
    assert ex.candidates[ex.answer] == "Access Point" and "\nB. Access Point\n" in ex.prompt
    assert ap == [] or ap[0].candidates[ap[0].answer] == "Access Point"


def test_mmlu_few_shot_template():
    spec = MMLUTask("letter", k_shot=3, source="sample").specs(1, seed=0)[0]
    blocks = spec.prompt.split("\n\n")
    assert blocks[0].startswith("The following are multiple choice questions (with answers) about ")
    assert len(blocks) == 1 + 3 + 1
    for b in blocks[1:4]:
        assert b.splitlines()[-1] in {"Answer: A", "Answer: B", "Answer: C", "Answer: D"}
        assert [ln[:3] for ln in b.splitlines()[1:5]] == ["A. ", "B. ", "C. ", "D. "]
    assert blocks[-1].endswith("\nAnswer:") and spec.meta["question"] in blocks[-1]
    assert spec.meta["question"] not in "\n\n".join(blocks[1:4])  # never its own few-shot example
    content = MMLUTask("content", k_shot=1, source="sample", description=False).specs(1, seed=0)[0]
    shot = content.prompt.split("\n\n")[0]
    opts = [ln[3:] for ln in shot.splitlines()[1:5]]
    assert shot.splitlines()[-1][len("Answer: "):] in opts


@pytest.mark.parametrize("name", list(all_tasks()))
def test_same_seed_same_prompts(name):
    a = [s.prompt for s in all_tasks()[name].specs(5, seed=11)]
    b = [s.prompt for s in all_tasks()[name].specs(5, seed=11)]
    c = [s.prompt for s in all_tasks()[name].specs(5, seed=12)]
    assert a == b
    assert a != c
    if name in ("kv", "mqar"):  # example i does not depend on how many are drawn
        assert [s.prompt for s in all_tasks()[name].specs(3, seed=11)] == a[:3]


def test_collate_right_pads_and_indexes(bpe):
    exs = KVRetrieval(n_pairs=3).examples(bpe, 2, seed=0) + FactsTask(WORLD, "letter").examples(bpe, 2)
    b = collate(exs, pad_id=bpe.pad_token_id)
    assert b.tokens.shape == (4, max(len(e) for e in exs))
    for i, e in enumerate(exs):
        assert b.tokens[i, : len(e)].tolist() == e.input_ids
        assert (b.tokens[i, len(e):] == bpe.pad_token_id).all()
        assert b.query_pos[i] == e.query_pos
        assert b.correct_summary[i] == e.segments[e.correct].summary
        assert b.seg_mask[i].sum() == len(e.segments)
        assert b.seg_summary[i, : len(e.segments)].tolist() == [s.summary for s in e.segments]
        assert b.cand_ids[i, : len(e.candidates)].tolist() == [c[0] for c in e.candidate_ids]
    assert (b.seg_start[:2, 3:] == -1).all()  # KV has 3 segments, MC 4: padded with -1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    keys=st.lists(st.text(alphabet="abcdefgxyzQ-_ 0123456789é", min_size=1, max_size=9)
                  .map(str.strip).filter(bool), min_size=2, max_size=8, unique=True),
    values=st.lists(st.integers(0, 10**6), min_size=2, max_size=8, unique=True),
    seed=st.integers(0, 1000),
)
def test_random_vocab_spans_decode(bpe, keys, values, seed):
    n = min(len(keys), len(values))
    task = KVRetrieval(n_pairs=n, keys=keys, values=values)
    for ex in task.examples(bpe, 2, seed=seed):
        check_example(ex, bpe, exact=True)
        assert [s.label for s in ex.segments] == [t.split(":")[0] for t in (s.text for s in ex.segments)]


# ----------------------------------------------------------------- bad input
def test_dictionary_larger_than_value_space():
    with pytest.raises(TaskError, match="larger than the value space"):
        KVRetrieval(n_pairs=11, values=range(10))
    with pytest.raises(TaskError, match="value space"):
        MQAR(n_pairs=5, values=["1", "2"])


def test_duplicate_keys_and_values():
    with pytest.raises(TaskError, match="duplicate keys.*'apple'"):
        KVRetrieval(n_pairs=2, keys=["apple", "pear", "apple"])
    with pytest.raises(TaskError, match="duplicate values"):
        KVRetrieval(n_pairs=2, values=[1, 2, 2])
    with pytest.raises(TaskError, match="duplicate"):
        MQAR(n_pairs=2, keys=["a", "a", "b"])
    with pytest.raises(TaskError, match="duplicate entity"):
        FactWorld("color", ["Bo", "Bo"], ["red", "blue"], {"Bo": "red"})


def test_bad_keys_are_explained():
    with pytest.raises(TaskError, match="empty key"):
        KVRetrieval(n_pairs=1, keys=["", "b"])
    with pytest.raises(TaskError, match="':'"):
        KVRetrieval(n_pairs=1, keys=["a:b", "c"])


def test_key_that_tokenises_to_nothing():
    from tokenizers import normalizers

    keys = ["apple", "\u200b", "pear"]
    texts = [s.prompt for s in KVRetrieval(n_pairs=2, keys=["apple", "pear"], values=[1, 2]).specs(4)]
    tok = word_level_tokenizer(texts + ["1 2"])
    tok.backend_tokenizer.normalizer = normalizers.Replace("\u200b", "")  # the tokenizer drops this character
    task = KVRetrieval(n_pairs=3, keys=keys, values=[1, 2, 3])
    with pytest.raises(TaskError, match=r"key '\\u200b' tokenises to nothing"):
        task.examples(tok, 4)


def test_out_of_range_task_parameters():
    with pytest.raises(TaskError, match="n_options=9"):
        FactsTask(WORLD, "letter", n_options=9)
    with pytest.raises(TaskError, match="n_queries=5 > n_pairs=3"):
        MQAR(n_pairs=3, n_queries=5)
    with pytest.raises(TaskError, match="k_shot=40"):
        MMLUTask("letter", k_shot=40, source="sample").specs(1)
    with pytest.raises(TaskError, match="fmt must be"):
        MMLUTask("letters")
    with pytest.raises(TaskError, match="unknown task 'kvv'"):
        get_task("kvv")


# ----------------------------------------------------------------- worlds and model directories
def test_fact_world_round_trip(tmp_path):
    WORLD.save(tmp_path)
    data = json.loads((tmp_path / "facts.json").read_text())
    assert set(data) == {"relation", "entities", "attributes", "facts"}
    back = FactWorld.load(tmp_path)
    assert back == FactWorld.load(tmp_path / "facts.json") == WORLD
    assert len(set(WORLD.entities)) == 12 and all(WORLD.facts[e] in WORLD.attributes for e in WORLD.entities)


@pytest.mark.parametrize("data, match", [
    ({"relation": "color", "entities": ["Bo"], "attributes": ["red", "blue"]}, r"missing the key\(s\) \['facts'\]"),
    ({"relation": "color", "entities": [], "attributes": ["red", "blue"], "facts": {}}, "no entities"),
    ({"relation": "color", "entities": ["Bo"], "attributes": ["red", "blue"], "facts": {"Bo": "pink"}},
     "not listed in 'attributes'"),
    ({"relation": "color", "entities": ["Bo", "Al"], "attributes": ["red", "blue"], "facts": {"Bo": "red"}},
     r"entities without a fact: \['Al'\]"),
])
def test_bad_facts_json(tmp_path, data, match):
    (tmp_path / "facts.json").write_text(json.dumps(data))
    with pytest.raises(TaskError, match=match):
        FactWorld.load(tmp_path)


def test_missing_facts_file(tmp_path):
    with pytest.raises(TaskError, match="no facts file"):
        FactWorld.load(tmp_path)


def test_for_model_dir_uses_shipped_vocabulary(tmp_path):
    WORLD.save(tmp_path)
    keys = [f"kk{i}" for i in range(20)]
    vals = [str(100 + i) for i in range(20)]
    (tmp_path / "zoo_tasks.json").write_text(json.dumps(
        {"kv_keys": keys, "kv_values": vals, "kv_dict_sizes_trained": [4, 8], "letters": list("ABCDE"),
         "mqar": {"n_pairs": 5, "n_queries": 2}}))
    tasks = for_model_dir(tmp_path)
    assert set(tasks) == {"kv", "mqar", "letter-mc", "content-mc", "knowledge"}
    kv = tasks["kv"].specs(3, seed=0)
    assert all(len(s.segments) == 8 for s in kv)
    assert all(set(s.candidates) <= set(vals) and s.meta["key"] in keys for s in kv)
    assert tasks["mqar"].n_pairs == 5 and set(tasks["mqar"].specs(1)[0].candidates) <= set(vals)
    assert tasks["letter-mc"].world == WORLD
    assert get_task("kv", model_dir=tmp_path, n_pairs=3).n_pairs == 3
    # a directory without zoo_tasks.json: defaults; without facts.json: no facts tasks
    (tmp_path / "zoo_tasks.json").unlink()
    (tmp_path / "facts.json").unlink()
    assert set(for_model_dir(tmp_path)) == {"kv", "mqar"}


def test_annotations_that_do_not_survive_the_tokenizer_are_refused():
    """Issue 19: a user's word-level tokenizer that does not know the task's keys (or its line end) must not turn
    them into <unk> silently: the task refuses, naming the token."""
    from gather_aggregate.tasks.kv import KVRetrieval
    from gather_aggregate.training.vocab import build_tokenizer, make_world

    world = make_world(0)
    tok = build_tokenizer(world)
    with pytest.raises(TaskError, match=r"key 'zzqx' tokenises to the unknown token '<unk>'"):
        KVRetrieval(n_pairs=4, keys=["zzqx", *world.kv_keys[:7]], values=world.kv_values,
                    query_index=1).examples(tok, n=1)
    with pytest.raises(TaskError, match=r"value '999999' tokenises to the unknown token"):
        KVRetrieval(n_pairs=8, keys=world.kv_keys, values=["999999", *world.kv_values[:7]]).examples(tok, n=1)
    # a tokenizer without the newline loses every line's summary token
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(w for w in world.words if w != "\n")}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex(r"[ \t]+|[:.?']|\n"), behavior="isolated")
    no_nl = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", pad_token="<pad>")
    with pytest.raises(TaskError, match=r"line end \(the summary token\) '\\n' tokenises to the unknown token"):
        KVRetrieval(n_pairs=4, keys=world.kv_keys, values=world.kv_values).examples(no_nl, n=1)
