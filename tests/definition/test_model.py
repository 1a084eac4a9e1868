"""The validated model of a definition and its steps: effects, retries, catch, waits,
set steps, compensation, callbacks, limits and deadlines (branches, maps and children:
``test_model_composite.py``)."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from tests.helpers.workflows import CORPUS, MINIMAL
from toolkit.definition import (
    DEFAULT_MAX_STEPS,
    TIMEOUT_ERROR,
    Callback,
    CatchRule,
    ChoiceStep,
    Compensation,
    EffectStep,
    FailStep,
    MapStep,
    RetryPolicy,
    SetStep,
    SucceedStep,
    WaitEvent,
    WaitStep,
    WorkflowDefinition,
    catch_target,
    definition_from_body,
    load_definition,
    parse_definition,
)

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
  a: {effect: h, idempotent: true, retry: {initial: 500ms, non_retryable: [Boom]}, timeout: 5s}
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
