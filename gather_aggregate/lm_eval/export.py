"""lm-eval task folders in a model's own vocabulary: YAMLs over local JSON files, offline by design.

``export_tasks(model_dir, out)`` writes, from this project's tasks (so the
prompts are exactly the ones :func:`~gather_aggregate.tasks.evaluate` scores):

=====================  ================  =====================================================
task                   output type       prompts
=====================  ================  =====================================================
``ga_mmlu_letter``     multiple_choice   MMLU format (``cais/mmlu`` columns ``question``,
                                         ``choices``, ``answer``, ``subject``) built from the
                                         model's ``facts.json``; scored on `` A``..`` D``
``ga_mmlu_content``    multiple_choice   the same questions scored on the option texts
``ga_kv``              multiple_choice   the paper's KV retrieval; candidates = the values
``ga_kv_gen``          generate_until    the same prompts, greedy answer, first word exact match
``ga_knowledge``       multiple_choice   ``The color of <entity> is`` over every attribute
``ga_facts_ppl``       loglikelihood_    the facts as sentences (perplexity)
                       rolling
``ga_mmlu_sample``     multiple_choice   the shipped real-MMLU sample in lm-eval's MMLU
                                         template (on the zoo it is mostly ``<unk>``)
=====================  ================  =====================================================

Each JSON is read by ``utils.load`` (a ``custom_dataset`` next to the YAMLs),
so the folder works from any working directory: ``--include_path FOLDER``.
Without facts.json only the KV tasks are written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gather_aggregate.core.results_io import atomic_write_text

UTILS_PY = '''"""Loader for the JSON files beside these task YAMLs (written by gather_aggregate.lm_eval.export)."""

import json
from pathlib import Path


def load(file=None, **kwargs):
    import datasets

    rows = json.loads((Path(__file__).resolve().parent / file).read_text(encoding="utf-8"))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
'''

_COMMON = """custom_dataset: !function utils.load
dataset_kwargs:
  file: {file}
test_split: test
"""

_MC = _COMMON + """task: {task}
output_type: multiple_choice
doc_to_text: "{text}"
doc_to_choice: {choice}
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

_GEN = _COMMON + """task: {task}
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{choices[answer]}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 4
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: false
filter_list:
  - name: first_word
    filter:
      - function: regex
        regex_pattern: '(\\S+)'
      - function: take_first
metadata:
  version: 1.0
"""

_ROLLING = _COMMON + """task: {task}
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
"""


def _yaml_text(s: str) -> str:
    """A Python string as the inside of a double-quoted YAML scalar."""
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def mmlu_template(letters: str, n_options: int, *, description: str = "", prefix: str = "Question: ") -> str:
    """Jinja ``doc_to_text`` of an MMLU-format task: ``{prefix}{question}\\nA. ..\\n..Answer:``."""
    lines = "".join(f"{L}. {{{{choices[{i}]}}}}\n" for i, L in enumerate(letters[:n_options]))
    return f"{description}{prefix}{{{{question.strip()}}}}\n{lines}Answer:"


def mmlu_rows_from_facts(model_dir: str | os.PathLike[str], n: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """Facts questions as ``cais/mmlu`` rows (``question``, ``choices``, ``answer``, ``subject``) plus the prompt."""
    from gather_aggregate.tasks.registry import get_task

    task = get_task("letter-mc", model_dir=model_dir)
    rows = []
    for spec in task.specs(n, seed=seed):
        first = spec.prompt.split("\n", 1)[0]
        rows.append({"question": first[len("Question: "):], "choices": list(spec.meta["options"]),
                     "answer": int(spec.answer), "subject": spec.meta["relation"], "prompt": spec.prompt})
    return rows


def export_tasks(model_dir: str | os.PathLike[str], out: str | os.PathLike[str], *, n: int = 64,
                 seed: int = 0, mmlu_sample: bool = True) -> list[str]:
    """Write the task folder for ``model_dir`` into ``out``; returns the task names written."""
    from gather_aggregate.tasks.registry import get_task

    model_dir, out = Path(model_dir), Path(out)
    written: list[str] = []

    def put(name: str, rows: list[dict[str, Any]], yaml_text: str) -> None:
        atomic_write_text(out / f"{name}.json", json.dumps(rows, indent=1) + "\n")
        atomic_write_text(out / f"{name}.yaml", yaml_text)
        written.append(name)

    atomic_write_text(out / "utils.py", UTILS_PY)
    kv = get_task("kv", model_dir=model_dir)
    kv_rows = [{"prompt": s.prompt, "choices": list(s.candidates), "answer": int(s.answer)}
               for s in kv.specs(n, seed=seed)]
    put("ga_kv", kv_rows, _MC.format(task="ga_kv", file="ga_kv.json", text="{{prompt}}", choice="\"{{choices}}\""))
    atomic_write_text(out / "ga_kv_gen.yaml", _GEN.format(task="ga_kv_gen", file="ga_kv.json"))
    written.append("ga_kv_gen")
    if (model_dir / "facts.json").is_file():
        letter = get_task("letter-mc", model_dir=model_dir)
        letters = str(letter.letters)
        rows = mmlu_rows_from_facts(model_dir, n, seed)
        text = _yaml_text(mmlu_template(letters, letter.n_options))
        put("ga_mmlu_letter", rows, _MC.format(task="ga_mmlu_letter", file="ga_mmlu_letter.json", text=text,
                                              choice=json.dumps(list(letters[: letter.n_options]))))
        atomic_write_text(out / "ga_mmlu_content.yaml", _MC.format(
            task="ga_mmlu_content", file="ga_mmlu_letter.json", text=text, choice="\"{{choices}}\""))
        written.append("ga_mmlu_content")
        know = get_task("knowledge", model_dir=model_dir)
        k_rows = [{"prompt": s.prompt, "choices": list(s.candidates), "answer": int(s.answer)}
                  for s in know.specs(n, seed=seed)]
        put("ga_knowledge", k_rows, _MC.format(task="ga_knowledge", file="ga_knowledge.json", text="{{prompt}}",
                                               choice="\"{{choices}}\""))
        p_rows = [{"text": f"{s.prompt} {s.candidates[s.answer]}"} for s in know.specs(min(n, 32), seed=seed)]
        put("ga_facts_ppl", p_rows, _ROLLING.format(task="ga_facts_ppl", file="ga_facts_ppl.json"))
    if mmlu_sample:
        from gather_aggregate.tasks.mmlu import load_mmlu

        items = load_mmlu("sample")
        rows = [{"question": it.question, "choices": list(it.choices), "answer": it.answer, "subject": it.subject}
                for it in items if len(it.choices) == 4]
        desc = "The following are multiple choice questions (with answers) about {{subject.replace('_', ' ')}}.\n\n"
        text = _yaml_text(mmlu_template("ABCD", 4, description=desc, prefix=""))
        put("ga_mmlu_sample", rows, _MC.format(task="ga_mmlu_sample", file="ga_mmlu_sample.json", text=text,
                                               choice=json.dumps(list("ABCD"))))
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m gather_aggregate.lm_eval.export",
                                description="write lm-eval task YAMLs + JSON in a model directory's vocabulary")
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from gather_aggregate.zoo import resolve_model_path

    names = export_tasks(resolve_model_path(args.model_dir), args.out, n=args.n, seed=args.seed)
    print(f"wrote {', '.join(names)} -> {args.out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
