"""What the bad-input tests check of every error the project raises: its message is one line."""

from __future__ import annotations


def one_line(exc: BaseException) -> str:
    """The error's message, asserted to be a single line (trailing whitespace aside)."""
    text = str(exc)
    assert "\n" not in text.strip(), text
    return text
