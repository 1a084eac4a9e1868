"""Robustness: random text, JSON and definition-shaped documents raise a located
``DefinitionError`` or parse, never anything else (hypothesis)."""

from __future__ import annotations

import json
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.definition import WorkflowDefinition, definition_from_body, parse_definition
from toolkit.errors import DefinitionError

KEYS = ["name", "version", "start", "steps", "input", "defaults", "effect", "idempotent", "args"]
KEYS += ["retry", "timeout", "next", "choice", "when", "default", "succeed", "output", "fail"]
KEYS += ["error", "message", "max_attempts", "initial", "factor", "max", "jitter", "wait", "a"]
KEYS += ["type", "properties", "required", "$ref", "items", "b", "non_retryable", "catch"]
KEYS += ["errors", "duration", "until", "signal", "parallel", "map", "workflow", "branches"]
KEYS += ["branch", "mode", "reserve", "total", "per_branch", "budget", "max_concurrency"]
KEYS += ["set", "any", "schema", "callback", "compensate", "limits", "on_timeout", "max_steps"]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 10**20)
    | st.floats()
    | st.sampled_from(
        ["a", "b", "h.x", "1s", "5 m", "${ a }", "${ a.", "${", "object", "#/$defs/x", "", "-1"]
    )
)
JSON = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), children, max_size=5)
    ),
    max_leaves=30,
)
TARGETS = st.sampled_from(["a", "b", "c"]) | st.sampled_from(["zz", "bad id", 5])
DURATIONS = st.sampled_from(["1s", "500ms", "1h30m", 0, 2.5, "5 m", -1, None, "0s"])
TEXTS = st.sampled_from(["m", "${ input.x } failed", "${ steps.a }", "${ x.", "${", "a ${ b }"])
RETRY = st.fixed_dictionaries(
    {},
    optional={
        "max_attempts": st.sampled_from([1, 3, 0, "2", "unlimited"]),
        "initial": DURATIONS,
        "factor": st.sampled_from([1, 2.5, 0.5]),
        "max": DURATIONS,
        "jitter": st.booleans(),
        "non_retryable": st.lists(st.sampled_from(["E", "pkg.E", "1"]), max_size=2),
    },
)
CATCH = st.lists(
    st.fixed_dictionaries(
        {
            "errors": st.lists(st.sampled_from(["E", "p.E", "*", "Timeout", "1"]), max_size=3),
            "next": TARGETS,
        }
    ),
    max_size=3,
)
RETRY_RULES = st.lists(
    st.fixed_dictionaries(
        {"errors": st.lists(st.sampled_from(["E", "p.E", "*", "1"]), max_size=3)},
        optional={"max_attempts": st.sampled_from([2, "unlimited", 0]), "initial": DURATIONS},
    ),
    max_size=3,
)
EFFECT = st.fixed_dictionaries(
    {"effect": st.sampled_from(["h", "a.b", "a.b", "1x"]), "idempotent": st.booleans()},
    optional={
        "next": TARGETS,
        "args": JSON | TEXTS,
        "retry": RETRY | RETRY_RULES | RETRY.map(lambda r: {**r, "errors": ["*"]}),
        "timeout": DURATIONS,
        "catch": CATCH,
        "callback": st.fixed_dictionaries({}, optional={"timeout": DURATIONS}),
        "compensate": st.fixed_dictionaries(
            {"effect": st.sampled_from(["undo", "1x"])},
            optional={"args": JSON | TEXTS, "idempotent": st.booleans()},
        ),
        "limits": st.lists(st.sampled_from(["api", "a.b-c", "bad name", ""]), max_size=3),
    },
)
SET = st.fixed_dictionaries(
    {"set": st.dictionaries(st.sampled_from(["x", "y", "bad name"]), JSON | TEXTS, max_size=3)},
    optional={"next": TARGETS, "catch": CATCH},
)
WAIT_EVENT = st.fixed_dictionaries(
    {},
    optional={
        "signal": st.sampled_from(["go", "go", "stop", "bad name"]),
        "duration": DURATIONS,
        "until": st.sampled_from(["${ input.at }", "2030-01-01", "x ${ a }"]),
        "schema": st.sampled_from([{"type": "object"}, {"type": "nope"}, True, 3]),
        "next": TARGETS,
    },
)
WAIT_ANY = st.fixed_dictionaries(
    {"wait": st.fixed_dictionaries({"any": st.lists(WAIT_EVENT, max_size=3)})},
    optional={"next": TARGETS, "catch": CATCH},
)
WAIT = st.fixed_dictionaries(
    {
        "wait": st.fixed_dictionaries(
            {},
            optional={
                "duration": DURATIONS,
                "until": st.sampled_from(
                    ["${ input.at }", "2030-01-01T00:00:00Z", "2030-01-01", "x ${ a }", "${ x."]
                ),
                "signal": st.sampled_from(["go", "a.b-c", "bad name", ""]),
                "timeout": DURATIONS,
                "schema": st.sampled_from([{"type": "object"}, {"default": 1, "type": "string"}]),
            },
        )
    },
    optional={"next": TARGETS, "catch": CATCH},
)
CHOICE = st.fixed_dictionaries(
    {
        "choice": st.lists(
            st.fixed_dictionaries(
                {"when": st.sampled_from(["${ a }", "${ x.", "a", "${a} ${b}"]), "next": TARGETS}
            ),
            min_size=1,
            max_size=3,
        )
    },
    optional={"default": TARGETS},
)
FAIL_COMPENSATE = st.fixed_dictionaries(
    {"fail": st.fixed_dictionaries({"error": st.just("E"), "compensate": st.booleans()})}
)
SUCCEED = st.fixed_dictionaries(
    {"succeed": st.fixed_dictionaries({}, optional={"output": JSON | TEXTS})}
)
FAIL = st.fixed_dictionaries(
    {
        "fail": st.fixed_dictionaries(
            {"error": st.sampled_from(["E", "p.E"])}, optional={"message": TEXTS}
        )
    }
)
JUNK = st.dictionaries(st.sampled_from(KEYS), JSON | TARGETS, max_size=4)
AMOUNTS = st.dictionaries(
    st.sampled_from(["tokens", "usd", "api.calls", "bad name"]),
    st.sampled_from([1, 2.5, 1000, 0, -1, "3"]),
    max_size=2,
)
RESERVE = st.fixed_dictionaries({}, optional={"total": AMOUNTS, "per_branch": AMOUNTS})
BRANCH = st.fixed_dictionaries(
    {
        "start": TARGETS,
        "steps": st.dictionaries(
            st.sampled_from(["a", "b", "c", "bad id"]),
            st.one_of(EFFECT, CHOICE, SUCCEED, FAIL, SET, WAIT, JUNK),
            max_size=3,
        ),
    }
)
PARALLEL = st.fixed_dictionaries(
    {
        "parallel": st.fixed_dictionaries(
            {
                "branches": st.dictionaries(
                    st.sampled_from(["x", "y", "bad id"]), BRANCH, max_size=3
                )
            },
            optional={
                "mode": st.sampled_from(["all", "first_success", "any"]),
                "cancel_losers": st.booleans(),
                "reserve": RESERVE,
            },
        )
    },
    optional={"next": TARGETS, "catch": CATCH},
)
MAP = st.fixed_dictionaries(
    {
        "map": st.fixed_dictionaries(
            {
                "items": st.sampled_from(["${ input.items }", "input.items", "${ x.", "a ${ b }"]),
                "branch": BRANCH | JUNK,
            },
            optional={
                "max_concurrency": st.sampled_from([1, 4, 0, "2"]),
                "cancel_losers": st.booleans(),
                "reserve": RESERVE,
            },
        )
    },
    optional={"next": TARGETS, "catch": CATCH},
)
WORKFLOW = st.fixed_dictionaries(
    {
        "workflow": st.fixed_dictionaries(
            {},
            optional={
                "name": st.sampled_from(["child", "child", "Bad"]),
                "version": st.sampled_from([1, 0, "2"]),
                "input": JSON | TEXTS,
            },
        )
    },
    optional={"next": TARGETS, "catch": CATCH},
)
STEP = st.one_of(
    EFFECT,
    CHOICE,
    SUCCEED,
    FAIL,
    FAIL_COMPENSATE,
    WAIT,
    WAIT_ANY,
    SET,
    PARALLEL,
    MAP,
    WORKFLOW,
    JUNK,
)
DOCUMENTS = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["ok", "ok", "Bad"]),
        "version": st.sampled_from([1, 1, 0, "1", 2.0]),
        "start": st.sampled_from(["a", "a", "b", "zz"]),
        "steps": st.dictionaries(st.sampled_from(["a", "b", "c", "c", "bad id"]), STEP, max_size=4),
    },
    optional={
        "input": JSON
        | st.sampled_from([{"type": "object"}, {"properties": {"x": {"default": 1}}}]),
        "defaults": st.fixed_dictionaries({}, optional={"retry": RETRY, "timeout": DURATIONS}),
        "description": st.text(max_size=5),
        "budget": AMOUNTS,
        "timeout": DURATIONS,
        "on_timeout": TARGETS,
        "max_steps": st.sampled_from([1, 100, 0, "5"]),
    },
)
YAMLISH = st.text(
    alphabet=st.sampled_from([*"abcnstep:{}[],-&*!|>?#'\"\n \t\\$%@`0129.", "\x85", "\ufeff", "é"]),
    max_size=80,
)


def parse_or_definition_error(text: str) -> None:
    try:
        result = parse_definition(text, source="fuzz.yaml")
    except DefinitionError as exc:
        assert exc.faults
        for fault in exc.faults:
            assert fault.file == "fuzz.yaml" and fault.path.startswith("$")
            assert fault.line is None or fault.line >= 1
    else:
        assert isinstance(result, WorkflowDefinition)
        assert definition_from_body(result.body).digest == result.digest


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(YAMLISH)
def test_random_yamlish_text_raises_only_definition_error(text: str) -> None:
    parse_or_definition_error(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_random_json_raises_only_definition_error(doc: Any) -> None:
    parse_or_definition_error(json.dumps(doc))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(DOCUMENTS)
def test_random_definitions_raise_only_definition_error(doc: Any) -> None:
    parse_or_definition_error(json.dumps(doc))
    parse_or_definition_error(yaml.safe_dump(doc))
