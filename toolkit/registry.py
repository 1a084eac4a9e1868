"""The application's side: effect handlers registered by name, and the context they get.

Handler names resolve only through an :class:`App`'s registry, never by importing a path
named in YAML (DESIGN §2, "Effect").
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import threading
from collections.abc import Awaitable, Callable, Hashable, Iterable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import psycopg

from toolkit.definition import Branch, EffectStep, MapStep, ParallelStep, WorkflowDefinition
from toolkit.errors import (
    BudgetExceeded,
    ConfigError,
    EffectCancelled,
    HandlerArgumentsMismatch,
    HandlerNotFound,
    MissingHandlers,
    MissingLimits,
)

HandlerFunc = Callable[..., Any]
F = TypeVar("F", bound=HandlerFunc)


#: Where a spend limit applies: a key naming the counter several calls may share (the
#: task's budget of a resource, a step's total reservation, one branch's share of it).
Pool = Hashable
#: What the calls of a cycle may still spend, by resource: ``(pool, amount)``.
SpendLimits = Mapping[str, tuple[Pool, float]]


class SpendLedger:
    """The spend that concurrent calls of one cycle reported and that is not charged yet.

    Branches of a parallel or map step run their calls at once against the same budget: a
    call's limit is what remains of its pool less what the other calls of that pool have
    reported meanwhile, so together they never spend past it. ``lock`` also covers the
    charge that moves a call's spend out of the ledger (see `SpendMeter.settle`).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()  # sync handlers report from their worker threads
        self.in_flight: dict[Pool, dict[int, float]] = {}

    def others(self, pool: Pool, meter: SpendMeter) -> float:
        """What the other calls of ``pool`` reported and is not charged yet."""
        return sum(v for m, v in self.in_flight.get(pool, {}).items() if m != id(meter))


class SpendMeter:
    """What one effect call spends, against what remains of its pools (DESIGN §2-3).

    Args:
        limits: the pools and amounts the call may use now, read at each report (absent
            resource: no limit).
        ledger: the cycle's in-flight spend, shared by its concurrent calls.
    """

    def __init__(self, limits: Callable[[], SpendLimits], ledger: SpendLedger) -> None:
        self._limits = limits
        self._ledger = ledger
        self.spent: dict[str, float] = {}

    def add(self, amounts: Mapping[str, float]) -> None:
        """Record ``amounts``; raise once one is over what remains (see `EffectContext.spend`).

        Raises:
            BudgetExceeded: over what remained for the call (the amounts are recorded).
            ValueError: a negative, infinite or non-numeric amount (nothing recorded).
        """
        for resource, amount in amounts.items():
            if (
                isinstance(amount, bool)
                or not isinstance(amount, int | float)
                or not math.isfinite(amount)
                or amount < 0
            ):
                raise ValueError(
                    f"spend of {resource!r} must be a finite number >= 0, got {amount!r}"
                )
        over = None
        with self._ledger.lock:
            limits = self._limits()
            for resource, amount in amounts.items():
                total = self.spent.get(resource, 0.0) + float(amount)
                self.spent[resource] = total
                if resource not in limits:
                    continue
                pool, limit = limits[resource]
                left = limit - self._ledger.others(pool, self)
                self._ledger.in_flight.setdefault(pool, {})[id(self)] = total
                if total > left + 1e-9 and over is None:
                    over = (resource, total, left)
        if over is not None:
            resource, total, left = over
            raise BudgetExceeded(
                f"spending {total:g} {resource} exceeds the {max(left, 0):g} that remained of "
                "the budget",
                resource=resource, wanted=total, remaining=left,
            )  # fmt: skip

    def settle(self, charge: Callable[[dict[str, float]], None] | None = None) -> None:
        """Leave the ledger, charging the spend with ``charge`` at the same moment.

        So no other call counts it twice or not at all. Without ``charge`` (the call was
        abandoned), the spend is dropped with the call.
        """
        with self._ledger.lock:
            if charge is not None and self.spent:
                charge(dict(self.spent))
            for calls in self._ledger.in_flight.values():
                calls.pop(id(self), None)


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
        callback_token: for a step with ``callback``: the token to hand to the external
            system, which completes the step with ``toolkit complete TOKEN`` (one per
            occurrence and attempt); None for other steps.
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
    callback_token: str | None = None

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


_RATE = re.compile(
    r"^\s*(?P<calls>\d+(?:\.\d+)?)\s*/\s*(?P<unit>s|sec|second|m|min|minute|h|hour)\s*$"
)
_RATE_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
               "h": 3600.0, "hour": 3600.0}  # fmt: skip


#: The lowest rate a limit takes, calls per second: one a day (a token's wait stays a day).
MIN_RATE = 1 / 86400


def parse_rate(rate: str | float, what: str = "rate") -> float:
    """A rate as calls per second: ``"600/min"`` → 10.0, ``"20/s"`` → 20.0, ``"5/h"``, or a number.

    Args:
        rate: ``CALLS/UNIT`` with unit ``s``, ``min`` or ``h`` (also ``sec``, ``second``,
            ``m``, ``minute``, ``hour``), or a number of calls per second.
        what: how the value is named in the error message.

    Returns:
        Calls per second, a finite number >= `MIN_RATE`.

    Raises:
        ConfigError: not a rate, or below one a day.
    """
    if isinstance(rate, bool):
        raise ConfigError(f"{what} must be like '600/min', '20/s' or '5/h', not {rate!r}")
    if isinstance(rate, int | float):
        per_second = float(rate)
    else:
        match = _RATE.match(str(rate))
        if match is None:
            raise ConfigError(f"{what} must be like '600/min', '20/s' or '5/h', not {rate!r}")
        per_second = float(match["calls"]) / _RATE_UNITS[match["unit"]]
    if not math.isfinite(per_second) or per_second < MIN_RATE:
        raise ConfigError(f"{what} must be at least 1/day ({MIN_RATE:.3g}/s), not {rate!r}")
    return per_second


@dataclasses.dataclass(frozen=True)
class LimitSpec:
    """A downstream limit as an application declares it (see :meth:`App.limit`).

    Attributes:
        name: the limit's name, used by steps (``limits: [NAME]``) and handlers.
        max_concurrency: most calls inside the limit at once, over every worker; None: no
            bound.
        rate_per_second: calls per second on average; None: no rate.
        burst: the token bucket's size in calls (None without a rate).
        per_tenant: each tenant has its own slots and bucket.
    """

    name: str
    max_concurrency: int | None = None
    rate_per_second: float | None = None
    burst: float | None = None
    per_tenant: bool = False


@dataclasses.dataclass(frozen=True)
class Handler:
    """A registered effect handler; ``limits`` are the limits every call of it takes."""

    name: str
    func: HandlerFunc
    is_async: bool
    limits: tuple[str, ...] = ()

    def call(self, ctx: EffectContext, args: Any) -> Awaitable[Any] | Any:
        """Call the function: ``func(ctx, **args)`` for a mapping, ``func(ctx, args)`` else.

        Raises:
            HandlerArgumentsMismatch: the function's signature does not take ``args``.
        """
        try:
            if isinstance(args, dict):
                return self.func(ctx, **args)
            if args is None:
                return self.func(ctx)
            return self.func(ctx, args)
        except TypeError as exc:
            fault = self.arguments_fault(args)
            if fault is None:
                raise  # raised inside the function
            raise HandlerArgumentsMismatch(f"handler {self.name!r}: {fault}") from exc

    def arguments_fault(self, args: Any) -> str | None:
        """Why the function's signature cannot take ``args`` as `call` passes them.

        None when it can, or when its signature cannot be read.
        """
        try:
            signature = inspect.signature(self.func)
        except (TypeError, ValueError):
            return None
        try:
            if isinstance(args, dict):
                signature.bind(None, **args)
            elif args is None:
                signature.bind(None)
            else:
                signature.bind(None, args)
        except TypeError as exc:
            return _named_faults(signature, args or {}) or str(exc)
        return None


def _named_faults(signature: inspect.Signature, args: Any) -> str | None:
    """The names ``args`` gives that the signature lacks, and those it needs but lacks.

    The first parameter takes the context. None when there are neither.
    """
    if not isinstance(args, dict):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = list(signature.parameters.values())[1:]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    names = {p.name for p in params if p.kind in named}
    unknown = [key for key in args if key not in names] if not takes_any else []
    missing = [
        p.name for p in params if p.kind in named and p.default is p.empty and p.name not in args
    ]
    faults = []
    if unknown:
        faults.append("it has no parameter " + ", ".join(map(repr, unknown)))
    if missing:
        faults.append("it needs " + ", ".join(map(repr, missing)))
    return "; ".join(faults) or None


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
        self._limits: dict[str, LimitSpec] = {}

    def effect(self, name: str, *, limits: Iterable[str] = ()) -> Callable[[F], F]:
        """Register the decorated function, async or sync, as the handler ``name``.

        Sync handlers run in a worker thread so they never block heartbeats.

        Args:
            name: the handler name definitions use.
            limits: names of downstream limits every call of the handler takes (on top of
                a step's own ``limits``), see :meth:`limit`.

        Raises:
            ValueError: ``name`` is already registered.
        """

        def register(func: F) -> F:
            self.add(name, func, limits=limits)
            return func

        return register

    def add(self, name: str, func: HandlerFunc, *, limits: Iterable[str] = ()) -> None:
        """Register ``func`` as the handler ``name`` (the non-decorator form).

        Args:
            name: the handler name definitions use.
            func: the handler, async or sync.
            limits: names of downstream limits every call takes (see :meth:`effect`).

        Raises:
            ValueError: ``name`` is already registered.
        """
        if name in self._handlers:
            raise ValueError(f"handler {name!r} is registered twice")
        names = tuple(sorted(set(limits)))
        self._handlers[name] = Handler(name, func, inspect.iscoroutinefunction(func), names)

    def limit(
        self,
        name: str,
        *,
        max_concurrency: int | None = None,
        rate: str | float | None = None,
        burst: float | None = None,
        per: str | None = None,
    ) -> LimitSpec:
        """Declare a downstream limit, held fleet-wide in the store (docs/limits.md).

        Example: ``app.limit("llm", max_concurrency=4, rate="600/min", burst=20)``. A worker
        stores its app's limits when it starts; a limit an operator changed with
        ``toolkit limits set`` keeps the operator's values.

        Args:
            name: the limit's name (non-empty).
            max_concurrency: most calls inside the limit at once over every worker (>= 1);
                None for no bound.
            rate: calls allowed on average: ``"600/min"``, ``"20/s"``, ``"5/h"``, or a number
                per second; None for no rate.
            burst: the most calls the bucket lets through at once after a quiet spell
                (>= 1); default one second's worth of the rate, at least 1.
            per: ``"tenant"`` for separate slots and bucket per tenant; None (or
                ``"global"``) for one of each over all tenants.

        Returns:
            The declaration.

        Raises:
            ConfigError: a value is out of range, neither a bound nor a rate is given, or the
                name is declared twice.
        """
        if not isinstance(name, str) or not name:
            raise ConfigError("a limit name must be a non-empty string")
        if name in self._limits:
            raise ConfigError(f"limit {name!r} is declared twice in app {self.name!r}")
        if max_concurrency is None and rate is None:
            raise ConfigError(f"limit {name!r}: give max_concurrency, rate, or both")
        if max_concurrency is not None and (
            isinstance(max_concurrency, bool)
            or not isinstance(max_concurrency, int)
            or not 1 <= max_concurrency <= 2**31 - 1
        ):
            raise ConfigError(f"limit {name!r}: max_concurrency must be a positive integer")
        per_second = None if rate is None else parse_rate(rate, f"limit {name!r}: rate")
        if burst is not None:
            if per_second is None:
                raise ConfigError(f"limit {name!r}: a burst needs a rate")
            if (
                isinstance(burst, bool)
                or not isinstance(burst, int | float)
                or not (math.isfinite(burst) and burst >= 1)
            ):
                raise ConfigError(f"limit {name!r}: burst must be a number >= 1")
        elif per_second is not None:
            burst = max(per_second, 1.0)
        if per not in (None, "global", "tenant"):
            raise ConfigError(f"limit {name!r}: per must be 'tenant' or 'global', not {per!r}")
        spec = LimitSpec(
            name, max_concurrency, per_second, None if burst is None else float(burst),
            per == "tenant",
        )  # fmt: skip
        self._limits[name] = spec
        return spec

    @property
    def limit_specs(self) -> tuple[LimitSpec, ...]:
        """Every limit this app declares, by name."""
        return tuple(self._limits[name] for name in sorted(self._limits))

    def step_limits(self, step: EffectStep) -> tuple[str, ...]:
        """The limits a step's calls take: its own ``limits`` and its handler's, sorted."""
        handler = self._handlers.get(step.handler)
        own = getattr(step, "limits", ())
        if not own and (handler is None or not handler.limits):
            return ()
        return tuple(sorted({*own, *(handler.limits if handler is not None else ())}))

    def check_limits(
        self, definitions: Iterable[WorkflowDefinition], stored: Iterable[str]
    ) -> None:
        """Check that every limit a step or handler names is declared here or ``stored``.

        Args:
            definitions: the definitions a worker runs.
            stored: the names of the limits the store holds (set by an operator).

        Raises:
            MissingLimits: one line per undeclared limit, naming the file and step, or the
                handler.
        """
        known = set(self._limits) | set(stored)
        lines = []
        for handler in self._handlers.values():
            for name in handler.limits:
                if name not in known:
                    lines.append(
                        f"handler {handler.name!r} of app {self.name!r}: limit {name!r} is not "
                        "declared (app.limit) nor set in the store (toolkit limits set)"
                    )
        for definition in definitions:
            where = definition.source or f"{definition.name} v{definition.version}"
            for path, step in _effect_steps(definition):
                for name in getattr(step, "limits", ()):
                    if name not in known:
                        lines.append(
                            f"{where}: {path}.limits: limit {name!r} is not declared in app "
                            f"{self.name!r} (app.limit) nor set in the store (toolkit limits set)"
                        )
        if lines:
            raise MissingLimits("\n".join(dict.fromkeys(lines)))

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
        """Check that every effect and compensation has a handler here that takes its args.

        The handler's signature is checked against the step's ``args`` when its keys are
        known before it renders (a mapping, or no ``args``).

        Raises:
            MissingHandlers: one line per missing or unfit handler, naming the file and step.
        """
        lines = []
        for definition in definitions:
            where = definition.source or f"{definition.name} v{definition.version}"
            for path, step in _effect_steps(definition):
                needed = [(path, step.handler, step.args.source)]
                if step.compensate is not None:
                    undo = step.compensate
                    needed.append((f"{path}.compensate", undo.handler, undo.args.source))
                for at, name, args in needed:
                    handler = self._handlers.get(name)
                    if handler is None:
                        lines.append(
                            f"{where}: {at}.effect: no handler {name!r} is registered in app"
                            f" {self.name!r}"
                        )
                        continue
                    # The keys of args are known before it renders; an expression is not.
                    if isinstance(args, dict) or args is None:
                        shape = None if args is None else dict.fromkeys(args)
                        fault = handler.arguments_fault(shape)
                        if fault is not None:
                            lines.append(
                                f"{where}: {at}.args: handler {name!r} cannot take these"
                                f" arguments: {fault}"
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
