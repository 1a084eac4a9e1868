from __future__ import annotations

import dataclasses
import json
import pathlib
import pickle
import re
import sys
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from toolkit.definition import (
    DEFAULT_MAX_STEPS,
    TIMEOUT_ERROR,
    Branch,
    Callback,
    CatchRule,
    ChoiceStep,
    Compensation,
    EffectStep,
    FailStep,
    MapStep,
    ParallelStep,
    Reservation,
    RetryPolicy,
    SetStep,
    SucceedStep,
    WaitEvent,
    WaitStep,
    WorkflowDefinition,
    WorkflowStep,
    catch_target,
    definition_from_body,
    load_definition,
    load_definitions,
    parse_definition,
    schema_path,
)
from toolkit.errors import (
    DefinitionError,
    DefinitionFault,
    ExpressionError,
    InputError,
    NoChoiceMatched,
    ToolkitError,
)

CORPUS = pathlib.Path(__file__).parent / "corpus"
VALID = sorted((CORPUS / "valid").glob("*.yaml"))
INVALID = sorted((CORPUS / "invalid").glob("*.yaml"))

# Each invalid corpus file starts with one or more lines
#     # expect: LINE: PATH: FRAGMENT
# mirroring how a fault prints (FILE:LINE: PATH: message) without the file. LINE is the
# 1-based line of the fault in that file, or "-" when the fault has no line; PATH is the
# exact JSON path; FRAGMENT must occur in the message. Every expectation must be met by
# some fault of the file.
EXPECT = re.compile(r"^# expect: (?P<line>\d+|-): (?P<path>\$.*?): (?P<fragment>.+)$")

MINIMAL = """\
name: demo
version: 1
start: done
steps:
  done: {succeed: {}}
"""


def expectations(path: pathlib.Path) -> list[tuple[int | None, str, str]]:
    found = []
    for text in path.read_text(encoding="utf-8").splitlines():
        if not text.startswith("#"):
            break
        match = EXPECT.match(text)
        if match:
            line = None if match["line"] == "-" else int(match["line"])
            found.append((line, match["path"], match["fragment"]))
    return found


def faults_of(text: str, source: str = "<string>") -> tuple[DefinitionFault, ...]:
    with pytest.raises(DefinitionError) as caught:
        parse_definition(text, source=source)
    return caught.value.faults


# --- the corpus -------------------------------------------------------------------------------


def test_corpus_is_large_enough() -> None:
    assert len(INVALID) >= 25
    assert len(VALID) >= 5


def test_corpus_covers_composition() -> None:
    composite = ("parallel", "map", "workflow", "budget", "reserve")
    valid = [p for p in VALID if any(word in p.read_text() for word in composite)]
    invalid = [p for p in INVALID if any(word in p.read_text() for word in composite)]
    assert len(valid) >= 3 and len(invalid) >= 12


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_corpus(path: pathlib.Path) -> None:
    expected = expectations(path)
    assert expected, f"{path.name} must start with '# expect: LINE: PATH: FRAGMENT'"
    with pytest.raises(DefinitionError) as caught:
        load_definition(path)
    faults = caught.value.faults
    assert faults
    for line, json_path, fragment in expected:
        assert any(
            f.line == line and f.path == json_path and fragment in f.message for f in faults
        ), f"no fault {line}: {json_path}: {fragment!r} in:\n{caught.value}"
    for fault in faults:
        assert fault.file == str(path)
        assert fault.path.startswith("$")
    assert str(caught.value).splitlines() == [str(f) for f in faults]


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_corpus(path: pathlib.Path) -> None:
    definition = load_definition(path)
    assert definition.source == str(path)
    assert definition.steps[definition.start]
    assert re.fullmatch(r"[0-9a-f]{64}", definition.digest)
    assert definition.key == (definition.name, definition.version, definition.digest)
    # The stored body rebuilds the same definition.
    rebuilt = definition_from_body(json.loads(json.dumps(definition.body)))
    assert rebuilt == definition
    assert rebuilt.digest == definition.digest
    assert rebuilt.steps.keys() == definition.steps.keys()


def reordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_digest_is_stable_under_formatting(path: pathlib.Path) -> None:
    definition = load_definition(path)
    body = reordered(definition.body)
    assert list(body) != list(definition.body)
    variants = [
        yaml.safe_dump(body, default_flow_style=False, sort_keys=False),
        yaml.safe_dump(body, default_flow_style=True, sort_keys=False, width=1000),
        "# a comment\n\n" + yaml.safe_dump(body, sort_keys=True, indent=4),
        json.dumps(body, indent=2),
    ]
    for text in variants:
        assert parse_definition(text).digest == definition.digest


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_digest_changes_with_content(path: pathlib.Path) -> None:
    definition = load_definition(path)
    changed = json.loads(json.dumps(definition.body))
    changed["description"] = changed.get("description", "") + " (changed)"
    assert definition_from_body(changed).digest != definition.digest
    bumped = {**definition.body, "version": definition.version + 1}
    assert definition_from_body(bumped).digest != definition.digest


def test_digest_is_sha256_of_canonical_json() -> None:
    import hashlib

    definition = parse_definition(MINIMAL)
    canonical = json.dumps(
        definition.body, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert definition.digest == hashlib.sha256(canonical.encode()).hexdigest()


# --- the model --------------------------------------------------------------------------------


ORDER = CORPUS / "valid" / "order-fulfilment.yaml"


def test_model_of_the_order_example() -> None:
    d = load_definition(ORDER)
    assert (d.name, d.version, d.start) == ("order-fulfilment", 3, "reserve")
    assert d.description.startswith("Reserve stock")
    assert list(d.steps) == ["reserve", "route", "review", "decide", "charge", "done", "oops"]
    assert d.handlers() == frozenset({"inventory.reserve", "orders.review", "payments.charge"})

    reserve = d.steps["reserve"]
    assert isinstance(reserve, EffectStep)
    assert (reserve.handler, reserve.idempotent, reserve.next) == (
        "inventory.reserve",
        True,
        "route",
    )
    assert reserve.retry == RetryPolicy(5, 1.0, 2.0, 60.0, True, ("OutOfStock",))
    assert reserve.timeout == 30.0
    assert reserve.args.render({"input": {"order_id": "A1"}}) == {"order": "A1"}

    charge = d.steps["charge"]
    assert isinstance(charge, EffectStep)
    assert charge.retry == RetryPolicy(3, 1.0, 2.0, 60.0, True, ())  # from defaults
    assert charge.timeout == 30.0
    assert charge.args.is_constant and charge.args.render({}) is None

    route = d.steps["route"]
    assert isinstance(route, ChoiceStep)
    assert route.default == "charge"
    assert [rule.next for rule in route.choices] == ["review"]
    assert route.choices[0].when.render({"steps": {"reserve": {"total": 101}}}) is True

    done = d.steps["done"]
    assert isinstance(done, SucceedStep)
    assert done.output.render({"steps": {"charge": {"id": 7}}}) == {"id": 7}

    oops = d.steps["oops"]
    assert isinstance(oops, FailStep)
    assert oops.error == "OrderRejected"
    assert oops.message.render({"input": {"order_id": "A1"}}) == "order A1 rejected"


def test_defaults_without_retry_or_timeout() -> None:
    d = parse_definition(
        "name: x\nversion: 1\nstart: a\nsteps:\n  a: {effect: h, idempotent: false}\n"
    )
    step = d.steps["a"]
    assert isinstance(step, EffectStep)
    # Built-in defaults (the lead's decision: three attempts, delays capped at one minute).
    assert step.retry == RetryPolicy() == RetryPolicy(3, 1.0, 2.0, 60.0, True, ())
    assert step.timeout is None
    assert step.next is None
    assert d.input_schema == {}
    assert d.description == ""


def test_retry_fields_merge_step_over_defaults() -> None:
    d = parse_definition(
        """
name: x
version: 1
defaults: {retry: {max_attempts: 4, initial: 2s, jitter: false}, timeout: 1m}
start: a
steps:
  a: {effect: h, idempotent: true, retry: {initial: 500ms, non_retryable: [Boom]}, timeout: 5}
"""
    )
    step = d.steps["a"]
    assert isinstance(step, EffectStep)
    assert step.retry == RetryPolicy(4, 0.5, 2.0, 60.0, False, ("Boom",))
    assert step.timeout == 5.0


def test_succeed_and_fail_defaults() -> None:
    d = parse_definition(
        "name: x\nversion: 1\nstart: a\nsteps:\n"
        "  a: {choice: [{when: '${ input.ok }', next: b}], default: c}\n"
        "  b: {succeed: {}}\n  c: {fail: {error: pkg.Bad}}\n"
    )
    b, c, a = d.steps["b"], d.steps["c"], d.steps["a"]
    assert isinstance(b, SucceedStep) and b.output.render({}) is None
    assert isinstance(c, FailStep) and c.message.render({}) == "" and c.error == "pkg.Bad"
    assert isinstance(a, ChoiceStep)


def test_choice_without_default_is_valid() -> None:
    d = parse_definition(
        "name: x\nversion: 1\nstart: a\nsteps:\n"
        "  a: {choice: [{when: '${ input.ok }', next: b}]}\n  b: {succeed: {}}\n"
    )
    step = d.steps["a"]
    assert isinstance(step, ChoiceStep) and step.default is None


def test_definition_is_immutable_and_compares_by_key() -> None:
    d = parse_definition(MINIMAL, source="a.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        d.steps["new"] = d.steps["done"]  # type: ignore[index]
    same = parse_definition(MINIMAL.replace("{succeed: {}}", "\n    succeed: {}"), source="b")
    assert same == d and hash(same) == hash(d)
    assert {d, same} == {d}
    assert d != parse_definition(MINIMAL.replace("version: 1", "version: 2"))
    assert d != "not a definition"
    assert isinstance(d, WorkflowDefinition)


def test_source_labels() -> None:
    assert parse_definition(MINIMAL).source == "<string>"
    assert parse_definition(MINIMAL, source="x.yaml").source == "x.yaml"
    body = parse_definition(MINIMAL).body
    assert definition_from_body(body).source is None
    assert definition_from_body(body, source="db").source == "db"


# --- catch and wait ---------------------------------------------------------------------------


def test_catch_rule_matching() -> None:
    rule = CatchRule(errors=("OutOfStock", "pkg.Declined"), next="refund")
    assert rule.matches("OutOfStock") and rule.matches("pkg.Declined")
    assert not rule.matches("Declined") and not rule.matches("*x")
    anything = CatchRule(errors=("*",), next="oops")
    assert anything.matches("Timeout") and anything.matches("")
    rules = [CatchRule(("A",), "a"), CatchRule(("*",), "any"), CatchRule(("B",), "b")]
    assert catch_target(rules, "A") == "a"
    assert catch_target(rules, "B") == "any"  # rules are tried in order
    assert catch_target(rules[2:], "C") is None
    assert catch_target((), "A") is None


def test_model_of_catch() -> None:
    d = load_definition(CORPUS / "valid" / "catch.yaml")
    charge = d.steps["charge"]
    assert isinstance(charge, EffectStep)
    assert charge.catch == (
        CatchRule(("PaymentDeclined", "payments.CardExpired"), "release"),
        CatchRule(("*",), "refund"),
    )
    assert catch_target(charge.catch, "payments.CardExpired") == "release"
    assert catch_target(charge.catch, "Boom") == "refund"
    ship = d.steps["ship"]
    assert isinstance(ship, EffectStep) and ship.catch == () and ship.next is None
    assert d.handlers() == frozenset(
        {
            "inventory.reserve",
            "payments.charge",
            "shipping.ship",
            "inventory.release",
            "payments.refund",
        }
    )
    # The field has a default, so code building steps by hand keeps working.
    built = EffectStep("a", "h", True, ship.args, RetryPolicy(), None, None)
    assert built.catch == ()


def test_model_of_waits() -> None:
    timers = load_definition(CORPUS / "valid" / "wait-duration.yaml")
    assert timers.steps["pause"] == WaitStep("pause", 5400.0, None, None, None, "remind")
    assert timers.steps["cool_down"] == WaitStep("cool_down", 2.5, None, None, None, None)
    assert timers.handlers() == frozenset({"mail.send", "mail.remind"})

    dated = load_definition(CORPUS / "valid" / "wait-until.yaml")
    hold = dated.steps["hold"]
    assert isinstance(hold, WaitStep) and hold.until is not None
    assert (hold.duration, hold.signal, hold.timeout, hold.next, hold.catch) == (
        None,
        None,
        None,
        "not_before_launch",
        (),
    )
    assert hold.until.is_expression
    scope = {"input": {"deliver_at": "2030-05-01T10:00:00+02:00"}}
    assert hold.until.render(scope) == "2030-05-01T10:00:00+02:00"
    fixed = dated.steps["not_before_launch"]
    assert isinstance(fixed, WaitStep) and fixed.until is not None
    assert fixed.until.is_constant and fixed.until.render({}) == "2030-01-01T09:00:00+01:00"

    signals = load_definition(CORPUS / "valid" / "wait-signal.yaml")
    approve = signals.steps["approve"]
    assert approve == WaitStep(
        "approve",
        duration=None,
        until=None,
        signal="approved",
        timeout=172800.0,
        next="second_opinion",
        catch=(CatchRule(("Timeout",), "escalate"),),
    )
    assert isinstance(approve, WaitStep)
    assert catch_target(approve.catch, TIMEOUT_ERROR) == "escalate"
    forever = signals.steps["second_opinion"]
    assert isinstance(forever, WaitStep)
    assert (forever.signal, forever.timeout, forever.catch) == ("manager.ok-2", None, ())
    escalate = signals.steps["escalate"]
    assert isinstance(escalate, WaitStep) and escalate.next is None


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
    in_branch = [branch["$ref"] for branch in schema["$defs"]["branchStep"]["oneOf"]]
    branch_kinds = ("effect", "choice", "succeed", "fail", "set")
    assert in_branch == [f"#/$defs/{kind}Step" for kind in branch_kinds]


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


# --- parallel, map, child workflows, budgets --------------------------------------------------


def test_model_of_a_race() -> None:
    d = load_definition(CORPUS / "valid" / "parallel-race.yaml")
    assert d.budget == {"tokens": 10000.0, "usd": 2.5}
    assert all(isinstance(amount, float) for amount in d.budget.values())
    with pytest.raises(TypeError):
        d.budget["tokens"] = 1  # type: ignore[index]
    research = d.steps["research"]
    assert isinstance(research, ParallelStep)
    assert (research.id, research.mode, research.cancel_losers, research.next) == (
        "research",
        "first_success",
        True,
        "summarise",
    )
    assert research.reserve == Reservation({"tokens": 2000.0}, per_branch=False)
    assert research.catch == (CatchRule(("*",), "fallback"),)
    assert list(research.branches) == ["fast", "slow"]
    fast, slow = research.branches["fast"], research.branches["slow"]
    assert isinstance(fast, Branch) and fast.start == "ask" and list(fast.steps) == ["ask"]
    ask = fast.steps["ask"]
    assert isinstance(ask, EffectStep) and ask.next is None  # ends the branch
    assert ask.args.render({"input": {"q": "why"}}) == {"q": "why"}
    assert ask.args.path == "$.steps.research.parallel.branches.fast.steps.ask.args"
    # The definition's effect defaults apply inside branches too.
    assert ask.retry == RetryPolicy(max_attempts=2) and ask.timeout == 20.0
    a, b = slow.steps["a"], slow.steps["b"]
    assert isinstance(a, EffectStep) and (a.timeout, a.next) == (120.0, "b")
    assert isinstance(b, SucceedStep) and b.output.render({"steps": {"a": 1}}) == 1
    with pytest.raises(TypeError):
        research.branches["new"] = fast  # type: ignore[index]
    with pytest.raises(TypeError):
        fast.steps["new"] = ask  # type: ignore[index]
    fallback = d.steps["fallback"]
    assert isinstance(fallback, ParallelStep)
    assert (fallback.mode, fallback.cancel_losers, fallback.reserve, fallback.next) == (
        "all",
        False,
        None,
        None,
    )
    assert d.handlers() == frozenset({"llm.ask", "llm.ask_slow", "llm.summarise", "cache.lookup"})


def test_model_of_parallel_all_with_catch_choice_and_fail_in_branches() -> None:
    d = load_definition(CORPUS / "valid" / "parallel-all.yaml")
    fan = d.steps["fan"]
    assert isinstance(fan, ParallelStep) and fan.mode == "all"
    assert fan.reserve == Reservation({"api.calls": 3.0}, per_branch=True)
    stock, credit = fan.branches["stock"], fan.branches["credit"]
    check = stock.steps["check"]
    assert isinstance(check, EffectStep) and check.handler == "inventory.check"
    assert check.catch == (CatchRule(("OutOfStock",), "none_left"),)
    assert check.retry.non_retryable == ("OutOfStock",)
    route = credit.steps["route"]
    assert isinstance(route, ChoiceStep) and route.default == "refused"
    assert route.choices[0].when.render({"steps": {"check": {"score": 700}}}) is True
    refused = credit.steps["refused"]
    assert isinstance(refused, FailStep) and refused.error == "CreditRefused"
    assert d.handlers() == frozenset({"orders.check", "inventory.check", "credit.check"})


def test_model_of_a_map() -> None:
    d = load_definition(CORPUS / "valid" / "map-batch.yaml")
    step = d.steps["per_file"]
    assert isinstance(step, MapStep)
    assert step.items.is_expression and step.items.path == "$.steps.per_file.map.items"
    assert step.items.render({"input": {"files": ["a", "b"]}}) == ["a", "b"]
    assert (step.max_concurrency, step.cancel_losers, step.next) == (4, False, None)
    assert step.reserve == Reservation({"tokens": 100.0}, per_branch=True)
    assert step.catch == (CatchRule(("*",), "failed"),)
    assert step.branch.start == "fetch" and list(step.branch.steps) == ["fetch", "parse"]
    fetch = step.branch.steps["fetch"]
    assert isinstance(fetch, EffectStep) and fetch.timeout == 10.0
    assert fetch.args.render({"context": {"item": "x.csv"}}) == "x.csv"
    assert d.handlers() == frozenset({"files.fetch", "files.parse"})
    assert d.budget == {}


def test_map_defaults() -> None:
    d = parse_definition(
        "name: x\nversion: 1\nstart: m\nsteps:\n  m:\n    map:\n"
        "      items: '${ input }'\n      branch: {start: a, steps: {a: {succeed: {}}}}\n"
    )
    step = d.steps["m"]
    assert isinstance(step, MapStep)
    assert (step.max_concurrency, step.cancel_losers, step.reserve, step.next, step.catch) == (
        None,
        False,
        None,
        None,
        (),
    )


def test_model_of_child_workflows() -> None:
    d = load_definition(CORPUS / "valid" / "child-workflow.yaml")
    pay = d.steps["pay"]
    assert isinstance(pay, WorkflowStep)
    assert (pay.workflow, pay.version, pay.next) == ("payment", 2, "notify")
    assert pay.input.render({"input": {"amount": 12.5}}) == {"amount": 12.5}
    assert pay.catch == (CatchRule(("ChildCancelled", "payments.Declined"), "declined"),)
    notify = d.steps["notify"]
    assert notify == WorkflowStep("notify", "notify.customer", None, notify.input, None)
    assert notify.input.is_constant and notify.input.render({}) is None
    assert d.handlers() == frozenset()


@pytest.mark.parametrize(
    "kind",
    [
        "wait: {duration: 1s}",
        "parallel: {branches: {}}",
        "map: {items: '${ input.a }'}",
        "workflow: {name: y}",
    ],
)
def test_only_effect_choice_succeed_and_fail_are_allowed_in_a_branch(kind: str) -> None:
    text = (
        "name: x\nversion: 1\nstart: fan\nsteps:\n  fan:\n    parallel:\n      branches:\n"
        "        one:\n          start: a\n          steps:\n"
        f"            a: {{{kind}}}\n"
    )
    (fault,) = faults_of(text)
    name = kind.split(":")[0]
    assert fault.path == f"$.steps.fan.parallel.branches.one.steps.a.{name}"
    assert fault.line == 11
    assert f"a {name} step is not allowed inside a branch" in fault.message


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
        "next step 'c' does not exist in branch 'left'",
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


def test_reserve_and_budget_accept_any_resource_name() -> None:
    text = """\
name: x
version: 1
budget: {tokens: 10}
start: fan
steps:
  fan:
    parallel:
      reserve: {total: {usd: 0.5, api.calls: 10, tokens: 5}}
      branches: {only: {start: a, steps: {a: {succeed: {}}}}}
"""
    step = parse_definition(text).steps["fan"]
    assert isinstance(step, ParallelStep) and step.reserve is not None
    assert step.reserve.amounts == {"usd": 0.5, "api.calls": 10.0, "tokens": 5.0}
    assert not step.reserve.per_branch


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


# --- retries by error, callbacks, compensation, limits, set, wait any, deadlines ------------------


def test_model_of_error_filtered_retries() -> None:
    d = load_definition(CORPUS / "valid" / "retry-by-error.yaml")
    charge = d.steps["charge"]
    assert isinstance(charge, EffectStep)
    limited = RetryPolicy(sys.maxsize, 10.0, 2.0, 300.0, False, (), ("RateLimited",), True)
    busy = RetryPolicy(5, 2.0, 2.0, 30.0, False, (), ("Unavailable", "payments.Gateway"))
    assert charge.retry_rules == (limited, busy)
    # No policy for any error: lost attempts count against the defaults with the most attempts.
    assert charge.retry == RetryPolicy(sys.maxsize, 2.0, 2.0, 30.0, False, unlimited=True)
    assert charge.retry_policy("RateLimited") == limited
    assert charge.retry_policy("payments.Gateway") == busy
    assert charge.retry_policy("Declined") is None  # named by no policy: not retried

    notify = d.steps["notify"]
    assert isinstance(notify, EffectStep)
    anything, bad_address = notify.retry_rules
    assert notify.retry is anything
    assert (anything.errors, anything.max_attempts, anything.non_retryable) == (
        ("*",),
        4,
        ("BadAddress",),
    )
    assert notify.retry_policy("Boom") is anything
    assert notify.retry_policy("BadAddress") is bad_address and bad_address.max_attempts == 1

    poll = d.steps["poll"]
    assert isinstance(poll, EffectStep) and poll.retry_rules == ()
    assert poll.retry == RetryPolicy(sys.maxsize, 2.0, 1.0, 30.0, False, unlimited=True)
    assert poll.retry_policy("Anything") is poll.retry


def test_retry_list_without_a_policy_for_any_error() -> None:
    d = parse_definition(
        """
name: x
version: 1
defaults: {retry: {max_attempts: 9, initial: 3s, non_retryable: [Fatal]}}
start: a
steps:
  a:
    effect: h
    idempotent: true
    retry: [{errors: [A], max_attempts: 2}, {errors: [B], max_attempts: 7, factor: 3}]
"""
    )
    step = d.steps["a"]
    assert isinstance(step, EffectStep)
    assert [(r.errors, r.max_attempts, r.factor, r.initial) for r in step.retry_rules] == [
        (("A",), 2, 2.0, 3.0),
        (("B",), 7, 3.0, 3.0),
    ]
    assert all(rule.non_retryable == ("Fatal",) for rule in step.retry_rules)
    assert step.retry == RetryPolicy(7, 3.0, 2.0, 60.0, True, ("Fatal",))
    assert not step.retry.unlimited


def test_new_fields_have_defaults() -> None:
    d = parse_definition(
        "name: x\nversion: 1\nstart: a\nsteps:\n  a: {effect: h, idempotent: true, next: b}\n"
        "  b: {fail: {error: E}}\n"
    )
    assert (d.timeout, d.on_timeout, d.max_steps) == (None, None, DEFAULT_MAX_STEPS)
    assert DEFAULT_MAX_STEPS == 10_000
    a, b = d.steps["a"], d.steps["b"]
    assert isinstance(a, EffectStep)
    assert (a.retry_rules, a.callback, a.compensate, a.limits) == ((), None, None, ())
    assert isinstance(b, FailStep) and b.compensate is False


def test_model_of_compensation_callback_limits_and_deadline() -> None:
    d = load_definition(CORPUS / "valid" / "saga-deadline.yaml")
    assert (d.timeout, d.on_timeout, d.max_steps) == (5400.0, "too_slow", 50)
    reserve, charge = d.steps["reserve"], d.steps["charge"]
    assert isinstance(reserve, EffectStep) and isinstance(charge, EffectStep)
    assert reserve.compensate is not None
    assert (reserve.compensate.handler, reserve.compensate.idempotent) == (
        "inventory.release",
        True,
    )
    assert reserve.compensate.args.path == "$.steps.reserve.compensate.args"
    scope = {"steps": {"reserve": {"reservation_id": "R1"}}}
    assert reserve.compensate.args.render(scope) == {"reservation": "R1"}
    assert reserve.callback is None and reserve.limits == ("inventory-api",)
    assert charge.compensate is not None and charge.compensate.idempotent is False
    assert charge.compensate.args.render({}) is None
    assert charge.callback == Callback(timeout=600.0)
    assert charge.limits == ("payments-api", "payments.eu")
    late = d.steps["too_slow"]
    assert isinstance(late, EffectStep) and late.callback == Callback(timeout=None)
    undo = d.steps["undo"]
    assert isinstance(undo, FailStep) and undo.compensate is True
    # Compensating effects are handlers the worker must have too.
    assert d.handlers() == frozenset(
        {
            "inventory.reserve",
            "inventory.release",
            "payments.charge",
            "payments.refund",
            "mail.send",
        }
    )
    assert isinstance(reserve.compensate, Compensation)


def test_compensation_handlers_inside_branches_count() -> None:
    d = parse_definition(
        """
name: x
version: 1
start: fan
steps:
  fan:
    parallel:
      branches:
        one:
          start: a
          steps:
            a: {effect: h.do, idempotent: true, compensate: {effect: h.undo}, limits: [api]}
"""
    )
    assert d.handlers() == frozenset({"h.do", "h.undo"})
    fan = d.steps["fan"]
    assert isinstance(fan, ParallelStep)
    inner = fan.branches["one"].steps["a"]
    assert isinstance(inner, EffectStep) and inner.limits == ("api",)


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


def test_model_of_wait_any_and_signal_schemas() -> None:
    d = load_definition(CORPUS / "valid" / "wait-any.yaml")
    decide = d.steps["decide"]
    assert isinstance(decide, WaitStep)
    assert (decide.duration, decide.until, decide.signal, decide.timeout, decide.next) == (
        None,
        None,
        None,
        None,
        None,
    )
    approved, rejected, remind, expired = decide.any
    assert approved.signal == "approved" and approved.next == "approved"
    assert approved.schema is not None and approved.schema["required"] == ["by"]
    assert rejected == WaitEvent("rejected", None, None, "rejected")
    assert remind == WaitEvent(None, 172800.0, None, "remind")
    assert (expired.signal, expired.duration, expired.next) == (None, None, "expired")
    assert expired.until is not None and expired.until.is_expression
    assert expired.until.path == "$.steps.decide.wait.any[3].until"
    assert expired.until.render({"input": {"expires_at": "2030-01-01T00:00:00Z"}}) == (
        "2030-01-01T00:00:00Z"
    )
    last_call = d.steps["last_call"]
    assert isinstance(last_call, WaitStep)
    assert last_call.schema == {"type": "object"} and last_call.any == ()
    assert (last_call.signal, last_call.timeout, last_call.next) == (
        "approved",
        86400.0,
        "approved",
    )


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


def test_model_of_set_steps() -> None:
    d = load_definition(CORPUS / "valid" / "set-step.yaml")
    total = d.steps["total"]
    assert isinstance(total, SetStep) and total.next == "lines"
    assert total.values.path == "$.steps.total.set"
    scope = {"input": {"order_id": "A1", "items": [1, 2]}, "steps": {"reserve": {"total": 9}}}
    assert total.values.render(scope) == {
        "sum": 9,
        "label": "order A1 (2 items)",
        "fixed": {"currency": "EUR", "lines": [1, 2]},
    }
    done = d.steps["done"]
    assert isinstance(done, SetStep) and done.next is None  # ends the workflow
    lines = d.steps["lines"]
    assert isinstance(lines, MapStep)
    net = lines.branch.steps["net"]
    assert isinstance(net, SetStep) and net.next is None  # ends the branch
    assert net.values.render({"context": {"item": {"sku": "S"}, "index": 0}}) == {
        "sku": "S",
        "position": 0,
    }
    assert d.handlers() == frozenset({"inventory.reserve"})


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


# --- input ------------------------------------------------------------------------------------


def test_validate_input_applies_nested_defaults() -> None:
    d = load_definition(CORPUS / "valid" / "input-defaults.yaml")
    value = {"customer": {"id": "c1"}, "options": {"channel": "sms"}}
    result = d.validate_input(value)
    assert result == {
        "customer": {"id": "c1"},
        "priority": 5,
        "options": {"channel": "sms", "notify": True},
    }
    assert value == {"customer": {"id": "c1"}, "options": {"channel": "sms"}}  # not modified
    assert d.validate_input({"customer": {"id": "c1"}})["options"] == {
        "notify": True,
        "channel": "email",
    }


@pytest.mark.parametrize(
    ("value", "path", "fragment"),
    [
        ({}, "$", 'missing required field "customer"'),
        ({"customer": {"id": 5}}, "$.customer.id", "expected string, got integer 5"),
        ({"customer": {"id": None}}, "$.customer.id", "expected string, got null"),
        ({"customer": {"id": "c"}, "priority": -1}, "$.priority", "less than the minimum"),
        ({"customer": {"id": "c"}, "options": {"channel": "fax"}}, "$.options.channel", '"fax"'),
        ("text", "$", 'expected object, got string "text"'),
    ],
)
def test_validate_input_errors(value: Any, path: str, fragment: str) -> None:
    d = load_definition(CORPUS / "valid" / "input-defaults.yaml")
    with pytest.raises(InputError) as caught:
        d.validate_input(value)
    assert caught.value.path == path
    assert fragment in str(caught.value)
    assert path in str(caught.value)


def test_input_schema_absent_or_boolean() -> None:
    assert parse_definition(MINIMAL).validate_input({"anything": [1]}) == {"anything": [1]}
    closed = parse_definition(MINIMAL + "input: false\n")
    with pytest.raises(InputError):
        closed.validate_input({})
    assert parse_definition(MINIMAL + "input: true\n").validate_input(3) == 3


def test_input_schema_never_fetches_remote_references() -> None:
    faults = faults_of(MINIMAL + "input: {$ref: 'https://example.com/schema.json'}\n")
    assert faults[0].path == "$.input['$ref']"
    assert "cannot resolve $ref" in faults[0].message
    d = parse_definition(
        MINIMAL + "input: {$ref: 'https://json-schema.org/draft/2020-12/schema'}\n"
    )
    assert d.validate_input({"type": "object"}) == {"type": "object"}
    with pytest.raises(InputError):
        d.validate_input({"type": 5})


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


def test_fault_format() -> None:
    assert str(DefinitionFault("f.yaml", 3, "$.a", "bad")) == "f.yaml:3: $.a: bad"
    assert str(DefinitionFault("f.yaml", None, "$", "bad")) == "f.yaml: $: bad"
    error = DefinitionError([DefinitionFault("f", 1, "$", "a"), DefinitionFault("f", 2, "$", "b")])
    assert str(error) == "f:1: $: a\nf:2: $: b"
    assert isinstance(error, ToolkitError)
    assert str(DefinitionError([])) == "Invalid workflow definition."


def test_body_faults_have_no_line() -> None:
    with pytest.raises(DefinitionError) as caught:
        definition_from_body({"name": "x", "version": 1, "start": "a", "steps": {"b": {}}})
    assert all(f.line is None and f.file == "<body>" for f in caught.value.faults)
    with pytest.raises(DefinitionError) as caught:
        definition_from_body({"name": "x", "version": 1, "start": "a", "steps": {}}, source="db")
    assert caught.value.faults[0].file == "db"
    with pytest.raises(DefinitionError, match="mapping key 1 is not a string"):
        definition_from_body({"name": "x", "version": 1, "start": "a", "steps": {1: {}}})


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
                walk(child, f"{where}/{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{where}/{i}")

    walk(schema, "#")


# --- files ------------------------------------------------------------------------------------


def test_load_definition_missing_or_unreadable(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(DefinitionError) as caught:
        load_definition(missing)
    (fault,) = caught.value.faults
    assert fault.file == str(missing) and fault.line is None
    assert "cannot read the file" in fault.message
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(DefinitionError, match="not valid UTF-8"):
        load_definition(latin)
    with pytest.raises(DefinitionError, match="cannot read the file"):
        load_definition(tmp_path)


def test_load_definitions_from_directories_and_files(tmp_path: pathlib.Path) -> None:
    (tmp_path / "b.yaml").write_text(MINIMAL.replace("demo", "bee"))
    (tmp_path / "a.yml").write_text(MINIMAL.replace("demo", "ant"))
    (tmp_path / "notes.txt").write_text("not a definition")
    extra = tmp_path / "sub" / "c.yaml"
    extra.parent.mkdir()
    extra.write_text(MINIMAL.replace("demo", "cat"))
    loaded = load_definitions([tmp_path, extra, tmp_path / "a.yml"])
    assert [d.name for d in loaded] == ["ant", "bee", "cat"]
    assert load_definitions([]) == []


def test_load_definitions_collects_faults_of_all_files(tmp_path: pathlib.Path) -> None:
    (tmp_path / "1.yaml").write_text(MINIMAL)
    (tmp_path / "2.yaml").write_text(
        "# same name and version\n" + MINIMAL.replace("{}}", "{output: 1}}")
    )
    (tmp_path / "3.yaml").write_text(MINIMAL.replace("version: 1", "version: x"))
    (tmp_path / "4.yaml").write_text("name: [")
    with pytest.raises(DefinitionError) as caught:
        load_definitions([tmp_path, tmp_path / "missing.yaml"])
    by_file = {pathlib.Path(f.file).name: f for f in caught.value.faults}
    assert set(by_file) == {"2.yaml", "3.yaml", "4.yaml", "missing.yaml"}
    duplicate = by_file["2.yaml"]
    assert duplicate.line == 3 and duplicate.path == "$.version"
    assert "demo version 1 is also defined in" in duplicate.message
    assert "1.yaml" in duplicate.message
    assert by_file["4.yaml"].message.startswith("invalid YAML")


def test_yaml_syntax_error_has_the_line() -> None:
    (fault,) = faults_of("name: x\nsteps:\n  a: [1, 2\n  b: 3\n")
    assert fault.path == "$" and fault.line is not None and fault.line >= 3
    assert fault.message.startswith("invalid YAML")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a: 1\n---\nb: 2\n", "expected a single document"),
        ("a: !!python/object:os.system {}\n", "could not determine a constructor"),
        ("a: !!int abc\n", "invalid YAML"),
        ("a: !!binary aGVsbG8=\n", "a value of type bytes is not allowed"),
        ("a: .inf\n", "numbers must be finite"),
        ("a: !!timestamp 2024-01-01\n", "is not allowed"),
        ("a: !!set {x, y}\n", "is not allowed"),
        ("? [1, 2]\n: x\n", "invalid YAML"),
        ("a: &x [*x]\n", "recursive YAML alias"),
        ("\t- x", "invalid YAML"),
        ("a: \x00\n", "invalid YAML"),
        ("[" * 5000, "invalid YAML"),
    ],
)
def test_hostile_yaml_gives_faults(text: str, fragment: str) -> None:
    faults = faults_of(text)
    assert any(fragment in f.message for f in faults), faults


def test_alias_bomb_is_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    (fault,) = faults_of("\n".join(lines) + "\n")
    assert "too large" in fault.message


def test_yaml_1_2_scalars() -> None:
    d = load_definition(CORPUS / "valid" / "yaml-core-scalars.yaml")
    step = d.steps["call"]
    assert isinstance(step, EffectStep)
    assert step.args.render({}) == {
        "country": "NO",
        "answer": "yes",
        "switch": "on",
        "date": "2024-01-31",
        "time": "12:30",
    }


# --- retry ------------------------------------------------------------------------------------


def test_retry_delay() -> None:
    policy = RetryPolicy(max_attempts=5, initial=1.0, factor=2.0, max=5.0, jitter=False)
    assert [policy.delay(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert policy.delay(10_000) == 5.0  # no overflow
    jittered = dataclasses.replace(policy, jitter=True)
    assert jittered.delay(2, rand=lambda: 0.0) == 1.0
    assert jittered.delay(2, rand=lambda: 0.999) == pytest.approx(1.999)
    for _ in range(100):
        assert 0.5 <= jittered.delay(1) <= 1.0
    with pytest.raises(ValueError, match="start at 1"):
        policy.delay(0)


# --- errors -----------------------------------------------------------------------------------


def test_error_defaults_and_pickling() -> None:
    assert str(ToolkitError()) == "Base of every error the toolkit raises on purpose."
    assert str(InputError()) == "Task input does not match the workflow's input schema."
    error = NoChoiceMatched(step="route")
    assert error.step == "route" and "route" in str(error)
    for original in [
        DefinitionError([DefinitionFault("f", 1, "$", "m")]),
        ExpressionError("boom", expression="a.b", step="s", path="$.x"),
        InputError("bad", path="$.a"),
        error,
    ]:
        copy = pickle.loads(pickle.dumps(original))
        assert type(copy) is type(original)
        assert str(copy) == str(original)
        assert copy.__dict__ == original.__dict__


# --- robustness -------------------------------------------------------------------------------

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


def test_runtime_expression_errors_are_expression_errors() -> None:
    d = parse_definition(MINIMAL.replace("{succeed: {}}", "{succeed: {output: '${ abs(input) }'}}"))
    step = d.steps["done"]
    assert isinstance(step, SucceedStep)
    with pytest.raises(ExpressionError):
        step.output.render({"input": "text"})
