"""Checks of one step beyond the schema: durations, retry policies, waits and catch rules.

Also the expressions of its fields, and its reservations against the definition's budget.
"""

from __future__ import annotations

import datetime
from typing import Any

from toolkit.definition.events import match_problems
from toolkit.definition.expressions import compile_template
from toolkit.definition.graph import _wait_events
from toolkit.definition.input_schema import input_schema_problems
from toolkit.definition.paths import JsonPath
from toolkit.definition.references import _single_expression_problems, template_problems
from toolkit.definition.wording import short
from toolkit.definition.yaml_source import Problem
from toolkit.durations import parse_duration


def _step_problems(path: JsonPath, step: dict[str, Any]) -> list[Problem]:
    problems = []
    if "args" in step:
        problems += template_problems((*path, "args"), step["args"])
    problems += _duration_problems(path, step)
    problems += _retry_rule_problems(path, step.get("retry"))
    callback = step.get("callback")
    if isinstance(callback, dict):
        problems += _duration_problems((*path, "callback"), callback)
    compensate = step.get("compensate")
    if isinstance(compensate, dict) and "args" in compensate:
        problems += template_problems((*path, "compensate", "args"), compensate["args"])
    if "set" in step:
        problems += template_problems((*path, "set"), step["set"])
    rules = step.get("choice")
    for i, rule in enumerate(rules if isinstance(rules, list) else []):
        when = rule.get("when") if isinstance(rule, dict) else None
        if isinstance(when, str):
            problems += _single_expression_problems((*path, "choice", i, "when"), when)
    for kind, field in (("succeed", "output"), ("fail", "message")):
        body = step.get(kind)
        if isinstance(body, dict) and field in body:
            problems += template_problems((*path, kind, field), body[field])
    wait = step.get("wait")
    if isinstance(wait, dict):
        problems += _wait_problems((*path, "wait"), wait)
        if "any" in wait and "next" in step:
            problems.append(
                Problem(
                    (*path, "next"),
                    "'next' is not allowed on a wait with 'any': each event names its own next",
                )
            )
        seen: dict[str, int] = {}
        for i, event in _wait_events(step):
            problems += _wait_problems((*path, "wait", "any", i), event)
            for kind in ("signal", "event"):
                name = event.get(kind)
                if isinstance(name, str) and f"{kind}:{name}" in seen:
                    problems.append(
                        Problem(
                            (*path, "wait", "any", i, kind),
                            f"{kind} {name!r} is already awaited by "
                            f"any[{seen[f'{kind}:{name}']}]: wait for each {kind} at most once",
                        )
                    )
                elif isinstance(name, str):
                    seen[f"{kind}:{name}"] = i
    problems += _catch_problems(path, step)
    return problems


def _retry_rule_problems(path: JsonPath, rules: Any) -> list[Problem]:
    """Durations of a list of retry policies, and policies that can never apply."""
    if not isinstance(rules, list):
        return []
    problems = []
    covered: set[str] = set()
    everything = False
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        problems += _duration_problems((*path, "retry", i), rule)
        errors = rule.get("errors")
        exempt = rule.get("non_retryable")
        if not isinstance(errors, list) or not all(isinstance(e, str) for e in errors):
            continue
        exempt = (
            set(exempt)
            if isinstance(exempt, list) and all(isinstance(e, str) for e in exempt)
            else set()
        )
        if errors and (everything or ("*" not in errors and covered.issuperset(errors))):
            earlier = "'*'" if everything else ", ".join(map(repr, errors))
            problems.append(
                Problem(
                    (*path, "retry", i),
                    f"this policy never applies: earlier policies already cover {earlier}",
                )
            )
        everything = everything or ("*" in errors and not exempt)
        covered.update(e for e in errors if e != "*" and e not in exempt)
    return problems


def _wait_problems(path: JsonPath, wait: dict[str, Any]) -> list[Problem]:
    """Check the durations, ``until`` and payload ``schema`` of a wait or a ``wait.any`` event."""
    problems = []
    if "timeout" in wait and "signal" not in wait and "event" not in wait:
        problems.append(
            Problem((*path, "timeout"), "'timeout' is allowed only with 'signal' or 'event'")
        )
    for key in ("duration", "timeout"):
        if key in wait:
            try:
                seconds = parse_duration(wait[key])
            except ValueError as exc:
                problems.append(Problem((*path, key), str(exc)))
                continue
            problems += _unitless((*path, key), wait[key])
            if seconds <= 0:
                problems.append(Problem((*path, key), f"{key} must be greater than zero"))
    if "schema" in wait:
        problems += input_schema_problems(wait["schema"], (*path, "schema"), "signal schema")
    if isinstance(wait.get("match"), dict):
        problems += match_problems((*path, "match"), wait["match"])
    until = wait.get("until")
    if isinstance(until, str):
        found = template_problems((*path, "until"), until)
        if found:
            return problems + found
        template = compile_template(until)
        if template.is_constant:
            problems += [Problem((*path, "until"), m) for m in timestamp_problems(until)]
        elif not template.is_expression:
            problems.append(
                Problem(
                    (*path, "until"),
                    f"'until' must be one '${{ ... }}' expression or a constant timestamp, not a"
                    f" text template: {until!r}",
                )
            )
    return problems


def timestamp_problems(text: str) -> list[str]:
    """Why ``text`` is not an ISO-8601 timestamp with a UTC offset (empty when it is one)."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return [
            f"{short(text)} is not an ISO-8601 timestamp (e.g. 2030-01-01T09:00:00+01:00,"
            " 2030-01-01T08:00:00Z)"
        ]
    if moment.utcoffset() is None:
        return [
            f"timestamp {short(text)} has no UTC offset: add one (e.g. Z or +01:00), a wait"
            " cannot depend on the worker's time zone"
        ]
    return []


def _catch_problems(path: JsonPath, step: dict[str, Any]) -> list[Problem]:
    """Catch rules that can never match: on a wait that cannot fail, or shadowed by earlier ones."""
    rules = step.get("catch")
    if not isinstance(rules, list):
        return []
    wait = step.get("wait")
    if isinstance(wait, dict):
        if ("signal" not in wait and "event" not in wait) or "timeout" not in wait:
            if "any" in wait:
                hint = ": a wait with 'any' never fails, each of its events goes to its own next"
            elif "signal" in wait or "event" in wait:
                hint = ": add a timeout to the wait, or remove catch"
            else:
                hint = ": only a signal or event wait with a timeout can fail"
            return [
                Problem(
                    (*path, "catch"),
                    f"catch needs a wait that can fail (signal or event with timeout){hint}",
                )
            ]
    problems = []
    caught: set[str] = set()
    for i, rule in enumerate(rules):
        errors = rule.get("errors") if isinstance(rule, dict) else None
        if not isinstance(errors, list) or not all(isinstance(e, str) for e in errors):
            continue
        if isinstance(wait, dict):
            for j, name in enumerate(errors):
                if name not in ("*", "Timeout"):
                    problems.append(
                        Problem(
                            (*path, "catch", i, "errors", j),
                            f"a wait fails only with 'Timeout', never with {name!r}",
                        )
                    )
        if errors and ("*" in caught or caught.issuperset(errors)):
            earlier = "'*'" if "*" in caught else ", ".join(map(repr, errors))
            problems.append(
                Problem(
                    (*path, "catch", i),
                    f"this rule never matches: earlier rules already catch {earlier}",
                )
            )
        caught.update(errors)
    return problems


def _duration_problems(path: JsonPath, holder: dict[str, Any]) -> list[Problem]:
    """Check ``timeout``, ``initial`` / ``max`` and ``retry.initial`` / ``retry.max`` of ``holder``.

    ``holder`` is a step, ``defaults``, a policy of a list of retry policies, a ``callback``
    or the document (its ``timeout``).
    """
    found: list[tuple[JsonPath, Any]] = []
    if "timeout" in holder:
        found.append(((*path, "timeout"), holder["timeout"]))
    if len(path) >= 2 and path[-2] == "retry" and isinstance(path[-1], int):  # in a list
        found += [((*path, k), holder[k]) for k in ("initial", "max") if k in holder]
    retry = holder.get("retry")
    if isinstance(retry, dict):
        found += [((*path, "retry", k), retry[k]) for k in ("initial", "max") if k in retry]
    problems = []
    for where, value in found:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            problems.append(Problem(where, str(exc)))
            continue
        problems += _unitless(where, value)
        if where[-1] == "timeout" and seconds <= 0:
            problems.append(Problem(where, "timeout must be greater than zero"))
        elif where[-1] in ("initial", "max") and seconds <= 0:
            problems.append(Problem(
                where,
                f"a retry's {where[-1]} delay must be greater than zero (a zero backoff calls a "
                "failing handler again at once, every attempt)",
                new_only=True,
            ))  # fmt: skip
    return problems


def _unitless(where: JsonPath, value: Any) -> list[Problem]:
    """A duration written as a bare number: new registrations must name the unit.

    ``initial: 500`` meant milliseconds as often as seconds (issue 24); a version registered
    with bare numbers keeps loading, as seconds (docs/decisions.md, "Durations name a unit").
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return []
    shown = f"{value:g}"
    seconds = "second" if value == 1 else "seconds"
    return [Problem(
        where,
        f"write a unit on durations: {shown} would be {shown} {seconds}; write '{shown}s' for "
        f"seconds, '{shown}ms' for milliseconds (or m, h, d)",
        new_only=True,
    )]  # fmt: skip


def _reserve_problems(budget: Any, steps: dict[str, Any]) -> list[Problem]:
    """Reservations larger than the definition's own budget for that resource.

    Such a step could never start (with a submit that does not raise the budget); a
    per-branch amount of a parallel step counts once per branch (a map's item count is only
    known at run time, so one share is compared).
    """
    if not isinstance(budget, dict):
        return []
    problems = []
    for step_id, step in steps.items():
        for kind in ("parallel", "map"):
            body = step.get(kind) if isinstance(step, dict) else None
            if not isinstance(body, dict) or not isinstance(body.get("reserve"), dict):
                continue
            reserve = body["reserve"]
            for how in ("total", "per_branch"):
                amounts = reserve.get(how)
                if not isinstance(amounts, dict):
                    continue
                branches = body.get("branches") if kind == "parallel" else None
                factor = len(branches) if how == "per_branch" and isinstance(branches, dict) else 1
                for resource, amount in amounts.items():
                    limit = budget.get(resource)
                    if not _number(amount) or not _number(limit) or amount * factor <= limit:
                        continue
                    times = f" ({factor} branches x {amount:g})" if factor > 1 else ""
                    problems.append(
                        Problem(
                            ("steps", step_id, kind, "reserve", how, resource),
                            f"reserves {amount * factor:g}{times} {resource}, more than the "
                            f"definition's budget of {limit:g}",
                        )
                    )
    return problems


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
