"""Issue 7: every Python code block in the docs runs (except those marked `# requires: gpu` / `hub`), and the API
pages name what exists (exports documented, the calls in section headings and table rows resolve, documented
keywords and parameter lists are parameters)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
FENCE = re.compile(r"```python\n(.*?)```", re.S)


def blocks(path: Path) -> list[str]:
    return [b for b in FENCE.findall(path.read_text()) if not re.search(r"#\s*requires:.*\b(gpu|hub)\b", b)]


def test_docs_have_runnable_blocks():
    assert any(blocks(p) for p in DOCS), "no runnable Python blocks found in the docs"


@pytest.mark.parametrize("path", [p for p in DOCS if blocks(p)], ids=lambda p: p.name)
def test_doc_code_blocks_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    namespace: dict = {"__name__": f"doc_{path.stem}"}
    for i, code in enumerate(blocks(path)):
        try:
            exec(compile(code, f"{path.name}[block {i}]", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - shown on failure
            raise AssertionError(f"{path.name} block {i} failed: {type(exc).__name__}: {exc}\n{code}") from exc


# ---- the API pages name what exists -------------------------------------------------------------------------------
# Every export of the public packages is mentioned on an API page; every call written in a section heading or a
# table's first column resolves; every keyword a doc writes into a call to one of our functions is a parameter of
# it; and every `name` a section lists as a parameter (`- `name`: ...`) is a parameter of its heading's call.
API_PAGES = [*sorted((REPO / "docs").glob("api*.md")), REPO / "docs" / "hybrids.md", REPO / "docs" / "tasks.md"]
PUBLIC = ("gather_aggregate", "gather_aggregate.adapters", "gather_aggregate.tasks", "gather_aggregate.viz",
          "gather_aggregate.hybridise")
# where a bare name written in the docs may live (documented module paths resolve on their own)
HOMES = (*PUBLIC, "gather_aggregate.models.loading", "gather_aggregate.zoo", "gather_aggregate.interventions.ablation",
         "gather_aggregate.core.readout", "gather_aggregate.scan.exact", "gather_aggregate.attribution.estimators", "gather_aggregate.scan.patching",
         "gather_aggregate.scan.distributed", "gather_aggregate.studies.ablation_tables", "gather_aggregate.detect.detector",
         "gather_aggregate.core.sharpness", "gather_aggregate.core.results_io", "gather_aggregate.core.errors", "gather_aggregate.report.html",
         "gather_aggregate.studies.claims", "gather_aggregate.tasks.base", "gather_aggregate.tasks.registry",
         "gather_aggregate.tasks.taskfile", "gather_aggregate.adapters.implied", "gather_aggregate.studies.hybrids.choose",
         "gather_aggregate.studies.hybrids.distill", "gather_aggregate.studies.hybrids.graft", "gather_aggregate.studies.hybrids.shipped",
         "gather_aggregate.studies.hybrids.experiment", "gather_aggregate.viz.static", "gather_aggregate.viz.tokens",
         "gather_aggregate.viz.circuit", "gather_aggregate.viz.curves", "gather_aggregate.training.vocab",
         "gather_aggregate.training.quick_eval")
# receivers of documented methods: `model.pattern(...)`, `info.heads_of(...)`
RECEIVERS = {"model": ("HookedModel", "ProtocolMixin"), "info": ("LayerInfo",)}  # classes of gather_aggregate.core.protocol
SPAN = re.compile(r"`([^`\n]+)`")
CALL = re.compile(r"(?:with\s+)?([A-Za-z_][\w.]*)\((.*)\)(?:\s*->.*|:.*)?$")


def _attr_path(obj, names):
    for n in names:
        obj = getattr(obj, n)
    return obj


def _resolve(name: str) -> list:
    """The objects of ours that a documented (possibly dotted) name can mean; empty when none."""
    import importlib

    parts = name.removeprefix("gather_aggregate.").split(".")
    if parts[0] in RECEIVERS and len(parts) <= 2:  # `model.pattern(...)`, or `model(tokens, ...)`: its __call__
        protocol = importlib.import_module("gather_aggregate.core.protocol")
        classes = [getattr(protocol, cls) for cls in RECEIVERS[parts[0]]]
        member = parts[1] if len(parts) == 2 else "__call__"
        return [getattr(c, member) for c in classes if hasattr(c, member)]
    found = []
    for i in range(len(parts), 0, -1):  # a module path, then attributes
        try:
            mod = importlib.import_module(".".join(["gather_aggregate", *parts[:i]]))
        except ImportError:
            continue
        try:
            found.append(_attr_path(mod, parts[i:]))
        except AttributeError:
            pass
        break
    for home in HOMES:
        try:
            found.append(_attr_path(importlib.import_module(home), parts))
        except AttributeError:
            pass
    return found


def _split_args(args: str) -> list[str]:
    depth, cur, out = 0, "", []
    for ch in args:
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [a for a in [*out, cur.strip()] if a]


def _first_cells(path: Path) -> list[str]:
    """What a page documents as calls: each section heading, and the first cell of each table row."""
    lines = path.read_text().splitlines()
    headings = [line for line in lines if line.startswith("#")]
    return headings + [row.split("|")[1] for row in lines if row.startswith("| `")]


PARAM = re.compile(r"- ((?:`[A-Za-z_]\w*`(?:, )?)+):")  # `- `name`: ...` or `- `a`, `b`: ...`


def _parameter_lists(path: Path) -> list[tuple[str, list[str]]]:
    """(heading, the names its section lists as parameters) for every section whose heading names a call."""
    out: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            out.append((line, []))
        elif out and (m := PARAM.match(line)):
            out[-1][1].extend(re.findall(r"`(\w+)`", m.group(1)))
    return [(head, names) for head, names in out if names and any(CALL.match(s) for s in SPAN.findall(head))]


def _fits(func, keywords: list[str], n_positional: int) -> bool:
    """Whether ``func`` accepts ``n_positional`` positional arguments and these keywords."""
    import inspect

    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return True
    kinds = {p.kind for p in params}
    named = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return ((inspect.Parameter.VAR_KEYWORD in kinds or set(keywords) <= named)
            and (inspect.Parameter.VAR_POSITIONAL in kinds or n_positional <= len(positional)))


def test_public_exports_are_documented():
    import importlib

    text = "\n".join(p.read_text() for p in API_PAGES)
    missing = [f"{mod}.{name}" for mod in PUBLIC for name in importlib.import_module(mod).__all__
               if not name.startswith("__") and not re.search(rf"\b{re.escape(name)}\b", text)]
    assert not missing, f"exported but on no API page ({', '.join(p.name for p in API_PAGES)}): {missing}"


def test_api_tables_name_what_exists():
    missing = []
    for path in API_PAGES:
        for cell in _first_cells(path):
            for span in SPAN.findall(cell):
                call = CALL.match(span)
                name = call.group(1) if call else span if re.fullmatch(r"(gather_aggregate|viz)(\.\w+)+", span) else None
                if name and not _resolve(name):
                    missing.append(f"{path.name}: {span}")
    assert not missing, f"API tables name calls that do not exist: {missing}"


def test_parameter_lists_name_parameters():
    """An API section lists its call's parameters as `- `name`: ...`; each must be a parameter of the call."""
    import inspect

    wrong, seen = [], 0
    for path in API_PAGES:
        for head, names in _parameter_lists(path):
            funcs = [f for span in SPAN.findall(head) if (call := CALL.match(span))
                     for f in _resolve(call.group(1)) if callable(f)]
            assert funcs, f"{path.name}: {head!r} lists parameters of a call that does not resolve"
            seen += 1
            for name in names:
                if not any(_fits(f, [name], 0) for f in funcs):
                    wrong.append(f"{path.name}: {head.lstrip('# ')} lists `{name}`, not a parameter of "
                                 f"{inspect.signature(funcs[0])}")
    assert seen >= 15 and not wrong, "\n".join(wrong) or f"only {seen} parameter lists found"


def test_documented_keywords_are_parameters():
    import inspect

    wrong = []
    for path in DOCS:
        for span in SPAN.findall(path.read_text()):
            call = CALL.match(span)
            if not call:
                continue
            funcs = [f for f in _resolve(call.group(1)) if callable(f)]
            if not funcs:  # not ours (math, builtins, a local variable)
                continue
            keywords, n_positional, after_star = [], 0, False
            for a in _split_args(call.group(2)):
                named = re.match(r"([A-Za-z_]\w*)\s*=(?!=)", a)
                if a == "*":
                    after_star = True
                elif named or (after_star and a.isidentifier()):  # `x=1`, or `x` after `*`
                    keywords.append(named.group(1) if named else a)
                elif a not in ("...", "/") and not a.startswith("**"):
                    n_positional += 1
            if not any(_fits(f, keywords, n_positional) for f in funcs):
                wrong.append(f"{path.name}: `{span}` vs {call.group(1)}{inspect.signature(funcs[0])}")
    assert not wrong, "documented calls that the code would refuse:\n" + "\n".join(wrong)


def test_files_the_docs_name_exist():
    # `adapters/model.py`, `families/bamba.py`, `scripts/hybrid_figure.py`, [links](tasks.md): a renamed or removed
    # file is caught (a name may be written relative to any folder, so it only has to end a tracked path)
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    if not tracked:  # not a git checkout (an sdist): nothing to compare with
        pytest.skip("no git checkout")
    missing = []
    for path in DOCS:
        text = path.read_text()
        for span in SPAN.findall(text):
            for name in re.findall(r"[\w./-]+\.(?:py|md|ipynb|sh)\b", span):
                name = name.removeprefix("./").replace("gather_aggregate/adapters/", "adapters/")
                if "{" not in span and not any(f == name or f.endswith("/" + name) for f in tracked):
                    missing.append(f"{path.name}: {name}")
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)", text):
            if not re.match(r"[a-z]+:", target) and not (path.parent / target).exists():
                missing.append(f"{path.name}: link {target}")
    assert not missing, f"the docs name files that do not exist: {missing}"


def test_cli_lines_in_the_docs_use_real_subcommands_and_options():
    import argparse

    from gather_aggregate.cli.parser import build_parser

    def options(p: argparse.ArgumentParser) -> set[str]:
        found = {o for a in p._actions for o in a.option_strings}
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):  # zoo list / zoo train
                for q in a.choices.values():
                    found |= options(q)
        return found

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    wrong, seen = [], 0
    for path in DOCS:
        text = path.read_text()
        code = [*re.findall(r"```bash\n(.*?)```", text, re.S), *SPAN.findall(text)]
        for snippet in code:
            for m in re.finditer(r"gather-aggregate\s+([a-z][\w-]*)([^\n|]*)", snippet.replace("\\\n", " ")):
                seen += 1
                cmd, rest = m.groups()
                if cmd not in sub:
                    wrong.append(f"{path.name}: no subcommand {cmd!r}")
                    continue
                wrong += [f"{path.name}: `gather-aggregate {cmd}` has no {flag}"
                          for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest) if flag not in options(sub[cmd])]
    assert seen > 10 and not wrong, wrong


def _module_path_resolves(ref: str) -> bool:
    """``gather_aggregate.a.b.c``: the longest importable module prefix, then attributes."""
    import importlib

    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as exc:
            if exc.name and not exc.name.startswith("gather_aggregate"):
                return True  # an optional extra that is not installed here: nothing to check against
            continue
        try:
            _attr_path(obj, parts[i:])
            return True
        except AttributeError:
            return False
    return False


def test_module_paths_in_the_docs_resolve():
    refs = {(path.name, ref) for path in DOCS for span in SPAN.findall(path.read_text())
            for ref in re.findall(r"\bgather_aggregate(?:\.\w+)+", span)}
    missing = sorted(f"{name}: {ref}" for name, ref in refs if not _module_path_resolves(ref))
    assert len(refs) > 30 and not missing, f"the docs name modules or attributes that do not exist: {missing}"


def test_commands_the_docs_name_answer_help(tmp_path):
    """Every `python -m gather_aggregate.X` and `scripts/X.py` in the docs prints its usage on `--help` and writes
    nothing: `hybridise.shipped --help` was a traceback, `scripts/hybrid_figure.py --help` wrote a PNG named
    '--help', `scripts/report_screenshots.py --help` an IndexError."""
    import subprocess
    import sys

    text = "\n".join(p.read_text() for p in DOCS)
    modules = sorted(set(re.findall(r"python3? -m (gather_aggregate(?:\.\w+)*)", text)))
    scripts = sorted(set(re.findall(r"\b(scripts/\w+\.py)\b", text)))
    assert len(modules) >= 5 and len(scripts) >= 2, (modules, scripts)
    cmds = [["-m", m] for m in modules] + [[str(REPO / s)] for s in scripts]
    runs = [subprocess.Popen([sys.executable, *cmd, "--help"], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
            for cmd in cmds]  # side by side: most of the time is each one's torch import
    failed = []
    for cmd, run in zip(cmds, runs):
        out, err = run.communicate(timeout=300)
        if run.returncode != 0 or "usage" not in out.lower():
            failed.append(f"{' '.join(cmd)} --help: exit {run.returncode}, {err.strip()[-200:]!r}")
    written = [p.name for p in tmp_path.iterdir()]
    assert not failed and not written, "\n".join([*failed, f"--help wrote {written}"])


def test_the_docs_state_the_present_within_their_sizes():
    """The current tables, not the history (issue 38): the README under 200 lines, docs/benchmarks.md and
    docs/results.md under 600 each (history stays in git)."""
    limits = {"README.md": 200, "docs/benchmarks.md": 600, "docs/results.md": 600}
    sizes = {f: len((REPO / f).read_text(encoding="utf-8").splitlines()) for f in limits}
    assert {f: n for f, n in sizes.items() if n >= limits[f]} == {}
