"""Edges of ``session.analysis``: a model that overrides ``train()``, nested calls, and what it may not wrap."""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.core.model_state import analysis, eval_mode


class SwitchedDropout(torch.nn.Module):
    """Keeps its dropout rate outside ``training``: only its ``train()`` override turns it off, as some custom
    attention modules do (``dropout_p`` passed to ``scaled_dot_product_attention``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.dropout_p = 0.5

    def train(self, mode: bool = True) -> SwitchedDropout:
        super().train(mode)
        self.dropout_p = 0.5 if mode else 0.0
        return self


@analysis
def seen(model: torch.nn.Module) -> tuple[float, bool, bool]:
    return model.dropout_p, model.training, model.lin.training


def test_a_model_that_overrides_train_sees_eval_mode_and_gets_its_state_back() -> None:
    model = SwitchedDropout().train()
    assert seen(model) == (0.0, False, False)  # the override ran: no dropout inside the analysis
    assert (model.dropout_p, model.training, model.lin.training) == (0.5, True, True)


def test_nested_analyses_and_an_error_restore_every_flag() -> None:
    model = SwitchedDropout().train()
    model.lin.eval()  # a mixed state: the root trains, one child does not

    @analysis
    def outer(m: torch.nn.Module) -> tuple[float, bool, bool]:
        return seen(m)

    assert outer(model) == (0.0, False, False)
    assert (model.dropout_p, model.training, model.lin.training) == (0.5, True, False)
    with pytest.raises(KeyError), eval_mode(model):
        raise KeyError("boom")
    assert (model.dropout_p, model.training, model.lin.training) == (0.5, True, False)


def test_analysis_refuses_a_generator_whose_body_would_run_outside_its_scope() -> None:
    def rows(model: torch.nn.Module):  # type: ignore[no-untyped-def]
        yield model.training

    with pytest.raises(TypeError, match="generator"):
        analysis(rows)


def test_a_model_that_is_no_module_is_left_alone() -> None:
    assert analysis(lambda m: m)("not a module") == "not a module"


def test_warnings_point_at_the_users_line_through_the_analysis_wrapper() -> None:
    """A warning raised inside an entry point (behind ``@analysis``'s wrapper and the package's helpers) is shown
    at the caller's line: with fixed stack levels the wrapper added today moved it into ``session.py``."""
    import warnings

    from gather_aggregate.core.errors import UnknownTokenWarning
    from gather_aggregate.tasks.unknown import warn_if_unknown

    class Tok:
        unk_token_id = 0

    @analysis
    def entry(model: object) -> float:  # an entry point as the package writes them (this file is not the package)
        return warn_if_unknown("t", [[0, 0, 1]], Tok())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        entry(None)
    (w,) = [c for c in caught if issubclass(c.category, UnknownTokenWarning)]
    assert w.filename == __file__
