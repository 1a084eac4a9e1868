"""The corpus of definitions (``tests/corpus/``): every invalid one gives the faults it
expects, every valid one loads, rebuilds from its body and keeps its digest."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest
import yaml

from tests.helpers.workflows import CORPUS, MINIMAL
from toolkit.definition import definition_from_body, load_definition, parse_definition
from toolkit.errors import DefinitionError

VALID = sorted((CORPUS / "valid").glob("*.yaml"))
INVALID = sorted((CORPUS / "invalid").glob("*.yaml"))

# Each invalid corpus file starts with one or more lines
#     # expect: LINE: PATH: FRAGMENT
# mirroring how a fault prints (FILE:LINE: PATH: message) without the file. LINE is the
# 1-based line of the fault in that file, or "-" when the fault has no line; PATH is the
# exact JSON path; FRAGMENT must occur in the message. Every expectation must be met by
# some fault of the file.
EXPECT = re.compile(r"^# expect: (?P<line>\d+|-): (?P<path>\$.*?): (?P<fragment>.+)$")


def expectations(path: pathlib.Path) -> list[tuple[int | None, str, str]]:
    found = []
    for text in path.read_text(encoding="utf-8").splitlines():
        if not text.startswith("#"):
            break
        match = EXPECT.match(text)
        if match:
            line = None if match["line"] == "-" else int(match["line"])
            found.append((line, match["path"], match["fragment"]))
    return found


def test_corpus_is_large_enough() -> None:
    assert len(INVALID) >= 25
    assert len(VALID) >= 5


def test_corpus_covers_composition() -> None:
    composite = ("parallel", "map", "workflow", "budget", "reserve")
    valid = [p for p in VALID if any(word in p.read_text() for word in composite)]
    invalid = [p for p in INVALID if any(word in p.read_text() for word in composite)]
    assert len(valid) >= 3 and len(invalid) >= 12


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_corpus(path: pathlib.Path) -> None:
    expected = expectations(path)
    assert expected, f"{path.name} must start with '# expect: LINE: PATH: FRAGMENT'"
    with pytest.raises(DefinitionError) as caught:
        load_definition(path)
    faults = caught.value.faults
    assert faults
    for line, json_path, fragment in expected:
        assert any(
            f.line == line and f.path == json_path and fragment in f.message for f in faults
        ), f"no fault {line}: {json_path}: {fragment!r} in:\n{caught.value}"
    for fault in faults:
        assert fault.file == str(path)
        assert fault.path.startswith("$")
    assert str(caught.value).splitlines() == [str(f) for f in faults]


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_corpus(path: pathlib.Path) -> None:
    definition = load_definition(path)
    assert definition.source == str(path)
    assert definition.steps[definition.start]
    assert re.fullmatch(r"[0-9a-f]{64}", definition.digest)
    assert definition.key == (definition.name, definition.version, definition.digest)
    # The stored body rebuilds the same definition.
    rebuilt = definition_from_body(json.loads(json.dumps(definition.body)))
    assert rebuilt == definition
    assert rebuilt.digest == definition.digest
    assert rebuilt.steps.keys() == definition.steps.keys()


def reordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_digest_is_stable_under_formatting(path: pathlib.Path) -> None:
    definition = load_definition(path)
    body = reordered(definition.body)
    assert list(body) != list(definition.body)
    variants = [
        yaml.safe_dump(body, default_flow_style=False, sort_keys=False),
        yaml.safe_dump(body, default_flow_style=True, sort_keys=False, width=1000),
        "# a comment\n\n" + yaml.safe_dump(body, sort_keys=True, indent=4),
        json.dumps(body, indent=2),
    ]
    for text in variants:
        assert parse_definition(text).digest == definition.digest


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_digest_changes_with_content(path: pathlib.Path) -> None:
    definition = load_definition(path)
    changed = json.loads(json.dumps(definition.body))
    changed["description"] = changed.get("description", "") + " (changed)"
    assert definition_from_body(changed).digest != definition.digest
    bumped = {**definition.body, "version": definition.version + 1}
    assert definition_from_body(bumped).digest != definition.digest


def test_digest_is_sha256_of_canonical_json() -> None:
    import hashlib

    definition = parse_definition(MINIMAL)
    canonical = json.dumps(
        definition.body, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert definition.digest == hashlib.sha256(canonical.encode()).hexdigest()
