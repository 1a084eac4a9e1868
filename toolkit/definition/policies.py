"""What happens when a step fails: its retry policies and its catch rules.

Both match errors by name. An error name is any text of 1 to :data:`MAX_ERROR_NAME`
characters without a control character (``$defs/errorName`` of the JSON Schema), compared
exactly: ``missing-order-id``, ``Job Failed`` and ``States.Timeout`` are names as much as
``OutOfStock``. ``"*"`` is no error's name: in ``catch`` and ``retry`` ``errors`` it stands
for any error.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "ANY_ERROR", "MAX_ERROR_NAME", "CatchRule", "RetryPolicy", "catch_target",
    "error_name_problem",
]  # fmt: skip

#: In ``catch`` and ``retry`` ``errors``: any error (never an error's own name).
ANY_ERROR = "*"
#: The longest error name a definition may write, characters (as a stored error's name).
MAX_ERROR_NAME = 200
#: A control character: C0, DEL or C1 (Unicode category ``Cc``).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def error_name_problem(name: object, *, wildcard: bool = False) -> str | None:
    """Why ``name`` is not an error name a definition may write, or None when it is one.

    The rule of the schema's ``$defs/errorName`` (``$defs/errorMatch`` with ``wildcard``),
    for checks of error names given outside a definition (a callback's or an operator's).

    Args:
        name: the candidate.
        wildcard: whether ``"*"`` (any error) is allowed, as in ``catch`` and ``retry``
            ``errors``.

    Returns:
        A clause for a message (``"it is empty"``), or None.
    """
    if not isinstance(name, str):
        return "it is not a string"
    if not name:
        return "it is empty"
    if len(name) > MAX_ERROR_NAME:
        return f"it has {len(name)} characters, at most {MAX_ERROR_NAME} are allowed"
    control = _CONTROL.search(name)
    if control is not None:
        return f"it holds the control character U+{ord(control.group()):04X}"
    if name == ANY_ERROR and not wildcard:
        return "it stands for any error, in catch and retry errors only"
    return None


#: The shortest delay before a retry, seconds: a policy stored with a zero ``initial`` or
#: ``max`` (refused for new registrations since) retries at this pace (docs/decisions.md).
MIN_RETRY_DELAY = 0.01


@dataclass(frozen=True)
class RetryPolicy:
    """When and how often a failed effect is attempted again.

    Attributes:
        max_attempts: Attempts in total, including the first (1 means no retry). An attempt
            lost to a crash or an expired lease counts too (docs/decisions.md). Default 3.
        initial: Delay before the first retry, in seconds.
        factor: Multiplier applied to the delay after each retry (≥ 1).
        max: Upper bound of any delay, in seconds.
        jitter: Whether delays are randomised (between 50% and 100% of the computed delay).
        non_retryable: Error names that fail the step at once, whatever the attempt count
            (compared exactly).
        errors: Error names this policy applies to (``"*"``: any), compared exactly, for a
            step whose ``retry`` is a list of policies: the first policy naming an error
            decides; an error no policy names is not retried.
        unlimited: Retry without limit (``max_attempts: unlimited``); ``max_attempts`` is then
            the largest int and only lost attempts still count.
    """

    max_attempts: int = 3
    initial: float = 1.0
    factor: float = 2.0
    max: float = 60.0
    jitter: bool = True
    non_retryable: tuple[str, ...] = ()
    errors: tuple[str, ...] = ("*",)
    unlimited: bool = False

    def applies_to(self, error_name: str) -> bool:
        """Whether this policy covers the error named ``error_name``."""
        return (ANY_ERROR in self.errors or error_name in self.errors) and (
            error_name not in self.non_retryable
        )

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Return the delay, in seconds, before retrying after failed attempt number ``attempt``.

        The delay is ``min(max, initial * factor ** (attempt - 1))``; with jitter it is then
        scaled by a random factor between 0.5 and 1.0; it is never below
        :data:`MIN_RETRY_DELAY`.

        Args:
            attempt: The 1-based number of the attempt that failed.
            rand: Source of uniform random numbers in ``[0, 1)``; pass a fixed function for
                deterministic tests.

        Raises:
            ValueError: If ``attempt`` is less than 1.
        """
        if attempt < 1:
            raise ValueError(f"attempt numbers start at 1, got {attempt}")
        try:
            delay = min(self.max, self.initial * self.factor ** (attempt - 1))
        except OverflowError:
            delay = self.max
        if self.jitter:
            delay *= 0.5 + 0.5 * rand()
        return max(delay, MIN_RETRY_DELAY)


@dataclass(frozen=True)
class CatchRule:
    """One rule of a step's ``catch``: go to ``next`` when the step fails with one of ``errors``.

    Attributes:
        errors: Error names, compared exactly (case-sensitive); ``"*"`` stands for any error.
        next: The step to go to.
    """

    errors: tuple[str, ...]
    next: str

    def matches(self, error_name: str) -> bool:
        """Tell whether the rule catches the error named ``error_name``."""
        return ANY_ERROR in self.errors or error_name in self.errors


def catch_target(rules: Sequence[CatchRule], error_name: str) -> str | None:
    """Return the ``next`` of the first rule catching ``error_name``, or None when none does."""
    for rule in rules:
        if rule.matches(error_name):
            return rule.next
    return None
