"""The detector on planted circuits in prompt formats the zoo, the fixtures and the planted matrix never show
(``tests/planted_formats.py``): it names exactly the planted Gather and Aggregate heads, reads the segments where
the planted Gather writes, and refuses what it cannot support with one line naming the fix."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
from planted_formats import Fmt, build, examples, spec_and_truth, world

from gather_aggregate.core import errors
from gather_aggregate.detect.detector import find_ga_heads

#: (format, planted model, the read position ``auto`` must find).  Before the read positions were generalised
#: (a declared summary read as the last token's offset, reads only 0-2 tokens before the end) the four marked
#: ``was: no Gather`` named the Aggregate heads but no Gather head.
CASES = [
    (Fmt("unequal_lengths_multi_token_values", filler=(0, 4), val_len=(1, 3)),
     dict(heads_per_layer=6, depth=3, n_gather=1, n_agg=2, seed=4), "summary"),
    (Fmt("multi_token_keys_and_a_first_word_distractor", key_len=(2, 3), distractor=True),
     dict(heads_per_layer=8, depth=2, n_gather=2, n_agg=2, seed=2), "summary"),
    (Fmt("three_token_separator", sep=["so", "then", "\n"]), dict(seed=1), "summary"),
    (Fmt("no_separator", sep=[], mid=[]), dict(heads_per_layer=6, n_agg=2, keymover=False, seed=5), "summary"),
    (Fmt("summary_declared_at_segment_start", summary="start"), dict(seed=0), "last"),  # was: no Gather
    (Fmt("summary_declared_at_the_key", summary="key", key_len=(1, 2)),
     dict(heads_per_layer=6, depth=3, n_gather=2, n_agg=1, seed=7), "last"),  # was: no Gather
    (Fmt("summary_declared_at_the_value_read_at_the_newline", summary="value_end", sep=["so", "\n"]),
     dict(seed=3), "last"),  # was: no Gather
    (Fmt("read_at_the_value_three_before_the_end", read="value_end", sep=[".", "so", "\n"]),
     dict(heads_per_layer=6, n_gather=2, seed=6), "last-3"),  # was: no Gather
    (Fmt("read_at_the_value_unequal_tails", read="value_end", filler=(0, 3)), dict(seed=8), "first+2"),
    (Fmt("trailing_words_after_the_query", trailing=["is", "the", "value", "now", "please", ":"]),
     dict(heads_per_layer=4, depth=3, seed=9), "summary"),
    (Fmt("thirty_two_segments", n_seg=32), dict(seed=10), "summary"),
    (Fmt("two_segments", n_seg=2), dict(heads_per_layer=6, n_agg=2, seed=11), "summary"),
    (Fmt("bos_token", bos=True), dict(seed=12), "summary"),
    (Fmt("value_before_key", value_first=True, mid=["of"]), dict(seed=13), "summary"),
    (Fmt("mixed_formats_ssm", key_len=(1, 2), val_len=(1, 3), filler=(0, 3), sep=[".", "\n"], distractor=True,
         trailing=["is", "then", ":"], n_seg=10), dict(heads_per_layer=6, n_agg=2, kind="ssm", seed=14), "summary"),
]


@pytest.fixture(scope="module")
def worlds():
    return {False: world(), True: world(bos=True)}


def _planted(worlds, fmt, cfg):
    w, tok = worlds[fmt.bos]
    model, g, a = build(tok, **cfg)
    return model, examples(fmt, model, w, tok), g, a


@pytest.mark.parametrize("fmt,cfg,read", CASES, ids=[c[0].name for c in CASES])
def test_planted_heads_named_in_every_format(worlds, fmt, cfg, read):
    model, ex, g, a = _planted(worlds, fmt, cfg)
    ga = find_ga_heads(model, ex)
    assert ga.margin["margin"] > 0.6, ga.margin  # the planted model retrieves (chance: log #segments below)
    assert (set(ga.gather), set(ga.aggregate)) == (g, a), (ga.gather, ga.aggregate, ga.read_why)
    assert ga.reading["gather"] == read, ga.read_why
    assert sorted(ga.pairs) == sorted((gg, aa) for gg in g for aa in a)


def test_query_position_before_the_prompts_end(worlds):
    """``Example.query_pos`` is honoured when tokens follow it (a hand-built example): the same heads."""
    model, ex, g, a = _planted(worlds, Fmt("base"), dict(seed=0))
    w, tok = worlds[False]
    more = tok(" now then", add_special_tokens=False)["input_ids"]
    ex = [dataclasses.replace(e, prompt=e.prompt + " now then", input_ids=e.input_ids + more) for e in ex]
    ga = find_ga_heads(model, ex)
    assert (set(ga.gather), set(ga.aggregate)) == (g, a)


def test_padding_in_a_batch_changes_nothing(worlds):
    """Prompts of unequal lengths right-padded together give the decisions and numbers of one prompt per batch."""
    from gather_aggregate.detect.rules import decide

    model, ex, g, a = _planted(worlds, Fmt("unequal", filler=(0, 4), val_len=(1, 3)), dict(seed=0))
    one, eight = decide(model, ex, batch_size=1), decide(model, ex, batch_size=8)
    assert (one["gather"], one["aggregate"]) == (eight["gather"], eight["aggregate"]) == (sorted(g), sorted(a))
    assert one["clean"] == pytest.approx(eight["clean"], abs=1e-5)


def test_summary_declared_in_a_task_file_is_read_where_the_model_reads(worlds, tmp_path):
    """A user's task file that declares each segment's summary at its key (as docs/tasks.md's example does) gives
    the examples of the same spec, and the detector reads the segments at their last token, where the Gather
    writes, not at the declared key."""
    from gather_aggregate.tasks.base import annotate
    from gather_aggregate.tasks.taskfile import read_task_file

    w, tok = worlds[False]
    fmt = Fmt("summary_key_file", summary="key")
    specs = [spec_and_truth(fmt, i, w.kv_keys, w.kv_values, w.filler, seed=1)[0] for i in range(8)]
    path = tmp_path / "kv_summary_at_key.jsonl"
    path.write_text("".join(json.dumps({
        "prompt": s.prompt, "correct": s.correct, "candidates": s.candidates, "answer": s.candidates[s.answer],
        "segments": [{"start": cs, "end": ce, "label": lab, "summary": sc}
                     for (cs, ce, lab), sc in zip(s.segments, s.summaries or [])]}) + "\n" for s in specs))
    from_file = read_task_file(path).examples(tok, n=8)
    assert [e.segments for e in from_file] == [annotate(s, tok).segments for s in specs]
    model, ex, g, a = _planted(worlds, fmt, dict(seed=0))
    assert [e.input_ids for e in ex] == [e.input_ids for e in from_file]
    ga = find_ga_heads(model, from_file)
    assert ga.reading["gather"] == "last" and (set(ga.gather), set(ga.aggregate)) == (g, a)


def test_formats_the_detector_cannot_support_are_refused_in_one_line(worlds):
    w, tok = worlds[False]
    model, ex, g, a = _planted(worlds, Fmt("base"), dict(seed=0))
    single = examples(Fmt("single", n_seg=1), model, w, tok)
    with pytest.raises(errors.InputError, match="two or more segments"):
        find_ga_heads(model, single)
    pad = tok.pad_token_id
    shifted = [dataclasses.replace(e, input_ids=[pad] * 3 + e.input_ids, query_pos=e.query_pos + 3, segments=[
        dataclasses.replace(s, start=s.start + 3, end=s.end + 3, summary=s.summary + 3) for s in e.segments])
        for e in ex]
    from gather_aggregate.tasks import evaluate

    for call in (find_ga_heads, evaluate):  # every tool that checks examples against the model (tasks/fit.py)
        with pytest.raises(errors.InputError, match="starts with 3 padding tokens.*unpadded ids"):
            call(model, shifted)
    at_start = examples(Fmt("summary_start", summary="start"), model, w, tok)
    with pytest.raises(errors.InputError, match="summary is the segment's first token.*reading='auto'"):
        find_ga_heads(model, at_start, reading="summary")
    with pytest.raises(errors.InputError, match="reading must be"):
        find_ga_heads(model, ex, reading="last-0")
    with pytest.raises(errors.InputError, match="no segment has a token there"):
        find_ga_heads(model, ex, reading="first+9")
    # segments of one token (the line's newline alone): the Aggregate heads are still named; no Gather can be
    # looked for inside a one-token segment, and the detector says so
    newline_only = [dataclasses.replace(e, segments=[dataclasses.replace(s, start=s.end - 1) for s in e.segments])
                    for e in ex]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ga = find_ga_heads(model, newline_only)
    assert set(ga.aggregate) == a and ga.gather == []
    assert any(issubclass(c.category, errors.GAWarning) and "no Gather head can be looked for" in str(c.message)
               for c in caught)


def test_segments_that_leave_out_their_separator_are_warned_about_and_nothing_is_misnamed(worlds):
    """A user's segments ``k : v`` without the line's ``\\n``, where the model gathers into (and reads) that
    ``\\n``: no head of the segments does the work, so no Gather or Aggregate head is named, and the detector says
    why in one warning naming the fix (zoo ``bamba-ga``/``mamba2-ga`` on such a task file: no Aggregate head;
    ``llama-kvmc``: no Gather head)."""
    model, ex, g, a = _planted(worlds, Fmt("newline_left_out", annotate_sep=False), dict(seed=0))
    assert all(s.end < t.start for e in ex for s, t in zip(e.segments, e.segments[1:]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ga = find_ga_heads(model, ex)
    assert ga.margin["margin"] > 1.0 and ga.gather == [] and ga.aggregate == []  # missed, never misnamed
    assert any(issubclass(c.category, errors.GAWarning) and "let each segment cover its separator" in str(c.message)
               and c.filename == __file__ for c in caught)  # shown at the user's line, not inside the package
