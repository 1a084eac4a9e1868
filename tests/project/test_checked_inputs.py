"""Inputs that reached tracebacks or raw database errors are refused with one clear line.

Issue 15, items 4 and 7: JSON nested past the payload limit in every option that takes JSON,
run settings that are not finite durations in range, tenant and signal names no one can
read, type or wait for, and a zero retry backoff (refused for new registrations; a version
registered with it keeps running, at the minimum delay).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from psycopg.types.json import Jsonb

from tests.apps import counting
from tests.helpers.inprocess import FAST, make_due, sql
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.cli import cli
from toolkit.definition import WorkflowDefinition, load_definitions, schema_path
from toolkit.definition.policies import MIN_RETRY_DELAY, RetryPolicy
from toolkit.errors import ConfigError, DefinitionError, InputError, PayloadRefused
from toolkit.payload import parse_json
from toolkit.runtime.supervisor import SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store
from toolkit.store.names import MAX_NAME, SIGNAL_NAME, check_signal_name, check_tenant

DEEP = "[" * 3000 + "]" * 3000


def invoke(*args: str, dsn: str | None = None) -> tuple[int, str]:
    env = {"TOOLKIT_DSN": dsn} if dsn else {}
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stderr


# --- JSON nested past the limit ------------------------------------------------------------


def test_json_nested_past_the_limit_is_refused_before_the_parser_recurses() -> None:
    with pytest.raises(PayloadRefused, match="deeper than 64 levels"):
        parse_json(DEEP)
    assert parse_json("[" * 64 + "]" * 64) == parse_json("[" * 64 + "]" * 64)
    # Brackets inside strings, escaped quotes included, are text, not nesting.
    text = '{"a": "\\"' + "[" * 500 + '"}'
    assert parse_json(text) == {"a": '"' + "[" * 500}


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "three-steps", "--input", DEEP],
        ["signal", "1", "go", "--payload", DEEP],
        ["reconcile", "1", "second", "--completed", "--result", DEEP],
    ],
    ids=["submit --input", "signal --payload", "reconcile --result"],
)
def test_deeply_nested_json_options_are_one_line(args: list[str], dsn: str) -> None:
    code, err = invoke(*args, dsn=dsn)
    assert code == 1, err
    assert "Traceback" not in err and "RecursionError" not in err
    assert "nests deeper than 64 levels" in err, err


def test_a_deeply_nested_input_file_is_one_line(dsn: str, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    code, err = invoke("submit", "three-steps", "--input-file", str(deep), dsn=dsn)
    assert code == 1 and "nests deeper than 64 levels" in err and "Traceback" not in err


# --- run settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"heartbeat": math.nan}, "heartbeat"),
        ({"lease": math.nan}, "lease"),
        ({"lease": math.inf}, "lease"),
        ({"lease": 1e-9, "heartbeat": 1e-10}, "heartbeat"),
        ({"grace": -1.0}, "grace"),
        ({"grace": math.nan}, "grace"),
        ({"idle_backoff_max": math.inf}, "idle_backoff_max"),
    ],
)
def test_run_settings_must_be_finite_durations_in_range(
    settings: dict[str, float], named: str
) -> None:
    with pytest.raises(ConfigError, match=f"^{named} must be a number of seconds"):
        SupervisorConfig(**settings)


def test_the_run_command_names_the_bad_setting(tmp_path: Path) -> None:
    path = tmp_path / "three.yaml"
    path.write_text(THREE_STEPS)
    code, err = invoke(
        "run", "--app", "tests.apps.counting", "--definitions", str(path), "--lease", "nan"
    )
    assert code == 1 and err.strip().splitlines() == [
        "error: lease must be a number of seconds at least 0.15 and at most 86400, not nan"
    ]


# --- tenant and signal names ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["", " ", " acme", "acme ", "a\tb", "a\x00b", "a\x1bb", "x" * (MAX_NAME + 1)]
)
def test_a_tenant_name_is_readable_text_of_bounded_length(name: str) -> None:
    with pytest.raises(InputError, match="tenant name"):
        check_tenant(name)


@pytest.mark.parametrize("name", ["", " ", "go now", "1st", "a\nb", "s" * 20_000, "ok!"])
def test_a_signal_name_is_one_a_wait_step_could_name(name: str) -> None:
    with pytest.raises(InputError, match="not a signal name"):
        check_signal_name(name)


def test_the_signal_name_rule_is_the_definition_format_s() -> None:
    rule = json.loads(schema_path().read_text())["$defs"]["signalName"]
    assert rule["pattern"] == f"^{SIGNAL_NAME.pattern}$"
    assert rule["maxLength"] == MAX_NAME


@pytest.mark.anyio
async def test_names_are_checked_before_anything_is_stored(store: Store) -> None:
    d = definition(THREE_STEPS)
    await store.definitions.deploy(d)
    with pytest.raises(InputError, match="control character"):
        await store.tasks.submit(d, [{"n": 1}], tenant="a\tb")
    with pytest.raises(InputError, match="at most 200"):
        await store.tasks.submit_keyed(d, {"n": 1}, key="k", tenant="t" * 100_000)
    with pytest.raises(ConfigError, match="space at an end"):
        await store.tenants.set(" ", weight=2)
    (task_id,) = await store.tasks.submit(d, [{"n": 1}])
    with pytest.raises(InputError, match="not a signal name"):
        await store.tasks.signal(task_id, "s" * 20_000)
    assert await store.tasks.signals(task_id) == []
    assert [row[0] for row in await sql(store, "SELECT tenant FROM toolkit_tenants")] == [
        "default"
    ]


# --- a zero retry backoff -------------------------------------------------------------------

ZERO_BACKOFF = """
name: zero-backoff
version: 1
start: call
steps:
  call:
    effect: count.flaky
    idempotent: true
    args: {fail_times: 4}
    retry: {max_attempts: 5, initial: 0s, factor: 2}
"""


async def registered_by_an_older_release(
    store: Store, loaded: WorkflowDefinition
) -> WorkflowDefinition:
    """Row surgery: ``loaded`` stored as an older release registered it, before a check was
    made stricter; deploying it again is "unchanged". Returns the stored version."""
    await sql(
        store,
        "INSERT INTO toolkit_definitions (name, version, digest, body) VALUES (%s, %s, %s, %s)",
        loaded.name, loaded.version, loaded.digest, Jsonb(dict(loaded.body)),
    )  # fmt: skip
    assert await store.definitions.deploy(loaded) == "unchanged"
    return await store.definitions.get(loaded.name, loaded.version)


def test_a_retry_never_waits_less_than_the_minimum() -> None:
    policy = RetryPolicy(initial=0.0, max=0.0, jitter=False)
    assert [policy.delay(attempt) for attempt in (1, 2, 3)] == [MIN_RETRY_DELAY] * 3


@pytest.mark.anyio
async def test_a_zero_backoff_is_refused_for_new_registrations_only(
    store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "zero.yaml"
    path.write_text(ZERO_BACKOFF)
    with pytest.raises(DefinitionError, match="initial delay must be greater than zero"):
        load_definitions([path])
    (loaded,) = load_definitions([path], accept_new_only=True)  # what `toolkit run` loads
    with pytest.raises(DefinitionError, match="initial delay must be greater than zero"):
        await store.definitions.deploy(loaded)  # not registered: a new registration
    assert await store.definitions.list() == []


@pytest.mark.anyio
async def test_a_version_registered_with_a_zero_backoff_keeps_running(
    store: Store, tmp_path: Path
) -> None:
    """Registered before the check (row surgery: the stored body of an older release), the
    version still loads from its file and from its stored body, and its tasks run, retrying
    at the minimum delay."""
    path = tmp_path / "zero.yaml"
    path.write_text(ZERO_BACKOFF)
    (loaded,) = load_definitions([path], accept_new_only=True)
    stored = await registered_by_an_older_release(store, loaded)
    assert stored.digest == loaded.digest
    (task_id,) = await store.tasks.submit(stored, [{}])
    worker = Worker(store, counting.app, [loaded])
    await WorkflowSupervisor(worker, SupervisorConfig(until_idle=True, **FAST)).run()
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", {"attempt": 5}), task
    delays = [
        event["detail"]["delay_seconds"]
        for event in await store.tasks.events(task_id)
        if event["kind"] == "retry_scheduled"
    ]
    assert len(delays) == 4 and all(d >= MIN_RETRY_DELAY for d in delays), delays


# --- a duration without a unit ----------------------------------------------------------------

UNITLESS = """
name: unitless
version: 1
start: pause
steps:
  pause: {wait: {duration: 0.2}, next: done}
  done: {succeed: {output: paused}}
"""


@pytest.mark.anyio
async def test_a_duration_without_a_unit_is_refused_for_new_registrations_only(
    store: Store, tmp_path: Path
) -> None:
    """Issue 24, item 10: ``initial: 500`` was silently 500 seconds."""
    path = tmp_path / "unitless.yaml"
    path.write_text(UNITLESS)
    with pytest.raises(DefinitionError, match=r"write a unit on durations: 0.2 would be 0.2 s"):
        load_definitions([path])
    (loaded,) = load_definitions([path], accept_new_only=True)
    with pytest.raises(DefinitionError, match=r"write '0\.2s' for seconds, '0\.2ms' for milli"):
        await store.definitions.deploy(loaded)
    # Registered by an older release: it still deploys as unchanged and its tasks run.
    stored = await registered_by_an_older_release(store, loaded)
    (task_id,) = await store.tasks.submit(stored, [{}])
    for _ in range(2):  # the first run reaches the timer; the second, once it is due, ends
        worker = Worker(store, counting.app, [loaded])
        await WorkflowSupervisor(worker, SupervisorConfig(until_idle=True, **FAST)).run()
        await make_due(store, task_id)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", "paused"), task
