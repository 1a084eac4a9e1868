"""The expressions and templates of the format (``toolkit.definition.expressions``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.workflows import MINIMAL
from toolkit.definition import SucceedStep, parse_definition
from toolkit.definition.expressions import Template, check_template, compile_template, is_truthy
from toolkit.errors import ExpressionError, ExpressionSyntaxError, ToolkitError


def test_runtime_expression_errors_are_expression_errors() -> None:
    d = parse_definition(MINIMAL.replace("{succeed: {}}", "{succeed: {output: '${ abs(input) }'}}"))
    step = d.steps["done"]
    assert isinstance(step, SucceedStep)
    with pytest.raises(ExpressionError):
        step.output.render({"input": "text"})


SCOPE: dict[str, Any] = {
    "input": {
        "order_id": "A-1",
        "count": 3,
        "price": 9.5,
        "express": False,
        "tags": ["x1", "b", "x2"],
        "customer": {"name": "Ann", "vip": True},
        "nothing": None,
        "empty": "",
    },
    "steps": {"reserve": {"total": 120, "lines": [{"sku": "s1"}, {"sku": "s2"}]}},
    "context": {"task_id": 42, "tenant": "acme", "attempt": 1},
}


def render(value: Any) -> Any:
    return compile_template(value).render(SCOPE)


@pytest.mark.parametrize(
    ("text", "result"),
    [
        ("${ input.order_id }", "A-1"),
        ("${input.count}", 3),
        ("  ${   input.price   }  ", 9.5),
        ("${ input.express }", False),
        ("${ input.customer }", {"name": "Ann", "vip": True}),
        ("${ input.tags }", ["x1", "b", "x2"]),
        ("${ input.missing }", None),
        ("${ steps.reserve.total > `100` }", True),
        ("${ steps.reserve.lines[].sku }", ["s1", "s2"]),
        ("${ length(input.tags) }", 3),
        ("${ input.tags[?starts_with(@, 'x')] }", ["x1", "x2"]),
        ("${ {id: input.order_id, n: context.task_id} }", {"id": "A-1", "n": 42}),
        ('${ `{"a": {"b": [1, 2]}}` }', {"a": {"b": [1, 2]}}),
        ("${ '}' }", "}"),
        ("${ '${' }", "${"),
        ('${ "input".order_id }', "A-1"),
        ("${ @.context.tenant }", "acme"),
    ],
)
def test_whole_expression_keeps_its_type(text: str, result: Any) -> None:
    template = compile_template(text)
    assert template.is_expression
    assert not template.is_constant
    assert template.render(SCOPE) == result


@pytest.mark.parametrize(
    ("text", "result"),
    [
        ("order ${ input.order_id } rejected", "order A-1 rejected"),
        ("n=${ input.count }", "n=3"),
        ("p=${input.price};e=${input.express}", "p=9.5;e=false"),
        ("[${ input.nothing }]", "[]"),
        ("[${ input.empty }]", "[]"),
        ("${ input.customer } and more", '{"name": "Ann", "vip": true} and more'),
        ("${ input.tags }!", '["x1", "b", "x2"]!'),
        ("${ input.order_id }${ input.count }", "A-13"),
        ("café ${ input.customer.name }", "café Ann"),
    ],
)
def test_string_templates(text: str, result: str) -> None:
    template = compile_template(text)
    assert not template.is_expression
    assert template.render(SCOPE) == result


@pytest.mark.parametrize(
    "value",
    ["plain", "cost: $5 {braces}", "$ {not an expression}", "", 0, 1.5, True, None, [], {}],
)
def test_constants(value: Any) -> None:
    template = compile_template(value)
    assert template.is_constant
    assert template.render({}) == value
    assert template.source is value


def test_nested_values() -> None:
    value = {
        "order": "${ input.order_id }",
        "lines": [{"sku": "${ steps.reserve.lines[0].sku }", "qty": 1}, "fixed"],
        "meta": {"deep": {"deeper": ["${ context.tenant }-${ context.attempt }"]}},
        "const": {"a": [1, 2]},
    }
    assert render(value) == {
        "order": "A-1",
        "lines": [{"sku": "s1", "qty": 1}, "fixed"],
        "meta": {"deep": {"deeper": ["acme-1"]}},
        "const": {"a": [1, 2]},
    }


def test_keys_are_constants() -> None:
    assert render({"${ input.order_id }": 1}) == {"${ input.order_id }": 1}


def test_render_returns_fresh_values() -> None:
    source = {"a": [1, 2], "b": "${ input.count }"}
    template = compile_template(source)
    first = template.render(SCOPE)
    first["a"].append(3)
    assert template.render(SCOPE) == {"a": [1, 2], "b": 3}
    constant = compile_template({"a": [1]})
    constant.render({})["a"].append(2)
    assert constant.render({}) == {"a": [1]}
    assert source == {"a": [1, 2], "b": "${ input.count }"}


def test_render_does_not_modify_the_scope() -> None:
    scope = {"input": {"xs": [3, 1, 2]}}
    assert compile_template("${ sort(input.xs) }").render(scope) == [1, 2, 3]
    assert scope == {"input": {"xs": [3, 1, 2]}}


@pytest.mark.parametrize(
    ("text", "expression", "fragment"),
    [
        ("${ input.order_id == }", "input.order_id ==", "incomplete expression"),
        ("${ a b }", "a b", "Unexpected token: b at column 2"),
        ("${ `{ }", "${ `{ }", "unterminated '${'"),
        ("order ${ input.id", "order ${ input.id", "unterminated '${'"),
        ("${ }", "", "the expression is empty"),
        ("${ lenght(input.tags) }", "lenght(input.tags)", "unknown function lenght()"),
        ("${ length(a, b) }", "length(a, b)", "function length() takes 1 argument(s), got 2"),
        ("${ merge() }", "merge()", "takes at least 1 argument(s), got 0"),
        ("${ __import__('os') }", "__import__('os')", "unknown function __import__()"),
        ('${ "abc }', '${ "abc }', "unterminated '${'"),
    ],
)
def test_syntax_errors(text: str, expression: str, fragment: str) -> None:
    with pytest.raises(ExpressionSyntaxError) as caught:
        compile_template({"args": {"x": text}}, path="$.steps.a")
    error = caught.value
    assert isinstance(error, ToolkitError)
    assert error.path == "$.steps.a.args.x"
    assert error.expression == expression
    assert fragment in str(error)


def test_check_template_reports_every_error() -> None:
    errors = check_template(
        {"a": "${ a. }", "b": ["ok ${ x }", "${ y[ }"], "c-d": "${ }"}, path="$.args"
    )
    assert [e.path for e in errors] == ["$.args.a", "$.args.b[1]", "$.args['c-d']"]
    assert check_template({"fine": "${ input.x }"}) == []


def test_runtime_errors_carry_the_expression_and_path() -> None:
    template = compile_template({"v": "${ abs(input.order_id) }"}, path="$.steps.s.args")
    with pytest.raises(ExpressionError) as caught:
        template.render(SCOPE)
    assert caught.value.expression == "abs(input.order_id)"
    assert caught.value.path == "$.steps.s.args.v"
    assert caught.value.step is None
    assert "abs(input.order_id)" in str(caught.value)


@pytest.mark.parametrize(
    ("value", "truthy"),
    [
        (None, False),
        (False, False),
        ("", False),
        ([], False),
        ({}, False),
        (0, True),
        (0.0, True),
        (True, True),
        ("false", True),
        ([0], True),
        ({"a": None}, True),
        (-1, True),
    ],
)
def test_is_truthy(value: Any, truthy: bool) -> None:
    assert is_truthy(value) is truthy


def test_repr() -> None:
    assert repr(compile_template("${ a }")) == "Template('${ a }')"
    assert isinstance(compile_template(1), Template)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=10,
)
expression_text = st.text(alphabet="${}[]()'\"`@.*|&!<>=,:?abcxyz012 \\", max_size=30)


@settings(max_examples=300, deadline=None)
@given(expression_text, json_values)
def test_random_templates_raise_only_toolkit_errors(text: str, data: Any) -> None:
    try:
        template = compile_template({"k": [text]})
    except ExpressionSyntaxError:
        return
    try:
        template.render({"input": data, "steps": {"a": data}, "context": {}})
    except ExpressionError:
        pass
