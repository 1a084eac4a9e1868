"""What a `toolkit` process pays before it does anything: no backend of a format we never
check (toolkit/definition/json_schema.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

_PROBE = """
import sys
import toolkit.cli
from toolkit.definition import load_definition
hidden = "rfc3987_syntax" in sys.modules or "lark" in sys.modules
import rfc3987_syntax  # an application importing it itself still gets it
print(hidden, rfc3987_syntax.is_valid_syntax("iri", "https://example.com/a"))
"""

#: Format backends that jsonschema's import would load, and that nothing here uses.
_UNUSED = ("isoduration", "arrow", "webcolors", "jsonpointer", "uri_template", "fqdn",
           "rfc3339_validator")  # fmt: skip

_PROBE_ALL = f"""
import importlib, sys
import toolkit.cli
from toolkit.definition.input_schema import input_schema_problems
print(sorted(set({_UNUSED!r}) & set(sys.modules)))
# the formats the meta-schema check asserts are still checked
print(len(input_schema_problems({{"type": "string", "pattern": "("}})))
for name in {_UNUSED!r}:
    if importlib.util.find_spec(name) is not None:
        importlib.import_module(name)  # an application importing it itself still gets it
print("imported")
"""


@pytest.mark.skipif(
    importlib.util.find_spec("rfc3987_syntax") is None, reason="rfc3987-syntax not installed"
)
def test_the_cli_does_not_build_the_iri_parsers_and_leaves_them_importable() -> None:
    """Regression: with jupyterlab installed, jsonschema's import built rfc3987-syntax's
    Earley parsers, about 3 s of CPU in every command and worker start."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"], done.stdout


def test_the_cli_loads_no_format_backend_it_does_not_use() -> None:
    """jsonschema's other optional format backends (arrow among them) cost about 22 ms of
    every command and worker start; the meta-schema check of an input schema uses none."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE_ALL], capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "1", "imported"], done.stdout
