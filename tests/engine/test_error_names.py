"""Error names as people write them (issue 18), end to end against PostgreSQL: a handler's
``missing-order-id`` caught by a rule naming it, a ``fail`` step's ``Job Failed`` as the
task's error, and a retry policy for ``States.Timeout`` that retries that error only.
Names are compared exactly: another case is another error."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.inprocess import deploy_submit, drain
from toolkit.application import App, EffectContext
from toolkit.store import Store

pytestmark = pytest.mark.anyio

NAMES = App("error-names")


class NamedFailure(Exception):
    """An error whose name is given, as a handler names one with ``error_name``."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.error_name = name


@NAMES.effect("orders.lookup")
async def lookup(ctx: EffectContext, error: str, fail_times: int) -> dict[str, Any]:
    """Fail the first ``fail_times`` attempts with the error named ``error``."""
    if ctx.attempt <= fail_times:
        raise NamedFailure(error, f"attempt {ctx.attempt}: {error}")
    return {"attempt": ctx.attempt}


ERROR_NAMES = """
name: error-names
version: 1
input: {type: object}
start: lookup
steps:
  lookup:
    effect: orders.lookup
    idempotent: true
    args: {error: "${ input.error }", fail_times: "${ input.fail_times }"}
    retry:
      - errors: [States.Timeout]
        max_attempts: 3
        initial: 10ms
        max: 20ms
    catch:
      - errors: [missing-order-id]
        next: no_order
    next: done
  no_order:
    fail:
      error: Job Failed
      message: "caught ${ steps.lookup.error.name } after ${ steps.lookup.error.attempts }"
  done: {succeed: {output: "${ steps.lookup }"}}
"""


async def test_error_names_with_dashes_spaces_and_dots_are_matched_exactly(
    store: Store,
) -> None:
    inputs = {
        "timeout": {"error": "States.Timeout", "fail_times": 2},
        "missing": {"error": "missing-order-id", "fail_times": 9},
        "other case": {"error": "states.timeout", "fail_times": 2},
        "uncaught": {"error": "Missing-Order-Id", "fail_times": 9},
    }
    submitted = await deploy_submit(store, ERROR_NAMES, list(inputs.values()))
    ids = dict(zip(inputs, submitted, strict=True))
    await drain(store, ERROR_NAMES, handlers=NAMES)
    tasks = {label: await store.tasks.get(task_id) for label, task_id in ids.items()}

    # The retry policy names States.Timeout: that error is retried until the call succeeds.
    assert tasks["timeout"].state == "succeeded", tasks["timeout"].error
    assert tasks["timeout"].result == {"attempt": 3}

    # missing-order-id: no policy names it, so no retry; the catch rule naming it routes the
    # task to the fail step, whose error Job Failed (with a space) is the task's error.
    assert tasks["missing"].state == "failed"
    assert tasks["missing"].error == {
        "name": "Job Failed",
        "message": "caught missing-order-id after 1",
        "step": "no_order",
    }
    events = [e["kind"] for e in await store.tasks.events(ids["missing"])]
    assert "caught" in events and "retry_scheduled" not in events

    # Another case is another name: neither retried nor caught.
    for label, name in (("other case", "states.timeout"), ("uncaught", "Missing-Order-Id")):
        failed = tasks[label]
        assert failed.state == "failed"
        assert (failed.error["name"], failed.error["attempts"]) == (name, 1)
        evidence = await store.tasks.evidence(ids[label])
        assert [e["error"]["name"] for e in evidence] == [name]
