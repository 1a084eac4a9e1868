"""Awaiting a task's result: ``toolkit wait TASK`` and ``toolkit submit --wait``.

The output is printed as JSON (exit 0), or the task's error (exit :data:`EXIT_FAILED` or
:data:`EXIT_CANCELLED`); a wait that timed out exits :data:`EXIT_TIMED_OUT`. These do not
collide with the CLI's own 1 (an error of the command) and 2 (a usage error).
"""

from __future__ import annotations

import click

from toolkit.cli.options import duration_option
from toolkit.cli.output import echo_json
from toolkit.cli.session import Settings, run_in_store
from toolkit.errors import TaskCancelled, TaskFailed, WaitTimedOut
from toolkit.store import Store

#: The exit status when the awaited task failed.
EXIT_FAILED = 3
#: The exit status when the awaited task was cancelled.
EXIT_CANCELLED = 4
#: The exit status when the wait timed out and the task goes on.
EXIT_TIMED_OUT = 5


def wait_timeout(text: str | None, option: str) -> float | None:
    """A wait's timeout option in seconds (None: no timeout)."""
    return None if text is None else duration_option(text, f"{option} {text}")


async def await_and_print(store: Store, task_id: int, timeout: float | None) -> int:
    """Wait for the task, print its output or error; return the exit status."""
    try:
        output = await store.tasks.result(task_id, timeout=timeout)
    except TaskCancelled as exc:
        click.echo(f"error: {exc.message}", err=True)
        echo_json(exc.error)
        return EXIT_CANCELLED
    except TaskFailed as exc:
        click.echo(f"error: {exc.message}", err=True)
        echo_json(exc.error)
        return EXIT_FAILED
    except WaitTimedOut as exc:
        click.echo(f"error: {exc.message}", err=True)
        return EXIT_TIMED_OUT
    echo_json(output)
    return 0


@click.command()
@click.argument("task_id", type=int)
@click.option(
    "--timeout",
    "timeout_text",
    metavar="DURATION",
    help="Give up after this long (e.g. 30s, 5m); the task goes on. Default: wait until it ends.",
)
@click.pass_context
def wait(ctx: click.Context, task_id: int, timeout_text: str | None) -> None:
    """Wait for task TASK_ID to end; print its output as JSON.

    Exit status: 0 it succeeded (the output on stdout); 3 it failed and 4 it was cancelled
    (the error as JSON on stdout, a line on stderr); 5 the timeout passed first.
    """
    settings: Settings = ctx.obj
    timeout = wait_timeout(timeout_text, "--timeout")
    ctx.exit(run_in_store(settings, lambda store: await_and_print(store, task_id, timeout)))
