"""The toolkit's exception hierarchy.

Every error the toolkit raises on purpose derives from `ToolkitError`, so an
application can catch the whole family with one ``except`` clause. Each class
docstring's first line doubles as its default message, and the structured
facts an operator or program acts on (file, line, JSON path, step id,
expression ...) are attributes, not only text in the message.

To add an error: subclass `ToolkitError` (or a closer relative), write a
one-line summary docstring (the default message), accept the message as the
first optional argument and any structured facts as keyword-only arguments,
and store them as attributes before calling ``super().__init__(message)``.
Pickling (e.g. across process pools) keeps the attributes without any extra
code.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BudgetExceeded",
    "CallbackRefused",
    "ConcurrencyKeyBusy",
    "ConfigError",
    "DatabaseUnavailable",
    "DefinitionConflict",
    "DefinitionError",
    "DefinitionFault",
    "DefinitionInUse",
    "DefinitionRetired",
    "EffectCancelled",
    "ExpressionError",
    "ExpressionSyntaxError",
    "HandlerArgumentsMismatch",
    "HandlerNotFound",
    "HistoryError",
    "InputError",
    "LeaseLost",
    "MissingHandlers",
    "MissingLimits",
    "NoChoiceMatched",
    "NotExported",
    "NotReconcilable",
    "PayloadRefused",
    "PlanRefused",
    "ResultNotJson",
    "ResultTooLarge",
    "SchemaOutdated",
    "StoreError",
    "SubmitConflict",
    "TaskCancelled",
    "TaskFailed",
    "TaskTerminal",
    "Throttled",
    "ToolkitError",
    "UnknownDefinition",
    "UnknownLimit",
    "UnknownSignal",
    "UnknownTask",
    "UnknownTenant",
    "WaitTimedOut",
    "WorkerIdInUse",
]


def _rebuild(cls: type[ToolkitError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """Recreate a pickled `ToolkitError` without calling its ``__init__``."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ToolkitError(Exception):
    """Base of every error the toolkit raises on purpose."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.default_message())

    @classmethod
    def default_message(cls) -> str:
        """Return the summary line of the class docstring, the message used when none is given."""
        doc = inspect.cleandoc(cls.__doc__ or "") or cls.__name__
        return doc.split("\n", 1)[0].strip()

    @property
    def message(self) -> str:
        """The human-readable message (the first constructor argument)."""
        return str(self.args[0]) if self.args else self.default_message()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


# --- workflow definitions -------------------------------------------------------------------


@dataclass(frozen=True)
class DefinitionFault:
    """One problem found in a workflow definition.

    Attributes:
        file: The file the definition came from (or a label such as ``<string>``).
        line: 1-based line in that file, or None when unknown (e.g. a definition rebuilt
            from its stored JSON body, or a fault about the file as a whole).
        path: JSON path of the faulty value, e.g. ``$.steps.reserve.retry.max_attempts``.
        message: What is wrong, phrased so the author can fix it.
    """

    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.path}: {self.message}"


class DefinitionError(ToolkitError):
    """Invalid workflow definition.

    Attributes:
        faults: Every fault found, in report order. ``str(error)`` is one
            ``FILE:LINE: PATH: message`` line per fault.
        loaded: The definitions of the other files, which loaded (``load_definitions``):
            a check of their handlers can report beside these faults (``toolkit validate``).
    """

    def __init__(
        self,
        faults: Iterable[DefinitionFault],
        message: str | None = None,
        *,
        loaded: Sequence[Any] = (),
    ) -> None:
        self.faults: tuple[DefinitionFault, ...] = tuple(faults)
        self.loaded: tuple[Any, ...] = tuple(loaded)
        super().__init__(message or "\n".join(map(str, self.faults)) or None)


class InputError(ToolkitError):
    """Task input does not match the workflow's input schema.

    Attributes:
        path: JSON path of the (most relevant) faulty value in the input, e.g. ``$.order_id``.
    """

    def __init__(self, message: str | None = None, *, path: str = "$") -> None:
        self.path = path
        super().__init__(message)


# --- expressions ----------------------------------------------------------------------------


class ExpressionSyntaxError(ToolkitError):
    """Invalid expression.

    Attributes:
        path: JSON path of the string holding the expression, e.g. ``$.steps.a.args.order``.
        expression: The expression text between ``${`` and ``}`` (or the whole string when
            the problem is with the ``${ }`` delimiters).
    """

    def __init__(
        self, message: str | None = None, *, path: str = "$", expression: str = ""
    ) -> None:
        self.path = path
        self.expression = expression
        super().__init__(message)


class ExpressionError(ToolkitError):
    """Expression evaluation failed.

    Raised at run time, e.g. when a JMESPath function gets a value of the wrong type.

    Attributes:
        expression: The expression text, when known.
        step: Id of the step whose expression failed, when known (the engine fills it in).
        path: JSON path of the expression inside the definition, when known.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        expression: str | None = None,
        step: str | None = None,
        path: str | None = None,
    ) -> None:
        self.expression = expression
        self.step = step
        self.path = path
        super().__init__(message)


# --- execution ------------------------------------------------------------------------------


class NoChoiceMatched(ToolkitError):
    """No choice rule matched and the choice step has no default.

    Attributes:
        step: Id of the choice step.
    """

    def __init__(self, message: str | None = None, *, step: str | None = None) -> None:
        self.step = step
        if message is None and step is not None:
            message = f"no rule of choice step {step!r} matched and it has no default"
        super().__init__(message)


# --- store, leases and workers ----------------------------------------------------------------


class ConfigError(ToolkitError):
    """A setting or option is invalid."""


class DatabaseUnavailable(ToolkitError):
    """The database cannot be reached; nothing was written by the failed call."""


class StoreError(ToolkitError):
    """The database refused an operation."""


class SchemaOutdated(ToolkitError):
    """The database schema is older than this toolkit needs: run `toolkit db migrate`."""


class LeaseLost(ToolkitError):
    """The lease is no longer held (expired, or claimed by another worker); nothing was written.

    Attributes:
        task_id: the task whose lease was lost.
        token: the fencing token the writer held.
    """

    def __init__(
        self, message: str | None = None, *, task_id: int | None = None, token: int | None = None
    ) -> None:
        self.task_id = task_id
        self.token = token
        super().__init__(message or f"lease on task {task_id} with token {token} is no longer held")


class UnknownDefinition(ToolkitError):
    """No such definition (name and version) is deployed."""


class DefinitionConflict(ToolkitError):
    """This definition version is already deployed with another digest: bump the version."""


class ScheduleConflict(ToolkitError):
    """Deploying this definition version would break a schedule; nothing was deployed."""


class UnknownTask(ToolkitError):
    """No task has this id."""


class UnknownTenant(ToolkitError):
    """No tenant of this name is registered (it never submitted and was never set)."""


class WorkerIdInUse(ToolkitError):
    """Another live worker process holds this worker id."""


class HandlerNotFound(ToolkitError):
    """No handler is registered under this name."""


class MissingHandlers(ToolkitError):
    """Effects of the loaded definitions name handlers missing here, or unfit for their args."""


class HandlerArgumentsMismatch(ToolkitError):
    """A handler was called with arguments its signature does not take.

    For example ``args`` names a parameter the handler does not have, or leaves out one
    without a default. Recorded as the step's error and never retried: calling again cannot help.
    """


class MissingLimits(ToolkitError):
    """Effects of the loaded definitions name limits that are declared nowhere.

    A limit is declared by the application (``App.limit``) or stored by an operator
    (``toolkit limits set``); the message has one line per undeclared name and where it is
    used.
    """


class UnknownLimit(ToolkitError):
    """No limit of that name is stored."""


class ResultNotJson(ToolkitError):
    """A handler returned a value that cannot be stored as JSON."""


class UnknownSignal(InputError):
    """No step of the task's definition waits for a signal of that name; nothing was stored.

    Sending it anyway (``force=True``, ``toolkit signal --force``) stores it for a later
    version of the task's definition to consume, e.g. after a redrive.

    Attributes:
        task_id: the task, None when not given.
        name: the refused signal's name, None when not given.
        waited: the signal names the task's definition waits for, sorted.
        address: the branch it was addressed to, when no branch there waits for it.
        addresses: then, the addresses of the branches that wait for it (``N/ship``: a
            branch ``ship`` of any map item).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        task_id: int | None = None,
        name: str | None = None,
        waited: Iterable[str] = (),
        address: str | None = None,
        addresses: Iterable[str] = (),
    ) -> None:
        self.task_id = task_id
        self.name = name
        self.waited = tuple(sorted(waited))
        self.address = address
        self.addresses = tuple(addresses)
        if message is None and name is not None:
            message = self.refusal("force=True")
        super().__init__(message)

    def refusal(self, force: str) -> str:
        """The refusal in words, naming ``force`` as how to store the signal anyway.

        Args:
            force: the caller's way to force it: ``force=True`` in Python, ``--force`` on
                the command line.
        """
        if self.address is not None:
            where = ", ".join(self.addresses) or "no branch"
            return (
                f"task {self.task_id}: no branch at {self.address!r} waits for signal"
                f" {self.name!r} (branches waiting for it: {where}; N is a map item's index);"
                f" nothing was stored ({force} stores it anyway)"
            )
        known = ", ".join(map(repr, self.waited)) or "none: no step waits for one"
        return (
            f"task {self.task_id}: no step of its definition waits for signal {self.name!r} "
            f"(it waits for {known}); nothing was stored ({force} stores it anyway)"
        )


class SignalAmbiguous(InputError):
    """A signal to a task as a whole would reach several of its waiting branches.

    Send it to one of them (``address``; ``toolkit signal --branch NAME`` or ``--item N``,
    ``--branch 3/approval`` for a branch of a nested step); nothing was stored.

    Attributes:
        task_id: the task.
        name: the signal's name.
        addresses: the waiting branches that wait for it.
    """

    def __init__(self, task_id: int, name: str, addresses: Iterable[str]) -> None:
        self.task_id = task_id
        self.name = name
        self.addresses = tuple(addresses)
        listed = ", ".join(self.addresses)
        nested = next((a for a in self.addresses if "/" in a), None)
        how = f"--branch {nested}" if nested else "--branch NAME, --item N"
        super().__init__(
            f"task {task_id} has {len(self.addresses)} branches waiting for signal {name!r} "
            f"({listed}): address one of them ({how}); nothing was stored"
        )


class TaskTerminal(ToolkitError):
    """The task has already ended (succeeded, failed or cancelled); nothing was changed."""


class NotReconcilable(ToolkitError):
    """The task is not waiting for reconciliation of that step; nothing was changed."""


class NotRedrivable(ToolkitError):
    """The task cannot be redriven as asked (state, step or version); nothing was changed."""


class RedriveRefused(ToolkitError):
    """The redrive is refused; nothing was changed.

    It would call again effects that are not idempotent and were not named with
    ``--rerun``, or compensations ran that a redrive would not undo.

    Attributes:
        plan: the refused plan (its preview says what was refused and why).
    """

    def __init__(self, message: str | None = None, plan: object = None) -> None:
        super().__init__(message)
        self.plan = plan


class EffectCancelled(ToolkitError):
    """The effect call was cancelled (task cancelled, lease lost or worker stopping)."""


class BudgetExceeded(ToolkitError):
    """A spend or a reservation does not fit in what remains of a budget.

    Raised by ``ctx.spend`` inside a handler (the step fails with this error, not retried)
    and recorded as the error of a step whose reservation can never fit.

    Attributes:
        resource: the resource, e.g. ``"tokens"``.
        wanted: the amount asked for.
        remaining: what remained.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        resource: str | None = None,
        wanted: float | None = None,
        remaining: float | None = None,
    ) -> None:
        self.resource = resource
        self.wanted = wanted
        self.remaining = remaining
        super().__init__(message)


class CallbackRefused(ToolkitError):
    """The callback token is unknown, or was completed or expired already; nothing changed."""


class DefinitionRetired(ToolkitError):
    """This definition version is retired: it takes no new submissions."""


class DefinitionInUse(ToolkitError):
    """Live tasks reference this definition version; it cannot be deleted yet."""


class HistoryError(ToolkitError):
    """The history export folder is missing, unreadable or of another export schema."""


class NotExported(ToolkitError):
    """Terminal tasks past the age limit are not exported yet; prune refused them."""


class SubmitConflict(ToolkitError):
    """A task with this idempotency key exists for another definition version.

    Attributes:
        task_id: the existing task.
        definition: ``(name, version)`` of the existing task.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        task_id: int | None = None,
        definition: tuple[str, int] | None = None,
    ) -> None:
        self.task_id = task_id
        self.definition = definition
        super().__init__(message)


class ConcurrencyKeyBusy(ToolkitError):
    """A submit refused: its concurrency key has ``max_active`` live tasks.

    The definition says ``concurrency: {on_conflict: skip}`` (docs/flow-control.md).

    Attributes:
        key: the key value.
        holders: the live tasks of the key, oldest first.
    """

    def __init__(
        self, message: str | None = None, *, key: str = "", holders: tuple[int, ...] = ()
    ) -> None:
        self.key = key
        self.holders = holders
        super().__init__(message)


class Throttled(ToolkitError):
    """A submit refused: its throttle key is past its rate (``excess: refuse``).

    Attributes:
        key: the throttle key value.
        retry_after: seconds until the key has a start free.
    """

    def __init__(
        self, message: str | None = None, *, key: str = "", retry_after: float = 0.0
    ) -> None:
        self.key = key
        self.retry_after = retry_after
        super().__init__(message)


class TaskFailed(ToolkitError):
    """The awaited task failed; its error is attached.

    Attributes:
        task_id: the task.
        error: the task's error as stored: ``{"name", "message", "step", ...}``.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        task_id: int | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        self.task_id = task_id
        self.error = error or {}
        super().__init__(message)

    @property
    def name(self) -> str:
        """The error's name (what ``catch`` and ``retry`` match), e.g. ``Declined``."""
        return str(self.error.get("name", "Error"))


class TaskCancelled(TaskFailed):
    """The awaited task was cancelled (its error is the cancellation's ``Cancelled``)."""


class WaitTimedOut(ToolkitError):
    """The awaited task had not ended when the wait's timeout passed; it goes on.

    Attributes:
        task_id: the task.
        state: its state when the wait gave up.
    """

    def __init__(
        self, message: str | None = None, *, task_id: int | None = None, state: str | None = None
    ) -> None:
        self.task_id = task_id
        self.state = state
        super().__init__(message)


class PlanRefused(ToolkitError):
    """The bulk plan cannot be applied: there is no such plan, or it was applied already."""


class PayloadRefused(ToolkitError):
    """A JSON value cannot be stored: too large, nested too deeply, or not storable JSON.

    Attributes:
        path: JSON path of the fault inside the value (``$`` when the whole value is too
            large).
        reason: what is wrong there, without the path.
        limit: the limit exceeded (bytes or nesting levels), None when no limit is involved.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        path: str = "$",
        reason: str | None = None,
        limit: int | None = None,
    ) -> None:
        self.path = path
        self.reason = reason or message or self.default_message()
        self.limit = limit
        super().__init__(message)


class ResultTooLarge(ToolkitError):
    """A step's result is over the payload limit (size or nesting); the step fails for good.

    Attributes:
        step: the step whose result was refused.
        path: JSON path of the fault inside the result.
        limit: the limit exceeded (bytes or nesting levels).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        step: str | None = None,
        path: str = "$",
        limit: int | None = None,
    ) -> None:
        self.step = step
        self.path = path
        self.limit = limit
        super().__init__(message)
