"""The jsonschema names the definition format uses, imported without a start-up of seconds.

jsonschema loads every optional format-checker backend when it is first imported. One of
them, ``rfc3987-syntax`` (which ``jupyterlab`` brings in through
``jsonschema[format-nongpl]``), builds some 35 Earley parsers at import: about 3 s of CPU
in every ``toolkit`` command and worker start, four times everything else the CLI imports
(python-jsonschema/jsonschema#1428, open upstream as of jsonschema 4.26). The others cost
about 22 ms together (``isoduration`` brings ``arrow``), a twentieth of a worker's start.

Nothing here asserts a format but those the meta-schema check of an input schema meets:
``uri``, ``uri-reference`` and ``regex`` (task input and signal payloads are validated
without format assertions). So when jsonschema is not imported yet, it is imported with the
backends of the other formats hidden (a ``None`` entry in ``sys.modules`` makes an import
fail, which jsonschema expects and skips), and the entries are removed at once: an
application that imports one of them itself still gets it. An application that needs
jsonschema's checkers of those formats imports jsonschema before ``toolkit``
(docs/decisions.md, "jsonschema without its IRI parsers").
"""

from __future__ import annotations

import sys

#: The format backends hidden from jsonschema's first import, by the formats they check:
#: iri and iri-reference, duration, color, json-pointer, uri-template, hostname,
#: idn-hostname, date-time and time. (``rfc3987`` or ``rfc3986_validator``, for uri and
#: uri-reference, stay.)
_UNUSED_BACKENDS = (
    "rfc3987_syntax", "isoduration", "webcolors", "jsonpointer", "uri_template", "fqdn",
    "idna", "rfc3339_validator",
)  # fmt: skip

if "jsonschema" not in sys.modules:
    _hidden = [name for name in _UNUSED_BACKENDS if name not in sys.modules]
    for _name in _hidden:
        sys.modules[_name] = None  # type: ignore[assignment]
    try:
        import jsonschema  # noqa: F401  (the first import, with the backends hidden)
    finally:
        for _name in _hidden:
            del sys.modules[_name]

from jsonschema import Draft202012Validator  # noqa: E402
from jsonschema.exceptions import ValidationError, best_match  # noqa: E402

__all__ = ["Draft202012Validator", "ValidationError", "best_match"]
