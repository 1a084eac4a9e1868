"""One filter over tasks, for reading and for acting (docs/many-tasks.md).

:class:`TaskFilter` has the same fields as the CLI's filter options (``--state``,
``--wait-reason``, ``--tenant``, ``--definition NAME[@VERSION]``, ``--tag K=V``, ``--error``,
``--step``, ``--created-since`` ...) and the notebook's: ``toolkit tasks``, ``toolkit bulk``,
:meth:`Tasks.list <toolkit.store.tasks.Tasks.list>` and the TaskBrowser all take one. There
is no text query language: each field is ANDed with the others, a field left None matches
any task. The SQL is one statement (``task_filter`` in ``sql/queries/tasks.sql``), planned
for the values of each call, so a tag filter uses the GIN index on tags and a state and
definition filter the definition index.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from toolkit.durations import parse_duration
from toolkit.errors import InputError
from toolkit.lifecycle import TaskState, WaitReason
from toolkit.store.tags import check_tags

#: A time bound of a filter: a datetime, an ISO 8601 text, or a duration before now
#: (seconds, or a text such as ``30m`` or ``2d``).
TimeBound = datetime.datetime | str | float | int

_STATES = tuple(state.value for state in TaskState)
_WAIT_REASONS = tuple(reason.value for reason in WaitReason)
_BOUNDS = ("created_since", "created_until", "finished_since", "finished_until")


@dataclasses.dataclass(frozen=True)
class TaskFilter:
    """Which tasks: every field given must hold (AND); a field left None matches any task.

    Attributes:
        state: one state or several (any of them), e.g. ``"failed"`` or
            ``("queued", "waiting")``.
        wait_reason: why a waiting task waits (``signal``, ``timer``, ``reconciliation`` ...).
        tenant: the tenant.
        definition: the definition name, or ``NAME@VERSION``.
        tags: tags the task must all have (key to value).
        error: the name of the error a task ended with (``Declined``, ``Timeout``,
            ``Cancelled`` ...).
        step: the step a task is at, or failed at.
        schedule: the schedule that started the task.
        parent: the id of the task's parent: a ``workflow`` step's child, or a distributed
            map's item tasks (docs/composition.md#distributed-map).
        created_since, created_until: bounds of the submit time (inclusive, exclusive): a
            datetime (naive means UTC), an ISO 8601 text, or a duration before now (seconds,
            or ``"30m"``, ``"2d"``).
        finished_since, finished_until: the same for the time a task ended.

    Raises:
        InputError: on construction, a field that is not one: an unknown state or wait
            reason, a malformed definition, tag or time; ``path`` names the field.
    """

    state: str | Sequence[str] | None = None
    wait_reason: str | None = None
    tenant: str | None = None
    definition: str | None = None
    tags: Mapping[str, str] | None = None
    error: str | None = None
    step: str | None = None
    schedule: str | None = None
    parent: int | None = None
    created_since: TimeBound | None = None
    created_until: TimeBound | None = None
    finished_since: TimeBound | None = None
    finished_until: TimeBound | None = None

    def __post_init__(self) -> None:
        for state in self.states or ():
            if state not in _STATES:
                raise InputError(
                    f"unknown state {state!r}: one of {', '.join(_STATES)}", path="state"
                )
        if self.wait_reason is not None and self.wait_reason not in _WAIT_REASONS:
            raise InputError(
                f"unknown wait reason {self.wait_reason!r}: one of {', '.join(_WAIT_REASONS)}",
                path="wait_reason",
            )
        self.definition_version  # noqa: B018 - checks NAME@VERSION
        if self.tags is not None:
            check_tags(self.tags, path="tags")
        for field in _BOUNDS:
            time_bound(getattr(self, field), field, datetime.datetime.now(datetime.UTC))

    @property
    def has_time_bounds(self) -> bool:
        """Whether a time bound is given (a duration needs the database's now)."""
        return any(getattr(self, field) is not None for field in _BOUNDS)

    @property
    def states(self) -> tuple[str, ...] | None:
        """The states asked for, as a tuple (None: any)."""
        if self.state is None:
            return None
        return (self.state,) if isinstance(self.state, str) else tuple(self.state)

    @property
    def definition_name(self) -> str | None:
        """The definition name, without its version."""
        return None if self.definition is None else self.definition.partition("@")[0]

    @property
    def definition_version(self) -> int | None:
        """The definition version of ``NAME@VERSION``, None without one.

        Raises:
            InputError: the definition is not ``NAME`` or ``NAME@VERSION`` with VERSION ≥ 1.
        """
        if self.definition is None:
            return None
        name, sep, version = self.definition.partition("@")
        if not name or (sep and not (version.isdigit() and int(version) >= 1)):
            raise InputError(
                f"definition {self.definition!r}: expected NAME or NAME@VERSION, e.g. "
                "orders or orders@2",
                path="definition",
            )
        return int(version) if sep else None

    def params(self, now: datetime.datetime) -> dict[str, Any]:
        """The named parameters of the ``task_filter`` SQL fragment.

        Args:
            now: the database's time, from which durations are counted back.
        """
        from psycopg.types.json import Jsonb

        states = self.states
        return {
            "states": list(states) if states is not None else None,
            "wait_reason": self.wait_reason,
            "tenant": self.tenant,
            "name": self.definition_name,
            "version": self.definition_version,
            "tags": Jsonb(dict(self.tags)) if self.tags else None,
            "error": self.error,
            "step": self.step,
            "schedule": self.schedule,
            "parent": self.parent,
            **{field: time_bound(getattr(self, field), field, now) for field in _BOUNDS},
        }

    def to_json(self, now: datetime.datetime) -> dict[str, Any]:
        """The fields given, as JSON, time bounds resolved to ISO 8601 (a bulk plan keeps it)."""
        found: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            if field.name in _BOUNDS:
                bound = time_bound(value, field.name, now)
                assert bound is not None
                value = bound.isoformat()
            elif field.name == "state":
                value = list(self.states or ())
            elif field.name == "tags":
                value = dict(value)
            found[field.name] = value
        return found

    def describe(self) -> str:
        """The filter in words, as the CLI's options would give it (``all tasks`` if empty)."""
        parts = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            option = "--" + field.name.replace("_", "-")
            if field.name == "tags":
                parts += [f"--tag {key}={tag}" for key, tag in value.items()]
            elif field.name == "state":
                parts += [f"--state {state}" for state in self.states or ()]
            else:
                parts.append(f"{option} {value}")
        return " ".join(parts) or "all tasks"


def time_bound(
    value: TimeBound | None, field: str, now: datetime.datetime
) -> datetime.datetime | None:
    """A time bound as an aware datetime: a duration counts back from ``now``.

    Raises:
        InputError: the value is neither a time nor a duration.
    """
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
    if isinstance(value, str):
        try:
            moment = datetime.datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)
    try:
        return now - datetime.timedelta(seconds=parse_duration(value))
    except (ValueError, OverflowError):
        raise InputError(
            f"{field} {value!r} is neither a time nor a duration: give an ISO 8601 time "
            "(2026-06-01, 2026-06-01T12:00:00+02:00) or a duration before now (30m, 2d)",
            path=field,
        ) from None
