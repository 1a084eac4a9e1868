"""Bad input: oversized, deeply nested and unstorable JSON is refused with a clear error that
names the limit, the place (a JSON path) and the step; nothing is written and no task stays
stuck."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.apps.counting import record_call
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.application import App, EffectContext
from toolkit.cli import cli
from toolkit.definition import WorkflowDefinition
from toolkit.errors import ConfigError, InputError, PayloadRefused, ToolkitError
from toolkit.payload import DEFAULT_MAX_BYTES, PayloadLimits, check_payload
from toolkit.runtime.supervisor import SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

pytestmark = pytest.mark.anyio

FAST = dict(lease=6.0, heartbeat=0.5, idle_backoff_min=0.01, idle_backoff_max=0.05)


def nested(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


async def deployed(store: Store, text: str) -> WorkflowDefinition:
    d = definition(text)
    await store.definitions.deploy(d)
    return d


# --- the check itself ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "path", "reason"),
    [
        ({"name": "a\x00b"}, "$.name", "NUL character"),
        ({"k\x00": 1}, '$["k\\u0000"]', "NUL character"),
        ({"n": [1, math.nan]}, "$.n[1]", "nan is not a JSON number"),
        ({"n": math.inf}, "$.n", "inf is not a JSON number"),
        ({"s": "\ud800"}, "$.s", "unpaired UTF-16 surrogate"),
        ({"o": object()}, "$.o", "a object is not a JSON value"),
        ({"o": {1, 2}}, "$.o", "a set is not a JSON value"),
        ({"b": b"bytes"}, "$.b", "a bytes is not a JSON value"),
        ({1: "x"}, "$", "object key 1 is a int, not a string"),
        ({"big": 10**5000}, "$.big", "integer is too large"),
        ({"odd key": {"x": [None, "\x00"]}}, '$["odd key"].x[1]', "NUL character"),
    ],
)
def test_unstorable_values_are_refused_with_their_path(value: Any, path: str, reason: str) -> None:
    with pytest.raises(PayloadRefused) as info:
        check_payload(value)
    assert info.value.path == path and reason in info.value.reason
    assert str(info.value).startswith(f"{path}: ")


def test_size_and_depth_limits_name_the_limit() -> None:
    # at the limit exactly, it passes; one byte over, it does not (the bound counted while
    # walking only spares the encoding of values surely within it)
    for text in ("x" * 10, "é" * 5, "\u0001" * 2):
        size = len(json.dumps({"a": text}, ensure_ascii=False, separators=(",", ":")).encode())
        check_payload({"a": text}, PayloadLimits(max_bytes=size))
        with pytest.raises(PayloadRefused, match=f"limit of {size - 1} bytes"):
            check_payload({"a": text}, PayloadLimits(max_bytes=size - 1))
    with pytest.raises(PayloadRefused, match="over the payload size limit of 1048576 bytes") as e:
        check_payload({"blob": "x" * DEFAULT_MAX_BYTES})
    assert e.value.limit == DEFAULT_MAX_BYTES and e.value.path == "$"
    with pytest.raises(PayloadRefused, match="over the payload size limit of 20 bytes"):
        check_payload(list(range(10)), PayloadLimits(max_bytes=20))  # many small items
    check_payload(nested(64))
    with pytest.raises(PayloadRefused, match="deeper than 64 levels") as e:
        check_payload(nested(10_000))
    assert e.value.limit == 64 and e.value.path.startswith("$[0].a[0].a")
    with pytest.raises(ConfigError):
        PayloadLimits(max_depth=10_000)
    with pytest.raises(ConfigError):
        PayloadLimits(max_bytes=0)


# --- submit ---------------------------------------------------------------------------------------


async def test_submit_refuses_an_oversized_input_naming_the_limit(store: Store) -> None:
    d = await deployed(store, THREE_STEPS)
    with pytest.raises(InputError, match="payload size limit of 1048576 bytes") as info:
        await store.tasks.submit(d, [{"n": 1}, {"blob": "é" * (DEFAULT_MAX_BYTES // 2 + 1)}])
    assert info.value.path == "$"
    assert "three-steps v1" in str(info.value)
    assert await store.tasks.counts_by_state() == {}  # nothing written, not even the good one
    store.db.payload_limits = PayloadLimits(max_bytes=64)
    with pytest.raises(InputError, match="limit of 64 bytes"):
        await store.tasks.submit_keyed(d, {"blob": "x" * 64}, key="k")
    assert await store.tasks.submit(d, [{"blob": "x" * 32}])
    assert await store.tasks.counts_by_state() == {"queued": 1}


async def test_submit_refuses_deeply_nested_input_without_a_recursion_error(
    store: Store,
) -> None:
    strict = THREE_STEPS.replace(
        "input: {type: object}",
        "input: {type: object, properties: {n: {type: integer, default: 1}}}",
    )
    for text in (THREE_STEPS, strict):
        d = await deployed(store, text.replace("three-steps", f"deep-{len(text)}"))
        with pytest.raises(InputError, match="deeper than 64 levels") as info:
            await store.tasks.submit(d, [{"n": 1, "deep": nested(10_000)}])
        assert info.value.path.startswith("$.deep")
        # The definition's own check is safe too when called directly.
        with pytest.raises(InputError, match="too deeply"):
            d.validate_input({"deep": nested(5_000)})
    assert await store.tasks.counts_by_state() == {}


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"name": "a\x00b"}, "$.name"),
        ({"x": math.nan}, "$.x"),
        ({"x": object()}, "$.x"),
        ({"x": ["\udfff"]}, "$.x[0]"),
    ],
)
async def test_submit_refuses_values_postgresql_would_refuse(
    store: Store, value: Any, path: str
) -> None:
    d = await deployed(store, THREE_STEPS)
    with pytest.raises(InputError) as info:
        await store.tasks.submit(d, [value])
    assert info.value.path == path and path in str(info.value)
    with pytest.raises(InputError):
        await store.tasks.submit_keyed(d, value, key="k")
    assert await store.tasks.counts_by_state() == {}


async def test_signal_payloads_and_reconciled_results_are_checked(store: Store) -> None:
    d = await deployed(store, THREE_STEPS)
    (task_id,) = await store.tasks.submit(d, [{"n": 1}])
    with pytest.raises(InputError, match=r"payload of signal 'go'.*\$\.why: .*NUL") as info:
        await store.tasks.signal(task_id, "go", {"why": "\x00"})
    assert info.value.path == "$.why"
    assert await store.tasks.signals(task_id) == []
    with pytest.raises(InputError, match=r"result of step 'second'.*size limit"):
        await store.tasks.reconcile(
            task_id, "second", "completed", result="x" * (DEFAULT_MAX_BYTES + 1)
        )


def test_cli_submit_refuses_an_input_over_the_configured_limit(dsn: str, tmp_path: Any) -> None:
    path = tmp_path / "three.yaml"
    path.write_text(THREE_STEPS)
    runner = CliRunner()
    env = {"TOOLKIT_DSN": dsn}
    assert runner.invoke(cli, ["deploy", str(path)], env=env).exit_code == 0
    big = json.dumps({"n": 1, "note": "x" * 100})
    result = runner.invoke(cli, ["--max-payload-bytes", "50", "submit", "three-steps",
                                 "--input", big], env=env)  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert "payload size limit of 50 bytes" in result.stderr and "Traceback" not in result.stderr
    env["TOOLKIT_MAX_PAYLOAD_BYTES"] = "1000"
    result = runner.invoke(cli, ["submit", "three-steps", "--input", big], env=env)
    assert result.exit_code == 0, result.stderr


# --- results --------------------------------------------------------------------------------------

BAD = App("bad-results")


@BAD.effect("bad.result")
async def bad_result(ctx: EffectContext, kind: str = "ok") -> Any:
    await record_call(ctx)
    return {
        "ok": {"fine": True},
        "big": {"blob": "x" * 2_000},
        "deep": nested(10_000),
        "nul": {"text": "a\x00b"},
        "nan": {"value": math.nan},
        "set": {"value": {1, 2}},
        "object": {"value": object()},
    }[kind]


@BAD.effect("bad.error")
async def bad_error(ctx: EffectContext, huge: bool = False) -> Any:
    await record_call(ctx)
    if ctx.attempt == 1:
        raise RuntimeError("nul \x00 and a lone \ud800 surrogate " * (5_000 if huge else 1))
    return {"attempt": ctx.attempt}


RESULTS = """
name: results
version: 1
input: {type: object}
start: make
steps:
  make:
    effect: bad.result
    idempotent: true
    args: {kind: "${ input.kind }"}
    retry: {max_attempts: 3, initial: 10ms}
    catch:
      - errors: [ResultTooLarge]
        next: fallback
    next: done
  fallback: {succeed: {output: {caught: "${ steps.make.error.name }"}}}
  done: {succeed: {output: "${ steps.make }"}}
"""

NO_CATCH = RESULTS.replace(
    "    catch:\n      - errors: [ResultTooLarge]\n        next: fallback\n", ""
).replace('  fallback: {succeed: {output: {caught: "${ steps.make.error.name }"}}}\n', "")


async def drain(store: Store, app: App, text: str) -> Any:
    worker = Worker(store, app, [definition(text)])
    return await WorkflowSupervisor(worker, SupervisorConfig(until_idle=True, **FAST)).run()


async def calls(store: Store) -> dict[str, int]:
    async with store.db.connection() as conn:
        cursor = await conn.execute("SELECT idempotency_key, calls FROM test_calls")
        rows = await cursor.fetchall()
    return dict(rows)


async def test_results_over_the_limit_or_unstorable_fail_their_step_once(store: Store) -> None:
    store.db.payload_limits = PayloadLimits(max_bytes=1_000)
    kinds = ["ok", "big", "deep", "nul", "nan", "set", "object"]
    d = await deployed(store, NO_CATCH)
    ids = await store.tasks.submit(d, [{"kind": k} for k in kinds])
    report = await drain(store, BAD, NO_CATCH)
    assert report.succeeded == 1 and report.failed == 6 and report.retried == 0
    tasks = {k: await store.tasks.get(i) for k, i in zip(kinds, ids, strict=True)}
    assert tasks["ok"].result == {"fine": True}
    too_large, not_json = "ResultTooLarge", "ResultNotJson"
    expected = {"big": too_large, "deep": too_large, "nul": not_json, "nan": not_json,
                "set": not_json, "object": not_json}  # fmt: skip
    for kind, name in expected.items():
        task = tasks[kind]
        assert task.state == "failed", kind
        assert task.error["name"] == name and task.error["step"] == "make", task.error
        assert "step 'make'" in task.error["message"]
    assert "payload size limit of 1000 bytes" in tasks["big"].error["message"]
    assert "deeper than 64 levels" in tasks["deep"].error["message"]
    assert "$.text" in tasks["nul"].error["message"]
    # Not retried: each handler was called once, and its evidence says why it failed.
    assert sorted((await calls(store)).values()) == [1] * 7
    evidence = await store.tasks.evidence(ids[1])
    assert [(e["record"], e["error"]["name"]) for e in evidence] == [("failed", "ResultTooLarge")]


async def test_a_result_over_the_limit_goes_to_the_steps_catch(store: Store) -> None:
    store.db.payload_limits = PayloadLimits(max_bytes=1_000)
    d = await deployed(store, RESULTS)
    (task_id,) = await store.tasks.submit(d, [{"kind": "big"}])
    await drain(store, BAD, RESULTS)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded" and task.result == {"caught": "ResultTooLarge"}


async def test_a_workflow_output_over_the_limit_fails_naming_its_step(store: Store) -> None:
    text = """
name: big-output
version: 1
input: {type: object}
start: done
steps:
  done: {succeed: {output: "${ input }"}}
"""
    d = await deployed(store, text)
    (task_id,) = await store.tasks.submit(d, [{"blob": "x" * 500}])
    store.db.payload_limits = PayloadLimits(max_bytes=100)  # lowered after the submit
    await drain(store, BAD, text)
    task = await store.tasks.get(task_id)
    assert task.state == "failed" and task.error["name"] == "ResultTooLarge"
    assert task.error["step"] == "done" and "step 'done'" in task.error["message"]


@pytest.mark.parametrize("huge", [False, True])
async def test_an_error_message_postgresql_cannot_store_does_not_end_the_retries(
    store: Store, huge: bool
) -> None:
    """A handler's exception text with a NUL character (or megabytes of it) is stored cleaned
    and cut, so the step is retried as its policy says instead of failing the task."""
    text = """
name: bad-error
version: 1
input: {type: object}
start: call
steps:
  call:
    effect: bad.error
    idempotent: true
    args: {huge: "${ input.huge }"}
    retry: {max_attempts: 2, initial: 10ms}
"""
    d = await deployed(store, text)
    (task_id,) = await store.tasks.submit(d, [{"huge": huge}])
    await drain(store, BAD, text)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded" and task.result == {"attempt": 2}, task.error
    failed, _ = await store.tasks.evidence(task_id)
    message = failed["error"]["message"]
    assert "\x00" not in message and message.startswith("nul \\0 and a lone ? surrogate")
    assert len(message) <= 4_000


# --- property: random JSON into submit --------------------------------------------------------

ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=8)
SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT
    | st.integers(min_value=-(10**30), max_value=10**30)
)  # fmt: skip
JSONISH = st.recursive(
    SCALARS,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(ANY_TEXT, kids, max_size=4),
    max_leaves=20,
)
DEEP = st.builds(nested, st.integers(min_value=0, max_value=150), SCALARS)
# Near misses of the strict schema below: right shape, random content.
STRICTISH = st.fixed_dictionaries(
    {"id": st.text("abc\x00", min_size=1, max_size=4), "tags": st.lists(ANY_TEXT, max_size=4)},
    optional={"meta": st.dictionaries(ANY_TEXT, st.floats() | st.integers(), max_size=3)},
)
INPUTS = JSONISH | DEEP | STRICTISH | st.dictionaries(ANY_TEXT, JSONISH, max_size=4)

PERMISSIVE = """
name: permissive
version: 1
input: {}
start: done
steps:
  done: {succeed: {output: 1}}
"""
STRICT = """
name: strict
version: 1
input:
  type: object
  required: [id, tags]
  additionalProperties: false
  properties:
    id: {type: string, minLength: 1, pattern: "^[a-z]+$"}
    tags: {type: array, items: {type: string}, maxItems: 3}
    meta: {type: object, additionalProperties: {type: number}}
start: done
steps:
  done: {succeed: {output: 1}}
"""


def same_json(stored: Any, sent: Any) -> bool:
    """jsonb keeps a number as its decimal text: a float with no fraction comes back as an
    int of that text (3.8e16 as 38000000000000000), equal as a float, not always exactly."""
    if isinstance(sent, float) and isinstance(stored, int | float):
        return float(stored) == sent
    if isinstance(sent, dict):
        return (
            isinstance(stored, dict)
            and stored.keys() == sent.keys()
            and all(same_json(stored[k], v) for k, v in sent.items())
        )
    if isinstance(sent, list | tuple):
        return (
            isinstance(stored, list)
            and len(stored) == len(sent)
            and all(same_json(a, b) for a, b in zip(stored, sent, strict=True))
        )
    return type(stored) is type(sent) and stored == sent


@pytest.mark.parametrize("text", [PERMISSIVE, STRICT], ids=["permissive", "strict"])
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=INPUTS)
async def test_random_json_into_submit_is_stored_or_refused_with_a_path(
    store: Store, text: str, value: Any
) -> None:
    """Whatever JSON-ish value is submitted, it is stored faithfully or refused with one of
    the toolkit's own errors, located by a JSON path; never a driver error or a crash."""
    d = definition(text)
    await store.definitions.deploy(d)
    try:
        (task_id,) = await store.tasks.submit(d, [value])
    except ToolkitError as exc:
        assert isinstance(exc, InputError), repr(exc)
        assert exc.path.startswith("$") and exc.path in str(exc)
        return
    stored = (await store.tasks.get(task_id)).input
    assert same_json(stored, d.validate_input(value)), (stored, value)
