"""Awaiting a task: ``toolkit wait TASK``, ``submit --wait`` and ``watch TASK``.

``watch`` follows the task's stream too (docs/progress.md).

The output is printed as JSON (exit 0), or the task's error (exit :data:`EXIT_FAILED` or
:data:`EXIT_CANCELLED`); a wait that timed out exits :data:`EXIT_TIMED_OUT`, one stopped by
Ctrl-C :data:`EXIT_INTERRUPTED`. These do not collide with the CLI's own 1 (an error of the
command) and 2 (a usage error).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import click

from toolkit.cli.options import duration_option, task_tenant_option
from toolkit.cli.output import echo_json
from toolkit.cli.session import Settings, run_in_store
from toolkit.errors import TaskCancelled, TaskFailed, ToolkitError, WaitTimedOut
from toolkit.store import Store

#: The exit status when the awaited task failed.
EXIT_FAILED = 3
#: The exit status when the awaited task was cancelled.
EXIT_CANCELLED = 4
#: The exit status when the wait timed out and the task goes on.
EXIT_TIMED_OUT = 5
#: The exit status when Ctrl-C stopped the wait and the task goes on (128 + SIGINT).
EXIT_INTERRUPTED = 130


def run_waiting(settings: Settings, act: Callable[[Store], Awaitable[int]], what: str) -> int:
    """``run_in_store(settings, act)`` for a command that waits for a task.

    Ctrl-C stops the wait, not the task: it says so on stderr (click said only "Aborted!")
    and returns :data:`EXIT_INTERRUPTED`. ``what`` names the task, e.g. ``task 7``.
    """
    try:
        return run_in_store(settings, act)
    except KeyboardInterrupt:
        click.echo(f"stopped waiting (Ctrl-C); {what} goes on (`toolkit show`)", err=True)
        return EXIT_INTERRUPTED


def wait_timeout(text: str | None, option: str) -> float | None:
    """A wait's timeout option in seconds (None: no timeout)."""
    return None if text is None else duration_option(text, f"{option} {text}")


async def await_and_print(
    store: Store, task_id: int, timeout: float | None, tenant: str | None = None
) -> int:
    """Wait for the task, print its output or error; return the exit status.

    ``tenant``: the task's, if known (else looked up by the id).
    """
    try:
        output = await store.tasks.result(task_id, timeout=timeout, tenant=tenant)
    except TaskCancelled as exc:
        click.echo(f"error: {exc.message}", err=True)
        echo_json(exc.error)
        return EXIT_CANCELLED
    except TaskFailed as exc:
        click.echo(f"error: {exc.message}", err=True)
        echo_json(exc.error)
        return EXIT_FAILED
    except WaitTimedOut as exc:
        click.echo(f"error: {exc.message}{await _unserved(store, task_id, tenant)}", err=True)
        return EXIT_TIMED_OUT
    echo_json(output)
    return 0


async def _unserved(store: Store, task_id: int, tenant: str | None) -> str:
    """Why a task waited for nothing, when that is why: no live worker has its definition.

    Empty when a worker has it, or when the store cannot say (the timeout is the news).
    """
    try:
        task = await store.tasks.get(task_id, tenant=tenant)
        version = (task.definition_name, task.definition_version)
        if version not in await store.definitions.unavailable():
            return ""
    except ToolkitError:
        return ""
    return f"; no live worker has loaded {version[0]} v{version[1]} (`toolkit doctor`)"


@click.command()
@click.argument("task_id", type=int)
@click.option(
    "--timeout",
    "timeout_text",
    metavar="DURATION",
    help="Give up after this long (e.g. 30s, 5m); the task goes on. Default: wait until it ends.",
)
@task_tenant_option
@click.pass_context
def wait(ctx: click.Context, task_id: int, timeout_text: str | None, tenant: str | None) -> None:
    """Wait for task TASK_ID to end; print its output as JSON.

    Exit status: 0 it succeeded (the output on stdout); 3 it failed and 4 it was cancelled
    (the error as JSON on stdout, a line on stderr); 5 the timeout passed first; 130 Ctrl-C
    stopped the wait (the task goes on).
    """
    settings: Settings = ctx.obj
    timeout = wait_timeout(timeout_text, "--timeout")
    ctx.exit(
        run_waiting(
            settings, lambda store: await_and_print(store, task_id, timeout, tenant),
            f"task {task_id}",
        )
    )


@click.command()
@click.argument("task_id", type=int)
@click.option("--after", type=click.IntRange(min=0), default=0, show_default=True,
              help="Show the stream's items after this number (resume where you left).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per event.")
@task_tenant_option
@click.pass_context
def watch(
    ctx: click.Context, task_id: int, after: int, as_json: bool, tenant: str | None
) -> None:
    """Follow task TASK_ID until it ends: its state, what its steps publish and their progress.

    Prints a line per state change, per published item (`item N VALUE`, durable and in
    order) and per progress value (best effort, while watching), then the task's output or
    error. Exit status as `toolkit wait`: 0 succeeded, 3 failed, 4 cancelled.
    """  # fmt: skip
    settings: Settings = ctx.obj

    async def follow(store: Store) -> int:
        code = 0
        async for event in store.streams.follow(task_id, after=after, tenant=tenant):
            if as_json:
                line = {"kind": event.kind, "value": event.value, "seq": event.seq,
                        "occurrence": event.occurrence, **event.detail}  # fmt: skip
                click.echo(json.dumps(line, default=str, ensure_ascii=False))
            elif event.kind == "item":
                click.echo(f"item {event.seq} {json.dumps(event.value)}")
            elif event.kind == "progress":
                click.echo(f"progress {json.dumps(event.value)}")
            else:
                reason = event.detail.get("wait_reason")
                click.echo(f"state {event.value}" + (f" ({reason})" if reason else ""))
            if event.kind == "state" and event.value in ("succeeded", "failed", "cancelled"):
                code = {"succeeded": 0, "failed": EXIT_FAILED}.get(event.value, EXIT_CANCELLED)
                if not as_json:
                    echo_json(event.detail.get("result" if code == 0 else "error"))
        return code

    ctx.exit(run_waiting(settings, follow, f"task {task_id}"))
