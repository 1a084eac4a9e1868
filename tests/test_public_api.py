"""The package façade: `toolkit.__all__` is exact, and every error class is exported."""

from __future__ import annotations

import inspect

import toolkit
from toolkit import errors


def test_all_names_exist_and_are_sorted() -> None:
    assert all(hasattr(toolkit, name) for name in toolkit.__all__)
    assert list(toolkit.__all__) == sorted(toolkit.__all__)


def test_every_error_a_user_catches_is_exported() -> None:
    internal = {"ExpressionSyntaxError", "NoChoiceMatched", "StoreError", "SchemaOutdated"}
    classes = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.ToolkitError)
    }
    missing = sorted(classes - set(toolkit.__all__) - internal)
    assert not missing, f"toolkit.__all__ lacks {missing}"
