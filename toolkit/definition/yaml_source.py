"""Safe YAML loading that remembers where every value came from.

`load_yaml` composes the node tree with a `yaml.SafeLoader` subclass, maps
each JSON path to its line, reports duplicate mapping keys (PyYAML silently
keeps the last one), and constructs plain JSON data. It never raises on bad
input: every problem comes back as a `Problem`.

Plain scalars are resolved by the YAML 1.2 core schema, not PyYAML's YAML 1.1
rules: only ``true``/``false`` are booleans (``yes``, ``no``, ``on``, ``off``
stay strings), dates stay strings, ``012`` is 12 and ``1:30`` a string.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from toolkit.definition.paths import JsonPath, PathPart

MAX_NODES = 100_000
"""Refuse documents whose node tree (with aliases expanded) is larger than this."""

_BOOL_TAG = "tag:yaml.org,2002:bool"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Loader(yaml.SafeLoader):
    """`yaml.SafeLoader` resolving plain scalars by the YAML 1.2 core schema rules.

    Differences from PyYAML's YAML 1.1 rules: only true/false are booleans (``yes``, ``no``,
    ``on``, ``off`` stay strings), dates stay strings, ``012`` is 12 (not octal 10), ``1:30``
    stays a string (not 90), and ``1e3`` is a number.
    """


_Loader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag not in (_BOOL_TAG, _INT_TAG, _FLOAT_TAG, _TIMESTAMP_TAG)
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(_INT_TAG, re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
_Loader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _construct_int(loader: yaml.SafeLoader, node: Node) -> Any:
    """Read decimal integers as decimal (YAML 1.1 reads ``012`` as octal)."""
    if not isinstance(node, ScalarNode):
        return loader.construct_scalar(node)  # type: ignore[arg-type]  # raises ConstructorError
    value = loader.construct_scalar(node)
    if re.fullmatch(r"[-+]?[0-9]+", value):
        return int(value)
    return loader.construct_yaml_int(node)  # explicit `!!int 0x1F` and friends


_Loader.add_constructor(_INT_TAG, _construct_int)


@dataclass(frozen=True)
class Problem:
    """A fault found while loading, before it is tied to a file.

    ``new_only``: a check that applies to new registrations only: a definition rebuilt from
    its stored body (already registered) skips it, so a check made stricter never strands a
    stored version (docs/decisions.md).
    """

    path: JsonPath
    message: str
    line: int | None = None  # None: look it up from the path
    new_only: bool = False


@dataclass
class YamlSource:
    """The result of `load_yaml`.

    Attributes:
        data: The document as plain JSON data; None when it could not be built (see
            ``problems``) or when the document is empty. A document whose only faults are
            duplicate keys is built, the last value of each such key kept.
        lines: 1-based line of each path: a mapping entry maps to its key's line, a list
            item to the line where the item starts.
        problems: Faults found while loading, in document order.
    """

    data: Any = None
    lines: dict[JsonPath, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    empty: bool = False

    def line_of(self, path: JsonPath) -> int | None:
        """Return the line of ``path``, or of its closest ancestor that has one."""
        for end in range(len(path), -1, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return None


def load_yaml(text: str) -> YamlSource:
    """Parse one YAML document safely, tracking lines and detecting duplicate keys."""
    source = YamlSource()
    loader: _Loader | None = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is None:
            source.empty = True
            return source
        if not _Walker(source).walk(node, ()):
            return source
        raw = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = "; ".join(part for part in (exc.context, exc.problem) if part)
        source.problems.append(
            Problem((), f"invalid YAML: {message or exc}", None if mark is None else mark.line + 1)
        )
        return source
    except RecursionError:
        source.problems.append(Problem((), "invalid YAML: the document is nested too deeply"))
        return source
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        # e.g. an explicit tag applied to a value it cannot construct: `!!int abc`
        source.problems.append(Problem((), f"invalid YAML: {exc}"))
        return source
    finally:
        if loader is not None:
            loader.dispose()
    # Duplicate keys are the only faults a finished walk records: the document is still
    # built (the last value of a key wins) so that its other faults are checked and listed
    # with them; a value JSON cannot hold leaves nothing to check.
    walked = len(source.problems)
    data = _to_json(raw, (), source)
    if len(source.problems) == walked:
        source.data = data
    return source


class _Walker:
    """Visits the node tree once to record lines, duplicate keys, recursion and size."""

    def __init__(self, source: YamlSource) -> None:
        self.source = source
        self.visited = 0
        self.active: set[int] = set()

    def walk(self, node: Node, path: JsonPath) -> bool:
        """Record ``node`` and its children; False when the document must be refused."""
        self.visited += 1
        if self.visited > MAX_NODES:
            self.source.problems.append(
                Problem((), f"the document is too large (more than {MAX_NODES} values)")
            )
            return False
        self.source.lines.setdefault(path, node.start_mark.line + 1)
        if id(node) in self.active:
            self.source.problems.append(
                Problem(path, "recursive YAML alias: a value cannot contain itself")
            )
            return False
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                return all(self.walk(item, (*path, i)) for i, item in enumerate(node.value))
            if isinstance(node, MappingNode):
                return self._walk_mapping(node, path)
            return True
        finally:
            self.active.discard(id(node))

    def _walk_mapping(self, node: MappingNode, path: JsonPath) -> bool:
        seen: dict[tuple[str, str], int] = {}
        merged: list[Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:  # `<<: *defaults`, merged by the constructor
                merged.append(value_node)
                continue
            key: PathPart = key_node.value if isinstance(key_node, ScalarNode) else "?"
            child = (*path, key)
            line = key_node.start_mark.line + 1
            identity = (key_node.tag, str(key))
            if isinstance(key_node, ScalarNode) and identity in seen:
                what = "step id" if path == ("steps",) else "key"
                self.source.problems.append(
                    Problem(
                        child,
                        f"duplicate {what} {key!r} (first defined on line {seen[identity]})",
                        line,
                    )
                )
            else:
                seen[identity] = line
            self.source.lines.setdefault(child, line)
            if not self.walk(value_node, child):
                return False
        # Merged entries come last so that explicit keys keep their own lines.
        return all(self.walk(value_node, path) for value_node in merged)


def _to_json(value: Any, path: JsonPath, source: YamlSource) -> Any:
    """Copy constructed YAML data into fresh JSON values, reporting what JSON cannot hold."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return _text(value, path, source)
    if isinstance(value, float):
        if not math.isfinite(value):
            source.problems.append(Problem(path, f"{value} is not allowed: numbers must be finite"))
        return value
    if isinstance(value, list):
        return [_to_json(item, (*path, i), source) for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        result: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                source.problems.append(
                    Problem(
                        (*path, str(key)),
                        f"mapping key {key!r} is not a string; quote it"
                        " (definitions are JSON data)",
                    )
                )
                continue
            key = _text(key, (*path, key), source)
            result[key] = _to_json(item, (*path, key), source)
        return result
    source.problems.append(
        Problem(
            path,
            f"a value of type {type(value).__name__} is not allowed"
            " (definitions are JSON data: remove the YAML tag)",
        )
    )
    return None


def _text(value: str, path: JsonPath, source: YamlSource) -> str:
    """Return ``value`` as valid Unicode, joining UTF-16 surrogate pairs written as escapes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        try:  # YAML "\ud83d\ude00" escapes give a surrogate pair: join it into one character
            joined = value.encode("utf-16", "surrogatepass").decode("utf-16")
            joined.encode("utf-8")
        except UnicodeError:
            source.problems.append(Problem(path, f"{value!r} contains an unpaired surrogate"))
            return value
        return joined
    return value


def to_json(value: Any) -> tuple[Any, list[Problem]]:
    """Copy a Python value into fresh JSON data, returning it and any problems found."""
    source = YamlSource()
    try:
        data = _to_json(value, (), source)
    except RecursionError:
        return None, [Problem((), "the value is nested too deeply or contains itself")]
    return data, source.problems
