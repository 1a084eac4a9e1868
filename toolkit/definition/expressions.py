"""``${ ... }`` expressions in workflow definitions, evaluated with JMESPath.

Any JSON value in a definition (step ``args``, ``succeed.output``,
``fail.message``, choice ``when``) may contain expressions, at any depth:

- A string that is exactly one ``${ expr }`` (whitespace around it allowed)
  evaluates to the raw JMESPath result, which can be any JSON type.
- A string mixing text and expressions, like ``"order ${ input.id } rejected"``,
  is a string template: each result is inserted as-is when it is a string,
  as ``""`` when it is null, and as ``json.dumps(result)`` otherwise.
- Strings without ``${``, numbers, booleans and null are constants. Mapping
  keys are always constants.

Expressions see a scope ``{"input": ..., "steps": {...}, "context": {...}}``.
JMESPath is a query language over JSON data; nothing is ever passed to
``eval`` or ``exec``. To put a literal ``${`` in a string, use a JMESPath raw
string: ``${ '${' }``.

Templates are compiled once (`compile_template`); JMESPath parses are cached
by expression text.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Mapping
from typing import Any

import jmespath
from jmespath.exceptions import (
    EmptyExpressionError,
    IncompleteExpressionError,
    JMESPathError,
    LexerError,
    ParseError,
)
from jmespath.functions import Functions
from jmespath.parser import ParsedResult

from toolkit.definition.paths import child_path
from toolkit.errors import ExpressionError, ExpressionSyntaxError

__all__ = [
    "ExpressionError",
    "ExpressionSyntaxError",
    "Template",
    "check_template",
    "compile_template",
    "is_truthy",
]

_OPEN = "${"
_QUOTES = "'\"`"
_FUNCTIONS: Mapping[str, Any] = Functions().FUNCTION_TABLE


class _Node:
    """A compiled piece of a template."""

    constant = False

    def render(self, scope: dict[str, Any]) -> Any:
        raise NotImplementedError


class _Const(_Node):
    constant = True

    def __init__(self, value: Any) -> None:
        self.value = value

    def render(self, scope: dict[str, Any]) -> Any:
        # A copy, so a caller mutating the result cannot change the definition.
        if isinstance(self.value, (dict, list)):
            return copy.deepcopy(self.value)
        return self.value


class _Expr(_Node):
    def __init__(self, text: str, path: str, parsed: ParsedResult) -> None:
        self.text = text
        self.path = path
        self.parsed = parsed

    def render(self, scope: dict[str, Any]) -> Any:
        try:
            return self.parsed.search(scope)
        except (JMESPathError, TypeError, ValueError) as exc:
            raise ExpressionError(
                f"expression {self.text!r} at {self.path} failed: {exc}",
                expression=self.text,
                path=self.path,
            ) from exc


class _Interpolation(_Node):
    def __init__(self, parts: tuple[str | _Expr, ...]) -> None:
        self.parts = parts

    def render(self, scope: dict[str, Any]) -> Any:
        return "".join(
            part if isinstance(part, str) else _to_text(part.render(scope), part)
            for part in self.parts
        )


class _Dict(_Node):
    def __init__(self, items: tuple[tuple[str, _Node], ...]) -> None:
        self.items = items

    def render(self, scope: dict[str, Any]) -> Any:
        return {key: node.render(scope) for key, node in self.items}


class _List(_Node):
    def __init__(self, items: tuple[_Node, ...]) -> None:
        self.items = items

    def render(self, scope: dict[str, Any]) -> Any:
        return [node.render(scope) for node in self.items]


def _to_text(value: Any, expr: _Expr) -> str:
    """Convert an expression result for insertion into a string template."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError) as exc:
        raise ExpressionError(
            f"expression {expr.text!r} at {expr.path} gave a value that cannot be written as"
            f" text: {exc}",
            expression=expr.text,
            path=expr.path,
        ) from exc


class Template:
    """A compiled JSON value that may contain ``${ }`` expressions anywhere inside.

    Build one with `compile_template`. A template is immutable and safe to share
    between tasks and threads.
    """

    __slots__ = ("_root", "path", "source")

    def __init__(self, root: _Node, *, source: Any, path: str) -> None:
        self._root = root
        self.source: Any = source
        """The JSON value the template was compiled from."""
        self.path: str = path
        """JSON path of the value inside its definition (used in error messages)."""

    @property
    def is_constant(self) -> bool:
        """True when the value contains no expressions, so `render` ignores the scope."""
        return self._root.constant

    @property
    def is_expression(self) -> bool:
        """True when the whole value is one ``${ expr }`` string (its result keeps its type)."""
        return isinstance(self._root, _Expr)

    def render(self, scope: Mapping[str, Any]) -> Any:
        """Evaluate the template.

        Args:
            scope: The data expressions can see, normally
                ``{"input": ..., "steps": {step_id: output, ...}, "context": {...}}``.
                Only read, never modified.

        Returns:
            A new JSON value (fresh lists and dicts; mutating it does not affect the template).

        Raises:
            ExpressionError: If an expression fails at run time (e.g. a function receives
                a value of the wrong type). ``path`` and ``expression`` are set; ``step``
                is left for the caller to fill in.
        """
        return self._root.render(dict(scope))

    def __repr__(self) -> str:
        return f"Template({self.source!r})"


def compile_template(value: Any, *, path: str = "$") -> Template:
    """Compile a JSON value into a `Template`.

    Args:
        value: Any JSON value (dicts with string keys, lists, strings, numbers, booleans,
            None). Not modified; the template keeps a reference to it as ``source``.
        path: JSON path of ``value`` in its document, used in error messages.

    Returns:
        The compiled template.

    Raises:
        ExpressionSyntaxError: For the first invalid expression found (unterminated
            ``${``, empty expression, JMESPath syntax error, unknown function or wrong
            number of function arguments), with its ``path`` and ``expression``. Use
            `check_template` to get all of them.
    """
    errors: list[ExpressionSyntaxError] = []
    root = _compile(value, path, errors)
    if errors:
        raise errors[0]
    return Template(root, source=value, path=path)


def check_template(value: Any, *, path: str = "$") -> list[ExpressionSyntaxError]:
    """Return every expression syntax error in a JSON value (empty when it compiles).

    Args:
        value: Any JSON value, as for `compile_template`.
        path: JSON path of ``value`` in its document, used in the errors.
    """
    errors: list[ExpressionSyntaxError] = []
    _compile(value, path, errors)
    return errors


def scope_reads(text: str) -> list[tuple[str, str, str | None]]:
    """What the expressions in a string read from the scope, by name.

    Args:
        text: A string that may hold ``${ }`` expressions (one with a syntax error is
            skipped: `check_template` reports it).

    Returns:
        ``(expression, name, field)`` for each name an expression reads from the scope
        itself (``input``, ``steps``, ``context`` ...), with the field it reads next
        (``steps.reserve.total`` gives ``("steps", "reserve")``), or None. Names inside
        projections, filters and ``&`` references read the elements, not the scope, and are
        not listed.
    """
    errors: list[ExpressionSyntaxError] = []
    node = _compile_string(text, "$", errors)
    exprs = [node] if isinstance(node, _Expr) else []
    if isinstance(node, _Interpolation):
        exprs = [part for part in node.parts if isinstance(part, _Expr)]
    return [
        (expr.text, name, field)
        for expr in exprs
        for name, field in _reads(expr.parsed.parsed, at_scope=True)
    ]


#: Node types whose first child is evaluated where the node is, and the rest on its result.
_CHAINED = frozenset(
    {"subexpression", "index_expression", "projection", "value_projection",
     "filter_projection", "flatten", "pipe"}
)  # fmt: skip


def _reads(node: Any, *, at_scope: bool) -> list[tuple[str, str | None]]:
    """``(name, next field)`` of the fields of a JMESPath AST read from the scope."""
    if not isinstance(node, dict):
        return []
    kind, children = node.get("type"), node.get("children") or []
    if kind == "field":
        return [(node["value"], None)] if at_scope else []
    if kind == "expref":
        return []
    if kind in _CHAINED and children:
        first, rest = children[0], children[1:]
        if at_scope and kind == "subexpression" and first.get("type") == "field":
            found = [(first["value"], _first_field(rest[0]) if rest else None)]
        else:
            found = _reads(first, at_scope=at_scope)
        return found + [read for child in rest for read in _reads(child, at_scope=False)]
    return [read for child in children for read in _reads(child, at_scope=at_scope)]


def _first_field(node: Any) -> str | None:
    """The field a chain starts with (``a`` of ``a.b[0]``), or None."""
    while isinstance(node, dict):
        if node.get("type") == "field":
            return str(node["value"])
        if node.get("type") not in ("subexpression", "index_expression"):
            return None
        node = (node.get("children") or [None])[0]
    return None


def is_truthy(value: Any) -> bool:
    """Apply JMESPath truthiness: false, null, ``""``, ``[]`` and ``{}`` are false.

    Everything else is true, including ``0`` and ``0.0`` (unlike Python).
    """
    if value is None or value is False:
        return False
    if isinstance(value, (str, list, tuple, Mapping)):
        return len(value) > 0
    return True


def _compile(value: Any, path: str, errors: list[ExpressionSyntaxError]) -> _Node:
    """Compile ``value``, appending syntax errors to ``errors`` instead of raising."""
    if isinstance(value, str):
        return _compile_string(value, path, errors)
    if isinstance(value, Mapping):
        items = tuple(
            (key, _compile(item, child_path(path, str(key)), errors)) for key, item in value.items()
        )
        if all(node.constant for _, node in items):
            return _Const(value)
        return _Dict(items)
    if isinstance(value, (list, tuple)):
        nodes = tuple(_compile(item, child_path(path, i), errors) for i, item in enumerate(value))
        if all(node.constant for node in nodes):
            return _Const(value)
        return _List(nodes)
    return _Const(value)


def _compile_string(text: str, path: str, errors: list[ExpressionSyntaxError]) -> _Node:
    if _OPEN not in text:
        return _Const(text)
    parts: list[str | _Expr] = []
    literal_start = 0
    start = text.find(_OPEN)
    while start >= 0:
        end = _closing_brace(text, start + len(_OPEN))
        if end < 0:
            errors.append(
                ExpressionSyntaxError(
                    f"unterminated '${{' in {text!r}: expressions are written '${{ ... }}'",
                    path=path,
                    expression=text,
                )
            )
            return _Const(text)
        if start > literal_start:
            parts.append(text[literal_start:start])
        expression = text[start + len(_OPEN) : end].strip()
        parsed = _parse(expression, path, errors)
        if parsed is not None:
            parts.append(_Expr(expression, path, parsed))
        literal_start = end + 1
        start = text.find(_OPEN, literal_start)
    if literal_start < len(text):
        parts.append(text[literal_start:])
    exprs = [part for part in parts if isinstance(part, _Expr)]
    if len(exprs) == 1 and all(isinstance(p, _Expr) or not p.strip() for p in parts):
        return exprs[0]
    if not exprs:  # only failed expressions; errors were recorded
        return _Const(text)
    return _Interpolation(tuple(parts))


def _closing_brace(text: str, position: int) -> int:
    """Find the ``}`` closing an expression that starts at ``position``; -1 if none.

    Braces inside JMESPath string and JSON literals (``'...'``, ``"..."``,
    `` `...` ``) and nested braces (multi-select hashes) do not count.
    """
    depth = 0
    index = position
    while index < len(text):
        char = text[index]
        if char in _QUOTES:
            index = _skip_quoted(text, index)
            if index < 0:
                return -1
        elif char == "{":
            depth += 1
        elif char == "}":
            if depth == 0:
                return index
            depth -= 1
        index += 1
    return -1


def _skip_quoted(text: str, position: int) -> int:
    """Return the index of the quote closing the one at ``position``; -1 if unclosed."""
    quote = text[position]
    index = position + 1
    while index < len(text):
        if text[index] == "\\":
            index += 2
            continue
        if text[index] == quote:
            return index
        index += 1
    return -1


def _parse(expression: str, path: str, errors: list[ExpressionSyntaxError]) -> ParsedResult | None:
    """Parse one JMESPath expression (cached), recording a located error on failure."""
    reason: str | None
    try:
        parsed = _jmespath_compile(expression)
    except JMESPathError as exc:
        reason = _describe(exc)
    except (RecursionError, TypeError, ValueError) as exc:  # defensive: jmespath internals
        reason = str(exc) or type(exc).__name__
    else:
        reason = _check_functions(parsed.parsed)
        if reason is None:
            return parsed
    errors.append(
        ExpressionSyntaxError(
            f"invalid expression {expression!r}: {reason}", path=path, expression=expression
        )
    )
    return None


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@functools.lru_cache(maxsize=4096)
def _jmespath_compile(expression: str) -> ParsedResult:
    return jmespath.compile(expression)


def _describe(exc: JMESPathError) -> str:
    """Turn a JMESPath parse error into a one-line reason."""
    if isinstance(exc, EmptyExpressionError):
        return "the expression is empty"
    if isinstance(exc, IncompleteExpressionError):
        return "incomplete expression (it ends too early)"
    if isinstance(exc, LexerError):
        return f"{exc.message} at column {exc.lexer_position}"
    if isinstance(exc, ParseError):
        if exc.token_type == "NUMBER":
            # JMESPath reads a bare number only as an index or slice bound, not as a value.
            written = _NUMBER.match(exc.expression or "", exc.lex_position)
            number = written.group() if written else str(exc.token_value)
            return (
                f"a number is written as a JMESPath literal in backticks: `{number}` "
                f"(column {exc.lex_position})"
            )
        return f"{exc.msg} at column {exc.lex_position}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _check_functions(node: Any) -> str | None:
    """Check that every function call in a parsed expression exists and has a valid arity."""
    stack = [node]
    while stack:
        current = stack.pop()
        if not isinstance(current, dict):
            continue
        if current.get("type") == "function_expression":
            name = current.get("value")
            args = current.get("children", [])
            function = _FUNCTIONS.get(name) if isinstance(name, str) else None
            if function is None:
                return f"unknown function {name}()"
            signature = function["signature"]
            variadic = bool(signature) and bool(signature[-1].get("variadic"))
            if (variadic and len(args) < len(signature)) or (
                not variadic and len(args) != len(signature)
            ):
                wanted = f"at least {len(signature)}" if variadic else str(len(signature))
                return f"function {name}() takes {wanted} argument(s), got {len(args)}"
        stack.extend(current.get("children", []))
    return None
