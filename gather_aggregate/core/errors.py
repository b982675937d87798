"""Exceptions with messages that say what was wrong and how to fix it.

Every error the toolkit raises on bad input is a :class:`GAError` subclass, so a
caller (or the CLI) can catch them as one family and show the one-line message.
Most also subclass the builtin a Python user would expect (``ValueError``,
``IndexError``, ``FileNotFoundError``), so ``except ValueError`` keeps working.
"""

from __future__ import annotations


class GAError(Exception):
    """Base class of every user-facing error of gather-aggregate."""


class ModelLoadError(GAError, OSError):
    """A model could not be located or loaded (offline hub, missing files, ...)."""


class UnsupportedModelError(GAError, ValueError):
    """The checkpoint's ``model_type`` (or layout) is not supported."""


class TokenizerMissingError(GAError, FileNotFoundError):
    """The model directory has no tokenizer files."""


class CheckpointError(GAError, ValueError):
    """A checkpoint has missing, unexpected or mis-shaped tensors."""


class IndexOutOfRangeError(GAError, IndexError):
    """A layer, head, row or position index is outside the model or prompt."""


class ContextLengthError(GAError, ValueError):
    """A prompt is longer than the model's context window."""


class InputError(GAError, ValueError):
    """Malformed input: wrong shape, dtype, device, values or arguments."""


class ProvenanceError(InputError):
    """A result handed from one step to another was made on another model, task, prompt set or seed."""


class MemoryBudgetError(GAError, MemoryError):
    """A computation would need more memory than the allowed budget."""


class TaskError(GAError, ValueError):
    """A task could not be built from the given parameters or data."""


class NonFiniteError(GAError, FloatingPointError):
    """NaN or inf values where finite values are required."""


class ResumeMismatchError(GAError, ValueError):
    """A resume file belongs to a different model, task or configuration."""


class ClusterUnreachableError(GAError, ConnectionError):
    """A distributed job could not reach its cluster (e.g. no Ray head at the given address)."""


class GAWarning(UserWarning):
    """Base class of every warning gather-aggregate emits."""


class UnknownTokenWarning(GAWarning):
    """A task's prompts tokenise to many unknown tokens: the model cannot read them, so its accuracy means little."""


def warn(warning: Warning) -> None:
    """``warnings.warn(warning)`` attributed to the user's line: the first frame outside this package, however many
    of its frames (an entry point's ``@analysis`` wrapper, helpers) lie between, so a notebook shows its own cell."""
    import os
    import sys
    import warnings

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the package, not core/
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame, level = frame.f_back, level + 1
    warnings.warn(warning, stacklevel=level)
