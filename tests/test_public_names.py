"""The public import paths users write keep working after the move into layer packages (issue 38).

Each package's ``__init__`` and each top-level facade maps its public names lazily to their homes; a name
imported from its public path is the very object of its home module, and importing a facade stays cheap.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

#: public path -> names users import from it (README, docs, notebooks and the modules' docstrings)
PUBLIC: dict[str, tuple[str, ...]] = {
    "gather_aggregate": ("load_model", "from_hf_model", "supported_model_types", "LayerInfo", "HookedModel",
                         "ReadoutMetric"),
    "gather_aggregate.scan": ("exact_scan", "naive_scan", "atp_scan", "exact_scan_ray", "ScanResult",
                              "compare_rankings", "patch_heads", "model_fingerprint", "task_fingerprint"),
    "gather_aggregate.detect": ("find_ga_heads", "pattern_scores", "GAHeads", "aggregate_reading", "gather_reading"),
    "gather_aggregate.attribution": ("attribution_scan", "ESTIMATORS", "CORESET_ESTIMATORS"),
    "gather_aggregate.interventions": ("ablate", "ablation_hooks", "make_replacement", "run_ablated", "Replacement",
                                       "Edit", "edit_hook", "heads_except", "resample_hooks", "head_outputs"),
    "gather_aggregate.tasks": ("task_metric", "evaluate", "word_level_tokenizer"),
    "gather_aggregate.viz": ("attention_heads", "head_score_heatmaps", "sharp_vs_smooth", "cumulative_ablation_curve"),
    "gather_aggregate.claims": ("measure_model", "task_sets", "TASKS", "to_markdown"),
    "gather_aggregate.experiments": ("remove_only", "keep_only", "cumulative_ablation", "layer_pruning",
                                     "ablation_sweep"),
    "gather_aggregate.metrics": ("row_entropy", "top1_mass", "sharpness_index", "normalize_rows"),
    "gather_aggregate.errors": ("GAError", "InputError", "ModelLoadError", "CheckpointError", "NonFiniteError",
                                "ResumeMismatchError", "ClusterUnreachableError", "MemoryBudgetError",
                                "ProvenanceError", "GAWarning", "warn"),
    "gather_aggregate.protocol": ("Head", "HookedModel", "LayerInfo", "LayerKind", "ProtocolMixin"),
    "gather_aggregate.hybridise": ("hybridise", "HookedHeadHybrid", "HeadHybridConfig", "cache_bytes",
                                   "memory_table", "distill", "choose_heads"),
    "gather_aggregate.report": ("write_report", "render_report", "Table", "Figure", "Markdown", "KeyValues"),
    "gather_aggregate.testing": ("tiny_llama", "tiny_gpt2", "save_model_dir", "bpe_tokenizer"),
    "gather_aggregate.cli": ("main", "build_parser"),
    "gather_aggregate.adapters": ("SSM_MODEL_TYPES", "HYBRID_MODEL_TYPES", "load_ssm"),
}
CASES = [(path, name) for path, names in PUBLIC.items() for name in names]


@pytest.mark.parametrize(("path", "name"), CASES, ids=[f"{p}.{n}" for p, n in CASES])
def test_public_name_imports_from_its_public_path_and_is_its_homes_object(path, name):
    module = importlib.import_module(path)
    value = getattr(module, name)
    home = getattr(value, "__module__", None)
    if isinstance(home, str) and home.startswith("gather_aggregate") and home != path:
        assert getattr(importlib.import_module(home), name) is value
    assert name in dir(module)


def test_every_facade_entry_resolves():
    """Every ``_LAZY`` table in the package names a module that defines (or re-exports) the name."""
    from test_architecture import LAZY

    missing = [f"{facade}.{name} -> {module}" for facade, table in LAZY.items() for name, module in table.items()
               if not hasattr(importlib.import_module(module), name)]
    assert missing == []


@pytest.mark.parametrize("path", list(PUBLIC))
def test_facades_import_nothing_heavy(path):
    """``import gather_aggregate.scan`` (and every facade) stays free of transformers and TransformerLens, and of
    torch too except ``tasks`` (its prompt classes hold token tensors)."""
    heavy = ("transformers", "transformer_lens") + (() if path == "gather_aggregate.tasks" else ("torch",))
    code = f"import sys, {path}; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
