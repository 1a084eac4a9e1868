"""The application's registry: effect handlers by name, and the limits it declares.

Handler names resolve only through an :class:`App`'s registry, never by importing a path
named in YAML (DESIGN §2, "Effect").
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

from toolkit.application.handlers import Handler, HandlerFunc
from toolkit.definition import (
    Branch,
    DistributedMapStep,
    EffectStep,
    MapStep,
    ParallelStep,
    Step,
    WorkflowDefinition,
)
from toolkit.definition.paths import JsonPath, format_path
from toolkit.definition.wording import suggest
from toolkit.errors import (
    ConfigError,
    DefinitionFault,
    HandlerNotFound,
    MissingHandlers,
    MissingLimits,
)
from toolkit.store.limits import LimitSpec, parse_rate

F = TypeVar("F", bound=HandlerFunc)


#: The line of a JSON path in a definition's file, or None (see `App.check`).
LineOf = Callable[[WorkflowDefinition, JsonPath], int | None]


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
                        at = format_path((*path, "limits"))
                        lines.append(
                            f"{where}: {at}: limit {name!r} is not declared in app "
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

    def check(
        self, definitions: Iterable[WorkflowDefinition], line_of: LineOf | None = None
    ) -> None:
        """Check that every effect and compensation has a handler here that takes its args.

        The handler's signature is checked against the step's ``args`` when its keys are
        known before it renders (a mapping, or no ``args``).

        Args:
            definitions: the definitions to check.
            line_of: the line of a path in a definition's file, when known (the CLI reads
                the files again); default: no lines.

        Raises:
            MissingHandlers: one line per missing or unfit handler, naming the file and step.
        """
        faults = self.handler_faults(definitions, line_of)
        if faults:
            raise MissingHandlers("\n".join(map(str, faults)))

    def handler_faults(
        self, definitions: Iterable[WorkflowDefinition], line_of: LineOf | None = None
    ) -> list[DefinitionFault]:
        """What :meth:`check` refuses, as faults: a handler missing, or one unfit for ``args``.

        Args:
            definitions: the definitions to check.
            line_of: the line of a path in a definition's file (as for :meth:`check`);
                default: no lines.

        Returns:
            One fault per effect or compensation, in definition and step order, naming the
            definition's file (or ``NAME vVERSION``), the line (with ``line_of``) and the
            path of the step's ``effect`` or ``args``.
        """
        def fault(definition: WorkflowDefinition, path: JsonPath, message: str) -> DefinitionFault:
            where = definition.source or f"{definition.name} v{definition.version}"
            line = None if line_of is None else line_of(definition, path)
            return DefinitionFault(where, line, format_path(path), message)

        faults = []
        for definition in definitions:
            for path, step in _effect_steps(definition):
                needed = [(path, step.handler, step.args.source)]
                if step.compensate is not None:
                    undo = step.compensate
                    needed.append(((*path, "compensate"), undo.handler, undo.args.source))
                for at, name, args in needed:
                    handler = self._handlers.get(name)
                    if handler is None:
                        hint = suggest(name, sorted(self._handlers), _HANDLER_LIKENESS)
                        faults.append(fault(
                            definition, (*at, "effect"),
                            f"no handler {name!r} is registered in app {self.name!r}{hint}",
                        ))  # fmt: skip
                        continue
                    # The keys of args are known before it renders; an expression is not.
                    if isinstance(args, dict) or args is None:
                        shape = None if args is None else dict.fromkeys(args)
                        unfit = handler.arguments_fault(shape)
                        if unfit is not None:
                            faults.append(fault(
                                definition, (*at, "args"),
                                f"handler {name!r} cannot take these arguments: {unfit}",
                            ))  # fmt: skip
        return faults


#: How alike a registered handler's name must be to a missing one to be suggested: dotted
#: names share their prefix, so the default would offer ``count.fail`` for ``count.missing``.
_HANDLER_LIKENESS = 0.8


def _effect_steps(definition: WorkflowDefinition) -> Iterator[tuple[JsonPath, EffectStep]]:
    """Every effect step of a definition, branches (nested ones too) included, with its path."""
    return _effects_in(definition.steps, ("steps",))


def _effects_in(
    steps: Mapping[str, Step], where: JsonPath
) -> Iterator[tuple[JsonPath, EffectStep]]:
    """The effect steps of ``steps`` (at JSON path ``where``) and of their branches."""
    for step in steps.values():
        if isinstance(step, EffectStep):
            yield (*where, step.id), step
        if isinstance(step, DistributedMapStep) and step.items_from.page is not None:
            yield (*where, step.id, "map", "items_from"), step.items_from.page
        branches: Mapping[str, Branch] = {}
        if isinstance(step, ParallelStep):
            branches = step.branches
            inner: JsonPath = (*where, step.id, "parallel", "branches")
        elif isinstance(step, MapStep):
            branches = {"branch": step.branch}
            inner = (*where, step.id, "map")
        for name, branch in branches.items():
            yield from _effects_in(branch.steps, (*inner, name, "steps"))
