"""Option text to values; a fault is a :class:`~toolkit.errors.ConfigError` naming the option."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

import click

from toolkit.durations import parse_duration
from toolkit.errors import ConfigError, PayloadRefused
from toolkit.payload import parse_json
from toolkit.store.tenants import budget_amount

#: ``--tenant`` of the commands that act on one task by its id (``show``, ``signal``,
#: ``cancel``, ``reconcile``, ``redrive``, ``wait``, ``watch``): without it the tenant is
#: looked up by the id, which on a store distributed by tenant reads every node
#: (docs/scaling.md).
task_tenant_option = click.option(
    "--tenant",
    metavar="TENANT",
    help="The task's tenant (default: looked up by the id; give it on a distributed store).",
)


def json_option(text: str | None, option: str) -> Any:
    """The JSON value of an option such as ``--payload``; None when the option was not given.

    Args:
        text: the option's text, None when not given.
        option: how the error names the option, e.g. ``--result``.

    Raises:
        ConfigError: the text is not valid JSON, or it nests deeper than the payload
            nesting limit (64 levels).
    """
    if text is None:
        return None
    try:
        return parse_json(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{option}: not valid JSON: {exc}") from exc
    except PayloadRefused as exc:
        raise ConfigError(f"{option}: {exc}") from None


def duration_option(text: str, option: str) -> float:
    """A duration option such as ``--older-than 30d``, in seconds.

    Args:
        text: the option's text, e.g. ``30d`` or ``1h30m``.
        option: how the error names the option, e.g. ``--bucket``.

    Raises:
        ConfigError: the text is not a duration.
    """
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc}") from None


def since_option(text: str | None) -> datetime.datetime | None:
    """``--since``: an ISO 8601 date or time; without an offset it is UTC (see time_option).

    Raises:
        ConfigError: the text is not an ISO 8601 date or time.
    """
    return None if text is None else time_option(text, "--since")


def time_option(text: str, option: str) -> datetime.datetime:
    """A time option such as ``--at``: an ISO 8601 date or time; without an offset, UTC.

    Raises:
        ConfigError: the text is not an ISO 8601 date or time; the message names ``option``.
    """
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"{option} {text!r}: expected an ISO 8601 date or time, e.g. 2025-06-01 or "
            "2025-06-01T12:00:00+02:00"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def resource_amounts(texts: Sequence[str]) -> dict[str, str]:
    """``--budget RESOURCE=AMOUNT`` options as resource to amount text.

    Raises:
        ConfigError: one is not of that form, or its amount is not a budget's (a number from
            0 to 1e15: ``toolkit.store.tenants.budget_amount``), naming the option.
    """
    amounts = {}
    for text in texts:
        resource, sep, amount = text.partition("=")
        if not sep or not resource.strip() or not amount.strip():
            raise ConfigError(f"--budget {text}: expected RESOURCE=AMOUNT, e.g. tokens=10000")
        try:
            budget_amount(amount.strip())
        except ValueError as exc:
            raise ConfigError(f"--budget {text}: the amount {exc}") from None
        amounts[resource.strip()] = amount.strip()
    return amounts


def setting_change(option: str, value: Any, remove: bool) -> dict[str, Any]:
    """A setting given as ``--OPTION VALUE`` or removed with ``--no-OPTION``, as a change.

    Args:
        option: the option's name without dashes, e.g. ``max-active``.
        value: the ``--OPTION`` value, None when not given.
        remove: whether ``--no-OPTION`` was given.

    Returns:
        ``{}`` when neither was given, else the setting (``max_active``) to its new value,
        None to remove it.

    Raises:
        ConfigError: both were given.
    """
    if value is not None and remove:
        raise ConfigError(f"give --{option} or --no-{option}, not both")
    if value is None and not remove:
        return {}
    return {option.replace("-", "_"): value}
