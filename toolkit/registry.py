"""The application's side: effect handlers registered by name, and the context they get.

Handler names resolve only through an :class:`App`'s registry, never by importing a path
named in YAML (DESIGN §2, "Effect").
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import psycopg

from toolkit.definition import Branch, EffectStep, MapStep, ParallelStep, WorkflowDefinition
from toolkit.errors import BudgetExceeded, EffectCancelled, HandlerNotFound, MissingHandlers

HandlerFunc = Callable[..., Any]
F = TypeVar("F", bound=HandlerFunc)


class SpendMeter:
    """What one effect call spends, against what remained for it when it started.

    Args:
        remaining: resource to the amount the call may use (absent: no limit).
    """

    def __init__(self, remaining: Mapping[str, float]) -> None:
        self.remaining = dict(remaining)
        self.spent: dict[str, float] = {}
        self._lock = threading.Lock()  # a sync handler reports from its worker thread

    def add(self, amounts: Mapping[str, float]) -> None:
        """Record ``amounts``; raise once one is over what remains (see `EffectContext.spend`).

        Raises:
            BudgetExceeded: over what remained for the call.
            ValueError: a negative or non-numeric amount.
        """
        for resource, amount in amounts.items():
            if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
                raise ValueError(f"spend of {resource!r} must be a number >= 0, got {amount!r}")
        over = None
        with self._lock:
            for resource, amount in amounts.items():
                total = self.spent.get(resource, 0.0) + float(amount)
                self.spent[resource] = total
                limit = self.remaining.get(resource)
                if limit is not None and total > limit + 1e-9 and over is None:
                    over = (resource, total, limit)
        if over is not None:
            resource, total, limit = over
            raise BudgetExceeded(
                f"spending {total:g} {resource} exceeds the {limit:g} that remained of the budget",
                resource=resource, wanted=total, remaining=limit,
            )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class EffectContext:
    """What a handler learns about the call it serves.

    Attributes:
        task_id: the task's id.
        tenant: the task's tenant.
        workflow: ``(name, version)`` of the definition.
        step: the step id.
        occurrence: the step occurrence, e.g. ``"charge#2"`` on the second entry of a loop.
        attempt: 1 for the first attempt at this occurrence, then 2, 3, ...
        fencing_token: the lease's fencing token; a write to another system can carry it so
            that system can refuse a stale writer.
        idempotency_key: stable across retries, crashes and takeovers of this occurrence,
            different for every other occurrence; pass it to the system you call.
    """

    task_id: int
    tenant: str
    workflow: tuple[str, int]
    step: str
    occurrence: str
    attempt: int
    fencing_token: int
    idempotency_key: str
    _connection: Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]] = (
        dataclasses.field(repr=False)
    )
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event, repr=False)
    _spend: SpendMeter | None = dataclasses.field(default=None, repr=False)

    def spend(self, **amounts: float) -> None:
        """Report what this call used of budgeted resources, e.g. ``ctx.spend(tokens=812)``.

        The amounts are recorded with the effect's evidence (fenced: a stale worker's spend
        never counts) and charged to the task's budget (or the reservation of the parallel
        or map step the call runs in) and the tenant's. Call it once the resource is used:
        it is recorded even when it raises.

        Args:
            amounts: resource name to amount used (≥ 0), in the resource's own unit.

        Raises:
            BudgetExceeded: the amount takes the call over what remained for it; the step
                fails with this error (it is not retried).
            ValueError: an amount is negative or not a number.
        """
        if self._spend is not None:  # None: a context built outside the engine
            self._spend.add(amounts)

    @property
    def cancelled(self) -> bool:
        """True once the call should stop.

        That is: the task was cancelled, its lease was lost, the step's timeout passed, or
        the worker is shutting down past its grace period. Async handlers are cancelled by
        anyio; sync handlers (run in a thread) cannot be, so they should check this, or call
        :meth:`check_cancelled`, between units of work.
        """
        return self._stop.is_set()

    def check_cancelled(self) -> None:
        """Raise :class:`~toolkit.errors.EffectCancelled` if :attr:`cancelled` is true."""
        if self._stop.is_set():
            raise EffectCancelled(f"step {self.step!r} of task {self.task_id} was cancelled")

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """Borrow an autocommit connection to the store's database for application tables.

        Use it as ``async with ctx.connection() as conn: ...``. Writes made here are the
        application's, not fenced by the lease: key them by :attr:`idempotency_key`.
        """
        return self._connection()


@dataclasses.dataclass(frozen=True)
class Handler:
    """A registered effect handler."""

    name: str
    func: HandlerFunc
    is_async: bool

    def call(self, ctx: EffectContext, args: Any) -> Awaitable[Any] | Any:
        """Call the function: ``func(ctx, **args)`` for a mapping, ``func(ctx, args)`` else."""
        if isinstance(args, dict):
            return self.func(ctx, **args)
        if args is None:
            return self.func(ctx)
        return self.func(ctx, args)


class App:
    """A registry of effect handlers, looked up by the names definitions use.

    Example::

        app = toolkit.App()

        @app.effect("inventory.reserve")
        async def reserve(ctx: toolkit.EffectContext, order: str) -> dict:
            ...
    """

    def __init__(self, name: str = "app") -> None:
        self.name = name
        self._handlers: dict[str, Handler] = {}

    def effect(self, name: str) -> Callable[[F], F]:
        """Register the decorated function, async or sync, as the handler ``name``.

        Sync handlers run in a worker thread so they never block heartbeats.

        Raises:
            ValueError: ``name`` is already registered.
        """

        def register(func: F) -> F:
            self.add(name, func)
            return func

        return register

    def add(self, name: str, func: HandlerFunc) -> None:
        """Register ``func`` as the handler ``name`` (the non-decorator form).

        Raises:
            ValueError: ``name`` is already registered.
        """
        if name in self._handlers:
            raise ValueError(f"handler {name!r} is registered twice")
        self._handlers[name] = Handler(name, func, inspect.iscoroutinefunction(func))

    @property
    def handler_names(self) -> frozenset[str]:
        """Every registered handler name."""
        return frozenset(self._handlers)

    def handler(self, name: str) -> Handler:
        """Look up a handler.

        Raises:
            HandlerNotFound: nothing is registered under ``name``.
        """
        try:
            return self._handlers[name]
        except KeyError:
            raise HandlerNotFound(
                f"no handler registered as {name!r} in app {self.name!r}"
            ) from None

    def check(self, definitions: Iterable[WorkflowDefinition]) -> None:
        """Check that every effect of every definition has a handler here.

        Raises:
            MissingHandlers: one line per missing handler, naming the file and step.
        """
        lines = []
        for definition in definitions:
            where = definition.source or f"{definition.name} v{definition.version}"
            for path, step in _effect_steps(definition):
                if step.handler not in self._handlers:
                    lines.append(
                        f"{where}: {path}.effect: no handler {step.handler!r} "
                        f"is registered in app {self.name!r}"
                    )
        if lines:
            raise MissingHandlers("\n".join(lines))


def _effect_steps(definition: WorkflowDefinition) -> Iterator[tuple[str, EffectStep]]:
    """Every effect step of a definition, branches included, with its JSON path."""
    for step in definition.steps.values():
        if isinstance(step, EffectStep):
            yield f"$.steps.{step.id}", step
        branches: Mapping[str, Branch] = {}
        if isinstance(step, ParallelStep):
            branches = step.branches
            where = f"$.steps.{step.id}.parallel.branches"
        elif isinstance(step, MapStep):
            branches = {"branch": step.branch}
            where = f"$.steps.{step.id}.map"
        for name, branch in branches.items():
            for inner in branch.steps.values():
                if isinstance(inner, EffectStep):
                    yield f"{where}.{name}.steps.{inner.id}", inner
