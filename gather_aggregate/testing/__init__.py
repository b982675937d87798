"""Test beds: tiny offline models, random config draws and their checks, real-width checkpoints.

For tests, benchmarks, scripts and the demo; the library itself never imports this package.

* :mod:`.tiny_models` (transformers), :mod:`.tiny_ssm`, :mod:`.tiny_hybrids`, :mod:`.tiny_families`,
  :mod:`.llamba_checkpoints`: tiny random models of every family, and their HF references;
* :mod:`.fuzz`: randomised configs of every family and how each is checked;
* :mod:`.realwidth`: random checkpoints at the published widths; :mod:`.zoo_ablation_check`: per-head zoo checks.
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "bpe_tokenizer": "gather_aggregate.testing.tiny_models",
    "tiny_llama": "gather_aggregate.testing.tiny_models",
    "tiny_gpt2": "gather_aggregate.testing.tiny_models",
    "TINY_FAMILIES": "gather_aggregate.testing.tiny_models",
    "tiny_transformer": "gather_aggregate.testing.tiny_models",
    "hf_output_projection": "gather_aggregate.testing.tiny_models",
    "hf_logits": "gather_aggregate.testing.tiny_models",
    "hf_head_inputs": "gather_aggregate.testing.tiny_models",
    "save_model_dir": "gather_aggregate.testing.tiny_models",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
