"""The errors (``toolkit.errors``): default messages, the fault format, pickling."""

from __future__ import annotations

import pickle

from toolkit.errors import (
    DefinitionError,
    DefinitionFault,
    ExpressionError,
    InputError,
    NoChoiceMatched,
    ToolkitError,
)


def test_fault_format() -> None:
    assert str(DefinitionFault("f.yaml", 3, "$.a", "bad")) == "f.yaml:3: $.a: bad"
    assert str(DefinitionFault("f.yaml", None, "$", "bad")) == "f.yaml: $: bad"
    error = DefinitionError([DefinitionFault("f", 1, "$", "a"), DefinitionFault("f", 2, "$", "b")])
    assert str(error) == "f:1: $: a\nf:2: $: b"
    assert isinstance(error, ToolkitError)
    assert str(DefinitionError([])) == "Invalid workflow definition."


def test_error_defaults_and_pickling() -> None:
    assert str(ToolkitError()) == "Base of every error the toolkit raises on purpose."
    assert str(InputError()) == "Task input does not match the workflow's input schema."
    error = NoChoiceMatched(step="route")
    assert error.step == "route" and "route" in str(error)
    for original in [
        DefinitionError([DefinitionFault("f", 1, "$", "m")]),
        ExpressionError("boom", expression="a.b", step="s", path="$.x"),
        InputError("bad", path="$.a"),
        error,
    ]:
        copy = pickle.loads(pickle.dumps(original))
        assert type(copy) is type(original)
        assert str(copy) == str(original)
        assert copy.__dict__ == original.__dict__
