"""A registered effect handler, and whether its signature takes a step's arguments."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from toolkit.application.context import EffectContext
from toolkit.errors import HandlerArgumentsMismatch

HandlerFunc = Callable[..., Any]

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
