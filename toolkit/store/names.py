"""Names the store takes from outside: tenants and signal names.

A name is stored, compared and shown: it must be text a person can read and type, of a
bounded length. A tenant name is 1 to 200 characters, none of them a control character,
without space at either end. A signal name follows the definition format's signal-name rule
(``$defs/signalName`` of the JSON Schema): a signal no wait step could name would be stored
and never consumed.
"""

from __future__ import annotations

import re
import unicodedata

from toolkit.errors import InputError

#: The longest tenant or signal name, characters.
MAX_NAME = 200
#: The definition format's signal names (``$defs/signalName`` in the schema).
SIGNAL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def check_tenant(name: object, path: str = "$.tenant") -> str:
    """Return ``name`` if it is a tenant name.

    Raises:
        InputError: it is not a string of 1 to 200 characters, holds a control character,
            or has space at either end (``path`` says where it was given).
    """
    if not isinstance(name, str) or not name:
        raise InputError(f"a tenant name must be a non-empty string, not {name!r}", path=path)
    if len(name) > MAX_NAME:
        raise InputError(
            f"a tenant name is at most {MAX_NAME} characters, not {len(name)}", path=path
        )
    if any(unicodedata.category(char) == "Cc" for char in name):
        raise InputError(f"tenant name {name!r} holds a control character", path=path)
    if name != name.strip():
        raise InputError(f"tenant name {name!r} has space at an end", path=path)
    return name


def check_event_name(name: object, path: str = "$.name") -> str:
    """Return ``name`` if it is an event name (the rule of signal names).

    Raises:
        InputError: it is not: letters, digits, ``_``, ``.`` and ``-``, starting with a letter
            or ``_``, at most 200 characters.
    """
    if not isinstance(name, str) or len(name) > MAX_NAME or not SIGNAL_NAME.fullmatch(name):
        raise InputError(
            f"{name!r} is not an event name: letters, digits, '_', '.' and '-', starting with "
            f"a letter or '_', at most {MAX_NAME} characters (e.g. order.placed)",
            path=path,
        )
    return name


def check_signal_name(name: object, path: str = "$.name") -> str:
    """Return ``name`` if a wait step can wait for it (the format's signal-name rule).

    Raises:
        InputError: it is not: letters, digits, ``_``, ``.`` and ``-``, starting with a letter
            or ``_``, at most 200 characters.
    """
    if not isinstance(name, str) or len(name) > MAX_NAME or not SIGNAL_NAME.fullmatch(name):
        shown = repr(name) if not isinstance(name, str) or len(name) <= 60 else (
            f"{name[:57]!r}... ({len(name)} characters)")
        raise InputError(
            f"{shown} is not a signal name: letters, digits, '_', '.' and '-', starting with "
            f"a letter or '_', at most {MAX_NAME} characters (no wait step could wait for it)",
            path=path,
        )
    return name
