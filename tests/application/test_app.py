"""The ``App`` registry (``toolkit.application.app``): downstream limits declared, a step's
limits joined with its handler's, undeclared ones refused."""

from __future__ import annotations

import pytest

from tests.apps.limited import one_step
from tests.helpers.workflows import definition
from toolkit import App, ConfigError, MissingLimits


def test_app_limit_declarations_are_checked() -> None:
    app = App("t")
    spec = app.limit("llm", max_concurrency=4, rate="600/min")
    assert (spec.max_concurrency, spec.rate_per_second, spec.burst) == (4, 10.0, 10.0)
    assert app.limit("slow", rate="5/h").burst == 1.0  # one second's worth, at least 1
    assert app.limit("tenanted", max_concurrency=1, per="tenant").per_tenant
    for kwargs, message in [
        ({}, "give max_concurrency, rate, or both"),
        ({"max_concurrency": 0}, "max_concurrency must be a positive integer"),
        ({"rate": "1/s", "burst": 0.5}, "burst must be a number >= 1"),
        ({"max_concurrency": 1, "burst": 3}, "a burst needs a rate"),
        ({"max_concurrency": 1, "per": "host"}, "per must be 'tenant' or 'global'"),
    ]:
        with pytest.raises(ConfigError, match=message):
            app.limit("x", **kwargs)
    with pytest.raises(ConfigError, match="declared twice"):
        app.limit("llm", max_concurrency=1)


def test_a_steps_limits_are_its_own_and_its_handlers() -> None:
    app = App("t")
    app.add("h.limited", lambda ctx: None, limits=["b", "a"])
    app.add("h.free", lambda ctx: None)
    step = definition(one_step("x", "h.limited", "a")).steps["call"]
    assert app.step_limits(step) == ("a", "b")
    assert app.step_limits(definition(one_step("y", "h.free", "a")).steps["call"]) == ()


def test_yaml_limits_of_a_step_join_its_handlers_and_must_be_declared() -> None:
    text = one_step("y", "h.limited", "a").replace(
        "idempotent: true", "limits: [c]\n    idempotent: true"
    )
    app = App("t")
    app.add("h.limited", lambda ctx: None, limits=["a"])
    d = definition(text)
    assert app.step_limits(d.steps["call"]) == ("a", "c")
    with pytest.raises(MissingLimits) as refused:
        app.check_limits([d], stored=["a"])
    assert str(refused.value) == (
        "<test>: $.steps.call.limits: limit 'c' is not declared in app 't' (app.limit) nor set "
        "in the store (toolkit limits set)"
    )
    app.check_limits([d], stored=["a", "c"])
