"""The jsonschema names the definition format uses, imported without a start-up of seconds.

jsonschema loads every optional format-checker backend when it is first imported. One of
them, ``rfc3987-syntax`` (which ``jupyterlab`` brings in through
``jsonschema[format-nongpl]``), builds some 35 Earley parsers at import: about 3 s of CPU
in every ``toolkit`` command and worker start, four times everything else the CLI imports
(python-jsonschema/jsonschema#1428, open upstream as of jsonschema 4.26).

Those parsers serve only the ``iri`` and ``iri-reference`` formats, which nothing here
checks: task input and signal payloads are validated without format assertions, and the
meta-schema check of an input schema meets no IRI format. So when jsonschema is not
imported yet, it is imported with that backend hidden (a ``None`` entry in
``sys.modules`` makes its import fail, which jsonschema expects and skips), and the entry is
removed at once: an application that imports ``rfc3987_syntax`` itself still gets it. An
application that needs jsonschema's ``iri`` checker imports jsonschema before ``toolkit``
(docs/decisions.md, "jsonschema without its IRI parsers").
"""

from __future__ import annotations

import sys

_SLOW_BACKEND = "rfc3987_syntax"

if "jsonschema" not in sys.modules and _SLOW_BACKEND not in sys.modules:
    sys.modules[_SLOW_BACKEND] = None  # type: ignore[assignment]
    try:
        import jsonschema  # noqa: F401  (the first import, with the backend hidden)
    finally:
        del sys.modules[_SLOW_BACKEND]

from jsonschema import Draft202012Validator  # noqa: E402
from jsonschema.exceptions import ValidationError, best_match  # noqa: E402

__all__ = ["Draft202012Validator", "ValidationError", "best_match"]
