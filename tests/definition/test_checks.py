"""The checks beyond the JSON Schema: located faults, one per mistake (no cascades),
reachability, targets, branches and the expressions a definition writes."""

from __future__ import annotations

import pytest

from tests.helpers.workflows import MINIMAL, faults_of
from toolkit.definition import ParallelStep, WaitStep, definition_from_body, parse_definition
from toolkit.errors import DefinitionError

WAIT_DOC = "name: x\nversion: 1\nstart: w\nsteps:\n  w: {wait: {until: %s}}\n"


@pytest.mark.parametrize(
    "until",
    [
        "2030-01-01T00:00:00Z",
        "2030-01-01T00:00:00+05:30",
        "2030-01-01 00:00:00.250-03:00",
        "'${ input.at }'",
        "\"${ join('T', [input.day, input.time]) }\"",
    ],
)
def test_wait_until_accepts(until: str) -> None:
    step = parse_definition(WAIT_DOC % until).steps["w"]
    assert isinstance(step, WaitStep) and step.until is not None


@pytest.mark.parametrize(
    ("until", "fragment"),
    [
        ("2030-01-01", "has no UTC offset"),
        ("2030-01-01T00:00:00", "has no UTC offset"),
        ("soon", "is not an ISO-8601 timestamp"),
        ("''", "is not an ISO-8601 timestamp"),
        ("'at ${ input.at }'", "not a text template"),
        ("'${ input. }'", "invalid expression"),
        ("1893456000", "expected string, got integer"),
    ],
)
def test_wait_until_refuses(until: str, fragment: str) -> None:
    (fault,) = faults_of(WAIT_DOC % until)
    assert fault.path == "$.steps.w.wait.until" and fault.line == 5
    assert fragment in fault.message


def test_misspelt_catch_does_not_cascade() -> None:
    text = """\
name: x
version: 1
start: a
steps:
  a:
    effect: h
    idempotent: true
    next: b
    cacth: [{errors: ["*"], next: c}]
  b: {succeed: {}}
  c: {fail: {error: E}}
"""
    faults = faults_of(text)
    assert [(f.path, f.message) for f in faults] == [
        ("$.steps.a.cacth", "unknown field 'cacth'; did you mean 'catch'?")
    ]


def test_catch_targets_count_for_reachability_and_finishing() -> None:
    text = """\
name: x
version: 1
start: a
steps:
  a:
    effect: h
    idempotent: true
    next: a
    catch: [{errors: [Done], next: b}]
  b: {succeed: {}}
"""
    d = parse_definition(text)
    assert list(d.steps) == ["a", "b"]
    faults = faults_of(text.replace("next: b}", "next: a}"))
    assert [f.path for f in faults] == ["$.steps.a", "$.steps.b"]
    assert "can never finish" in faults[0].message and "unreachable" in faults[1].message


def _nested(depth: int, innermost: str) -> str:
    """A definition whose parallel steps nest ``depth`` deep around ``innermost``."""
    step = innermost
    for level in range(depth):
        step = f"{{parallel: {{branches: {{b{level}: {{start: s, steps: {{s: {step}}}}}}}}}}}"
    return f"name: x\nversion: 1\nstart: s\nsteps:\n  s: {step}\n"


def test_parallel_and_map_nest_in_branches_at_most_three_deep() -> None:
    leaf = "{map: {items: '${ input.a }', branch: {start: e, steps: {e: {succeed: {}}}}}}"
    d = parse_definition(_nested(2, leaf))
    assert sum(type(s).__name__ in ("ParallelStep", "MapStep") for s in d.all_steps()) == 3
    (fault,) = faults_of(_nested(3, leaf))
    assert fault.path == "$.steps.s.parallel.branches.b2.steps.s.parallel.branches.b1.steps.s" \
        ".parallel.branches.b0.steps.s.map"
    assert "nested 4 deep" in fault.message and "at most 3 deep" in fault.message


def test_a_nested_parallel_or_map_step_reserves_nothing() -> None:
    leaf = (
        "{parallel: {reserve: {total: {tokens: 5}}, branches: {a: {start: e, steps:"
        " {e: {succeed: {}}}}}}}"
    )
    (fault,) = faults_of(_nested(1, leaf))
    assert fault.path.endswith(".steps.s.parallel.reserve")
    assert "reserve is allowed on a top-level parallel step only" in fault.message


def test_checks_apply_inside_branches_as_at_the_top_level() -> None:
    text = """\
name: x
version: 1
start: each
steps:
  each:
    map:
      items: "${ input.items }"
      branch:
        start: a
        steps:
          a:
            effect: h
            idempotent: true
            args: "${ x. }"
            retry: {initial: 5 m}
            catch: [{errors: ["*"], next: b}, {errors: [E], next: b}]
          b: {succeed: {output: "${ nope(a) }"}}
          c: {choice: [{when: "${ a } ${ b }", next: a}], cacth: []}
"""
    faults = {(f.path, f.line) for f in faults_of(text)}
    branch = "$.steps.each.map.branch.steps"
    assert faults == {
        (f"{branch}.a.args", 14),
        (f"{branch}.a.retry.initial", 15),
        (f"{branch}.a.catch[1]", 16),
        (f"{branch}.b.succeed.output", 17),
        (f"{branch}.c.choice[0].when", 18),
        (f"{branch}.c.cacth", 18),
        (f"{branch}.c", 18),  # unreachable: nothing goes to c
    }


def test_branch_step_ids_are_their_own_namespace() -> None:
    text = """\
name: x
version: 1
start: a
steps:
  a:
    parallel:
      branches:
        left: {start: a, steps: {a: {effect: h, idempotent: true, next: b}, b: {succeed: {}}}}
        right: {start: b, steps: {b: {effect: h, idempotent: true, next: a}, a: {fail: {error: E}}}}
    next: b
  b: {succeed: {}}
"""
    d = parse_definition(text)
    step = d.steps["a"]
    assert isinstance(step, ParallelStep)
    assert [branch.start for branch in step.branches.values()] == ["a", "b"]
    # A branch cannot go to a top-level step, nor a top-level step into a branch.
    faults = faults_of(text.replace("next: b}, b: {succeed", "next: c}, b: {succeed"))
    assert (faults[0].path, faults[0].message) == (
        "$.steps.a.parallel.branches.left.steps.a.next",
        "next step 'c' does not exist in branch 'left'; did you mean 'b', which no step goes to "
        "yet?",
    )
    faults = faults_of(text.replace("    next: b\n  b: {succeed: {}}\n", "    next: b\n"))
    assert [f.path for f in faults] == ["$.steps.a.next"]


@pytest.mark.parametrize("kind", ["parallel", "map", "workflow"])
def test_composite_steps_without_next_end_the_workflow(kind: str) -> None:
    body = {
        "parallel": {"branches": {"b": {"start": "s", "steps": {"s": {"succeed": {}}}}}},
        "map": {"items": "${ input }", "branch": {"start": "s", "steps": {"s": {"succeed": {}}}}},
        "workflow": {"name": "child"},
    }[kind]
    doc = {"name": "x", "version": 1, "start": "a", "steps": {"a": {kind: body}}}
    assert definition_from_body(doc).steps["a"].next is None  # type: ignore[union-attr]
    looping = {**doc, "steps": {"a": {kind: body, "next": "a"}}}
    with pytest.raises(DefinitionError, match="'a' can never finish"):
        definition_from_body(looping)
    caught = {
        **doc,
        "steps": {
            "a": {kind: body, "next": "a", "catch": [{"errors": ["*"], "next": "z"}]},
            "z": {"succeed": {}},
        },
    }
    assert set(definition_from_body(caught).steps) == {"a", "z"}


@pytest.mark.parametrize(
    ("reserve", "path", "fragment"),
    [
        ("{}", "$.steps.fan.parallel.reserve", "needs one of total, per_branch"),
        ("{total: {}}", "$.steps.fan.parallel.reserve.total", "name at least one resource"),
        (
            "{per_branch: {tokens: -1}}",
            "$.steps.fan.parallel.reserve.per_branch.tokens",
            "-1 must be greater than 0",
        ),
        (
            "{total: {'a b': 1}}",
            "$.steps.fan.parallel.reserve.total['a b']",
            "not a valid resource name",
        ),
        (
            "{total: {tokens: '5'}}",
            "$.steps.fan.parallel.reserve.total.tokens",
            "expected number, got string",
        ),
        ("{totl: {tokens: 5}}", "$.steps.fan.parallel.reserve.totl", "did you mean 'total'?"),
    ],
)
def test_reserve_faults(reserve: str, path: str, fragment: str) -> None:
    text = (
        "name: x\nversion: 1\nstart: fan\nsteps:\n  fan:\n    parallel:\n"
        f"      reserve: {reserve}\n"
        "      branches: {b: {start: a, steps: {a: {succeed: {}}}}}\n"
    )
    faults = faults_of(text)
    assert any(f.path == path and fragment in f.message for f in faults), faults


def test_on_timeout_is_an_entry_point_of_the_graph() -> None:
    text = """\
name: x
version: 1
timeout: 2h
on_timeout: late
start: a
steps:
  a: {effect: h, idempotent: true}
  late: {effect: h.notify, idempotent: true, next: gone}
  gone: {fail: {error: Late}}
"""
    d = parse_definition(text)
    assert (d.timeout, d.on_timeout) == (7200.0, "late")
    faults = faults_of(text.replace("timeout: 2h\non_timeout: late\n", ""))
    assert [f.path for f in faults] == ["$.steps.late", "$.steps.gone"]
    assert "unreachable from start 'a'" in faults[0].message


def test_signal_schema_references_resolve_inside_it() -> None:
    text = """\
name: x
version: 1
start: w
steps:
  w:
    wait:
      signal: go
      schema:
        $id: "urn:example:go"
        $defs: {who: {type: string}}
        properties: {by: {$ref: "#/$defs/who"}}
"""
    step = parse_definition(text).steps["w"]
    assert isinstance(step, WaitStep) and step.schema is not None
    faults = faults_of(text.replace("#/$defs/who", "#/$defs/whom"))
    assert [f.path for f in faults] == ["$.steps.w.wait.schema.properties.by['$ref']"]
    assert "only references inside the signal schema" in faults[0].message


@pytest.mark.parametrize(
    ("step", "path", "fragment"),
    [
        (
            "{effect: h, idempotent: true, retry: []}",
            "$.steps.a.retry",
            "at least one retry policy",
        ),
        (
            "{effect: h, idempotent: true, retry: [{errors: [A, A]}]}",
            "$.steps.a.retry[0].errors",
            "'A' is listed twice",
        ),
        (
            "{effect: h, idempotent: true, retry: [{errors: [A]}, {errors: [A]}]}",
            "$.steps.a.retry[1]",
            "this policy never applies: earlier policies already cover 'A'",
        ),
        (
            "{effect: h, idempotent: true, retry: {max_attempts: 0}}",
            "$.steps.a.retry.max_attempts",
            "0 is less than the minimum of 1",
        ),
        (
            "{effect: h, idempotent: true, retry: {max_attempts: true}}",
            "$.steps.a.retry.max_attempts",
            "expected integer or string, got boolean",
        ),
        (
            "{effect: h, idempotent: true, callback: {timeout: -1}}",
            "$.steps.a.callback.timeout",
            "less than the minimum of 0",
        ),
        (
            "{effect: h, idempotent: true, compensate: {effect: h, idempotent: maybe}}",
            "$.steps.a.compensate.idempotent",
            "expected boolean",
        ),
        ("{effect: h, idempotent: true, limits: api}", "$.steps.a.limits", "expected array"),
        ("{fail: {error: E}, catch: []}", "$.steps.a.catch", "a fail step cannot fail into catch"),
        ("{set: [1]}", "$.steps.a.set", "expected object, got array"),
        (
            "{wait: {any: [{signal: s, next: a}], timeout: 1h}}",
            "$.steps.a.wait.timeout",
            "only with",
        ),
        (
            "{wait: {any: [{signal: s, next: b}, {duration: 0, next: b}]}}",
            "$.steps.a.wait.any[1].duration",
            "duration must be greater than zero",
        ),
        (
            "{wait: {any: [{until: soon, next: b}]}}",
            "$.steps.a.wait.any[0].until",
            "is not an ISO-8601 timestamp",
        ),
        ("{wait: {signal: s, schema: 5}}", "$.steps.a.wait.schema", "expected object or boolean"),
    ],
)
def test_misuse_of_the_new_fields(step: str, path: str, fragment: str) -> None:
    text = f"name: x\nversion: 1\nstart: a\nsteps:\n  a: {step}\n  b: {{succeed: {{}}}}\n"
    faults = faults_of(text)
    assert any(f.path == path and fragment in f.message and f.line == 5 for f in faults), faults


def test_a_wait_with_any_is_not_an_end() -> None:
    text = "name: x\nversion: 1\nstart: a\nsteps:\n  a: {wait: {any: [{signal: s, next: a}]}}\n"
    (fault,) = faults_of(text)
    assert fault.path == "$.steps.a" and "can never finish" in fault.message
    # A misspelt next of an event does not also make its target look unreachable.
    text = (
        "name: x\nversion: 1\nstart: a\nsteps:\n  a: {wait: {any: [{signal: s, nxt: b}]}}\n"
        "  b: {succeed: {}}\n"
    )
    assert {f.path for f in faults_of(text)} == {
        "$.steps.a.wait.any[0].nxt",
        "$.steps.a.wait.any[0]",
    }


@pytest.mark.parametrize(
    ("head", "step_a", "path"),
    [
        ("start: a\n", "{effect: h, idempotent: true, next: shipp}", "$.steps.a.next"),
        (
            "start: a\n",
            "{wait: {any: [{signal: s, next: shipp}, {duration: 1h, next: late}]}}",
            "$.steps.a.wait.any[0].next",
        ),
        (
            "start: a\n",
            "{effect: h, idempotent: true, catch: [{errors: [E], next: shipp}], next: late}",
            "$.steps.a.catch[0].next",
        ),
        ("timeout: 1h\non_timeout: lat\nstart: a\n", "{effect: h, idempotent: true, next: ship}",
         "$.on_timeout"),
        ("start: aa\n", "{effect: h, idempotent: true, next: ship}", "$.start"),
    ],
)
def test_a_misspelt_target_is_one_fault_not_a_cascade(head: str, step_a: str, path: str) -> None:
    """The step a misspelt target likely means (the one suggested) is not also reported
    unreachable, nor are the steps after it (``late`` may be, where nothing goes to it)."""
    text = (
        f"name: x\nversion: 1\n{head}steps:\n  a: {step_a}\n"
        "  ship: {effect: h.ship, idempotent: true, next: done}\n"
        "  late: {effect: h.late, idempotent: true, next: done}\n"
        "  done: {succeed: {}}\n"
    )
    faults = faults_of(text)
    (fault,) = [f for f in faults if f.path == path]
    assert "did you mean" in fault.message, fault
    unreachable = {f.path for f in faults if "unreachable" in f.message}
    assert not unreachable & {"$.steps.ship", "$.steps.done"}, faults


def test_a_target_like_no_step_suggests_the_steps_nothing_goes_to() -> None:
    """Regression (tutorial 1): the hint read `(no step goes to 'done' yet)`, unlike the
    other hints; it asks, as they do."""
    text = (
        "name: x\nversion: 1\nstart: a\nsteps:\n"
        "  a: {effect: h, idempotent: true, next: finish}\n"
        "  done: {succeed: {}}\n"
    )
    (fault,) = faults_of(text)
    assert fault.message == (
        "next step 'finish' does not exist; did you mean 'done', which no step goes to yet?"
    )
    (fault,) = faults_of(text + "  other: {succeed: {}}\n")
    assert fault.message.endswith("did you mean one of 'done', 'other', which no step goes to yet?")


def test_expressions_that_read_nothing_are_reported() -> None:
    """A misspelt root, a step no graph has, or true/false read as a field are null for every
    task; names inside projections and filters read the elements and are not checked."""
    text = """\
name: x
version: 1
start: a
steps:
  a:
    effect: h
    idempotent: true
    args:
      typo: "${ stpes.a.total }"
      gone: "total ${ steps.reserv.total }"
      flag: "${ input.flag == true }"
      fine: "${ input.items[?price > `1`].name || input.x == null }"
      branch: "${ steps.b.value }"
      ctx: "${ context.step }"
    next: fan
  fan:
    parallel:
      branches:
        one:
          start: b
          steps:
            b: {effect: h, idempotent: true}
"""
    faults = {f.path: f.message for f in faults_of(text)}
    assert set(faults) == {"$.steps.a.args.typo", "$.steps.a.args.gone", "$.steps.a.args.flag"}
    assert faults["$.steps.a.args.typo"].endswith(
        "reads 'stpes', which is nothing: an expression reads input, steps or context;"
        " did you mean 'steps'?"
    )
    assert "reads step 'reserv', which no graph of this definition has" in faults[
        "$.steps.a.args.gone"
    ]
    assert "write `true` in backquotes" in faults["$.steps.a.args.flag"]


# --- faults -----------------------------------------------------------------------------------


def test_faults_collect_everything_and_print_with_file_and_line() -> None:
    text = """\
name: Bad Name
version: 0
start: a
steps:
  a: {effect: h, idempotent: true, next: b, retry: {max_attempts: 0}}
  b: {effect: h, idempotnt: true, next: d}
  d: {fail: {error: E}}
  c: {succeed: {output: "${ x. }"}}
"""
    faults = faults_of(text, source="flows/bad.yaml")
    printed = [str(f) for f in faults]
    assert any(
        p.startswith("flows/bad.yaml:1: $.name: 'Bad Name' is not a valid workflow")
        for p in printed
    )
    assert any(p.startswith("flows/bad.yaml:2: $.version: 0 is less than") for p in printed)
    assert any("flows/bad.yaml:5: $.steps.a.retry.max_attempts:" in p for p in printed)
    assert any(
        "flows/bad.yaml:6: $.steps.b.idempotnt: unknown field 'idempotnt'" in p for p in printed
    )
    assert any(
        "flows/bad.yaml:8: $.steps.c.succeed.output: invalid expression 'x.'" in p for p in printed
    )
    assert any("$.steps.c: step 'c' is unreachable" in p for p in printed)
    assert len(set(faults)) == len(faults)


def test_best_match_comes_first() -> None:
    text = MINIMAL.replace("version: 1", "version: '1'") + "extra: 1\n"
    faults = faults_of(text)
    assert {f.path for f in faults} == {"$.version", "$.extra"}


def test_one_bad_step_does_not_cascade() -> None:
    text = """\
name: x
version: 1
start: a
steps:
  a: {effect: h, idempotent: true, nxt: b}
  b: {effect: h, idempotent: true, next: c}
  c: {succeed: {}}
"""
    faults = faults_of(text)
    assert [f.path for f in faults] == ["$.steps.a.nxt"]


def test_body_faults_have_no_line() -> None:
    with pytest.raises(DefinitionError) as caught:
        definition_from_body({"name": "x", "version": 1, "start": "a", "steps": {"b": {}}})
    assert all(f.line is None and f.file == "<body>" for f in caught.value.faults)
    with pytest.raises(DefinitionError) as caught:
        definition_from_body({"name": "x", "version": 1, "start": "a", "steps": {}}, source="db")
    assert caught.value.faults[0].file == "db"
    with pytest.raises(DefinitionError, match="mapping key 1 is not a string"):
        definition_from_body({"name": "x", "version": 1, "start": "a", "steps": {1: {}}})
