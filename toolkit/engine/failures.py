"""Errors as data: the JSON form of an error a handler raised or the engine decided.

A task's error, an effect's failed evidence and a caught error are all this form:
``{"name", "message", ...}``, where ``name`` is what ``retry`` and ``catch`` rules match.
"""

from __future__ import annotations

from typing import Any

#: Most characters of an error message stored with a task or its evidence.
MAX_ERROR_MESSAGE = 4000
#: Error names never retried: a budget does not grow by calling again, nor do arguments a
#: handler cannot take start to fit.
NEVER_RETRIED = frozenset({"BudgetExceeded", "HandlerArgumentsMismatch"})

Error = dict[str, Any]


def error_data(exc: BaseException) -> Error:
    """The JSON form of an error raised by a handler or the engine.

    The name is the exception's ``error_name`` attribute when it has one, else its class
    name; it is what ``retry.non_retryable`` and ``catch`` rules match.
    """
    name = getattr(exc, "error_name", None) or type(exc).__name__
    return {
        "name": storable_text(str(name), 200),
        "message": storable_text(str(exc) or type(exc).__name__),
    }


def storable_text(text: str, limit: int = MAX_ERROR_MESSAGE) -> str:
    """``text`` as PostgreSQL can store it in JSON: no NUL, valid Unicode, at most ``limit``.

    NUL characters become a backslash and ``0``, unpaired surrogates ``?``; a longer text is
    cut and marked with ``...``.
    """
    text = text.replace("\x00", "\\0").encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 3] + "..."
