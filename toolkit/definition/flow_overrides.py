"""One submit's overrides of a definition's flow control (issue 20, docs/flow-control.md).

A definition declares its ``concurrency``, ``debounce`` and ``throttle``; a submit may change
their values for the tasks it writes (``toolkit submit --quiet 30s``, or
``store.tasks.submit(FlowOverrides(quiet=30).applied(definition), ...)``), never add a control
the definition does not declare nor change its key: the key is what ties the tasks of a key
value together, and tasks submitted with another key expression would not meet the others.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from toolkit.definition.flow_control import Excess
from toolkit.definition.model import WorkflowDefinition
from toolkit.durations import MAX_SECONDS, rate_parts
from toolkit.errors import InputError

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class FlowOverrides:
    """What one submit changes of a definition's flow control; None keeps the declared value.

    Attributes:
        max_active: the concurrency key's ``max_active`` for these tasks (≥ 1); the key's
            admission follows the value its oldest waiting task was submitted with.
        quiet: the debounce's quiet period, seconds (> 0, at most 100 years).
        max_wait: the debounce's longest wait from the first submit of a burst, seconds.
        rate: the throttle's rate, as in YAML (``"10/min"``, ``"5/s"``; at least one start).
        excess: the throttle's ``excess``: ``delay`` or ``refuse``.
    """

    max_active: int | None = None
    quiet: float | None = None
    max_wait: float | None = None
    rate: str | None = None
    excess: Excess | None = None

    def applied(self, definition: WorkflowDefinition) -> WorkflowDefinition:
        """``definition`` with these values in place of its own.

        The copy keeps the definition's digest: its tasks are pinned to the registered
        version, and only the submit reads the values.

        Returns:
            The definition to submit with (``definition`` itself when nothing is overridden).

        Raises:
            InputError: a value for a control the definition does not declare, or out of
                range; ``path`` names the override (``$.flow.quiet``).
        """
        if self == FlowOverrides():
            return definition
        changes: dict[str, Any] = {}
        concurrency, debounce, throttle = (
            definition.concurrency, definition.debounce, definition.throttle
        )  # fmt: skip
        if self.max_active is not None:
            concurrency = _declared(concurrency, definition, "max_active", "concurrency")
            if self.max_active < 1:
                raise InputError("max_active must be at least 1", path="$.flow.max_active")
            changes["concurrency"] = dataclasses.replace(concurrency, max_active=self.max_active)
        if self.quiet is not None or self.max_wait is not None:
            field = "quiet" if self.quiet is not None else "max_wait"
            debounce = _declared(debounce, definition, field, "debounce")
            for name, seconds in (("quiet", self.quiet), ("max_wait", self.max_wait)):
                if seconds is not None and not 0 < seconds <= MAX_SECONDS:
                    raise InputError(
                        f"{name} must be greater than zero and at most 100 years",
                        path=f"$.flow.{name}",
                    )
            changes["debounce"] = dataclasses.replace(
                debounce,
                quiet=self.quiet if self.quiet is not None else debounce.quiet,
                max_wait=self.max_wait if self.max_wait is not None else debounce.max_wait,
            )
        if self.rate is not None or self.excess is not None:
            field = "rate" if self.rate is not None else "excess"
            throttle = _declared(throttle, definition, field, "throttle")
            calls, period = throttle.calls, throttle.period
            if self.rate is not None:
                parts = rate_parts(self.rate)
                if parts is None or parts[0] < 1:
                    raise InputError(
                        f"rate {self.rate!r} is not a rate like '10/min', '5/s' or '100/h' of at"
                        " least one start",
                        path="$.flow.rate",
                    )
                calls, period = parts
            if self.excess not in (None, "delay", "refuse"):
                raise InputError(
                    f"excess {self.excess!r} is not delay or refuse", path="$.flow.excess"
                )
            changes["throttle"] = dataclasses.replace(
                throttle, calls=calls, period=period, excess=self.excess or throttle.excess
            )
        return dataclasses.replace(definition, **changes)


def _declared(control: T | None, definition: WorkflowDefinition, field: str, name: str) -> T:
    """``control`` when the definition declares it; else the InputError of the override."""
    if control is None:
        raise InputError(
            f"{definition.name} v{definition.version} declares no {name}: a submit can change"
            f" its values, not add one ({field} given)",
            path=f"$.flow.{field}",
        )
    return control
