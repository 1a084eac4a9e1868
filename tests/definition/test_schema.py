"""The JSON Schema of the format: valid itself, closed, one ``$defs`` entry per step kind."""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator

from toolkit.definition import schema_path


def test_schema_has_a_def_per_step_kind() -> None:
    schema = json.loads(schema_path().read_text(encoding="utf-8"))
    refs = [branch["$ref"] for branch in schema["$defs"]["step"]["oneOf"]]
    kinds = ["effect", "choice", "succeed", "fail", "wait", "parallel", "map", "workflow", "set"]
    assert refs == [f"#/$defs/{kind}Step" for kind in kinds]
    for kind in kinds:
        assert schema["$defs"][f"{kind}Step"]["required"][0] == kind
    for kind in ("effect", "wait", "parallel", "map", "workflow"):
        assert schema["$defs"][f"{kind}Step"]["properties"]["catch"] == {"$ref": "#/$defs/catch"}
    assert "catch" not in schema["$defs"]["setStep"]["properties"]
    # any step kind may be in a branch (nested parallel and map are bounded semantically)
    branch_steps = schema["$defs"]["branch"]["properties"]["steps"]["additionalProperties"]
    assert branch_steps == {"$ref": "#/$defs/step"}


def test_schema_file() -> None:
    path = schema_path()
    assert path.name == "workflow.schema.json" and path.is_file()
    schema = json.loads(path.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    assert schema["additionalProperties"] is False


def test_every_object_in_the_schema_is_closed() -> None:
    schema = json.loads(schema_path().read_text(encoding="utf-8"))

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "properties" in node:
                assert node.get("additionalProperties") is False, where
            for key, child in node.items():
                if key != "if":  # a condition on an object, not its shape
                    walk(child, f"{where}/{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{where}/{i}")

    walk(schema, "#")
