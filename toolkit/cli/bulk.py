"""``toolkit bulk``: act on every task a filter matches, through a plan.

Without ``--yes`` an action previews: how many tasks match, by state and definition, a
sample, what the action would do to each kind, and a *plan* kept in the store that
``toolkit bulk apply PLAN`` carries out, touching only tasks whose fencing token and state
are still those the plan recorded (docs/many-tasks.md).
"""

from __future__ import annotations

import dataclasses
import getpass
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import click

from toolkit.cli.filters import filter_fields, filter_options, task_filter
from toolkit.cli.options import duration_option, json_option
from toolkit.cli.output import json_line
from toolkit.cli.session import Settings, run_in_store
from toolkit.cli.tasks import chosen_outcome, outcome_options
from toolkit.counts import counted
from toolkit.store import Store
from toolkit.store.bulk import BATCH_SIZE, Plan
from toolkit.store.filters import TaskFilter

_SAMPLE = 5


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"


def _common(*leave_out: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options every bulk action takes: the filters, --yes and --operator."""

    def options(command: Callable[..., Any]) -> Callable[..., Any]:
        command = click.option(
            "--operator", default=_operator, show_default="your user name",
            help="Who acts: recorded with the plan and each task's event.")(command)  # fmt: skip
        command = click.option(
            "--yes", is_flag=True, help="Apply at once, without a separate preview.")(command)
        return filter_options(command, leave_out=leave_out)

    return options


@click.group()
def bulk() -> None:
    """Act on every task a filter matches: preview a plan, then apply it."""


def _preview_or_apply(
    settings: Settings,
    make: Callable[[Store, TaskFilter], Awaitable[Plan]],
    yes: bool,
    options: dict[str, Any],
) -> None:
    where = task_filter(**filter_fields(options))

    async def planned(store: Store) -> None:
        plan = await make(store, where)
        # the examples are tasks the plan acts on: of the states it planned, not those it
        # leaves alone (an ended task matched by a cancel's filter)
        acted = dataclasses.replace(where, state=sorted({row[0] for row in plan.planned_counts}))
        sample = await store.tasks.list(acted, limit=_SAMPLE) if plan.planned else []
        _print_preview(plan, where, sample)
        if yes and plan.planned:
            await _apply(store, plan.id)
        elif plan.planned:
            click.echo(
                f"plan {plan.id} kept: `toolkit bulk apply {plan.id}` carries it out, acting "
                "only on tasks whose fencing token and state are still those planned"
            )

    run_in_store(settings, planned)


def _print_preview(plan: Plan, where: TaskFilter, sample: list[Any]) -> None:
    matched = sum(n for *_, n in plan.matched)
    click.echo(f"{counted(matched, 'task')} {'matches' if matched == 1 else 'match'} "
               f"({where.describe()})")  # fmt: skip
    if plan.matched:
        click.echo(f"  {'STATE':<10} {'DEFINITION':<32} {'TASKS':>9}")
        for state, name, version, n in plan.matched:
            click.echo(f"  {state:<10} {name + ' v' + str(version):<32} {n:>9,}")
    click.echo(f"{plan.action} would act on {plan.planned:,} of them:")
    for line in plan.effects():
        click.echo(f"  - {line}")
    for task in sample:
        tags = " ".join(f"{k}={v}" for k, v in sorted(task.tags.items()))
        click.echo(
            f"  e.g. task {task.id}: {task.state} {task.definition_name} "
            f"v{task.definition_version}, tenant {task.tenant}" + (f", {tags}" if tags else "")
        )


async def _apply(store: Store, plan_id: int, batch_size: int = BATCH_SIZE) -> None:
    plan = await store.bulk.get(plan_id)
    if plan.finished_at is None and sys.stdout.isatty():
        with click.progressbar(length=plan.left, label=f"plan {plan_id}") as bar:
            plan = await store.bulk.apply(plan_id, batch_size=batch_size, progress=bar.update)
    else:
        plan = await store.bulk.apply(plan_id, batch_size=batch_size)
    click.echo(f"plan {plan_id} applied: {plan.summary()}")
    for row in await store.bulk.not_acted_on(plan_id, limit=10):
        if row["outcome"] == "refused" and row["reason"]:
            click.echo(f"  task {row['task_id']} refused: {row['reason']}")
            continue
        now = (
            "deleted" if row["state"] is None
            else f"now {row['state']} token {row['lease_token']}"
        )  # fmt: skip
        click.echo(
            f"  task {row['task_id']} {row['outcome']}: planned {row['planned_state']} token "
            f"{row['planned_token']}, {now}"
        )


@bulk.command("cancel")
@_common()
@click.option("--reason", default="cancelled in bulk", show_default=True)
@click.pass_obj
def bulk_cancel(
    settings: Settings, /, yes: bool, operator: str, reason: str, **options: Any
) -> None:
    """Cancel the live tasks the filters match (as `toolkit cancel` does one)."""
    _preview_or_apply(
        settings,
        lambda store, where: store.bulk.plan_cancel(where, reason=reason, operator=operator),
        yes,
        options,
    )


@bulk.command("signal")
@click.argument("name")
@_common()
@click.option("--payload", help="Signal payload as JSON.")
@click.option("--force", is_flag=True, help="Plan it even for definitions with no wait for NAME.")
@click.pass_obj
def bulk_signal(
    settings: Settings,
    /,
    name: str,
    yes: bool,
    operator: str,
    payload: str | None,
    force: bool,
    **options: Any,
) -> None:
    """Send signal NAME to the live tasks the filters match (each gets it once)."""
    value = json_option(payload, "--payload")
    _preview_or_apply(
        settings,
        lambda store, where: store.bulk.plan_signal(
            where, name, value, force=force, operator=operator
        ),
        yes,
        options,
    )


@bulk.command("reconcile")
@click.argument("step")
@_common("step", "error")
@outcome_options
@click.pass_obj
def bulk_reconcile(
    settings: Settings,
    /,
    step: str,
    yes: bool,
    operator: str,
    completed: bool,
    failed: bool,
    retry: bool,
    result: str | None,
    error: str | None,
    message: str | None,
    **options: Any,
) -> None:
    """Record the outcome of step STEP's uncertain effect, for the matching tasks.

    Only the tasks waiting for the reconciliation of an occurrence of STEP are planned.
    """
    outcome, value = chosen_outcome(completed, failed, retry, result, error, message)
    _preview_or_apply(
        settings,
        lambda store, where: store.bulk.plan_reconcile(
            where, step, outcome, result=value, error=error, message=message, operator=operator
        ),
        yes,
        options,
    )


@bulk.command("redrive")
@_common()
@click.option("--from", "from_step", metavar="STEP", help="Resume each task at this step.")
@click.option("--version", type=int, help="Resume each task on this version of its definition.")
@click.option("--rerun", multiple=True, metavar="STEP",
              help="Allow this non-idempotent step to be called again (repeatable).")  # fmt: skip
@click.option("--timeout", "timeout_text", metavar="DURATION",
              help="A new workflow deadline from now (needed after a deadline).")  # fmt: skip
@click.option("--reason", help="Why: recorded in each task's redriven event.")
@click.pass_obj
def bulk_redrive(
    settings: Settings,
    /,
    yes: bool,
    operator: str,
    from_step: str | None,
    version: int | None,
    rerun: tuple[str, ...],
    timeout_text: str | None,
    reason: str | None,
    **options: Any,
) -> None:
    """Redrive the failed and cancelled tasks the filters match (as `toolkit redrive` does one).

    The preview plans every task's redrive and sums what would happen: the effects called
    again, by step, and the tasks refused, with why. Applying redrives each task whose
    redrive is not refused, only if its fencing token and state are still those planned.
    """
    timeout = duration_option(timeout_text, "--timeout") if timeout_text else None

    def make(store: Store, where: TaskFilter) -> Awaitable[Plan]:
        return store.bulk.plan_redrive(
            where, from_step=from_step, version=version, rerun=rerun, timeout=timeout,
            reason=reason, operator=operator,
        )  # fmt: skip

    _preview_or_apply(settings, make, yes, options)


@bulk.command("apply")
@click.argument("plan_id", metavar="PLAN", type=int)
@click.option("--batch-size", type=click.IntRange(min=1), default=BATCH_SIZE, show_default=True,
              help="Tasks acted on in one transaction.")  # fmt: skip
@click.pass_obj
def bulk_apply(settings: Settings, plan_id: int, batch_size: int) -> None:
    """Carry out plan PLAN, or finish an apply that stopped.

    Each task is acted on once, and only if its fencing token and state are still those
    planned.
    """
    run_in_store(settings, lambda store: _apply(store, plan_id, batch_size))


@bulk.command("show")
@click.argument("plan_id", metavar="PLAN", type=int)
@click.pass_obj
def bulk_show(settings: Settings, plan_id: int) -> None:
    """Show plan PLAN: its action, filter, operator and how far applying it went."""

    async def show(store: Store) -> None:
        plan = await store.bulk.get(plan_id)
        state = "applied" if plan.finished_at else ("not applied" if not (
            plan.applied or plan.moved or plan.gone or plan.refused) else "applied in part")
        click.echo(f"plan {plan.id}: {plan.action} by {plan.operator}, {state}")
        click.echo(f"  made:     {plan.created_at:%Y-%m-%d %H:%M:%S %Z}")
        click.echo(f"  filter:   {json_line(plan.filter)}")
        shown = {k: v for k, v in plan.arguments.items() if k != "payloads"}
        click.echo(f"  action:   {json_line(shown)}")
        click.echo(f"  planned:  {plan.planned:,} tasks; {plan.summary()}")

    run_in_store(settings, show)
