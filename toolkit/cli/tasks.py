"""Tasks: submit, list, and act on one (signal, complete, cancel, reconcile).

``show``, one task in detail, has its own module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import IO, Literal

import click

from toolkit.cli.options import duration_option, json_option, resource_amounts
from toolkit.cli.output import echo_json
from toolkit.cli.session import Settings, run_in_store
from toolkit.errors import ConfigError, UnknownSignal
from toolkit.store import Store

Outcome = Literal["completed", "failed", "retry"]
"""What ``reconcile`` records of an uncertain effect, as the store takes it."""


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
@click.pass_obj
def submit(
    settings: Settings,
    name: str,
    version: int | None,
    input_json: str | None,
    input_file: IO[str] | None,
    tenant: str,
    key: str | None,
    budgets: Sequence[str],
    timeout_text: str | None,
) -> None:
    """Submit a task of definition NAME (default: its latest version); prints the task id."""
    if input_json is not None and input_file is not None:
        raise ConfigError("give --input or --input-file, not both")
    budget: dict[str, float] = {}
    for resource, amount in resource_amounts(budgets).items():
        try:
            budget[resource] = float(amount)
        except ValueError:
            raise ConfigError(f"--budget {resource}={amount}: {amount!r} is not a number") from None
    timeout = None
    if timeout_text is not None:
        timeout = duration_option(timeout_text, f"--timeout {timeout_text}")
    source = "--input-file" if input_file is not None else "--input"
    text = input_file.read() if input_file is not None else (input_json or "{}")
    value = json_option(text, source)

    async def submit_task(store: Store) -> int:
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

    click.echo(run_in_store(settings, submit_task))


@click.command()
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
    records = run_in_store(
        settings,
        lambda store: store.tasks.list(state=state, tenant=tenant, name=name, limit=limit),
    )
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


@click.command("signal")
@click.argument("task_id", type=int)
@click.argument("name")
@click.option("--payload", help="Signal payload as JSON.")
@click.option(
    "--force", is_flag=True, help="Store it even if no step of the definition waits for NAME."
)
@click.pass_obj
def send_signal(
    settings: Settings, task_id: int, name: str, payload: str | None, force: bool
) -> None:
    """Send signal NAME to task TASK_ID (kept until a wait consumes it)."""
    value = json_option(payload, "--payload")
    try:
        signal_id = run_in_store(
            settings, lambda store: store.tasks.signal(task_id, name, value, force=force)
        )
    except UnknownSignal as refused:  # worded for the command line: --force, not force=True
        raise UnknownSignal(
            refused.refusal("--force"), task_id=task_id, name=name, waited=refused.waited
        ) from None
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
@click.pass_obj
def cancel(settings: Settings, task_id: int, reason: str) -> None:
    """Cancel a task: at once if queued or waiting, at its worker's next heartbeat if leased."""
    outcome = run_in_store(settings, lambda store: store.tasks.cancel(task_id, reason))
    click.echo(
        f"task {task_id} cancelled"
        if outcome == "cancelled"
        else f"task {task_id}: cancel requested; its worker stops it at its next heartbeat"
    )


@click.command()
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
    value = json_option(result, "--result")
    run_in_store(
        settings,
        lambda store: store.tasks.reconcile(
            task_id, step, outcome, result=value, error=error, message=message
        ),
    )
    click.echo(f"task {task_id}: step {step} reconciled as {outcome}; the task is queued again")
