"""Building the model from a document that passed every check.

Retry policies merge the step's fields over ``defaults.retry`` over the built-in defaults,
and the definition's digest is the SHA-256 of the document's canonical JSON.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Any

from toolkit.definition.expressions import Template, compile_template
from toolkit.definition.flow_control import build_concurrency, build_debounce, build_throttle
from toolkit.definition.model import (
    DEFAULT_MAX_STEPS,
    Branch,
    Callback,
    ChoiceRule,
    ChoiceStep,
    Compensation,
    DistributedMapStep,
    EffectStep,
    FailStep,
    ItemSource,
    MapStep,
    ParallelStep,
    Reservation,
    SetStep,
    Step,
    Subscription,
    SucceedStep,
    Trigger,
    WaitEvent,
    WaitStep,
    WorkflowDefinition,
    WorkflowStep,
)
from toolkit.definition.paths import JsonPath, format_path
from toolkit.definition.policies import CatchRule, RetryPolicy
from toolkit.definition.schedules import build_schedules
from toolkit.durations import parse_duration

_DEFAULT_RETRY: Mapping[str, Any] = types.MappingProxyType(
    {"max_attempts": 3, "initial": 1.0, "factor": 2.0, "max": 60.0, "jitter": True}
)


def _build(doc: dict[str, Any], source: str | None) -> WorkflowDefinition:
    """Build the model from a document that passed every check."""
    defaults = doc.get("defaults", {})
    steps = {
        step_id: _build_step(("steps", step_id), raw, defaults)
        for step_id, raw in doc["steps"].items()
    }
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return WorkflowDefinition(
        name=doc["name"],
        version=int(doc["version"]),
        description=doc.get("description", ""),
        input_schema=_input_schema(doc.get("input", True)),
        start=doc["start"],
        steps=types.MappingProxyType(steps),
        body=doc,
        digest=hashlib.sha256(canonical.encode()).hexdigest(),
        source=source,
        budget=_amounts(doc.get("budget", {})),
        timeout=parse_duration(doc["timeout"]) if "timeout" in doc else None,
        on_timeout=doc.get("on_timeout"),
        max_steps=int(doc.get("max_steps", DEFAULT_MAX_STEPS)),
        tags=types.MappingProxyType(
            {
                key: compile_template(value, path=f"$.tags.{key}")
                for key, value in doc.get("tags", {}).items()
            }
        ),
        schedules=build_schedules(doc),
        triggers=_triggers(doc),
        events=types.MappingProxyType(dict(doc.get("events", {}))),
        concurrency=build_concurrency(doc),
        priority=int(doc.get("priority", 0)),
        debounce=build_debounce(doc),
        throttle=build_throttle(doc),
        cancel_on=tuple(
            Subscription(raw["event"], _match(raw, f"$.cancel_on[{i}]") or {}, cancels=True)
            for i, raw in enumerate(doc.get("cancel_on", ()))
        ),
    )


def _input_schema(schema: Mapping[str, Any] | bool) -> Mapping[str, Any]:
    """Normalise a boolean input schema to the equivalent object schema."""
    if isinstance(schema, bool):
        return {} if schema else {"not": {}}
    return schema


def _build_step(where: JsonPath, raw: dict[str, Any], defaults: dict[str, Any]) -> Step:
    """Build the step at ``where`` (its path; the last part is its id)."""
    step_id, path = str(where[-1]), format_path(where)
    if "parallel" in raw:
        parallel = raw["parallel"]
        return ParallelStep(
            id=step_id,
            mode=parallel.get("mode", "all"),
            branches=types.MappingProxyType(
                {
                    name: _build_branch((*where, "parallel", "branches", name), branch, defaults)
                    for name, branch in parallel["branches"].items()
                }
            ),
            cancel_losers=bool(parallel.get("cancel_losers", False)),
            reserve=_reservation(parallel.get("reserve")),
            next=raw.get("next"),
            catch=_catch_rules(raw),
        )
    if "map" in raw and raw["map"].get("distributed"):
        return _build_distributed_map(where, raw, defaults)
    if "map" in raw:
        mapped = raw["map"]
        return MapStep(
            id=step_id,
            items=compile_template(mapped["items"], path=f"{path}.map.items"),
            max_concurrency=mapped.get("max_concurrency"),
            branch=_build_branch((*where, "map", "branch"), mapped["branch"], defaults),
            cancel_losers=bool(mapped.get("cancel_losers", False)),
            reserve=_reservation(mapped.get("reserve")),
            next=raw.get("next"),
            catch=_catch_rules(raw),
        )
    if "workflow" in raw:
        child = raw["workflow"]
        return WorkflowStep(
            id=step_id,
            workflow=child["name"],
            version=child.get("version"),
            input=compile_template(child.get("input"), path=f"{path}.workflow.input"),
            next=raw.get("next"),
            catch=_catch_rules(raw),
        )
    if "wait" in raw:
        wait = raw["wait"]
        events = tuple(
            _wait_event(f"{path}.wait.any[{i}]", event)
            for i, event in enumerate(wait.get("any", ()))
        )
        return WaitStep(
            id=step_id,
            duration=parse_duration(wait["duration"]) if "duration" in wait else None,
            until=_until(wait, f"{path}.wait"),
            signal=wait.get("signal"),
            timeout=parse_duration(wait["timeout"]) if "timeout" in wait else None,
            next=raw.get("next"),
            catch=_catch_rules(raw),
            any=events,
            schema=wait.get("schema"),
            event=wait.get("event"),
            match=_match(wait, f"{path}.wait"),
        )
    return _build_simple_step(where, raw, defaults)


def _wait_event(path: str, raw: Mapping[str, Any]) -> WaitEvent:
    """Build one event of ``wait.any`` (``path``: its JSON path)."""
    return WaitEvent(
        signal=raw.get("signal"),
        duration=parse_duration(raw["duration"]) if "duration" in raw else None,
        until=_until(raw, path),
        next=raw["next"],
        schema=raw.get("schema"),
        event=raw.get("event"),
        match=_match(raw, path),
    )


def _match(raw: Mapping[str, Any], path: str) -> Mapping[str, Template] | None:
    """The compiled ``match`` of an event wait at ``path``, or None."""
    match = raw.get("match")
    if match is None:
        return None
    compiled = {
        field: compile_template(value, path=f"{path}.match.{field}")
        for field, value in match.items()
    }
    return types.MappingProxyType(compiled)


def _triggers(doc: Mapping[str, Any]) -> tuple[Trigger, ...]:
    """The definition's ``triggers``, compiled."""

    def template(raw: Mapping[str, Any], name: str, path: str) -> Template | None:
        return compile_template(raw[name], path=f"{path}.{name}") if name in raw else None

    return tuple(
        Trigger(
            event=raw["event"],
            when=template(raw, "when", f"$.triggers[{i}]"),
            input=template(raw, "input", f"$.triggers[{i}]"),
            key=template(raw, "key", f"$.triggers[{i}]"),
        )
        for i, raw in enumerate(doc.get("triggers", ()))
    )


def _build_distributed_map(
    where: JsonPath, raw: dict[str, Any], defaults: dict[str, Any]
) -> DistributedMapStep:
    """Build a ``map: {distributed: true}`` step; its page source is an idempotent effect."""
    step_id, path = str(where[-1]), format_path(where)
    mapped = raw["map"]
    source = mapped["items_from"]
    page = None
    if "effect" in source:
        effect = {k: source[k] for k in ("effect", "args", "retry", "timeout") if k in source}
        built = _build_simple_step(where, {**effect, "idempotent": True}, defaults)
        assert isinstance(built, EffectStep)
        page = built
    file = source.get("file")
    return DistributedMapStep(
        id=step_id,
        items_from=ItemSource(
            page=page,
            file=None
            if file is None
            else compile_template(file, path=f"{path}.map.items_from.file"),
            page_size=source.get("page_size", 1000),
        ),
        workflow=mapped["workflow"]["name"],
        version=mapped["workflow"].get("version"),
        input=None
        if "input" not in mapped
        else compile_template(mapped["input"], path=f"{path}.map.input"),
        items_per_task=mapped.get("items_per_task"),
        max_concurrency=mapped.get("max_concurrency"),
        tolerated_failures=mapped.get("tolerated_failures"),
        tolerated_failure_percentage=mapped.get("tolerated_failure_percentage"),
        next=raw.get("next"),
        catch=_catch_rules(raw),
    )


def _until(raw: Mapping[str, Any], path: str) -> Template | None:
    """The compiled ``until`` of a wait or wait event at ``path``, or None."""
    until = raw.get("until")
    return None if until is None else compile_template(until, path=f"{path}.until")


def _build_simple_step(
    where: JsonPath, raw: dict[str, Any], defaults: dict[str, Any]
) -> Step:
    """Build an effect, choice, succeed, fail or set step."""
    step_id, path = str(where[-1]), format_path(where)
    if "effect" in raw:
        timeout = raw.get("timeout", defaults.get("timeout"))
        retry, retry_rules = _retry(raw.get("retry", {}), defaults.get("retry", {}))
        callback = raw.get("callback")
        compensate = raw.get("compensate")
        return EffectStep(
            id=step_id,
            handler=raw["effect"],
            idempotent=raw["idempotent"],
            args=compile_template(raw.get("args"), path=f"{path}.args"),
            retry=retry,
            timeout=None if timeout is None else parse_duration(timeout),
            next=raw.get("next"),
            catch=_catch_rules(raw),
            retry_rules=retry_rules,
            callback=None
            if callback is None
            else Callback(
                timeout=parse_duration(callback["timeout"]) if "timeout" in callback else None
            ),
            compensate=None
            if compensate is None
            else Compensation(
                handler=compensate["effect"],
                args=compile_template(compensate.get("args"), path=f"{path}.compensate.args"),
                idempotent=bool(compensate.get("idempotent", True)),
            ),
            limits=tuple(raw.get("limits", ())),
        )
    if "set" in raw:
        return SetStep(
            id=step_id,
            values=compile_template(raw["set"], path=f"{path}.set"),
            next=raw.get("next"),
        )
    if "choice" in raw:
        rules = tuple(
            ChoiceRule(
                when=compile_template(rule["when"], path=f"{path}.choice[{i}].when"),
                next=rule["next"],
            )
            for i, rule in enumerate(raw["choice"])
        )
        return ChoiceStep(id=step_id, choices=rules, default=raw.get("default"))
    if "succeed" in raw:
        output = raw["succeed"].get("output")
        return SucceedStep(
            id=step_id, output=compile_template(output, path=f"{path}.succeed.output")
        )
    fail = raw["fail"]
    message = compile_template(fail.get("message", ""), path=f"{path}.fail.message")
    return FailStep(
        id=step_id,
        error=fail["error"],
        message=message,
        compensate=bool(fail.get("compensate", False)),
    )


def _build_branch(where: JsonPath, raw: dict[str, Any], defaults: dict[str, Any]) -> Branch:
    """Build the branch at ``where``; the definition's effect defaults apply inside it too."""
    steps = {
        step_id: _build_step((*where, "steps", step_id), raw_step, defaults)
        for step_id, raw_step in raw["steps"].items()
    }
    return Branch(start=raw["start"], steps=types.MappingProxyType(steps))


def _reservation(raw: Mapping[str, Any] | None) -> Reservation | None:
    if raw is None:
        return None
    per_branch = "per_branch" in raw
    return Reservation(
        amounts=_amounts(raw["per_branch" if per_branch else "total"]), per_branch=per_branch
    )


def _amounts(raw: Mapping[str, Any]) -> Mapping[str, float]:
    return types.MappingProxyType({name: float(amount) for name, amount in raw.items()})


def _catch_rules(raw: Mapping[str, Any]) -> tuple[CatchRule, ...]:
    return tuple(
        CatchRule(errors=tuple(rule["errors"]), next=rule["next"]) for rule in raw.get("catch", ())
    )


def _retry(
    raw: Mapping[str, Any] | Sequence[Mapping[str, Any]], defaults: Mapping[str, Any]
) -> tuple[RetryPolicy, tuple[RetryPolicy, ...]]:
    """An effect's ``(retry, retry_rules)`` from its ``retry`` and ``defaults.retry``.

    A single policy gives no rules. A list of policies gives one rule per policy (fields each
    policy leaves out come from the defaults), and as ``retry`` the first rule for any error
    (``"*"``), else the defaults with the largest ``max_attempts`` of the rules: the policy
    lost attempts count against.
    """
    if isinstance(raw, Mapping):
        return _retry_policy({**_DEFAULT_RETRY, **defaults, **raw}), ()
    rules = tuple(_retry_policy({**_DEFAULT_RETRY, **defaults, **rule}) for rule in raw)
    catch_all = next((rule for rule in rules if "*" in rule.errors), None)
    if catch_all is not None:
        return catch_all, rules
    fallback = _retry_policy({**_DEFAULT_RETRY, **defaults})
    most = max(rules, key=lambda rule: rule.max_attempts)
    return (
        dataclasses.replace(fallback, max_attempts=most.max_attempts, unlimited=most.unlimited),
        rules,
    )


def _retry_policy(fields: Mapping[str, Any]) -> RetryPolicy:
    unlimited = fields["max_attempts"] == "unlimited"
    return RetryPolicy(
        max_attempts=sys.maxsize if unlimited else int(fields["max_attempts"]),
        initial=parse_duration(fields["initial"]),
        factor=float(fields["factor"]),
        max=parse_duration(fields["max"]),
        jitter=bool(fields["jitter"]),
        non_retryable=tuple(fields.get("non_retryable", ())),
        errors=tuple(fields.get("errors", ("*",))),
        unlimited=unlimited,
    )
