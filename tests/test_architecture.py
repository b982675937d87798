"""The package's shape, checked from its source: the folders are the layers, imports point one way, no cycle, no
module over 500 lines, no test bed in the library.

Every ``import`` counts: at module level, inside a function (a lazy import is still a dependency) and under
``if TYPE_CHECKING:`` (a type is a dependency too).  A name taken from a lazy facade (``from gather_aggregate
import load_model``) counts as an import of the module its ``_LAZY`` table names.  The layers are the packages
below ``gather_aggregate``, in the order of ``LAYERS`` (and of ``docs/architecture.md``); a module may import its
own layer and the layers before it, never a later one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500

#: The layers, in import order: each is one package below ``gather_aggregate`` (``adapters`` is the top-level
#: folder installed as ``gather_aggregate.adapters``), except the models layer, which holds the shipped zoo too, and
#: the studies layer, which holds the zoo's training.
LAYERS: dict[str, tuple[str, ...]] = {
    "core": ("core",),
    "tasks": ("tasks",),
    "adapters": ("adapters",),
    "models": ("models", "zoo"),
    "interventions": ("interventions",),
    "scan": ("scan",),
    "attribution": ("attribution",),
    "detect": ("detect",),
    "studies": ("studies", "training"),
    "viz": ("viz",),
    "report": ("report",),
    "lm_eval": ("lm_eval",),
    "cli": ("cli",),
    "testing": ("testing",),  # test beds: the library never imports them (below)
}
#: The modules at the top of the package: the package itself and the public paths kept for names users import
#: (``from gather_aggregate.errors import InputError``).  Each is a lazy facade: a ``_LAZY`` table and nothing else.
FACADES = ("gather_aggregate", "gather_aggregate.errors", "gather_aggregate.metrics", "gather_aggregate.protocol",
           "gather_aggregate.claims", "gather_aggregate.experiments", "gather_aggregate.hybridise")
#: Library modules that may import ``testing``: the demo's quickstart builds a tiny random Llama when no zoo is there.
TESTING_IMPORTERS = ("gather_aggregate.cli.demo",)
MAX_TOP_LEVEL_MODULES = 12


def _module_files() -> dict[str, Path]:
    """Importable module name -> file, for ``gather_aggregate/`` and ``adapters/`` (= ``gather_aggregate.adapters``)."""
    out = {}
    for folder, prefix in (("gather_aggregate", ("gather_aggregate",)),
                           ("adapters", ("gather_aggregate", "adapters"))):
        for path in (ROOT / folder).rglob("*.py"):
            parts = prefix + path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _module_files()


def _lazy_table(tree: ast.Module) -> dict[str, str]:
    """A facade's ``_LAZY = {"name": "module", ...}``."""
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "_LAZY" and isinstance(node.value, ast.Dict):
            return {ast.literal_eval(k): ast.literal_eval(v) for k, v in zip(node.value.keys, node.value.values)
                    if k is not None}
    return {}


TREES = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in MODULES.items()}
LAZY = {name: table for name, tree in TREES.items() if (table := _lazy_table(tree))}


def _resolve(package: str, name: str) -> str | None:
    """The project module that ``from package import name`` depends on, if any."""
    if name == "__version__":
        return None  # the package's version string: metadata, not a dependency on the facade
    if f"{package}.{name}" in MODULES:
        return f"{package}.{name}"
    if name in LAZY.get(package, {}):
        return LAZY[package][name]
    return package if package in MODULES else None


def imports_of(module: str) -> set[str]:
    tree, path = TREES[module], MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    deps: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            deps.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                dep = _resolve(base, alias.name)
                if dep is not None:
                    deps.add(dep)
    deps.discard(module)
    return deps


GRAPH = {m: imports_of(m) for m in MODULES}


def layer_of(module: str) -> str | None:
    rel = module.removeprefix("gather_aggregate").lstrip(".")
    if not rel:
        return None  # the lazy facade: its names resolve to their modules
    top = rel.split(".")[0]
    return next((layer for layer, packages in LAYERS.items() if top in packages), None)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or ``None``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_every_module_has_a_layer_or_is_a_top_level_facade():
    assert [m for m in MODULES if m not in FACADES and layer_of(m) is None] == []


def test_the_top_level_holds_only_facades_and_few_of_them():
    top = sorted(p.stem for p in (ROOT / "gather_aggregate").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    assert sorted(m for m in MODULES if MODULES[m].parent == ROOT / "gather_aggregate") == sorted(FACADES)
    for facade in FACADES:  # a docstring, imports of the lazy machinery, the table and its __all__/__getattr__
        assert facade in LAZY, f"{facade} has no _LAZY table"
        defs = [n for n in TREES[facade].body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert defs == [], f"{facade} defines code; it only maps public names to their modules"


def test_the_library_imports_no_facade_and_no_test_bed():
    """Inside the library a name is imported from its home, never through a public facade (that would hide the
    layer it comes from); and ``testing/`` is for tests, benchmarks, scripts and the demo only."""
    library = [m for m in MODULES if m not in FACADES and layer_of(m) != "testing"]
    through_facade = [f"{m} imports {d}" for m in library for d in GRAPH[m] if d in FACADES]
    assert through_facade == []
    beds = [f"{m} imports {d}" for m in library for d in GRAPH[m]
            if layer_of(d) == "testing" and m not in TESTING_IMPORTERS]
    assert beds == []


def test_no_test_bed_outside_testing():
    """Tiny models, config draws and real-width beds live in ``gather_aggregate/testing/`` alone."""
    names = ("testing", "fuzz", "realwidth", "tiny_", "ablation_check")
    stray = [str(p.relative_to(ROOT)) for folder in ("gather_aggregate", "adapters") for p in (ROOT / folder).rglob("*.py")
             if any(n in p.stem for n in names) and "testing" not in p.relative_to(ROOT).parts]
    assert stray == []


def test_no_import_cycle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_imports_point_one_way():
    order = list(LAYERS)
    wrong = [f"{m} ({layer_of(m)}) imports {d} ({layer_of(d)})" for m, deps in sorted(GRAPH.items())
             for d in sorted(deps) if layer_of(m) and layer_of(d)
             and order.index(layer_of(d)) > order.index(layer_of(m))
             and not (m in TESTING_IMPORTERS and layer_of(d) == "testing")]
    assert wrong == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_is_at_most_500_lines(module):
    n = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{MODULES[module].relative_to(ROOT)} has {n} lines; split it (limit {MAX_LINES})"


def test_checker_sees_cycles_and_wrong_directions():
    """The checks above are not vacuous: a planted cycle and an analysis -> CLI import are caught."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert layer_of("gather_aggregate.detect.detector") == "detect"
    assert layer_of("gather_aggregate.cli.commands") == "cli"
    assert layer_of("gather_aggregate.adapters.model") == "adapters"
    assert layer_of("gather_aggregate.zoo") == "models"
    # lazy (function-level) imports and facade names count: the loader is reached through both
    assert "gather_aggregate.adapters.convert" in GRAPH["gather_aggregate.models.loading"]
    assert _resolve("gather_aggregate", "load_model") == "gather_aggregate.models.loading"


def test_one_list_of_model_types_and_the_docs_table_agrees():
    """``load_model``'s SSM/hybrid model types come from one place (the SSM config table and the hybrid family
    table), and docs/api_ssm.md's class table lists exactly those."""
    import re

    from gather_aggregate import adapters
    from gather_aggregate.adapters.config import FAMILY_OF_MODEL_TYPE
    from gather_aggregate.adapters.families import HYBRID_FAMILIES
    from gather_aggregate.models.loading import ssm_model_types

    assert ssm_model_types() == (*FAMILY_OF_MODEL_TYPE, *HYBRID_FAMILIES)
    assert (adapters.SSM_MODEL_TYPES, adapters.HYBRID_MODEL_TYPES) == (tuple(FAMILY_OF_MODEL_TYPE),
                                                                       tuple(HYBRID_FAMILIES))
    rows = [r for r in (ROOT / "docs" / "api_ssm.md").read_text(encoding="utf-8").splitlines()
            if r.startswith("| `Hooked")]
    built_for = [row.split("|")[2] for row in rows]
    assert sorted(t for cell in built_for for t in re.findall(r"`(\w+)`", cell)) == sorted(ssm_model_types())
    for model_type, module in HYBRID_FAMILIES.items():  # every family module exists where the table says
        path = ROOT / "adapters" / "families" / f"{module.rsplit('.', 1)[1]}.py"
        assert path.is_file(), f"{model_type}: {path} is missing"


def test_make_test_lints_and_type_checks_before_the_suite():
    """CI runs ``make test``; its recipe runs ruff and mypy (configured in pyproject.toml) before pytest."""
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = make.split("\ntest: setup\n", 1)[1].split("\n\n", 1)[0].splitlines()
    steps = [line.split("-m ")[1].split()[0] for line in recipe if "-m " in line]
    assert steps == ["ruff", "mypy", "pytest"]
    assert "[tool.mypy]" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
