"""lm-evaluation-harness integration: the paper's benchmark tables with heads ablated, masked or layers pruned.

lm-eval is an optional extra (``pip install gather-aggregate[lmeval]``).
Importing this package does not import lm-eval; :func:`register` does, and
adds ``gather_aggregate`` to lm-eval's model registry.  lm-eval's own CLI
(``lm_eval`` / ``lm-eval``) has no plugin entry point for models, so use::

    python -m gather_aggregate.lm_eval --model gather_aggregate \\
        --model_args pretrained=DIR,ablate=L16H22;L17H24,method=mean --tasks mmlu

which registers the model and then runs lm-eval's CLI unchanged (every lm-eval
option works), or, from Python, ``import gather_aggregate.lm_eval.model`` before
``lm_eval.simple_evaluate(model="gather_aggregate", ...)``.

Modules: :mod:`.model` (``GatherAggregateLM``), :mod:`.intervention` (what is
ablated / kept / pruned), :mod:`.schedule` (``gather-aggregate lm-eval``: the
head-removal table and chat-vs-completion formats), :mod:`.export` (task YAMLs
and JSON in a model's own vocabulary).
"""

from __future__ import annotations

MODEL_NAME = "gather_aggregate"


def require_lm_eval() -> None:
    """Raise a clear error when lm-eval is not installed."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        from gather_aggregate.core.errors import InputError

        raise InputError("lm-eval is not installed; pip install 'gather-aggregate[lmeval]' "
                         "(or pip install lm-eval==0.4.13)") from None


def register() -> type:
    """Register ``gather_aggregate`` with lm-eval's model registry; returns the model class."""
    require_lm_eval()
    from gather_aggregate.lm_eval.model import GatherAggregateLM

    return GatherAggregateLM
