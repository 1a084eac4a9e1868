"""``toolkit redrive``: bring a failed or cancelled task back, showing first what runs again."""

from __future__ import annotations

from collections.abc import Sequence

import click

from toolkit.cli.options import duration_option, task_tenant_option
from toolkit.cli.session import Settings, run_in_store
from toolkit.errors import RedriveRefused
from toolkit.store import Store
from toolkit.store.redrive_plan import RedrivePlan


@click.command()
@click.argument("task_id", type=int)
@click.option("--from", "from_step", metavar="STEP", help="Resume at this earlier step.")
@click.option("--version", type=int, help="Resume on this version of the task's definition.")
@click.option(
    "--rerun",
    "rerun",
    multiple=True,
    metavar="STEP",
    help="Allow this non-idempotent step to be called again, with a new key (repeatable).",
)
@click.option(
    "--timeout",
    "timeout_text",
    metavar="DURATION",
    help="A new workflow deadline from now (a task failed by its deadline needs one).",
)
@click.option("--reason", help="Why: recorded in the task's redriven event.")
@click.option("--operator", default="operator", show_default=True, help="Who redrives it.")
@click.option("--dry-run", is_flag=True, help="Only show what the redrive would do.")
@task_tenant_option
@click.pass_obj
def redrive(
    settings: Settings,
    task_id: int,
    from_step: str | None,
    version: int | None,
    rerun: Sequence[str],
    timeout_text: str | None,
    reason: str | None,
    operator: str,
    dry_run: bool,
    tenant: str | None,
) -> None:
    """Bring back failed or cancelled task TASK_ID from the step that failed.

    Completed steps keep their recorded results; the failed step runs again with a fresh
    attempt budget. With --from, the steps from STEP on run again, and a completed effect
    that is not idempotent is refused unless named with --rerun. The plan is printed
    first: what is called again, what is not, what is refused. --dry-run exits 1 when the
    redrive would be refused, as the redrive does.
    """
    timeout = duration_option(timeout_text, "--timeout") if timeout_text else None

    async def act(store: Store) -> RedrivePlan:
        try:
            return await store.tasks.redrive(
                task_id, from_step=from_step, version=version, rerun=rerun, timeout=timeout,
                reason=reason, operator=operator, dry_run=dry_run, tenant=tenant,
            )  # fmt: skip
        except RedriveRefused as exc:
            if isinstance(exc.plan, RedrivePlan):
                for line in exc.plan.lines():
                    click.echo(line)
            raise

    plan = run_in_store(settings, act)
    for line in plan.lines():
        click.echo(line)
    if dry_run:
        click.echo("dry run: nothing was changed")
        if plan.refusals:  # as the redrive itself would: a script can use the dry run
            raise click.exceptions.Exit(1)
    else:
        click.echo(f"task {task_id} redriven; it is queued")
