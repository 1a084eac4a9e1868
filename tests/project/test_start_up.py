"""What a `toolkit` process pays before it does anything: no parser of a format we never
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
