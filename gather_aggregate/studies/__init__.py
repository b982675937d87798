"""Studies built from the analyses: the paper's claims and tables, and the hybridisation experiments.

* :mod:`.claims`: the paper's claims measured on a checkpoint; :mod:`.ablation_tables`: cumulative ablation,
  keep-only / remove-only, layer pruning;
* :mod:`.study`: ``Study``, one model × task whose steps (eval, scan, detect, ablate, pattern) hand their results on;
  :mod:`.study_folder`: its folder on disk;
* :mod:`.hybrids`: retrieval-guided hybrids (head choice, MOHAWK distillation, the reverse graft) and their toy sweeps.
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "Study": "gather_aggregate.studies.study",
    "StudyFolder": "gather_aggregate.studies.study_folder",
    "AblationResult": "gather_aggregate.studies.ablation_result",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
