"""Loading definitions from files and folders, and the safe YAML loader: located faults
for unreadable files, invalid and hostile YAML."""

from __future__ import annotations

import pathlib

import pytest

from tests.helpers.workflows import CORPUS, MINIMAL, faults_of
from toolkit.definition import EffectStep, load_definition, load_definitions
from toolkit.errors import DefinitionError


def test_load_definition_missing_or_unreadable(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(DefinitionError) as caught:
        load_definition(missing)
    (fault,) = caught.value.faults
    assert fault.file == str(missing) and fault.line is None
    assert "cannot read the file" in fault.message
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(DefinitionError, match="not valid UTF-8"):
        load_definition(latin)
    with pytest.raises(DefinitionError, match="cannot read the file"):
        load_definition(tmp_path)


def test_load_definitions_from_directories_and_files(tmp_path: pathlib.Path) -> None:
    (tmp_path / "b.yaml").write_text(MINIMAL.replace("demo", "bee"))
    (tmp_path / "a.yml").write_text(MINIMAL.replace("demo", "ant"))
    (tmp_path / "notes.txt").write_text("not a definition")
    extra = tmp_path / "sub" / "c.yaml"
    extra.parent.mkdir()
    extra.write_text(MINIMAL.replace("demo", "cat"))
    loaded = load_definitions([tmp_path, extra, tmp_path / "a.yml"])
    assert [d.name for d in loaded] == ["ant", "bee", "cat"]
    assert load_definitions([]) == []


def test_load_definitions_collects_faults_of_all_files(tmp_path: pathlib.Path) -> None:
    (tmp_path / "1.yaml").write_text(MINIMAL)
    (tmp_path / "2.yaml").write_text(
        "# same name and version\n" + MINIMAL.replace("{}}", "{output: 1}}")
    )
    (tmp_path / "3.yaml").write_text(MINIMAL.replace("version: 1", "version: x"))
    (tmp_path / "4.yaml").write_text("name: [")
    with pytest.raises(DefinitionError) as caught:
        load_definitions([tmp_path, tmp_path / "missing.yaml"])
    by_file = {pathlib.Path(f.file).name: f for f in caught.value.faults}
    assert set(by_file) == {"2.yaml", "3.yaml", "4.yaml", "missing.yaml"}
    duplicate = by_file["2.yaml"]
    assert duplicate.line == 3 and duplicate.path == "$.version"
    assert "demo version 1 is also defined in" in duplicate.message
    assert "1.yaml" in duplicate.message
    assert by_file["4.yaml"].message.startswith("invalid YAML")


def test_yaml_syntax_error_has_the_line() -> None:
    (fault,) = faults_of("name: x\nsteps:\n  a: [1, 2\n  b: 3\n")
    assert fault.path == "$" and fault.line is not None and fault.line >= 3
    assert fault.message.startswith("invalid YAML")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a: 1\n---\nb: 2\n", "expected a single document"),
        ("a: !!python/object:os.system {}\n", "could not determine a constructor"),
        ("a: !!int abc\n", "invalid YAML"),
        ("a: !!binary aGVsbG8=\n", "a value of type bytes is not allowed"),
        ("a: .inf\n", "numbers must be finite"),
        ("a: !!timestamp 2024-01-01\n", "is not allowed"),
        ("a: !!set {x, y}\n", "is not allowed"),
        ("? [1, 2]\n: x\n", "invalid YAML"),
        ("a: &x [*x]\n", "recursive YAML alias"),
        ("\t- x", "invalid YAML"),
        ("a: \x00\n", "invalid YAML"),
        ("[" * 5000, "invalid YAML"),
    ],
)
def test_hostile_yaml_gives_faults(text: str, fragment: str) -> None:
    faults = faults_of(text)
    assert any(fragment in f.message for f in faults), faults


def test_alias_bomb_is_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    (fault,) = faults_of("\n".join(lines) + "\n")
    assert "too large" in fault.message


def test_yaml_1_2_scalars() -> None:
    d = load_definition(CORPUS / "valid" / "yaml-core-scalars.yaml")
    step = d.steps["call"]
    assert isinstance(step, EffectStep)
    assert step.args.render({}) == {
        "country": "NO",
        "answer": "yes",
        "switch": "on",
        "date": "2024-01-31",
        "time": "12:30",
    }
