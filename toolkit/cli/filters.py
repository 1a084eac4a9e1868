"""The filter options, the same on every command that finds tasks (``tasks``, ``bulk``).

Each option is a field of :class:`~toolkit.store.filters.TaskFilter` (docs/many-tasks.md);
given together they are ANDed, ``--state`` and ``--tag`` may repeat (any of the states; all
of the tags).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from toolkit.errors import ConfigError, InputError
from toolkit.lifecycle import TaskState, WaitReason
from toolkit.store.filters import TaskFilter

F = TypeVar("F", bound=Callable[..., Any])

_TIME_HELP = "a time (2026-06-01, 2026-06-01T12:00+02:00) or a duration before now (30m, 2d)"

#: The options, outermost first, as ``(flags, click keyword arguments)``.
_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--state",), dict(
        type=click.Choice([s.value for s in TaskState]), multiple=True,
        help="Tasks in this state (repeatable: any of them).")),
    (("--wait-reason",), dict(
        type=click.Choice([r.value for r in WaitReason]), help="Waiting tasks waiting for this.")),
    (("--tenant",), dict(help="Tasks of this tenant.")),
    (("--definition",), dict(
        metavar="NAME[@VERSION]", help="Tasks of this definition, or of one version of it.")),
    (("--tag", "tags"), dict(
        multiple=True, metavar="KEY=VALUE", help="Tasks with this tag (repeatable: all of them).")),
    (("--error",), dict(metavar="NAME", help="Tasks that ended with this error (e.g. Declined).")),
    (("--step",), dict(metavar="STEP", help="Tasks at this step, or that failed at it.")),
    (("--schedule",), dict(metavar="NAME", help="Tasks started by this schedule.")),
    (("--parent",), dict(
        type=int, metavar="TASK", help="Children of this task (a distributed map's items).")),
    (("--created-since",), dict(metavar="TIME", help=f"Submitted at or after: {_TIME_HELP}.")),
    (("--created-until",), dict(metavar="TIME", help="Submitted before TIME.")),
    (("--finished-since",), dict(metavar="TIME", help="Ended at or after TIME.")),
    (("--finished-until",), dict(metavar="TIME", help="Ended before TIME.")),
)  # fmt: skip


def filter_options(command: F, *, leave_out: tuple[str, ...] = ()) -> F:
    """Add the filter options to a click command.

    The command receives them as keyword arguments: :func:`filter_fields` takes them out,
    :func:`task_filter` makes the filter.

    Args:
        command: the command.
        leave_out: fields the command gives a meaning of its own (``bulk reconcile STEP``
            names the step, its ``--error`` the outcome's error).
    """
    for flags, settings in reversed(_OPTIONS):
        if _name(flags) not in leave_out:
            command = click.option(*flags, **settings)(command)
    return command


def _name(flags: tuple[str, ...]) -> str:
    """The keyword argument an option's value is passed as."""
    return flags[1] if len(flags) > 1 else flags[0][2:].replace("-", "_")


def tag_options(texts: Sequence[str], option: str = "--tag") -> dict[str, str]:
    """``--tag KEY=VALUE`` options as a mapping.

    Raises:
        ConfigError: one is not of that form.
    """
    tags: dict[str, str] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise ConfigError(f"{option} {text}: expected KEY=VALUE, e.g. customer=acme")
        tags[key] = value
    return tags


def task_filter(
    state: Sequence[str] = (),
    wait_reason: str | None = None,
    tenant: str | None = None,
    definition: str | None = None,
    tags: Sequence[str] = (),
    error: str | None = None,
    step: str | None = None,
    schedule: str | None = None,
    parent: int | None = None,
    created_since: str | None = None,
    created_until: str | None = None,
    finished_since: str | None = None,
    finished_until: str | None = None,
) -> TaskFilter:
    """The filter the options give.

    Raises:
        ConfigError: an option's value is not valid; the message names the option.
    """
    try:
        return TaskFilter(
            state=tuple(state) or None,
            wait_reason=wait_reason,
            tenant=tenant,
            definition=definition,
            tags=tag_options(tags) or None,
            error=error,
            step=step,
            schedule=schedule,
            parent=parent,
            created_since=created_since,
            created_until=created_until,
            finished_since=finished_since,
            finished_until=finished_until,
        )
    except InputError as exc:
        field = str(exc.path or "filter").split(".")[0]
        option = "--tag" if field == "tags" else "--" + field.replace("_", "-")
        message = exc.message
        if message.startswith(field + " "):  # "created_since '...' is ..." names the option
            raise ConfigError(f"{option} {message[len(field) + 1:]}") from None
        raise ConfigError(f"{option}: {message}") from None


def filter_fields(options: dict[str, Any]) -> dict[str, Any]:
    """Pop the filter options out of a command's keyword arguments (for :func:`task_filter`)."""
    names = [_name(flags) for flags, _ in _OPTIONS]
    return {name: options.pop(name) for name in names if name in options}
