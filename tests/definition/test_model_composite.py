"""The model of parallel steps, maps and child workflows: branches, reservations and
budgets."""

from __future__ import annotations

import pytest

from tests.helpers.workflows import CORPUS
from toolkit.definition import (
    Branch,
    CatchRule,
    ChoiceStep,
    EffectStep,
    FailStep,
    MapStep,
    ParallelStep,
    Reservation,
    RetryPolicy,
    SucceedStep,
    WorkflowStep,
    load_definition,
    parse_definition,
)


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
