"""Callbacks: an effect step completed from outside through its token, in-process against
PostgreSQL: early completions, failures through retry and catch, timeouts, a callback in a
branch and how `toolkit show` prints its token (the race with the wait commit:
``tests/store/test_wakeups.py``)."""

from __future__ import annotations

import anyio
import pytest

from tests.apps import counting
from tests.apps.counting import TOKENS
from tests.helpers.inprocess import deploy_submit, drain, make_due, sql
from toolkit.errors import CallbackRefused, InputError
from toolkit.store import Store

pytestmark = pytest.mark.anyio

CALLBACK = """
name: callback
version: 1
start: ask
steps:
  ask:
    effect: count.callback
    idempotent: true
    args: {complete_early: "${ input.early }"}
    callback: {timeout: 1h}
    retry: {max_attempts: 2, initial: 0.01s}
    catch: [{errors: ["*"], next: refused}]
  refused: {succeed: {output: "${ steps.ask.error.name }"}}
"""


async def test_a_callback_completes_its_step_from_outside(store: Store) -> None:
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, CALLBACK, [{"early": False}])
    await drain(store, CALLBACK)
    task = await store.tasks.get(task_id)
    assert (task.state, task.wait_reason, task.lease_owner) == ("waiting", "callback", None)
    (token,) = TOKENS
    assert await store.tasks.complete(token, result={"approved": True}) == task_id
    await drain(store, CALLBACK)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", {"approved": True})
    with pytest.raises(CallbackRefused, match="completed"):
        await store.tasks.complete(token, result=1)
    with pytest.raises(CallbackRefused, match="no callback token"):
        await store.tasks.complete("cb_nonsense", result=1)


async def test_a_completion_before_the_handler_returns_is_kept(store: Store) -> None:
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, CALLBACK, [{"early": True}])
    await drain(store, CALLBACK)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", "early")  # never waited


async def test_a_failed_callback_goes_through_retry_then_catch(store: Store) -> None:
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, CALLBACK, [{"early": False}])
    await drain(store, CALLBACK)
    await store.tasks.complete(TOKENS[-1], error="Rejected", message="no")
    await drain(store, CALLBACK)  # attempt 2: a new token
    assert len(TOKENS) == 2 and TOKENS[0] != TOKENS[1]
    await store.tasks.complete(TOKENS[-1], error="Rejected")
    await drain(store, CALLBACK)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", "Rejected")


async def test_a_callback_that_never_comes_times_out_and_its_token_expires(store: Store) -> None:
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, CALLBACK, [{"early": False}])
    await drain(store, CALLBACK)
    await make_due(store, task_id)  # the hour has passed
    await drain(store, CALLBACK)
    with pytest.raises(CallbackRefused, match="expired"):
        await store.tasks.complete(TOKENS[0], result=1)
    assert len(TOKENS) == 2  # retried with a new token


# --- regressions found by a new user ------------------------------------------------------------

async def test_a_callback_without_a_timeout_woken_for_nothing_waits_on(store: Store) -> None:
    """Regression: a callback without a timeout, woken with no completion stored (a wake-up
    for nothing, or a stale cycle), read its deadline as passed: its token expired and the
    step failed Timeout."""
    TOKENS.clear()
    text = CALLBACK.replace("callback: {timeout: 1h}", "callback: {}")
    (task_id,) = await deploy_submit(store, text, [{"early": False}])
    await drain(store, text)
    await make_due(store, task_id)  # woken, and no completion stored
    await drain(store, text)
    task = await store.tasks.get(task_id)
    assert (task.state, task.wait_reason) == ("waiting", "callback"), (task, task.result)
    (token,) = TOKENS
    assert await store.tasks.complete(token, result="late") == task_id
    await drain(store, text)
    assert (await store.tasks.get(task_id)).result == "late"


BRANCH_CALLBACK = """
name: branch-callback
version: 1
start: fan
steps:
  fan:
    parallel:
      branches:
        only:
          start: ask
          steps:
            ask:
              effect: count.callback
              idempotent: true
              callback: {timeout: 1h}
              retry: {max_attempts: 2, initial: 0.01s}
    catch: [{errors: [Timeout], next: gave_up}]
  gave_up: {succeed: {output: gave up}}
"""


async def test_each_attempt_of_a_callback_in_a_branch_waits_its_whole_timeout(
    store: Store,
) -> None:
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, BRANCH_CALLBACK, [{}])
    for attempt in (1, 2):  # the branch parks; each attempt gets a timer of its own
        await drain(store, BRANCH_CALLBACK)
        task = await store.tasks.get(task_id)
        assert (task.state, task.wait_reason, len(TOKENS)) == ("waiting", "branches", attempt)
        (left,) = await sql(
            store,
            "SELECT extract(epoch FROM run_at - clock_timestamp())::float8"
            " FROM toolkit_branches WHERE task_id = %s",
            task_id,
        )
        assert 3500 < left[0] <= 3600, left  # the whole timeout is ahead, not a remainder
        await sql(store, "UPDATE toolkit_branches SET run_at = statement_timestamp()")
        await make_due(store, task_id)
    await drain(store, BRANCH_CALLBACK)
    assert (await store.tasks.get(task_id)).result == "gave up"


async def test_a_callback_of_an_ended_task_is_refused(store: Store) -> None:
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, CALLBACK, [{"early": False}])
    await drain(store, CALLBACK)
    await store.tasks.cancel(task_id)
    with pytest.raises(CallbackRefused, match=f"task {task_id} .* was cancelled"):
        await store.tasks.complete(TOKENS[0], result=1)


async def test_a_callback_completion_names_its_error_as_catch_would(store: Store) -> None:
    with pytest.raises(InputError, match="is not a valid error name: it holds the control"):
        await store.tasks.complete("cb_whatever", error="Job\tFailed")
    with pytest.raises(InputError, match="it is empty"):
        await store.tasks.complete("cb_whatever", error="")


CALLBACK_IN_BRANCH = """
name: callback-in-branch
version: 1
start: fan
steps:
  fan:
    parallel:
      branches:
        ask:
          start: c
          steps:
            c: {effect: count.callback, idempotent: true, callback: {timeout: 1h}}
"""


# --- toolkit show -----------------------------------------------------------------------------


async def test_show_prints_the_token_of_a_callback_awaited_in_a_branch(
    store: Store, dsn: str
) -> None:
    from tests.cli.test_cli import invoke

    TOKENS = counting.TOKENS
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, CALLBACK_IN_BRANCH, [{}])
    await drain(store, CALLBACK_IN_BRANCH)  # the branch parks, its token in the checkpoint
    assert (await store.tasks.get(task_id)).wait_reason == "branches"
    code, out, _ = await anyio.to_thread.run_sync(lambda: invoke("show", str(task_id), dsn=dsn))
    assert code == 0
    assert f"callback:   fan#1/ask/c#1 attempt 1: token {TOKENS[0]}" in out
    assert "ask       waiting   at c, waits for a callback" in out
    await store.tasks.complete(TOKENS[0], result="answered")
    await drain(store, CALLBACK_IN_BRANCH)
    assert (await store.tasks.get(task_id)).result == {"ask": "answered"}
