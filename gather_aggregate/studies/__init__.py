"""Studies built from the analyses: the paper's claims and tables, and the hybridisation experiments.

* :mod:`.claims`: the paper's claims measured on a checkpoint; :mod:`.ablation_tables`: cumulative ablation,
  keep-only / remove-only, layer pruning;
* :mod:`.hybrids`: retrieval-guided hybrids (head choice, MOHAWK distillation, the reverse graft) and their toy sweeps.
"""
