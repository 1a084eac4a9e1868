"""A definition's input schema: defaults applied, errors located, no remote references."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.workflows import CORPUS, MINIMAL, faults_of
from toolkit.definition import load_definition, parse_definition
from toolkit.errors import InputError


def test_validate_input_applies_nested_defaults() -> None:
    d = load_definition(CORPUS / "valid" / "input-defaults.yaml")
    value = {"customer": {"id": "c1"}, "options": {"channel": "sms"}}
    result = d.validate_input(value)
    assert result == {
        "customer": {"id": "c1"},
        "priority": 5,
        "options": {"channel": "sms", "notify": True},
    }
    assert value == {"customer": {"id": "c1"}, "options": {"channel": "sms"}}  # not modified
    assert d.validate_input({"customer": {"id": "c1"}})["options"] == {
        "notify": True,
        "channel": "email",
    }


@pytest.mark.parametrize(
    ("value", "path", "fragment"),
    [
        ({}, "$", 'missing required field "customer"'),
        ({"customer": {"id": 5}}, "$.customer.id", "expected string, got integer 5"),
        ({"customer": {"id": None}}, "$.customer.id", "expected string, got null"),
        ({"customer": {"id": "c"}, "priority": -1}, "$.priority", "less than the minimum"),
        ({"customer": {"id": "c"}, "options": {"channel": "fax"}}, "$.options.channel", '"fax"'),
        ("text", "$", 'expected object, got string "text"'),
    ],
)
def test_validate_input_errors(value: Any, path: str, fragment: str) -> None:
    d = load_definition(CORPUS / "valid" / "input-defaults.yaml")
    with pytest.raises(InputError) as caught:
        d.validate_input(value)
    assert caught.value.path == path
    assert fragment in str(caught.value)
    assert path in str(caught.value)


def test_input_schema_absent_or_boolean() -> None:
    assert parse_definition(MINIMAL).validate_input({"anything": [1]}) == {"anything": [1]}
    closed = parse_definition(MINIMAL + "input: false\n")
    with pytest.raises(InputError):
        closed.validate_input({})
    assert parse_definition(MINIMAL + "input: true\n").validate_input(3) == 3


def test_input_schema_never_fetches_remote_references() -> None:
    faults = faults_of(MINIMAL + "input: {$ref: 'https://example.com/schema.json'}\n")
    assert faults[0].path == "$.input['$ref']"
    assert "cannot resolve $ref" in faults[0].message
    d = parse_definition(
        MINIMAL + "input: {$ref: 'https://json-schema.org/draft/2020-12/schema'}\n"
    )
    assert d.validate_input({"type": "object"}) == {"type": "object"}
    with pytest.raises(InputError):
        d.validate_input({"type": 5})


def test_every_fault_of_an_input_is_listed_the_most_relevant_first() -> None:
    """Issue 24, item 13: ``submit`` reported only the first fault; fixing one at a time
    took as many submits as there were faults."""
    d = load_definition(CORPUS / "valid" / "input-defaults.yaml")
    value = {"priority": -1, "options": {"channel": "fax"}}
    with pytest.raises(InputError) as caught:
        d.validate_input(value)
    lines = str(caught.value).splitlines()
    assert len(lines) == 3, lines
    assert all(line.startswith("invalid input for input-defaults v1: $") for line in lines), lines
    joined = "\n".join(lines)
    assert 'missing required field "customer"' in joined
    assert "$.priority" in joined and "$.options.channel" in joined
    assert caught.value.path == "$" and ': $: missing required field "customer"' in lines[0]
