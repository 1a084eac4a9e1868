"""Tasks: submit, list by filter, and act on one (signal, complete, cancel, reconcile).

``show``, one task in detail, has its own module.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from typing import IO, Any, Literal, TypeVar

import click

from toolkit.cli.filters import filter_fields, filter_options, tag_options, task_filter
from toolkit.cli.options import (
    duration_option,
    json_option,
    resource_amounts,
    task_tenant_option,
    time_option,
)
from toolkit.cli.output import echo_json
from toolkit.cli.results import await_and_print, run_waiting, wait_timeout
from toolkit.cli.session import Settings, run_in_store
from toolkit.definition.flow_overrides import FlowOverrides
from toolkit.errors import ConfigError, UnknownSignal
from toolkit.store import Store
from toolkit.store.filters import TaskFilter
from toolkit.store.tasks import TaskRecord

Outcome = Literal["completed", "failed", "retry"]
"""What ``reconcile`` records of an uncertain effect, as the store takes it."""

F = TypeVar("F", bound=Callable[..., Any])


@click.command()
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
@click.option(
    "--tag", "tags", multiple=True, metavar="KEY=VALUE", help="Tag the task (repeatable)."
)
@click.option("--at", "at_text", metavar="TIME", help="Start it at TIME (ISO 8601), not now.")
@click.option("--delay", "delay_text", metavar="DURATION", help="Start it in DURATION (e.g. 2h).")
@click.option(
    "--priority",
    type=click.IntRange(0, 9),
    help="Override the definition's priority: 0 (lowest) to 9.",
)
@click.option(
    "--max-active",
    type=click.IntRange(min=1),
    help="Override the concurrency key's max_active for this task.",
)
@click.option("--quiet", "quiet_text", metavar="DURATION",
              help="Override the debounce's quiet period, e.g. 30s.")
@click.option("--max-wait", "max_wait_text", metavar="DURATION",
              help="Override the debounce's max_wait, e.g. 5m.")
@click.option("--rate", metavar="RATE", help="Override the throttle's rate, e.g. 10/min.")
@click.option("--excess", type=click.Choice(["delay", "refuse"]),
              help="Override the throttle's excess.")
@click.option(
    "--wait", "wait_for", is_flag=True, help="Wait for the task to end; print its output."
)
@click.option(
    "--wait-timeout",
    "wait_text",
    metavar="DURATION",
    help="With --wait: give up after this long (exit 5); the task goes on.",
)
@click.pass_context
def submit(
    ctx: click.Context,
    name: str,
    version: int | None,
    input_json: str | None,
    input_file: IO[str] | None,
    tenant: str,
    key: str | None,
    budgets: Sequence[str],
    timeout_text: str | None,
    tags: Sequence[str],
    at_text: str | None,
    delay_text: str | None,
    priority: int | None,
    max_active: int | None,
    quiet_text: str | None,
    max_wait_text: str | None,
    rate: str | None,
    excess: Literal["delay", "refuse"] | None,
    wait_for: bool,
    wait_text: str | None,
) -> None:
    """Submit a task of definition NAME (default: its latest version); prints the task id.

    --max-active, --quiet, --max-wait, --rate and --excess change the values of the
    definition's concurrency, debounce and throttle for this task (docs/flow-control.md).

    With --wait it prints the task's output as JSON once it ends instead, with the exit
    status of `toolkit wait`: 0 succeeded, 3 failed, 4 cancelled, 5 still running when
    --wait-timeout passed.
    """
    settings: Settings = ctx.obj
    if wait_text is not None and not wait_for:
        raise ConfigError("--wait-timeout goes with --wait")
    wait_timeout_seconds = wait_timeout(wait_text, "--wait-timeout")
    task_tags = tag_options(tags)
    if at_text is not None and delay_text is not None:
        raise ConfigError("give --at or --delay, not both")
    start_at = time_option(at_text, "--at") if at_text is not None else None
    delay = duration_option(delay_text, f"--delay {delay_text}") if delay_text else None
    if input_json is not None and input_file is not None:
        raise ConfigError("give --input or --input-file, not both")
    budget: dict[str, float] = {}
    for resource, amount in resource_amounts(budgets).items():
        budget[resource] = float(amount)
    timeout = None
    if timeout_text is not None:
        timeout = duration_option(timeout_text, f"--timeout {timeout_text}")
    source = "--input-file" if input_file is not None else "--input"
    if input_file is not None:
        text = input_file.read()
    else:  # (an empty --input is a mistake, not the empty object: refused as not JSON)
        text = "{}" if input_json is None else input_json
    value = json_option(text, source)
    flow = FlowOverrides(
        max_active=max_active,
        quiet=duration_option(quiet_text, f"--quiet {quiet_text}") if quiet_text else None,
        max_wait=(
            duration_option(max_wait_text, f"--max-wait {max_wait_text}")
            if max_wait_text else None
        ),
        rate=rate,
        excess=excess,
    )  # fmt: skip

    async def submit_task(store: Store) -> int:
        definition = flow.applied(await store.definitions.submittable(name, version))
        options: dict[str, Any] = dict(
            tenant=tenant, budget=budget, timeout=timeout, tags=task_tags, start_at=start_at,
            delay=delay, priority=priority,
        )
        if key is not None:
            task_id, _ = await store.tasks.submit_keyed(definition, value, key=key, **options)
        else:
            (task_id,) = await store.tasks.submit(definition, [value], **options)
        if not wait_for:
            click.echo(task_id)
            return 0
        click.echo(f"task {task_id} submitted; waiting for it to end", err=True)
        return await await_and_print(store, task_id, wait_timeout_seconds, tenant)

    run = functools.partial(run_waiting, what="the task submitted") if wait_for else run_in_store
    ctx.exit(run(settings, submit_task))


@click.command()
@filter_options
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
              help="Tasks on a page.")
@click.option("--before", type=int, metavar="ID",
              help="The page of tasks with ids below ID (the next page of a listing).")
@click.option("--all", "every", is_flag=True, help="Every matching task, page after page.")
@click.option("--count", "count_only", is_flag=True, help="Print only how many match.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def tasks(
    settings: Settings,
    /,
    limit: int,
    before: int | None,
    every: bool,
    count_only: bool,
    as_json: bool,
    **options: Any,
) -> None:
    """List the tasks the filters match, newest first, a page at a time ("50 of 3,204").

    The filters are ANDed; --state and --tag may repeat. The next page is --before the
    last id shown (keyset pagination: each task is on exactly one page).
    """
    where = task_filter(**filter_fields(options))

    async def listing(store: Store) -> tuple[int, list[TaskRecord]]:
        total = await store.tasks.count(where)
        if count_only:
            return total, []
        found: list[TaskRecord] = []
        after = before
        while True:
            page = await store.tasks.list(where, before=after, limit=limit)
            found += page
            if not every or len(page) < limit:
                return total, found
            after = page[-1].id

    total, records = run_in_store(settings, listing)
    if count_only:
        click.echo(total if not as_json else json.dumps({"count": total}))
        return
    if as_json:
        echo_json([dataclasses.asdict(r) for r in records])
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
    shown = f"{len(records):,} of {total:,}" if len(records) < total else f"{total:,}"
    line = f"{shown} {'task' if total == 1 else 'tasks'}"
    if where != TaskFilter():
        line += f" matching {where.describe()}"
    if records and len(records) < total and not every and len(records) == limit:
        line += f"; next page: --before {records[-1].id}"
    click.echo(line)


@click.command("signal")
@click.argument("task_id", type=int)
@click.argument("name")
@click.option("--payload", help="Signal payload as JSON.")
@click.option(
    "--force", is_flag=True, help="Store it even if no step of the definition waits for NAME."
)
@click.option(
    "--branch",
    help="For this branch of a parallel step only (in a nested step, the path of branch"
    " names, e.g. 0/approval: branch approval of map item 0).",
)
@click.option("--item", type=click.IntRange(min=0), help="For this item of a map step only.")
@task_tenant_option
@click.pass_obj
def send_signal(
    settings: Settings,
    task_id: int,
    name: str,
    payload: str | None,
    force: bool,
    branch: str | None,
    item: int | None,
    tenant: str | None,
) -> None:
    """Send signal NAME to task TASK_ID (kept until a wait consumes it).

    Inside a parallel or map step, --branch or --item addresses one branch; without them
    the signal goes to the one branch waiting for NAME, and is refused when several do.
    """
    value = json_option(payload, "--payload")
    if branch is not None and item is not None:
        raise click.UsageError("give --branch or --item, not both")
    address = str(item) if item is not None else branch
    try:
        signal_id = run_in_store(
            settings,
            lambda store: store.tasks.signal(
                task_id, name, value, force=force, address=address, tenant=tenant
            ),
        )
    except UnknownSignal as refused:  # worded for the command line: --force, not force=True
        raise UnknownSignal(
            refused.refusal("--force"), task_id=task_id, name=name, waited=refused.waited,
            address=refused.address, addresses=refused.addresses,
        ) from None  # fmt: skip
    click.echo(f"signal {signal_id} sent to task {task_id}")


@click.command()
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
    value = json_option(result_json, "--result")
    task_id = run_in_store(
        settings,
        lambda store: store.tasks.complete(token, result=value, error=error, message=message),
    )
    click.echo(f"callback completed; task {task_id} resumes")


@click.command()
@click.argument("task_id", type=int)
@click.option("--reason", default="cancelled by request", show_default=True)
@task_tenant_option
@click.pass_obj
def cancel(settings: Settings, task_id: int, reason: str, tenant: str | None) -> None:
    """Cancel a task: at once if queued or waiting, at its worker's next heartbeat if leased."""
    outcome = run_in_store(
        settings, lambda store: store.tasks.cancel(task_id, reason, tenant=tenant)
    )
    click.echo(
        f"task {task_id} cancelled"
        if outcome == "cancelled"
        else f"task {task_id}: cancel requested; its worker stops it at its next heartbeat"
    )


def outcome_options(command: F) -> F:
    """The options that say what happened of an uncertain effect (``reconcile``)."""
    options = (
        ("--completed", dict(is_flag=True, help="The effect happened.")),
        ("--failed", dict(is_flag=True, help="The effect did not happen.")),
        ("--retry", dict(is_flag=True, help="Call the handler again (the operator's risk).")),
        ("--result", dict(help="With --completed: the effect's result as JSON.")),
        ("--error", dict(help="With --failed: the error name retry and catch rules match.")),
        ("--message", dict(help="With --failed: a description of the failure.")),
    )
    for flag, settings in reversed(options):
        command = click.option(flag, **settings)(command)
    return command


def chosen_outcome(
    completed: bool,
    failed: bool,
    retry: bool,
    result: str | None,
    error: str | None,
    message: str | None,
) -> tuple[Outcome, Any]:
    """The outcome the options chose, and the ``--result`` value.

    Raises:
        ConfigError: not exactly one outcome, or an option that goes with another one.
    """
    flags: tuple[tuple[Outcome, bool], ...] = (
        ("completed", completed), ("failed", failed), ("retry", retry),
    )  # fmt: skip
    chosen = [name for name, on in flags if on]
    if len(chosen) != 1:
        raise ConfigError("give exactly one of --completed, --failed or --retry")
    outcome = chosen[0]
    if result is not None and outcome != "completed":
        raise ConfigError("--result goes with --completed")
    if (error is not None or message is not None) and outcome != "failed":
        raise ConfigError("--error and --message go with --failed")
    return outcome, json_option(result, "--result")


@click.command()
@click.argument("task_id", type=int)
@click.argument("step")
@outcome_options
@task_tenant_option
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
    tenant: str | None,
) -> None:
    """Record the real outcome of an uncertain effect of a task waiting for reconciliation."""
    outcome, value = chosen_outcome(completed, failed, retry, result, error, message)
    run_in_store(
        settings,
        lambda store: store.tasks.reconcile(
            task_id, step, outcome, result=value, error=error, message=message, tenant=tenant
        ),
    )
    click.echo(f"task {task_id}: step {step} reconciled as {outcome}; the task is queued again")
